"""nri_framework.memo: recent answers of a pure function, bounded."""

from __future__ import annotations

import random
import tracemalloc
from collections import deque

import pytest
from nri_framework.memo import RecentAnswers


def test_a_hit_returns_the_remembered_answer() -> None:
    memo: RecentAnswers[tuple[int, str], int] = RecentAnswers(4)
    assert memo.get((1, "a")) is None
    memo.keep((1, "a"), 10)
    memo.keep((2, "b"), 0)  # a falsy answer is an answer
    assert memo.get((1, "a")) == 10
    assert memo.get((2, "b")) == 0
    assert (2, "b") in memo and (3, "c") not in memo
    assert len(memo) == 2


def test_the_oldest_kept_is_evicted_first() -> None:
    """Full: a new answer evicts the first kept; a hit makes no answer younger,
    keeping a known key again neither evicts nor moves it."""
    memo: RecentAnswers[int, str] = RecentAnswers(3)
    for k in (1, 2, 3):
        memo.keep(k, str(k))
    assert memo.get(1) == "1"  # a hit: 1 stays the oldest
    memo.keep(2, "two")  # known: replaced in place, nothing evicted
    assert memo.keys() == [1, 2, 3] and memo.get(2) == "two"
    memo.keep(4, "4")
    assert memo.keys() == [2, 3, 4]
    assert memo.get(1) is None
    memo.keep(5, "5")
    memo.keep(1, "1")
    assert memo.keys() == [4, 5, 1]


def test_the_bound_holds_under_a_stream_of_distinct_keys() -> None:
    """A hostile peer choosing every question new: never more than ``limit``
    answers, the most recent ones, and the memory stays flat."""
    rng = random.Random(14)
    memo: RecentAnswers[bytes, bytes] = RecentAnswers(64)
    recent: deque[bytes] = deque(maxlen=64)
    settled = 0
    tracemalloc.start()
    try:
        for i in range(20_000):
            key = rng.randbytes(32)
            memo.keep(key, key)
            recent.append(key)
            assert len(memo) == min(i + 1, 64)
            if i == 1_000:
                settled = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - settled
    finally:
        tracemalloc.stop()
    assert memo.keys() == list(recent)
    assert grown < 64 * 1024  # 19,000 more keys: no more memory than the bound's


def test_clear_forgets_every_answer() -> None:
    memo: RecentAnswers[int, int] = RecentAnswers(2)
    memo.keep(1, 1)
    memo.clear()
    assert len(memo) == 0 and memo.get(1) is None
    memo.keep(2, 2)  # get still reads the memo's own dict after a clear
    assert memo.get(2) == 2


def test_a_memo_keeps_at_least_one_answer() -> None:
    with pytest.raises(ValueError, match="keeps none"):
        RecentAnswers(0)

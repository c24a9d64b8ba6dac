"""``cpuset.ids`` of a set of a few ids walks its bits one by one (a decision's
balloon of a core or two, its dirty CPUs: one bit each, not a generator of
runs); the previous implementation (the runs of :func:`cpuset.ranges`, kept
here) is the oracle, on masks around the sparse bound: sparse, runs, high ids,
the empty set, and a negative mask (the same error)."""

from __future__ import annotations

import random

import pytest
from nri_framework import cpuset


def previous_ids(mask: int) -> list[int]:
    out: list[int] = []
    for a, b in cpuset.ranges(mask):
        out.extend(range(a, b + 1))
    return out


def masks(rng: random.Random) -> list[int]:
    out = [0, 1, 1 << 8191, (1 << 8192) - 1]
    for _ in range(3000):
        width = rng.choice((8, 64, 256, 8192))
        bits = rng.randint(1, cpuset.SPARSE_IDS + 3)
        kind = rng.random()
        if kind < 0.4:  # spread
            mask = 0
            for i in rng.sample(range(width), min(bits, width)):
                mask |= 1 << i
        elif kind < 0.7:  # one run
            mask = ((1 << bits) - 1) << rng.randrange(width)
        else:  # siblings: i and i + half
            mask = 0
            for i in rng.sample(range(width // 2), min(bits, width // 2)):
                mask |= 1 << i | 1 << (i + width // 2)
        out.append(mask)
    return out


def test_ids_equal_the_runs_walk() -> None:
    rng = random.Random(20261202)
    seen_sparse = seen_dense = 0
    for mask in masks(rng):
        assert cpuset.ids(mask) == previous_ids(mask), hex(mask)
        if mask.bit_count() <= cpuset.SPARSE_IDS:
            seen_sparse += 1
        else:
            seen_dense += 1
    assert seen_sparse > 500 and seen_dense > 500  # both ways were taken


@pytest.mark.parametrize("mask", [-1, -2, -(1 << 70), -5])
def test_a_negative_mask_is_the_same_error(mask: int) -> None:
    with pytest.raises(cpuset.CpusetError, match="negative cpuset mask"):
        previous_ids(mask)
    with pytest.raises(cpuset.CpusetError, match="negative cpuset mask"):
        cpuset.ids(mask)

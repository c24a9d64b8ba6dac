"""Recent answers of a pure function, bounded: the one memo of the plugin.

A decision asks the same questions again and again (the same free CPUs and
size, the same CPU set's nodes, the same namespace of a balloon type, the same
resources of a Synchronize's containers); the answers depend on the question
alone. :class:`RecentAnswers` keeps the last ``limit`` of them, so that memory
stays bounded whatever the questions are: a peer (a runtime, a pod owner)
choosing them can make every one new.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["RecentAnswers"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RecentAnswers(Generic[K, V]):
    """The answers of a pure function of ``K``, at most ``limit`` of them.

    The rule when full: a new answer evicts the **oldest kept** (the first
    kept of those still there; a hit does not make an answer younger). Why
    this rule and not another:

    * clearing all when full would forget a node's few steady questions every
      ``limit`` new ones, so that a stream of distinct keys (hostile or just
      many) costs the steady ones too, all at once;
    * refusing new keys when full would keep the first ``limit`` questions
      forever, answers of a workload that may be long gone, and never learn
      the node's current ones;
    * evicting the least recently *used* would keep hot answers better, but
      it costs a reorder on every hit, and the hit is the path a memo is for;
      evicting the oldest kept costs one dict deletion per miss, and a steady
      question evicted comes back on its next miss.

    ``get`` gives ``None`` for a question not (or no longer) kept: a function
    whose answer can be ``None`` is not one to keep here.
    """

    __slots__ = ("_got", "get", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a memo of at most {limit} answers keeps none")
        self.limit = limit
        self._got: dict[K, V] = {}
        #: the answer kept for a key, or ``None`` (the dict's own ``get``: the
        #: hit costs what a dict's does)
        self.get = self._got.get

    def __len__(self) -> int:
        return len(self._got)

    def __contains__(self, key: object) -> bool:
        return key in self._got

    def keep(self, key: K, value: V) -> None:
        """Remember ``value`` as the answer for ``key``; when ``limit`` answers
        are kept already, the oldest kept is forgotten first."""
        got = self._got
        if key not in got and len(got) >= self.limit:
            del got[next(iter(got))]
        got[key] = value

    def clear(self) -> None:
        """Forget every answer (what they were answers of changed)."""
        self._got.clear()

    def keys(self) -> list[K]:
        """The questions kept, oldest first (for tests and inspection)."""
        return list(self._got)

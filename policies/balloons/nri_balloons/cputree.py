"""The CPU tree allocator of the balloons policy (upstream ``cputree.go``).

A :class:`CpuTreeAllocator` belongs to one balloon. :meth:`CpuTreeAllocator.resize`
answers "which CPUs should this balloon gain (``delta > 0``) or give up
(``delta < 0``)": the resizer chain of ``ResizeCpus`` narrows the choice down to a
candidate set, then the shared :class:`~nri_balloons.cpuallocator.CpuAllocator` makes the
exact pick (``AllocateCpus``/``ReleaseCpus``), as ``resizeBalloon`` does upstream.
:meth:`CpuTreeAllocator.candidates` is ``ResizeCpus`` alone.

The chain, in order (each step may call the rest of the chain):

1. only-if-necessary: ``delta == 0`` does nothing; too few free (current) CPUs
   raise :class:`ResizeError`; an exact fit takes every free (current) CPU.
2. dynamic device hints: with an ``on_cpu_pick`` hook (load classes with
   ``overloadsLevelInBalloon``), CPUs are picked one at a time and the hook runs
   with the grown CPU set after each pick, so the next pick sees updated hints.
3. devices: ``prefer_close_to`` hints (each one CPU mask or a list of alternative
   masks, in priority order), then ``prefer_far_from`` hints as "free minus far".
   Inflate keeps ``free & hint`` while it still has ``delta`` CPUs, else drops the
   hint. Deflate scores current CPUs by the hints holding them and frees the
   lowest-scored ones.
4. one at a time: deflate always, and inflate with ``prefer_spread_on_physical_cores``,
   pick single CPUs from the rest of the chain.
5. max local set: the deepest tree node that can give (take) ``|delta|`` CPUs, best
   by the balloon's current CPUs per level (stay local), then by free CPUs per level
   (balancing: most free; packing: least free), then by name.
6. now: the node's free (current) CPUs are the candidates.

The tree is :meth:`nri_framework.topology.Topology.tree` (upstream's node names);
with ``prefer_spread_on_physical_cores`` every NUMA node is split into classes by
thread index (``<numa>class<k>``), so first threads of all cores are used first.

Hints are already CPU masks: resolving device paths (``topology.NewTopologyHints``)
and ``podresourceapi:`` devices is the caller's business. Upstream quirks kept:
on deflate a far-from hint (``free & ~far``) never contains current CPUs, so it
only lowers the weight of the other hints; the ``not enough free CPUs`` text of the
max-local-set step is used for deflate too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from nri_framework import cpuset
from nri_framework.memo import RecentAnswers
from nri_framework.topology import Topology, TreeNode

from nri_balloons.cpuallocator import PICKS_MAX, CpuAllocator, ResizeError
from nri_balloons.cpupriority import CpuPriority
from nri_balloons.devices import VirtualDevice
from nri_balloons.flattree import FlatTree, flat_tree

log = logging.getLogger("nri_balloons.cputree")

__all__ = [
    "NO_HINTS",
    "CpuTreeAllocator",
    "Hint",
    "OnCpuPick",
    "ResizeError",
    "ResizeHints",
    "cpu_locations",
]

Hint = int | VirtualDevice | Sequence[int]
"""A topology hint: one CPU mask, a list of alternative masks, or a virtual device
whose ``cpusets`` are read at every resize. An empty list is no hint at all; the
mask 0 is a hint that never fits (as a virtual device with an empty set upstream)."""


class ResizeHints(msgspec.Struct, frozen=True):
    """The hints of one resize, passed down the chain: ``prefer`` after the type's
    ``prefer_close_to``, ``avoid`` after its ``prefer_far_from``."""

    prefer: tuple[Hint, ...] = ()
    avoid: tuple[Hint, ...] = ()


NO_HINTS = ResizeHints()


OnCpuPick = Callable[[int], None]
"""Called with the balloon's (growing) CPU set before a resize and after each
single-CPU pick of an inflate (``deviceUpdateOnEveryCpu``)."""

_F = cpuset.format


def cpu_locations(topology: Topology, cpus: int) -> list[list[str]]:
    """``CpuLocations``: per tree level (0 system, 1 packages, 2 dies, 3 NUMA nodes,
    4 L2 caches, 5 cores, 6 threads) the names of the nodes holding ``cpus``."""
    out: list[list[str]] = [[] for _ in range(7)]
    stack: list[tuple[TreeNode, int]] = [(topology.tree(), 0)]
    while stack:
        node, d = stack.pop()
        if not node.cpus & cpus:
            continue
        out[d].append(node.name)
        stack.extend((child, d + 1) for child in reversed(node.children))
    return out


# ---------------------------------------------------------------------------
# the allocator


def _hint_cpusets(hint: Hint) -> Sequence[int]:
    if isinstance(hint, int):
        return (hint,)
    if isinstance(hint, VirtualDevice):
        return hint.cpusets
    return hint


class CpuTreeAllocator:
    """Chooses the CPUs a balloon gains or gives up (``cpuTreeAllocator``).

    The options are the balloon type's (upstream ``allocatorOptions``), plain
    attributes read at each resize; the hints of one resize only (cpuClass hints)
    are an argument of :meth:`resize` and :meth:`candidates` (:class:`ResizeHints`),
    used after the type's own.
    ``cpu_allocator`` is shared by all balloons of a policy (one is made when
    omitted); ``allocator_priority`` is the balloon type's ``allocatorPriority``."""

    def __init__(
        self,
        topology: Topology,
        *,
        topology_balancing: bool = False,
        prefer_spread_on_physical_cores: bool = False,
        prefer_close_to: Sequence[Hint] = (),
        prefer_far_from: Sequence[Hint] = (),
        on_cpu_pick: OnCpuPick | None = None,
        allocator_priority: CpuPriority = CpuPriority.NONE,
        cpu_allocator: CpuAllocator | None = None,
    ) -> None:
        self.topology = topology
        self.topology_balancing = topology_balancing
        self.prefer_close_to: Sequence[Hint] = list(prefer_close_to)
        self.prefer_far_from: Sequence[Hint] = list(prefer_far_from)
        self.on_cpu_pick = on_cpu_pick
        self.allocator_priority = allocator_priority
        self.cpu_allocator = cpu_allocator if cpu_allocator is not None else CpuAllocator(topology)
        self._spread = prefer_spread_on_physical_cores
        self._tree = flat_tree(topology, self._spread)
        self._reach: dict[int, tuple[int, ...]] = {}
        """need -> :func:`_reach` for the smallest node size >= need (shared by
        the needs of one size; the size's own entry under ``-size``)"""
        self._best_nodes: RecentAnswers[tuple[int, int, int, bool], int]
        self._best_nodes = RecentAnswers(PICKS_MAX)
        """(current, free, delta, balancing) -> the max local set's node
        (:meth:`_best_node`; -1: none), for this tree"""
        self._resizers: tuple[Callable[[int, ResizeHints, int, int, int], tuple[int, int]], ...] = (
            self._only_if_necessary,
            self._dynamic_device_hints,
            self._devices,
            self._one_at_a_time,
            self._max_local_set,
            self._now,
        )

    @property
    def prefer_spread_on_physical_cores(self) -> bool:
        return self._spread

    @prefer_spread_on_physical_cores.setter
    def prefer_spread_on_physical_cores(self, value: bool) -> None:
        self._spread = value
        self._tree = flat_tree(self.topology, value)
        self._reach = {}
        self._best_nodes.clear()

    def __repr__(self) -> str:
        return (
            f"CpuTreeAllocator(balancing={self.topology_balancing}, "
            f"spread={self._spread}, close={self.prefer_close_to!r}, "
            f"far={self.prefer_far_from!r}, priority={self.allocator_priority})"
        )

    # -- API ------------------------------------------------------------------

    def resize(self, current: int, free: int, delta: int, hints: ResizeHints = NO_HINTS) -> int:
        """The CPUs to add to ``current`` (``delta > 0``, a subset of ``free``) or to
        remove from it (``delta < 0``, a subset of ``current``), exactly ``|delta|``
        of them; 0 for ``delta == 0``. CPUs outside the topology are ignored in
        both sets. ``hints``: those of this resize only, after the allocator's own
        (``prefer_close_to``/``prefer_far_from``). Raises :class:`ResizeError`."""
        if delta > 0:
            add_from, _ = self.candidates(current, free, delta, hints)
            return self.cpu_allocator.allocate(add_from, delta, self.allocator_priority)
        if delta < 0:
            _, remove_from = self.candidates(current, free, delta, hints)
            return self.cpu_allocator.release(remove_from, -delta, self.allocator_priority)
        return 0

    def candidates(
        self, current: int, free: int, delta: int, hints: ResizeHints = NO_HINTS
    ) -> tuple[int, int]:
        """``ResizeCpus``: ``(add_from, remove_from)``; inflate picks ``delta`` CPUs
        of ``add_from`` (a subset of ``free``, possibly larger than ``delta``),
        deflate ``-delta`` CPUs of ``remove_from`` (a subset of ``current``)."""
        online = self.topology.online
        current &= online
        free &= online & ~current
        return self._next(0, hints, current, free, delta)

    # -- the chain --------------------------------------------------------------

    def _next(
        self, stage: int, hints: ResizeHints, current: int, free: int, delta: int
    ) -> tuple[int, int]:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "- resizer-%d(%r, %r, %d)",
                len(self._resizers) - stage - 1,
                _F(current),
                _F(free),
                delta,
            )
        return self._resizers[stage](stage + 1, hints, current, free, delta)

    def _only_if_necessary(
        self, nxt: int, hints: ResizeHints, current: int, free: int, delta: int
    ) -> tuple[int, int]:
        if delta == 0:
            return 0, 0
        if delta > 0:
            nfree = free.bit_count()
            if nfree < delta:
                ncur = current.bit_count()
                raise ResizeError(
                    f"not enough free CPUs ({nfree}) to resize current CPU set "
                    f"from {ncur} to {ncur + delta} CPUs"
                )
            if nfree == delta:
                return free, 0
        else:
            ncur = current.bit_count()
            if ncur < -delta:
                raise ResizeError(f"not enough current CPUs ({ncur}) to release {-delta} CPUs")
            if ncur == -delta:
                return 0, current
        return self._next(nxt, hints, current, free, delta)

    def _dynamic_device_hints(
        self, nxt: int, hints: ResizeHints, current: int, free: int, delta: int
    ) -> tuple[int, int]:
        hook = self.on_cpu_pick
        if hook is None:
            return self._next(nxt, hints, current, free, delta)
        hook(current)
        if delta <= 0:
            return self._next(nxt, hints, current, free, delta)
        # Ask for all delta CPUs first: the lowest of that set is a good seed for
        # CPUs close to each other. Then pick one CPU at a time.
        add_from, remove_from = self._next(nxt, hints, current, free, delta)
        if add_from.bit_count() < delta:
            return add_from, remove_from
        added = 0
        while True:
            cpu = add_from & -add_from
            added |= cpu
            if added.bit_count() >= delta:
                break
            current |= cpu
            free &= ~current
            hook(current)
            add_from, remove_from = self._next(nxt, hints, current, free, 1)
            if not add_from:
                return added, remove_from
        return added | add_from, remove_from

    def _devices(
        self, nxt: int, hints: ResizeHints, current: int, free: int, delta: int
    ) -> tuple[int, int]:
        debug = log.isEnabledFor(logging.DEBUG)
        # All hint sets in priority order: the first ones win conflicts.
        hint_sets: list[Sequence[int]] = []
        for hint in (*self.prefer_close_to, *hints.prefer):
            sets = _hint_cpusets(hint)
            if sets:
                if debug:
                    log.debug("  - prepare: close to %r, prefer cpusets: %s", hint, _fmt(sets))
                hint_sets.append(sets)
        for hint in (*self.prefer_far_from, *hints.avoid):
            for far in _hint_cpusets(hint):
                if debug:
                    log.debug("  - prepare: far from %r, prefer cpusets: %s", hint, _F(free & ~far))
                hint_sets.append((free & ~far,))
        if not hint_sets:
            return self._next(nxt, hints, current, free, delta)
        if delta > 0:
            remaining = free
            applied = total = 0
            for sets in hint_sets:
                for cpus in sets:
                    total += 1
                    common = remaining & cpus
                    if common.bit_count() >= delta:
                        applied += 1
                        if debug:
                            log.debug(
                                "  - take hinted cpus %r, common free %r", _F(cpus), _F(common)
                            )
                        remaining = common
                    elif debug:
                        log.debug(
                            "  - drop hinted cpus %r, not enough common free in %r",
                            _F(cpus),
                            _F(common),
                        )
            if debug:
                log.debug(
                    "  - original free cpus %r, took %d/%d hints, remaining free: %r",
                    _F(free),
                    applied,
                    total,
                    _F(remaining),
                )
            return self._next(nxt, hints, current, remaining, delta)
        if delta < 0:
            # Score current CPUs by the hints holding them; free the least hinted
            # for sure, let the rest of the chain choose among the tie group.
            n = len(hint_sets)
            cur_ids = cpuset.ids(current)
            score = dict.fromkeys(cur_ids, 0)
            for prio, sets in enumerate(hint_sets):
                weight = 1 << (n - 1 - prio)
                for cpus in sets:
                    for cpu in cpuset.ids(cpus & current):
                        score[cpu] += weight
            least_hinted = sorted(cur_ids, key=score.__getitem__)
            max_hints = score[least_hinted[-delta]]
            for_sure = maybe = 0
            for cpu in least_hinted:
                s = score[cpu]
                if s > max_hints:
                    break
                if s < max_hints:
                    for_sure |= 1 << cpu
                else:
                    maybe |= 1 << cpu
            remaining_delta = delta + for_sure.bit_count()
            if debug:
                log.debug(
                    "  - device hints: from cpus %r: free for sure: %r and %d more from: %r",
                    _F(current),
                    _F(for_sure),
                    -remaining_delta,
                    _F(maybe),
                )
            _, free_from_maybe = self._next(nxt, hints, maybe, free, remaining_delta)
            for cpu in cpuset.ids(free_from_maybe):
                if for_sure.bit_count() >= -delta:
                    break
                for_sure |= 1 << cpu
            return free, for_sure
        return free, current

    def _one_at_a_time(
        self, nxt: int, hints: ResizeHints, current: int, free: int, delta: int
    ) -> tuple[int, int]:
        if delta > 0:
            try:
                superset_add, superset_remove = self._next(nxt, hints, current, free, delta)
            except ResizeError:
                if not self._spread:
                    raise
                superset_add = superset_remove = 0
            if not self._spread or superset_add.bit_count() == delta:
                return superset_add, superset_remove
            # With preferSpreadOnPhysicalCores the candidates are not equally good:
            # build the set one CPU at a time.
            add_from = 0
            for n in range(delta):
                single, _ = self._next(nxt, hints, current, free, 1)
                if single.bit_count() != 1:
                    raise ResizeError(
                        "internal error: failed to find single CPU to allocate, "
                        f"currentCpus={_F(current)} freeCpus={_F(free)} "
                        f"expectedSingle={_F(single)}"
                    )
                add_from |= single
                if add_from.bit_count() != n + 1:
                    raise ResizeError(
                        f"internal error: double add the same CPU ({_F(single)}) "
                        f"to cpuset {_F(add_from)} on round {n + 1}"
                    )
                current |= single
                free &= ~single
            return add_from, superset_remove
        # Release CPUs one by one instead of looking for one topology element
        # from which all of them could be released.
        remove_from = 0
        for n in range(-delta):
            _, single = self._next(nxt, hints, current, free, -1)
            if single.bit_count() != 1:
                raise ResizeError(
                    "internal error: failed to find single cpu to free, "
                    f"currentCpus={_F(current)} freeCpus={_F(free)} expectedSingle={_F(single)}"
                )
            if (remove_from | single).bit_count() != n + 1:
                raise ResizeError(
                    "internal error: double release of a cpu, "
                    f"currentCpus={_F(current)} freeCpus={_F(free)} "
                    f"alreadyRemoved={_F(remove_from)} removedNow={_F(single)}"
                )
            remove_from |= single
            current &= ~single
            free |= single
        return 0, remove_from

    def _reach_for(self, need: int) -> tuple[int, ...]:
        """:func:`_reach` for nodes that can give or take ``need`` CPUs (one per
        node size of the tree)."""
        got = self._reach.get(need)
        if got is None:
            size = min((n for n in set(self._tree.sizes) if n >= need), default=need)
            got = self._reach.get(-size)  # a size's own entry: one tuple per size
            if got is None:
                got = self._reach[-size] = _reach(self._tree, size)
            self._reach[need] = got
        return got

    def _max_local_set(
        self, nxt: int, hints: ResizeHints, current: int, free: int, delta: int
    ) -> tuple[int, int]:
        """The best tree node that can give (take) ``|delta|`` CPUs
        (:meth:`_best_node`, remembered for the last sets asked about); the
        rest of the chain chooses within it."""
        key = (current, free, delta, self.topology_balancing)
        best = self._best_nodes.get(key)
        if best is None:
            best = self._best_node(current, free, delta)
            self._best_nodes.keep(key, best)
        if best < 0:
            raise ResizeError("not enough free CPUs")
        t = self._tree
        if log.isEnabledFor(logging.DEBUG):
            log.debug("  - max local set: %s", t.names[best])
        mask = t.masks[best]
        return self._next(nxt, hints, current & mask, free & mask, delta)

    def _best_node(self, current: int, free: int, delta: int) -> int:
        """The best tree node that can give (take) ``|delta|`` CPUs; -1: none.

        Upstream flattens the tree into per-node count vectors and sorts them
        (``ToAttributedSlice``, ``sorterAllocate``/``sorterRelease``). Here one
        preorder pass keeps the best node, with the same result (a test compares
        both on random inputs):

        - a subtree that cannot fit ``|delta|`` is skipped whole (upstream's filter);
        - a node's key is built from its parent's: the count paths are nested pairs
          ``(parent_path, count)``, which compare like the flat vectors;
        - bit operations use the parent's CPU sets shifted down to the node's
          lowest CPU, so they shrink with the subtree;
        - the single-CPU leaves of a node are not visited one by one: all passing
          leaves of a node have equal count paths, so the first in name order is
          its best leaf;
        - levels whose nodes all have one child with the same CPUs were dropped
          when the tree was flattened (see :func:`drop_trivial_levels`);
        - a subtree that cannot beat the best node so far is skipped whole: its
          deepest node big enough is shallower than the best, or as deep and its
          count path already below the best's at this depth (every node of it
          extends that path; the deeper count paths compare before the free
          ones), or, inflating, it holds no current CPU, its count path equals
          the best's and its free path is below. A balloon growing one CPU at a
          time walks the branch of its CPUs, not the machine."""
        t = self._tree
        sizes, depth, parent, end, rank = t.sizes, t.depth, t.parent, t.end, t.rank
        rel, shift, leaves = t.rel, t.shift, t.leaves
        n = len(sizes)
        need = delta if delta > 0 else -delta
        reach = self._reach_for(need)
        inflate = delta > 0
        sign = 1 if self.topology_balancing else -1
        # Per visited node: count paths, and its free/current CPUs shifted down by
        # its base CPU (so bit operations shrink with the subtree, not the machine).
        cpath: list[Any] = [None] * (n + 1)
        fpath: list[Any] = [None] * (n + 1)
        lfree = [0] * (n + 1)
        lcur = [0] * (n + 1)
        cpath[n] = fpath[n] = ()
        lfree[n], lcur[n] = free, current
        best = -1
        best_depth = -1
        best_key: tuple[Any, Any, int] = ((), (), 0)
        # the best's count and free paths at each depth (built on use)
        bpath: list[Any] | None = None
        bfpath: list[Any] = []
        i = 0
        while i < n:
            if sizes[i] < need:
                i = end[i]
                continue
            p = parent[i]
            if inflate:
                sel = (lfree[p] >> shift[i]) & rel[i]
                f = sel.bit_count()
                if f < need:
                    i = end[i]
                    continue
                lc = (lcur[p] >> shift[i]) & rel[i]
                c = lc.bit_count()
                lfree[i], lcur[i] = sel, lc
                # Allocate: more current CPUs first (stay local), then most
                # (balancing) or least (packing) free CPUs, then name ascending.
                cp = cpath[i] = (cpath[p], c)
                fp = fpath[i] = (fpath[p], f * sign)
                r = -rank[i]
            else:
                sel = (lcur[p] >> shift[i]) & rel[i]
                c = sel.bit_count()
                if c < need:
                    i = end[i]
                    continue
                lf = (lfree[p] >> shift[i]) & rel[i]
                f = lf.bit_count()
                lfree[i], lcur[i] = lf, sel
                # Release: fewer current CPUs first, then fewer free CPUs, then
                # name descending.
                cp = cpath[i] = (cpath[p], -c)
                fp = fpath[i] = (fpath[p], -f)
                r = rank[i]
            d = depth[i]
            if d > best_depth:
                best, best_depth, best_key, bpath = i, d, (cp, fp, r), None
            elif d == best_depth:
                key = (cp, fp, r)
                if key > best_key:
                    best, best_key, bpath = i, key, None
            elif reach[i] <= best_depth:
                # no node below that passes can be deeper than the best: skip the
                # subtree when its paths already lose at this depth
                if reach[i] < best_depth:
                    i = end[i]
                    continue
                if bpath is None:
                    bpath, bfpath = _prefixes(best_key, best_depth)
                if cp < bpath[d]:
                    i = end[i]
                    continue
                # an inflate's node without current CPUs: no count path below
                # exceeds the best's, and an equal one loses on the free path
                if inflate and not c and fp < bfpath[d] and cp == bpath[d]:
                    i = end[i]
                    continue
            kids = leaves[i]
            if kids:
                # Single-CPU leaves: they pass only when need == 1, and then all
                # passing leaves of this node have the same count paths (a free
                # leaf holds no current CPU and vice versa), so the best one is the
                # first passing leaf in name order. Skip visiting them one by one.
                if need == 1 and d + 1 >= best_depth:
                    for bit, k in kids if inflate else reversed(kids):
                        if sel & bit:
                            if inflate:
                                key = ((cp, 0), (fp, sign), -rank[k])
                            else:
                                key = ((cp, -1), (fp, 0), rank[k])
                            if d + 1 > best_depth or key > best_key:
                                best, best_depth, best_key, bpath = k, d + 1, key, None
                            break
                i = end[i]
                continue
            i += 1
        return best

    def _now(
        self, nxt: int, hints: ResizeHints, current: int, free: int, delta: int
    ) -> tuple[int, int]:
        return free, current


def _reach(tree: FlatTree, size: int) -> tuple[int, ...]:
    """Node -> the depth of the deepest node of its subtree holding ``size`` CPUs
    or more (-1: none)."""
    reach = [d if n >= size else -1 for d, n in zip(tree.depth, tree.sizes, strict=True)]
    for i in range(len(reach) - 1, 0, -1):
        p = tree.parent[i]
        if reach[i] > reach[p]:
            reach[p] = reach[i]
    return tuple(reach)


def _prefixes(key: tuple[Any, Any, int], depth: int) -> tuple[list[Any], list[Any]]:
    """The count and free paths of ``key`` (a node at ``depth``) cut at each depth."""
    cpath: list[Any] = [None] * (depth + 1)
    fpath: list[Any] = [None] * (depth + 1)
    c, f = key[0], key[1]
    for j in range(depth, -1, -1):
        cpath[j], fpath[j] = c, f
        c, f = c[0], f[0]
    return cpath, fpath


def _fmt(sets: Sequence[int]) -> str:
    return "[" + " ".join(_F(m) for m in sets) + "]"

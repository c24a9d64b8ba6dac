"""The final CPU pick of the balloons policy: a port of upstream's ``pkg/cpuallocator``.

Every CPU set is an ``int`` bitmask (see :mod:`nri_framework.cpuset`).

:class:`CpuAllocator` ports upstream's ``pkg/cpuallocator`` (``AllocateCpus`` and
``ReleaseCpus``): after the CPU tree (:mod:`nri_balloons.cputree`) has narrowed a
resize down to a candidate set, it picks the exact CPUs, preferring in turn idle
packages, idle CPU clusters (hybrid CPUs only), idle or partly used cache groups,
idle cores and finally single threads, ordered by the CPU priority the balloon
type asked for (``allocatorPriority``). What is left out or changed:

- CPU priorities are a constructor input (``priorities``, see
  :mod:`nri_balloons.cpupriority`); without one they come from cpufreq.
- CPU clusters (used only on hybrid CPUs) are the L2 groups of each die: the
  topology does not read ``topology/cluster_id``, and on Intel hybrid parts a
  cluster is the set of cores sharing an L2.
- Cache groups: the grouping cache level is chosen among L3 and L2 the way upstream
  does (the first level, from the top, whose group is neither a core, a die nor a
  package). L1 is never considered (it is per core on every supported CPU).
- Two upstream slips are fixed in ``takeCacheGroups``: the usable-group sort
  compares package/die ids of the best idle group (upstream compares them with CPU
  *counts*, so the rule never fires), and the never-reachable "fewest groups of one
  size" branch (its ``n < take`` test starts from ``take = 0``) is dropped.
- Offline CPUs are not modelled: the topology only holds online CPUs.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Mapping, Sequence

import msgspec
from nri_framework import cpuset
from nri_framework.memo import RecentAnswers
from nri_framework.topology import Topology

from nri_balloons.cpupriority import PRIOS, CpuPriority, Priorities, cpufreq_priorities

log = logging.getLogger("nri_balloons.cpus")  # the logger these lines always had

__all__ = ["PICKS_MAX", "AllocFlag", "CpuAllocator", "ResizeError"]

PICKS_MAX = 256
"""Picks remembered (:class:`~nri_framework.memo.RecentAnswers`; each key a
few CPU masks: ~40 KiB on a 256-CPU machine)."""


class ResizeError(ValueError):
    """A CPU set cannot be resized (or allocated from) as asked; the message is
    upstream's text."""


class AllocFlag(enum.IntFlag):
    IDLE_PACKAGES = 1
    IDLE_CLUSTERS = 2
    CACHE_GROUPS = 4
    IDLE_CORES = 8
    DEFAULT = IDLE_PACKAGES | IDLE_CLUSTERS | CACHE_GROUPS | IDLE_CORES


class _Cluster(msgspec.Struct, frozen=True):
    pkg: int
    die: int
    cluster: int
    cpus: int
    efficient: bool


class _CacheGroup(msgspec.Struct, frozen=True):
    id: int
    pkg: int
    die: int
    node: int
    cpus: int
    efficient: bool


def _ids_by_group(from_: int, table: list[int]) -> list[tuple[int, int]]:
    """``(lowest cpu, group mask)`` of each group of ``table`` that ``from_`` touches."""
    out: list[tuple[int, int]] = []
    size = len(table)
    while from_:
        low = from_ & -from_
        cpu = low.bit_length() - 1
        group = (table[cpu] if cpu < size else 0) or low
        out.append(((group & -group).bit_length() - 1, group))
        from_ &= ~group
    return out


class CpuAllocator:
    """Topology-aware exact CPU picks (``cpuallocator.CPUAllocator``).

    One instance serves the whole policy: it holds the topology lookups and the CPU
    priorities; each call takes the balloon type's priority."""

    def __init__(self, topology: Topology, priorities: Mapping[CpuPriority, int] | None = None):
        self.topology = topology
        prios = cpufreq_priorities(topology) if priorities is None else dict(priorities)
        efficient = topology.efficient_cpus
        masks = [prios.get(p, 0) & topology.online for p in PRIOS]
        if topology.performance_cpus:
            # E-cores never count as high or normal priority CPUs.
            masks[CpuPriority.HIGH] &= ~efficient
            masks[CpuPriority.NORMAL] &= ~efficient
        self._prios = Priorities((masks[0], masks[1], masks[2]))
        self.hybrid = bool(efficient and topology.performance_cpus)

        size = topology.online.bit_length()
        self._core_of = [0] * size
        for info in topology.cpus.values():
            self._core_of[info.id] = topology.core_masks[info.core]
        self._core_keys: dict[CpuPriority, dict[int, tuple[int, ...]]] = {p: {} for p in PRIOS}
        """priority -> core mask -> its priority sort key (at most one per core)"""
        self._packages = tuple(topology.package_masks.items())
        self._clusters = self._discover_clusters() if self.hybrid else ()
        self._cache_groups = self._discover_cache_groups()
        self._picks: RecentAnswers[tuple[int, int, CpuPriority, AllocFlag], int]
        self._picks = RecentAnswers(PICKS_MAX)
        """(from, count, priority, flags) -> the CPUs :meth:`allocate` picked:
        its answer depends on nothing else (the topology and the priorities
        are this allocator's for its life)"""

    @property
    def priorities(self) -> dict[CpuPriority, int]:
        """``GetCPUPriorities``: priority -> CPUs."""
        return {p: self._prios.masks[p] for p in PRIOS}

    # -- discovery ------------------------------------------------------------

    def _discover_clusters(self) -> tuple[_Cluster, ...]:
        topo = self.topology
        out: list[_Cluster] = []
        for pkg, _pkg_cpus in self._packages:
            clusters: list[_Cluster] = []
            for (dpkg, die), die_cpus in topo.die_masks.items():
                if dpkg != pkg:
                    continue
                seen = 0
                for cpu in cpuset.ids(die_cpus):
                    if seen >> cpu & 1:
                        continue
                    key = topo.cpus[cpu].l2
                    cpus = topo.l2_masks[key] & die_cpus
                    seen |= cpus
                    clusters.append(
                        _Cluster(pkg, die, key, cpus, bool(topo.efficient_cpus >> cpu & 1))
                    )
            if len(clusters) > 1:
                out.extend(clusters)
        return tuple(out)

    def _grouping_masks(self) -> dict[int, int] | None:
        """``pickCacheLevelForGrouping``: the cache level (L3, then L2) whose groups
        are neither cores, dies nor packages, judged on the first CPU that has one."""
        topo = self.topology
        for cpu, info in topo.cpus.items():
            for masks, key in ((topo.l3_masks, info.l3), (topo.l2_masks, info.l2)):
                cpus = masks[key]
                if cpus.bit_count() <= 1 or cpus in (
                    topo.core_masks[info.core],
                    topo.die_masks[info.die_key],
                    topo.package_masks[info.package],
                ):
                    continue
                level = 2 if masks is topo.l2_masks else 3
                log.debug("picked cache level %d for CPU grouping (CPU %d)", level, cpu)
                return masks
        return None

    def _discover_cache_groups(self) -> tuple[_CacheGroup, ...]:
        topo = self.topology
        masks = self._grouping_masks()
        if masks is None:
            log.debug("no cache level provides useful CPU grouping")
            return ()
        l3 = masks is topo.l3_masks
        raw: list[tuple[int, int, int, int, bool]] = []
        for _pkg, pkg_cpus in self._packages:
            groups: list[tuple[int, int, int, int, bool]] = []
            assigned = 0
            for cpu in cpuset.ids(pkg_cpus):
                if assigned >> cpu & 1:
                    continue
                info = topo.cpus[cpu]
                cpus = masks[info.l3 if l3 else info.l2]
                if cpus.bit_count() <= 1 or cpus in (
                    topo.core_masks[info.core],
                    topo.die_masks[info.die_key],
                    pkg_cpus,
                ):
                    continue
                groups.append(
                    (info.package, info.die, info.node, cpus, bool(topo.efficient_cpus >> cpu & 1))
                )
                assigned |= cpus
            if len(groups) > 1:
                raw.extend(groups)
        for pkg, _die, node, cpus, _eff in raw:
            for c in cpuset.ids(cpus):
                other = topo.cpus[c]
                if other.package != pkg or other.node != node:
                    log.warning(
                        "CPU #%d in a cache group spans package/node %d/%d != %d/%d; "
                        "not using cache groups",
                        c,
                        other.package,
                        other.node,
                        pkg,
                        node,
                    )
                    return ()
        by_die = all(
            topo.cpus[c].die == die for _p, die, _n, cpus, _e in raw for c in cpuset.ids(cpus)
        )
        raw.sort(key=lambda g: (g[0], g[1] if by_die else 0, g[2], (g[3] & -g[3]).bit_length()))
        return tuple(
            _CacheGroup(i, pkg, die, node, cpus, eff)
            for i, (pkg, die, node, cpus, eff) in enumerate(raw)
        )

    # -- API --------------------------------------------------------------------

    def allocate(
        self,
        from_: int,
        cnt: int,
        prefer: CpuPriority = CpuPriority.NONE,
        *,
        flags: AllocFlag = AllocFlag.DEFAULT,
    ) -> int:
        """``AllocateCpus``: ``cnt`` CPUs of ``from_``."""
        size = from_.bit_count()
        if size < cnt:
            raise ResizeError(f"cpuset {cpuset.format(from_)} does not have {cnt} CPUs")
        if size == cnt:
            return from_
        debug = log.isEnabledFor(logging.DEBUG)
        key = (from_, cnt, prefer, flags)
        if not debug:  # with debug, the steps' lines are logged again (above
            # debug they log nothing that can happen: the internal error cannot)
            got = self._picks.get(key)
            if got is not None:
                return got
        helper = _Helper(self, from_, cnt, prefer, flags)
        result = helper.allocate()
        self._picks.keep(key, result)
        if debug:
            log.debug(
                "%d cpus from #%s (preferring #%s) => #%s",
                cnt,
                cpuset.format(from_),
                prefer,
                cpuset.format(result),
            )
        return result

    def release(self, from_: int, cnt: int, prefer: CpuPriority = CpuPriority.NONE) -> int:
        """``ReleaseCpus``: the ``cnt`` CPUs of ``from_`` to give up; the kept ones are
        picked as an allocation of ``|from_| - cnt`` CPUs."""
        if cnt > from_.bit_count():
            raise ResizeError(f"cpuset {cpuset.format(from_)} does not have {cnt} CPUs")
        kept = self.allocate(from_, from_.bit_count() - cnt, prefer)
        return from_ & ~kept


class _Helper:
    """``allocatorHelper``: the state of one allocation."""

    __slots__ = ("a", "cnt", "flags", "from_", "prefer", "result")

    def __init__(
        self, a: CpuAllocator, from_: int, cnt: int, prefer: CpuPriority, flags: AllocFlag
    ) -> None:
        self.a = a
        self.from_ = from_
        self.cnt = cnt
        self.prefer = prefer
        self.flags = flags
        self.result = 0

    def _take(self, cpus: int) -> None:
        self.result |= cpus
        self.from_ &= ~cpus
        self.cnt -= cpus.bit_count()

    def allocate(self) -> int:
        if self.flags & AllocFlag.IDLE_PACKAGES:
            self.take_idle_packages()
        if self.a.hybrid and self.cnt > 0 and self.flags & AllocFlag.IDLE_CLUSTERS:
            self.take_idle_clusters()
        if self.cnt > 0 and self.flags & AllocFlag.CACHE_GROUPS:
            self.take_cache_groups()
        if self.cnt > 0 and self.flags & AllocFlag.IDLE_CORES:
            self.take_idle_cores()
        if self.cnt > 0:
            self.take_idle_threads()
        return self.result if self.cnt == 0 else 0

    # -- steps ------------------------------------------------------------------

    def take_idle_packages(self) -> None:
        prios = self.a._prios
        prefer = self.prefer
        picked: list[tuple[int, int, int]] = []
        for pkg, pkg_cpus in self.a._packages:
            cset = pkg_cpus
            if prefer is not CpuPriority.NONE:
                cset &= prios.masks[prefer]
            if cset & self.from_ == cset:
                picked.append((pkg, pkg_cpus, cset))
        if not picked:
            return
        picked.sort(key=lambda p: (prios.key(p[1], prefer), p[0]))
        for _pkg, _pkg_cpus, cset in picked:
            if self.cnt >= cset.bit_count():
                self._take(cset)
                if self.cnt == 0:
                    break

    def take_idle_clusters(self) -> None:
        if len(self.a._clusters) <= 1:
            return
        prefer = self.prefer
        clusters: list[_Cluster] = []
        pkg_cnt: dict[int, int] = {}
        die_cnt: dict[tuple[int, int], int] = {}
        for c in self.a._clusters:
            # E-clusters only for low priority requests, P-clusters for the others.
            if (prefer is CpuPriority.LOW) != c.efficient:
                continue
            if c.cpus & self.from_ != c.cpus:
                continue  # only fully idle clusters
            n = c.cpus.bit_count()
            clusters.append(c)
            pkg_cnt[c.pkg] = pkg_cnt.get(c.pkg, 0) + n
            die_cnt[(c.pkg, c.die)] = die_cnt.get((c.pkg, c.die), 0) + n
        if not clusters:
            return
        cnt = self.cnt

        def tightest(a: _Cluster, b: _Cluster) -> int:
            # Prefer the cluster, else die, else package that alone satisfies the
            # request, the tighter the better; ties go to smaller ids.
            for ca, cb in (
                (a.cpus.bit_count(), b.cpus.bit_count()),
                (die_cnt[(a.pkg, a.die)], die_cnt[(b.pkg, b.die)]),
                (pkg_cnt[a.pkg], pkg_cnt[b.pkg]),
            ):
                if ca >= cnt > cb:
                    return -1
                if ca < cnt <= cb:
                    return 1
                if ca >= cnt and cb >= cnt:
                    return (
                        (ca - cb) or (a.pkg - b.pkg) or (a.die - b.die) or (a.cluster - b.cluster)
                    )
            return 0

        clusters.sort(key=functools.cmp_to_key(tightest))
        first = clusters[0].cpus.bit_count()
        if first == cnt:
            self._take(clusters[0].cpus)
            return
        if first > cnt:
            return  # the tightest fit is too big: no cluster can be consumed fully
        for c in clusters:
            if self.cnt < c.cpus.bit_count():
                return
            self._take(c.cpus)
            if self.cnt == 0:
                return

    def take_cache_groups(self) -> None:
        groups_all = self.a._cache_groups
        if len(groups_all) <= 1 or self.cnt < 2:
            return
        s = _CacheGroupSorter(self, groups_all)
        if s.prefer:
            chosen_pkg = s.prefer[0].pkg
            prefer_pkg = s.prefer_pkg.get(chosen_pkg, 0)
            usable_pkg = s.usable_pkg.get(chosen_pkg, 0)
        elif s.usable:
            chosen_pkg = s.usable[0].pkg
            prefer_pkg = 0
            usable_pkg = s.usable_pkg.get(chosen_pkg, 0)
        else:
            return
        if prefer_pkg + usable_pkg < self.cnt:
            log.debug("=> no package can satisfy the allocation")
            return

        result, from_, cnt = self.result, self.from_, self.cnt
        for g in s.prefer:
            if cnt <= 0:
                break
            cset = s.cpus[g.id]
            if cnt >= cset.bit_count():
                use = cset
            else:
                use = _Helper(self.a, cset, cnt, self.prefer, AllocFlag.IDLE_CORES).allocate()
            result |= use
            from_ &= ~use
            cnt -= use.bit_count()
        if cnt <= 0:
            self.result, self.from_, self.cnt = result, from_, cnt
            return

        # Usable (partly allocated) groups of the chosen package, in sorted order.
        usable: list[_CacheGroup] = []
        by_size: dict[int, list[_CacheGroup]] = {}
        totals: list[int] = []
        total = 0
        for g in s.usable:
            if g.pkg != chosen_pkg:
                break  # never cross a package boundary
            size = s.cpus[g.id].bit_count()
            usable.append(g)
            by_size.setdefault(size, []).append(g)
            total += size
            totals.append(total)
        exact = by_size.get(cnt)
        if exact:
            cset = s.cpus[exact[0].id]
            self.result, self.from_, self.cnt = result | cset, from_ & ~cset, 0
            return
        ngroups = 0
        ncpus = 0
        for i, t in enumerate(totals):
            ngroups, ncpus = i + 1, t
            if cnt <= t:
                break
        if ncpus < cnt:
            log.debug("=> %d CPUs in usable cache groups < needed %d", ncpus, cnt)
            return
        for g in usable[:ngroups]:
            cset = s.cpus[g.id]
            if cnt < cset.bit_count():
                break
            result |= cset
            from_ &= ~cset
            cnt -= cset.bit_count()
        if cnt > 0:
            cset = s.cpus[usable[ngroups - 1].id]
            use = _Helper(self.a, cset, cnt, self.prefer, AllocFlag.IDLE_CORES).allocate()
            result |= use
            from_ &= ~use
            cnt -= use.bit_count()
        if cnt != 0:
            log.error("=> internal error: %d unallocated cache group CPUs remain", cnt)
            return
        self.result, self.from_, self.cnt = result, from_, 0

    def take_idle_cores(self) -> None:
        prios = self.a._prios
        prefer = self.prefer
        cores = [
            (lowest, core)
            for lowest, core in _ids_by_group(self.from_, self.a._core_of)
            if core & self.from_ == core
        ]
        if prefer is not CpuPriority.NONE:
            keys = self.a._core_keys[prefer]  # an idle core's key is its own

            def key(c: tuple[int, int]) -> tuple[tuple[int, ...], int]:
                got = keys.get(c[1])
                if got is None:
                    got = keys[c[1]] = prios.key(c[1], prefer)
                return (got, c[0])

            cores.sort(key=key)
        for _lowest, core in cores:
            if self.cnt >= core.bit_count():
                self._take(core)
                if self.cnt == 0:
                    break

    def take_idle_threads(self) -> None:
        a = self.a
        prios = a._prios
        prefer = self.prefer
        from_ = self.from_
        result = self.result
        cnt = self.cnt
        packages = [(pkg, cpus) for pkg, cpus in a._packages if cpus & from_]
        # Package order: co-location with what is already taken, then the CPU
        # priority comparison of the package's free CPUs, then the package id.

        def pkg_cmp(x: tuple[int, int], y: tuple[int, int]) -> int:
            colo = (y[1] & result).bit_count() - (x[1] & result).bit_count()
            if colo:
                return colo
            res = prios.cmp(x[1] & from_, y[1] & from_, prefer, cnt)
            if res:
                return -res
            return x[0] - y[0]

        packages.sort(key=functools.cmp_to_key(pkg_cmp))
        masks = prios.masks

        def cpu_prio_key(cpu: int) -> tuple[int, int]:
            if prefer is CpuPriority.NONE:
                return (0, 0)
            for p in PRIOS:
                if masks[p] >> cpu & 1:
                    return (0, p - prefer) if p >= prefer else (2, -p)
            return (1, 0)

        core_of = a._core_of
        for _pkg, pkg_cpus in packages:
            pkg_free = pkg_cpus & from_
            threads = cpuset.ids(pkg_free)
            threads.sort(key=lambda c: (cpu_prio_key(c), (core_of[c] & from_).bit_count(), c))
            for c in threads:
                self._take(1 << c)
                if self.cnt == 0:
                    return


class _CacheGroupSorter:
    """``cacheGroupSorter`` with upstream's ``pickGroups``/``sortIdle``/``sortUsed``."""

    def __init__(self, h: _Helper, groups: Sequence[_CacheGroup]) -> None:
        self.prefer: list[_CacheGroup] = []
        self.usable: list[_CacheGroup] = []
        self.prefer_pkg: dict[int, int] = {}
        self.prefer_die: dict[tuple[int, int], int] = {}
        self.usable_pkg: dict[int, int] = {}
        self.usable_die: dict[tuple[int, int], int] = {}
        self.cpus: dict[int, int] = {}
        # Upstream assumes every group has the size of the first one.
        self.part = h.cnt % groups[0].cpus.bit_count()
        self.full = h.cnt - self.part
        for g in groups:
            if h.a.hybrid:
                if h.prefer is not CpuPriority.LOW and g.efficient:
                    continue
                if h.prefer is CpuPriority.LOW and not g.efficient:
                    continue
            free = g.cpus & h.from_
            if not free:
                continue
            n = free.bit_count()
            self.cpus[g.id] = free
            if free == g.cpus:
                self.prefer.append(g)
                self.prefer_pkg[g.pkg] = self.prefer_pkg.get(g.pkg, 0) + n
                self.prefer_die[(g.pkg, g.die)] = self.prefer_die.get((g.pkg, g.die), 0) + n
            else:
                self.usable.append(g)
                self.usable_pkg[g.pkg] = self.usable_pkg.get(g.pkg, 0) + n
                self.usable_die[(g.pkg, g.die)] = self.usable_die.get((g.pkg, g.die), 0) + n
        self.prefer.sort(key=functools.cmp_to_key(self._sort_idle))
        self.usable.sort(key=functools.cmp_to_key(self._sort_used))

    @staticmethod
    def _ids(a: _CacheGroup, b: _CacheGroup) -> int:
        if a.pkg != b.pkg:
            return a.pkg - b.pkg
        if a.die != b.die:
            return a.die - b.die
        return a.id - b.id

    def _sort_idle(self, a: _CacheGroup, b: _CacheGroup) -> int:
        full, part = self.full, self.part
        for fa, fb, pa, pb in (
            (
                self.prefer_die.get((a.pkg, a.die), 0),
                self.prefer_die.get((b.pkg, b.die), 0),
                self.usable_die.get((a.pkg, a.die), 0),
                self.usable_die.get((b.pkg, b.die), 0),
            ),
            (
                self.prefer_pkg.get(a.pkg, 0),
                self.prefer_pkg.get(b.pkg, 0),
                self.usable_pkg.get(a.pkg, 0),
                self.usable_pkg.get(b.pkg, 0),
            ),
        ):
            # Only one of them can satisfy the request: prefer that one.
            if fa >= full > fb and pa >= part:
                return -1
            if fa < full <= fb and pb >= part:
                return 1
            if fa >= full and fb >= full:
                if pa >= part > pb:
                    return -1
                if pa < part <= pb:
                    return 1
                if pa >= part and pb >= part:
                    # Both can: prefer the tighter one.
                    return (fa - fb) or (pa - pb) or self._ids(a, b)
        return a.id - b.id

    def _sort_used(self, a: _CacheGroup, b: _CacheGroup) -> int:
        size_a, size_b = self.cpus[a.id].bit_count(), self.cpus[b.id].bit_count()
        if self.full > 0 and self.prefer:
            # Prefer groups of the same package and die as the best idle group
            # (upstream compares the ids with CPU counts here; see the module doc).
            idle = self.prefer[0]
            in_a, in_b = a.pkg == idle.pkg, b.pkg == idle.pkg
            if in_a != in_b:
                return -1 if in_a else 1
            if in_a and in_b:
                da, db = a.die == idle.die, b.die == idle.die
                if da != db:
                    return -1 if da else 1
                if da and db:
                    return -(size_a - size_b) or a.id - b.id
            return 0
        total = self.full + self.part
        pa = self.usable_die.get((a.pkg, a.die), 0)
        pb = self.usable_die.get((b.pkg, b.die), 0)
        if pa >= total > pb:
            return -1
        if pa < total <= pb:
            return 1
        if pa >= total and pb >= total:
            return (pa - pb) or -(size_a - size_b) or self._ids(a, b)
        return 0

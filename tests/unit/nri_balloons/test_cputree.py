"""The CPU tree allocator (nri_balloons.cputree).

The first part ports upstream's ``cmd/plugins/balloons/policy/cputree_test.go``
(``TestResizeCpus``, ``TestSplitLevel``, ``TestCpuLocations``). The
upstream tests build synthetic trees; here the same machines are generated as sysfs
trees and discovered, so the tree also has the L2 level (one L2 per core).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nri_balloons.cpuallocator import PICKS_MAX, CpuAllocator, ResizeError
from nri_balloons.cpupriority import CpuPriority
from nri_balloons.cputree import NO_HINTS, CpuTreeAllocator, cpu_locations
from nri_balloons.flattree import FlatTree, flat_tree
from nri_framework import cpuset
from nri_framework.simulate.topologies import N4C16, TopologySpec
from nri_framework.topology import Topology, TreeNode
from topologies import int5, topology

P = cpuset.parse
F = cpuset.format


def int5_names(p: int, d: int, n: int, c: int, t: int) -> dict[int, dict[str, str]]:
    """CPU id -> level -> upstream's element name (``p0d1n0c01t1``)."""
    out: dict[int, dict[str, str]] = {}
    cpu = 0
    for pk in range(p):
        for di in range(d):
            for nu in range(n):
                for co in range(c):
                    for th in range(t):
                        numa = f"p{pk}d{di}n{nu}"
                        out[cpu] = {
                            "package": f"p{pk}",
                            "die": f"p{pk}d{di}",
                            "numa": numa,
                            "core": f"{numa}c{co:02d}",
                            "thread": f"{numa}c{co:02d}t{th}",
                        }
                        cpu += 1
    return out


# ---------------------------------------------------------------------------
# cputree_test.go: TestResizeCpus


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    topology: tuple[int, int, int, int, int]
    deltas: tuple[int, ...]
    balancing: bool = False
    spread: bool = False
    close: tuple[str, ...] = ()
    far: tuple[str, ...] = ()
    allocations: tuple[int, ...] = ()
    allocate: bool = False
    operate_on: tuple[int, ...] = ()
    current_on_same: tuple[str, ...] = ()
    current_not_on_same: tuple[str, ...] = ()
    all_on_same: tuple[str, ...] = ()
    current_on: tuple[str, ...] = ()
    current_not_on: tuple[str, ...] = ()
    add_sizes: tuple[int, ...] = ()
    disjoint: tuple[tuple[str, tuple[int, ...]], ...] = ()
    errors: tuple[str, ...] = ()
    seed_ccid1: bool = False
    """Start balloon 1 with ``allocations``. Upstream's defragmenting cases put the
    allocations in balloon 0 and then operate on balloon 1, which the map lookup
    makes empty, so every resize fails and every check passes vacuously; here they
    operate on the allocations as their comments describe."""


RESIZE_CASES = [
    Case(
        "first allocations",
        (2, 2, 2, 2, 2),
        deltas=(0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32),
        add_sizes=(0, 1, 2, 4, 4, 8, 8, 8, 16, 16, 16, 32, 32, 32),
    ),
    Case(
        "too large an allocation",
        (2, 2, 2, 2, 2),
        deltas=(33,),
        errors=("not enough free CPUs",),
    ),
    Case(
        "spread allocations",
        (2, 2, 2, 2, 2),
        balancing=True,
        deltas=(1, 1, 1, 1, 1, 1, 1, 1),
        allocate=True,
        operate_on=(1, 2, 3, 4, 5, 6, 7, 8),
        disjoint=(
            ("", ()),
            ("package", (1, 2)),
            ("die", (1, 2, 3)),
            ("die", (1, 2, 3, 4)),
            ("numa", (1, 2, 3, 4, 5)),
            ("numa", (1, 2, 3, 4, 5, 6)),
            ("numa", (1, 2, 3, 4, 5, 6, 7)),
            ("numa", (1, 2, 3, 4, 5, 6, 7, 8)),
        ),
    ),
    Case(
        "spread allocations2",
        (4, 1, 4, 8, 2),
        balancing=True,
        deltas=(1, 3, 2, 4, 1, 4, 2, 4),
        allocate=True,
        operate_on=(1, 2, 3, 4, 5, 6, 7, 8),
        disjoint=(
            ("", ()),
            ("package", (1, 2)),
            ("package", (1, 2, 3)),
            ("package", (1, 2, 3, 4)),
            ("numa", (1, 2, 3, 4, 5)),
            ("numa", (1, 2, 3, 4, 5, 6)),
            ("numa", (1, 2, 3, 4, 5, 6, 7)),
            ("numa", (1, 2, 3, 4, 5, 6, 7, 8)),
        ),
    ),
    Case(
        "pack allocations",
        (2, 2, 2, 2, 2),
        deltas=(1, 1, 1, 1),
        allocate=True,
        operate_on=(1, 2, 3, 4, 5),
        all_on_same=("", "core", "numa", "numa", "die", "die"),
    ),
    Case(
        "inflate",
        (2, 2, 2, 2, 2),
        allocate=True,
        # cpu0..3 on numa n0 of die d0, cpu4..7 on n1, then cpu8..15 on die d1
        deltas=(1, 1, 1, 1, 1, 3, 6, 1, 1),
        operate_on=(1, 1, 1, 1, 1, 1, 1, 1, 1),
        current_on_same=(
            "core",
            "core",
            "numa",
            "numa",
            "die",
            "die",
            "package",
            "package",
            "package",
        ),
        add_sizes=(1, 1, 1, 1, 1, 3, 8, 1, 1),
    ),
    Case(
        "defragmenting single removals",
        (2, 2, 2, 2, 2),
        allocations=(0, 2, 3, 7, 10, 17, 18),
        allocate=True,
        seed_ccid1=True,
        deltas=(-1, -1, -1, -1, -1, -1, -1),
        operate_on=(1, 1, 1, 1, 1, 1, 1),
        # release cpu17/18, cpu17/18, cpu10, cpu7, cpu0, then cpu2/3
        current_on_same=("", "package", "die", "numa", "core", "core", "core"),
        current_not_on=("", "p1", "p0d1", "p0d0n1", "p0d0n0c00"),
    ),
    Case(
        "defragmenting multi-removals",
        (2, 2, 2, 2, 2),
        allocations=(0, 2, 4, 6, 8, 9, 10, 24, 25, 26, 27, 28, 29, 30, 31),
        allocate=True,
        seed_ccid1=True,
        # from p0d1n0; the rest of p0d1; all of p0 and one of p1d1nX; the rest of
        # p1d1nX => all on the same NUMA node
        deltas=(-2, -1, -5, -3),
        operate_on=(1, 1, 1, 1),
        current_on_same=("", "", "die", "numa"),
        current_not_on=("", "p0d1", "p0", ""),
    ),
    Case(
        "gentle rebalancing",
        (2, 1, 1, 16, 2),  # 2 packages x 16 cores x 2 threads
        deltas=(
            # 8 sets; the last 14 CPUs fill package 0 and spill over to package 1
            *(4, 4, 14, 7, 7, 4, 4, 14),
            # make a little room in package 0
            *(-2, -2, -2, -2),
            # deflate/inflate the last set: it gradually moves to package 0
            *(-1, 1, -1, 1, -1, 1, -1, 1),
        ),
        operate_on=(1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 8),
        allocate=True,
        current_on_same=(
            *("package",) * 7,
            "",
            *("",) * 4,
            *("",) * 6,
            "package",
            "package",
        ),
    ),
    Case(
        "prefer spread on physical cores",
        (4, 1, 4, 8, 2),
        balancing=True,
        spread=True,
        deltas=(
            # one thread from each core of the same NUMA node
            *(2, 1, 4, 1),
            # three other sets, each in its own package (topology balancing)
            *(3, 9, 16),
            # grow the first: 3+4 fit in its NUMA node, of the last 3 the first
            # fills the node and 2 go to another node of the same package
            *(3, 4, 3),
            # release the 2 on the other node and put them back
            *(-2, 2),
            # release 2+8: the rest are single threads on their own cores
            -10,
        ),
        allocate=True,
        operate_on=(1, 1, 1, 1, 2, 3, 4, 1, 1, 1, 1, 1, 1),
        current_on_same=(
            *("numa",) * 4,
            *("numa",) * 3,
            "numa",
            "numa",
            "package",
            "numa",
            "package",
            "numa",
        ),
        current_not_on_same=(
            *("core",) * 4,
            "core",
            "",
            "",
            *("",) * 3,
            "",
            "",
            "core",
        ),
        disjoint=(
            ("", ()),
            ("", ()),
            ("", ()),
            ("", ()),
            ("package", (1, 2)),
            ("package", (1, 2, 3)),
            ("package", (1, 2, 3, 4)),
        ),
    ),
    Case(
        "prefer close to devices",
        (2, 1, 2, 2, 2),
        balancing=True,
        spread=True,
        close=(
            "4-7",  # close to p0d0n1c*
            "3",  # close to p0d0n0c01t1
            "2-7",  # close to p0d0n*
        ),
        far=("0-1",),  # far from p0d0n0c00t*
        deltas=(1, 3, 1, -1, 4, -3, 1, -1),
        allocate=True,
        # balloon 1 gets cpus 4-7; balloon 2 cannot get enough from 2-7
        operate_on=(1, 1, 1, 1, 2, 2, 2, 2),
        current_on=("p0d0n1", "p0d0n1", "p0d0", "p0d0n1", "p1", "p1", "", "p0d0n0c01t1"),
        current_not_on=(
            "p0d0n0",
            "p0d0n0",
            "p0d0n0c00",
            "p0d0n0",
            "p0d0n0c00",
            "p0d0n0c00",
            "p0d0n0c00",
            "p0d0n0c00",
        ),
    ),
]


def _elements(names: dict[int, dict[str, str]], level: str, cpus: int) -> list[str]:
    return [names[c][level] for c in cpuset.ids(cpus)]


def _verify_same(names: dict[int, dict[str, str]], level: str, cpus: int, inversed: bool) -> None:
    # upstream doVerifySame: every CPU is compared with the first one
    elements = _elements(names, level, cpus)
    for other in elements[1:]:
        if inversed:
            assert other != elements[0], f"{F(cpus)}: expected not the same {level}"
        else:
            assert other == elements[0], f"{F(cpus)}: expected the same {level}"


def _at(seq: tuple[str, ...], i: int) -> str:
    return seq[i] if i < len(seq) else ""


@pytest.mark.parametrize("mode", ["candidates", "resize"])
@pytest.mark.parametrize("case", RESIZE_CASES, ids=lambda c: c.name)
def test_resize_cpus(case: Case, mode: str) -> None:
    """cputree_test.go TestResizeCpus. ``candidates`` mode is upstream's test (take
    the lowest CPUs of ``ResizeCpus``'s candidate set); ``resize`` mode checks the
    same expectations with the final pick of :class:`CpuAllocator`."""
    topo = topology(int5(*case.topology))
    names = int5_names(*case.topology)
    alloc = CpuTreeAllocator(
        topo,
        topology_balancing=case.balancing,
        prefer_spread_on_physical_cores=case.spread,
        prefer_close_to=[P(s) for s in case.close],
        prefer_far_from=[P(s) for s in case.far],
    )
    current = cpuset.from_ids(case.allocations)
    free = topo.online & ~current
    ccids = {0: current}
    if case.seed_ccid1:
        ccids = {1: current}
    for i, delta in enumerate(case.deltas):
        op = case.operate_on[i] if i < len(case.operate_on) else 0
        if op > 0:
            current = ccids.get(op, 0)
        error = ""
        added = removed = 0
        if mode == "candidates":
            try:
                add_from, remove_from = alloc.candidates(current, free, delta)
            except ResizeError as exc:
                add_from = remove_from = 0
                error = str(exc)
            if i < len(case.add_sizes):
                assert add_from.bit_count() == case.add_sizes[i], f"step {i}: {F(add_from)}"
            added = cpuset.lowest(add_from, delta)
            removed = cpuset.lowest(remove_from, -delta)
        else:
            try:
                got = alloc.resize(current, free, delta)
            except ResizeError as exc:
                got = 0
                error = str(exc)
            else:
                assert got.bit_count() == abs(delta)
            added, removed = (got, 0) if delta > 0 else (0, got)
            assert not added & ~free
            assert not removed & ~current
        if i < len(case.errors):
            assert case.errors[i] in error
        else:
            assert not error, f"step {i}: {error}"
        if not case.allocate:
            continue
        free = (free & ~added) | removed
        current |= added
        if op > 0:
            current &= ~removed
            ccids[op] = current
        ctx = f"step {i} (delta {delta}): current {F(current)}"
        if level := _at(case.current_on_same, i):
            _verify_same(names, level, current, False)
        if level := _at(case.current_not_on_same, i):
            _verify_same(names, level, current, True)
        if region := _at(case.current_on, i):
            assert all(region in names[c]["thread"] for c in cpuset.ids(current)), ctx
        if region := _at(case.current_not_on, i):
            assert not any(region in names[c]["thread"] for c in cpuset.ids(current)), ctx
        if level := _at(case.all_on_same, i):
            union = 0
            for cpus in ccids.values():
                union |= cpus
            _verify_same(names, level, union, False)
        if i < len(case.disjoint) and case.disjoint[i][0]:
            level, ids = case.disjoint[i]
            for a in range(len(ids)):
                for b in range(a + 1, len(ids)):
                    ea = set(_elements(names, level, ccids.get(ids[a], 0)))
                    eb = set(_elements(names, level, ccids.get(ids[b], 0)))
                    assert not ea & eb, f"{ctx}: balloons {ids[a]} and {ids[b]} share {level}"


def _reference_tree(topo: Topology, spread: bool) -> list[tuple[str, int, int]]:
    """Upstream's tree as ``(name, cpus, depth)`` in preorder, split at the NUMA level
    by thread index when ``spread`` (``SplitLevel``), without any simplification."""
    classes: dict[int, int] = {}
    for info in topo.cpus.values():
        classes[info.thread] = classes.get(info.thread, 0) | 1 << info.id
    out: list[tuple[str, int, int]] = []

    def visit(node: TreeNode, d: int, cmask: int) -> None:
        cpus = node.cpus & cmask
        if not cpus:
            return
        out.append((node.name, cpus, d))
        if spread and node.level == "numa" and cmask == -1:
            for k in sorted(classes):
                if cpus & classes[k]:
                    out.append((f"{node.name}class{k}", cpus & classes[k], d + 1))
                    for child in node.children:
                        visit(child, d + 2, classes[k])
        else:
            for child in node.children:
                visit(child, d + 1, cmask)

    visit(topo.tree(), 0, -1)
    return out


def _reference_max_local_set(
    tree: list[tuple[str, int, int]], current: int, free: int, delta: int, balancing: bool
) -> tuple[int, int]:
    """``resizeCpusMaxLocalSet`` as upstream writes it: ``ToAttributedSlice`` with the
    filter, then ``sort.Slice`` with ``sorterAllocate``/``sorterRelease``."""
    attrs = []
    skip_below = None
    paths: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {-1: ((), ())}
    for name, cpus, d in tree:
        if skip_below is not None and d > skip_below:
            continue
        skip_below = None
        cc, fc = (cpus & current).bit_count(), (cpus & free).bit_count()
        if (delta > 0 and fc < delta) or (delta < 0 and cc < -delta):
            skip_below = d
            continue
        cpath, fpath = paths[d - 1]
        paths[d] = ((*cpath, cc), (*fpath, fc))
        attrs.append((name, cpus, d, paths[d][0], paths[d][1]))

    def allocate(a: tuple, b: tuple) -> int:  # type: ignore[type-arg]
        if a[2] != b[2]:
            return -1 if a[2] > b[2] else 1
        if a[3] != b[3]:
            return -1 if a[3] > b[3] else 1
        if a[4] != b[4]:
            if balancing:
                return -1 if a[4] > b[4] else 1
            return -1 if a[4] < b[4] else 1
        return -1 if a[0] < b[0] else (1 if a[0] > b[0] else 0)

    def release(a: tuple, b: tuple) -> int:  # type: ignore[type-arg]
        if a[2] != b[2]:
            return -1 if a[2] > b[2] else 1
        if a[3] != b[3]:
            return -1 if a[3] < b[3] else 1
        if a[4] != b[4]:
            return -1 if a[4] < b[4] else 1
        return -1 if a[0] > b[0] else (1 if a[0] < b[0] else 0)

    if not attrs:
        raise ResizeError("not enough free CPUs")
    attrs.sort(key=functools.cmp_to_key(allocate if delta > 0 else release))
    return free & attrs[0][1], current & attrs[0][1]


@settings(max_examples=400, deadline=None)
@given(
    spec=st.sampled_from(
        [
            N4C16,
            int5(2, 2, 2, 2, 2),
            dataclasses.replace(N4C16, name="n4c16-l2x2", cores_per_l2=2),
            dataclasses.replace(N4C16, name="n4c16-sparse", online="0-5,9,12-15"),
            TopologySpec(name="t3", packages=2, cores_per_node=3, threads_per_core=3),
        ]
    ),
    balancing=st.booleans(),
    spread=st.booleans(),
    data=st.data(),
)
def test_max_local_set_matches_upstream_sort(
    spec: TopologySpec, balancing: bool, spread: bool, data: st.DataObject
) -> None:
    """The one-pass max-local-set (subtree pruning, incremental keys, leaf scan,
    dropped single-child levels) chooses the node upstream's full sort chooses."""
    topo = topology(spec)
    ids = cpuset.ids(topo.online)
    owner = data.draw(st.lists(st.sampled_from("cfo"), min_size=len(ids), max_size=len(ids)))
    current = cpuset.from_ids(c for c, o in zip(ids, owner, strict=True) if o == "c")
    free = cpuset.from_ids(c for c, o in zip(ids, owner, strict=True) if o == "f")
    sign = data.draw(st.sampled_from([1, -1]))
    avail = free if sign > 0 else current
    if not avail:
        return
    delta = sign * data.draw(st.integers(1, avail.bit_count()))
    alloc = CpuTreeAllocator(
        topo, topology_balancing=balancing, prefer_spread_on_physical_cores=spread
    )
    expected = _reference_max_local_set(
        _reference_tree(topo, spread), current, free, delta, balancing
    )
    assert alloc._max_local_set(5, NO_HINTS, current, free, delta) == expected


@settings(max_examples=60, deadline=None)
@given(
    spec=st.sampled_from(
        [int5(2, 2, 2, 4, 2), dataclasses.replace(N4C16, name="n4c16-l2x2", cores_per_l2=2)]
    ),
    balancing=st.booleans(),
    spread=st.booleans(),
    data=st.data(),
)
def test_max_local_set_of_a_growing_balloon_matches_upstream_sort(
    spec: TopologySpec, balancing: bool, spread: bool, data: st.DataObject
) -> None:
    """A balloon growing (and now and then shrinking) one CPU at a time beside
    other balloons, as a Synchronize grows the default balloon: at every step the
    walk that skips the subtrees that cannot beat the best so far chooses the
    node upstream's full sort chooses."""
    topo = topology(spec)
    ids = cpuset.ids(topo.online)
    others = cpuset.from_ids(data.draw(st.sets(st.sampled_from(ids), max_size=len(ids) // 2)))
    free = topo.online & ~others
    current = 0
    alloc = CpuTreeAllocator(
        topo, topology_balancing=balancing, prefer_spread_on_physical_cores=spread
    )
    tree = _reference_tree(topo, spread)
    for step in range(data.draw(st.integers(1, 24))):
        delta = -1 if current and step % 5 == 4 else 1
        if delta > 0 and not free:
            break
        expected = _reference_max_local_set(tree, current, free, delta, balancing)
        assert alloc._max_local_set(5, NO_HINTS, current, free, delta) == expected
        cpus = alloc.resize(current, free, delta)
        if delta > 0:
            current, free = current | cpus, free & ~cpus
        else:
            current, free = current & ~cpus, free | cpus


def test_split_level() -> None:
    """cputree_test.go TestSplitLevel: with preferSpreadOnPhysicalCores the NUMA
    level is split by thread index, so sibling threads land in different classes
    under the same NUMA node."""
    topo = topology(int5(2, 2, 2, 4, 2))
    plain, split = flat_tree(topo, False), flat_tree(topo, True)

    def ancestors(t: FlatTree, cpu: int) -> list[str]:
        i = next(i for i, m in enumerate(t.masks) if m == 1 << cpu and t.end[i] == i + 1)
        chain = []
        while i < len(t.masks):
            chain.append(t.names[i])
            i = t.parent[i]
        return chain  # leaf first

    # 62 and 63 are threads of one core in the original tree
    a62, a63 = ancestors(plain, 62), ancestors(plain, 63)
    assert a62[0] == "p1d1n7cpu62t62" and a63[0] == "p1d1n7cpu62t63"
    assert a62[1] == a63[1] == "p1d1n7cpu62"
    # in the split tree they are in different classes of the same NUMA node (the
    # one-thread core and L2 copies under a class are dropped as trivial levels)
    s62, s63 = ancestors(split, 62), ancestors(split, 63)
    assert s62[1] == "p1d1n7class0" and s63[1] == "p1d1n7class1"
    assert s62[2] == s63[2] == "p1d1n7"
    # the reference (unsimplified) tree has the copied cores with one thread each
    ref = _reference_tree(topo, True)
    copies = [(name, cpus) for name, cpus, _ in ref if name == "p1d1n7cpu62"]
    assert copies == [("p1d1n7cpu62", 1 << 62), ("p1d1n7cpu62", 1 << 63)]


def test_cpu_locations() -> None:
    """cputree_test.go TestCpuLocations (from the system node; index 4 is the L2
    level here, so cores are at 5)."""
    topo = topology(int5(2, 2, 2, 4, 2))
    locations = cpu_locations(topo, cpuset.from_ids([0, 1, 3, 4, 16]))
    assert len(locations) == 7
    assert locations[0] == ["system"]
    assert locations[1] == ["p0"]
    assert locations[2] == ["p0d0", "p0d1"]
    assert locations[3] == ["p0d0n0", "p0d1n2"]
    assert len(locations[5]) == 4
    assert locations[6] == [
        "p0d0n0cpu0t0",
        "p0d0n0cpu0t1",
        "p0d0n0cpu2t3",
        "p0d0n0cpu4t4",
        "p0d1n2cpu16t16",
    ]


# --- remembered picks: the answers of the same questions again ----------------


def _fresh(topo: Topology, alloc: CpuTreeAllocator) -> CpuTreeAllocator:
    """An allocator with ``alloc``'s options and nothing remembered."""
    return CpuTreeAllocator(
        topo,
        topology_balancing=alloc.topology_balancing,
        prefer_spread_on_physical_cores=alloc.prefer_spread_on_physical_cores,
        allocator_priority=alloc.allocator_priority,
    )


@settings(max_examples=40, deadline=None)
@given(
    spec=st.sampled_from(
        [int5(2, 2, 2, 4, 2), dataclasses.replace(N4C16, name="n4c16-l2x2", cores_per_l2=2)]
    ),
    priority=st.sampled_from(list(CpuPriority)),
    data=st.data(),
)
def test_remembered_picks_are_the_fresh_ones(
    spec: TopologySpec, priority: CpuPriority, data: st.DataObject
) -> None:
    """Balloons made, grown, shrunk and deleted over and over (the same
    questions come again), the options switched between resizes: at every step
    the allocator that remembers its answers picks what a new one picks."""
    topo = topology(spec)
    alloc = CpuTreeAllocator(topo, allocator_priority=priority)
    balloons: list[int] = []
    free = topo.online
    for _step in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["new", "new", "grow", "shrink", "delete", "opt"]))
        if op == "opt":
            if data.draw(st.booleans()):
                alloc.topology_balancing = not alloc.topology_balancing
            else:
                alloc.prefer_spread_on_physical_cores = not alloc.prefer_spread_on_physical_cores
            continue
        if op == "delete" and balloons:
            free |= balloons.pop(data.draw(st.integers(0, len(balloons) - 1)))
            continue
        if op in ("grow", "shrink") and balloons:
            i = data.draw(st.integers(0, len(balloons) - 1))
        else:
            balloons.append(0)
            i, op = len(balloons) - 1, "grow"
        current = balloons[i]
        top = free.bit_count() if op == "grow" else current.bit_count()
        if not top:
            continue
        delta = data.draw(st.integers(1, min(top, 4))) * (1 if op == "grow" else -1)
        got = alloc.resize(current, free, delta)
        assert got == _fresh(topo, alloc).resize(current, free, delta), (op, delta)
        if delta > 0:
            balloons[i], free = current | got, free & ~got
        else:
            balloons[i], free = current & ~got, free | got


def test_a_remembered_pick_follows_the_options() -> None:
    """The same question after the type's balancing or spreading changed is
    answered for the new options (balancing is in the key; a new tree forgets)."""
    topo = topology(N4C16)
    free = topo.online & ~cpuset.parse("0-1")  # package 0 has fewer free CPUs
    alloc = CpuTreeAllocator(topo)
    packed = alloc.resize(0, free, 2)
    alloc.topology_balancing = True
    balanced = alloc.resize(0, free, 2)
    assert balanced == _fresh(topo, alloc).resize(0, free, 2) != packed
    alloc.prefer_spread_on_physical_cores = True
    spread = alloc.resize(0, free, 2)
    assert spread == _fresh(topo, alloc).resize(0, free, 2) != balanced


def test_remembered_picks_are_bounded() -> None:
    """More distinct questions than PICKS_MAX: the tree and the CPU allocator
    keep PICKS_MAX answers, the oldest forgotten, and still answer right."""
    topo = topology(dataclasses.replace(N4C16, name="n4c16-l2x2", cores_per_l2=2))
    alloc = CpuTreeAllocator(topo)
    ids = cpuset.ids(topo.online)
    asked = 0
    for a in ids:
        for b in ids:
            if a < b:
                free = topo.online & ~cpuset.from_ids([a, b])
                for delta in (3, 5, 6, 7):
                    got = alloc.resize(0, free, delta)
                    assert got == _fresh(topo, alloc).resize(0, free, delta)
                    got = alloc.cpu_allocator.allocate(free, delta)
                    assert got == CpuAllocator(topo).allocate(free, delta)
                    asked += 1
    assert asked > PICKS_MAX
    assert len(alloc._best_nodes) == PICKS_MAX
    assert len(alloc.cpu_allocator._picks) == PICKS_MAX


def test_a_remembered_pick_logs_its_debug_lines_again(caplog: pytest.LogCaptureFixture) -> None:
    """With debug on, a question asked again logs every line the first logged
    (the tree's and the CPU allocator's: the allocator's steps run again)."""
    topo = topology(dataclasses.replace(N4C16, name="n4c16-l2x2", cores_per_l2=2))
    alloc = CpuTreeAllocator(topo)
    free = topo.online
    alloc.resize(0, free, 3)  # remembered without debug
    lines = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            alloc.resize(0, free, 3)
        lines.append([r.getMessage() for r in caplog.records])
    assert any("cpus from" in m for m in lines[0]), lines[0]
    assert any("max local set" in m for m in lines[0]), lines[0]
    assert lines[1] == lines[0]

"""The CPU tree allocator (nri_balloons.cputree) on discovered machines: where
new and growing balloons go, deflation, device and cpuClass hints, load
classes, big and sparse topologies, and hypothesis properties of resize. The
port of upstream's ``cputree_test.go`` is in :mod:`test_cputree`."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nri_balloons.cpuallocator import ResizeError
from nri_balloons.cpupriority import CpuPriority
from nri_balloons.cputree import CpuTreeAllocator, ResizeHints
from nri_balloons.devices import LoadedDevice, VirtualDevice, loaded_cpus
from nri_framework import cpuset
from nri_framework.simulate.topologies import N4C16, S8C4K, XEON_6776P, TopologySpec
from nri_framework.topology import Topology
from topologies import int5, topology

P = cpuset.parse
F = cpuset.format

# ---------------------------------------------------------------------------
# behaviour on discovered machines


def fresh(topo: Topology, **kwargs: object) -> CpuTreeAllocator:
    return CpuTreeAllocator(topo, **kwargs)  # type: ignore[arg-type]


def new_balloons(topo: Topology, sizes: list[int], **kwargs: object) -> list[int]:
    free = topo.online
    out = []
    for n in sizes:
        got = fresh(topo, **kwargs).resize(0, free, n)
        free &= ~got
        out.append(got)
    return out


def test_balancing_spreads_new_balloons_across_packages() -> None:
    topo = topology(N4C16)
    balloons = new_balloons(topo, [2, 2, 2, 2], topology_balancing=True)
    packages = [topo.cpus[cpuset.ids(b)[0]].package for b in balloons]
    assert packages == [0, 1, 0, 1]  # alternate packages
    nodes = [topo.closest_nodes(b) for b in balloons]
    assert all(n.bit_count() == 1 for n in nodes) and len(set(nodes)) == 4  # own NUMA node
    for b in balloons:
        assert b in topo.core_masks.values()  # a whole core each


def test_packing_fills_one_numa_node_first() -> None:
    topo = topology(N4C16)
    a, b, c = new_balloons(topo, [2, 2, 2], topology_balancing=False)
    assert a | b == topo.node_masks[0]
    assert c & topo.node_masks[1] == c  # then the next node of the same package


def test_prefer_spread_on_physical_cores_one_thread_per_core() -> None:
    topo = topology(N4C16)
    spread = fresh(topo, prefer_spread_on_physical_cores=True, topology_balancing=True).resize(
        0, topo.online, 2
    )
    assert len({topo.cpus[c].core for c in cpuset.ids(spread)}) == 2
    plain = fresh(topo, topology_balancing=True).resize(0, topo.online, 2)
    assert plain in topo.core_masks.values()
    # on a big machine: 16 CPUs of one NUMA node on 16 different cores
    xeon = topology(XEON_6776P)
    alloc = fresh(xeon, prefer_spread_on_physical_cores=True, topology_balancing=True)
    cur, free = 0, xeon.online
    for step in (3, 5, 8):
        got = alloc.resize(cur, free, step)
        cur, free = cur | got, free & ~got
    assert cur.bit_count() == 16
    assert xeon.single_thread(cur) == cur  # no two threads of one core
    assert len({xeon.cpus[c].node for c in cpuset.ids(cur)}) == 1


def test_growing_balloon_stays_local() -> None:
    topo = topology(N4C16)
    for balancing in (True, False):
        alloc = fresh(topo, topology_balancing=balancing)
        cur, free = 0, topo.online
        seen_nodes = []
        for _ in range(8):
            got = alloc.resize(cur, free, 1)
            cur, free = cur | got, free & ~got
            seen_nodes.append(topo.closest_nodes(cur).bit_count())
        # fills its NUMA node (4 CPUs) before spilling, then stays in the package
        assert seen_nodes == [1, 1, 1, 1, 2, 2, 2, 2]
        assert topo.closest_nodes(cur) in (0b11, 0b1100)


def test_growing_balloon_stays_local_with_neighbours() -> None:
    topo = topology(N4C16)
    # another balloon holds node 0; ours starts on node 1
    other = topo.node_masks[0]
    cur = P("4")
    free = topo.online & ~other & ~cur
    for balancing in (True, False):
        alloc = fresh(topo, topology_balancing=balancing)
        # what fits in its NUMA node stays there
        assert alloc.resize(cur, free, 3) == P("5-7")
        # the whole delta must fit in one subtree: 5 CPUs come from package 1
        got = alloc.resize(cur, free, 5)
        assert got & ~topo.package_masks[1] == 0 and got.bit_count() == 5


def test_deflate_releases_cpus_farthest_from_the_rest() -> None:
    topo = topology(N4C16)
    alloc = fresh(topo)
    cur = P("0-3,8")  # node 0 plus a stray CPU on package 1
    free = topo.online & ~cur
    assert alloc.resize(cur, free, -1) == P("8")
    cur = P("0-3,6-7,12")
    free = topo.online & ~cur
    released = alloc.resize(cur, free, -3)
    assert released == P("6-7,12")


def test_prefer_close_to_hint_honoured_when_it_fits() -> None:
    """test10-allocator-opts device-node2: the balloon lands on node 2 when the
    request fits there and ignores the hint when it does not."""
    topo = topology(N4C16)
    node2 = topo.node_masks[2]
    alloc = fresh(
        topo, prefer_spread_on_physical_cores=True, topology_balancing=True, prefer_close_to=[node2]
    )
    got = alloc.resize(0, topo.online, 3)
    assert got & ~node2 == 0
    # node 2 partly taken: 3 CPUs do not fit any more, the hint is dropped
    free = topo.online & ~P("8-9")
    got = alloc.resize(0, free, 3)
    assert got.bit_count() == 3 and got & ~free == 0
    # alternatives in one hint: the first that fits wins
    alloc.prefer_close_to = [[P("0-1"), P("12-15")]]
    got = alloc.resize(0, topo.online, 2)
    assert got == P("0-1")
    # a virtual device is read at every resize
    device = VirtualDevice("dev", [P("14-15")])
    alloc.prefer_close_to = [device]
    assert alloc.resize(0, topo.online, 2) == P("14-15")
    device.cpusets = [P("6-7")]
    assert alloc.resize(0, topo.online, 2) == P("6-7")


def test_prefer_far_from_avoided_when_possible() -> None:
    topo = topology(N4C16)
    far = P("0-11")
    alloc = fresh(topo, prefer_far_from=[far])
    got = alloc.resize(0, topo.online, 4)
    assert got & far == 0
    # only 2 CPUs outside the far set are free: the hint is dropped
    free = topo.online & ~P("12-13")
    got = alloc.resize(0, free, 4)
    assert got.bit_count() == 4 and got & ~free == 0
    # close-to wins over far-from (priority order)
    alloc = fresh(topo, prefer_close_to=[P("0-3")], prefer_far_from=[P("0-7")])
    assert alloc.resize(0, topo.online, 2) & ~P("0-3") == 0


def test_deflate_with_hints_keeps_hinted_cpus() -> None:
    topo = topology(N4C16)
    alloc = fresh(topo, prefer_close_to=[P("4-7")])
    cur = P("2-7")
    released = alloc.resize(cur, topo.online & ~cur, -2)
    assert released == P("2-3")


def test_loaded_core_device_avoids_sibling_threads() -> None:
    """test15-loadclasses pre-reserved-avx: a balloon with an ``avx`` load
    (level core, overloadsLevelInBalloon) never uses two threads of one core."""
    topo = topology(N4C16)
    avx = LoadedDevice(topo, "core", update_on_every_cpu=True)
    alloc = fresh(topo, prefer_far_from=[avx], on_cpu_pick=avx.add)
    avx.load(0)
    cur, free = 0, topo.online & ~P("1")  # the reserved balloon holds CPU 1
    got = alloc.resize(cur, free, 2)
    cur, free = cur | got, free & ~got
    assert topo.single_thread(cur) == cur
    avx.load(cur)
    got = alloc.resize(cur, free, 2)
    cur |= got
    assert cur.bit_count() == 4 and topo.single_thread(cur) == cur
    # a second avx balloon avoids the cores of the first one
    avx.load(cur)
    other = fresh(topo, prefer_far_from=[avx], on_cpu_pick=avx.add).resize(0, free & ~got, 2)
    assert topo.siblings(other) & cur == 0


def test_loaded_l2cache_device() -> None:
    spec = dataclasses.replace(N4C16, name="n4c16-l2x2", cores_per_l2=2)
    topo = topology(spec)
    assert loaded_cpus(topo, "l2cache", P("1")) == P("0-3")
    assert loaded_cpus(topo, "core", P("1,5")) == P("0-1,4-5")
    membw = LoadedDevice(topo, "l2cache")
    membw.load(P("0"))
    got = fresh(topo, prefer_far_from=[membw]).resize(0, topo.online & ~P("0"), 1)
    assert got & P("0-3") == 0
    with pytest.raises(ValueError, match="not implemented load level"):
        LoadedDevice(topo, "numa")  # type: ignore[arg-type]


def test_big_and_sparse_topologies() -> None:
    xeon = topology(XEON_6776P)
    assert xeon.online.bit_count() == 256
    got = new_balloons(xeon, [8, 8, 8, 8], topology_balancing=True)
    assert [xeon.closest_nodes(b).bit_count() for b in got] == [1, 1, 1, 1]
    assert len({xeon.closest_nodes(b) for b in got}) == 4
    for b in got:
        assert xeon.siblings(b) == b  # whole cores (threads n and n+128)
    s8 = topology(S8C4K)
    assert F(s8.online) == "0-2,511,1535,4095"
    alloc = fresh(s8, topology_balancing=True, prefer_close_to=[s8.node_masks[7]])
    cur = alloc.resize(0, s8.online, 1)
    assert cur == P("4095")
    more = alloc.resize(cur, s8.online & ~cur, 3)
    assert more & ~s8.online == 0 and more.bit_count() == 3
    # packing fills the fullest package first; balancing the emptiest (package 0
    # holds 0-2 and 511, packages 2 and 7 one CPU each)
    assert new_balloons(s8, [1, 1, 1, 1], topology_balancing=False) == [
        P("1535"),
        P("4095"),
        P("0"),
        P("1"),
    ]
    assert new_balloons(s8, [2, 1, 1], topology_balancing=True) == [P("0-1"), P("2"), P("511")]


def test_hints_of_one_resize_are_arguments() -> None:
    """cpuClass hints reach the tree as arguments of one resize: they steer that
    resize (after the type's own hints) and leave the allocator's lists as they were,
    so the next resize does not see them."""
    topo = topology(N4C16)
    alloc = fresh(topo, prefer_close_to=[P("0-7")])
    close, far = list(alloc.prefer_close_to), list(alloc.prefer_far_from)
    pref = VirtualDevice("__cls_pref_0_hp", [P("4-5")])
    assert alloc.resize(0, topo.online, 2, ResizeHints(prefer=(pref,))) == P("4-5")
    assert alloc.resize(0, topo.online, 2, ResizeHints(avoid=(P("0-5"),))) == P("6-7")
    # the type's hint comes first and wins a conflict
    assert alloc.resize(0, topo.online, 2, ResizeHints(prefer=(P("12-13"),))) == P("0-1")
    assert alloc.prefer_close_to == close and alloc.prefer_far_from == far
    assert alloc.resize(0, topo.online, 2) == P("0-1")  # no hint left behind


def test_resize_errors() -> None:
    topo = topology(N4C16)
    alloc = fresh(topo)
    with pytest.raises(
        ResizeError,
        match=r"^not enough free CPUs \(2\) to resize current CPU set from 1 to 4 CPUs$",
    ):
        alloc.resize(P("0"), P("4-5"), 3)
    with pytest.raises(ResizeError, match=r"^not enough current CPUs \(1\) to release 2 CPUs$"):
        alloc.resize(P("0"), P("4-5"), -2)
    assert isinstance(ResizeError("x"), ValueError)
    assert alloc.resize(P("0"), P("4-5"), 0) == 0
    assert alloc.resize(P("0"), P("4-5"), 2) == P("4-5")  # exact fit
    assert alloc.resize(P("0-1"), P("4-5"), -2) == P("0-1")


# ---------------------------------------------------------------------------
# properties

SMALL_SPECS = [
    N4C16,
    int5(2, 2, 2, 2, 2),
    TopologySpec(name="odd", packages=3, nodes_per_die=1, cores_per_node=3, threads_per_core=1),
    dataclasses.replace(N4C16, name="n4c16-l2x2", cores_per_l2=2),
    dataclasses.replace(N4C16, name="n4c16-sparse", online="0-5,9,12-15"),
]


@st.composite
def resize_requests(draw: st.DrawFn) -> tuple[Topology, int, int, int, dict[str, object]]:
    topo = topology(draw(st.sampled_from(SMALL_SPECS)))
    ids = [*cpuset.ids(topo.online), 40, 63]  # two ids outside every topology
    owner = draw(
        st.lists(st.sampled_from(["cur", "free", "other"]), min_size=len(ids), max_size=len(ids))
    )
    current = cpuset.from_ids(c for c, o in zip(ids, owner, strict=True) if o == "cur")
    free = cpuset.from_ids(c for c, o in zip(ids, owner, strict=True) if o == "free")
    delta = draw(st.integers(-current.bit_count() - 2, free.bit_count() + 2))
    mask = st.integers(0, topo.online)
    opts: dict[str, object] = {
        "topology_balancing": draw(st.booleans()),
        "prefer_spread_on_physical_cores": draw(st.booleans()),
        "prefer_close_to": draw(st.lists(st.one_of(mask, st.lists(mask, max_size=2)), max_size=2)),
        "prefer_far_from": draw(st.lists(mask, max_size=2)),
        "allocator_priority": draw(st.sampled_from(list(CpuPriority))),
    }
    if draw(st.booleans()):
        dev = LoadedDevice(topo, draw(st.sampled_from(["core", "l2cache"])), True)
        opts["prefer_far_from"] = [*opts["prefer_far_from"], dev]  # type: ignore[misc]
        opts["on_cpu_pick"] = dev.add
    return topo, current, free, delta, opts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resize_requests())
def test_resize_properties(req: tuple[Topology, int, int, int, dict[str, object]]) -> None:
    topo, current, free, delta, opts = req
    alloc = fresh(topo, **opts)
    usable_free = free & topo.online
    usable_current = current & topo.online
    too_few_free = delta > 0 and usable_free.bit_count() < delta
    too_few_current = delta < 0 and usable_current.bit_count() < -delta
    if too_few_free or too_few_current:
        with pytest.raises(ResizeError, match=r"^not enough (free|current) CPUs"):
            alloc.resize(current, free, delta)
        return
    got = alloc.resize(current, free, delta)
    assert got.bit_count() == abs(delta)
    assert got & ~topo.online == 0
    if delta > 0:
        assert got & ~free == 0
    elif delta < 0:
        assert got & ~current == 0
    # the candidate sets obey the same bounds
    add_from, remove_from = alloc.candidates(current, free, delta)
    assert add_from & ~usable_free == 0
    assert remove_from & ~usable_current == 0

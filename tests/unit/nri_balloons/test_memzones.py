"""Memory zones (:mod:`nri_balloons.memzones`, upstream libmem's allocator): node
capacity, spilling to the next-closest nodes, overcommit resolution by priority,
Realloc keeping a zone, Release, and the saved allocations, on upstream's
``n6-hbm-cxl`` machine (DRAM 0-1: 2 GiB, HBM 2-3: 1 GiB, PMEM 4-5: 4 GiB)."""

from __future__ import annotations

import logging
import random
from typing import Any

import msgspec
import pytest
from nri_balloons import memzones
from nri_balloons.configyaml import load_policy
from nri_balloons.memplacement import MemoryPlacer
from nri_balloons.memzones import (
    MemoryAllocation,
    MemoryAllocator,
    MemoryPlacementError,
    Priority,
    human_size,
    initial_zone,
    parse_types,
)
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.state import BalloonsState, decode
from nri_balloons.validation import PreparedConfig, validate
from nri_framework import cpuset
from nri_framework.kubelet_cpu import QOSClass
from nri_framework.model import Container, MemoryResources, Pod, Resources
from nri_framework.simulate.topologies import N6_HBM_CXL
from nri_framework.topology import MemoryType
from topologies import topology

M = 1 << 20
NODE0 = 0b1
HBM = parse_types("hbm")
BURSTABLE, GUARANTEED = Priority.BURSTABLE, Priority.GUARANTEED


def allocator() -> MemoryAllocator:
    return MemoryAllocator(topology(N6_HBM_CXL))


def zone(a: MemoryAllocator, cid: str) -> str:
    z = a.assigned(cid)
    assert z is not None, cid
    return cpuset.format(z)


def test_capacity_is_each_nodes_meminfo() -> None:
    a = allocator()
    assert a.zone_capacity(0b1) == 2048 * M
    assert a.zone_capacity(0b100) == 1024 * M
    assert a.zone_capacity(0b110000) == 8192 * M


def test_a_limit_that_does_not_fit_its_hbm_node_spills_to_the_next_by_distance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = allocator()
    assert a.allocate("small", "ns/p/small", 500 * M, NODE0, HBM, BURSTABLE) == (0b100, {})
    a.release("small")
    with caplog.at_level(logging.DEBUG, logger="libmem"):
        got, moved = a.allocate("big", "ns/p/big", 1536 * M, NODE0, HBM, BURSTABLE)
    # HBM node 2 (1 GiB, distance 15 from node 0) is too small: HBM node 3 joins
    assert cpuset.format(got) == "2-3" and moved == {}
    assert "  zone<2>: 512M" in caplog.messages
    assert "  + zone<2> expanded by HBM 3 to 2-3" in caplog.messages


def test_an_overcommitted_zone_moves_its_lowest_priority_container_first() -> None:
    a = allocator()
    a.allocate("g", "ns/p/g", 600 * M, NODE0, HBM, GUARANTEED)
    got, moved = a.allocate("b", "ns/p/b", 600 * M, NODE0, HBM, BURSTABLE)
    # the burstable one moves, younger or not, and the guaranteed one stays
    assert (cpuset.format(got), moved) == ("2-3", {})
    a = allocator()
    a.allocate("b", "ns/p/b", 600 * M, NODE0, HBM, BURSTABLE)
    got, moved = a.allocate("g", "ns/p/g", 600 * M, NODE0, HBM, GUARANTEED)
    assert cpuset.format(got) == "2"
    assert moved == {"b": 0b1100}  # the caller updates b's cpuset.mems
    assert zone(a, "b") == "2-3"


def test_on_a_tie_the_smaller_then_the_younger_moves() -> None:
    a = allocator()
    a.allocate("old", "ns/p/old", 300 * M, NODE0, HBM, BURSTABLE)
    a.allocate("big", "ns/p/big", 500 * M, NODE0, HBM, BURSTABLE)
    _, moved = a.allocate("young", "ns/p/young", 300 * M, NODE0, HBM, BURSTABLE)
    # 1100M in 1 GiB: one 300M container frees enough, the youngest of the two
    assert moved == {} and zone(a, "young") == "2-3"
    assert (zone(a, "old"), zone(a, "big")) == ("2", "2")


def test_a_failed_allocation_changes_nothing() -> None:
    a = allocator()
    a.allocate("b", "ns/p/b", 900 * M, NODE0, HBM, BURSTABLE)
    with pytest.raises(MemoryPlacementError) as err:
        a.allocate("huge", "ns/p/huge", 64 << 30, NODE0, HBM, GUARANTEED)
    assert str(err.value).startswith(
        "libmem: insufficient available memory: failed to resolve overcommit, zones nodes{"
    )
    assert a.assigned("huge") is None
    assert zone(a, "b") == "2"  # moved while trying, then put back (libmem's journal)


def test_a_request_for_unknown_nodes_or_twice_is_refused() -> None:
    a = allocator()
    with pytest.raises(MemoryPlacementError, match=r"unknown nodes requested \(0,40\)"):
        a.allocate("c", "", 0, 1 | 1 << 40, HBM, BURSTABLE)
    a.allocate("c", "", 0, NODE0, HBM, BURSTABLE)
    with pytest.raises(MemoryPlacementError, match="allocation already exists"):
        a.allocate("c", "", 0, 0b10, HBM, BURSTABLE)
    assert zone(a, "c") == "2"


def test_zero_limit_uses_no_capacity() -> None:
    a = allocator()
    for i in range(20):
        assert a.allocate(f"c{i}", "", 0, NODE0, HBM, BURSTABLE) == (0b100, {})
    assert a.zone_usage(0b100) == 0


def test_realloc_keeps_the_zone_from_the_last_allocation() -> None:
    a = allocator()
    a.allocate("big", "ns/p/big", 1536 * M, NODE0, HBM, BURSTABLE)
    # pinned again on the same nodes: the spilled zone stays (not recomputed: 2)
    assert a.realloc("big", NODE0, HBM) == (0b1100, {})
    a.allocate("d", "ns/p/d", 0, NODE0, (), BURSTABLE)
    assert zone(a, "d") == "0"
    # the balloon grows to node 1: the zone grows, never shrinks
    assert a.realloc("d", 0b11, ()) == (0b11, {})
    assert a.realloc("d", NODE0, ()) == (0b11, {})
    # a type it lacks (its annotation changed): the closest node of that type joins
    assert a.realloc("d", NODE0, HBM) == (0b1111, {})  # 2 next to node 0, 3 to node 1


def test_release_frees_the_capacity() -> None:
    a = allocator()
    a.allocate("first", "ns/p/first", 800 * M, NODE0, HBM, BURSTABLE)
    assert a.release("first") and not a.release("first")
    assert a.allocate("second", "ns/p/second", 800 * M, NODE0, HBM, BURSTABLE) == (0b100, {})


def test_allocations_are_saved_and_restored() -> None:
    a = allocator()
    a.allocate("big", "ns/p/big", 1536 * M, NODE0, HBM, GUARANTEED)
    a.allocate("d", "ns/p/d", 100 * M, NODE0, (), BURSTABLE)
    saved = msgspec.json.decode(msgspec.json.encode(a.export()), type=list[MemoryAllocation])
    b = allocator()
    assert b.restore(saved, {"big", "d"}) == []
    assert b.export() == a.export()
    # the next request is younger than the restored ones
    b.allocate("new", "", 0, NODE0, (), BURSTABLE)
    assert b.requests["new"].created > b.requests["d"].created


def test_a_restored_allocation_is_exported_in_the_canonical_form() -> None:
    """A saved allocation's node lists and types are parsed once per distinct
    text (a thousand containers share a few); one saved as :meth:`export`
    writes it is exported as it was read, one written otherwise (an older
    version, a hand edit) as export writes it."""
    canonical = MemoryAllocation(id="c", affinity="0-1", types="DRAM,HBM", zone="0-3", created=1)
    other = MemoryAllocation(id="o", affinity="1,0", types="hbm, dram", zone="0,1,2-3", created=2)
    a = allocator()
    assert a.restore([canonical, other], {"c", "o"}) == []
    c, o = a.export()
    assert c is canonical
    assert o == msgspec.structs.replace(other, affinity="0-1", types="DRAM,HBM", zone="0-3")
    assert a.requests["o"].zone == a.requests["c"].zone == 0b1111
    assert a.requests["o"].types == a.requests["c"].types == HBM | {MemoryType.DRAM}


def test_a_bad_saved_allocation_is_dropped_named_and_the_rest_kept() -> None:
    good = MemoryAllocation(id="ok", limit=M, affinity="0", types="DRAM", zone="0")
    bad = [
        MemoryAllocation(id="far", affinity="0", zone="9"),
        MemoryAllocation(id="huge", affinity="0", zone="0-99999999"),
        MemoryAllocation(id="type", affinity="0", types="XPOINT", zone="0"),
        MemoryAllocation(id="neg", limit=-1, affinity="0", zone="0"),
    ]
    a = allocator()
    alive = {"ok", "far", "huge", "type", "neg"}
    dropped = a.restore([good, *bad, MemoryAllocation(id="gone", affinity="0", zone="0")], alive)
    assert [d.split(":")[0] for d in dropped] == ["far", "huge", "type", "neg"]
    assert set(a.requests) == {"ok"}


def test_old_state_without_allocations_still_reads() -> None:
    state = decode({"version": 2, "balloons": []})
    assert isinstance(state, BalloonsState) and state.memory == []


@pytest.mark.parametrize(
    ("size", "text"),
    [(512, "512"), (1024, "1k"), (300 * M, "300M"), (1536 * M, "1.5G"), (1 << 40, "1T")],
)
def test_human_size_as_libmem(size: int, text: str) -> None:
    assert human_size(size) == text


def test_a_limit_no_zone_can_hold_falls_back_and_moves_no_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    placer = MemoryPlacer(topology(N6_HBM_CXL))
    placer.note("small", 600 * M, QOSClass.BURSTABLE)
    assert placer.mems("small", "ns/p/small", 0b1111, HBM, None) == 0b100
    placer.note("huge", 1 << 62, QOSClass.GUARANTEED)
    with caplog.at_level(logging.INFO):
        assert placer.mems("huge", "ns/p/huge", 0b1111, HBM, None) == NODE0
    assert any(
        m.startswith(
            "allocMem: falling back to 0, failed to allocate memory for ns/p/huge: "
            "libmem: insufficient available memory: failed to resolve overcommit"
        )
        for m in caplog.messages
    ), caplog.messages
    assert placer.current("small", 0) == 0b100
    assert placer.allocator.assigned("huge") is None
    # gone: its memory is free, its remembered request too
    placer.keep_only(["huge"])
    assert placer.allocator.assigned("small") is None


HBM_TYPE = """
reservedResources: {cpu: "cpuset:0"}
pinMemory: true
balloonTypes:
- {name: hbm, namespaces: ["*"], minCPUs: 1, maxCPUs: 1, maxBalloons: 1, memoryTypes: [HBM]}
"""
IMPOSSIBLE = """
reservedResources: {cpu: "cpuset:0"}
balloonTypes:
- {name: hbm, namespaces: ["*"], minBalloons: 2, minCPUs: 10}
"""


def prepared(text: str) -> PreparedConfig:
    result = validate(load_policy(text), online_cpus=topology(N6_HBM_CXL).online)
    assert result.prepared is not None, result.errors
    return result.prepared


def test_the_policy_accounts_limits_and_a_failed_reconfigure_keeps_them() -> None:
    policy = BalloonsPolicy(topology(N6_HBM_CXL))
    policy.set_config(prepared(HBM_TYPE))
    pod = Pod(id="p", name="p", namespace="default", cgroup_parent="/kubepods/burstable/p")
    running = []
    for name, limit in (("c0", 300 * M), ("c1", 800 * M)):
        c = Container(
            id=name,
            pod_sandbox_id="p",
            name=name,
            resources=Resources(memory=MemoryResources(limit=limit)),
        )
        policy.allocate(pod, c)
        running.append((pod, c))
        pins = policy.pinning(lambda _pid: pod)
    own = pins["c1"][1]
    assert len(own) == 1 and pins["c0"][1] == "2-3"  # 300M + 800M: the smaller moved
    with pytest.raises(BalloonsError, match=r"^balloons: config update failed: "):
        policy.reconfigure(prepared(IMPOSSIBLE), running)
    assert policy.pinning(lambda _pid: pod) == pins
    assert [m.id for m in decode(policy.export()).memory] == ["c0", "c1"]
    # a new configuration (no memoryTypes): a new allocator, every container
    # allocated again in order (a kept zone would only grow: 0,2-3)
    policy.reconfigure(prepared(HBM_TYPE.replace(", memoryTypes: [HBM]", "")), running)
    pins = policy.pinning(lambda _pid: pod)
    assert pins["c0"][1] == pins["c1"][1] and len(pins["c0"][1]) == 1, pins
    assert [m.limit for m in decode(policy.export()).memory] == [300 * M, 800 * M]


def test_log_debug_star_debugs_libmem() -> None:
    """``log.debug: ["*"]`` reaches the memory allocator's ``libmem`` logger too."""
    from nri_balloons.plugin import Balloons

    plugin = Balloons()
    plugin.debug_loggers(["*"])
    try:
        assert logging.getLogger("libmem").level == logging.DEBUG
    finally:
        plugin.debug_loggers([])
    assert logging.getLogger("libmem").level == logging.NOTSET


class _Unmemoized(MemoryAllocator):
    """The allocator as it was before capacities, initial zones and clean
    overcommit checks were memoized: the oracle of the twin test."""

    def _overcommit(self, nodes: int) -> tuple[list[int], dict[int, int]]:
        spill: dict[int, int] = {}
        users = {z: use[0] for z, use in self._in_use.items()}
        for z in users:
            if not nodes or z & nodes:
                free = self.zone_free(z)
                if free < 0:
                    spill[z] = -free
        zones = sorted(spill, key=lambda z: (-users[z], z.bit_count(), -z))
        return zones, spill

    def zone_capacity(self, zone: int) -> int:
        return sum(c for n, c in self.capacity.items() if zone >> n & 1)

    def _initial_zone(
        self, affinity: int, types: frozenset[MemoryType]
    ) -> tuple[int, frozenset[MemoryType]]:
        return initial_zone(self.topology, affinity, types)


def _step(a: MemoryAllocator, op: tuple[Any, ...]) -> Any:
    try:
        if op[0] == "allocate":
            return a.allocate(*op[1:])
        if op[0] == "realloc":
            return a.realloc(*op[1:])
        if op[0] == "restore":
            return a.restore(*op[1:])
        return a.release(op[1])
    except (MemoryPlacementError, KeyError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("debug", [False, True])
def test_memoized_zones_allocate_as_computed_ones(
    seed: int, debug: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Random allocations, reallocations and releases (limits that spill and
    fail, every affinity and type set) give the same zones, moves, errors,
    exports and log lines with the memoized capacities and initial zones as
    with the computed ones."""
    rng = random.Random(seed)
    kinds = [frozenset(), HBM, parse_types("dram"), parse_types("pmem"), parse_types("hbm,pmem")]
    ours, oracle = allocator(), _Unmemoized(topology(N6_HBM_CXL))
    level = logging.DEBUG if debug else logging.INFO
    for _ in range(200):
        cid = f"c{rng.randrange(25)}"
        affinity = rng.randrange(1, 64)
        types = rng.choice(kinds)
        op: tuple[Any, ...]
        if rng.random() < 0.03:
            # restored allocations are taken as saved: they may overcommit
            saved = [msgspec.structs.replace(m, id=m.id + "r") for m in ours.export()]
            alive = {m.id for m in saved if rng.random() < 0.5}
            op = ("restore", saved, alive)
        elif cid not in ours.requests:
            limit = rng.choice([0, 0, 0, 0, 100 * M, 700 * M, 1500 * M, 5000 * M])
            prio = rng.choice([BURSTABLE, GUARANTEED])
            op = ("allocate", cid, cid, limit, affinity, types, prio)
        elif rng.random() < 0.5:
            op = ("realloc", cid, affinity, types)
        else:
            op = ("release", cid)
        outs, lines = [], []
        for a in (ours, oracle):
            caplog.clear()
            with caplog.at_level(level, logger="libmem"):
                outs.append(_step(a, op))
            lines.append([r.getMessage() for r in caplog.records])
        assert outs[0] == outs[1], op
        assert lines[0] == lines[1], op
        assert ours.export() == oracle.export()


def test_the_memoized_zones_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memzones, "MEMO_MAX", 4)
    a = allocator()
    for z in range(1, 64):
        assert a.zone_capacity(z) == _Unmemoized.zone_capacity(a, z)
        a.allocate(f"c{z}", "", 0, z, (), BURSTABLE)
    assert 0 < len(a._capacity) <= 4
    assert 0 < len(a._initial) <= 4


def test_a_limit_joining_a_zone_checked_clean_is_checked_again() -> None:
    """Synchronize's 1000 containers without a limit share a zone and skip its
    overcommit check after the first; a container with a limit joining that
    zone is checked (and spills) as without the skip."""
    ours, oracle = allocator(), _Unmemoized(topology(N6_HBM_CXL))
    for a in (ours, oracle):
        for i in range(20):
            assert a.allocate(f"c{i}", "", 0, NODE0, HBM, BURSTABLE) == (0b100, {})
    got = ours.allocate("big", "ns/p/big", 1500 * M, NODE0, HBM, BURSTABLE)
    assert got == oracle.allocate("big", "ns/p/big", 1500 * M, NODE0, HBM, BURSTABLE)
    assert zone(ours, "big") == "2-3"
    assert ours.export() == oracle.export()


def test_a_zone_coming_into_use_is_checked_again() -> None:
    """A restored allocation without a limit brings zone 0-2 into use, over
    its capacity by what its subzones 0-1 and 1-2 hold: the next allocation on
    nodes 0-1, checked clean before, resolves it as without the skip."""
    G = 1024 * M
    ours, oracle = allocator(), _Unmemoized(topology(N6_HBM_CXL))
    for a in (ours, oracle):
        assert a.allocate("a", "", 3 * G + G // 2, 0b11, (), BURSTABLE)[0] == 0b11
        assert a.allocate("b", "", 2 * G + G // 2, 0b110, (), BURSTABLE)[0] == 0b110
        assert a.allocate("x", "", 0, 0b11, (), BURSTABLE)[0] == 0b11
        w = MemoryAllocation(id="w", affinity="0-2", types="DRAM,HBM", zone="0-2", created=9)
        assert a.restore([w], {"w"}) == []
    got = ours.allocate("y", "", 0, 0b11, (), BURSTABLE)
    assert got == oracle.allocate("y", "", 0, 0b11, (), BURSTABLE)
    assert ours.export() == oracle.export()
    assert ours._overcommit(0) == ([], {})

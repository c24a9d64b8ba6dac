"""A pinning reuses the pins of the balloons that did not change
(:meth:`BalloonsPolicy.pinning`, issue #14: a decision touches what changes):
what makes a balloon's pins stale must make them computed again, exactly as a
pinning from scratch would give them."""

from __future__ import annotations

import contextlib
import random

from nri_balloons import annotations as ann
from nri_balloons.balloon import Member
from nri_balloons.configyaml import load_policy
from nri_balloons.memzones import (
    MemoryAllocator,
    MemoryPlacementError,
    Priority,
    format_types,
    parse_types,
)
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import PreparedConfig, validate
from nri_framework import cpuset
from nri_framework.model import Container, MemoryResources, Pod, Resources
from nri_framework.simulate.topologies import N4C16, N6_HBM_CXL, TopologySpec
from topologies import topology

M = 1 << 20

# two balloons on package 0 (node 0), both on HBM node 2 (1 GiB)
HBM_TWO = """
reservedResources: {cpu: "cpuset:0"}
availableResources: {cpu: "cpuset:0-3"}
pinMemory: true
balloonTypes:
- {name: a, namespaces: [a], minCPUs: 1, maxCPUs: 1, maxBalloons: 1, memoryTypes: [HBM]}
- {name: b, namespaces: [b], minCPUs: 1, maxCPUs: 1, maxBalloons: 1, memoryTypes: [HBM]}
"""
TWO = """
reservedResources: {cpu: 1000m}
balloonTypes:
- {name: a, namespaces: [a], minCPUs: 2, maxCPUs: 2, maxBalloons: 1}
- {name: b, namespaces: [b], minCPUs: 2, maxCPUs: 2, maxBalloons: 1}
"""


def policy(spec: TopologySpec, text: str) -> BalloonsPolicy:
    p = BalloonsPolicy(topology(spec))
    result = validate(load_policy(text), online_cpus=topology(spec).online)
    assert result.prepared is not None, result.errors
    prepared: PreparedConfig = result.prepared
    p.set_config(prepared)
    return p


def pod(ns: str, annotations: dict[str, str] | None = None) -> Pod:
    return Pod(
        id=f"p-{ns}",
        name=f"p-{ns}",
        namespace=ns,
        cgroup_parent=f"/kubepods/burstable/p-{ns}",
        annotations=annotations or {},
    )


def container(cid: str, ns: str, limit: int = 0) -> Container:
    mem = Resources(memory=MemoryResources(limit=limit)) if limit else None
    return Container(id=cid, pod_sandbox_id=f"p-{ns}", name=cid, resources=mem)


def test_a_move_by_another_balloons_allocation_reaches_a_reused_balloon() -> None:
    p = policy(N6_HBM_CXL, HBM_TWO)
    pods = {"p-a": pod("a"), "p-b": pod("b")}
    p.allocate(pods["p-a"], container("small", "a", 300 * M))
    pins = p.pinning(pods.get)
    assert pins["small"][1] == "2"
    # balloon a does not change, but b's 800M overcommit HBM node 2: the smaller
    # container (in a) moves to nodes 2-3 and its pins must say so
    p.allocate(pods["p-b"], container("big", "b", 800 * M))
    pins = p.pinning(pods.get)
    assert (pins["small"][1], pins["big"][1]) == ("2-3", "2"), pins
    assert p.pinning(pods.get) == pins  # and stays so when reused


def test_a_pod_sent_anew_is_read_anew() -> None:
    p = policy(N4C16, TWO)
    pods = {"p-a": pod("a"), "p-b": pod("b")}
    p.allocate(pods["p-a"], container("ca", "a"))
    p.allocate(pods["p-b"], container("cb", "b"))
    before = p.pinning(pods.get)
    assert cpuset.parse(before["ca"][0]).bit_count() == 2
    # the runtime sends pod a again, now hiding hyperthreads: nothing else changed
    pods["p-a"] = pod("a", {f"{ann.HIDE_HYPERTHREADS}/pod": "true"})
    after = p.pinning(pods.get)
    assert cpuset.parse(after["ca"][0]).bit_count() == 1, after
    assert after["cb"] == before["cb"]


def test_a_member_that_joins_an_unchanged_balloon_is_pinned() -> None:
    p = policy(N4C16, TWO)
    pods = {"p-a": pod("a"), "p-b": pod("b")}
    p.allocate(pods["p-a"], container("ca", "a"))
    first = p.pinning(pods.get)
    p.allocate(pods["p-a"], container("ca2", "a"))  # same balloon, same CPUs
    second = p.pinning(pods.get)
    assert second["ca2"] == second["ca"] == first["ca"]
    p.release("ca")
    assert set(p.pinning(pods.get)) == {"ca2"}


def test_an_allocation_exported_again_shows_its_new_zone() -> None:
    a = MemoryAllocator(topology(N6_HBM_CXL))
    hbm = parse_types("hbm")
    a.allocate("small", "ns/p/small", 300 * M, 0b1, hbm, Priority.BURSTABLE)
    assert [m.zone for m in a.export()] == ["2"]
    a.allocate("big", "ns/p/big", 800 * M, 0b1, hbm, Priority.GUARANTEED)
    assert {m.id: m.zone for m in a.export()} == {"small": "2-3", "big": "2"}
    a.release("small")
    assert [m.id for m in a.export()] == ["big"]


def test_the_allocators_zone_accounting_follows_every_change() -> None:
    """Zone usage and the export are kept as requests come, move, fail and go
    (not computed over every request per allocation): after each step of a
    seeded random sequence they are what the requests say."""
    a = MemoryAllocator(topology(N6_HBM_CXL))
    rnd = random.Random(14)
    zones = (0b1, 0b10, 0b100, 0b1100, 0b10001, 0b111111)
    types = [parse_types(t) for t in ("hbm", "dram", "pmem", "hbm,dram")]
    live: list[str] = []
    for step in range(300):
        op = rnd.random()
        if op < 0.55 or not live:
            rid = f"r{step}"
            limit = rnd.choice((0, 100, 300, 700, 1500, 9000)) * M
            prio = rnd.choice((Priority.BURSTABLE, Priority.GUARANTEED))
            try:
                a.allocate(rid, rid, limit, rnd.choice(zones[:3]), rnd.choice(types), prio)
                live.append(rid)
            except MemoryPlacementError:
                pass
        elif op < 0.75:
            rid = rnd.choice(live)
            with contextlib.suppress(MemoryPlacementError):
                a.realloc(rid, rnd.choice(zones), rnd.choice(types))
        else:
            rid = live.pop(rnd.randrange(len(live)))
            assert a.release(rid)
        for z in (*zones, 0b1111, 0b110000):
            want = sum(r.limit for r in a.requests.values() if r.zone and not r.zone & ~z)
            assert a.zone_usage(z) == want, (step, z)
        # and the export, kept as requests change, is what they say now
        fresh = sorted(a.requests.values(), key=lambda r: r.created)
        assert [(m.id, m.zone, m.types) for m in a.export()] == [
            (r.id, cpuset.format(r.zone), format_types(r.types)) for r in fresh
        ], step


def test_a_balloons_requested_follows_its_members() -> None:
    """``Balloon.requested`` is kept as members come and go (not summed per
    question): it equals the sum of their requests after each change."""
    from nri_balloons.balloon import Balloon

    p = policy(N4C16, TWO)
    bln = Balloon(bdef=p.types["a"], instance=0, members={"x": member("x", 100)})
    ms = bln.members
    ms["y"] = member("y", 250)
    ms["x"] = member("x", 400)  # replaced
    assert bln.requested == 650
    assert ms.pop("y").request == 250 and ms.pop("y", None) is None
    ms.update({"z": member("z", 7)}, w=member("w", 3))
    del ms["z"]
    ms.setdefault("v", member("v", 20))
    assert bln.requested == sum(m.request for m in ms.values()) == 423
    ms.popitem()
    assert bln.requested == sum(m.request for m in ms.values())
    ms.clear()
    assert bln.requested == 0


def member(cid: str, request: int) -> Member:
    return Member(
        id=cid, pod_id="p", namespace="ns", pod_name="p", name=cid, request=request, limit=0
    )


def test_allocations_restored_out_of_order_are_exported_oldest_first() -> None:
    a = MemoryAllocator(topology(N6_HBM_CXL))
    for rid in ("r1", "r2", "r3"):
        a.allocate(rid, rid, 0, 0b1, (), Priority.BURSTABLE)
    saved = a.export()
    b = MemoryAllocator(topology(N6_HBM_CXL))
    assert b.restore(list(reversed(saved)), {"r1", "r2", "r3"}) == []
    assert [m.id for m in b.export()] == ["r1", "r2", "r3"]

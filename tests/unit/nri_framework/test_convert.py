"""protobuf -> model at the stub's edge: what Synchronize converts 1000 times."""

from __future__ import annotations

import random
from typing import Any

import pytest
from nri_framework import convert
from nri_framework.model import ContainerState, CpuResources, MemoryResources, Resources
from nri_framework.pb import nri_pb2 as pb


def test_wrapper_fields_set_to_zero_are_set_and_absent_ones_none() -> None:
    c = pb.Container(id="c", pod_sandbox_id="p", name="n", state=3, pid=7)
    r = c.linux.resources
    r.cpu.shares.value = 0  # set, to zero: not "unset"
    r.cpu.period.value = 100000
    r.cpu.mems = "0-1"
    r.memory.limit.value = 1 << 28
    r.memory.disable_oom_killer.value = False
    got = convert.container_from_pb(c)
    assert got.state is ContainerState.RUNNING
    assert got.resources is not None
    assert got.resources.cpu == CpuResources(shares=0, period=100000, mems="0-1")
    assert got.resources.memory == MemoryResources(limit=1 << 28, disable_oom_killer=False)
    assert got.resources.cpu.quota is None and got.resources.cpu.cpus == ""


def test_unknown_container_state_is_unknown() -> None:
    assert convert.container_from_pb(pb.Container(id="c", state=99)).state is (
        ContainerState.UNKNOWN
    )


def test_resources_round_trip_through_an_update() -> None:
    c = pb.Container(id="c")
    r = c.linux.resources
    r.cpu.quota.value = -1
    r.cpu.realtime_runtime.value = 5
    r.cpu.cpus = "2-3"
    r.memory.swappiness.value = 60
    r.memory.use_hierarchy.value = True
    res = convert.container_from_pb(c).resources
    assert res is not None
    out = pb.LinuxResources()
    convert.resources_to_pb(res, out)
    assert out == r


# --- ResentPods: a pod resent unchanged is converted once --------------------


def sent_pod(pod_id: str, **annotations: str) -> pb.PodSandbox:
    p = pb.PodSandbox(id=pod_id, name=pod_id, namespace="ns", annotations=annotations)
    p.linux.cgroup_parent = f"/kubepods/pod{pod_id}"
    p.linux.resources.cpu.shares.value = 1024
    return p


def test_resent_pod_is_converted_once_and_a_changed_one_anew() -> None:
    pods = convert.ResentPods()
    first = pods.convert(sent_pod("p", a="1"))
    assert first == convert.pod_from_pb(sent_pod("p", a="1"))
    assert pods.convert(sent_pod("p", a="1")) is first  # the same bytes: reused
    changed = pods.convert(sent_pod("p", a="2"))
    assert changed == convert.pod_from_pb(sent_pod("p", a="2"))
    assert changed.annotations == {"a": "2"}
    assert pods.convert(sent_pod("q", a="1")).id == "q"  # by pod id
    assert len(pods) == 2
    pods.forget("p")
    assert len(pods) == 1 and pods.convert(sent_pod("p", a="2")) is not changed


def test_resent_pods_are_bounded_in_bytes() -> None:
    pods = convert.ResentPods(max_bytes=4096)
    one = len(sent_pod("p0000").SerializeToString())
    for i in range(1000):  # a runtime sending pods without end
        pods.convert(sent_pod(f"p{i:04}"))
        assert pods.size <= 4096
    assert len(pods) == 4096 // one
    kept = range(1000)[-len(pods) :]  # the last ones converted
    assert pods.size == sum(len(sent_pod(f"p{i:04}").SerializeToString()) for i in kept)
    # a pod of more than a sixteenth of the budget is converted, not kept
    big = pods.convert(sent_pod("big", a="x" * 300))
    assert big.annotations == {"a": "x" * 300} and len(pods) == 4096 // one


def test_resources_to_pb_sets_cpu_only_with_something_in_it() -> None:
    for cpu, present in (
        (CpuResources(), False),
        (CpuResources(shares=0), True),  # zero is a value: the wrapper is set
        (CpuResources(realtime_period=0), True),
        (CpuResources(mems="0"), True),
    ):
        out = pb.LinuxResources()
        convert.resources_to_pb(Resources(cpu=cpu), out)
        assert out.HasField("cpu") is present, cpu
        if present:
            assert convert.resources_from_pb(out).cpu == cpu


# --- resources_from_pb: a HasField per field, as the ListFields walk did -------


def _listfields_resources(r: pb.LinuxResources) -> Resources:
    """The conversion before it read each field with HasField: one ListFields
    per message (the oracle of the twin test)."""

    def wrapped(msg: Any, strings: tuple[str, ...] = ()) -> dict[str, Any]:
        return {fd.name: v if fd.name in strings else v.value for fd, v in msg.ListFields()}

    cpu = memory = blockio_class = rdt_class = pids_limit = None
    unified: dict[str, str] = {}
    for fd, v in r.ListFields():
        name = fd.name
        if name == "cpu":
            cpu = CpuResources(**wrapped(v, ("cpus", "mems")))
        elif name == "memory":
            memory = MemoryResources(**wrapped(v))
        elif name == "blockio_class":
            blockio_class = v.value
        elif name == "rdt_class":
            rdt_class = v.value
        elif name == "unified":
            unified = dict(v)
        elif name == "pids":
            pids_limit = v.limit
    return Resources(
        cpu=cpu,
        memory=memory,
        blockio_class=blockio_class,
        rdt_class=rdt_class,
        unified=unified,
        pids_limit=pids_limit,
    )


def _random_resources(rng: random.Random) -> pb.LinuxResources:
    r = pb.LinuxResources()
    values = [0, 1, -1, 204, 1 << 40]
    if rng.random() < 0.8:
        r.cpu.SetInParent()
        for name in ("shares", "quota", "period", "realtime_runtime", "realtime_period"):
            if rng.random() < 0.4:
                v = rng.choice(values)
                unsigned = name in ("shares", "period", "realtime_period")
                getattr(r.cpu, name).value = abs(v) if unsigned else v
        r.cpu.cpus = rng.choice(["", "0-3", "5"])
        r.cpu.mems = rng.choice(["", "0"])
    if rng.random() < 0.8:
        r.memory.SetInParent()
        for name in ("limit", "reservation", "swap", "kernel", "kernel_tcp", "swappiness"):
            if rng.random() < 0.3:
                getattr(r.memory, name).value = abs(rng.choice(values))
        for name in ("disable_oom_killer", "use_hierarchy"):
            if rng.random() < 0.3:
                getattr(r.memory, name).value = rng.random() < 0.5
    if rng.random() < 0.3:
        r.blockio_class.value = rng.choice(["", "slow"])
    if rng.random() < 0.3:
        r.rdt_class.value = rng.choice(["", "gold"])
    if rng.random() < 0.3:
        r.unified["memory.high"] = "max"
    if rng.random() < 0.3:
        r.pids.limit = rng.choice([0, 100])
    if rng.random() < 0.2:
        r.hugepage_limits.add(page_size="2MB", limit=1)
    return r


def test_resources_from_pb_converts_as_the_listfields_walk() -> None:
    rng = random.Random(14)
    for _ in range(600):
        r = _random_resources(rng)
        # through the wire too: what the stub converts is a parsed message
        r = pb.LinuxResources.FromString(r.SerializeToString())
        assert convert.resources_from_pb(r) == _listfields_resources(r), r


# --- synchronize_from_pb: a Synchronize converted in one pass ------------------


def _sync_request(rng: random.Random, n: int) -> pb.SynchronizeRequest:
    req = pb.SynchronizeRequest()
    for i in range(n):
        p = req.pods.add(id=f"p{i}", name=f"p{i}", namespace="ns")
        p.linux.cgroup_parent = f"/kubepods/burstable/podp{i}"
        c = req.containers.add(id=f"c{i}", pod_sandbox_id=p.id, name="ctr", state=3)
        if rng.random() < 0.9:
            shared = rng.random() < 0.7  # most containers ask alike
            r = _random_resources(random.Random(1) if shared else rng)
            c.linux.resources.CopyFrom(r)
    return pb.SynchronizeRequest.FromString(req.SerializeToString())


def test_synchronize_from_pb_converts_as_one_at_a_time() -> None:
    rng = random.Random(7)
    req = _sync_request(rng, 300)
    pods, containers = convert.synchronize_from_pb(req.pods, req.containers)
    assert pods == [convert.pod_from_pb(p) for p in req.pods]
    assert containers == [convert.container_from_pb(c) for c in req.containers]
    shared = [c.resources for c in containers if c.resources == containers[0].resources]
    assert len(shared) > 100 and all(r is shared[0] for r in shared)  # converted once


def test_synchronize_from_pb_remembers_boundedly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime sending many different resources: past SYNC_RESOURCES_MAX
    distinct ones the oldest are forgotten (converted again when repeated),
    the most recent ones shared."""
    monkeypatch.setattr(convert, "SYNC_RESOURCES_MAX", 4)
    calls: list[pb.LinuxResources] = []
    plain = convert.resources_from_pb

    def counting(r: pb.LinuxResources) -> Resources:
        calls.append(r)
        return plain(r)

    monkeypatch.setattr(convert, "resources_from_pb", counting)
    req = pb.SynchronizeRequest()
    asked = list(range(10)) * 2 + [9, 8, 7, 6]  # 10 distinct, each twice, then the last 4
    for k in asked:
        c = req.containers.add(id=f"c{len(req.containers)}")
        c.linux.resources.cpu.shares.value = 2 + k
    _, containers = convert.synchronize_from_pb(req.pods, req.containers)
    assert [c.resources.cpu.shares for c in containers if c.resources and c.resources.cpu] == [
        2 + k for k in asked
    ]
    # the second ten: each forgotten (4 kept, 10 apart); the last 4: kept
    assert len(calls) == 10 + 10
    assert containers[-1].resources is containers[-4 - 4].resources  # 6: shared


# --- recent_resources: a container's resources converted once while resent -----


def test_recent_resources_convert_as_resources_from_pb() -> None:
    """Twin: the remembered conversion equals a fresh one (the oracle) for random
    resources, many repeated (as the runtime resends them), through the wire."""
    convert._resources_of.cache_clear()
    rng = random.Random(21)
    kinds = [_random_resources(random.Random(k)) for k in range(40)]
    for _ in range(800):
        r = rng.choice(kinds) if rng.random() < 0.7 else _random_resources(rng)
        r = pb.LinuxResources.FromString(r.SerializeToString())
        assert convert.recent_resources(r) == convert.resources_from_pb(r), r
        c = pb.Container(id="c", name="n", state=2)
        c.linux.resources.CopyFrom(r)
        plain = convert.container_from_pb(c, convert.resources_from_pb)
        assert convert.container_from_pb(c) == plain


def test_resent_resources_are_one_conversion() -> None:
    convert._resources_of.cache_clear()
    r = _random_resources(random.Random(3))
    again = pb.LinuxResources.FromString(r.SerializeToString())
    assert convert.recent_resources(again) is convert.recent_resources(r)


def test_recent_resources_remember_a_bounded_count() -> None:
    """Past RECENT_RESOURCES distinct resources, the oldest is converted anew."""
    convert._resources_of.cache_clear()
    first = pb.LinuxResources()
    first.cpu.shares.value = 2
    kept = convert.recent_resources(first)
    for k in range(convert.RECENT_RESOURCES):
        r = pb.LinuxResources()
        r.cpu.shares.value = 3 + k
        convert.recent_resources(r)
    assert convert._resources_of.cache_info().currsize <= convert.RECENT_RESOURCES
    again = convert.recent_resources(first)
    assert again == kept and again is not kept


def test_recent_resources_do_not_keep_huge_ones() -> None:
    """Resources serialized over RECENT_RESOURCES_BYTES are converted each time,
    never kept (a hostile runtime's huge ones cost no memory here)."""
    convert._resources_of.cache_clear()
    r = pb.LinuxResources()
    r.unified["x"] = "y" * convert.RECENT_RESOURCES_BYTES
    one, two = convert.recent_resources(r), convert.recent_resources(r)
    assert one == two == convert.resources_from_pb(r) and one is not two
    assert convert._resources_of.cache_info().currsize == 0

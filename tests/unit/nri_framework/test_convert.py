"""protobuf -> model at the stub's edge: what Synchronize converts 1000 times."""

from __future__ import annotations

from nri_framework import convert
from nri_framework.model import ContainerState, CpuResources, MemoryResources
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

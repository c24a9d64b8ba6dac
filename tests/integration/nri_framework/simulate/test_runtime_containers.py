"""The runtime simulator's container requests: CreateContainer adjustments (and their
conflicts, errors and slow plugins), UpdateContainer (reassert or the kubelet wins),
unsolicited updates.

Where the neighbouring test modules are: see :mod:`runtime_peers`.
"""

from __future__ import annotations

import asyncio

import pytest
from nri_framework.model import CpuResources, Resources, Update, cpu_pin
from nri_framework.nri.ttrpc import Code, TtrpcError
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.runtime import NriError
from runtime_peers import (
    NS_MD,
    MakeRuntime,
    PinPolicy,
    RawPlugin,
    answer_never,
    created_pod,
    loop_now,
    sample_container,
    sample_pod,
    stub_plugin,
)

# --- CreateContainer ----------------------------------------------------------------


async def test_create_container_adjustment_applied(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    policy = PinPolicy("1")
    async with stub_plugin(rt, policy):
        pod, (first,) = await created_pod(rt)
        policy.other_update = Update(container_id=first.id, resources=cpu_pin("2-3"))
        second = await rt.create_container(pod.id, sample_container("c1"))
    assert second.cpus == "1"
    assert second.resources and second.resources.cpu
    assert second.resources.cpu.mems == "0"
    assert second.resources.cpu.shares == 1024  # untouched fields keep the kubelet's value
    assert second.annotations["pinned-by"] == "pin-policy"
    assert second.env == ["PATH=/bin", "PINNED_CPUS=1"]
    assert second.cgroups_path == f"/kubepods/poduid-pod0/{second.id}"
    table = rt.containers
    assert table[second.id] == second
    assert table[first.id].cpus == "2-3"  # the update of the other container was applied
    assert policy.created == [first.id, second.id]


@pytest.mark.parametrize(
    ("decorate", "field"), [(False, "CPU pinning"), (True, "annotation pinned-by")]
)
async def test_two_plugins_setting_one_field_is_an_error(
    make_runtime: MakeRuntime, decorate: bool, field: str
) -> None:
    rt = await make_runtime()
    pod = await rt.run_pod(sample_pod())
    async with (
        stub_plugin(rt, PinPolicy("1", decorate=decorate), name="a", index="50"),
        stub_plugin(rt, PinPolicy("2", decorate=decorate), name="b", index="60"),
    ):
        with pytest.raises(NriError) as err:
            await rt.create_container(pod.id, sample_container())
        assert len(rt.plugins) == 2
    assert str(err.value) == (
        "failed to get NRI adjustment for container: "
        f'plugins "60-b" and "50-a" both tried to set {field}'
    )
    assert rt.containers == {}


async def test_plugin_error_fails_creation(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path)

    async def refuse(payload: bytes) -> bytes:
        raise TtrpcError(Code.UNKNOWN, "no CPUs left")

    raw.handlers["CreateContainer"] = refuse
    await raw.start()
    await rt.wait_plugins(1, 5)
    pod = await rt.run_pod(sample_pod())
    with pytest.raises(NriError, match="rpc error: code = Unknown desc = no CPUs left"):
        await rt.create_container(pod.id, sample_container())
    assert len(rt.plugins) == 1  # a non-fatal error keeps the plugin
    await raw.close()


async def test_update_of_the_container_being_created_is_an_error(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path, name="upd", index="40")

    async def update_self(payload: bytes) -> bytes:
        cid = pb.CreateContainerRequest.FromString(payload).container.id
        rpl = pb.CreateContainerResponse()
        rpl.update.add(container_id=cid).linux.resources.cpu.cpus = "0"
        return rpl.SerializeToString()

    raw.handlers["CreateContainer"] = update_self
    await raw.start()
    await rt.wait_plugins(1, 5)
    pod = await rt.run_pod(sample_pod())
    with pytest.raises(
        NriError, match=r'plugin "40-upd" asked update of "[0-9a-f]{64}" during creation'
    ):
        await rt.create_container(pod.id, sample_container())
    await raw.close()


async def test_slow_plugin_is_dropped_and_creation_goes_on(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await make_runtime(request_timeout=0.3)
    slow = RawPlugin(rt.socket_path, name="slow", index="20")
    slow.handlers["CreateContainer"] = answer_never
    await slow.start()
    await rt.wait_plugins(1, 5)
    async with stub_plugin(rt, PinPolicy("1"), name="pin", index="30"):
        pod = await rt.run_pod(sample_pod())
        t0 = loop_now()
        # a liveness bound: the creation finishes at all (it waits 0.3 s for the slow one)
        created = await asyncio.wait_for(rt.create_container(pod.id, sample_container()), 10)
        elapsed = loop_now() - t0
        assert [p.full_name for p in rt.plugins] == ["30-pin"]
    assert elapsed > 0.25  # it waited for the deadline (a lower bound: no speed claim)
    assert created.cpus == "1"  # the other plugin's adjustment, without the slow one's
    await asyncio.wait_for(slow.closed.wait(), 5)
    assert (
        "closing plugin 20-slow, failed to handle CreateContainer request: "
        "context deadline exceeded" in caplog.text
    )
    # the request carried the deadline, like containerd's 2 s context: the 0.3 s budget
    create_req = next(s for s in slow.seen if s.method == "CreateContainer")
    assert create_req.metadata == NS_MD
    assert 0.25e9 < create_req.timeout_nano <= 0.3e9


async def test_slow_plugin_without_others_leaves_container_unadjusted(
    make_runtime: MakeRuntime,
) -> None:
    rt = await make_runtime(request_timeout=0.2)
    slow = RawPlugin(rt.socket_path, name="slow", index="20")
    slow.handlers["CreateContainer"] = answer_never
    await slow.start()
    await rt.wait_plugins(1, 5)
    pod = await rt.run_pod(sample_pod())
    created = await rt.create_container(pod.id, sample_container(cpus="0-3"))
    assert created.cpus == "0-3"
    assert rt.plugins == []


# --- UpdateContainer ----------------------------------------------------------------


@pytest.mark.parametrize(("reassert", "expected"), [(True, "1"), (False, "0-3")])
async def test_update_container_reassert_or_kubelet_wins(
    make_runtime: MakeRuntime, reassert: bool, expected: str
) -> None:
    rt = await make_runtime()
    async with stub_plugin(rt, PinPolicy("1", reassert=reassert)):
        _, (ctr,) = await created_pod(rt)
        assert ctr.cpus == "1"
        await rt.start_container(ctr.id)
        kubelet = Resources(cpu=CpuResources(shares=2048, quota=200000, period=100000, cpus="0-3"))
        updated = await rt.update_container(ctr.id, kubelet)
    assert updated.cpus == expected
    assert updated.resources and updated.resources.cpu
    assert (updated.resources.cpu.shares, updated.resources.cpu.quota) == (2048, 200000)


async def test_update_without_cpuset_keeps_the_pinning(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    async with stub_plugin(rt, PinPolicy("1")):
        _, (ctr,) = await created_pod(rt)
        updated = await rt.update_container(ctr.id, Resources(cpu=CpuResources(shares=512)))
    assert (updated.cpus, updated.resources.cpu.shares) == ("1", 512)  # type: ignore[union-attr]


# --- unsolicited updates ----------------------------------------------------------------


async def test_unsolicited_update_containers(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    async with stub_plugin(rt, PinPolicy("1")) as host:
        _, (ctr,) = await created_pod(rt)
        failed = await host.update_containers(
            [
                Update(container_id=ctr.id, resources=cpu_pin("2", "0")),
                Update(container_id="no-such-container", resources=cpu_pin("3")),
            ]
        )
        assert [u.container_id for u in failed] == ["no-such-container"]
        assert rt.containers[ctr.id].cpus == "2"
        ok = await host.update_containers([Update(container_id=ctr.id, resources=cpu_pin("0"))])
        assert ok == []
        assert rt.containers[ctr.id].cpus == "0"

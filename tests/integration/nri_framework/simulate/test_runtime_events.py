"""The runtime simulator's lifecycle events: containerd 1.7's order, subscriptions, the
v0.12 dedicated RPCs and their fallback to StateChange, closing plugins on stop.

Where the neighbouring test modules are: see :mod:`runtime_peers`.
"""

from __future__ import annotations

import asyncio

from nri_framework.model import CpuResources, Event, Resources
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.emulation import NRI_V0_12
from nri_framework.simulate.runtime import SimulatedRuntime
from runtime_peers import (
    NS_MD,
    MakeRuntime,
    PinPolicy,
    RawPlugin,
    answer_empty,
    sample_container,
    sample_pod,
    stub_plugin,
)

# --- lifecycle events ------------------------------------------------------------------


async def _lifecycle(rt: SimulatedRuntime) -> None:
    pod = await rt.run_pod(sample_pod())
    ctr = await rt.create_container(pod.id, sample_container())
    await rt.start_container(ctr.id)
    await rt.update_container(ctr.id, Resources(cpu=CpuResources(shares=512)))
    await rt.stop_container(ctr.id)
    await rt.remove_container(ctr.id)
    await rt.stop_pod(pod.id)
    await rt.remove_pod(pod.id)


async def test_lifecycle_events_in_containerd_1_7_order(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path)
    await raw.start()
    await rt.wait_plugins(1, 5)
    await _lifecycle(rt)
    assert raw.labels() == [
        "Configure",
        "Synchronize",
        "RUN_POD_SANDBOX",
        "CreateContainer",
        "POST_CREATE_CONTAINER",
        "START_CONTAINER",
        "POST_START_CONTAINER",
        "UpdateContainer",
        "POST_UPDATE_CONTAINER",
        "StopContainer",
        "REMOVE_CONTAINER",
        "STOP_POD_SANDBOX",
        "REMOVE_POD_SANDBOX",
    ]
    by_label = {s.label: s for s in raw.seen}
    assert by_label["StopContainer"].metadata == ()
    assert by_label["START_CONTAINER"].metadata == NS_MD
    states = {
        label: pb.StateChangeEvent.FromString(by_label[label].payload).container
        for label in ("POST_CREATE_CONTAINER", "START_CONTAINER", "POST_START_CONTAINER")
    }
    assert states["POST_CREATE_CONTAINER"].state == pb.CONTAINER_CREATED
    assert (
        states["START_CONTAINER"].pid > 0
        and states["START_CONTAINER"].state == pb.CONTAINER_CREATED
    )
    assert states["POST_START_CONTAINER"].state == pb.CONTAINER_RUNNING
    assert rt.containers == {} and rt.pods == {}
    await raw.close()


async def test_only_subscribed_events_are_sent(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path, events=Event.CREATE_CONTAINER.bit | Event.STOP_POD_SANDBOX.bit)
    await raw.start()
    await rt.wait_plugins(1, 5)
    await _lifecycle(rt)
    assert raw.labels() == ["Configure", "Synchronize", "CreateContainer", "STOP_POD_SANDBOX"]
    await raw.close()


async def test_v0_12_dedicated_rpcs_fall_back_to_state_change(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12)
    raw = RawPlugin(rt.socket_path)
    raw.handlers["RunPodSandbox"] = answer_empty  # implemented; PostCreateContainer is not
    await raw.start()
    await rt.wait_plugins(1, 5)
    pod = await rt.run_pod(sample_pod())
    ctr = await rt.create_container(pod.id, sample_container())
    await rt.start_container(ctr.id)
    assert raw.labels()[2:] == [
        "RunPodSandbox",
        "CreateContainer",
        "PostCreateContainer",  # UNIMPLEMENTED ...
        "POST_CREATE_CONTAINER",  # ... so StateChange, and from now on only StateChange
        "START_CONTAINER",
        "POST_START_CONTAINER",
    ]
    assert len(rt.plugins) == 1
    await raw.close()


async def test_real_stub_under_v0_12(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12)
    async with stub_plugin(rt, PinPolicy("1")) as host:
        await _lifecycle(rt)
        assert len(rt.plugins) == 1
        assert host.cache.containers == {}  # the cache saw RemoveContainer/RemovePodSandbox


async def test_stop_closes_plugins(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path)
    await raw.start()
    await rt.wait_plugins(1, 5)
    await rt.stop()
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert not rt.socket_path.exists()

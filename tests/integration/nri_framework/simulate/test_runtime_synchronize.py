"""The runtime simulator's Synchronize: paging with ``more`` (v0.7+), the real stub's
paging and its updates applied, a plugin that does not echo ``more``, NRI 0.6's
oversized sync.

Where the neighbouring test modules are: see :mod:`runtime_peers`.
"""

from __future__ import annotations

import asyncio

from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.emulation import NRI_V0_12
from nri_framework.simulate.runtime import SimulatedRuntime
from runtime_peers import (
    MakeRuntime,
    PinPolicy,
    RawPlugin,
    answer_empty,
    sample_container,
    sample_pod,
    stub_plugin,
)

# --- Synchronize ----------------------------------------------------------------------


async def _populate(rt: SimulatedRuntime, pods: int, per_pod: int) -> list[str]:
    ids: list[str] = []
    for i in range(pods):
        pod = await rt.run_pod(sample_pod(f"pod{i}"))
        for j in range(per_pod):
            ids.append((await rt.create_container(pod.id, sample_container(f"c{j}"))).id)
    return ids


async def test_synchronize_pages_with_more(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12, max_message_size=4000)
    ids = await _populate(rt, pods=6, per_pod=3)
    raw = RawPlugin(rt.socket_path)
    await raw.start()
    await rt.wait_plugins(1, 5)
    chunks = [
        pb.SynchronizeRequest.FromString(s.payload) for s in raw.seen if s.method == "Synchronize"
    ]
    assert len(chunks) > 1
    assert [c.more for c in chunks] == [True] * (len(chunks) - 1) + [False]
    assert all(c.ByteSize() <= 4000 for c in chunks)
    assert sum(len(c.pods) for c in chunks) == 6
    assert sorted(ctr.id for c in chunks for ctr in c.containers) == sorted(ids)
    await raw.close()


async def test_real_stub_handles_paging_and_sync_updates_apply(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12, max_message_size=4000)
    ids = await _populate(rt, pods=6, per_pod=3)
    policy = PinPolicy(sync_update="3")
    async with stub_plugin(rt, policy):
        assert policy.synced is not None
        pods, containers = policy.synced
        assert len(pods) == 6 and len(containers) == 18
        assert rt.containers[containers[0].id].cpus == "3"
        assert {rt.containers[i].cpus for i in ids[1:]} == {""}


async def test_plugin_that_does_not_echo_more_is_closed(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12, max_message_size=4000)
    await _populate(rt, pods=6, per_pod=3)
    raw = RawPlugin(rt.socket_path)
    raw.handlers["Synchronize"] = answer_empty  # answers SynchronizeResponse{} even for more=true
    await raw.start()
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.failures == [
        "failed to synchronize plugin: plugin does not handle split sync requests"
    ]
    assert rt.plugins == []


async def test_nri_0_6_cannot_split_an_oversized_sync(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(max_message_size=4000)
    await _populate(rt, pods=6, per_pod=3)
    raw = RawPlugin(rt.socket_path)
    await raw.start()
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.failures[0].startswith(
        "failed to synchronize plugin: rpc error: code = ResourceExhausted desc = message length "
    )
    assert not any(s.method == "Synchronize" for s in raw.seen)  # refused locally, like ttrpc

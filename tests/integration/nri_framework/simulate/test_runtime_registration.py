"""The runtime simulator and a plugin's registration: the real stub registers, the
Configure request of each emulated version, the event mask, invalid registrations,
the registration timeout, plugins admitted one at a time.

Where the neighbouring test modules are: see :mod:`runtime_peers`.
"""

from __future__ import annotations

import asyncio
import logging
import os

import pytest
from nri_framework.model import Event
from nri_framework.nri.ttrpc import Code
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.emulation import CONTAINERD_1_7, NRI_V0_12, Emulation
from runtime_peers import ALL_V06, MakeRuntime, PinPolicy, RawPlugin, stub_plugin, until

# --- registration and Configure -----------------------------------------------------


async def test_registration_with_real_stub(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "nri_framework.simulate")
    rt = await make_runtime()
    async with stub_plugin(rt, PinPolicy()):
        (info,) = await rt.wait_plugins(1, 5)
        assert (info.name, info.index, info.full_name) == ("pin", "10", "10-pin")
        assert info.pid == os.getpid()
        expected = 0
        for ev in (
            Event.CREATE_CONTAINER,
            Event.UPDATE_CONTAINER,
            Event.REMOVE_CONTAINER,
            Event.REMOVE_POD_SANDBOX,
        ):
            expected |= ev.bit
        assert info.events == expected
    assert f'plugin "external:10-pin[{os.getpid()}]" registered as "10-pin"' in caplog.text
    assert 'plugin "10-pin" connected' in caplog.text


@pytest.mark.parametrize("emulation", [CONTAINERD_1_7, NRI_V0_12], ids=["nri-0.6.1", "nri-0.12"])
async def test_configure_request_matches_emulation(
    make_runtime: MakeRuntime, emulation: Emulation
) -> None:
    rt = await make_runtime(emulation=emulation, registration_timeout=3.0, request_timeout=1.5)
    raw = RawPlugin(rt.socket_path)
    assert await raw.start() == (0, "")
    await rt.wait_plugins(1, 5)
    req = pb.ConfigureRequest.FromString(raw.seen[0].payload)
    assert raw.seen[0].method == "Configure" and raw.seen[0].metadata == ()
    assert (req.runtime_name, req.config) == ("containerd", "")
    if emulation is CONTAINERD_1_7:
        assert req.runtime_version == "1.7.24~ds1"
        assert (req.registration_timeout, req.request_timeout, req.NRI_version) == (0, 0, "")
        assert rt.plugins[0].events == ALL_V06  # events == 0: all valid events
    else:
        assert (req.registration_timeout, req.request_timeout) == (3000, 1500)
        assert req.NRI_version == "v0.12.0"
        assert rt.plugins[0].events == 0x3FFF
    await raw.close()


@pytest.mark.parametrize(
    ("emulation", "accepted"),
    [(CONTAINERD_1_7, False), (NRI_V0_12, True)],
    ids=["nri-0.6.1", "nri-0.12"],
)
async def test_event_mask_checked_against_version(
    make_runtime: MakeRuntime,
    emulation: Emulation,
    accepted: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = await make_runtime(emulation=emulation)
    raw = RawPlugin(rt.socket_path, events=0xFFF)
    await raw.start()
    if accepted:
        (info,) = await rt.wait_plugins(1, 5)
        assert info.events == 0xFFF
        await raw.close()
        return
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.plugins == []
    assert rt.failures == ["failed to start external plugin: invalid plugin events: 0x800"]
    assert "invalid plugin events: 0x800" in caplog.text


@pytest.mark.parametrize(
    ("name", "index", "message"),
    [
        ("raw", "1", 'invalid plugin index: invalid plugin index "1", must be 2 digits'),
        ("raw", "x1", 'invalid plugin index: invalid plugin index "x1" (not [0-9][0-9])'),
        (
            "bad name",
            "10",
            "invalid plugin name: invalid plugin name \"bad name\": contains invalid character ' '",
        ),
        ("", "10", "invalid plugin name: invalid plugin name: name is empty"),
    ],
)
async def test_invalid_registration_rejected(
    make_runtime: MakeRuntime, name: str, index: str, message: str
) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path, name=name, index=index)
    code, text = await raw.start()
    assert (code, text) == (Code.UNKNOWN, message)
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.failures[0].startswith("failed to start external plugin: failed to register plugin: ")
    assert rt.plugins == []


async def test_registration_timeout(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(registration_timeout=0.2)
    raw = RawPlugin(rt.socket_path)
    await raw.start(register=False)
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.failures == ["failed to start external plugin: plugin registration timed out"]


async def test_plugins_are_admitted_one_at_a_time(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    slow = RawPlugin(rt.socket_path, name="first", index="20")
    order: list[str] = []

    async def slow_sync(payload: bytes) -> bytes:
        await asyncio.sleep(0.3)  # the stimulus: a slow Synchronize
        order.append("first synchronized")
        return b""

    async def fast_configure(payload: bytes) -> bytes:
        order.append("second configured")
        return pb.ConfigureResponse().SerializeToString()

    slow.handlers["Synchronize"] = slow_sync
    fast = RawPlugin(rt.socket_path, name="second", index="10")
    fast.handlers["Configure"] = fast_configure
    await slow.start()
    await until(lambda: "Synchronize" in slow.labels())  # the first is being admitted
    second = asyncio.create_task(fast.start())
    infos = await rt.wait_plugins(2, 5)
    await second
    # the second plugin is configured only after the first one is synchronized
    assert order == ["first synchronized", "second configured"]
    assert [p.full_name for p in infos] == ["10-second", "20-first"]  # invocation order by index
    await slow.close()
    await fast.close()

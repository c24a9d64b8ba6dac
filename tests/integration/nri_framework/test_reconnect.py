"""The stub's reconnect backoff against the runtime simulator on a unix socket:
it doubles while the runtime stays away and starts over after a connection
that registered. The waits are an injected ``pause`` that records them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nri_framework.host import PolicyHost
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.policies.pinner import Pinner
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.sysfs import write_cpu_tree
from nri_framework.stub import PluginStub, StubOptions


class Pauses:
    """The stub's waits: each is recorded and lasts until the test resumes it."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.resume.clear()
        self.paused.set()
        await self.resume.wait()

    async def next(self) -> float:
        await asyncio.wait_for(self.paused.wait(), 10)
        self.paused.clear()
        return self.delays[-1]


async def serve_once(rt: SimulatedRuntime, n: int) -> None:
    """The plugin registers and answers a CreateContainer."""
    await rt.wait_plugins(1, 10)
    pod = await rt.run_pod(Pod(id="", name=f"p{n}", uid=f"u{n}", namespace="default"))
    shared = Container(id="", name="c", resources=Resources(cpu=CpuResources(shares=2)))
    assert (await rt.create_container(pod.id, shared)).cpus


async def test_backoff_starts_over_after_a_registered_connection(tmp_path: Path) -> None:
    root = tmp_path / "host"
    write_cpu_tree(root, 4)
    sock = tmp_path / "nri.sock"
    host = PolicyHost("pinner", Pinner(), host_root=str(root))
    pauses = Pauses()
    stub = PluginStub(host, StubOptions(socket_path=str(sock)), pause=pauses)
    rt = SimulatedRuntime(sock)
    await rt.start()
    running = asyncio.create_task(stub.run())
    try:
        # five outages, each after a connection that registered and served:
        # every one waits the initial delay (it was 0.5, 1, 2, 4, 8 s)
        for n in range(5):
            await serve_once(rt, n)
            await rt.stop()
            assert await pauses.next() == 0.5
            await rt.start()
            pauses.resume.set()
        # the runtime stays away: the waits double while attempts fail
        await serve_once(rt, 5)
        await rt.stop()
        assert [await pauses.next()] == [0.5]
        for want in (1.0, 2.0, 4.0, 8.0, 10.0, 10.0):
            pauses.resume.set()
            assert await pauses.next() == want
        # it comes back and serves: the next outage starts over
        await rt.start()
        pauses.resume.set()
        await serve_once(rt, 6)
        await rt.stop()
        assert await pauses.next() == 0.5
        assert pauses.delays == [0.5] * 6 + [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 0.5]
    finally:
        stub.stop()
        pauses.resume.set()
        await asyncio.wait_for(running, 10)
        await rt.stop()

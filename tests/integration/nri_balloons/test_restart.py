"""A restart of the balloons plugin (SIGKILL, then a new process on the same
state dir) re-synchronizes to exactly the same balloons and cpusets."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any

from balloons_e2e import node, plugin_command
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_framework.simulate.sysfs import write_topology


async def test_sigkill_restart_keeps_every_cpuset() -> None:
    async with node("test08-numa", "balloons.yaml") as n:
        for pod in ("pod0.yaml", "pod1.yaml", "pod2.yaml", "pod3.yaml"):
            await n.create(pod)
        before = n.all_cpus()
        # no wait: each decision is journaled before its reply (nri_framework.journal)
        n.plugin.kill()
        await n.plugin.stop()  # reaped and its pipe drained (no transport left behind)
        state = n.host_root.parent / "state"
        cmd = plugin_command(n.rt.socket_path, n.host_root, state, n.config)
        n.plugin = await PluginProcess.launch(cmd)
        await wait_registered(n.rt, n.plugin, 10)
        await n.plugin.wait_output("synchronized", timeout=10)
        assert n.all_cpus() == before
        # restored from the state dir, not placed anew
        assert not any(re.search("assigning container", line) for line in n.plugin.tail)
        # and it goes on placing: a new pod still works
        await n.create("pod4.yaml")
        assert n.cpus("pod4c0")
        await n.plugin.stop()  # node() stops the plugin it started, not this one


# --- SIGKILL the instant the runtime has the reply ---------------------------------------

DEDICATED = """
reservedResources: {cpu: "cpuset:0"}
balloonTypes:
- name: dedicated
  namespaces: ["*"]
  preferNewBalloons: true
"""


class KillOnCreateReply(SimulatedRuntime):
    """The runtime simulator, SIGKILLing ``victim`` the moment a CreateContainer
    reply from it has been read (a stand-in hook on the simulator's one
    request path: the plugin gets no instruction after its reply)."""

    victim: int | None = None

    async def _request(self, peer: Any, method: str, req: Any, rtype: Any) -> Any:
        reply = await super()._request(peer, method, req, rtype)
        if method == "CreateContainer" and self.victim is not None:
            os.kill(self.victim, signal.SIGKILL)
            self.victim = None
        return reply


def two_cpus(name: str) -> Container:
    cpu = CpuResources(shares=2048, quota=200_000, period=100_000)
    return Container(id="", name=name, resources=Resources(cpu=cpu))


async def test_sigkill_right_after_create_replies_moves_no_container(tmp_path: Path) -> None:
    """Each round: create a container, drop an old one, create another and
    SIGKILL the plugin as soon as its reply is in; while it is dead the
    runtime removes the oldest container (so a decision that was lost would
    be made afresh on other CPUs); the restarted plugin must give every
    running container exactly the CPUs the runtime applied."""
    host_root = write_topology(tmp_path / "host", "n4c16")
    config = tmp_path / "balloons.yaml"
    config.write_text(DEDICATED)
    state = tmp_path / "state"
    cmd = plugin_command(tmp_path / "nri.sock", host_root, state, config)
    alive: list[str] = []
    async with KillOnCreateReply(tmp_path / "nri.sock") as rt:
        plugin = await PluginProcess.launch(cmd)
        try:
            await wait_registered(rt, plugin, 20)
            pod = await rt.run_pod(Pod(id="", name="p", uid="u", namespace="default"))
            for r in range(6):
                a = await rt.create_container(pod.id, two_cpus(f"a{r}"))
                await rt.start_container(a.id)
                alive.append(a.id)
                if len(alive) > 3:
                    await rt.remove_container(alive.pop(0))
                rt.victim = plugin.proc.pid
                c = await rt.create_container(pod.id, two_cpus(f"c{r}"))
                assert c.cpus, "the reply came before the kill"
                assert await asyncio.wait_for(plugin.proc.wait(), 10) == -signal.SIGKILL
                alive.append(c.id)
                await rt.start_container(c.id)
                await rt.remove_container(alive.pop(0))  # while the plugin is dead
                before = {cid: rt.container(cid).cpus for cid in alive}
                await plugin.stop()
                plugin = await PluginProcess.launch(cmd)
                await wait_registered(rt, plugin, 20)
                await plugin.wait_output("synchronized", timeout=10)
                after = {cid: rt.container(cid).cpus for cid in alive}
                assert after == before, f"round {r}:\n{plugin.output()}"
        finally:
            await plugin.stop()


async def test_runtime_restart_moves_no_container(tmp_path: Path) -> None:
    """The runtime restarts (its containers keep running) and synchronizes the
    plugin again: what the plugin decided since it started stays, not what it
    had loaded at start (a container removed in between freed CPUs that a
    fresh placement would hand to the others)."""
    host_root = write_topology(tmp_path / "host", "n4c16")
    config = tmp_path / "balloons.yaml"
    config.write_text(DEDICATED)
    cmd = plugin_command(tmp_path / "nri.sock", host_root, tmp_path / "state", config)
    cmd.remove("--exit-on-disconnect")
    rt = SimulatedRuntime(tmp_path / "nri.sock")
    await rt.start()
    plugin = await PluginProcess.launch(cmd)
    try:
        await wait_registered(rt, plugin, 20)
        pod = await rt.run_pod(Pod(id="", name="p", uid="u", namespace="default"))
        ids = [(await rt.create_container(pod.id, two_cpus(f"c{i}"))).id for i in range(3)]
        await rt.remove_container(ids.pop(0))
        before = {cid: rt.container(cid).cpus for cid in ids}
        await rt.stop()
        await rt.start()
        await wait_registered(rt, plugin, 20)
        await plugin.wait_output("synchronized 1 pod(s), 2 container(s)", timeout=10)
        assert {cid: rt.container(cid).cpus for cid in ids} == before, plugin.output()
    finally:
        await rt.stop()
        await plugin.stop()

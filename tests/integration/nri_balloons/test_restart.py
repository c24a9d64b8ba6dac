"""A restart of the balloons plugin (SIGKILL, then a new process on the same
state dir) re-synchronizes to exactly the same balloons and cpusets."""

from __future__ import annotations

import asyncio
import re

from balloons_e2e import node, plugin_command
from nri_framework.simulate.scenario import PluginProcess, wait_registered


async def test_sigkill_restart_keeps_every_cpuset() -> None:
    async with node("test08-numa", "balloons.yaml") as n:
        for pod in ("pod0.yaml", "pod1.yaml", "pod2.yaml", "pod3.yaml"):
            await n.create(pod)
        before = n.all_cpus()
        await asyncio.sleep(0.3)  # the state file is written off the reply path
        n.plugin.kill()
        await n.plugin.proc.wait()
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

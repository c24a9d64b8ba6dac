"""SIGHUP reloads ``--config-file`` into the running plugin: containers move and
the runtime hears of it through UpdateContainers; an invalid file is rejected
with upstream's text and the running configuration stays."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess
from nri_framework.simulate.sysfs import write_topology

CONFIG = """
reservedResources: {cpu: "cpuset:0"}
balloonTypes:
- name: work
  namespaces: ["*"]
  minCPUs: %d
  maxCPUs: %d
"""


async def test_sighup_reload(tmp_path: Path) -> None:
    write_topology(tmp_path / "host", "n4c16")
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(CONFIG % (1, 4))
    sock = tmp_path / "nri.sock"
    cmd = [sys.executable, "-m", "nri_framework", "run", "--policy", "balloons",
           "--nri-socket", str(sock), "--host-root", str(tmp_path / "host"),
           "--state-dir", str(tmp_path / "state"), "--config-file", str(cfg)]  # fmt: skip
    async with SimulatedRuntime(sock) as rt:
        plugin = await PluginProcess.launch(cmd)
        try:
            await rt.wait_plugins(1, 20)
            pod = await rt.run_pod(Pod(id="", name="p", uid="u", namespace="default",
                                       cgroup_parent="/kubepods/burstable/podu"))  # fmt: skip
            c = await rt.create_container(
                pod.id,
                Container(id="", name="c", resources=Resources(cpu=CpuResources(shares=512))),
            )
            assert cpuset.parse(rt.container(c.id).cpus).bit_count() == 1

            cfg.write_text(CONFIG % (3, 4))
            plugin.proc.send_signal(signal.SIGHUP)
            await plugin.wait_output("config update from", timeout=10)
            for _ in range(100):
                if cpuset.parse(rt.container(c.id).cpus).bit_count() == 3:
                    break
                await asyncio.sleep(0.05)
            assert cpuset.parse(rt.container(c.id).cpus).bit_count() == 3, plugin.output()

            cfg.write_text(CONFIG % (5, 2))
            plugin.proc.send_signal(signal.SIGHUP)
            await plugin.wait_output("keeping the running configuration", timeout=10)
            assert "MinCpus (5) > MaxCpus (2) in balloon type" in plugin.output()
            assert cpuset.parse(rt.container(c.id).cpus).bit_count() == 3
            assert plugin.proc.returncode is None
        finally:
            await plugin.stop()

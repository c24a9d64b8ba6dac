"""SIGHUP reloads ``--config-file`` into the running plugin: containers move and
the runtime hears of it through UpdateContainers; an invalid file is rejected
with upstream's text and the running configuration stays."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.runtime import NriError, SimulatedRuntime
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


# --- reloads that must not stop the event loop --------------------------------------------

#: Small, valid YAML that costs a while to check (a second or so): 10000
#: aliases of one balloon type expand to half a million nodes (within the
#: loader's bounds); it is rejected in the end (10000 types named "t").
SLOW = (
    "reservedResources: {cpu: 'cpuset:0'}\nballoonTypes: [&t {name: t, namespaces: ["
    + ",".join(f"n{i}" for i in range(48))
    + "]}, "
    + ", ".join(["*t"] * 10_000)
    + "]\n"
)


class Churn:
    """Creates and removes containers back to back, as a busy node does; keeps
    when each create was answered and how long it took."""

    def __init__(self, rt: SimulatedRuntime, pod_id: str) -> None:
        self.rt, self.pod_id = rt, pod_id
        self.answered: list[float] = []
        self.errors: list[str] = []
        self.stopping = False
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        n = 0
        while not self.stopping:
            n += 1
            cpu = CpuResources(shares=512)
            shared = Container(id="", name=f"churn{n}", resources=Resources(cpu=cpu))
            try:
                c = await self.rt.create_container(self.pod_id, shared)
            except NriError as exc:
                self.errors.append(str(exc))
                await asyncio.sleep(0.01)
                continue
            self.answered.append(loop.time())
            if not c.cpus:
                self.errors.append(f"{c.name} not pinned (the plugin was dropped?)")
            await self.rt.remove_container(c.id)
            await asyncio.sleep(0.002)  # (without a plugin the simulator never yields)

    async def stop(self) -> None:
        # a flag, not cancel(): Python 3.11's wait_for can swallow a cancellation
        self.stopping = True
        await asyncio.wait_for(self.task, 10)


async def test_reloads_of_a_fifo_a_huge_and_a_slow_file_keep_creates_answered(
    tmp_path: Path,
) -> None:
    write_topology(tmp_path / "host", "n4c16")
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(CONFIG % (1, 4))
    sock = tmp_path / "nri.sock"
    cmd = [sys.executable, "-m", "nri_framework", "run", "--policy", "balloons",
           "--nri-socket", str(sock), "--host-root", str(tmp_path / "host"),
           "--state-dir", str(tmp_path / "state"), "--config-file", str(cfg)]  # fmt: skip
    async with SimulatedRuntime(sock) as rt:
        plugin = await PluginProcess.launch(cmd)
        churn = None
        try:
            await rt.wait_plugins(1, 20)
            pod = await rt.run_pod(Pod(id="", name="p", uid="u", namespace="default",
                                       cgroup_parent="/kubepods/burstable/podu"))  # fmt: skip
            c = await rt.create_container(
                pod.id,
                Container(id="", name="c", resources=Resources(cpu=CpuResources(shares=512))),
            )
            assert cpuset.parse(rt.container(c.id).cpus).bit_count() == 1
            churn = Churn(rt, pod.id)
            loop = asyncio.get_running_loop()
            rejected = 0
            for what, make, message in (
                ("fifo", lambda: os.mkfifo(cfg), f"{cfg}: not a regular file"),
                (
                    "huge",
                    lambda: cfg.write_bytes(b"#" * (50 << 20)),
                    f"{cfg}: 52428800 bytes, larger than 4194304 bytes",
                ),
                ("slow", lambda: cfg.write_text(SLOW), "two balloon types with the same name"),
            ):
                cfg.unlink()
                make()
                start = loop.time()
                plugin.proc.send_signal(signal.SIGHUP)
                rejected += 1
                await plugin.wait_output(
                    "keeping the running configuration", timeout=60, count=rejected
                )
                assert message in plugin.output(), what
                if what == "slow":
                    # creates were answered while the file was checked (about
                    # 30 here); on the loop none could be, but the one in
                    # flight and one the plugin read before the signal (2)
                    during = [t for t in churn.answered if t > start]
                    assert len(during) >= 10, len(during)
            await churn.stop()
            times = rt.call_times("CreateContainer")
            assert max(times) < 1.0, sorted(times)[-5:]  # liveness: every create answered
            assert not churn.errors, churn.errors[:3]
            # the running configuration stayed (minCPUs 1, maxCPUs 4), the plugin too
            assert cpuset.parse(rt.container(c.id).cpus).bit_count() == 1
            assert [p.pid for p in rt.plugins] == [plugin.proc.pid]
            cfg.unlink()
            cfg.write_text(CONFIG % (3, 4))
            plugin.proc.send_signal(signal.SIGHUP)
            await plugin.wait_output("config update from", timeout=30, count=rejected + 1)
            for _ in range(100):
                if cpuset.parse(rt.container(c.id).cpus).bit_count() == 3:
                    break
                await asyncio.sleep(0.05)
            assert cpuset.parse(rt.container(c.id).cpus).bit_count() == 3, plugin.output()
        finally:
            if churn is not None:
                await churn.stop()
            await plugin.stop()


#: (file content, the error the plugin logs, after ``FILE:``)
BAD: list[tuple[bytes, str]] = [
    (b"reservedResources: {cpu: 'cpuset:0-99999999999'}\n",
     "1:26: balloons: failed to parse reserved CPU cpuset '0-99999999999'"),
    (b"reservedResources: {cpu: 'cpuset:0'}\nx: " + b"[" * 10000 + b"]" * 10000 + b"\n",
     "2:67: invalid YAML: document nested deeper than 64 levels"),
    (b"reservedResources: {cpu: 'cpuset:0'}\nballoonTypes: [{name: \"a\0\"}]\n",
     "2:25: invalid YAML: unacceptable character #x0000"),
    (b"reservedResources: {cpu: 'cpuset:0'}\nballoonTypes: [{name: \"\xff\"}]\n",
     "2:24: not UTF-8 text (byte 0xff)"),
    (b"reservedResources: {cpu: 'cpuset:0'}\nballoonTypes:\n- name: work\n"
     b"  maxCPUs: 100000000000000000000000000\n",
     "4:12: balloonTypes[0].maxCPUs: Invalid value: 100000000000000000000000000:"),
    (b"reservedResources: {cpu: 'cpuset:0'}\nballoonTypes:\n- name: work\n  minCPUs: -5\n",
     "4:12: balloonTypes[0].minCPUs: Invalid value: -5:"),
]  # fmt: skip


async def test_invalid_files_are_rejected_with_their_position(tmp_path: Path) -> None:
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
            shared = Resources(cpu=CpuResources(shares=512))
            c = await rt.create_container(pod.id, Container(id="", name="c", resources=shared))
            for n, (data, message) in enumerate(BAD, 1):
                cfg.write_bytes(data)
                plugin.proc.send_signal(signal.SIGHUP)
                await plugin.wait_output("keeping the running configuration", timeout=20, count=n)
                line = [ln for ln in plugin.tail if "keeping the running configuration" in ln][-1]
                assert f"{cfg}:{message}" in line, line
                # the running configuration (minCPUs 1) places the next container
                d = await rt.create_container(
                    pod.id, Container(id="", name=f"d{n}", resources=shared)
                )
                assert cpuset.parse(d.cpus).bit_count() == 1
                await rt.remove_container(d.id)
            assert cpuset.parse(rt.container(c.id).cpus).bit_count() == 1
            assert [p.pid for p in rt.plugins] == [plugin.proc.pid]
            assert "Traceback" not in plugin.output()
        finally:
            await plugin.stop()


@pytest.mark.parametrize(("data", "message"), BAD[:1] + BAD[-1:])
async def test_invalid_file_at_start_is_an_error_line(
    tmp_path: Path, data: bytes, message: str
) -> None:
    write_topology(tmp_path / "host", "n4c16")
    cfg = tmp_path / "balloons.yaml"
    cfg.write_bytes(data)
    cmd = [sys.executable, "-m", "nri_framework", "run", "--policy", "balloons",
           "--nri-socket", str(tmp_path / "nri.sock"), "--host-root", str(tmp_path / "host"),
           "--state-dir", str(tmp_path / "state"), "--config-file", str(cfg)]  # fmt: skip
    plugin = await PluginProcess.launch(cmd)
    assert await asyncio.wait_for(plugin.proc.wait(), 20) == 1
    await plugin.stop()
    assert f"cannot start policy balloons: {cfg}:{message}" in plugin.output()
    assert "Traceback" not in plugin.output()

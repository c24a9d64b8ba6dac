"""A node with the balloons plugin process and the SST helper as a real
subprocess on the sim backend, both on one host root, driven by the runtime
simulator (shared by the cpuClass and PCT integration tests)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from balloons_e2e import plugin_command
from nri_framework import cpuset
from nri_framework.simulate.podspec import RuntimeDefaults, load_pod_file
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_framework.simulate.sysfs import online, write_topology

PCT16_SIM = {
    "packages": 2,
    "punits_per_package": 1,
    "cores_per_punit": 4,
    "base_mhz": 2900,
    "p0_mhz": 3800,
    "cpuinfo_max_khz": 3_800_000,
    "tf_buckets": [2],
    "tf_mhz": [3800],
    "lp_clip_mhz": 2900,
}
"""The SST helper's sim config for the pct16 topology: upstream test19's part
(2 packages of one 4-core punit, base 2.9 GHz, turbo 3.8 GHz)."""

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    balloon.balloons.resource-policy.nri.io: {balloon}
spec:
  containers:
  - name: {name}c0
    image: busybox
    resources:
      requests: {{cpu: {cpu}, memory: 50M}}
      limits: {{cpu: {cpu}, memory: 50M}}
"""


class Helper:
    """``nri-sst-helper serve --backend sim`` on the node's host root."""

    def __init__(self, work: Path, host_root: Path, args: tuple[str, ...] = ()) -> None:
        self.sock = work / "run" / "helper.sock"
        self.sock.parent.mkdir(mode=0o700, exist_ok=True)
        self.endpoint = f"ipc://{self.sock}"
        self.host_root = host_root
        self.state = work / "sim.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.args = args
        self.log = work / "helper.log"

    def start(self) -> None:
        self.sock.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "nri_sst.cli", "serve",
            "--socket", self.endpoint,
            "--backend", "sim",
            "--host-root", str(self.host_root),
            "--sim-state", str(self.state),
            *self.args,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stderr=log)
        deadline = time.monotonic() + 20
        while not self.sock.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("the SST helper did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Node:
    rt: SimulatedRuntime
    plugin: PluginProcess
    helper: Helper
    host_root: Path
    work: Path
    pods: dict[str, str] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)
    cmd: list[str] = field(default_factory=list)
    """the plugin's command line (for restarts)"""
    create_seconds: list[float] = field(default_factory=list)
    """the CreateContainer round trip of every container created, in order"""

    def cpu_file(self, cpu: int, rel: str) -> str:
        path = self.host_root / "sys/devices/system/cpu" / f"cpu{cpu}" / rel
        return path.read_text().strip()

    def package(self, cpu: int) -> int:
        return int(self.cpu_file(cpu, "topology/physical_package_id"))

    def freq(self, cpu: int) -> tuple[int, int]:
        return (
            int(self.cpu_file(cpu, "cpufreq/scaling_min_freq")),
            int(self.cpu_file(cpu, "cpufreq/scaling_max_freq")),
        )

    def disabled(self, cpu: int) -> set[str]:
        out = set()
        for state in sorted(
            (self.host_root / f"sys/devices/system/cpu/cpu{cpu}/cpuidle").iterdir()
        ):
            if (state / "disable").read_text().strip() == "1":
                out.add((state / "name").read_text().strip())
        return out

    async def create(self, name: str, balloon: str, cpu: str = "750m") -> set[int]:
        """Run a one-container pod in ``balloon``; the CPUs it is pinned to."""
        path = self.work / f"{name}.yaml"
        path.write_text(POD.format(name=name, balloon=balloon, cpu=cpu))
        return await self.create_from(name, path)

    async def create_from(self, name: str, path: Path) -> set[int]:
        """Run the one-container pod of a Pod YAML file; the CPUs it is pinned to."""
        defaults = RuntimeDefaults(cpus=online(self.host_root), mems=online(self.host_root, "node"))
        (sim,) = load_pod_file(path, defaults)
        pod = await self.rt.run_pod(sim.pod)
        self.pods[name] = pod.id
        t0 = time.monotonic()
        created = await self.rt.create_container(pod.id, sim.containers[0])
        self.create_seconds.append(time.monotonic() - t0)
        await self.rt.start_container(created.id)
        self.containers[name] = created.id
        return self.cpus(name)

    def cpus(self, name: str) -> set[int]:
        """The CPUs the container of pod ``name`` is pinned to now."""
        c = self.rt.container(self.containers[name])
        assert c.resources and c.resources.cpu
        return set(cpuset.ids(cpuset.parse(c.resources.cpu.cpus)))

    async def delete(self, name: str) -> None:
        pod_id = self.pods.pop(name)
        await self.rt.stop_pod(pod_id)
        await self.rt.remove_pod(pod_id)

    def lines(self, text: str, since: int = 0) -> list[str]:
        return [line for line in list(self.plugin.tail)[since:] if text in line]

    def mark(self) -> int:
        return len(self.plugin.tail)


@asynccontextmanager
async def node(
    config: str,
    log_level: str = "info",
    topology: str = "n4c16",
    helper_args: tuple[str, ...] = (),
    runtime: Callable[[Path], SimulatedRuntime] = SimulatedRuntime,
    plugin_args: tuple[str, ...] = (),
    command: Callable[[list[str]], list[str]] | None = None,
) -> AsyncIterator[Node]:
    """``runtime`` makes the simulator from its socket path (a subclass with
    kill points, say); ``plugin_args`` go to the end of the plugin's command;
    ``command`` rewrites that command (a module's constants set, say)."""
    work = Path(tempfile.mkdtemp(prefix="cpuclass-"))
    host_root = write_topology(work / "host", topology)
    cfg = work / "balloons.yaml"
    cfg.write_text(config)
    helper = Helper(work, host_root, helper_args)
    helper.start()
    try:
        async with runtime(work / "nri.sock") as rt:
            cmd = plugin_command(work / "nri.sock", host_root, work / "state", cfg)
            cmd += ["--sst-helper", helper.endpoint, "--log-level", log_level, *plugin_args]
            if command is not None:
                cmd = command(cmd)
            n = Node(rt, await PluginProcess.launch(cmd), helper, host_root, work, cmd=cmd)
            try:
                await wait_registered(rt, n.plugin, 10)
                yield n
            finally:
                await n.plugin.stop()  # the one running now: a test may restart it
    finally:
        helper.stop()
        shutil.rmtree(work, ignore_errors=True)

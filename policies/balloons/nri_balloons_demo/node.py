"""The simulated node of the balloons demos: a dual-socket Xeon 6776P.

Everything runs as it would on a node, only the hardware and the runtime are
simulated: the sysfs tree of a 6776P is written to a temp dir; the SST helper
(``nri-sst-helper serve --backend sim``, the Xeon 6776P model of sst.md §5)
and the balloons plugin run as separate processes and talk over a real
ZeroMQ socket; the runtime simulator plays containerd 1.7 over a real NRI
unix socket. :class:`Demo` builds the node, runs a demo's body on it
(a :class:`Node`), stops the plugin and the helper, then runs the teardown
checks.

Reporter figures are *simulated*: ``mhz_avg`` is Bzy MHz from the helper's
APERF/MPERF counters, which the model advances at each CPU's effective
frequency under load (sst.md §5.5.12-13); ``events_per_sec`` is that
frequency times :data:`EVENTS_PER_MHZ` per thread, sysbench's cpu test
scaling with the core clock, calibrated once on the spec's own hp-1 sample
(2077.58 events/s per thread at 4600 MHz).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from nri_framework import cpuset
from nri_framework.simulate.podspec import RuntimeDefaults, load_pod_file
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import (
    PluginProcess,
    ScenarioPaths,
    plugin_command,
    wait_registered,
)
from nri_framework.simulate.sysfs import online, write_topology
from nri_sst import messages as m
from nri_sst.client import SyncHelperClient
from nri_sst.handler import bzy_mhz

from nri_balloons_demo.checks import Checks, section

EVENTS_PER_MHZ = 2077.58 / 4600
"""sysbench cpu events/s per thread per MHz (see the module doc)."""
SAMPLE_SECONDS = 0.4
"""How long the reporter samples APERF/MPERF (simulated time runs in real time)."""
PCT_GREP = re.compile(r"pct(:| mock:)|associated cpus .* to CLOS")
POLICY_HEAD = """\
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata:
  name: default
  namespace: kube-system
spec:
  reservedResources:
    cpu: cpuset:0,1,128,129
  pinCPU: true
  showContainersInNrt: true
  balloonTypes:
"""
"""The demos' BalloonsPolicy up to its balloon types: the spec's reserved CPUs,
pinned, containers shown in NRT."""
SIM_LEVEL = 1
"""The SST-PP level the model boots with: the level Intel's PCT scripts query."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def punit_of(cpu: int) -> tuple[int, int]:
    """sst.md §5.2: the 6776P's CPU -> (package, punit)."""
    return (cpu % 128) // 64, (cpu % 64) // 32


@dataclass
class Pod:
    name: str
    label: str
    threads: int
    container_id: str = ""
    pod_id: str = ""
    cpus: int = 0


@dataclass
class Node:
    """The simulated node: host root, helper, runtime, plugin."""

    work: Path
    host_root: Path
    helper_endpoint: str
    helper_state: Path
    helper_config: Path
    metrics: str
    rt: SimulatedRuntime
    plugin: PluginProcess
    helper: subprocess.Popen[bytes] | None
    pods: dict[str, Pod] = field(default_factory=dict)

    def client(self) -> SyncHelperClient:
        return SyncHelperClient(self.helper_endpoint, timeout=2.0, client="demo")

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.metrics}/debug/state", timeout=5) as r:
            return dict(json.load(r))

    def pct_lines(self, since: int = 0) -> list[str]:
        out = []
        for line in list(self.plugin.tail)[since:]:
            if PCT_GREP.search(line):
                out.append(line.split(" cpuclass: ", 1)[-1])
        return out

    async def create(self, path: Path) -> Pod:
        defaults = RuntimeDefaults(cpus=online(self.host_root), mems=online(self.host_root, "node"))
        (sim,) = load_pod_file(path, defaults)
        env = dict(e.split("=", 1) for e in sim.containers[0].env)
        doc = yaml.safe_load(path.read_text())
        pod = await self.rt.run_pod(sim.pod)
        created = await self.rt.create_container(pod.id, sim.containers[0])
        await self.rt.start_container(created.id)
        c = self.rt.container(created.id)
        cpus = cpuset.parse(c.resources.cpu.cpus) if c.resources and c.resources.cpu else 0
        p = Pod(
            name=doc["metadata"]["name"],
            label=env.get("LABEL", sim.pod.name),
            threads=int(env.get("THREADS", 0)) or cpus.bit_count(),
            container_id=created.id,
            pod_id=pod.id,
            cpus=cpus,
        )
        self.pods[p.name] = p
        return p

    async def delete(self, name: str) -> None:
        p = self.pods.pop(name)
        await self.rt.stop_pod(p.pod_id)
        await self.rt.remove_pod(p.pod_id)

    def clos(self, cpus: list[int]) -> dict[int, int]:
        with self.client() as c:
            return c.call(m.GetAssociation(cpus=cpus), m.GetAssociationReply).clos

    def discover(self) -> m.DiscoverReply:
        with self.client() as c:
            return c.call(m.Discover(), m.DiscoverReply)

    def report(self, p: Pod) -> tuple[float, float]:
        """The reporter of step 7 for ``p``: (events/s, Bzy MHz), simulated."""
        cpus = cpuset.ids(p.cpus)
        with self.client() as c:
            before = c.call(m.ReadFrequency(cpus=cpus), m.ReadFrequencyReply)
            time.sleep(SAMPLE_SECONDS)
            after = c.call(m.ReadFrequency(cpus=cpus), m.ReadFrequencyReply)
        mhz = [
            bzy_mhz(b, a, after.tsc_mhz) for b, a in zip(before.samples, after.samples, strict=True)
        ]
        avg = sum(mhz) / len(mhz)
        # one sysbench thread per pinned CPU unless THREADS says fewer: those
        # run on the fastest CPUs of the set (all equal here)
        events = p.threads * EVENTS_PER_MHZ * avg
        tag = f"[{p.label}]".ljust(10)
        print(
            f"  {tag} cpus={cpuset.format(p.cpus)} threads={p.threads} "
            f"events_per_sec={events:.2f} mhz_avg={avg:.0f}   (simulated)"
        )
        return events, avg


def sim_config(path: Path, **overrides: Any) -> Path:
    fields = {"current_level": SIM_LEVEL, **overrides}
    path.write_text(json.dumps(fields))
    return path


def start_helper(work: Path, host_root: Path, config: Path) -> tuple[str, subprocess.Popen[bytes]]:
    sock = work / "run" / "sst-helper.sock"
    sock.parent.mkdir(mode=0o700, exist_ok=True)
    endpoint = f"ipc://{sock}"
    cmd = [
        sys.executable, "-m", "nri_sst.cli", "serve",
        "--socket", endpoint,
        "--backend", "sim",
        "--host-root", str(host_root),
        "--sim-state", str(work / "sst-sim.json"),
        "--sim-config", str(config),
    ]  # fmt: skip
    log = (work / "sst-helper.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the SST helper did not start:\n{read_log(work)}")
        time.sleep(0.02)
    return endpoint, proc


def read_log(work: Path) -> str:
    path = work / "sst-helper.log"
    return path.read_text(errors="replace") if path.exists() else ""


def stop_helper(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Demo:
    """One walkthrough: builds the node, runs ``body``, stops the plugin and
    the helper (SIGTERM), then ``after`` (teardown checks on the model)."""

    def __init__(self, name: str, config: str, *, helper: bool = True, keep: bool = False) -> None:
        self.name = name
        self.config = config
        self.use_helper = helper
        self.keep = keep
        self.checks = Checks()

    async def run(
        self,
        body: Callable[[Node, Checks], Any],
        prepare: Callable[[Path, Path, Path], None] | None = None,
        after: Callable[[Path, Path, Path, Checks], None] | None = None,
    ) -> Checks:
        work = Path(tempfile.mkdtemp(prefix=f"nri-demo-{self.name}-"))
        try:
            host_root = write_topology(work / "host", "xeon-6776p")
            cfg = work / "balloons.yaml"
            cfg.write_text(self.config)
            helper_cfg = sim_config(work / "sst-sim-config.json")
            if prepare is not None:
                prepare(work, host_root, helper_cfg)
            endpoint, helper = "", None
            if self.use_helper:
                endpoint, helper = start_helper(work, host_root, helper_cfg)
            try:
                await self._node(work, host_root, cfg, helper_cfg, endpoint, helper, body)
            finally:
                if helper is not None:
                    stop_helper(helper)
            if after is not None:
                after(work, host_root, helper_cfg, self.checks)
        finally:
            if self.keep:
                print(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
        return self.checks

    async def _node(
        self,
        work: Path,
        host_root: Path,
        cfg: Path,
        helper_cfg: Path,
        endpoint: str,
        helper: subprocess.Popen[bytes] | None,
        body: Callable[[Node, Checks], Any],
    ) -> None:
        metrics = f"127.0.0.1:{free_port()}"
        paths = ScenarioPaths(work, work / "nri" / "nri.sock", host_root, work / "state")
        extra = ["--config-file", str(cfg), "--metrics-address", metrics]
        if endpoint:
            extra += ["--sst-helper", endpoint]
        cmd = plugin_command("balloons", paths, extra)
        async with SimulatedRuntime(paths.socket) as rt:
            section(
                "node: dual-socket Xeon 6776P, 256 CPUs (simulated sysfs"
                + (" + SST model" if endpoint else "")
                + "), runtime simulator emulating containerd 1.7.24"
            )
            plugin = await PluginProcess.launch(cmd)
            try:
                info = await wait_registered(rt, plugin, 30)
                if endpoint:
                    print(f"  SST helper: {endpoint} (backend sim)")
                print(f"  plugin {info.full_name} registered; inspect: {metrics}")
                node = Node(
                    work, host_root, endpoint, work / "sst-sim.json", helper_cfg,
                    metrics, rt, plugin, helper,
                )  # fmt: skip
                await body(node, self.checks)
            finally:
                await plugin.stop()

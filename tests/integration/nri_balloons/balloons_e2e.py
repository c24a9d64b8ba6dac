"""A node for porting upstream's balloons e2e tests: the real balloons plugin
process against the runtime simulator, pods from YAML under
``tests/data/balloons/<test>/``.

Upstream's shell helpers map to methods: ``create`` (kubectl apply of a pod),
``cpus``/``mems`` (``report allowed``: ``Cpus_allowed_list``/
``Mems_allowed_list``, so an unpinned container has every CPU, as the runtime
default cpuset here), ``balloon`` (the plugin's ``assigning container ... to
balloon ...`` log line), ``delete`` (kubectl delete pod).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import signal
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from nri_framework import cpuset
from nri_framework.simulate.podspec import RuntimeDefaults, load_pod_file
from nri_framework.simulate.runtime import NriError, SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_framework.simulate.sysfs import online, write_topology
from nri_framework.simulate.topologies import TOPOLOGIES, TopologySpec
from nri_framework.topology import Topology

DATA = Path(__file__).resolve().parents[2] / "data" / "balloons"

_ASSIGN = re.compile(
    r'assigning container (\S+) to balloon (\S+)\{cpus:"([^"]*)", mems:"([^"]*)"\}'
)


@dataclass
class Node:
    """One simulated node running the balloons plugin."""

    test: str
    rt: SimulatedRuntime
    plugin: PluginProcess
    host_root: Path
    config: Path
    #: container name -> (pod id, container id); container names are unique per test
    ids: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: pod name -> pod id
    pods: dict[str, str] = field(default_factory=dict)
    #: container name -> creation error text
    errors: dict[str, str] = field(default_factory=dict)
    namespaces: dict[str, str] = field(default_factory=dict)
    system_pods: set[str] = field(default_factory=set)

    @property
    def topology(self) -> Topology:
        if self._topology is None:
            self._topology = Topology.from_sysfs(self.host_root)
        return self._topology

    _topology: Topology | None = None

    @property
    def data(self) -> Path:
        return DATA / self.test

    async def create(self, filename: str) -> list[str]:
        """Run the pods of ``<test>/<filename>``; returns the container names.

        Creation errors are kept in :attr:`errors` (upstream reads them from
        ``kubectl describe pod``)."""
        defaults = RuntimeDefaults(cpus=online(self.host_root), mems=online(self.host_root, "node"))
        names: list[str] = []
        for sim in load_pod_file(self.data / filename, defaults):
            pod = await self.rt.run_pod(sim.pod)
            self.pods[pod.name] = pod.id
            for c in sim.containers:
                names.append(c.name)
                self.namespaces[c.name] = f"{pod.namespace}/{pod.name}/{c.name}"
                try:
                    created = await self.rt.create_container(pod.id, c)
                    await self.rt.start_container(created.id)
                except NriError as exc:
                    self.errors[c.name] = str(exc)
                    continue
                self.ids[c.name] = (pod.id, created.id)
        return names

    async def delete(self, *pod_names: str) -> None:
        """Stop and remove pods (``kubectl delete pod --now``)."""
        for name in pod_names:
            pod_id = self.pods.pop(name)
            await self.rt.stop_pod(pod_id)
            await self.rt.remove_pod(pod_id)
            for ctr, (pid, _) in list(self.ids.items()):
                if pid == pod_id:
                    del self.ids[ctr]

    async def delete_all(self) -> None:
        """Delete the pods the test created (not the system pods)."""
        await self.delete(*[p for p in self.pods if p not in self.system_pods])

    async def start_system_pods(self) -> None:
        """The kube-system pods of the e2e VMs' control plane (750m in total).

        Upstream's expectations sometimes count on them: they keep the
        reserved balloon inflated, or its CPUs busy."""
        before = set(self.pods)
        await self.create("../kube-system.yaml")
        self.system_pods |= set(self.pods) - before

    def _container(self, name: str) -> tuple[str, str]:
        _, cid = self.ids[name]
        c = self.rt.container(cid)
        cpu = c.resources.cpu if c.resources else None
        return (cpu.cpus if cpu else "", cpu.mems if cpu else "")

    def cpus(self, name: str) -> set[int]:
        """The CPUs container ``name`` may run on."""
        return _ids(self._container(name)[0])

    def mems(self, name: str) -> set[int]:
        return _ids(self._container(name)[1])

    def _groups(self, name: str, masks: dict[int, int], prefix: str) -> set[str]:
        cpus = cpuset.from_ids(self.cpus(name))
        return {f"{prefix}{key}" for key, mask in masks.items() if mask & cpus}

    def cores(self, name: str) -> set[str]:
        """Upstream's ``cores``: the physical cores of the container's CPUs."""
        return self._groups(name, self.topology.core_masks, "core")

    def nodes(self, name: str) -> set[str]:
        """Upstream's ``nodes``: ``{"node0", ...}`` of the container's CPUs."""
        return self._groups(name, self.topology.node_masks, "node")

    def packages(self, name: str) -> set[str]:
        return self._groups(name, self.topology.package_masks, "package")

    def all_cpus(self) -> dict[str, set[int]]:
        """Every running container's CPUs by name (upstream's ``cpus`` dict)."""
        return {name: self.cpus(name) for name in self.ids}

    def balloon(self, name: str) -> str:
        """The balloon (``type[n]``) container ``name`` was last assigned to."""
        pretty = self.namespaces[name]
        found = ""
        for line in self.plugin.tail:
            m = _ASSIGN.search(line)
            if m and m.group(1) == pretty:
                found = m.group(2)
        assert found, f"no assignment of {pretty} in the plugin output:\n{self.plugin.output()}"
        return found

    async def reload(self, config: str) -> None:
        """Replace the config file with ``<test>/<config>`` and SIGHUP the plugin,
        as an operator would; returns once the plugin answered (applied or not)."""
        done = sum("config update from" in line for line in self.plugin.tail)
        self.config.write_text((self.data / config).read_text())
        with RuntimeLog(logging.INFO, "updated container", "update of unknown container") as rt:
            self.plugin.proc.send_signal(signal.SIGHUP)
            await self.plugin.wait_output("config update from", timeout=10, count=done + 1)
            last = [x for x in self.plugin.tail if "config update from" in x][-1]
            sent = _UPDATES.search(last)
            # the unsolicited UpdateContainers round trip: the runtime has them all
            n = int(sent.group(1)) if sent else 0
            await until(lambda: len(rt.lines) >= n, f"the runtime to apply {n} update(s)", 10)

    async def assigned(self, name: str, count: int = 1) -> str:
        """Wait for the ``count``-th assignment log line of ``name``; the balloon."""
        await self.plugin.wait_output(
            f"assigning container {self.namespaces[name]} to balloon", timeout=5, count=count
        )
        return self.balloon(name)


async def http_get(port: int, path: str) -> tuple[int, str]:
    """A real HTTP client (urllib, in a thread) on the loopback: status and body."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(get)


_UPDATES = re.compile(r"applied, (\d+) container\(s\) to update")


async def until(check: Callable[[], bool], what: str, timeout: float) -> None:
    """Until ``check()``, polled on the event loop; at most ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


class RuntimeLog(logging.Handler):
    """The runtime simulator's log lines of ``level`` and up (those containing
    one of ``texts``, when given), kept while in a ``with`` block."""

    def __init__(self, level: int, *texts: str) -> None:
        super().__init__(level)
        self.texts = texts
        self.lines: list[str] = []
        self._logger = logging.getLogger("nri_framework.simulate")

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if not self.texts or any(t in line for t in self.texts):
            self.lines.append(line)

    def __enter__(self) -> RuntimeLog:
        self._level = self._logger.level
        if not self._logger.isEnabledFor(self.level):
            self._logger.setLevel(self.level)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def _ids(text: str) -> set[int]:
    mask = cpuset.parse(text) if text else 0
    return {i for i in range(mask.bit_length()) if mask >> i & 1}


def disjoint(*sets: set[int]) -> bool:
    """Upstream's ``disjoint_sets``."""
    seen: set[int] = set()
    for s in sets:
        if s & seen:
            return False
        seen |= s
    return True


def plugin_command(socket: Path, host_root: Path, state: Path, config: Path) -> list[str]:
    return [
        sys.executable, "-m", "nri_framework", "run",
        "--policy", "balloons",
        "--nri-socket", str(socket),
        "--host-root", str(host_root),
        "--state-dir", str(state),
        "--config-file", str(config),
        "--exit-on-disconnect",
    ]  # fmt: skip


@asynccontextmanager
async def node(
    test: str, config: str, topology: str | TopologySpec = "n4c16", args: tuple[str, ...] = ()
) -> AsyncIterator[Node]:
    """A node with the balloons plugin on ``<test>/<config>`` registered;
    ``args`` are more plugin command-line options."""
    work = Path(tempfile.mkdtemp(prefix="balloons-e2e-"))
    spec = TOPOLOGIES[topology] if isinstance(topology, str) else topology
    host_root = write_topology(work / "host", spec)
    cfg = work / "balloons.yaml"  # a copy, so that reload() can replace it
    shutil.copyfile(DATA / test / config, cfg)
    try:
        async with SimulatedRuntime(work / "nri.sock") as rt:
            plugin = await PluginProcess.launch(
                plugin_command(work / "nri.sock", host_root, work / "state", cfg) + list(args)
            )
            try:
                await wait_registered(rt, plugin, 10)
                yield Node(test, rt, plugin, host_root, cfg)
            finally:
                await plugin.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def start_failure(test: str, config: str, topology: str = "n4c16") -> str:
    """Launch the plugin on a configuration that must not start; its output."""
    work = Path(tempfile.mkdtemp(prefix="balloons-e2e-"))
    host_root = write_topology(work / "host", TOPOLOGIES[topology])
    try:
        async with SimulatedRuntime(work / "nri.sock") as rt:
            plugin = await PluginProcess.launch(
                plugin_command(work / "nri.sock", host_root, work / "state", DATA / test / config)
            )
            try:
                await wait_registered(rt, plugin, 10)
            except Exception:
                await plugin.stop()
                return plugin.output()
            await plugin.stop()
            raise AssertionError(f"plugin started with {config}:\n{plugin.output()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

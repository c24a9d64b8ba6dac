"""A pod the plugin cannot work in, as the real plugin process sees it: the
NRI socket missing or not writable, sysfs not mounted, a state directory
that is read-only or a file, the SST helper's socket directory not shared.

Each time: one clear line naming the path and the chart's volume, repeated
rarely (attempts 1, 2, 4, 8: counted against the process's own per-attempt
debug lines, no wall time), ``/healthz`` 503 with that line as the reason,
the process alive and without a traceback after those attempts, and the
plugin starting by itself once the path is fixed. The backoff is the real
one made short (``--retry-interval``); the runtime is the simulator, the
helper the real ``nri-sst-helper`` process; the read-only state directory is
a read-only tmpfs in the plugin's own mount namespace (``unshare -m``: root
writes through a chmod, not through a read-only mount), the unwritable
socket one the plugin cannot write without capabilities (``setpriv``, as
the chart's container drops them all)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from nri_framework.model import Container, Pod
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_framework.simulate.sysfs import write_cpu_tree, write_topology
from nri_framework.simulate.topologies import TOPOLOGIES

TESTS = Path(__file__).resolve().parents[2]
for _p in (str(TESTS), str(TESTS / "integration" / "nri_sst")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _tier  # noqa: E402
from helper_process import helper_command  # noqa: E402

_LISTENING = re.compile(r"instrumentation HTTP endpoint listening on (\S+):(\d+) ")
ATTEMPTS = 9  # the line is logged at attempts 1, 2, 4 and 8 of them
START_ATTEMPT = "start-up attempt {n} failed"
NRI_ATTEMPT = "NRI runtime not reachable ("  # the stub's per-attempt debug line

Launch = Callable[..., Awaitable["Plugin"]]


class Plugin:
    """The plugin process and its instrumentation port."""

    def __init__(self, proc: PluginProcess, port: int) -> None:
        self.proc = proc
        self.port = port

    async def health(self, path: str = "/healthz") -> tuple[int, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            data = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        head, _, body = data.decode().partition("\r\n\r\n")
        return int(head.split()[1]), body

    async def wait_healthy(self, timeout: float = 20) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (status := await self.health()) != (200, "ok\n"):
            assert loop.time() < deadline, f"{status}\n{self.proc.output()}"
            await asyncio.sleep(0.05)

    async def lines_until(self, marker: str, count: int = ATTEMPTS) -> list[str]:
        """The output up to the ``count``-th line containing ``marker``."""
        await self.proc.wait_output(marker, timeout=30, count=count)
        out, seen = [], 0
        for line in list(self.proc.tail):
            out.append(line)
            seen += marker in line
            if seen == count:
                return out
        raise AssertionError(marker)

    def assert_alive(self) -> None:
        assert self.proc.proc.returncode is None, self.proc.output()
        assert "Traceback" not in self.proc.output()


def reported(lines: list[str], *parts: str) -> int:
    """How many of ``lines`` are the one clear line: ERROR, naming every part."""
    return sum(" ERROR " in line and all(p in line for p in parts) for line in lines)


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "host"
    root.mkdir()
    return {"socket": tmp_path / "nri" / "nri.sock", "host": root, "state": tmp_path / "state"}


@pytest.fixture
async def launch(paths: dict[str, Path]) -> AsyncIterator[Launch]:
    procs: list[PluginProcess] = []

    async def start(*extra: str, prefix: tuple[str, ...] = (), policy: str = "pinner") -> Plugin:
        cmd = [
            *prefix,
            sys.executable, "-m", "nri_framework", "run",
            "--policy", policy,
            "--nri-socket", str(paths["socket"]),
            "--host-root", str(paths["host"]),
            "--state-dir", str(paths["state"]),
            "--metrics-address", "127.0.0.1:0",
            "--retry-interval", "0.01:0.04",
            "--log-level", "debug",
            *extra,
        ]  # fmt: skip
        proc = await PluginProcess.launch(cmd)
        procs.append(proc)
        await proc.wait_output("instrumentation HTTP endpoint listening on", timeout=20)
        m = next(m for line in proc.tail if (m := _LISTENING.search(line)))
        return Plugin(proc, int(m.group(2)))

    yield start
    for proc in procs:
        await proc.stop()


async def healthy_with_helper(plugin: Plugin, tmp_path: Path, sock: Path) -> None:
    """The real helper started on ``sock`` (its host tree already written under
    ``tmp_path/helper-host``): the plugin becomes healthy and is still alive."""
    cmd = helper_command(tmp_path / "helper-host", f"ipc://{sock}", tmp_path / "sim.json")
    helper = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        await plugin.wait_healthy()
        plugin.assert_alive()
    finally:
        helper.terminate()
        helper.wait(10)


async def test_sysfs_not_mounted(paths: dict[str, Path], launch: Launch) -> None:
    cpu = paths["host"] / "sys" / "devices" / "system" / "cpu"
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch()
        lines = await plugin.lines_until(START_ATTEMPT.format(n=ATTEMPTS), 1)
        line = f"cannot start: {cpu} does not exist (sysfs not mounted)"
        assert reported(lines, line, "hostPath volume hostsysfs", "--host-root") == 4, lines
        plugin.assert_alive()
        status, body = await plugin.health()
        assert status == 503 and body.startswith(f"not ok: {line}: ") and "hostsysfs" in body
        assert await plugin.health("/livez") == (200, "ok\n")  # waiting on purpose: alive
        assert not rt.plugins
        write_cpu_tree(paths["host"], 4)  # sysfs is there now
        await wait_registered(rt, plugin.proc, 20)
        await plugin.wait_healthy()
        assert f"{cpu} is usable now: starting" in plugin.proc.output()


async def test_state_dir_is_a_file(paths: dict[str, Path], launch: Launch) -> None:
    write_cpu_tree(paths["host"], 4)
    paths["state"].write_text("not a directory")
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch()
        lines = await plugin.lines_until(START_ATTEMPT.format(n=ATTEMPTS), 1)
        line = f"cannot start: {paths['state']} is not a directory"
        assert reported(lines, line, "hostPath volume resource-policydata") == 4, lines
        plugin.assert_alive()
        status, body = await plugin.health()
        assert status == 503 and body.startswith(f"not ok: {line}")
        paths["state"].unlink()
        await wait_registered(rt, plugin.proc, 20)
        await plugin.wait_healthy()
        assert paths["state"].is_dir()


def _need(tool: str, why: str) -> str:
    path = shutil.which(tool)
    if path is None or os.geteuid() != 0:
        _tier.unavailable("startup faults", f"{why}: needs root and {tool}", "NRI_ROOT_REQUIRED")
    return path


async def test_read_only_state_dir(paths: dict[str, Path], launch: Launch) -> None:
    """A read-only tmpfs over the state directory, in the plugin's own mount
    namespace; fixed by remounting it read-write there (``nsenter``)."""
    unshare = _need("unshare", "a read-only mount in a private mount namespace")
    nsenter = _need("nsenter", "remounting it read-write")
    write_cpu_tree(paths["host"], 4)
    state = paths["state"]
    state.mkdir()
    ro = f'mount -t tmpfs -o ro,size=1m tmpfs "{state}" && exec "$@"'
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch(prefix=(unshare, "-m", "--propagation", "private", "sh", "-c", ro,
                                      "sh"))  # fmt: skip
        lines = await plugin.lines_until(START_ATTEMPT.format(n=ATTEMPTS), 1)
        line = f"cannot start: {state} is on a read-only file system"
        assert reported(lines, line, "hostPath volume resource-policydata") == 4, lines
        plugin.assert_alive()
        status, body = await plugin.health()
        assert status == 503 and body.startswith(f"not ok: {line}")
        assert not rt.plugins
        pid = str(plugin.proc.proc.pid)  # sh exec'ed the plugin: the same process
        fix = [nsenter, "-t", pid, "-m", "mount", "-o", "remount,rw", str(state)]
        subprocess.run(fix, check=True, timeout=10)
        await wait_registered(rt, plugin.proc, 20)
        await plugin.wait_healthy()
    assert not any(state.iterdir())  # the files went to the plugin's tmpfs, not here


async def test_nri_socket_missing(paths: dict[str, Path], launch: Launch) -> None:
    write_cpu_tree(paths["host"], 4)
    plugin = await launch()
    lines = await plugin.lines_until(NRI_ATTEMPT)
    where = paths["socket"].parent  # not even the directory: the runtime's NRI is off
    line = f"NRI runtime not reachable: {where} does not exist (NRI runtime socket)"
    assert reported(lines, line, "hostPath volume nrisockets", "io.containerd.nri.v1.nri") == 4
    plugin.assert_alive()
    status, body = await plugin.health()
    assert status == 503 and "not registered with the NRI runtime" in body and line[27:] in body
    async with SimulatedRuntime(paths["socket"]) as rt:
        await wait_registered(rt, plugin.proc, 20)
        await plugin.wait_healthy()


async def test_nri_socket_not_writable(paths: dict[str, Path], launch: Launch) -> None:
    """Root without capabilities, as in the chart, and a socket of mode 0."""
    setpriv = _need("setpriv", "a plugin without capabilities")
    write_cpu_tree(paths["host"], 4)
    nocaps = (setpriv, "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs")
    async with SimulatedRuntime(paths["socket"]) as rt:
        paths["socket"].chmod(0)
        plugin = await launch(prefix=nocaps)
        lines = await plugin.lines_until(NRI_ATTEMPT)
        line = f"NRI runtime not reachable: {paths['socket']} is not writable (Permission denied)"
        assert reported(lines, line, "hostPath volume nrisockets") == 4, lines
        plugin.assert_alive()
        status, body = await plugin.health()
        assert status == 503 and "is not writable (Permission denied)" in body
        paths["socket"].chmod(0o600)
        await wait_registered(rt, plugin.proc, 20)
        await plugin.wait_healthy()


async def test_helper_socket_directory_not_shared(
    paths: dict[str, Path], launch: Launch, tmp_path: Path
) -> None:
    """The plugin works without the helper, unhealthy: first the directory is
    missing, then the socket does not appear; the real helper then serves.
    (``--sst-helper`` is the balloons policy's flag: the peer it names.)"""
    write_topology(paths["host"], TOPOLOGIES["n4c16"])
    config = TESTS / "data" / "balloons" / "test01-basic-placement" / "balloons.yaml"
    sock = tmp_path / "sst" / "helper.sock"
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch("--sst-helper", f"ipc://{sock}", "--config-file", str(config),
                              policy="balloons")  # fmt: skip
        await wait_registered(rt, plugin.proc, 20)  # pinning goes on meanwhile
        # two looks of grace (the sidecar starts alongside), then looks 1, 2, 4 of 7
        lines = await plugin.lines_until("SST helper socket check 9 failed", 1)
        line = f"SST helper unreachable: {sock.parent} does not exist (SST helper socket directory)"
        assert reported(lines, line, "emptyDir volume sst-ipc", "/run/nri-sst") == 3, lines
        status, body = await plugin.health()
        assert status == 503 and body.startswith(f"not ok: {line}: ") and "sst-ipc" in body
        sock.parent.mkdir()
        missing = f"SST helper unreachable: {sock} does not exist (SST helper socket)"
        await plugin.proc.wait_output(missing, timeout=20)
        assert (await plugin.health())[0] == 503
        write_topology(tmp_path / "helper-host", TOPOLOGIES["n4c16"])
        await healthy_with_helper(plugin, tmp_path, sock)


async def test_state_dir_full_after_start(paths: dict[str, Path], launch: Launch) -> None:
    """The state directory (a 1 MiB tmpfs in the plugin's own mount namespace)
    fills up after the start: the next decision's journal record cannot be
    written, ``/healthz`` says so until a record is written again."""
    unshare = _need("unshare", "a small tmpfs in a private mount namespace")
    nsenter = _need("nsenter", "filling it")
    write_cpu_tree(paths["host"], 4)
    state = paths["state"]
    state.mkdir()
    small = f'mount -t tmpfs -o size=1m tmpfs "{state}" && exec "$@"'
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch(prefix=(unshare, "-m", "--propagation", "private", "sh", "-c",
                                      small, "sh"))  # fmt: skip
        await wait_registered(rt, plugin.proc, 20)
        await plugin.wait_healthy()
        inside = [nsenter, "-t", str(plugin.proc.proc.pid), "-m", "sh", "-c"]
        fill = subprocess.run([*inside, f'cat /dev/zero > "{state}/fill"'], timeout=30)
        assert fill.returncode != 0  # ENOSPC
        pod = await rt.run_pod(Pod(id="", name="p", uid="u", namespace="default"))
        # the journal's last page takes a few more records: decide until one does not fit
        for n in range(200):
            await rt.create_container(pod.id, Container(id="", name=f"c{n}"))
            status, body = await plugin.health()
            if status != 200:
                break
        journal = state / "pinner.journal"
        assert status == 503, body
        assert body.startswith(f"not ok: cannot write the decision journal: {journal} is not "
                               "writable") and "resource-policydata" in body  # fmt: skip
        subprocess.run([*inside, f'rm "{state}/fill"'], check=True, timeout=10)
        await rt.create_container(pod.id, Container(id="", name="d"))
        await plugin.wait_healthy()
        plugin.assert_alive()


async def test_balloons_in_a_pod_without_sysfs_nor_helper(
    paths: dict[str, Path], launch: Launch, tmp_path: Path
) -> None:
    """The balloons policy as the chart runs it (``--sst-helper``): sysfs
    missing, then present (the policy starts and pins), the helper's socket
    directory missing until the real helper serves in it."""
    config = TESTS / "data" / "balloons" / "test01-basic-placement" / "balloons.yaml"
    sock = tmp_path / "sst" / "helper.sock"
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch("--sst-helper", f"ipc://{sock}", "--config-file", str(config),
                              policy="balloons")  # fmt: skip
        lines = await plugin.lines_until(START_ATTEMPT.format(n=ATTEMPTS), 1)
        assert reported(lines, "sys/devices/system/cpu does not exist", "hostsysfs") == 4
        plugin.assert_alive()
        assert (await plugin.health())[0] == 503
        write_topology(paths["host"], TOPOLOGIES["n4c16"])
        await wait_registered(rt, plugin.proc, 30)
        await plugin.proc.wait_output("synchronized", timeout=20)
        status, body = await plugin.health()
        assert status == 503 and body.startswith(f"not ok: SST helper unreachable: {sock.parent}")
        pod = await rt.run_pod(Pod(id="", name="p", uid="u", namespace="default"))
        assert (await rt.create_container(pod.id, Container(id="", name="c"))).cpus
        sock.parent.mkdir()
        write_topology(tmp_path / "helper-host", TOPOLOGIES["n4c16"])
        await healthy_with_helper(plugin, tmp_path, sock)


async def test_sysfs_incomplete(paths: dict[str, Path], launch: Launch) -> None:
    """``online`` there, the CPUs' topology not (a tree the balloons policy's
    topology cannot be read from): the same line and retries, naming the
    missing file."""
    cpu = paths["host"] / "sys" / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-3\n")
    config = TESTS / "data" / "balloons" / "test01-basic-placement" / "balloons.yaml"
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch("--config-file", str(config), policy="balloons")
        lines = await plugin.lines_until(START_ATTEMPT.format(n=ATTEMPTS), 1)
        assert reported(lines, f"cannot start: {cpu / 'cpu0'}", "is unusable", "hostsysfs") == 4
        plugin.assert_alive()
        assert (await plugin.health())[0] == 503
        shutil.rmtree(paths["host"] / "sys")
        write_topology(paths["host"], TOPOLOGIES["n4c16"])
        await wait_registered(rt, plugin.proc, 20)
        await plugin.wait_healthy()

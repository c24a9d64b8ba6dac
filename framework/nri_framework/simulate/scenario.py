"""``nri-resource-policy simulate``: a policy process against the simulated runtime.

Starts a :class:`~nri_framework.simulate.runtime.SimulatedRuntime` on a socket
in a temporary directory, launches the plugin as its own process::

    python -m nri_framework run --policy NAME --nri-socket SOCK --host-root ROOT
        --state-dir STATE --exit-on-disconnect

waits until it registers, runs every pod of the YAML files in ``--pods``
(sorted by file name, documents in order: RunPodSandbox, then CreateContainer
and StartContainer per container) and prints where each container landed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nri_framework
from nri_framework import logsetup
from nri_framework.simulate.emulation import CONTAINERD_1_7, NRI_V0_12, Emulation
from nri_framework.simulate.podspec import PodSpecError, RuntimeDefaults, SimPod, load_pod_dir
from nri_framework.simulate.runtime import NriError, PluginInfo, SimulatedRuntime
from nri_framework.simulate.sysfs import TopologyError, online, prepare_host_root

log = logging.getLogger("nri_framework.simulate")

EMULATIONS = {"containerd-1.7": CONTAINERD_1_7, "nri-0.12": NRI_V0_12}
STOP_GRACE = 5.0


class ScenarioError(Exception):
    """The scenario could not run (bad input, plugin did not come up)."""


@dataclass(frozen=True)
class Row:
    pod: str
    container: str
    qos: str
    cpus: str = ""
    mems: str = ""
    error: str = ""


@dataclass
class ScenarioResult:
    rows: list[Row] = field(default_factory=list)
    plugin: PluginInfo | None = None
    #: the plugin was dropped by the runtime or refused
    failures: list[str] = field(default_factory=list)
    workdir: Path | None = None
    plugin_output: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and not any(r.error for r in self.rows)


@dataclass(frozen=True)
class ScenarioPaths:
    workdir: Path
    socket: Path
    host_root: Path
    state_dir: Path


def plugin_command(
    policy: str,
    paths: ScenarioPaths,
    extra_args: Sequence[str] = (),
    *,
    exit_on_disconnect: bool = True,
) -> list[str]:
    """The default plugin command line."""
    return [
        sys.executable, "-m", "nri_framework", "run",
        "--policy", policy,
        "--nri-socket", str(paths.socket),
        "--host-root", str(paths.host_root),
        "--state-dir", str(paths.state_dir),
        *(["--exit-on-disconnect"] if exit_on_disconnect else []),
        *extra_args,
    ]  # fmt: skip


def _expand(cmd: Sequence[str], policy: str, paths: ScenarioPaths) -> list[str]:
    """``{socket}``, ``{host_root}``, ``{state_dir}``, ``{policy}`` in a custom command."""
    values = {
        "socket": str(paths.socket),
        "host_root": str(paths.host_root),
        "state_dir": str(paths.state_dir),
        "policy": policy,
    }
    return [arg.format(**values) for arg in cmd]


def plugin_env() -> dict[str, str]:
    """Our environment, with this ``nri_framework`` importable by the child."""
    env = dict(os.environ)
    root = str(Path(nri_framework.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


class PluginProcess:
    """The plugin child process; its output is logged and the tail kept."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.tail: collections.deque[str] = collections.deque(maxlen=100_000)
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def launch(cls, cmd: list[str]) -> PluginProcess:
        log.info("launching plugin: %s", " ".join(cmd))
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=plugin_env(),
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            log.debug("plugin: %s", line)

    def output(self) -> str:
        return "\n".join(self.tail)

    async def wait_output(self, text: str, timeout: float = 10.0, count: int = 1) -> None:
        """Wait until ``text`` appeared ``count`` times in the output (kept tail)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while sum(text in line for line in self.tail) < count:
            if loop.time() > deadline:
                raise TimeoutError(f"plugin did not print {text!r} in {timeout}s:\n{self.output()}")
            await asyncio.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL, no chance to clean up."""
        if self.proc.returncode is None:
            self.proc.kill()

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._reader, STOP_GRACE)
        return self.proc.returncode or 0


async def wait_registered(
    rt: SimulatedRuntime, plugin: PluginProcess, timeout: float
) -> PluginInfo:
    waiter = asyncio.create_task(rt.wait_plugins(1, timeout))
    exited = asyncio.create_task(plugin.proc.wait())
    done, _ = await asyncio.wait({waiter, exited}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done:
        exited.cancel()
        try:
            return waiter.result()[0]
        except TimeoutError as exc:
            raise ScenarioError(f"plugin did not register: {exc}") from None
    waiter.cancel()
    await asyncio.sleep(0.1)  # let the reader drain the last lines
    tail = "\n".join(list(plugin.tail)[-20:])
    raise ScenarioError(
        f"plugin exited with code {plugin.proc.returncode} before registering:\n{tail}"
    )


@dataclass(frozen=True)
class Placed:
    """A container the scenario tried to create: its id, or why it failed."""

    pod: str
    container: str
    qos: str
    container_id: str = ""
    error: str = ""


async def deploy(rt: SimulatedRuntime, sim: SimPod) -> list[Placed]:
    """Run one pod and create + start its containers."""
    pod = await rt.run_pod(sim.pod)
    placed: list[Placed] = []
    for c in sim.containers:
        try:
            created = await rt.create_container(pod.id, c)
            await rt.start_container(created.id)
        except NriError as exc:
            placed.append(Placed(pod.name, c.name, str(sim.qos), error=str(exc)))
            continue
        placed.append(Placed(pod.name, c.name, str(sim.qos), container_id=created.id))
    return placed


def rows_of(rt: SimulatedRuntime, placed: list[Placed]) -> list[Row]:
    """Where each container is now (later pods may have moved earlier ones)."""
    table = rt.containers
    rows: list[Row] = []
    for p in placed:
        c = table.get(p.container_id)
        if c is None:
            rows.append(Row(p.pod, p.container, p.qos, error=p.error or "container is gone"))
            continue
        cpu = c.resources.cpu if c.resources else None
        rows.append(
            Row(p.pod, p.container, p.qos, cpu.cpus if cpu else "", cpu.mems if cpu else "")
        )
    return rows


def make_paths(topology: str, state_dir: str | os.PathLike[str] | None) -> ScenarioPaths:
    workdir = Path(tempfile.mkdtemp(prefix="nri-simulate-"))
    try:
        host_root = prepare_host_root(topology, workdir)
    except TopologyError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise ScenarioError(str(exc)) from None
    state = Path(state_dir) if state_dir else workdir / "state"
    return ScenarioPaths(workdir, workdir / "nri.sock", host_root, state)


def _load_pods(
    pods_dir: str | os.PathLike[str], host_root: Path, default_cpuset: bool
) -> list[SimPod]:
    defaults = RuntimeDefaults()
    if default_cpuset:
        defaults = RuntimeDefaults(cpus=online(host_root, "cpu"), mems=online(host_root, "node"))
    try:
        return load_pod_dir(pods_dir, defaults)
    except (OSError, PodSpecError) as exc:
        raise ScenarioError(f"cannot load pods from {pods_dir}: {exc}") from None


async def run_scenario(
    pods_dir: str | os.PathLike[str],
    policy: str,
    topology: str = "cpus:4",
    *,
    plugin_cmd: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 30.0,
    state_dir: str | os.PathLike[str] | None = None,
    keep: bool = False,
    emulation: Emulation = CONTAINERD_1_7,
    default_cpuset: bool = False,
) -> ScenarioResult:
    """Run the pods of ``pods_dir`` against ``policy``; see the module docstring.

    ``plugin_cmd`` replaces the plugin command line; ``{socket}``,
    ``{host_root}``, ``{state_dir}`` and ``{policy}`` in it are filled in.
    ``default_cpuset``: containers start on all online CPUs and memory nodes
    of the topology (as with a kubelet CPU manager) instead of no cpuset.
    The temporary directory is removed unless ``keep``.
    """
    paths = make_paths(topology, state_dir)
    result = ScenarioResult(workdir=paths.workdir if keep else None)
    try:
        pods = _load_pods(pods_dir, paths.host_root, default_cpuset)
        await _run(pods, policy, paths, plugin_cmd, extra_args, timeout, emulation, result)
    finally:
        if not keep:
            shutil.rmtree(paths.workdir, ignore_errors=True)
    return result


async def _run(
    pods: list[SimPod],
    policy: str,
    paths: ScenarioPaths,
    plugin_cmd: Sequence[str] | None,
    extra_args: Sequence[str],
    timeout: float,
    emulation: Emulation,
    result: ScenarioResult,
) -> None:
    cmd = (
        _expand(plugin_cmd, policy, paths)
        if plugin_cmd
        else plugin_command(policy, paths, extra_args)
    )
    async with SimulatedRuntime(paths.socket, emulation=emulation) as rt:
        plugin = await PluginProcess.launch(cmd)
        try:
            result.plugin = await wait_registered(rt, plugin, timeout)
            placed: list[Placed] = []
            for sim in pods:
                placed.extend(await deploy(rt, sim))
            result.rows = rows_of(rt, placed)
            result.failures = list(rt.failures)
        finally:
            await plugin.stop()
            result.plugin_output = list(plugin.tail)


# --- command line -------------------------------------------------------------------


def format_table(rows: Sequence[Row]) -> str:
    header = ("POD", "CONTAINER", "QOS", "CPUS", "MEMS")
    cells = [header] + [
        (
            r.pod,
            r.container,
            r.qos,
            "-" if r.error else r.cpus or "(all)",
            "-" if r.error else r.mems or "(all)",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nri-resource-policy simulate",
        description="Run a policy against a simulated containerd and show where pods land.",
    )
    p.add_argument("--pods", required=True, metavar="DIR", help="directory of Pod YAML files")
    p.add_argument("--policy", required=True, metavar="NAME", help="policy entry point name")
    p.add_argument(
        "--topology",
        default="cpus:4",
        metavar="SPEC",
        help="host root directory with sys/, cpus:N, n4c16, xeon-6776p or s8c4k (default cpus:4)",
    )
    p.add_argument(
        "--state-dir", metavar="DIR", help="plugin state directory (default: in the temp dir)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for registration")
    p.add_argument(
        "--emulate",
        choices=sorted(EMULATIONS),
        default="containerd-1.7",
        help="runtime to emulate (default containerd-1.7, NRI 0.6.1)",
    )
    p.add_argument(
        "--plugin-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the plugin's run command (repeatable)",
    )
    p.add_argument(
        "--default-cpuset",
        action="store_true",
        help="containers start on all online CPUs/nodes instead of no cpuset",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log runtime and plugin activity")
    return p  # fmt: skip


def main(argv: list[str]) -> int:
    """``nri-resource-policy simulate ...``; returns the exit code."""
    args = _parser().parse_args(argv)
    logsetup.setup("debug" if args.verbose else "warning")
    try:
        result = asyncio.run(
            run_scenario(
                args.pods,
                args.policy,
                args.topology,
                extra_args=args.plugin_arg,
                timeout=args.timeout,
                state_dir=args.state_dir,
                keep=args.keep,
                emulation=EMULATIONS[args.emulate],
                default_cpuset=args.default_cpuset,
            )
        )
    except ScenarioError as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 1
    print(format_table(result.rows))
    for r in result.rows:
        if r.error:
            print(f"error: {r.pod}/{r.container}: {r.error}", file=sys.stderr)
    for failure in result.failures:
        print(f"runtime: {failure}", file=sys.stderr)
    if result.workdir is not None:
        print(f"kept {result.workdir}", file=sys.stderr)
    return 0 if result.ok else 1

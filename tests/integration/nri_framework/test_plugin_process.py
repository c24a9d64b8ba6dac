"""The plugin as its own process (``python -m nri_framework run``) against the
runtime simulator over a unix socket: reconnects, exits, restarts with state,
survives a hostile peer, loads a third-party policy."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from nri_framework.model import Container, CpuResources, Event, Pod, Resources
from nri_framework.nri import mux
from nri_framework.nri.connection import NriConnection, Role
from nri_framework.nri.ttrpc import Code, RequestReceived, ResponseReceived
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, run_scenario
from nri_framework.simulate.sysfs import write_cpu_tree

PODS = Path(__file__).resolve().parents[3] / "tests" / "data" / "pods"

Launch = Callable[..., Awaitable[PluginProcess]]


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "host"
    write_cpu_tree(root, 8)
    return {"socket": tmp_path / "nri" / "nri.sock", "host": root, "state": tmp_path / "state"}


@pytest.fixture
async def launch(paths: dict[str, Path]) -> AsyncIterator[Launch]:
    procs: list[PluginProcess] = []

    async def start(*extra: str, policy: str = "pinner") -> PluginProcess:
        cmd = [
            sys.executable, "-m", "nri_framework", "run",
            "--policy", policy,
            "--nri-socket", str(paths["socket"]),
            "--host-root", str(paths["host"]),
            "--state-dir", str(paths["state"]),
            *extra,
        ]  # fmt: skip
        proc = await PluginProcess.launch(cmd)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        await proc.stop()


def guaranteed(name: str, n: int) -> Container:
    cpu = CpuResources(shares=1024 * n, quota=100_000 * n, period=100_000)
    return Container(id="", name=name, resources=Resources(cpu=cpu))


def shared(name: str) -> Container:
    return Container(id="", name=name, resources=Resources(cpu=CpuResources(shares=2)))


async def populate(rt: SimulatedRuntime) -> dict[str, str]:
    """Two pods: an exclusive 2-CPU container and a shared one; returns cpus by name."""
    pod = await rt.run_pod(Pod(id="", name="p1", uid="u1", namespace="default"))
    a = await rt.create_container(pod.id, guaranteed("excl", 2))
    b = await rt.create_container(pod.id, shared("shr"))
    for c in (a, b):
        await rt.start_container(c.id)
    return cpus_by_name(rt)


def cpus_by_name(rt: SimulatedRuntime) -> dict[str, str]:
    return {c.name: c.cpus for c in rt.containers.values()}


async def test_reconnects_and_resynchronizes(paths: dict[str, Path], launch: Launch) -> None:
    rt = SimulatedRuntime(paths["socket"])
    await rt.start()
    plugin = await launch()
    try:
        await rt.wait_plugins(1, 10)
        before = await populate(rt)
        assert before == {"excl": "6-7", "shr": "0-5"}
        await rt.stop()  # the runtime goes away; its containers keep running
        await plugin.wait_output("reconnecting in", timeout=5)
        assert plugin.proc.returncode is None
        await rt.start()  # ... and comes back
        await rt.wait_plugins(1, 10)
        await plugin.wait_output("synchronized 1 pod(s), 2 container(s)", timeout=5)
        assert cpus_by_name(rt) == before
        c = await rt.create_container(next(iter(rt.pods)), guaranteed("new", 1))
        assert c.cpus == "5"
        assert cpus_by_name(rt)["shr"] == "0-4"
    finally:
        await rt.stop()


async def test_exit_on_disconnect(paths: dict[str, Path], launch: Launch) -> None:
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch("--exit-on-disconnect")
        await rt.wait_plugins(1, 10)
    assert await asyncio.wait_for(plugin.proc.wait(), 5) == 1
    # its last lines may still be in the pipe: read until they are out
    await plugin.wait_output("lost NRI runtime: runtime closed the connection; exiting", 5)


async def test_waits_for_a_missing_socket(paths: dict[str, Path], launch: Launch) -> None:
    plugin = await launch()
    await plugin.wait_output("NRI runtime not reachable", timeout=5)
    async with SimulatedRuntime(paths["socket"]) as rt:
        await rt.wait_plugins(1, 10)


async def test_sigkill_then_restart_keeps_cpus(paths: dict[str, Path], launch: Launch) -> None:
    """The decisions survive in the journal alone: no snapshot can be written
    (a directory where the snapshot's temporary file goes), and the kill
    comes right after the replies. (The pinner would trust the runtime's
    cpusets without a state: the restarted plugin's log says where its
    state came from.)"""
    (paths["state"] / "pinner.state.tmp").mkdir(parents=True)
    async with SimulatedRuntime(paths["socket"]) as rt:
        first = await launch()
        await rt.wait_plugins(1, 10)
        before = await populate(rt)
        await first.wait_output("failed to save state to", timeout=5)
        # no wait: each decision is journaled before its reply (nri_framework.journal)
        first.kill()
        await first.proc.wait()
        # creation goes on without the dead plugin (dropped at the next event)
        pod_id = next(iter(rt.pods))
        orphan = await rt.create_container(pod_id, shared("orphan"))
        assert orphan.cpus == ""
        second = await launch()
        await rt.wait_plugins(1, 10)
        await second.wait_output("synchronized 1 pod(s), 3 container(s)", timeout=5)
        (loaded,) = [x for x in second.output().splitlines() if "loaded state of" in x]
        assert "loaded state of 2 container(s) from " in loaded, loaded
        assert loaded.endswith(" journal record(s) after the snapshot)"), loaded
        assert not loaded.endswith("(0 journal record(s) after the snapshot)"), loaded
        after = cpus_by_name(rt)
        assert {k: after[k] for k in before} == before
        assert after["orphan"] == "0-5"  # adopted into the shared pool


async def test_sigterm_exits_cleanly_and_saves(paths: dict[str, Path], launch: Launch) -> None:
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await launch()
        await rt.wait_plugins(1, 10)
        await populate(rt)
        assert await plugin.stop() == 0
    state = (paths["state"] / "pinner.state.json").read_text()
    assert '"exclusive"' in state and '"6-7"' in state


# --- a hostile runtime -------------------------------------------------------------


class RawRuntime:
    """A runtime peer on the sans-IO codec that can send anything."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.conns: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawRuntime:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.server = await asyncio.start_unix_server(self._accepted, path=str(self.socket))
        return self

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        self.conns.put_nowait((reader, writer))

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:  # Python >= 3.12.1 waits for them in wait_closed()
            writer.close()
        await self.server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def accept(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, NriConnection]:
        reader, writer = await asyncio.wait_for(self.conns.get(), 10)
        conn = NriConnection(Role.RUNTIME)
        # answer RegisterPlugin
        while True:
            events = conn.receive_data(await reader.read(65536))
            reqs = [e for e in events if isinstance(e, RequestReceived)]
            if reqs:
                assert reqs[0].method == "RegisterPlugin"
                conn.send_response(reqs[0].stream_id, b"")
                writer.write(conn.data_to_send())
                return reader, writer, conn

    @staticmethod
    async def call(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: NriConnection,
        method: str,
        payload: bytes,
    ) -> ResponseReceived:
        conn.send_request(method, payload)
        writer.write(conn.data_to_send())
        while True:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data, "plugin closed the connection"
            for ev in conn.receive_data(data):
                if isinstance(ev, ResponseReceived):
                    return ev


async def test_hostile_peer_gets_protocol_answers(paths: dict[str, Path], launch: Launch) -> None:
    async with RawRuntime(paths["socket"]) as raw:
        plugin = await launch()
        reader, writer, conn = await raw.accept()
        await plugin.wait_output("registered as", timeout=5)  # it read the answer
        req = pb.CreateContainerRequest()
        req.pod.id = "p"
        req.container.id = "c"
        req.container.linux.resources.cpu.shares.value = 2
        # out of order: a create before Configure is a protocol error, the trunk lives
        early = await raw.call(reader, writer, conn, "CreateContainer", req.SerializeToString())
        assert (early.code, early.message) == (
            Code.FAILED_PRECONDITION,
            "CreateContainer is not allowed in state registered",
        )
        configure = pb.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24")
        ok = await raw.call(reader, writer, conn, "Configure", configure.SerializeToString())
        assert ok.code == 0 and pb.ConfigureResponse.FromString(ok.payload).events
        bad = await raw.call(reader, writer, conn, "CreateContainer", b"\xff\xff\xff")
        assert bad.code == Code.INVALID_ARGUMENT
        unknown = await raw.call(reader, writer, conn, "FlyToTheMoon", b"")
        assert (unknown.code, unknown.message) == (Code.UNIMPLEMENTED, "method FlyToTheMoon")
        # ... and so is one between Configure and Synchronize
        early = await raw.call(reader, writer, conn, "CreateContainer", req.SerializeToString())
        assert (early.code, early.message) == (
            Code.FAILED_PRECONDITION,
            "CreateContainer is not allowed in state configured",
        )
        await plugin.wait_output(
            "NRI protocol: CreateContainer is not allowed in state configured", timeout=5
        )
        synced = await raw.call(reader, writer, conn, "Synchronize", b"")
        assert synced.code == 0
        # a create for a pod the plugin never heard of still gets a decision
        created = await raw.call(reader, writer, conn, "CreateContainer", req.SerializeToString())
        assert created.code == 0
        answer = pb.CreateContainerResponse.FromString(created.payload)
        assert answer.adjust.linux.resources.cpu.cpus == "0-7"
        # now garbage at the mux level: the plugin closes this trunk ...
        writer.write(mux.HEADER.pack(1, 0xFFFFFFF0) + b"junk")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        await plugin.wait_output("closing NRI connection: mux frame of", timeout=5)
        # ... but lives on and comes back
        await raw.accept()
        assert plugin.proc.returncode is None


DEDICATED_RPCS = {
    "RunPodSandbox": Event.RUN_POD_SANDBOX,
    "StopPodSandbox": Event.STOP_POD_SANDBOX,
    "RemovePodSandbox": Event.REMOVE_POD_SANDBOX,
    "PostUpdatePodSandbox": Event.POST_UPDATE_POD_SANDBOX,
    "PostCreateContainer": Event.POST_CREATE_CONTAINER,
    "StartContainer": Event.START_CONTAINER,
    "PostStartContainer": Event.POST_START_CONTAINER,
    "PostUpdateContainer": Event.POST_UPDATE_CONTAINER,
    "RemoveContainer": Event.REMOVE_CONTAINER,
}
"""NRI v0.12's dedicated event RPCs and their events (``<Method>Request``)."""


async def test_dedicated_rpc_of_an_unsubscribed_event_is_unimplemented(
    paths: dict[str, Path], launch: Launch
) -> None:
    """A v0.12 dedicated event RPC for an event the plugin did not subscribe to
    (no hook wants it) is answered UNIMPLEMENTED, so a runtime falls back to
    StateChange, never served as a no-op; one it subscribed to is served."""
    async with RawRuntime(paths["socket"]) as raw:
        plugin = await launch()
        reader, writer, conn = await raw.accept()
        configure = pb.ConfigureRequest(
            runtime_name="containerd", runtime_version="2.1.0", NRI_version="v0.12.0"
        )
        ok = await raw.call(reader, writer, conn, "Configure", configure.SerializeToString())
        assert ok.code == 0
        events = pb.ConfigureResponse.FromString(ok.payload).events
        assert (await raw.call(reader, writer, conn, "Synchronize", b"")).code == 0
        answers, wanted = {}, {}
        for method, event in DEDICATED_RPCS.items():
            req = getattr(pb, f"{method}Request")()
            req.pod.id = "p"
            if "container" in req.DESCRIPTOR.fields_by_name:
                req.container.id = "c"
                req.container.pod_sandbox_id = "p"
            got = await raw.call(reader, writer, conn, method, req.SerializeToString())
            answers[method] = (got.code, got.message)
            wanted[method] = (
                (0, "") if events & event.bit else (Code.UNIMPLEMENTED, f"method {method}")
            )
        assert answers == wanted
        # the pinner (and the host's cache) want some of them, not all
        assert 0 < sum(code == 0 for code, _ in answers.values()) < len(DEDICATED_RPCS)
        assert plugin.proc.returncode is None


# --- a policy from outside the distribution ----------------------------------------


async def test_third_party_policy_by_entry_point() -> None:
    result = await run_scenario(PODS, "example", "cpus:4", timeout=20)
    assert result.ok, (result.failures, result.plugin_output)
    assert result.rows and {r.cpus for r in result.rows} == {"3"}


def console_script() -> str:
    """The installed ``nri-resource-policy`` of the interpreter running the tests."""
    script = Path(sys.executable).parent / "nri-resource-policy"
    found = str(script) if script.is_file() else shutil.which("nri-resource-policy")
    assert found, "the nri-resource-policy console script is not installed"
    return found


async def test_third_party_flag_through_the_console_script(paths: dict[str, Path]) -> None:
    """The example policy's own flag (``policy_addoption``), given to the real
    ``nri-resource-policy run``: listed by ``--help`` after ``--policy``, and
    the decision follows it."""
    script = console_script()
    shown = subprocess.run([script, "run", "--policy", "example", "--help"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "example:\n  --example-cpus LIST" in shown.stdout
    assert "--example-cpus" not in subprocess.run([script, "run", "--help"], capture_output=True,
                                                  text=True, timeout=30).stdout  # fmt: skip
    cmd = [script, "run", "--policy", "example", "--example-cpus", "1-2",
           "--nri-socket", str(paths["socket"]), "--host-root", str(paths["host"]),
           "--state-dir", str(paths["state"])]  # fmt: skip
    async with SimulatedRuntime(paths["socket"]) as rt:
        plugin = await PluginProcess.launch(cmd)
        try:
            await rt.wait_plugins(1, 10)
            pod = await rt.run_pod(Pod(id="", name="p", uid="u", namespace="default"))
            created = await rt.create_container(pod.id, shared("c"))
            assert created.cpus == "1-2"
            assert created.annotations["example.nri-policy/decided-by"] == "example"
        finally:
            await plugin.stop()


def test_third_party_command_through_the_console_script() -> None:
    """The example's command (group ``nri_resource_policy.commands``): run by
    name with its arguments, listed by ``--help`` and by ``policies``."""
    script = console_script()
    run = subprocess.run([script, "example-info", "--annotation"], capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    assert (run.returncode, run.stdout) == (0, "example.nri-policy/decided-by\n"), run.stderr
    bad = subprocess.run([script, "example-info", "--bogus"], capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr
    helped = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert "example-info" in helped.stdout and "Say which policy this is" in helped.stdout
    listed = subprocess.run([script, "policies"], capture_output=True, text=True, timeout=30)
    assert "    example-info (nri-policy-example: nri_policy_example:info_main)" in listed.stdout


def test_policies_command_lists_both() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nri_framework", "policies"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "example 1.2.3 (nri-policy-example: nri_policy_example:ExamplePolicy)" in out
    assert "pinner 0.1.0 (nri-resource-policy: nri_framework.policies.pinner:plugin)" in out
    assert "    nri_create_container" in out

"""A real plugin process SIGKILLed between a reply and the snapshot that reply
made due (:meth:`nri_framework.statefile.StateFile.due`): its record is in the
journal before the reply, so the restarted plugin loses nothing.

The record is a create whose container carries a large annotation: one more
like it would carry the journal past ``COMPACT_BYTES``, so the snapshot is
written on the loop turn after the reply. The test SIGKILLs the plugin as
soon as the runtime simulator has that reply (``racing``: the kill lands
before, during or after the snapshot, as a crash would); with ``blocked`` the
snapshot cannot land at all (a directory where its temporary file goes),
which pins the crash to the point between the reply and the snapshot."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from nri_framework.journal import COMPACT_BYTES
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess
from nri_framework.simulate.sysfs import write_cpu_tree


def guaranteed(name: str, n: int, note: int = 0) -> Container:
    cpu = CpuResources(shares=1024 * n, quota=100_000 * n, period=100_000)
    annotations = {"note": "x" * note} if note else {}
    return Container(id="", name=name, annotations=annotations, resources=Resources(cpu=cpu))


def cpus_by_name(rt: SimulatedRuntime) -> dict[str, str]:
    return {c.name: c.cpus for c in rt.containers.values()}


@pytest.mark.parametrize("crash", ["racing", "blocked"])
async def test_sigkill_after_a_reply_that_made_the_snapshot_due_loses_nothing(
    tmp_path: Path, crash: str
) -> None:
    root = tmp_path / "host"
    write_cpu_tree(root, 8)
    socket, state = tmp_path / "nri" / "nri.sock", tmp_path / "state"
    cmd = [
        sys.executable, "-m", "nri_framework", "run",
        "--policy", "pinner",
        "--nri-socket", str(socket),
        "--host-root", str(root),
        "--state-dir", str(state),
    ]  # fmt: skip
    if crash == "blocked":
        (state / "pinner.state.tmp").mkdir(parents=True)
    async with SimulatedRuntime(socket) as rt:
        plugin = await PluginProcess.launch(cmd)
        try:
            await rt.wait_plugins(1, 10)
            pod = await rt.run_pod(Pod(id="", name="p", uid="u", namespace="default"))
            for c in (guaranteed("a", 2), guaranteed("b", 1)):
                await rt.start_container((await rt.create_container(pod.id, c)).id)
            # a record over half of COMPACT_BYTES: no room for another like it
            big = await rt.create_container(pod.id, guaranteed("big", 1, COMPACT_BYTES // 2 + 1))
            os.kill(plugin.proc.pid, signal.SIGKILL)
            assert big.cpus, "the reply came before the kill"
            assert await asyncio.wait_for(plugin.proc.wait(), 10) == -signal.SIGKILL
            await plugin.stop()
            await rt.start_container(big.id)
            before = cpus_by_name(rt)
            assert before == {"a": "6-7", "b": "5", "big": "4"}
            if crash == "blocked":  # no snapshot landed: the journal holds the create
                assert not (state / "pinner.state.json").exists()
                assert (state / "pinner.journal").stat().st_size > COMPACT_BYTES // 2
            plugin = await PluginProcess.launch(cmd)
            await rt.wait_plugins(1, 10)
            await plugin.wait_output("synchronized 1 pod(s), 3 container(s)", timeout=10)
            (loaded,) = [x for x in plugin.output().splitlines() if "loaded state of" in x]
            assert "loaded state of 3 container(s) from " in loaded, loaded
            if crash == "blocked":
                assert not loaded.endswith("(0 journal record(s) after the snapshot)"), loaded
            assert cpus_by_name(rt) == before
            new = await rt.create_container(pod.id, guaranteed("new", 1))
            assert new.cpus == "3"  # the restarted plugin knows big's CPU
        finally:
            await plugin.stop()

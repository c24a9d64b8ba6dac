"""The instrumentation endpoint of the real balloons plugin process against the
runtime simulator: ``/healthz`` over the plugin's life (before the runtime is
there, registered, runtime gone), ``/metrics`` as pods come and go, and
``nri-resource-policy inspect`` run as a command."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from balloons_e2e import DATA, Node, http_get
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, plugin_env, wait_registered
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import TOPOLOGIES
from prometheus_client.parser import text_string_to_metric_families

TEST = "test01-basic-placement"
_LISTENING = re.compile(r"instrumentation HTTP endpoint listening on (\S+):(\d+) ")


async def balloon_samples(port: int) -> dict[str, tuple[dict[str, str], float]]:
    status, text = await http_get(port, "/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {
        s.labels["balloon"]: (s.labels, s.value) for s in fams["nri_policy_balloons_cores"].samples
    }


async def inspect(port: int, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nri_framework", "inspect", "--address", f"127.0.0.1:{port}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=plugin_env(),
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode()


@asynccontextmanager
async def plugin_first() -> AsyncIterator[tuple[Path, PluginProcess, int]]:
    """The plugin started before the runtime (it keeps retrying to connect),
    serving instrumentation on a free loopback port; yields (work dir, plugin, port)."""
    work = Path(tempfile.mkdtemp(prefix="balloons-observe-"))
    host_root = write_topology(work / "host", TOPOLOGIES["n4c16"])
    cfg = work / "balloons.yaml"
    shutil.copyfile(DATA / TEST / "balloons.yaml", cfg)
    cmd = [
        sys.executable, "-m", "nri_framework", "run",
        "--policy", "balloons",
        "--nri-socket", str(work / "nri.sock"),
        "--host-root", str(host_root),
        "--state-dir", str(work / "state"),
        "--config-file", str(cfg),
        "--metrics-address", "127.0.0.1:0",
    ]  # fmt: skip
    plugin = await PluginProcess.launch(cmd)
    try:
        await plugin.wait_output("instrumentation HTTP endpoint listening on", timeout=20)
        m = next(m for line in plugin.tail if (m := _LISTENING.search(line)))
        yield work, plugin, int(m.group(2))
    finally:
        await plugin.stop()
        shutil.rmtree(work, ignore_errors=True)


async def test_health_metrics_and_inspect_of_a_running_plugin() -> None:
    async with plugin_first() as (work, plugin, port):
        # no runtime yet: alive, answering, not healthy ("starting" while the policy
        # starts off the loop, then the runtime it waits for)
        for _ in range(200):
            status, body = await http_get(port, "/healthz")
            assert status == 503
            if body != "not ok: starting\n":
                break
            await asyncio.sleep(0.05)
        assert body.startswith(f"not ok: not registered with the NRI runtime ({work / 'nri.sock'})")

        async with SimulatedRuntime(work / "nri.sock") as rt:
            await wait_registered(rt, plugin, 30)
            await plugin.wait_output("synchronized", timeout=10)
            status, body = await http_get(port, "/healthz")
            assert (status, body) == (200, "ok\n")

            n = Node(TEST, rt, plugin, work / "host", work / "balloons.yaml")
            await n.create("pod0.yaml")  # kube-system: the reserved balloon
            await n.create("pod1.yaml")  # annotation: a two-cpu balloon
            samples = await balloon_samples(port)
            labels, value = samples["two-cpu[0]"]
            assert labels["containers"] == "default/pod1/pod1c0,default/pod1/pod1c1"
            assert value == 2.0 == len(n.cpus("pod1c0"))
            assert labels["cpus"] == rt.container(n.ids["pod1c0"][1]).resources.cpu.cpus  # type: ignore[union-attr]
            assert labels["cpu_class"] == "class2"
            assert labels["tot_req_millicpu"] == "200"
            assert re.fullmatch(r"p\dd0n\d", labels["numas"])
            assert samples["reserved[0]"][0]["containers"] == (
                "kube-system/pod0/pod0c0,kube-system/pod0/pod0c1"
            )

            # inspect, as an operator runs it
            rc, out = await inspect(port)
            assert rc == 0, out
            lines = out.splitlines()
            assert "health: ok" in lines
            assert "runtime containerd" in lines[1]
            assert "allowed cpus: 1-15" in lines
            balloons = table(lines, "BALLOONS")
            assert balloons["two-cpu[0]"][:2] == ["two-cpu", labels["cpus"]]
            containers = table(lines, "CONTAINERS")
            cpuset, _mems, balloon, request = containers["default/pod1/pod1c0"]
            assert (cpuset, balloon, request) == (labels["cpus"], "two-cpu[0]", "100")
            assert containers["kube-system/pod0/pod0c0"][2] == "reserved[0]"
            cpus = table(lines, "CPUS")
            assert len(cpus) == 16
            assert cpus["0"][0] == "not allowed"  # availableResources: cpuset:1-15
            for cpu in n.cpus("pod1c0"):
                assert cpus[str(cpu)][:2] == ["two-cpu[0]", "class2"]
            assert "CLOS" not in out  # no PCT configured: no CLOS column

            rc, raw = await inspect(port, "--json")
            assert rc == 0 and '"balloons"' in raw

            # the balloon goes when its pod goes
            await n.delete("pod1")
            await asyncio.sleep(0.1)
            samples = await balloon_samples(port)
            assert "two-cpu[0]" not in samples and "reserved[0]" in samples

        # the runtime went away: the plugin retries, and says it is not healthy
        await plugin.wait_output("lost NRI runtime", timeout=10)
        status, body = await http_get(port, "/healthz")
        assert status == 503 and "not registered" in body


async def test_inspect_without_a_plugin() -> None:
    rc, out = await inspect(1)  # nothing listens on port 1
    assert rc == 1
    assert "cannot read http://127.0.0.1:1/debug/state" in out
    assert "--metrics-address" in out


def table(lines: list[str], title: str) -> dict[str, list[str]]:
    """Rows of the table ``title`` printed by inspect: first cell -> the other cells."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{title} ("))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        first, *rest = re.split(r"\s{2,}", line.strip())
        rows[first] = rest
    return rows

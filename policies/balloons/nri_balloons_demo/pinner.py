"""``nri-resource-policy demo pinner``: a simulated node, the plugin, a few pods.

The runtime simulator plays containerd (NRI 0.6.1, as Debian's 1.7.24); the
plugin runs as its own process (``python -m nri_framework run --policy
pinner``) over a real unix socket, as it would on a node. The demo walks a
node through a short life and checks each step:

1. four Kubernetes pods (``nri_balloons_demo/data/pinner/*.yaml``) are created;
   Guaranteed pods with whole CPUs get exclusive CPUs, the rest share;
2. the kubelet resizes a container (UpdateContainer with cpuset 0-7): the
   policy's cpuset stays;
3. the plugin is killed with SIGKILL; a pod created meanwhile runs unpinned;
   the restarted plugin re-synchronizes without moving anything and adopts
   the orphan into the shared pool;
4. a Guaranteed pod goes away: its CPUs return to the shared pool;
5. SIGTERM: the plugin exits 0.

Exits non-zero when any check fails.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nri_framework import cpuset
from nri_framework.model import CpuResources, Resources
from nri_framework.simulate.podspec import load_pod_dir, pods_from_yaml
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import (
    PluginProcess,
    ScenarioPaths,
    deploy,
    format_table,
    plugin_command,
    rows_of,
    wait_registered,
)
from nri_framework.simulate.sysfs import prepare_host_root

from nri_balloons_demo.checks import Checks, finish, section
from nri_balloons_demo.data import pinner_pods
from nri_balloons_demo.harness import demo_arguments

ORPHAN = """
apiVersion: v1
kind: Pod
metadata: {name: orphan}
spec:
  containers:
  - name: late
    image: busybox
    resources: {requests: {cpu: 250m}}
"""


def cpus_by_container(rt: SimulatedRuntime) -> dict[str, str]:
    pods = rt.pods
    return {f"{pods[c.pod_sandbox_id].name}/{c.name}": c.cpus for c in rt.containers.values()}


@dataclass
class Walk:
    """The node as the steps leave it."""

    rt: SimulatedRuntime
    plugin: PluginProcess
    cmd: list[str]
    ncpus: int
    checks: Checks
    g2: int = 0
    shared: int = 0


async def pods_arrive(w: Walk, pods_dir: Path) -> None:
    section("1. pods arrive")
    placed = []
    for sim in load_pod_dir(pods_dir):
        placed.extend(await deploy(w.rt, sim))
    print(format_table(rows_of(w.rt, placed)))
    now = cpus_by_container(w.rt)
    g2, g1 = cpuset.parse(now["g2/app"]), cpuset.parse(now["g1/worker"])
    w.g2, w.shared = g2, ((1 << w.ncpus) - 1) & ~(g2 | g1)
    w.checks.check(g2.bit_count() == 2 and g1.bit_count() == 1, "g2 has 2 CPUs, g1 has 1")
    w.checks.check(g2 & g1 == 0, "exclusive CPUs are not shared between containers")
    others = [k for k in now if k not in ("g2/app", "g1/worker")]
    w.checks.check(
        all(cpuset.parse(now[k]) == w.shared for k in others),
        f"every other container runs on the shared pool {cpuset.format(w.shared)}",
    )


async def kubelet_resizes(w: Walk) -> None:
    section("2. the kubelet resizes burst/web with cpuset 0-" + str(w.ncpus - 1))
    before = cpus_by_container(w.rt)["burst/web"]
    web = next(c for c in w.rt.containers.values() if c.name == "web")
    cpu = CpuResources(shares=768, quota=150000, period=100000, cpus=f"0-{w.ncpus - 1}")
    after = await w.rt.update_container(web.id, Resources(cpu=cpu))
    print(f"  burst/web cpus after the update: {after.cpus}")
    w.checks.check(after.cpus == before, "the policy re-asserted the cpuset")


async def plugin_restarts(w: Walk) -> None:
    section("3. SIGKILL the plugin, a pod arrives while it is down, restart")
    await asyncio.sleep(0.2)  # the state file is written off the reply path
    w.plugin.kill()
    await w.plugin.proc.wait()
    before = cpus_by_container(w.rt)
    [orphan] = pods_from_yaml(ORPHAN, source="orphan")
    await deploy(w.rt, orphan)
    late = cpus_by_container(w.rt)["orphan/late"] or "(unpinned)"
    print(f"  orphan/late created without the plugin: cpus={late}")
    w.plugin = await PluginProcess.launch(w.cmd)
    await wait_registered(w.rt, w.plugin, 20)
    await w.plugin.wait_output("synchronized", timeout=10)
    print("  " + next(line for line in w.plugin.tail if "synchronized" in line))
    now = cpus_by_container(w.rt)
    w.checks.check(all(now[k] == v for k, v in before.items()), "no running container changed CPUs")
    w.checks.check(
        cpuset.parse(now["orphan/late"]) == w.shared,
        "the orphan was adopted into the shared pool",
    )


async def pod_goes_away(w: Walk) -> None:
    section("4. pod g2 goes away")
    g2_ctr = next(c for c in w.rt.containers.values() if c.name == "app")
    await w.rt.stop_container(g2_ctr.id)
    await w.rt.remove_container(g2_ctr.id)
    await w.rt.stop_pod(g2_ctr.pod_sandbox_id)
    await w.rt.remove_pod(g2_ctr.pod_sandbox_id)
    now = cpus_by_container(w.rt)
    grown = w.shared | w.g2
    print(f"  shared pool now {cpuset.format(grown)}")
    w.checks.check(
        cpuset.parse(now["be/batch"]) == grown, "the freed CPUs returned to the shared pool"
    )


async def run_demo(workdir: Path, pods_dir: Path, ncpus: int) -> Checks:
    checks = Checks()
    host_root = prepare_host_root(f"cpus:{ncpus}", workdir)
    socket = workdir / "nri" / "nri.sock"
    paths = ScenarioPaths(workdir, socket, host_root, workdir / "state")
    cmd = plugin_command("pinner", paths, exit_on_disconnect=False)
    async with SimulatedRuntime(socket) as rt:
        section(f"node: {ncpus} CPUs (simulated), runtime simulator emulating containerd 1.7.24")
        plugin = await PluginProcess.launch(cmd)
        info = await wait_registered(rt, plugin, 20)
        print(f"  plugin {info.full_name} registered, subscribed events 0x{info.mask:x}")
        w = Walk(rt, plugin, cmd, ncpus, checks)
        await pods_arrive(w, pods_dir)
        await kubelet_resizes(w)
        await plugin_restarts(w)
        await pod_goes_away(w)
        section("5. SIGTERM")
        rc = await w.plugin.stop()
        checks.check(rc == 0, f"the plugin exited with code {rc}")
    return checks


def main(argv: list[str]) -> int:
    args = demo_arguments(
        argv,
        __doc__,
        lambda p: p.add_argument(
            "--cpus", type=int, default=8, help="CPUs of the simulated node (pinner)"
        ),
    )
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="nri-demo-"))
    try:
        checks = asyncio.run(run_demo(workdir, pinner_pods(), args.cpus))
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return finish(checks, started)

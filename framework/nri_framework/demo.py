"""``nri-resource-policy demo``: a simulated node, the plugin, a few pods.

The runtime simulator plays containerd (NRI 0.6.1, as Debian's 1.7.24); the
plugin runs as its own process (``python -m nri_framework run --policy
pinner``) over a real unix socket, as it would on a node. The demo walks a
node through a short life and checks each step:

1. four Kubernetes pods (``nri_framework/demos/pinner/*.yaml``) are created;
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

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from importlib.metadata import EntryPoint, entry_points
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


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        mark = "ok  " if ok else "FAIL"
        print(f"  [{mark}] {what}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)


def cpus_by_container(rt: SimulatedRuntime) -> dict[str, str]:
    pods = rt.pods
    return {f"{pods[c.pod_sandbox_id].name}/{c.name}": c.cpus for c in rt.containers.values()}


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


async def run_demo(workdir: Path, pods_dir: Path, ncpus: int) -> Checks:
    checks = Checks()
    host_root = prepare_host_root(f"cpus:{ncpus}", workdir)
    socket = workdir / "nri" / "nri.sock"
    state = workdir / "state"
    online = (1 << ncpus) - 1
    cmd = plugin_command(
        "pinner", ScenarioPaths(workdir, socket, host_root, state), exit_on_disconnect=False
    )

    async with SimulatedRuntime(socket) as rt:
        section(f"node: {ncpus} CPUs (simulated), runtime simulator emulating containerd 1.7.24")
        plugin = await PluginProcess.launch(cmd)
        info = await wait_registered(rt, plugin, 20)
        print(f"  plugin {info.full_name} registered, subscribed events 0x{info.mask:x}")

        section("1. pods arrive")
        placed = []
        for sim in load_pod_dir(pods_dir):
            placed.extend(await deploy(rt, sim))
        print(format_table(rows_of(rt, placed)))
        now = cpus_by_container(rt)
        g2, g1 = cpuset.parse(now["g2/app"]), cpuset.parse(now["g1/worker"])
        shared = online & ~(g2 | g1)
        checks.check(g2.bit_count() == 2 and g1.bit_count() == 1, "g2 has 2 CPUs, g1 has 1")
        checks.check(g2 & g1 == 0, "exclusive CPUs are not shared between containers")
        others = [k for k in now if k not in ("g2/app", "g1/worker")]
        checks.check(
            all(cpuset.parse(now[k]) == shared for k in others),
            f"every other container runs on the shared pool {cpuset.format(shared)}",
        )

        section("2. the kubelet resizes burst/web with cpuset 0-" + str(ncpus - 1))
        web = next(c for c in rt.containers.values() if c.name == "web")
        cpu = CpuResources(shares=768, quota=150000, period=100000, cpus=f"0-{ncpus - 1}")
        after = await rt.update_container(web.id, Resources(cpu=cpu))
        print(f"  burst/web cpus after the update: {after.cpus}")
        checks.check(after.cpus == now["burst/web"], "the policy re-asserted the cpuset")

        section("3. SIGKILL the plugin, a pod arrives while it is down, restart")
        await asyncio.sleep(0.2)  # the state file is written off the reply path
        plugin.kill()
        await plugin.proc.wait()
        before = cpus_by_container(rt)
        [orphan] = pods_from_yaml(ORPHAN, source="orphan")
        await deploy(rt, orphan)
        late = cpus_by_container(rt)["orphan/late"] or "(unpinned)"
        print(f"  orphan/late created without the plugin: cpus={late}")
        plugin = await PluginProcess.launch(cmd)
        await wait_registered(rt, plugin, 20)
        await plugin.wait_output("synchronized", timeout=10)
        print("  " + next(line for line in plugin.tail if "synchronized" in line))
        now = cpus_by_container(rt)
        checks.check(
            all(now[k] == v for k, v in before.items()), "no running container changed CPUs"
        )
        checks.check(
            cpuset.parse(now["orphan/late"]) == shared,
            "the orphan was adopted into the shared pool",
        )

        section("4. pod g2 goes away")
        g2_ctr = next(c for c in rt.containers.values() if c.name == "app")
        await rt.stop_container(g2_ctr.id)
        await rt.remove_container(g2_ctr.id)
        await rt.stop_pod(g2_ctr.pod_sandbox_id)
        await rt.remove_pod(g2_ctr.pod_sandbox_id)
        now = cpus_by_container(rt)
        grown = shared | g2
        print(f"  shared pool now {cpuset.format(grown)}")
        checks.check(
            cpuset.parse(now["be/batch"]) == grown, "the freed CPUs returned to the shared pool"
        )

        section("5. SIGTERM")
        rc = await plugin.stop()
        checks.check(rc == 0, f"the plugin exited with code {rc}")
    return checks


DEMO_GROUP = "nri_resource_policy.demos"
"""Entry points of policies' demos: ``name = module:main`` (main(argv) -> int)."""
DEFAULT_SCENARIO = "pct-managed"
"""The README's main job: the spec's walkthrough (``nri_balloons.demo``)."""


def demo_entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=DEMO_GROUP)}


def default_pods() -> Path:
    return Path(str(resources.files("nri_framework.demos") / "pinner"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nri-resource-policy demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    others = demo_entry_points()
    default = DEFAULT_SCENARIO if DEFAULT_SCENARIO in others else "pinner"
    parser.add_argument("scenario", nargs="?", default=default, choices=["pinner", *sorted(others)])
    parser.add_argument("--cpus", type=int, default=8, help="CPUs of the simulated node (pinner)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.scenario != "pinner":
        run: Callable[[list[str]], int] = others[args.scenario].load()
        return run([args.scenario, *(["--keep"] if args.keep else [])])
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="nri-demo-"))
    try:
        checks = asyncio.run(run_demo(workdir, default_pods(), args.cpus))
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return finish(checks, started)


def finish(checks: Checks, started: float) -> int:
    """The demo's last line and exit status (non-zero when a check failed)."""
    took = time.monotonic() - started
    if checks.failed:
        print(f"\ndemo: {len(checks.failed)} check(s) FAILED: {'; '.join(checks.failed)}")
        return 1
    print(f"\ndemo: all {checks.passed} checks passed in {took:.1f}s")
    return 0

"""Benchmark: the balloons policy's CreateContainer decision and the plugin end to end.

Prints figures beside the targets; asserts nothing (with ``NRI_BENCH_OUT``
set they are also written there for ``report.py``).

* decision: ``PolicyHost.create_container`` with the balloons policy (type
  choice, fill chain, resize, pinning of every affected container) on the
  dual-socket Xeon 6776P topology with 500 running containers in 60 balloons,
  timed over create/remove cycles; the same at 16 (n4c16), 256 (Xeon) and
  4096 CPUs (s8c4k-like, every CPU online) to show how it grows;
* the cost of the durable save: the same decision with a state directory,
  where every decision is appended to the decision journal before it returns
  (and compacted into the snapshot off the reply path), beside the one
  without; and the CreateContainer round trip with ``--state-dir ''`` (no
  persistence) beside the default;
* end to end: the plugin process driven by the runtime simulator over a unix
  socket: CreateContainer round trip, Synchronize of 1000 containers, RSS, and
  a restart (SIGKILL, a new process reads the state dir and is synchronized).

    python tests/bench/bench_balloons.py [--cycles N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from _results import Figure, pct, show, write
from nri_balloons.plugin import Balloons
from nri_framework.host import PolicyHost
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, ScenarioPaths, plugin_command
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import N4C16, XEON_6776P, TopologySpec

S8C4K_FULL = TopologySpec(name="s8c4k-full", packages=8, cores_per_node=512, threads_per_core=1)

CONFIG = """
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata: {name: default, namespace: kube-system}
spec:
  reservedResources: {cpu: 1000m}
  allocatorTopologyBalancing: true
  balloonTypes:
  - name: grouped
    groupBy: ${pod/labels/grp}
    maxCPUs: 8
  - name: dedicated
    matchExpressions: [{key: qosclass, operator: In, values: [Guaranteed]}]
    preferNewBalloons: true
    preferSpreadingPods: true
"""


def pod(i: int, grp: int | None) -> Pod:
    labels = {"grp": f"g{grp}"} if grp is not None else {}
    return Pod(
        id=f"p{i}", name=f"p{i}", uid=f"u{i}", namespace="bench", labels=labels,
        cgroup_parent=f"/kubepods/burstable/pod{i}" if grp is not None else f"/kubepods/pod{i}",
    )  # fmt: skip


def burstable(i: int) -> Container:
    cpu = CpuResources(shares=204)  # 200m
    return Container(id=f"c{i}", pod_sandbox_id=f"p{i}", name="ctr", resources=Resources(cpu=cpu))


def guaranteed(i: int, n: int = 1) -> Container:
    cpu = CpuResources(shares=1024 * n, quota=100_000 * n, period=100_000)
    return Container(id=f"c{i}", pod_sandbox_id=f"p{i}", name="ctr", resources=Resources(cpu=cpu))


def host_for(root: Path, config: Path, state: Path | None = None) -> PolicyHost:
    return PolicyHost(
        "balloons",
        Balloons(),
        options={"config_file": str(config)},
        host_root=str(root),
        state_dir=state,
    )


def decision(
    spec: TopologySpec, existing: int, groups: int, cycles: int, *, durable: bool = False
) -> tuple[float, float]:
    """Seconds of ``create_container`` (p50, p99); ``durable``: with a state
    directory, in an event loop that runs the snapshots between decisions as
    the plugin's does."""
    return asyncio.run(_decision(spec, existing, groups, cycles, durable))


async def _decision(
    spec: TopologySpec, existing: int, groups: int, cycles: int, durable: bool
) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "host"
        write_topology(root, spec)
        config = Path(tmp) / "config.yaml"
        config.write_text(CONFIG)
        host = host_for(root, config, Path(tmp) / "state" if durable else None)
        host.synchronize([], [])
        for i in range(existing):
            host.create_container(pod(i, i % groups), burstable(i))
        await asyncio.sleep(0.1)  # the snapshot of the set-up
        times = []
        for k in range(cycles):
            i = 100_000 + k
            p, c = pod(i, None), guaranteed(i)
            t0 = time.perf_counter()
            host.create_container(p, c)
            times.append(time.perf_counter() - t0)
            host.stop_container(p, c)
            await asyncio.sleep(0)  # the loop turns between requests: compaction
        host.shutdown()
        return pct(times, 0.5), pct(times, 0.99)


async def end_to_end(
    creates: int, existing: int, sync_n: int, *, durable: bool = True
) -> dict[str, float]:
    """Round trips of CreateContainer (and, with ``sync_n``, a Synchronize);
    without ``durable`` the plugin runs with ``--state-dir ''``."""
    with tempfile.TemporaryDirectory(prefix="nri-bench-") as tmp:
        work = Path(tmp)
        host = work / "host"
        write_topology(host, XEON_6776P)
        config = work / "config.yaml"
        config.write_text(CONFIG)
        paths = ScenarioPaths(work, work / "nri.sock", host, work / "state")
        extra = ["--config-file", str(config)] + ([] if durable else ["--state-dir", ""])
        cmd = plugin_command("balloons", paths, extra, exit_on_disconnect=False)
        rt = SimulatedRuntime(paths.socket)
        await rt.start()
        plugin = await PluginProcess.launch(cmd)
        out: dict[str, float] = {}
        try:
            await rt.wait_plugins(1, 60)
            for i in range(existing):
                p = await rt.run_pod(pod(i, i % 60))
                c = await rt.create_container(p.id, burstable(i))
                await rt.start_container(c.id)
            base = len(rt.call_times("CreateContainer"))
            gpod = await rt.run_pod(pod(99_999, None))
            for k in range(creates):
                c = await rt.create_container(gpod.id, guaranteed(100_000 + k))
                await rt.stop_container(c.id)
                await rt.remove_container(c.id)
            times = rt.call_times("CreateContainer")[base:]
            out["rt_p50"], out["rt_p99"] = pct(times, 0.5), pct(times, 0.99)
            if not sync_n:
                return out
            # Synchronize: the runtime restarts holding sync_n containers
            for i in range(existing, sync_n):
                p = await rt.run_pod(pod(i, i % 60))
                c = await rt.create_container(p.id, burstable(i))
            await rt.stop()
            await rt.start()
            await rt.wait_plugins(1, 60)
            out["sync"] = rt.call_times("Synchronize")[-1]
            out["containers"] = len(rt.containers)
            status = Path(f"/proc/{plugin.proc.pid}/status").read_text()
            out["rss_mb"] = int(status.split("VmRSS:")[1].split()[0]) / 1024
            # restart: the plugin dies (SIGKILL) holding sync_n containers; a new
            # one starts, reads the state dir, registers and is synchronized
            plugin.kill()
            await plugin.stop()
            synced = len(rt.call_times("Synchronize"))
            t0 = time.perf_counter()
            plugin = await PluginProcess.launch(cmd)
            deadline = t0 + 60
            while len(rt.call_times("Synchronize")) <= synced:
                if time.perf_counter() > deadline:
                    raise TimeoutError("the restarted plugin was not synchronized in 60 s")
                await asyncio.sleep(0.001)
            out["restart"] = time.perf_counter() - t0
            out["restart_sync"] = rt.call_times("Synchronize")[-1]
        finally:
            await rt.stop()
            await plugin.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    rows: list[Figure] = []
    xeon = "6776P, 500 containers / 60 balloons"
    p50, p99 = decision(XEON_6776P, 500, 60, args.cycles)
    plain_p50 = p50
    rows.append(Figure("balloons.decision_p50", f"balloons decision p50, {xeon}", p50 * 1e3, "ms"))
    rows.append(
        Figure("balloons.decision_p99", f"balloons decision p99, {xeon}", p99 * 1e3, "ms", 2)
    )
    for spec, n in ((N4C16, 16), (XEON_6776P, 256), (S8C4K_FULL, 4096)):
        p50, _ = decision(spec, 40, 10, max(50, args.cycles // 3))
        rows.append(
            Figure(
                f"balloons.decision_p50_{n}cpus",
                f"decision p50 at {n} CPUs (40 containers)",
                p50 * 1e3,
                "ms",
                note="grows no faster than the CPU count",
            )
        )
    p50_j, p99_j = decision(XEON_6776P, 500, 60, args.cycles, durable=True)
    rows.append(
        Figure(
            "balloons.decision_p50_journal",
            f"balloons decision p50 with the decision journal, {xeon}",
            p50_j * 1e3,
            "ms",
            note=f"journal append: {(p50_j - plain_p50) * 1e6:+.0f} us",
        )
    )
    rows.append(
        Figure(
            "balloons.decision_p99_journal",
            f"balloons decision p99 with the decision journal, {xeon}",
            p99_j * 1e3,
            "ms",
            2,
        )
    )
    e2e = asyncio.run(end_to_end(args.cycles, 500, 1000))
    bare = asyncio.run(end_to_end(args.cycles, 500, 0, durable=False))
    sim = "through the simulator, 6776P"
    for q in ("p50", "p99"):
        rows.append(
            Figure(
                f"balloons.rt_{q}_no_state",
                f"balloons round trip {q} {sim}, --state-dir '' (no durable save)",
                bare[f"rt_{q}"] * 1e3,
                "ms",
                note=f"the durable save adds {(e2e[f'rt_{q}'] - bare[f'rt_{q}']) * 1e3:+.2f} ms",
            )
        )
    rows.append(
        Figure("balloons.rt_p50", f"balloons round trip p50 {sim}", e2e["rt_p50"] * 1e3, "ms")
    )
    rows.append(
        Figure("balloons.rt_p99", f"balloons round trip p99 {sim}", e2e["rt_p99"] * 1e3, "ms", 3)
    )
    n = int(e2e["containers"])
    rows.append(
        Figure(
            "balloons.sync_1000",
            f"balloons: Synchronize of {n} containers",
            e2e["sync"] * 1e3,
            "ms",
            500,
        )
    )
    rows.append(
        Figure(
            "balloons.restart_1000",
            f"balloons: restart with {n} containers, process start to synchronized",
            e2e["restart"] * 1e3,
            "ms",
            150,
            note=f"its Synchronize {e2e['restart_sync'] * 1e3:.1f} ms; the rest is the "
            "interpreter, imports, discovery and the state read",
        )
    )
    rows.append(Figure("balloons.plugin_rss", "balloons plugin RSS", e2e["rss_mb"], "MB", 80))
    show("balloons benchmark (plugin and policy; figures measured now)", rows)
    write("balloons", rows, "balloons policy and plugin")
    return 0


if __name__ == "__main__":
    sys.exit(main())

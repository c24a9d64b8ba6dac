"""Benchmark: the plugin process driven by the runtime simulator over a unix socket.

Prints figures; asserts nothing about speed (targets are printed beside the
measured values; with ``NRI_BENCH_OUT`` set they are also written there for
``report.py``). Topology: 256 CPUs; policy: the small ``pinner``.

* CreateContainer round trip as the runtime sees it (request written ->
  answer parsed), p50/p99, with 500 containers already running;
* Synchronize of 1000 containers (runtime restarts with them, the plugin
  reconnects): the Synchronize round trip.

    python tests/bench/bench_nri.py [--creates N] [--existing N] [--sync N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from _results import Figure, pct, show, write
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, ScenarioPaths, plugin_command
from nri_framework.simulate.sysfs import write_cpu_tree

NCPUS = 256


def shared(name: str) -> Container:
    return Container(id="", name=name, resources=Resources(cpu=CpuResources(shares=102)))


async def fill(rt: SimulatedRuntime, n: int, prefix: str) -> str:
    pod = await rt.run_pod(Pod(id="", name=f"{prefix}-pod", uid=f"{prefix}-uid", namespace="bench"))
    for i in range(n):
        c = await rt.create_container(pod.id, shared(f"{prefix}-{i}"))
        await rt.start_container(c.id)
    return pod.id


async def bench(creates: int, existing: int, sync_n: int) -> list[Figure]:
    rows: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="nri-bench-") as tmp:
        work = Path(tmp)
        host = work / "host"
        write_cpu_tree(host, NCPUS)
        paths = ScenarioPaths(work, work / "nri.sock", host, work / "state")
        rt = SimulatedRuntime(paths.socket)
        await rt.start()
        plugin = await PluginProcess.launch(
            plugin_command("pinner", paths, exit_on_disconnect=False)
        )
        try:
            await rt.wait_plugins(1, 30)
            pod_id = await fill(rt, existing, "existing")
            base = len(rt.call_times("CreateContainer"))
            for i in range(creates):
                c = await rt.create_container(pod_id, shared(f"timed-{i}"))
                await rt.remove_container(c.id)
            times = rt.call_times("CreateContainer")[base:]
            p50, p99 = pct(times, 0.50) * 1e6, pct(times, 0.99) * 1e6
            ctx = f"pinner, {len(times)} samples, {existing} containers running"
            rows.append(
                Figure(
                    "nri.create_rt_p50",
                    "pinner: CreateContainer round trip p50",
                    p50,
                    "us",
                    300,
                    ctx,
                )
            )
            rows.append(
                Figure(
                    "nri.create_rt_p99",
                    "pinner: CreateContainer round trip p99",
                    p99,
                    "us",
                    1000,
                    ctx,
                )
            )

            # Synchronize: the runtime restarts holding sync_n containers
            await fill(rt, sync_n - len(rt.containers), "sync")
            await rt.stop()
            await rt.start()
            await rt.wait_plugins(1, 30)
            sync = rt.call_times("Synchronize")[-1]
            n = len(rt.containers)
            rows.append(
                Figure(
                    "nri.sync_1000",
                    f"pinner: Synchronize of {n} containers",
                    sync * 1e3,
                    "ms",
                    150,
                    "pinner",
                )
            )
            mean = statistics.mean(times) * 1e6
            rows.append(
                Figure("nri.create_rt_mean", "pinner: CreateContainer round trip mean", mean, "us")
            )
        finally:
            await rt.stop()
            await plugin.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=2000)
    parser.add_argument("--existing", type=int, default=500)
    parser.add_argument("--sync", type=int, default=1000)
    args = parser.parse_args()
    rows = asyncio.run(bench(args.creates, args.existing, args.sync))
    show(f"NRI benchmark: pinner policy, {NCPUS}-CPU topology, plugin in its own process", rows)
    write("nri", rows, f"pinner policy, {NCPUS}-CPU topology, plugin in its own process")
    return 0


if __name__ == "__main__":
    sys.exit(main())

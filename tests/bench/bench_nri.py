"""Benchmark: the plugin process driven by the runtime simulator over a unix socket.

Prints figures; asserts nothing about speed (targets are printed beside the
measured values). Topology: 256 CPUs; policy: the small ``pinner``.

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

from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, ScenarioPaths, plugin_command
from nri_framework.simulate.sysfs import write_cpu_tree

NCPUS = 256


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def shared(name: str) -> Container:
    return Container(id="", name=name, resources=Resources(cpu=CpuResources(shares=102)))


async def fill(rt: SimulatedRuntime, n: int, prefix: str) -> str:
    pod = await rt.run_pod(Pod(id="", name=f"{prefix}-pod", uid=f"{prefix}-uid", namespace="bench"))
    for i in range(n):
        c = await rt.create_container(pod.id, shared(f"{prefix}-{i}"))
        await rt.start_container(c.id)
    return pod.id


async def bench(creates: int, existing: int, sync_n: int) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
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
            rows.append(("CreateContainer round trip p50", f"{p50:.0f} us", "<= 300 us"))
            rows.append(("CreateContainer round trip p99", f"{p99:.0f} us", "<= 1000 us"))
            rows.append(("  (samples, existing containers)", f"{len(times)}, {existing}", ""))

            # Synchronize: the runtime restarts holding sync_n containers
            await fill(rt, sync_n - len(rt.containers), "sync")
            await rt.stop()
            await rt.start()
            await rt.wait_plugins(1, 30)
            sync = rt.call_times("Synchronize")[-1]
            rows.append(
                (
                    f"Synchronize of {len(rt.containers)} containers",
                    f"{sync * 1e3:.1f} ms",
                    "<= 150 ms",
                )
            )
            rows.append(("  CreateContainer mean", f"{statistics.mean(times) * 1e6:.0f} us", ""))
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
    print(f"\nNRI benchmark: pinner policy, {NCPUS}-CPU topology, plugin in its own process")
    width = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(width)}  {'measured':>14}  target")
    for name, value, target in rows:
        print(f"{name.ljust(width)}  {value:>14}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

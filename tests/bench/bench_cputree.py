"""Benchmark: the balloons CPU tree allocator (``CpuTreeAllocator.resize``).

Prints figures; asserts nothing about speed (with ``NRI_BENCH_OUT`` set they
are also written there for ``report.py``). Target: a resize decision of about
1 ms at 256 CPUs, growing no faster than the CPU count.

Machines: ``n4c16`` (16 CPUs), the dual-socket Xeon 6776P (256 CPUs) and an
``s8c4k``-like machine with every CPU online (8 packages x 512 cores = 4096 CPUs),
each written as a sysfs tree and discovered. For each machine and allocator mode,
a quarter of the CPUs is first handed out to 2-CPU balloons, then we time:

* ``+2 new``: a new balloon takes 2 CPUs;
* ``+2 grow``: an existing balloon grows by 2;
* ``-2``: it shrinks back by 2.

    python tests/bench/bench_cputree.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
for _p in ("framework", "policies/balloons"):
    if str(_REPO / _p) not in sys.path:
        sys.path.insert(0, str(_REPO / _p))

from _results import Figure, write  # noqa: E402
from nri_balloons.cputree import CpuTreeAllocator  # noqa: E402
from nri_framework.simulate.sysfs import write_topology  # noqa: E402
from nri_framework.simulate.topologies import N4C16, XEON_6776P, TopologySpec  # noqa: E402
from nri_framework.topology import Topology  # noqa: E402

S8C4K_FULL = TopologySpec(name="s8c4k-full", packages=8, cores_per_node=512, threads_per_core=1)

MODES = {  # name -> (allocatorTopologyBalancing, preferSpreadOnPhysicalCores)
    "balancing": (True, False),
    "packing": (False, False),
    "spread": (True, True),
}


def allocator(topo: Topology, mode: tuple[bool, bool]) -> CpuTreeAllocator:
    return CpuTreeAllocator(
        topo, topology_balancing=mode[0], prefer_spread_on_physical_cores=mode[1]
    )


def _p50_p99(samples: list[float]) -> tuple[float, float]:
    """Microseconds."""
    samples = sorted(samples)
    p50 = statistics.median(samples) * 1e6
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e6
    return p50, p99


def bench(topo: Topology, mode: tuple[bool, bool], rounds: int) -> dict[str, list[float]]:
    free = topo.online
    balloons: list[int] = []
    while free.bit_count() > topo.online.bit_count() * 3 // 4:
        got = allocator(topo, mode).resize(0, free, 2)
        free &= ~got
        balloons.append(got)
    times: dict[str, list[float]] = {"+2 new": [], "+2 grow": [], "-2": []}
    alloc = allocator(topo, mode)
    for i in range(rounds):
        t0 = time.perf_counter()
        new = alloc.resize(0, free, 2)
        times["+2 new"].append(time.perf_counter() - t0)
        cur = balloons[i % len(balloons)]
        t0 = time.perf_counter()
        grow = alloc.resize(cur, free, 2)
        times["+2 grow"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        alloc.resize(cur | grow, free & ~grow, -2)
        times["-2"].append(time.perf_counter() - t0)
        assert new.bit_count() == grow.bit_count() == 2
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    worst: dict[int, tuple[float, float]] = {}  # CPUs -> worst (p50, p99) over modes and ops
    with tempfile.TemporaryDirectory(prefix="bench-cputree-") as tmp:
        for spec in (N4C16, XEON_6776P, S8C4K_FULL):
            t0 = time.perf_counter()
            topo = Topology.from_sysfs(write_topology(Path(tmp) / spec.name, spec))
            setup = time.perf_counter() - t0
            ncpus = topo.online.bit_count()
            print(f"{spec.name}: {ncpus} CPUs (sysfs written and discovered in {setup:.1f} s)")
            rounds = args.rounds if ncpus < 1000 else max(20, args.rounds // 5)
            for name, mode in MODES.items():
                allocator(topo, mode)  # build the (cached) tree outside timing
                for what, samples in bench(topo, mode, rounds).items():
                    p50, p99 = _p50_p99(samples)
                    print(f"  {name:9s} {what:8s} p50 {p50:8.0f} us  p99 {p99:8.0f} us")
                    w50, w99 = worst.get(ncpus, (0.0, 0.0))
                    worst[ncpus] = (max(w50, p50), max(w99, p99))
    print("target: ~1000 us at 256 CPUs, growing no faster than the CPU count")
    figures = [
        Figure(f"cputree.resize_p50_{n}cpus", f"resize p50 at {n} CPUs (worst mode/op)", w50, "us")
        for n, (w50, _) in sorted(worst.items())
    ]
    if 256 in worst:
        figures.append(
            Figure(
                "cputree.resize_p50_256cpus_target",
                "CPU tree resize p50 at 256 CPUs (worst mode/op)",
                worst[256][0],
                "us",
                1000,
                f"p99 {worst[256][1]:.0f} us",
            )
        )
    if 256 in worst and 4096 in worst:
        figures.append(
            Figure(
                "cputree.growth_4096_vs_256",
                "resize p50 growth 256 -> 4096 CPUs (CPU count grows 16x)",
                worst[4096][0] / worst[256][0],
                "x",
                16,
            )
        )
    write("cputree", figures, "CpuTreeAllocator.resize, n4c16 / Xeon 6776P / s8c4k-like")


if __name__ == "__main__":
    main()

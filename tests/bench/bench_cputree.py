"""Benchmark: the balloons CPU tree allocator (``CpuTreeAllocator.resize``).

Prints figures; asserts nothing about speed. Target: a resize decision of about
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

from nri_balloons.cputree import CpuTreeAllocator  # noqa: E402
from nri_framework.simulate.sysfs import N4C16, XEON_6776P, TopologySpec, write_topology  # noqa: E402
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


def _us(samples: list[float]) -> str:
    samples = sorted(samples)
    p50 = statistics.median(samples) * 1e6
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e6
    return f"p50 {p50:8.0f} us  p99 {p99:8.0f} us"


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
                    print(f"  {name:9s} {what:8s} {_us(samples)}")
    print("target: ~1000 us at 256 CPUs, growing no faster than the CPU count")


if __name__ == "__main__":
    main()

"""Benchmark: the SST helper process (sim backend, Xeon 6776P) over an ipc socket.

Prints figures; asserts nothing about speed (targets are printed beside the
measured values):

* helper round trip (GetClosConfig, the smallest request that reaches the
  backend) as the asyncio client sees it, p50/p99 (target p50 <= 150 us);
* AssociateCpus of all 256 CPUs to one CLOS, p50 (target <= 5 ms);
* helper RSS after the run (target <= 35 MB).

    python tests/bench/bench_sst.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nri_framework.simulate.sysfs import write_topology
from nri_sst import messages as m
from nri_sst.client import HelperClient, SyncHelperClient


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(endpoint: str, rounds: int) -> tuple[list[float], list[float]]:
    async with HelperClient(endpoint, timeout=2.0) as c:
        await c.call(m.Hello(protocol=1), m.HelloReply)
        await c.call(m.PrepareManagedMode(), m.PrepareManagedModeReply)
        await c.call(m.EnableCP(), m.EnableCPReply)
        rt: list[float] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            await c.call(m.GetClosConfig(clos=0), m.GetClosConfigReply)
            rt.append(time.perf_counter() - t0)
        assoc: list[float] = []
        cpus = list(range(256))
        for i in range(max(rounds // 20, 20)):
            t0 = time.perf_counter()
            await c.call(m.AssociateCpus(clos=3 if i % 2 else 0, cpus=cpus), m.AssociateCpusReply)
            assoc.append(time.perf_counter() - t0)
        await c.call(m.Teardown(), m.TeardownReply)
        return rt, assoc


def measure_sync(endpoint: str, rounds: int) -> list[float]:
    """The blocking client, as the plugin's cpuClass commits use it."""
    c = SyncHelperClient(endpoint, timeout=2.0)
    try:
        c.call(m.Hello(protocol=1), m.HelloReply)
        rt: list[float] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            c.call(m.GetClosConfig(clos=0), m.GetClosConfigReply)
            rt.append(time.perf_counter() - t0)
        return rt
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--state-file", action="store_true", help="persist sim state (JSON) too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = write_topology(Path(tmp) / "host", "xeon-6776p")
        sock = Path(tmp) / "helper.sock"
        cmd = [
            sys.executable,
            "-m",
            "nri_sst.cli",
            "serve",
            "--socket",
            f"ipc://{sock}",
            "--backend",
            "sim",
            "--host-root",
            str(root),
        ]
        if args.state_file:
            cmd += ["--sim-state", str(Path(tmp) / "sim.json")]
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            rt, assoc = asyncio.run(measure(f"ipc://{sock}", args.rounds))
            rt_sync = measure_sync(f"ipc://{sock}", args.rounds)
            rss = rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    state = "with" if args.state_file else "without"
    print(f"sst helper (sim backend, xeon-6776p, {state} --sim-state)")
    print(
        f"  round trip, blocking client p50 {pct(rt_sync, 0.5) * 1e6:6.0f} us  "
        f"p99 {pct(rt_sync, 0.99) * 1e6:7.0f} us   (target p50 <= 150 us, n={len(rt_sync)})"
    )
    print(
        f"  round trip, asyncio client  p50 {pct(rt, 0.5) * 1e6:6.0f} us  "
        f"p99 {pct(rt, 0.99) * 1e6:7.0f} us   (n={len(rt)})"
    )
    print(
        f"  AssociateCpus 256 CPUs     p50 {pct(assoc, 0.5) * 1e3:7.2f} ms  "
        f"p99 {pct(assoc, 0.99) * 1e3:7.2f} ms   (target <= 5 ms, n={len(assoc)})"
    )
    print(f"  helper RSS                 {rss:7.1f} MB                  (target <= 35 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

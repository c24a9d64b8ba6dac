"""Benchmark: the SST helper process (sim backend, Xeon 6776P) over an ipc socket.

Prints figures; asserts nothing about speed (targets are printed beside the
measured values; with ``NRI_BENCH_OUT`` set they are also written there for
``report.py``):

* helper round trip (GetClosConfig, the smallest request that reaches the
  backend) as the asyncio client sees it, p50/p99 (target p50 <= 150 us);
* AssociateCpus of all 256 CPUs to one CLOS, p50 (target <= 5 ms);
* helper RSS after the run (target <= 35 MB);
* the blocking client's round trip while six hostile clients flood the helper
  for a bounded time (``tests/integration/nri_sst/hostile.py``: garbage,
  1 MiB payloads, endless and many-frame messages, unread replies, connection
  churn), p50/p99 (target p99 <= 10 ms), and the helper's peak RSS after it.

    python tests/bench/bench_sst.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# hostile.py, the flood of the helper's integration tests, lives beside them
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "nri_sst"))

import hostile
import zmq
from _results import Figure, pct, show, write
from nri_framework.simulate.sysfs import write_topology
from nri_sst import messages as m
from nri_sst.client import HelperClient, SyncHelperClient


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure_flood(sock: Path, seconds: float) -> list[float]:
    """The blocking client's GetClosConfig round trips during a bounded flood."""
    with hostile.flood(sock, hostile.FLOOD, seconds) as f:
        hostile.connections(f, hostile.CONNECTED)
        return hostile.latencies(f"ipc://{sock}", until=lambda: f.poll() is not None)


@dataclass(frozen=True)
class Measure:
    """One request type timed over the asyncio client, in PCT managed mode.

    The rows of the report are these: a later PCT path (ConfigureClos, a
    whole class change) is one more entry of :data:`MEASURES`."""

    key: str
    name: str
    request: Callable[[int], m.Request]
    """The ``i``-th request."""
    reply: type[m.Reply]
    unit: str
    """``us`` or ``ms``"""
    share: int = 1
    """Rounds = ``--rounds`` // share (at least 20)."""
    p50_target: float | None = None


ALL_CPUS = list(range(256))
MEASURES = [
    Measure(
        "rt_async",
        "round trip, asyncio client (GetClosConfig)",
        lambda i: m.GetClosConfig(clos=0),
        m.GetClosConfigReply,
        "us",
    ),
    Measure(
        "associate_256",
        "AssociateCpus of 256 CPUs (sim)",
        lambda i: m.AssociateCpus(clos=3 if i % 2 else 0, cpus=ALL_CPUS),
        m.AssociateCpusReply,
        "ms",
        share=20,
        p50_target=5,
    ),
]
SCALE = {"us": 1e6, "ms": 1e3}


async def measure(endpoint: str, rounds: int) -> dict[str, list[float]]:
    """Samples (seconds) of every :data:`MEASURES` entry, by key."""
    async with HelperClient(endpoint, timeout=2.0) as c:
        await c.call(m.Hello(protocol=1), m.HelloReply)
        await c.call(m.PrepareManagedMode(), m.PrepareManagedModeReply)
        await c.call(m.EnableCP(), m.EnableCPReply)
        out: dict[str, list[float]] = {}
        for what in MEASURES:
            samples = out[what.key] = []
            for i in range(max(rounds // what.share, 20)):
                req = what.request(i)
                t0 = time.perf_counter()
                await c.call(req, what.reply)
                samples.append(time.perf_counter() - t0)
        await c.call(m.Teardown(), m.TeardownReply)
        return out


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


ECHO = """
import sys, zmq
s = zmq.Context.instance().socket(zmq.ROUTER)
s.bind(sys.argv[1])
while True:
    f = s.recv_multipart()
    s.send_multipart(f)
    if f[-1] == b"stop":
        break
"""


def measure_floor(tmp: Path, rounds: int) -> list[float]:
    """The same exchange with a bare pyzmq ROUTER that echoes: the floor this
    machine puts under any helper round trip (context, not a target)."""
    endpoint = f"ipc://{tmp / 'echo.sock'}"
    proc = subprocess.Popen([sys.executable, "-c", ECHO, endpoint])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        frames = [b"", b"12345678", m.encode(m.GetClosConfig(clos=0))]
        sock.send_multipart(frames)
        sock.recv_multipart()  # connected
        rt: list[float] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            sock.send_multipart(frames)
            sock.recv_multipart()
            rt.append(time.perf_counter() - t0)
        sock.send_multipart([b"", b"", b"stop"])
        sock.recv_multipart()
        return rt
    finally:
        sock.close(0)
        proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--state-file", action="store_true", help="persist sim state (JSON) too")
    ap.add_argument("--flood-seconds", type=float, default=5.0, help="length of the flood")
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
            timed = asyncio.run(measure(f"ipc://{sock}", args.rounds))
            rt_sync = measure_sync(f"ipc://{sock}", args.rounds)
            floor = measure_floor(Path(tmp), args.rounds)
            rss = rss_mb(proc.pid)
            flooded = measure_flood(sock, args.flood_seconds)
            flood_rss = rss_mb(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(10)
    state = "with" if args.state_file else "without"
    figures = [
        Figure(
            "sst.zmq_floor_p50",
            "bare pyzmq ipc echo round trip p50 (this machine's floor)",
            pct(floor, 0.5) * 1e6,
            "us",
            note="context",
        ),
        Figure(
            "sst.rt_sync_p50",
            "helper round trip p50, blocking client (the plugin's path), ipc",
            pct(rt_sync, 0.5) * 1e6,
            "us",
            150,
            f"n={len(rt_sync)}",
        ),
        Figure(
            "sst.rt_sync_p99",
            "helper round trip p99, blocking client",
            pct(rt_sync, 0.99) * 1e6,
            "us",
        ),
    ]
    for what in MEASURES:
        samples, scale = timed[what.key], SCALE[what.unit]
        for q, target in ((0.5, what.p50_target), (0.99, None)):
            figures.append(
                Figure(
                    f"sst.{what.key}_p{int(q * 100)}",
                    f"{what.name} p{int(q * 100)}",
                    pct(samples, q) * scale,
                    what.unit,
                    target,
                    f"n={len(samples)}",
                )
            )
    figures.append(Figure("sst.helper_rss", "helper RSS", rss, "MB", 35))
    n = f"n={len(flooded)}, 6 hostile clients, {args.flood_seconds:g} s"
    figures += [
        Figure(
            "sst.flood_rt_p50",
            "helper round trip p50 during a flood, blocking client",
            pct(flooded, 0.5) * 1e3,
            "ms",
            note=n,
        ),
        Figure(
            "sst.flood_rt_p99",
            "helper round trip p99 during a flood, blocking client",
            pct(flooded, 0.99) * 1e3,
            "ms",
            10,
            n,
        ),
        Figure(
            "sst.flood_rss_peak", "helper peak RSS (VmHWM) after the flood", flood_rss, "MB", 40
        ),
    ]
    show(f"sst helper (sim backend, xeon-6776p, {state} --sim-state)", figures)
    write("sst", figures, f"sst helper, sim backend, xeon-6776p, {state} --sim-state")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: our balloons plugin beside the Go floor, through an independent Go NRI runtime peer.

The peer (``tests/bench/go/peer``, on containerd/nri 0.6.1's ``pkg/adaptation``,
the runtime side containerd uses) and the floor (``tests/bench/go/floor``, a
trivial plugin on NRI's stub that pins every container to fixed CPUs) are
built offline from Debian trixie's packages (``gopeer_build.py``; cached).
In one run the peer drives the same scenario, in turn, against:

* the floor;
* ``nri-resource-policy run --policy balloons`` with the spec's BalloonsPolicy
  (``examples/pct-managed``, without its debug logging) on a 6776P sysfs tree
  (``write_topology``), without an SST helper (PCT fields ignored);
* the same with the sim SST helper (``nri-sst-helper serve --backend sim``):
  PCT on the HP pods' reply path.

That turn is taken :data:`RUNS` times (floor, ours, PCT, floor, ours, PCT,
...), and each figure of each of the three is the median of its runs'
(:func:`median_runs`): one noisy run on a shared 2-core VM, or a stretch of
load that falls on one program's run and not on the other's, does not move a
ratio; the ratios compare runs taken side by side.

Scenario (per count N of running burstable containers in the default balloon,
N = 0, 100, 500, 1000, Synchronize'd at registration): HP pods (2 CPUs,
hp-bln) and LP pods (4 CPUs, lp-bln) created, started, updated, stopped and
removed ``--cycles`` times each; at N = 1000 the plugin is restarted (to
registered and synchronized again, its state directory kept).

Figures are ratios to the floor per issue #14 (``Figure.relative``); printed,
written for ``report.py`` with ``NRI_BENCH_OUT``; nothing is asserted on time.
When the Go programs cannot be fetched or built: ``_tier.unavailable``
(a loud skip; a failure under ``CI=true`` or ``NRI_BENCH_REQUIRED=1``).

    python tests/bench/bench_floor.py [--cycles N] [--running 0,100,500,1000]
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import functools
import importlib.util
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import pytest
import yaml

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from _results import Figure, show, write  # noqa: E402
from _tier import required, unavailable  # noqa: E402
from bench_pct import memory_dir, start_helper  # noqa: E402
from gopeer_build import GoBuildError, build, stamp  # noqa: E402
from nri_balloons_demo.data import pods_dir  # noqa: E402
from nri_framework.simulate.scenario import ScenarioPaths, plugin_command, plugin_env  # noqa: E402
from nri_framework.simulate.sysfs import write_topology  # noqa: E402
from nri_framework.simulate.topologies import XEON_6776P  # noqa: E402

BENCH = "floor"
RUNNING = (0, 100, 500, 1000)
#: counts with a create/remove/update target (the issue's)
TARGETED = (0, 500, 1000)
#: HP and LP pods per round, each (three turns take about 65 s at 600 on
#: CI's 2 cores): a p99 of 100 samples is their largest or second largest,
#: one stall of a shared VM; of the HP creates alone (the PCT target), 300
#: made it the third largest, 600 the sixth
CYCLES, CI_CYCLES = 600, 600
#: turns of floor, ours and PCT in a run (each figure the median of its runs)
RUNS = 3


class Stats(msgspec.Struct, frozen=True):
    count: int
    p50_ms: float
    p99_ms: float
    #: the three largest samples, largest first (a p99 of 100 is one or two of them)
    slowest_ms: list[float] = []


class Round(msgspec.Struct, frozen=True):
    """What the peer measured at one count of running containers."""

    running: int
    registered_ms: float
    synchronize_ms: float
    requests: dict[str, Stats]
    plugin_rss_mb: float
    #: timed creates whose reply set no CPUs: the runtime answered them alone
    unadjusted_creates: int = 0
    restart_ms: float | None = None
    restart_synchronize_ms: float | None = None
    #: each restart's figure (``restart_ms`` is their median)
    restarts_ms: list[float] = []


class PeerResult(msgspec.Struct, frozen=True):
    """The peer's stdout document."""

    peer: str
    cycles: int
    rounds: list[Round]

    def at(self, running: int) -> Round:
        for r in self.rounds:
            if r.running == running:
                return r
        raise KeyError(f"the peer measured no round with {running} running containers")


def parse(stdout: bytes) -> PeerResult:
    """The peer's document; ``msgspec.ValidationError`` (or DecodeError) when malformed."""
    return msgspec.json.decode(stdout, type=PeerResult)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _slowest(samples: list[float]) -> list[float]:
    return sorted(samples, reverse=True)[:3]


def _median_round(rounds: list[Round]) -> Round:
    """One round's figures, each the median of ``rounds``' (same running
    count); the restart is the median of every run's restarts."""
    kinds = set.intersection(*(set(r.requests) for r in rounds))
    restarts = [ms for r in rounds for ms in r.restarts_ms] or [
        r.restart_ms for r in rounds if r.restart_ms is not None
    ]
    syncs = [r.restart_synchronize_ms for r in rounds if r.restart_synchronize_ms is not None]
    return Round(
        running=rounds[0].running,
        registered_ms=_median([r.registered_ms for r in rounds]),
        synchronize_ms=_median([r.synchronize_ms for r in rounds]),
        requests={
            k: Stats(
                count=sum(r.requests[k].count for r in rounds),
                p50_ms=_median([r.requests[k].p50_ms for r in rounds]),
                p99_ms=_median([r.requests[k].p99_ms for r in rounds]),
                slowest_ms=_slowest([ms for r in rounds for ms in r.requests[k].slowest_ms]),
            )
            for k in sorted(kinds)
        },
        plugin_rss_mb=_median([r.plugin_rss_mb for r in rounds]),
        # any run whose plugin was off the path makes the round not measured
        unadjusted_creates=max(r.unadjusted_creates for r in rounds),
        restart_ms=_median(restarts) if restarts else None,
        restart_synchronize_ms=_median(syncs) if syncs else None,
        restarts_ms=[ms for r in rounds for ms in r.restarts_ms],
    )


def median_runs(runs: list[PeerResult]) -> PeerResult:
    """One program's figures: each the median of ``runs``' (the program's
    runs), at every running count all runs measured. A median, not a minimum:
    a minimum would pick the luckiest run and a mean would carry the noisiest
    one."""
    if not runs:
        raise ValueError("no run to take a median of")
    counts = [r.running for r in runs[0].rounds if all(_has(run, r.running) for run in runs)]
    return PeerResult(
        peer=runs[0].peer,
        cycles=sum(run.cycles for run in runs),
        rounds=[_median_round([run.at(n) for run in runs]) for n in counts],
    )


def _has(result: PeerResult, running: int) -> bool:
    return any(r.running == running for r in result.rounds)


def _ratio(
    targeted: bool, key: str, name: str, value: float, base: float, multiple: float,
    base_name: str = "floor", note: str = "",
) -> Figure:  # fmt: skip
    """A figure in ms beside ``base``: its target ``multiple`` times it when ``targeted``."""
    if targeted:
        return Figure.relative(key, name, value, "ms", base, multiple, base_name, note)
    return Figure(key, name, value, "ms", note=note, base=base, base_name=base_name)


def _ms_list(samples: list[float]) -> str:
    """``2.1/0.9/0.8 ms``: a p99's outliers for people."""
    return "/".join(f"{ms:.2g}" for ms in samples) + " ms" if samples else "-"


#: the figures a round's requests make (its Synchronize, RSS and restart are
#: measured apart, and stay)
REQUEST_FIGURES = ("floor.create_", "floor.remove_", "floor.update_", "floor.pct_")


def off_path(plugin: PeerResult, what: str) -> dict[int, str]:
    """running count -> why that round's request figures of ``plugin`` are not
    a plugin's: some of its timed creates came back without a CPU set (the
    peer counts them), so the runtime answered them alone (NRI's adaptation
    closes a plugin on a fatal error and goes on without it). Seen once in
    CI, at 1000 running, after the round's Synchronize."""
    out = {}
    for r in plugin.rounds:
        if r.unadjusted_creates:
            total = r.requests["create"].count
            out[r.running] = (
                f"NOT MEASURED: {what} was off the request path at {r.running} running "
                f"({r.unadjusted_creates} of {total} creates came back without its CPU set)"
            )
    return out


def not_measured(rows: list[Figure], why: dict[int, str]) -> list[Figure]:
    """``rows`` with each request figure of a round in ``why`` made infinite (over
    any target) and saying why, instead of a number no plugin produced."""
    out = []
    for f in rows:
        n = f.key.rsplit("_", 1)[-1]
        reason = why.get(int(n)) if n.isdigit() and f.key.startswith(REQUEST_FIGURES) else None
        if f.key == "floor.create_p50_growth" and why:
            reason = next(iter(why.values()))
        out.append(dataclasses.replace(f, value=math.inf, note=reason) if reason else f)
    return out


def figures(
    floor: PeerResult, ours: PeerResult, pct: PeerResult, helper_rss: float
) -> list[Figure]:
    """Issue #14's targets, each as a ratio to the floor (or to its own base);
    the counts outside :data:`TARGETED` are context (a ratio, no target). A
    round whose plugin was off the request path is reported as not measured."""
    why = (
        off_path(floor, "the trivial Go plugin (the floor)")
        | off_path(ours, "the plugin")
        | off_path(pct, "the PCT plugin")
    )
    for reason in why.values():
        print(reason, file=sys.stderr)
    return not_measured(_figures(floor, ours, pct, helper_rss), why)


def _figures(
    floor: PeerResult, ours: PeerResult, pct: PeerResult, helper_rss: float
) -> list[Figure]:
    rows: list[Figure] = []
    counts = [r.running for r in ours.rounds]
    for n in counts:
        f, o = floor.at(n), ours.at(n)
        ratio = functools.partial(_ratio, n in TARGETED)
        create, fcreate = o.requests["create"], f.requests["create"]
        name = f"balloons CreateContainer {{}}, {n} running"
        rows.append(ratio(f"floor.create_p50_{n}", name.format("p50"), create.p50_ms,
                          fcreate.p50_ms, 3))  # fmt: skip
        rows.append(ratio(f"floor.create_p99_{n}", name.format("p99"), create.p99_ms,
                          fcreate.p99_ms, 3))  # fmt: skip
        for kind in ("remove", "update"):
            value, base = o.requests[kind].p99_ms, f.requests[kind].p99_ms
            name = f"balloons {kind.capitalize()}Container p99, {n} running"
            rows.append(ratio(f"floor.{kind}_p99_{n}", name, value, base, 2))
        rows.append(
            Figure(
                f"floor.sync_{n}",
                f"balloons Synchronize of {n} containers",
                o.synchronize_ms,
                "ms",
                60 if n == 1000 else None,
                base=f.synchronize_ms,
                base_name="floor",
            )
        )
        hp_pct, hp = pct.at(n).requests["create_hp"], o.requests["create_hp"]
        rows.append(
            ratio(
                f"floor.pct_hp_create_p99_{n}",
                f"HP CreateContainer p99 with PCT (sim helper), {n} running",
                hp_pct.p99_ms,
                hp.p99_ms,
                1.5,
                "no PCT",
                note=f"slowest {_ms_list(hp_pct.slowest_ms)}, no PCT {_ms_list(hp.slowest_ms)}",
            )
        )
        start_pct = pct.at(n).requests["start_hp"]
        rows.append(
            Figure(
                f"floor.pct_hp_start_p99_{n}",
                f"HP StartContainer p99 with PCT (answered after the create's commit), {n} running",
                start_pct.p99_ms,
                "ms",
                note=f"p50 {start_pct.p50_ms:.2g} ms; without a helper it is not subscribed to",
            )
        )
        rows.append(
            Figure(
                f"floor.pct_lp_create_p50_{n}",
                f"LP CreateContainer p50 with PCT, {n} running",
                pct.at(n).requests["create_lp"].p50_ms,
                "ms",
                base=o.requests["create_lp"].p50_ms,
                base_name="no PCT",
            )
        )
    lo, hi = ours.at(min(counts)), ours.at(max(counts))
    rows.append(
        Figure.relative(
            "floor.create_p50_growth",
            f"balloons CreateContainer p50 at {hi.running} running vs at {lo.running}",
            hi.requests["create"].p50_ms,
            "ms",
            lo.requests["create"].p50_ms,
            1.25,
            f"p50 at {lo.running}",
        )
    )
    fhi = floor.at(hi.running)
    if hi.restart_ms is not None:
        times = sorted(hi.restarts_ms)
        each = ", ".join(f"{ms:.0f}" for ms in times)
        if len(times) > 5:  # one run's each, the runs' range
            each = f"{times[0]:.0f}-{times[-1]:.0f}"
        rows.append(
            Figure(
                f"floor.restart_{hi.running}",
                f"balloons restart with {hi.running} containers to registered + synchronized"
                + (f" (median of {len(hi.restarts_ms)})" if len(hi.restarts_ms) > 1 else ""),
                hi.restart_ms,
                "ms",
                150,
                note="process start, state load, registration, Synchronize"
                + (f"; {'each' if len(times) <= 5 else 'range'}: {each} ms" if each else ""),
                base=fhi.restart_ms,
                base_name="floor",
            )
        )
    rows.append(
        Figure(
            f"floor.plugin_rss_{hi.running}",
            f"balloons plugin RSS at {hi.running} containers",
            hi.plugin_rss_mb,
            "MB",
            60,
            base=fhi.plugin_rss_mb,
            base_name="floor",
        )
    )
    rows.append(Figure("floor.helper_rss", "SST helper (sim) RSS after the PCT run",
                       helper_rss, "MB", 30))  # fmt: skip
    return rows


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def spec_config(path: Path) -> Path:
    """The spec's BalloonsPolicy without its debug logging (the bench times replies)."""
    doc = yaml.safe_load((pods_dir() / "balloons-pct-managed.yaml").read_text())
    doc["spec"].pop("log", None)
    path.write_text(yaml.safe_dump(doc))
    return path


def drive(peer: Path, work: Path, plugin: list[str], running: str, cycles: int) -> PeerResult:
    """One peer run against ``plugin`` (its command; ``{running}`` per round)."""
    cmd = [str(peer), "-socket", str(work / "nri.sock"), "-running", running,
           "-cycles", str(cycles), "-plugin-log", str(work / "plugin.log"),
           "--", *plugin]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, env=plugin_env(), timeout=600, check=False)
    if proc.returncode != 0:
        log = (work / "plugin.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(
            f"the peer failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-2000:]}"
            f"\nplugin log tail:\n{log}"
        )
    result = parse(proc.stdout)
    if off_path(result, "the plugin"):
        # what NRI's adaptation said (it logs why it closed a plugin) and the
        # plugin's last lines: the evidence of a round the runtime answered alone
        log = (work / "plugin.log").read_text(errors="replace")[-3000:]
        print(f"peer stderr:\n{proc.stderr.decode(errors='replace')[-3000:]}", file=sys.stderr)
        print(f"plugin log tail ({work.name}):\n{log}", file=sys.stderr)
    return result


#: the packages a plugin process imports from this checkout
PACKAGES = ("nri_framework", "nri_balloons", "nri_sst")


def ship_bytecode() -> None:
    """Our packages' ``.pyc`` files, as a wheel install has them (pip compiles
    on install; CI's bench env installs the wheel): an editable install under
    ``PYTHONDONTWRITEBYTECODE=1`` has none, and every plugin process, the
    restart timed at N = 1000 among them, would compile each module (about
    110 ms) that a shipped plugin never does."""
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            if not compileall.compile_dir(location, quiet=1):
                raise RuntimeError(f"cannot compile {name} in {location}")


def run(bins: dict[str, Path], running: str, cycles: int) -> list[Figure]:
    ship_bytecode()
    with tempfile.TemporaryDirectory(prefix="nri-bench-floor-", dir=memory_dir()) as tmp:
        work = Path(tmp)
        host = write_topology(work / "host", XEON_6776P)
        config = spec_config(work / "config.yaml")
        runs: dict[str, list[PeerResult]] = {"floor": [], "ours": [], "pct": []}
        t0 = time.monotonic()
        endpoint, helper = start_helper(work, host)
        plugins: dict[str, list[str]] = {"ours": [], "pct": ["--sst-helper", endpoint]}
        try:
            for turn in range(RUNS):
                d = work / f"floor-{turn}"
                d.mkdir()
                cmd = [str(bins["floor"]), "-nri-socket", str(d / "nri.sock")]
                runs["floor"].append(drive(bins["peer"], d, cmd, running, cycles))
                for name, extra in plugins.items():
                    d = work / f"{name}-{turn}"
                    d.mkdir()
                    paths = ScenarioPaths(d, d / "nri.sock", host, d / "state-{running}")
                    cmd = plugin_command("balloons", paths, ["--config-file", str(config), *extra])
                    runs[name].append(drive(bins["peer"], d, cmd, running, cycles))
            helper_rss = rss_mb(helper.pid)
        finally:
            helper.terminate()
            helper.wait(10)
        print(f"peer runs: {time.monotonic() - t0:.0f} s ({RUNS} turns of floor, ours, PCT)")
    median = {name: median_runs(each) for name, each in runs.items()}
    return figures(median["floor"], median["ours"], median["pct"], helper_rss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ci = required()
    parser.add_argument("--cycles", type=int, default=CI_CYCLES if ci else CYCLES)
    parser.add_argument("--running", default=",".join(map(str, RUNNING)))
    args = parser.parse_args()
    try:
        bins = build()
    except GoBuildError as e:
        try:
            unavailable("bench-floor", f"the Go peer and floor: {e}", "NRI_BENCH_REQUIRED")
        except pytest.skip.Exception as skip:
            write(BENCH, [], "balloons beside the Go floor", skipped=str(skip))
            return 0
        except pytest.fail.Exception:
            return 1
    built = stamp(bins)
    print(
        f"Go peer and floor: {built['go']}, packages {built['packages']}; "
        f"{args.cycles} HP + {args.cycles} LP pods per round, running: {args.running}"
    )
    rows = run(bins, args.running, args.cycles)
    show("balloons beside the Go floor, through the Go NRI 0.6.1 runtime peer (6776P)", rows)
    write(BENCH, rows, f"through the Go NRI runtime peer; {args.cycles} cycles per round")
    return 0


if __name__ == "__main__":
    sys.exit(main())

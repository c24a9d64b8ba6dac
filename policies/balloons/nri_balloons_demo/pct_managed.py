"""``nri-resource-policy demo pct-managed``: the spec's walkthrough on the
simulated dual-socket Xeon 6776P (:mod:`.node`), the README's main job.

The pods are the spec's YAML (``data/pct_managed``, the same files as
``examples/pct-managed``). One function per spec step, in the spec's order:
the plugin's ``pct:`` lines (:func:`step_4`), the pods (:func:`step_5`), the
associations (:func:`step_6_1`), the NRT balloon and container tables
(:func:`step_6_5`), the SST state (:func:`step_6_2`), the CLOS of every pinned
CPU (:func:`step_6_3`), the punit of each HP balloon (:func:`step_6_4`,
:func:`inspect_punits`, and the CPU map beside them, :func:`map_at_6_4`),
reporter lines beside the plugin's own busy MHz and CLOS bounds
(:func:`step_7`, :func:`plugin_frequencies`: no privileged pod) and the A/B of
step 8 (:func:`step_8`, the CPU map once more: :func:`map_after_8`), then the
teardown (:func:`step_9_1`, :func:`step_9_2`).
Reporter figures are simulated (see :mod:`.node`). Every expectation the spec
states is checked; the exit status is non-zero when one fails.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from nri_framework import cpumap, cpuset
from nri_framework.inspect_cli import render

from nri_balloons_demo.checks import Checks, finish, section
from nri_balloons_demo.data import pods_dir
from nri_balloons_demo.harness import default, demo_arguments
from nri_balloons_demo.node import Demo, Node, Pod, punit_of
from nri_balloons_demo.sstmodel import sst_summary
from nri_balloons_demo.tables import (
    BUSY_MHZ,
    frequency_metrics,
    get_assoc_lines,
    nrt_tables,
    print_tsv,
)

PCT_LINES = [
    "pct: mode=managed, 2 PCT cpuClass(es), 4 punit(s) across 2 package(s)",
    "pct: programmed CLOS 0 min=2300000 max=4600000 kHz",
    "pct: programmed CLOS 3 min=800000 max=2300000 kHz",
    'pct: cpuClass "hp-pct" classified HP (managed: pctPriority=high, CLOS 0)',
    'pct: cpuClass "lp-pct" classified LP (managed: pctPriority=low, CLOS 3)',
    "pct: fallback CLOS for non-PCT CPUs set to 3 (LP)",
]
"""Step 4's lines, as the spec shows them."""
RESERVED = "0,1,128,129"
"""The BalloonsPolicy's reservedResources."""


@dataclass
class Walk:
    """What the steps hand on: the node, the checks, the spec's pods."""

    n: Node
    c: Checks
    hp: list[Pod] = field(default_factory=list)
    lp: Pod | None = None
    mark: int = 0
    """The plugin's log line count before the pods were created."""
    hp_perf: list[tuple[float, float]] = field(default_factory=list)

    @property
    def lp_pod(self) -> Pod:
        assert self.lp is not None, "step 5 creates the LP pod"
        return self.lp


def step_4(w: Walk) -> None:
    section("4. the plugin applied the BalloonsPolicy: grep -E 'pct(:| mock:)'")
    lines = w.n.pct_lines()
    for line in lines:
        if "associated cpus" not in line:
            print("  " + line)
    for e in PCT_LINES:
        w.c.check(e in lines, e)
    w.c.check(
        any(
            x.startswith("pct: SST discovered: pkg=0 punit=0 level=1 cpus=0-31,128-159")
            for x in lines
        ),
        "pct: SST discovered: pkg=0 punit=0 level=1 cpus=0-31,128-159 ...",
    )
    w.c.check(any("PrepareManagedMode done" in x for x in lines), "PrepareManagedMode done")
    w.c.check(any("EnableCP done" in x for x in lines), "EnableCP done")


async def step_5(w: Walk) -> None:
    section("5. the HP and LP pods")
    pods = pods_dir()
    w.mark = len(w.n.plugin.tail)
    w.hp = [await w.n.create(pods / f"pod-hp-{i}.yaml") for i in range(1, 5)]
    w.lp = await w.n.create(pods / "pod-lp.yaml")
    for p in [*w.hp, w.lp]:
        print(f"  pod/{p.name} created: cpus={cpuset.format(p.cpus)}")


async def step_6_1(w: Walk) -> None:
    section("6.1 the plugin log: grep -E 'pct(:| mock:)|associated cpus .* to CLOS'")
    lp = w.lp_pod
    await w.n.plugin.wait_output(f"associated cpus {cpuset.format(lp.cpus)} to CLOS 3", 10)
    new = w.n.pct_lines(w.mark)
    for line in new:
        print("  " + line)
    for p in w.hp:
        w.c.check(
            f"pct: associated cpus {cpuset.format(p.cpus)} to CLOS 0" in new,
            f"{p.name}: associated cpus {cpuset.format(p.cpus)} to CLOS 0",
        )
    w.c.check(
        f"pct: associated cpus {cpuset.format(lp.cpus)} to CLOS 3" in new,
        f"pct-lp: associated cpus {cpuset.format(lp.cpus)} to CLOS 3",
    )


def step_6_5(w: Walk) -> None:
    section("6.5 NodeResourceTopology (the zones the agent publishes)")
    balloons, containers = nrt_tables(w.n.state())
    print_tsv(["NODE", "BALLOON", "CPUSET"], balloons)
    print()
    print_tsv(["NODE", "BALLOON", "CONTAINER", "CPUS"], containers)
    hp_zones = {r[1]: r[2] for r in balloons if r[1].startswith("hp-bln[")}
    w.c.check(
        sorted(hp_zones) == [f"hp-bln[{i}]" for i in range(4)]
        and all(cpuset.parse(v).bit_count() == 2 for v in hp_zones.values()),
        "four hp-bln[0..3] zones, each with a 2-CPU set",
    )
    lp_zone = next((r[2] for r in balloons if r[1] == "lp-bln[0]"), "")
    w.c.check(cpuset.parse(lp_zone).bit_count() == 8, "one lp-bln[0] zone with 8 CPUs")
    for p in [*w.hp, w.lp_pod]:
        row = next((r for r in containers if r[2] == f"default/{p.name}/bench"), None)
        w.c.check(
            row is not None
            and row[3] == cpuset.format(p.cpus)
            and row[1] in hp_zones | {"lp-bln[0]": ""},
            f"{p.name}/bench pinned to its balloon's set {cpuset.format(p.cpus)}",
        )
    reserved = next((r[2] for r in balloons if r[1] == "reserved[0]"), None)
    w.c.check(
        reserved is not None and cpuset.parse(reserved) & ~cpuset.parse(RESERVED) == 0,
        f"reserved[0] within the reserved pool {RESERVED} ({reserved!r})",
    )


def step_6_2(w: Walk) -> None:
    section("6.2 SST state read back from the model (intel-speed-select ... info / get-config)")
    info = w.n.discover()
    for pu in (pu for pkg in info.packages for pu in pkg.punits):
        bounds = {cl.clos: cl for cl in pu.clos}
        print(
            f"  package-{pu.package} powerdomain-{pu.punit}: perf-profile current "
            f"level {pu.pp.current_level}; speed-select-turbo-freq:"
            f"{'enabled' if pu.tf.enabled else 'disabled'}; core-power enable-status:"
            f"{'enabled' if pu.cp.enabled else 'disabled'}, priority-type:"
            f"{1 if pu.cp.priority == 'ordered' else 0}; clos-0 min/max "
            f"{bounds[0].min_khz // 1000}/{bounds[0].max_khz // 1000} MHz, clos-3 min/max "
            f"{bounds[3].min_khz // 1000}/{bounds[3].max_khz // 1000} MHz"
        )
        w.c.check(
            (bounds[0].min_khz, bounds[0].max_khz) == (2_300_000, 4_600_000)
            and (bounds[3].min_khz, bounds[3].max_khz) == (800_000, 2_300_000),
            f"pkg {pu.package} punit {pu.punit}: CLOS bounds match the programmed CLOS lines",
        )


def step_6_3(w: Walk) -> None:
    section("6.3 per-CPU associations (core-power get-assoc)")
    all_hp = [cpu for p in w.hp for cpu in cpuset.ids(p.cpus)]
    lp_cpus = cpuset.ids(w.lp_pod.cpus)
    print(f"  HP_CPUS={','.join(map(str, all_hp))}")
    print(f"  LP_CPUS={','.join(map(str, lp_cpus))}")
    clos = w.n.clos(sorted(all_hp + lp_cpus))
    for line in get_assoc_lines(clos):
        print(line)
    w.c.check(all(clos[cpu] == 0 for cpu in all_hp), "clos:0 for every CPU in HP_CPUS")
    w.c.check(all(clos[cpu] == 3 for cpu in lp_cpus), "clos:3 for every CPU in LP_CPUS")
    idle = w.n.clos(list(range(256)))
    w.c.check(
        all(k == 3 for cpu, k in idle.items() if cpu not in all_hp),
        "every other CPU (idle, reserved, LP) is on the LP CLOS 3",
    )


def step_6_4(w: Walk) -> None:
    section("6.4 punit spread (sst info)")
    info = w.n.discover()
    for pkg in info.packages:
        for pu in pkg.punits:
            print(f"    {pu.package}    {pu.punit}      {cpuset.format(cpuset.from_ids(pu.cpus))}")
    for p in w.hp:
        keys = {punit_of(cpu) for cpu in cpuset.ids(p.cpus)}
        print(f"  {p.name}: cpus={cpuset.format(p.cpus)} -> (pkg, punit) {sorted(keys)}")
    spread = {punit_of(cpu) for p in w.hp for cpu in cpuset.ids(p.cpus)}
    w.c.check(len(spread) == 4, "the four HP balloons fall in four different (pkg, punit) rows")
    for pu in (pu for pkg in info.packages for pu in pkg.punits):
        w.c.check(
            pu.cp.enabled and pu.cp.priority == "ordered" and pu.tf.enabled,
            f"pkg {pu.package} punit {pu.punit}: SST-CP enabled, ordered; SST-TF enabled",
        )


def inspect_punits(w: Walk) -> None:
    """Step 6.4 as ``nri-resource-policy inspect`` shows it."""
    section(f"nri-resource-policy inspect --address {w.n.metrics}: balloons and punits")
    text = render(w.n.state())
    start = text.index("\nBALLOONS")
    end = text.index("\nCONTAINERS")
    print("\n".join("  " + x for x in text[start:end].strip("\n").splitlines()))
    pstart = text.find("\nPUNITS")
    if pstart >= 0:
        print("\n".join("  " + x for x in text[pstart:].strip("\n").splitlines()))
    by_name = {b["name"]: b for b in w.n.state()["policy"]["balloons"]}
    hp_punits = [tuple(by_name[f"hp-bln[{i}]"].get("punit", [])) for i in range(4)]
    w.c.check(
        all(len(p) == 1 for p in hp_punits) and len(set(hp_punits)) == 4,
        "inspect shows each HP balloon on its own punit",
    )


def show_map(w: Walk, title: str) -> cpumap.CpuMap:
    """``nri-resource-policy inspect --map``: the node's CPUs, each one's
    balloon, CLOS and busy MHz (simulated), as a pipe shows it (no colour)."""
    section(f"nri-resource-policy inspect --address {w.n.metrics} --map: {title}")
    cmap = cpumap.cpu_map_of(w.n.state())
    text = cpumap.render(cmap)
    print("\n".join(("  " + x).rstrip() for x in text.rstrip("\n").splitlines()))
    cells = {c.cpu: c for c in cmap.cells}
    w.c.check(
        sorted(cells) == list(range(256)) and max(len(x) for x in text.splitlines()) <= 120,
        "the map shows each of the 256 CPUs once, in 120 columns",
    )
    w.c.check(
        {cells[c].key for c in cpuset.ids(cpuset.parse(RESERVED))} == {"="},
        f"the map shows the reserved CPUs {RESERVED}",
    )
    return cmap


def hp_keys_on_clos_0(w: Walk, cmap: cpumap.CpuMap, pods: list[Pod]) -> set[str]:
    """The map's keys of ``pods``' CPUs, checked to show CLOS 0."""
    cells = {c.cpu: c for c in cmap.cells}
    cpus = [cpu for p in pods for cpu in cpuset.ids(p.cpus)]
    w.c.check(
        all(cells[c].mark == "0" for c in cpus),
        "the map shows CLOS 0 on every HP CPU",
    )
    return {cells[c].key for c in cpus}


def map_at_6_4(w: Walk) -> None:
    """Step 6.4 on the map: four HP keys on four punits, the LP balloon at CLOS 3."""
    cmap = show_map(w, "step 6.4")
    cells = {c.cpu: c for c in cmap.cells}
    keys = [{cells[c].key for c in cpuset.ids(p.cpus)} for p in w.hp]
    w.c.check(
        all(len(k) == 1 for k in keys) and len(set.union(*keys)) == 4,
        "the map shows each HP balloon under its own key",
    )
    hp_keys_on_clos_0(w, cmap, w.hp)
    lp = {(cells[c].key, cells[c].mark) for c in cpuset.ids(w.lp_pod.cpus)}
    w.c.check(len(lp) == 1 and next(iter(lp))[1] == "3", "the map shows the LP balloon at CLOS 3")


def map_after_8(w: Walk, ab: Pod) -> None:
    """After step 8: the A/B pod in the LP balloon at CLOS 3, its busy MHz below the HP's."""
    w.n.state()  # pct-hp-on-lp's CPUs joined lp-bln: the inspect interval of them starts here
    time.sleep(0.2)
    cmap = show_map(w, "after step 8")
    cells = {c.cpu: c for c in cmap.cells}
    ab_cells = [cells[c] for c in cpuset.ids(ab.cpus)]
    w.c.check({c.mark for c in ab_cells} == {"3"}, "the map shows pct-hp-on-lp's CPUs at CLOS 3")
    hp_mhz = [cells[c].mhz for p in w.hp for c in cpuset.ids(p.cpus)]
    ab_mhz = [c.mhz for c in ab_cells if c.mhz is not None]
    w.c.check(
        bool(ab_mhz) and all(m is not None and m > max(ab_mhz) for m in hp_mhz),
        "the map's busy MHz: every HP CPU above pct-hp-on-lp's (simulated)",
    )


def scrape(w: Walk) -> str:
    """The plugin's ``/metrics``, as Prometheus scrapes it."""
    with urllib.request.urlopen(f"http://{w.n.metrics}/metrics", timeout=5) as r:
        return str(r.read().decode())


def step_7(w: Walk) -> None:
    section("7. observe performance (reporter lines; simulated)")
    scrape(w)  # the plugin's first reading: its interval starts here
    w.hp_perf = [w.n.report(p) for p in w.hp]
    lp_perf = w.n.report(w.lp_pod)
    w.c.check(
        all(round(mhz) == 4600 for _, mhz in w.hp_perf),
        "HP pods run at bucket-0 turbo, 4600 MHz",
    )
    w.c.check(lp_perf[1] <= 2300 + 1, "the LP pod is capped at base, 2300 MHz or less")
    plugin_frequencies(
        w, {cpuset.format(p.cpus): mhz for p, (_, mhz) in zip(w.hp, w.hp_perf, strict=True)}
    )


def plugin_frequencies(w: Walk, reported: dict[str, float]) -> None:
    """Step 7 without privileged pods: the plugin's busy MHz per balloon and
    CLOS bounds per punit over the reporters' interval (its ``/metrics``;
    the SST helper read the counters)."""
    busy, clos = frequency_metrics(scrape(w))
    print(f"  the plugin's /metrics ({w.n.metrics}), no privileged pod:")
    for row in busy:
        if row.balloon.startswith(("hp-bln[", "lp-bln[")):
            print(
                f'    {BUSY_MHZ}{{balloon="{row.balloon}",cpus="{row.cpus}",'
                f'source="{row.source}"}} {row.mhz:.0f}   (simulated)'
            )
    for punit, bounds in clos.items():
        cells = ", ".join(f"clos{n} {lo:.0f}-{hi:.0f}" for n, (lo, hi) in bounds.items())
        print(f"    punit {punit}: {cells} MHz   (simulated)")
    w.c.check(bool(busy) and {r.source for r in busy} == {"sim"}, 'figures labelled source="sim"')
    hp = [r for r in busy if r.balloon.startswith("hp-bln[")]
    lp = [r for r in busy if r.balloon.startswith("lp-bln[")]
    w.c.check(
        len(hp) == 4 and len(lp) == 1 and min(r.mhz for r in hp) > max(r.mhz for r in lp),
        "the plugin's busy MHz: every HP balloon above the LP balloon, as the model computes",
    )
    w.c.check(
        all(abs(r.mhz - reported.get(r.cpus, 0.0)) < 1 for r in hp),
        "each HP balloon's busy MHz is its reporter's mhz_avg",
    )
    w.c.check(
        len(clos) == 4
        and all(b.get(0) == (2300, 4600) and b.get(3) == (800, 2300) for b in clos.values()),
        "the plugin's CLOS bounds: CLOS 0 2300-4600, CLOS 3 800-2300 MHz on every punit",
    )


async def step_8(w: Walk) -> None:
    section("8. A/B: the same 2-thread workload on the LP CLOS")
    await w.n.delete("pct-lp")
    ab = await w.n.create(pods_dir() / "pod-hp-on-lp.yaml")
    print(f"  pod/pct-hp-on-lp created: cpus={cpuset.format(ab.cpus)} (lp-bln, CLOS 3)")
    ab_events, ab_mhz = w.n.report(ab)
    hp_events, hp_mhz = w.hp_perf[0]
    per_hp, per_ab = hp_events / w.hp[0].threads, ab_events / ab.threads
    print(
        f"  per-thread events/s: hp {per_hp:.2f} -> hp-on-lp {per_ab:.2f} "
        f"(x{per_ab / per_hp:.3f}); mhz_avg ratio x{ab_mhz / hp_mhz:.3f}   (simulated)"
    )
    w.c.check(
        abs(per_ab / per_hp - ab_mhz / hp_mhz) < 0.01,
        "per-thread events/s drop by the frequency ratio (LP base / HP turbo)",
    )
    w.c.check(set(w.n.clos(cpuset.ids(ab.cpus)).values()) == {3}, "pct-hp-on-lp runs on CLOS 3")
    map_after_8(w, ab)


async def step_9_1(w: Walk) -> None:
    section("9.1 cleanup, Kubernetes side: every pod deleted")
    for name in list(w.n.pods):
        await w.n.delete(name)
    await w.n.plugin.wait_output(f"associated cpus {cpuset.format(w.hp[-1].cpus)} to CLOS 3", 10)
    ext = {
        k: v
        for k, v in (w.n.state().get("extended_resources") or {}).items()
        if v is not None and k.startswith("cpuclass.balloons.nri.io/")
    }
    print(f"  cpuclass.balloons.nri.io/* extended resources to publish: {json.dumps(ext)}")
    w.c.check(ext == {}, "no cpuclass.balloons.nri.io/* extended resource is published ({})")
    idle = w.n.clos(list(range(256)))
    w.c.check(set(idle.values()) == {3}, "freed HP CPUs went back to the LP CLOS 3")


def step_9_2(work: Path, host_root: Path, config: Path, c: Checks) -> None:
    """Step 9.2: the helper's SIGTERM in managed mode reset SST."""
    section("9.2 SST after the helper's SIGTERM (intel-speed-select ... info)")
    cp, tf = sst_summary(work, host_root, config)
    c.check(cp == ["disabled"], "SST-CP disabled on every punit")
    c.check(tf == ["disabled"], "SST-TF disabled on every punit")


async def walkthrough(n: Node, c: Checks) -> None:
    """Steps 4 to 9.1 on the running node (9.2 runs after the helper exited)."""
    w = Walk(n, c)
    step_4(w)
    await step_5(w)
    await step_6_1(w)
    step_6_5(w)
    step_6_2(w)
    step_6_3(w)
    step_6_4(w)
    inspect_punits(w)
    map_at_6_4(w)
    step_7(w)
    await step_8(w)
    await step_9_1(w)


def run_pct_managed(keep: bool = False) -> int:
    started = time.monotonic()
    config = (pods_dir() / "balloons-pct-managed.yaml").read_text()
    demo = Demo("pct-managed", config, keep=keep)
    return finish(asyncio.run(demo.run(walkthrough, after=step_9_2)), started)


@default
def main(argv: list[str]) -> int:
    args = demo_arguments(argv, __doc__, lambda p: None)
    return run_pct_managed(args.keep)

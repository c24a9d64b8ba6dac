"""``nri-resource-policy demo pct-assoc-only``: reference §19's manual
example on the simulated Xeon 6776P (:mod:`.node`).

The operator owns SST: before the plugin starts, ``intel-speed-select``
(played on the model) enables SST-TF and SST-CP and puts one core per punit
on CLOS 0; the BalloonsPolicy names CLOS IDs only (no minFreq/maxFreq), so
the plugin associates CPUs and never programs or resets SST.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nri_framework import cpuset
from nri_sst import messages as m

from nri_balloons_demo.checks import Checks, finish, section
from nri_balloons_demo.data import pods_dir
from nri_balloons_demo.harness import demo_arguments
from nri_balloons_demo.node import POLICY_HEAD, Demo, Node, punit_of
from nri_balloons_demo.sstmodel import model_handler, sst_summary

ASSOC_ONLY_CONFIG = (
    POLICY_HEAD
    + """\
  - name: reserved
  - name: hp-bln
    cpuClass: hp-clos0
    maxCPUs: 8
    preferNewBalloons: true
    preferSpreadingPods: false
  - name: lp-bln
    cpuClass: lp-clos3
    preferSpreadingPods: false
  cpuClasses:
  - name: default
    sstClosID: 3
  - name: hp-clos0
    sstClosID: 0
  - name: lp-clos3
    sstClosID: 3
  log:
    debug:
    - policy
    - cpu
"""
)
"""Reference §19's manual example: no minFreq/maxFreq, the operator owns SST."""

OPERATOR_CPUS = [0, 32, 64, 96]
"""``intel-speed-select -c 0,32,64,96 turbo-freq enable -a``: one CPU per punit."""


def operator_enables_turbo_freq(work: Path, host_root: Path, config: Path) -> None:
    """What the operator's ``intel-speed-select -c 0,32,64,96 turbo-freq enable
    -a`` does on the model before the plugin starts (reference §19): SST-TF on,
    SST-CP on with ordered priority, the listed cores (both threads) on CLOS 0,
    every other CPU on CLOS 3. Done on the model directly, not through the
    helper process: the operator's tool, not ours."""
    handler = model_handler(work, host_root, config, b"operator")
    handler.dispatch(m.PrepareManagedMode(), b"operator")  # CPReset + TFEnable + ordered
    handler.dispatch(m.EnableCP(), b"operator")
    hp = sorted({*OPERATOR_CPUS, *(c + 128 for c in OPERATOR_CPUS)})
    handler.dispatch(m.AssociateCpus(clos=0, cpus=hp), b"operator")
    rest = [c for c in range(256) if c not in hp]
    handler.dispatch(m.AssociateCpus(clos=3, cpus=rest), b"operator")
    handler.backend.idle()  # the model's state file is the hardware the helper starts on
    section("the operator: intel-speed-select -c 0,32,64,96 turbo-freq enable -a (on the model)")
    print("  SST-TF enabled, SST-CP enabled (ordered); cpus 0,32,64,96 (+ siblings) -> CLOS 0,")
    print("  every other CPU -> CLOS 3")


async def pct_assoc_only_body(n: Node, c: Checks) -> None:
    section("the plugin applied the BalloonsPolicy: grep -E 'pct(:| mock:)'")
    lines = n.pct_lines()
    for line in lines:
        if "associated cpus" not in line:
            print("  " + line)
    c.check(
        "pct: mode=assoc-only, 3 PCT cpuClass(es), 4 punit(s) across 2 package(s)" in lines,
        "pct: mode=assoc-only, 3 PCT cpuClass(es), 4 punit(s) across 2 package(s)",
    )
    c.check(
        any(
            x.startswith('pct: cpuClass "hp-clos0" classified HP (assoc-only: CLOS 0')
            for x in lines
        ),
        'cpuClass "hp-clos0" classified HP (assoc-only: CLOS 0 ...)',
    )
    c.check(
        not any("PrepareManagedMode done" in x or "EnableCP done" in x for x in lines),
        "the plugin did not program SST (no PrepareManagedMode / EnableCP)",
    )
    pods = pods_dir()
    mark = len(n.plugin.tail)
    hp = [await n.create(pods / f"pod-hp-{i}.yaml") for i in range(1, 5)]
    lp = await n.create(pods / "pod-lp.yaml")
    await n.plugin.wait_output(f"associated cpus {cpuset.format(lp.cpus)} to CLOS 3", 10)
    section("the pods: grep 'associated cpus .* to CLOS'")
    for line in n.pct_lines(mark):
        if "associated cpus" in line:
            print("  " + line)
    for p in hp:
        c.check(set(n.clos(cpuset.ids(p.cpus)).values()) == {0}, f"{p.name} on CLOS 0")
    c.check(set(n.clos(cpuset.ids(lp.cpus)).values()) == {3}, "pct-lp on CLOS 3")
    spread = {punit_of(cpu) for p in hp for cpu in cpuset.ids(p.cpus)}
    c.check(len(spread) == 4, "the four HP balloons on four different punits")
    section("reporter lines (simulated)")
    perf = [n.report(p) for p in hp]
    lp_perf = n.report(lp)
    c.check(all(round(mhz) == 4600 for _, mhz in perf), "HP pods at bucket-0 turbo, 4600 MHz")
    c.check(lp_perf[1] <= 2300 + 1, "LP pod at the LP clip, 2300 MHz or less")
    for name in list(n.pods):
        await n.delete(name)


def assoc_only_after(work: Path, host_root: Path, config: Path, c: Checks) -> None:
    section("after the helper's SIGTERM: SST as the operator left it")
    cp, tf = sst_summary(work, host_root, config)
    c.check(cp == ["enabled"] and tf == ["enabled"], "assoc-only: the plugin never reset SST")


def run_pct_assoc_only(keep: bool = False) -> int:
    started = time.monotonic()
    demo = Demo("pct-assoc-only", ASSOC_ONLY_CONFIG, keep=keep)
    checks = asyncio.run(
        demo.run(pct_assoc_only_body, prepare=operator_enables_turbo_freq, after=assoc_only_after)
    )
    return finish(checks, started)


def main(argv: list[str]) -> int:
    args = demo_arguments(argv, __doc__, lambda p: None)
    return run_pct_assoc_only(args.keep)

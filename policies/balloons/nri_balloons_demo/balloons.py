"""``nri-resource-policy demo balloons``: the spec's balloon types without
cpuClasses on the simulated Xeon 6776P (:mod:`.node`), no SST helper at all.
Every pod gets CPUs of its own, one hp-bln balloon per HP pod, the empty
balloons go when the pods do.
"""

from __future__ import annotations

import asyncio
import time

from nri_framework import cpuset

from nri_balloons_demo.checks import Checks, finish, section
from nri_balloons_demo.data import pods_dir
from nri_balloons_demo.harness import demo_arguments
from nri_balloons_demo.node import POLICY_HEAD, Demo, Node
from nri_balloons_demo.tables import nrt_tables, print_tsv

BALLOONS_CONFIG = (
    POLICY_HEAD
    + """\
  - name: hp-bln
    maxCPUs: 8
    preferNewBalloons: true
    preferSpreadingPods: false
  - name: lp-bln
    preferSpreadingPods: false
"""
)
"""The spec's balloon types without cpuClasses: no SST helper at all."""


async def balloons_body(n: Node, c: Checks) -> None:
    pods = pods_dir()
    section("the pods")
    hp = [await n.create(pods / f"pod-hp-{i}.yaml") for i in range(1, 5)]
    lp = await n.create(pods / "pod-lp.yaml")
    for p in [*hp, lp]:
        print(f"  pod/{p.name}: cpus={cpuset.format(p.cpus)}")
    section("NodeResourceTopology (the zones the agent publishes)")
    balloons, containers = nrt_tables(n.state())
    print_tsv(["NODE", "BALLOON", "CPUSET"], balloons)
    print()
    print_tsv(["NODE", "BALLOON", "CONTAINER", "CPUS"], containers)
    sets = [p.cpus for p in [*hp, lp]]
    c.check(all(a & b == 0 for i, a in enumerate(sets) for b in sets[i + 1 :]), "no CPU shared")
    c.check([p.cpus.bit_count() for p in hp] == [2, 2, 2, 2], "each HP pod has 2 CPUs")
    c.check(lp.cpus.bit_count() == 8, "the LP pod has 8 CPUs")
    reserved = cpuset.parse("0,1,128,129")
    c.check(all(s & reserved == 0 for s in sets), "no pod on the reserved CPUs")
    c.check(
        sorted(r[1] for r in balloons if r[1].startswith("hp-bln"))
        == [f"hp-bln[{i}]" for i in range(4)],
        "one hp-bln balloon per HP pod (preferNewBalloons)",
    )
    section("pods deleted")
    for name in list(n.pods):
        await n.delete(name)
    balloons, _ = nrt_tables(n.state())
    left = sorted(r[1] for r in balloons)
    print(f"  balloons left: {', '.join(left)}")
    c.check(not any(x.startswith(("hp-bln", "lp-bln")) for x in left), "empty balloons deleted")


def run_balloons(keep: bool = False) -> int:
    started = time.monotonic()
    demo = Demo("balloons", BALLOONS_CONFIG, helper=False, keep=keep)
    return finish(asyncio.run(demo.run(balloons_body)), started)


def main(argv: list[str]) -> int:
    args = demo_arguments(argv, __doc__, lambda p: None)
    return run_balloons(args.keep)

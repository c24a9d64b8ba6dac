"""The placement hints of Priority Core Turbo against their previous
implementation as oracle (copied verbatim from before the CPU maps kept
their CLOS and class masks: it visited every CPU of ``known`` and
``class_of`` per decision): the same hints on random sequences of HP and LP
decisions, releases and helper answers, for random free and current sets
(few free CPUs and many, so that both ways of finding the shared cores
run). And the CPU map itself against masks computed from its items.

Where the neighbouring test modules are: see :mod:`pct_helpers`.
"""

from __future__ import annotations

import functools
import operator
import random

import pytest
from nri_balloons.pcthints import Hints, PlacementHints
from nri_balloons.pctstate import CpuMap
from nri_framework import cpuset
from pct_helpers import (
    make,
    pod,
    shared_root,  # noqa: F401 (the module's autouse host tree)
)

# -- the oracle: the previous implementation, verbatim --------------------------------


def old_hints(self: PlacementHints, name: str, requested: int, free: int, current: int) -> Hints:
    """Upstream ``Hints(intent)``; every candidate set is non-empty and
    within the allowed CPUs."""
    out = Hints()
    if not self.mode or requested < 1:
        return out
    free &= self.allowed
    clos = self.clos_for(name)
    if clos is not None:
        shared = old_shared_core_cpus(self, clos, free, current)
        whole = free & ~shared
        if shared and whole.bit_count() >= requested:
            out.prefer.append(("sst-whole-core", [whole]))
    plan = self.plans.get(name)
    if plan is not None:
        # CPUs on the class's CLOS by themselves: not a free thread that
        # a sibling in another balloon holds on a CLOS it does not ask for
        topo = self.topology
        held = free & topo.siblings(self.allowed & ~free & ~current) & ~topo.siblings(current)
        on_clos = 0
        for cpu, k in self.known.items():
            if (
                k == plan.clos
                and cpu >= 0
                and free >> cpu & 1
                and (self.want.get(cpu) == k or not held >> cpu & 1)
            ):
                on_clos |= 1 << cpu
        if on_clos.bit_count() >= requested:
            out.prefer.append((f"sst-clos-{plan.clos}", [on_clos]))
    if name in self.hp_classes:
        used = old_hp_used(self)
        sets = self._hp_reserve(free, current, requested, used)
        if sets:
            out.prefer.append(("sst-hp-reserve", sets))
        # within the chosen punit, the free threads of cores that are HP
        # already: no HP core more for SST-TF to count
        others = functools.reduce(operator.or_, used.values(), 0) & ~current
        hp_cores = self.topology.siblings(others) & free
        if hp_cores.bit_count() >= requested:
            out.prefer.append(("sst-hp-core", [hp_cores]))
        return out
    if self.hp_classes:
        in_use = 0
        for idx in old_hp_used(self):
            in_use |= self.punits[idx].cpus
        if in_use:
            out.avoid.append(("sst-hp-in-use", in_use & self.allowed))
    return out


def old_shared_core_cpus(self: PlacementHints, clos: int, free: int, current: int) -> int:
    """The CPUs of ``free`` whose core has a thread in use (neither free
    nor ``current``) on or asking for another CLOS than ``clos``."""
    busy = self.topology.siblings(free) & ~free & ~current
    other = 0
    for cpu in cpuset.ids(busy):
        theirs = self.want.get(cpu, self.known.get(cpu))
        if theirs is not None and theirs != clos:
            other |= 1 << cpu
    return self.topology.siblings(other) & free if other else 0


def old_hp_used(self: PlacementHints) -> dict[int, int]:
    """punit index -> the CPUs an HP class runs on there (from ``class_of``)."""
    used: dict[int, int] = {}
    for cpu, name in self.class_of.items():
        idx = self.punit_of.get(cpu)
        if idx is not None and name in self.hp_classes:
            used[idx] = used.get(idx, 0) | 1 << cpu
    return used


# -- the tests -------------------------------------------------------------------------


def _random_set(rng: random.Random, allowed: int, share: float) -> int:
    return sum(1 << c for c in cpuset.ids(allowed) if rng.random() < share)


@pytest.mark.parametrize("seed", range(3))
def test_hints_equal_the_previous_implementation(seed: int) -> None:
    rng = random.Random(seed)
    policy, _helper = make()
    pct = policy.cpu_classes.pct
    names = [*sorted(pct.plans), "default", "no-such-class"]
    running: list[str] = []
    for step in range(40):
        if running and rng.random() < 0.4:
            cid = running.pop(rng.randrange(len(running)))
            policy.release(cid)
        else:
            kind = rng.choice(["hp-bln", "lp-bln"])
            name = f"twin-{seed}-{step}"
            p, c = pod(name, rng.choice([1, 2, 4]), kind)
            if policy.allocate(p, c) is not None:
                running.append(c.id)
        if rng.random() < 0.7:  # otherwise the decision waits: want differs from known
            assert policy.cpu_classes.commit()
        if rng.random() < 0.1:  # the helper's answers forgotten for a core
            pct._unlearn(1 << rng.choice(cpuset.ids(pct.allowed)))
        for _ in range(6):
            share = rng.choice([0.05, 0.5, 0.95])
            free = _random_set(rng, pct.allowed, share)
            current = _random_set(rng, pct.allowed & ~free, 0.05)
            for name in names:
                requested = rng.choice([0, 1, 2, 4, 8])
                assert pct.hints(name, requested, free, current) == old_hints(
                    pct, name, requested, free, current
                ), (step, name, requested)
            for clos in range(4):
                assert pct._shared_core_cpus(clos, free, current) == old_shared_core_cpus(
                    pct, clos, free, current
                )
        used = pct._hp_used()
        assert sorted(used.items()) == sorted(old_hp_used(pct).items())


def test_cpu_map_masks_follow_its_items() -> None:
    """Assignment, reassignment, pop, del and clear keep each value's mask and
    the mapped CPUs; a CPU beyond the bound (or negative) stays in the map
    but in no mask; the dict methods that would bypass the masks refuse."""
    rng = random.Random(7)
    cpus: CpuMap[int] = CpuMap({1: 0, 5: 3, -1: 3, 10**9: 0}, bound=64)
    assert cpus.mask(0) == 1 << 1 and cpus.mask(3) == 1 << 5 and cpus.cpus == 1 << 1 | 1 << 5
    assert cpus[10**9] == 0 and cpus[-1] == 3
    for _ in range(500):
        cpu = rng.randrange(-2, 70)
        op = rng.random()
        if op < 0.6:
            cpus[cpu] = rng.randrange(4)
        elif op < 0.8:
            cpus.pop(cpu, None)
        elif cpu in cpus:
            del cpus[cpu]
        for value in range(4):
            want = sum(1 << c for c, v in cpus.items() if v == value and 0 <= c < 64)
            assert cpus.mask(value) == want
        assert cpus.cpus == sum(1 << c for c in cpus if 0 <= c < 64)
    with pytest.raises(KeyError):
        cpus.pop(10**6)
    for refused in (cpus.update, cpus.setdefault, cpus.popitem):
        with pytest.raises(TypeError):
            refused({2: 1})  # type: ignore[operator]
    cpus.clear()
    assert cpus == {} and cpus.mask(0) == 0 and cpus.cpus == 0

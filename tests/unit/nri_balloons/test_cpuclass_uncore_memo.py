"""The uncore plan's "does a class have uncore limits" answer is remembered
until the classes change (:meth:`CpuClassHandler.configure`, ``_set_def``),
not computed over every class at each commit: a handler with the previous
plan (kept here, verbatim but for its name) as the oracle takes the same
random class sets, reconfigurations, uses and commits, and sends the same
requests and logs the same lines."""

from __future__ import annotations

import logging
import random

import pytest
from nri_balloons import cpuclass
from nri_balloons.config import CPUClass
from nri_balloons.cpuclass import CpuClassHandler
from nri_framework import cpuset
from nri_sst import messages as m
from test_cpuclass import Recorder, cls, topology

log = logging.getLogger("cpuclass")


class PreviousHandler(CpuClassHandler):
    """The uncore plan as it was: the classes' limits looked at per commit."""

    def _plan_uncore(self, plan: cpuclass._Plan) -> None:
        limited = any(d.uncore_min_freq or d.uncore_max_freq for d in self.defs.values())
        if not limited and not log.isEnabledFor(logging.DEBUG):
            return
        cpus = self.topology.cpus
        dies = {cpus[c].die_key for c in cpuset.ids(self.dirty) if c in cpus}
        for key in sorted(dies):
            lo = hi = 0
            for cpu in cpuset.ids(self.topology.die_masks.get(key, 0) if limited else 0):
                d = self.defs.get(self.cpu_class.get(cpu, ""))
                if d is not None:
                    lo = max(lo, d.uncore_min_freq)
                    hi = max(hi, d.uncore_max_freq)
            if not lo and not hi:
                log.debug("uncore: pkg/die %d/%d: no limits in effect", key[0], key[1])
                continue
            if lo and hi and lo > hi:
                log.warning(
                    "uncore: pkg/die %d/%d: min %d kHz above max %d kHz", key[0], key[1], lo, hi
                )
            prev = self.uncore_written.get(key, (0, 0))
            new_lo = lo if lo and lo != prev[0] else None
            new_hi = hi if hi and hi != prev[1] else None
            if new_lo is None and new_hi is None:
                continue
            plan.requests.append(
                m.SetUncore(package=key[0], die=key[1], min_khz=new_lo, max_khz=new_hi)
            )
            plan.done.append([])
            plan.uncore_done.append((key, (lo or prev[0], hi or prev[1])))


def random_classes(rng: random.Random) -> list[CPUClass]:
    out = []
    for i in range(rng.randint(1, 4)):
        kw: dict[str, object] = {}
        if rng.random() < 0.5:
            kw["min_freq"] = rng.choice((800_000, 1_200_000))
        if rng.random() < 0.4:
            kw["uncore_min_freq"] = rng.choice((800_000, 1_000_000, 1_600_000))
        if rng.random() < 0.4:
            kw["uncore_max_freq"] = rng.choice((1_200_000, 2_400_000, "turbo", "base"))
        if rng.random() < 0.3:
            kw["turbo_priority"] = rng.randint(0, 3)
        out.append(cls(f"c{i}", **kw))
    return out


def new(kind: type[CpuClassHandler]) -> tuple[CpuClassHandler, Recorder]:
    rec = Recorder()
    h = kind(topology(), rec)
    h.uncore_available = True  # n4c16 has no driver: the plan is what is compared
    return h, rec


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_the_same_uncore_requests_as_the_previous_plan(
    seed: int, debug: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG if debug else logging.INFO, "cpuclass")
    rng = random.Random(seed)
    online = topology().online
    handlers = [new(CpuClassHandler), new(PreviousHandler)]
    said: list[list[object]] = [[], []]
    for step in range(60):
        op = rng.random()
        classes = random_classes(rng) if op < 0.1 or step == 0 else None
        cpus = rng.getrandbits(online.bit_length()) & online
        target = rng.randrange(5)
        for (h, rec), out in zip(handlers, said, strict=True):
            caplog.clear()
            if classes is not None:
                h.configure(classes)
            elif op < 0.7:
                names = list(h.classes)
                h.use(cpus, names[target % len(names)] if target < 4 else "")
            else:
                h.commit()
            out.append((rec.take(), h.uncore_written.copy(), caplog.messages))
        assert said[0][-1] == said[1][-1], step


def test_a_reconfiguration_to_uncore_limits_is_planned() -> None:
    """The remembered answer is forgotten by configure: classes without
    uncore limits, a commit, then classes with them (on a node without
    cpufreq's range: no turbo arbitration redefines the classes between)."""
    h, rec = new(CpuClassHandler)
    h.turbo = None
    h.configure([cls("plain", min_freq=800_000)])
    h.use(cpuset.from_ids([0, 1]), "plain")
    h.commit()
    assert [r for r in rec.take() if isinstance(r, m.SetUncore)] == []
    h.configure([cls("plain", uncore_max_freq=2_000_000)])
    h.use(cpuset.from_ids([0, 1]), "plain")
    h.commit()
    die = topology().cpus[0].die_key
    assert [r for r in rec.take() if isinstance(r, m.SetUncore)] == [
        m.SetUncore(package=die[0], die=die[1], min_khz=None, max_khz=2_000_000)
    ]

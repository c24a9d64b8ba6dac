"""IRQ affinity: ``irqClaim``, ``irqMode`` and ``controllableInterrupts``
(upstream's ``applyIrqAffinities``, reference §11).

The plugin writes no procfs: the SST helper lists the IRQs
(:class:`~nri_sst.messages.ListInterrupts`) and writes their affinities
(:class:`~nri_sst.messages.SetIrqAffinity`). The list is asked for only
when a configuration uses ``irqClaim``/``irqMode``: before it is applied (at
start or on a reload; a claim on a denied IRQ is refused with upstream's
error) and, when the helper did not answer then, by the first commit that
needs it; such a configuration is already running, so its denied claims are
logged as errors (they are never applied either way: only controllable,
allowed IRQs are written). After each decision the policy
computes the affinities (:func:`new_affinities`) and :meth:`IrqAffinity.commit_steps`
sends the changed ones in one request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import msgspec
from nri_framework import cpuset
from nri_sst import messages as m

from nri_balloons.config import BalloonType
from nri_balloons.globmatch import go_match
from nri_balloons.sstlink import Ask, Steps, WriteRefused, WriterUnavailable

log = logging.getLogger("irq")

SINK = "sink"
ISOLATE = "isolate"


class Irq(msgspec.Struct, frozen=True):
    number: int
    description: str
    affinity: int
    """CPU mask."""
    writable: bool

    def __str__(self) -> str:
        return f"irq {self.number} ({self.description})"

    def matches(self, pattern: str) -> bool:
        return claims(pattern, self.number, self.description)


def claims(pattern: str, number: int, description: str) -> bool:
    """Upstream's ``Irq.Match``: an ``irqClaim`` pattern names the IRQ's
    number, or is a glob over its description."""
    return bool(pattern) and (pattern == str(number) or go_match(pattern, description))


def in_use(types: Iterable[BalloonType]) -> bool:
    return any(t.irq_claim or t.irq_mode for t in types)


def controllable(irqs: Iterable[Irq], patterns: Sequence[str]) -> list[Irq]:
    """Writable IRQs whose description a ``controllableInterrupts`` glob
    matches (every writable one when there is no pattern)."""
    return [
        i
        for i in irqs
        if i.writable and (not patterns or any(go_match(p, i.description) for p in patterns))
    ]


def new_affinities(
    irqs: Iterable[Irq], balloons: Iterable[tuple[BalloonType, int]], allowed: int
) -> dict[int, int]:
    """The affinity of each IRQ that changes (reference §11): the claiming
    balloons' CPUs, else the sinks', else (an IRQ with an allowed CPU)
    ``(current | allowed) - isolate`` with isolate balloons, else ``allowed``.
    Empty balloons count for nothing: every rule is a union of balloons'
    CPUs, to which an empty balloon adds none."""
    live = list(balloons)
    sink = isolate = 0
    for t, cpus in live:
        if t.irq_mode == SINK:
            sink |= cpus
        elif t.irq_mode == ISOLATE:
            isolate |= cpus
    out: dict[int, int] = {}
    for irq in irqs:
        claim = 0
        for t, cpus in live:
            if any(irq.matches(p) for p in t.irq_claim):
                claim |= cpus
        if claim:
            new = claim
        elif sink:
            new = sink
        elif not irq.affinity & allowed:
            continue  # out of the policy's scope
        elif isolate:
            new = (irq.affinity | allowed) & ~isolate
        else:
            new = allowed
        if new and new != irq.affinity:
            out[irq.number] = new
    return out


class IrqAffinity:
    """What the policy knows of the node's IRQs and the affinities it still
    has to write."""

    def __init__(self) -> None:
        self.irqs: dict[int, Irq] | None = None
        """From the helper's last list (None: not listed yet)."""
        self.pending: dict[int, int] = {}
        self.inputs: tuple[list[BalloonType], list[tuple[BalloonType, int]], int, list[str]] = (
            [],
            [],
            0,
            [],
        )
        self.listed_late = False

    def learn(self, reply: m.ListInterruptsReply) -> None:
        self.irqs = {
            i.number: Irq(i.number, i.description, cpuset.from_ids(i.affinity), i.writable)
            for i in reply.interrupts
        }

    def descriptions(self) -> list[tuple[int, str]] | None:
        """``(number, description)`` of every IRQ, for the configuration's
        denied-claim check (None: not known yet)."""
        if self.irqs is None:
            return None
        return [(i.number, i.description) for i in self.irqs.values()]

    def list_steps(self, timeout: float | None = None) -> Steps[bool]:
        try:
            reply = yield Ask(m.ListInterrupts(), timeout)
        except (WriterUnavailable, WriteRefused) as exc:
            log.warning("failed to read interrupts for IRQ affinity update: %s", exc)
            return False
        if isinstance(reply, m.ListInterruptsReply):
            self.learn(reply)
            return True
        return False

    def decide(
        self,
        types: list[BalloonType],
        balloons: list[tuple[BalloonType, int]],
        allowed: int,
        patterns: list[str],
    ) -> None:
        """The affinities the balloons want now (nothing when no type uses IRQ options)."""
        self.inputs = (types, balloons, allowed, patterns)
        if not in_use(types):
            self.pending = {}
            return
        if self.irqs is None:
            return  # computed when the list comes (commit_steps)
        self.pending = new_affinities(controllable(self.irqs.values(), patterns), balloons, allowed)

    def unsettled(self) -> bool:
        return bool(self.pending) or (in_use(self.inputs[0]) and self.irqs is None)

    def commit_steps(self, timeout: float | None = None) -> Steps[bool]:
        """Write the pending affinities in one request (the list first when
        it is not known). False when the helper is unavailable (they stay
        pending); a refusal is logged and the list asked for again next time."""
        types = self.inputs[0]
        if not in_use(types):
            return True
        if self.irqs is None:
            if not (yield from self.list_steps(timeout)):
                return False
            self.listed_late = True
            self.decide(*self.inputs)
        assert self.irqs is not None
        batch, self.pending = self.pending, {}
        if not batch:
            return True
        groups: dict[int, list[int]] = {}
        for irq, cpus in sorted(batch.items()):
            groups.setdefault(cpus, []).append(irq)
        req = m.SetIrqAffinity(
            groups=[m.IrqGroup(irqs=irqs, cpus=cpuset.ids(c)) for c, irqs in groups.items()]
        )
        try:
            reply = yield Ask(req, timeout)
        except WriteRefused as exc:
            log.warning("failed to set IRQ affinities: %s", exc)
            self.irqs = None  # the kernel's view changed: list again
            return True
        except WriterUnavailable:
            self.pending = {**batch, **self.pending}
            return False
        if isinstance(reply, m.SetIrqAffinityReply):
            for num, now in sorted(reply.affinities.items()):
                old = self.irqs.get(num)
                if old is None:
                    continue
                self.irqs[num] = msgspec.structs.replace(old, affinity=cpuset.from_ids(now))
                log.debug('set affinity of %s to "%s"', old, cpuset.format(batch[num]))
        return True

"""Associating CPUs with their CLOS (reference §13.3): what a decision asks
for, and the flush that tells the helper.

:meth:`ClosAssociation.use` records the CLOS the class on some CPUs asks
for and marks them pending; the flush
(:meth:`nri_balloons.pct.PctAllocator.flush_steps`) sends one
``AssociateCpus`` per CLOS for the cores of the pending CPUs
(:meth:`ClosAssociation.core_plan`), all in the decision's one request, none
for cores the helper reported on that CLOS already, and remembers what the
helper reports.
SST programming comes first (:mod:`nri_balloons.sstprogram`); the hints
that keep cores whole are :mod:`nri_balloons.pcthints`.

CLOS is per core. SST associates *cores* (``CLOS_ASSOC`` addresses a punit
core; the kernel: "the granularity is at core level not at per CPU level",
reference sst.md §2.3), and a core has one frequency for its threads, so two
threads of one core cannot honour two CLOS. Upstream tracks association per
CPU and never notices; here the rule is:

* a class asks for a CLOS per CPU (:attr:`~nri_balloons.pctstate.PctState.want`), but a flush
  resolves each touched *core*: the core goes to the highest-priority CLOS its
  threads ask for (an HP CLOS first, then the lower CLOS id, the order SST-CP
  ordered priority throttles in). An HP pod keeps its turbo; an LP pod on the
  sibling of an HP thread runs at that core's frequency. Capping the core
  instead would take away the one promise PCT exists for, silently. Every
  such core is logged (``pct: cpus ... share a core ...``), as a warning when
  a PCT class does not get its CLOS, at info level when only non-PCT CPUs
  (idle, the fallback) follow their sibling;
* placement avoids it: every class that asks for a CLOS is steered
  (``sst-whole-core``, before upstream's hints) away from free CPUs whose
  sibling runs a class asking for another CLOS, so a core is shared only
  when no whole core is left. Upstream's ``sst-clos-<N>`` hint takes only
  CPUs on that CLOS by themselves (a free thread is on CLOS 0 when its
  sibling runs an HP balloon: that core is taken), and an HP balloon then
  prefers, within the punit ``sst-hp-reserve`` chose, the free threads of
  cores that are HP already (``sst-hp-core``): they cost no HP core, and
  fewer HP cores per punit select a faster SST-TF bucket;
* what the plugin reports (:meth:`nri_balloons.pct.PctAllocator.clos_of`, ``/debug/state``)
  is what the helper did: its ``AssociateCpusReply`` names every CPU moved,
  siblings included. A refused or unanswered association, and a helper that
  is away or must be programmed again, make the CLOS unknown (not shown)
  until the next association; a restarted plugin or helper re-associates
  every core;
* SST-TF selects its bucket by the number of HP *cores* per punit, so the HP
  room of the placement hints counts cores (upstream counts CPUs, which on
  an SMT part halves the room).
"""

from __future__ import annotations

import functools
import logging
import operator

from nri_framework import cpuset
from nri_sst import messages as m

from nri_balloons.gofmt import quote
from nri_balloons.pctplan import CLOS_COUNT
from nri_balloons.pctstate import PctState
from nri_balloons.sstlink import Steps, WriteRefused, item_replies

log = logging.getLogger("cpuclass")


class ClosAssociation(PctState):
    """The CLOS each CPU asks for, and its association flush (see the module doc)."""

    def use(self, cpus: int, name: str) -> None:
        """Class ``name`` ("" = none) now runs on ``cpus``: record the CLOS it
        asks for; the next flush associates the cores they are on."""
        if not self.wanted_mode:
            return
        cpus &= self.allowed
        if not cpus:
            return
        ids = cpuset.ids(cpus)
        for cpu in ids:
            self.class_of[cpu] = name
        clos = self.clos_for(name)
        if clos is None:
            # assoc-only: non-PCT CPUs ask for nothing and are left alone, but
            # a core they share with a PCT thread follows that thread again
            for cpu in ids:
                self.want.pop(cpu, None)
        else:
            for cpu in ids:
                self.want[cpu] = clos
        self.pending |= cpus

    def _clos_priority(self) -> dict[int, tuple[bool, int]]:
        """Sort key of every planned CLOS for a shared core: the HP CLOS
        first, then the lower id (SST-CP ordered priority: CLOS 0 > 3)."""
        hp = {self.plans[n].clos for n in self.hp_classes if n in self.plans}
        return {c: (c not in hp, c) for c in range(CLOS_COUNT)}

    def core_plan(self, pending: int | None = None) -> dict[int, int]:
        """CLOS -> the CPUs to associate with it, for the cores of ``pending``
        (default: the pending CPUs; module doc: CLOS is per core). Each core goes to the highest
        priority CLOS its threads ask for; the request names the core's
        pending threads that ask for a CLOS (the CPUs the decision touched, as
        upstream's log line), or, when none does, the threads that ask."""
        plan: dict[int, int] = {}
        priority = self._clos_priority()
        pending = self.pending if pending is None else pending
        rest = pending
        while rest:
            core = self.topology.siblings(rest & -rest)
            rest &= ~core
            wants: dict[int, int] = {}
            for cpu in cpuset.ids(core):
                clos = self.want.get(cpu)
                if clos is not None and cpu in self.punit_of:
                    wants[clos] = wants.get(clos, 0) | 1 << cpu
            if not wants:
                continue  # assoc-only: no thread asks for a CLOS
            clos = min(wants, key=lambda c: priority.get(c, (True, c)))
            asking = functools.reduce(operator.or_, wants.values())
            plan[clos] = plan.get(clos, 0) | (pending & asking or asking)
            if len(wants) > 1:
                self._log_shared_core(wants, clos)
        return plan

    def _log_shared_core(self, wants: dict[int, int], clos: int) -> None:
        parts = []
        level = logging.INFO
        for want, mask in sorted(wants.items()):
            names = sorted({self.class_of.get(c, "") for c in cpuset.ids(mask)})
            parts.append(
                f"{cpuset.format(mask)} (cpuClass {', '.join(quote(n) for n in names)}, "
                f"CLOS {want})"
            )
            if want != clos and any(n in self.plans for n in names):
                level = logging.WARNING  # a PCT class does not get its CLOS
        log.log(
            level,
            "pct: cpus %s share a core; SST associates whole cores: the core is on CLOS %d "
            "(the higher-priority CLOS wins)",
            " and ".join(parts),
            clos,
        )

    def _learn(self, requested: int, clos: int, reply: m.AssociateCpusReply) -> None:
        """The helper moved ``requested`` and the siblings its reply names to
        ``clos`` (only CPUs of the requested cores are believed)."""
        cores = self.topology.siblings(requested)
        moved = requested
        for cpu in reply.cpus:
            if 0 <= cpu < cores.bit_length() and cores >> cpu & 1:
                moved |= 1 << cpu
        for cpu in cpuset.ids(moved):
            self.known[cpu] = clos

    def _unlearn(self, cpus: int) -> None:
        """The association of the cores of ``cpus`` is not known any more."""
        for cpu in cpuset.ids(self.topology.siblings(cpus)):
            self.known.pop(cpu, None)

    def _associate_pending(self, timeout: float | None) -> Steps[None]:
        """The associations of the cores of the pending CPUs (see
        :meth:`core_plan`), one ``AssociateCpus`` per CLOS, all in one request
        (an ``Apply``; see :func:`nri_balloons.sstlink.together`); none for a
        core the helper reported on that CLOS already. A request without an
        answer leaves its CPUs pending: its outcome is unknown, they are sent
        again; until then the plugin is degraded and :meth:`clos_of` says
        nothing."""
        batch, self.pending = self.pending, 0  # decisions from now on: the next batch
        by_clos = self.core_plan(batch)
        debug = log.isEnabledFor(logging.DEBUG)
        for clos, mask in sorted(by_clos.items()):
            if self._holds(clos, mask):  # as the helper reported: nothing to send
                del by_clos[clos]
                if debug:
                    log.debug("pct: associated cpus %s to CLOS %d", cpuset.format(mask), clos)
        if not by_clos:
            return
        order = sorted(by_clos)
        asks = [m.AssociateCpus(clos=clos, cpus=cpuset.ids(by_clos[clos])) for clos in order]
        try:
            if len(asks) == 1:
                try:
                    replies: list[m.Reply | WriteRefused] = [
                        (yield from self._ask(asks[0], timeout))
                    ]
                except WriteRefused as exc:
                    replies = [exc]
            else:
                reply = yield from self._ask(m.Apply(items=list(asks)), timeout)
                replies = item_replies(reply, len(asks))
        except BaseException:  # unavailable, or the steps were abandoned
            self.pending |= functools.reduce(operator.or_, by_clos.values(), 0)
            raise
        for clos, answer in zip(order, replies, strict=True):
            mask = by_clos[clos]
            if not isinstance(answer, m.AssociateCpusReply) or answer.clos != clos:
                text = cpuset.format(mask)
                why = (
                    answer
                    if isinstance(answer, WriteRefused)
                    else WriteRefused(f"unexpected reply {type(answer).__name__}")
                )
                self._unlearn(mask)
                log.warning(
                    "cpuclass: pct failed to apply class on CPUs %s: "
                    "pct: associate cpus %s to CLOS %d: %s",
                    text,
                    text,
                    clos,
                    why,
                )
                continue
            self._learn(mask, clos, answer)
            if debug:
                log.debug("pct: associated cpus %s to CLOS %d", cpuset.format(mask), clos)

    def _holds(self, clos: int, mask: int) -> bool:
        """The helper reported every thread of the cores of ``mask`` on
        ``clos`` (an association would change nothing)."""
        return all(self.known.get(cpu) == clos for cpu in cpuset.ids(self.topology.siblings(mask)))

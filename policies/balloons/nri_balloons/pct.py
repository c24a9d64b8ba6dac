"""Priority Core Turbo: SST-CP/TF programming and CPU-to-CLOS association
(upstream ``pkg/resmgr/cpuclass/internal/pct``, reference §13).

The plugin never touches hardware: every SST operation is a typed request to
the privileged helper through the cpuClass handler's :class:`Writer`.

Modes (from the cpuClasses, §13.1): ``managed`` (``pctPriority``; the plugin
programs SST-CP/TF itself: PrepareManagedMode, CLOS bounds, EnableCP) and
``assoc-only`` (``sstClosID``; the operator programmed SST, the plugin only
associates CPUs). :meth:`PctAllocator.use` records which CLOS CPUs must be
on; :meth:`PctAllocator.flush_steps` (run by the handler's one commit per
decision) programs SST when the plan is new, and sends one ``AssociateCpus``
per CLOS for the cores the decisions moved to another CLOS (in the
decision's one request with its other writes:
:func:`nri_balloons.sstlink.together`). While the helper is away PCT is
*degraded*: decisions are still recorded, containers are still created and
pinned, and what is pending is sent when the helper is back. Only another
helper process (``HelloReply.instance`` changed: a restarted helper) makes SST
be programmed again, keeping what the hardware still holds for the same plan
(``PrepareManagedMode(keep_programmed=True)``), then every CPU re-associated;
a re-handshake with the same helper changes nothing.

The parts, one concept each: the plan (:mod:`nri_balloons.pctplan`: which
cpuClass asks for which CLOS), the state and helper access
(:mod:`nri_balloons.pctstate`), SST programming
(:mod:`nri_balloons.sstprogram`: Discover, PrepareManagedMode,
ConfigureClos, EnableCP, or reading the operator's assoc-only setup), the
CLOS association (:mod:`nri_balloons.closassoc`: CLOS is per core, pending
CPUs, ``core_plan``), and the placement hints and capacity
(:mod:`nri_balloons.pcthints`: ``hpReserveCpus``). This module is the
façade the cpuClass handler uses: :class:`PctAllocator` with configure,
flush (degraded and recovery), probe and inspection.

Log lines follow upstream's (logger ``cpuclass``; the ``cpu`` debug source
of the configuration enables it, as the spec's ``log.debug: [policy, cpu]``
expects).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

from nri_sst import messages as m

from nri_balloons.closassoc import ClosAssociation
from nri_balloons.config import CPUClass
from nri_balloons.pcthints import Hints, PlacementHints
from nri_balloons.pctplan import CLOS_COUNT, HP_CLOS, LP_CLOS, PctError, Plan, Punit, plan_classes
from nri_balloons.pctstate import DISCOVER_TIMEOUT
from nri_balloons.sstlink import Steps, WriteRefused, WriterUnavailable
from nri_balloons.sstprogram import SstProgramming

__all__ = [
    "CLOS_COUNT",
    "DISCOVER_TIMEOUT",
    "HP_CLOS",
    "LP_CLOS",
    "Hints",
    "PctAllocator",
    "PctError",
    "Plan",
    "Punit",
    "plan_classes",
]

log = logging.getLogger("cpuclass")


class PctAllocator(SstProgramming, ClosAssociation, PlacementHints):
    """SST state of one node, driven through the helper (see the module doc)."""

    # -- configuration (§13.2) -----------------------------------------------------

    def configure(self, classes: Sequence[CPUClass], allowed: int) -> None:
        """Plan ``classes``; the next :meth:`flush_steps` programs SST (managed)
        or reads it (assoc-only). Raises :class:`PctError` for a plan that
        cannot work. Talks to no helper."""
        mode, plans = plan_classes(classes, self._turbo)
        key = (mode, tuple(sorted(plans.items())), allowed)
        if self.mode and key == self._programmed_key and not self.need_program:
            # the same plan, programmed: SST stays as it is (no PrepareManagedMode
            # that would put every CPU on CLOS 0 meanwhile); the caller assigns
            # every CPU's class again
            log.debug("pct: SST already set up for this plan; keeping it")
            self.want = {}
            self.class_of = {}
            self.pending = 0
            return
        self.teardown_pending = self.managed_sst and mode != "managed"
        self._programmed_key = key
        self.plans = plans
        self.allowed = allowed
        self.mode = ""
        self.wanted_mode = mode
        self.hp_classes = set()
        self.hp_eligible = set()
        self.fallback_clos = 0
        self.want = {}
        self.class_of = {}
        self.pending = 0
        self.need_program = False
        if mode == "managed":  # known without the helper
            self.hp_classes = {n for n, p in plans.items() if p.priority == "high"}
            lp = [p.clos for p in plans.values() if p.priority == "low"]
            self.fallback_clos = lp[0] if lp else 0
        if not mode:
            log.debug("pct: no cpuClasses request PCT; PCT allocator disabled")
            return
        if self._turbo is None:
            log.warning("pct: cannot discover platform turbo info: no cpufreq frequency range")
        if not self.has_helper:
            log.warning("pct: no SST helper (--sst-helper); ignoring PCT fields in cpuClasses")
            self.wanted_mode = ""
            return
        self.need_program = True

    def flush_steps(self, timeout: float | None = None) -> Steps[bool]:
        """Reset SST when managed mode was left, program it when needed, and
        send the associations the decisions since the last flush touched.
        False when the helper is unavailable (PCT degraded; retried later).
        ``timeout``: per request (None: the writer's default), handed to every
        request of the flush (an argument, never state: two flushes' steps
        never see each other's)."""
        if self.teardown_pending and not (yield from self._reset_managed(timeout)):
            return False
        if not self.wanted_mode:
            self.pending = 0
            self.degraded = False
            return True
        try:
            if self.degraded:
                # the helper must answer before it counts as back: a flush
                # that sends nothing (cores already on their CLOS) proves nothing
                with contextlib.suppress(WriteRefused):  # a refusal is an answer
                    yield from self._ask(
                        m.GetAssociation(cpus=[min(self.punit_of, default=0)]), timeout
                    )
            for _attempt in range(2):
                if self._must_program():
                    if self.mode and not self.need_program:
                        log.warning("pct: SST helper reconnected; programming SST state again")
                    self.need_program = True
                    yield from self._program(timeout)
                if not self.mode:
                    self.pending = 0
                    return True
                if self.hold:
                    break  # programmed; the CPUs wait for the running containers
                yield from self._associate_pending(timeout)
                if not self._must_program():
                    break
                # the answers came from a restarted helper: program it all again
            else:
                return False  # restarted once more meanwhile: the next flush goes on
        except WriterUnavailable as exc:
            self._degrade(exc)
            return False
        except PctError as exc:
            log.error("%s; Priority Core Turbo is off", exc)
            self.need_program = False
            self.mode = ""
            return True
        if self.degraded:
            self.degraded = False
            log.info("pct: SST helper is back; SST state programmed and CPUs re-associated")
        return True

    def heard_restart(self) -> bool:
        """A reply to another request (the class settings sent in the same
        batch) came from another helper process than the one SST was
        programmed on: a flush programs it again. A flush with nothing to
        associate (every core on its CLOS already) sends nothing itself."""
        answered = self.writer.instance
        if not self.mode or not answered or answered == self.instance:
            return False
        self.instance = answered
        self._answered.add(answered)
        return self._must_program()

    def probe_steps(self, timeout: float | None = None) -> Steps[bool]:
        """Ask the helper something cheap to notice a restart (its SST state
        may be gone then). True when SST must be programmed or CPUs associated
        again (a flush does it). ``timeout``: the request's (None: the
        writer's default)."""
        if not self.mode or self.degraded or self.need_program or not self.punit_of:
            return self.need_program or self.degraded or self.teardown_pending
        try:
            yield from self._ask(m.GetAssociation(cpus=[min(self.punit_of)]), timeout)
        except WriterUnavailable as exc:
            self._degrade(exc)
            return True
        except WriteRefused:
            return False
        if self._must_program():
            log.warning("pct: SST helper reconnected; programming SST state again")
            self.need_program = True
        return self.need_program

    # -- inspection ------------------------------------------------------------------------

    def clos_of(self, cpu: int) -> int | None:
        """The CLOS ``cpu`` (its core) is on as the helper last reported it;
        ``None`` when that is not known for sure: PCT off, the helper away,
        restarted or to be programmed again (its SST state may be gone)."""
        if not self.mode or self.degraded or self._must_program():
            return None
        return self.known.get(cpu)

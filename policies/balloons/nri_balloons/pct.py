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
per CLOS for the CPUs the decisions touched. While the helper is away PCT is
*degraded*: decisions are still recorded, containers are still created and
pinned, and what is pending is sent when the helper is back. Only another
helper process (``HelloReply.instance`` changed: a restarted helper) makes SST
be programmed again, keeping what the hardware still holds for the same plan
(``PrepareManagedMode(keep_programmed=True)``), then every CPU re-associated;
a re-handshake with the same helper changes nothing.

CLOS is per core. SST associates *cores* (``CLOS_ASSOC`` addresses a punit
core; the kernel: "the granularity is at core level not at per CPU level",
reference sst.md §2.3), and a core has one frequency for its threads, so two
threads of one core cannot honour two CLOS. Upstream tracks association per
CPU and never notices; here the rule is:

* a class asks for a CLOS per CPU (:attr:`PctAllocator.want`), but a flush
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
* what the plugin reports (:meth:`PctAllocator.clos_of`, ``/debug/state``)
  is what the helper did: its ``AssociateCpusReply`` names every CPU moved,
  siblings included. A refused or unanswered association, and a helper that
  is away or must be programmed again, make the CLOS unknown (not shown)
  until the next association; a restarted plugin or helper re-associates
  every core;
* SST-TF selects its bucket by the number of HP *cores* per punit, so the HP
  room of the placement hints counts cores (upstream counts CPUs, which on
  an SMT part halves the room).

Placement hints (§13.6): HP balloons are steered to the punit with the most
HP room (then the most free CPUs), other balloons away from punits that hold
HP CPUs. :meth:`PctAllocator.free_class_capacity` is the extended-resource
capacity (§13.5).

Log lines follow upstream's (logger ``cpuclass``; the ``cpu`` debug source
of the configuration enables it, as the spec's ``log.debug: [policy, cpu]``
expects).
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from nri_framework import cpuset
from nri_framework.topology import Topology
from nri_sst import messages as m

from nri_balloons.config import CPUClass
from nri_balloons.frequency import Frequency
from nri_balloons.gofmt import quote
from nri_balloons.sstlink import (
    Ask,
    BudgetSpent,
    Steps,
    Writer,
    WriteRefused,
    WriterUnavailable,
)

log = logging.getLogger("cpuclass")

HP_CLOS = 0
LP_CLOS = 3
CLOS_COUNT = 4
DISCOVER_TIMEOUT = 2.0
"""Discovery, PrepareManagedMode and Teardown touch every punit: allowed more
than the per-request 100 ms (on the reply path the reply budget caps it)."""


class PctError(Exception):
    """A PCT plan that cannot be applied (upstream ``cpuclass: pct configure``)."""


@dataclass(frozen=True)
class Plan:
    """What one PCT cpuClass asks for."""

    clos: int
    min_khz: int = 0
    max_khz: int = 0
    managed: bool = True
    priority: str = ""
    """``high``/``low`` in managed mode"""


@dataclass
class Punit:
    package: int
    punit: int
    cpus: int
    """its CPUs among the allowed ones"""
    level: int = 0
    max_hp: int = 0
    guaranteed_hp: int = 0
    tf_supported: bool = False
    tf_enabled: bool = False
    bf_supported: bool = False

    @property
    def key(self) -> tuple[int, int]:
        return self.package, self.punit


@dataclass
class Hints:
    """Placement hints of one class for one resize: ``prefer`` is a list of
    hints, each an ordered list of alternative CPU sets; ``avoid`` CPU sets."""

    prefer: list[tuple[str, list[int]]] = field(default_factory=list)
    avoid: list[tuple[str, int]] = field(default_factory=list)


def plan_classes(
    classes: Sequence[CPUClass], turbo: tuple[int, int, int] | None
) -> tuple[str, dict[str, Plan]]:
    """Upstream ``planClasses``: ``(mode, plans)``; mode "" when no class asks
    for PCT. ``turbo``: (min, base, max) kHz of the platform, for symbolic
    frequencies (no arbitration: ``turbo`` is the hardware maximum)."""

    def khz(f: Frequency) -> int:
        if turbo is None:
            return int(f)
        return f.resolve(turbo[0], turbo[1], turbo[2])

    plans: dict[str, Plan] = {}
    managed = assoc = False
    for cc in classes:
        if cc.pct_priority:
            if cc.pct_priority not in ("high", "low"):
                raise PctError(
                    f"cpuClass {quote(cc.name)}: invalid pctPriority {quote(cc.pct_priority)}"
                )
            managed = True
            plans[cc.name] = Plan(
                clos=HP_CLOS if cc.pct_priority == "high" else LP_CLOS,
                min_khz=khz(cc.pct_min_freq or cc.min_freq),
                max_khz=khz(cc.pct_max_freq or cc.max_freq),
                priority=cc.pct_priority,
            )
        elif cc.sst_clos_id is not None:
            assoc = True
            plans[cc.name] = Plan(clos=cc.sst_clos_id, managed=False)
    if managed and assoc:
        raise PctError("pct: cannot mix managed (pctPriority) and assoc-only (sstClosID) modes")
    if managed:
        return "managed", plans
    if assoc:
        return "assoc-only", plans
    return "", {}


class PctAllocator:
    """SST state of one node, driven through the helper (see the module doc)."""

    def __init__(self, topology: Topology, writer: Writer) -> None:
        self.topology = topology
        self.writer = writer
        self.mode = ""
        """"" (inactive), ``managed`` or ``assoc-only``"""
        self.wanted_mode = ""
        """the mode of the configuration, also while the helper is away"""
        self.plans: dict[str, Plan] = {}
        self.allowed = 0
        self.supported: bool | None = None
        self.punits: list[Punit] = []
        self.punit_of: dict[int, int] = {}
        self.hp_classes: set[str] = set()
        self.hp_eligible: set[int] = set()
        self.fallback_clos = 0
        self.want: dict[int, int] = {}
        """cpu -> the CLOS its class asks for (its core's CLOS is resolved
        from its threads' at flush time, see the module doc)"""
        self.class_of: dict[int, str] = {}
        """cpu -> the class last used on it (HP room is derived from it)"""
        self.known: dict[int, int] = {}
        """cpu -> the CLOS the helper last reported or confirmed (siblings
        included: a core's threads move together)"""
        self.pending = 0
        """CPUs whose association a decision touched since the last flush
        (their whole cores are associated again), and those whose
        AssociateCpus has an unknown outcome (sent again)"""
        self.need_program = False
        """the SoC-wide SST state must be programmed (or read) before CPUs are
        associated: a new plan, or a restarted helper"""
        self.teardown_pending = False
        """managed mode was left by the configuration; SST is reset by the next flush"""
        self.degraded = False
        self.instance = ""
        """the helper process that answered the last request"""
        self.programmed_instance: str | None = None
        """the helper process SST was last programmed on (None: none yet)"""
        self.managed_sst = False
        """SST is in managed mode by our PrepareManagedMode (until a Teardown)"""
        self.hold = False
        """Program SST but associate no CPU yet: a starting plugin does not
        know the running containers before the runtime's Synchronize, and must
        not send their CPUs to the idle class (an HP pod off its CLOS) meanwhile"""
        self.requests_sent = 0
        self._programmed_key: object = None
        """the plan of the configuration"""
        self._answered: set[str] = set()
        self._discovery: m.DiscoverReply | None = None
        self._turbo: tuple[int, int, int] | None = None
        for c in topology.cpus.values():
            if c.freq.max and c.freq.min:
                self._turbo = (c.freq.min, c.freq.base or c.freq.max, c.freq.max)
                break

    # -- helper access -------------------------------------------------------------
    #
    # Everything that talks to the helper is written as steps (sstlink): the
    # reply path runs them blocking within its budget, the plugin's background
    # awaiting the asyncio client; between two requests of the background,
    # hooks run and only record decisions (``use``), which the steps pick up.

    @property
    def has_helper(self) -> bool:
        return bool(self.writer.endpoint)

    def _ask(self, req: m.Request, timeout: float | None, slow: bool = False) -> Steps[m.Reply]:
        """One request, ``timeout`` its own (None: the writer's default); the
        writer's :class:`WriterUnavailable` or :class:`WriteRefused` are
        raised here. ``slow``: it touches every punit (at least
        :data:`DISCOVER_TIMEOUT`, within the reply budget on the reply path)."""
        if slow:
            timeout = DISCOVER_TIMEOUT if timeout is None else max(timeout, DISCOVER_TIMEOUT)
        reply = yield Ask(req, timeout)
        self.requests_sent += 1
        self.instance = self.writer.instance
        self._answered.add(self.instance)
        return reply

    def _must_program(self) -> bool:
        """SST must be programmed before associating: a new plan, or an answer
        from another helper process than the one SST was programmed on."""
        return self.need_program or (bool(self.mode) and self.instance != self.programmed_instance)

    # -- configuration (§13.2) -----------------------------------------------------

    @property
    def active(self) -> bool:
        return bool(self.mode)

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

    def _reset_managed(self, timeout: float | None) -> Steps[bool]:
        """The configuration has no managed PCT any more: return SST to its
        reset state (what the helper also does when it stops in managed mode).
        False when the helper is away (tried again by the next flush)."""
        try:
            reply = yield from self._ask(m.Teardown(), timeout, slow=True)
        except WriterUnavailable as exc:
            self._degrade(exc)
            return False
        except WriteRefused as exc:
            log.warning("pct: managed mode left, but SST could not be reset: %s", exc)
            self.teardown_pending = False
            return True
        assert isinstance(reply, m.TeardownReply)
        self.teardown_pending = False
        self.managed_sst = False
        for pu in self.punits:
            pu.tf_enabled = False
        log.info(
            "pct: managed mode left; SST reset (CPReset, TFDisable, CPDisable) on %d punit(s)",
            reply.punits,
        )
        return True

    def _discover(self, timeout: float | None) -> Steps[bool]:
        """Punits from the helper, once (the topology is snapshotted, as upstream)."""
        if self._discovery is None:
            reply = yield from self._ask(m.Discover(), timeout, slow=True)
            assert isinstance(reply, m.DiscoverReply)
            self._discovery = reply
            self.supported = reply.supported
            for pkg in reply.packages:
                for pu in pkg.punits:
                    mask = cpuset.from_ids(pu.cpus)
                    if not pu.tf.buckets:
                        log.info(
                            "pct: SST discovered: pkg=%d punit=%d level=%d cpus=%s "
                            "maxHpCpus=0 (no PerfLevelInfo)",
                            pu.package,
                            pu.punit,
                            pu.pp.current_level,
                            cpuset.format(mask),
                        )
                        continue
                    log.info(
                        "pct: SST discovered: pkg=%d punit=%d level=%d cpus=%s "
                        "maxHpCpus=%d guaranteedHpCpus=%d (tf=%s bf=%s)",
                        pu.package,
                        pu.punit,
                        pu.pp.current_level,
                        cpuset.format(mask),
                        pu.max_hp_cpus,
                        pu.guaranteed_hp_cpus,
                        "true" if pu.tf.supported else "false",
                        "true" if pu.bf.supported else "false",
                    )
        return bool(self.supported)

    def _snapshot_punits(self) -> None:
        assert self._discovery is not None
        self.punits = []
        self.punit_of = {}
        for pkg in self._discovery.packages:
            for pu in pkg.punits:
                cpus = cpuset.from_ids(pu.cpus) & self.allowed
                if not cpus:
                    continue
                idx = len(self.punits)
                self.punits.append(
                    Punit(
                        package=pu.package,
                        punit=pu.punit,
                        cpus=cpus,
                        level=pu.pp.current_level,
                        max_hp=pu.max_hp_cpus,
                        guaranteed_hp=pu.guaranteed_hp_cpus,
                        tf_supported=pu.tf.supported,
                        tf_enabled=pu.tf.enabled,
                        bf_supported=pu.bf.supported,
                    )
                )
                for cpu in cpuset.ids(cpus):
                    self.punit_of[cpu] = idx

    def _program(self, timeout: float | None) -> Steps[None]:
        """Discover, then program (managed) or read (assoc-only) the SoC-wide
        state, and mark every wanted CPU for re-association. What hints read
        (``hp_eligible``, ``hp_classes``, ``mode``) changes only at the end:
        decisions taken between two requests see the previous state."""
        mode = self.wanted_mode
        self._answered = set()
        if not (yield from self._discover(timeout)):
            log.warning("pct: SST not supported on this host; ignoring PCT fields in cpuClasses")
            backend = self._discovery.backend if self._discovery else "?"
            log.warning(
                "pct: Speed Select Technology (SST) support not detected by the SST helper "
                "(backend %s): it cannot use /dev/isst_interface; with the Helm chart, "
                "install with --set allowPCT=true",
                backend,
            )
            self.mode = ""
            self.need_program = False
            return
        self._snapshot_punits()
        packages = {p.package for p in self.punits}
        log.info(
            "pct: mode=%s, %d PCT cpuClass(es), %d punit(s) across %d package(s)",
            mode,
            len(self.plans),
            len(self.punits),
            len(packages),
        )
        if mode == "managed":
            hp_eligible = yield from self._program_managed(timeout)
        else:
            hp_eligible = yield from self._program_assoc_only(timeout)
        self.hp_eligible = hp_eligible
        self.mode = mode
        self.need_program = False
        # every answer from one helper process, or SST is programmed again
        answered = self._answered or {self.instance}
        self.programmed_instance = answered.pop() if len(answered) == 1 else None
        self.pending |= cpuset.from_ids(self.want)

    def _program_managed(self, timeout: float | None) -> Steps[set[int]]:
        """PrepareManagedMode, CLOS bounds, EnableCP. Returns the HP-eligible
        punits (every one).

        SST already in managed state (a restarted helper or plugin: the
        hardware keeps what was programmed) is kept rather than reset, so no
        core drops to CLOS 0 meanwhile; what a reset would do is then done
        explicitly: every CLOS the plan does not use gets the reset bounds,
        and every CPU is re-associated (all are pending after programming)."""
        try:
            reply = yield from self._ask(
                m.PrepareManagedMode(keep_programmed=True), timeout, slow=True
            )
        except WriteRefused as exc:
            raise PctError(f"pct: failed to prepare managed mode: {exc}") from None
        assert isinstance(reply, m.PrepareManagedModeReply)
        self.managed_sst = True
        if reply.reset:
            log.debug(
                "pct: PrepareManagedMode done (CPReset+TFEnable+CPSetPriorityType=ordered) "
                "on %d punit(s)",
                reply.punits,
            )
            self.known = dict.fromkeys(self.punit_of, 0)  # CPReset: every CPU on CLOS 0
        else:
            log.debug(
                "pct: PrepareManagedMode: SST already in managed state on %d punit(s); kept as is",
                reply.punits,
            )
        for pu in self.punits:  # TFEnable (where the level supports it)
            pu.tf_enabled = pu.tf_supported
        by_clos: dict[int, Plan] = {}
        for plan in self.plans.values():
            by_clos.setdefault(plan.clos, plan)
        if not reply.reset:
            for clos in range(m.CLOS_COUNT):
                if clos not in by_clos:  # as CPReset leaves it: no limit
                    try:
                        yield from self._ask(
                            m.ConfigureClos(clos=clos, min_khz=0, max_khz=m.CLOS_NO_LIMIT_KHZ),
                            timeout,
                        )
                    except WriteRefused as exc:
                        raise PctError(f"pct: failed to configure CLOS {clos}: {exc}") from None
        for clos in sorted(by_clos):
            plan = by_clos[clos]
            log.debug(
                "pct: ConfigureClos {ClosID:%d MinFreq:%d MaxFreq:%d}",
                clos,
                plan.min_khz,
                plan.max_khz,
            )
            try:
                yield from self._ask(
                    m.ConfigureClos(clos=clos, min_khz=plan.min_khz, max_khz=plan.max_khz),
                    timeout,
                )
            except WriteRefused as exc:
                raise PctError(f"pct: failed to configure CLOS {clos}: {exc}") from None
            log.info("pct: programmed CLOS %d min=%d max=%d kHz", clos, plan.min_khz, plan.max_khz)
        try:
            reply = yield from self._ask(m.EnableCP(), timeout)
        except WriteRefused as exc:
            raise PctError(f"pct: failed to enable SST-CP: {exc}") from None
        assert isinstance(reply, m.EnableCPReply)
        log.debug("pct: EnableCP done on %d punit(s)", reply.punits)
        lp_clos: int | None = None
        for name, plan in self.plans.items():
            if plan.priority == "high":
                log.info(
                    "pct: cpuClass %s classified HP (managed: pctPriority=high, CLOS %d)",
                    quote(name),
                    plan.clos,
                )
            else:
                lp_clos = plan.clos
                log.info(
                    "pct: cpuClass %s classified LP (managed: pctPriority=low, CLOS %d)",
                    quote(name),
                    plan.clos,
                )
        if lp_clos is not None:
            log.info("pct: fallback CLOS for non-PCT CPUs set to %d (LP)", lp_clos)
        return set(range(len(self.punits)))

    def _program_assoc_only(self, timeout: float | None) -> Steps[set[int]]:
        """Read what the operator programmed; sets the HP classes, returns the
        HP-eligible punits (SST-TF enabled)."""
        best: tuple[int, int] | None = None  # (max kHz, clos)
        for clos in sorted({p.clos for p in self.plans.values()}):
            try:
                reply = yield from self._ask(m.GetClosConfig(clos=clos), timeout)
            except WriteRefused as exc:
                log.warning("pct: assoc-only: GetClosConfig(%d) failed: %s", clos, exc)
                continue
            assert isinstance(reply, m.GetClosConfigReply)
            cfg = reply.config
            if cfg.max_khz <= 0:
                log.info("pct: assoc-only: CLOS %d not programmed; cannot classify HP/LP", clos)
                continue
            log.info(
                "pct: assoc-only: CLOS %d programmed min=%d max=%d kHz",
                clos,
                cfg.min_khz,
                cfg.max_khz,
            )
            if best is None or cfg.max_khz > best[0]:
                best = (cfg.max_khz, clos)
        hp_classes: set[str] = set()
        if best is None:
            log.info("pct: assoc-only: no CLOS has a programmed MaxFreq; HP classification skipped")
        else:
            for name, plan in self.plans.items():
                if plan.clos == best[1]:
                    hp_classes.add(name)
                    log.info(
                        "pct: cpuClass %s classified HP (assoc-only: CLOS %d MaxFreq=%d kHz)",
                        quote(name),
                        best[1],
                        best[0],
                    )
        hp_eligible: set[int] = set()
        try:
            tf = yield from self._ask(m.TFStatus(), timeout)
        except WriteRefused as exc:
            log.warning("pct: assoc-only: cannot read SST-TF status: %s", exc)
        else:
            assert isinstance(tf, m.TFStatusReply)
            enabled = {(p.package, p.punit) for p in tf.punits if p.enabled}
            for idx, pu in enumerate(self.punits):
                if pu.key in enabled:
                    hp_eligible.add(idx)
                    continue
                log.warning(
                    "pct: assoc-only: SST-TF disabled on pkg=%d punit=%d; HP cores on this punit "
                    "cannot exceed the standard turbo-ratio bucket frequency. Enable with: "
                    "intel-speed-select -c %d turbo-freq enable -a",
                    pu.package,
                    pu.punit,
                    (pu.cpus & -pu.cpus).bit_length() - 1,
                )
        # what the operator associated: the CLOS hints read it
        cpus = sorted(self.punit_of)
        try:
            reply = yield from self._ask(m.GetAssociation(cpus=cpus), timeout)
        except WriteRefused as exc:
            log.warning("pct: assoc-only: cannot read CPU associations: %s", exc)
            self.known = {}
        else:
            assert isinstance(reply, m.GetAssociationReply)
            self.known = dict(reply.clos)
        self.hp_classes = hp_classes
        return hp_eligible

    def _degrade(self, exc: WriterUnavailable) -> None:
        """The helper did not answer: decisions are still recorded, and what
        is pending is sent when it is back (SST programmed again only if it
        is another helper process then). A spent reply budget is not an
        outage: the background just goes on."""
        if isinstance(exc, BudgetSpent):
            log.info("pct: %s; SST is programmed in the background", exc)
            return
        if not self.degraded:
            log.error(
                "pct: SST helper unavailable: %s; Priority Core Turbo is degraded (containers are "
                "still created and pinned; SST is programmed again when the helper is back)",
                exc,
            )
        self.degraded = True

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

    # -- association (§13.3) -------------------------------------------------------

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

    def clos_for(self, name: str) -> int | None:
        """The CLOS class ``name`` asks for: its plan's; other classes the
        fallback in managed mode and none in assoc-only mode (§13.3)."""
        plan = self.plans.get(name)
        if plan is not None:
            return plan.clos
        if self.wanted_mode == "managed":
            return self.fallback_clos
        return None

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

    def _associate_pending(self, timeout: float | None) -> Steps[None]:
        """One AssociateCpus per CLOS for the cores of the pending CPUs (see
        :meth:`core_plan`). A request without an answer leaves its CPUs (and
        those not sent yet) pending: its outcome is unknown, they are sent
        again; until then the plugin is degraded and :meth:`clos_of` says
        nothing."""
        batch, self.pending = self.pending, 0  # decisions from now on: the next batch
        by_clos = self.core_plan(batch)
        todo = functools.reduce(operator.or_, by_clos.values(), 0)
        try:
            for clos in sorted(by_clos):
                mask = by_clos[clos]
                text = cpuset.format(mask)
                try:
                    reply = yield from self._ask(
                        m.AssociateCpus(clos=clos, cpus=cpuset.ids(mask)), timeout
                    )
                    if not isinstance(reply, m.AssociateCpusReply) or reply.clos != clos:
                        raise WriteRefused(f"unexpected reply {type(reply).__name__}")
                except WriteRefused as exc:
                    todo &= ~mask
                    self._unlearn(mask)
                    log.warning(
                        "cpuclass: pct failed to apply class on CPUs %s: "
                        "pct: associate cpus %s to CLOS %d: %s",
                        text,
                        text,
                        clos,
                        exc,
                    )
                    continue
                todo &= ~mask
                self._learn(mask, clos, reply)
                log.debug("pct: associated cpus %s to CLOS %d", text, clos)
        except BaseException:  # unavailable, or the steps were abandoned
            self.pending |= todo
            raise

    # -- hints (§13.6) ------------------------------------------------------------------

    def hints(self, name: str, requested: int, free: int, current: int) -> Hints:
        """Upstream ``Hints(intent)``; every candidate set is non-empty and
        within the allowed CPUs."""
        out = Hints()
        if not self.mode or requested < 1:
            return out
        free &= self.allowed
        clos = self.clos_for(name)
        if clos is not None:
            shared = self._shared_core_cpus(clos, free, current)
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
            used = self._hp_used()
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
            for idx in self._hp_used():
                in_use |= self.punits[idx].cpus
            if in_use:
                out.avoid.append(("sst-hp-in-use", in_use & self.allowed))
        return out

    def _shared_core_cpus(self, clos: int, free: int, current: int) -> int:
        """The CPUs of ``free`` whose core has a thread in use (neither free
        nor ``current``) on or asking for another CLOS than ``clos``."""
        busy = self.topology.siblings(free) & ~free & ~current
        other = 0
        for cpu in cpuset.ids(busy):
            theirs = self.want.get(cpu, self.known.get(cpu))
            if theirs is not None and theirs != clos:
                other |= 1 << cpu
        return self.topology.siblings(other) & free if other else 0

    def _hp_used(self) -> dict[int, int]:
        """punit index -> the CPUs an HP class runs on there (from ``class_of``)."""
        used: dict[int, int] = {}
        for cpu, name in self.class_of.items():
            idx = self.punit_of.get(cpu)
            if idx is not None and name in self.hp_classes:
                used[idx] = used.get(idx, 0) | 1 << cpu
        return used

    def _room(self, idx: int, current: int, used: dict[int, int]) -> int:
        """HP cores the punit can still take (SST-TF counts cores)."""
        pu = self.punits[idx]
        if pu.max_hp <= 0:
            return 0
        return pu.max_hp - self.topology.single_thread(used.get(idx, 0) & ~current).bit_count()

    def _hp_reserve(
        self, free: int, current: int, requested: int, used: dict[int, int]
    ) -> list[int]:
        """Upstream ``hpReserveCpus``: disjoint candidate sets, best first
        (``used``: :meth:`_hp_used`)."""
        if not any(pu.max_hp > 0 for pu in self.punits):
            return []
        need = max(requested, 1)
        # Sorted by room, then free CPUs, then ids (upstream); unlike upstream a
        # growing balloon first stays on the punit it is on (its HP budget).
        tier_a: list[tuple[bool, int, int, int, int, int]] = []
        for idx, pu in enumerate(self.punits):
            if idx not in self.hp_eligible:
                continue
            pfree = free & pu.cpus
            room = self._room(idx, current, used)
            if pfree.bit_count() >= need and room >= need:
                away = not current & pu.cpus
                tier_a.append((away, -room, -pfree.bit_count(), pu.package, pu.punit, idx))
        if tier_a:
            tier_a.sort()
            sets = []
            for _, neg_room, _, pkg, pun, idx in tier_a:
                pfree = free & self.punits[idx].cpus
                log.debug(
                    "pct: hpReserveCpus tier=A punit=%d/%d room=%d free=%s",
                    pkg,
                    pun,
                    -neg_room,
                    cpuset.format(pfree),
                )
                sets.append(pfree)
            return sets
        per_pkg: dict[int, tuple[int, int]] = {}
        for idx, pu in enumerate(self.punits):
            if idx not in self.hp_eligible:
                continue
            room = self._room(idx, current, used)
            pfree = free & pu.cpus
            if room > 0 and pfree:
                r, f = per_pkg.get(pu.package, (0, 0))
                per_pkg[pu.package] = (r + room, f | pfree)
        tier_b = sorted(
            (-r, -f.bit_count(), pkg, f)
            for pkg, (r, f) in per_pkg.items()
            if r >= requested and f.bit_count() >= requested
        )
        if tier_b:
            for neg_room, _, pkg, f in tier_b:
                log.debug(
                    "pct: hpReserveCpus tier=B pkg=%d room=%d free=%s",
                    pkg,
                    -neg_room,
                    cpuset.format(f),
                )
            return [f for _, _, _, f in tier_b]
        log.debug(
            "pct: hpReserveCpus tier=none (no punit or package has %d HP room with %d free CPUs)",
            requested,
            requested,
        )
        return []

    # -- capacity (§13.5) --------------------------------------------------------------

    def free_class_capacity(self, name: str, held: int) -> int:
        if not self.mode or name not in self.plans:
            return 0
        if name in self.hp_classes:
            total = 0
            for idx, pu in enumerate(self.punits):
                if idx not in self.hp_eligible or pu.guaranteed_hp <= 0:
                    continue
                total += max(min(pu.guaranteed_hp, (pu.cpus & self.allowed & ~held).bit_count()), 0)
            return total
        return (self.allowed & ~held).bit_count()

    def log_placement(self, balloon: str, name: str, cpus: int) -> None:
        """Where a balloon of a PCT class landed (spec step 11: "the plugin
        log prints the punit each new balloon is assigned to")."""
        if not self.mode or name not in self.plans or not cpus:
            return
        keys = sorted({k for c in cpuset.ids(cpus) if (k := self.punit_key(c)) is not None})
        log.info(
            "pct: balloon %s (cpuClass %s, CLOS %d) on cpus %s: %s",
            balloon,
            quote(name),
            self.plans[name].clos,
            cpuset.format(cpus),
            ", ".join(f"pkg={p} punit={u}" for p, u in keys) or "no punit",
        )

    # -- inspection ------------------------------------------------------------------------

    def punit_key(self, cpu: int) -> tuple[int, int] | None:
        idx = self.punit_of.get(cpu)
        return None if idx is None else self.punits[idx].key

    def clos_of(self, cpu: int) -> int | None:
        """The CLOS ``cpu`` (its core) is on as the helper last reported it;
        ``None`` when that is not known for sure: PCT off, the helper away,
        restarted or to be programmed again (its SST state may be gone)."""
        if not self.mode or self.degraded or self._must_program():
            return None
        return self.known.get(cpu)

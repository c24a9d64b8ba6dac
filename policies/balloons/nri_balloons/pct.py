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

Placement hints (§13.6): HP balloons are steered to the punit with the most
HP room (then the most free CPUs), other balloons away from punits that hold
HP CPUs. :meth:`PctAllocator.free_class_capacity` is the extended-resource
capacity (§13.5).

Log lines follow upstream's (logger ``cpuclass``; the ``cpu`` debug source
of the configuration enables it, as the spec's ``log.debug: [policy, cpu]``
expects).
"""

from __future__ import annotations

import logging
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
        """cpu -> the CLOS it must be on"""
        self.class_of: dict[int, str] = {}
        """cpu -> the class last used on it (HP room is derived from it)"""
        self.known: dict[int, int] = {}
        """cpu -> the CLOS the helper last reported or confirmed"""
        self.pending = 0
        """CPUs whose association a decision touched since the last flush (and
        those whose AssociateCpus has an unknown outcome: sent again)"""
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
        self.requests_sent = 0
        self.timeout: float | None = None
        """per-request timeout of the current flush (None: the writer's default)"""
        self._programmed_key: object = None
        """the plan of the configuration"""
        self._sst_key: object = None
        """the plan SST was last programmed with (kept over a helper restart:
        the same plan then keeps what the hardware still has)"""
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

    def _ask(self, req: m.Request, slow: bool = False) -> Steps[m.Reply]:
        """One request; the writer's :class:`WriterUnavailable` or
        :class:`WriteRefused` are raised here. ``slow``: it touches every punit
        (at least :data:`DISCOVER_TIMEOUT`, within the reply budget on the
        reply path)."""
        timeout = self.timeout
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

    def _reset_managed(self) -> Steps[bool]:
        """The configuration has no managed PCT any more: return SST to its
        reset state (what the helper also does when it stops in managed mode).
        False when the helper is away (tried again by the next flush)."""
        try:
            reply = yield from self._ask(m.Teardown(), slow=True)
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

    def _discover(self) -> Steps[bool]:
        """Punits from the helper, once (the topology is snapshotted, as upstream)."""
        if self._discovery is None:
            reply = yield from self._ask(m.Discover(), slow=True)
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

    def _program(self) -> Steps[None]:
        """Discover, then program (managed) or read (assoc-only) the SoC-wide
        state, and mark every wanted CPU for re-association. What hints read
        (``hp_eligible``, ``hp_classes``, ``mode``) changes only at the end:
        decisions taken between two requests see the previous state."""
        mode = self.wanted_mode
        self._answered = set()
        if not (yield from self._discover()):
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
            hp_eligible = yield from self._program_managed()
        else:
            hp_eligible = yield from self._program_assoc_only()
        self.hp_eligible = hp_eligible
        self.mode = mode
        self.need_program = False
        # every answer from one helper process, or SST is programmed again
        answered = self._answered or {self.instance}
        self.programmed_instance = answered.pop() if len(answered) == 1 else None
        self._sst_key = self._programmed_key
        self.pending |= cpuset.from_ids(self.want)

    def _program_managed(self) -> Steps[set[int]]:
        """PrepareManagedMode (keeping what SST holds when it was programmed
        for this very plan: a restarted helper), CLOS bounds, EnableCP.
        Returns the HP-eligible punits (every one)."""
        keep = self._sst_key == self._programmed_key
        try:
            reply = yield from self._ask(m.PrepareManagedMode(keep_programmed=keep), slow=True)
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
                    m.ConfigureClos(clos=clos, min_khz=plan.min_khz, max_khz=plan.max_khz)
                )
            except WriteRefused as exc:
                raise PctError(f"pct: failed to configure CLOS {clos}: {exc}") from None
            log.info("pct: programmed CLOS %d min=%d max=%d kHz", clos, plan.min_khz, plan.max_khz)
        try:
            reply = yield from self._ask(m.EnableCP())
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

    def _program_assoc_only(self) -> Steps[set[int]]:
        """Read what the operator programmed; sets the HP classes, returns the
        HP-eligible punits (SST-TF enabled)."""
        best: tuple[int, int] | None = None  # (max kHz, clos)
        for clos in sorted({p.clos for p in self.plans.values()}):
            try:
                reply = yield from self._ask(m.GetClosConfig(clos=clos))
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
            tf = yield from self._ask(m.TFStatus())
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
            reply = yield from self._ask(m.GetAssociation(cpus=cpus))
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

    def probe_steps(self) -> Steps[bool]:
        """Ask the helper something cheap to notice a restart (its SST state
        may be gone then). True when SST must be programmed or CPUs associated
        again (a flush does it)."""
        if not self.mode or self.degraded or self.need_program or not self.punit_of:
            return self.need_program or self.degraded or self.teardown_pending
        try:
            yield from self._ask(m.GetAssociation(cpus=[min(self.punit_of)]))
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
        """Class ``name`` ("" = none) now runs on ``cpus``: record their CLOS."""
        if not self.wanted_mode:
            return
        cpus &= self.allowed
        if not cpus:
            return
        for cpu in cpuset.ids(cpus):
            self.class_of[cpu] = name
        plan = self.plans.get(name)
        if plan is not None:
            clos = plan.clos
        elif self.wanted_mode == "managed":
            clos = self.fallback_clos
        else:
            return  # assoc-only: non-PCT CPUs are left alone
        for cpu in cpuset.ids(cpus):
            self.want[cpu] = clos
        self.pending |= cpus

    def flush_steps(self, timeout: float | None = None) -> Steps[bool]:
        """Reset SST when managed mode was left, program it when needed, and
        send the associations the decisions since the last flush touched.
        False when the helper is unavailable (PCT degraded; retried later).
        ``timeout``: per request (None: the writer's default)."""
        self.timeout = timeout
        try:
            return (yield from self._flush())
        finally:
            self.timeout = None

    def _flush(self) -> Steps[bool]:
        if self.teardown_pending and not (yield from self._reset_managed()):
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
                    yield from self._program()
                if not self.mode:
                    self.pending = 0
                    return True
                yield from self._associate_pending()
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

    def _associate_pending(self) -> Steps[None]:
        """One AssociateCpus per CLOS for the pending CPUs. A request without
        an answer leaves its CPUs (and those not sent yet) pending: its
        outcome is unknown, they are sent again."""
        batch, self.pending = self.pending, 0  # decisions from now on: the next batch
        by_clos: dict[int, list[int]] = {}
        for cpu in cpuset.ids(batch):
            clos = self.want.get(cpu)
            if clos is not None and cpu in self.punit_of:
                by_clos.setdefault(clos, []).append(cpu)
        todo = cpuset.from_ids(c for cpus in by_clos.values() for c in cpus)
        try:
            for clos in sorted(by_clos):
                cpus = by_clos[clos]
                mask = cpuset.from_ids(cpus)
                text = cpuset.format(mask)
                try:
                    yield from self._ask(m.AssociateCpus(clos=clos, cpus=cpus))
                except WriteRefused as exc:
                    todo &= ~mask
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
                for cpu in cpus:
                    self.known[cpu] = clos
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
        plan = self.plans.get(name)
        if plan is not None:
            on_clos = cpuset.from_ids(c for c, k in self.known.items() if k == plan.clos) & free
            if on_clos.bit_count() >= requested:
                out.prefer.append((f"sst-clos-{plan.clos}", [on_clos]))
        if name in self.hp_classes:
            sets = self._hp_reserve(free, current, requested)
            if sets:
                out.prefer.append(("sst-hp-reserve", sets))
            return out
        if self.hp_classes:
            in_use = 0
            for idx in self._hp_used():
                in_use |= self.punits[idx].cpus
            if in_use:
                out.avoid.append(("sst-hp-in-use", in_use & self.allowed))
        return out

    def _hp_used(self) -> dict[int, int]:
        """punit index -> the CPUs an HP class runs on there (from ``class_of``)."""
        used: dict[int, int] = {}
        for cpu, name in self.class_of.items():
            idx = self.punit_of.get(cpu)
            if idx is not None and name in self.hp_classes:
                used[idx] = used.get(idx, 0) | 1 << cpu
        return used

    def _room(self, idx: int, current: int, used: dict[int, int]) -> int:
        pu = self.punits[idx]
        if pu.max_hp <= 0:
            return 0
        return pu.max_hp - (used.get(idx, 0) & ~current).bit_count()

    def _hp_reserve(self, free: int, current: int, requested: int) -> list[int]:
        """Upstream ``hpReserveCpus``: disjoint candidate sets, best first."""
        if not any(pu.max_hp > 0 for pu in self.punits):
            return []
        need = max(requested, 1)
        used = self._hp_used()
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
        return self.known.get(cpu)

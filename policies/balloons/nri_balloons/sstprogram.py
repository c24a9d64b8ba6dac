"""Programming Speed Select for the PCT plan (reference §13.2, sst.md): the
sequence a flush runs when the plan is new or the helper was restarted.

Discovery (``Discover``, once: the punits are snapshotted, as upstream),
then in managed mode ``PrepareManagedMode`` (keeping what the hardware holds
for the same plan), ``ConfigureClos`` per CLOS and ``EnableCP`` (SST-TF is
enabled with the preparation); in assoc-only mode the operator's
programming is read (``GetClosConfig``, ``TFStatus``, ``GetAssociation``) to
classify HP classes and eligible punits. Leaving managed mode is a
``Teardown``. The state is :class:`~nri_balloons.pctstate.PctState`; the
flush that calls this is :meth:`nri_balloons.pct.PctAllocator.flush_steps`,
the CPUs' association after programming :mod:`nri_balloons.closassoc`.
"""

from __future__ import annotations

import logging

from nri_framework import cpuset
from nri_sst import messages as m

from nri_balloons.gofmt import quote
from nri_balloons.pctplan import PctError, Plan, Punit
from nri_balloons.pctstate import PctState
from nri_balloons.sstlink import Steps, WriteRefused, WriterUnavailable

log = logging.getLogger("cpuclass")


class SstProgramming(PctState):
    """Discovery and the SoC-wide SST programming of the plan (see the module doc)."""

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
            # believed again only as the re-association answers (every CPU is
            # pending; none is skipped as held)
            self.known = {}
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

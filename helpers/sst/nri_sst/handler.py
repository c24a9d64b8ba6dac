"""The request handler, sans-IO: bytes in, bytes out, never an exception.

:meth:`RequestHandler.handle` decodes (size first), checks the handshake,
validates against the discovered machine, runs the operation on the
:class:`~nri_sst.sst_platform.SstPlatform` and the sysfs writers, and encodes the
typed reply or an :class:`~nri_sst.messages.ErrorReply`. The ZeroMQ server is
a thin loop around it; tests drive it directly.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from nri_sst import PROTOCOL_VERSION, validate
from nri_sst import messages as m
from nri_sst.backends.base import MSR_APERF, MSR_MPERF, MSR_TSC, Backend
from nri_sst.hostfs import Machine, SysfsError, SysfsWriter, discover_machine
from nri_sst.interrupts import Interrupts, IrqWriteError
from nri_sst.resctrl import Resctrl
from nri_sst.sst_platform import SstPlatform

log = logging.getLogger("nri_sst")

CAPABILITIES = [
    "sst-cp",
    "sst-tf",
    "cstates",
    "cpufreq",
    "uncore",
    "aperf-mperf",
    "irq",
    "resctrl",
    "apply",
]
MAX_PEERS = 1024

Write = Callable[[], tuple[m.ApplyItemReply, bool]]
"""A validated write: its reply and whether it changed anything."""


def _kind(req: m.Request) -> str:
    """What ``req`` asks, for the debug log: its type, an ``Apply``'s items' too."""
    if isinstance(req, m.Apply):
        return f"Apply({', '.join(type(i).__name__ for i in req.items)})"
    return type(req).__name__


class PeerTable:
    """The peers that said Hello, least recently active first, at most ``limit``.

    A request of a peer makes it the most recent; a Hello beyond the limit
    ends the session of the least recently active peer only, so a client in
    use keeps its session whatever other clients do. The server ends the
    session of a peer whose connection closed (:meth:`discard`)."""

    def __init__(self, limit: int = MAX_PEERS) -> None:
        self.limit = limit
        self._peers: OrderedDict[bytes, None] = OrderedDict()

    def add(self, peer: bytes) -> None:
        self._peers[peer] = None
        self._peers.move_to_end(peer)
        while len(self._peers) > self.limit:
            self._peers.popitem(last=False)

    def touch(self, peer: bytes) -> bool:
        """Mark ``peer`` active; False when it has no session."""
        if peer not in self._peers:
            return False
        self._peers.move_to_end(peer)
        return True

    def discard(self, peer: bytes) -> None:
        self._peers.pop(peer, None)

    def __contains__(self, peer: object) -> bool:
        return peer in self._peers

    def __len__(self) -> int:
        return len(self._peers)


class RequestHandler:
    def __init__(self, backend: Backend, host_root: Path) -> None:
        self.backend = backend
        self.host_root = Path(host_root)
        self.machine: Machine = discover_machine(self.host_root)
        self.platform = SstPlatform(backend, self.machine)
        self.writer = SysfsWriter(self.machine)
        self.interrupts: Interrupts = backend.interrupts(self.machine)
        self.resctrl: Resctrl = backend.resctrl(self.machine)
        self.managed = False
        """True after PrepareManagedMode until Teardown: SIGTERM then resets SST."""
        self.peers = PeerTable()
        self._sync_failed = False
        self.instance = os.urandom(8).hex()
        """Random per process (HelloReply.instance): a restarted helper is a new one."""
        for w in self.platform.warnings:
            log.warning("sst: %s", w)

    # ------------------------------------------------------------------ entry point

    def handle(self, data: bytes, peer: bytes = b"") -> bytes:
        try:
            req = m.decode_request(data)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("nri-sst-helper: request %s from peer %s", _kind(req), peer.hex())
            reply = self.dispatch(req, peer)
        except m.HelperError as exc:
            reply = exc.reply()
        except Exception as exc:  # a bug must not kill the helper
            log.exception("internal error handling a request")
            reply = m.ErrorReply(code="internal", message=f"internal error: {exc!r}")
        return m.encode(reply)

    def forget(self, peer: bytes) -> None:
        """``peer`` is gone (its connection closed): it must say Hello again."""
        self.peers.discard(peer)

    def dispatch(self, req: m.Request, peer: bytes = b"") -> m.Reply:
        if isinstance(req, m.Hello):
            validate.hello(req)
            self.peers.add(peer)
            return m.HelloReply(
                protocol=PROTOCOL_VERSION,
                backend=self.backend.name,
                sst_supported=self.platform.supported,
                capabilities=list(CAPABILITIES),
                instance=self.instance,
            )
        if not self.peers.touch(peer):
            raise m.HelperError("handshake-required", "send Hello first")
        changed = True
        try:
            reply, changed = self._run(req)
        finally:
            if changed:
                self._sync()
        return reply

    def _sync(self) -> None:
        """The backend's after-change hook; its failure (the sim's state file
        cannot be written) does not undo the change the reply reports."""
        try:
            self.backend.sync()
        except OSError as exc:
            if not self._sync_failed:
                log.error("sst: backend sync failed: %s", exc)
            self._sync_failed = True
        else:
            self._sync_failed = False

    def _sst(self) -> SstPlatform:
        self.platform.require()
        return self.platform

    def _run(self, req: m.Request) -> tuple[m.Reply, bool]:
        mc = self.machine
        if isinstance(req, m.Discover):
            return self.discover(), False
        if isinstance(req, m.PrepareManagedMode):
            sst = self._sst()
            reset = sst.prepare_managed_mode(req.keep_programmed)
            self.managed = True
            if reset:
                log.info(
                    "sst: PrepareManagedMode done (CPReset+TFEnable+CPSetPriorityType=ordered)"
                )
            else:
                log.info("sst: PrepareManagedMode: SST already in managed state; kept as is")
            return m.PrepareManagedModeReply(punits=len(sst.punits), reset=reset), reset
        if isinstance(req, m.ConfigureClos):
            clos = validate.clos(req.clos)
            validate.clos_freqs(mc, req.min_khz, req.max_khz, req.proportional_priority)
            sst = self._sst()
            sst.configure_clos(clos, req.min_khz, req.max_khz, req.proportional_priority)
            log.info("sst: programmed CLOS %d min=%d max=%d kHz", clos, req.min_khz, req.max_khz)
            return m.ConfigureClosReply(config=sst.clos_config(sst.first_punit(), clos)), True
        if isinstance(req, m.EnableCP):
            sst = self._sst()
            sst.enable_cp()
            return m.EnableCPReply(punits=len(sst.punits)), True
        if isinstance(req, m.ApplyItem):
            return self._prepare(req)()
        if isinstance(req, m.Apply):
            return self.apply(req)
        if isinstance(req, m.GetAssociation):
            cpus = validate.cpus(mc, req.cpus)
            sst = self._sst()
            validate.sst_cpus(mc, sst.punit_of, cpus)
            return m.GetAssociationReply(clos=sst.get_association(cpus)), False
        if isinstance(req, m.GetClosConfig):
            clos = validate.clos(req.clos)
            sst = self._sst()
            return m.GetClosConfigReply(config=sst.clos_config(sst.first_punit(), clos)), False
        if isinstance(req, m.TFStatus):
            return m.TFStatusReply(punits=self._sst().tf_status()), False
        if isinstance(req, m.Teardown):
            sst = self._sst()
            self.teardown()
            return m.TeardownReply(punits=len(sst.punits)), True
        if isinstance(req, m.ReadFrequency):
            cpus = validate.cpus(mc, req.cpus)
            return self.read_frequency(cpus, req.clos), False
        if isinstance(req, m.ListInterrupts):
            return m.ListInterruptsReply(
                interrupts=self.interrupts.read(),
                default_affinity=self.interrupts.default_affinity(),
            ), False
        if isinstance(req, m.ReadResctrl):
            return self.resctrl.read(), False
        if isinstance(req, m.SetResctrl):
            return self.set_resctrl(req), True
        raise m.HelperError("unknown-message", f"unhandled request {type(req).__name__}")

    # ------------------------------------------------------------------ writes

    def _prepare(self, req: m.ApplyItem) -> Write:
        """Validate a write against the machine as it is now (raising
        :class:`~nri_sst.messages.HelperError`, nothing written); the write
        itself is what is returned."""
        mc = self.machine
        if isinstance(req, m.AssociateCpus):
            clos = validate.clos(req.clos)
            cpus = validate.cpus(mc, req.cpus)
            sst = self._sst()
            validate.sst_cpus(mc, sst.punit_of, cpus)
            return lambda: (m.AssociateCpusReply(clos=clos, cpus=sst.associate(clos, cpus)), True)
        if isinstance(req, m.SetCstates):
            cpus, names = validate.cstates(mc, req)
            return lambda: self._set_cstates(cpus, names)
        if isinstance(req, m.SetCpufreq):
            cpus = validate.cpufreq(mc, req, self.writer.cpufreq_now)
            return lambda: self._set_cpufreq(cpus, req)
        if isinstance(req, m.SetUncore):
            validate.uncore(mc, req, self.writer.uncore_now)
            return lambda: self._set_uncore(req)
        known = {i.number: i for i in self.interrupts.read()}
        batch = validate.irq_affinity(mc, known, req)
        return lambda: (self._set_irq_affinity(batch), True)

    def apply(self, req: m.Apply) -> tuple[m.ApplyReply, bool]:
        """Every item validated first (one invalid refuses the whole request,
        nothing written), then each written in order (see :class:`m.Apply`)."""
        if len(req.items) > m.MAX_APPLY_ITEMS:
            raise m.HelperError(
                "invalid-argument",
                f"apply: {len(req.items)} items exceed the limit of {m.MAX_APPLY_ITEMS}",
            )
        irqs = sum(
            len(g.irqs) for i in req.items if isinstance(i, m.SetIrqAffinity) for g in i.groups
        )
        if irqs > m.MAX_IRQ_BATCH:
            raise m.HelperError(
                "invalid-argument",
                f"apply: {irqs} IRQs exceed the limit of {m.MAX_IRQ_BATCH}",
            )
        writes = []
        for n, item in enumerate(req.items):
            try:
                writes.append(self._prepare(item))
            except m.HelperError as exc:
                raise m.HelperError(
                    exc.code, f"apply: item {n} ({type(item).__name__}): {exc.message}"
                ) from None
        replies: list[m.ApplyItemReply] = []
        changed = False
        for write in writes:
            try:
                reply, did = write()
            except m.HelperError as exc:  # what it wrote before failing stays
                reply, did = exc.reply(), True
            replies.append(reply)
            changed = changed or did
        return m.ApplyReply(replies=replies), changed

    def _set_cstates(self, cpus: list[int], names: frozenset[str]) -> tuple[m.ApplyItemReply, bool]:
        try:
            for cpu in cpus:
                self.writer.set_cstates(cpu, names)
        except SysfsError as exc:
            raise m.HelperError("hardware-error", str(exc)) from None
        # idle states change no frequency limit (sst.md §5.5.12): nothing to sync
        return m.SetCstatesReply(cpus=cpus, disabled=sorted(names)), False

    def _set_cpufreq(self, cpus: list[int], req: m.SetCpufreq) -> tuple[m.ApplyItemReply, bool]:
        try:
            for cpu in cpus:
                self.writer.set_cpufreq(cpu, req.min_khz, req.max_khz, req.governor, req.epp)
        except SysfsError as exc:
            raise m.HelperError("hardware-error", str(exc)) from None
        finally:
            self.backend.sysfs_changed(cpus)
        return m.SetCpufreqReply(cpus=cpus), True

    def _set_uncore(self, req: m.SetUncore) -> tuple[m.ApplyItemReply, bool]:
        try:
            self.writer.set_uncore(req.package, req.die, req.min_khz, req.max_khz)
        except SysfsError as exc:
            raise m.HelperError("hardware-error", str(exc)) from None
        return m.SetUncoreReply(package=req.package, die=req.die), False

    # ------------------------------------------------------------------ operations

    def discover(self) -> m.DiscoverReply:
        sst = self.platform
        packages = sst.packages_info() if sst.supported else []
        first = min(self.machine.cpufreq, default=None)
        cf = None
        if first is not None:
            i = self.machine.cpufreq[first]
            cf = m.CpufreqInfo(
                min_khz=i.min_khz,
                base_khz=i.base_khz,
                max_khz=i.max_khz,
                governors=list(i.governors),
                epp_preferences=list(i.epp_preferences),
            )
        first_idle = min(self.machine.cstates, default=None)
        return m.DiscoverReply(
            supported=sst.supported,
            backend=self.backend.name,
            api_version=sst.api_version,
            online_cpus=sorted(self.machine.online),
            packages=packages,
            cpufreq=cf,
            cstates=list(self.machine.cstates[first_idle]) if first_idle is not None else [],
            uncore=[
                m.UncoreDomain(
                    package=u.package,
                    die=u.die,
                    min_khz=u.initial_min_khz,
                    max_khz=u.initial_max_khz,
                )
                for u in sorted(self.machine.uncore.values(), key=lambda u: (u.package, u.die))
            ],
        )

    def _set_irq_affinity(self, batch: list[tuple[int, list[int]]]) -> m.SetIrqAffinityReply:
        """Written in IRQ order (validated against the kernel's list before);
        a write the kernel refuses ends the batch (what was written before
        stays, as with every sysfs knob) with ``hardware-error``."""
        done: dict[int, list[int]] = {}
        for irq, cpus in batch:
            try:
                done[irq] = self.interrupts.set_affinity(irq, cpus)
            except IrqWriteError as exc:
                written = f" (written before it: {sorted(done)})" if done else ""
                raise m.HelperError("hardware-error", f"{exc}{written}") from None
        log.info("irq: set the affinity of %d IRQs", len(done))
        return m.SetIrqAffinityReply(affinities=done)

    def set_resctrl(self, req: m.SetResctrl) -> m.SetResctrlReply:
        """Validated whole against resctrl as it is now, then applied
        (:meth:`nri_sst.resctrl.Resctrl.apply`)."""
        validate.resctrl(self.resctrl.read(), req)
        reply = self.resctrl.apply(req)
        log.info(
            "rdt: %d resctrl groups configured, %d removed", len(reply.groups), len(reply.removed)
        )
        return reply

    def teardown(self) -> None:
        """CPReset, then TF disable, then CP disable on every package."""
        self._sst().teardown()
        self.managed = False
        log.info("sst: teardown done (CPReset, TFDisable, CPDisable on every package)")

    def read_frequency(self, cpus: list[int], clos: bool = False) -> m.ReadFrequencyReply:
        b = self.backend
        if not b.supported:
            raise m.HelperError("not-supported", "SST not supported: no APERF/MPERF access")
        b.settle()
        samples = []
        for cpu in cpus:
            try:
                samples.append(
                    m.FrequencySample(
                        cpu=cpu,
                        aperf=b.read_msr(cpu, MSR_APERF),
                        mperf=b.read_msr(cpu, MSR_MPERF),
                        tsc=b.read_msr(cpu, MSR_TSC),
                    )
                )
            except OSError as exc:
                raise m.HelperError("hardware-error", f"MSR read on cpu {cpu}: {exc}") from None
        punits = self.platform.clos_bounds() if clos and self.platform.supported else []
        return m.ReadFrequencyReply(
            tsc_mhz=b.tsc_mhz(), samples=samples, backend=b.name, punits=punits
        )


def bzy_mhz(before: m.FrequencySample, after: m.FrequencySample, tsc_mhz: int) -> float:
    """turbostat's Bzy_MHz = TSC_MHz * ΔAPERF / ΔMPERF (0.0 when idle)."""
    dm = after.mperf - before.mperf
    return tsc_mhz * (after.aperf - before.aperf) / dm if dm > 0 else 0.0

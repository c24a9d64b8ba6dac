"""The cpuClass handler: the one place CPU frequency, C-state and uncore
settings of the balloons policy are decided (upstream ``pkg/resmgr/cpuclass``,
reference §12; PCT is not here).

Decisions only mark CPUs dirty: :meth:`CpuClassHandler.use` assigns a class
to CPUs, :meth:`~CpuClassHandler.forget` returns them to the idle class,
:meth:`~CpuClassHandler.reset` puts every allowed CPU in the idle class. One
:meth:`~CpuClassHandler.commit` per decision turns the dirty CPUs into the
fewest helper requests: CPUs that need the same cpufreq change share one
``SetCpufreq``, CPUs that need the same C-states share one ``SetCstates``,
uncore limits go per die (the highest limit of the classes on the die wins).
Only what differs from the last successful write is sent.

The plugin never writes sysfs: a :class:`Writer` delivers the requests.
:class:`HelperWriter` sends them to the SST helper; :class:`NullWriter` (no
``--sst-helper``) only logs them at debug level. A commit is written once, as
steps (:meth:`CpuClassHandler.commit_steps`, see :mod:`nri_balloons.sstlink`):
:meth:`~CpuClassHandler.commit` runs them blocking (on the reply path within
the :class:`~nri_balloons.sstlink.Wait` given to the call), the plugin's
background awaiting the asyncio client.

Classes are tracked per turbo domain under synthetic names ``<class>@d<N>``
(N = package id with ``turboDomain: package``, 0 with ``system``). Within a
domain, the active classes with the highest ``turboPriority`` keep ``turbo``;
the others get the base frequency wherever their ``minFreq``/``maxFreq`` say
``turbo`` (§12.4).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import msgspec
from nri_framework import cpuset
from nri_framework.topology import Topology
from nri_sst import messages as m

from nri_balloons.config import CPUClass
from nri_balloons.frequency import Frequency
from nri_balloons.gofmt import list_v, quote
from nri_balloons.pct import Hints, PctAllocator, PctError
from nri_balloons.sstlink import (
    DEFAULT_WAIT,
    Ask,
    Budget,
    BudgetSpent,
    HelperWriter,
    NullWriter,
    Steps,
    Wait,
    Writer,
    WriteRefused,
    WriteRequest,
    WriterUnavailable,
    exchange,
    item_replies,
    sidecar_awaited,
    together,
)

__all__ = [
    "Budget",
    "CpuClassError",
    "CpuClassHandler",
    "HelperWriter",
    "NullWriter",
    "WriteRefused",
    "WriteRequest",
    "Writer",
    "WriterUnavailable",
]

log = logging.getLogger("cpuclass")

TURBO_DOMAINS = ("package", "system")
UNCORE_DIR = "sys/devices/system/cpu/intel_uncore_frequency"


class CpuClassError(Exception):
    """A configuration the handler cannot apply."""


# --------------------------------------------------------------------------- writers


# --------------------------------------------------------------------------- classes


class ClassDef(msgspec.Struct, frozen=True):
    """A class with its frequencies resolved to kHz (0 = don't write)."""

    min_freq: int = 0
    max_freq: int = 0
    epp: int = 0
    uncore_min_freq: int = 0
    uncore_max_freq: int = 0
    governor: str = ""
    disabled_cstates: tuple[str, ...] = ()


class TurboInfo(msgspec.Struct, frozen=True):
    """min/base/max turbo kHz of the first online CPU with a frequency range."""

    min_khz: int
    base_khz: int
    max_khz: int


def resolve(cc: CPUClass, info: TurboInfo | None, turbo_khz: int = 0) -> ClassDef:
    """Upstream ``classDefFromCPUClass``: symbolic values against ``info`` (the
    ``turbo`` sentinel as ``turbo_khz`` when given); without platform info
    symbolic values become 0 (no write)."""

    def khz(f: Frequency) -> int:
        if info is None:
            return 0 if f.is_symbolic else int(f)
        return f.resolve(info.min_khz, info.base_khz, turbo_khz or info.max_khz)

    return ClassDef(
        min_freq=khz(cc.min_freq),
        max_freq=khz(cc.max_freq),
        epp=cc.energy_performance_preference,
        uncore_min_freq=khz(cc.uncore_min_freq),
        uncore_max_freq=khz(cc.uncore_max_freq),
        governor=cc.freq_governor,
        disabled_cstates=tuple(cc.disabled_cstates),
    )


def turbo_info(topology: Topology) -> TurboInfo | None:
    for c in topology.cpus.values():
        f = c.freq
        if f.max and f.min:
            return TurboInfo(f.min, f.base or f.max, f.max)
    return None


class _Written(msgspec.Struct):
    """What the last successful commit wrote to one CPU (None = nothing yet)."""

    min_freq: int | None = None
    max_freq: int | None = None
    governor: str | None = None
    epp: str | None = None
    cstates: tuple[str, ...] | None = None


class _FreqDelta(msgspec.Struct, frozen=True):
    min_khz: int | None
    max_khz: int | None
    governor: str | None
    epp: str | None


_NO_DELTA = _FreqDelta(None, None, None, None)
_NOTHING_WRITTEN = _Written()
"""What :meth:`CpuClassHandler._plan` compares a CPU never written with (never changed)."""
_WRITTEN_FIELDS = ("min_freq", "max_freq", "governor", "epp", "cstates")


def _freq_delta(d: ClassDef, w: _Written) -> _FreqDelta | None:
    """The cpufreq settings of ``d`` that differ from what ``w`` says was
    written; ``None`` when none does."""
    delta = _FreqDelta(
        min_khz=d.min_freq if d.min_freq and d.min_freq != w.min_freq else None,
        max_khz=d.max_freq if d.max_freq and d.max_freq != w.max_freq else None,
        governor=d.governor if d.governor and d.governor != w.governor else None,
        epp=str(d.epp) if d.epp and str(d.epp) != w.epp else None,
    )
    return None if delta == _NO_DELTA else delta


class _Plan(msgspec.Struct):
    requests: list[WriteRequest] = msgspec.field(default_factory=list)
    """In order; ``done[i]`` records request ``i`` as written."""
    done: list[list[tuple[int, _Written]]] = msgspec.field(default_factory=list)
    uncore_done: list[tuple[tuple[int, int], tuple[int, int]] | None] = msgspec.field(
        default_factory=list
    )


class CpuClassHandler:
    """Per-CPU class assignment, turbo arbitration and batched commits."""

    def __init__(self, topology: Topology, writer: Writer | None = None) -> None:
        self.topology = topology
        self.writer: Writer = writer if writer is not None else NullWriter()
        self.turbo = turbo_info(topology)
        self.classes: dict[str, CPUClass] = {}
        self.idle_class = ""
        self.turbo_domain = "package"
        self.allowed = topology.online
        self.domain_of: dict[int, int] = {}
        self._domain_cpus: dict[int, int] = {}
        """domain -> its CPUs in ``domain_of`` (in the order of their lowest CPU)"""
        self.defs: dict[str, ClassDef] = {}
        """synthetic name -> resolved definition"""
        self._uncore_limited: bool | None = None
        """whether a class of :attr:`defs` has uncore limits (None: not known
        since :meth:`configure`; :meth:`_set_def` changes no class's having
        them: it resolves the same fields with another turbo frequency, and a
        symbolic one resolves to a frequency, never 0, with platform info)"""
        self.cpu_class: dict[int, str] = {}
        """cpu -> synthetic class name ("" = no class: never written)"""
        self._class_cpus: dict[str, int] = {}
        """synthetic class name -> its CPUs in ``cpu_class`` (kept with it)"""
        self.active: dict[int, dict[str, int]] = {}
        """domain -> class -> CPU mask"""
        self.winner: dict[int, int] = {}
        self.dirty = 0
        self._want_cstates: dict[tuple[str, frozenset[str]], tuple[str, ...]] = {}
        """(synthetic class, a CPU's C-states) -> the C-states it disables, sorted
        (until the classes change: :meth:`configure`; at most one entry per
        configured class, turbo domain and distinct C-state set of the CPUs)"""
        self.cstates_managed = False
        """True once a class disables C-states: from then on every class writes
        its C-states (an empty list enables them all)."""
        self.written: dict[int, _Written] = {}
        self.uncore_written: dict[tuple[int, int], tuple[int, int]] = {}
        self.degraded = False
        self.uncore_available = (Path(topology.host_root) / UNCORE_DIR).is_dir()
        self.requests_sent = 0
        self.pct = PctAllocator(topology, self.writer)

    # -- configuration -----------------------------------------------------------

    def configure(
        self,
        classes: Sequence[CPUClass],
        turbo_domain: str = "package",
        allowed: int | None = None,
        idle_class: str = "",
        wait: Wait = DEFAULT_WAIT,
    ) -> None:
        """Install a class set (upstream ``Configure``) and the idle class of
        :meth:`forget` and :meth:`reset`. Every CPU leaves its class: the
        caller follows with :meth:`reset` and :meth:`use`. What was written
        stays known, so unchanged settings are not written again. SST is
        programmed now (blocking), waiting for the helper as ``wait`` says."""
        if turbo_domain not in ("", *TURBO_DOMAINS):
            raise CpuClassError(
                f"cpuclass: cpufreq configure: cpufreq: unsupported turboDomain "
                f"{quote(turbo_domain)} (expected {quote('package')} or {quote('system')})"
            )
        self.classes = {cc.name: cc for cc in classes}
        self.idle_class = idle_class
        self.turbo_domain = turbo_domain or "package"
        self.allowed = (self.topology.online if allowed is None else allowed) & self.topology.online
        system = self.turbo_domain == "system"
        self.domain_of = {
            cpu: 0 if system else info.package
            for cpu, info in self.topology.cpus.items()
            if self.allowed >> cpu & 1
        }
        domains = sorted(set(self.domain_of.values()))
        self._domain_cpus = {}
        for cpu in sorted(self.domain_of):
            in_domain = self.domain_of[cpu]
            self._domain_cpus[in_domain] = self._domain_cpus.get(in_domain, 0) | 1 << cpu
        self.defs = {}
        self._uncore_limited = None
        self._want_cstates = {}
        self.dirty |= cpuset.from_ids(c for c, name in self.cpu_class.items() if name)
        self.cpu_class = {}
        self._class_cpus = {}
        self.active = {}
        self.winner = {d: -1 for d in domains}
        if self.turbo is None and any(
            f.is_symbolic
            for cc in classes
            for f in (cc.min_freq, cc.max_freq, cc.uncore_min_freq, cc.uncore_max_freq)
        ):
            log.warning("cpufreq: cannot discover platform turbo info: no cpufreq frequency range")
        for cc in classes:
            d = resolve(cc, self.turbo)
            for dom in domains:
                self.defs[f"{cc.name}@d{dom}"] = d
            log.info(
                "cpuClass %s configured: minFreq=%s(%d) maxFreq=%s(%d) disabledCstates=%s",
                quote(cc.name),
                cc.min_freq,
                d.min_freq,
                cc.max_freq,
                d.max_freq,
                list_v(cc.disabled_cstates),
            )
            if cc.disabled_cstates:
                self.cstates_managed = True
        if not self.uncore_available:
            for name, d in self.defs.items():
                if d.uncore_min_freq or d.uncore_max_freq:
                    raise CpuClassError(
                        f"uncore limits set in cpu class {quote(name)} but uncore driver not "
                        "available; load the intel_uncore_frequency driver"
                    )
        try:
            self.pct.configure(classes, self.allowed)
        except PctError as exc:
            raise CpuClassError(f"cpuclass: pct configure: {exc}") from None
        # SST now, so the configuration's balloons get PCT hints (a helper that
        # does not answer leaves it to a later commit)
        exchange(self.pct.flush_steps(wait.timeout), self.writer, wait.budget)

    def known(self, name: str) -> bool:
        return name in self.classes

    # -- decisions ---------------------------------------------------------------

    def forget(self, cpus: int) -> None:
        """``cpus`` back to the idle class."""
        self.use(cpus, self.idle_class)

    def reset(self) -> None:
        """The idle class on every allowed CPU."""
        self.use(self.allowed, self.idle_class)

    def use(self, cpus: int, name: str) -> None:
        """Assign class ``name`` ("" = none) to ``cpus`` (allowed ones only)."""
        cpus &= self.allowed
        if not cpus:
            return
        if name and name not in self.classes:
            log.error("unknown CPU class %s", quote(name))
        self.pct.use(cpus, name)
        for per_class in self.active.values():
            for cls in list(per_class):
                per_class[cls] &= ~cpus
                if not per_class[cls]:
                    del per_class[cls]
        by_domain = self._by_domain(cpus)
        if name:
            for d, mask in by_domain.items():
                per_class = self.active.setdefault(d, {})
                per_class[name] = per_class.get(name, 0) | mask
        for d in sorted(by_domain):
            self._recalculate_turbo(d)
        for d, mask in by_domain.items():
            syn = self._synthetic(name, d)
            # Only the CPUs whose class changes are visited (a balloon growing by
            # one CPU asks for its whole set again: per CPU, a Synchronize of a
            # balloon of n CPUs was quadratic).
            change = mask & ~self._class_cpus.get(syn, 0)
            if not change:
                continue
            for other, held in list(self._class_cpus.items()):
                if held & change:
                    if held & ~change:
                        self._class_cpus[other] = held & ~change
                    else:
                        del self._class_cpus[other]
            self._class_cpus[syn] = self._class_cpus.get(syn, 0) | change
            self.cpu_class.update(dict.fromkeys(cpuset.ids(change), syn))
            self.dirty |= change

    def _by_domain(self, cpus: int) -> dict[int, int]:
        """``cpus`` split by turbo domain, in the order of each part's lowest CPU
        (CPUs of no domain count in domain 0)."""
        by_domain: dict[int, int] = {}
        rest = cpus
        for d, held in self._domain_cpus.items():
            part = cpus & held
            if part:
                by_domain[d] = part
                rest &= ~part
        if rest:
            by_domain[0] = by_domain.get(0, 0) | rest
        if len(by_domain) > 1:
            by_domain = dict(sorted(by_domain.items(), key=lambda kv: kv[1] & -kv[1]))
        return by_domain

    def _synthetic(self, name: str, d: int) -> str:
        if not name or name not in self.classes:
            return name
        return f"{name}@d{d}"

    def _set_def(self, syn: str, d: ClassDef) -> None:
        prev = self.defs.get(syn)
        self.defs[syn] = d
        if prev == d:
            return
        for cpu, cls in self.cpu_class.items():
            if cls == syn:
                self.dirty |= 1 << cpu

    def _recalculate_turbo(self, d: int) -> None:
        """Upstream ``recalculateTurbo`` (§12.4)."""
        if not self.classes:
            return
        per_class = self.active.get(d, {})
        prio = 0
        for cc in self.classes.values():
            if cc.turbo_priority > prio and per_class.get(cc.name):
                prio = cc.turbo_priority
        if self.winner.get(d) == prio:
            return
        self.winner[d] = prio
        if self.turbo is None:
            log.warning("turbo recalculation skipped (domain %d): no platform turbo info", d)
            return
        for cc in self.classes.values():
            wins = prio == 0 or cc.turbo_priority >= prio
            turbo = self.turbo.max_khz if wins else self.turbo.base_khz
            cdef = resolve(cc, self.turbo, turbo)
            self._set_def(self._synthetic(cc.name, d), cdef)
            log.info(
                "turbo: domain=%d class %s (prio=%d, winner=%s): minFreq=%d maxFreq=%d",
                d,
                quote(cc.name),
                cc.turbo_priority,
                "true" if wins else "false",
                cdef.min_freq,
                cdef.max_freq,
            )

    # -- commit ------------------------------------------------------------------

    def commit(self, wait: Wait = DEFAULT_WAIT) -> bool:
        """Write what the dirty CPUs need (blocking, waiting for the helper as
        ``wait`` says: its per-request timeout, within its budget). False when
        the writer is unavailable (the CPUs stay dirty; a later commit
        re-applies every setting)."""
        self.pct.log_placed()
        return exchange(self.commit_steps(wait.timeout), self.writer, wait.budget)

    def unsettled(self) -> bool:
        """Decisions wait for the helper (what a background commit applies)."""
        pct = self.pct
        return bool(
            self.dirty
            or self.degraded
            or (pct.pending and not pct.hold)  # held CPUs wait for the Synchronize
            or pct.need_program
            or pct.teardown_pending
            or pct.degraded
        )

    def commit_steps(self, timeout: float | None = None) -> Steps[bool]:
        """:meth:`commit` as steps: PCT's flush and the class settings side by
        side, their writes in one request (:func:`~nri_balloons.sstlink.together`).
        Decisions taken between two requests (by hooks, while the background
        awaits) stay dirty for the next commit."""
        flushed, written = yield from together(
            self.pct.flush_steps(timeout), self.write_steps(timeout)
        )
        if flushed and self.pct.heard_restart():
            flushed = yield from self.pct.flush_steps(timeout)
        return bool(flushed and written)

    def write_steps(self, timeout: float | None = None) -> Steps[bool]:
        """The cpufreq, C-state and uncore writes the dirty CPUs need, in one
        request; False when the helper is unavailable (they stay dirty)."""
        if self.degraded:
            self.written.clear()
            self.uncore_written.clear()
            self.dirty |= cpuset.from_ids(c for c, name in self.cpu_class.items() if name)
        plan = self._plan()
        batch, self.dirty = self.dirty, 0
        try:
            replies: list[m.Reply | WriteRefused] = []
            if len(plan.requests) == 1:
                try:
                    replies = [(yield Ask(plan.requests[0], timeout))]
                except WriteRefused as exc:
                    replies = [exc]
            elif plan.requests:
                reply = yield Ask(m.Apply(items=list(plan.requests)), timeout)
                replies = item_replies(reply, len(plan.requests))
        except WriterUnavailable as exc:
            self.dirty |= batch  # nothing of it is known written: it all goes again
            if isinstance(exc, BudgetSpent):
                log.debug("cpuclass: %s; the rest is written in the background", exc)
            elif sidecar_awaited(self.writer):  # nothing written yet: all is dirty still
                log.debug("cpuclass: SST helper not there yet: %s", exc)
            elif not self.degraded:
                log.error("cpuclass: SST helper unavailable: %s", exc)
                self.degraded = True
            else:
                log.debug("cpuclass: SST helper still unavailable: %s", exc)
            return False
        except BaseException:  # the steps were abandoned
            self.dirty |= batch
            raise
        for i, (req, answer) in enumerate(zip(plan.requests, replies, strict=True)):
            if isinstance(answer, WriteRefused):
                log.error("cpuclass: %s refused: %s", _describe(req), answer)
                continue
            self.requests_sent += 1
            wrote: list[tuple[str, object]] = []  # the fields of this request's done
            for cpu, done in plan.done[i]:
                w = self.written.get(cpu)
                if w is None:
                    w = self.written[cpu] = _Written()
                if not wrote:
                    wrote = [(a, v) for a in _WRITTEN_FIELDS if (v := getattr(done, a)) is not None]
                for attr, value in wrote:
                    setattr(w, attr, value)
            u = plan.uncore_done[i]
            if u is not None:
                self.uncore_written[u[0]] = u[1]
        if self.degraded:
            if plan.requests:
                log.info("cpuclass: SST helper is back; CPU class settings re-applied")
            self.degraded = False
        return True

    def _plan(self) -> _Plan:
        plan = _Plan()
        debug = log.isEnabledFor(logging.DEBUG)
        freq_groups: dict[_FreqDelta, list[int]] = {}
        cstate_groups: dict[tuple[str, ...], list[int]] = {}
        cstate_log: dict[tuple[str, str], int] = {}
        cpu_class, defs, written = self.cpu_class, self.defs, self.written
        infos, want_cstates = self.topology.cpus, self._want_cstates
        nothing = _NOTHING_WRITTEN
        for cpu in cpuset.ids(self.dirty):
            syn = cpu_class.get(cpu, "")
            if not syn:
                continue  # class "": never written (§12.1)
            d = defs.get(syn)
            if d is None:
                continue  # an unknown class
            w = written.get(cpu) or nothing
            delta = _freq_delta(d, w) if d.min_freq or d.max_freq or d.governor or d.epp else None
            if delta is not None:
                freq_groups.setdefault(delta, []).append(cpu)
                if debug:
                    log.debug("enforcing cpu frequency from class %s on cpu %d", quote(syn), cpu)
                    if delta.min_khz is not None:
                        log.debug(
                            "enforcing cpu frequency min %d from class %s on cpu %d",
                            delta.min_khz,
                            quote(syn),
                            cpu,
                        )
                    if delta.max_khz is not None:
                        log.debug(
                            "enforcing cpu frequency max %d from class %s on cpu %d",
                            delta.max_khz,
                            quote(syn),
                            cpu,
                        )
                    if delta.governor is not None:
                        log.debug(
                            "enforcing cpu frequency governor %s from class %s on cpu %d",
                            quote(delta.governor),
                            quote(syn),
                            cpu,
                        )
            if self.cstates_managed:
                # upstream filters the class's names by the C-states the CPU has
                # (cstates.NewBasicFilter().SetCstateNames): unknown ones are no writes
                has = infos[cpu].cstates
                want = want_cstates.get((syn, has))
                if want is None:
                    want = want_cstates[(syn, has)] = tuple(sorted(set(d.disabled_cstates) & has))
                if want != w.cstates:
                    cstate_groups.setdefault(want, []).append(cpu)
                    if debug:
                        key = (syn, list_v(want))
                        cstate_log[key] = cstate_log.get(key, 0) | 1 << cpu
        for delta, cpus in freq_groups.items():
            plan.requests.append(
                m.SetCpufreq(
                    cpus=cpus,
                    min_khz=delta.min_khz,
                    max_khz=delta.max_khz,
                    governor=delta.governor,
                    epp=delta.epp,
                )
            )
            done = _Written(delta.min_khz, delta.max_khz, delta.governor, delta.epp)
            plan.done.append([(c, done) for c in cpus])
            plan.uncore_done.append(None)
        for (syn, disabled_text), mask in cstate_log.items():
            log.debug(
                "cstates: class %s on cpus %s: disable=%s",
                quote(syn),
                cpuset.format(mask),
                disabled_text,
            )
        for disabled, cpus in cstate_groups.items():
            plan.requests.append(m.SetCstates(cpus=cpus, disabled=list(disabled)))
            done = _Written(cstates=disabled)
            plan.done.append([(c, done) for c in cpus])
            plan.uncore_done.append(None)
        self._plan_uncore(plan)
        return plan

    def _plan_uncore(self, plan: _Plan) -> None:
        """Per die of a dirty CPU: the highest limits of the classes on the die."""
        limited = self._uncore_limited
        if limited is None:  # the classes changed since the last plan
            limited = self._uncore_limited = any(
                d.uncore_min_freq or d.uncore_max_freq for d in self.defs.values()
            )
        if not limited and not log.isEnabledFor(logging.DEBUG):
            return  # every die would have "no limits in effect" (a debug line)
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

    def hints(self, name: str, requested: int, free: int, current: int) -> Hints:
        """Placement hints of class ``name`` for adding ``requested`` CPUs of
        ``free`` to a balloon holding ``current`` (upstream ``Hints``; PCT's)."""
        return self.pct.hints(name, requested, free, current)

    def close(self) -> None:
        self.writer.close()


def _describe(req: WriteRequest) -> str:
    if isinstance(req, m.SetUncore):
        return f"uncore of package {req.package} die {req.die}"
    what = "cpufreq" if isinstance(req, m.SetCpufreq) else "C-states"
    return f"{what} of CPUs {cpuset.format(cpuset.from_ids(req.cpus))}"

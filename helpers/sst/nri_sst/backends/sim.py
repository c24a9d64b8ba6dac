"""The ``sim`` backend: a dual-socket Xeon 6776P (GNR-SP, TPMI) per sst.md §5.

The model answers the TPMI ioctls of :class:`~nri_sst.backends.base.Backend`
with the kernel's error model (every TPMI failure is ``ENOTTY``, GET_PHY_ID of
an impossible CPU is ``EINVAL``, MSR of an offline CPU is ``ENXIO``), keeps
per-punit state (CP enable/priority, 4 CLOS as ratios, association per
``(pkg, punit, module)``, PP level and feature state) and computes an effective
frequency per CPU (§5.5.12) from which APERF/MPERF advance with a clock.

State lives in a JSON file (``--sim-state FILE``), loaded at start if present
(hardware state survives a helper restart): rewritten atomically when the
helper is idle, and each change the hardware keeps appended before the reply
to ``FILE.journal`` (what changed since the file was written; a kill after a
reply loses nothing the hardware would keep). :func:`read_state` reads the two,
so tests and demos can inspect it:

``punits["<pkg>/<punit>"]``
    ``cp_enable``, ``cp_ordered``, ``clos`` (4 x ``[min_ratio, max_ratio, prop]``),
    ``assoc`` (64 CLOS ids by module), ``feature_state``, ``current_level``,
    ``locked``, ``level_mask``, ``allowed_mask``, ``feature_error``.
``cpus``
    ``aperf``, ``mperf``, ``tsc``, ``load`` (0..1), and the frequency oracle
    ``min_mhz``/``max_mhz`` (effective bounds; Bzy MHz under load = max).
``log``
    The last writes, oldest first, for ordering assertions.

Choices where sst.md §6 is uncertain: a CLOS max of 0 MHz means "no limit"
(§6.6); HP CLOS = {0} (§6.7); the TF budget is per punit (§6.1); TF enable
while CP is off is accepted and becomes effective when CP turns on (§6.2,
``tf_strict=False``).
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from nri_sst import messages as m
from nri_sst.backends.base import (
    MSR_APERF,
    MSR_MPERF,
    MSR_PLATFORM_INFO,
    MSR_PM_ENABLE,
    MSR_PM_LOGICAL_ID,
    MSR_TSC,
    Backend,
    ClosParam,
    CorePower,
    LevelInfo,
    PerfLevels,
    TurboFreqInfo,
)
from nri_sst.hostfs import Machine, SysfsWriter
from nri_sst.interrupts import Interrupts, IrqWriteError
from nri_sst.resctrl import Resctrl, ResctrlError

MODULES_PER_PUNIT_MAX = 64  # 4 CLOS_ASSOC registers x 16 cores (sst.md §1.9)
LOG_LIMIT = 500
VOLATILE = frozenset({"cpus", "clock", "log"})
"""Parts of the state that are not what the hardware holds (the counters,
the model's clock, the operation log): a change of them alone is saved when
the helper is idle, not before the reply."""
JOURNAL_LIMIT = 1 << 20
"""Bytes of journal (see :func:`read_state`) after which a change is saved
whole on the reply path instead (an idle helper saves whole anyway)."""
_json = msgspec.json.Encoder()


def journal_path(state_file: Path | str) -> str:
    """Where the changes made since ``state_file`` was saved whole go."""
    return f"{os.fspath(state_file)}.journal"


def _identity(st: os.stat_result) -> list[int]:
    """What a journal names the state file it follows by (a file saved anew
    is a new inode: a journal of an earlier one, or one beside a file put
    there by hand, is not read)."""
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def read_state(state_file: Path | str) -> dict[str, Any]:
    """The state the sim's state file holds (raising ``OSError`` or
    ``ValueError``): the file, saved whole when the helper was idle, with
    its journal's changes since (each line the hardware parts that changed,
    appended before the reply went out) put over it in order. A journal that
    follows another file is not read; a line cut short (the helper killed
    while writing it) ends it."""
    path = os.fspath(state_file)
    with open(path, "rb") as f:
        ident = _identity(os.fstat(f.fileno()))
        state: dict[str, Any] = json.loads(f.read())
    try:
        with open(journal_path(path), "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return state
    try:
        if json.loads(lines[0]) != {"follows": ident}:
            return state
    except ValueError:
        return state
    for line in lines[1:]:
        try:
            change = json.loads(line)
        except ValueError:
            break  # the last line, cut short (or the empty one after the last newline)
        if not isinstance(change, dict):
            break
        state.update((k, v) for k, v in change.items() if k in state and k not in VOLATILE)
    return state


@dataclass(frozen=True)
class SimIrq:
    """One IRQ of the model's ``/proc/interrupts``."""

    number: int
    description: str
    per_cpu: bool = False
    """Per-CPU or kernel-managed: a write fails with ``EIO`` (listed not writable)."""


SERVER_IRQS: tuple[SimIrq, ...] = (
    SimIrq(0, "IR-IO-APIC 2-edge timer", per_cpu=True),
    SimIrq(4, "IR-IO-APIC 4-edge ttyS0"),
    SimIrq(8, "IR-IO-APIC 8-edge rtc0"),
    SimIrq(9, "IR-IO-APIC 9-fasteoi acpi"),
    SimIrq(16, "IR-IO-APIC 16-fasteoi i801_smbus"),
    SimIrq(24, "DMAR-MSI 0-edge dmar0"),
    SimIrq(40, "IR-PCI-MSIX-0000:16:00.0 0-edge nvme0q0"),
    SimIrq(41, "IR-PCI-MSIX-0000:16:00.0 1-edge nvme0q1", per_cpu=True),
    SimIrq(42, "IR-PCI-MSIX-0000:16:00.0 2-edge nvme0q2", per_cpu=True),
    SimIrq(64, "IR-PCI-MSIX-0000:17:00.0 0-edge eth0"),
    SimIrq(65, "IR-PCI-MSIX-0000:17:00.0 1-edge eth0-TxRx-0"),
    SimIrq(66, "IR-PCI-MSIX-0000:17:00.0 2-edge eth0-TxRx-1"),
    SimIrq(67, "IR-PCI-MSIX-0000:17:00.0 3-edge eth0-TxRx-2"),
    SimIrq(68, "IR-PCI-MSIX-0000:17:00.0 4-edge eth0-TxRx-3"),
)
"""A server's IRQs: the timer and the NVMe I/O queues are not controllable."""


@dataclass(frozen=True)
class SimConfig:
    """Every default is the 6776P of sst.md §5.1-§5.3."""

    packages: int = 2
    punits_per_package: int = 2
    cores_per_punit: int = 32
    threads_per_core: int = 2
    profile: str = "bios-default"
    """``bios-default``: CP off, proportional, CLOS {0,0,25500}, all CLOS 0.
    ``bios-pct-on``: CP on, ordered, the first 8 modules of each punit in CLOS 0, others CLOS 2."""
    strict: bool = True
    """Reject out-of-range inputs hardware would corrupt (§5.5.2); False = kernel-faithful."""
    tf_strict: bool = False
    """Refuse TF enable (status stays 0, error 7) unless CP is on and ordered."""
    hwp: bool = True
    """MSR 0x770 bit 0; off makes CP/PP/feature sets fail (§5.5.3)."""
    privileged: bool = True
    """Without CAP_SYS_ADMIN every set fails with ENOTTY."""
    cp_status_delay_s: float = 0.0
    """CP status reflects a write only after this delay (§5.5.8)."""
    level_change_cost_s: float = 0.02
    tsc_mhz: int = 2300
    base_mhz: int = 2300
    p0_mhz: int = 4600
    pm_mhz: int = 800
    current_level: int = 0
    level_mask: int = 0b00011
    allowed_mask: int = 0b00011
    locked: bool = True
    tf_levels: int = 0b00011
    trl_buckets: tuple[int, ...] = (2, 4, 8, 12, 16, 20, 24, 32)
    trl_mhz: tuple[int, ...] = (3900, 3900, 3800, 3800, 3700, 3700, 3600, 3600)
    tf_buckets: tuple[int, ...] = (8, 16, 32)
    tf_mhz: tuple[int, ...] = (4600, 4200, 3800)
    lp_clip_mhz: int = 2300
    cpuinfo_min_khz: int = 800_000
    cpuinfo_max_khz: int = 4_600_000
    never_online: tuple[int, ...] = ()
    """CPUs never onlined since module load: GET_PHY_ID returns 0 (§5.5.4)."""
    interrupts: tuple[SimIrq, ...] = SERVER_IRQS
    """The model's ``/proc/interrupts``; every affinity starts as every online CPU."""
    l3_cbm_mask: int = 0x7FFF
    """resctrl's L3 (one cache id per package): 15 ways, as Xeons of this size."""
    l3_min_cbm_bits: int = 1
    num_closids: int = 16
    mb_bandwidth_gran: int = 10
    mb_min_bandwidth: int = 10
    resctrl: bool = True
    """resctrl mounted (False: no RDT allocation)."""

    @property
    def cores_per_package(self) -> int:
        return self.punits_per_package * self.cores_per_punit

    @property
    def ncores(self) -> int:
        return self.packages * self.cores_per_package

    @property
    def ncpus(self) -> int:
        return self.ncores * self.threads_per_core

    def locate(self, cpu: int) -> tuple[int, int, int, int]:
        """``cpu -> (pkg, punit, module, thread)`` (sst.md §5.2, SMT sibling = cpu + ncores)."""
        thread, g = divmod(cpu, self.ncores)
        pkg, in_pkg = divmod(g, self.cores_per_package)
        punit, module = divmod(in_pkg, self.cores_per_punit)
        return pkg, punit, module, thread


def _enotty(what: str) -> OSError:
    return OSError(errno.ENOTTY, f"Inappropriate ioctl for device ({what})")


class SimBackend(Backend):
    name = "sim"
    supported = True

    def __init__(
        self,
        config: SimConfig | None = None,
        state_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config or SimConfig()
        self.state_file = Path(state_file) if state_file else None
        self.clock = clock
        self.sleep = sleep
        self._stale = False
        """A change made the frequency oracle stale (recomputed once, lazily)."""
        self._stale_punits: set[tuple[int, int]] = set()
        """Punits whose association changed: only their CPUs are recomputed."""
        self._stale_modules: dict[tuple[int, int], set[int]] = {}
        """Of each stale punit, the modules whose CLOS changed."""
        self._changed_at: dict[tuple[int, int], float] = {}
        """Of each stale punit, when its association changed: the counters of
        its CPUs whose frequencies the change changes advance to then first."""
        self._punit_inputs: dict[tuple[int, int], tuple[Any, ...]] = {}
        """Of each punit, what its frequencies were last computed from besides
        each module's CLOS (when only CLOS changed and this did not: only the
        changed modules are computed again)."""
        self._unsaved = False
        self._saved_parts: dict[str, bytes] | None = None
        """Each part of the hardware part (:meth:`_hardware_parts`) as the state
        file and its journal hold it (None: not known, the next change saves whole)."""
        self._journal: int | None = None
        """The journal's descriptor, open for appending (None: none since the
        last whole save, or it failed: the next change saves whole)."""
        self._journal_size = 0
        self._irqs_json: tuple[object, bytes] | None = None
        """``state["irqs"]`` and its encoding (see :meth:`_hardware_parts`)."""
        self._at: list[float] | None = None
        """Per CPU, when its counters were advanced to (None: every CPU at
        ``state["clock"]``); an association change advances its punit's only."""
        c = self.config
        self._loc = [c.locate(cpu) for cpu in range(c.ncpus)]
        self._module_cpus = {
            (pkg, pu): [
                [self._cpu_of(pkg, pu, mod, t) for t in range(c.threads_per_core)]
                for mod in range(c.cores_per_punit)
            ]
            for pkg in range(c.packages)
            for pu in range(c.punits_per_package)
        }
        self.machine: Machine | None = None
        self.writer: SysfsWriter | None = None
        self._limits: dict[int, tuple[int, int]] = {}
        self._cp_pending: dict[str, tuple[float, bool, bool]] = {}
        self.mismatches: list[int] = []
        """Online CPUs whose sysfs package differs from the model's (a wrong host root)."""
        self.state: dict[str, Any] = self._initial_state()
        if self.state_file is not None and self.state_file.exists():
            try:
                loaded = read_state(self.state_file)
                if loaded.get("version") == 1 and set(loaded["punits"]) == set(
                    self.state["punits"]
                ):
                    self.state = loaded
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass  # a corrupt state file is replaced by the boot state
        self.state["clock"] = self.clock()
        self._recompute()

    # ------------------------------------------------------------------ state

    def _initial_state(self) -> dict[str, Any]:
        c = self.config
        punits: dict[str, Any] = {}
        pct_on = c.profile == "bios-pct-on"
        for pkg in range(c.packages):
            for pu in range(c.punits_per_package):
                assoc = [0] * MODULES_PER_PUNIT_MAX
                if pct_on:
                    assoc = [0 if m < c.tf_buckets[0] else 2 for m in range(MODULES_PER_PUNIT_MAX)]
                punits[f"{pkg}/{pu}"] = {
                    "cp_enable": pct_on,
                    "cp_ordered": pct_on,
                    "clos": [[0, 0 if pct_on else 255, 0] for _ in range(4)],
                    "assoc": assoc,
                    "feature_state": 0b10 if pct_on else 0,
                    "feature_error": 0,
                    "current_level": c.current_level,
                    "locked": c.locked,
                    "level_mask": c.level_mask,
                    "allowed_mask": c.allowed_mask,
                }
                if pct_on:
                    punits[f"{pkg}/{pu}"]["clos"] = [[0, 255, 0] for _ in range(4)]
        n = c.ncpus
        return {
            "version": 1,
            "backend": "sim",
            "model": "xeon-6776p",
            "punits": punits,
            "cpus": {
                "aperf": [0] * n,
                "mperf": [0] * n,
                "tsc": [0] * n,
                "load": [1.0] * n,
                "min_mhz": [0] * n,
                "max_mhz": [0] * n,
            },
            "clock": 0.0,
            "log": [],
        }

    def _hardware_parts(self) -> dict[str, bytes]:
        """What the hardware holds: each key of the state but :data:`VOLATILE`
        and its value encoded (joined by :func:`_join`, the same bytes as the
        dict's encoding);
        the IRQ affinities (most of it: every online CPU of each IRQ) encoded
        again only when one changed (:meth:`irqs_changed`), not at every
        association write."""
        parts = {}
        for key, value in self.state.items():
            if key in VOLATILE:
                continue
            if key == "irqs":
                cached = self._irqs_json
                if cached is None or cached[0] is not value:
                    cached = self._irqs_json = (value, _json.encode(value))
                parts[key] = cached[1]
            else:
                parts[key] = _json.encode(value)
        return parts

    def irqs_changed(self) -> None:
        """An IRQ affinity of the state changed: :meth:`_hardware_parts` encodes them again."""
        self._irqs_json = None

    def _volatile(self) -> bytes:
        """The :data:`VOLATILE` part of the state, encoded."""
        return _json.encode({k: v for k, v in self.state.items() if k in VOLATILE})

    def save(self) -> None:
        """The whole state to the state file (atomically: a new file renamed
        over the old), and a new journal after it."""
        self._unsaved = False
        if self.state_file is None:
            return
        self.catch_up()  # the file holds the frequencies of the state it holds
        parts = self._hardware_parts()
        path = os.fspath(self.state_file)
        self._saved_parts = None  # until both are written
        self._close_journal()
        data = b"".join((_join(parts)[:-1], b",", self._volatile()[1:]))
        ident = _identity(_write_new(path, data))
        self._start_journal(path, ident)
        self._saved_parts = parts

    def _save_hardware(self, parts: dict[str, bytes]) -> None:
        """The parts of the hardware part that changed since the state file and
        its journal were written, appended to the journal in one write (or, with
        no journal or a full one, the whole state saved now); the counters and
        log lines of now follow when the helper is idle: they are most of the
        state, and no reply waits for them."""
        saved = self._saved_parts
        fd = self._journal
        if (
            saved is None
            or fd is None
            or self._journal_size > JOURNAL_LIMIT
            or saved.keys() != parts.keys()
        ):
            self.save()
            return
        changed = {k: v for k, v in parts.items() if saved[k] != v}
        line = b"%s\n" % _join(changed)
        try:
            _write_all(fd, line)
        except OSError:
            self._close_journal()  # what it holds now is not known: the next change saves whole
            self._saved_parts = None
            raise
        self._journal_size += len(line)
        saved.update(changed)
        self._unsaved = True

    def _start_journal(self, path: str, ident: list[int]) -> None:
        """A new journal following the state file ``ident`` names, open for
        appending (a new file renamed over the old: a helper still holding the
        old one appends to that, not to this)."""
        journal = journal_path(path)
        _write_new(journal, b"%s\n" % _json.encode({"follows": ident}))
        fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._journal, self._journal_size = fd, os.fstat(fd).st_size

    def _close_journal(self) -> None:
        if self._journal is not None:
            fd, self._journal = self._journal, None
            os.close(fd)

    def _log(self, op: str, **fields: int | bool | str) -> None:
        log: list[dict[str, Any]] = self.state["log"]
        log.append({"op": op, **fields})
        if len(log) > LOG_LIMIT:
            del log[: len(log) - LOG_LIMIT]

    def _punit(self, package: int, punit: int) -> dict[str, Any]:
        pu = self.state["punits"].get(f"{package}/{punit}")
        if pu is None:
            raise _enotty(f"no power domain {package}/{punit}")
        return pu  # type: ignore[no-any-return]

    def _check_set(self) -> None:
        if not self.config.privileged:
            raise _enotty("not permitted")

    def _check_hwp(self) -> None:
        if not self.config.hwp:
            raise _enotty("HWP disabled")

    # ------------------------------------------------------------------ Backend hooks

    def attach(self, machine: Machine) -> None:
        self.machine = machine
        self.writer = SysfsWriter(machine)
        self.mismatches = sorted(
            cpu
            for cpu, pkg in machine.package_of.items()
            if cpu >= self.config.ncpus or self.config.locate(cpu)[0] != pkg
        )
        self._read_limits(sorted(machine.online))
        self._recompute()

    def _read_limits(self, cpus: list[int]) -> None:
        if self.writer is not None:
            for cpu in cpus:
                if 0 <= cpu < self.config.ncpus:
                    self._limits[cpu] = self.writer.read_cpufreq_limits(cpu)

    def sysfs_changed(self, cpus: list[int]) -> None:
        """The limits of ``cpus`` re-read: the frequencies of the modules
        whose limits changed are computed again (their counters advance to
        now first, at the frequencies until now), nothing else (a write of
        limits a CPU has already changes no frequency)."""
        if self._stale or self._stale_punits:
            self._recompute()  # the frequencies until now first
        before = {cpu: self._limits.get(cpu) for cpu in cpus}
        self._read_limits(cpus)
        self._log("sysfs", cpus=len(cpus))
        now = self.clock()
        for cpu, was in before.items():
            if not 0 <= cpu < self.config.ncpus or self._limits.get(cpu) == was:
                continue
            pkg, punit, module, _ = self._loc[cpu]
            key = (pkg, punit)
            self._changed_at[key] = now
            self._stale_modules.setdefault(key, set()).add(module)
            self._stale_punits.add(key)
        if self._stale_punits:
            self._recompute()

    def settle(self) -> None:
        self._advance()

    def sync(self) -> None:
        # the frequency oracle is not computed here: whatever reads a
        # frequency or advances the counters computes it first (a change's
        # counters advance from the time it was made, _changed_at), and an
        # idle helper does (idle): an association write's reply does not wait
        # for the model of its frequencies, which no reply carries
        if self.state_file is None:
            return
        # hardware keeps every write at once: so does the model, before the
        # reply leaves, or a helper killed right after answering would come
        # back with SST the plugin was told it is not. A request that changed
        # nothing the hardware holds (an association to the CLOS a core is on
        # already, a cpufreq write: sysfs keeps those) leaves only counters
        # and log lines, saved when idle.
        parts = self._hardware_parts()
        if parts != self._saved_parts:
            self._save_hardware(parts)
        else:
            self._unsaved = True

    def has_deferred(self) -> bool:
        return self._unsaved or self._stale or bool(self._stale_punits)

    def catch_up(self) -> None:
        if self._stale or self._stale_punits:
            self._recompute()

    def idle(self) -> None:
        self.catch_up()
        if self._unsaved:
            self.save()

    def tsc_mhz(self) -> int:
        return self.config.tsc_mhz

    def interrupts(self, machine: Machine) -> Interrupts:
        return SimInterrupts(self, machine)

    def resctrl(self, machine: Machine) -> Resctrl:
        return SimResctrl(self)

    # ------------------------------------------------------------------ ioctls

    def api_version(self) -> int:
        return 3

    def count_instances(self, package: int) -> int:
        if not 0 <= package < self.config.packages:
            raise _enotty(f"no package {package}")
        return (1 << self.config.punits_per_package) - 1

    def phy_id(self, cpu: int) -> int:
        if not 0 <= cpu < self.config.ncpus:
            raise OSError(errno.EINVAL, f"cpu {cpu} >= possible CPUs")
        if cpu in self.config.never_online:
            return 0
        _, punit, module, thread = self.config.locate(cpu)
        return (punit << 11) | (module << 3) | thread

    def perf_levels(self, package: int, punit: int) -> PerfLevels:
        pu = self._punit(package, punit)
        return PerfLevels(
            max_level=int(pu["level_mask"]).bit_length() - 1,
            feature_rev=1,
            level_mask=pu["level_mask"],
            current_level=pu["current_level"],
            feature_state=pu["feature_state"],
            locked=bool(pu["locked"]),
            enabled=True,
            tf_support=self.config.tf_levels,
            bf_support=0,
        )

    def _check_level(self, package: int, punit: int, level: int) -> dict[str, Any]:
        pu = self._punit(package, punit)
        if not (0 <= level < 8 and pu["level_mask"] >> level & 1):
            raise _enotty(f"level {level} not enabled")
        return pu

    def level_cpu_mask(self, package: int, punit: int, level: int) -> int:
        self._check_level(package, punit, level)
        return (1 << self.config.cores_per_punit) - 1

    def level_info(self, package: int, punit: int, level: int) -> LevelInfo:
        self._check_level(package, punit, level)
        c = self.config
        return LevelInfo(
            base_mhz=c.base_mhz,
            p0_mhz=c.p0_mhz,
            pm_mhz=c.pm_mhz,
            bucket_core_counts=c.trl_buckets,
            trl_freq_mhz=(c.trl_mhz,),
        )

    def turbo_freq_info(self, package: int, punit: int, level: int) -> TurboFreqInfo:
        self._check_level(package, punit, level)
        c = self.config
        return TurboFreqInfo(
            lp_clip_mhz=(c.lp_clip_mhz,),
            bucket_core_counts=c.tf_buckets,
            trl_freq_mhz=(c.tf_mhz,),
        )

    def core_power_get(self, package: int, punit: int) -> CorePower:
        pu = self._punit(package, punit)
        key = f"{package}/{punit}"
        pending = self._cp_pending.get(key)
        if pending is not None:
            at, enable, ordered = pending
            if self.clock() < at:
                return CorePower(enable=enable, supported=True, ordered=ordered)
            del self._cp_pending[key]
        return CorePower(
            enable=bool(pu["cp_enable"]), supported=True, ordered=bool(pu["cp_ordered"])
        )

    def core_power_set(self, package: int, punit: int, enable: bool, ordered: bool) -> None:
        pu = self._punit(package, punit)
        self._check_set()
        self._check_hwp()
        if self.config.strict and (int(enable) not in (0, 1) or int(ordered) not in (0, 1)):
            raise _enotty("enable/priority_type not 0/1")
        self._advance()
        if self.config.cp_status_delay_s > 0:
            self._cp_pending[f"{package}/{punit}"] = (
                self.clock() + self.config.cp_status_delay_s,
                bool(pu["cp_enable"]),
                bool(pu["cp_ordered"]),
            )
        pu["cp_enable"] = bool(int(enable) & 1)
        # Kernel-faithful: enable=2 spills into the priority bit (§1.7).
        pu["cp_ordered"] = bool(int(ordered) & 1 or int(enable) & 2)
        self._log("cp", pkg=package, punit=punit, enable=pu["cp_enable"], ordered=pu["cp_ordered"])
        self._stale = True

    def clos_param_get(self, package: int, punit: int, clos: int) -> ClosParam:
        pu = self._punit(package, punit)
        if not 0 <= clos < 4:
            raise _enotty(f"clos {clos}")
        lo, hi, prop = pu["clos"][clos]
        return ClosParam(min_mhz=lo * 100, max_mhz=hi * 100, prop_prio=prop)

    def clos_param_set(self, package: int, punit: int, clos: int, param: ClosParam) -> None:
        pu = self._punit(package, punit)
        self._check_set()
        lo, hi, prop = param.min_mhz // 100, param.max_mhz // 100, param.prop_prio
        if self.config.strict and (
            not 0 <= clos < 4 or not 0 <= lo <= 255 or not 0 <= hi <= 255 or not 0 <= prop <= 15
        ):
            raise _enotty(f"clos {clos} param {param} out of range")
        if not 0 <= clos < 4:
            self._log("corrupt-clos-param", pkg=package, punit=punit, clos=clos)
            return
        # Register [7:4] prop, [15:8] min, [23:16] max, written unmasked (§1.7).
        reg = (prop << 4) | (lo << 8) | (hi << 16)
        self._advance()
        pu["clos"][clos] = [(reg >> 8) & 0xFF, (reg >> 16) & 0xFF, (reg >> 4) & 0xF]
        self._log("clos-param", pkg=package, punit=punit, clos=clos, min=lo * 100, max=hi * 100)
        self._stale = True

    def clos_assoc_get(self, package: int, punit: int, core: int) -> int:
        pu = self._punit(package, punit)
        if not 0 <= core < MODULES_PER_PUNIT_MAX:
            raise _enotty(f"punit core {core}")
        return int(pu["assoc"][core])

    def clos_assoc_set(self, package: int, punit: int, assoc: list[tuple[int, int]]) -> None:
        pu = self._punit(package, punit)
        self._check_set()
        if len(assoc) > 64:
            raise _enotty("more than 64 commands")
        held = pu["assoc"]
        key = (package, punit)
        changed: set[int] | None = None
        for core, clos in assoc:  # entries before a failing one stay applied (§1.1)
            if not 0 <= core < MODULES_PER_PUNIT_MAX or (self.config.strict and not 0 <= clos < 4):
                raise _enotty(f"assoc core {core} clos {clos}")
            value = clos & 0x3 if self.config.strict else clos & 0xF
            if held[core] != value:  # the same CLOS again changes no frequency
                if changed is None:
                    # this punit's frequencies until now first (another stale
                    # punit keeps the time of its own change); the counters of
                    # the CPUs this changes advance to now when they are computed
                    if self._stale or key in self._stale_punits:
                        self._recompute()
                    self._changed_at[key] = self.clock()
                    changed = self._stale_modules.setdefault(key, set())
                    self._stale_punits.add(key)
                held[core] = value
                changed.add(core)
        self._log("clos-assoc", pkg=package, punit=punit, n=len(assoc))

    def perf_set_feature(self, package: int, punit: int, feature: int) -> None:
        pu = self._punit(package, punit)
        self._check_set()
        self._check_hwp()
        self._advance()
        level = pu["current_level"]
        state = 0
        error = 0
        if feature & 0b01:  # BF is not supported on 6776P
            error |= 1
        if feature & 0b10:
            if not self.config.tf_levels >> level & 1:
                error |= 1 << 3
            elif self.config.tf_strict and not (pu["cp_enable"] and pu["cp_ordered"]):
                error |= 7 << 3
            else:
                state |= 0b10
        pu["feature_state"] = state
        pu["feature_error"] = error
        self._log("feature", pkg=package, punit=punit, feature=feature, state=state)
        self._stale = True

    def perf_set_level(self, package: int, punit: int, level: int) -> None:
        """``PERF_SET_LEVEL`` (§5.5.9); not used by the helper's requests yet."""
        pu = self._punit(package, punit)
        self._check_set()
        self._check_hwp()
        if (
            not (0 <= level < 8 and pu["allowed_mask"] >> level & 1)
            or level == pu["current_level"]
            or pu["locked"]
        ):
            self.sleep(self.config.level_change_cost_s)
            raise _enotty(f"level change to {level} refused")
        self._advance()
        pu["current_level"] = level
        pu["feature_state"] = 0
        self._log("level", pkg=package, punit=punit, level=level)
        self._stale = True

    def read_msr(self, cpu: int, msr: int) -> int:
        if self.machine is not None and cpu not in self.machine.online:
            raise OSError(errno.ENXIO, f"cpu {cpu} offline")
        if not 0 <= cpu < self.config.ncpus:
            raise OSError(errno.ENXIO, f"no cpu {cpu}")
        cpus = self.state["cpus"]
        if msr == MSR_APERF:
            return int(cpus["aperf"][cpu])
        if msr == MSR_MPERF:
            return int(cpus["mperf"][cpu])
        if msr == MSR_TSC:
            return int(cpus["tsc"][cpu])
        if msr == MSR_PM_LOGICAL_ID:
            return self.phy_id(cpu)
        if msr == MSR_PM_ENABLE:
            return int(self.config.hwp)
        if msr == MSR_PLATFORM_INFO:
            return ((self.config.base_mhz // 100) << 8) | ((self.config.pm_mhz // 100) << 40)
        raise OSError(errno.EIO, f"MSR {msr:#x} not modelled")

    # ------------------------------------------------------------------ the model

    def _advance(self) -> None:
        """Advance TSC/MPERF/APERF of every CPU to now at the frequencies in
        effect since the last change (recomputed first when a change made
        them stale)."""
        if self._stale or self._stale_punits:
            self._recompute()
        now = self.clock()
        if self._at is not None:
            self._advance_cpus(now, range(self.config.ncpus))
            self._at = None
            self.state["clock"] = now
            return
        us = int((now - float(self.state["clock"])) * 1_000_000)
        if us <= 0:
            return
        self.state["clock"] = now
        cpus = self.state["cpus"]
        tsc_step = self.config.tsc_mhz * us
        tsc_mhz = self.config.tsc_mhz
        busy = [us * x for x in cpus["load"]]
        cpus["tsc"] = [t + tsc_step for t in cpus["tsc"]]
        cpus["mperf"] = [v + int(tsc_mhz * b) for v, b in zip(cpus["mperf"], busy, strict=True)]
        cpus["aperf"] = [
            v + int(f * b) for v, f, b in zip(cpus["aperf"], cpus["max_mhz"], busy, strict=True)
        ]

    def _advance_cpus(self, now: float, which: Iterable[int]) -> None:
        """:meth:`_advance` of the CPUs ``which``, each from its own time."""
        if self._at is None:
            self._at = [float(self.state["clock"])] * self.config.ncpus
        at = self._at
        cpus = self.state["cpus"]
        tsc, mperf, aperf, load, max_mhz = (
            cpus["tsc"], cpus["mperf"], cpus["aperf"], cpus["load"], cpus["max_mhz"]
        )  # fmt: skip
        tsc_mhz = self.config.tsc_mhz
        for cpu in which:
            us = int((now - at[cpu]) * 1_000_000)
            if us <= 0:
                continue
            at[cpu] = now
            busy = us * load[cpu]
            tsc[cpu] += tsc_mhz * us
            mperf[cpu] += int(tsc_mhz * busy)
            aperf[cpu] += int(max_mhz[cpu] * busy)

    def tf_effective(self, package: int, punit: int) -> bool:
        """§5.5.11: TF status and CP enabled and ordered and turbo on."""
        pu = self._punit(package, punit)
        no_turbo = self.machine.no_turbo if self.machine is not None else False
        return bool(
            pu["feature_state"] & 0b10 and pu["cp_enable"] and pu["cp_ordered"] and not no_turbo
        )

    def _recompute(self) -> None:
        """The frequency oracle (§5.5.12) for every CPU (after an association
        change alone: for the CPUs of the punits it changed, of the modules it
        changed when the punit's other inputs are as before). A CPU whose
        frequencies an association changed has its counters advanced to the
        time of the change first, at the frequencies until then."""
        every = self._stale or not self._stale_punits
        only, self._stale_punits = self._stale_punits, set()
        modules_of, self._stale_modules = self._stale_modules, {}
        changed_at, self._changed_at = self._changed_at, {}
        self._stale = False
        c = self.config
        cpus = self.state["cpus"]
        no_turbo = self.machine.no_turbo if self.machine is not None else False
        load = cpus["load"]
        default = (c.cpuinfo_min_khz, c.cpuinfo_max_khz)
        max_mhz, min_mhz, limits = cpus["max_mhz"], cpus["min_mhz"], self._limits
        all_busy = min(load, default=1.0) > 0  # every module active (the model's default)
        for key, modules in self._module_cpus.items():
            if not every and key not in only:
                continue
            pu = self._punit(*key)
            assoc = pu["assoc"]
            hp = assoc[: c.cores_per_punit].count(0)
            bucket = next((b for b, n in enumerate(c.tf_buckets) if hp <= n), None)
            active = (
                len(modules)
                if all_busy
                else sum(1 for threads in modules if any(load[t] > 0 for t in threads))
            )
            trl = next(
                (f for n, f in zip(c.trl_buckets, c.trl_mhz, strict=False) if active <= n),
                c.trl_mhz[-1],
            )
            tf = self.tf_effective(*key)
            cp = bool(pu["cp_enable"])
            inputs = (bucket, trl, tf, cp, no_turbo, repr(pu["clos"]) if cp else "")
            which: Iterable[int] = range(len(modules))
            if not every and self._punit_inputs.get(key) == inputs and key in modules_of:
                which = sorted(m for m in modules_of[key] if m < len(modules))
            self._punit_inputs[key] = inputs
            at = changed_at.get(key)
            for module in which:
                threads = modules[module]
                clos = assoc[module] & 0x3
                hi = clos_min = 0
                if cp:
                    lo, hi, _ = pu["clos"][clos]
                    hi *= 100
                    clos_min = lo * 100
                if no_turbo:
                    limit = c.base_mhz
                elif tf and bucket is not None:
                    limit = c.tf_mhz[bucket] if clos == 0 else c.lp_clip_mhz
                else:
                    limit = trl
                for cpu in threads:
                    smin, smax = limits.get(cpu, default)
                    cap = smax // 1000
                    if hi and hi < cap:
                        cap = hi
                    max_eff = min(cap, limit)
                    if at is not None and max_mhz[cpu] != max_eff:
                        self._advance_cpus(at, (cpu,))
                    max_mhz[cpu] = max_eff
                    min_mhz[cpu] = min(max(smin // 1000, clos_min), max_eff)

    def _cpu_of(self, pkg: int, punit: int, module: int, thread: int) -> int:
        c = self.config
        return thread * c.ncores + pkg * c.cores_per_package + punit * c.cores_per_punit + module

    def expected_mhz(self, cpu: int) -> int:
        """Bzy MHz under load (the oracle's ``max_mhz``)."""
        if self._stale or self._stale_punits:
            self._recompute()
        return int(self.state["cpus"]["max_mhz"][cpu])


class SimInterrupts(Interrupts):
    """The model's ``/proc/irq``: affinities in the sim's state (``irqs``: IRQ
    number -> CPUs, saved with the rest), written as the kernel does: the CPUs
    are kept as given (``smp_affinity_list`` reads back what was written), a
    per-CPU IRQ refuses with ``EIO``, a set without an online CPU with ``EINVAL``."""

    def __init__(self, sim: SimBackend, machine: Machine) -> None:
        self.sim = sim
        self.online = sorted(machine.online)
        self.irqs = {i.number: i for i in sim.config.interrupts}
        state: dict[str, list[int]] = sim.state.setdefault("irqs", {})
        for num in self.irqs:
            state.setdefault(str(num), list(self.online))

    def read(self) -> list[m.Interrupt]:
        state = self.sim.state["irqs"]
        return [
            m.Interrupt(
                number=num,
                description=irq.description[: m.MAX_IRQ_DESCRIPTION],
                affinity=list(state[str(num)]),
                writable=not irq.per_cpu,
            )
            for num, irq in sorted(self.irqs.items())
        ][: m.MAX_INTERRUPTS]

    def default_affinity(self) -> list[int]:
        return list(self.online)

    def set_affinity(self, irq: int, cpus: list[int]) -> list[int]:
        info = self.irqs.get(irq)
        if info is None:
            raise IrqWriteError(f"irq {irq}: no such IRQ: {os.strerror(errno.ENOENT)}")
        if info.per_cpu:
            raise IrqWriteError(f"irq {irq}: {os.strerror(errno.EIO)}")
        effective = sorted(set(cpus) & set(self.online))
        if not effective:
            raise IrqWriteError(f"irq {irq}: {os.strerror(errno.EINVAL)}")
        self.sim.state["irqs"][str(irq)] = effective
        self.sim.irqs_changed()
        self.sim._log("irq-affinity", irq=irq, cpus=len(effective))
        return list(effective)


class SimResctrl(Resctrl):
    """The model's ``/sys/fs/resctrl``: L3 and MB with one cache id per
    package, groups and their schemata in the sim's state (``resctrl``:
    ``groups`` name -> resource -> cache id -> value, ``managed``, ``tasks``
    name -> pids, which a test sets to play the runtime), written as the kernel
    does: a schemata line is taken only whole and valid, else ``EINVAL``
    (a non-contiguous or out-of-mask bitmask, fewer than ``min_cbm_bits``,
    an unknown cache id), a ``mkdir`` beyond ``num_closids`` is ``ENOSPC``."""

    def __init__(self, sim: SimBackend) -> None:
        super().__init__()
        self.sim = sim
        c = sim.config
        ids = list(range(c.packages))
        self._resources = {
            "L3": m.ResctrlResource(
                name="L3",
                cache_ids=ids,
                num_closids=c.num_closids,
                cbm_mask=c.l3_cbm_mask,
                min_cbm_bits=c.l3_min_cbm_bits,
            ),
            "MB": m.ResctrlResource(
                name="MB",
                cache_ids=ids,
                num_closids=c.num_closids,
                bandwidth_gran=c.mb_bandwidth_gran,
                min_bandwidth=c.mb_min_bandwidth,
            ),
        }
        root = {"L3": {str(i): c.l3_cbm_mask for i in ids}, "MB": {str(i): 100 for i in ids}}
        state: dict[str, Any] = sim.state.setdefault(
            "resctrl", {"groups": {"": root}, "managed": [], "tasks": {}}
        )
        self.managed = set(state["managed"])

    @property
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.sim.state["resctrl"]
        return state

    def save_managed(self) -> None:
        self._state["managed"] = sorted(self.managed)
        self.sim.save()

    def mounted(self) -> bool:
        return self.sim.config.resctrl

    def resources(self) -> dict[str, m.ResctrlResource]:
        return dict(self._resources)

    def group_names(self) -> list[str]:
        return sorted(g for g in self._state["groups"] if g)

    def schemata(self, group: str) -> dict[str, dict[int, int]]:
        rows = self._state["groups"].get(group, {})
        return {r: {int(i): int(v) for i, v in vals.items()} for r, vals in rows.items()}

    def has_tasks(self, group: str) -> bool:
        return bool(self._state["tasks"].get(group))

    def create(self, group: str) -> None:
        groups = self._state["groups"]
        if group in groups:
            return
        if len(groups) >= self.sim.config.num_closids:
            raise ResctrlError(
                f"failed to create resctrl group {group!r}: {os.strerror(errno.ENOSPC)}"
            )
        c = self.sim.config
        ids = range(c.packages)
        groups[group] = {
            "L3": {str(i): c.l3_cbm_mask for i in ids},
            "MB": {str(i): 100 for i in ids},
        }
        self.sim._log("resctrl-mkdir", group=group)

    def remove(self, group: str) -> None:
        self._state["groups"].pop(group, None)
        self._state["tasks"].pop(group, None)
        self.sim._log("resctrl-rmdir", group=group)

    def write_schemata(self, group: str, text: str) -> None:
        rows = self._state["groups"].get(group)
        if rows is None:
            raise ResctrlError(f"resctrl group {group!r}: {os.strerror(errno.ENOENT)}")
        new = {r: dict(v) for r, v in rows.items()}
        for line in text.splitlines():
            name, _, cells = line.partition(":")
            res = self._resources.get(name)
            if res is None:
                raise ResctrlError(
                    f"resctrl group {group!r}: {line!r}: {os.strerror(errno.EINVAL)}"
                )
            for cell in cells.split(";"):
                key, _, value = cell.partition("=")
                try:
                    cache_id, v = int(key), int(value, 16 if res.cbm_mask else 10)
                except ValueError:
                    cache_id, v = -1, 0
                if cache_id not in res.cache_ids or not self._kernel_takes(res, v):
                    raise ResctrlError(
                        f"resctrl group {group!r}: {line!r}: {os.strerror(errno.EINVAL)}"
                    )
                if not res.cbm_mask:
                    gran = res.bandwidth_gran
                    v = -(-v // gran) * gran  # the kernel rounds up to the granularity
                new[name][str(cache_id)] = v
        rows.clear()
        rows.update(new)
        self.sim._log("resctrl-schemata", group=group)

    @staticmethod
    def _kernel_takes(res: m.ResctrlResource, v: int) -> bool:
        if not res.cbm_mask:
            return res.min_bandwidth <= v <= 100
        low = v & -v
        return (
            v > 0
            and not v & ~res.cbm_mask
            and not (v + low) & v
            and v.bit_count() >= res.min_cbm_bits
        )


def _join(parts: dict[str, bytes]) -> bytes:
    """The JSON object of ``parts`` (key -> encoded value)."""
    return b"{%s}" % b",".join(b"%s:%s" % (_json.encode(k), v) for k, v in parts.items())


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a regular file takes it whole; a short write goes on
        view = view[os.write(fd, view) :]


def _write_new(path: str, data: bytes) -> os.stat_result:
    """``data`` as ``path``, atomically (a new file renamed over it); the new file's stat."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        _write_all(fd, data)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return st

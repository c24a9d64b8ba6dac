"""The host's sysfs as the helper sees it under ``--host-root``: discovery and writers.

Discovery (:func:`discover_machine`) reads, once, everything validation needs:
online CPUs (those with ``topology/physical_package_id``, sst.md §2.1), their
package, cpufreq ranges and governors, per-CPU C-state names and uncore
domains. Writers (:class:`SysfsWriter`) only build paths from integers and from
names *looked up* in the discovered lists, never from request text.

Every backend uses the same writers; the ``sim`` backend writes the same files
under the host root it was given.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from nri_sst import _cpuset

CPU_DIR = "sys/devices/system/cpu"
UNCORE_DIR = f"{CPU_DIR}/intel_uncore_frequency"
MAX_KEPT_FILES = 16
"""C-state ``disable`` files a writer keeps open (within the helper's FD reserve)."""


class SysfsError(Exception):
    """A sysfs write or read that failed (the message names the file and errno)."""


@dataclass(frozen=True)
class CpuFreq:
    min_khz: int
    max_khz: int
    base_khz: int
    governors: tuple[str, ...]
    epp_preferences: tuple[str, ...]


@dataclass(frozen=True)
class CpufreqNow:
    """The writable cpufreq knobs of one CPU as sysfs has them now (-1/None: unreadable)."""

    min_khz: int
    max_khz: int
    governor: str | None


@dataclass(frozen=True)
class Uncore:
    package: int
    die: int
    initial_min_khz: int
    initial_max_khz: int


@dataclass
class Machine:
    """What the helper discovered under the host root (the validation reference)."""

    root: Path
    online: frozenset[int] = frozenset()
    package_of: dict[int, int] = field(default_factory=dict)
    cpufreq: dict[int, CpuFreq] = field(default_factory=dict)
    cstates: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """CPU -> C-state names in ``stateM`` order (index = M)."""
    uncore: dict[tuple[int, int], Uncore] = field(default_factory=dict)
    no_turbo: bool = False

    @property
    def packages(self) -> list[int]:
        return sorted(set(self.package_of.values()))


def _read(path: Path | str) -> str:
    with open(path) as f:
        return f.read().strip()


def _read_int(path: Path | str, default: int = 0) -> int:
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return default


def _read_or_none(path: str) -> str | None:
    try:
        return _read(path)
    except OSError:
        return None


def _write_value(fd: int, path: Path | str, value: str) -> None:
    """``value`` and a newline to the open ``fd`` of ``path`` (SysfsError names them)."""
    try:
        os.write(fd, f"{value}\n".encode())
    except OSError as exc:
        raise SysfsError(f"cannot write {value!r} to {path}: {exc.strerror}") from None


def discover_machine(root: Path) -> Machine:
    root = Path(root)
    cpu_dir = root / CPU_DIR
    m = Machine(root=root)
    online: set[int] = set()
    try:
        entries = os.listdir(cpu_dir)
    except OSError:
        entries = []
    for name in entries:
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        cpu = int(name[3:])
        d = cpu_dir / name
        try:
            pkg = int(_read(d / "topology" / "physical_package_id"))
        except (OSError, ValueError):
            continue  # offline: no topology directory
        online.add(cpu)
        m.package_of[cpu] = pkg
        f = d / "cpufreq"
        if (f / "cpuinfo_max_freq").exists():
            try:
                governors = tuple(_read(f / "scaling_available_governors").split())
            except OSError:
                governors = ()
            try:
                prefs = tuple(_read(f / "energy_performance_available_preferences").split())
            except OSError:
                prefs = ()
            m.cpufreq[cpu] = CpuFreq(
                min_khz=_read_int(f / "cpuinfo_min_freq"),
                max_khz=_read_int(f / "cpuinfo_max_freq"),
                base_khz=_read_int(f / "base_frequency"),
                governors=governors,
                epp_preferences=prefs,
            )
        names: list[str] = []
        idle = d / "cpuidle"
        i = 0
        while True:
            try:
                names.append(_read(idle / f"state{i}" / "name"))
            except OSError:
                break
            i += 1
        if names:
            m.cstates[cpu] = tuple(names)
    m.online = frozenset(online)
    udir = root / UNCORE_DIR
    try:
        uentries = sorted(os.listdir(udir))
    except OSError:
        uentries = []
    for name in uentries:
        parts = name.split("_")
        if len(parts) == 4 and parts[0] == "package" and parts[2] == "die":
            try:
                pkg, die = int(parts[1]), int(parts[3])
            except ValueError:
                continue
            m.uncore[(pkg, die)] = Uncore(
                package=pkg,
                die=die,
                initial_min_khz=_read_int(udir / name / "initial_min_freq_khz"),
                initial_max_khz=_read_int(udir / name / "initial_max_freq_khz"),
            )
    m.no_turbo = _read_int(cpu_dir / "intel_pstate" / "no_turbo") == 1
    return m


class SysfsWriter:
    """Writes cpuidle/cpufreq/uncore knobs under the host root.

    Paths are built from validated integers and from indexes of names in the
    discovered lists; request strings never become path components.
    """

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.cpu_dir = machine.root / CPU_DIR
        self._cpu_dir = str(self.cpu_dir)
        """as a string: the per-request paths are strings (no Path per file)"""
        self._kept: OrderedDict[tuple[int, int], int] = OrderedDict()
        """(CPU, idle state) -> the open ``disable`` file (:meth:`_write_kept`)"""
        self._cstates: dict[int, list[str | None]] = {}
        """CPU -> each idle state's ``disable`` as last written (:meth:`_cstates_now`)"""

    @staticmethod
    def _open(path: Path | str) -> int:
        try:
            return os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        except OSError as exc:
            raise SysfsError(f"cannot open {path}: {os.strerror(exc.errno or errno.EIO)}") from None

    def _write(self, path: Path | str, value: str) -> None:
        fd = self._open(path)
        try:
            _write_value(fd, path, value)
        finally:
            os.close(fd)

    def set_cstates(self, cpu: int, disabled: frozenset[str]) -> None:
        """``disable=1`` for names in ``disabled``, ``disable=0`` for all other
        states; only the states whose ``disable`` differs from what it holds
        are written (:meth:`_cstates_now`)."""
        base = f"{self._cpu_dir}/cpu{cpu:d}/cpuidle"  # a string: no Path per state
        now = self._cstates_now(cpu, base)
        for index, name in enumerate(self.machine.cstates.get(cpu, ())):
            value = "1" if name in disabled else "0"
            if now[index] == value:
                continue
            now[index] = None  # unknown until the write is done
            self._write_kept((cpu, index), f"{base}/state{index:d}/disable", value)
            now[index] = value

    def _write_kept(self, key: tuple[int, int], path: str, value: str) -> None:
        """``value`` (one character) to ``path`` through a file descriptor kept
        open for the next write of the same file (at most
        :data:`MAX_KEPT_FILES`, the least recently written closed first): a
        sysfs attribute takes each ``write`` whole, whatever the offset, and an
        open file costs no path walk (the HP balloons' CPUs are the ones written
        again and again). A kept descriptor that fails (its CPU went offline)
        is closed and the file opened again: that open's error is the one
        reported."""
        kept = self._kept
        fd = kept.get(key)
        if fd is not None:
            kept.move_to_end(key)
            try:
                data = f"{value}\n".encode()
                if os.pwrite(fd, data, 0) == len(data):
                    return
            except OSError:
                pass
            del kept[key]
            with contextlib.suppress(OSError):
                os.close(fd)
        fd = self._open(path)
        try:
            _write_value(fd, path, value)
        except SysfsError:
            os.close(fd)
            raise
        kept[key] = fd
        while len(kept) > MAX_KEPT_FILES:
            os.close(kept.popitem(last=False)[1])

    def close(self) -> None:
        """Close the file descriptors kept open (:meth:`_write_kept`)."""
        while self._kept:
            os.close(self._kept.popitem()[1])

    def _cstates_now(self, cpu: int, base: str) -> list[str | None]:
        """Each idle state's ``disable`` of ``cpu`` as this writer last wrote it,
        read from sysfs the first time the CPU is written (``None``: unknown, a
        read or write that failed, so the next request writes it). The helper is
        the one writer of these files on the node (the policy sends it every
        C-state change): a value written behind its back stays until a request
        changes that state's bit again, as when the policy sends nothing for a
        CPU whose class did not change."""
        now = self._cstates.get(cpu)
        if now is None:
            now = self._cstates[cpu] = [
                _read_or_none(f"{base}/state{index:d}/disable")
                for index in range(len(self.machine.cstates.get(cpu, ())))
            ]
        return now

    def set_cpufreq(
        self,
        cpu: int,
        min_khz: int | None,
        max_khz: int | None,
        governor: str | None,
        epp: str | None,
    ) -> None:
        d = f"{self._cpu_dir}/cpu{cpu:d}/cpufreq"
        if governor is not None:
            self._write(f"{d}/scaling_governor", governor)
        # Order so that min <= max holds after each write.
        current_max = _read_int(f"{d}/scaling_max_freq", 0)
        if min_khz is not None and max_khz is not None and min_khz > current_max:
            self._write(f"{d}/scaling_max_freq", str(max_khz))
            self._write(f"{d}/scaling_min_freq", str(min_khz))
        else:
            if min_khz is not None:
                self._write(f"{d}/scaling_min_freq", str(min_khz))
            if max_khz is not None:
                self._write(f"{d}/scaling_max_freq", str(max_khz))
        if epp is not None:
            self._write(f"{d}/energy_performance_preference", epp)

    def set_uncore(self, package: int, die: int, min_khz: int | None, max_khz: int | None) -> None:
        d = self.machine.root / UNCORE_DIR / f"package_{package:02d}_die_{die:02d}"
        if min_khz is not None:
            self._write(d / "min_freq_khz", str(min_khz))
        if max_khz is not None:
            self._write(d / "max_freq_khz", str(max_khz))

    def read_cpufreq_limits(self, cpu: int) -> tuple[int, int]:
        """``(scaling_min_freq, scaling_max_freq)`` in kHz, ``(0, 0)`` when unreadable."""
        d = f"{self._cpu_dir}/cpu{cpu:d}/cpufreq"
        return _read_int(f"{d}/scaling_min_freq"), _read_int(f"{d}/scaling_max_freq")

    def cpufreq_now(self, cpu: int) -> CpufreqNow:
        """What cpufreq of ``cpu`` is set to now (what a request is checked against)."""
        d = f"{self._cpu_dir}/cpu{cpu:d}/cpufreq"
        try:
            governor: str | None = _read(f"{d}/scaling_governor")
        except OSError:
            governor = None
        return CpufreqNow(
            min_khz=_read_int(f"{d}/scaling_min_freq", -1),
            max_khz=_read_int(f"{d}/scaling_max_freq", -1),
            governor=governor,
        )

    def uncore_now(self, package: int, die: int) -> tuple[int, int]:
        """``(min_freq_khz, max_freq_khz)`` of an uncore domain; -1 where unreadable."""
        d = self.machine.root / UNCORE_DIR / f"package_{package:02d}_die_{die:02d}"
        return _read_int(d / "min_freq_khz", -1), _read_int(d / "max_freq_khz", -1)


def online_list(machine: Machine) -> str:
    return _cpuset.format(machine.online)

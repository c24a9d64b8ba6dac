"""IRQ affinity: ``/proc/interrupts`` and ``/proc/irq/N/smp_affinity_list``.

The helper's one way to IRQs, for :class:`~nri_sst.messages.ListInterrupts`
and :class:`~nri_sst.messages.SetIrqAffinity`. Paths are built from IRQ
numbers only (integers the list found), never from request text.

:class:`ProcInterrupts` is the real kernel's, under the helper's host root
(``<host-root>/proc``: the chart mounts the host's ``/proc`` there, the same
root sysfs is read from). The kernel refuses affinity writes of per-CPU and
kernel-managed IRQs (``EIO``) and of IRQs whose file is read-only (``EPERM``,
``EROFS``); such an IRQ is reported not writable from then on, as upstream's
``pkg/irq`` stops trying (:func:`marks_read_only` is the one classification).
The ``sim`` backend models the same interface
(:class:`nri_sst.backends.sim.SimInterrupts`).
"""

from __future__ import annotations

import errno
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from nri_sst import _cpuset
from nri_sst import messages as m

MAX_INTERRUPTS_FILE = 4 * 1024 * 1024
"""Bytes of ``/proc/interrupts`` read at most (a 4096-CPU host's is ~2 MiB)."""
READ_ONLY_ERRNOS = frozenset({errno.EIO, errno.EPERM, errno.EACCES, errno.EROFS, errno.EISDIR})
"""Write errors that mark an IRQ not controllable from then on: the kernel's
refusal of a per-CPU or kernel-managed IRQ (``EIO``), a read-only file or
mount (``EPERM``, ``EACCES``, ``EROFS``), a directory where the affinity file
should be (``EISDIR``: an :class:`IsADirectoryError`). Every other error fails
that one write only: ``EINVAL`` (no online CPU in the set), ``ENOENT`` (the
IRQ went away; its number may come back with another device), ``ENOSPC``,
``EBUSY`` (the vector space is full now)."""


def marks_read_only(exc: OSError) -> bool:
    """Whether a failed affinity write makes its IRQ not controllable (:data:`READ_ONLY_ERRNOS`)."""
    return exc.errno in READ_ONLY_ERRNOS


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to an existing procfs file in one ``write`` (never creates it)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class IrqWriteError(Exception):
    """The kernel refused an affinity write (the message names the IRQ and errno)."""


def parse_interrupts(text: str) -> list[tuple[int, str]]:
    """Numbered IRQs of ``/proc/interrupts`` and their descriptions (the
    fields after the per-CPU counters, joined by one space: upstream's
    ``parseInterruptsLine``); named rows (``NMI``, ``LOC``) are left out."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[0].endswith(":"):
            continue
        head = fields[0][:-1]
        if not head.isascii() or not head.isdigit():
            continue
        rest = fields[1:]
        start = next((i for i, f in enumerate(rest) if not f.isdigit()), len(rest))
        out[int(head)] = " ".join(rest[start:])[: m.MAX_IRQ_DESCRIPTION]
    return sorted(out.items())[: m.MAX_INTERRUPTS]


class Interrupts(ABC):
    """IRQs as the helper sees them."""

    @abstractmethod
    def read(self) -> list[m.Interrupt]:
        """Every numbered IRQ (at most :data:`~nri_sst.messages.MAX_INTERRUPTS`)."""

    @abstractmethod
    def default_affinity(self) -> list[int]: ...

    @abstractmethod
    def set_affinity(self, irq: int, cpus: list[int]) -> list[int]:
        """Write one (validated) IRQ's affinity; the affinity read back.
        Raises :class:`IrqWriteError`."""


class ProcInterrupts(Interrupts):
    """The kernel's procfs under ``root``."""

    def __init__(self, root: Path, write: Callable[[Path, bytes], None] = write_file) -> None:
        self.proc = Path(root) / "proc"
        self.read_only: set[int] = set()
        """IRQs a write was refused for (:func:`marks_read_only`): listed not writable."""
        self.write = write
        """How an affinity file is written (a unit test injects the kernel's refusals)."""

    def _affinity_file(self, irq: int) -> Path:
        return self.proc / "irq" / f"{int(irq):d}" / "smp_affinity_list"

    def _read_cpus(self, path: Path) -> list[int] | None:
        try:
            with open(path, "rb") as f:
                return _cpuset.parse(f.read(64 * 1024).decode("ascii"))
        except (OSError, ValueError, UnicodeDecodeError):
            return None

    def read(self) -> list[m.Interrupt]:
        try:
            with open(self.proc / "interrupts", "rb") as f:
                text = f.read(MAX_INTERRUPTS_FILE).decode("utf-8", "replace")
        except OSError:
            return []
        out = []
        for num, desc in parse_interrupts(text):
            path = self._affinity_file(num)
            cpus = self._read_cpus(path)
            writable = cpus is not None and num not in self.read_only and os.access(path, os.W_OK)
            out.append(
                m.Interrupt(number=num, description=desc, affinity=cpus or [], writable=writable)
            )
        return out

    def default_affinity(self) -> list[int]:
        path = self.proc / "irq" / "default_smp_affinity"
        try:
            mask = int(path.read_text(encoding="ascii").strip().replace(",", ""), 16)
        except (OSError, ValueError):
            return []
        return [i for i in range(mask.bit_length()) if mask >> i & 1]

    def set_affinity(self, irq: int, cpus: list[int]) -> list[int]:
        path = self._affinity_file(irq)
        try:
            self.write(path, f"{_cpuset.format(cpus)}\n".encode())
        except OSError as exc:
            if marks_read_only(exc):
                self.read_only.add(irq)
            raise IrqWriteError(
                f"irq {irq}: cannot write {_cpuset.format(cpus)!r} to {path}: "
                f"{os.strerror(exc.errno or errno.EIO)}"
            ) from None
        return self._read_cpus(path) or []

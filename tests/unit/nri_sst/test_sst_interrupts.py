"""IRQ affinity in the helper: /proc/interrupts parsing, the sim's /proc/irq
model, the real procfs writer on a procfs-shaped temp tree, and the
validation of SetIrqAffinity (a refused batch writes nothing)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from nri_sst import messages as m
from nri_sst.backends.sim import SimBackend
from nri_sst.handler import RequestHandler
from nri_sst.interrupts import IrqWriteError, ProcInterrupts, parse_interrupts

from .conftest import SMALL_SIM

PROC_INTERRUPTS = """\
            CPU0       CPU1
   0:         36          0  IR-IO-APIC    2-edge      timer
   4:          0        112  IR-IO-APIC    4-edge      ttyS0
   8:          1          0  IR-IO-APIC    8-edge      rtc0
 NMI:          0          0   Non-maskable interrupts
 LOC:      12345      23456   Local timer interrupts
"""


def test_parse_interrupts_takes_the_description_after_the_counters() -> None:
    assert parse_interrupts(PROC_INTERRUPTS) == [
        (0, "IR-IO-APIC 2-edge timer"),
        (4, "IR-IO-APIC 4-edge ttyS0"),
        (8, "IR-IO-APIC 8-edge rtc0"),
    ]


def _handler(root: Path) -> RequestHandler:
    h = RequestHandler(SimBackend(SMALL_SIM), root)
    h.dispatch(m.Hello(protocol=1), b"t")
    return h


def _affinities(h: RequestHandler) -> dict[int, list[int]]:
    reply = h.dispatch(m.ListInterrupts(), b"t")
    assert isinstance(reply, m.ListInterruptsReply)
    return {i.number: i.affinity for i in reply.interrupts}


def _refused(h: RequestHandler, req: m.SetIrqAffinity) -> str:
    before = _affinities(h)
    reply = m.decode_reply(h.handle(m.encode(req), b"t"))
    assert isinstance(reply, m.ErrorReply) and reply.code == "invalid-argument", reply
    assert _affinities(h) == before  # nothing written
    return reply.message


def test_sim_lists_a_servers_irqs_and_writes_affinities(small_root: Path) -> None:
    h = _handler(small_root)
    reply = h.dispatch(m.ListInterrupts(), b"t")
    assert isinstance(reply, m.ListInterruptsReply)
    by_desc = {i.description.split()[-1]: i for i in reply.interrupts}
    assert not by_desc["timer"].writable and by_desc["ttyS0"].writable
    assert by_desc["rtc0"].affinity == list(range(16))
    done = h.dispatch(m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[4, 8], cpus=[2, 3])]), b"t")
    assert done == m.SetIrqAffinityReply(affinities={4: [2, 3], 8: [2, 3]})
    assert _affinities(h)[4] == [2, 3]


@pytest.mark.parametrize(
    ("groups", "says"),
    [
        ([m.IrqGroup(irqs=[4], cpus=[1]), m.IrqGroup(irqs=[1234], cpus=[1])], "no irq 1234"),
        ([m.IrqGroup(irqs=[4], cpus=[1]), m.IrqGroup(irqs=[0], cpus=[1])], "not controllable"),
        ([m.IrqGroup(irqs=[4, 8], cpus=[1, 99])], "not online"),
        ([m.IrqGroup(irqs=[4], cpus=[])], "empty CPU list"),
        ([m.IrqGroup(irqs=[4], cpus=[1]), m.IrqGroup(irqs=[4], cpus=[2])], "more than once"),
    ],
)
def test_a_refused_batch_writes_nothing(
    small_root: Path, groups: list[m.IrqGroup], says: str
) -> None:
    assert says in _refused(_handler(small_root), m.SetIrqAffinity(groups=groups))


def test_a_huge_batch_is_refused(small_root: Path) -> None:
    h = _handler(small_root)
    huge = m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[4] * (m.MAX_IRQ_BATCH + 1), cpus=[1])])
    assert "exceed the limit" in _refused(h, huge)


def _proc(root: Path, irqs: dict[int, str]) -> None:
    for num, cpus in irqs.items():
        d = root / "proc" / "irq" / str(num)
        d.mkdir(parents=True)
        (d / "smp_affinity_list").write_text(cpus + "\n")
    (root / "proc" / "interrupts").write_text(PROC_INTERRUPTS)
    (root / "proc" / "irq" / "default_smp_affinity").write_text("3\n")


def test_procfs_lists_and_writes_under_the_host_root(tmp_path: Path) -> None:
    _proc(tmp_path, {0: "0-1", 4: "0-1"})  # irq 8 has no /proc/irq/8: not controllable
    p = ProcInterrupts(tmp_path)
    listed = {i.number: i for i in p.read()}
    assert listed[4] == m.Interrupt(4, "IR-IO-APIC 4-edge ttyS0", [0, 1], True)
    assert not listed[8].writable and listed[8].affinity == []
    assert p.default_affinity() == [0, 1]
    assert p.set_affinity(4, [1]) == [1]
    assert (tmp_path / "proc/irq/4/smp_affinity_list").read_text() == "1\n"


def _refusing(code: int) -> Callable[[Path, bytes], None]:
    """The kernel's refusal of an affinity write (as root a temp file cannot
    refuse with EIO: the write function of ProcInterrupts is ours, injected)."""

    def write(path: Path, data: bytes) -> None:
        raise OSError(code, os.strerror(code), str(path))

    return write


@pytest.mark.parametrize("code", [errno.EIO, errno.EPERM, errno.EACCES, errno.EROFS])
def test_a_refused_write_marks_the_irq_not_controllable(tmp_path: Path, code: int) -> None:
    _proc(tmp_path, {0: "0-1", 4: "0-1", 8: "0-1"})
    p = ProcInterrupts(tmp_path, write=_refusing(code))
    with pytest.raises(IrqWriteError, match=f"irq 4: .*{os.strerror(code)}"):
        p.set_affinity(4, [1])
    listed = {i.number: i.writable for i in p.read()}
    assert listed == {0: True, 4: False, 8: True}  # from now on, until the helper restarts


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOENT, errno.ENOSPC, errno.EBUSY])
def test_a_failed_write_of_another_kind_fails_that_write_only(tmp_path: Path, code: int) -> None:
    _proc(tmp_path, {4: "0-1"})
    p = ProcInterrupts(tmp_path, write=_refusing(code))
    with pytest.raises(IrqWriteError):
        p.set_affinity(4, [1])
    assert {i.number: i.writable for i in p.read()}[4]


def test_a_directory_for_the_affinity_file_marks_the_irq_read_only(tmp_path: Path) -> None:
    """A real filesystem refusal as root: smp_affinity_list is a directory
    (IsADirectoryError, EISDIR); the mark stays when a file is there again."""
    _proc(tmp_path, {4: "0-1"})
    target = tmp_path / "proc/irq/8/smp_affinity_list"
    target.mkdir(parents=True)
    p = ProcInterrupts(tmp_path)
    with pytest.raises(IrqWriteError, match=r"irq 8: .*Is a directory"):
        p.set_affinity(8, [1])
    assert p.read_only == {8}
    target.rmdir()
    target.write_text("0-1\n")
    assert {i.number: i.writable for i in p.read()} == {0: False, 4: True, 8: False}

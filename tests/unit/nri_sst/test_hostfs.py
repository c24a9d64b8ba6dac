"""The helper's sysfs writer on a real sysfs-shaped tree: which files a write touches.

A file the writer rewrites holds exactly ``"<value>\\n"``; each test first marks
the files with trailing blanks (the writer's reads strip them), so a file still
marked is one it did not write.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from nri_sst.hostfs import MAX_KEPT_FILES, SysfsError, SysfsWriter, discover_machine

NAMES = ("POLL", "C1", "C1E", "C6", "C6P")


def _disable(root: Path, cpu: int, index: int) -> Path:
    return root / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state{index}/disable"


def _mark(root: Path, cpu: int) -> None:
    for index in range(len(NAMES)):
        f = _disable(root, cpu, index)
        f.write_text(f"{f.read_text().strip()}  \n")


def _written(root: Path, cpu: int) -> dict[str, str]:
    """name -> value of the states whose file was written since :func:`_mark`
    (a write through a kept descriptor replaces the first bytes only: the
    value is what the file holds, stripped, as sysfs readers see it)."""
    out = {}
    for index, name in enumerate(NAMES):
        text = _disable(root, cpu, index).read_text()
        if not text.endswith("  \n"):
            out[name] = text.strip()
    return out


@pytest.fixture
def writer(small_root: Path) -> Iterator[SysfsWriter]:
    machine = discover_machine(small_root)
    assert machine.cstates[2] == NAMES
    w = SysfsWriter(machine)
    yield w
    w.close()


def test_only_the_states_whose_disable_changes_are_written(
    small_root: Path, writer: SysfsWriter
) -> None:
    _mark(small_root, 2)
    writer.set_cstates(2, frozenset({"C6"}))
    assert _written(small_root, 2) == {"C6": "1"}
    _mark(small_root, 2)
    writer.set_cstates(2, frozenset({"C6", "C6P"}))
    assert _written(small_root, 2) == {"C6P": "1"}
    _mark(small_root, 2)
    writer.set_cstates(2, frozenset({"C6", "C6P"}))
    assert _written(small_root, 2) == {}
    writer.set_cstates(2, frozenset())
    assert _written(small_root, 2) == {"C6": "0", "C6P": "0"}


def test_what_sysfs_holds_before_the_first_write_is_what_it_is_compared_with(
    small_root: Path, writer: SysfsWriter
) -> None:
    _disable(small_root, 2, 3).write_text("1\n")  # C6 disabled before the helper started
    _mark(small_root, 2)
    writer.set_cstates(2, frozenset({"C6"}))
    assert _written(small_root, 2) == {}
    writer.set_cstates(2, frozenset())
    assert _written(small_root, 2) == {"C6": "0"}


def test_a_state_whose_write_failed_is_written_by_the_next_request(
    small_root: Path, writer: SysfsWriter
) -> None:
    writer.set_cstates(2, frozenset({"C6"}))
    broken = _disable(small_root, 2, 4)
    broken.unlink()
    broken.mkdir()  # opening it for writing fails (EISDIR)
    with pytest.raises(SysfsError, match="state4/disable"):
        writer.set_cstates(2, frozenset({"C6", "C6P"}))
    broken.rmdir()
    broken.write_text("0  \n")
    writer.set_cstates(2, frozenset({"C6", "C6P"}))
    assert broken.read_text() == "1\n"


def test_a_state_it_could_not_read_is_written(small_root: Path, writer: SysfsWriter) -> None:
    _disable(small_root, 2, 0).unlink()  # POLL's disable cannot be read (nor written)
    with pytest.raises(SysfsError, match="state0/disable"):
        writer.set_cstates(2, frozenset({"C6"}))  # POLL stays enabled: still tried


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_file_written_again_is_written_through_the_descriptor_kept_open(
    small_root: Path, writer: SysfsWriter
) -> None:
    writer.set_cstates(2, frozenset({"C6"}))
    c6 = _disable(small_root, 2, 3)
    moved = c6.with_name("disable.kept")
    c6.rename(moved)  # the kept descriptor still names the file written first
    c6.write_text("1\n")
    writer.set_cstates(2, frozenset())
    assert moved.read_text() == "0\n" and c6.read_text() == "1\n"


def test_a_kept_descriptor_that_fails_is_closed_and_the_file_opened_again(
    small_root: Path, writer: SysfsWriter
) -> None:
    writer.set_cstates(2, frozenset({"C6"}))
    c6 = _disable(small_root, 2, 3)
    fd = next(iter(writer._kept.values()))
    ro = os.open(os.devnull, os.O_RDONLY)
    os.dup2(ro, fd)  # the number, read-only now: a write through it fails, as an
    os.close(ro)  # offline CPU's attribute fails one
    writer.set_cstates(2, frozenset())
    assert c6.read_text() == "0\n"


def test_at_most_max_kept_files_stay_open(small_root: Path, writer: SysfsWriter) -> None:
    before = _open_fds()
    for cpu in range(16):
        writer.set_cstates(cpu, frozenset({"C6", "C6P"}))  # two files each
    assert len(_open_fds() - before) == MAX_KEPT_FILES
    writer.close()
    assert _open_fds() - before == set()

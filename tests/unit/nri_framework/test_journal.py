"""The decision journal: records written before the reply, replayed over the
snapshot, a torn tail cut off, compaction by sequence number and by size.

The tests run inside the event loop (``async``): there the snapshot waits
for its coalescing delay, so what a restart finds is the journal's doing."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc
from pathlib import Path

import msgspec
import pytest
from nri_framework import statefile
from nri_framework.host import PolicyHost
from nri_framework.journal import HEADER, Decision, frame
from nri_framework.model import Container, CpuResources, Event, Pod, Resources
from nri_framework.policies.pinner import Pinner

POD = Pod(id="p", name="pod")


def guaranteed(cid: str, n: int) -> Container:
    cpu = CpuResources(shares=1024 * n, quota=100_000 * n, period=100_000)
    return Container(id=cid, pod_sandbox_id="p", name=cid, resources=Resources(cpu=cpu))


def sysfs(tmp_path: Path) -> str:
    cpu = tmp_path / "root/sys/devices/system/cpu"
    cpu.mkdir(parents=True, exist_ok=True)
    (cpu / "online").write_text("0-7\n")
    return str(tmp_path / "root")


def host(tmp_path: Path) -> PolicyHost:
    return PolicyHost("pinner", Pinner(), state_dir=tmp_path / "state", host_root=sysfs(tmp_path))


def restored(h: PolicyHost, *containers: Container) -> dict[str, str]:
    """What a restarted host gives the containers the runtime reports (no cpusets)."""
    updates = h.synchronize([POD], list(containers))
    return {
        u.container_id: u.resources.cpu.cpus for u in updates if u.resources and u.resources.cpu
    }


def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "state/pinner.journal"


async def test_decisions_survive_without_a_snapshot(tmp_path: Path) -> None:
    first = host(tmp_path)
    first.synchronize([], [])
    first.create_container(POD, guaranteed("a", 2))
    first.create_container(POD, guaranteed("b", 1))
    # the process dies before the snapshot delay: only the journal has them
    assert not (tmp_path / "state/pinner.state.json").exists()
    assert journal_path(tmp_path).stat().st_size > 0
    again = host(tmp_path)
    assert restored(again, guaranteed("a", 2), guaranteed("b", 1)) == {"a": "6-7", "b": "5"}


async def test_torn_last_record_is_cut_off_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = host(tmp_path)
    first.synchronize([], [])
    first.create_container(POD, guaranteed("a", 2))
    good = journal_path(tmp_path).stat().st_size
    first.create_container(POD, guaranteed("b", 1))
    # a crash in the middle of the last write(2)
    with open(journal_path(tmp_path), "r+b") as f:
        f.truncate(journal_path(tmp_path).stat().st_size - 3)
    with caplog.at_level(logging.WARNING):
        again = host(tmp_path)
    assert "torn record" in caplog.text
    assert journal_path(tmp_path).stat().st_size == good  # cut where the good part ends
    # everything before the torn record is kept; "b" was never announced
    assert restored(again, guaranteed("a", 2)) == {"a": "6-7"}
    # what is appended after the cut is read back by the next start
    again.create_container(POD, guaranteed("c", 1))
    third = host(tmp_path)
    assert restored(third, guaranteed("a", 2), guaranteed("c", 1)) == {"a": "6-7", "c": "5"}


@pytest.mark.parametrize("damage", ["checksum", "garbage length", "undecodable"])
async def test_damaged_records_end_the_replay(tmp_path: Path, damage: str) -> None:
    first = host(tmp_path)
    first.synchronize([], [])
    first.create_container(POD, guaranteed("a", 2))
    good = journal_path(tmp_path).stat().st_size
    payload = msgspec.msgpack.encode(Decision(seq=99, containers={"a": None}))
    if damage == "checksum":
        record = HEADER.pack(len(payload), 12345) + payload
    elif damage == "garbage length":
        record = HEADER.pack(0xFFFFFFF0, 0) + payload
    else:
        record = frame(b"\xc1not msgpack")
    with open(journal_path(tmp_path), "ab") as f:
        f.write(record)
    tracemalloc.start()
    try:
        again = host(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # a 4 GiB length field is not believed
    assert journal_path(tmp_path).stat().st_size == good
    assert restored(again, guaranteed("a", 2)) == {"a": "6-7"}


async def test_records_the_snapshot_holds_are_skipped(tmp_path: Path) -> None:
    first = host(tmp_path)
    first.synchronize([], [])
    first.create_container(POD, guaranteed("a", 2))
    held = journal_path(tmp_path).read_bytes()  # records the next snapshot holds
    first.notify(Event.REMOVE_CONTAINER, POD, guaranteed("a", 2))
    first.save_now()  # the snapshot: "a" came and went; the journal is emptied
    assert journal_path(tmp_path).stat().st_size == 0
    # a crash after the snapshot's rename, before the journal was emptied,
    # leaves records the snapshot already holds: replayed, "a" would be back
    journal_path(tmp_path).write_bytes(held)
    again = host(tmp_path)
    assert again.restore_without_sync() == []


async def test_a_large_journal_is_compacted_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statefile, "COMPACT_BYTES", 200)
    h = host(tmp_path)
    h.synchronize([], [])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while journal_path(tmp_path).stat().st_size:  # until the Synchronize's snapshot empties it
        assert loop.time() < deadline, "no snapshot after the Synchronize"
        await asyncio.sleep(0.01)
    h.create_container(POD, guaranteed("a", 1))
    assert 0 < journal_path(tmp_path).stat().st_size < 200  # small: waits for the delay
    await asyncio.sleep(0)
    assert journal_path(tmp_path).stat().st_size > 0
    for cid in "bcd":
        h.create_container(POD, guaranteed(cid, 1))
    assert journal_path(tmp_path).stat().st_size > 200
    await asyncio.sleep(0)  # past the limit: compacted on the next loop turn
    assert journal_path(tmp_path).stat().st_size == 0
    again = host(tmp_path)
    assert restored(again, *(guaranteed(c, 1) for c in "abcd")) == {
        "a": "7",
        "b": "6",
        "c": "5",
        "d": "4",
    }


async def test_an_unwritable_journal_is_logged_once_and_decisions_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state").mkdir()
    journal_path(tmp_path).mkdir()  # a directory where the journal should be
    h = host(tmp_path)
    h.synchronize([], [])
    a = h.create_container(POD, guaranteed("a", 1))
    b = h.create_container(POD, guaranteed("b", 1))
    assert a.adjustment and b.adjustment
    assert caplog.text.count("cannot write the decision journal") == 1

"""The decision journal: records written before the reply, replayed over the
snapshot, a torn tail cut off, compaction by sequence number and by size; the
records of a policy with keyed state (``policy_state_changes``), the files of
the format before keyed states, the snapshot that waits for a quiet node.

The tests run inside the event loop (``async``): there the snapshot waits
for its coalescing delay, so what a restart finds is the journal's doing."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nri_framework import cpuset, statefile
from nri_framework.cache import Cache
from nri_framework.hookspecs import hookimpl
from nri_framework.host import PolicyHost
from nri_framework.journal import HEADER, Decision, Journal, StateChanges, frame
from nri_framework.model import (
    Container,
    ContainerState,
    CpuResources,
    CreateResult,
    Event,
    Pod,
    Resources,
    Update,
)
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
    monkeypatch.setattr(statefile, "COMPACT_BYTES", 400)  # room for two small records
    h = host(tmp_path)
    h.synchronize([], [])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while journal_path(tmp_path).stat().st_size:  # until the Synchronize's snapshot empties it
        assert loop.time() < deadline, "no snapshot after the Synchronize"
        await asyncio.sleep(0.01)
    h.create_container(POD, guaranteed("a", 1))
    assert 0 < journal_path(tmp_path).stat().st_size < 200  # room for another: waits
    await asyncio.sleep(0)
    assert journal_path(tmp_path).stat().st_size > 0
    for cid in "bcd":
        h.create_container(POD, guaranteed(cid, 1))
    assert journal_path(tmp_path).stat().st_size > 400
    await asyncio.sleep(0)  # past the limit: compacted from the next loop turn
    await h.statefile.written()  # the file, written by a thread
    assert journal_path(tmp_path).stat().st_size == 0
    again = host(tmp_path)
    assert restored(again, *(guaranteed(c, 1) for c in "abcd")) == {
        "a": "7",
        "b": "6",
        "c": "5",
        "d": "4",
    }


class HeldWrite:
    """``statefile.replace_file`` held in the writer's thread until released
    (``before``: ahead of the write; else once the file is in place), and
    the thread it ran in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, before: bool = True) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.threads: list[threading.Thread] = []
        real = statefile.replace_file

        def held(path: Path, data: bytes) -> None:
            data = bytes(data)  # this snapshot's, whatever is encoded meanwhile
            self.threads.append(threading.current_thread())
            self.entered.set()
            if not before:
                real(path, data)
            assert self.release.wait(10), "the held write was never released"
            if before:
                real(path, data)

        monkeypatch.setattr(statefile, "replace_file", held)

    async def started(self) -> None:
        for _ in range(500):
            if self.entered.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("no snapshot was written")


async def held_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: bool = True
) -> tuple[PolicyHost, HeldWrite]:
    """A host whose records of a-d made the snapshot due, its write held (see
    :class:`HeldWrite`), and e decided while it is held."""
    h = host(tmp_path)
    h.synchronize([], [])
    await h.statefile.written()
    write = HeldWrite(monkeypatch, before)
    monkeypatch.setattr(statefile, "COMPACT_BYTES", 400)
    for cid in "abcd":
        h.create_container(POD, guaranteed(cid, 1))
    await write.started()
    h.create_container(POD, guaranteed("e", 1))
    return h, write


async def test_requests_are_answered_while_the_snapshot_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A due snapshot's file is written by a thread: while its write is held,
    the loop goes on deciding (each decision journaled before its answer), and
    the records made meanwhile stay in the journal once the snapshot is in
    place: a restart finds every decision. Fails with the write on the loop
    (the held write never returns to the loop) or with the journal emptied
    after the snapshot (the decisions made meanwhile are lost)."""
    h, write = await held_snapshot(tmp_path, monkeypatch)
    assert write.threads[0] is not threading.current_thread()
    record = h.statefile.journal.last  # type: ignore[union-attr]  # e's
    write.release.set()
    await h.statefile.written()
    assert journal_path(tmp_path).stat().st_size == record  # e's record alone
    decided = {cid: c.resources.cpu.cpus for cid, c in h.containers.items()}  # type: ignore[union-attr]
    again = host(tmp_path)
    assert restored(again, *(guaranteed(c, 1) for c in "abcde")) == decided


async def test_a_snapshot_asked_for_during_a_write_follows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """e's record, made while the snapshot's file is held, asks for another
    snapshot (the journal is past the limit then): it is not dropped but
    comes once the write ended, so the quiet node's journal ends up empty.
    Fails without the save that was put off."""
    monkeypatch.setattr(statefile, "SAVE_DELAY", 0.05)
    h, write = await held_snapshot(tmp_path, monkeypatch)
    write.release.set()
    await h.statefile.written()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while journal_path(tmp_path).stat().st_size:  # cut once the snapshot is in place
        assert loop.time() < deadline, "the snapshot asked for during the write never came"
        await asyncio.sleep(0.01)
    saved = msgspec.json.decode((tmp_path / "state/pinner.state.json").read_bytes())
    assert set(saved["containers"]) == set("abcde")


async def test_a_crash_between_the_snapshot_and_the_journal_cut_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot written in the background is in place, the journal not yet
    cut (the process dies there): the restart reads the snapshot and skips the
    journal's records it holds by their sequence numbers."""
    h, write = await held_snapshot(tmp_path, monkeypatch, before=False)
    decided = {cid: c.resources.cpu.cpus for cid, c in h.containers.items()}  # type: ignore[union-attr]
    again = host(tmp_path)  # what a restart now would read
    assert restored(again, *(guaranteed(c, 1) for c in "abcde")) == decided
    write.release.set()
    await h.statefile.written()


async def test_a_save_now_waits_for_the_snapshot_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At shutdown the snapshot is written at once, after the one in the
    background: the files hold the last decision and the journal is empty."""
    h, write = await held_snapshot(tmp_path, monkeypatch)
    threading.Timer(0.05, write.release.set).start()
    h.shutdown()
    assert journal_path(tmp_path).stat().st_size == 0
    saved = msgspec.json.decode((tmp_path / "state/pinner.state.json").read_bytes())
    assert set(saved["containers"]) == set("abcde")


def annotated(cid: str, size: int) -> Container:
    """A container whose record is about ``size`` bytes (its annotations)."""
    return msgspec.structs.replace(guaranteed(cid, 1), annotations={"note": "x" * size})


@pytest.mark.parametrize("kind", ["synchronize", "create"])
async def test_a_record_leaving_no_room_for_another_is_compacted_after_its_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A record so large that one more like it would carry the journal past
    COMPACT_BYTES makes the snapshot due, whatever the request kind (a
    Synchronize's, the whole node; a create's): written on the next loop turn,
    after its reply (the record on disk before it, the snapshot not yet), not
    in the stream that follows; a small record waits for the quiet delay."""
    monkeypatch.setattr(statefile, "COMPACT_BYTES", 10_000)
    snapshot = tmp_path / "state/pinner.state.json"
    h = host(tmp_path)
    h.synchronize([POD], [guaranteed("a", 1)])
    await asyncio.sleep(0.01)
    assert not snapshot.exists()  # room for many such records: the quiet delay
    h.save_now()
    seq = msgspec.json.decode(snapshot.read_bytes())["seq"]
    if kind == "synchronize":  # the large part a pod, which later records leave out
        big_pod = Pod(id="q", name="big", annotations={"note": "x" * 6_000})
        h.synchronize([POD, big_pod], [guaranteed("a", 1)])
    else:
        h.create_container(POD, annotated("big", 6_000))
    size = journal_path(tmp_path).stat().st_size
    assert 6_000 < size < 10_000  # journaled before the reply, below the limit itself
    assert msgspec.json.decode(snapshot.read_bytes())["seq"] == seq  # not in the reply path
    await asyncio.sleep(0)  # the next loop turn
    await h.statefile.written()  # the file, written by a thread
    assert journal_path(tmp_path).stat().st_size == 0
    assert msgspec.json.decode(snapshot.read_bytes())["seq"] == seq + 1
    h.create_container(POD, guaranteed("b", 1))  # a small record: the delay again
    await asyncio.sleep(0.01)
    assert journal_path(tmp_path).stat().st_size > 0
    decided = {cid: c.resources.cpu.cpus for cid, c in h.containers.items()}  # type: ignore[union-attr]
    asked = [guaranteed("a", 1), guaranteed("b", 1)]  # without cpusets
    if kind == "create":
        asked.append(annotated("big", 6_000))
    again = host(tmp_path)  # the snapshot and the record after it
    assert restored(again, *asked) == decided


async def test_the_journal_passes_compact_bytes_by_one_record_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests one at a time (each reply, then a loop turn, and the
    snapshot's file write, a thread's, if one started), records of any size
    in any order: the journal is never past COMPACT_BYTES by more than the
    record that carried it there, so a restart replays at most that (and the
    records that came while a snapshot was written); and the restart finds
    every decision."""
    monkeypatch.setattr(statefile, "COMPACT_BYTES", 8_000)
    rng = random.Random(1414)
    h = host(tmp_path)
    h.synchronize([POD], [])
    journal = h.statefile.journal
    assert journal is not None
    running: list[str] = []
    asked: dict[str, Container] = {}  # as created: without cpusets
    for i in range(400):
        if running and (len(running) >= 6 or rng.random() < 0.4):
            cid = running.pop(rng.randrange(len(running)))
            h.notify(Event.REMOVE_CONTAINER, POD, h.containers[cid])
        elif rng.random() < 0.05:
            h.synchronize([POD], [h.containers[cid] for cid in running])
        else:
            cid = f"c{i}"
            asked[cid] = annotated(cid, rng.choice((10, 100, 1_000, 3_000, 7_000)))
            h.create_container(POD, asked[cid])
            running.append(cid)
        size = journal_path(tmp_path).stat().st_size
        assert size == journal.size
        assert size <= statefile.COMPACT_BYTES + journal.last, i
        await asyncio.sleep(0)  # the reply's loop turn
        await h.statefile.written()
    decided = {cid: c.resources.cpu.cpus for cid, c in h.containers.items()}  # type: ignore[union-attr]
    assert 0 < journal_path(tmp_path).stat().st_size <= statefile.COMPACT_BYTES
    again = host(tmp_path)
    assert restored(again, *(asked[cid] for cid in running)) == decided


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


# -- keyed policy state ----------------------------------------------------------------
#
# The policy is KeyedPinner, the framework's pinner with its state split in
# parts: a stand-in of ours, small, for a policy with keyed state (the balloons
# policy's is tested in tests/unit/nri_balloons/test_state_parts.py and,
# through real processes, by the restart and fault suites).


class KeyedPinner(Pinner):
    """The pinner, its state one part per exclusive container (``x:<id>``)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed: set[str] = set()

    @hookimpl
    def policy_export_state(self) -> Any:
        return {f"x:{cid}": cpuset.format(m) for cid, m in self.exclusive.items()}

    @hookimpl
    def policy_state_changes(self) -> StateChanges:
        parts = {
            f"x:{cid}": cpuset.format(m) if (m := self.exclusive.get(cid)) is not None else None
            for cid in self.changed
        }
        self.changed.clear()
        return StateChanges(parts=parts)

    @hookimpl
    def nri_synchronize(
        self, pods: list[Pod], containers: list[Container], saved_state: Any
    ) -> list[Update]:
        saved = saved_state if isinstance(saved_state, dict) else {}
        if any(k.startswith("x:") for k in saved):
            saved = {"exclusive": {k[2:]: v for k, v in saved.items() if k.startswith("x:")}}
        return super().nri_synchronize(pods=pods, containers=containers, saved_state=saved)

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        self.changed.add(container.id)
        return super().nri_create_container(pod=pod, container=container)

    def release(self, container_id: str) -> list[Update]:
        self.changed.add(container_id)
        return super().release(container_id)


def keyed_host(tmp_path: Path) -> PolicyHost:
    return PolicyHost(
        "pinner", KeyedPinner(), state_dir=tmp_path / "state", host_root=sysfs(tmp_path)
    )


def records(tmp_path: Path) -> list[Decision]:
    return list(Journal(journal_path(tmp_path)).replay())


async def test_each_record_holds_the_parts_its_decision_changed(tmp_path: Path) -> None:
    first = keyed_host(tmp_path)
    first.synchronize([], [])
    first.create_container(POD, guaranteed("a", 2))
    first.save_now()  # a snapshot of parts: "a"
    first.create_container(POD, guaranteed("b", 1))
    first.create_container(POD, guaranteed("c", 1))
    first.notify(Event.REMOVE_CONTAINER, POD, guaranteed("b", 1))
    got = records(tmp_path)
    assert [d.parts for d in got] == [{"x:b": "5"}, {"x:c": "4"}, {"x:b": None}]
    assert not any(d.parts_reset or isinstance(d.policy_state, msgspec.Raw) for d in got)
    # the process dies: the snapshot's parts with the records merged over them
    again = keyed_host(tmp_path)
    assert restored(again, guaranteed("a", 2), guaranteed("c", 1)) == {"a": "6-7", "c": "4"}


async def test_the_first_record_of_a_process_is_the_whole_state(tmp_path: Path) -> None:
    # what the disk has is a whole state (the format before keyed states, or
    # another policy version's): the first record replaces it, part for part
    first = PolicyHost("pinner", Pinner(), state_dir=tmp_path / "state", host_root=sysfs(tmp_path))
    first.synchronize([], [])
    first.create_container(POD, guaranteed("a", 2))
    first.save_now()
    second = keyed_host(tmp_path)
    assert restored(second, guaranteed("a", 2)) == {"a": "6-7"}
    second.create_container(POD, guaranteed("b", 1))
    first_record = records(tmp_path)[0]
    assert first_record.parts_reset and first_record.parts == {"x:a": "6-7"}
    third = keyed_host(tmp_path)
    assert restored(third, guaranteed("a", 2), guaranteed("b", 1)) == {"a": "6-7", "b": "5"}


def old_format(tmp_path: Path) -> None:
    """A snapshot (version 1) and a journal as the code before keyed states
    wrote them: the policy's state whole, in the snapshot and in a record."""
    state = tmp_path / "state"
    state.mkdir(parents=True)
    pod = {"id": "p", "name": "pod"}
    a = msgspec.to_builtins(guaranteed("a", 2))
    (state / "pinner.state.json").write_bytes(
        msgspec.json.encode(
            {
                "version": 1,
                "policy": "pinner",
                "seq": 1,
                "pods": {"p": pod},
                "containers": {"a": a},
                "policy_state": {"exclusive": {"a": "6-7"}},
            }
        )
    )
    b = msgspec.to_builtins(guaranteed("b", 1))
    # a record's policy_state: the whole state, msgpack-encoded (Raw)
    whole = msgspec.Raw(msgspec.msgpack.encode({"exclusive": {"a": "6-7", "b": "5"}}))
    payload = msgspec.msgpack.encode({"seq": 2, "containers": {"b": b}, "policy_state": whole})
    (state / "pinner.journal").write_bytes(frame(payload))


async def test_the_files_of_the_format_before_still_read(tmp_path: Path) -> None:
    old_format(tmp_path)
    h = PolicyHost("pinner", Pinner(), state_dir=tmp_path / "state", host_root=sysfs(tmp_path))
    assert h.statefile.seq == 2
    saved = h.statefile.load()
    assert saved is not None and set(saved.containers) == {"a", "b"}  # snapshot and record
    assert restored(h, guaranteed("a", 2), guaranteed("b", 1)) == {"a": "6-7", "b": "5"}
    keyed = tmp_path / "keyed"
    old_format(keyed)
    k = keyed_host(keyed)
    assert restored(k, guaranteed("a", 2), guaranteed("b", 1)) == {"a": "6-7", "b": "5"}


async def test_the_snapshot_waits_for_a_quiet_node(tmp_path: Path) -> None:
    snapshot = tmp_path / "state/pinner.state.json"
    h = keyed_host(tmp_path)
    h.synchronize([], [])
    h.create_container(POD, guaranteed("a", 1))
    # a change before the quiet delay is over puts the snapshot off
    await asyncio.sleep(statefile.SAVE_DELAY / 2)
    h.create_container(POD, guaranteed("b", 1))
    await asyncio.sleep(statefile.SAVE_DELAY * 0.7)  # past the first change's delay
    assert not snapshot.exists()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not snapshot.exists():
        assert loop.time() < deadline, "no snapshot once the node was quiet"
        await asyncio.sleep(0.05)
    assert journal_path(tmp_path).stat().st_size == 0


class BrokenKeyedPinner(KeyedPinner):
    """A policy bug: a part msgspec cannot encode."""

    @hookimpl
    def policy_state_changes(self) -> StateChanges:
        changes = super().policy_state_changes()
        return StateChanges(parts={**changes.parts, "x:bad": object()})


async def test_an_unencodable_part_is_logged_and_the_decision_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = PolicyHost(
        "pinner", BrokenKeyedPinner(), state_dir=tmp_path / "state", host_root=sysfs(tmp_path)
    )
    h.synchronize([], [])
    a = h.create_container(POD, guaranteed("a", 2))
    assert a.adjustment and a.adjustment.resources
    assert "cannot journal the policy's state" in caplog.text
    # the cache entry is journaled all the same, and the next record is whole
    again = keyed_host(tmp_path)
    assert again.statefile.load() is not None
    assert "a" in (again.statefile.load() or statefile.SavedState()).containers


def test_the_snapshot_copies_what_changed_and_strips_argv_and_environment() -> None:
    cache = Cache()
    c = msgspec.structs.replace(guaranteed("a", 1), args=["sleep"], env=["SECRET=1"])
    cache.put_container(c)
    cache.put_container(guaranteed("b", 1))
    _, first = cache.snapshot()
    assert (first["a"].args, first["a"].env, first["a"].pod_sandbox_id) == ([], [], "p")
    cache.record("a", Resources(cpu=CpuResources(cpus="3")))
    cache.nri_remove_container(POD, guaranteed("b", 1))
    _, second = cache.snapshot()
    assert set(second) == {"a"}
    assert second["a"].resources and second["a"].resources.cpu
    assert second["a"].resources.cpu.cpus == "3"  # not the copy of the first snapshot
    assert second["a"].env == []


class AbsentKeyedPinner(KeyedPinner):
    """A keyed policy that now and then has no state to give (``None`` from
    both hooks: a policy not set up yet)."""

    absent = False

    @hookimpl
    def policy_export_state(self) -> Any:
        return None if self.absent else super().policy_export_state()

    @hookimpl
    def policy_state_changes(self) -> StateChanges | None:
        return None if self.absent else super().policy_state_changes()


async def test_a_keyed_record_after_a_whole_one_is_whole(tmp_path: Path) -> None:
    policy = AbsentKeyedPinner()
    h = PolicyHost("pinner", policy, state_dir=tmp_path / "state", host_root=sysfs(tmp_path))
    h.synchronize([], [])
    h.create_container(POD, guaranteed("a", 2))
    policy.absent = True
    h.create_container(POD, guaranteed("b", 1))  # a whole record: no state
    policy.absent = False
    h.create_container(POD, guaranteed("c", 1))  # parts again: over no state
    assert records(tmp_path)[-1].parts_reset
    again = keyed_host(tmp_path)
    got = restored(again, guaranteed("a", 2), guaranteed("b", 1), guaranteed("c", 1))
    assert got == {"a": "6-7", "b": "5", "c": "4"}


async def test_without_a_state_dir_what_changed_does_not_pile_up(tmp_path: Path) -> None:
    policy = KeyedPinner()
    h = PolicyHost("pinner", policy, state_dir=None, host_root=sysfs(tmp_path))
    h.synchronize([], [])
    for i in range(20):
        h.create_container(POD, guaranteed(f"c{i}", 1))
        h.notify(Event.REMOVE_CONTAINER, POD, guaranteed(f"c{i}", 1))
    assert not h.cache.dirty_containers and not h.cache.dirty_pods
    assert not policy.changed  # the policy was asked for its changes: it forgot them


def test_a_snapshot_encodes_only_the_entries_that_changed(tmp_path: Path) -> None:
    """The snapshot is the bytes a whole :class:`SavedState` encodes to (what
    ``load`` reads), each unchanged entry's JSON kept from the last snapshot
    (in the mirror of the journal's records) and each changed or new one
    encoded again; an entry gone is forgotten."""
    h = host(tmp_path)
    for cid in ("a", "b"):
        h.create_container(POD, guaranteed(cid, 1))
    h.save_now()
    kept = dict(h.statefile._mirror.containers)
    a2 = guaranteed("a", 2)
    h.update_container(POD, a2, a2.resources or Resources())  # "a" changes, "b" does not
    h.create_container(POD, guaranteed("c", 1))
    h.save_now()
    now = h.statefile._mirror.containers
    assert now["b"] is kept["b"]
    assert now["a"] is not kept["a"]
    assert set(now) == {"a", "b", "c"}
    pods, containers = h.cache.snapshot()
    whole = statefile.SavedState(
        policy="pinner", seq=h.statefile.seq, pods=pods, containers=containers,
        policy_state=h.hook.policy_export_state(),
    )  # fmt: skip
    assert h.statefile.path is not None
    assert h.statefile.path.read_bytes() == msgspec.json.encode(whole)
    loaded = h.statefile.load()
    assert loaded is not None and loaded.containers["a"] == containers["a"]
    h.notify(Event.REMOVE_CONTAINER, POD, guaranteed("b", 1))
    h.save_now()
    assert set(h.statefile._mirror.containers) == {"a", "c"}


def test_a_snapshot_holds_what_changed_after_the_last_record(tmp_path: Path) -> None:
    """An event the runtime sent after the last decision (a container that
    started: no record of its own) is in the snapshot: the snapshot records
    what changed since the last record first, then writes its state."""
    h = host(tmp_path)
    h.create_container(POD, guaranteed("a", 1))
    h.save_now()  # the mirror of the records starts here
    running = msgspec.structs.replace(guaranteed("a", 1), state=ContainerState.RUNNING)
    h.notify(Event.POST_START_CONTAINER, POD, running)
    h.save_now()  # as at shutdown
    loaded = h.statefile.load()
    assert loaded is not None
    assert loaded.containers["a"].state is ContainerState.RUNNING
    assert loaded.containers == h.cache.snapshot()[1]


def test_drop_head_keeps_the_records_after_the_snapshot(tmp_path: Path) -> None:
    """The records after the first ``covered`` bytes stay, in a new file; a
    journal that cannot be rewritten (its temporary file's name taken by a
    directory) stays whole, and goes on taking records."""
    j = Journal(tmp_path / "x.journal")
    for seq in (1, 2, 3):
        assert j.append(Decision(seq=seq, containers={f"c{seq}": None}))
    first = len(frame(msgspec.msgpack.encode(Decision(seq=1, containers={"c1": None}))))
    j.drop_head(first)
    assert [d.seq for d in Journal(j.path).replay()] == [2, 3]
    assert j.size == j.path.stat().st_size
    assert j.append(Decision(seq=4))
    assert [d.seq for d in Journal(j.path).replay()] == [2, 3, 4]
    (tmp_path / "x.tmp").mkdir()  # replace_file's temporary name
    whole = j.path.read_bytes()
    j.drop_head(first)
    assert j.path.read_bytes() == whole
    assert j.size == len(whole)  # what the next compaction is decided on
    assert j.append(Decision(seq=5))
    assert [d.seq for d in Journal(j.path).replay()] == [2, 3, 4, 5]
    j.drop_head(j.size)
    assert j.path.stat().st_size == 0

"""The keyed saved state of the balloons policy (version 3, nri_balloons.state):
the parts a decision changed, merged as the host's journal merges them, give
what the whole export gives, and restore the same balloons."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import msgspec
import pytest
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.state import decode, parts
from nri_framework.journal import Decision, merge_parts
from nri_framework.model import Container, CpuResources, MemoryResources, Pod, Resources
from test_state import DATA, fresh_policy

M = 1 << 20
NAMESPACES = ("grouped", "spread", "dedicated", "default")


def make(rng: random.Random, i: int) -> tuple[Pod, Container]:
    ns = rng.choice(NAMESPACES)
    pod = Pod(
        id=f"pod{i}",
        name=f"pod{i}",
        namespace=ns,
        uid=f"uid{i}",
        labels={"app": rng.choice(("web", "db"))},
        cgroup_parent=f"/kubepods/burstable/poduid{i}",
    )
    milli = rng.choice((0, 250, 500, 1000, 1500))
    cpu = CpuResources(shares=max(2, milli * 1024 // 1000), quota=milli * 100, period=100_000)
    mem = MemoryResources(limit=rng.choice((0, 64 * M, 512 * M)))
    return pod, Container(
        id=f"c{i}", pod_sandbox_id=pod.id, name="ctr", resources=Resources(cpu=cpu, memory=mem)
    )


def builtins(value: Any) -> Any:
    """As the journal and the snapshot hand it back."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(value))


def journaled(policy: BalloonsPolicy, merged: Any, seq: int) -> tuple[Any, int]:
    """One record as the host writes it (``StateFile.record``), merged as
    ``StateFile.load`` merges it; returns the merged state and the record size."""
    changes = policy.state_changes()
    if changes.reset:
        d = Decision(seq=seq, parts=policy.export(), parts_reset=True)
    else:
        d = Decision(seq=seq, parts=changes.parts)
    d = msgspec.msgpack.decode(msgspec.msgpack.encode(d), type=Decision)
    return merge_parts(merged, d), len(msgspec.msgpack.encode(d))


def placement(policy: BalloonsPolicy, pods: dict[str, Pod]) -> Any:
    pins = policy.pinning(pods.get)
    saved = decode(builtins(policy.export()))
    assert saved is not None
    return builtins(saved), pins


@pytest.mark.parametrize("seed", range(6))
def test_merged_parts_restore_what_the_whole_export_restores(seed: int) -> None:
    rng = random.Random(seed)
    policy = fresh_policy()
    merged: Any = None
    merged, _ = journaled(policy, merged, 1)
    pods: dict[str, Pod] = {}
    alive: dict[str, Pod] = {}
    for i in range(60):
        if alive and rng.random() < 0.35:
            cid = rng.choice(sorted(alive))
            del alive[cid]
            policy.release(cid)
        else:
            pod, ctr = make(rng, i)
            try:
                policy.allocate(pod, ctr)
            except BalloonsError:
                continue
            pods[pod.id] = pod
            alive[ctr.id] = pod
        policy.pinning(pods.get)  # the decision's pins (and memory allocations)
        merged, _ = journaled(policy, merged, i + 2)
        # what the journal holds is what the whole export is, part for part
        assert merged == builtins(policy.export())
    whole = fresh_policy()
    assert whole.restore(builtins(policy.export()), set(alive)) == set(alive)
    parts = fresh_policy()
    assert parts.restore(merged, set(alive)) == set(alive)
    assert placement(parts, pods) == placement(whole, pods) == placement(policy, pods)


def test_a_decision_records_its_own_parts_not_the_node() -> None:
    rng = random.Random(7)
    policy = fresh_policy()
    merged, _ = journaled(policy, None, 1)
    pods: dict[str, Pod] = {}
    sizes = []
    for i in range(40):
        pod, ctr = make(rng, i)
        try:
            policy.allocate(pod, ctr)
        except BalloonsError:
            continue
        pods[pod.id] = pod
        policy.pinning(pods.get)
        merged, size = journaled(policy, merged, i + 2)
        sizes.append(size)
    whole = len(msgspec.msgpack.encode(policy.export()))
    # one member, its balloon and its allocation: far from the whole state
    assert max(sizes[-10:]) < whole / 4
    changes = policy.state_changes()
    assert changes.parts == {} and not changes.reset  # nothing changed since


def test_a_member_moved_between_balloons_is_recorded_in_its_new_one() -> None:
    policy = fresh_policy()
    merged, _ = journaled(policy, None, 1)
    rng = random.Random(3)
    pod, ctr = make(rng, 1)
    policy.allocate(pod, ctr)
    merged, _ = journaled(policy, merged, 2)
    src = policy.owner[ctr.id]
    dst = next(b for b in policy.balloons if b is not src)
    member = src.members.pop(ctr.id)
    dst.members[ctr.id] = member
    policy.owner[ctr.id] = dst
    merged, _ = journaled(policy, merged, 3)
    assert merged[f"m:{ctr.id}"]["balloon"] == f"b:{dst.name}"
    assert merged == builtins(policy.export())


def test_versions_1_and_2_state_files_still_decode_alike() -> None:
    for name in ("v1-n4c16.state.json", "v2-n4c16.state.json"):
        state = msgspec.json.decode((DATA / name).read_bytes())
        policy = fresh_policy()
        alive = set(state["containers"])
        assert policy.restore(state["policy_state"], alive) == alive
        # the keyed export of what was restored decodes as the same balloons
        again = decode(builtins(policy.export()))
        saved = decode(state["policy_state"])
        assert again is not None and saved is not None
        assert [(b.type, b.cpus, [m.id for m in b.members]) for b in again.balloons] == [
            (b.type, b.cpus, [m.id for m in b.members]) for b in saved.balloons
        ]


def test_a_member_changed_in_place_keeps_its_place_in_the_balloon() -> None:
    policy = fresh_policy()
    merged, _ = journaled(policy, None, 1)
    pods: dict[str, Pod] = {}
    for i in range(3):
        pod = Pod(id=f"pod{i}", name=f"pod{i}", namespace="default", uid=f"uid{i}")
        ctr = Container(id=f"c{i}", pod_sandbox_id=pod.id, name="ctr")
        policy.allocate(pod, ctr)
        pods[pod.id] = pod
        merged, _ = journaled(policy, merged, i + 2)
    bln = policy.owner["c0"]
    assert list(bln.members) == ["c0", "c1", "c2"]
    # the first member changes (the journal's merge moves its part last)
    bln.members["c0"] = msgspec.structs.replace(bln.members["c0"], request=100)
    merged, _ = journaled(policy, merged, 5)
    assert list(merged)[-1] == "m:c0"
    again = fresh_policy()
    assert again.restore(merged, {"c0", "c1", "c2"}) == {"c0", "c1", "c2"}
    assert list(again.owner["c0"].members) == ["c0", "c1", "c2"]


def test_an_export_reuses_the_parts_of_the_members_that_stayed() -> None:
    """A snapshot exports the whole state: the part of a member still the same
    object at the same place in the same balloon is the last export's; one
    that moved is made anew, and the export is what one without the memo
    makes."""
    rng = random.Random(5)
    policy = fresh_policy()
    for i in range(8):
        pod, ctr = make(rng, i)
        with contextlib.suppress(BalloonsError):
            policy.allocate(pod, ctr)
    first = policy.export()
    stay, move = sorted(k for k in first if k.startswith("m:"))[:2]
    cid = move[2:]
    src = policy.owner[cid]
    dst = next(b for b in policy.balloons if b is not src)
    dst.members[cid] = src.members.pop(cid)
    policy.owner[cid] = dst
    second = policy.export()
    assert second[stay] is first[stay]
    assert second[move] is not first[move] and second[move].balloon == f"b:{dst.name}"
    memory = {m.id: m for m in policy.memory.export()}
    assert builtins(second) == builtins(parts(policy.balloons, memory))

"""The saved state of the balloons policy (nri_balloons.state): versioned Structs,
and a state file of version 1 (made by the code of fe781eb, see
``tests/data/balloons/state/README.md``) restores without moving a container."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.state import STATE_VERSION, decode
from nri_balloons.validation import validate
from nri_framework.simulate.topologies import N4C16
from nri_framework.statefile import SavedState
from topologies import topology

DATA = Path(__file__).resolve().parents[2] / "data" / "balloons" / "state"


def fresh_policy() -> BalloonsPolicy:
    topo = topology(N4C16)
    result = validate(load_policy((DATA / "config.yaml").read_text()), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    policy = BalloonsPolicy(topo)
    policy.set_config(result.prepared)
    return policy


def saved_v1() -> SavedState:
    """The state file as the host reads it."""
    return msgspec.json.decode((DATA / "v1-n4c16.state.json").read_bytes(), type=SavedState)


def placement(policy: BalloonsPolicy, state: SavedState) -> dict[str, list[str]]:
    pins = policy.pinning(state.pods.get)
    return {cid: [bln.name, *pins[cid]] for cid, bln in sorted(policy.owner.items())}


def test_version_1_state_file_restores_without_moving_a_container() -> None:
    state = saved_v1()
    assert "version" not in state.policy_state  # what fe781eb wrote
    expected = json.loads((DATA / "v1-n4c16.placement.json").read_text())
    policy = fresh_policy()
    alive = set(state.containers)
    assert policy.restore(state.policy_state, alive) == alive
    assert placement(policy, state) == expected
    # and the pinning the runtime holds is the one restored
    for cid, (_bln, cpus, mems) in expected.items():
        cpu = state.containers[cid].resources.cpu  # type: ignore[union-attr]
        assert (cpu.cpus, cpu.mems) == (cpus, mems)  # type: ignore[union-attr]


def test_export_is_versioned_and_round_trips_through_json_and_msgpack() -> None:
    state = saved_v1()
    policy = fresh_policy()
    policy.restore(state.policy_state, set(state.containers))
    exported = policy.export()
    assert isinstance(exported, dict) and exported["version"] == STATE_VERSION == 3
    as_json = msgspec.json.decode(msgspec.json.encode(exported))
    assert as_json["version"] == STATE_VERSION
    assert as_json["balloons"] == [k for k in as_json if k.startswith("b:")]
    member = as_json["m:pod0c0"]["member"]
    assert isinstance(member, dict) and set(member) >= {"id", "pod_id", "request", "group"}
    expected = placement(policy, state)
    for saved in (exported, as_json, msgspec.msgpack.decode(msgspec.msgpack.encode(exported))):
        again = fresh_policy()
        assert again.restore(saved, set(state.containers)) == set(state.containers)
        assert placement(again, state) == expected


def test_only_alive_containers_are_restored() -> None:
    state = saved_v1()
    policy = fresh_policy()
    alive = set(state.containers) - {"pod5c0", "pod6c0"}
    assert policy.restore(state.policy_state, alive) == alive


def v1_with(change: Any) -> dict[str, Any]:
    saved = copy.deepcopy(saved_v1().policy_state)
    change(saved)
    return saved  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("saved", "reason"),
    [
        (v1_with(lambda s: s.update(version=STATE_VERSION + 1)), "unknown balloons state version"),
        (v1_with(lambda s: s["balloons"][0]["members"][0].pop()), "at least length 8, got 7"),
        (v1_with(lambda s: s["balloons"][0]["members"][0].append(1)), "at most length 8, got 9"),
        (v1_with(lambda s: s["balloons"][0].update(type="gone")), "'gone'"),
        (v1_with(lambda s: s["balloons"][0].update(cpus="0-15")), "not available"),
        (v1_with(lambda s: s["balloons"][0].update(instance="0")), "Expected `int`"),
    ],
    ids=["newer", "short-member", "long-member", "unknown-type", "cpus-taken", "instance-text"],
)
def test_bad_state_places_anew_and_loses_nothing(
    saved: dict[str, Any], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    policy = fresh_policy()
    before = [(b.name, b.cpus) for b in policy.balloons]
    with caplog.at_level(logging.WARNING, logger="policy"):
        assert policy.restore(saved, set(saved_v1().containers)) == set()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert lines[0].startswith("cannot restore saved balloons, placing containers anew: ")
    assert reason in lines[0]
    assert [(b.name, b.cpus) for b in policy.balloons] == before  # the fresh ones stay


def test_no_state_is_no_restore() -> None:
    assert decode(None) is None
    assert decode({"other": 1}) is None
    assert fresh_policy().restore([], set()) == set()

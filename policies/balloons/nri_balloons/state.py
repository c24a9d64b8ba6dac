"""The balloons policy's saved state: what :meth:`BalloonsPolicy.export` returns,
the host keeps in its state file and journal (``policy_state``), and
:meth:`BalloonsPolicy.restore` reads after a restart.

Versions:

* 1 (up to commit fe781eb): no ``version`` field; each balloon's ``members`` are
  positional lists ``[id, pod_id, namespace, pod_name, name, request, limit,
  group]``. Still read: state files of running nodes have it.
* 2: :class:`BalloonsState`, ``version: 2``; members are objects
  (:class:`~nri_balloons.balloon.Member`). Since the memory zones (same
  version: a file without them reads as no allocations, and a reader that
  predates them ignores them): ``memory``, the containers' memory allocations
  (:class:`~nri_balloons.memzones.MemoryAllocation`).

A newer version than this code knows is not guessed at: the containers are placed
anew.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import Any

import msgspec
from nri_framework import cpuset

from nri_balloons.balloon import Balloon, Member
from nri_balloons.config import BalloonType
from nri_balloons.memzones import MemoryAllocation

__all__ = ["STATE_VERSION", "BalloonsState", "SavedBalloon", "decode", "rebuild", "snapshot"]

STATE_VERSION = 2


class SavedBalloon(msgspec.Struct, kw_only=True):
    """One balloon: its type, instance, CPUs, components and containers."""

    type: str
    instance: int
    cpus: str
    components: list[SavedBalloon] = []
    members: list[Member] = []


class BalloonsState(msgspec.Struct, kw_only=True):
    """The saved state of the balloons policy: every top-level balloon."""

    version: int = STATE_VERSION
    balloons: list[SavedBalloon] = []
    memory: list[MemoryAllocation] = []
    """the containers' memory allocations (libmem's requests and zones)"""


class _MemberV1(Member, array_like=True, forbid_unknown_fields=True):
    """A member as version 1 saved it: a positional list of all eight fields."""

    group: str  # no default: version 1 always wrote it


class _BalloonV1(msgspec.Struct):
    type: str
    instance: int
    cpus: str
    components: list[_BalloonV1] = []
    members: list[_MemberV1] = []


class _StateV1(msgspec.Struct):
    balloons: list[_BalloonV1]


def _upgrade(b: _BalloonV1) -> SavedBalloon:
    return SavedBalloon(
        type=b.type,
        instance=b.instance,
        cpus=b.cpus,
        components=[_upgrade(c) for c in b.components],
        members=[Member(**msgspec.structs.asdict(m)) for m in b.members],
    )


def decode(saved: Any) -> BalloonsState | None:
    """``saved`` (a :class:`BalloonsState`, or what JSON or msgpack decoded) as the
    current version; ``None`` when it holds no balloons state at all. Raises
    :class:`ValueError` (also :class:`msgspec.ValidationError`) when it is
    malformed or of an unknown version."""
    if isinstance(saved, BalloonsState):
        return saved
    if not isinstance(saved, dict) or not isinstance(saved.get("balloons"), list):
        return None
    version = saved.get("version", 1)
    if version == 1:
        old = msgspec.convert(saved, _StateV1, strict=True)
        return BalloonsState(balloons=[_upgrade(b) for b in old.balloons])
    if version == STATE_VERSION:
        return msgspec.convert(saved, BalloonsState, strict=True)
    raise ValueError(f"unknown balloons state version {version!r}")


def snapshot(
    balloons: list[Balloon], memory: list[MemoryAllocation] | None = None
) -> BalloonsState:
    """The state to save for ``balloons`` (the policy's top-level balloons) and
    the containers' ``memory`` allocations."""

    def saved(b: Balloon) -> SavedBalloon:
        return SavedBalloon(
            type=b.bdef.name,
            instance=b.instance,
            cpus=cpuset.format(b.cpus),
            components=[saved(c) for c in b.components],
            members=list(b.members.values()),
        )

    return BalloonsState(balloons=[saved(b) for b in balloons], memory=list(memory or ()))


def rebuild(
    state: BalloonsState, types: Mapping[str, BalloonType], allowed: int, alive: set[str]
) -> tuple[list[Balloon], int]:
    """The balloons of ``state`` with the members in ``alive``, and the CPUs they
    hold. Raises :class:`KeyError` or :class:`ValueError` when a balloon does not
    fit the configuration: an unknown type, components that are not its type's,
    CPUs outside ``allowed`` or in two balloons."""
    taken = 0

    def balloon(entry: SavedBalloon) -> Balloon:
        nonlocal taken
        bdef = types[entry.type]
        cpus = cpuset.parse(entry.cpus)
        bln = Balloon(bdef=bdef, instance=entry.instance, cpus=cpus)
        bln.components = [balloon(c) for c in entry.components]
        if [c.bdef.name for c in bln.components] != [
            c.balloon_type for c in bdef.components
        ] and bdef.component_creation != "balance-balloons":
            raise ValueError(f"components of {entry.type} do not match its type")
        if bln.components:
            if cpus != functools.reduce(operator.or_, (c.cpus for c in bln.components), 0):
                raise ValueError(f"CPUs of {entry.type} are not those of its components")
        else:
            if cpus & ~allowed or cpus & taken:
                raise ValueError(f"CPUs {entry.cpus} of {entry.type} not available")
            taken |= cpus
        return bln

    balloons: list[Balloon] = []
    for entry in state.balloons:
        bln = balloon(entry)
        for m in entry.members:
            if m.id in alive:
                bln.members[m.id] = m
                if m.group:
                    bln.groups[m.group] += 1
        balloons.append(bln)
    return balloons, taken

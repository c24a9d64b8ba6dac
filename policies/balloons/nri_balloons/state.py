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

* 3: keyed (:func:`parts`), so that the host's journal records only the parts a
  decision changed (:class:`StateTracker`, ``policy_state_changes``): a dict of
  ``version: 3``; ``balloons``, the top-level balloons' keys in order;
  ``b:<type>[<instance>]``, each balloon's CPUs and components (a
  :class:`SavedBalloon` without members); ``m:<container id>``, each member
  (:class:`MemberPart`: its balloon and when it joined); ``a:<container id>``,
  each memory allocation. :func:`decode` assembles it as a :class:`BalloonsState`.

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
from nri_framework.journal import StateChanges

from nri_balloons.balloon import Balloon, Member
from nri_balloons.config import BalloonType
from nri_balloons.memzones import MemoryAllocation

__all__ = [
    "STATE_VERSION",
    "BalloonsState",
    "MemberPart",
    "SavedBalloon",
    "StateTracker",
    "decode",
    "parts",
    "rebuild",
    "snapshot",
]

#: The version :func:`parts` writes (keyed).
STATE_VERSION = 3
#: The version of :class:`BalloonsState` (whole; what versions 1 and 3 decode as).
WHOLE_VERSION = 2


class SavedBalloon(msgspec.Struct, kw_only=True):
    """One balloon: its type, instance, CPUs, components and containers."""

    type: str
    instance: int
    cpus: str
    components: list[SavedBalloon] = []
    members: list[Member] = []


class BalloonsState(msgspec.Struct, kw_only=True):
    """The saved state of the balloons policy: every top-level balloon."""

    version: int = WHOLE_VERSION
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


class MemberPart(msgspec.Struct, kw_only=True):
    """One member in the keyed state (version 3)."""

    balloon: str
    """the key of its balloon (``b:<type>[<instance>]``)"""
    joined: int
    """when it joined, relative to the others (their order in the balloon)"""
    member: Member


def balloon_key(b: Balloon) -> str:
    return f"b:{b.name}"


def _saved(b: Balloon, members: bool = True) -> SavedBalloon:
    return SavedBalloon(
        type=b.bdef.name,
        instance=b.instance,
        cpus=cpuset.format(b.cpus),
        components=[_saved(c) for c in b.components],
        members=list(b.members.values()) if members else [],
    )


def _member_part(b: Balloon, cid: str) -> MemberPart:
    return MemberPart(balloon=balloon_key(b), joined=b.members.joined[cid], member=b.members[cid])


def parts(
    balloons: list[Balloon],
    memory: Mapping[str, MemoryAllocation],
    memo: dict[str, MemberPart] | None = None,
) -> dict[str, Any]:
    """The keyed state (version 3) of ``balloons`` (the policy's top-level
    balloons) and the containers' ``memory`` allocations (by id). ``memo``:
    the member parts of the last call, by key, reused where the member is
    the same object in the same balloon at the same place (a snapshot of
    1000 containers makes the parts of those that moved), and replaced by
    this call's."""
    keys = [balloon_key(b) for b in balloons]
    out: dict[str, Any] = {"version": STATE_VERSION, "balloons": keys}
    for key, b in zip(keys, balloons, strict=True):
        out[key] = _saved(b, members=False)
    last = memo or {}
    made: dict[str, MemberPart] = {}
    for key, b in zip(keys, balloons, strict=True):
        joined = b.members.joined
        for cid, member in b.members.items():
            pk = f"m:{cid}"
            part, at = last.get(pk), joined[cid]
            same = part is not None and part.member is member and part.joined == at
            if part is None or not same or part.balloon != key:
                part = MemberPart(balloon=key, joined=at, member=member)
            out[pk] = made[pk] = part
    for rid, m in memory.items():
        out[f"a:{rid}"] = m
    if memo is not None:
        memo.clear()
        memo.update(made)
    return out


def _assemble(saved: dict[str, Any]) -> BalloonsState:
    """A keyed state (version 3) as the whole one."""
    if any(not isinstance(v, (dict, list, int, str)) for v in saved.values()):
        saved = msgspec.msgpack.decode(msgspec.msgpack.encode(saved))  # Structs, in process
    order = msgspec.convert(saved.get("balloons"), list[str], strict=True)
    balloons = {key: msgspec.convert(saved[key], SavedBalloon, strict=True) for key in order}
    members: list[MemberPart] = []
    memory: list[MemoryAllocation] = []
    for key, part in saved.items():
        if key.startswith("m:"):
            members.append(msgspec.convert(part, MemberPart, strict=True))
        elif key.startswith("a:"):
            memory.append(msgspec.convert(part, MemoryAllocation, strict=True))
    members.sort(key=operator.attrgetter("joined"))
    for m in members:
        bln = balloons.get(m.balloon)
        if bln is None:
            raise ValueError(f"member {m.member.id} of unknown balloon {m.balloon}")
        bln.members.append(m.member)
    memory.sort(key=operator.attrgetter("created"))
    return BalloonsState(balloons=list(balloons.values()), memory=memory)


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
    if version == WHOLE_VERSION:
        return msgspec.convert(saved, BalloonsState, strict=True)
    if version == STATE_VERSION:
        return _assemble(saved)
    raise ValueError(f"unknown balloons state version {version!r}")


def snapshot(
    balloons: list[Balloon], memory: list[MemoryAllocation] | None = None
) -> BalloonsState:
    """The state to save for ``balloons`` (the policy's top-level balloons) and
    the containers' ``memory`` allocations."""

    return BalloonsState(balloons=[_saved(b) for b in balloons], memory=list(memory or ()))


def _shape(b: Balloon) -> tuple[Any, ...]:
    """What a balloon's part holds (members aside): its CPUs and components'."""
    if not b.components:  # what the walk gives, without its generators
        return ((b.bdef.name, b.instance, b.cpus),)
    return tuple((c.bdef.name, c.instance, c.cpus) for c in b.walk())


class StateTracker:
    """Which parts of the keyed state changed since the last record: the
    members each balloon's :class:`~nri_balloons.balloon.Members` saw change,
    the memory allocations the allocator saw change, and the balloons (a walk
    of the top-level balloons, not of their members: their CPUs and
    components compared with the last record's)."""

    def __init__(self) -> None:
        self.reset = True
        """the next record is the whole state (a restore, a new configuration)"""
        self._balloons: dict[str, tuple[Balloon, tuple[Any, ...]]] = {}
        self._order: list[str] = []
        self._memory: Any = None

    def changes(
        self, balloons: list[Balloon], owner: Mapping[str, Balloon], memory: Any
    ) -> StateChanges:
        """The parts changed since the last call; ``owner`` is the policy's
        container id -> balloon, ``memory`` its
        :class:`~nri_balloons.memplacement.MemoryPlacer`."""
        order = [balloon_key(b) for b in balloons]
        if self.reset or memory is not self._memory:
            self.reset = False
            self._memory = memory
            memory.take_changes()
            for b in balloons:
                b.members.changed.clear()
            self._balloons = {k: (b, _shape(b)) for k, b in zip(order, balloons, strict=True)}
            self._order = order
            return StateChanges(reset=True)
        out: dict[str, Any] = {}
        members: set[str] = set()
        seen: dict[str, tuple[Balloon, tuple[Any, ...]]] = {}
        for key, b in zip(order, balloons, strict=True):
            shape = _shape(b)
            last = self._balloons.get(key)
            if last is None or last[0] is not b:
                out[key] = _saved(b, members=False)
                members.update(b.members)
                if last is not None:
                    members.update(last[0].members)
            elif last[1] != shape:
                out[key] = _saved(b, members=False)
            members.update(b.members.changed)
            b.members.changed.clear()
            seen[key] = (b, shape)
        for key, (b, _) in self._balloons.items():
            if key not in seen:
                out[key] = None
                members.update(b.members, b.members.changed)
                b.members.changed.clear()
        for cid in members:
            holder = owner.get(cid)
            held = holder is not None and cid in holder.members and balloon_key(holder) in seen
            out[f"m:{cid}"] = _member_part(holder, cid) if held and holder is not None else None
        for rid, m in memory.take_changes().items():
            out[f"a:{rid}"] = m
        if order != self._order:
            out["balloons"] = order
            self._order = order
        self._balloons = seen
        return StateChanges(parts=out)


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

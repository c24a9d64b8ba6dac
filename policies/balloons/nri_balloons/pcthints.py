"""Where PCT wants balloons placed (reference §13.6) and how many CPUs a
PCT cpuClass can still give (§13.5): upstream ``Hints(intent)`` and
``hpReserveCpus``.

HP balloons are steered to the punit with the most HP room (then the most
free CPUs), other balloons away from punits that hold HP CPUs; every class
that asks for a CLOS away from cores whose other thread asks for another
(``sst-whole-core``, see :mod:`nri_balloons.closassoc`: CLOS is per core).
:meth:`PlacementHints.free_class_capacity` is the extended-resource capacity
(§13.5).

The hints read the state (:mod:`nri_balloons.pctstate`) that the CLOS
association (:mod:`nri_balloons.closassoc`) and SST programming
(:mod:`nri_balloons.sstprogram`) keep; the cpuClass handler hands them to
the tree allocator.
"""

from __future__ import annotations

import functools
import logging
import operator

import msgspec
from nri_framework import cpuset

from nri_balloons.gofmt import quote
from nri_balloons.pctstate import PctState

log = logging.getLogger("cpuclass")

#: placement lines kept for the commit at most (a policy driven without one
#: logs them at this many)
PLACED_MAX = 64


class Hints(msgspec.Struct):
    """Placement hints of one class for one resize: ``prefer`` is a list of
    hints, each an ordered list of alternative CPU sets; ``avoid`` CPU sets."""

    prefer: list[tuple[str, list[int]]] = msgspec.field(default_factory=list)
    avoid: list[tuple[str, int]] = msgspec.field(default_factory=list)


class PlacementHints(PctState):
    """PCT's placement hints and capacity (see the module doc)."""

    def hints(self, name: str, requested: int, free: int, current: int) -> Hints:
        """Upstream ``Hints(intent)``; every candidate set is non-empty and
        within the allowed CPUs."""
        out = Hints()
        if not self.mode or requested < 1:
            return out
        free &= self.allowed
        clos = self.clos_for(name)
        if clos is not None:
            shared = self._shared_core_cpus(clos, free, current)
            whole = free & ~shared
            if shared and whole.bit_count() >= requested:
                out.prefer.append(("sst-whole-core", [whole]))
        plan = self.plans.get(name)
        if plan is not None:
            # CPUs on the class's CLOS by themselves: not a free thread that
            # a sibling in another balloon holds on a CLOS it does not ask for
            topo = self.topology
            held = free & topo.siblings(self.allowed & ~free & ~current) & ~topo.siblings(current)
            k = plan.clos
            on_clos = self.known.mask(k) & free & (self.want.mask(k) | ~held)
            if on_clos.bit_count() >= requested:
                out.prefer.append((f"sst-clos-{plan.clos}", [on_clos]))
        if name in self.hp_classes:
            used = self._hp_used()
            sets = self._hp_reserve(free, current, requested, used)
            if sets:
                out.prefer.append(("sst-hp-reserve", sets))
            # within the chosen punit, the free threads of cores that are HP
            # already: no HP core more for SST-TF to count
            others = functools.reduce(operator.or_, used.values(), 0) & ~current
            hp_cores = self.topology.siblings(others) & free
            if hp_cores.bit_count() >= requested:
                out.prefer.append(("sst-hp-core", [hp_cores]))
            return out
        if self.hp_classes:
            in_use = 0
            for idx in self._hp_used():
                in_use |= self.punits[idx].cpus
            if in_use:
                out.avoid.append(("sst-hp-in-use", in_use & self.allowed))
        return out

    def _shared_core_cpus(self, clos: int, free: int, current: int) -> int:
        """The CPUs of ``free`` whose core has a thread in use (neither free
        nor ``current``) on or asking for another CLOS than ``clos``."""
        siblings = self.topology.siblings
        used = ~free & ~current & ((1 << self._bound) - 1)
        if used.bit_count() < free.bit_count():  # the cores of the fewer CPUs visited
            busy = used & siblings(free & siblings(used))
        else:
            busy = siblings(free) & used
        want, known = self.want, self.known
        theirs_other = (want.cpus & ~want.mask(clos)) | (
            known.cpus & ~known.mask(clos) & ~want.cpus
        )  # what a CPU asks for, else what it is on
        other = busy & theirs_other
        return siblings(other) & free if other else 0

    def _hp_used(self) -> dict[int, int]:
        """punit index -> the CPUs an HP class runs on there (from ``class_of``)."""
        hp = 0
        for name in self.hp_classes:
            hp |= self.class_of.mask(name)
        used: dict[int, int] = {}
        for idx in reversed(range(len(self.punits)) if hp else ()):
            if on := hp & self.punits[idx].cpus:  # a CPU of two punits: the last's (punit_of)
                used[idx] = on
                hp &= ~on
        return used

    def _room(self, idx: int, current: int, used: dict[int, int]) -> int:
        """HP cores the punit can still take (SST-TF counts cores)."""
        pu = self.punits[idx]
        if pu.max_hp <= 0:
            return 0
        return pu.max_hp - self.topology.single_thread(used.get(idx, 0) & ~current).bit_count()

    def _hp_reserve(
        self, free: int, current: int, requested: int, used: dict[int, int]
    ) -> list[int]:
        """Upstream ``hpReserveCpus``: disjoint candidate sets, best first
        (``used``: :meth:`_hp_used`)."""
        if not any(pu.max_hp > 0 for pu in self.punits):
            return []
        need = max(requested, 1)
        # Sorted by room, then free CPUs, then ids (upstream); unlike upstream a
        # growing balloon first stays on the punit it is on (its HP budget).
        tier_a: list[tuple[bool, int, int, int, int, int]] = []
        for idx, pu in enumerate(self.punits):
            if idx not in self.hp_eligible:
                continue
            pfree = free & pu.cpus
            room = self._room(idx, current, used)
            if pfree.bit_count() >= need and room >= need:
                away = not current & pu.cpus
                tier_a.append((away, -room, -pfree.bit_count(), pu.package, pu.punit, idx))
        if tier_a:
            tier_a.sort()
            sets = [free & self.punits[idx].cpus for *_, idx in tier_a]
            if log.isEnabledFor(logging.DEBUG):  # the CPU sets formatted for debug only
                for (_, neg_room, _, pkg, pun, _), pfree in zip(tier_a, sets, strict=True):
                    log.debug(
                        "pct: hpReserveCpus tier=A punit=%d/%d room=%d free=%s",
                        pkg,
                        pun,
                        -neg_room,
                        cpuset.format(pfree),
                    )
            return sets
        per_pkg: dict[int, tuple[int, int]] = {}
        for idx, pu in enumerate(self.punits):
            if idx not in self.hp_eligible:
                continue
            room = self._room(idx, current, used)
            pfree = free & pu.cpus
            if room > 0 and pfree:
                r, f = per_pkg.get(pu.package, (0, 0))
                per_pkg[pu.package] = (r + room, f | pfree)
        tier_b = sorted(
            (-r, -f.bit_count(), pkg, f)
            for pkg, (r, f) in per_pkg.items()
            if r >= requested and f.bit_count() >= requested
        )
        if tier_b:
            for neg_room, _, pkg, f in tier_b if log.isEnabledFor(logging.DEBUG) else ():
                log.debug(
                    "pct: hpReserveCpus tier=B pkg=%d room=%d free=%s",
                    pkg,
                    -neg_room,
                    cpuset.format(f),
                )
            return [f for _, _, _, f in tier_b]
        log.debug(
            "pct: hpReserveCpus tier=none (no punit or package has %d HP room with %d free CPUs)",
            requested,
            requested,
        )
        return []

    # -- capacity (§13.5) --------------------------------------------------------------

    def free_class_capacity(self, name: str, held: int) -> int:
        if not self.mode or name not in self.plans:
            return 0
        if name in self.hp_classes:
            total = 0
            for idx, pu in enumerate(self.punits):
                if idx not in self.hp_eligible or pu.guaranteed_hp <= 0:
                    continue
                total += max(min(pu.guaranteed_hp, (pu.cpus & self.allowed & ~held).bit_count()), 0)
            return total
        return (self.allowed & ~held).bit_count()

    def log_placement(self, balloon: str, name: str, cpus: int) -> None:
        """Where a balloon of a PCT class landed (spec step 11: "the plugin
        log prints the punit each new balloon is assigned to"): the line is
        logged by :meth:`log_placed`, which the decision's commit calls (the
        plugin's runs once the answer is out: the line is not on the reply
        path); past :data:`PLACED_MAX` lines kept, at once."""
        if not self.mode or name not in self.plans or not cpus:
            return
        self.placed.append((balloon, name, self.plans[name].clos, cpus))
        if len(self.placed) >= PLACED_MAX:
            self.log_placed()

    def log_placed(self) -> None:
        """Log the placements :meth:`log_placement` kept, in their order."""
        placed, self.placed = self.placed, []
        for balloon, name, clos, cpus in placed:
            keys = sorted({k for c in cpuset.ids(cpus) if (k := self.punit_key(c)) is not None})
            log.info(
                "pct: balloon %s (cpuClass %s, CLOS %d) on cpus %s: %s",
                balloon,
                quote(name),
                clos,
                cpuset.format(cpus),
                ", ".join(f"pkg={p} punit={u}" for p, u in keys) or "no punit",
            )

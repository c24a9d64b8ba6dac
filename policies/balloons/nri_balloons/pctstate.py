"""The state of Priority Core Turbo on one node, and the one way it talks to
the SST helper (reference §13).

:class:`PctState` holds what the PCT allocator knows: the plan
(:mod:`nri_balloons.pctplan`), the punits the helper discovered, the CLOS each
CPU asks for and the one the helper last reported, what is pending, whether
the helper is away (*degraded*) and which helper process SST was programmed
on. Every request goes through :meth:`PctState._ask`, a step of the sans-IO
exchange of :mod:`nri_balloons.sstlink`, with the timeout its caller was
given. The parts that act on this state are mixins, one concept each:
:mod:`nri_balloons.sstprogram` (discovery and the managed-mode or assoc-only
programming sequence), :mod:`nri_balloons.closassoc` (the CLOS association
flush), :mod:`nri_balloons.pcthints` (placement hints and capacity);
:class:`nri_balloons.pct.PctAllocator` puts them together.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Generic, NoReturn, TypeVar

from nri_framework.topology import Topology
from nri_sst import messages as m

from nri_balloons.pctplan import Plan, Punit
from nri_balloons.sstlink import (
    Ask,
    BudgetSpent,
    Steps,
    Writer,
    WriterUnavailable,
    sidecar_awaited,
)

log = logging.getLogger("cpuclass")

V = TypeVar("V")
_MISSING = object()


class CpuMap(dict[int, V], Generic[V]):
    """cpu -> value, with the CPUs of each value kept as a bit mask as the
    map changes (:meth:`mask`): the placement hints ask "which CPUs are on
    CLOS k" per decision without visiting every CPU. Only CPUs in
    ``range(bound)`` are in the masks (a CPU beyond the topology, from a
    helper's reply, never meets a CPU mask of it); the other keys stay in
    the map. Changed through item assignment, ``pop``, ``del`` and
    ``clear`` only."""

    __slots__ = ("_all", "_masks", "bound")

    def __init__(self, items: Mapping[int, V] | Iterable[tuple[int, V]] = (), bound: int = 0):
        super().__init__()
        self.bound = bound
        self._masks: dict[V, int] = {}
        self._all = 0
        for cpu, value in dict(items).items():
            self[cpu] = value

    def mask(self, value: V) -> int:
        """The CPUs mapped to ``value`` (within ``bound``)."""
        return self._masks.get(value, 0)

    @property
    def cpus(self) -> int:
        """The CPUs mapped to anything (within ``bound``)."""
        return self._all

    def _drop(self, cpu: int, value: V) -> None:
        if 0 <= cpu < self.bound:
            self._masks[value] &= ~(1 << cpu)
            self._all &= ~(1 << cpu)

    def __setitem__(self, cpu: int, value: V) -> None:
        old = self.get(cpu, _MISSING)
        if old is not _MISSING:
            self._drop(cpu, old)  # type: ignore[arg-type]
        super().__setitem__(cpu, value)
        if 0 <= cpu < self.bound:
            self._masks[value] = self._masks.get(value, 0) | 1 << cpu
            self._all |= 1 << cpu

    def __delitem__(self, cpu: int) -> None:
        self._drop(cpu, self[cpu])
        super().__delitem__(cpu)

    def pop(self, cpu: int, *default: object) -> V:
        if cpu in self:
            value = self[cpu]
            del self[cpu]
            return value
        if default:
            return default[0]  # type: ignore[return-value]
        raise KeyError(cpu)

    def clear(self) -> None:
        super().clear()
        self._masks.clear()
        self._all = 0

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("CpuMap changes through item assignment, pop, del and clear only")

    update = setdefault = popitem = __ior__ = _refuse


DISCOVER_TIMEOUT = 2.0
"""Discovery, PrepareManagedMode and Teardown touch every punit: allowed more
than the per-request 100 ms (on the reply path the reply budget caps it)."""


class PctState:
    """What the PCT allocator knows of one node's SST (see the module doc)."""

    def __init__(self, topology: Topology, writer: Writer) -> None:
        self.topology = topology
        self.writer = writer
        self.mode = ""
        """"" (inactive), ``managed`` or ``assoc-only``"""
        self.wanted_mode = ""
        """the mode of the configuration, also while the helper is away"""
        self.plans: dict[str, Plan] = {}
        self.allowed = 0
        self.supported: bool | None = None
        self.punits: list[Punit] = []
        self.punit_of: dict[int, int] = {}
        self.hp_classes: set[str] = set()
        self.hp_eligible: set[int] = set()
        self.fallback_clos = 0
        self._bound = max(topology.cpus, default=-1) + 1
        self.want = {}
        """cpu -> the CLOS its class asks for (its core's CLOS is resolved
        from its threads' at flush time, see :mod:`nri_balloons.closassoc`)"""
        self.class_of = {}
        """cpu -> the class last used on it (HP room is derived from it)"""
        self.known = {}
        """cpu -> the CLOS the helper last reported or confirmed (siblings
        included: a core's threads move together)"""
        self.pending = 0
        """CPUs whose association a decision touched since the last flush
        (their whole cores are associated again), and those whose
        AssociateCpus has an unknown outcome (sent again)"""
        self.need_program = False
        """the SoC-wide SST state must be programmed (or read) before CPUs are
        associated: a new plan, or a restarted helper"""
        self.teardown_pending = False
        """managed mode was left by the configuration; SST is reset by the next flush"""
        self.degraded = False
        self.unreported = False
        """degraded while the helper was awaited (a WARNING, no ERROR yet)"""
        self.instance = ""
        """the helper process that answered the last request"""
        self.programmed_instance: str | None = None
        """the helper process SST was last programmed on (None: none yet)"""
        self.managed_sst = False
        """SST is in managed mode by our PrepareManagedMode (until a Teardown)"""
        self.hold = False
        """Program SST but associate no CPU yet: a starting plugin does not
        know the running containers before the runtime's Synchronize, and must
        not send their CPUs to the idle class (an HP pod off its CLOS) meanwhile"""
        self.requests_sent = 0
        self.placed: list[tuple[str, str, int, int]] = []
        """balloon, class, CLOS and CPUs of each placement of a PCT class not
        logged yet (:meth:`~nri_balloons.pcthints.PlacementHints.log_placed`)"""
        self._programmed_key: object = None
        """the plan of the configuration"""
        self._answered: set[str] = set()
        self._discovery: m.DiscoverReply | None = None
        self._turbo: tuple[int, int, int] | None = None
        for c in topology.cpus.values():
            if c.freq.max and c.freq.min:
                self._turbo = (c.freq.min, c.freq.base or c.freq.max, c.freq.max)
                break

    # The three cpu maps are CpuMaps whatever is assigned (a plain dict of
    # the helper's reply, an empty one when forgotten).

    @property
    def want(self) -> CpuMap[int]:
        return self._want

    @want.setter
    def want(self, items: Mapping[int, int]) -> None:
        self._want = CpuMap(items, self._bound)

    @property
    def class_of(self) -> CpuMap[str]:
        return self._class_of

    @class_of.setter
    def class_of(self, items: Mapping[int, str]) -> None:
        self._class_of = CpuMap(items, self._bound)

    @property
    def known(self) -> CpuMap[int]:
        return self._known

    @known.setter
    def known(self, items: Mapping[int, int]) -> None:
        self._known = CpuMap(items, self._bound)

    # -- helper access -------------------------------------------------------------
    #
    # Everything that talks to the helper is written as steps (sstlink): the
    # reply path runs them blocking within its budget, the plugin's background
    # awaiting the asyncio client; between two requests of the background,
    # hooks run and only record decisions (``use``), which the steps pick up.

    @property
    def has_helper(self) -> bool:
        return bool(self.writer.endpoint)

    def _ask(self, req: m.Request, timeout: float | None, slow: bool = False) -> Steps[m.Reply]:
        """One request, ``timeout`` its own (None: the writer's default); the
        writer's :class:`WriterUnavailable` or :class:`WriteRefused` are
        raised here. ``slow``: it touches every punit (at least
        :data:`DISCOVER_TIMEOUT`, within the reply budget on the reply path)."""
        if slow:
            timeout = DISCOVER_TIMEOUT if timeout is None else max(timeout, DISCOVER_TIMEOUT)
        reply = yield Ask(req, timeout)
        self.requests_sent += 1
        self.instance = self.writer.instance
        self._answered.add(self.instance)
        return reply

    def _must_program(self) -> bool:
        """SST must be programmed before associating: a new plan, or an answer
        from another helper process than the one SST was programmed on."""
        return self.need_program or (bool(self.mode) and self.instance != self.programmed_instance)

    def _degrade(self, exc: WriterUnavailable) -> None:
        """The helper did not answer: decisions are still recorded, and what
        is pending is sent when it is back (SST programmed again only if it
        is another helper process then). A spent reply budget is not an
        outage: the background just goes on. One ERROR per outage; while the
        helper is awaited at start (:data:`~nri_balloons.sstlink.START_GRACE`)
        a WARNING instead, and the ERROR once it is not awaited any more."""
        if isinstance(exc, BudgetSpent):
            log.info("pct: %s; SST is programmed in the background", exc)
            return
        if sidecar_awaited(self.writer):
            if not self.degraded:
                log.warning(
                    "pct: SST helper not there yet: %s; Priority Core Turbo waits for it "
                    "(containers are still created and pinned)",
                    exc,
                )
                self.unreported = True
            self.degraded = True
            return
        if not self.degraded or self.unreported:
            log.error(
                "pct: SST helper unavailable: %s; Priority Core Turbo is degraded (containers are "
                "still created and pinned; SST is programmed again when the helper is back)",
                exc,
            )
        self.unreported = False
        self.degraded = True

    # -- plan and punits --------------------------------------------------------------

    @property
    def active(self) -> bool:
        return bool(self.mode)

    def clos_for(self, name: str) -> int | None:
        """The CLOS class ``name`` asks for: its plan's; other classes the
        fallback in managed mode and none in assoc-only mode (§13.3)."""
        plan = self.plans.get(name)
        if plan is not None:
            return plan.clos
        if self.wanted_mode == "managed":
            return self.fallback_clos
        return None

    def punit_key(self, cpu: int) -> tuple[int, int] | None:
        idx = self.punit_of.get(cpu)
        return None if idx is None else self.punits[idx].key

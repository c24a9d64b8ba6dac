"""Busy frequency without privileged pods: each balloon's Bzy MHz over the
interval between two scrapes, and every punit's CLOS bounds, read from the
SST helper (which alone reads MSRs).

A scrape of ``/metrics`` or ``/debug/state`` makes one request,
``ReadFrequency(cpus=<every balloon CPU>, clos=True)``, off the NRI reply path
(the instrumentation awaits it on the event loop, NRI requests are served
meanwhile) and bounded by :data:`READ_TIMEOUT` in all, waiting for the
helper's session included. Each consumer (``/metrics``, ``/debug/state``)
keeps its own previous reading, so a Prometheus scrape's figure covers the
interval since its own previous scrape, whatever ``inspect`` does meanwhile.

A balloon's busy frequency is turbostat's summary ``Bzy_MHz`` over its CPUs:
``TSC_MHz * ΣΔAPERF / ΣΔMPERF`` (the busy-time weighted mean of its CPUs'
Bzy MHz). A CPU counts only when both readings come from the same helper
process and all three of its counters moved forward consistently
(``0 < ΔMPERF <= ΔTSC``): a counter that went back (a reset, a CPU taken
offline and back, a restarted helper) or did not move (an idle CPU, a stale
answer) leaves the CPU out, and a balloon with no CPU left has no figure.
No figure is ever made up: a failed, slow or malformed reading leaves the
figures absent until two good ones exist.

``backend`` names what read the counters; the ``sim`` backend's figures are
computed by its model of the Xeon 6776P (:data:`SIMULATED`) and are shown so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import msgspec
from nri_sst import messages as m

from nri_balloons.sstlink import HelperWriter, Writer, WriteRefused, WriterUnavailable

log = logging.getLogger("cpuclass")

READ_TIMEOUT = 0.5
"""Seconds one scrape's reading may take in all (a healthy helper answers a
256-CPU reading in about a millisecond)."""
SIMULATED = frozenset({"sim"})
"""Backends whose counters are a model's, not hardware's."""
CONSUMERS = ("metrics", "inspect")


class BadReading(ValueError):
    """A ReadFrequency reply that does not answer the request."""


class Reading(msgspec.Struct, frozen=True):
    """One ReadFrequency answer, checked against its request."""

    at: float
    """The plugin's monotonic clock when the answer arrived."""
    instance: str
    """The helper process that answered (counters of two processes never mix)."""
    backend: str
    tsc_mhz: int
    counters: dict[int, tuple[int, int, int]]
    """CPU -> (APERF, MPERF, TSC)."""
    punits: list[m.PunitClos] = []

    @property
    def simulated(self) -> bool:
        return self.backend in SIMULATED


def reading_of(
    reply: m.ReadFrequencyReply, asked: Iterable[int], instance: str, at: float
) -> Reading:
    """The reading of ``reply``, or :class:`BadReading`: a sample of a CPU
    that was not asked or given twice, a negative counter, a TSC rate that
    is not positive."""
    wanted = set(asked)
    if reply.tsc_mhz <= 0:
        raise BadReading(f"TSC rate {reply.tsc_mhz} MHz")
    counters: dict[int, tuple[int, int, int]] = {}
    for s in reply.samples:
        if s.cpu not in wanted:
            raise BadReading(f"a sample of cpu {s.cpu}, which was not asked")
        if s.cpu in counters:
            raise BadReading(f"cpu {s.cpu} sampled twice")
        if min(s.aperf, s.mperf, s.tsc) < 0:
            raise BadReading(f"cpu {s.cpu}: a negative counter")
        counters[s.cpu] = (s.aperf, s.mperf, s.tsc)
    return Reading(at, instance, reply.backend, reply.tsc_mhz, counters, list(reply.punits))


def busy_mhz(before: Reading, after: Reading, cpus: Iterable[int]) -> float | None:
    """Bzy MHz of ``cpus`` over ``before`` -> ``after`` (see the module doc);
    ``None`` when no CPU of them was busy with counters that moved forward."""
    if not before.instance or before.instance != after.instance:
        return None
    aperf = mperf = 0
    for cpu in cpus:
        a, b = before.counters.get(cpu), after.counters.get(cpu)
        if a is None or b is None:
            continue
        da, dm, dt = b[0] - a[0], b[1] - a[1], b[2] - a[2]
        if da < 0 or not 0 < dm <= dt:
            continue  # reset in between, idle, or inconsistent
        aperf += da
        mperf += dm
    if mperf == 0:
        return None
    return after.tsc_mhz * aperf / mperf


class Interval(msgspec.Struct, frozen=True):
    """A consumer's last two readings (``after`` None: the last one failed)."""

    before: Reading | None = None
    after: Reading | None = None

    def busy_mhz(self, cpus: Iterable[int]) -> float | None:
        if self.before is None or self.after is None:
            return None
        return busy_mhz(self.before, self.after, cpus)

    @property
    def seconds(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after.at - self.before.at


class BusyFrequency:
    """The readings of each consumer; :meth:`refresh` takes one, over a helper
    session of its own (``connect(endpoint)``, a :class:`HelperWriter`): a
    scrape never waits behind the background's SST programming, nor does a
    scrape's timeout touch that session."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = READ_TIMEOUT,
        connect: Callable[[str], Writer] = HelperWriter,
    ) -> None:
        self.clock = clock
        self.timeout = timeout
        self.connect = connect
        self._writer: Writer | None = None
        self.intervals: dict[str, Interval] = {c: Interval() for c in CONSUMERS}
        self._lock = asyncio.Lock()
        self._reading: dict[str, asyncio.Task[None]] = {}
        """the reading in flight for each consumer: concurrent scrapes share it"""

    def interval(self, consumer: str) -> Interval:
        return self.intervals.get(consumer, Interval())

    def writer(self, endpoint: str) -> Writer:
        """The session to the helper at ``endpoint`` (a new one when it changed)."""
        if self._writer is None or self._writer.endpoint != endpoint:
            self.close()
            self._writer = self.connect(endpoint)
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None

    async def refresh(self, consumer: str, endpoint: str, cpus: list[int]) -> None:
        """One ReadFrequency of ``cpus`` (with the CLOS bounds) for ``consumer``,
        at most :attr:`timeout` seconds in all; on any failure the consumer's
        figures are absent until its next good reading (logged at debug level:
        a scrape every few seconds must not flood the log). A scrape that
        comes while the consumer's reading is in flight waits for that one
        (a flood of scrapes is never a flood of requests to the helper); a
        cancelled scrape leaves it running to its own bound."""
        task = self._reading.get(consumer)
        if task is None or task.done():
            task = asyncio.ensure_future(self._read(consumer, endpoint, cpus))
            self._reading[consumer] = task
        await asyncio.shield(task)

    async def _read(self, consumer: str, endpoint: str, cpus: list[int]) -> None:
        last = self.interval(consumer)
        previous = last.after or last.before
        self.intervals[consumer] = Interval(previous, None)
        if not endpoint or not cpus:
            return
        writer = self.writer(endpoint)
        try:
            async with asyncio.timeout(self.timeout):
                async with self._lock:
                    reply = await writer.request_async(
                        m.ReadFrequency(cpus=cpus, clos=True), self.timeout
                    )
            if not isinstance(reply, m.ReadFrequencyReply):
                raise BadReading(f"a {type(reply).__name__} to ReadFrequency")
            reading = reading_of(reply, cpus, writer.instance, self.clock())
        except TimeoutError:
            log.debug("cpuclass: ReadFrequency: no answer within %.0f ms", self.timeout * 1000)
            return
        except (WriterUnavailable, WriteRefused, BadReading) as exc:
            log.debug("cpuclass: ReadFrequency failed: %s", exc)
            return
        self.intervals[consumer] = Interval(previous, reading)

"""Busy MHz over a scrape interval (nri_balloons.busyfreq): two readings of
the helper's APERF/MPERF/TSC counters, their deltas averaged over a
balloon's CPUs, and what leaves a CPU (or a whole figure) out: a CPU reset
in between, a counter that did not move, a restarted helper, a reply that
does not answer the request, a helper that does not answer in time."""

from __future__ import annotations

import asyncio

import pytest
from nri_balloons.busyfreq import BadReading, BusyFrequency, Reading, busy_mhz, reading_of
from nri_sst import messages as m

TSC = 2300
ENDPOINT = "ipc:///nowhere"  # the stand-in writers below never connect


def reading(counters: dict[int, tuple[int, int, int]], at: float = 0.0, instance: str = "a"):
    return Reading(at, instance, "sim", TSC, counters)


def test_two_readings_one_cpu_is_tsc_times_aperf_over_mperf_deltas() -> None:
    before = reading({4: (1_000, 2_000, 10_000)})
    # busy half of the interval (ΔMPERF = ΔTSC / 2) at twice the TSC rate
    after = reading({4: (1_000 + 4_000, 2_000 + 2_000, 10_000 + 4_000)}, at=1.0)
    assert busy_mhz(before, after, [4]) == pytest.approx(2 * TSC)


def test_balloon_average_is_weighted_by_busy_time() -> None:
    before = reading({0: (0, 0, 0), 1: (0, 0, 0)})
    # cpu 0: busy 3000 cycles at 2x; cpu 1: busy 1000 at 1x -> (6000+1000)/(4000)
    after = reading({0: (6_000, 3_000, 4_000), 1: (1_000, 1_000, 4_000)})
    assert busy_mhz(before, after, [0, 1]) == pytest.approx(TSC * 7_000 / 4_000)
    assert busy_mhz(before, after, [1]) == pytest.approx(TSC)


def test_a_cpu_reset_in_between_is_left_out() -> None:
    before = reading({0: (9_000, 9_000, 9_000), 1: (0, 0, 0)})
    # cpu 0 went offline and back: its counters restarted below the first reading
    after = reading({0: (100, 50, 200), 1: (2_000, 1_000, 1_000)})
    assert busy_mhz(before, after, [0, 1]) == pytest.approx(2 * TSC)
    assert busy_mhz(before, after, [0]) is None


@pytest.mark.parametrize(
    "after",
    [
        (500, 100, 1_100),  # MPERF did not move: idle the whole interval
        (100, 100, 100),  # nothing moved (a stale answer)
        (900, 150, 120),  # TSC moved less than MPERF: inconsistent
    ],
)
def test_a_counter_that_did_not_move_makes_no_figure(after: tuple[int, int, int]) -> None:
    before = reading({0: (100, 100, 100)})
    assert busy_mhz(before, reading({0: after}), [0]) is None


def test_readings_of_two_helper_processes_never_mix() -> None:
    before = reading({0: (0, 0, 0)}, instance="a")
    after = reading({0: (2_000, 1_000, 1_000)}, instance="b")
    assert busy_mhz(before, after, [0]) is None


def test_a_cpu_missing_from_one_reading_is_left_out() -> None:
    before = reading({0: (0, 0, 0)})
    after = reading({0: (2_000, 1_000, 1_000), 1: (5, 5, 5)})
    assert busy_mhz(before, after, [0, 1]) == pytest.approx(2 * TSC)


def sample(cpu: int, a: int = 1, b: int = 1, t: int = 1) -> m.FrequencySample:
    return m.FrequencySample(cpu=cpu, aperf=a, mperf=b, tsc=t)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(7)]), "cpu 7, which was not asked"),
        (m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(0), sample(0)]), "sampled twice"),
        (m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(0, a=-1)]), "negative counter"),
        (m.ReadFrequencyReply(tsc_mhz=0, samples=[sample(0)]), "TSC rate 0 MHz"),
    ],
)
def test_a_reply_that_does_not_answer_the_request_is_refused(
    reply: m.ReadFrequencyReply, error: str
) -> None:
    with pytest.raises(BadReading, match=error):
        reading_of(reply, [0, 1], "a", 0.0)


class StalledWriter:
    """A stand-in for a helper that accepted the request and never answers
    (ours, small: the integration tests stop a real helper with SIGSTOP)."""

    endpoint = ENDPOINT
    instance = "a"

    def close(self) -> None:
        pass

    async def request_async(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class AnsweringWriter:
    """A stand-in answering from a list of replies (ours, small)."""

    endpoint = ENDPOINT
    instance = "a"

    def __init__(self, replies: list[m.Reply]) -> None:
        self.replies = replies
        self.asked: list[m.Request] = []

    def close(self) -> None:
        pass

    async def request_async(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        self.asked.append(request)
        return self.replies.pop(0)


async def test_a_helper_that_does_not_answer_leaves_no_figure_within_the_timeout() -> None:
    busy = BusyFrequency(timeout=0.05, connect=lambda _: StalledWriter())  # type: ignore[arg-type,return-value]
    await asyncio.wait_for(busy.refresh("metrics", ENDPOINT, [0]), 5)
    assert busy.interval("metrics").after is None


async def test_one_request_per_refresh_for_every_cpu_and_intervals_per_consumer() -> None:
    ticks = iter([1.0, 3.0, 4.0])
    replies: list[m.Reply] = [
        m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(0, 0, 0, 0), sample(1, 0, 0, 0)]),
        m.ReadFrequencyReply(
            tsc_mhz=TSC, samples=[sample(0, 4_000, 2_000, 2_000), sample(1, 2_000, 2_000, 2_000)]
        ),
        m.ReadFrequencyReply(
            tsc_mhz=TSC, samples=[sample(0, 6_000, 3_000, 3_000), sample(1, 2_000, 2_000, 3_000)]
        ),
    ]
    writer = AnsweringWriter(replies)
    busy = BusyFrequency(clock=lambda: next(ticks), connect=lambda _: writer)  # type: ignore[arg-type,return-value]
    await busy.refresh("metrics", ENDPOINT, [0, 1])
    assert busy.interval("metrics").busy_mhz([0]) is None  # one reading: no figure yet
    await busy.refresh("metrics", ENDPOINT, [0, 1])
    await busy.refresh("inspect", ENDPOINT, [0, 1])
    assert writer.asked == [m.ReadFrequency(cpus=[0, 1], clos=True)] * 3
    metrics = busy.interval("metrics")
    assert metrics.seconds == 2.0 and metrics.busy_mhz([0]) == pytest.approx(2 * TSC)
    assert metrics.busy_mhz([1]) == pytest.approx(TSC)
    # inspect's first reading: nothing of /metrics' interval is shown as its own
    assert busy.interval("inspect").busy_mhz([0]) is None


async def test_a_failed_reading_keeps_the_last_good_one_as_the_baseline() -> None:
    writer = AnsweringWriter(
        [
            m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(0, 0, 0, 0)]),
            m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(9)]),  # not asked: refused
            m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(0, 2_000, 1_000, 1_000)]),
        ]
    )
    busy = BusyFrequency(connect=lambda _: writer)  # type: ignore[arg-type,return-value]
    await busy.refresh("metrics", ENDPOINT, [0])
    await busy.refresh("metrics", ENDPOINT, [0])
    assert busy.interval("metrics").busy_mhz([0]) is None
    await busy.refresh("metrics", ENDPOINT, [0])
    assert busy.interval("metrics").busy_mhz([0]) == pytest.approx(2 * TSC)


async def test_concurrent_scrapes_share_one_reading() -> None:
    gate = asyncio.Event()

    class GatedWriter(AnsweringWriter):
        async def request_async(self, request: m.Request, timeout: float | None = None) -> m.Reply:
            await gate.wait()
            return await super().request_async(request, timeout)

    reply = m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(0)])
    writer = GatedWriter([reply, reply])
    busy = BusyFrequency(connect=lambda _: writer)  # type: ignore[arg-type,return-value]
    scrapes = [asyncio.create_task(busy.refresh("metrics", ENDPOINT, [0])) for _ in range(50)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(asyncio.gather(*scrapes), 5)
    assert len(writer.asked) == 1 and busy.interval("metrics").after is not None


async def test_a_session_of_its_own_per_endpoint() -> None:
    made: list[AnsweringWriter] = []

    def connect(endpoint: str) -> AnsweringWriter:
        w = AnsweringWriter([m.ReadFrequencyReply(tsc_mhz=TSC, samples=[sample(0)])])
        w.endpoint = endpoint
        made.append(w)
        return w

    busy = BusyFrequency(connect=connect)  # type: ignore[arg-type]
    await busy.refresh("metrics", "ipc:///a", [0])
    await busy.refresh("metrics", "ipc:///b", [0])  # a reconfigured --sst-helper
    assert [w.endpoint for w in made] == ["ipc:///a", "ipc:///b"]

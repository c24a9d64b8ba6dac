"""CPU priorities from a SST helper that was away for the whole start budget
(:func:`nri_balloons.cpupriority.rediscover`): asked again off the reply path,
0.5 s doubling to 10 s (the pause injected: no test sleeps that long), until it
answers; a refusal, or a helper with no SST (or none that prioritises CPUs),
keeps the start's cpufreq priorities; cancelled at the plugin's shutdown.

The helper is its own request handler and backend in this process
(:class:`pct_helpers.InProcessHelper`: the client's session and the helper's
handler, only the socket a stand-in; ``down`` is a helper whose socket nobody
serves yet). The integration tier runs the helper as a process started after
the plugin (tests/integration/nri_balloons/test_cpu_priorities.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from nri_balloons.cpupriority import (
    LATE_RETRY_MAX,
    LATE_RETRY_MIN,
    cpu_priorities,
    cpufreq_priorities,
    discover_steps,
    rediscover,
)
from nri_balloons.sstlink import exchange
from nri_framework.topology import Topology
from nri_sst import messages as m
from nri_sst.backends.none import NoneBackend
from nri_sst.backends.sim import SimConfig
from pct_helpers import (
    InProcessHelper,
    host_root,
    shared_root,  # noqa: F401 (the module's autouse host tree)
)

LOGGER = "nri_balloons.cpus"
PCT_ON = SimConfig(profile="bios-pct-on")  # SST-CP ordered, CLOS 0 and 2: SST ranks CPUs


def topology() -> Topology:
    return Topology.from_sysfs(str(host_root()))


class Pauses:
    """The injected pause: records each delay; the helper comes up after
    ``until`` of them (never: None)."""

    def __init__(self, helper: InProcessHelper, until: int | None) -> None:
        self.helper = helper
        self.until = until
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.until is not None and len(self.delays) >= self.until:
            self.helper.down = False
        await asyncio.sleep(0)


async def test_backoff_doubles_from_half_a_second_to_ten_and_ends_when_the_helper_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    helper = InProcessHelper(PCT_ON)
    helper.down = True
    topo = topology()
    pauses = Pauses(helper, until=8)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = await asyncio.wait_for(rediscover(topo, helper, pauses), 10)  # liveness
    assert pauses.delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert (LATE_RETRY_MIN, LATE_RETRY_MAX) == (0.5, 10.0)
    # SST's priorities (CLOS 0 high), as the helper reports them now
    expected = cpu_priorities(topo, exchange(discover_steps(), helper))
    assert got == expected
    assert got != cpufreq_priorities(topo)
    assert "CPU priorities: SST status read from the SST helper after start" in caplog.text
    # it ended at the first answer: one Discover and one GetAssociation, no more
    asked = [type(r) for r in helper.sent]
    assert asked.count(m.Discover) == 2 and asked.count(m.GetAssociation) == 2  # + `expected`


async def test_a_helper_there_at_once_is_not_paused_for() -> None:
    helper = InProcessHelper(PCT_ON)
    pauses = Pauses(helper, until=None)
    got = await asyncio.wait_for(rediscover(topology(), helper, pauses), 10)
    assert got is not None
    assert pauses.delays == []


async def test_a_refusal_keeps_the_cpufreq_priorities(caplog: pytest.LogCaptureFixture) -> None:
    helper = InProcessHelper(PCT_ON)
    helper.down = True
    helper.refuse = {m.GetAssociation}
    pauses = Pauses(helper, until=2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = await asyncio.wait_for(rediscover(topology(), helper, pauses), 10)
    assert got is None  # the caller keeps the start's (cpufreq) priorities
    assert pauses.delays == [0.5, 1.0]  # a refusal is an answer: no more attempts
    assert "CPU priorities: the SST helper refused its SST status" in caplog.text
    assert "hardware-error: GetAssociation refused by the test" in caplog.text
    assert "SST status read" not in caplog.text


async def test_no_sst_keeps_the_cpufreq_priorities(caplog: pytest.LogCaptureFixture) -> None:
    helper = InProcessHelper(backend=NoneBackend())
    helper.down = True
    pauses = Pauses(helper, until=1)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = await asyncio.wait_for(rediscover(topology(), helper, pauses), 10)
    assert got is None
    assert "CPU priorities: the SST helper is there now and reports no SST" in caplog.messages
    assert not any(isinstance(r, m.GetAssociation) for r in helper.sent)


async def test_sst_that_prioritises_no_cpu_keeps_the_cpufreq_priorities(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The BIOS default (SST-CP off, SST-TF off, no SST-BF on the 6776P): the
    helper has SST but it ranks no CPU; the allocations keep cpufreq's (the
    plugin does not rebuild its trees for the same priorities)."""
    helper = InProcessHelper(SimConfig(profile="bios-default"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = await asyncio.wait_for(rediscover(topology(), helper, Pauses(helper, None)), 10)
    assert got is None
    assert "reports no SST that prioritises CPUs" in caplog.text
    assert "SST status read" not in caplog.text


async def test_cancelled_while_waiting_for_the_helper() -> None:
    """Cancelled in its pause (the helper never comes) and in a request (the
    helper holds it): the task ends cancelled, at once, nothing swallowed."""
    helper = InProcessHelper(PCT_ON)
    helper.down = True
    never = asyncio.Event()
    cancelled = False

    async def pause(seconds: float) -> None:
        if cancelled:  # a swallowed cancellation ends here, not in a loop
            raise AssertionError("paused again after its cancellation")
        await never.wait()

    task = asyncio.create_task(rediscover(topology(), helper, pause))
    await asyncio.sleep(0.01)
    assert not task.done()
    cancelled = True
    task.cancel()
    await asyncio.wait({task}, timeout=5)  # liveness bound (never cancels the task)
    assert task.cancelled()

    helper.down = False
    helper.gate = asyncio.Event()  # the helper holds every request
    cancelled = False
    task = asyncio.create_task(rediscover(topology(), helper, pause))
    await asyncio.sleep(0.01)
    assert not task.done()
    cancelled = True
    task.cancel()
    await asyncio.wait({task}, timeout=5)  # liveness bound (never cancels the task)
    assert task.cancelled()
    assert helper.sent == []


async def test_the_plugin_cancels_the_rediscovery_at_shutdown(tmp_path: Path) -> None:
    """A plugin whose helper was away at start asks again in the background
    (from its first commit); its shutdown ends that task."""
    from nri_balloons.cmdline import BalloonsOptions
    from nri_balloons.plugin import Balloons
    from nri_balloons.sstlink import DEFAULT_WAIT
    from nri_framework.host import PolicyHost

    plugin = Balloons()
    PolicyHost("balloons", plugin, host_root=str(host_root()))
    plugin.options = BalloonsOptions(sst_helper=f"ipc://{tmp_path}/absent.sock")
    plugin.sst_missed = True
    plugin.commit(DEFAULT_WAIT)
    task = plugin.rediscovery
    assert task is not None
    await asyncio.sleep(0.05)
    assert not task.done()  # asking an absent helper, pausing between attempts
    plugin.policy_shutdown()
    await asyncio.wait({task}, timeout=5)  # liveness bound (never cancels the task)
    assert task.cancelled()
    assert plugin.rediscovery is None

"""Priority Core Turbo while the SST helper fails (issue #10): the balloons
plugin and the SST helper as real processes (sim backend, the Xeon 6776P
model) under the runtime simulator; faults are real signals (SIGSTOP,
SIGCONT, SIGKILL) to the helper. SST state is read back from the helper over
its socket, the plugin's and the helper's own log lines are grepped."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from balloons_e2e import until
from faults import helper_punits, sst_not_programmed
from nri_balloons.sstlink import REPLY_BUDGET
from nri_framework import cpuset
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_sst import messages as m
from nri_sst.backends.sim import SimBackend
from nri_sst.client import HelperClient, HelperUnavailable
from sst_node import Node, node

EXAMPLES = Path(__file__).parents[3] / "examples" / "pct-managed"
SPEC = (EXAMPLES / "balloons-pct-managed.yaml").read_text()
ALL = list(range(256))
LIVENESS = 10.0
"""Seconds the runtime waits for a CreateContainer (its request timeout in
these tests): a liveness bound only, a create blocked on the stopped helper
fails it. How fast a create is with the helper away is a figure of
tests/bench/bench_pct.py (``pct.away_p99``); the tests here assert the
mechanism: the reply path's budget, the one degraded transition."""
UNAVAILABLE = re.compile(r"pct: SST helper unavailable: (.*); Priority Core Turbo is degraded")
WITHIN = re.compile(r"did not answer \w+ within (\d+) ms")


async def clos_of(n: Node, cpus: Iterable[int] = ALL) -> dict[int, int]:
    async with HelperClient(n.helper.endpoint, timeout=2.0, client="test") as c:
        return (await c.call(m.GetAssociation(cpus=sorted(cpus)), m.GetAssociationReply)).clos


def cores(cpus: Iterable[int]) -> set[int]:
    """``cpus`` and their sibling threads (the 6776P's: cpu and cpu + 128):
    CLOS is per core."""
    return {c % 128 + t for c in cpus for t in (0, 128)}


def helper_lines(n: Node, text: str) -> list[str]:
    return [line for line in n.helper.log.read_text().splitlines() if text in line]


def saved_clos(n: Node, cpus: Iterable[int]) -> dict[int, int]:
    """The CLOS of ``cpus`` in the sim's state file: what a helper started
    now would come up with (the boot state while there is no file)."""
    sim = SimBackend(state_file=n.helper.state)
    return {c: sim.clos_assoc_get(*sim.config.locate(c)[:3]) for c in cpus}


def long_deadline(path: Path) -> SimulatedRuntime:
    return SimulatedRuntime(path, request_timeout=LIVENESS)


@pytest.mark.parametrize("fault", ["SIGSTOP", "SIGKILL"])
async def test_helper_away_never_blocks_the_event_loop(fault: str) -> None:
    """Defect 8: with the helper stopped or killed for seconds (background
    retries and the probe included), no CreateContainer waits for it beyond
    the reply budget; when it is back, every decision taken meanwhile is
    applied. The mechanism, from the plugin's log: the first create after the
    fault waits at most the reply budget, and the plugin goes degraded once."""
    async with node(SPEC, topology="xeon-6776p", runtime=long_deadline) as n:
        await n.plugin.wait_output("balloons policy started", timeout=20)
        first = await n.create_from("pct-hp-1", EXAMPLES / "pod-hp-1.yaml")
        assert n.helper.proc is not None
        n.helper.proc.send_signal(getattr(signal, fault))
        if fault == "SIGKILL":
            n.helper.proc.wait()
        hp: list[set[int]] = [first]
        lp: list[set[int]] = []
        since = n.mark()
        end = time.monotonic() + 6.0  # retries at 0.5, 1, 2 s; the 5 s probe
        i = 0
        while time.monotonic() < end:
            i += 1
            if i % 2:
                hp.append(await n.create(f"hp{i}", "hp-bln", cpu="2"))
            else:
                lp.append(await n.create(f"lp{i}", "lp-bln", cpu="1"))
            await asyncio.sleep(0.25)  # the stimulus: creates spread over the retries
        assert i > 10 and all(hp) and all(lp)  # every create answered, and pinned
        await n.plugin.wait_output("pct: SST helper unavailable:", timeout=5)
        (why,) = [mt.group(1) for x in n.lines("", since) if (mt := UNAVAILABLE.search(x))]
        # the hook's request: capped by what was left of its budget, or (the
        # helper dead and its socket seen closed) not sent at all
        within = WITHIN.search(why)
        if fault == "SIGSTOP" or within:
            assert within and int(within.group(1)) <= REPLY_BUDGET * 1000, why
        else:
            assert why.endswith(" not connected (Apply)"), why  # the decision's one request
        if fault == "SIGSTOP":
            n.helper.proc.send_signal(signal.SIGCONT)
        else:
            n.helper.start()  # SST as the killed one left it (the sim's state file)
        await n.plugin.wait_output("pct: SST helper is back", timeout=20)
        clos = await clos_of(n)
        all_hp = set().union(*hp)
        assert {c for c, k in clos.items() if k == 0} == cores(all_hp)
        assert all(clos[c] == 3 for cpus in lp for c in cpus if c not in cores(all_hp))
        assert all(n.disabled(c) == {"C6", "C6P"} for c in all_hp)


async def test_rehandshake_with_a_stopped_helper_keeps_sst() -> None:
    """Defect 4: a request timing out (the helper SIGSTOPped for a moment)
    makes the plugin's client take a new socket and say hello again, to the
    same helper process: SST is not prepared again (no CPU through CLOS 0),
    pending associations are sent."""
    async with node(SPEC, topology="xeon-6776p") as n:
        await n.plugin.wait_output("balloons policy started", timeout=20)
        await n.create_from("pct-hp-1", EXAMPLES / "pod-hp-1.yaml")
        assert len(helper_lines(n, "sst: PrepareManagedMode done")) == 1
        assert n.helper.proc is not None
        n.helper.proc.send_signal(signal.SIGSTOP)
        try:
            hp = await n.create("hp-during", "hp-bln", cpu="2")  # its AssociateCpus times out
        finally:
            n.helper.proc.send_signal(signal.SIGCONT)
        await n.plugin.wait_output("pct: SST helper is back", timeout=20)
        assert set((await clos_of(n, hp)).values()) == {0}
        assert len(helper_lines(n, "sst: PrepareManagedMode")) == 1
        assert not n.lines("pct: SST helper reconnected; programming SST state again")


async def watch_clos(n: Node, cpus: list[int], seen: list[dict[int, int]]) -> None:
    """Read the CLOS of ``cpus`` from the helper, as fast as it answers."""
    async with HelperClient(n.helper.endpoint, timeout=0.5, client="watch") as c:
        while True:
            try:
                seen.append((await c.call(m.GetAssociation(cpus=cpus), m.GetAssociationReply)).clos)
            except HelperUnavailable:
                await asyncio.sleep(0.005)


async def test_restarted_helper_with_programmed_sst_is_not_reset() -> None:
    """Defect 4: kill -9 of the helper leaves SST programmed (the sim keeps
    it in its state file); the plugin programs the restarted helper for the
    same plan with keep_programmed: no CPU of the LP class (or idle) passes
    through CLOS 0 meanwhile, and everything is associated again."""
    async with node(SPEC, topology="xeon-6776p") as n:
        await n.plugin.wait_output("balloons policy started", timeout=20)
        hp = await n.create_from("pct-hp-1", EXAMPLES / "pod-hp-1.yaml")
        lp = await n.create_from("pct-lp", EXAMPLES / "pod-lp.yaml")
        await n.plugin.wait_output(
            f"pct: associated cpus {cpuset.format(cpuset.from_ids(lp))} to CLOS 3", 10
        )
        others = sorted(set(ALL) - cores(hp))
        await until(
            lambda: set(saved_clos(n, others).values()) == {3},
            "the sim's state file to hold the LP association",
            10,
        )
        n.helper.kill()
        n.helper.start()
        seen: list[dict[int, int]] = []
        watcher = asyncio.create_task(watch_clos(n, others, seen))
        try:
            while not seen:
                await asyncio.sleep(0.01)
            hp_after = await n.create("hp-after", "hp-bln", cpu="2")  # meets the new helper
            await n.plugin.wait_output(
                "pct: SST helper reconnected; programming SST state again", 15
            )
            await n.plugin.wait_output("pct: fallback CLOS for non-PCT CPUs set to 3 (LP)", 10, 2)
            await asyncio.sleep(0.3)  # the watcher samples on after the programming
        finally:
            watcher.cancel()
        assert helper_lines(n, "sst: PrepareManagedMode: SST already in managed state; kept as is")
        assert len(helper_lines(n, "sst: PrepareManagedMode done")) == 1  # the first helper's
        assert len(seen) > 5
        for clos in seen:  # hp-after's core legitimately goes to CLOS 0
            assert {c for c, k in clos.items() if k != 3} <= cores(hp_after), clos
        final = await clos_of(n)
        assert {c for c, k in final.items() if k == 0} == cores(hp | hp_after)


BACKOFF = 60.0
"""Seconds the plugin's background backs off after a failed commit in the
tests below (RETRY_MIN and RETRY_MAX set so in the plugin process): far past
their bounds, so that only the probe can bring the background back in time."""
NOTICED = 10.0
"""Seconds (a liveness bound) for the plugin to notice an outage or a
restarted helper while its background backs off: PROBE_INTERVAL paced."""


def with_backoff(module: str, low: str, high: str) -> Callable[[list[str]], list[str]]:
    """The plugin's command with the backoff ``module.low``..``module.high``
    at :data:`BACKOFF` seconds (set before the real entry point runs)."""

    def command(cmd: list[str]) -> list[str]:
        assert cmd[1:3] == ["-m", "nri_framework"], cmd
        code = (
            f"import sys; import {module} as p; p.{low} = p.{high} = {BACKOFF!r}; "
            "from nri_framework.launch import main; sys.exit(main())"
        )
        return [cmd[0], "-c", code, *cmd[3:]]

    return command


backing_off = with_backoff("nri_balloons.plugin", "RETRY_MIN", "RETRY_MAX")
"""The background's backoff (after a failed commit)."""


async def test_restarted_helper_is_programmed_while_the_background_backs_off() -> None:
    """The fault suite's seed 2210258062: the helper SIGSTOPped, so that a
    create's request and then the background's time out (the background now
    in its backoff); then SIGKILLed and started again with SST as the BIOS
    left it. The restarted helper is found and programmed at the probe's
    pace, not after the backoff: every punit programmed, the HP cores on the
    HP CLOS."""
    async with node(SPEC, topology="xeon-6776p", command=backing_off) as n:
        await n.plugin.wait_output("balloons policy started", timeout=20)
        hp = await n.create_from("pct-hp-1", EXAMPLES / "pod-hp-1.yaml")
        assert n.helper.proc is not None
        since = n.mark()
        n.helper.proc.send_signal(signal.SIGSTOP)
        hp |= await n.create("hp-stopped", "hp-bln", cpu="2")
        await n.plugin.wait_output("pct: SST helper unavailable:", timeout=5)
        # the background's own commit timed out too: it backs off now
        await until(
            lambda: bool(n.lines("cpuclass: SST helper still unavailable", since)),
            "the background's commit to time out",
            10,
        )
        n.helper.kill()  # stopped: SIGKILL still ends it
        n.helper.state.unlink(missing_ok=True)  # SST as the BIOS left it
        n.helper.start()
        await n.plugin.wait_output("pct: SST helper is back", timeout=NOTICED)
        assert not sst_not_programmed(await helper_punits(n.helper.endpoint))
        clos = await clos_of(n)
        assert {c for c, k in clos.items() if k == 0} == cores(hp)


LP_CSTATES = SPEC.replace(
    "    pctMaxFreq: base\n", "    pctMaxFreq: base\n    disabledCstates: [C6]\n", 1
)
"""The spec's policy with C-state settings for its LP class too."""


async def test_outage_is_reported_when_pct_has_nothing_to_send() -> None:
    """A create while the helper is dead whose cores are on their CLOS
    already (an LP pod: LP and idle CPUs share CLOS 3) sends only its
    C-state settings; their failure leaves the background backing off. PCT
    is still reported degraded (its ERROR line) at the probe's pace, and is
    back when a helper is."""
    assert LP_CSTATES != SPEC
    async with node(LP_CSTATES, topology="xeon-6776p", command=backing_off) as n:
        await n.plugin.wait_output("balloons policy started", timeout=20)
        await n.create_from("pct-hp-1", EXAMPLES / "pod-hp-1.yaml")
        lp = await n.create_from("pct-lp", EXAMPLES / "pod-lp.yaml")
        await n.plugin.wait_output(
            f"pct: associated cpus {cpuset.format(cpuset.from_ids(lp))} to CLOS 3", 10
        )
        since = n.mark()
        n.helper.kill()
        more = await n.create("lp-dead", "lp-bln", cpu="2")
        assert more and more - lp  # the LP balloon grew: C-state settings to send
        await n.plugin.wait_output("cpuclass: SST helper unavailable:", timeout=5)
        assert not n.lines("pct: SST helper unavailable:", since)  # PCT sent nothing
        await n.plugin.wait_output("pct: SST helper unavailable:", timeout=NOTICED)
        n.helper.start()
        await n.plugin.wait_output("pct: SST helper is back", timeout=NOTICED)
        clos = await clos_of(n, more)
        assert set(clos.values()) == {3}


async def test_cpu_priorities_of_a_helper_away_at_start_come_at_the_probes_pace() -> None:
    """The plugin started while the helper was SIGSTOPped reads its CPU
    priorities later (cpupriority.rediscover); once its rediscovery backs
    off, the helper SIGCONTed is asked again at the probe's pace, not after
    the backoff (LATE_RETRY_MIN..MAX)."""
    command = with_backoff("nri_balloons.cpupriority", "LATE_RETRY_MIN", "LATE_RETRY_MAX")
    async with node(SPEC, topology="xeon-6776p", log_level="debug", command=command) as n:
        await n.plugin.wait_output("balloons policy started", timeout=20)
        await n.plugin.stop()
        assert n.helper.proc is not None
        n.helper.proc.send_signal(signal.SIGSTOP)
        try:
            n.plugin = await PluginProcess.launch(n.cmd)
            await wait_registered(n.rt, n.plugin, 20)
            await n.plugin.wait_output("CPU priorities: cannot read SST status", timeout=10)
            await n.create("hp-away", "hp-bln", cpu="2")  # the rediscovery starts
            await n.plugin.wait_output("CPU priorities: SST helper still away", timeout=10)
        finally:
            n.helper.proc.send_signal(signal.SIGCONT)
        await n.plugin.wait_output(
            "CPU priorities: SST status read from the SST helper after start", timeout=NOTICED
        )

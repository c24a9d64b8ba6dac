"""The fault suite (issue #10): kill -9 of the balloons plugin and of the SST
helper under create/remove churn, and the promises that must survive it.

The node: the 6776P sysfs fixture, the SST helper as a real process on its
sim backend, the spec's PCT BalloonsPolicy (examples/pct-managed/), the real
plugin process registered with the runtime simulator over a real NRI socket.

1. :data:`PLUGIN_KILLS` times, at a random point of the churn (a random delay,
   or the moment a CreateContainer reply arrives: the decision has left, so
   it must be persisted), SIGKILL the plugin and start it again on the same
   state dir; the helper keeps running.
2. :data:`HELPER_KILLS` times, SIGKILL the helper, create pods while it is
   down, start it again (every other time with SST as the BIOS left it); the
   plugin keeps running and must program SST again.

After every restart, once the plugin reports it recovered (healthy, PCT not
degraded; bounded), the suite measures these figures, prints them as a table
and asserts each to its goal (0), the failure naming every violation:

- containers moved across plugin restarts: a running container's cpuset
  after the restarted plugin synchronized differs from before the kill (not
  compared: the balloon of a change in flight at the kill, which the new
  plugin may rightly resize when it learns of it);
- decisions lost: a container placed before the kill that the restarted
  plugin placed anew (its ``assigning container`` line) instead of restoring;
- CPUs in two exclusive balloons (``/debug/state`` and the runtime's cpusets);
- CPUs whose CLOS differs between ``/debug/state`` and the helper's
  ``GetAssociation``, and HP-class CPUs the helper does not have on CLOS 0;
- punits not programmed (CP ordered, TF, the CLOS bounds) after a helper
  restart, and SST resets (``PrepareManagedMode`` putting every core on
  CLOS 0) while SST was programmed: after a plugin restart, or a helper
  restart that kept the SST state;
- creates answered after more than 100 ms (and after the 1 s liveness bound)
  while the helper is down, with the count and the slowest;
- helper outages the plugin did not report (``pct_degraded``) within 3 s;
- runtime drops of the plugin (any disconnect but our kills), refused
  creates, and liveness bounds exceeded (which stop the suite early).

``NRI_FAULT_SEED`` repeats a run (the seed is printed).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from faults import (
    Churn,
    FaultNode,
    Figure,
    KillPointRuntime,
    RuntimeErrors,
    hp_off_clos,
    pretty,
    shared_cpus,
    table,
)
from nri_sst.client import HelperUnavailable
from sst_node import node

EXAMPLES = Path(__file__).parents[3] / "examples" / "pct-managed"
SPEC = (EXAMPLES / "balloons-pct-managed.yaml").read_text()
PLUGIN_KILLS = 50
HELPER_KILLS = 20
SLOW_CREATE = 0.1
"""Seconds: a create answered later than this while the helper is down counts."""
STUCK_CREATE = 1.0
"""Seconds: the liveness bound of the same (a blocked event loop)."""
HELPER_DOWN = (0.2, 1.2)
"""Seconds the helper stays down (random), the churn going on."""
MAX_DELAY = 0.3
"""Seconds into the churn a random-delay kill may come."""
SHOWN = 12
"""Violations shown per figure in the failure message."""


class Suite:
    def __init__(self, f: FaultNode, rng: random.Random, errors: RuntimeErrors) -> None:
        self.f = f
        self.errors = errors
        self.errmark = 0
        self.rng = rng
        self.churn = Churn(f.n, rng)
        self.moved = Figure("containers moved across plugin restarts")
        self.lost = Figure("decisions lost (placed anew after a restart)")
        self.shared = Figure("CPUs in two exclusive balloons")
        self.clos = Figure("CPUs whose CLOS differs, plugin vs helper")
        self.hp = Figure("HP CPUs not on the HP CLOS in the helper")
        self.sst = Figure("punits not programmed after a helper restart")
        self.resets = Figure("SST resets while programmed (all cores to CLOS 0)")
        self.slow = Figure(f"creates answered after > {SLOW_CREATE * 1000:.0f} ms, helper down")
        self.stuck = Figure(f"creates answered after > {STUCK_CREATE:.0f} s, helper down")
        self.unnoticed = Figure("helper outages not reported (pct_degraded)")
        self.drops = Figure("runtime drops of the plugin")
        self.refused = Figure("creates refused")
        self.stopped = Figure("liveness bounds exceeded (the suite stopped)")
        self.points: dict[str, int] = {"create-reply": 0, "delay": 0}
        self.helper_kills = 0
        self.mark = 0
        """failures of the runtime seen so far"""
        self.state: dict[str, Any] = {}
        """the plugin's /debug/state at the last check"""

    @property
    def figures(self) -> list[Figure]:
        return [
            self.moved,
            self.lost,
            self.shared,
            self.clos,
            self.hp,
            self.sst,
            self.resets,
            self.slow,
            self.stuck,
            self.unnoticed,
            self.drops,
            self.refused,
            self.stopped,
        ]

    # -- checks after each restart ---------------------------------------------------

    def new_failures(self, ours: int, where: str) -> None:
        """Runtime failures since the last look; ``ours`` "closed" ones are our kills."""
        rt = self.f.rt
        for text in rt.failures[self.mark :]:
            if ours and text == self.f.closed_text:
                ours -= 1
                continue
            self.drops.add(f"{where}: runtime: {text}{self.why()}")
        self.mark = len(rt.failures)
        self.errmark = len(self.errors.lines)

    def why(self) -> str:
        """What the runtime logged since the last look (why it closed the plugin)."""
        lines = self.errors.lines[self.errmark :]
        return f" ({'; '.join(lines)})" if lines else ""

    async def ensure_plugin(self, where: str) -> None:
        """Launch the plugin again if the runtime lost it; a drop."""
        why = await self.f.ensure_plugin()
        if why:
            self.drops.add(f"{where}: {'; '.join(why)}{self.why()}; launched it again")
            self.new_failures(1, where)

    async def check(self, where: str) -> None:
        """The plugin reports it recovered: compare its view with the runtime's
        and the helper's."""
        f = self.f
        await f.recovered()
        state, helper, diff = await f.clos_views()
        self.state = state
        for text in diff:
            self.clos.add(f"{where}: {text}")
        for text in hp_off_clos(state, helper):
            self.hp.add(f"{where}: {text}")
        for text in shared_cpus(state, f.rt):
            self.shared.add(f"{where}: {text}")

    def count_resets(self, where: str, log: int, allowed: int) -> None:
        """SST resets in the helper's log since ``log``; ``allowed`` of them
        programmed an SST that was not in managed state (as the BIOS left it)."""
        resets = self.f.sst_resets(log) - allowed
        if resets > 0:
            self.resets.add(f"{where}: the helper reset a programmed SST {resets} time(s)")

    async def churn_until_killed(self, i: int, kind: str) -> tuple[str, tuple[str, str] | None]:
        """Churn, SIGKILL the plugin at a random point; (the point, the op in flight)."""
        f, rng = self.f, self.rng
        inflight: list[tuple[str, str] | None] = []
        killed = asyncio.Event()

        def kill() -> None:
            if f.plugin_gone:
                self.drops.add(f"before plugin kill {i}: the plugin was gone already{self.why()}")
            inflight.append(self.churn.current)
            f.plugin.kill()
            killed.set()

        stop = asyncio.Event()
        task = asyncio.create_task(self.churn.run(stop))
        try:
            if kind == "create-reply":
                replies = rng.randint(1, 3)
                point = f"at CreateContainer reply {replies}"
                f.rt.arm(replies, kill)
                await f.until(lambda: killed.is_set() or f.plugin_gone, "a create reply", 60)
                if not killed.is_set():
                    kill()
            else:
                delay = rng.uniform(0, MAX_DELAY)
                point = f"{delay * 1000:.0f} ms into the churn"
                await asyncio.sleep(delay)
                kill()
        finally:
            f.rt.disarm()
            stop.set()
            await task
        return point, inflight[0]

    async def plugin_kill(self, i: int) -> None:
        f = self.f
        kind = self.rng.choice(("create-reply", "delay"))
        self.points[kind] += 1
        point, inflight = await self.churn_until_killed(i, kind)
        where = f"plugin kill {i} ({point})"
        await f.kill_plugin()
        balloon = f.balloons(self.state, list(f.plugin.tail))
        before = f.placed()
        log = f.helper_log()
        for why in await f.launch_plugin():
            self.drops.add(f"{where}: restart: {why}")
        await self.check(where)
        self.new_failures(1, where)
        self.count_resets(where, log, allowed=0)
        after = f.placed()
        # a change in flight at the kill may resize its balloon when the new
        # plugin learns of it: those balloons' containers are not compared
        now = f.balloons(self.state, [])
        affected = set()
        if inflight is not None:
            op, name = inflight
            if op == "remove" and name in balloon:
                affected.add(balloon[name])
            if op == "create" and name not in before and name in now:
                affected.add(now[name])
        # so may a container the killed plugin never placed (the churn went on
        # while it was down: the runtime created it unpinned)
        affected |= {bln for name, bln in now.items() if name not in balloon}
        for name, (_, cpus) in sorted(before.items()):
            if balloon.get(name) in affected or now.get(name) in affected:
                continue
            new = after.get(name, ("", "(gone)"))[1]
            if new != cpus:
                self.moved.add(
                    f"{where}: container {pretty(name)} of {balloon.get(name, '?')} moved "
                    f"from cpus {cpus} to {new}"
                )
        for name in f.assigned_again(sorted(before)):
            self.lost.add(
                f"{where}: container {pretty(name)} (cpus {before[name][1]}, "
                f"{balloon.get(name, '?')}) was placed anew by the restarted plugin"
            )

    async def helper_kill(self, i: int) -> None:
        f, churn = self.f, self.churn
        reset = i % 2 == 1
        where = f"helper kill {i}" + (" (SST reset)" if reset else "")
        f.n.helper.kill()
        self.helper_kills += 1
        log = f.helper_log()
        if reset:
            f.n.helper.state.unlink(missing_ok=True)  # SST as the BIOS left it
        loop = asyncio.get_running_loop()
        down = self.rng.uniform(*HELPER_DOWN)
        deadline = loop.time() + down
        churn.helper_down = True
        # the first create needs the helper (a new HP balloon of a whole core:
        # its CLOS association), then the churn goes on
        created: tuple[str, float | None] | None = await churn.create("hp-bln", "2")
        while True:
            if created is not None:
                name, took = created
                late = f"{where}: {pretty(name)} " + (
                    "got no answer" if took is None else f"answered after {took * 1000:.0f} ms"
                )
                if took is None or took > SLOW_CREATE:
                    self.slow.add(late)
                if took is None or took > STUCK_CREATE:
                    self.stuck.add(late)
            if loop.time() >= deadline or f.plugin_gone:
                break
            await asyncio.sleep(self.rng.uniform(0.02, 0.1))
            created = await churn.step(creates=0.7)
        churn.helper_down = False
        if not f.plugin_gone:
            try:
                await f.until_degraded()
            except AssertionError as exc:
                self.unnoticed.add(f"{where}: {exc}")
        await asyncio.to_thread(f.n.helper.start)
        await self.ensure_plugin(where)
        await self.check(where)
        for text in await f.programmed():
            self.sst.add(f"{where}: {text}")
        self.count_resets(where, log, allowed=1 if reset else 0)
        await churn.create()  # and with the helper up again
        await self.ensure_plugin(where)
        self.new_failures(0, where)

    def report(self, seed: int, phases: list[float]) -> str:
        c = self.churn
        down, up = c.answered[True], c.answered[False]
        self.slow.note = (
            f"{len(down)} answered while down, slowest {max(down, default=0) * 1000:.0f} ms; "
            f"helper up: {sum(t > SLOW_CREATE for t in up)} of {len(up)} over "
            f"{SLOW_CREATE * 1000:.0f} ms, slowest {max(up, default=0) * 1000:.0f} ms"
        )
        at = self.points
        return (
            f"fault suite, seed {seed}: {sum(at.values())} plugin kills ({at['create-reply']} at "
            f"a create reply, {at['delay']} at a random delay), {self.helper_kills} helper kills, "
            f"{c.creates} creates, {c.removes} removes\n"
            f"seconds: start {phases[0]:.0f}, plugin kills {phases[1]:.0f}, "
            f"helper kills {phases[2]:.0f}\n" + table(self.figures)
        )


async def test_kill_9_of_plugin_and_helper_under_churn() -> None:
    seed = int(os.environ.get("NRI_FAULT_SEED") or random.SystemRandom().randrange(2**32))
    print(f"fault suite seed {seed} (NRI_FAULT_SEED={seed} repeats this run)")
    rng = random.Random(seed)
    phases = [time.monotonic()]
    with RuntimeErrors() as errors:
        async with node(
            SPEC,
            topology="xeon-6776p",
            runtime=KillPointRuntime,
            plugin_args=("--metrics-address", "127.0.0.1:0"),
        ) as n:
            f = FaultNode(n)
            await f.started()
            suite = Suite(f, rng, errors)
            try:
                for _ in range(6):
                    await suite.churn.create()
                await suite.check("start")
                suite.new_failures(0, "start")
                phases.append(time.monotonic())
                for i in range(1, PLUGIN_KILLS + 1):
                    await suite.plugin_kill(i)
                phases.append(time.monotonic())
                for i in range(1, HELPER_KILLS + 1):
                    await suite.helper_kill(i)
            except (AssertionError, TimeoutError, RuntimeError, OSError, HelperUnavailable) as exc:
                suite.stopped.add(f"{type(exc).__name__}: {exc}")
            phases += [time.monotonic()] * (4 - len(phases))
            suite.refused.found = list(suite.churn.refused)
    report = suite.report(seed, [b - a for a, b in itertools.pairwise(phases)])
    print(report)
    failed = [fig for fig in suite.figures if not fig.ok]
    details = "\n".join(
        f"{fig.name} (goal {fig.goal}, measured {len(fig.found)}):\n  "
        + "\n  ".join(fig.found[:SHOWN])
        + (f"\n  ... and {len(fig.found) - SHOWN} more" if len(fig.found) > SHOWN else "")
        for fig in failed
    )
    if failed:
        pytest.fail(f"{report}\n\n{details}", pytrace=False)

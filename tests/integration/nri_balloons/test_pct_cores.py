"""CLOS is per core (issue #10), end to end: the balloons plugin process, the SST
helper (``nri-sst-helper serve --backend sim``) and the runtime simulator on
the ``pct16`` fixture (2 packages x 4 cores, SMT sibling = cpu + 8; the sim
shaped to it). After a churn of 1-CPU HP and LP pods, and again after a
SIGKILL and restart of the plugin and then of the helper, for every CPU the
CLOS the plugin shows in ``/debug/state``, the CLOS the helper reports
(``GetAssociation``) and the rule applied to the balloons on its core (a core
with an HP thread is on CLOS 0, any other on the LP CLOS 3) agree."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from nri_framework.inspect_cli import fetch_state
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_sst import messages as m
from nri_sst.client import SyncHelperClient
from sst_node import PCT16_SIM, Node, node

DATA = Path(__file__).resolve().parents[2] / "data" / "balloons"

SIM = {**PCT16_SIM, "tf_buckets": [4]}

CONFIG = (DATA / "pct16-cores" / "balloons-config.yaml").read_text()

CPUS = range(16)
_LISTENING = re.compile(r"instrumentation HTTP endpoint listening on 127\.0\.0\.1:(\d+) ")


def core(cpu: int) -> frozenset[int]:
    return frozenset({cpu % 8, cpu % 8 + 8})


async def state_port(plugin: PluginProcess) -> int:
    await plugin.wait_output("instrumentation HTTP endpoint listening on", timeout=20)
    return next(int(mt.group(1)) for line in plugin.tail if (mt := _LISTENING.search(line)))


def helper_clos(n: Node) -> dict[int, int]:
    with SyncHelperClient(n.helper.endpoint, timeout=2.0, client="test") as c:
        return c.call(m.GetAssociation(cpus=list(CPUS)), m.GetAssociationReply).clos


def disagreements(state: dict[str, Any], actual: dict[int, int]) -> list[str]:
    """Every CPU whose CLOS differs between ``/debug/state``, the helper and
    the rule; empty when all agree."""
    policy = state["policy"]
    class_of = {b["name"]: b["cpu_class"] for b in policy["balloons"]}
    rows = {row["cpu"]: row for row in policy["cpus"]}
    hp_cores = {core(c) for c, row in rows.items() if class_of.get(row["balloon"]) == "pct-hp"}
    out = []
    for cpu in CPUS:
        want = 0 if core(cpu) in hp_cores else 3
        shown = rows[cpu].get("clos")
        if not shown == actual[cpu] == want:
            out.append(f"cpu {cpu} ({rows[cpu]['balloon']}): shown {shown}, helper {actual[cpu]}")
    return out


async def settled(n: Node, port: int, timeout: float = 20) -> dict[str, Any]:
    """``/debug/state`` once it agrees with the helper and the rule (the
    plugin programs and associates after a restart); fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        state = await asyncio.to_thread(fetch_state, f"127.0.0.1:{port}")
        wrong = disagreements(state, await asyncio.to_thread(helper_clos, n))
        if not wrong:
            return state
        assert time.monotonic() < deadline, wrong
        await asyncio.sleep(0.2)


def mixed_cores(state: dict[str, Any]) -> dict[frozenset[int], dict[int, str]]:
    """Cores that hold an HP balloon and a balloon of another class: core ->
    cpu -> class."""
    policy = state["policy"]
    class_of = {b["name"]: b["cpu_class"] for b in policy["balloons"]}
    by_core: dict[frozenset[int], dict[int, str]] = {}
    for row in policy["cpus"]:
        if row["balloon"] in class_of:
            by_core.setdefault(core(row["cpu"]), {})[row["cpu"]] = class_of[row["balloon"]]
    return {
        c: classes
        for c, classes in by_core.items()
        if "pct-hp" in classes.values() and set(classes.values()) != {"pct-hp"}
    }


async def test_clos_views_agree_through_churn_and_restarts(tmp_path: Path) -> None:
    sim = tmp_path / "sim-config.json"
    sim.write_text(json.dumps(SIM))
    async with node(
        CONFIG,
        topology="pct16",
        helper_args=("--sim-config", str(sim)),
        plugin_args=("--metrics-address", "127.0.0.1:0"),
    ) as n:
        port = await state_port(n.plugin)
        await n.plugin.wait_output("balloons policy started", timeout=20)
        await settled(n, port)
        for i in range(6):
            await n.create(f"hp{i}", "hp-bln", cpu="1")
            await n.create(f"lp{i}", "lp-bln", cpu="1")
            assert mixed_cores(await settled(n, port)) == {}
        for name in ("hp1", "lp2", "hp4"):
            await n.delete(name)
            await settled(n, port)
        for name, balloon in (("hp6", "hp-bln"), ("lp6", "lp-bln"), ("hp7", "hp-bln")):
            await n.create(name, balloon, cpu="1")
            assert mixed_cores(await settled(n, port)) == {}
        # 9 HP and 6 LP 1-CPU pods and the reserved CPU on 16 CPUs: one core
        # holds an HP and another thread; it is on CLOS 0, and logged
        for name in ("hp8", "hp9", "hp10"):
            await n.create(name, "hp-bln", cpu="1")
        state = await settled(n, port)
        ((mixed, classes),) = mixed_cores(state).items()
        hp_cpu, other = sorted(classes, key=lambda c: classes[c] != "pct-hp")
        logged = [
            x
            for x in n.lines("share a core; SST associates whole cores: the core is on CLOS 0")
            if f'cpus {hp_cpu} (cpuClass "pct-hp", CLOS 0) and {other} (cpuClass ' in x
        ]
        assert logged and ("WARNING" in logged[-1]) == (classes[other] == "pct-lp"), logged

        # SIGKILL of the plugin: the restarted one restores its balloons and
        # associates every core again
        # no wait: each decision is journaled before its reply (nri_framework.journal)
        n.plugin.kill()
        await n.plugin.proc.wait()
        n.plugin = await PluginProcess.launch(n.cmd)
        await wait_registered(n.rt, n.plugin, 20)
        port = await state_port(n.plugin)
        await n.plugin.wait_output("synchronized 15 pod(s), 15 container(s)", 20)
        assert mixed_cores(await settled(n, port)) == {mixed: classes}

        # SIGKILL of the helper, started again on the SST state it left, then
        # on SST as the BIOS left it: the plugin programs it and every core again
        for reset in (False, True):
            seen = len(n.lines("pct: SST helper reconnected"))
            n.helper.kill()
            if reset:
                n.helper.state.unlink()
            n.helper.start()
            await n.plugin.wait_output("pct: SST helper reconnected", 20, count=seen + 1)
            assert mixed_cores(await settled(n, port)) == {mixed: classes}

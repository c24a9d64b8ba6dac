"""Priority Core Turbo end to end, as the spec walks it (steps 4-6, 9.2): the
balloons plugin process and the SST helper (`nri-sst-helper serve --backend
sim`, the Xeon 6776P model) as real processes over a real ZeroMQ socket, the
6776P sysfs fixture, the spec's BalloonsPolicy and pods from
examples/pct-managed/ through the runtime simulator. SST state is read back
from the helper over its socket; C-states from the files the helper wrote."""

from __future__ import annotations

import re
from pathlib import Path

from nri_balloons_demo.pct_managed import PCT_LINES
from nri_framework import cpuset
from nri_sst import messages as m
from nri_sst.backends.sim import SimBackend
from nri_sst.client import SyncHelperClient
from nri_sst.handler import RequestHandler
from sst_node import Node, node

EXAMPLES = Path(__file__).parents[3] / "examples" / "pct-managed"
SPEC = (EXAMPLES / "balloons-pct-managed.yaml").read_text()
PCT_LINE = re.compile(r"pct(:| mock:)|associated cpus .* to CLOS")


def pct_lines(n: Node, since: int = 0) -> list[str]:
    """What ``grep -E 'pct(:| mock:)|associated cpus .* to CLOS'`` shows (step 6.1),
    without the timestamp/level/logger prefix."""
    out = []
    for line in list(n.plugin.tail)[since:]:
        if PCT_LINE.search(line):
            out.append(line.split(": ", 1)[1] if " cpuclass: " in line else line)
    return out


def punit(cpu: int) -> tuple[int, int]:
    """sst.md §5.2: the 6776P's CPU -> (package, punit)."""
    return (cpu % 128) // 64, (cpu % 64) // 32


def sst(n: Node) -> SyncHelperClient:
    return SyncHelperClient(n.helper.endpoint, timeout=2.0, client="test")


def clos_of(n: Node, cpus: set[int] | list[int]) -> dict[int, int]:
    with sst(n) as c:
        return c.call(m.GetAssociation(cpus=sorted(cpus)), m.GetAssociationReply).clos


def punits_state(n: Node) -> list[m.PunitInfo]:
    with sst(n) as c:
        reply = c.call(m.Discover(), m.DiscoverReply)
    return [pu for pkg in reply.packages for pu in pkg.punits]


async def spec_pods(n: Node) -> tuple[list[set[int]], set[int]]:
    hp = [await n.create_from(f"pct-hp-{i}", EXAMPLES / f"pod-hp-{i}.yaml") for i in range(1, 5)]
    lp = await n.create_from("pct-lp", EXAMPLES / "pod-lp.yaml")
    return hp, lp


async def test_spec_walkthrough_managed_mode() -> None:
    async with node(SPEC, topology="xeon-6776p") as n:
        await n.plugin.wait_output("balloons policy started", timeout=20)
        # step 4: the managed-mode lines, in order
        lines = pct_lines(n)
        positions = [lines.index(x) for x in PCT_LINES]  # the spec's step 4, as the demo shows
        assert positions == sorted(positions), lines
        assert lines[0].startswith("pct: SST discovered: pkg=0 punit=0 level=0 cpus=0-31,128-159")
        # log.debug [policy, cpu] shows what upstream hides under "cpuclass" (§20.4)
        assert any("PrepareManagedMode done" in x for x in lines), lines
        assert any("EnableCP done" in x for x in lines), lines

        mark = n.mark()
        hp, lp = await spec_pods(n)
        # step 6.5 / 6.4: four 2-CPU HP balloons on four distinct punits, LP of 8
        assert [len(c) for c in hp] == [2, 2, 2, 2] and len(lp) == 8
        assert len({punit(c) for cpus in hp for c in cpus}) == 4
        assert all(len({punit(c) for c in cpus}) == 1 for cpus in hp)
        # step 6.1: one association per admitted pod, with the pod's CPUs
        lp_line = f"pct: associated cpus {cpuset.format(cpuset.from_ids(lp))} to CLOS 3"
        await n.plugin.wait_output(lp_line, timeout=5)
        assoc = [x for x in pct_lines(n, mark) if "associated cpus" in x]
        for cpus in hp:
            assert f"pct: associated cpus {cpuset.format(cpuset.from_ids(cpus))} to CLOS 0" in assoc
        assert f"pct: associated cpus {cpuset.format(cpuset.from_ids(lp))} to CLOS 3" in assoc
        assert sum(x.endswith("to CLOS 0") for x in assoc) == 4, assoc
        assert sum(x.endswith("to CLOS 3") for x in assoc) == 1, assoc
        # step 6.3: CLOS 0 on HP CPUs, CLOS 3 on LP and idle CPUs
        all_hp = set().union(*hp)
        clos = clos_of(n, list(range(256)))
        assert {c for c, k in clos.items() if k == 0} == all_hp
        assert {c for c, k in clos.items() if k == 3} == set(range(256)) - all_hp
        # step 6.2: CP enabled + ordered, TF enabled, CLOS bounds, on every punit
        for pu in punits_state(n):
            assert pu.cp.enabled and pu.cp.priority == "ordered", pu
            assert pu.tf.enabled, pu
            bounds = {c.clos: (c.min_khz, c.max_khz) for c in pu.clos}
            assert bounds[0] == (2_300_000, 4_600_000) and bounds[3] == (800_000, 2_300_000)
        # step 4: C6/C6P disabled exactly on the HP CPUs
        for cpu in range(256):
            assert n.disabled(cpu) == ({"C6", "C6P"} if cpu in all_hp else set()), cpu

        # freed HP CPUs: back to the LP CLOS, C-states enabled again
        await n.delete("pct-hp-1")
        await n.plugin.wait_output(
            f"pct: associated cpus {cpuset.format(cpuset.from_ids(hp[0]))} to CLOS 3", timeout=5
        )
        assert set(clos_of(n, hp[0]).values()) == {3}
        for cpu in hp[0]:
            assert n.disabled(cpu) == set()

        # step 9.2: SIGTERM of the helper disables every SST feature again
        await n.plugin.stop()
        n.helper.stop()
        after = RequestHandler(SimBackend(state_file=n.helper.state), n.host_root)
        after.dispatch(m.Hello(protocol=1), b"t")
        reply = after.dispatch(m.Discover(), b"t")
        assert isinstance(reply, m.DiscoverReply)
        for pkg in reply.packages:
            for pu in pkg.punits:
                assert not pu.cp.enabled and not pu.tf.enabled, pu


async def test_restarted_helper_is_programmed_again() -> None:
    async with node(SPEC, topology="xeon-6776p") as n:
        hp = await n.create_from("pct-hp-1", EXAMPLES / "pod-hp-1.yaml")
        fallback = "pct: fallback CLOS for non-PCT CPUs set to 3 (LP)"
        programmed = len(n.lines(fallback))
        assert programmed == 1  # once, though Synchronize sets the configuration again
        n.helper.kill()  # no teardown: a crash
        n.helper.state.unlink()  # and the hardware as the BIOS left it
        n.helper.start()
        await n.plugin.wait_output("pct: SST helper reconnected; programming SST state again", 15)
        await n.plugin.wait_output(fallback, 10, count=2)
        await n.plugin.wait_output(
            f"pct: associated cpus {cpuset.format(cpuset.from_ids(hp))} to CLOS 0", 10, count=2
        )
        assert all(pu.cp.enabled and pu.tf.enabled for pu in punits_state(n))
        clos = clos_of(n, list(range(256)))
        assert {c for c, k in clos.items() if k == 0} == hp


async def test_dead_helper_degrades_pct_not_containers() -> None:
    async with node(SPEC, topology="xeon-6776p") as n:
        n.helper.kill()
        hp = await n.create_from("pct-hp-1", EXAMPLES / "pod-hp-1.yaml")
        assert len(hp) == 2  # created and pinned without the helper
        await n.plugin.wait_output("pct: SST helper unavailable:", timeout=5)
        n.helper.start()
        await n.plugin.wait_output("pct: SST helper is back", timeout=20)
        clos = clos_of(n, list(range(256)))
        assert {c for c, k in clos.items() if k == 0} == hp
        assert all(n.disabled(c) == {"C6", "C6P"} for c in hp)


async def test_plugin_restart_keeps_placement_and_clos() -> None:
    """SIGKILL of the plugin: the restarted one restores its balloons from the
    state dir, programs SST again and every CPU ends on the same CLOS."""
    from nri_framework.simulate.scenario import PluginProcess, wait_registered

    async with node(SPEC, topology="xeon-6776p") as n:
        hp, lp = await spec_pods(n)
        before = clos_of(n, list(range(256)))
        # no wait: each decision is journaled before its reply (nri_framework.journal)
        n.plugin.kill()
        await n.plugin.proc.wait()
        n.plugin = await PluginProcess.launch(n.cmd)
        await wait_registered(n.rt, n.plugin, 20)
        await n.plugin.wait_output("synchronized 5 pod(s), 5 container(s)", 20)
        await n.plugin.wait_output("to CLOS 3", 20)  # after the restore
        # nothing associated before the Synchronize named the running
        # containers (their CPUs would have gone to the idle class meanwhile)
        log = list(n.plugin.tail)
        first = next(i for i, line in enumerate(log) if "to CLOS" in line)
        restored = f'on CPUs "{cpuset.format(cpuset.from_ids(hp[0]))}" of "hp-bln[0]"'
        assert any(restored in line for line in log[:first]), log[first]
        assert "CPReset" not in "".join(log)  # SST kept as the killed plugin left it
        names = [f"pct-hp-{i}" for i in range(1, 5)] + ["pct-lp"]
        for name, cpus in zip(names, [*hp, lp], strict=True):
            c = n.rt.container(n.containers[name])
            assert c.resources and c.resources.cpu
            assert set(cpuset.ids(cpuset.parse(c.resources.cpu.cpus))) == cpus
        assert clos_of(n, list(range(256))) == before

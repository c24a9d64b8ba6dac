"""CPU priorities from SST read through a real SST helper process (sim
backend, over its ZeroMQ socket) in assoc-only state: the BIOS's or operator's
programming the plugin only reads (the sim's ``bios-pct-on``: SST-CP on with
ordered priority, SST-TF on, the first two cores of each punit on CLOS 0, the
others on CLOS 2), moved further by an operator's association; the plugin's
start-up discovery (:func:`nri_balloons.cpupriority.discover`) ranks CLOS 0-1
high and the rest low (the SST-TF rule), as upstream's cpuallocator does."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from balloons_e2e import plugin_command, until
from nri_balloons.cpuallocator import CpuAllocator
from nri_balloons.cpupriority import DISCOVER_RETRY, CpuPriority, cpu_priorities, discover
from nri_balloons.sstlink import Budget, HelperWriter
from nri_framework import cpuset
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import PCT16
from nri_framework.topology import Topology
from nri_sst import messages as m
from nri_sst.client import SyncHelperClient
from sst_node import PCT16_SIM, Helper, Node

SIM = {**PCT16_SIM, "profile": "bios-pct-on"}


def test_assoc_only_sst_cp_ranks_the_cpus(tmp_path: Path) -> None:
    root = write_topology(tmp_path / "host", PCT16)
    config = tmp_path / "sim-config.json"
    config.write_text(json.dumps(SIM))
    helper = Helper(tmp_path, root, ("--sim-config", str(config)))
    helper.start()
    try:
        with SyncHelperClient(helper.endpoint, timeout=2.0, client="operator") as op:
            # the operator moves core 1 of package 0 (CPUs 1 and 9) to CLOS 2
            op.call(m.AssociateCpus(clos=2, cpus=[1]), m.AssociateCpusReply)
        topo = Topology.from_sysfs(root)
        writer = HelperWriter(helper.endpoint)
        try:
            prios = discover(topo, writer)
        finally:
            writer.close()
    finally:
        helper.stop()
    assert cpuset.format(prios[CpuPriority.HIGH]) == "0,4-5,8,12-13"
    assert cpuset.format(prios[CpuPriority.NORMAL]) == ""
    assert cpuset.format(prios[CpuPriority.LOW]) == "1-3,6-7,9-11,14-15"
    # a high-priority pick takes the CLOS 0 cores
    alloc = CpuAllocator(topo, prios)
    assert alloc.allocate(topo.online, 2, CpuPriority.HIGH) & ~prios[CpuPriority.HIGH] == 0


def test_a_helper_that_starts_after_the_plugin_is_waited_for(tmp_path: Path) -> None:
    """The sidecar starts beside the plugin: the start-up discovery begins while
    the helper's socket is not there yet, asks again while its budget lasts, and
    takes SST's priorities once the helper answers (not cpufreq's)."""
    root = write_topology(tmp_path / "host", PCT16)
    config = tmp_path / "sim-config.json"
    config.write_text(json.dumps(SIM))
    helper = Helper(tmp_path, root, ("--sim-config", str(config)))
    topo = Topology.from_sysfs(root)
    writer = HelperWriter(helper.endpoint, timeout=0.2)
    attempts: list[float] = []
    started = threading.Event()

    def pause(seconds: float) -> None:
        attempts.append(seconds)
        if len(attempts) == 3:  # the helper comes up after the plugin has asked twice
            helper.start()
            started.set()
        time.sleep(seconds)

    try:
        prios = discover(topo, writer, Budget(30.0), pause)  # 30 s: a liveness bound
    finally:
        writer.close()
        helper.stop()
    assert started.is_set() and len(attempts) >= 3, attempts
    assert prios != cpu_priorities(topo)  # not the cpufreq source
    assert cpuset.format(prios[CpuPriority.HIGH]) == "0-1,4-5,8-9,12-13"  # CLOS 0 cores


def test_no_helper_ever_is_cpufreq_once_the_budget_is_spent(tmp_path: Path) -> None:
    """No helper comes: cpufreq's priorities when the budget is spent, after
    attempts every DISCOVER_RETRY seconds (clock and pause injected)."""
    topo = topology_of(tmp_path)
    now = [0.0]
    waits: list[float] = []

    def pause(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    writer = HelperWriter(f"ipc://{tmp_path}/absent.sock", timeout=0.05)
    try:
        prios = discover(topo, writer, Budget(1.0, clock=lambda: now[0]), pause)
    finally:
        writer.close()
    assert prios == cpu_priorities(topo)
    assert waits and set(waits) == {DISCOVER_RETRY} and sum(waits) <= 1.0


def topology_of(tmp_path: Path) -> Topology:
    return Topology.from_sysfs(write_topology(tmp_path / "host", PCT16))


LATE_CONFIG = """
reservedResources: {cpu: "cpuset:15"}
balloonTypes:
- {name: hp, preferCoreType: performance}
- {name: hp-later, preferCoreType: performance}
"""


async def test_a_helper_that_comes_after_the_start_budget_gives_later_allocations_its_priorities(
    tmp_path: Path,
) -> None:
    """The helper is away for the whole start budget (2 s): the plugin starts on
    cpufreq's priorities and asks the helper again in the background, off the
    reply path. Once a real helper is there it reads SST once, says so, and the
    allocations from then on take SST's high-priority CPUs (``preferCoreType:
    performance``: the allocator's high priority CPUs, none with cpufreq's on
    this fixture); a balloon made before keeps its CPUs. (The SST state is the
    operator's, set on the sim before: only core 3 of package 0, CPUs 3 and 11,
    on CLOS 0.)"""
    root = write_topology(tmp_path / "host", PCT16)
    config = tmp_path / "sim-config.json"
    config.write_text(json.dumps(SIM))
    helper = Helper(tmp_path, root, ("--sim-config", str(config)))
    helper.start()
    try:
        with SyncHelperClient(helper.endpoint, timeout=2.0, client="operator") as op:
            op.call(m.AssociateCpus(clos=2, cpus=list(range(16))), m.AssociateCpusReply)
            op.call(m.AssociateCpus(clos=0, cpus=[3]), m.AssociateCpusReply)
    finally:
        helper.stop()  # the sim keeps its state in its state file
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(LATE_CONFIG)
    async with SimulatedRuntime(tmp_path / "nri.sock") as rt:
        cmd = plugin_command(tmp_path / "nri.sock", root, tmp_path / "state", cfg)
        plugin = await PluginProcess.launch([*cmd, "--sst-helper", helper.endpoint])
        n = Node(rt, plugin, helper, root, tmp_path)
        try:
            await wait_registered(rt, plugin, 20)
            early = await n.create("early", "hp", cpu="1")
            assert not early & {3, 11}, early  # cpufreq's priorities: none high
            helper.start()
            await until(
                lambda: bool(n.lines("SST status read from the SST helper after start")),
                "the late SST discovery",
                30,  # a liveness bound
            )
            late = await n.create("late", "hp-later", cpu="1")
            assert late <= {3, 11}, late  # SST's high priority CPUs
            assert n.cpus("early") == early  # an existing balloon does not move
        finally:
            await plugin.stop()
            helper.stop()

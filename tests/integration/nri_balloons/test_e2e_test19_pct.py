"""Upstream e2e test19-pct (reference §18), through the runtime simulator with
the balloons plugin and the SST helper as real processes. Upstream runs on
n4c16 with a mock SST seeded with 2 packages, 2 HP CPUs per package, and
cpufreq base 2.9 / min 0.8 / max 3.8 GHz; here the helper's sim backend is
configured to that shape (``--sim-config``) on the ``pct16`` sysfs fixture
(n4c16's size, the sim's CPU numbering). The extended-resource
reconciliation phase of test19 needs the Kubernetes agent: it is in the k8s
tier; the capacity figure itself is checked here through the policy."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from balloons_e2e import plugin_command
from nri_framework import cpuset
from nri_sst import messages as m
from nri_sst.client import SyncHelperClient
from sst_node import PCT16_SIM, Node, node

SIM = PCT16_SIM

MANAGED = """
reservedResources: {cpu: 750m}
pinCPU: true
balloonTypes:
- name: hp-bln
  cpuClass: pct-hp
  maxCPUs: 2
- name: hp2-bln
  cpuClass: pct-hp
  maxCPUs: 2
- name: lp-bln
  cpuClass: pct-lp
cpuClasses:
- name: pct-hp
  pctPriority: high
  pctMinFreq: turbo
  pctMaxFreq: turbo
  publishExtendedResource: true
- name: pct-lp
  pctPriority: low
  pctMinFreq: min
  pctMaxFreq: base
log:
  debug: [cpu]
"""

ASSOC_ONLY = """
reservedResources: {cpu: 750m}
balloonTypes:
- name: hp-bln
  cpuClass: clos1
cpuClasses:
- {name: clos1, sstClosID: 1}
log:
  debug: [cpu]
"""

INVALID = """
reservedResources: {cpu: 750m}
cpuClasses:
- {name: both, pctPriority: high, sstClosID: 1}
"""


def package(cpu: int) -> int:
    return (cpu % 8) // 4  # the sim model: 2 packages x 4 cores, SMT sibling = cpu + 8


def sim_config(tmp_path: Path) -> tuple[str, ...]:
    path = tmp_path / "sim-config.json"
    path.write_text(json.dumps(SIM))
    return ("--sim-config", str(path))


def clos_of(n: Node, cpus: set[int]) -> set[int]:
    with SyncHelperClient(n.helper.endpoint, timeout=2.0, client="test") as c:
        return set(c.call(m.GetAssociation(cpus=sorted(cpus)), m.GetAssociationReply).clos.values())


def assoc(cpus: set[int], clos: int) -> str:
    return f"pct: associated cpus {cpuset.format(cpuset.from_ids(cpus))} to CLOS {clos}"


async def test_managed(tmp_path: Path) -> None:
    async with node(MANAGED, topology="pct16", helper_args=sim_config(tmp_path)) as n:
        out = n.plugin.output()
        assert "pct: PrepareManagedMode done" in out
        assert re.search(r"ConfigureClos.*ClosID:0 MinFreq:3800000 MaxFreq:3800000", out)
        assert re.search(r"ConfigureClos.*ClosID:3 MinFreq:800000 MaxFreq:2900000", out)
        assert "pct: EnableCP done" in out
        assert "maxHpCpus=2 guaranteedHpCpus=2" in out

        # T1.1: an HP pod: CLOS 0, on the package with more free CPUs (the
        # reserved balloon holds a CPU of package 0)
        hp = await n.create("hp1", "hp-bln", cpu="1")
        await n.plugin.wait_output(assoc(hp, 0), timeout=5)
        assert clos_of(n, hp) == {0}
        (hp_pkg,) = {package(c) for c in hp}
        assert hp_pkg == 1

        # T1.2: an LP pod: CLOS 3, away from the package that hosts HP CPUs
        lp = await n.create("lp1", "lp-bln", cpu="2")
        await n.plugin.wait_output(assoc(lp, 3), timeout=5)
        assert clos_of(n, lp) == {3}
        assert {package(c) for c in lp} == {1 - hp_pkg}

        # T1.3: a second HP type goes to the package with more HP room
        hp2 = await n.create("hp2", "hp2-bln", cpu="1")
        await n.plugin.wait_output(assoc(hp2, 0), timeout=5)
        assert {package(c) for c in hp2} == {1 - hp_pkg}

        # T1.3b: the HP balloon grows: its new CPU is associated to CLOS 0
        grown = await n.create("hp1b", "hp-bln", cpu="1")
        assert grown and len(grown | hp) == 2
        await n.plugin.wait_output(assoc(hp | grown, 0), timeout=5)
        assert clos_of(n, hp | grown) == {0}

        # T1.4: freed CPUs go back to the LP fallback CLOS
        await n.delete("hp2")
        await n.plugin.wait_output(assoc(hp2, 3), timeout=5)
        assert clos_of(n, hp2) == {3}


async def test_assoc_only(tmp_path: Path) -> None:
    async with node(ASSOC_ONLY, topology="pct16", helper_args=sim_config(tmp_path)) as n:
        cpus = await n.create("a", "hp-bln", cpu="1")
        await n.plugin.wait_output(assoc(cpus, 1), timeout=5)
        assert clos_of(n, cpus) == {1}
        out = n.plugin.output()
        assert "pct: mode=assoc-only" in out
        assert "PrepareManagedMode done" not in out
        assert "EnableCP done" not in out


async def test_invalid_config_fails_the_plugin(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(INVALID)
    cmd = plugin_command(tmp_path / "nri.sock", Path("/"), tmp_path / "state", cfg)
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode != 0
    assert b"mutually exclusive" in out, out.decode()


def test_extended_resource_capacity_is_two_per_package(tmp_path: Path) -> None:
    """test19's `cpuclass.balloons.nri.io/pct-hp` = 4 (2 packages x 2)."""
    from nri_balloons.configyaml import load_policy
    from nri_balloons.extres import extended_resources
    from nri_balloons.policy import BalloonsPolicy
    from nri_balloons.sstlink import HelperWriter
    from nri_balloons.validation import validate
    from nri_framework.simulate.sysfs import write_topology
    from nri_framework.topology import Topology
    from sst_node import Helper

    root = write_topology(tmp_path / "host", "pct16")
    helper = Helper(tmp_path, root, sim_config(tmp_path))
    helper.start()
    try:
        topo = Topology.from_sysfs(str(root))
        policy = BalloonsPolicy(topo, str(root), writer=HelperWriter(helper.endpoint, 2.0))
        result = validate(load_policy(MANAGED), online_cpus=topo.online)
        assert result.prepared is not None
        policy.set_config(result.prepared)
        assert policy.cpu_classes.commit()
        assert extended_resources(policy) == {
            "cpuclass.balloons.nri.io/*": None,
            "cpuclass.balloons.nri.io/pct-hp": 4,
        }
        policy.cpu_classes.close()
    finally:
        helper.stop()

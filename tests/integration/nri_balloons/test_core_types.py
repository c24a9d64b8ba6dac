"""``preferCoreType`` on a hybrid part with one base frequency (the hybrid12
fixture: P-cores 0-3, E-cores 4-11, every CPU at base 2.0 GHz) whose CPU
priorities come from SST: the real balloons plugin and a real SST helper
(sim backend) in assoc-only state (its ``bios-pct-on`` profile: SST-CP and
SST-TF on, CPUs 0-1 on CLOS 0, the others on CLOS 2), over the runtime
simulator. As upstream, ``performance cores`` are the allocator's high
priority CPUs (SST-TF: CLOS 0-1, so CPUs 0-1), not the kernel's P-core list:
the ``fast`` balloon takes one of them, and the reserved and default balloons,
which avoid what another type prefers, stay on the other P-cores instead of
being pushed onto the E-cores."""

from __future__ import annotations

import json
from pathlib import Path

from nri_framework import cpuset
from sst_node import node

SIM = {
    "packages": 1,
    "punits_per_package": 1,
    "cores_per_punit": 12,
    "threads_per_core": 1,
    "base_mhz": 2000,
    "p0_mhz": 4000,
    "cpuinfo_max_khz": 4_000_000,
    "tf_buckets": [2],
    "tf_mhz": [4000],
    "lp_clip_mhz": 2000,
    "profile": "bios-pct-on",
}

CONFIG = """
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata: {name: default}
spec:
  reservedResources: {cpu: "1"}
  balloonTypes:
  - {name: fast, preferCoreType: performance, minBalloons: 1, minCPUs: 1}
  - {name: default, minBalloons: 1, minCPUs: 1}
"""

E_CORES = cpuset.parse("4-11")


async def test_sst_high_cpus_are_the_performance_cores(tmp_path: Path) -> None:
    config = tmp_path / "sim.json"
    config.write_text(json.dumps(SIM))
    async with node(CONFIG, topology="hybrid12", helper_args=("--sim-config", str(config))) as n:
        fast = await n.create("fast", "fast", cpu="500m")
        reserved = await n.create("sys", "reserved", cpu="100m")
        default = await n.create("dflt", "default", cpu="100m")
    assert fast <= {0, 1}, fast  # SST-TF's high priority CPUs
    for name, cpus in (("reserved", reserved), ("default", default)):
        assert cpus and not cpus & set(cpuset.ids(E_CORES)), (name, cpus)
        assert not cpus & {0, 1}, (name, cpus)  # they avoid the performance cores

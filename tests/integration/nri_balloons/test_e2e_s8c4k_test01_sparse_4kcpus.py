"""Upstream e2e balloons/s8c4k/test01-sparse-4kcpus: sparse CPU ids (online
0-2,511,1535,4095 on 8 packages, one NUMA node each) with preferCloseToDevices
on NUMA nodes and shared idle CPUs in the package; the NRT capacity and
allocatable of the pre-created balloons.

The NRT checks read :meth:`BalloonsPolicy.zones` of a policy set up on the
same host root and configuration (the simulator has no NRT agent).
"""

from __future__ import annotations

from balloons_e2e import node
from nri_balloons import nrt
from nri_balloons.configyaml import load_policy
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import validate
from nri_framework.topology import Topology

TEST = "s8c4k-test01-sparse-4kcpus"


async def test_sparse_4kcpus() -> None:
    async with node(TEST, "balloons.yaml", topology="s8c4k") as n:
        # NRT (nrt-verify-zone-resource / -attribute)
        topo = Topology.from_sysfs(n.host_root)
        prepared = validate(load_policy(n.config.read_text()), online_cpus=topo.online).prepared
        assert prepared is not None
        policy = BalloonsPolicy(topo, str(n.host_root))
        policy.set_config(prepared)
        zones = {z.name: z for z in nrt.zones(policy, lambda cid: ("", ""))}
        cpu = {name: z.resources[0] for name, z in zones.items()}
        assert (cpu["reserved[0]"].capacity, cpu["reserved[0]"].allocatable) == ("6", "5")
        assert (cpu["pkg7[0]"].capacity, cpu["pkg7[0]"].allocatable) == ("6", "1")
        attrs = {a.name: a.value for a in zones["pkg7[0]"].attributes}
        assert attrs["cpuset"] == "4095"

        # The e2e cluster runs kube-system pods (etcd, coredns, ...) which
        # inflate the reserved balloon (minCPUs 0 with a cpuset and no
        # maxCPUs, reference §20.6) onto its cpuset: CPU 1 is not idle below.
        await n.start_system_pods()
        assert n.cpus("etcd") == {1}
        # one BestEffort pod, each container annotated to its own type
        await n.create("pod0.yaml")
        assert n.cpus("pod0c0") == {511, 2, 0}  # 1 CPU + idle CPUs of package 0
        assert n.cpus("pod0c1") == {1535}
        assert n.cpus("pod0c2") == {4095}
        assert n.balloon("pod0c0") == "pkg0[0]"
        assert n.balloon("pod0c1") == "pkg2[0]"
        assert n.balloon("pod0c2") == "pkg7[0]"

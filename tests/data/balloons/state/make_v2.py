"""Make tests/data/balloons/state/v2-n4c16.state.json with the policy code of
commit cfd6d95, state version 2 (run with that commit's code first on sys.path)."""

import sys
import tempfile
from pathlib import Path

import msgspec
from nri_balloons.configyaml import load_policy
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import validate
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.sysfs import write_topology
from nri_framework.statefile import SavedState
from nri_framework.topology import Topology

out = Path(sys.argv[1])
topo = Topology.from_sysfs(write_topology(Path(tempfile.mkdtemp()), "n4c16"))
prepared = validate(load_policy((out / "config.yaml").read_text()), online_cpus=topo.online)
assert prepared.prepared is not None, prepared.errors
policy = BalloonsPolicy(topo)
policy.set_config(prepared.prepared)
pods: dict[str, Pod] = {}
containers: dict[str, Container] = {}
# (namespace, app label, containers, mCPU each)
for i, (ns, app, n, milli) in enumerate(
    [
        ("grouped", "web", 2, 500),
        ("grouped", "web", 1, 1000),
        ("grouped", "db", 1, 1500),
        ("spread", "", 1, 2000),
        ("dedicated", "", 2, 1000),
        ("dedicated", "", 1, 0),
        ("default", "", 1, 250),
    ]
):
    pod = Pod(
        id=f"pod{i}",
        name=f"pod{i}",
        namespace=ns,
        uid=f"uid{i}",
        labels={"app": app} if app else {},
        cgroup_parent=f"/kubepods/burstable/poduid{i}",
    )
    pods[pod.id] = pod
    for j in range(n):
        shares = max(2, milli * 1024 // 1000)
        cpu = CpuResources(shares=shares, quota=milli * 100 if milli else 0, period=100_000)
        c = Container(
            id=f"pod{i}c{j}", pod_sandbox_id=pod.id, name=f"c{j}", resources=Resources(cpu=cpu)
        )
        bln = policy.allocate(pod, c)
        assert bln is not None
        containers[c.id] = c
pins = policy.pinning(pods.get)
for cid, (cpus, mems) in pins.items():
    c = containers[cid]
    res = c.resources
    containers[cid] = msgspec.structs.replace(
        c,
        resources=msgspec.structs.replace(
            res, cpu=msgspec.structs.replace(res.cpu, cpus=cpus, mems=mems)
        ),
    )
state = SavedState(
    policy="balloons", seq=0, pods=pods, containers=containers, policy_state=policy.export()
)
(out / "v2-n4c16.state.json").write_bytes(msgspec.json.format(msgspec.json.encode(state)) + b"\n")
placed = {cid: [bln.name, pins[cid][0], pins[cid][1]] for cid, bln in policy.owner.items()}
(out / "v2-n4c16.placement.json").write_bytes(
    msgspec.json.format(msgspec.json.encode(dict(sorted(placed.items())))) + b"\n"
)

"""A decision's updates are computed from what it changed (issue #14: a
decision touches what changes, not the node): after every step of seeded random
decision sequences (create, stop, remove, a pod sent anew, a configuration
reload, a reconnect that restores the saved state) the plugin answers exactly
what comparing every container's pin gives.

The oracle is the comparison the plugin made before: the whole pinning computed
from scratch and compared with every pin sent (:class:`FullComparison`, ours,
a subclass of the real plugin differing in that alone). Both run the same
sequence on their own :class:`PolicyHost` over the same sysfs tree."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace
from nri_balloons.plugin import Balloons
from nri_framework.hookspecs import PolicyError
from nri_framework.host import SENT_PODS_MAX, PolicyHost
from nri_framework.model import (
    Container,
    ContainerState,
    CpuResources,
    MemoryResources,
    Pod,
    Resources,
    Update,
    cpu_pin,
)
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import N6_HBM_CXL

M = 1 << 20
HIDE = "hide-hyperthreads.resource-policy.nri.io/pod"
MEMTYPE = "memory-type.resource-policy.nri.io/pod"
PRESERVE = "memory.preserve.resource-policy.nri.io/pod"

CONFIG = """
reservedResources: {cpu: "cpuset:0"}
pinMemory: true
balloonTypes:
- {name: hbm, namespaces: [hbm], minCPUs: 1, maxCPUs: 2, maxBalloons: 2, memoryTypes: [HBM],
   preferNewBalloons: true}
- {name: shared, namespaces: [shared], shareIdleCPUsInSame: package, maxBalloons: 2}
- {name: fixed, namespaces: [fixed], minCPUs: 2, maxCPUs: 2, maxBalloons: 1, pinMemory: false}
- {name: grow, namespaces: [grow], maxCPUs: 3, minBalloons: 1, hideHyperthreads: %(hide)s}
"""
NAMESPACES = ("hbm", "shared", "fixed", "grow", "default")


class FullComparison(Balloons):
    """The oracle: every pin computed and compared, as before issue #14."""

    def _updates(self, skip: str = "") -> list[Update]:
        assert self.policy is not None and self.host is not None
        self.host.take_sent_pods()
        now = self.policy._pinning(self.host.pods.get, reuse=False)
        updates = [
            Update(container_id=cid, resources=cpu_pin(*pin))
            for cid, pin in now.items()
            if cid != skip and self.pins.get(cid) != pin
        ]
        self.pins = now
        return updates


def make_host(root: Path, plugin: Balloons, config: Path) -> PolicyHost:
    host = PolicyHost("balloons", plugin, options={"config_file": str(config)}, host_root=str(root))
    host.synchronize([], [])
    return host


def new_pod(rnd: random.Random, n: int) -> Pod:
    ns = rnd.choice(NAMESPACES)
    return Pod(
        id=f"pod{n}",
        name=f"pod{n}",
        namespace=ns,
        uid=f"uid{n}",
        cgroup_parent=f"/kubepods/burstable/pod{n}",
        annotations=annotations(rnd),
    )


def annotations(rnd: random.Random) -> dict[str, str]:
    out = {}
    if rnd.random() < 0.2:
        out[HIDE] = rnd.choice(("true", "false"))
    if rnd.random() < 0.15:
        out[MEMTYPE] = rnd.choice(("hbm", "dram", "pmem,dram"))
    if rnd.random() < 0.1:
        out[PRESERVE] = "true"
    return out


def new_container(rnd: random.Random, pod: Pod, n: int) -> Container:
    milli = rnd.choice((0, 100, 500, 1000, 1500))
    limit = rnd.choice((0, 0, 300, 700, 1500)) * M
    return Container(
        id=f"c{n}",
        pod_sandbox_id=pod.id,
        name=f"c{n}",
        state=ContainerState.CREATED,
        resources=Resources(
            cpu=CpuResources(shares=max(2, milli * 1024 // 1000)),
            memory=MemoryResources(limit=limit) if limit else None,
        ),
    )


def both(hosts: list[PolicyHost], call: str, **kwargs: Any) -> list[Any]:
    """The same request to each host: its answer or its refusal's text."""
    out: list[Any] = []
    for host in hosts:
        try:
            out.append(getattr(host, call)(**kwargs))
        except PolicyError as exc:
            out.append(str(exc))
    return out


def reconfigure(host: PolicyHost, text: str) -> Any:
    try:
        return host.hook.policy_reconfigure(config=text, source="test", prepared=None)
    except PolicyError as exc:
        return str(exc)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_updates_equal_the_full_comparison(tmp_path: Path, seed: int) -> None:
    write_topology(tmp_path, N6_HBM_CXL)
    config = tmp_path / "balloons.yaml"
    config.write_text(CONFIG % {"hide": "false"})
    incremental, oracle = Balloons(), FullComparison()
    hosts = [make_host(tmp_path, incremental, config), make_host(tmp_path, oracle, config)]
    rnd = random.Random(seed)
    pods: dict[str, Pod] = {}
    live: dict[str, Container] = {}
    for step in range(160):
        op = rnd.random()
        if op < 0.45 or not live:
            pod = pods[rnd.choice(list(pods))] if pods and rnd.random() < 0.3 else None
            if pod is None:
                pod = new_pod(rnd, step)
                pods[pod.id] = pod
            c = new_container(rnd, pod, step)
            got = both(hosts, "create_container", pod=pod, container=c)
            live[c.id] = c
        elif op < 0.6:
            cid = rnd.choice(list(live))
            c = live.pop(cid)
            got = both(hosts, "stop_container", pod=pods[c.pod_sandbox_id], container=c)
            # a pinning ran: nothing released is kept (no ghost pins pile up)
            assert incremental.policy is not None
            assert set(incremental.policy._pins) == set(incremental.policy.owner), (seed, step)
        elif op < 0.7:
            cid = rnd.choice(list(live))
            c = live.pop(cid)
            for host in hosts:
                host.hook.nri_remove_container(pod=pods[c.pod_sandbox_id], container=c)
            got = [None, None]
        elif op < 0.82:  # the runtime sends a pod anew (its annotations may differ)
            pid = rnd.choice(list(pods))
            pods[pid] = replace(pods[pid], annotations=annotations(rnd))
            both(hosts, "update_pod_sandbox", pod=pods[pid], resources=Resources())
            got = [None, None]
        elif op < 0.9:
            text = CONFIG % {"hide": rnd.choice(("true", "false"))}
            if rnd.random() < 0.5:
                text = text.replace("maxCPUs: 3", f"maxCPUs: {rnd.choice((2, 3, 4))}")
            got = [reconfigure(host, text) for host in hosts]
        else:  # a reconnect: Synchronize with what runs, the state kept
            running = [c for c in live.values()]
            got = both(
                hosts,
                "synchronize",
                pods=list(pods.values()),
                containers=running,
            )
        assert got[0] == got[1], (seed, step)
        assert incremental.pins == oracle.pins, (seed, step)
        assert incremental.policy is not None and oracle.policy is not None
        assert incremental.policy.memory.export() == oracle.policy.memory.export(), (seed, step)
        # the plugin's pins are the policy's whole pinning (but for containers
        # removed since, which the next pinning drops)
        owner = incremental.policy.owner
        whole = {cid: pin for cid, pin in incremental.policy._pins.items() if cid in owner}
        assert whole == incremental.pins, (seed, step)


def test_sent_pods_are_bounded_when_nobody_asks(tmp_path: Path) -> None:
    """A policy that never takes the sent pods costs at most SENT_PODS_MAX
    ids; past it the host answers "any pod may have changed" (None)."""
    write_topology(tmp_path, N6_HBM_CXL)
    config = tmp_path / "balloons.yaml"
    config.write_text(CONFIG % {"hide": "false"})
    host = make_host(tmp_path, Balloons(), config)
    host.take_sent_pods()
    host.update_pod_sandbox(Pod(id="p0"), Resources())
    assert host.take_sent_pods() == {"p0"}
    for i in range(SENT_PODS_MAX + 1):
        host.update_pod_sandbox(Pod(id=f"p{i}"), Resources())
    assert host._sent_pods is None
    assert host.take_sent_pods() is None
    assert host.take_sent_pods() == set()


def test_a_restarted_plugin_repins_only_what_the_runtime_reports_elsewhere(
    tmp_path: Path,
) -> None:
    """Synchronize after a restart (its state directory kept): a container
    the runtime reports on its pin (cpus and mems, as the runtime applied
    them) gets no update; one reported on other CPUs, or other memory nodes,
    gets its pin back. Only what changed is sent (a restart with 1000
    containers re-pins none of them)."""
    write_topology(tmp_path, N6_HBM_CXL)
    config = tmp_path / "balloons.yaml"
    config.write_text(CONFIG % {"hide": "false"})
    options = {"config_file": str(config)}
    state = tmp_path / "state"
    first = PolicyHost("balloons", Balloons(), options=options, host_root=str(tmp_path),
                       state_dir=state)  # fmt: skip
    first.synchronize([], [])
    rnd = random.Random(7)
    pods, created = [], []
    pins: dict[str, tuple[str, str]] = {}  # what the runtime applied, as it would
    for n, ns in enumerate(("hbm", "grow", "shared", "default")):  # memory pinned
        pod = replace(new_pod(rnd, n), namespace=ns, annotations={})
        c = new_container(rnd, pod, n)
        result = first.create_container(pod, c)
        assert result.adjustment is not None
        for cid, res in [(c.id, result.adjustment.resources)] + [
            (u.container_id, u.resources) for u in result.updates
        ]:
            assert res.cpu is not None and res.cpu.cpus and res.cpu.mems
            pins[cid] = (res.cpu.cpus, res.cpu.mems)
        pods.append(pod)
        created.append(c)
    first.shutdown()

    def reported(c: Container, cpus: str, mems: str) -> Container:
        assert c.resources is not None and c.resources.cpu is not None
        cpu = replace(c.resources.cpu, cpus=cpus, mems=mems)
        return replace(c, state=ContainerState.RUNNING, resources=replace(c.resources, cpu=cpu))

    running = [reported(c, *pins[c.id]) for c in created]
    running[1] = reported(created[1], "0-5", pins[created[1].id][1])  # other CPUs
    running[3] = reported(created[3], pins[created[3].id][0], "0-5")  # other memory nodes
    second = PolicyHost("balloons", Balloons(), options=options, host_root=str(tmp_path),
                        state_dir=state)  # fmt: skip
    updates = second.synchronize(pods, running)
    got = {
        u.container_id: (u.resources.cpu.cpus, u.resources.cpu.mems)
        for u in updates
        if u.resources.cpu
    }
    assert len(got) == len(updates)
    assert got == {c.id: pins[c.id] for c in (created[1], created[3])}
    assert second.containers[created[1].id].cpus == pins[created[1].id][0]

"""Upstream e2e balloons/n4c16/test06-update-config: configuration updates of a
running policy. Removing balloon types moves their containers, bringing a
type back moves its containers back, a cpuClass-only change moves nothing.

The simulator cannot deliver a new BalloonsPolicy (no agent), so this drives
the plugin in-process through :class:`PolicyHost` on the n4c16 sysfs and calls
:meth:`Balloons.reconfigure`, the agent's entry. The metrics (``containers``
and ``cpu_class`` labels) are read from the policy's balloons instead.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from balloons_e2e import DATA
from nri_balloons.plugin import Balloons
from nri_framework import cpuset
from nri_framework.hookspecs import PolicyError
from nri_framework.host import PolicyHost
from nri_framework.model import Container, ContainerState
from nri_framework.simulate.podspec import load_pod_file
from nri_framework.simulate.sysfs import write_topology

TEST = DATA / "test06-update-config"


class Node:
    def __init__(self, tmp: Path) -> None:
        root = write_topology(tmp / "host", "n4c16")
        self.plugin = Balloons()
        self.host = PolicyHost(
            "balloons",
            self.plugin,
            options={"config_file": str(TEST / "config1.yaml")},
            host_root=str(root),
        )
        self.ids: dict[str, str] = {}

    def create(self, filename: str) -> None:
        for sim in load_pod_file(TEST / filename):
            for c in sim.containers:
                cid = f"{sim.pod.name}-{c.name}"
                ctr = msgspec.structs.replace(
                    c, id=cid, pod_sandbox_id=sim.pod.id, state=ContainerState.RUNNING
                )
                self.host.create_container(sim.pod, ctr)
                self.ids[c.name] = cid

    def reconfigure(self, filename: str) -> set[str]:
        """Apply a configuration; the names of the containers that got updates."""
        updates = self.plugin.reconfigure((TEST / filename).read_text(), filename)
        by_id = {v: k for k, v in self.ids.items()}
        return {by_id[u.container_id] for u in updates}

    def balloon(self, name: str) -> str:
        assert self.plugin.policy is not None
        bln = self.plugin.policy.owner.get(self.ids[name])
        return bln.name if bln else ""

    def cpu_class(self, name: str) -> str:
        assert self.plugin.policy is not None
        return self.plugin.policy.owner[self.ids[name]].bdef.cpu_class

    def cpus(self, name: str) -> int:
        return cpuset.parse(self.plugin.pins[self.ids[name]][0])

    def container(self, name: str) -> Container:
        return self.host.containers[self.ids[name]]


def test_update_config(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.create("pod0.yaml")  # btype0 by annotation
    n.create("pod1.yaml")  # btype1 by namespace
    n.create("pod2.yaml")  # btype2 by the "*" namespace
    assert (n.balloon("pod0c0"), n.balloon("pod1c0"), n.balloon("pod2c0")) == (
        "btype0[0]",
        "btype1[0]",
        "btype2[0]",
    )
    assert not n.cpus("pod0c0") & cpuset.parse("1-3")  # availableResources 0,4-15

    # btype0 and btype1 removed, btype2 matches all namespaces. pod0's
    # annotated type is gone: upstream leaves that undefined; here the
    # container is left where it was, in no balloon.
    moved = n.reconfigure("config2.yaml")
    assert n.balloon("pod1c0") == n.balloon("pod2c0") == "btype2[0]"
    assert n.balloon("pod0c0") == ""
    assert "pod1c0" in moved  # pod2c0 may keep its CPUs in the rebuilt btype2[0]

    # btype0 is back: pod0 returns to it
    moved = n.reconfigure("config3.yaml")
    assert n.balloon("pod0c0") == "btype0[0]"
    assert n.balloon("pod1c0") == n.balloon("pod2c0") == "btype2[0]"
    assert "pod0c0" in moved
    assert n.cpu_class("pod0c0") == "classA"
    assert n.cpu_class("pod1c0") == n.cpu_class("pod2c0") == "classC"

    # only cpuClasses change: nobody moves, the classes follow
    before = {c: n.cpus(c) for c in ("pod0c0", "pod1c0", "pod2c0")}
    assert n.plugin.policy is not None
    balloon_objects = list(n.plugin.policy.balloons)
    assert n.reconfigure("config4.yaml") == set()
    assert n.plugin.policy.balloons == balloon_objects  # not rebuilt
    assert n.cpu_class("pod0c0") == "classC"
    assert n.cpu_class("pod1c0") == n.cpu_class("pod2c0") == "classB"
    assert {c: n.cpus(c) for c in before} == before
    assert n.balloon("pod0c0") == "btype0[0]"

    # (not upstream) a scheduling-class-only change is applied, without moves
    # (upstream drops it as "no configuration changes", reference §20.7)
    assert n.reconfigure("config5-scheduling.yaml") == set()
    assert all(a is b for a, b in zip(n.plugin.policy.balloons, balloon_objects, strict=True))
    assert n.plugin.policy.owner[n.ids["pod2c0"]].bdef.scheduling_class == "batch"
    assert {c: n.cpus(c) for c in before} == before

    # the same configuration again: nothing to do
    assert n.reconfigure("config5-scheduling.yaml") == set()


def test_update_config_that_cannot_be_set_up_keeps_running_state(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.create("pod0.yaml")
    before = (n.balloon("pod0c0"), n.cpus("pod0c0"))
    # 4 pre-created btype2 balloons of 4 CPUs do not fit in 0,4-15
    bad = (TEST / "config1.yaml").read_text().replace("minBalloons: 1", "minBalloons: 4")
    with pytest.raises(PolicyError, match=r"^balloons: config update failed: balloons: failed"):
        n.plugin.reconfigure(bad, "bad.yaml")
    assert (n.balloon("pod0c0"), n.cpus("pod0c0")) == before


# --- the same through the runtime simulator, reconfigured as an operator would ----


async def test_update_config_through_the_simulator() -> None:
    """The running plugin process gets each new configuration by SIGHUP (the
    ``--config-file`` reload; the Kubernetes agent will deliver the CR the same
    way) and the runtime's container table follows through UpdateContainers."""
    from balloons_e2e import node

    async with node("test06-update-config", "config1.yaml") as n:
        for pod in ("pod0.yaml", "pod1.yaml", "pod2.yaml"):
            await n.create(pod)
        assert (n.balloon("pod0c0"), n.balloon("pod1c0"), n.balloon("pod2c0")) == (
            "btype0[0]",
            "btype1[0]",
            "btype2[0]",
        )
        assert not n.cpus("pod0c0") & {1, 2, 3}  # availableResources 0,4-15

        # btype1 removed: pod1 moves to btype2, and the runtime sees its new CPUs
        await n.reload("config2.yaml")
        assert n.balloon("pod1c0") == "btype2[0]"
        assert n.cpus("pod1c0") == n.cpus("pod2c0")

        # btype0 back: pod0 returns to it
        await n.reload("config3.yaml")
        assert n.balloon("pod0c0") == "btype0[0]"
        assert not n.cpus("pod0c0") & n.cpus("pod2c0")

        # a cpuClass-only change moves nobody
        before = n.all_cpus()
        await n.reload("config4.yaml")
        assert n.all_cpus() == before

        # an invalid configuration is rejected; the running one stays
        await n.reload("config-invalid.yaml")
        assert "keeping the running configuration" in n.plugin.output()
        assert "MinCpus (3) > MaxCpus (2) in balloon type" in n.plugin.output()
        assert n.all_cpus() == before

"""The agent end to end: the real plugin process (``nri-resource-policy run
--policy balloons --config-namespace NS --kubeconfig K``) against the runtime
simulator and the real apiextensions-apiserver of ``stack.py``.

Each test has a namespace and a node of its own. Covered: the BalloonsPolicy
watch with node > group > default precedence (the node's own status entry
moves along), Success/Failure status with the exact error text and the running
configuration kept, NodeResourceTopology objects that answer the spec's step
6.5 queries (run verbatim with Debian's kubectl and jq), and extended resources
published, repaired and removed (spec step 9.1, its jq filter run by jq).
The agent and the cluster helpers are in ``agent_node.py``.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from agent_node import (
    CPUCLASS,
    EXAMPLES,
    GROUP,
    PLURAL,
    VERSION,
    Cluster,
    PluginNode,
    eventually,
    pct_spec,
    plugin_node,
    work_spec,
)
from agent_node import fail as _fail
from kubernetes import client
from nri_framework import cpuset
from nri_framework.simulate.scenario import wait_registered

pytestmark = pytest.mark.k8s


def assert_entry(
    cluster: Cluster, name: str, generation: int, status: str = "Success", errors: str = ""
) -> dict[str, Any]:
    entry = cluster.entry(name)
    assert entry is not None, f"no status entry for {cluster.node} in {name}"
    assert (entry["status"], entry["generation"], entry.get("errors", "")) == (
        status,
        generation,
        errors,
    ), entry
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["timestamp"]), entry
    return entry


def assert_no_entry(cluster: Cluster, name: str) -> None:
    assert cluster.entry(name) is None, cluster.get(name).get("status")


# --- configuration source and status ------------------------------------------------


async def test_precedence_default_group_node(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.stack.create_node, cluster.node)
    cluster.create("default", work_spec(1))
    cluster.create("group.g1", work_spec(2))
    async with plugin_node(cluster) as n:
        await eventually(lambda: assert_entry(cluster, "default", 1), what="Success on default")
        await n.run("p1")
        assert n.ncpus("p1") == 1
        assert_no_entry(cluster, "group.g1")

        # the node joins group g1: group.g1 takes over, the entry moves
        cluster.label({"config.nri/group": "g1"})
        await eventually(lambda: assert_entry(cluster, "group.g1", 1), what="Success on group")
        await eventually(lambda: assert_no_entry(cluster, "default"), what="entry left default")
        await eventually(lambda: n.ncpus("p1") == 2 or _fail(n.cpus("p1")), what="2 CPUs")

        # a node-specific CR wins over the group
        cluster.create(f"node.{cluster.node}", work_spec(3))
        await eventually(lambda: assert_entry(cluster, f"node.{cluster.node}", 1))
        await eventually(lambda: assert_no_entry(cluster, "group.g1"))
        await eventually(lambda: n.ncpus("p1") == 3 or _fail(n.cpus("p1")), what="3 CPUs")

        # its deletion falls back to the group
        cluster.delete(f"node.{cluster.node}")
        await eventually(lambda: assert_entry(cluster, "group.g1", 1))
        await eventually(lambda: n.ncpus("p1") == 2 or _fail(n.cpus("p1")), what="2 CPUs again")

        # a group without its CR: no configuration, no fall back to default;
        # the running configuration stays
        cluster.label({"config.nri/group": "nowhere"})
        await eventually(lambda: n.lines("has no effective configuration") or _fail("no warning"))
        await eventually(lambda: assert_no_entry(cluster, "group.g1"))
        assert_no_entry(cluster, "default")
        assert n.ncpus("p1") == 2

        # back to no group: default again
        cluster.label({"config.nri/group": None})
        await eventually(lambda: assert_entry(cluster, "default", 1))
        await eventually(lambda: n.ncpus("p1") == 1 or _fail(n.cpus("p1")), what="1 CPU")

        # only our own status patches happened meanwhile: every delivery is one log line
        await n.plugin.wait_output("config update from BalloonsPolicy", count=5)
        applied = n.lines("config update from BalloonsPolicy")
        assert len(applied) == 5, "\n".join(applied)
        await n.plugin.stop()
    # clean stop: our entry is gone
    assert_no_entry(cluster, "default")


async def test_status_failure_keeps_the_running_configuration(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.stack.create_node, cluster.node)
    cluster.create("default", work_spec(2))
    async with plugin_node(cluster) as n:
        await eventually(lambda: assert_entry(cluster, "default", 1))
        await n.run("p1")
        assert n.ncpus("p1") == 2

        cluster.patch_spec("default", work_spec(33, 32))
        await eventually(lambda: n.lines("keeping the running configuration") or _fail("no log"))
        (line,) = n.lines("keeping the running configuration")
        error = line.split("keeping the running configuration: ", 1)[1]
        assert "MinCpus (33) > MaxCpus (32) in balloon type" in error
        await eventually(lambda: assert_entry(cluster, "default", 2, "Failure", error))
        assert n.ncpus("p1") == 2
        assert n.plugin.proc.returncode is None

        # a status patch of someone else (same generation) does not re-deliver
        cluster.objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, cluster.ns, PLURAL, "default",
            {"status": {"nodes": {"other-node": {"status": "Success", "generation": 2}}}},
        )  # fmt: skip
        await asyncio.sleep(1)
        assert len(n.lines("keeping the running configuration")) == 1

        cluster.patch_spec("default", work_spec(3))
        await eventually(lambda: assert_entry(cluster, "default", 3))
        await eventually(lambda: n.ncpus("p1") == 3 or _fail(n.cpus("p1")))
        # our merge patches touch our node's key only
        assert cluster.get("default")["status"]["nodes"]["other-node"]["generation"] == 2


async def test_first_configuration_invalid_then_fixed(cluster: Cluster) -> None:
    """Registration waits for a configuration the policy accepts."""
    await asyncio.to_thread(cluster.stack.create_node, cluster.node)
    cluster.create("default", work_spec(5, 2))
    async with plugin_node(cluster, register=False) as n:
        await eventually(lambda: assert_entry(cluster, "default", 1, "Failure", _error(n)))
        assert not n.rt.plugins
        cluster.patch_spec("default", work_spec(1))
        await wait_registered(n.rt, n.plugin, 30)
        await eventually(lambda: assert_entry(cluster, "default", 2))


def _error(n: PluginNode) -> str:
    lines = n.lines("keeping the running configuration: ")
    assert lines
    return lines[-1].split("keeping the running configuration: ", 1)[1]


# --- NodeResourceTopology --------------------------------------------------------------


async def test_node_resource_topology(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.stack.create_node, cluster.node)
    spec = work_spec(2, agent={"nodeResourceTopology": True}, showContainersInNrt=True)
    cluster.create("default", spec)
    async with plugin_node(cluster) as n:
        await n.run("p1")
        await n.run("p2")

        # the spec's step 6.5 queries, verbatim, with kubectl and jq: our node's rows
        def check() -> list[list[str]]:
            rows = cluster.spec_rows("step6.5-containers")  # BALLOON, CONTAINER, CPUS
            assert sorted(r[1] for r in rows) == ["default/p1/c", "default/p2/c"], rows
            return rows

        rows = await eventually(check, what="NRT with both containers")
        obj = cluster.nrt()
        assert obj["attributes"] == [{"name": "TopologyPolicy", "value": "balloons"}]
        assert "topologyPolicies" not in obj
        balloons = dict(cluster.spec_rows("step6.5-balloons"))  # BALLOON, CPUSET
        for parent, name, cpus in rows:
            pod = name.split("/")[1]
            assert cpus == n.cpus(pod), (name, cpus, n.cpus(pod))
            assert balloons[parent] == cpus
        zone = next(z for z in obj["zones"] if z["type"] == "balloon" and z["name"] in balloons)
        (res,) = zone["resources"]
        assert res["name"] == "cpu" and res["capacity"] == "16"  # 16000m as Kubernetes prints it
        for q in (res["capacity"], res["allocatable"], res["available"]):
            assert re.fullmatch(r"-?\d+m?", q), q

        # a removed container leaves the NRT (PUT with the resourceVersion read)
        rv = obj["metadata"]["resourceVersion"]
        await n.delete("p2")
        await eventually(
            lambda: (
                [r[1] for r in cluster.spec_rows("step6.5-containers")] == ["default/p1/c"]
                or _fail(cluster.spec_rows("step6.5-containers"))
            )
        )
        assert cluster.nrt()["metadata"]["resourceVersion"] != rv
        await n.plugin.wait_output("updating topology zones...")

        # switched off by the configuration: no more writes
        cluster.patch_spec("default", {"agent": {"nodeResourceTopology": False}})
        await eventually(lambda: n.lines("disabling NRT client") or _fail("not disabled"))
        before = cluster.nrt()["metadata"]["resourceVersion"]
        await n.run("p3")
        await asyncio.sleep(1)
        assert cluster.nrt()["metadata"]["resourceVersion"] == before


async def test_no_node_resource_topology_when_disabled(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.stack.create_node, cluster.node)
    cluster.create("default", work_spec(1, agent={"podResourceAPI": False}))
    async with plugin_node(cluster) as n:
        await n.run("p1")
        await eventually(lambda: assert_entry(cluster, "default", 1))
        await asyncio.sleep(1)
        with pytest.raises(client.ApiException) as exc:
            cluster.nrt()
        assert exc.value.status == 404
        assert not n.lines("updating topology zones...")


# --- extended resources -------------------------------------------------------------------


async def test_extended_resources(cluster: Cluster) -> None:
    capacity = {
        "cpu": "256",
        "memory": "512Gi",
        f"{CPUCLASS}x": "1",  # an orphan in the owned domain
        "example.com/not-owned": "3",
    }
    await asyncio.to_thread(cluster.stack.create_node, cluster.node, None, capacity)
    cluster.create("default", pct_spec())
    async with plugin_node(cluster, "xeon-6776p", sst=True) as n:

        def published() -> dict[str, str]:
            cap = cluster.capacity()
            mine = cluster.owned_capacity()  # step 9.1's jq filter, with jq
            assert set(mine) == {f"{CPUCLASS}hp-pct", f"{CPUCLASS}lp-pct"}, cap
            assert cap["example.com/not-owned"] == "3"
            return mine

        first = await eventually(published, timeout=30, what="hp-pct and lp-pct published")
        assert all(re.fullmatch(r"\d+k?", v) for v in first.values()), first
        # the log lines follow the patch
        await n.plugin.wait_output("published node extended resources: ")
        await n.plugin.wait_output(f"removed node extended resources: {CPUCLASS}x")

        # an HP pod holds CPUs: the LP class's capacity shrinks (re-published on create)
        await n.run_yaml(EXAMPLES / "pod-hp-1.yaml")
        await eventually(
            lambda: (
                published()[f"{CPUCLASS}lp-pct"] != first[f"{CPUCLASS}lp-pct"] or _fail(published())
            ),
            what="lp-pct shrinks",
        )

        # an orphan injected while running goes at the next reconciliation
        cluster.set_capacity({f"{CPUCLASS}x": "7"})
        await n.run_yaml(EXAMPLES / "pod-lp.yaml")
        await eventually(lambda: f"{CPUCLASS}x" not in cluster.capacity() or _fail("orphan"))

        # step 6.5 on the spec's own policy: each pod's container in its balloon's zone
        def pct_rows() -> dict[str, tuple[str, str]]:
            rows = {
                r[1].split("/")[1]: (r[0], r[2]) for r in cluster.spec_rows("step6.5-containers")
            }
            assert set(rows) == {"pct-hp-1", "pct-lp"}, rows
            return rows

        rows = await eventually(pct_rows, what="both pods in the NRT")
        balloons = dict(cluster.spec_rows("step6.5-balloons"))
        assert rows["pct-hp-1"][0].startswith("hp-bln[") and rows["pct-lp"][0].startswith("lp-bln[")
        for pod, (parent, cpus) in rows.items():
            assert cpus == n.cpus(pod) == balloons[parent], (pod, parent, cpus)
        assert cpuset.parse(rows["pct-hp-1"][1]).bit_count() == 2

        # step 9.1: the BalloonsPolicy deleted -> every owned key removed
        cluster.delete("default")
        await eventually(lambda: cluster.owned_capacity() == {} or _fail(cluster.capacity()))
        cap = cluster.capacity()
        assert cap["example.com/not-owned"] == "3" and cap["cpu"] == "256"
        assert n.plugin.proc.returncode is None


async def test_start_without_configuration_removes_leftovers(cluster: Cluster) -> None:
    """A plugin started after the BalloonsPolicy was deleted (upstream e2e test19
    phase 1.5): it waits for a configuration, unregistered, and reconciles the
    resources an earlier run published away. SIGTERM ends the wait cleanly."""
    capacity = {"cpu": "16", f"{CPUCLASS}hp-pct": "32", "example.com/not-owned": "3"}
    await asyncio.to_thread(cluster.stack.create_node, cluster.node, None, capacity)
    async with plugin_node(cluster, register=False) as n:
        await n.plugin.wait_output("has no effective configuration", timeout=30)
        await eventually(lambda: cluster.owned_capacity() == {} or _fail(cluster.capacity()))
        assert cluster.capacity()["example.com/not-owned"] == "3"
        assert not n.rt.plugins
        t0 = time.monotonic()
        assert await n.plugin.stop() == 0
        assert time.monotonic() - t0 < 5

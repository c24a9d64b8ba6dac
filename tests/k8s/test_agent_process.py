"""The agent end to end: the real plugin process (``nri-resource-policy run
--policy balloons --config-namespace NS --kubeconfig K``) against the runtime
simulator and the real apiextensions-apiserver of ``stack.py``.

Each test has a namespace and a node of its own. Covered: the BalloonsPolicy
watch with node > group > default precedence (the node's own status entry
moves along), Success/Failure status with the exact error text and the running
configuration kept, NodeResourceTopology objects that answer the spec's step
6.5 queries, and extended resources published, repaired and removed (spec
step 9.1).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.podspec import RuntimeDefaults, load_pod_file
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_framework.simulate.sysfs import online, write_topology
from stack import Stack

# the SST helper process on the sim backend, as the PCT integration tests run it
_BALLOONS_TESTS = str(Path(__file__).resolve().parents[1] / "integration" / "nri_balloons")
if _BALLOONS_TESTS not in sys.path:
    sys.path.insert(0, _BALLOONS_TESTS)
from sst_node import Helper  # noqa: E402

pytestmark = pytest.mark.k8s

GROUP, VERSION, PLURAL = "config.nri", "v1alpha1", "balloonspolicies"
NRT = ("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pct-managed"
CPUCLASS = "cpuclass.balloons.nri.io/"

T = TypeVar("T")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def work_spec(min_cpus: int, max_cpus: int = 4, **extra: Any) -> dict[str, Any]:
    """One balloon type for every container: its size says which CR is in force."""
    return {
        "reservedResources": {"cpu": "cpuset:0"},
        "balloonTypes": [
            {"name": "work", "namespaces": ["*"], "minCPUs": min_cpus, "maxCPUs": max_cpus}
        ],
        **extra,
    }


def cr(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "BalloonsPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


async def eventually(check: Callable[[], T], timeout: float = 20.0, what: str = "") -> T:
    """``check()`` once it stops raising AssertionError (or KeyError/ApiException 404)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncio.to_thread(check)
        except (AssertionError, KeyError, client.ApiException) as exc:
            if isinstance(exc, client.ApiException) and exc.status != 404:
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"not in {timeout}s: {what or check}: {exc!r}") from exc
        await asyncio.sleep(0.1)


@dataclass
class Cluster:
    """The API as the tests see it: one namespace, one node."""

    stack: Stack
    api: Any
    ns: str
    node: str
    objs: Any = None
    core: Any = None

    def __post_init__(self) -> None:
        self.objs = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)

    # BalloonsPolicy
    def create(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = self.objs.create_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, cr(name, spec)
        )
        return obj

    def get(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.objs.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name
        )
        return obj

    def patch_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = self.objs.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec}
        )
        return obj

    def delete(self, name: str) -> None:
        self.objs.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def entry(self, name: str) -> dict[str, Any] | None:
        """Our node's status entry in CR ``name``."""
        nodes = (self.get(name).get("status") or {}).get("nodes") or {}
        entry: dict[str, Any] | None = nodes.get(self.node)
        return entry

    # Node
    def label(self, labels: dict[str, str | None]) -> None:
        self.core.patch_node(
            self.node,
            {"metadata": {"labels": labels}},
            _content_type="application/merge-patch+json",
        )

    def capacity(self) -> dict[str, str]:
        cap: dict[str, str] = self.core.read_node(self.node).status.capacity or {}
        return cap

    def set_capacity(self, values: dict[str, str | None]) -> None:
        self.core.patch_node_status(
            self.node,
            {"status": {"capacity": values}},
            _content_type="application/merge-patch+json",
        )

    # NodeResourceTopology
    def nrt(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.objs.get_cluster_custom_object(*NRT, self.node)
        return obj

    def nrt_items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.objs.list_cluster_custom_object(*NRT)["items"]
        return items

    def cleanup(self) -> None:
        for item in self.objs.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL)[
            "items"
        ]:
            self.delete(item["metadata"]["name"])
        for call in (
            lambda: self.objs.delete_cluster_custom_object(*NRT, self.node),
            lambda: self.core.delete_node(self.node),
        ):
            try:
                call()
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


@dataclass
class PluginNode:
    """The plugin process for ``cluster.node`` and its runtime."""

    cluster: Cluster
    rt: SimulatedRuntime
    plugin: PluginProcess
    host_root: Path
    work: Path
    pods: dict[str, str] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)

    async def run(self, name: str, millicpu: int = 500) -> str:
        """A one-container burstable pod; the container id."""
        pod = await self.rt.run_pod(
            Pod(
                id="",
                name=name,
                uid=f"u-{name}",
                namespace="default",
                cgroup_parent=f"/kubepods/burstable/podu-{name}",
            )
        )
        shares = millicpu * 1024 // 1000
        c = await self.rt.create_container(
            pod.id, Container(id="", name="c", resources=Resources(cpu=CpuResources(shares=shares)))
        )
        await self.rt.start_container(c.id)
        self.pods[name] = pod.id
        self.containers[name] = c.id
        return c.id

    async def run_yaml(self, path: Path) -> str:
        defaults = RuntimeDefaults(cpus=online(self.host_root), mems=online(self.host_root, "node"))
        (sim,) = load_pod_file(path, defaults)
        pod = await self.rt.run_pod(sim.pod)
        c = await self.rt.create_container(pod.id, sim.containers[0])
        await self.rt.start_container(c.id)
        self.pods[sim.pod.name] = pod.id
        self.containers[sim.pod.name] = c.id
        return c.id

    async def delete(self, name: str) -> None:
        pod_id = self.pods.pop(name)
        self.containers.pop(name, None)
        await self.rt.stop_pod(pod_id)
        await self.rt.remove_pod(pod_id)

    def cpus(self, name: str) -> str:
        c = self.rt.container(self.containers[name])
        return c.resources.cpu.cpus if c.resources and c.resources.cpu else ""

    def ncpus(self, name: str) -> int:
        return cpuset.parse(self.cpus(name)).bit_count()

    def lines(self, text: str) -> list[str]:
        return [line for line in list(self.plugin.tail) if text in line]


@pytest.fixture
def cluster(k8s_stack: Stack) -> Any:
    api = k8s_stack.api_client()
    c = Cluster(k8s_stack, api, unique("ns"), unique("node"))
    try:
        yield c
    finally:
        try:
            c.cleanup()
        finally:
            api.close()


@asynccontextmanager
async def plugin_node(
    cluster: Cluster, topology: str = "n4c16", *, sst: bool = False, register: bool = True
) -> AsyncIterator[PluginNode]:
    """The plugin for ``cluster.node`` (the CRs it needs must exist when
    ``register``: registration waits for the first configuration)."""
    work = Path(tempfile.mkdtemp(prefix="agent-k8s-"))
    host_root = write_topology(work / "host", topology)
    helper = Helper(work, host_root) if sst else None
    if helper is not None:
        helper.start()
    cmd = [
        sys.executable, "-m", "nri_framework", "run", "--policy", "balloons",
        "--nri-socket", str(work / "nri.sock"), "--host-root", str(host_root),
        "--state-dir", str(work / "state"), "--exit-on-disconnect",
        "--config-namespace", cluster.ns, "--kubeconfig", str(cluster.stack.kubeconfig),
    ]  # fmt: skip
    if helper is not None:
        cmd += ["--sst-helper", helper.endpoint]
    old = os.environ.get("NODE_NAME")
    os.environ["NODE_NAME"] = cluster.node
    try:
        async with SimulatedRuntime(work / "nri.sock") as rt:
            plugin = await PluginProcess.launch(cmd)
            try:
                if register:
                    await wait_registered(rt, plugin, 30)
                yield PluginNode(cluster, rt, plugin, host_root, work)
            finally:
                await plugin.stop()
    finally:
        if old is None:
            os.environ.pop("NODE_NAME", None)
        else:
            os.environ["NODE_NAME"] = old
        if helper is not None:
            helper.stop()
        shutil.rmtree(work, ignore_errors=True)


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


def _fail(what: object) -> bool:
    raise AssertionError(what)


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


def balloon_rows(items: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Step 6.5's first jq query: NODE, BALLOON, CPUSET of zones of type balloon."""
    return [
        (node["metadata"]["name"], z["name"], a["value"])
        for node in items
        for z in node["zones"]
        if z["type"] == "balloon"
        for a in z.get("attributes", [])
        if a["name"] == "cpuset"
    ]


def container_rows(items: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """The second: NODE, BALLOON (parent), CONTAINER, CPUS."""
    return [
        (node["metadata"]["name"], z["parent"], z["name"], a["value"])
        for node in items
        for z in node["zones"]
        if z["type"] == "allocation for container"
        for a in z.get("attributes", [])
        if a["name"] == "cpuset"
    ]


async def test_node_resource_topology(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.stack.create_node, cluster.node)
    spec = work_spec(2, agent={"nodeResourceTopology": True}, showContainersInNrt=True)
    cluster.create("default", spec)
    async with plugin_node(cluster) as n:
        await n.run("p1")
        await n.run("p2")

        def check() -> list[dict[str, Any]]:
            items = [i for i in cluster.nrt_items() if i["metadata"]["name"] == cluster.node]
            assert len(items) == 1
            rows = container_rows(items)
            assert sorted(r[2] for r in rows) == ["default/p1/c", "default/p2/c"], rows
            return items

        items = await eventually(check, what="NRT with both containers")
        obj = items[0]
        assert obj["attributes"] == [{"name": "TopologyPolicy", "value": "balloons"}]
        assert "topologyPolicies" not in obj
        balloons = {name: cpus for _, name, cpus in balloon_rows(items)}
        for _, parent, name, cpus in container_rows(items):
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
                [r[2] for r in container_rows([cluster.nrt()])] == ["default/p1/c"]
                or _fail(container_rows([cluster.nrt()]))
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


def pct_spec() -> dict[str, Any]:
    """The spec's step 4 BalloonsPolicy with step 10's publishExtendedResource."""
    doc = yaml.safe_load((EXAMPLES / "balloons-pct-managed.yaml").read_text())
    spec: dict[str, Any] = doc["spec"]
    for cc in spec["cpuClasses"]:
        if cc["name"] in ("hp-pct", "lp-pct"):
            cc["publishExtendedResource"] = True
    return spec


def owned(capacity: dict[str, str]) -> dict[str, str]:
    """Step 9.1's jq filter: the keys starting with cpuclass.balloons.nri.io/."""
    return {k: v for k, v in capacity.items() if k.startswith(CPUCLASS)}


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
            mine = owned(cap)
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
            rows = {r[2].split("/")[1]: (r[1], r[3]) for r in container_rows([cluster.nrt()])}
            assert set(rows) == {"pct-hp-1", "pct-lp"}, rows
            return rows

        rows = await eventually(pct_rows, what="both pods in the NRT")
        balloons = dict(r[1:] for r in balloon_rows([cluster.nrt()]))
        assert rows["pct-hp-1"][0].startswith("hp-bln[") and rows["pct-lp"][0].startswith("lp-bln[")
        for pod, (parent, cpus) in rows.items():
            assert cpus == n.cpus(pod) == balloons[parent], (pod, parent, cpus)
        assert cpuset.parse(rows["pct-hp-1"][1]).bit_count() == 2

        # step 9.1: the BalloonsPolicy deleted -> every owned key removed
        cluster.delete("default")
        await eventually(lambda: owned(cluster.capacity()) == {} or _fail(cluster.capacity()))
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
        await eventually(lambda: owned(cluster.capacity()) == {} or _fail(cluster.capacity()))
        assert cluster.capacity()["example.com/not-owned"] == "3"
        assert not n.rt.plugins
        t0 = time.monotonic()
        assert await n.plugin.stop() == 0
        assert time.monotonic() - t0 < 5

"""The agent under test for the k8s tier: the real plugin process (``nri-resource-policy
run --policy balloons --config-namespace NS --kubeconfig K``) on the runtime
simulator, a 6776P or smaller sysfs tree, optionally the SST helper (sim backend),
and the cluster as the tests see it (:class:`Cluster`: one namespace, one node;
the Python client for what a test sets up, :class:`spec_commands.Kubectl` for what
an operator would query).

Shared by ``test_agent_process.py`` and ``test_spec_kubectl.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client
from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.podspec import RuntimeDefaults, load_pod_file
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_framework.simulate.sysfs import online, write_topology
from spec_commands import Kubectl, tsv
from stack import Stack

# the SST helper process on the sim backend, as the PCT integration tests run it
_BALLOONS_TESTS = str(Path(__file__).resolve().parents[1] / "integration" / "nri_balloons")
if _BALLOONS_TESTS not in sys.path:
    sys.path.insert(0, _BALLOONS_TESTS)
from sst_node import Helper  # noqa: E402

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
    kubectl: Kubectl
    objs: Any = None
    core: Any = None

    def __post_init__(self) -> None:
        self.objs = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)

    @classmethod
    @contextmanager
    def opened(cls, stack: Stack, ns: str, node: str, kubectl: Kubectl) -> Iterator[Cluster]:
        """A cluster view with its own API client; what it made is removed after."""
        api = stack.api_client()
        c = cls(stack, api, ns, node, kubectl)
        try:
            yield c
        finally:
            try:
                c.cleanup()
            finally:
                api.close()

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

    def spec_rows(self, name: str) -> list[list[str]]:
        """Our node's rows of the spec's step 6.5 query ``name`` (``step6.5-balloons``,
        ``step6.5-containers``), run verbatim with kubectl and jq; header checked."""
        header, *rows = tsv(self.kubectl.spec(name))
        assert header[0] == "NODE", header
        return [row[1:] for row in rows if row[0] == self.node]

    def owned_capacity(self) -> dict[str, str]:
        """Step 9.1's jq filter on our node's capacity (kubectl and jq; the spec's
        ``.items[0]`` would be any node of a shared stack)."""
        out = self.kubectl.run(
            f"kubectl get node {self.node} -o jsonpath='{{.status.capacity}}' "
            f"| jq -c 'with_entries(select(.key | startswith(\"{CPUCLASS}\")))'"
        )
        owned: dict[str, str] = json.loads(out)
        return owned

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


def fail(what: object) -> bool:
    raise AssertionError(what)


def pct_spec() -> dict[str, Any]:
    """The spec's step 4 BalloonsPolicy with step 10's publishExtendedResource."""
    doc = yaml.safe_load((EXAMPLES / "balloons-pct-managed.yaml").read_text())
    spec: dict[str, Any] = doc["spec"]
    for cc in spec["cpuClasses"]:
        if cc["name"] in ("hp-pct", "lp-pct"):
            cc["publishExtendedResource"] = True
    return spec

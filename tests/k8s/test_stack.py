"""The API semantics the agent relies on, on the real apiextensions-apiserver.

Each test works in a namespace of its own (namespaces are not objects here: any
name works, see ``stack.py``) or on objects with unique names.
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from stack import Stack

pytestmark = pytest.mark.k8s

GROUP, VERSION, PLURAL = "config.nri", "v1alpha1", "balloonspolicies"
NRT_GROUP, NRT_VERSION, NRT_PLURAL = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
HP = "cpuclass.balloons.nri.io/hp-pct"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def api(k8s_stack: Stack) -> Iterator[client.ApiClient]:
    with k8s_stack.api_client() as api:
        yield api


@pytest.fixture
def objs(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


@pytest.fixture
def ns() -> str:
    return _name("ns")


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "BalloonsPolicy",
        "metadata": {"name": name},
        "spec": {"reservedResources": {"cpu": "1000m"}, **spec},
    }


def node_status(gen: int, status: str = "Success", errors: str = "") -> dict[str, Any]:
    return {"status": status, "generation": gen, "errors": errors}


def status_patch(objs: client.CustomObjectsApi, ns: str, name: str, body: Any) -> Any:
    return objs.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name, body)


def get_policy(objs: client.CustomObjectsApi, ns: str, name: str) -> Any:
    return objs.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


class Watcher:
    """A watch running in a thread; events are (type, name, generation, status) tuples."""

    def __init__(self, list_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.events: queue.Queue[tuple[str, str, int | None, Any]] = queue.Queue()
        self.w = watch.Watch()
        self.errors: list[BaseException] = []

        def loop() -> None:
            try:
                for ev in self.w.stream(list_fn, *args, timeout_seconds=30, **kwargs):
                    obj = ev["object"]
                    if not isinstance(obj, dict):
                        obj = obj.to_dict()
                    meta = obj["metadata"]
                    self.events.put(
                        (ev["type"], meta["name"], meta.get("generation"), obj.get("status"))
                    )
            except BaseException as e:  # reported by next()
                self.errors.append(e)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def next(self, timeout: float = 10) -> tuple[str, str, int | None, Any]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no watch event within {timeout}s; {self.errors}") from None

    def quiet(self, timeout: float = 1.0) -> bool:
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected watch event {ev}")

    def stop(self) -> None:
        self.w.stop()


# --------------------------------------------------------------------------- BalloonsPolicy


def test_balloonspolicy_create_get(objs: client.CustomObjectsApi, ns: str) -> None:
    body = policy("default", pinCPU=True)
    body["status"] = {"nodes": {"n1": node_status(1)}}  # dropped: status subresource
    created = objs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    assert created["metadata"]["generation"] == 1
    assert created["metadata"]["uid"]
    got = get_policy(objs, ns, "default")
    assert got["spec"]["reservedResources"] == {"cpu": "1000m"}
    assert got["spec"]["pinCPU"] is True
    assert got["spec"]["agent"] == {"nodeResourceTopology": True}  # the CRD's default
    assert "status" not in got
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    listed = objs.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    assert [o["metadata"]["name"] for o in listed["items"]] == ["default"]
    # kube-system works like any namespace although no Namespace object exists
    name = _name("node")
    objs.create_namespaced_custom_object(GROUP, VERSION, "kube-system", PLURAL, policy(name))
    assert get_policy(objs, "kube-system", name)["metadata"]["namespace"] == "kube-system"
    objs.delete_namespaced_custom_object(GROUP, VERSION, "kube-system", PLURAL, name)


def test_status_merge_patch_and_generation(objs: client.CustomObjectsApi, ns: str) -> None:
    objs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, policy("default"))
    out = status_patch(objs, ns, "default", {"status": {"nodes": {"n1": node_status(1)}}})
    assert out["status"]["nodes"]["n1"] == node_status(1)
    assert out["metadata"]["generation"] == 1  # a status change is no new generation
    out = status_patch(
        objs, ns, "default", {"status": {"nodes": {"n2": node_status(1, "Failure", "bad")}}}
    )
    assert set(out["status"]["nodes"]) == {"n1", "n2"}  # merged, n1 kept
    assert out["metadata"]["generation"] == 1
    # null removes this node's key only
    out = status_patch(objs, ns, "default", {"status": {"nodes": {"n2": None}}})
    assert out["status"]["nodes"] == {"n1": node_status(1)}
    # a spec change bumps generation; status sent to the main resource is ignored
    out = objs.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        "default",
        {"spec": {"pinCPU": False}, "status": {"nodes": {"n1": None}}},
    )
    assert out["metadata"]["generation"] == 2
    assert out["spec"]["pinCPU"] is False
    assert out["status"]["nodes"] == {"n1": node_status(1)}
    # a status patch after that keeps generation 2
    out = status_patch(objs, ns, "default", {"status": {"nodes": {"n1": node_status(2)}}})
    assert out["metadata"]["generation"] == 2


def test_watch_field_selector_metadata_name(objs: client.CustomObjectsApi, ns: str) -> None:
    first = objs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, policy("node.n1"))
    # from a known resourceVersion, so no event can slip in before the watch is set up
    w = Watcher(
        objs.list_namespaced_custom_object,
        GROUP,
        VERSION,
        ns,
        PLURAL,
        field_selector="metadata.name=default",
        resource_version=first["metadata"]["resourceVersion"],
    )
    try:
        objs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, policy("default"))
        assert w.next()[:3] == ("ADDED", "default", 1)
        status_patch(objs, ns, "default", {"status": {"nodes": {"n1": node_status(1)}}})
        ev = w.next()
        assert ev[:3] == ("MODIFIED", "default", 1)  # same generation: the agent's own write
        assert ev[3] == {"nodes": {"n1": node_status(1)}}
        objs.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "default", {"spec": {"reservedResources": {"cpu": "2"}}}
        )
        assert w.next()[:3] == ("MODIFIED", "default", 2)
        objs.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "node.n1", {"spec": {"reservedResources": {"cpu": "2"}}}
        )
        objs.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "default")
        assert w.next()[:2] == ("DELETED", "default")
        assert w.quiet()  # nothing of node.n1 came through
    finally:
        w.stop()


def test_schema_violations_rejected_422(objs: client.CustomObjectsApi, ns: str) -> None:
    bad = policy("default")
    del bad["spec"]["reservedResources"]
    with pytest.raises(client.ApiException) as e:
        objs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, bad)
    assert e.value.status == 422
    assert "spec.reservedResources: Required value" in e.value.body

    with pytest.raises(client.ApiException) as e:
        objs.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, policy("default", pinCPU="yes")
        )
    assert e.value.status == 422
    assert "spec.pinCPU" in e.value.body

    objs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, policy("default"))
    with pytest.raises(client.ApiException) as e:
        status_patch(objs, ns, "default", {"status": {"nodes": {"n1": node_status(1, "Weird")}}})
    assert e.value.status == 422
    assert "Unsupported value" in e.value.body


def test_unknown_spec_fields_pruned(objs: client.CustomObjectsApi, ns: str) -> None:
    out = objs.create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, policy("default", noSuchField=1)
    )
    assert "noSuchField" not in out["spec"]


# --------------------------------------------------------------------------- NRT


def nrt(name: str, available: str = "4") -> dict[str, Any]:
    return {
        "apiVersion": f"{NRT_GROUP}/{NRT_VERSION}",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": [{"name": "topologyManagerPolicy", "value": "none"}],
        "zones": [
            {
                "name": "dedicated-cpus[0]",
                "type": "balloon",
                "resources": [
                    {"name": "cpu", "capacity": "8", "allocatable": "6", "available": available}
                ],
                "attributes": [{"name": "cpuset", "value": "2-3,6"}],
            }
        ],
    }


def test_nrt_create_put_and_conflict(objs: client.CustomObjectsApi) -> None:
    name = _name("n")
    args = (NRT_GROUP, NRT_VERSION, NRT_PLURAL)
    created = objs.create_cluster_custom_object(*args, nrt(name))
    rv1 = created["metadata"]["resourceVersion"]
    got = objs.get_cluster_custom_object(*args, name)
    assert got["zones"][0]["attributes"] == [{"name": "cpuset", "value": "2-3,6"}]

    # PUT with the current resourceVersion
    body = nrt(name, available="3")
    body["metadata"]["resourceVersion"] = rv1
    updated = objs.replace_cluster_custom_object(*args, name, body)
    assert updated["zones"][0]["resources"][0]["available"] == "3"
    assert updated["metadata"]["resourceVersion"] != rv1

    # a stale PUT conflicts
    stale = nrt(name, available="2")
    stale["metadata"]["resourceVersion"] = rv1
    with pytest.raises(client.ApiException) as e:
        objs.replace_cluster_custom_object(*args, name, stale)
    assert e.value.status == 409

    # a resource without `available` is invalid
    bad = nrt(name)
    del bad["zones"][0]["resources"][0]["available"]
    with pytest.raises(client.ApiException) as e:
        objs.create_cluster_custom_object(*args, {**bad, "metadata": {"name": _name("n")}})
    assert e.value.status == 422
    objs.delete_cluster_custom_object(*args, name)


# --------------------------------------------------------------------------- Nodes


def test_node_standin_capacity_patches(k8s_stack: Stack, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    name = _name("node")
    node = k8s_stack.create_node(
        name, labels={"config.nri/group": "g1"}, capacity={"cpu": 8, "memory": "16Gi"}
    )
    assert node.api_version == "v1" and node.kind == "Node"
    assert node.metadata.labels == {"config.nri/group": "g1"}
    assert node.status.capacity == {"cpu": "8", "memory": "16Gi"}
    assert node.status.allocatable == {"cpu": "8", "memory": "16Gi"}

    merge = "application/merge-patch+json"
    out = core.patch_node_status(name, {"status": {"capacity": {HP: "4"}}}, _content_type=merge)
    assert out.status.capacity == {"cpu": "8", "memory": "16Gi", HP: "4"}
    assert core.read_node(name).status.capacity[HP] == "4"

    out = core.patch_node_status(name, {"status": {"capacity": {HP: None}}}, _content_type=merge)
    assert out.status.capacity == {"cpu": "8", "memory": "16Gi"}
    # null for a key that is not there is a no-op
    core.patch_node_status(name, {"status": {"capacity": {HP: None}}}, _content_type=merge)

    # the client's default for a dict (strategic merge patch) works too
    out = core.patch_node_status(name, {"status": {"capacity": {HP: "2"}}})
    assert out.status.capacity[HP] == "2"
    # JSON patch as on a real server: RFC 6901 escaping; remove of a missing key is 422
    path = "/status/capacity/" + HP.replace("~", "~0").replace("/", "~1")
    out = core.patch_node_status(name, [{"op": "remove", "path": path}])
    assert HP not in out.status.capacity
    with pytest.raises(client.ApiException) as e:
        core.patch_node_status(name, [{"op": "remove", "path": path}])
    assert e.value.status == 422

    # status cannot be changed through the main resource; labels can
    out = core.patch_node(name, {"metadata": {"labels": {"config.nri/group": "g2"}}})
    assert out.metadata.labels == {"config.nri/group": "g2"}
    core.delete_node(name)
    with pytest.raises(client.ApiException) as e:
        core.read_node(name)
    assert e.value.status == 404


def test_node_watch_field_selector(k8s_stack: Stack, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    name, other = _name("node"), _name("node")
    rv = k8s_stack.create_node(other).metadata.resource_version
    w = Watcher(core.list_node, field_selector=f"metadata.name={name}", resource_version=rv)
    try:
        k8s_stack.create_node(name, labels={"config.nri/group": "g1"})
        assert w.next()[:2] == ("ADDED", name)
        ev = w.next()
        assert ev[:2] == ("MODIFIED", name)  # create_node's status seed
        assert ev[3]["capacity"]["cpu"] == "4"
        core.patch_node(name, {"metadata": {"labels": {"config.nri/group": "g2"}}})
        assert w.next()[:2] == ("MODIFIED", name)
        assert core.read_node(name).metadata.labels == {"config.nri/group": "g2"}
        core.delete_node(other)
        assert w.quiet()
    finally:
        w.stop()
        core.delete_node(name)


def test_nodes_list_is_core_v1(k8s_stack: Stack, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    name, tag = _name("node"), uuid.uuid4().hex[:8]
    k8s_stack.create_node(name, labels={"tag": tag})
    nodes = core.list_node(label_selector=f"tag={tag}")
    assert nodes.api_version == "v1" and nodes.kind == "NodeList"
    assert [n.metadata.name for n in nodes.items] == [name]
    with urllib.request.urlopen(f"{k8s_stack.server}/api/v1/nodes/{name}", timeout=10) as r:
        raw = json.load(r)
    assert raw["apiVersion"] == "v1"
    assert {f["apiVersion"] for f in raw["metadata"]["managedFields"]} == {"v1"}
    core.delete_node(name)


# --------------------------------------------------------------------------- the stack itself


def test_second_stack_starts_and_leaves_nothing(k8s_stack: Stack) -> None:
    st = Stack(k8s_stack.cache, crds_dir=None, say=lambda m: None)
    with st:
        assert st.server != k8s_stack.server
        pids = [p.pid for p in st.procs.values()]
        assert len(pids) == 3
        work = st.work_dir
        assert work is not None and work.is_dir()
    assert st.leftovers() == []
    assert not work.exists()

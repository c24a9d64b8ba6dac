"""Pod YAML -> NRI pods/containers as the kubelet + containerd make them.

Samples live in tests/data/pods/. Expected numbers follow the kubelet's
``MilliCPUToShares``/``milliCPUToQuota`` and Kubernetes' ``GetPodQOS``.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from nri_framework.quantity import QuantityError, milli_value, parse_quantity, value
from nri_framework.simulate.podspec import (
    PodSpecError,
    QOSClass,
    RuntimeDefaults,
    SimPod,
    cpu_quota,
    cpu_shares,
    load_pod_dir,
    pod_uid,
    pods_from_yaml,
)

PODS = Path(__file__).resolve().parents[4] / "tests" / "data" / "pods"


@pytest.fixture(scope="module")
def pods() -> dict[str, SimPod]:
    return {p.pod.name: p for p in load_pod_dir(PODS)}


# --- quantities -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", Fraction(2)),
        ("500m", Fraction(1, 2)),
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("128Mi", 128 * 2**20),
        ("1Gi", 2**30),
        ("1Ki", 1024),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1e3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("100n", Fraction(1, 10**7)),
        ("5u", Fraction(5, 10**6)),
        ("+1", 1),
        (2, 2),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_quantity(text: str | int | float, expected: Fraction | int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("bad", ["", "1.2.3", "Mi", "1mi", "1 Gi", "1KiB", "abc", "1e", True])
def test_parse_quantity_rejects(bad: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_values_round_up_like_kubernetes() -> None:
    assert milli_value("2") == 2000
    assert milli_value("250m") == 250
    assert milli_value("100u") == 1  # MilliValue rounds up
    assert value("1500m") == 2
    assert value("128Mi") == 134217728


# --- kubelet arithmetic -----------------------------------------------------------


@pytest.mark.parametrize(
    ("milli", "shares"), [(0, 2), (1, 2), (2, 2), (100, 102), (250, 256), (2000, 2048)]
)
def test_cpu_shares(milli: int, shares: int) -> None:
    assert cpu_shares(milli) == shares


@pytest.mark.parametrize(
    ("milli", "quota"), [(0, 0), (1, 1000), (9, 1000), (500, 50000), (1500, 150000)]
)
def test_cpu_quota(milli: int, quota: int) -> None:
    assert cpu_quota(milli) == quota


# --- the samples ------------------------------------------------------------------


def test_load_order_and_skips(pods: dict[str, SimPod]) -> None:
    names = [p.pod.name for p in load_pod_dir(PODS)]
    # files sorted by name, documents in order, the ConfigMap skipped
    assert names == ["pct-hp-1", "web", "idle", "limits-only", "with-init"]
    assert pods["limits-only"].source == "40-multi.yaml"


def test_guaranteed_pod(pods: dict[str, SimPod]) -> None:
    sim = pods["pct-hp-1"]
    assert sim.qos is QOSClass.GUARANTEED
    pod = sim.pod
    assert pod.namespace == "default"
    assert pod.uid == pod_uid("default", "pct-hp-1")
    assert len(pod.id) == 64
    assert pod.cgroup_parent == f"/kubepods/pod{pod.uid}"
    assert pod.annotations["balloon.balloons.resource-policy.nri.io"] == "hp-bln"
    assert pod.labels["io.kubernetes.pod.name"] == "pct-hp-1"
    (bench,) = sim.containers
    assert bench.resources is not None and bench.resources.cpu and bench.resources.memory
    cpu, mem = bench.resources.cpu, bench.resources.memory
    assert (cpu.shares, cpu.quota, cpu.period) == (2048, 200000, 100000)
    assert (cpu.cpus, cpu.mems) == ("", "")
    assert mem.limit == 128 * 2**20
    assert mem.swap == mem.limit
    assert bench.args == ["/usr/local/bin/reporter", "--interval", "5"]
    assert "LABEL=hp-1" in bench.env and "INTERVAL=5" in bench.env
    assert not any(e.startswith("NODE=") for e in bench.env)  # valueFrom is skipped
    assert bench.labels == {
        "io.kubernetes.container.name": "bench",
        "io.kubernetes.pod.name": "pct-hp-1",
        "io.kubernetes.pod.namespace": "default",
        "io.kubernetes.pod.uid": pod.uid,
    }
    assert bench.pod_sandbox_id == pod.id


def test_burstable_pod(pods: dict[str, SimPod]) -> None:
    sim = pods["web"]
    assert sim.qos is QOSClass.BURSTABLE
    assert sim.pod.namespace == "shop"
    assert sim.pod.labels["app"] == "web"
    assert sim.pod.cgroup_parent == f"/kubepods/burstable/pod{sim.pod.uid}"
    server, sidecar = sim.containers
    assert server.resources and server.resources.cpu and server.resources.memory
    assert server.resources.cpu.shares == 256
    assert server.resources.cpu.quota == 50000
    assert server.resources.cpu.period == 100000
    assert server.resources.memory.limit == 128 * 2**20
    assert sidecar.resources and sidecar.resources.cpu
    assert sidecar.resources.cpu.shares == 102
    assert sidecar.resources.cpu.quota is None  # no limit: no quota
    assert sidecar.resources.memory is None


def test_besteffort_pod(pods: dict[str, SimPod]) -> None:
    sim = pods["idle"]
    assert sim.qos is QOSClass.BEST_EFFORT
    assert sim.pod.cgroup_parent == f"/kubepods/besteffort/pod{sim.pod.uid}"
    (sleeper,) = sim.containers
    assert sleeper.resources and sleeper.resources.cpu
    assert sleeper.resources.cpu.shares == 2
    assert sleeper.resources.cpu.quota is None
    assert sleeper.resources.memory is None
    assert sleeper.args == ["sleep", "infinity"]


def test_requests_default_to_limits(pods: dict[str, SimPod]) -> None:
    sim = pods["limits-only"]
    assert sim.qos is QOSClass.GUARANTEED
    (app,) = sim.containers
    assert app.resources and app.resources.cpu and app.resources.memory
    assert app.resources.cpu.shares == 1536
    assert app.resources.cpu.quota == 150000
    assert app.resources.memory.limit == 2**30


def test_init_containers_count_for_qos_but_are_not_created(pods: dict[str, SimPod]) -> None:
    sim = pods["with-init"]
    assert sim.pod.uid == "3f1c9a52-8d5e-4b7a-9f64-1c2d3e4f5a6b"
    assert sim.pod.namespace == "batch"
    assert sim.qos is QOSClass.BURSTABLE  # the init container has requests only
    assert [c.name for c in sim.containers] == ["tiny"]
    tiny = sim.containers[0]
    assert tiny.resources and tiny.resources.cpu and tiny.resources.memory
    assert tiny.resources.cpu.shares == 2
    assert tiny.resources.cpu.quota == 1000  # the kubelet's minimum quota
    assert tiny.resources.memory.limit == 10**6


def test_ids_are_deterministic() -> None:
    text = (PODS / "20-burstable.yaml").read_text()
    (a,), (b,) = pods_from_yaml(text), pods_from_yaml(text)
    assert (a.pod.id, a.pod.uid) == (b.pod.id, b.pod.uid)
    other = pods_from_yaml(text.replace("namespace: shop", "namespace: other"))[0]
    assert other.pod.uid != a.pod.uid


def test_runtime_default_cpuset() -> None:
    text = (PODS / "30-besteffort.yaml").read_text()
    (sim,) = pods_from_yaml(text, RuntimeDefaults(cpus="0-7", mems="0"))
    cpu = sim.containers[0].resources.cpu  # type: ignore[union-attr]
    assert cpu is not None and (cpu.cpus, cpu.mems) == ("0-7", "0")


def test_memory_only_limits_are_burstable() -> None:
    doc = """
kind: Pod
metadata: {name: m}
spec:
  containers:
  - name: c
    resources:
      limits: {memory: 1Gi}
"""
    (sim,) = pods_from_yaml(doc)
    assert sim.qos is QOSClass.BURSTABLE


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("kind: Pod\nspec: {containers: [{name: c}]}\n", "metadata.name is required"),
        ("kind: Pod\nmetadata: {name: p}\nspec: {}\n", "spec.containers must not be empty"),
        ("kind: Pod\nmetadata: {name: p}\nspec: {containers: [{image: x}]}\n", "needs a name"),
        (
            "kind: Pod\nmetadata: {name: p}\n"
            "spec: {containers: [{name: c, resources: {limits: {cpu: lots}}}]}\n",
            "quantities must match",
        ),
        ("- just\n- a list\n", "not a mapping"),
    ],
)
def test_invalid_documents(doc: str, message: str) -> None:
    with pytest.raises(PodSpecError, match=message):
        pods_from_yaml(doc)

"""The balloons metrics (reference §15) and inspect state, through the host's
real exposition: the balloons policy in a :class:`PolicyHost` on a generated
sysfs tree, scraped as Prometheus would parse it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nri_balloons.plugin import Balloons
from nri_framework.host import PolicyHost
from nri_framework.instrumentation import Instrumentation
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import TOPOLOGIES
from prometheus_client.parser import text_string_to_metric_families

# Reference §15, in its order: written out here, not imported from the code.
SECTION_15_LABELS = [
    "balloon_type",
    "cpu_class",
    "cpus_min",
    "cpus_max",
    "balloon",
    "groups",
    "cpus",
    "cpus_count",
    "numas",
    "numas_count",
    "dies",
    "dies_count",
    "packages",
    "packages_count",
    "sharedidlecpus",
    "sharedidlecpus_count",
    "cpus_allowed",
    "cpus_allowed_count",
    "mems",
    "containers",
    "tot_req_millicpu",
]

CONFIG = """
reservedResources: {cpu: 1000m}
availableResources: {cpu: "cpuset:1-15"}
pinMemory: true
idleCPUClass: idle
cpuClasses:
- {name: idle}
- {name: fast}
balloonTypes:
- name: dedicated
  matchExpressions: [{key: qosclass, operator: In, values: [Guaranteed]}]
  cpuClass: fast
  preferNewBalloons: true
  maxCPUs: 4
- name: shared
  matchExpressions: [{key: qosclass, operator: In, values: [Burstable, BestEffort]}]
  minBalloons: 1
  minCPUs: 2
  maxCPUs: 6
  groupBy: ${pod/labels/team}
  shareIdleCPUsInSame: package
"""

COMPOSITE = """
reservedResources: {cpu: 1000m}
balloonTypes:
- name: n0
  preferCloseToDevices: [/sys/devices/system/node/node0]
- name: n2
  preferCloseToDevices: [/sys/devices/system/node/node2]
- name: both
  components: [{balloonType: n0}, {balloonType: n2}]
  minCPUs: 4
  minBalloons: 1
"""


def make_host(tmp_path: Path, config: str) -> PolicyHost:
    root = write_topology(tmp_path / "host", TOPOLOGIES["n4c16"])
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(config)
    host = PolicyHost(
        "balloons", Balloons(), options={"config_file": str(cfg)}, host_root=str(root)
    )
    host.synchronize([], [])
    return host


def pod(name: str, team: str = "", namespace: str = "default") -> Pod:
    """A Guaranteed pod, or a Burstable one of ``team``."""
    qos = "burstable/" if team else ""
    return Pod(
        id=name, name=name, uid=f"uid-{name}", namespace=namespace,
        labels={"team": team} if team else {}, cgroup_parent=f"/kubepods/{qos}pod{name}",
    )  # fmt: skip


def guaranteed(cid: str, pod_id: str, cpus: int) -> Container:
    res = CpuResources(shares=1024 * cpus, quota=100_000 * cpus, period=100_000)
    return Container(id=cid, pod_sandbox_id=pod_id, name=cid, resources=Resources(cpu=res))


def burstable(cid: str, pod_id: str, milli: int) -> Container:
    res = CpuResources(shares=milli * 1024 // 1000)
    return Container(id=cid, pod_sandbox_id=pod_id, name=cid, resources=Resources(cpu=res))


def balloon_samples(host: PolicyHost) -> dict[str, tuple[dict[str, str], float]]:
    """Scrape ``/metrics`` (text format) and parse it as Prometheus does: the
    ``nri_policy_balloons_cores`` samples by balloon name."""
    body, content_type = Instrumentation(host, None, "127.0.0.1:0").metrics()
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    fam = families["nri_policy_balloons_cores"]
    assert fam.type == "gauge"
    assert fam.documentation == "CPUs"
    out = {}
    for s in fam.samples:
        assert s.name == "nri_policy_balloons_cores"
        out[s.labels["balloon"]] = (s.labels, s.value)
    return out


def test_labels_are_exactly_section_15(tmp_path: Path) -> None:
    host = make_host(tmp_path, CONFIG)
    samples = balloon_samples(host)
    assert samples
    for labels, _ in samples.values():
        assert sorted(labels) == sorted(SECTION_15_LABELS)
    # and the plain data the policy hands the framework keeps upstream's order
    (fam,) = host.hook.policy_collect_metrics()[0]
    assert list(fam.labels) == SECTION_15_LABELS
    assert (fam.name, fam.unit) == ("balloons", "cores")


def test_values_and_labels_of_a_balloon(tmp_path: Path) -> None:
    host = make_host(tmp_path, CONFIG)
    host.create_container(pod("web", team="a"), burstable("w1", "web", 300))
    host.create_container(pod("api", team="a"), burstable("a1", "api", 200))
    samples = balloon_samples(host)
    labels, value = samples["shared[0]"]
    cpus = labels["cpus"]
    assert value == float(labels["cpus_count"]) == 2.0
    assert labels["balloon_type"] == "shared"
    assert labels["cpu_class"] == ""  # raw type value: no "default"/idle substitution
    assert (labels["cpus_min"], labels["cpus_max"]) == ("2", "6")
    assert labels["groups"] == "a"
    assert labels["containers"] == "default/api/a1,default/web/w1"  # sorted ns/pod/ctr
    assert labels["tot_req_millicpu"] == "500"
    # topology names of the CPU tree, one NUMA node of one die of one package
    assert labels["numas"] in {f"p{p}d0n{n}" for p in (0, 1) for n in range(4)}
    assert labels["dies"] == labels["numas"][:4]
    assert labels["packages"] == labels["numas"][:2]
    assert (labels["numas_count"], labels["dies_count"], labels["packages_count"]) == (
        "1",
        "1",
        "1",
    )
    # shareIdleCPUsInSame: package -> the free CPUs of its package, allowed too
    policy = host.hook.policy_inspect()
    shared_idle = labels["sharedidlecpus"]
    assert shared_idle and int(labels["sharedidlecpus_count"]) > 0
    allowed = f"{cpus},{shared_idle}"
    assert int(labels["cpus_allowed_count"]) == 2 + int(labels["sharedidlecpus_count"])
    assert set(_ids(labels["cpus_allowed"])) == set(_ids(allowed))
    assert labels["mems"] != ""  # pinMemory: true
    assert policy is not None


def test_balloons_appear_and_disappear(tmp_path: Path) -> None:
    host = make_host(tmp_path, CONFIG)
    before = balloon_samples(host)
    assert set(before) == {"reserved[0]", "default[0]", "shared[0]"}
    p, q = pod("g"), pod("h")
    c1, c2 = guaranteed("g1", "g", 2), guaranteed("h1", "h", 1)
    host.create_container(p, c1)
    host.create_container(q, c2)  # preferNewBalloons: a second balloon
    during = balloon_samples(host)
    assert set(during) == set(before) | {"dedicated[0]", "dedicated[1]"}
    assert during["dedicated[0]"][1] == 2.0
    assert during["dedicated[1]"][1] == 1.0
    assert during["dedicated[0]"][0]["cpu_class"] == "fast"
    assert during["dedicated[0]"][0]["containers"] == "default/g/g1"
    host.stop_container(p, c1)
    after_one = balloon_samples(host)
    assert "dedicated[0]" not in after_one and "dedicated[1]" in after_one
    host.stop_container(q, c2)
    assert set(balloon_samples(host)) == set(before)


def test_one_sample_per_top_level_balloon(tmp_path: Path) -> None:
    host = make_host(tmp_path, COMPOSITE)
    samples = balloon_samples(host)
    assert set(samples) == {"reserved[0]", "default[0]", "both[0]"}  # no component samples
    labels, value = samples["both[0]"]
    assert value == 4.0
    assert labels["packages"] == "p0,p1"  # spans both packages, tree order
    assert labels["packages_count"] == "2"
    assert labels["numas"] == "p0d0n0,p1d0n2"


def test_no_metrics_without_configuration(tmp_path: Path) -> None:
    root = write_topology(tmp_path / "host", TOPOLOGIES["n4c16"])
    host = PolicyHost("balloons", Balloons(), host_root=str(root))
    body, _ = Instrumentation(host, None, "127.0.0.1:0").metrics()
    assert b"nri_policy_balloons_cores" not in body
    assert host.hook.policy_inspect() == {"configured": False}


def test_inspect_state(tmp_path: Path) -> None:
    host = make_host(tmp_path, CONFIG)
    host.create_container(pod("g"), guaranteed("g1", "g", 2))
    state: dict[str, Any] = host.hook.policy_inspect()
    balloons = {b["name"]: b for b in state["balloons"]}
    ded = balloons["dedicated[0]"]
    assert ded["type"] == "dedicated"
    assert ded["cpu_class"] == "fast"
    assert ded["containers"] == ["default/g/g1"]
    assert ded["requested_mcpu"] == 2000
    assert balloons["default[0]"]["cpu_class"] == ""  # no cpuClass, no "default" class
    assert state["containers"]["g1"] == {"balloon": "dedicated[0]", "requested_mcpu": 2000}
    cpus = {row["cpu"]: row for row in state["cpus"]}
    assert len(cpus) == 16
    assert cpus[0]["balloon"] == "not allowed"  # availableResources: 1-15
    for cpu in _ids(ded["cpus"]):
        assert cpus[cpu]["balloon"] == "dedicated[0]"
        assert cpus[cpu]["class"] == "fast"
    free = [r for r in state["cpus"] if r["balloon"] == "free"]
    assert free and all(r["class"] == "idle" for r in free)
    assert {r["node"] for r in state["cpus"]} == {0, 1, 2, 3}
    # no PCT configured: no CLOS or punit columns at all
    assert not any("clos" in r or "punit" in r for r in state["cpus"])
    assert "punits" not in state


@pytest.mark.parametrize("name", ["reserved[0]", "shared[0]"])
def test_inspect_and_metrics_agree(tmp_path: Path, name: str) -> None:
    host = make_host(tmp_path, CONFIG)
    host.create_container(pod("web", team="a"), burstable("w1", "web", 300))
    labels, _ = balloon_samples(host)[name]
    row = next(b for b in host.hook.policy_inspect()["balloons"] if b["name"] == name)
    assert row["cpus"] == labels["cpus"]
    assert row["shared_idle_cpus"] == labels["sharedidlecpus"]


def _ids(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out

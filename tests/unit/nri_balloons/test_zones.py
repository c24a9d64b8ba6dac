"""NodeResourceTopology zones of the spec's scenario (step 6.5), from the hook."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace
from nri_balloons.plugin import Balloons
from nri_framework import cpuset
from nri_framework.host import PolicyHost
from nri_framework.simulate.podspec import load_pod_file
from nri_framework.simulate.sysfs import write_topology

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pct-managed"


@pytest.fixture(scope="module")
def host(module_tmp: Path) -> PolicyHost:
    root = module_tmp / "host"
    write_topology(root, "xeon-6776p")
    host = PolicyHost(
        "balloons",
        Balloons(),
        options={"config_file": str(EXAMPLE / "balloons-pct-managed.yaml")},
        host_root=str(root),
    )
    host.synchronize([], [])
    step5 = [EXAMPLE / f"pod-hp-{i}.yaml" for i in range(1, 5)] + [EXAMPLE / "pod-lp.yaml"]
    for sim in (s for path in step5 for s in load_pod_file(path)):
        for i, c in enumerate(sim.containers):
            cid = f"{sim.pod.name}-{i}"
            host.create_container(sim.pod, replace(c, id=cid, pod_sandbox_id=sim.pod.id))
    return host


def zones_of(host: PolicyHost, kind: str) -> dict[str, dict[str, str]]:
    zones = host.hook.policy_topology_zones() or []
    return {
        z.name: {"parent": z.parent, **{a.name: a.value for a in z.attributes}}
        for z in zones
        if z.type == kind
    }


def test_balloon_zones(host: PolicyHost) -> None:
    balloons = zones_of(host, "balloon")
    hp = {k: v for k, v in balloons.items() if k.startswith("hp-bln[")}
    assert sorted(hp) == ["hp-bln[0]", "hp-bln[1]", "hp-bln[2]", "hp-bln[3]"]
    sets = [cpuset.parse(v["cpuset"]) for v in hp.values()]
    assert all(s.bit_count() == 2 for s in sets)
    union = 0
    for s in sets:
        assert s & union == 0, "HP balloons share CPUs"
        union |= s
    assert cpuset.parse(balloons["lp-bln[0]"]["cpuset"]).bit_count() == 8
    assert "reserved[0]" in balloons
    reserved = cpuset.parse(balloons["reserved[0]"]["cpuset"])
    assert reserved & ~cpuset.parse("0,1,128,129") == 0
    for v in balloons.values():
        assert set(v) >= {"cpuset", "shared cpuset", "excess cpus"}


def test_container_zones_match_their_balloons(host: PolicyHost) -> None:
    balloons = zones_of(host, "balloon")
    containers = zones_of(host, "allocation for container")
    assert sorted(containers) == [
        "default/pct-hp-1/bench",
        "default/pct-hp-2/bench",
        "default/pct-hp-3/bench",
        "default/pct-hp-4/bench",
        "default/pct-lp/bench",
    ]
    for z in containers.values():
        assert z["cpuset"] == balloons[z["parent"]]["cpuset"]
    assert containers["default/pct-lp/bench"]["parent"] == "lp-bln[0]"

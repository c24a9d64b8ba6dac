"""The NodeResourceTopology object built from the policy's zones, and
Kubernetes' quantity formatting."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from nri_framework.agent.nrt import canonical_quantity, nrt_object, zone_object
from nri_framework.quantity import format_quantity, parse_quantity
from nri_framework.zones import Zone, ZoneAttribute, ZoneResource

CRD = (
    Path(__file__).resolve().parents[4]
    / "charts/nri-resource-policy-balloons/crds/noderesourcetopology.yaml"
)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (2, "2"),
        (Fraction(3, 2), "1500m"),
        (Fraction(1, 2), "500m"),
        (1000, "1k"),
        (1500, "1500"),
        (12000, "12k"),
        (256, "256"),
        (10**6, "1M"),
        (Fraction(1, 10**10), "1n"),  # finer than nano rounds up
        (-Fraction(1, 2), "-500m"),
    ],
)
def test_format_quantity(value: Fraction | int, text: str) -> None:
    assert format_quantity(value) == text


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("4000m", "4"), ("2500m", "2500m"), ("0", "0"), ("0m", "0"), ("1000", "1k"), ("0.5", "500m")],
)
def test_canonical_quantity(text: str, canonical: str) -> None:
    assert canonical_quantity(text) == canonical
    assert parse_quantity(canonical) == parse_quantity(text)


def test_canonical_quantity_keeps_what_it_cannot_parse() -> None:
    assert canonical_quantity("lots") == "lots"


def cpu(capacity: str, allocatable: str, available: str) -> list[ZoneResource]:
    return [
        ZoneResource(name="cpu", capacity=capacity, allocatable=allocatable, available=available)
    ]


ZONES = [
    Zone(
        name="hp-bln[0]",
        type="balloon",
        resources=cpu("16000m", "8000m", "6000m"),
        attributes=[
            ZoneAttribute(name="cpuset", value="2-3"),
            ZoneAttribute(name="shared cpuset", value=""),
            ZoneAttribute(name="excess cpus", value="0m"),
        ],
    ),
    Zone(
        name="default/pct-hp-1/bench",
        type="allocation for container",
        parent="hp-bln[0]",
        resources=cpu("2", "2", "0"),
        attributes=[
            ZoneAttribute(name="cpuset", value="2-3"),
            ZoneAttribute(name="memory set", value="0"),
        ],
    ),
    Zone(name="empty", type="balloon"),
]


def test_zone_object() -> None:
    assert zone_object(ZONES[0]) == {
        "name": "hp-bln[0]",
        "type": "balloon",
        "resources": [{"name": "cpu", "capacity": "16", "allocatable": "8", "available": "6"}],
        "attributes": [
            {"name": "cpuset", "value": "2-3"},
            {"name": "shared cpuset", "value": ""},
            {"name": "excess cpus", "value": "0m"},
        ],
    }
    assert zone_object(ZONES[1])["parent"] == "hp-bln[0]"
    assert zone_object(ZONES[2]) == {"name": "empty", "type": "balloon"}


def test_new_object() -> None:
    obj = nrt_object("n1", "balloons", ZONES)
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert obj["kind"] == "NodeResourceTopology"
    assert obj["metadata"] == {"name": "n1"}
    assert obj["attributes"] == [{"name": "TopologyPolicy", "value": "balloons"}]
    assert "topologyPolicies" not in obj
    assert [z["name"] for z in obj["zones"]] == ["hp-bln[0]", "default/pct-hp-1/bench", "empty"]


def test_existing_object_keeps_its_metadata_and_gets_new_zones() -> None:
    current = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "n1", "resourceVersion": "42", "uid": "u"},
        "attributes": [{"name": "TopologyPolicy", "value": "old"}],
        "zones": [{"name": "stale", "type": "balloon"}],
    }
    obj = nrt_object("n1", "balloons", ZONES[:1], current)
    assert obj["metadata"] == {"name": "n1", "resourceVersion": "42", "uid": "u"}
    assert obj["attributes"] == [{"name": "TopologyPolicy", "value": "balloons"}]
    assert [z["name"] for z in obj["zones"]] == ["hp-bln[0]"]
    assert current["zones"] == [{"name": "stale", "type": "balloon"}]  # not modified


def test_step_6_5_queries() -> None:
    """The spec's jq queries (step 6.5), in Python, on a built object."""
    items = [nrt_object("n1", "balloons", ZONES)]
    balloons = [
        (
            n["metadata"]["name"],
            z["name"],
            next(a["value"] for a in z["attributes"] if a["name"] == "cpuset"),
        )
        for n in items
        for z in n["zones"]
        if z["type"] == "balloon" and "attributes" in z
    ]
    assert balloons == [("n1", "hp-bln[0]", "2-3")]
    containers = [
        (
            n["metadata"]["name"],
            z["parent"],
            z["name"],
            next(a["value"] for a in z["attributes"] if a["name"] == "cpuset"),
        )
        for n in items
        for z in n["zones"]
        if z["type"] == "allocation for container"
    ]
    assert containers == [("n1", "hp-bln[0]", "default/pct-hp-1/bench", "2-3")]


def test_valid_against_the_crd_schema() -> None:
    import jsonschema

    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")
    schema = version["schema"]["openAPIV3Schema"]
    errors = list(
        jsonschema.Draft7Validator(schema).iter_errors(nrt_object("n1", "balloons", ZONES))
    )
    assert errors == []

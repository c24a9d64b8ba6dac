"""What a balloons decision remembers or skips between containers: the answers
of the types' ``namespaces`` (bounded, forgotten when the types change), a pod's
pinning annotations when it has none, the class lines' CPU sets at INFO."""

from __future__ import annotations

import logging

import pytest
from nri_balloons import annotations as ann
from nri_balloons import balloonclass
from nri_balloons import policy as policy_module
from nri_balloons.configyaml import load_policy
from nri_balloons.policy import BalloonsPolicy, _MemberAnnotations
from nri_balloons.validation import PreparedConfig, validate
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.topologies import N4C16
from nri_framework.topology import Topology
from topologies import topology


def _prepared(topo: Topology, namespaces: str) -> PreparedConfig:
    text = (
        "reservedResources: {cpu: 'cpuset:0'}\n"
        f"balloonTypes:\n- {{name: team, namespaces: [{namespaces}]}}\n"
    )
    result = validate(load_policy(text), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    return result.prepared


def _type_of(policy: BalloonsPolicy, namespace: str) -> str:
    pod = Pod(id="p", name="p", namespace=namespace)
    return policy.choose_type(pod, Container(id="c", pod_sandbox_id="p", name="c")).name


def test_namespace_answers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new namespace adds an answer: a node seeing many namespaces keeps at
    most NAMESPACE_MATCHES of them, and answers right after dropping them."""
    monkeypatch.setattr(policy_module, "NAMESPACE_MATCHES", 8)
    topo = topology(N4C16)
    policy = BalloonsPolicy(topo)
    policy.set_config(_prepared(topo, "'team-*'"))
    for i in range(40):
        assert _type_of(policy, f"team-{i}") == "team"
        assert _type_of(policy, f"other-{i}") == "default"
        assert len(policy._namespace_matches) <= 8


def test_namespace_answers_follow_the_types() -> None:
    """A new configuration's namespaces are asked anew, not answered from the
    old types' matches (set_config and a classes-only swap alike)."""
    topo = topology(N4C16)
    policy = BalloonsPolicy(topo)
    policy.set_config(_prepared(topo, "'team-*'"))
    assert _type_of(policy, "team-a") == "team"
    policy.set_config(_prepared(topo, "'dev-*'"))
    assert _type_of(policy, "team-a") == "default"
    assert _type_of(policy, "dev-a") == "team"
    policy._swap_types(_prepared(topo, "'team-*'"))
    assert _type_of(policy, "dev-a") == "default"
    assert _type_of(policy, "team-a") == "team"


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {ann.HIDE_HYPERTHREADS: "true", ann.MEMORY_TYPE: "HBM"},
        {f"{ann.MEMORY_PRESERVE}/container.c": "true", f"{ann.HIDE_HYPERTHREADS}/pod": "0"},
    ],
)
def test_member_annotations_read(annotations: dict[str, str]) -> None:
    """A pod without annotations reads as one whose lookups all miss."""
    pod = Pod(id="p", name="p", namespace="ns", annotations=annotations)
    ctr = Container(id="c1", name="c")
    said = _MemberAnnotations.read(pod, "c1", "c")
    assert said.pod is pod
    assert said.hide == ann.parse_bool(ann.effective(ann.HIDE_HYPERTHREADS, pod, ctr))
    assert said.memory_preserved == ann.memory_preserved(pod, ctr)
    assert said.memory_type == ann.effective(ann.MEMORY_TYPE, pod, ctr)


def test_class_lines_format_cpus_for_debug_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A balloon resized at every container quotes its CPU set for the debug
    lines of its class (forget, apply) only when they are logged."""
    quoted: list[str] = []
    real = balloonclass.quote
    monkeypatch.setattr(balloonclass, "quote", lambda s: quoted.append(s) or real(s))
    topo = topology(N4C16)
    policy = BalloonsPolicy(topo)
    policy.set_config(_prepared(topo, "'team-*'"))
    cpu = CpuResources(shares=2048)
    for i, level in enumerate((logging.INFO, logging.INFO, logging.DEBUG)):
        quoted.clear()
        pod = Pod(id=f"p{i}", name=f"p{i}", namespace="team-a")
        ctr = Container(id=f"c{i}", pod_sandbox_id=pod.id, name="c", resources=Resources(cpu=cpu))
        with caplog.at_level(level, logger="policy"):
            bln = policy.allocate(pod, ctr)
        assert bln is not None and bln.name == "team[0]"
        if level == logging.INFO:
            assert quoted == []
        else:
            text = [r.getMessage() for r in caplog.records]
            assert any(t.startswith("forget class of cpus") for t in text)
            assert any(t.startswith("apply CPU class") and "team[0]" in t for t in text)

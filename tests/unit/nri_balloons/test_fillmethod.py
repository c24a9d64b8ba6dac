"""Fill methods (nri_balloons.fillmethod, reference §6): the names table and the
chain a balloon type builds."""

from __future__ import annotations

import logging

import msgspec
import pytest
from nri_balloons.config import BalloonType
from nri_balloons.configyaml import load_policy
from nri_balloons.fillmethod import FILL_METHOD_NAMES, FillMethod, fill_chain
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import validate
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.topologies import N4C16
from topologies import topology


def test_every_method_has_its_upstream_name() -> None:
    assert set(FILL_METHOD_NAMES) == set(FillMethod)
    assert sorted(FILL_METHOD_NAMES.values()) == [
        "balanced",
        "balanced-inflate",
        "new-balloon",
        "same-group",
        "same-namespace",
        "same-pod",
    ]
    assert str(FillMethod.SAME_POD) == "same-pod"
    assert f"{FillMethod.BALANCED_INFLATE}" == "balanced-inflate"


@pytest.mark.parametrize(
    ("options", "chain"),
    [
        ({}, "same-pod balanced balanced-inflate new-balloon"),
        ({"prefer_new_balloons": True}, "same-pod new-balloon balanced balanced-inflate"),
        (
            {"group_by": "${pod/labels/app}", "prefer_spreading_pods": True},
            "same-group balanced balanced-inflate new-balloon",
        ),
        (
            {"prefer_per_namespace_balloon": True},
            "same-pod same-namespace new-balloon balanced balanced-inflate new-balloon",
        ),
    ],
)
def test_fill_chain(options: dict[str, object], chain: str) -> None:
    bdef = msgspec.structs.replace(BalloonType(name="t"), **options)
    assert " ".join(map(str, fill_chain(bdef))) == chain


def test_log_lines_name_the_methods(caplog: pytest.LogCaptureFixture) -> None:
    """The debug lines quote the upstream names, as before the enum."""
    topo = topology(N4C16)
    result = validate(
        load_policy("reservedResources: {cpu: 'cpuset:0'}\n"), online_cpus=topo.online
    )
    assert result.prepared is not None, result.errors
    policy = BalloonsPolicy(topo)
    policy.set_config(result.prepared)
    pod = Pod(id="p0", name="p0", namespace="default", cgroup_parent="/kubepods/pod0")
    cpu = CpuResources(shares=1024, quota=100_000, period=100_000)
    container = Container(id="c0", pod_sandbox_id="p0", name="c", resources=Resources(cpu=cpu))
    with caplog.at_level(logging.DEBUG, logger="policy"):
        policy.allocate(pod, container)
    messages = [r.getMessage() for r in caplog.records]
    assert "fill method 'same-pod' not applicable" in messages
    assert "fill method 'balanced' not applicable" in messages
    assert (
        "fill method 'balanced-inflate' suggests any of balloon instances ['default[0]']"
        in messages
    )

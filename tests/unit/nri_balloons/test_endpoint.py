"""``instrumentation.httpEndpoint`` (nri_balloons.endpoint): an address that is
none rejects the configuration with the field named; the running
configuration's value is what ``policy_instrumentation`` answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.plugin import Balloons
from nri_balloons.validation import validate
from nri_framework.host import PolicyHost
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import N4C16

BASE = 'reservedResources: {cpu: "cpuset:0"}\n'


@pytest.mark.parametrize("address", [":8891", "127.0.0.1:0", "[::1]:9000", ""])
def test_addresses_accepted(address: str) -> None:
    doc = load_policy(BASE + f'instrumentation: {{httpEndpoint: "{address}"}}\n')
    result = validate(doc, online_cpus=0xFF)
    assert result.errors == []


@pytest.mark.parametrize("address", ["8891", "host:", "host:http", ":70000"])
def test_an_invalid_address_is_a_validation_error(address: str) -> None:
    doc = load_policy(BASE + f'instrumentation: {{httpEndpoint: "{address}"}}\n')
    result = validate(doc, online_cpus=0xFF)
    assert result.prepared is None
    assert result.errors == [
        "balloons: invalid configuration: instrumentation.httpEndpoint: invalid address "
        f"{address!r}: want HOST:PORT, :PORT or [IPV6]:PORT"
    ]


@pytest.mark.parametrize(
    ("block", "answer"), [('instrumentation: {httpEndpoint: ":8891"}\n', ":8891"), ("", "")]
)
def test_the_hook_answers_the_running_configuration(
    tmp_path: Path, block: str, answer: str
) -> None:
    root = write_topology(tmp_path / "host", N4C16)
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(BASE + block)
    host = PolicyHost(
        "balloons", Balloons(), options={"config_file": str(cfg)}, host_root=str(root)
    )
    assert host.hook.policy_instrumentation() == answer


def test_no_configuration_no_opinion(tmp_path: Path) -> None:
    root = write_topology(tmp_path / "host", N4C16)
    host = PolicyHost("balloons", Balloons(), host_root=str(root))
    assert host.hook.policy_instrumentation() is None

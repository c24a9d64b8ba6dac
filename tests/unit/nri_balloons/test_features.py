from __future__ import annotations

from nri_balloons.configyaml import load_policy
from nri_balloons.features import unimplemented


def test_unimplemented_features_are_named() -> None:
    spec = load_policy(
        """
reservedResources: {cpu: "1"}
agent: {podResourceAPI: true}
balloonTypes:
- name: nic
  irqClaim: ["ttyS0"]
  memoryTypes: [HBM]
  preferCloseToDevices: ["podresourceapi:*.com/nic", "/sys/devices/system/node/node0"]
cpuClasses:
- {name: hp, pctPriority: high}
- {name: plain, maxFreq: base}
"""
    ).spec
    warnings = unimplemented(spec)
    assert not any("irqClaim" in w for w in warnings)  # IRQ claims are implemented
    assert not any("memoryTypes" in w for w in warnings)  # memory types are implemented
    assert not any("podresourceapi" in w for w in warnings)  # implemented, the API on
    assert not any("agent.podResourceAPI" in w for w in warnings)
    assert not any("'hp'" in w for w in warnings)  # Priority Core Turbo is implemented
    assert not any("'plain'" in w for w in warnings)


def test_plain_config_has_no_warnings() -> None:
    spec = load_policy("reservedResources: {cpu: '1'}\nballoonTypes: [{name: a}]").spec
    assert unimplemented(spec) == []

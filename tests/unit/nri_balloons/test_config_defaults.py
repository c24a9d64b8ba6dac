"""BalloonsPolicy warnings, defaults (the CRD's and the code's), built-in balloon
types and their order, validation without the node's CPUs, legacy control.cpu.classes.

Every error text is asserted verbatim, each triggered by a concrete YAML.

Where the neighbouring test modules are: see :mod:`config_checks`.
"""

from __future__ import annotations

import pytest
from config_checks import check
from nri_balloons.config import CPUClass, merge_legacy_cpu_classes
from nri_balloons.configdecode import ConfigError
from nri_balloons.configyaml import load_policy
from nri_balloons.frequency import Frequency
from nri_balloons.validation import validate

# --- warnings ----------------------------------------------------------------------


def test_warnings() -> None:
    result = check(
        """
        balloonTypes:
        - {name: iso, preferIsolCpus: true, shareIdleCPUsInSame: core}
        - {name: nic, preferCloseToDevices: ["podresourceapi:*.com/nic", "podresourceapi:a/b"]}
        - {name: hp, cpuClass: missing}
        """
    )
    assert result.errors == []
    assert result.warnings == [
        "WARNING: using PreferIsolCpus with ShareIdleCpusInSame is highly discouraged",
        'balloon type "nic" prefers affinity container\'s devices [*.com/nic a/b], but the same'
        " balloon may contain many containers because PreferNewBalloons=false (suggest: true) and"
        " PreferSpreadingPods=false (suggest: true) to prefer single container per balloon",
        'cpuClass "missing" referenced by balloon type "hp" is not defined in cpuClasses',
    ]


# --- defaults and built-in balloon types ---------------------------------------------


def test_crd_and_code_defaults() -> None:
    spec = load_policy("reservedResources: {cpu: '1'}\nballoonTypes:\n- name: a\n").spec
    assert spec.pin_cpu is True and spec.pin_memory is True
    assert spec.reserved_pool_namespaces == ["kube-system"]
    assert spec.turbo_domain == "package"
    assert spec.controllable_interrupts == ["*"]
    assert spec.agent.node_resource_topology is True
    assert spec.agent.pod_resource_api is False
    assert spec.balloon_types[0].allocator_priority == "high"
    assert spec.balloon_types[0].prefer_isol_cpus is False
    assert spec.instrumentation.report_period == "30s"
    assert spec.instrumentation.metrics.enabled == ["policy", "buildinfo"]
    assert spec.show_containers_in_nrt is None


def test_agent_section_given_disables_the_nrt_default() -> None:
    spec = load_policy("reservedResources: {cpu: '1'}\nagent: {podResourceAPI: true}\n").spec
    assert (spec.agent.node_resource_topology, spec.agent.pod_resource_api) == (False, True)


def test_builtin_types_for_quantity_reservation() -> None:
    result = check(
        """
        reservedResources: {cpu: 750m}
        reservedPoolNamespaces: [monitor-*]
        balloonTypes:
        - {name: a, namespaces: ["*"]}
        """
    )
    prepared = result.prepared
    assert prepared is not None
    assert [t.name for t in prepared.balloon_types] == ["reserved", "a", "default"]
    r, d = prepared.reserved_type, prepared.default_type
    assert (r.min_cpus, r.min_balloons, r.max_balloons, r.allocator_priority) == (1, 1, 1, "low")
    assert r.namespaces == ["kube-system", "monitor-*"]
    assert r.prefer_close_to_devices == []
    assert prepared.reserved == 0
    assert (d.min_balloons, d.max_balloons, d.allocator_priority) == (1, 1, "low")


def test_user_reserved_and_default_types_keep_their_place() -> None:
    result = check(
        """
        reservedResources: {cpu: 'cpuset:0-3'}
        balloonTypes:
        - {name: first}
        - {name: default, minBalloons: 2, namespaces: [x]}
        - {name: reserved, maxCPUs: 2, namespaces: [infra]}
        """
    )
    prepared = result.prepared
    assert prepared is not None
    assert [t.name for t in prepared.balloon_types] == ["first", "default", "reserved"]
    r = prepared.reserved_type
    assert (r.min_cpus, r.max_cpus, r.allocator_priority) == (2, 2, "normal")
    assert r.namespaces == ["infra", "kube-system", "kube-system"]
    assert prepared.default_type.min_balloons == 2


def test_validation_without_node_cpus_skips_cpu_checks() -> None:
    result = check("reservedResources: {cpu: 'cpuset:0,1,128,129'}\n", online=None)
    assert result.errors == []
    assert result.prepared is not None and result.prepared.allowed is None


# --- legacy control.cpu.classes ------------------------------------------------------

LEGACY = """
reservedResources: {cpu: '1'}
control:
  cpu:
    classes:
      turbo: {minFreq: 3000000, maxFreq: 3800000, disabledCstates: [C6]}
      slow: {maxFreq: 1200000, freqGovernor: powersave}
      same: {maxFreq: 2000000}
      other: {maxFreq: 2000000}
cpuClasses:
- {name: same, maxFreq: 2GHz}
- {name: other, maxFreq: 2.1GHz}
"""


def test_legacy_cpu_classes_are_merged() -> None:
    spec = load_policy(LEGACY).spec
    merged, warnings = merge_legacy_cpu_classes(spec)
    assert [c.name for c in merged.cpu_classes] == ["same", "other", "slow", "turbo"]
    assert merged.cpu_classes[3] == CPUClass(
        name="turbo",
        min_freq=Frequency(3_000_000),
        max_freq=Frequency(3_800_000),
        disabled_cstates=["C6"],
    )
    assert warnings == [
        "control.cpu.classes is deprecated; converted to cpuClasses: [slow turbo]",
        'control.cpu.classes entry "other" overridden by cpuClasses entry; remove the legacy'
        " entry to silence this warning",
    ]
    again, warnings_again = merge_legacy_cpu_classes(merged)
    assert again.cpu_classes == merged.cpu_classes and warnings_again == [warnings[1]]
    assert [c.name for c in spec.cpu_classes] == ["same", "other"]
    result = validate(spec, online_cpus=0xFF)
    assert result.warnings == warnings and result.errors == []
    assert result.prepared is not None
    assert len(result.prepared.spec.cpu_classes) == 4


def test_legacy_control_cpu_requires_classes() -> None:
    with pytest.raises(ConfigError) as exc:
        load_policy("reservedResources: {cpu: '1'}\ncontrol:\n  cpu: {}\n")
    assert exc.value.errors == ['<config>:3:8: missing required field "control.cpu.classes"']

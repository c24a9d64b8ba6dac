"""BalloonsPolicy decoding, defaults and validation; the ``validate`` command.

Every error text is asserted verbatim, each triggered by a concrete YAML.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import msgspec
import pytest
from nri_balloons import validate_cli
from nri_balloons.config import (
    BalloonsPolicy,
    BalloonsPolicySpec,
    CPUClass,
    merge_legacy_cpu_classes,
    to_builtins,
)
from nri_balloons.configdecode import ConfigError, ConfigSyntaxError
from nri_balloons.configyaml import load_policy
from nri_balloons.frequency import Frequency
from nri_balloons.validation import Validation, validate
from nri_framework import cpuset

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples/pct-managed/balloons-pct-managed.yaml"
INVALID = "balloons: invalid configuration: "
INVALID_BLN = INVALID + "balloons: "


def check(
    text: str,
    *,
    online: str | None = "0-15",
    interrupts: list[tuple[int, str]] | None = None,
) -> Validation:
    text = textwrap.dedent(text)
    if "reservedResources" not in text:
        text = "reservedResources:\n  cpu: cpuset:0\n" + text
    policy = load_policy(text)
    return validate(
        policy,
        online_cpus=None if online is None else cpuset.parse(online),
        interrupts=interrupts,
    )


def errors(text: str, **kw: object) -> list[str]:
    return check(text, **kw).errors  # type: ignore[arg-type]


# --- the spec's step 4 ---------------------------------------------------------------


def test_step_4_policy_parses_and_validates_clean() -> None:
    policy = load_policy(EXAMPLE.read_text(), source=str(EXAMPLE))
    assert (policy.api_version, policy.kind, policy.name) == (
        "config.nri/v1alpha1",
        "BalloonsPolicy",
        "default",
    )
    assert policy.metadata["namespace"] == "kube-system"
    spec = policy.spec
    assert spec.reserved_resources == {"cpu": "cpuset:0,1,128,129"}
    assert spec.agent.node_resource_topology and spec.show_containers_in_nrt
    assert [bt.name for bt in spec.balloon_types] == ["reserved", "hp-bln", "lp-bln"]
    hp = spec.balloon_types[1]
    assert (hp.cpu_class, hp.max_cpus, hp.prefer_new_balloons, hp.prefer_spreading_pods) == (
        "hp-pct",
        8,
        True,
        False,
    )
    hp_class = spec.cpu_classes[1]
    assert (hp_class.pct_priority, hp_class.pct_min_freq, hp_class.pct_max_freq) == (
        "high",
        Frequency.BASE,
        Frequency.TURBO,
    )
    assert hp_class.disabled_cstates == ["C6", "C6P"]
    assert spec.cpu_classes[2].pct_min_freq == Frequency.MIN
    assert spec.log.debug == ["policy", "cpu"]

    result = validate(policy, online_cpus=cpuset.parse("0-255"))
    assert result.errors == [] and result.warnings == []
    prepared = result.prepared
    assert prepared is not None
    assert [t.name for t in prepared.balloon_types] == ["reserved", "hp-bln", "lp-bln", "default"]
    reserved = prepared.reserved_type
    assert prepared.reserved == cpuset.parse("0,1,128,129")
    assert (reserved.min_cpus, reserved.min_balloons, reserved.max_balloons) == (0, 1, 1)
    assert reserved.allocator_priority == "normal"
    assert reserved.prefer_close_to_devices == ["reserved CPUs"]
    assert reserved.namespaces == ["kube-system", "kube-system"]
    assert prepared.default_type.allocator_priority == "low"
    # the user's spec is not modified
    assert spec.balloon_types[0].prefer_close_to_devices == []


def test_step_4_policy_on_a_smaller_node() -> None:
    policy = load_policy(EXAMPLE.read_text())
    assert validate(policy, online_cpus=cpuset.parse("0-127")).errors == [
        "balloons: ReservedResources cpus 0-1,128-129 contains CPUs not in AllowedResources"
        " 0-127, namely 128-129"
    ]


# --- the spec's step 11 troubleshooting errors ---------------------------------------


def test_step_11_mutually_exclusive() -> None:
    errs = errors(
        """
        cpuClasses:
        - name: X
          pctPriority: high
          sstClosID: 0
        """
    )
    assert errs == [INVALID + 'cpuClass "X": pctPriority and sstClosID are mutually exclusive']
    assert 'cpuClass "X": pctPriority and sstClosID are mutually exclusive' in errs[0]


def test_step_11_at_most_one_high() -> None:
    errs = errors(
        """
        cpuClasses:
        - {name: hp-b, pctPriority: high}
        - {name: hp-a, pctPriority: high}
        - {name: lp, pctPriority: low}
        """
    )
    assert errs == [
        INVALID
        + "at most one managed PCT cpuClass with pctPriority=high allowed, got 2: [hp-a hp-b]"
    ]
    assert "at most one managed PCT cpuClass with pctPriority=high allowed" in errs[0]


def test_step_11_cannot_mix_modes() -> None:
    errs = errors(
        """
        cpuClasses:
        - {name: hp, pctPriority: high}
        - {name: lp, pctPriority: low}
        - {name: clos1, sstClosID: 1}
        """
    )
    assert errs == [
        INVALID + "pct: cannot mix managed (pctPriority) and assoc-only (sstClosID) modes:"
        " mixing managed (pctPriority) and assoc-only (sstClosID) PCT cpuClasses is not allowed:"
        " managed=map[hp:high lp:low], assocOnly=map[clos1:1]"
    ]
    assert "pct: cannot mix managed (pctPriority) and assoc-only (sstClosID) modes" in errs[0]


# --- every validateConfig / fillBuiltinBalloonDefs / setConfig error ------------------

CASES: list[tuple[str, str, str]] = [
    ("empty type name", "balloonTypes:\n- name: ''\n",
     INVALID_BLN + "missing or empty name in a balloon type"),
    ("missing type name", "balloonTypes:\n- minCPUs: 1\n",
     INVALID_BLN + "missing or empty name in a balloon type"),
    ("duplicate type", "balloonTypes:\n- name: a\n- name: a\n",
     INVALID_BLN + 'two balloon types with the same name: "a"'),
    ("min > max cpus", "balloonTypes:\n- {name: a, minCPUs: 4, maxCPUs: 2}\n",
     INVALID_BLN + 'MinCpus (4) > MaxCpus (2) in balloon type "a"'),
    ("maxCPUs -1", "balloonTypes:\n- {name: a, maxCPUs: -1}\n",
     INVALID_BLN + 'MinCpus (0) > MaxCpus (-1) in balloon type "a"'),
    ("min > max balloons (fixed text)",
     "balloonTypes:\n- {name: a, minCPUs: 1, maxCPUs: 8, minBalloons: 3, maxBalloons: 2}\n",
     INVALID_BLN + 'MinBalloons (3) > MaxBalloons (2) in balloon type "a"'),
    ("memory type", "balloonTypes:\n- {name: a, memoryTypes: [dram, XPOINT]}\n",
     INVALID_BLN + 'invalid memoryTypes: libmem: invalid type: "XPOINT"'),
    ("two reserved balloons (min)", "balloonTypes:\n- {name: reserved, minBalloons: 2}\n",
     INVALID_BLN + 'invalid configuration: exactly one "reserved" balloon expected'
     " but MinBalloons=2"),
    ("two reserved balloons (max)", "balloonTypes:\n- {name: reserved, maxBalloons: 3}\n",
     INVALID_BLN + 'invalid configuration: exactly one "reserved" balloon expected'
     " but MaxBalloons=3"),
    ("composite with cpuClass",
     "balloonTypes:\n- name: a\n- {name: c, cpuClass: x, components: [{balloonType: a}]}\n"
     "cpuClasses:\n- name: x\n",
     INVALID_BLN + 'composite balloon "c" cannot have CpuClasses'),
    ("composite allocation options",
     "balloonTypes:\n- name: a\n"
     "- name: c\n  components: [{balloonType: a}]\n  preferSpreadOnPhysicalCores: false\n"
     "  allocatorTopologyBalancing: true\n"
     "  preferCloseToDevices: [/sys/devices/system/node/node1]\n"
     "  preferIsolCpus: true\n  preferCoreType: performance\n",
     INVALID_BLN + 'CPU allocation options not allowed in composite balloons, but "c" has:'
     " PreferSpreadOnPhysicalCores, AllocatorTopologyBalancing, PreferCloseToDevices,"
     " PreferIsolCpus, PreferCoreType"),
    ("componentCreation without components",
     "balloonTypes:\n- {name: a, componentCreation: balance-balloons}\n",
     INVALID_BLN + 'ComponentCreation mode "balance-balloons" specified but no components'
     " defined"
     ' in balloon type "a"'),
    ("unknown componentCreation",
     "balloonTypes:\n- name: a\n"
     "- {name: c, components: [{balloonType: a}], componentCreation: rr}\n",
     INVALID_BLN + 'unknown ComponentCreation mode "rr" in balloon type "c"'),
    ("load class name", "loadClasses:\n- {level: core}\n",
     INVALID_BLN + "missing or empty name in a load classes list, index 0"),
    ("load class level missing", "loadClasses:\n- {name: avx}\n",
     INVALID_BLN + 'missing or invalid level in load class "avx"'),
    ("load class level invalid", "loadClasses:\n- {name: avx, level: numa}\n",
     INVALID_BLN + 'missing or invalid level in load class "avx"'),
    ("undefined loads",
     "balloonTypes:\n- {name: a, loads: [membw, avx]}\n- {name: b, loads: [avx, l2]}\n"
     "loadClasses:\n- {name: l2, level: l2cache}\n",
     INVALID_BLN + "loads defined in balloonTypes but missing from loadClasses:"
     " map[avx:{} membw:{}]"),
    ("undefined scheduling class",
     "balloonTypes:\n- {name: a, schedulingClass: rt}\n- {name: b, schedulingClass: bg}\n"
     "schedulingClasses:\n- {name: bg, policy: idle}\n",
     INVALID_BLN + "schedulingClass(es) defined in balloonTypes but missing from"
     " schedulingClasses: map[rt:{}]"),
    ("cpuClass name", "cpuClasses:\n- {minFreq: 1GHz}\n",
     INVALID + "missing or empty name in a cpuClasses entry"),
    ("cpuClass pctPriority", "cpuClasses:\n- {name: x, pctPriority: medium}\n",
     INVALID + 'cpuClass "x": invalid pctPriority "medium" (allowed: "high", "low")'),
    ("cpuClass sstClosID", "cpuClasses:\n- {name: x, sstClosID: -1}\n",
     INVALID + 'cpuClass "x": sstClosID must be >= 0, got -1'),
    ("pct freqs with sstClosID", "cpuClasses:\n- {name: x, sstClosID: 1, pctMaxFreq: turbo}\n",
     INVALID + 'cpuClass "x": pctMinFreq/pctMaxFreq require pctPriority (managed mode); they are'
     " incompatible with sstClosID, where the SST CLOS is pre-programmed by"
     " intel-speed-select/BIOS"),
    ("pct freqs without PCT", "cpuClasses:\n- {name: x, pctMinFreq: 1GHz}\n",
     INVALID + 'cpuClass "x": pctMinFreq/pctMaxFreq require pctPriority (managed mode); the'
     " cpuClass is currently not a PCT class"),
    ("publish without PCT", "cpuClasses:\n- {name: x, publishExtendedResource: true}\n",
     INVALID + 'cpuClass "x": publishExtendedResource requires the cpuClass to be a PCT class'
     " (set pctPriority or sstClosID)"),
    ("duplicate cpuClass", "cpuClasses:\n- name: x\n- name: x\n",
     INVALID + 'duplicate cpuClasses name: "x"'),
    ("two low classes",
     "cpuClasses:\n- {name: l1, pctPriority: low}\n- {name: l2, pctPriority: low}\n",
     INVALID + "at most one managed PCT cpuClass with pctPriority=low allowed, got 2: [l1 l2]"),
    ("empty component",
     "balloonTypes:\n- name: a\n- {name: c, components: [{balloonType: a}, {}]}\n",
     INVALID_BLN + "missing or empty component balloonType name in composite balloon"
     ' "c" component 2'),
    ("undefined component", "balloonTypes:\n- {name: c, components: [{balloonType: nope}]}\n",
     INVALID_BLN + 'balloon type "nope" in composite balloon "c" is not defined in balloonTypes'),
    ("circular composition",
     "balloonTypes:\n- {name: c1, components: [{balloonType: c2}]}\n"
     "- {name: c2, components: [{balloonType: c1}]}\n",
     INVALID_BLN + 'circular composition detected in composite balloon "c1"'),
    ("self composition", "balloonTypes:\n- {name: c, components: [{balloonType: c}]}\n",
     INVALID_BLN + 'circular composition detected in composite balloon "c"'),
    ("reserved outside allowed", "reservedResources:\n  cpu: cpuset:14-17\n",
     "balloons: ReservedResources cpus 14-17 contains CPUs not in AllowedResources 0-15,"
     " namely 16-17"),
    ("reserved outside available",
     "reservedResources: {cpu: 'cpuset:0-3'}\navailableResources: {cpu: 'cpuset:2-9'}\n",
     "balloons: ReservedResources cpus 0-3 contains CPUs not in AllowedResources 2-9, namely 0-1"),
    ("reserved quantity syntax", "reservedResources:\n  cpu: 2x\n",
     "balloons: failed to parse reserved CPU quantity '2x': failed to parse amount '2x' as"
     " resource quantity: quantities must match the regular expression: '2x'"),
    ("reserved maxCPUs vs quantity",
     "reservedResources: {cpu: '1500m'}\nballoonTypes:\n- {name: reserved, maxCPUs: 1}\n",
     "balloons: mismatching reserved balloon maxCpus: 1 and ReservedResources cpus: 1500 mCPU"
     " (implies minCpu 2)"),
    ("reserved minCPUs vs quantity",
     "reservedResources: {cpu: '2'}\nballoonTypes:\n- {name: reserved, minCPUs: 3}\n",
     "balloons: mismatching reserved balloon minCpus: 3 and ReservedResources cpus: 2000 mCPU"),
    ("available quantity", "availableResources: {cpu: '4'}\n",
     "balloons: can't handle CPU resources given as resource.Quantity (4)"),
    ("irq pattern", "controllableInterrupts: ['*', 'eth[']\n",
     'balloons: failed to set allowed interrupts: invalid globbing pattern "eth[":'
     " syntax error in pattern"),
    ("enum", "turboDomain: world\n",
     'spec.turboDomain: Unsupported value: "world": supported values: "package", "system"'),
    ("allocatorPriority", "balloonTypes:\n- {name: a, allocatorPriority: urgent}\n",
     'spec.balloonTypes[0].allocatorPriority: Unsupported value: "urgent": supported values:'
     ' "high", "normal", "low", "none"'),
    ("shareIdleCPUsInSame", "balloonTypes:\n- {name: a, shareIdleCPUsInSame: socket}\n",
     'spec.balloonTypes[0].shareIdleCPUsInSame: Unsupported value: "socket": supported values:'
     ' "system", "package", "die", "numa", "l2cache", "core", "thread"'),
    ("preferCoreType", "balloonTypes:\n- {name: a, preferCoreType: fast}\n",
     'spec.balloonTypes[0].preferCoreType: Unsupported value: "fast": supported values:'
     ' "efficient", "performance"'),
    ("irqMode", "balloonTypes:\n- {name: a, irqMode: isolated}\n",
     'spec.balloonTypes[0].irqMode: Unsupported value: "isolated": supported values:'
     ' "sink", "isolate"'),
    ("resource name", "reservedResources: {cpus: '2'}\n",
     'spec.reservedResources: Unsupported value: "cpus": supported values: "cpu", "memory"'),
    ("turboPriority", "cpuClasses:\n- {name: x, turboPriority: -1}\n",
     "spec.cpuClasses[0].turboPriority: Invalid value: -1: spec.cpuClasses[0].turboPriority in"
     " body should be greater than or equal to 0"),
    ("scheduling policy",
     "schedulingClasses:\n- {name: s, policy: realtime, flags: [reclaim, nope], ioClass: be}\n",
     'spec.schedulingClasses[0].policy: Unsupported value: "realtime": supported values: "none",'
     ' "other", "fifo", "rr", "batch", "iso", "idle", "deadline"'),
    ("reportPeriod", "instrumentation: {reportPeriod: 30x}\n",
     'spec.instrumentation.reportPeriod: Invalid value: "30x": spec.instrumentation.reportPeriod'
     ' in body must be of type duration: "30x"'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("yaml_text", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_error_text(yaml_text: str, message: str) -> None:
    errs = errors(yaml_text)
    assert message in errs, errs


def test_errors_are_all_collected_in_upstream_order() -> None:
    errs = errors(
        """
        reservedResources: {cpu: 'cpuset:0-1'}
        turboDomain: world
        balloonTypes:
        - {name: a, minCPUs: 4, maxCPUs: 2, matchExpressions: [{key: nope, operator: Exists}]}
        - {name: a, minBalloons: 2, maxBalloons: 1}
        - {name: b, loads: [avx]}
        cpuClasses:
        - {name: x, pctPriority: high, sstClosID: 2}
        - {name: y, publishExtendedResource: true}
        """
    )
    assert errs == [
        'spec.turboDomain: Unsupported value: "world": supported values: "package", "system"',
        'expression: invalid expression, unknown key "nope"',
        INVALID_BLN + 'MinCpus (4) > MaxCpus (2) in balloon type "a"',
        INVALID_BLN + 'two balloon types with the same name: "a"',
        INVALID_BLN + 'MinBalloons (2) > MaxBalloons (1) in balloon type "a"',
        INVALID_BLN + "loads defined in balloonTypes but missing from loadClasses: map[avx:{}]",
        INVALID + 'cpuClass "x": pctPriority and sstClosID are mutually exclusive',
        INVALID + 'cpuClass "y": publishExtendedResource requires the cpuClass to be a PCT class'
        " (set pctPriority or sstClosID)",
    ]
    assert check("turboDomain: world\n").primary == errs[0]


def test_circular_compositions_report_each_loop_start() -> None:
    errs = errors(
        """
        balloonTypes:
        - {name: c1, components: [{balloonType: c2}]}
        - {name: c2, components: [{balloonType: c1}]}
        """
    )
    assert errs == [
        INVALID_BLN + 'circular composition detected in composite balloon "c1"',
        INVALID_BLN + 'circular composition detected in composite balloon "c2"',
    ]


def test_exclude_cpuset_reserved_and_available() -> None:
    result = check(
        """
        reservedResources: {cpu: 'exclude-cpuset:2-15'}
        availableResources: {cpu: 'exclude-cpuset:12-15'}
        """
    )
    assert result.errors == []
    assert result.prepared is not None
    assert result.prepared.allowed == cpuset.parse("0-11")
    assert result.prepared.reserved == cpuset.parse("0-1")


def test_irq_claims_of_denied_interrupts() -> None:
    irqs = [(4, "IO-APIC 4-edge ttyS0"), (8, "IO-APIC 8-edge rtc0"), (24, "PCI-MSI eth0-rx")]
    text = """
        controllableInterrupts: ["*rtc*", "*eth*"]
        balloonTypes:
        - {name: a, irqClaim: ["*ttyS0", "*rtc0"], irqMode: sink}
        """
    assert errors(text, interrupts=irqs) == [
        'invalid irqclaim ["*ttyS0" "*rtc0"]: denied interrupt: irq 4 (IO-APIC 4-edge ttyS0)'
        ' denied but matched by user pattern "*ttyS0"'
    ]
    assert errors(text) == []  # no interrupts known: not checked
    assert errors(text.replace('"*rtc*", "*eth*"', '"*"'), interrupts=irqs) == []


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


# --- decoding --------------------------------------------------------------------------


def test_spec_only_document() -> None:
    policy = load_policy("reservedResources:\n  cpu: cpuset:0\npinMemory: false\n")
    assert isinstance(policy, BalloonsPolicy)
    assert policy.spec.pin_memory is False
    assert policy.name == ""


def test_every_unknown_field_is_reported_with_path_line_and_hint() -> None:
    text = """\
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata:
  name: default
spec:
  reservedResources:
    cpu: "1"
  pinCpu: true
  balloonTypes:
  - name: a
    maxCpus: 2
    matchExpressions:
    - {key: name, op: Equals, values: [a]}
  cpuClasses:
  - name: x
    turboPrio: 1
  wibble: 3
"""
    with pytest.raises(ConfigError) as exc:
        load_policy(text, source="p.yaml")
    assert exc.value.errors == [
        'p.yaml:8:3: unknown field "spec.pinCpu" (did you mean "pinCPU"?)',
        'p.yaml:11:5: unknown field "spec.balloonTypes[0].maxCpus" (did you mean "maxCPUs"?)',
        'p.yaml:13:19: unknown field "spec.balloonTypes[0].matchExpressions[0].op"',
        'p.yaml:16:5: unknown field "spec.cpuClasses[0].turboPrio" (did you mean "turboPriority"?)',
        'p.yaml:17:3: unknown field "spec.wibble"',
    ]


def test_preferFarFromDevices_is_not_settable() -> None:
    with pytest.raises(
        ConfigError, match=r'unknown field "balloonTypes\[0\].preferFarFromDevices"'
    ):
        load_policy(
            "reservedResources: {cpu: '1'}\nballoonTypes:\n- {name: a, preferFarFromDevices: [x]}\n"
        )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("spec: {}\n", '<config>:1:7: missing required field "spec.reservedResources"'),
        ("pinCPU: true\n", '<config>:1:1: missing required field "reservedResources"'),
        ("kind: BalloonsPolicy\n", '<config>:1:1: missing required field "spec"'),
        (
            "reservedResources: {cpu: 2}\n",
            "<config>:1:26: reservedResources.cpu: expected str, got int",
        ),
        (
            "reservedResources: {cpu: '2'}\nballoonTypes:\n- {name: a, minCPUs: two}\n",
            "<config>:3:22: balloonTypes[0].minCPUs: expected int, got str",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nspec: {}\n",
            '<config>:1:13: apiVersion "v1" is not config.nri/v1alpha1',
        ),
        ("- a\n", "<config>:1:1: document is not a mapping"),
        # cpuset amounts are parsed while the positions are known (upstream's words)
        (
            "reservedResources:\n  cpu: cpuset:0-x\n",
            "<config>:2:8: balloons: failed to parse reserved CPU cpuset '0-x': failed to parse"
            " amount '0-x' as cpuset: invalid cpuset '0-x': bad element '0-x'",
        ),
        (
            "reservedResources: {cpu: '1'}\navailableResources: {cpu: 'cpuset:1-'}\n",
            "<config>:2:27: balloons: failed to parse available CPU cpuset '1-': failed to parse"
            " amount '1-' as cpuset: invalid cpuset '1-': bad element '1-'",
        ),
    ],
)
def test_decoding_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_policy(text)
    assert exc.value.errors[0] == message


def test_yaml_syntax_error_has_a_position() -> None:
    with pytest.raises(ConfigSyntaxError) as exc:
        load_policy("spec:\n  reservedResources: {cpu: '1'\n  pinCPU: [\n", source="x.yaml")
    assert exc.value.errors[0].startswith("x.yaml:3:")
    assert "invalid YAML" in exc.value.errors[0]


def test_round_trip_through_builtins() -> None:
    policy = load_policy(EXAMPLE.read_text())
    data = to_builtins(policy)
    assert data["spec"]["cpuClasses"][1]["pctMaxFreq"] == "turbo"
    assert data["spec"]["balloonTypes"][1]["maxCPUs"] == 8
    again = msgspec.convert(
        data["spec"], BalloonsPolicySpec, dec_hook=lambda t, o: Frequency.from_json(o)
    )
    assert again == policy.spec


# --- the validate command --------------------------------------------------------------


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = validate_cli.main(list(argv), out=out)
    return rc, out.getvalue()


def test_cli_valid_example() -> None:
    rc, out = run_cli(str(EXAMPLE), "--cpus", "0-255")
    assert rc == 0
    assert out == f'{EXAMPLE}: valid BalloonsPolicy "default", 0 warnings\n'


def test_cli_without_node_notes_the_skipped_checks() -> None:
    rc, out = run_cli(str(EXAMPLE))
    assert rc == 0
    assert out.splitlines()[-1].startswith("note: CPU sets not checked against a node")


def test_cli_prints_every_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        "reservedResources: {cpu: 'cpuset:0-3'}\n"
        "balloonTypes:\n- {name: a, cpuClass: nope}\n"
        "cpuClasses:\n- {name: X, pctPriority: high, sstClosID: 0}\n"
        "- {name: Y, pctPriority: high}\n"
    )
    rc, out = run_cli(str(f), "--cpus", "0-1")
    assert rc == 1
    assert out.splitlines() == [
        "error: balloons: ReservedResources cpus 0-3 contains CPUs not in AllowedResources 0-1,"
        " namely 2-3",
        "error: " + INVALID + 'cpuClass "X": pctPriority and sstClosID are mutually exclusive',
        "error: " + INVALID + "at most one managed PCT cpuClass with pctPriority=high allowed,"
        " got 2: [X Y]",
        'warning: cpuClass "nope" referenced by balloon type "a" is not defined in cpuClasses',
        f"{f}: invalid BalloonsPolicy: 3 errors, 1 warning",
    ]


def test_cli_host_root(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/interrupts").write_text(
        "           CPU0       CPU1\n"
        "  4:          0        115   IO-APIC   4-edge      ttyS0\n"
        "  8:          0          0   IO-APIC   8-edge      rtc0\n"
        "NMI:          0          0   Non-maskable interrupts\n"
    )
    f = tmp_path / "p.yaml"
    f.write_text(
        "reservedResources: {cpu: 'cpuset:3-4'}\ncontrollableInterrupts: ['*rtc0']\n"
        "balloonTypes:\n- {name: a, irqClaim: ['*ttyS0']}\n"
    )
    rc, out = run_cli(str(f), "--host-root", str(tmp_path))
    assert rc == 1
    assert out.splitlines()[:2] == [
        'error: invalid irqclaim ["*ttyS0"]: denied interrupt: irq 4 (IO-APIC 4-edge ttyS0)'
        ' denied but matched by user pattern "*ttyS0"',
        "error: balloons: ReservedResources cpus 3-4 contains CPUs not in AllowedResources 0-3,"
        " namely 4",
    ]


def test_cli_unreadable_and_unparseable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(str(tmp_path / "missing.yaml"))[0] == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec:\n  reservedResources: [\n")
    assert run_cli(str(bad))[0] == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:3:1: invalid YAML: ")
    assert run_cli(str(bad), "--cpus", "0-x")[0] == 2
    assert "cannot read the node's CPUs" in capsys.readouterr().err
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert run_cli(str(empty))[0] == 2


def test_cli_multiple_documents(tmp_path: Path) -> None:
    f = tmp_path / "all.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n"
        + EXAMPLE.read_text()
        + "---\napiVersion: config.nri/v1alpha1\nkind: BalloonsPolicy\nmetadata: {name: n2}\n"
        "spec: {reservedResources: {cpu: '1'}, cpuClasses: [{name: ''}]}\n"
    )
    rc, out = run_cli(str(f), "--cpus", "0-255")
    assert rc == 1
    assert out.splitlines() == [
        "--- document 2",
        f'{f} (document 2): valid BalloonsPolicy "default", 0 warnings',
        "--- document 3",
        "error: " + INVALID + "missing or empty name in a cpuClasses entry",
        f'{f} (document 3): invalid BalloonsPolicy "n2": 1 error, 0 warnings',
        f"{f}: skipped 1 document of other kinds",
    ]


# --- module homes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "module", ["nri_balloons.configdecode", "nri_balloons.configyaml", "nri_balloons.config"]
)
def test_each_config_module_imports_first(module: str) -> None:
    """config, configdecode and configyaml import each other (the old names
    stay importable from config): each can be the first one a process imports."""
    import subprocess
    import sys

    code = f"import {module}; from nri_balloons.config import ConfigError, load_policy"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_old_config_names_are_the_new_ones() -> None:
    """The names that moved out of config are the same objects there, and a
    name config never had is still an AttributeError."""
    from nri_balloons import config, configdecode, configyaml

    assert config.ConfigError is configdecode.ConfigError
    assert config.ConfigSyntaxError is configdecode.ConfigSyntaxError
    assert config.decode_policy is configdecode.decode_policy
    assert config.load_policy is configyaml.load_policy
    assert config.parse_yaml is configyaml.parse_yaml
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        config.nope  # noqa: B018

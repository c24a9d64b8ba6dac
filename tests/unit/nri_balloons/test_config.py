"""BalloonsPolicy validation: the spec's step 4 policy, step 11's troubleshooting
errors, every validateConfig / fillBuiltinBalloonDefs / setConfig error in upstream's
order, excluded and reserved CPUs, IRQ claims.

Every error text is asserted verbatim, each triggered by a concrete YAML.

Where the neighbouring test modules are: see :mod:`config_checks`.
"""

from __future__ import annotations

import pytest
from config_checks import EXAMPLE, INVALID, INVALID_BLN, check, errors
from nri_balloons.configyaml import load_policy
from nri_balloons.frequency import Frequency
from nri_balloons.validation import validate
from nri_framework import cpuset

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
    ("nodeResourceTopologyWindow", "agent: {nodeResourceTopologyWindow: 10 s}\n",
     'spec.agent.nodeResourceTopologyWindow: Invalid value: "10 s":'
     ' spec.agent.nodeResourceTopologyWindow in body must be of type duration: "10 s"'),
    ("negative nodeResourceTopologyWindow", "agent: {nodeResourceTopologyWindow: -1s}\n",
     'spec.agent.nodeResourceTopologyWindow: Invalid value: "-1s": must not be negative'),
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

"""cpuClasses end to end: the balloons plugin process, the SST helper as a real
subprocess on the sim backend, both on one n4c16 host root, driven by the
runtime simulator. The plugin never writes sysfs; the assertions read the
files the helper wrote. Ports upstream's e2e test17 (C-states) and test18
(turboPriority) checks that do not need a Kubernetes API server.
"""

from __future__ import annotations

import signal

from sst_node import Node, node

MIN, BASE, TURBO = 800_000, 2_900_000, 3_800_000  # n4c16's cpufreq
AVAILABLE = [2, 3, 4, 5, 6, 7, 10, 11, 12, 13]

CSTATES_CONFIG = """
reservedResources: {cpu: 750m}
availableResources: {cpu: "cpuset:2-7,10-13"}
balloonTypes:
- name: lowlat
  cpuClass: lowlat
  minCPUs: 2
  maxCPUs: 2
cpuClasses:
- name: lowlat
  minFreq: 2GHz
  maxFreq: 3GHz
  disabledCstates: [C4, C8]
- name: default
  minFreq: min
  maxFreq: base
"""

# upstream test18's balloons-turbo.cfg
TURBO_CONFIG = """
reservedResources: {cpu: 750m}
availableResources: {cpu: "cpuset:2-7,10-13"}
allocatorTopologyBalancing: false
idleCPUClass: default-noturbo
balloonTypes:
- name: reserved
  cpuClass: default-turbo
- name: turbo-high-bln
  cpuClass: turbo-high
  minCPUs: 1
  maxCPUs: 2
- name: turbo-low-bln
  cpuClass: turbo-low
  minCPUs: 1
  maxCPUs: 2
cpuClasses:
- {name: turbo-high, minFreq: turbo, maxFreq: turbo, turboPriority: 10}
- {name: turbo-low, minFreq: turbo, maxFreq: turbo, turboPriority: 1}
- {name: default-turbo, minFreq: min, maxFreq: turbo}
- {name: default-noturbo, minFreq: min, maxFreq: base}
log:
  debug: [cpuclass]
"""

# upstream test18's balloons-turbo-oldsyntax.cfg
LEGACY_CONFIG = """
reservedResources: {cpu: 750m}
availableResources: {cpu: "cpuset:2-7,10-13"}
idleCPUClass: legacy-idle
balloonTypes:
- name: legacy-bln
  cpuClass: legacy-fast
  minCPUs: 1
  maxCPUs: 1
control:
  cpu:
    classes:
      legacy-idle: {minFreq: 800000, maxFreq: 2900000}
      legacy-fast: {minFreq: 3800000, maxFreq: 3800000}
"""


async def test_cstates_and_frequencies_follow_the_balloon() -> None:
    async with node(CSTATES_CONFIG) as n:
        # no idleCPUClass: the "default" class on every available CPU
        for cpu in AVAILABLE:
            assert n.freq(cpu) == (MIN, BASE), cpu
            assert n.disabled(cpu) == set(), cpu
        assert n.freq(0) == (MIN, TURBO)  # outside availableResources: untouched
        cpus = await n.create("pod0", "lowlat")
        assert len(cpus) == 2
        for cpu in AVAILABLE:
            if cpu in cpus:
                assert n.disabled(cpu) == {"C4", "C8"}, cpu
                assert n.freq(cpu) == (2_000_000, 3_000_000), cpu
            else:
                assert n.disabled(cpu) == set(), cpu
                assert n.freq(cpu) == (MIN, BASE), cpu
        await n.delete("pod0")
        for cpu in AVAILABLE:
            assert n.disabled(cpu) == set(), cpu
            assert n.freq(cpu) == (MIN, BASE), cpu


async def test_killed_helper_does_not_fail_containers_and_settings_come_back() -> None:
    async with node(CSTATES_CONFIG) as n:
        n.helper.kill()
        cpus = await n.create("pod0", "lowlat")  # pinned all the same
        assert len(cpus) == 2
        await n.plugin.wait_output("cpuclass: SST helper unavailable:", timeout=5)
        # while the helper is away, hooks leave the retries to a timer: the
        # container is pinned all the same (the round trip while the helper is
        # away is a figure of tests/bench/bench_pct.py, pct.away_p99)
        cpus |= await n.create("pod1", "lowlat", cpu="2")
        assert len(cpus) == 4
        for cpu in cpus:
            assert n.disabled(cpu) == set()
        n.helper.start()
        await n.plugin.wait_output("cpuclass: SST helper is back", timeout=15)
        for cpu in AVAILABLE:
            if cpu in cpus:
                assert n.disabled(cpu) == {"C4", "C8"}, cpu
                assert n.freq(cpu) == (2_000_000, 3_000_000), cpu
            else:
                assert n.freq(cpu) == (MIN, BASE), cpu
        assert len(n.lines("cpuclass: SST helper unavailable:")) == 1


def winner(n: Node, cls: str, since: int) -> str:
    lines = [line for line in n.lines(f'class "{cls}" ', since) if "turbo: " in line]
    assert lines, n.plugin.output()
    return lines[-1]


async def test_turbo_priority() -> None:
    """Upstream test18: the highest turboPriority class active in a package
    keeps turbo, the others drop to base; turbo comes back when it leaves;
    only what changed is written."""
    async with node(TURBO_CONFIG) as n:
        writes = "enforcing cpu frequency"
        idle = [c for c in AVAILABLE if n.freq(c) == (MIN, BASE)]
        reserved = [c for c in AVAILABLE if n.freq(c) == (MIN, TURBO)]
        assert len(reserved) == 1 and len(idle) == 9, [n.freq(c) for c in AVAILABLE]
        rcpu = reserved[0]
        init = n.lines(writes)
        assert n.lines("DEBUG policy") == []  # log.debug names only cpuclass
        assert any(
            'from class "default-turbo@d' in x and x.endswith(f"on cpu {rcpu}") for x in init
        )

        # step 1: turbo-low wins, default-turbo loses turbo on the reserved CPU
        mark = n.mark()
        (low,) = await n.create("pod0", "turbo-low-bln")
        assert "winner=true" in winner(n, "turbo-low", mark)
        assert winner(n, "turbo-low", mark).endswith("maxFreq=3800000")
        assert n.package(low) == n.package(rcpu)  # one turbo domain (as upstream's layout)
        assert n.freq(low) == (TURBO, TURBO)
        assert n.freq(rcpu) == (MIN, BASE)
        assert "winner=false" in winner(n, "default-turbo", mark)
        step = n.lines(writes, mark)
        assert len(step) == len(set(step)), step  # no duplicate writes

        # step 1b: a second container in the same balloon writes nothing
        mark = n.mark()
        await n.create("pod1", "turbo-low-bln", cpu="100m")
        assert n.lines(writes, mark) == []

        # step 2: turbo-high wins where it lands; turbo-low in the same package loses
        mark = n.mark()
        (high,) = await n.create("pod2", "turbo-high-bln")
        assert n.package(high) == n.package(low)
        assert "winner=true" in winner(n, "turbo-high", mark)
        assert n.freq(high) == (TURBO, TURBO)
        assert n.freq(low) == (BASE, BASE)
        assert "winner=false" in winner(n, "turbo-low", mark)
        assert not any(x.endswith(f"on cpu {rcpu}") for x in n.lines(writes, mark))

        # step 3: turbo-high gone, turbo-low regains turbo, the CPU goes back to idle
        mark = n.mark()
        await n.delete("pod2")
        assert n.freq(low) == (TURBO, TURBO)
        assert n.freq(high) == (MIN, BASE)
        assert not any(x.endswith(f"on cpu {rcpu}") for x in n.lines(writes, mark))

        # step 4: one of two containers gone, the balloon stays: no writes
        mark = n.mark()
        await n.delete("pod1")
        assert n.lines(writes, mark) == []

        # step 5: turbo-low gone, default-turbo regains turbo on the reserved CPU
        mark = n.mark()
        await n.delete("pod0")
        assert "winner=true" in winner(n, "default-turbo", mark)
        assert n.freq(low) == (MIN, BASE)
        assert n.freq(rcpu) == (MIN, TURBO)


async def test_legacy_control_cpu_classes_drive_writes() -> None:
    async with node(LEGACY_CONFIG) as n:
        # the reserved balloon has no class and there is no "default" class:
        # its CPU is never written (upstream: class "" is not enforced)
        freqs = sorted(n.freq(cpu) for cpu in AVAILABLE)
        assert freqs == [(MIN, BASE)] * 9 + [(MIN, TURBO)]
        assert "control.cpu.classes is deprecated" in n.plugin.output()
        (cpu,) = await n.create("pod3", "legacy-bln")
        assert n.freq(cpu) == (TURBO, TURBO)


# upstream test18's balloons-turbo-defaultclass.cfg
DEFAULTCLASS_CONFIG = """
reservedResources: {cpu: 750m}
availableResources: {cpu: "cpuset:2-7,10-13"}
balloonTypes:
- name: reserved
- name: fast-bln
  cpuClass: fast
  minCPUs: 1
  maxCPUs: 1
cpuClasses:
- {name: default, minFreq: min, maxFreq: base}
- {name: fast, minFreq: turbo, maxFreq: turbo}
"""


async def test_default_class_and_class_only_reload() -> None:
    """No idleCPUClass and no cpuClass on the reserved type: the "default"
    class on idle and reserved CPUs; a cpuClasses change (SIGHUP reload) is
    written to every default-class CPU at once, without any pod event."""
    async with node(DEFAULTCLASS_CONFIG) as n:
        for cpu in AVAILABLE:
            assert n.freq(cpu) == (MIN, BASE), cpu
        (cpu,) = await n.create("pod4", "fast-bln")
        assert n.freq(cpu) == (TURBO, TURBO)
        await n.delete("pod4")
        assert n.freq(cpu) == (MIN, BASE)

        cfg = n.work / "balloons.yaml"
        cfg.write_text(DEFAULTCLASS_CONFIG.replace("maxFreq: base", "maxFreq: turbo"))
        n.plugin.proc.send_signal(signal.SIGHUP)
        await n.plugin.wait_output("config update from", timeout=10)
        assert "configuration changes only on CPU classes" in n.plugin.output()
        for cpu in AVAILABLE:
            assert n.freq(cpu) == (MIN, TURBO), cpu

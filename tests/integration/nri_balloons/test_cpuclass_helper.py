"""cpuClasses end to end: the balloons plugin process, the SST helper as a real
subprocess on the sim backend, both on one n4c16 host root, driven by the
runtime simulator. The plugin never writes sysfs; the assertions read the
files the helper wrote. Upstream's e2e test17 and test18 are ported one to one
in ``test_e2e_test17_cstates_scheduling.py`` and ``test_e2e_test18_turbo_priority.py``.
"""

from __future__ import annotations

from sst_node import node

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

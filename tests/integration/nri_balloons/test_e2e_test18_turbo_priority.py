"""Upstream e2e balloons/n4c16/test18-turbo-priority, step by step: the
highest ``turboPriority`` class active in a turbo domain keeps turbo, the
others drop to base, turbo comes back when the winner leaves; the frequency
writes are minimal (none duplicated, none for a no-op assignment, some on
every turbo<->base transition and for idle CPUs); the legacy
``control.cpu.classes`` still drives writes; the implicit ``default`` class on
idle and reserved CPUs; a cpuClasses-only change applied at once to every
default-class CPU; ``turboDomain`` package vs system.

Upstream's checks grep the plugin's ``enforcing cpu frequency`` and ``turbo:``
log lines; so do these, on the plugin process's own output (the lines are
upstream's, see reference §12.4/§12.5). Besides, each step reads the
``scaling_min/max_freq`` files the SST helper (the only writer) wrote on the
n4c16 host root, where upstream's fake ``OVERRIDE_SYS_CPUFREQ`` fs (base
2.9 GHz, min 0.8, max 3.8) is the simulated sysfs with the same figures.

What differs, and why:

* upstream patches the ``BalloonsPolicy`` CR with ``kubectl patch``; no API
  server runs here, so each patch is the same change written to the
  configuration file and applied with SIGHUP (the same reconfigure path:
  ``configuration changes only on CPU classes`` for a cpuClasses-only patch).
* ``kubectl delete pod ... --now`` / ``wait-pod-gone`` are the runtime
  simulator's StopPodSandbox + RemovePodSandbox, awaited; the writes of a
  decision are committed within its hook, so ``wait-enforce-grows`` is a
  plain check that the count grew.
* ``agent.nodeResourceTopology`` is left out of the configurations (no
  Kubernetes agent here; NRT has nothing to do with the checks).
* upstream's oldsyntax step ends by deleting pod3 before the next launch;
  here every configuration runs on a fresh node (a helm-terminate), so the
  delete is implicit.
"""

from __future__ import annotations

import re
import signal

from sst_node import Node, node

MIN, BASE, TURBO = 800_000, 2_900_000, 3_800_000  # n4c16's cpufreq
FREE = [2, 3, 4, 5, 6, 7, 11, 12, 13]
RESERVED = 10  # the reserved balloon's CPU of upstream's layout
AVAILABLE = sorted([*FREE, RESERVED])
ENFORCE = "enforcing cpu frequency"
LOG_DEBUG = """
log:
  debug: [policy, nri-plugin, cpu, cpuclass]
"""

# upstream's balloons-turbo.cfg
TURBO_CONFIG = (
    """
allocatorTopologyBalancing: false
availableResources: {cpu: "cpuset:2-7,10-13"}
reservedResources: {cpu: 750m}
pinCPU: true
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
"""
    + LOG_DEBUG
)

# upstream's balloons-turbo-oldsyntax.cfg
OLDSYNTAX_CONFIG = (
    """
allocatorTopologyBalancing: false
availableResources: {cpu: "cpuset:2-7,10-13"}
reservedResources: {cpu: 750m}
pinCPU: true
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
    + LOG_DEBUG
)

# upstream's balloons-turbo-defaultclass.cfg (no idleCPUClass, no cpuClass on
# the reserved type: both fall back to the class named "default")
DEFAULTCLASS_CONFIG = (
    """
allocatorTopologyBalancing: false
availableResources: {cpu: "cpuset:2-7,10-13"}
reservedResources: {cpu: 750m}
pinCPU: true
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
    + LOG_DEBUG
)


# -- upstream's helpers, on the plugin's output ---------------------------------------


def writes(n: Node, since: int = 0) -> list[str]:
    """``enforce-lines-since``: the enforce lines logged since ``since``."""
    return n.lines(ENFORCE, since)


def on_cpu(lines: list[str], cpu: int) -> list[str]:
    return [x for x in lines if x.endswith(f"on cpu {cpu}")]


def class_written(lines: list[str], cls: str) -> bool:
    """``assert-class-written``: the literal name or its ``X@d<N>`` form."""
    pattern = re.compile(rf'from class "{re.escape(cls)}(@d[0-9]+)?"')
    return any(pattern.search(x) for x in lines)


def assert_step_writes(lines: list[str], expect_min: int) -> None:
    """``assert-step-writes``: at least ``expect_min`` writes, none duplicated."""
    assert len(lines) >= expect_min, lines
    assert len(lines) == len(set(lines)), lines


def verify_turbo(n: Node, cls: str, winner: bool, max_freq: int, since: int) -> None:
    """``verify-turbo-winner`` / ``verify-turbo-loser``: the class's last
    ``turbo:`` line since ``since`` says winner=true/false with ``max_freq``."""
    flag = "winner=true" if winner else "winner=false"
    lines = [x for x in n.lines(f'class "{cls}" ', since) if "turbo: " in x and flag in x]
    assert lines, n.plugin.output()
    assert lines[-1].endswith(f"maxFreq={max_freq}"), lines[-1]


async def reload(n: Node, config: str) -> int:
    """The CR patch: the changed configuration, applied (SIGHUP); the mark of
    the output before it."""
    mark = n.mark()
    (n.work / "balloons.yaml").write_text(config)
    n.plugin.proc.send_signal(signal.SIGHUP)
    await n.plugin.wait_output("config update from", timeout=10, count=_count(n) + 1)
    return mark


def _count(n: Node) -> int:
    return len(n.lines("config update from"))


# -- balloons-turbo.cfg ---------------------------------------------------------------


async def test_turbo_priority() -> None:
    async with node(TURBO_CONFIG) as n:
        # initial idle: free CPUs default-noturbo, the reserved CPU default-turbo
        # at turbo (no turboPriority > 0 class active)
        init = writes(n)
        assert class_written(init, "default-noturbo")
        assert class_written(init, "default-turbo")
        for cpu in FREE:
            assert on_cpu(init, cpu), cpu
            assert n.freq(cpu) == (MIN, BASE), cpu
        assert on_cpu(init, RESERVED)
        assert any("default-turbo" in x for x in on_cpu(init, RESERVED))
        assert not any("default-noturbo" in x for x in on_cpu(init, RESERVED))
        assert not any("default-turbo" in x for x in on_cpu(init, 2))
        assert any(f"max {TURBO}" in x and "default-turbo" in x for x in on_cpu(init, RESERVED))
        assert n.freq(RESERVED) == (MIN, TURBO)
        assert_step_writes(init, 20)  # 9 free CPUs * (min+max) + the reserved CPU's 2

        # step 1: turbo-low wins turbo; default-turbo loses it on the reserved CPU
        mark = n.mark()
        pod0 = await n.create("pod0", "turbo-low-bln")
        assert len(pod0) == 1
        verify_turbo(n, "turbo-low", True, TURBO, mark)
        verify_turbo(n, "default-turbo", False, BASE, mark)
        step = writes(n, mark)
        assert class_written(step, "turbo-low")
        assert class_written(step, "default-turbo")
        assert any(f"max {BASE}" in x and "default-turbo" in x for x in on_cpu(step, RESERVED))
        # upstream's count: "1 write (max) for cpu 10"; its min is unchanged
        assert not any(" min " in x for x in on_cpu(step, RESERVED)), step
        assert_step_writes(step, 3)
        (low,) = pod0
        assert n.package(low) == n.package(RESERVED)  # one turbo domain, as upstream's
        assert n.freq(low) == (TURBO, TURBO)
        assert n.freq(RESERVED) == (MIN, BASE)

        # step 1b: a second container in the same balloon: no new writes
        mark = n.mark()
        await n.create("pod1", "turbo-low-bln", cpu="100m")
        assert writes(n, mark) == []

        # step 2: turbo-high wins; turbo-low and default-turbo are at base
        mark = n.mark()
        pod2 = await n.create("pod2", "turbo-high-bln")
        assert len(pod2) == 1
        verify_turbo(n, "turbo-high", True, TURBO, mark)
        verify_turbo(n, "turbo-low", False, BASE, mark)
        verify_turbo(n, "default-turbo", False, BASE, mark)
        step = writes(n, mark)
        assert class_written(step, "turbo-low")
        assert class_written(step, "turbo-high")
        assert on_cpu(step, RESERVED) == []  # already at base
        assert_step_writes(step, 4)
        (high,) = pod2
        assert n.freq(high) == (TURBO, TURBO)
        assert n.freq(low) == (BASE, BASE)

        # step 3: turbo-high gone: turbo-low regains turbo, its CPU back to idle
        mark = n.mark()
        await n.delete("pod2")
        step = writes(n, mark)
        assert step
        verify_turbo(n, "turbo-low", True, TURBO, mark)
        assert class_written(step, "turbo-low")
        assert class_written(step, "default-noturbo")
        assert on_cpu(step, RESERVED) == []  # turbo-low still active
        assert_step_writes(step, 4)
        assert n.freq(low) == (TURBO, TURBO)
        assert n.freq(high) == (MIN, BASE)

        # step 4: one of turbo-low-bln's two containers gone: no new writes
        mark = n.mark()
        await n.delete("pod1")
        assert writes(n, mark) == []

        # step 5: the last one gone: default-turbo regains turbo on the reserved CPU
        mark = n.mark()
        await n.delete("pod0")
        step = writes(n, mark)
        assert step
        assert class_written(step, "default-noturbo")
        assert class_written(step, "default-turbo")
        assert any(f"max {TURBO}" in x and "default-turbo" in x for x in on_cpu(step, RESERVED))
        assert_step_writes(step, 3)
        assert n.freq(low) == (MIN, BASE)
        assert n.freq(RESERVED) == (MIN, TURBO)


# -- balloons-turbo-oldsyntax.cfg -------------------------------------------------------


async def test_legacy_control_cpu_classes() -> None:
    async with node(OLDSYNTAX_CONFIG) as n:
        init = writes(n)
        assert class_written(init, "legacy-idle")
        assert any(f"min {MIN}" in x and "legacy-idle" in x for x in on_cpu(init, 2))
        assert any(f"max {BASE}" in x and "legacy-idle" in x for x in on_cpu(init, 2))
        assert "control.cpu.classes is deprecated" in n.plugin.output()
        # beyond upstream's checks: the reserved balloon has no class and there
        # is no "default" class, so its CPU is never written (class "", §12.1)
        assert on_cpu(init, RESERVED) == []
        assert n.freq(RESERVED) == (MIN, TURBO)

        mark = n.mark()
        pod3 = await n.create("pod3", "legacy-bln")
        assert len(pod3) == 1
        step = writes(n, mark)
        assert class_written(step, "legacy-fast")
        assert any(re.search(f"min {TURBO}.*legacy-fast", x) for x in step)
        assert any(re.search(f"max {TURBO}.*legacy-fast", x) for x in step)
        assert_step_writes(step, 2)
        (cpu,) = pod3
        assert n.freq(cpu) == (TURBO, TURBO)


# -- balloons-turbo-defaultclass.cfg ----------------------------------------------------


async def test_default_class_and_class_only_patch() -> None:
    async with node(DEFAULTCLASS_CONFIG) as n:
        # "default" on the idle CPUs and on the reserved CPU; no "fast" yet
        init = writes(n)
        assert class_written(init, "default")
        assert not class_written(init, "fast")
        for cpu in AVAILABLE:
            assert any("default" in x for x in on_cpu(init, cpu)), cpu
            assert n.freq(cpu) == (MIN, BASE), cpu
        assert any(f"min {MIN}" in x and "default" in x for x in on_cpu(init, RESERVED))
        assert any(f"max {BASE}" in x and "default" in x for x in on_cpu(init, RESERVED))

        # step 1: a fast-bln pod: its CPU to "fast", nothing else re-touched
        mark = n.mark()
        pod4 = await n.create("pod4", "fast-bln")
        assert len(pod4) == 1
        step = writes(n, mark)
        assert class_written(step, "fast")
        assert any(re.search(f"min {TURBO}.*fast", x) for x in step)
        assert any(re.search(f"max {TURBO}.*fast", x) for x in step)
        assert_step_writes(step, 2)
        (cpu,) = pod4
        assert n.freq(cpu) == (TURBO, TURBO)

        # step 2: pod4 gone: its CPU back to "default", never to class ""
        mark = n.mark()
        await n.delete("pod4")
        step = writes(n, mark)
        assert class_written(step, "default")
        assert not any('from class ""' in x for x in step)
        assert n.freq(cpu) == (MIN, BASE)

        # step 3: cpuClasses only, default.maxFreq base -> turbo: written to every
        # default-class CPU at once, with no pod event in between
        mark = await reload(n, DEFAULTCLASS_CONFIG.replace("maxFreq: base", "maxFreq: turbo"))
        assert "configuration changes only on CPU classes" in "\n".join(n.lines("", mark))
        step = writes(n, mark)
        assert class_written(step, "default")
        for c in AVAILABLE:
            assert any("default" in x and f"max {TURBO}" in x for x in on_cpu(step, c)), c
            assert n.freq(c) == (MIN, TURBO), c

        # step 4: reverted: again at once on every default-class CPU
        mark = await reload(n, DEFAULTCLASS_CONFIG)
        step = writes(n, mark)
        assert class_written(step, "default")
        for c in AVAILABLE:
            assert any("default" in x and f"max {BASE}" in x for x in on_cpu(step, c)), c
            assert n.freq(c) == (MIN, BASE), c


# -- turboDomain: package vs system ----------------------------------------------------


async def test_turbo_domain_package_and_system() -> None:
    """One CPU per package (cpuset:2,10): the reserved balloon's default-turbo
    CPU keeps turbo under ``turboDomain: package`` while turbo-high wins the
    other package; under ``system`` turbo-high wins it too."""
    async with node(TURBO_CONFIG) as n:
        assert n.package(2) != n.package(10)
        layout = TURBO_CONFIG.replace('"cpuset:2-7,10-13"', '"cpuset:2,10"').replace(
            "cpu: 750m", "cpu: 1000m"
        )
        mark = await reload(n, layout)
        assert writes(n, mark)

        pod5 = await n.create("pod5", "turbo-high-bln")
        assert len(pod5) == 1
        (turbo_cpu,) = pod5
        assert turbo_cpu in (2, 10)
        reserved = 12 - turbo_cpu  # the other one
        assert any(
            "default-turbo" in x and f"max {TURBO}" in x for x in on_cpu(writes(n), reserved)
        )
        assert n.freq(reserved) == (MIN, TURBO)
        assert n.freq(turbo_cpu) == (TURBO, TURBO)

        system = layout.replace("pinCPU: true", "pinCPU: true\nturboDomain: system")
        mark = await reload(n, system)
        step = on_cpu(writes(n, mark), reserved)
        assert any("default-turbo" in x and f"max {BASE}" in x for x in step), step
        assert n.freq(reserved) == (MIN, BASE)

        mark = await reload(n, layout.replace("pinCPU: true", "pinCPU: true\nturboDomain: package"))
        step = on_cpu(writes(n, mark), reserved)
        assert any("default-turbo" in x and f"max {TURBO}" in x for x in step), step
        assert n.freq(reserved) == (MIN, TURBO)

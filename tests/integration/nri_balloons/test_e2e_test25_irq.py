"""Upstream e2e test25-irq (reference §18) one to one, through the runtime
simulator with the balloons plugin and the SST helper as real processes. The
helper's sim backend models the node's /proc/interrupts and /proc/irq (a
server's IRQs: ttyS0 is irq 4, rtc0 irq 8, acpi irq 9); upstream's `cat
/proc/irq/N/smp_affinity_list` is the helper's ListInterrupts here. Each phase
starts a new node (upstream's helm-terminate, cleanup, helm-launch): the IRQs
start with every CPU in their affinity."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from balloons_e2e import plugin_command
from nri_sst import messages as m
from nri_sst.client import SyncHelperClient
from sst_node import PCT16_SIM, Helper, Node, node

TTYS0, RTC0, ACPI = 4, 8, 9
ALL = set(range(16))

BASE = """
reservedResources: {cpu: 1000m}
pinCPU: true
pinMemory: true
"""
CLAIM = (
    BASE
    + """
balloonTypes:
- {name: claimer, minCPUs: 2, maxCPUs: 2, irqClaim: ["*ttyS0*", "*rtc0*"]}
log: {debug: [policy, irq]}
"""
)
ISOLATE = (
    BASE
    + """
balloonTypes:
- {name: isolate, minCPUs: 2, maxCPUs: 2, irqMode: isolate}
"""
)
SINK = (
    BASE
    + """
balloonTypes:
- {name: claimer, minCPUs: 2, maxCPUs: 2, irqClaim: ["*ttyS0*", "*rtc0*"]}
- {name: sink, minCPUs: 2, maxCPUs: 2, irqMode: sink}
"""
)
DEDICATED = (
    BASE
    + """
balloonTypes:
- name: dedicated-claimer
  minCPUs: 2
  maxCPUs: 2
  irqClaim: ["ttyS", "*rtc0*"]  # "ttyS" should not match
  irqMode: isolate
"""
)
DENIED = (
    BASE
    + """
controllableInterrupts: ["*rtc0*"]
balloonTypes:
- {name: claimer, minCPUs: 2, maxCPUs: 2, irqClaim: ["*ttyS0*", "*rtc0*"]}
log: {debug: [policy, irq]}
"""
)


def sim_config(tmp_path: Path) -> tuple[str, ...]:
    path = tmp_path / "sim-config.json"
    path.write_text(json.dumps(PCT16_SIM))
    return ("--sim-config", str(path))


def irq_cpus(endpoint: str, irq: int) -> set[int]:
    with SyncHelperClient(endpoint, timeout=2.0, client="test") as c:
        reply = c.call(m.ListInterrupts(), m.ListInterruptsReply)
    return next(set(i.affinity) for i in reply.interrupts if i.number == irq)


async def verify_irq_cpus(n: Node, irq: int, expected: set[int]) -> None:
    """Upstream's verify-irq-cpus: wait until the affinity is ``expected``
    (the loop's bound is a liveness bound)."""
    got: set[int] = set()
    for _ in range(100):
        got = irq_cpus(n.helper.endpoint, irq)
        if got == expected:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"irq {irq} affinity: expected CPUs {sorted(expected)}, got {sorted(got)}")


async def test_irq_claim(tmp_path: Path) -> None:
    async with node(CLAIM, topology="pct16", helper_args=sim_config(tmp_path)) as n:
        claimer = await n.create("pod0", "claimer")
        assert len(claimer) == 2
        await verify_irq_cpus(n, TTYS0, claimer)
        await verify_irq_cpus(n, RTC0, claimer)
        await verify_irq_cpus(n, ACPI, ALL)
        assert n.lines("set affinity of irq 4 (IR-IO-APIC 4-edge ttyS0)"), n.plugin.output()


async def test_irq_isolate(tmp_path: Path) -> None:
    async with node(ISOLATE, topology="pct16", helper_args=sim_config(tmp_path)) as n:
        isolate = await n.create("pod1", "isolate")
        await verify_irq_cpus(n, RTC0, ALL - isolate)


async def test_irq_sink(tmp_path: Path) -> None:
    async with node(SINK, topology="pct16", helper_args=sim_config(tmp_path)) as n:
        await verify_irq_cpus(n, TTYS0, ALL)  # no sink, no claimer present
        sink = await n.create("pod2", "sink")
        for irq in (TTYS0, RTC0, ACPI):
            await verify_irq_cpus(n, irq, sink)
        claimer = await n.create("pod3", "claimer")
        sink = n.cpus("pod2")
        await verify_irq_cpus(n, TTYS0, claimer)
        await verify_irq_cpus(n, RTC0, claimer)
        await verify_irq_cpus(n, ACPI, sink)
        await n.delete("pod2")  # no sink present anymore
        await verify_irq_cpus(n, TTYS0, claimer)
        await verify_irq_cpus(n, RTC0, claimer)
        await verify_irq_cpus(n, ACPI, ALL)


async def test_irq_dedicated_claim_with_isolate(tmp_path: Path) -> None:
    async with node(DEDICATED, topology="pct16", helper_args=sim_config(tmp_path)) as n:
        claimer = await n.create("pod4", "dedicated-claimer")
        await verify_irq_cpus(n, RTC0, claimer)
        await verify_irq_cpus(n, TTYS0, ALL - claimer)
        await verify_irq_cpus(n, ACPI, ALL - claimer)


async def test_denied_irq_claim_fails_the_plugin(tmp_path: Path) -> None:
    from nri_framework.simulate.sysfs import write_topology

    root = write_topology(tmp_path / "host", "pct16")
    helper = Helper(tmp_path, root, sim_config(tmp_path))
    helper.start()
    try:
        cfg = tmp_path / "denied.yaml"
        cfg.write_text(DENIED)
        cmd = plugin_command(tmp_path / "nri.sock", root, tmp_path / "state", cfg)
        cmd += ["--sst-helper", helper.endpoint]
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode != 0
        text = out.decode()
        assert (
            'invalid irqclaim ["*ttyS0*" "*rtc0*"]: denied interrupt: irq 4 '
            '(IR-IO-APIC 4-edge ttyS0) denied but matched by user pattern "*ttyS0*"'
        ) in text, text
        assert irq_cpus(helper.endpoint, TTYS0) == ALL
    finally:
        helper.stop()

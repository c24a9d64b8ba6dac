"""Upstream e2e balloons/n4c16/test17-cstates-scheduling, step by step: the
C-states of a balloon's cpuClass (``disabledCstates``) on its CPUs only,
never on CPUs outside ``availableResources``, enabled again when the balloon
deflates and when it goes. The C-state writes go through the SST helper's sim
backend (upstream: its ``OVERRIDE_SYS_CSTATES`` fake fs); the assertions read
the ``cpuidle/stateN/disable`` files the helper wrote.

The scheduling classes (the balloon type's ``realtime``: fifo 42; the
``run-when-free`` annotation: idle, nice 17, best-effort 6): upstream reads
``/proc/PID/sched`` and ``ionice -p PID`` of the container's process. The
runtime simulator (an NRI v0.12 runtime here: older ones drop the fields)
runs no process per container, so the test reads the ``linux.scheduler`` and
``linux.io_priority`` the runtime would apply (``sched_setattr``,
``ioprio_set``) from the simulator's container state
(:meth:`~nri_framework.simulate.runtime.SimulatedRuntime.scheduling`) and
shows them the way those two files do (:func:`proc_sched`, :func:`ionice`).
"""

from __future__ import annotations

from pathlib import Path

from nri_framework.simulate.emulation import NRI_V0_12
from nri_framework.simulate.runtime import SimulatedRuntime
from sst_node import Node, node

# upstream's balloons-cstates.cfg merged into the chart's defaults
CONFIG = """
allocatorTopologyBalancing: false
availableResources: {cpu: "cpuset:2-7,10-13"}
reservedResources: {cpu: 750m}
pinCPU: true
idleCPUClass: default-class
balloonTypes:
- name: lowlatency-bln
  cpuClass: lowlatency-class
  schedulingClass: realtime
cpuClasses:
- {name: lowlatency-class, disabledCstates: [C4, C6, C8, C10]}
- {name: default-class, disabledCstates: []}
schedulingClasses:
- {name: realtime, policy: fifo, priority: 42}
- {name: run-when-free, policy: idle, nice: 17, ioClass: be, ioPriority: 6}
reservedPoolNamespaces: [kube-system]
"""

POD1 = """
apiVersion: v1
kind: Pod
metadata:
  name: pod1
  annotations:
    balloon.balloons.resource-policy.nri.io: lowlatency-bln
    scheduling-class.resource-policy.nri.io: run-when-free
spec:
  containers:
  - name: pod1c0
    image: busybox
    resources:
      requests: {cpu: "3", memory: 100M}
"""

AVAILABLE = [2, 3, 4, 5, 6, 7, 10, 11, 12, 13]
UNAVAILABLE = [0, 1, 8, 9, 14, 15]
ALL = {"POLL", "C1E", "C2", "C4", "C8"}  # n4c16: upstream's fake C-state names, and POLL


def disable_files(n: Node, cpu: int) -> list[Path]:
    return sorted((n.host_root / f"sys/devices/system/cpu/cpu{cpu}/cpuidle").glob("state*/disable"))


def verify_cstates(n: Node, cpus: set[int] | list[int], disabled: set[str]) -> None:
    """Upstream's verify-cstates: ``disabled`` off, the others on."""
    for cpu in cpus:
        assert n.disabled(cpu) == disabled, cpu


SCHED_POLICIES = {"SCHED_OTHER": 0, "SCHED_FIFO": 1, "SCHED_RR": 2, "SCHED_BATCH": 3}
SCHED_POLICIES |= {"SCHED_IDLE": 5, "SCHED_DEADLINE": 6}
IO_CLASSES = {"IOPRIO_CLASS_RT": "realtime", "IOPRIO_CLASS_BE": "best-effort"}
IO_CLASSES |= {"IOPRIO_CLASS_IDLE": "idle"}


def proc_sched(n: Node, name: str) -> tuple[int, int]:
    """``policy`` and ``prio`` of the container's ``/proc/PID/sched``: the kernel's
    priority is ``99 - rt_priority`` for the real-time policies, ``120 + nice``
    for the others."""
    sched, _io = n.rt.scheduling(n.containers[name])
    assert sched is not None, f"{name}: no scheduling policy"
    policy = SCHED_POLICIES[sched.policy]
    rt = policy in (1, 2)
    return policy, (99 - sched.priority) if rt else 120 + sched.nice


def ionice(n: Node, name: str) -> str:
    """What ``ionice -p PID`` prints for the container's process."""
    _sched, io = n.rt.scheduling(n.containers[name])
    if io is None:
        return "none: prio 0"
    return f"{IO_CLASSES[io.io_class]}: prio {io.priority}"


def runtime(socket: Path) -> SimulatedRuntime:
    return SimulatedRuntime(socket, emulation=NRI_V0_12)


async def test_cstates_scheduling() -> None:
    async with node(CONFIG, runtime=runtime) as n:
        # the fixture writer's last file: anything written after it is the helper's
        written = (n.host_root / "sys/devices/system/node/node3/meminfo").stat().st_mtime_ns
        # all c-states of all available CPUs are enabled
        verify_cstates(n, AVAILABLE, set())

        (cpu0,) = await n.create("pod0", "lowlatency-bln")
        # CPUs of low-latency pod0 cannot enter C4 or C8 (C6, C10: not on this CPU)
        verify_cstates(n, {cpu0}, {"C4", "C8"})
        verify_cstates(n, set(AVAILABLE) - {cpu0}, set())
        assert proc_sched(n, "pod0") == (1, 99 - 42)  # SCHED_FIFO, prio 57

        path = n.work / "pod1.yaml"
        path.write_text(POD1)
        pod1 = await n.create_from("pod1", path)
        pod0 = n.cpus("pod0")
        assert pod0 == pod1 and len(pod0) == 4
        # CPUs of low-latency pods pod0 and pod1 cannot enter C4 or C8
        verify_cstates(n, pod1, {"C4", "C8"})
        verify_cstates(n, set(AVAILABLE) - pod1, set())
        assert proc_sched(n, "pod1") == (5, 120 + 17)  # SCHED_IDLE, prio 137
        assert ionice(n, "pod1") == "best-effort: prio 6"
        max_lowlatency = pod1

        await n.delete("pod1")
        pod0 = n.cpus("pod0")
        assert len(pod0) == 1
        # c-states of freed CPUs are enabled again after the balloon deflated
        verify_cstates(n, max_lowlatency - pod0, set())
        # the remaining CPU is still configured for low latency
        verify_cstates(n, pod0, {"C4", "C8"})

        await n.delete("pod0")
        # all containers gone: c-states of all used CPUs are enabled again
        verify_cstates(n, max_lowlatency, set())

        # c-states of CPUs outside availableResources have not been written
        for cpu in UNAVAILABLE:
            for f in disable_files(n, cpu):
                assert f.stat().st_mtime_ns <= written, f
        names = {(f.parent / "name").read_text().strip() for f in disable_files(n, 0)}
        assert names == ALL  # the files checked are there

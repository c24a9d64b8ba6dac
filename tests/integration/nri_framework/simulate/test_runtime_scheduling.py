"""The runtime simulator keeps a CreateContainer adjustment's ``linux.scheduler``
and ``linux.io_priority`` in the container's state, as an NRI v0.11+ runtime
applies them to the container's process (the simulator runs none: they are
read back with :meth:`SimulatedRuntime.scheduling`); a runtime of an older NRI
does not know the fields and drops them; two plugins setting one is an error.

Where the neighbouring test modules are: see :mod:`runtime_peers`.
"""

from __future__ import annotations

import pytest
from nri_framework.hookspecs import hookimpl
from nri_framework.model import Adjustment, Container, CreateResult, IOPriority, Pod, Scheduler
from nri_framework.simulate.emulation import CONTAINERD_1_7, NRI_V0_12
from nri_framework.simulate.runtime import NriError
from runtime_peers import MakeRuntime, created_pod, sample_container, sample_pod, stub_plugin

FIFO = Scheduler(policy="SCHED_FIFO", priority=42)
BE6 = IOPriority(io_class="IOPRIO_CLASS_BE", priority=6)


class SchedulingPolicy:
    """Gives every new container ``FIFO`` and ``BE6``."""

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        return CreateResult(adjustment=Adjustment(scheduler=FIFO, io_priority=BE6))


async def test_scheduler_and_io_priority_are_kept(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12)
    async with stub_plugin(rt, SchedulingPolicy()):
        _pod, (created,) = await created_pod(rt)
    assert rt.scheduling(created.id) == (FIFO, BE6)


async def test_an_older_nri_runtime_drops_them(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=CONTAINERD_1_7)  # NRI 0.6.1
    async with stub_plugin(rt, SchedulingPolicy()):
        _pod, (created,) = await created_pod(rt)
    assert rt.scheduling(created.id) == (None, None)


async def test_two_plugins_setting_the_scheduler_is_an_error(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12)
    pod = await rt.run_pod(sample_pod())
    async with (
        stub_plugin(rt, SchedulingPolicy(), name="a", index="50"),
        stub_plugin(rt, SchedulingPolicy(), name="b", index="60"),
    ):
        with pytest.raises(NriError) as err:
            await rt.create_container(pod.id, sample_container())
    assert str(err.value).endswith('plugins "60-b" and "50-a" both tried to set scheduling policy')

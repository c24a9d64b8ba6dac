"""The replies' protobuf built as before: create_result_to_pb (and the
resources_to_pb and adjustment_to_pb it uses) against the previous
implementation (the oracle, verbatim) on random results: the same message."""

from __future__ import annotations

import random

import pytest
from nri_framework import convert
from nri_framework.model import (
    Adjustment,
    CpuResources,
    CreateResult,
    Eviction,
    IOPriority,
    MemoryResources,
    Resources,
    Scheduler,
    Update,
)
from nri_framework.pb import nri_pb2 as pb


def oracle_resources_to_pb(res: Resources, out: pb.LinuxResources) -> None:
    if res.cpu is not None:
        c = res.cpu
        if (
            c.cpus
            or c.mems
            or not (
                c.shares is None
                and c.quota is None
                and c.period is None
                and c.realtime_runtime is None
                and c.realtime_period is None
            )
        ):
            oc = out.cpu
            for name in convert._CPU_OPT:
                v = getattr(c, name)
                if v is not None:
                    getattr(oc, name).value = v
            if c.cpus:
                oc.cpus = c.cpus
            if c.mems:
                oc.mems = c.mems
    if res.memory is not None:
        for name in convert._MEM_OPT:
            v = getattr(res.memory, name)
            if v is not None:
                getattr(out.memory, name).value = v
    if res.blockio_class is not None:
        out.blockio_class.value = res.blockio_class
    if res.rdt_class is not None:
        out.rdt_class.value = res.rdt_class
    for k, v in res.unified.items():
        out.unified[k] = v
    if res.pids_limit is not None:
        out.pids.limit = res.pids_limit


def oracle_update_to_pb(u: Update, out: pb.ContainerUpdate) -> None:
    out.container_id = u.container_id
    oracle_resources_to_pb(u.resources, out.linux.resources)
    if u.ignore_failure:
        out.ignore_failure = True


def oracle_adjustment_to_pb(a: Adjustment, out: pb.ContainerAdjustment) -> None:
    for k, v in a.annotations.items():
        out.annotations[k] = v
    for k, v in a.env.items():
        out.env.add(key=k, value=v)
    if a.resources is not None:
        oracle_resources_to_pb(a.resources, out.linux.resources)
    if a.scheduler is not None:
        sch = a.scheduler
        ps = out.linux.scheduler
        ps.policy = pb.LinuxSchedulerPolicy.Value(sch.policy or "SCHED_NONE")
        ps.nice, ps.priority = sch.nice, sch.priority
        ps.flags.extend(pb.LinuxSchedulerFlag.Value(f) for f in sch.flags)
        ps.runtime, ps.deadline, ps.period = sch.runtime, sch.deadline, sch.period
    if a.io_priority is not None:
        prio = out.linux.io_priority
        setattr(prio, "class", pb.IOPrioClass.Value(a.io_priority.io_class))
        prio.priority = a.io_priority.priority


def oracle_create_result_to_pb(r: CreateResult) -> pb.CreateContainerResponse:
    resp = pb.CreateContainerResponse()
    if r.adjustment is not None:
        oracle_adjustment_to_pb(r.adjustment, resp.adjust)
    for u in r.updates:
        oracle_update_to_pb(u, resp.update.add())
    for e in r.evictions:
        resp.evict.add(container_id=e.container_id, reason=e.reason)
    return resp


def _maybe(rng: random.Random, value: object, p: float = 0.3) -> object:
    return value if rng.random() < p else None


def _resources(rng: random.Random) -> Resources:
    cpu = None
    if rng.random() < 0.8:
        cpu = CpuResources(
            shares=_maybe(rng, rng.choice([0, 2, 1024])),  # type: ignore[arg-type]
            quota=_maybe(rng, rng.choice([-1, 0, 100_000])),  # type: ignore[arg-type]
            period=_maybe(rng, rng.choice([0, 100_000])),  # type: ignore[arg-type]
            realtime_runtime=_maybe(rng, 5, 0.1),  # type: ignore[arg-type]
            realtime_period=_maybe(rng, 7, 0.1),  # type: ignore[arg-type]
            cpus=rng.choice(["", "10,138", "2-3,130-131"]),
            mems=rng.choice(["", "0", "0-1"]),
        )
    memory = None
    if rng.random() < 0.3:
        memory = MemoryResources(limit=_maybe(rng, 1 << 30, 0.5), swap=_maybe(rng, 0, 0.5))  # type: ignore[arg-type]
    return Resources(
        cpu=cpu,
        memory=memory,
        blockio_class=_maybe(rng, rng.choice(["", "slow"])),  # type: ignore[arg-type]
        rdt_class=_maybe(rng, rng.choice(["", "gold"])),  # type: ignore[arg-type]
        unified={"memory.high": "max"} if rng.random() < 0.2 else {},
        pids_limit=_maybe(rng, rng.choice([0, 100]), 0.2),  # type: ignore[arg-type]
    )


def _result(rng: random.Random) -> CreateResult:
    adjustment = None
    if rng.random() < 0.9:
        adjustment = Adjustment(
            annotations={"a": "b"} if rng.random() < 0.2 else {},
            env={"K": "V", "L": ""} if rng.random() < 0.2 else {},
            resources=_resources(rng) if rng.random() < 0.9 else None,
            scheduler=Scheduler(policy="SCHED_FIFO", priority=5, flags=["SCHED_FLAG_RESET_ON_FORK"])
            if rng.random() < 0.2
            else None,
            io_priority=IOPriority(io_class="IOPRIO_CLASS_BE", priority=4)
            if rng.random() < 0.2
            else None,
        )
    updates = [
        Update(container_id=f"c{k}", resources=_resources(rng), ignore_failure=rng.random() < 0.3)
        for k in range(rng.choice([0, 0, 1, 3]))
    ]
    evictions = [Eviction(container_id="e", reason="r")] if rng.random() < 0.1 else []
    return CreateResult(adjustment=adjustment, updates=updates, evictions=evictions)


@pytest.mark.parametrize("seed", range(100))
def test_create_reply_as_before(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(10):
        r = _result(rng)
        want = oracle_create_result_to_pb(r)
        got = convert.create_result_to_pb(r)
        assert got == want, r
        assert sorted(f.name for f, _ in got.ListFields()) == sorted(
            f.name for f, _ in want.ListFields()
        )

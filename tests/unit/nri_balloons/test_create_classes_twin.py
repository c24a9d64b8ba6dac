"""The classes of a create's adjustment against their previous implementations
(the oracles, verbatim) on random annotations, controls and scheduling classes:
rdtblockio.with_classes (which formatted the container's name for every call)
and scheduling.effective_class (which built a mapping by name for every call)
give the same classes and log the same lines at the same levels."""

from __future__ import annotations

import logging
import random

import msgspec
import pytest
from nri_balloons import annotations as ann
from nri_balloons import rdtblockio, scheduling
from nri_balloons.config import BalloonType, BlockIOControl, Control, RdtControl, SchedulingClass
from nri_balloons.containers import pretty_name, qos_class
from nri_framework.model import Container, CpuResources, Pod, Resources

log = rdtblockio.log


def oracle_effective(
    ctl: rdtblockio._Controller,
    enable: bool,
    use_qos: bool,
    own: str | None,
    pod: Pod,
    container: Container,
) -> str | None:
    pretty = pretty_name(pod, container)
    value = ann.effective(ctl.key, pod, container)
    if value is not None:
        why = rdtblockio.invalid_class_name(value)
        if why is not None:
            log.warning(
                "%s: invalid %s class annotation %s: %s (%s); no class set",
                pretty,
                ctl.what,
                ctl.key,
                rdtblockio._quoted(value),
                why,
            )
            return None
        if not enable:
            log.warning("%s: %s class control disabled, omitting class %s", pretty, ctl.what, value)
            return None
        return value
    if enable and use_qos and not own:
        return str(qos_class(pod, container))
    return None


def oracle_with_classes(
    resources: Resources, control: Control, pod: Pod, container: Container
) -> Resources:
    own = container.resources or Resources()
    rdt = oracle_effective(
        rdtblockio.RDT,
        control.rdt.enable,
        control.rdt.use_pod_qos_as_default_class,
        own.rdt_class,
        pod,
        container,
    )
    blockio = oracle_effective(
        rdtblockio.BLOCKIO,
        control.blockio.enable,
        control.blockio.use_pod_qos_as_default_class,
        own.blockio_class,
        pod,
        container,
    )
    if rdt is not None:
        resources = msgspec.structs.replace(resources, rdt_class=rdt)
    if blockio is not None:
        resources = msgspec.structs.replace(resources, blockio_class=blockio)
    return resources


def oracle_effective_class(
    classes: list[SchedulingClass], bdef: BalloonType, pod: Pod, container: Container
) -> SchedulingClass | None:
    by_name = {c.name: c for c in classes}
    name = bdef.scheduling_class
    override = ann.effective(ann.SCHEDULING_CLASS, pod, container)
    if override is not None and override in by_name:
        scheduling.log.debug(
            "container %s overrides balloon scheduling class %r with annotation %r",
            container.name,
            name,
            override,
        )
        name = override
    return by_name.get(name) if name else None


VALUES = ["gold", "", "bad value", "x" * 200, "system/default", "Guaranteed"]
NAMES = ["", "rt", "batch", "idle"]


def _annotations(rng: random.Random, keys: list[str], values: list[str]) -> dict[str, str]:
    out = {}
    for key in keys:
        for scoped in (key, f"{key}/pod", f"{key}/container.c", f"{key}/container.d"):
            if rng.random() < 0.25:
                out[scoped] = rng.choice(values)
    return out


def _subject(rng: random.Random, keys: list[str], values: list[str]) -> tuple[Pod, Container]:
    own = None
    if rng.random() < 0.6:
        own = Resources(
            cpu=CpuResources(shares=2) if rng.random() < 0.5 else None,
            rdt_class=rng.choice([None, "", "own"]),
            blockio_class=rng.choice([None, "", "own"]),
        )
    parent = rng.choice(["", "/kubepods/burstable/podp", "/kubepods/podp"])
    pod = Pod(id="p", name="p", namespace="ns", annotations=_annotations(rng, keys, values),
              cgroup_parent=parent)  # fmt: skip
    ctr = Container(id="c", name=rng.choice(["c", "d"]), resources=own,
                    annotations=_annotations(rng, keys, values))  # fmt: skip
    return pod, ctr


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str]]:
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    caplog.clear()
    return got


@pytest.mark.parametrize("seed", range(150))
def test_with_classes_as_before(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    rng = random.Random(seed)
    for _ in range(10):
        control = Control(
            rdt=RdtControl(enable=rng.random() < 0.5,
                           use_pod_qos_as_default_class=rng.random() < 0.5),
            blockio=BlockIOControl(enable=rng.random() < 0.5,
                                   use_pod_qos_as_default_class=rng.random() < 0.5),
        )  # fmt: skip
        pod, ctr = _subject(rng, [rdtblockio.RDT_CLASS, rdtblockio.BLOCKIO_CLASS], VALUES)
        base = Resources(cpu=CpuResources(cpus="1-2"), rdt_class=rng.choice([None, "was"]))
        want = oracle_with_classes(base, control, pod, ctr)
        said = _records(caplog)
        assert rdtblockio.with_classes(base, control, pod, ctr) == want
        assert _records(caplog) == said


@pytest.mark.parametrize("seed", range(150))
def test_effective_class_as_before(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    rng = random.Random(seed)
    for _ in range(10):
        classes = [
            SchedulingClass(name=rng.choice(NAMES), nice=rng.randrange(20))
            for _ in range(rng.randrange(4))
        ]
        bdef = BalloonType(name="t", scheduling_class=rng.choice(NAMES))
        pod, ctr = _subject(rng, [ann.SCHEDULING_CLASS], [*NAMES, "unknown"])
        want = oracle_effective_class(classes, bdef, pod, ctr)
        said = _records(caplog)
        got = scheduling.effective_class(classes, bdef, pod, ctr)
        assert got is want
        assert _records(caplog) == said

"""Observers are told, the policy decides: a plugin registered beside the
policy whose decision hooks answer "nothing" (an empty ``CreateResult``, no
updates, a refused Configure) changes nothing the runtime gets.

The real plugin side (``PluginStub`` + ``PolicyHost``) against the runtime
simulator over a unix socket, in-process; policy and observer are in-test
plugins with ``@hookimpl`` methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from nri_framework import model
from nri_framework.hookspecs import PolicyError, hookimpl
from nri_framework.host import PolicyHost
from nri_framework.model import (
    Adjustment,
    Container,
    CpuResources,
    CreateResult,
    Pod,
    Resources,
    Update,
    cpu_pin,
)
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.stub import PluginStub, StubOptions


class Pin:
    """The policy: every container on CPU 3, re-asserted on updates."""

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        return CreateResult(adjustment=Adjustment(resources=cpu_pin("3", "0")))

    @hookimpl
    def nri_update_container(
        self, pod: Pod, container: Container, resources: Resources
    ) -> list[Update]:
        return [Update(container_id=container.id, resources=cpu_pin("3"))]


class Bystander:
    """An observer that answers the decision hooks with "nothing", and
    watches pods start."""

    def __init__(self) -> None:
        self.pods_run: list[str] = []
        self.decisions_asked = 0

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        self.decisions_asked += 1
        return CreateResult()

    @hookimpl
    def nri_update_container(
        self, pod: Pod, container: Container, resources: Resources
    ) -> list[Update]:
        self.decisions_asked += 1
        return []

    @hookimpl
    def nri_run_pod_sandbox(self, pod: Pod) -> None:
        self.pods_run.append(pod.name)


class Refuser:
    """An observer that would refuse the runtime's Configure."""

    @hookimpl
    def nri_configure(self, config: str, runtime: model.RuntimeInfo) -> None:
        raise PolicyError("an observer must not refuse the runtime")


@pytest.fixture
async def runtime() -> AsyncIterator[SimulatedRuntime]:
    d = Path(tempfile.mkdtemp(prefix="nri-obs-"))  # short: unix socket paths are limited
    rt = SimulatedRuntime(d / "nri.sock")
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()
        shutil.rmtree(d, ignore_errors=True)


async def until(cond: Callable[[], bool]) -> None:
    """A liveness bound (5 s), not a speed claim."""
    async with asyncio.timeout(5):
        while not cond():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def plugin(runtime: SimulatedRuntime, *observers: object) -> AsyncIterator[PolicyHost]:
    """The policy and its observers in a host, registered with ``runtime``
    and synchronized."""
    host = PolicyHost("pin", Pin(), observers=list(observers))
    opts = StubOptions(name="pin", index="10", socket_path=str(runtime.socket_path))
    stub = PluginStub(host, opts)
    task = asyncio.create_task(stub.run())
    try:
        await until(lambda: host.synchronized)
        yield host
    finally:
        stub.stop()
        await asyncio.wait_for(task, 5)


async def test_an_observer_cannot_replace_the_policys_decision(
    runtime: SimulatedRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "nri_framework.host")
    bystander = Bystander()
    async with plugin(runtime, bystander):
        pod = await runtime.run_pod(Pod(id="", name="web", uid="u1", namespace="default"))
        created = await runtime.create_container(
            pod.id,
            Container(id="", name="app", resources=Resources(cpu=CpuResources(cpus="0-7"))),
        )
        # the policy's adjustment reached the runtime, not the observer's empty one
        assert created.cpus == "3"
        updated = await runtime.update_container(
            created.id, Resources(cpu=CpuResources(shares=2, cpus="0-7"))
        )
        assert updated.cpus == "3"
        # observers are still told what happens
        await until(lambda: bystander.pods_run == ["web"])
        assert bystander.decisions_asked == 0
    for hook in ("nri_create_container", "nri_update_container"):
        assert f"observer Bystander implements the decision hook {hook}" in caplog.text


async def test_an_observer_cannot_refuse_the_runtime(runtime: SimulatedRuntime) -> None:
    async with plugin(runtime, Refuser()) as host:
        assert [p.full_name for p in runtime.plugins] == ["10-pin"]
        assert host.runtime.name  # configured

"""PolicyHooks: a decision hook's one plain implementation is called directly,
with what pluggy passes and returning what pluggy returns; wrappers,
monitoring and calls pluggy would refuse go through pluggy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pluggy
import pytest
from nri_framework import hookspecs
from nri_framework.hookrelay import DecisionCaller, PolicyHooks
from nri_framework.hookspecs import PROJECT, hookimpl
from nri_framework.model import Container, CreateResult, Pod, Resources

POD, CTR = Pod(id="p"), Container(id="c", pod_sandbox_id="p")


class Policy:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        self.calls.append(("create", (pod, container)))
        return CreateResult()

    @hookimpl
    def nri_stop_container(self, container: Container) -> None:  # a subset of the spec's
        self.calls.append(("stop", (container,)))

    @hookimpl
    def nri_update_pod_sandbox(self, pod: Pod, resources: Resources) -> str:
        return "not firstresult"


def hooks(policy: object, *more: object) -> tuple[pluggy.PluginManager, PolicyHooks]:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(policy, name="policy")
    for plugin in more:
        pm.register(plugin)
    return pm, PolicyHooks(pm, policy)


def test_direct_call_answers_as_pluggy() -> None:
    policy = Policy()
    pm, hook = hooks(policy)
    assert isinstance(hook.nri_create_container, DecisionCaller)
    for caller in (hook.nri_create_container, pm.hook.nri_create_container):
        assert caller(pod=POD, container=CTR) == CreateResult()
    # firstresult: None stays None; the implementation gets only its arguments
    for caller in (hook.nri_stop_container, pm.hook.nri_stop_container):
        assert caller(pod=POD, container=CTR) is None
    assert policy.calls == [("create", (POD, CTR))] * 2 + [("stop", (CTR,))] * 2
    # not firstresult: a list of the results
    for caller in (hook.nri_update_pod_sandbox, pm.hook.nri_update_pod_sandbox):
        assert caller(pod=POD, resources=Resources()) == ["not firstresult"]
    assert hook.nri_create_container.get_hookimpls() == pm.hook.nri_create_container.get_hookimpls()


def test_call_missing_an_argument_is_pluggys_error() -> None:
    _, hook = hooks(Policy())
    with (
        pytest.warns(UserWarning, match="'container'"),
        pytest.raises(pluggy.HookCallError, match="must provide argument 'container'"),
    ):
        hook.nri_create_container(pod=POD)


def test_monitoring_enabled_later_sees_decisions() -> None:
    pm, hook = hooks(Policy())
    seen: list[str] = []
    pm.add_hookcall_monitoring(lambda name, impls, kwargs: seen.append(name), lambda *a: None)
    hook.nri_create_container(pod=POD, container=CTR)
    assert seen == ["nri_create_container"]


class Wrapper:
    def __init__(self) -> None:
        self.wrapped = 0

    @hookimpl(wrapper=True)
    def nri_create_container(self, pod: Pod, container: Container) -> Iterator[None]:
        self.wrapped += 1
        return (yield)


class WrappingPolicy(Policy):
    @hookimpl(wrapper=True)
    def nri_stop_container(self, container: Container) -> Iterator[None]:
        self.calls.append(("wrapped stop", (container,)))
        return (yield)


def test_a_wrapper_goes_through_pluggy() -> None:
    policy = WrappingPolicy()
    _, hook = hooks(policy)
    assert not isinstance(hook.nri_stop_container, DecisionCaller)
    assert hook.nri_stop_container(pod=POD, container=CTR) is None
    assert policy.calls[0] == ("wrapped stop", (CTR,))


def test_an_observers_decision_hook_is_not_called() -> None:
    observer = Wrapper()
    _, hook = hooks(Policy(), observer)
    assert hook.nri_create_container(pod=POD, container=CTR) == CreateResult()
    assert observer.wrapped == 0

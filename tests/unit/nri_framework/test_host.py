"""The host: subscription from implemented hooks, cache, persistence, restore."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from nri_framework import convert, cpuset
from nri_framework.hookspecs import PolicyError, hookimpl
from nri_framework.host import PolicyHost
from nri_framework.model import (
    Adjustment,
    Container,
    CpuResources,
    CreateResult,
    Event,
    Pod,
    Resources,
    RuntimeInfo,
    Update,
)
from nri_framework.nri.versions import VALID_EVENTS_V0_6, VALID_EVENTS_V0_10, valid_events
from nri_framework.pb import nri_pb2 as pb
from nri_framework.policies.pinner import Pinner

CONTAINERD_17 = RuntimeInfo(name="containerd", version="1.7.24~ds1")
CONTAINERD_22 = RuntimeInfo(name="containerd", version="2.2.0")


def sysfs(tmp_path: Path, cpus: str) -> str:
    cpu = tmp_path / "root/sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text(cpus + "\n")
    return str(tmp_path / "root")


def guaranteed(cid: str, n: int, pod: str = "p") -> Container:
    return Container(
        id=cid,
        pod_sandbox_id=pod,
        name=cid,
        resources=Resources(cpu=CpuResources(shares=1024 * n, quota=100000 * n, period=100000)),
    )


def shared(cid: str, pod: str = "p") -> Container:
    return Container(
        id=cid, pod_sandbox_id=pod, name=cid, resources=Resources(cpu=CpuResources(shares=2))
    )


class OnlyCreate:
    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> None:
        return None


class WantsPodUpdates(OnlyCreate):
    @hookimpl
    def nri_update_pod_sandbox(self, pod: Pod, resources: Resources) -> None:
        return None

    @hookimpl
    def nri_post_start_container(self, pod: Pod, container: Container) -> None:
        return None


def test_mask_from_implemented_hooks() -> None:
    host = PolicyHost("t", OnlyCreate())
    mask = host.configure("", CONTAINERD_17)
    # create, plus the removal events the cache always needs
    assert (
        mask
        == Event.CREATE_CONTAINER.bit | Event.REMOVE_CONTAINER.bit | Event.REMOVE_POD_SANDBOX.bit
    )


class NoHooks:
    """A policy that implements no hook."""


class CreateObserver(OnlyCreate):
    """An observer with a decision hook: it does not subscribe the plugin."""

    @hookimpl
    def nri_post_start_container(self, pod: Pod, container: Container) -> None:
        return None


def test_mask_has_no_decision_event_of_an_observer() -> None:
    host = PolicyHost("t", NoHooks(), observers=[CreateObserver()])
    mask = host.configure("", CONTAINERD_22)
    assert not mask & Event.CREATE_CONTAINER.bit
    assert mask & Event.POST_START_CONTAINER.bit  # a notification: every plugin's


def test_mask_capped_by_runtime_version(caplog: pytest.LogCaptureFixture) -> None:
    host = PolicyHost("t", WantsPodUpdates())
    old = host.configure("", CONTAINERD_17)
    assert old & ~VALID_EVENTS_V0_6 == 0
    assert not old & Event.UPDATE_POD_SANDBOX.bit
    assert "does not support event UPDATE_POD_SANDBOX" in caplog.text
    new = host.configure("", CONTAINERD_22)
    assert new & Event.UPDATE_POD_SANDBOX.bit and new & Event.POST_START_CONTAINER.bit


@pytest.mark.parametrize(
    ("name", "version", "nri", "valid"),
    [
        ("containerd", "1.7.24~ds1", "", VALID_EVENTS_V0_6),
        ("containerd", "v2.1.4", "", VALID_EVENTS_V0_6),
        ("containerd", "2.2.1", "", VALID_EVENTS_V0_10),
        ("cri-o", "1.33.0", "", VALID_EVENTS_V0_6),
        ("cri-o", "1.34.2", "", VALID_EVENTS_V0_10),
        ("somert", "9.9", "", VALID_EVENTS_V0_6),
        ("somert", "9.9", "v0.12.0", VALID_EVENTS_V0_10),
    ],
)
def test_valid_events(name: str, version: str, nri: str, valid: int) -> None:
    assert valid_events(name, version, nri) == valid


def make_host(tmp_path: Path, cpus: str = "0-7") -> PolicyHost:
    return PolicyHost(
        "pinner", Pinner(), state_dir=tmp_path / "state", host_root=sysfs(tmp_path, cpus)
    )


def test_state_survives_restart(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    host.configure("", CONTAINERD_17)
    host.synchronize([], [])
    pod = Pod(id="p", name="pod")
    a = host.create_container(pod, guaranteed("a", 2))
    b = host.create_container(pod, shared("b"))
    assert a.adjustment and a.adjustment.resources and a.adjustment.resources.cpu
    assert a.adjustment.resources.cpu.cpus == "6-7"
    assert b.adjustment and b.adjustment.resources and b.adjustment.resources.cpu
    assert b.adjustment.resources.cpu.cpus == "0-5"
    host.save_now()

    # a new process: the runtime reports the containers without our cpusets
    # (as if the adjustments were lost); the saved state puts them back
    again = PolicyHost(
        "pinner", Pinner(), state_dir=tmp_path / "state", host_root=str(tmp_path / "root")
    )
    again.configure("", CONTAINERD_17)
    updates = again.synchronize([pod], [guaranteed("a", 2), shared("b")])
    by_id = {u.container_id: u.resources.cpu.cpus for u in updates if u.resources.cpu}
    assert by_id == {"a": "6-7", "b": "0-5"}


def test_restore_without_sync_and_forget(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    host.configure("", CONTAINERD_17)
    pod = Pod(id="p", name="pod")
    host.create_container(pod, guaranteed("a", 1))
    host.create_container(pod, guaranteed("b", 1))
    host.save_now()

    again = PolicyHost(
        "pinner", Pinner(), state_dir=tmp_path / "state", host_root=str(tmp_path / "root")
    )
    again.configure("", CONTAINERD_17)
    updates = again.restore_without_sync()
    assert {u.container_id: u.resources.cpu.cpus for u in updates if u.resources.cpu} == {
        "a": "7",
        "b": "6",
    }
    # the runtime says "b" is gone: its CPU returns to the shared pool
    again.forget_containers(["b"])
    c = again.create_container(pod, shared("c"))
    assert c.adjustment and c.adjustment.resources and c.adjustment.resources.cpu
    assert c.adjustment.resources.cpu.cpus == "0-6"


def test_unreadable_state_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state/pinner.state.json").write_text("{not json")
    host = make_host(tmp_path)
    assert "ignoring unreadable state file" in caplog.text
    assert host.synchronize([], []) == []


def test_removal_forgets_and_frees(tmp_path: Path) -> None:
    host = make_host(tmp_path, "0-3")
    pod = Pod(id="p")
    host.create_container(pod, guaranteed("a", 2))
    host.notify(Event.REMOVE_CONTAINER, pod, guaranteed("a", 2))
    assert "a" not in host.containers
    r = host.create_container(pod, guaranteed("b", 3))
    assert r.adjustment and r.adjustment.resources and r.adjustment.resources.cpu
    assert cpuset.size(cpuset.parse(r.adjustment.resources.cpu.cpus)) == 3


def test_export_state_is_builtins(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    host.create_container(Pod(id="p"), guaranteed("a", 1))
    state: Any = host.hook.policy_export_state()
    assert state == {"exclusive": {"a": "7"}}


# --- configurations are prepared off the event loop ----------------------------------


class SlowToCheck:
    """A stand-in policy (ours, small): its check waits for ``release`` and
    notes the thread; ``policy_reconfigure`` records what it applied."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.checked_in: list[int] = []
        self.applied: list[Any] = []

    @hookimpl
    def policy_prepare_config(self, config: str, source: str) -> Any:
        self.checked_in.append(threading.get_ident())
        if config == "bug":
            raise ValueError("a bug in the check")
        self.release.wait(10)
        return {"checked": config}

    @hookimpl
    def policy_reconfigure(self, config: str, source: str, prepared: Any) -> list[Any]:
        self.applied.append(prepared)
        return []


async def test_configuration_is_checked_off_the_loop_within_a_bound() -> None:
    policy = SlowToCheck()
    host = PolicyHost("t", policy)
    host.prepare_timeout = 0.5
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    beating = asyncio.create_task(ticker())
    try:
        rejected = await host.try_reconfigure("x", "file")
    finally:
        beating.cancel()
    assert str(rejected) == "configuration not checked in 0.5s (too large or too complex)"
    assert ticks > 5  # the loop went on while the check hung
    assert policy.checked_in and policy.checked_in[0] != threading.get_ident()
    assert policy.applied == []  # the running configuration stays
    policy.release.set()
    assert await host.try_reconfigure("y", "file") is None
    assert policy.applied == [{"checked": "y"}]
    host.shutdown()


async def test_a_failing_check_is_a_rejection(caplog: pytest.LogCaptureFixture) -> None:
    policy = SlowToCheck()
    host = PolicyHost("t", policy)
    rejected = await host.try_reconfigure("bug", "file")
    assert str(rejected) == "invalid configuration: ValueError: a bug in the check"
    assert "keeping the running configuration" in caplog.text
    assert policy.applied == []
    host.shutdown()


def test_a_state_dir_that_cannot_be_written_is_logged_rarely(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every change tries to save again; the failure is logged at tries 1, 2,
    4, 8 (not at each), and once when a save works again."""
    caplog.set_level(logging.INFO)
    make_host(tmp_path)  # writes the CPU tree
    blocker = tmp_path / "file"
    blocker.write_text("a file where the state dir's parent should be")
    host = PolicyHost(
        "pinner", Pinner(), state_dir=blocker / "state", host_root=str(tmp_path / "root")
    )
    for _ in range(9):
        host.save_now()
    failed = [r for r in caplog.records if "failed to save state to" in r.getMessage()]
    assert len(failed) == 4 and all(r.levelname == "ERROR" for r in failed)
    blocker.unlink()
    blocker.mkdir()
    host.save_now()
    assert any("state saved to" in r.getMessage() for r in caplog.records)
    assert (blocker / "state" / "pinner.state.json").is_file()


class Mutator:
    """A policy that tries to change what it was given."""

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> None:
        pod.name = "changed"  # type: ignore[misc]


def test_a_policy_cannot_mutate_a_pod_it_was_given() -> None:
    host = PolicyHost("t", Mutator())
    pod = Pod(id="p", name="web")
    with pytest.raises(AttributeError, match="immutable"):
        host.create_container(pod, shared("c"))
    assert pod.name == host.pods["p"].name == "web"


# --- the pods a policy must look at again (take_sent_pods) ----------------------


def _sent_pods_host(tmp_path: Path) -> PolicyHost:
    host = PolicyHost("pinner", Pinner(), host_root=sysfs(tmp_path, "0-3"))
    host.synchronize([], [])
    host.take_sent_pods()
    return host


def test_a_pod_resent_unchanged_is_not_sent_again(tmp_path: Path) -> None:
    """The runtime sends a pod with each event of its containers; unchanged, the
    stub's ResentPods hands out the object the cache holds: no policy needs to
    look at that pod again (create, the lifecycle events, an update)."""
    host = _sent_pods_host(tmp_path)
    resent = convert.ResentPods()
    msg = pb.PodSandbox(id="p", name="web", namespace="ns", labels={"app": "a"})
    host.notify(Event.RUN_POD_SANDBOX, resent.convert(msg), None)
    assert host.take_sent_pods() == {"p"}
    c = shared("c1")
    host.create_container(resent.convert(msg), c)
    assert host.take_sent_pods() == set()
    for event in (Event.POST_CREATE_CONTAINER, Event.START_CONTAINER):
        host.notify(event, resent.convert(msg), c)
    host.update_pod_sandbox(resent.convert(msg), Resources())
    assert host.take_sent_pods() == set()
    assert host.pods["p"].labels == {"app": "a"}


def test_a_changed_or_removed_pod_is_still_sent(tmp_path: Path) -> None:
    """A pod whose bytes changed is a new object: sent, at create and at any
    event; so is an equal pod that is not the cache's object (identity is the
    proof, not equality), a pod met for the first time, and a removed one."""
    host = _sent_pods_host(tmp_path)
    resent = convert.ResentPods()
    msg = pb.PodSandbox(id="p", name="web", namespace="ns", labels={"app": "a"})
    c = shared("c1")
    host.create_container(resent.convert(msg), c)  # first seen at its create
    assert host.take_sent_pods() == {"p"}
    msg.labels["app"] = "b"
    host.create_container(resent.convert(msg), shared("c2"))
    assert host.take_sent_pods() == {"p"}
    assert host.pods["p"].labels == {"app": "b"}
    msg.annotations["x"] = "1"
    host.notify(Event.START_CONTAINER, resent.convert(msg), c)
    assert host.take_sent_pods() == {"p"}
    host.notify(Event.START_CONTAINER, convert.pod_from_pb(msg), c)  # equal, not the same
    assert host.take_sent_pods() == {"p"}
    host.notify(Event.REMOVE_POD_SANDBOX, resent.convert(msg), None)
    assert host.take_sent_pods() == {"p"}


class Deferring:
    """A policy whose create and stop leave a call for after the reply."""

    def __init__(self, order: list[str], fail: bool = False, broken: bool = False) -> None:
        self.order, self.fail, self.broken = order, fail, broken
        self.host: Any = None

    @hookimpl
    def policy_start(self, host: Any) -> None:
        self.host = host

    def _after_reply(self) -> None:
        self.order.append("after reply")
        if self.broken:
            raise RuntimeError("a bug in the call")

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        self.host.after_reply(self._after_reply)
        self.order.append("decided")
        if self.fail:
            raise PolicyError("no room")
        return CreateResult(adjustment=Adjustment(resources=Resources(cpu=CpuResources(cpus="1"))))

    @hookimpl
    def nri_stop_container(self, pod: Pod, container: Container) -> list[Update]:
        self.host.after_reply(self._after_reply)
        self.order.append("decided")
        return []


def _deferring_host(tmp_path: Path, policy: Deferring) -> PolicyHost:
    host = PolicyHost("deferring", policy, state_dir=tmp_path / "state",
                      host_root=sysfs(tmp_path, "0-3"))  # fmt: skip
    host.configure("", CONTAINERD_17)
    host.synchronize([], [])
    record = host.statefile.record

    def journaled(*args: Any, **kwargs: Any) -> None:
        record(*args, **kwargs)
        policy.order.append("journaled")

    host.statefile.record = journaled  # type: ignore[method-assign]
    return host


def test_a_call_after_the_reply_runs_once_the_answer_is_journaled(tmp_path: Path) -> None:
    """What a create or stop leaves for after its reply (a helper request)
    runs after the decision is journaled; without a stub around it (whose
    block runs it once the answer is written: test_stub) the host runs it
    before returning the answer; outside an answer it runs at once."""
    order: list[str] = []
    host = _deferring_host(tmp_path, Deferring(order))
    pod = Pod(id="p", name="pod")
    result = host.create_container(pod, shared("a"))
    order.append("returned")
    assert result.adjustment is not None
    assert order == ["decided", "journaled", "after reply", "returned"]
    order.clear()
    host.stop_container(pod, shared("a"))
    order.append("returned")
    assert order == ["decided", "journaled", "after reply", "returned"]
    order.clear()
    host.after_reply(lambda: order.append("now"))
    assert order == ["now"]


def test_a_call_after_the_reply_runs_when_the_hook_fails_and_its_failure_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A hook that raises still has its call run (a helper request it sent
    is finished), and the error is the answer; a call that raises is logged
    and the answer stands."""
    order: list[str] = []
    host = _deferring_host(tmp_path, Deferring(order, fail=True))
    with pytest.raises(PolicyError, match="no room"):
        host.create_container(Pod(id="p", name="pod"), shared("a"))
    assert order == ["decided", "after reply"]
    order.clear()
    host = _deferring_host(tmp_path / "2", Deferring(order, broken=True))
    with caplog.at_level(logging.ERROR, logger="nri_framework.host"):
        result = host.create_container(Pod(id="p", name="pod"), shared("a"))
    assert result.adjustment is not None and order == ["decided", "journaled", "after reply"]
    assert "a call after the reply failed" in caplog.text
    assert "a bug in the call" in caplog.text

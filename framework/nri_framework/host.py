"""The microkernel: pod/container cache, the policy's plugin manager, state.

The stub hands the host typed requests; the host keeps its cache current,
calls the policy's hooks through pluggy, records what was decided and
persists it before the reply leaves: one record appended to the decision
journal per change, compacted into the snapshot off the reply path (see
:mod:`nri_framework.journal`). One policy is active at a time; other
registered plugins (observers) receive the notification hooks too, never the
decision hooks (:mod:`nri_framework.hookrelay`).

A new configuration is parsed and checked off the event loop (the policy's
``policy_prepare_config`` in a worker thread, bounded by
:data:`PREPARE_TIMEOUT`), then applied on it: a huge or slow configuration
never delays an NRI reply.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import msgspec
import pluggy
from nri_sst.retry import Reporter

from nri_framework import hookspecs
from nri_framework.hookrelay import PolicyHooks
from nri_framework.hookspecs import EVENT_HOOKS, PROJECT, PolicyError, hookimpl
from nri_framework.journal import COMPACT_BYTES, Decision, Journal
from nri_framework.model import (
    Container,
    ContainerState,
    CpuResources,
    CreateResult,
    Event,
    Pod,
    Resources,
    RuntimeInfo,
    Update,
)
from nri_framework.nri.versions import valid_events

if TYPE_CHECKING:
    from nri_framework.contract import Host

log = logging.getLogger("nri_framework.host")

STATE_VERSION = 1
#: Coalescing delay of snapshots (seconds): the compaction of the journal,
#: off the reply path (the journal record is what is on the reply path).
SAVE_DELAY = 0.05
#: Seconds a new configuration may take to be parsed and checked off the loop.
PREPARE_TIMEOUT = 30.0
#: The share of the runtime's request timeout a hook may spend blocked on its
#: own work (:meth:`PolicyHost.reply_budget`): a quarter, the rest is margin
#: for the host, the interpreter and a loaded machine.
REPLY_SHARE = 0.25


class SavedState(msgspec.Struct, kw_only=True):
    """The snapshot: the cache as last decided, and the policy's own state;
    ``seq`` is the last journal record it holds."""

    version: int = STATE_VERSION
    policy: str = ""
    seq: int = 0
    pods: dict[str, Pod] = {}
    containers: dict[str, Container] = {}
    policy_state: Any = None


def with_cpuset(res: Resources | None, cpus: str, mems: str) -> Resources:
    """``res`` with the cpuset fields that are non-empty replaced."""
    res = res or Resources()
    cpu = res.cpu or CpuResources()
    cpu = msgspec.structs.replace(cpu, cpus=cpus or cpu.cpus, mems=mems or cpu.mems)
    return msgspec.structs.replace(res, cpu=cpu)


class Cache:
    """Pods and containers the runtime told us about, by id, with the
    cpusets our decisions gave them.

    Registered with the plugin manager so that the subscription always
    includes the removal events the cache needs to forget things.
    """

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.containers: dict[str, Container] = {}
        #: what changed since the last journal record (ids), or everything
        self.dirty_pods: set[str] = set()
        self.dirty_containers: set[str] = set()
        self.dirty_all = False

    def replace(self, pods: list[Pod], containers: list[Container]) -> None:
        """Everything the runtime reported (Synchronize)."""
        self.pods = {p.id: p for p in pods}
        self.containers = {c.id: c for c in containers}
        self.dirty_all = True

    def put_pod(self, pod: Pod) -> None:
        self.pods[pod.id] = pod
        self.dirty_pods.add(pod.id)

    def put_container(self, container: Container) -> None:
        self.containers[container.id] = container
        self.dirty_containers.add(container.id)

    def record(self, container_id: str, resources: Resources | None) -> None:
        """Remember the cpuset/memset a decision gave ``container_id``."""
        c = self.containers.get(container_id)
        if c is None or resources is None or resources.cpu is None:
            return
        cpu = resources.cpu
        if cpu.cpus or cpu.mems:
            c.resources = with_cpuset(c.resources, cpu.cpus, cpu.mems)
            self.dirty_containers.add(container_id)

    def set_state(self, container_id: str, state: ContainerState) -> None:
        c = self.containers.get(container_id)
        if c is not None:
            c.state = state
            self.dirty_containers.add(container_id)

    @staticmethod
    def _stored(c: Container) -> Container:
        return msgspec.structs.replace(c, args=[], env=[])

    def snapshot(self) -> tuple[dict[str, Pod], dict[str, Container]]:
        """What to persist: everything but the bulky argv and environment."""
        return dict(self.pods), {cid: self._stored(c) for cid, c in self.containers.items()}

    def take_changes(self, seq: int) -> Decision:
        """A journal record of what changed since the last one (and forget it)."""
        if self.dirty_all:
            pods, containers = self.snapshot()
            d = Decision(seq=seq, reset=True, pods=dict(pods), containers=dict(containers))
        else:
            d = Decision(
                seq=seq,
                pods={pid: self.pods.get(pid) for pid in self.dirty_pods},
                containers={
                    cid: self._stored(c) if (c := self.containers.get(cid)) else None
                    for cid in self.dirty_containers
                },
            )
        self.clear_changes()
        return d

    def clear_changes(self) -> None:
        self.dirty_pods.clear()
        self.dirty_containers.clear()
        self.dirty_all = False

    @hookimpl(trylast=True)
    def nri_remove_container(self, pod: Pod, container: Container) -> None:
        self.containers.pop(container.id, None)
        self.dirty_containers.add(container.id)

    @hookimpl(trylast=True)
    def nri_remove_pod_sandbox(self, pod: Pod) -> None:
        self.pods.pop(pod.id, None)
        self.dirty_pods.add(pod.id)
        for cid in [cid for cid, c in self.containers.items() if c.pod_sandbox_id == pod.id]:
            self.containers.pop(cid, None)
            self.dirty_containers.add(cid)


UpdateSender = Callable[[list[Update]], Awaitable[list[Update]]]


class PolicyHost:
    """What a policy gets in :func:`~nri_framework.hookspecs.policy_start`, and the
    stub's entry into the policy."""

    def __init__(
        self,
        policy_name: str,
        policy: ModuleType | object,
        *,
        options: Mapping[str, Any] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        host_root: str = "/",
        observers: list[object] | None = None,
    ) -> None:
        self.policy_name = policy_name
        self.options: Mapping[str, Any] = dict(options or {})
        self.host_root = host_root
        self.state_dir = Path(state_dir) if state_dir else None
        self.log = logging.getLogger(f"policy.{policy_name}")
        self.cache = Cache()
        self.runtime = RuntimeInfo()
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.pm.register(self.cache, name="cache")
        self.pm.register(policy, name=policy_name)
        for obs in observers or ():
            self.pm.register(obs)
        #: decision hooks reach the policy alone, notifications every plugin
        self.hook = PolicyHooks(self.pm, policy)
        self._update_sender: UpdateSender | None = None
        self._save_handle: asyncio.Handle | None = None
        self._save_reporter = Reporter(log)
        self._save_urgent = False
        self._listeners: list[Callable[[], None]] = []
        self.journal = (
            Journal(self.state_dir / f"{policy_name}.journal") if self.state_dir else None
        )
        self._seq = 0
        self._policy_state = b""  # the last one journaled, encoded
        self._saved = self._load_state()
        self.synchronized = False
        #: configurations are prepared one at a time, in this one worker thread
        self._preparer = concurrent.futures.ThreadPoolExecutor(1, "prepare-config")
        self._reconfiguring = asyncio.Lock()
        self.prepare_timeout = PREPARE_TIMEOUT
        self.hook.policy_start(host=self)

    # -- services for policies ---------------------------------------------

    @property
    def pods(self) -> Mapping[str, Pod]:
        return self.cache.pods

    @property
    def containers(self) -> Mapping[str, Container]:
        return self.cache.containers

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (no arguments, must not block: it runs on the NRI
        event loop) after every change of placement or configuration: what the
        agent uses to republish NRT zones and extended resources."""
        self._listeners.append(callback)

    def set_update_sender(self, sender: UpdateSender | None) -> None:
        self._update_sender = sender

    async def update_containers(self, updates: list[Update]) -> list[Update]:
        """Push updates to the runtime unsolicited; returns the ones that failed.

        Raises :class:`ConnectionError` when no runtime is connected.
        """
        if self._update_sender is None:
            raise ConnectionError("not connected to an NRI runtime")
        for u in updates:
            self.cache.record(u.container_id, u.resources)
        self.changed()  # journaled before the runtime applies them
        return await self._update_sender(updates)

    def reply_budget(self, wanted: float) -> float:
        """Seconds a hook may spend blocked on its own work (a helper exchange)
        while the runtime waits for the answer: ``wanted``, but never more than
        :data:`REPLY_SHARE` of the runtime's request timeout, so that a runtime
        configured with a short ``plugin_request_timeout`` does not drop us for
        waiting on something slow (the rest of the share is the host's own work)."""
        return min(wanted, REPLY_SHARE * self.runtime.request_timeout)

    # -- the subscription ----------------------------------------------------

    def event_mask(self, valid: int) -> int:
        """Subscription bits for every ``nri_*`` hook that has an implementation."""
        mask = 0
        for name, event in EVENT_HOOKS.items():
            if getattr(self.hook, name).get_hookimpls():
                if event.bit & valid:
                    mask |= event.bit
                else:
                    log.warning(
                        "runtime %s %s does not support event %s: hook %s will not be called",
                        self.runtime.name,
                        self.runtime.version,
                        event.name,
                        name,
                    )
        return mask

    # -- requests from the stub ----------------------------------------------

    def configure(self, config: str, runtime: RuntimeInfo) -> int:
        self.runtime = runtime
        if runtime.sent_timeouts:
            log.info(
                "runtime timeouts: registration %d ms, request %d ms; "
                "a reply's blocking work is capped at %.0f ms",
                runtime.registration_timeout * 1000,
                runtime.request_timeout * 1000,
                REPLY_SHARE * runtime.request_timeout * 1000,
            )
        else:
            log.info(
                "runtime %s %s sent no timeouts (NRI < 0.7): assuming NRI's defaults, "
                "registration %d ms, request %d ms",
                runtime.name,
                runtime.version,
                runtime.registration_timeout * 1000,
                runtime.request_timeout * 1000,
            )
        self.hook.nri_configure(config=config, runtime=runtime)
        return self.event_mask(valid_events(runtime.name, runtime.version, runtime.nri_version))

    def synchronize(self, pods: list[Pod], containers: list[Container]) -> list[Update]:
        # the state to keep: the saved one on the first Synchronize; after a
        # reconnect (the runtime restarted, its containers did not) what this
        # process decided since, not what it started with
        if self.synchronized:
            state = self.hook.policy_export_state()
        else:
            state = self._saved.policy_state if self._saved else None
        self.cache.replace(pods, containers)
        updates = (
            self.hook.nri_synchronize(pods=pods, containers=containers, saved_state=state) or []
        )
        for u in updates:
            self.cache.record(u.container_id, u.resources)
        self.synchronized = True
        self.changed()
        return updates

    def restore_without_sync(self) -> list[Update]:
        """Synchronize from the state file, for runtimes that never send Synchronize.

        NRI before v0.10 (containerd 1.7, 2.0, 2.1) does not synchronize
        pre-launched plugins; after a runtime restart such a plugin would
        otherwise forget every running container. The saved pods and
        containers stand in for the runtime's view; the caller pushes the
        returned updates, and containers the runtime no longer knows are
        dropped with :meth:`forget_containers`.
        """
        saved = self._saved
        if saved is None:
            return []
        log.warning(
            "runtime %s %s does not synchronize pre-launched plugins: "
            "restoring %d container(s) of %d pod(s) from %s",
            self.runtime.name,
            self.runtime.version,
            len(saved.containers),
            len(saved.pods),
            self.state_path,
        )
        return self.synchronize(list(saved.pods.values()), list(saved.containers.values()))

    def forget_containers(self, container_ids: list[str]) -> None:
        """Containers the runtime does not know (any more): release them."""
        for cid in container_ids:
            c = self.cache.containers.get(cid)
            if c is None:
                continue
            pod = self.cache.pods.get(c.pod_sandbox_id) or Pod(id=c.pod_sandbox_id)
            log.info("forgetting container %s (%s), unknown to the runtime", c.name, cid)
            self.hook.nri_remove_container(pod=pod, container=c)
        self.changed()

    def create_container(self, pod: Pod, container: Container) -> CreateResult:
        self.cache.put_pod(pod)
        self.cache.put_container(container)
        result: CreateResult | None = self.hook.nri_create_container(pod=pod, container=container)
        if result is None:
            return CreateResult()
        if result.adjustment is not None:
            self.cache.record(container.id, result.adjustment.resources)
        for u in result.updates:
            self.cache.record(u.container_id, u.resources)
        self.changed()
        return result

    def update_container(
        self, pod: Pod, container: Container, resources: Resources
    ) -> list[Update]:
        self.cache.put_container(container)
        updates = (
            self.hook.nri_update_container(pod=pod, container=container, resources=resources) or []
        )
        for u in updates:
            self.cache.record(u.container_id, u.resources)
        if updates:
            self.changed()
        return updates

    def stop_container(self, pod: Pod, container: Container) -> list[Update]:
        self.cache.set_state(container.id, ContainerState.STOPPED)
        updates = self.hook.nri_stop_container(pod=pod, container=container) or []
        for u in updates:
            self.cache.record(u.container_id, u.resources)
        self.changed()
        return updates

    def update_pod_sandbox(self, pod: Pod, resources: Resources) -> None:
        self.cache.put_pod(pod)
        self.hook.nri_update_pod_sandbox(pod=pod, resources=resources)

    def notify(self, event: Event, pod: Pod, container: Container | None) -> None:
        """A lifecycle event without an answer: refresh the cache, call the hooks."""
        hook_name = f"nri_{event.name.lower()}"
        if event is not Event.REMOVE_POD_SANDBOX:
            self.cache.put_pod(pod)
        if container is not None and event is not Event.REMOVE_CONTAINER:
            self.cache.put_container(container)
        caller = getattr(self.hook, hook_name, None)
        if caller is None:
            return
        if container is None:
            caller(pod=pod)
        else:
            caller(pod=pod, container=container)
        if event in (Event.REMOVE_CONTAINER, Event.REMOVE_POD_SANDBOX):
            self.changed()

    async def reconfigure(self, config: str, source: str) -> bool:
        """Hand a new configuration to the policy; push what moved. False when
        the policy rejected it (logged; the running configuration stays)."""
        return await self.try_reconfigure(config, source) is None

    async def try_reconfigure(self, config: str, source: str) -> PolicyError | None:
        """:meth:`reconfigure`, returning the policy's rejection (``None`` when
        applied): the agent reports its text in the custom resource's status.

        The policy parses and checks the text off the event loop
        (``policy_prepare_config``, in the host's one worker thread, at most
        :attr:`prepare_timeout` seconds), then applies it on the loop
        (``policy_reconfigure``). Reconfigurations run one at a time."""
        async with self._reconfiguring:
            try:
                prepared = await self._prepare(config, source)
                updates = (
                    self.hook.policy_reconfigure(config=config, source=source, prepared=prepared)
                    or []
                )
            except PolicyError as exc:
                log.error(
                    "config update from %s failed, keeping the running configuration: %s",
                    source,
                    exc,
                )
                return exc
            log.info(
                "config update from %s applied, %d container(s) to update", source, len(updates)
            )
            self.changed()
            if updates and self._update_sender is not None:
                failed = await self.update_containers(updates)
                if failed:
                    log.warning("runtime failed to update %d container(s)", len(failed))
            return None

    async def _prepare(self, config: str, source: str) -> Any:
        """``policy_prepare_config`` in the worker thread; its result, or
        ``None`` when no policy prepares configurations (``policy_reconfigure``
        parses on the loop then). Raises :class:`PolicyError`."""
        if not self.hook.policy_prepare_config.get_hookimpls():
            return None
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(
            self._preparer, lambda: self.hook.policy_prepare_config(config=config, source=source)
        )
        try:
            return await asyncio.wait_for(future, self.prepare_timeout)
        except TimeoutError:
            raise PolicyError(
                f"configuration not checked in {self.prepare_timeout:g}s (too large or too complex)"
            ) from None
        except PolicyError:
            raise
        except Exception as exc:  # a policy bug must not take the process down
            log.error("checking the configuration from %s failed", source, exc_info=exc)
            raise PolicyError(f"invalid configuration: {type(exc).__name__}: {exc}") from None

    def shutdown(self) -> None:
        self.hook.policy_shutdown()
        self._preparer.shutdown(wait=False, cancel_futures=True)
        self.save_now()
        if self.journal is not None:
            self.journal.close()

    # -- persistence ---------------------------------------------------------

    @property
    def state_path(self) -> Path | None:
        return self.state_dir / f"{self.policy_name}.state.json" if self.state_dir else None

    def _load_snapshot(self) -> SavedState | None:
        path = self.state_path
        if path is None or not path.exists():
            return None
        try:
            state = msgspec.json.decode(path.read_bytes(), type=SavedState)
        except (OSError, msgspec.DecodeError) as exc:
            log.error("ignoring unreadable state file %s: %s", path, exc)
            return None
        if state.version != STATE_VERSION or state.policy != self.policy_name:
            log.warning(
                "ignoring state file %s of policy %r, version %d", path, state.policy, state.version
            )
            return None
        return state

    def _load_state(self) -> SavedState | None:
        """The snapshot with the journal's later records applied."""
        state = self._load_snapshot()
        replayed = 0
        if self.journal is not None:
            base = state or SavedState(policy=self.policy_name)
            for d in self.journal.replay():
                if d.seq <= base.seq:
                    continue  # compacted already: the snapshot holds it
                if d.reset:
                    base.pods, base.containers = {}, {}
                for pid, pod in d.pods.items():
                    if pod is None:
                        base.pods.pop(pid, None)
                    else:
                        base.pods[pid] = pod
                for cid, ctr in d.containers.items():
                    if ctr is None:
                        base.containers.pop(cid, None)
                    else:
                        base.containers[cid] = ctr
                policy_state = d.state()
                if policy_state is not msgspec.UNSET:
                    base.policy_state = policy_state
                base.seq = d.seq
                replayed += 1
            if replayed:
                state = base
        if state is None:
            return None
        self._seq = state.seq
        log.info(
            "loaded state of %d container(s) from %s (%d journal record(s) after the snapshot)",
            len(state.containers),
            self.state_path,
            replayed,
        )
        return state

    def changed(self) -> None:
        """Something worth persisting changed: journal it now (before the
        reply that announces it), snapshot soon, after the reply is out."""
        self._journal()
        for callback in self._listeners:
            try:
                callback()
            except Exception:
                log.exception("change listener failed")
        if self.state_dir is None:
            return
        urgent = self.journal is not None and self.journal.size > COMPACT_BYTES
        if self._save_handle is not None and not (urgent and not self._save_urgent):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.save_now()
            return
        if self._save_handle is not None:
            self._save_handle.cancel()
        # past COMPACT_BYTES: on the next turn of the loop (still after the reply)
        if urgent:
            self._save_handle = loop.call_soon(self.save_now)
        else:
            self._save_handle = loop.call_later(SAVE_DELAY, self.save_now)
        self._save_urgent = urgent

    def _journal(self) -> None:
        """One record: the cache entries that changed, the policy's state if
        it did (one small ``write(2)``; see :mod:`nri_framework.journal`)."""
        if self.journal is None:
            return
        self._seq += 1
        decision = self.cache.take_changes(self._seq)
        try:
            policy_state = msgspec.msgpack.encode(self.hook.policy_export_state())
        except (msgspec.EncodeError, TypeError, OverflowError) as exc:  # a policy bug
            log.error("cannot journal the policy's state: %s", exc)
            policy_state = self._policy_state
        if policy_state != self._policy_state:
            decision.policy_state = msgspec.Raw(policy_state)
            self._policy_state = policy_state
        self.journal.append(decision)

    def save_now(self) -> None:
        """Write the snapshot, then empty the journal it holds."""
        if self._save_handle is not None:
            self._save_handle.cancel()
        self._save_handle = None
        path = self.state_path
        if path is None:
            return
        pods, containers = self.cache.snapshot()
        self.cache.clear_changes()
        state = SavedState(
            policy=self.policy_name,
            seq=self._seq,
            pods=pods,
            containers=containers,
            policy_state=self.hook.policy_export_state(),
        )
        tmp = path.with_suffix(".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(msgspec.json.encode(state))
            os.replace(tmp, path)
        except OSError as exc:
            # every change tries again: the line is repeated rarely (nri_sst.retry)
            self._save_reporter.failed(f"failed to save state to {path}: {exc}")
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self._save_reporter.cleared(f"state saved to {path} again")
        if self.journal is not None:
            self.journal.reset()
            self._policy_state = b""  # each journal carries the policy's state again


if TYPE_CHECKING:
    # the host keeps the contract's promise to policies (mypy checks it here)
    def _as_contract(host: PolicyHost) -> Host:
        return host

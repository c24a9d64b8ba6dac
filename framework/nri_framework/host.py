"""The microkernel: the policy's plugin manager and the requests it answers.

The stub hands the host typed requests; the host keeps its cache current
(:mod:`nri_framework.cache`), calls the policy's hooks through pluggy,
records what was decided and persists it before the reply leaves: one
record appended to the decision journal per change, compacted into the
snapshot off the reply path (:mod:`nri_framework.statefile`,
:mod:`nri_framework.journal`). One policy is active at a time; other
registered plugins (observers) receive the notification hooks too, never the
decision hooks (:mod:`nri_framework.hookrelay`).

A new configuration is parsed and checked off the event loop (the policy's
``policy_prepare_config`` in a worker thread, bounded by
:data:`PREPARE_TIMEOUT`), then applied on it: a huge or slow configuration
never delays an NRI reply.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nri_framework.cache import Cache
from nri_framework.hookrelay import PolicyHooks
from nri_framework.hookspecs import EVENT_HOOKS, PolicyError, plugin_manager
from nri_framework.model import (
    Container,
    ContainerState,
    CreateResult,
    Event,
    Pod,
    Resources,
    RuntimeInfo,
    Update,
)
from nri_framework.nri.versions import valid_events
from nri_framework.statefile import StateFile

if TYPE_CHECKING:
    from nri_framework.contract import Host

log = logging.getLogger("nri_framework.host")

#: Seconds a new configuration may take to be parsed and checked off the loop.
PREPARE_TIMEOUT = 30.0
#: The share of the runtime's request timeout a hook may spend blocked on its
#: own work (:meth:`PolicyHost.reply_budget`): a quarter, the rest is margin
#: for the host, the interpreter and a loaded machine.
REPLY_SHARE = 0.25
SENT_PODS_MAX = 65536
"""Pod ids :meth:`PolicyHost.take_sent_pods` remembers between two calls (a
policy that never asks costs no more than this); past it, it answers "any"."""


UpdateSender = Callable[[list[Update]], Awaitable[list[Update]]]

#: each event's notification hook (``nri_<event>``), named once, not per event
HOOK_NAMES = {event: f"nri_{event.name.lower()}" for event in Event}


class PolicyHost:
    """What a policy gets in :func:`~nri_framework.hookspecs.policy_start`, and the
    stub's entry into the policy."""

    def __init__(
        self,
        policy_name: str,
        policy: ModuleType | object,
        *,
        options: argparse.Namespace | Mapping[str, Any] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        host_root: str = "/",
        observers: list[object] | None = None,
    ) -> None:
        self.policy_name = policy_name
        #: the parsed command line: ``run``'s flags and the policy's own (see
        #: ``policy_addoption``); a mapping (a host built by hand) becomes one
        self.options = (
            options
            if isinstance(options, argparse.Namespace)
            else argparse.Namespace(**(options or {}))
        )
        self.host_root = host_root
        self.state_dir = Path(state_dir) if state_dir else None
        self.log = logging.getLogger(f"policy.{policy_name}")
        self.cache = Cache()
        self.runtime = RuntimeInfo()
        self.pm = plugin_manager()
        self.pm.register(self.cache, name="cache")
        self.pm.register(policy, name=policy_name)
        for obs in observers or ():
            self.pm.register(obs)
        #: decision hooks reach the policy alone, notifications every plugin
        self.hook = PolicyHooks(self.pm, policy)
        self._update_sender: UpdateSender | None = None
        self._sent_pods: set[str] | None = set()
        """pods the runtime sent since :meth:`take_sent_pods` (None: too many to tell)"""
        self._listeners: list[Callable[[], None]] = []
        self._after_reply: list[Callable[[], None]] | None = None
        """While a request is answered: what runs once its answer is out
        (:meth:`after_reply`)."""
        self._config_listeners: list[Callable[[], None]] = []
        self.statefile = StateFile(self.state_dir, policy_name)
        self.journal = self.statefile.journal
        self._saved = self.statefile.load()
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

    def take_sent_pods(self) -> set[str] | None:
        """The ids of the pods the runtime sent (anew, added or removed) since
        the last call, and forget them: what a policy that keeps per-pod
        conclusions reads to know which are stale. ``None``: any may be (more
        than :data:`SENT_PODS_MAX` since the last call, or a Synchronize)."""
        sent, self._sent_pods = self._sent_pods, set()
        return sent

    def _put_pod(self, pod: Pod) -> None:
        """Cache ``pod``; mark it sent (:meth:`take_sent_pods`) unless it is the
        very object the cache holds: the runtime resent it unchanged
        (:class:`~nri_framework.convert.ResentPods` hands out its last
        conversion while the bytes are the same), and the mark of its last
        change is still pending or was taken by a decision that read this pod."""
        unchanged = self.cache.pods.get(pod.id) is pod
        self.cache.put_pod(pod)
        if not unchanged:
            self._pod_sent(pod.id)

    def _pod_sent(self, pod_id: str) -> None:
        sent = self._sent_pods
        if sent is None:
            return
        if len(sent) >= SENT_PODS_MAX:  # nobody asks: bounded, then "any"
            self._sent_pods = None
            return
        sent.add(pod_id)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (no arguments, must not block: it runs on the NRI
        event loop) after every change of placement or configuration: what the
        agent uses to republish NRT zones and extended resources."""
        self._listeners.append(callback)

    def add_config_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (no arguments, must not block) after the runtime's
        Configure and after every configuration the policy took
        (:meth:`try_reconfigure`): what follows the configuration alone (the
        instrumentation endpoint) listens here, not on every decision."""
        self._config_listeners.append(callback)

    def _configured(self) -> None:
        for callback in self._config_listeners:
            try:
                callback()
            except Exception:
                log.exception("configuration listener failed")

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
        self._configured()
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
        self._sent_pods = None
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
        self._put_pod(pod)
        self.cache.put_container(container)
        with self.replying():
            result: CreateResult | None = self.hook.nri_create_container(
                pod=pod, container=container
            )
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
        with self.replying():
            updates = self.hook.nri_stop_container(pod=pod, container=container) or []
            for u in updates:
                self.cache.record(u.container_id, u.resources)
            self.changed()
            return updates

    def observe(self, plugin: object) -> None:
        """Register ``plugin``'s notification hooks (an observer's): before
        Configure, its ``nri_*`` hooks count in the subscription."""
        self.pm.register(plugin)

    def after_reply(self, call: Callable[[], None]) -> None:
        """``call`` runs once the answer of the request now answered is out
        (journaled before, whether the hook returned or raised), before the
        next request is read, so that the runtime does not wait for it;
        outside an answer, now. A call that raises is logged: the answer
        stands."""
        if self._after_reply is None:
            self._run(call)
        else:
            self._after_reply.append(call)

    @contextlib.contextmanager
    def replying(self) -> Iterator[list[Callable[[], None]]]:
        """The answer of one request: what :meth:`after_reply` is given in the
        block (the list yielded) runs when it is left (returned or raised).
        The stub writes the answer inside its block; a block inside another
        leaves its calls to the outer one (the host's own, around a create or
        stop, runs them when no stub is around)."""
        if self._after_reply is not None:
            yield self._after_reply
            return
        calls: list[Callable[[], None]] = []
        self._after_reply = calls
        try:
            yield calls
        finally:
            self._after_reply = None
            for call in calls:
                self._run(call)

    @staticmethod
    def _run(call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:
            log.exception("a call after the reply failed")

    def update_pod_sandbox(self, pod: Pod, resources: Resources) -> None:
        self._put_pod(pod)
        self.hook.nri_update_pod_sandbox(pod=pod, resources=resources)

    def notify(self, event: Event, pod: Pod, container: Container | None) -> None:
        """A lifecycle event without an answer: refresh the cache, call the hooks."""
        if event is not Event.REMOVE_POD_SANDBOX:
            self._put_pod(pod)
        else:
            self._pod_sent(pod.id)
        if container is not None and event is not Event.REMOVE_CONTAINER:
            self.cache.put_container(container)
        caller = getattr(self.hook, HOOK_NAMES[event], None)
        if caller is None:
            return
        if container is None:
            caller(pod=pod)
        else:
            caller(pod=pod, container=container)
        if event is Event.REMOVE_CONTAINER or event is Event.REMOVE_POD_SANDBOX:
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
            self._configured()
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
        self.statefile.close()

    # -- persistence: the state file (snapshot and journal) ------------------

    @property
    def state_path(self) -> Path | None:
        return self.statefile.path

    def changed(self) -> None:
        """Something worth persisting changed: journal it now (before the
        reply that announces it), snapshot soon, after the reply is out."""
        self.statefile.record(
            self.cache, self.hook.policy_export_state, self.hook.policy_state_changes
        )
        for callback in self._listeners:
            try:
                callback()
            except Exception:
                log.exception("change listener failed")
        self.statefile.schedule(self._save_soon)

    def save_now(self) -> None:
        """Write the snapshot, then empty the journal it holds."""
        self.statefile.save(
            self.cache, self.hook.policy_export_state, self.hook.policy_state_changes
        )

    def _save_soon(self) -> None:
        """The scheduled snapshot: its file written off the loop."""
        self.statefile.save(
            self.cache,
            self.hook.policy_export_state,
            self.hook.policy_state_changes,
            background=True,
        )


if TYPE_CHECKING:
    # the host keeps the contract's promise to policies (mypy checks it here)
    def _as_contract(host: PolicyHost) -> Host:
        return host

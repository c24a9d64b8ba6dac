"""The Kubernetes agent: configuration from custom resources, per-node status,
NodeResourceTopology and node extended resources.

Its coroutines run on the NRI event loop, where the policy's hooks may be
called, but they only decide: every Kubernetes request runs in the agent's
worker threads (``await self.io(fn, ...)``) and the watches in daemon
threads that hand their events back with ``loop.call_soon_threadsafe``. The
host's change listener only sets flags, so an NRI reply never waits for the
agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from nri_framework.agent.config import ConfigSource, nrt_enabled, nrt_window
from nri_framework.agent.extres import ExtendedResources
from nri_framework.agent.kube import (
    Informer,
    KubeClient,
    KubeError,
    Obj,
    PolicyResource,
    load_client_configuration,
)
from nri_framework.agent.nrt import NrtPublisher
from nri_framework.agent.options import AgentOptions
from nri_framework.host import PolicyHost
from nri_framework.zones import Zone

log = logging.getLogger("nri_framework.agent")

T = TypeVar("T")

#: Seconds the clean stop may spend removing our status entry.
STOP_TIMEOUT = 5.0


class Agent:
    """One per process; :meth:`start` on the NRI event loop, :meth:`stop` on exit."""

    def __init__(
        self, host: PolicyHost, options: AgentOptions, client: KubeClient | None = None
    ) -> None:
        self.host = host
        self.options = options
        self.resource = PolicyResource.for_policy(host.policy_name)
        self.client = client
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="k8s-agent")
        self._tasks: list[asyncio.Task[None]] = []
        self._informers: list[Informer] = []
        self._stopped = False
        self.source: ConfigSource | None = None
        self.nrt: NrtPublisher | None = None
        self.extres: ExtendedResources | None = None

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn(*args)`` in a worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    # -- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and start watching; raises when there is no way to reach a cluster."""
        opts = self.options
        if self.client is None:
            cfg = await self.io(load_client_configuration, opts.kubeconfig)
            self.client = KubeClient(cfg, self.resource)
        client = self.client
        log.info(
            "agent: node %s, configuration from %s in namespace %s (group label %s)",
            opts.node,
            self.resource.plural,
            opts.namespace,
            opts.group_label,
        )
        self.source = ConfigSource(
            node=opts.node,
            namespace=opts.namespace,
            group_label=opts.group_label,
            resource=self.resource,
            client=client,
            io=self.io,
            apply=self._apply,
            on_change=self._config_changed,
        )
        self.nrt = NrtPublisher(
            node=opts.node,
            policy=self.host.policy_name,
            client=client,
            io=self.io,
            zones=self._zones,
        )
        self.extres = ExtendedResources(
            node=opts.node,
            client=client,
            io=self.io,
            desired=self._extended_resources,
            resync=opts.resync,
            retry=opts.retry,
        )
        loop = asyncio.get_running_loop()
        source = self.source

        def to_loop(handler: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
            def deliver(kind: str, payload: Any) -> None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: we are exiting
                    loop.call_soon_threadsafe(handler, kind, payload)

            return deliver

        def node_snapshot() -> tuple[list[Obj], str | None]:
            try:
                node = client.get_node(opts.node)
            except KubeError as exc:
                if exc.not_found:
                    return [], None
                raise
            return [node], (node.get("metadata") or {}).get("resourceVersion")

        def policies_snapshot() -> tuple[list[Obj], str | None]:
            listing = client.list_policies(opts.namespace)
            return listing.get("items") or [], (listing.get("metadata") or {}).get(
                "resourceVersion"
            )

        self._informers = [
            Informer(
                f"node {opts.node}",
                node_snapshot,
                functools.partial(client.watch_nodes, opts.node),
                to_loop(self._on_node),
            ),
            Informer(
                f"{self.resource.plural} in {opts.namespace}",
                policies_snapshot,
                functools.partial(client.watch_policies, opts.namespace),
                to_loop(source.on_policies),
            ),
        ]
        for informer in self._informers:
            informer.start()
        for name, coro in (
            ("config", source.run()),
            ("nrt", self.nrt.run()),
            ("extended-resources", self.extres.run()),
        ):
            self._tasks.append(self._spawn(name, coro))
        self.host.add_listener(self._changed)

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"agent-{name}")

        def done(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("agent %s loop died", name, exc_info=t.exception())

        task.add_done_callback(done)
        return task

    async def wait_configured(self, stopping: asyncio.Event) -> bool:
        """Until the policy accepted its first configuration (True) or ``stopping``."""
        assert self.source is not None
        accepted = asyncio.ensure_future(self.source.accepted.wait())
        stop = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({accepted, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            accepted.cancel()
            stop.cancel()
        return self.source.accepted.is_set()

    async def stop(self) -> None:
        """Stop watching and writing; remove our entry from the status of the
        custom resource in force (NRT and extended resources stay)."""
        if self._stopped:
            return
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for informer in self._informers:
            informer.stop()
        if self.source is not None:
            try:
                await asyncio.wait_for(self.source.shutdown(), STOP_TIMEOUT)
            except Exception as exc:
                log.warning("could not remove this node's status entry: %s", exc)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.client is not None:
            self.client.close()

    # -- between the policy and the agent (event loop) ---------------------------------

    async def _apply(self, text: str, source: str) -> str | None:
        error = await self.host.try_reconfigure(text, source)
        return None if error is None else str(error)

    def _on_node(self, kind: str, payload: Any) -> None:
        """The Node watch: its labels choose the configuration, its capacity
        is what the extended resources are compared with."""
        assert self.source is not None and self.extres is not None
        self.source.on_node(kind, payload)
        self.extres.on_node(kind, payload)

    def _config_changed(self, spec: Mapping[str, Any] | None) -> None:
        assert self.nrt is not None and self.extres is not None
        if spec is not None:
            self.nrt.set_window(nrt_window(spec))
            self.nrt.set_enabled(nrt_enabled(spec))
        self.extres.set_in_force(spec is not None)

    def _changed(self) -> None:
        """The host's change listener: placement or configuration changed."""
        if self._stopped:
            return
        if self.nrt is not None:
            self.nrt.changed()
        if self.extres is not None:
            self.extres.changed()

    def _zones(self) -> list[Zone] | None:
        zones: list[Zone] | None = self.host.hook.policy_topology_zones()
        return zones

    def _extended_resources(self) -> dict[str, int | None] | None:
        wanted: dict[str, int | None] | None = self.host.hook.policy_extended_resources()
        return wanted

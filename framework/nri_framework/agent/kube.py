"""Blocking Kubernetes I/O: the one module that imports the ``kubernetes`` client.

Every method blocks (the official client is synchronous): the agent calls
them in its worker threads, never on the NRI event loop. Objects travel as
the plain JSON dicts the API server sends (no client models). Watches run in
their own daemon threads (:class:`Informer`) and hand every change to a
callback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes as _kubernetes

log = logging.getLogger("nri_framework.agent")

#: The client, partly typed: used through ``Any``.
kubernetes: Any = _kubernetes

Obj = dict[str, Any]

#: Seconds to wait for an ordinary request (GET, PATCH, PUT, POST).
REQUEST_TIMEOUT = 10.0
#: Seconds a watch request lives on the server before we start a new one.
WATCH_SECONDS = (240, 300)

NRT_GROUP = "topology.node.k8s.io"
NRT_VERSION = "v1alpha2"
NRT_PLURAL = "noderesourcetopologies"

MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """A request the API server answered with an error (or did not answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410


@dataclass(frozen=True)
class PolicyResource:
    """Where a policy's configuration lives: ``<plural>.<group>/<version>``."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @classmethod
    def for_policy(cls, policy: str) -> PolicyResource:
        """Upstream's naming: ``balloons`` -> ``balloonspolicies.config.nri``,
        kind ``BalloonsPolicy``."""
        return cls("config.nri", "v1alpha1", f"{policy}policies", f"{policy.capitalize()}Policy")


def load_client_configuration(kubeconfig: str = "") -> Any:
    """How to reach the API server: ``kubeconfig`` when given, else the pod's
    service account when running in a cluster (``KUBERNETES_SERVICE_HOST``),
    else ``$KUBECONFIG`` / ``~/.kube/config``."""
    cfg = kubernetes.client.Configuration()
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=cfg)
        log.info("using the in-cluster configuration (service account)")
    else:
        where = kubeconfig or os.environ.get("KUBECONFIG", "") or "~/.kube/config"
        try:
            kubernetes.config.load_kube_config(
                config_file=kubeconfig or None, client_configuration=cfg, persist_config=False
            )
        except Exception as exc:
            raise KubeError(0, f"kubeconfig {where}: {exc}") from None
        log.info("using kubeconfig %s", where)
    return cfg


def _error(resp: Any) -> KubeError:
    """The API server's ``Status`` message of a failed response."""
    raw = resp.data
    try:
        body = json.loads(raw)
        message = str(body.get("message") or body)
    except (ValueError, AttributeError):
        message = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return KubeError(int(resp.status), message or str(getattr(resp, "reason", "")))


class KubeClient:
    """The requests the agent makes; each returns plain dicts or raises :class:`KubeError`."""

    def __init__(self, configuration: Any, policy: PolicyResource) -> None:
        self.api = kubernetes.client.ApiClient(configuration)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.policy = policy

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.api.close()

    @staticmethod
    def _request(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The raw (unread) response of a successful request; :class:`KubeError` else."""
        try:
            resp = fn(*args, _preload_content=False, **kwargs)
        except kubernetes.client.ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.reason or exc)) from None
        except Exception as exc:  # urllib3 connection errors, timeouts
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from None
        if not 200 <= resp.status <= 299:
            err = _error(resp)
            resp.release_conn()
            raise err
        return resp

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
        resp = self._request(fn, *args, **kwargs)
        data: Obj = json.loads(resp.data) if resp.data else {}
        return data

    # -- nodes ---------------------------------------------------------------------

    def get_node(self, name: str) -> Obj:
        return self._call(self.core.read_node, name)

    def patch_node_status(self, name: str, patch: Obj, timeout: float = 5.0) -> Obj:
        """A JSON merge patch of the node's ``/status``."""
        return self._call(
            self.core.patch_node_status,
            name,
            patch,
            _content_type=MERGE_PATCH,
            _request_timeout=timeout,
        )

    # -- the policy's custom resources ---------------------------------------------------

    def list_policies(self, namespace: str) -> Obj:
        p = self.policy
        return self._call(
            self.custom.list_namespaced_custom_object, p.group, p.version, namespace, p.plural
        )

    def patch_policy_status(self, namespace: str, name: str, patch: Obj) -> Obj:
        """A JSON merge patch of ``/status`` of one custom resource."""
        p = self.policy
        return self._call(
            self.custom.patch_namespaced_custom_object_status,
            p.group,
            p.version,
            namespace,
            p.plural,
            name,
            patch,
            _content_type=MERGE_PATCH,
        )

    # -- NodeResourceTopology --------------------------------------------------------------

    def get_nrt(self, name: str) -> Obj:
        return self._call(
            self.custom.get_cluster_custom_object, NRT_GROUP, NRT_VERSION, NRT_PLURAL, name
        )

    def create_nrt(self, body: Obj) -> Obj:
        return self._call(
            self.custom.create_cluster_custom_object, NRT_GROUP, NRT_VERSION, NRT_PLURAL, body
        )

    def replace_nrt(self, name: str, body: Obj) -> Obj:
        return self._call(
            self.custom.replace_cluster_custom_object,
            NRT_GROUP,
            NRT_VERSION,
            NRT_PLURAL,
            name,
            body,
        )

    # -- watches ---------------------------------------------------------------------

    def watch_nodes(self, name: str, resource_version: str | None) -> Any:
        """A watch on one node (``fieldSelector=metadata.name=NAME``: needs only
        the ``watch`` verb); the raw streaming response."""
        return self._watch(
            self.core.list_node,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version,
        )

    def watch_policies(self, namespace: str, resource_version: str | None) -> Any:
        p = self.policy
        return self._watch(
            self.custom.list_namespaced_custom_object,
            p.group,
            p.version,
            namespace,
            p.plural,
            resource_version=resource_version,
        )

    def _watch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        seconds = random.randint(*WATCH_SECONDS)
        if kwargs.get("resource_version") is None:
            kwargs.pop("resource_version", None)
        return self._request(
            fn,
            *args,
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _request_timeout=(REQUEST_TIMEOUT, seconds + 30),
            **kwargs,
        )


def watch_events(resp: Any) -> Iterator[tuple[str, Obj]]:
    """``(type, object)`` of each line of a watch response."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                event = json.loads(line)
                yield str(event.get("type", "")), event.get("object") or {}
    if buf.strip():
        event = json.loads(buf)
        yield str(event.get("type", "")), event.get("object") or {}


def _shutdown(resp: Any) -> None:
    """Unblock a thread reading ``resp`` (closing alone may not wake a blocked read)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    with contextlib.suppress(Exception):
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)


Snapshot = Callable[[], tuple[list[Obj], str | None]]
OpenWatch = Callable[[str | None], Any]
Deliver = Callable[[str, Any], None]


def single_object(kind: str, payload: Any) -> Any:
    """What an :class:`Informer` of one object (a field-selected Node)
    delivered: the object now, or None (deleted, or none listed)."""
    if kind == "SYNC":
        return payload[0] if payload else None
    if kind == "DELETED":
        return None
    return payload


class Informer(threading.Thread):
    """Read a set of objects, then watch it; report every change.

    ``snapshot()`` returns the objects and the resource version to watch from;
    ``open_watch(rv)`` starts a watch. ``deliver`` is called from this thread
    with ``("SYNC", [objects])`` after every (re)list and ``(event type,
    object)`` for each ADDED/MODIFIED/DELETED. Errors are logged and retried
    with a growing delay; an expired resource version (410) lists again.
    """

    def __init__(
        self,
        name: str,
        snapshot: Snapshot,
        open_watch: OpenWatch,
        deliver: Deliver,
        *,
        retry_min: float = 1.0,
        retry_max: float = 30.0,
    ) -> None:
        super().__init__(name=f"informer-{name}", daemon=True)
        self.what = name
        self.snapshot = snapshot
        self.open_watch = open_watch
        self.deliver = deliver
        self.retry_min = retry_min
        self.retry_max = retry_max
        self._stop_event = threading.Event()
        self._resp: Any = None

    def stop(self) -> None:
        self._stop_event.set()
        resp = self._resp
        if resp is not None:
            _shutdown(resp)

    @property
    def stopped(self) -> bool:
        return self._stop_event.is_set()

    def run(self) -> None:
        delay = self.retry_min
        while not self.stopped:
            try:
                items, rv = self.snapshot()
                if self.stopped:
                    return
                self.deliver("SYNC", items)
                self._watch(rv)
                delay = self.retry_min  # the watch expired (410): list again at once
            except Exception as exc:
                if self.stopped:
                    return
                log.warning("watching %s failed, retrying in %.0fs: %s", self.what, delay, exc)
                self._stop_event.wait(delay)
                delay = min(delay * 2, self.retry_max)

    def _watch(self, rv: str | None) -> None:
        """Watch from ``rv`` until stopped; returns to list again (410)."""
        while not self.stopped:
            resp = self.open_watch(rv)
            self._resp = resp
            try:
                if self.stopped:
                    return
                for kind, obj in watch_events(resp):
                    if kind == "ERROR":
                        code = int(obj.get("code") or 0)
                        if code == 410:
                            log.debug("watch of %s expired, listing again", self.what)
                            return
                        raise KubeError(code, str(obj.get("message") or obj))
                    meta = obj.get("metadata") or {}
                    rv = meta.get("resourceVersion") or rv
                    if kind == "BOOKMARK":
                        continue
                    self.deliver(kind, obj)
            finally:
                self._resp = None
                with contextlib.suppress(Exception):
                    resp.release_conn()

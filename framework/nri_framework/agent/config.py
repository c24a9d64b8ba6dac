"""The configuration source: which custom resource configures this node, and
what the node reports back in its status.

Precedence (reference k8s.md §2), in the ``--config-namespace``:

1. ``node.<NODE_NAME>`` whenever it exists;
2. ``group.<G>`` when the Node carries the label ``--config-group-label`` = G
   (``config.nri/group`` by default). A node in a group whose CR does not
   exist has *no* effective configuration: it does not fall back;
3. ``default`` only for nodes without a group label.

Every change of the effective object goes to the policy
(:meth:`~nri_framework.host.PolicyHost.try_reconfigure`), except one whose
``metadata.uid`` and ``metadata.generation`` did not change (what our own
status patch causes). The outcome is written into the object's status with a
JSON merge patch of ``/status``::

    {"status": {"nodes": {"<node>": {"status": "Success", "generation": 2,
                                     "errors": "", "timestamp": "..."}}}}

and removed again (``{"status": {"nodes": {"<node>": null}}}``) when another
object takes over and on shutdown.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from nri_framework.agent.kube import KubeClient, KubeError, Obj, PolicyResource, single_object
from nri_framework.agent.options import DEFAULT_GROUP_LABEL

log = logging.getLogger("nri_framework.agent")

#: Older group label keys, still read (with a warning) when the configured one is absent.
DEPRECATED_GROUP_LABELS = ("group.config.nri", "resource-policy.nri.io/group")

SUCCESS = "Success"
FAILURE = "Failure"

#: Seconds between the tries of a status patch that failed (not for a missing object).
STATUS_RETRY = 1.0
STATUS_TRIES = 3


# --- precedence -------------------------------------------------------------------


def node_group(
    labels: Mapping[str, str], group_label: str = DEFAULT_GROUP_LABEL
) -> tuple[str, str]:
    """The node's configuration group and the label key it came from
    (``("", "")`` for a node in no group)."""
    if labels.get(group_label):
        return labels[group_label], group_label
    for key in DEPRECATED_GROUP_LABELS:
        if key != group_label and labels.get(key):
            return labels[key], key
    return "", ""


def effective_name(node: str, group: str, existing: Collection[str]) -> str | None:
    """The name of the custom resource that configures ``node`` among
    ``existing``, or ``None`` when none does."""
    if f"node.{node}" in existing:
        return f"node.{node}"
    if group:
        name = f"group.{group}"
        return name if name in existing else None
    return "default" if "default" in existing else None


# --- what a custom resource means -------------------------------------------------------


@dataclass(frozen=True)
class ConfigRef:
    """One version of one custom resource (the duplicate filter's key)."""

    name: str
    uid: str
    generation: int

    @classmethod
    def of(cls, obj: Obj) -> ConfigRef:
        meta = obj.get("metadata") or {}
        return cls(
            str(meta.get("name", "")), str(meta.get("uid", "")), int(meta.get("generation", 0))
        )


def policy_text(obj: Obj, resource: PolicyResource) -> str:
    """The custom resource as the YAML document the policy's loader takes:
    ``apiVersion``, ``kind``, ``metadata`` (name and namespace) and ``spec``
    (server-side bookkeeping and ``status`` left out)."""
    meta = obj.get("metadata") or {}
    doc = {
        "apiVersion": obj.get("apiVersion") or resource.api_version,
        "kind": obj.get("kind") or resource.kind,
        "metadata": {k: meta[k] for k in ("name", "namespace") if k in meta},
        "spec": obj.get("spec") or {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def nrt_enabled(spec: Mapping[str, Any] | None) -> bool:
    """``spec.agent.nodeResourceTopology``; true when the ``agent`` section (or
    the whole configuration) is missing, as upstream."""
    if spec is None:
        return True
    agent = spec.get("agent")
    if not isinstance(agent, Mapping):
        return True
    return bool(agent.get("nodeResourceTopology", False))


#: ``agent.nodeResourceTopologyWindow`` when unset: seconds between two NRT writes.
NRT_WINDOW = 10.0
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
                   "m": 60.0, "h": 3600.0}  # fmt: skip
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """A Go duration (``"10s"``, ``"1m30s"``, ``"0"``) in seconds; ValueError else."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if body == "0":
        return 0.0
    total, at = 0.0, 0
    for m in _DURATION_PART.finditer(body):
        if m.start() != at:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        at = m.end()
    if not body or at != len(body):
        raise ValueError(f"invalid duration {text!r}")
    return sign * total


def nrt_window(spec: Mapping[str, Any] | None) -> float:
    """``spec.agent.nodeResourceTopologyWindow`` in seconds (10 s when unset);
    an unusable value (the policy's validation rejects it first) gives the default."""
    agent = (spec or {}).get("agent")
    text = agent.get("nodeResourceTopologyWindow") if isinstance(agent, Mapping) else None
    if not text:
        return NRT_WINDOW
    try:
        window = parse_duration(str(text))
    except ValueError:
        window = -1.0
    if window < 0:
        log.warning("agent.nodeResourceTopologyWindow %r is not usable: using 10s", text)
        return NRT_WINDOW
    return window


# --- status ---------------------------------------------------------------------------


def timestamp(now: datetime.datetime | None = None) -> str:
    """RFC 3339 in UTC, seconds, as Kubernetes writes ``metav1.Time``."""
    now = now or datetime.datetime.now(datetime.UTC)
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_patch(
    node: str, generation: int, error: str | None, now: datetime.datetime | None = None
) -> Obj:
    """The merge patch of ``/status`` that reports how ``node`` took ``generation``;
    ``errors`` is ``""`` on success, to overwrite an earlier failure."""
    return {
        "status": {
            "nodes": {
                node: {
                    "status": SUCCESS if error is None else FAILURE,
                    "generation": generation,
                    "errors": error or "",
                    "timestamp": timestamp(now),
                }
            }
        }
    }


def status_removal(node: str) -> Obj:
    """The merge patch that deletes ``node``'s entry."""
    return {"status": {"nodes": {node: None}}}


# --- the source ------------------------------------------------------------------------

IO = Callable[..., Awaitable[Any]]
Apply = Callable[[str, str], Awaitable[str | None]]


class ConfigSource:
    """Follows the Node's labels and the policy's custom resources (both fed
    by informers through :meth:`on_node` / :meth:`on_policies`, on the event
    loop) and delivers the effective configuration.

    :param apply: hands a configuration text and its source to the policy;
        returns the rejection text or ``None``.
    :param io: runs a blocking call off the event loop (``await io(fn, *args)``).
    :param on_change: called with the ``spec`` now in force after the policy
        accepted it, and with ``None`` when none is: the node lost its
        effective configuration, or the policy rejected the first one. Not
        called for a rejected update (the running configuration stays).
    """

    def __init__(
        self,
        *,
        node: str,
        namespace: str,
        group_label: str,
        resource: PolicyResource,
        client: KubeClient,
        io: IO,
        apply: Apply,
        on_change: Callable[[Mapping[str, Any] | None], None],
    ) -> None:
        self.node = node
        self.namespace = namespace
        self.group_label = group_label
        self.resource = resource
        self.client = client
        self.io = io
        self.apply = apply
        self.on_change = on_change
        self.labels: dict[str, str] | None = None
        self.policies: dict[str, Obj] | None = None
        #: The object version last delivered (accepted or not): the duplicate filter.
        self.delivered: ConfigRef | None = None
        #: Set once a configuration was accepted.
        self.accepted = asyncio.Event()
        self.decided = False
        self._kick = asyncio.Event()
        self._warned_label = ""

    # -- informer input (event loop) -------------------------------------------------

    def on_node(self, kind: str, payload: Any) -> None:
        node = single_object(kind, payload)
        if node is None:
            if self.labels is None:
                log.warning("node %s not found; taking it as a node without labels", self.node)
            self.labels = {}
        else:
            self.labels = dict((node.get("metadata") or {}).get("labels") or {})
        self._kick.set()

    def on_policies(self, kind: str, payload: Any) -> None:
        if kind == "SYNC":
            self.policies = {ConfigRef.of(o).name: o for o in payload}
        else:
            if self.policies is None:
                self.policies = {}
            name = ConfigRef.of(payload).name
            if kind == "DELETED":
                self.policies.pop(name, None)
            else:
                self.policies[name] = payload
        self._kick.set()

    # -- decisions -------------------------------------------------------------------

    def effective(self) -> Obj | None:
        assert self.labels is not None and self.policies is not None
        group, key = node_group(self.labels, self.group_label)
        if key and key != self.group_label and key != self._warned_label:
            self._warned_label = key
            log.warning(
                "node %s: using deprecated group label %s=%s, please use %s",
                self.node,
                key,
                group,
                self.group_label,
            )
        name = effective_name(self.node, group, self.policies)
        return self.policies[name] if name else None

    async def run(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            if self.labels is None or self.policies is None:
                continue
            try:
                await self.reconcile()
            except Exception:
                log.exception("failed to handle a configuration change")

    async def reconcile(self) -> None:
        obj = self.effective()
        ref = ConfigRef.of(obj) if obj is not None else None
        if self.decided and ref == self.delivered:
            return
        previous = self.delivered
        first = not self.decided
        self.decided = True
        if previous is not None and (ref is None or ref.uid != previous.uid):
            await self._remove_entry(previous)
        self.delivered = ref
        if obj is None or ref is None:
            group, _ = node_group(self.labels or {}, self.group_label)
            where = f"group.{group}" if group else "default"
            log.warning(
                "node (%s) has no effective configuration (looked for %s and %s in namespace %s)",
                self.node,
                f"node.{self.node}",
                where,
                self.namespace,
            )
            self.on_change(None)
            return
        source = f"{self.resource.kind} {self.namespace}/{ref.name}"
        log.info(
            "%s configuration %s (generation %d)",
            "initial" if first or previous is None else "new",
            source,
            ref.generation,
        )
        try:
            error = await self.apply(policy_text(obj, self.resource), source)
        except Exception as exc:
            log.exception("applying %s failed", source)
            error = str(exc) or type(exc).__name__
        if error is None:
            # in force from now on: what waits for it (the registration with the
            # runtime) does not wait for the report below, however slow the API is
            self.accepted.set()
            self.on_change(obj.get("spec") or {})
        await self._patch_status(ref.name, status_patch(self.node, ref.generation, error))
        if error is not None and not self.accepted.is_set():
            self.on_change(None)  # rejected, and nothing accepted before: none in force

    async def _remove_entry(self, ref: ConfigRef) -> None:
        """Take our entry out of ``ref``'s status, if that object still exists."""
        current = (self.policies or {}).get(ref.name)
        if current is None or ConfigRef.of(current).uid != ref.uid:
            return
        await self._patch_status(ref.name, status_removal(self.node))

    async def _patch_status(self, name: str, patch: Obj) -> None:
        for attempt in range(1, STATUS_TRIES + 1):
            try:
                await self.io(self.client.patch_policy_status, self.namespace, name, patch)
                return
            except KubeError as exc:
                if exc.not_found or attempt == STATUS_TRIES:
                    log.error("failed to update status of %s/%s: %s", self.namespace, name, exc)
                    return
                log.warning(
                    "updating status of %s/%s failed, retrying: %s", self.namespace, name, exc
                )
            await asyncio.sleep(STATUS_RETRY)

    async def shutdown(self) -> None:
        """Clean stop: remove our entry from the object in force."""
        if self.delivered is not None:
            await self._remove_entry(self.delivered)

"""Kubernetes Pod YAML -> the NRI pods and containers a kubelet + containerd make.

What is emulated (kubelet with the cgroupfs driver, CFS quota on, no CPU
manager; containerd 1.7):

* pod uid: ``metadata.uid`` or a UUID derived from namespace/name; sandbox id:
  64 hex digits derived from the uid (containerd's are random);
* QoS class by the Kubernetes rules (requests default to limits), the pod
  cgroup parent ``/kubepods[/burstable|/besteffort]/pod<uid>``;
* per container: CPU shares ``max(2, milliCPU request * 1024 / 1000)``, CFS
  period 100000 (always, as the kubelet sends it) and quota
  ``limit milliCPU * 100000 / 1000`` (min 1000) only with a CPU limit, memory
  limit (and swap = limit, as containerd sets it) only with a memory limit,
  cpuset cpus/mems empty unless a runtime default is given;
* the labels and annotations the kubelet and containerd put on containers,
  env from ``env[].value`` (``valueFrom`` cannot be resolved and is skipped),
  args = ``command + args``.

Not emulated: init and ephemeral containers are *not* created (they do count
for the QoS class, as in Kubernetes), pod-level sandbox resources, the
kubelet's service environment variables and ``$(VAR)`` expansion.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nri_framework.kubelet_cpu import CFS_PERIOD, QOSClass, cpu_quota, cpu_shares
from nri_framework.model import Container, CpuResources, MemoryResources, Pod, Resources
from nri_framework.quantity import QuantityError, milli_value, value

log = logging.getLogger("nri_framework.simulate")

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
QOS_RESOURCES = ("cpu", "memory")


class PodSpecError(ValueError):
    """A document that cannot be turned into a pod."""


@dataclass(frozen=True)
class SimPod:
    """One pod as the runtime will see it; containers have no id yet."""

    pod: Pod
    containers: tuple[Container, ...]
    qos: QOSClass
    source: str = ""


@dataclass(frozen=True)
class RuntimeDefaults:
    """What the runtime puts in a container the kubelet did not pin."""

    cpus: str = ""
    mems: str = ""
    env: tuple[str, ...] = field(default=(DEFAULT_PATH,))


# --- loading ----------------------------------------------------------------------


def load_pod_dir(
    directory: str | os.PathLike[str], defaults: RuntimeDefaults | None = None
) -> list[SimPod]:
    """Every pod of every ``*.yaml``/``*.yml`` file in ``directory``, by file name."""
    files = sorted(p for p in Path(directory).iterdir() if p.suffix in (".yaml", ".yml"))
    pods: list[SimPod] = []
    for path in files:
        pods.extend(load_pod_file(path, defaults))
    return pods


def load_pod_file(
    path: str | os.PathLike[str], defaults: RuntimeDefaults | None = None
) -> list[SimPod]:
    path = Path(path)
    return pods_from_yaml(path.read_text(), defaults, source=path.name)


def pods_from_yaml(
    text: str, defaults: RuntimeDefaults | None = None, *, source: str = "<yaml>"
) -> list[SimPod]:
    """The ``kind: Pod`` documents of a (multi-document) YAML text, in order."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise PodSpecError(f"{source}: invalid YAML: {exc}") from None
    pods: list[SimPod] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise PodSpecError(f"{source}: document {i + 1} is not a mapping")
        if doc.get("kind") != "Pod":
            log.info("%s: skipping document %d of kind %r", source, i + 1, doc.get("kind"))
            continue
        pods.append(pod_from_manifest(doc, defaults, source=source))
    return pods


# --- one pod ----------------------------------------------------------------------


def pod_from_manifest(
    doc: Mapping[str, Any], defaults: RuntimeDefaults | None = None, *, source: str = "<yaml>"
) -> SimPod:
    defaults = defaults or RuntimeDefaults()
    meta = _mapping(doc.get("metadata"), f"{source}: metadata")
    spec = _mapping(doc.get("spec"), f"{source}: spec")
    name = meta.get("name")
    if not name or not isinstance(name, str):
        raise PodSpecError(f"{source}: metadata.name is required")
    where = f"{source}: pod {name}"
    containers = _container_specs(spec, "containers", where)
    if not containers:
        raise PodSpecError(f"{where}: spec.containers must not be empty")
    try:
        qos = qos_class(containers + _container_specs(spec, "initContainers", where))
        pod = _pod(meta, name, qos)
        ctrs = tuple(_container(c, pod, spec, defaults, where) for c in containers)
    except QuantityError as exc:
        raise PodSpecError(f"{where}: {exc}") from None
    return SimPod(pod=pod, containers=ctrs, qos=qos, source=source)


def _mapping(obj: object, what: str) -> Mapping[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise PodSpecError(f"{what} must be a mapping")
    return obj


def _container_specs(spec: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    items = spec.get(key) or []
    if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
        raise PodSpecError(f"{where}: spec.{key} must be a list of containers")
    for c in items:
        if not c.get("name"):
            raise PodSpecError(f"{where}: every entry of spec.{key} needs a name")
    return items


def pod_uid(namespace: str, name: str) -> str:
    """The uid of a pod without ``metadata.uid``: stable for the same namespace/name."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"k8s://pods/{namespace}/{name}"))


def sandbox_id(uid: str) -> str:
    return hashlib.sha256(f"sandbox:{uid}".encode()).hexdigest()


def cgroup_parent(qos: QOSClass, uid: str) -> str:
    """The pod cgroup the kubelet (cgroupfs driver) creates."""
    if qos is QOSClass.GUARANTEED:
        return f"/kubepods/pod{uid}"
    tier = "burstable" if qos is QOSClass.BURSTABLE else "besteffort"
    return f"/kubepods/{tier}/pod{uid}"


def _pod(meta: Mapping[str, Any], name: str, qos: QOSClass) -> Pod:
    namespace = str(meta.get("namespace") or "default")
    uid = str(meta.get("uid") or pod_uid(namespace, name))
    sid = sandbox_id(uid)
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    labels.update(
        {
            "io.kubernetes.pod.name": name,
            "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.uid": uid,
        }
    )
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    annotations.setdefault("kubernetes.io/config.source", "api")
    parent = cgroup_parent(qos, uid)
    return Pod(
        id=sid,
        name=name,
        uid=uid,
        namespace=namespace,
        labels=labels,
        annotations=annotations,
        cgroup_parent=parent,
        cgroups_path=f"{parent}/{sid}",
    )


# --- QoS --------------------------------------------------------------------------


def _requests_limits(c: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A container's requests (defaulted to its limits, as the API server does) and limits."""
    res = c.get("resources") or {}
    limits = dict(res.get("limits") or {})
    requests = dict(res.get("requests") or {})
    for k, v in limits.items():
        requests.setdefault(k, v)
    return requests, limits


def qos_class(containers: Iterable[Mapping[str, Any]]) -> QOSClass:
    """Kubernetes' ``GetPodQOS`` over regular and init containers."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in containers:
        req, lim = _requests_limits(c)
        for name in QOS_RESOURCES:
            if name in req and (q := milli_value(req[name])):
                requests[name] = requests.get(name, 0) + q
            if name in lim and (q := milli_value(lim[name])):
                limits[name] = limits.get(name, 0) + q
        if not all(name in lim and milli_value(lim[name]) for name in QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return QOSClass.BEST_EFFORT
    if guaranteed and requests == limits:
        return QOSClass.GUARANTEED
    return QOSClass.BURSTABLE


# --- one container ----------------------------------------------------------------


def container_resources(c: Mapping[str, Any], defaults: RuntimeDefaults) -> Resources:
    """The container's LinuxResources as containerd hands them to NRI."""
    requests, limits = _requests_limits(c)
    shares = cpu_shares(milli_value(requests["cpu"]) if "cpu" in requests else 0)
    quota = cpu_quota(milli_value(limits["cpu"])) if "cpu" in limits else 0
    cpu = CpuResources(
        shares=shares,
        quota=quota or None,
        period=CFS_PERIOD,
        cpus=defaults.cpus,
        mems=defaults.mems,
    )
    mem_limit = value(limits["memory"]) if "memory" in limits else 0
    memory = MemoryResources(limit=mem_limit, swap=mem_limit) if mem_limit else None
    return Resources(cpu=cpu, memory=memory)


def _env(c: Mapping[str, Any], pod: Pod, defaults: RuntimeDefaults, where: str) -> list[str]:
    env = [*defaults.env, f"HOSTNAME={pod.name}"]
    for item in c.get("env") or []:
        if "valueFrom" in item:
            log.info("%s: env %s uses valueFrom, which is not simulated", where, item.get("name"))
            continue
        env.append(f"{item['name']}={item.get('value', '')}")
    return env


def _container(
    c: Mapping[str, Any],
    pod: Pod,
    spec: Mapping[str, Any],
    defaults: RuntimeDefaults,
    where: str,
) -> Container:
    name = str(c["name"])
    labels = {
        "io.kubernetes.container.name": name,
        "io.kubernetes.pod.name": pod.name,
        "io.kubernetes.pod.namespace": pod.namespace,
        "io.kubernetes.pod.uid": pod.uid,
    }
    annotations = {
        "io.kubernetes.container.restartCount": "0",
        "io.kubernetes.container.terminationMessagePath": str(
            c.get("terminationMessagePath", "/dev/termination-log")
        ),
        "io.kubernetes.container.terminationMessagePolicy": str(
            c.get("terminationMessagePolicy", "File")
        ),
        "io.kubernetes.pod.terminationGracePeriod": str(
            spec.get("terminationGracePeriodSeconds", 30)
        ),
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": name,
        "io.kubernetes.cri.sandbox-id": pod.id,
        "io.kubernetes.cri.sandbox-name": pod.name,
        "io.kubernetes.cri.sandbox-namespace": pod.namespace,
        "io.kubernetes.cri.sandbox-uid": pod.uid,
        "io.kubernetes.cri.image-name": str(c.get("image", "")),
    }
    args = [str(a) for a in (c.get("command") or [])] + [str(a) for a in (c.get("args") or [])]
    return Container(
        id="",
        pod_sandbox_id=pod.id,
        name=name,
        labels=labels,
        annotations=annotations,
        args=args,
        env=_env(c, pod, defaults, f"{where} container {name}"),
        resources=container_resources(c, defaults),
    )

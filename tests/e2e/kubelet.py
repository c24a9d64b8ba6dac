"""A kubelet stand-in: a Pod spec becomes the CRI calls the kubelet would make.

**Ours, small, and only a stand-in**: the kubelet itself cannot run here (no
kube-apiserver for it to register with, no CNI). What the e2e tests start with it
is real: the chart's rendered DaemonSet pod template (or an example Pod), the
images imported into the env's containerd, containerd and runc; only the step
"pod spec -> RunPodSandbox / CreateContainer / StartContainer / StopContainer"
is done by this module instead of the kubelet, following what the kubelet does
(``pkg/kubelet/kuberuntime``) for the fields the chart and the spec's pods use:

* the sandbox: metadata, labels, annotations, cgroup parent by QoS class
  (cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>``), privileged
  when a container is. **Host network always**: there is no CNI here, so the
  pod shares the node's network namespace (the chart's pod does not ask for
  ``hostNetwork``; its ``:8891`` endpoint is reached on the node's loopback);
  no hostname is set (runc refuses one without a private UTS namespace);
* per container: image (must already be imported: there is no registry), the
  command, args, env (``value``; ``valueFrom.fieldRef`` of ``spec.nodeName``,
  ``metadata.name|namespace|uid``) plus the ``KUBERNETES_SERVICE_*`` variables the
  kubelet injects; the securityContext mapped to CRI (privileged, capabilities,
  readOnlyRootFilesystem -> readonly_rootfs, allowPrivilegeEscalation=false ->
  no_new_privs, seccompProfile, runAsUser/runAsGroup, the kubelet's default
  masked/readonly /proc paths for unprivileged containers); CPU/memory
  requests and limits as the kubelet computes shares, quota and limit;
* volumes, each onto a directory this module or the test owns: ``hostPath``
  through ``host_paths`` (the test maps every host path the pod names; an
  unmapped one is an error, never the machine's own), ``emptyDir`` as a fresh
  directory per pod (``sizeLimit``/``medium`` are not enforced), ``projected``
  with the service account token, ``kube-root-ca.crt``'s ``ca.crt`` and the
  downward-API namespace (what ``kube-api-access`` needs);
* stopping: every container at once with the pod's
  ``terminationGracePeriodSeconds`` (default 30, as the API server defaults it)
  as the StopContainer timeout, then the sandbox.

Any other field of the pod, a container, a volume or a securityContext raises
:class:`Unsupported`: a field this stand-in does not know is never ignored.
Probes are not run by it (``probe_url`` gives the URL a test can poll), nor
are containers restarted.
"""

# grpc stubs are untyped
# mypy: disable-error-code="no-any-return,no-untyped-call"
from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nri_framework.pb import cri_pb2 as pb

# what the kubelet sets for an unprivileged container with procMount Default
# (k8s.io/kubernetes pkg/securitycontext/util.go)
DEFAULT_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)
DEFAULT_GRACE_SECONDS = 30
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# the fields this stand-in translates; anything else is Unsupported
POD_FIELDS = {
    "containers",
    "volumes",
    "serviceAccountName",
    "automountServiceAccountToken",
    "terminationGracePeriodSeconds",
    "restartPolicy",
    "hostNetwork",
    # scheduling: decided before a pod reaches a kubelet (one node here)
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
}
META_FIELDS = {"name", "namespace", "labels", "annotations", "uid"}
CONTAINER_FIELDS = {
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "env",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "securityContext",
    "resources",
    "volumeMounts",
}
SECURITY_FIELDS = {
    "privileged",
    "allowPrivilegeEscalation",
    "readOnlyRootFilesystem",
    "capabilities",
    "seccompProfile",
    "runAsUser",
    "runAsGroup",
}
MOUNT_FIELDS = {"name", "mountPath", "readOnly"}
FIELD_PATHS = {"spec.nodeName", "metadata.name", "metadata.namespace", "metadata.uid"}


class Unsupported(ValueError):
    """A pod-spec field (or value) the stand-in does not translate."""


def _check(obj: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise Unsupported(f"{where}: unsupported field(s) {', '.join(unknown)} (kubelet stand-in)")


def cpu_millis(q: str | int | float) -> int:
    s = str(q)
    return int(s[:-1]) if s.endswith("m") else int(float(s) * 1000)


_SUFFIX = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 10**3, "M": 10**6, "G": 10**9}


def memory_bytes(q: str | int) -> int:
    s = str(q)
    for suffix, mult in _SUFFIX.items():
        if s.endswith(suffix):
            return int(float(s[: -len(suffix)]) * mult)
    return int(s)


def qos_class(spec: Mapping[str, Any]) -> str:
    """The pod's QoS class (requests == limits for cpu and memory everywhere: Guaranteed)."""
    guaranteed, any_set = True, False
    for c in spec["containers"]:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        any_set = any_set or bool(req or lim)
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and str(req[r]) != str(lim[r])):
                guaranteed = False
    if guaranteed and any_set:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


def container_resources(c: Mapping[str, Any]) -> pb.LinuxContainerResources:
    """The kubelet's CPU shares (requests), quota (limits) and memory limit."""
    res = c.get("resources") or {}
    _check(res, {"requests", "limits"}, f"container {c['name']} resources")
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    for part, name in ((req, "requests"), (lim, "limits")):
        _check(part, {"cpu", "memory"}, f"container {c['name']} resources.{name}")
    cpu_req = req.get("cpu", lim.get("cpu"))
    shares = max(2, cpu_millis(cpu_req) * 1024 // 1000) if cpu_req is not None else 2
    out = pb.LinuxContainerResources(cpu_shares=shares)
    if "cpu" in lim:
        out.cpu_period = 100000
        out.cpu_quota = cpu_millis(lim["cpu"]) * 100000 // 1000
    if "memory" in lim:
        out.memory_limit_in_bytes = memory_bytes(lim["memory"])
    return out


def security_context(
    c: Mapping[str, Any], ns: pb.NamespaceOption
) -> pb.LinuxContainerSecurityContext:
    sc = c.get("securityContext") or {}
    where = f"container {c['name']} securityContext"
    _check(sc, SECURITY_FIELDS, where)
    privileged = bool(sc.get("privileged", False))
    out = pb.LinuxContainerSecurityContext(
        privileged=privileged,
        namespace_options=ns,
        readonly_rootfs=bool(sc.get("readOnlyRootFilesystem", False)),
        # the kubelet: no_new_privs only when allowPrivilegeEscalation is false
        no_new_privs=sc.get("allowPrivilegeEscalation") is False,
    )
    caps = sc.get("capabilities") or {}
    _check(caps, {"add", "drop"}, f"{where}.capabilities")
    out.capabilities.CopyFrom(
        pb.Capability(
            add_capabilities=list(caps.get("add") or []),
            drop_capabilities=list(caps.get("drop") or []),
        )
    )
    profile = sc.get("seccompProfile") or {"type": "Unconfined"}
    _check(profile, {"type"}, f"{where}.seccompProfile")
    if profile["type"] not in ("RuntimeDefault", "Unconfined"):
        raise Unsupported(f"{where}.seccompProfile.type {profile['type']!r}")
    out.seccomp.CopyFrom(
        pb.SecurityProfile(profile_type=pb.SecurityProfile.ProfileType.Value(profile["type"]))
    )
    if "runAsUser" in sc:
        out.run_as_user.value = int(sc["runAsUser"])
    if "runAsGroup" in sc:
        out.run_as_group.value = int(sc["runAsGroup"])
    if not privileged:
        out.masked_paths.extend(DEFAULT_MASKED_PATHS)
        out.readonly_paths.extend(DEFAULT_READONLY_PATHS)
    return out


@dataclass
class ServiceAccount:
    """What the kubelet would get from the API server for ``kube-api-access``."""

    token: str
    ca_crt: bytes
    host: str
    port: int


@dataclass
class PodObject:
    """A pod to start: metadata and spec as in the API (a DaemonSet's template gets a name)."""

    name: str
    namespace: str
    spec: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any], namespace: str = "default") -> PodObject:
        """A ``kind: Pod`` manifest, or a DaemonSet whose template becomes pod ``<ds>-<id>``."""
        if doc.get("kind") == "DaemonSet":
            meta, tmpl = doc["metadata"], doc["spec"]["template"]
            tmeta = tmpl.get("metadata") or {}
            _check(tmeta, {"labels", "annotations"}, "DaemonSet template.metadata")
            return cls(
                name=f"{meta['name']}-{uuid.uuid4().hex[:5]}",
                namespace=meta.get("namespace", namespace),
                spec=tmpl["spec"],
                labels=dict(tmeta.get("labels") or {}),
                annotations={k: str(v) for k, v in (tmeta.get("annotations") or {}).items()},
            )
        if doc.get("kind") != "Pod":
            raise Unsupported(f"kind {doc.get('kind')!r}: a Pod or a DaemonSet")
        _check(doc, {"apiVersion", "kind", "metadata", "spec"}, "Pod")
        meta = doc["metadata"]
        _check(meta, META_FIELDS, "Pod metadata")
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", namespace),
            spec=doc["spec"],
            labels=dict(meta.get("labels") or {}),
            annotations={k: str(v) for k, v in (meta.get("annotations") or {}).items()},
            uid=meta.get("uid") or str(uuid.uuid4()),
        )


@dataclass
class RunningPod:
    pod: PodObject
    sandbox_id: str
    sandbox_config: pb.PodSandboxConfig
    containers: dict[str, str]  # container name -> CRI id
    configs: dict[str, pb.ContainerConfig]

    @property
    def grace_seconds(self) -> int:
        return int(self.pod.spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))


class Kubelet:
    """Starts and stops pods through a ``cri_client.CRIClient``'s stubs (see module doc).

    ``host_paths`` maps every hostPath path a pod may name onto a test-owned
    directory; ``work`` holds the emptyDir and projected volumes.
    """

    def __init__(
        self,
        cri: Any,
        *,
        node_name: str,
        work: Path,
        host_paths: Mapping[str, Path],
        service_account: ServiceAccount | None = None,
        log_root: Path,
    ) -> None:
        self.cri = cri
        self.node_name = node_name
        self.work = work
        self.host_paths = {k.rstrip("/") or "/": Path(v) for k, v in host_paths.items()}
        self.service_account = service_account
        self.log_root = log_root

    # ---- translation (no runtime calls)
    def sandbox_config(self, pod: PodObject) -> pb.PodSandboxConfig:
        _check(pod.spec, POD_FIELDS, f"pod {pod.name} spec")
        if pod.spec.get("restartPolicy", "Always") not in ("Always", "Never", "OnFailure"):
            raise Unsupported(f"pod {pod.name}: restartPolicy {pod.spec['restartPolicy']!r}")
        qos = qos_class(pod.spec)
        parent = {"Guaranteed": "", "Burstable": "/burstable", "BestEffort": "/besteffort"}[qos]
        log_dir = self.log_root / f"{pod.namespace}_{pod.name}_{pod.uid}"
        log_dir.mkdir(parents=True, exist_ok=True)
        privileged = any(
            (c.get("securityContext") or {}).get("privileged") for c in pod.spec["containers"]
        )
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace),
            log_directory=str(log_dir),
            labels={
                **pod.labels,
                "io.kubernetes.pod.name": pod.name,
                "io.kubernetes.pod.namespace": pod.namespace,
                "io.kubernetes.pod.uid": pod.uid,
            },
            annotations=dict(pod.annotations),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=f"/kubepods{parent}/pod{pod.uid}",
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=_namespaces(), privileged=privileged
                ),
            ),
        )

    def volumes(self, pod: PodObject) -> dict[str, Path]:
        """Every volume of ``pod`` as a host directory (created/filled as the kubelet would)."""
        out: dict[str, Path] = {}
        for v in pod.spec.get("volumes") or []:
            name = v["name"]
            kinds = sorted(set(v) - {"name"})
            if len(kinds) != 1 or kinds[0] not in ("hostPath", "emptyDir", "projected"):
                raise Unsupported(f"pod {pod.name} volume {name}: {kinds} (kubelet stand-in)")
            src = v[kinds[0]] or {}
            if kinds[0] == "hostPath":
                _check(src, {"path", "type"}, f"volume {name} hostPath")
                out[name] = self._host_path(name, src["path"], src.get("type", ""))
            elif kinds[0] == "emptyDir":
                _check(src, {"medium", "sizeLimit"}, f"volume {name} emptyDir")
                out[name] = self.volume_dir(pod, name)
                out[name].mkdir(parents=True, exist_ok=True)
            else:
                out[name] = self._projected(pod, self.volume_dir(pod, name), name, src)
        return out

    def volume_dir(self, pod: PodObject, name: str) -> Path:
        """Where the emptyDir or projected volume ``name`` of ``pod`` lives on the host
        (short: a unix socket path in it must stay under 108 bytes)."""
        return self.work / pod.uid[:8] / name

    def _host_path(self, name: str, path: str, kind: str) -> Path:
        key = path.rstrip("/") or "/"
        if key not in self.host_paths:
            raise Unsupported(f"volume {name}: hostPath {path} is not mapped onto a test directory")
        target = self.host_paths[key]
        if kind == "DirectoryOrCreate":
            target.mkdir(parents=True, exist_ok=True)
        elif kind == "Directory":
            if not target.is_dir():
                raise FileNotFoundError(
                    f"volume {name}: hostPath {path} ({target}) is no directory"
                )
        elif kind == "File":
            if not target.is_file():
                raise FileNotFoundError(f"volume {name}: hostPath {path} ({target}) is no file")
        elif kind:
            raise Unsupported(f"volume {name}: hostPath type {kind!r}")
        return target

    def _projected(self, pod: PodObject, d: Path, name: str, src: Mapping[str, Any]) -> Path:
        _check(src, {"sources", "defaultMode"}, f"volume {name} projected")
        sa = self.service_account
        if sa is None:
            raise Unsupported(f"volume {name}: projected volume without a service account")
        mode = int(src.get("defaultMode", 0o644))
        d.mkdir(parents=True, exist_ok=True)
        for source in src["sources"]:
            ((kind, item),) = source.items()
            if kind == "serviceAccountToken":
                _check(item, {"path", "expirationSeconds", "audience"}, f"volume {name} token")
                files = {item["path"]: sa.token.encode()}
            elif kind == "configMap" and item.get("name") == "kube-root-ca.crt":
                _check(item, {"name", "items"}, f"volume {name} configMap")
                files = {i["path"]: sa.ca_crt for i in item["items"] if i["key"] == "ca.crt"}
            elif kind == "downwardAPI":
                _check(item, {"items"}, f"volume {name} downwardAPI")
                files = {i["path"]: self._field(pod, i["fieldRef"]).encode() for i in item["items"]}
            else:
                raise Unsupported(f"volume {name}: projected source {kind} {item}")
            for rel, data in files.items():
                p = d / rel
                p.write_bytes(data)
                os.chmod(p, mode)
        return d

    def _field(self, pod: PodObject, ref: Mapping[str, Any]) -> str:
        _check(ref, {"fieldPath", "apiVersion"}, "fieldRef")
        path = ref["fieldPath"]
        if path not in FIELD_PATHS:
            raise Unsupported(f"fieldRef {path}")
        return {
            "spec.nodeName": self.node_name,
            "metadata.name": pod.name,
            "metadata.namespace": pod.namespace,
            "metadata.uid": pod.uid,
        }[path]

    def environment(self, pod: PodObject, c: Mapping[str, Any]) -> list[pb.KeyValue]:
        env: dict[str, str] = {}
        for e in c.get("env") or []:
            _check(e, {"name", "value", "valueFrom"}, f"container {c['name']} env")
            if "valueFrom" in e:
                vf = e["valueFrom"]
                _check(vf, {"fieldRef"}, f"container {c['name']} env {e['name']} valueFrom")
                env[e["name"]] = self._field(pod, vf["fieldRef"])
            else:
                env[e["name"]] = str(e.get("value", ""))
        sa = self.service_account
        if sa is not None:  # what the kubelet injects for the `kubernetes` service
            env.setdefault("KUBERNETES_SERVICE_HOST", sa.host)
            env.setdefault("KUBERNETES_SERVICE_PORT", str(sa.port))
            env.setdefault("KUBERNETES_SERVICE_PORT_HTTPS", str(sa.port))
            env.setdefault("KUBERNETES_PORT", f"tcp://{sa.host}:{sa.port}")
        return [pb.KeyValue(key=k, value=v.encode()) for k, v in env.items()]

    def container_config(
        self, pod: PodObject, c: Mapping[str, Any], volumes: Mapping[str, Path]
    ) -> pb.ContainerConfig:
        _check(c, CONTAINER_FIELDS, f"container {c.get('name')}")
        if c.get("imagePullPolicy", "IfNotPresent") not in ("IfNotPresent", "Never"):
            raise Unsupported(f"container {c['name']}: imagePullPolicy Always (no registry here)")
        mounts = []
        for m in c.get("volumeMounts") or []:
            _check(m, MOUNT_FIELDS, f"container {c['name']} volumeMount")
            if m["name"] not in volumes:
                raise Unsupported(f"container {c['name']}: volumeMount of unknown volume {m}")
            mounts.append(
                pb.Mount(
                    container_path=m["mountPath"],
                    host_path=str(volumes[m["name"]]),
                    readonly=bool(m.get("readOnly", False)),
                    propagation=pb.PROPAGATION_PRIVATE,
                )
            )
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=c["name"]),
            image=pb.ImageSpec(image=c["image"]),
            command=[str(x) for x in c.get("command") or []],
            args=[str(x) for x in c.get("args") or []],
            envs=self.environment(pod, c),
            mounts=mounts,
            labels={"io.kubernetes.container.name": c["name"]},
            log_path=f"{c['name']}_0.log",
            linux=pb.LinuxContainerConfig(
                resources=container_resources(c),
                security_context=security_context(c, _namespaces()),
            ),
        )

    # ---- the runtime calls
    def run_pod(self, pod: PodObject, *, start: bool = True) -> RunningPod:
        """RunPodSandbox, then CreateContainer (+ StartContainer) for each container in order."""
        rt, t = self.cri.runtime, self.cri.timeout
        sandbox = self.sandbox_config(pod)
        volumes = self.volumes(pod)
        configs = {
            c["name"]: self.container_config(pod, c, volumes) for c in pod.spec["containers"]
        }
        for cfg in configs.values():
            if self.cri.image_status(cfg.image.image) is None:
                raise FileNotFoundError(f"image {cfg.image.image} is not imported (no registry)")
        sid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox), timeout=t).pod_sandbox_id
        running = RunningPod(pod, sid, sandbox, {}, configs)
        for name, cfg in configs.items():
            req = pb.CreateContainerRequest(pod_sandbox_id=sid, config=cfg, sandbox_config=sandbox)
            running.containers[name] = rt.CreateContainer(req, timeout=t).container_id
            if start:
                self.cri.start_container(running.containers[name])
        return running

    def stop_pod(self, running: RunningPod, grace: int | None = None) -> None:
        """Every container at once with the grace period (SIGTERM, SIGKILL after it), then
        the sandbox; the pod is removed."""
        grace = running.grace_seconds if grace is None else grace
        errors: list[BaseException] = []

        def stop(cid: str) -> None:
            try:
                self.cri.stop_container(cid, timeout=grace)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=stop, args=(c,)) for c in running.containers.values()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.cri.stop_pod(running.sandbox_id)
        self.cri.remove_pod(running.sandbox_id)
        if errors:
            raise errors[0]


def _namespaces() -> pb.NamespaceOption:
    # host network (no CNI here), private pid, pod ipc: see the module doc
    return pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD)


def probe_url(c: Mapping[str, Any], kind: str = "readinessProbe") -> str | None:
    """``http://127.0.0.1:PORT/PATH`` of the container's httpGet probe (host network)."""
    probe = c.get(kind)
    if not probe:
        return None
    get = probe["httpGet"]
    port = get["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in c.get("ports") or [] if p.get("name") == port)
    return f"http://127.0.0.1:{port}{get.get('path', '/')}"

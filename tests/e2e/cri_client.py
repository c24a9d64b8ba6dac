"""A small CRI (runtime.v1) client over grpcio, driving containerd the way the kubelet does.

Only what the e2e tests need.  Pods always use the host network (no CNI here) and
never set a hostname (runc refuses a hostname without a private UTS namespace).

    cri = CRIClient(env.cri_socket, log_root=env.pod_log_dir)
    pod = cri.run_pod("p1", cgroup_parent="/kubepods/pod-uid")     # -> Pod(id, config)
    cid = cri.create_container(pod.id, pod.config, "c1", command=["sh", "-c", "..."],
                               cpu_shares=512, cpuset_cpus="0-1")
    cri.start_container(cid)
    line = cri.wait_for_output(cid, "Cpus_allowed_list")
    cri.cleanup()                       # stop + remove every pod of this daemon
"""

# grpc stubs are untyped: their results are Any
# mypy: disable-error-code="no-any-return,no-untyped-call"
from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from nri_framework.pb import cri_pb2 as pb
from nri_framework.pb import cri_pb2_grpc as pb_grpc

BUSYBOX_IMAGE = "docker.io/library/busybox:local"

_LOG_LINE = re.compile(r"^(\S+) (stdout|stderr) ([PF]) ?(.*)$")


@dataclass
class Pod:
    id: str
    config: pb.PodSandboxConfig

    @property
    def log_directory(self) -> Path:
        return Path(self.config.log_directory)


@dataclass
class LogLine:
    timestamp: str
    stream: str
    text: str


def parse_cri_log(text: str) -> list[LogLine]:
    """Parse the CRI log format ``<ts> <stream> <P|F> <text>``; partial (P) lines are joined."""
    out: list[LogLine] = []
    partial: dict[str, list[str]] = {}
    for raw in text.splitlines():
        m = _LOG_LINE.match(raw)
        if not m:
            continue
        ts, stream, tag, body = m.groups()
        partial.setdefault(stream, []).append(body)
        if tag == "F":
            out.append(LogLine(ts, stream, "".join(partial.pop(stream))))
    return out


def read_cri_log(path: str | Path, stream: str | None = None) -> list[str]:
    """The output lines in a CRI container log file (``[]`` while it does not exist)."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [ln.text for ln in parse_cri_log(text) if stream is None or ln.stream == stream]


def _ns_options(
    pid: pb.NamespaceMode = pb.CONTAINER, ipc: pb.NamespaceMode = pb.POD
) -> pb.NamespaceOption:
    return pb.NamespaceOption(network=pb.NODE, pid=pid, ipc=ipc)


def resources(
    *,
    cpu_shares: int = 0,
    cpu_quota: int = 0,
    cpu_period: int = 0,
    cpuset_cpus: str = "",
    cpuset_mems: str = "",
    memory_limit: int = 0,
    memory_swap_limit: int = 0,
    oom_score_adj: int = 0,
    unified: Mapping[str, str] | None = None,
) -> pb.LinuxContainerResources:
    return pb.LinuxContainerResources(
        cpu_shares=cpu_shares,
        cpu_quota=cpu_quota,
        cpu_period=cpu_period,
        cpuset_cpus=cpuset_cpus,
        cpuset_mems=cpuset_mems,
        memory_limit_in_bytes=memory_limit,
        memory_swap_limit_in_bytes=memory_swap_limit,
        oom_score_adj=oom_score_adj,
        unified=dict(unified or {}),
    )


class CRIClient:
    """Blocking CRI client.  Every call takes ``timeout`` seconds at most."""

    def __init__(
        self, socket_path: str | Path, *, log_root: str | Path | None = None, timeout: float = 30.0
    ) -> None:
        self.socket_path = str(socket_path)
        self.timeout = timeout
        self.log_root = Path(log_root) if log_root else Path("/tmp/nri-e2e-pod-logs")
        # listings carry every container's annotations: allow more than gRPC's 4 MiB
        self.channel = grpc.insecure_channel(
            f"unix://{self.socket_path}", options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self.runtime = pb_grpc.RuntimeServiceStub(self.channel)
        self.images = pb_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> CRIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- runtime info
    def version(self) -> pb.VersionResponse:
        return self.runtime.Version(pb.VersionRequest(version="v1"), timeout=self.timeout)

    def status(self) -> pb.StatusResponse:
        return self.runtime.Status(pb.StatusRequest(), timeout=self.timeout)

    def list_images(self) -> list[pb.Image]:
        return list(self.images.ListImages(pb.ListImagesRequest(), timeout=self.timeout).images)

    def image_status(self, image: str) -> pb.Image | None:
        r = self.images.ImageStatus(
            pb.ImageStatusRequest(image=pb.ImageSpec(image=image)), timeout=self.timeout
        )
        return r.image if r.HasField("image") else None

    # ---- pods
    def pod_config(
        self,
        name: str,
        namespace: str = "default",
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        cgroup_parent: str | None = None,
        *,
        attempt: int = 0,
        log_directory: str | Path | None = None,
        overhead: pb.LinuxContainerResources | None = None,
        pod_resources: pb.LinuxContainerResources | None = None,
    ) -> pb.PodSandboxConfig:
        """A host-network PodSandboxConfig without hostname.

        ``cgroup_parent`` defaults to ``/kubepods/pod<uid>`` (kubelet, cgroupfs driver);
        pass ``""`` for none (containerd then uses ``/k8s.io/<id>``).
        """
        uid = uid or str(uuid.uuid4())
        if cgroup_parent is None:
            cgroup_parent = f"/kubepods/pod{uid}"
        if log_directory is None:
            log_directory = self.log_root / f"{namespace}_{name}_{uid}"
        Path(log_directory).mkdir(parents=True, exist_ok=True)
        linux = pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=_ns_options()),
        )
        if overhead is not None:
            linux.overhead.CopyFrom(overhead)
        if pod_resources is not None:
            linux.resources.CopyFrom(pod_resources)
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(
                name=name, uid=uid, namespace=namespace, attempt=attempt
            ),
            log_directory=str(log_directory),
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            linux=linux,
        )

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        cgroup_parent: str | None = None,
        **kw: Any,
    ) -> Pod:
        """RunPodSandbox; returns ``Pod(id, config)``.  ``kw`` goes to ``pod_config``."""
        config = self.pod_config(name, namespace, uid, annotations, labels, cgroup_parent, **kw)
        r = self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=self.timeout)
        return Pod(r.pod_sandbox_id, config)

    def stop_pod(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(
            pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout
        )

    def remove_pod(self, pod_id: str) -> None:
        self.runtime.RemovePodSandbox(
            pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout
        )

    def pod_status(self, pod_id: str, verbose: bool = False) -> pb.PodSandboxStatusResponse:
        return self.runtime.PodSandboxStatus(
            pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=verbose), timeout=self.timeout
        )

    def list_pods(self) -> list[pb.PodSandbox]:
        return list(
            self.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=self.timeout).items
        )

    # ---- containers
    def container_config(
        self,
        name: str,
        image: str = BUSYBOX_IMAGE,
        command: Iterable[str] | None = None,
        *,
        args: Iterable[str] | None = None,
        cpu_shares: int = 0,
        cpu_quota: int = 0,
        cpu_period: int = 0,
        cpuset_cpus: str = "",
        cpuset_mems: str = "",
        memory_limit: int = 0,
        memory_swap_limit: int = 0,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        log_path: str | None = None,
        envs: Mapping[str, str] | None = None,
        attempt: int = 0,
    ) -> pb.ContainerConfig:
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image),
            command=list(command or []),
            args=list(args or []),
            envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in (envs or {}).items()],
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            log_path=log_path if log_path is not None else f"{name}_{attempt}.log",
            linux=pb.LinuxContainerConfig(
                resources=resources(
                    cpu_shares=cpu_shares,
                    cpu_quota=cpu_quota,
                    cpu_period=cpu_period,
                    cpuset_cpus=cpuset_cpus,
                    cpuset_mems=cpuset_mems,
                    memory_limit=memory_limit,
                    memory_swap_limit=memory_swap_limit,
                ),
                security_context=pb.LinuxContainerSecurityContext(namespace_options=_ns_options()),
            ),
        )

    def create_container(
        self,
        pod_id: str,
        pod_config: pb.PodSandboxConfig,
        name: str,
        image: str = BUSYBOX_IMAGE,
        command: Iterable[str] | None = None,
        cpu_shares: int = 0,
        cpu_quota: int = 0,
        cpu_period: int = 0,
        cpuset_cpus: str = "",
        memory_limit: int = 0,
        annotations: Mapping[str, str] | None = None,
        log_path: str | None = None,
        **kw: Any,
    ) -> str:
        """CreateContainer; returns the container id.

        ``log_path`` is relative to the pod's ``log_directory`` (default ``<name>_0.log``).
        ``kw``: args, cpuset_mems, memory_swap_limit, labels, envs, attempt.
        """
        config = self.container_config(
            name,
            image,
            command,
            cpu_shares=cpu_shares,
            cpu_quota=cpu_quota,
            cpu_period=cpu_period,
            cpuset_cpus=cpuset_cpus,
            memory_limit=memory_limit,
            annotations=annotations,
            log_path=log_path,
            **kw,
        )
        r = self.runtime.CreateContainer(
            pb.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config
            ),
            timeout=self.timeout,
        )
        return r.container_id

    def start_container(self, container_id: str) -> None:
        self.runtime.StartContainer(
            pb.StartContainerRequest(container_id=container_id), timeout=self.timeout
        )

    def stop_container(self, container_id: str, timeout: int = 2) -> None:
        """StopContainer: SIGTERM, then SIGKILL after ``timeout`` s (a shell as PID 1
        ignores SIGTERM unless it traps it)."""
        self.runtime.StopContainer(
            pb.StopContainerRequest(container_id=container_id, timeout=timeout),
            timeout=self.timeout + timeout,
        )

    def remove_container(self, container_id: str) -> None:
        self.runtime.RemoveContainer(
            pb.RemoveContainerRequest(container_id=container_id), timeout=self.timeout
        )

    def update_container_resources(
        self,
        container_id: str,
        linux: pb.LinuxContainerResources | None = None,
        *,
        annotations: Mapping[str, str] | None = None,
        **res: Any,
    ) -> None:
        """UpdateContainerResources with ``linux`` or keyword resources (see ``resources()``)."""
        if linux is None:
            linux = resources(**res)
        self.runtime.UpdateContainerResources(
            pb.UpdateContainerResourcesRequest(
                container_id=container_id, linux=linux, annotations=dict(annotations or {})
            ),
            timeout=self.timeout,
        )

    def container_status(self, container_id: str, verbose: bool = False) -> pb.ContainerStatus:
        return self.runtime.ContainerStatus(
            pb.ContainerStatusRequest(container_id=container_id, verbose=verbose),
            timeout=self.timeout,
        ).status

    def list_containers(self, pod_id: str = "") -> list[pb.Container]:
        flt = pb.ContainerFilter(pod_sandbox_id=pod_id)
        return list(
            self.runtime.ListContainers(
                pb.ListContainersRequest(filter=flt), timeout=self.timeout
            ).containers
        )

    def exec_sync(
        self, container_id: str, cmd: Iterable[str], timeout: int = 10
    ) -> pb.ExecSyncResponse:
        return self.runtime.ExecSync(
            pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout),
            timeout=self.timeout + timeout,
        )

    # ---- output
    def container_log_path(self, container_id: str) -> Path:
        return Path(self.container_status(container_id).log_path)

    def container_output(self, container_id: str, stream: str | None = None) -> list[str]:
        """The container's output lines so far, from its CRI log file."""
        return read_cri_log(self.container_log_path(container_id), stream)

    def wait_for_output(
        self, container_id: str, match: str | Callable[[str], bool], timeout: float = 20.0
    ) -> str:
        """Wait for an output line containing ``match`` (or for which ``match(line)``)."""
        pred = match if callable(match) else (lambda line: match in line)
        path = self.container_log_path(container_id)
        deadline = time.monotonic() + timeout
        while True:
            for line in read_cri_log(path):
                if pred(line):
                    return line
            if time.monotonic() > deadline:
                st = self.container_status(container_id)
                raise TimeoutError(
                    f"no output line matching {match!r} from {container_id[:12]} in {timeout}s;"
                    f" state={pb.ContainerState.Name(st.state)} exit={st.exit_code}"
                    f" reason={st.reason!r}; output so far: {read_cri_log(path)!r}"
                )
            time.sleep(0.1)

    # ---- teardown
    def cleanup(self, stop_timeout: int = 0) -> None:
        """Stop and remove every container and pod of this daemon (not only ours)."""
        for c in self.list_containers():
            try:
                self.stop_container(c.id, timeout=stop_timeout)
                self.remove_container(c.id)
            except grpc.RpcError:
                pass
        for p in self.list_pods():
            try:
                self.stop_pod(p.id)
                self.remove_pod(p.id)
            except grpc.RpcError:
                pass

"""The typed domain model between the NRI stub and the policies.

Policies never see protobuf: :mod:`nri_framework.convert` turns NRI messages
into these msgspec Structs at the edge and adjustments back into protobuf.
Only what a resource policy needs is modelled; the rest of a container
(mounts, hooks, devices, ...) stays in the runtime.

The Structs are frozen: a policy cannot change the pod or container it was
given (the host's cache holds the same values); a changed value is a new one
(``msgspec.structs.replace``).
"""

from __future__ import annotations

import enum

import msgspec


class ContainerState(enum.IntEnum):
    UNKNOWN = 0
    CREATED = 1
    PAUSED = 2
    RUNNING = 3
    STOPPED = 4


class Event(enum.IntEnum):
    """NRI lifecycle events; event ``e`` is subscription bit ``1 << (e - 1)``."""

    RUN_POD_SANDBOX = 1
    STOP_POD_SANDBOX = 2
    REMOVE_POD_SANDBOX = 3
    CREATE_CONTAINER = 4
    POST_CREATE_CONTAINER = 5
    START_CONTAINER = 6
    POST_START_CONTAINER = 7
    UPDATE_CONTAINER = 8
    POST_UPDATE_CONTAINER = 9
    STOP_CONTAINER = 10
    REMOVE_CONTAINER = 11
    UPDATE_POD_SANDBOX = 12
    POST_UPDATE_POD_SANDBOX = 13
    VALIDATE_CONTAINER_ADJUSTMENT = 14

    @property
    def bit(self) -> int:
        return 1 << (self.value - 1)

    @property
    def of_container(self) -> bool:
        """A container's event: its request must carry the container."""
        return Event.CREATE_CONTAINER <= self <= Event.REMOVE_CONTAINER


class CpuResources(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """``LinuxCPU``: CFS shares/quota/period, RT budget, cpuset cpus and mems.

    ``None`` means "not set"; the cpuset strings use the Linux list format and
    ``""`` means "not set".
    """

    shares: int | None = None
    quota: int | None = None
    period: int | None = None
    realtime_runtime: int | None = None
    realtime_period: int | None = None
    cpus: str = ""
    mems: str = ""


class MemoryResources(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    limit: int | None = None
    reservation: int | None = None
    swap: int | None = None
    kernel: int | None = None
    kernel_tcp: int | None = None
    swappiness: int | None = None
    disable_oom_killer: bool | None = None
    use_hierarchy: bool | None = None


class Resources(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """``LinuxResources``, the part a resource policy reads or adjusts."""

    cpu: CpuResources | None = None
    memory: MemoryResources | None = None
    blockio_class: str | None = None
    rdt_class: str | None = None
    unified: dict[str, str] = {}
    pids_limit: int | None = None


class Pod(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    id: str
    name: str = ""
    uid: str = ""
    namespace: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    runtime_handler: str = ""
    cgroup_parent: str = ""
    cgroups_path: str = ""
    pod_overhead: Resources | None = None
    pod_resources: Resources | None = None
    resources: Resources | None = None
    pid: int = 0
    ips: list[str] = []


class Container(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    id: str
    pod_sandbox_id: str = ""
    name: str = ""
    state: ContainerState = ContainerState.UNKNOWN
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    args: list[str] = []
    env: list[str] = []
    resources: Resources | None = None
    cgroups_path: str = ""
    pid: int = 0

    @property
    def cpus(self) -> str:
        """The container's cpuset (``""`` when unset)."""
        return self.resources.cpu.cpus if self.resources and self.resources.cpu else ""


class Scheduler(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """``LinuxScheduler`` (NRI v0.11+): names as the kernel's (``SCHED_FIFO``,
    ``SCHED_FLAG_RESET_ON_FORK``); times in microseconds."""

    policy: str = ""
    nice: int = 0
    priority: int = 0
    flags: list[str] = []
    runtime: int = 0
    deadline: int = 0
    period: int = 0


class IOPriority(msgspec.Struct, kw_only=True, frozen=True):
    """``LinuxIOPriority`` (NRI v0.10+): ``IOPRIO_CLASS_BE`` etc. and a level."""

    io_class: str
    priority: int = 0


class Adjustment(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """What a policy changes in a container being created.

    ``annotations``/``env`` entries are added (env as ``KEY=VALUE``);
    ``resources`` fields that are set override the runtime's values;
    ``scheduler``/``io_priority`` need a runtime with NRI v0.11/v0.10 (older
    runtimes ignore them).
    """

    annotations: dict[str, str] = {}
    env: dict[str, str] = {}
    resources: Resources | None = None
    scheduler: Scheduler | None = None
    io_priority: IOPriority | None = None


class Update(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """A change to the resources of an existing container."""

    container_id: str
    resources: Resources
    ignore_failure: bool = False


class Eviction(msgspec.Struct, kw_only=True, frozen=True):
    container_id: str
    reason: str


class CreateResult(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """A policy's answer to CreateContainer."""

    adjustment: Adjustment | None = None
    updates: list[Update] = []
    evictions: list[Eviction] = []


#: NRI's defaults (``api/timeouts.go``): what a runtime that does not send its
#: timeouts (NRI < 0.7: containerd 1.7.24) uses unless configured otherwise
DEFAULT_REGISTRATION_TIMEOUT_MS = 5000
DEFAULT_REQUEST_TIMEOUT_MS = 2000
#: what we take at most from a runtime's word (a hostile or absurd value cannot
#: make us wait for hours)
MAX_TIMEOUT_MS = 600_000


class RuntimeInfo(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """Who we are talking to, from ``ConfigureRequest``.

    ``*_timeout_ms``: what the runtime sent (NRI 0.7+), 0 when it sent nothing;
    :attr:`request_timeout` / :attr:`registration_timeout` are what to go by."""

    name: str = ""
    version: str = ""
    nri_version: str = ""
    registration_timeout_ms: int = 0
    request_timeout_ms: int = 0

    @property
    def sent_timeouts(self) -> bool:
        return self.request_timeout_ms > 0

    @property
    def request_timeout(self) -> float:
        """Seconds the runtime waits for one answer of ours (Configure and the whole
        of a Synchronize included) before it drops us: its own word, else NRI's default."""
        ms = self.request_timeout_ms
        return min(ms if ms > 0 else DEFAULT_REQUEST_TIMEOUT_MS, MAX_TIMEOUT_MS) / 1000

    @property
    def registration_timeout(self) -> float:
        """Seconds the runtime waits for our RegisterPlugin (its word, else the default)."""
        ms = self.registration_timeout_ms
        return min(ms if ms > 0 else DEFAULT_REGISTRATION_TIMEOUT_MS, MAX_TIMEOUT_MS) / 1000


def cpu_pin(cpus: str, mems: str = "") -> Resources:
    """Resources that pin to ``cpus`` (and ``mems`` when given)."""
    return Resources(cpu=CpuResources(cpus=cpus, mems=mems))

"""The plugin's start-up: is this a pod the plugin can work in?

The chart's pod gives the plugin the paths it needs
(``templates/daemonset.yaml``): the runtime's NRI socket (hostPath volume
``nrisockets``, the node's ``/var/run/nri``), the node's sysfs (hostPath
volume ``hostsysfs`` at ``/host/sys``, ``--host-root /host``), its state
directory (hostPath volume ``resource-policydata``, ``--state-dir``) and what
the policy's peers need (for balloons, the SST helper's socket directory).
When one is missing or unusable the plugin logs **one line** naming the path
and what in the chart provides it (an :class:`Obstacle`), keeps ``/healthz``
failing with that line as the reason, and tries again with bounded backoff,
the line repeated rarely (:mod:`nri_sst.retry`); it starts by itself once the
path is there. No exit, so no crash loop and no traceback burying the line.

* sysfs and the state directory block the start (:class:`Startup`): without
  the topology there is no policy, without a writable state directory no
  decision would survive a restart (each is persisted before it takes effect).
* the NRI socket is the stub's connect loop (:func:`nri_socket_obstacle`).
* a policy's peer does not block: the policy names it (a :class:`Peer`, from
  the hook ``policy_peer``) and works without it; :class:`PeerWatch` keeps
  ``/healthz`` failing until it is reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from nri_sst.retry import Backoff, Obstacle, Reporter

from nri_framework import topology_child
from nri_framework.contract import Peer
from nri_framework.heap import pause_heap as pause_heap  # the stub's, as before
from nri_framework.heap import settle_heap as settle_heap
from nri_framework.journal import Journal
from nri_framework.topology import SYS_CPU, TopologyError

log = logging.getLogger("nri_framework.startup")

T = TypeVar("T")
Pause = Callable[[float], Coroutine[Any, Any, None]]

NRI_SOCKET_FIX = (
    'enable NRI in the container runtime (containerd: [plugins."io.containerd.nri.v1.nri"] '
    "disable = false) so that it creates its socket in the node's /var/run/nri, "
    "the chart's hostPath volume nrisockets"
)
NRI_SOCKET_ACCESS_FIX = (
    "the plugin (root with every capability dropped in the chart) must be allowed to write "
    "to the runtime's socket: chart hostPath volume nrisockets (the node's /var/run/nri)"
)
SYSFS_FIX = (
    "mount the node's /sys there: chart hostPath volume hostsysfs (the node's /sys at "
    "/host/sys, --host-root /host)"
)
STATE_DIR_FIX = (
    "the state directory must be a writable directory: chart hostPath volume "
    "resource-policydata (the node's /var/lib/nri-resource-policy at --state-dir)"
)


def _problem(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "does not exist"
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "is not a directory"
    if exc.errno == errno.EROFS:
        return "is on a read-only file system"
    if isinstance(exc, PermissionError):
        return f"is not writable ({exc.strerror})"
    return f"is not usable ({exc.strerror or exc})"


def sysfs_obstacle(host_root: str) -> Obstacle | None:
    """The node's sysfs is not under ``host_root``."""
    online = Path(host_root) / SYS_CPU / "online"
    if online.is_file():
        return None
    cpu = online.parent
    if cpu.is_dir():
        return Obstacle(str(online), "does not exist (not a sysfs tree)", SYSFS_FIX)
    return Obstacle(str(cpu), "does not exist (sysfs not mounted)", SYSFS_FIX)


def topology_obstacle(exc: TopologyError, host_root: str) -> Obstacle:
    """A sysfs tree the topology could not be read from."""
    path = str(exc.path) if exc.path is not None else str(Path(host_root) / SYS_CPU)
    return Obstacle(path, f"is unusable ({exc})", SYSFS_FIX)


PROBE_TRIES = 16


def _probe_file(path: Path) -> tuple[int, str]:
    """A new file of a random name in ``path``, open for writing (as
    ``tempfile.mkstemp`` makes one, without importing :mod:`tempfile`, its
    :mod:`random` and :mod:`shutil`: ~4 ms of every start); a name taken is
    tried again with another, up to :data:`PROBE_TRIES` times."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(PROBE_TRIES):
        probe = os.path.join(path, f".probe-{os.urandom(6).hex()}")
        with contextlib.suppress(FileExistsError):
            return os.open(probe, flags, 0o600), probe
    raise OSError(f"no probe name free after {PROBE_TRIES} tries")


def state_dir_obstacle(state_dir: str | os.PathLike[str]) -> Obstacle | None:
    """``state_dir`` is not a directory a file can be written in (created if missing)."""
    path = Path(state_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = _probe_file(path)
        try:
            os.write(fd, b"\0")
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(probe)
    except FileExistsError:
        return Obstacle(str(path), "is not a directory", STATE_DIR_FIX)
    except OSError as exc:
        return Obstacle(str(path), _problem(exc), STATE_DIR_FIX)
    return None


def journal_obstacle(journal: Journal) -> Obstacle:
    """A decision journal that cannot be written any more (after the start)."""
    return Obstacle(
        str(journal.path),
        "is not writable: decisions would not survive a restart",
        STATE_DIR_FIX,
    )


def nri_socket_obstacle(path: str, exc: OSError) -> Obstacle:
    """Why connecting to the runtime's socket at ``path`` failed."""
    if isinstance(exc, FileNotFoundError):
        parent = Path(path).parent
        where = path if parent.is_dir() else str(parent)
        return Obstacle(where, "does not exist (NRI runtime socket)", NRI_SOCKET_FIX)
    if isinstance(exc, PermissionError):
        return Obstacle(path, f"is not writable ({exc.strerror})", NRI_SOCKET_ACCESS_FIX)
    if isinstance(exc, ConnectionRefusedError):
        return Obstacle(
            path, "refuses connections (the runtime is not running, or NRI is off)", NRI_SOCKET_FIX
        )
    return Obstacle(path, _problem(exc), NRI_SOCKET_FIX)


class Startup:
    """Retries the start-up until the pod is one the plugin can work in.

    ``checks`` each return an :class:`Obstacle` or ``None``; ``make`` then
    builds what the start-up is for (the policy host), raising
    :class:`TopologyError` for a sysfs tree it cannot read. ``obstacle`` is
    what stands in the way now (``/healthz`` reports it)."""

    def __init__(
        self,
        checks: list[Callable[[], Obstacle | None]],
        *,
        backoff: Backoff | None = None,
        host_root: str = "/",
        pause: Pause | None = None,
    ) -> None:
        self.checks = checks
        self.backoff = backoff or Backoff()
        self.host_root = host_root
        self.stopping = asyncio.Event()
        self.pause: Pause = pause or self._pause
        self.obstacle: Obstacle | None = None
        self.reporter = Reporter(log)
        self.attempts = 0

    async def _pause(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), delay)

    def _attempt(self, make: Callable[[], T]) -> T | Obstacle:
        for check in self.checks:
            obstacle = check()
            if obstacle is not None:
                return obstacle
        try:
            return make()
        except TopologyError as exc:
            return topology_obstacle(exc, self.host_root)

    async def wait(self, make: Callable[[], T]) -> T | None:
        """``make()`` once every check passes; ``None`` when stopped first."""
        while not self.stopping.is_set():
            self.attempts += 1
            # off the loop, as before the loop ran: the policy's start may wait
            # for its peers (the SST helper's set-up, CONFIG_TIMEOUT per request)
            # while the endpoint keeps answering /livez and /healthz
            try:
                result = await asyncio.to_thread(self._attempt, make)
            finally:  # the launch's child answers the first attempt only (or none)
                topology_child.discard()
            if not isinstance(result, Obstacle):
                if self.obstacle is not None:
                    self.reporter.cleared(f"{self.obstacle.path} is usable now: starting")
                self.obstacle = None
                return result
            self.obstacle = result
            # a start that waits (for hours, maybe) does so with the collector on: the
            # launch paused it for a start that goes through (settle_heap once made)
            gc.enable()
            self.reporter.failed(f"cannot start: {result}")
            delay = self.backoff.next()
            log.debug("start-up attempt %d failed, retrying in %.2fs", self.attempts, delay)
            await self.pause(delay)
        return None

    def stop(self) -> None:
        self.stopping.set()


class PeerWatch:
    """Looks for a policy's :class:`Peer` until it is there (then every
    ``backoff.maximum`` seconds, as the peer's pod may be remade): the
    plugin works meanwhile; ``obstacle`` keeps ``/healthz`` failing."""

    #: failed looks not logged: a sidecar starts alongside the plugin
    GRACE = 2

    def __init__(self, peer: Peer, backoff: Backoff, pause: Pause | None = None) -> None:
        self.peer = peer
        self.backoff = Backoff(backoff.initial, backoff.maximum)
        self.stopping = asyncio.Event()
        self.pause: Pause = pause or self._pause
        self.obstacle: Obstacle | None = peer.look()
        self.reporter = Reporter(log, grace=self.GRACE)
        self.task: asyncio.Task[None] | None = None

    async def _pause(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), delay)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        name = self.peer.name
        while not self.stopping.is_set():
            self.obstacle = self.peer.look()
            if self.obstacle is None:
                self.reporter.cleared(f"{name} socket {self.peer.endpoint} is there now")
                self.backoff.reset()
                delay = self.backoff.maximum
            else:
                self.reporter.failed(f"{name} unreachable: {self.obstacle}")
                delay = self.backoff.next()
                log.debug("%s socket check %d failed", name, self.reporter.attempts)
            await self.pause(delay)

    async def stop(self) -> None:
        self.stopping.set()
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

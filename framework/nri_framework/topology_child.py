"""The sysfs topology discovered by a child process beside the start's imports.

A ``run`` spends ~100 ms importing (asyncio, protobuf, msgspec, the policy)
before the policy's start discovers the topology (~20-40 ms of sysfs reads:
3500 files on a 6776P). These do not depend on each other, and a node has a
second core free then: the launch (:mod:`nri_framework.launch`) forks a child
at its start (:func:`start`: before any thread exists and before asyncio is
imported; after msgspec and :mod:`nri_framework.sysfs`, which the parent
imports anyway, so that the child only reads sysfs), the child, at the lowest
priority (:data:`CHILD_NICE`: on a loaded node it takes no core from the
parent's imports), discovers the topology
(:func:`nri_framework.sysfs.discover`) and writes it to a pipe, JSON-encoded
(:func:`nri_framework.sysfs.encode_discovery`, with the log lines the
discovery wrote), and exits; the parent imports meanwhile.
:meth:`Topology.from_sysfs <nri_framework.topology.Topology.from_sysfs>` takes
the child's answer (:func:`take`) for the same host root, once.

The child is a peer like any other: whatever goes wrong with it (it dies, it
hangs, it writes garbage or too much, it answers for another host root) the
parent discovers in-process, as without it. The parent reads at most
:data:`MAX_ANSWER` bytes within :data:`DEADLINE` seconds, catches decode
errors, and reaps the child in every case (killed first when it has not
ended): no zombie, even in a container where the plugin is PID 1. The child
bounds itself too (:data:`CHILD_LIFETIME`, an alarm whose default action ends
it, should the parent die or never ask), and keeps no file descriptor of the
parent's but its end of the pipe (a pre-launched plugin's NRI socket).

This module imports nothing but the standard library's at its top: the launch
imports it before anything else.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nri_framework.topology import Topology

#: bytes of a child's answer at most (the 6776P's is ~70 KB)
MAX_ANSWER = 16 * 1024 * 1024
#: seconds the parent waits for the answer, from when it asks
DEADLINE = 2.0
#: the child's niceness: it works on a core the parent leaves idle, not on
#: the parent's (on a loaded node it runs when the parent waits for it)
CHILD_NICE = 19
#: seconds a child may live at all (``SIGALRM``, its default action)
CHILD_LIFETIME = 30


class _Child:
    def __init__(self, pid: int, fd: int, host_root: str) -> None:
        self.pid = pid
        self.fd = fd
        self.host_root = host_root


_child: _Child | None = None
#: why the last answer was not taken (tests and the debug line read it)
last_refusal = ""


def host_root_of(argv: list[str]) -> str | None:
    """The ``--host-root`` of a ``run`` command line as ``run`` would read it
    (``/`` by default); ``None`` for another command, or an option spelled in a
    way this does not follow (an abbreviation): no child then. A wrong guess
    costs nothing but the child's work: :func:`take` answers for the root asked."""
    if not argv or argv[0] != "run":
        return None
    root = "/"
    args = iter(argv[1:])
    for arg in args:
        if arg == "--":
            break
        if arg == "--host-root":
            value = next(args, None)
            if value is None:
                return None
            root = value
        elif arg.startswith("--host-root="):
            root = arg.partition("=")[2]
        elif arg.startswith("--host-r") or arg.startswith("--host"):
            return None  # an abbreviation argparse may take for --host-root
    return root


def start(host_root: str) -> None:
    """Fork a child that discovers the topology under ``host_root`` (once per
    process; nothing where :func:`os.fork` is missing or fails)."""
    global _child
    if _child is not None or not hasattr(os, "fork"):
        return
    # what the child runs is imported first (msgspec, the topology's records:
    # the parent's imports need them too): the child only reads sysfs
    import nri_framework.sysfs  # noqa: F401

    try:
        r, w = os.pipe()
    except OSError:
        return
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return
    if pid == 0:  # pragma: no cover - the child (its exit status is tested)
        _child_main(w, host_root)
    os.close(w)
    os.set_inheritable(r, False)
    _child = _Child(pid, r, host_root)


def _child_main(w: int, host_root: str) -> None:  # pragma: no cover - runs in the child
    code = 1
    try:
        import signal

        signal.alarm(CHILD_LIFETIME)
        os.nice(CHILD_NICE)
        os.closerange(0, w)  # stdin/out/err too: the child writes nothing but its answer
        os.closerange(w + 1, 1 << 20)
        from nri_framework.sysfs import discover_and_encode

        data = discover_and_encode(host_root)
        view = memoryview(data)
        while view:
            view = view[os.write(w, view) :]
        code = 0
    except BaseException:
        pass
    finally:
        os._exit(code)


def pending() -> bool:
    """A child was started and its answer not taken or discarded yet."""
    return _child is not None


def take(host_root: str | os.PathLike[str]) -> Topology | None:
    """The topology the child discovered under ``host_root`` (its log lines
    written now, as the discovery would have), or ``None``: no child, another
    root, or the child failed (dead, late, garbage, too much:
    :data:`last_refusal` says which). The child is reaped either way; a second
    call answers ``None``."""
    global _child, last_refusal
    child, _child = _child, None
    if child is None:
        return None
    try:
        if os.fspath(host_root) != child.host_root:
            last_refusal = f"the child discovered {child.host_root!r}, not {host_root!r}"
            return None
        data = _read(child.fd)
    finally:
        os.close(child.fd)
        status = _reap(child.pid)
    if data is None:
        return None
    if status != 0:
        last_refusal = f"the child ended with status {status}"
        return None
    from nri_framework.sysfs import decode_discovery

    try:
        return decode_discovery(data, child.host_root)
    except ValueError as exc:
        last_refusal = f"the child's answer does not decode: {exc}"
        return None


def discard() -> None:
    """End and reap a child whose answer nobody will ask for (a start that
    waits: the topology is read anew when it goes through)."""
    global _child
    child, _child = _child, None
    if child is not None:
        os.close(child.fd)
        _reap(child.pid)


def _read(fd: int) -> bytes | None:
    """The whole answer (up to end of file), or ``None`` when over
    :data:`MAX_ANSWER` bytes or not there within :data:`DEADLINE`."""
    global last_refusal
    import select

    deadline = time.monotonic() + DEADLINE
    chunks: list[bytes] = []
    size = 0
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poll.poll(left * 1000):
            last_refusal = f"no answer within {DEADLINE:g}s"
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER:
            last_refusal = f"answer over {MAX_ANSWER} bytes"
            return None
        chunks.append(chunk)


def _reap(pid: int) -> int:
    """Wait for the child, killed first if it has not ended; its wait status."""
    import signal

    try:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped by someone else (a SIGCHLD handler)
        return -1
    return status

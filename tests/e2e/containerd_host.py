"""What containerd puts on the host outside its work dir, and processes found by PID.

Containerd creates ``/run/containerd/{s,fifo,runc}`` and the cgroups ``kubepods`` /
``k8s.io`` in every hierarchy whatever its config says; ``ContainerdEnv`` records
them before ``start()`` and removes what is new in ``stop()``, with the helpers here
(mount table, cgroup trees, ``umount2``, ``/proc`` scans).

Its neighbours (the environment's other modules): see :mod:`containerd_env`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import time
from pathlib import Path

from containerd_packages import _log

# cgroup directory names (top level of each hierarchy) that containerd/CRI/runc create
CGROUP_NAMES = ("kubepods", "k8s.io")
RUN_CONTAINERD = Path("/run/containerd")
RUN_SUBDIRS = ("s", "fifo", "runc")


def _cgroup_mounts() -> list[Path]:
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split()[0] if right else ""
            if fstype in ("cgroup", "cgroup2"):
                mounts.append(Path(_unescape(left.split()[4])))
    return mounts


def cgroup_v1_root(controller: str) -> Path | None:
    """Where the cgroup v1 hierarchy of ``controller`` is mounted, if it is."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = right.split()
        if len(fields) >= 3 and fields[0] == "cgroup" and controller in fields[2].split(","):
            return Path(_unescape(left.split()[4]))
    return None


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def _cgroup_dirs() -> list[str]:
    """All cgroup directories under the names containerd/CRI create, in every hierarchy."""
    found = []
    for mnt in _cgroup_mounts():
        for name in CGROUP_NAMES:
            top = mnt / name
            if top.is_dir():
                for dirpath, _dirs, _files in os.walk(top):
                    found.append(dirpath)
    return found


def _run_entries() -> list[str]:
    out = []
    if RUN_CONTAINERD.is_dir():
        out.append(str(RUN_CONTAINERD))
        for sub in RUN_SUBDIRS:
            d = RUN_CONTAINERD / sub
            if d.is_dir():
                out.append(str(d))
                for e in d.iterdir():
                    out.append(str(e))
                    if sub == "runc" and e.is_dir():
                        out.extend(str(x) for x in e.iterdir())
    return out


def _mounts_under(prefix: Path) -> list[str]:
    pre = str(prefix).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = _unescape(line.split()[4])
            if mp.startswith(pre) or mp == pre.rstrip("/"):
                found.append(mp)
    return found


_libc = None


def _umount(path: str) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if _libc.umount2(path.encode(), 2) != 0:  # MNT_DETACH
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            _log(f"umount {path}: {os.strerror(err)}")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _pid_alive(p)]
    return left


def _kill(pids: list[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


# --------------------------------------------------------------------------- the env

"""Debian packages for the test tiers, fetched without touching the system's APT.

One home for what the tiers that need real binaries share (e2e: containerd, the
UAPI check: a kernel header, k8s: apiextensions-apiserver + etcd):

* :func:`run`: a command with captured output that raises on failure (and,
  given a :class:`_progress.Step`, ticks it while the command runs);
* :func:`apt_config`: a private ``APT_CONFIG`` (sources, lists, cache, optionally
  its own empty dpkg status) under a directory of the caller's; ``/etc/apt`` and
  the system's lists stay untouched;
* :func:`apt_env`: the environment that makes ``apt-get``/``apt-cache`` use it;
* :func:`dpkg_extract`: ``dpkg -x`` of many ``.deb`` files into one root;
* :func:`cache_lock`: one builder at a time per cache directory.

Stdlib only; the modules that use it put ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _progress import Step

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class CommandError(RuntimeError):
    """A command run by :func:`run` failed (the message has the tail of its output)."""


def debian_source(suite: str) -> str:
    """A one-line ``sources.list`` for ``suite`` (main only)."""
    return f"deb [signed-by={KEYRING}] http://deb.debian.org/debian {suite} main\n"


def run(
    cmd: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 600,
    error: type[Exception] = CommandError,
    progress: Step | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` capturing text output; raise ``error`` if ``check`` and it fails.

    ``progress``: tick that step every ``progress.poll`` seconds while waiting
    (a line at least every :data:`_progress.EVERY` seconds of its clock)."""
    if progress is None:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout, check=False
        )
    else:
        proc = _run_ticking(cmd, cwd, env, timeout, progress)
    if check and proc.returncode != 0:
        raise error(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return proc


def _run_ticking(
    cmd: list[str], cwd: Path | None, env: dict[str, str] | None, timeout: float, step: Step
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + timeout
    with subprocess.Popen(
        cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as popen:
        while True:
            try:
                out, err = popen.communicate(timeout=step.poll)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    popen.kill()
                    popen.communicate()
                    raise subprocess.TimeoutExpired(cmd, timeout) from None
                step.tick()
    return subprocess.CompletedProcess(cmd, popen.returncode, out, err)


def apt_config(apt: Path, sources: str, *, own_status: bool = False) -> Path:
    """Write a private APT configuration under ``apt``; returns the ``apt.conf`` path.

    ``sources``: the ``sources.list`` text (see :func:`debian_source`).
    ``own_status``: use an empty dpkg status file of its own instead of the
    system's, so that what this machine has installed plays no part in resolving
    packages of another suite.
    """
    for d in (
        apt / "lists" / "partial",
        apt / "cache" / "archives" / "partial",
        apt / "sources.list.d",
        apt / "preferences.d",
    ):
        d.mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(sources)
    lines = [
        f'Dir::Etc::SourceList "{apt}/sources.list";',
        f'Dir::Etc::SourceParts "{apt}/sources.list.d";',
        f'Dir::Etc::PreferencesParts "{apt}/preferences.d";',
        f'Dir::State::Lists "{apt}/lists";',
        f'Dir::Cache "{apt}/cache";',
        'Acquire::Languages "none";',
        'APT::Sandbox::User "root";',
    ]
    if own_status:
        status = apt / "status"
        status.touch()
        lines.append(f'Dir::State::status "{status}";')
    conf = apt / "apt.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def apt_env(conf: Path) -> dict[str, str]:
    """``os.environ`` plus ``APT_CONFIG=conf`` and a non-interactive frontend."""
    return dict(os.environ, APT_CONFIG=str(conf), DEBIAN_FRONTEND="noninteractive")


def dpkg_extract(
    debs: Iterable[Path], root: Path, *, jobs: int = 4, progress: Step | None = None
) -> None:
    """``dpkg -x`` every ``.deb`` into ``root`` (a few at a time), ticking ``progress``."""
    root.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(run, ["dpkg", "-x", str(deb), str(root)], timeout=600) for deb in debs
        ]
        if progress is not None:
            while wait(futures, timeout=progress.poll).not_done:
                progress.tick(f"{sum(f.done() for f in futures)}/{len(futures)} packages")
        for f in futures:
            f.result()


@contextlib.contextmanager
def cache_lock(directory: Path) -> Iterator[None]:
    """One builder at a time per cache directory (two pytest sessions, say)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)

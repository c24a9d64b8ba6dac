"""Progress of the test tiers' long first-run steps: no silent minute.

The tiers fetch Debian packages and build things once (containerd and runc for
e2e, the images' base and the images, the API server and etcd for k8s, a
kernel header for the UAPI check); on a fresh machine that takes minutes, then
the caches make it instant. One :class:`Progress` per tier says so:

* ``progress.step(what, watch=DIR)``: a :class:`Step`; it says what starts,
  then at least every :data:`EVERY` seconds what it is doing, how long it has
  been at it and how many bytes ``DIR`` holds (a download's destination),
  then ``done`` with the size and the time, or ``failed after``;
* :func:`_debian.run` with ``progress=step`` runs a command and ticks the step
  while waiting for it;
* ``progress.cached(what)``: the line that says a cache made a step instant.

Lines go to the terminal *live*, also inside pytest's session fixtures where
output is captured (``-q`` or not): the tests' ``conftest.py`` attaches
pytest's config (:func:`attach`), and each line is written around the capture
(the capture manager's ``global_and_fixture_disabled``), to stderr. Outside
pytest (``python tests/k8s/stack.py up``) it is plain stderr.

The clock and the writer are injectable (tests). Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EVERY = 10.0
"""Seconds between two lines of a running step, at most."""
POLL = 1.0
"""Seconds :func:`_debian.run` waits for a command between two ticks."""

Write = Callable[[str], None]
Clock = Callable[[], float]

_config: Any = None  # the pytest config whose capture is lifted for a line


def attach(config: Any) -> None:
    """Write live in this pytest session (from its ``pytest_configure``)."""
    global _config
    _config = config


def detach() -> None:
    global _config
    _config = None


def pytest_configure(config: Any) -> None:
    """The hooks of ``tests/conftest.py`` (and of ``-p _progress``)."""
    attach(config)


def pytest_unconfigure(config: Any) -> None:
    detach()


def write_line(text: str) -> None:
    """``text`` on stderr now, also while pytest captures the output."""
    capman = _config.pluginmanager.getplugin("capturemanager") if _config is not None else None
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def sayer(prefix: str) -> Write:
    """A tier's ``say``: ``prefix message`` written live (:func:`write_line`)."""
    return lambda message: write_line(f"{prefix} {message}")


def human_size(n: int) -> str:
    """``1234567`` -> ``"1.2 MB"`` (decimal units, as apt-get says them)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks not followed; 0 if absent)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                if not os.path.islink(os.path.join(root, name)):
                    total += st.st_size
    return total


class Progress:
    """The progress lines of one tier (``prefix``: ``[k8s-stack]``, ...; ``""``
    when ``write`` is a tier's own ``say`` that adds it)."""

    def __init__(
        self,
        prefix: str,
        *,
        write: Write | None = None,
        clock: Clock = time.monotonic,
        every: float = EVERY,
    ) -> None:
        self.prefix = prefix
        self.write: Write = write or write_line
        self.clock = clock
        self.every = every

    def say(self, message: str) -> None:
        self.write(f"{self.prefix} {message}" if self.prefix else message)

    def cached(self, what: str) -> None:
        """A cache made ``what`` instant."""
        self.say(f"cached: {what} (nothing to fetch or build)")

    def step(self, what: str, *, watch: Path | None = None, poll: float = POLL) -> Step:
        return Step(self, what, watch, poll)


class Step:
    """One long step; a context manager (``done`` or ``failed after`` at its end)."""

    def __init__(self, progress: Progress, what: str, watch: Path | None, poll: float) -> None:
        self.progress = progress
        self.what = what
        self.watch = watch
        #: how long a waiter sleeps between two :meth:`tick` calls (real seconds)
        self.poll = poll
        self.started = progress.clock()
        self.last = self.started
        self.base = tree_size(watch) if watch is not None else 0
        progress.say(f"{what} ...")

    def _size(self) -> str:
        if self.watch is None:
            return ""
        return f", {human_size(max(0, tree_size(self.watch) - self.base))}"

    def elapsed(self) -> float:
        return self.progress.clock() - self.started

    def tick(self, doing: str = "") -> None:
        """A line when the last one is ``every - 2 * poll`` seconds old: ticked
        every ``poll`` seconds (and a waiter's overhead, under ``poll``), no gap
        exceeds ``every`` (:data:`EVERY`)."""
        now = self.progress.clock()
        if now - self.last < max(self.poll, self.progress.every - 2 * self.poll):
            return
        self.last = now
        what = f"{self.what} ({doing})" if doing else self.what
        self.progress.say(f"{what}: {now - self.started:.0f} s{self._size()} so far")

    def done(self) -> None:
        self.progress.say(f"{self.what}: done in {self.elapsed():.0f} s{self._size()}")

    def failed(self) -> None:
        self.progress.say(f"{self.what}: failed after {self.elapsed():.0f} s{self._size()}")

    def __enter__(self) -> Step:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if kind is None:
            self.done()
        else:
            self.failed()

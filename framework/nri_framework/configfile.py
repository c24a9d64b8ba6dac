"""The configuration file (``--config-file``): read without trusting it, and
reloaded on SIGHUP without stopping the NRI event loop.

Whoever can write the file (or replace it: a ConfigMap mount is a symlink
that flips) decides what the plugin reads, so reading is bounded:

* opened with ``O_NONBLOCK``: a FIFO or a device put in its place does not
  block the open until a writer comes;
* only a regular file is read (``fstat`` of the open descriptor, so a file
  swapped after a check is not read), at most :data:`MAX_CONFIG_BYTES`
  (checked on the size and again while reading: the file may grow);
* the bytes must be UTF-8; the first one that is not is reported with its
  line and column.

:class:`Reloader` runs the reloads: a SIGHUP only sets a flag, one task reads
the file in a worker thread (bounded by :data:`READ_TIMEOUT`) and hands the
text to :meth:`~nri_framework.host.PolicyHost.try_reconfigure`, which parses
it off the event loop too. SIGHUPs during a reload coalesce into one more
reload. Any failure keeps the running configuration and is logged in the
host's words (``config update from FILE failed, keeping the running
configuration: ...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nri_framework.host import PolicyHost

log = logging.getLogger("nri_framework.config")

#: The largest configuration file read (a real one is a few kilobytes).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Seconds a reload waits for the file's bytes (a hung network file system).
READ_TIMEOUT = 5.0


class ConfigFileError(Exception):
    """A configuration file that cannot be taken; the text says why."""


def decode_text(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text; :class:`ConfigFileError` names the line and
    column of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        column = len(data[line_start : exc.start].decode("utf-8", errors="replace")) + 1
        raise ConfigFileError(
            f"{source}:{line}:{column}: not UTF-8 text (byte 0x{data[exc.start]:02x})"
        ) from None


def read_config_file(path: str | os.PathLike[str], limit: int = MAX_CONFIG_BYTES) -> str:
    """The text of the regular file ``path``, at most ``limit`` bytes.

    Blocking (a file system may be slow): call it off the event loop. Raises
    :class:`ConfigFileError` with a message that names the file."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise ConfigFileError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigFileError(f"{name}: not a regular file")
        if st.st_size > limit:
            raise ConfigFileError(f"{name}: {st.st_size} bytes, larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise ConfigFileError(f"cannot read {name}: {exc.strerror or exc}") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ConfigFileError(f"{name}: larger than {limit} bytes")
    finally:
        os.close(fd)
    return decode_text(b"".join(chunks), name)


class Reloader:
    """Re-reads ``path`` into ``host`` on :meth:`request` (the SIGHUP handler),
    one reload at a time, off the event loop."""

    def __init__(
        self,
        host: PolicyHost,
        path: str,
        *,
        limit: int = MAX_CONFIG_BYTES,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.host = host
        self.path = path
        self.limit = limit
        self.read_timeout = read_timeout
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: a read that outlived its timeout: no second one starts beside it
        self._reading: asyncio.Future[str] | None = None
        #: reloads done (applied or rejected), for tests and logs
        self.done = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def request(self) -> None:
        """Ask for a reload; returns at once (safe in a signal handler)."""
        self._wanted.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.reload()
            except Exception:  # the reloads go on whatever happened to one
                log.exception("reloading %s failed", self.path)
            self.done += 1

    async def reload(self) -> bool:
        """One reload; ``True`` when the policy took the new configuration."""
        log.info("reloading configuration from %s", self.path)
        try:
            text = await self._read()
        except ConfigFileError as exc:
            log.error(
                "config update from %s failed, keeping the running configuration: %s",
                self.path,
                exc,
            )
            return False
        return await self.host.try_reconfigure(text, self.path) is None

    async def _read(self) -> str:
        if self._reading is not None and not self._reading.done():
            raise ConfigFileError(f"cannot read {self.path}: an earlier read has not returned")
        loop = asyncio.get_running_loop()
        self._reading = loop.run_in_executor(None, read_config_file, self.path, self.limit)
        # a read given up on still ends some time: its outcome is dropped quietly
        self._reading.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            return await asyncio.wait_for(asyncio.shield(self._reading), self.read_timeout)
        except TimeoutError:
            raise ConfigFileError(
                f"cannot read {self.path}: no data in {self.read_timeout:g}s"
            ) from None

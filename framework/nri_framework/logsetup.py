"""Logging set-up: the one place that configures handlers and format.

Decisions log a line per container at info (``assigning container ...``), so
a Synchronize of 1000 emits 1000 records: the formatter strftimes each second
once (``SecondFormatter``), and the record attributes that ``FORMAT`` does not
use (the caller's file and line, thread, process) are not gathered per record
(the logging HOWTO's "Optimization" switches). The handler (``TurnHandler``)
writes the lines below WARNING once per event-loop turn, instead of a write
and a flush per record; the NRI stub writes them (:func:`write_held`) before
the replies they led to, so a reply is never seen before its lines.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import TextIO

from nri_framework.eventloop import running_loop

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Record attributes that need logging to walk the caller's frames (``_srcfile``).
_CALLER_FIELDS = ("%(pathname)", "%(filename)", "%(module)", "%(funcName)", "%(lineno)")


class SecondFormatter(logging.Formatter):
    """``logging.Formatter`` with the strftime of the current second kept: the
    same text, one ``time.strftime`` per second instead of one per record."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)
        self._second: tuple[int, str | None] | None = None
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        key = (int(record.created), datefmt)
        if key != self._second:
            ct = self.converter(record.created)
            fmt = datefmt or self.default_time_format
            self._stamp = time.strftime(fmt, ct)
            self._second = key
        if datefmt or not self.default_msec_format:
            return self._stamp
        return self.default_msec_format % (self._stamp, record.msecs)


#: lines held at most before they are written (a turn that logs more writes
#: every this many)
TURN_LINES = 256


class TurnHandler(logging.StreamHandler[TextIO]):
    """``logging.StreamHandler`` that writes the lines of one event-loop turn
    at once: a record below WARNING is formatted when it is logged (its
    arguments as they are then) and held until the loop's next turn
    (``call_soon``), or until :data:`TURN_LINES` are held; a WARNING or above
    writes what is held and itself at once. Outside a running loop (another
    thread, before or after the loop) every record is written at once.
    :meth:`flush` writes what is held: ``logging.shutdown`` calls it at exit,
    and so does a crash path that flushes its handlers."""

    def __init__(self, stream: TextIO, limit: int = TURN_LINES) -> None:
        super().__init__(stream)
        self.limit = limit
        self._held: list[str] = []
        self._pending: asyncio.AbstractEventLoop | None = None
        """the loop a write is scheduled on (a closed loop drops it: a new loop
        schedules its own)"""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        held = self._held
        held.append(line)
        if record.levelno >= logging.WARNING or len(held) >= self.limit:
            self.flush()
            return
        loop = running_loop()
        if loop is None:
            self.flush()
            return
        if self._pending is not loop:
            self._pending = loop
            loop.call_soon(self._turn_ended)

    def _turn_ended(self) -> None:
        self._pending = None
        self.flush()

    def flush(self) -> None:
        self.acquire()
        try:
            if self._held:
                text = "".join(self._held)
                self._held.clear()
                self.stream.write(text)
            if self.stream and hasattr(self.stream, "flush"):
                self.stream.flush()
        finally:
            self.release()


_installed: TurnHandler | None = None
"""the handler :func:`setup` installed"""


def write_held() -> None:
    """Write the lines :func:`setup`'s handler holds (before a reply is sent:
    whoever sees the reply may look for its lines)."""
    handler = _installed
    if handler is not None and handler._held:
        handler.flush()


def setup(level: str = "info", debug: list[str] | None = None) -> None:
    """Log to stderr at ``level``; loggers named in ``debug`` log at DEBUG."""
    global _installed
    handler = _installed = TurnHandler(sys.stderr)
    handler.setFormatter(SecondFormatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in debug or ():
        logging.getLogger(name).setLevel(logging.DEBUG)
    if not any(field in FORMAT for field in _CALLER_FIELDS):
        logging._srcfile = None  # no findCaller per record (documented in the HOWTO)
    if "%(thread" not in FORMAT:
        logging.logThreads = False
    if "%(process" not in FORMAT:
        logging.logProcesses = False
        logging.logMultiprocessing = False
    if "%(taskName" not in FORMAT:
        setattr(logging, "logAsyncioTasks", False)  # noqa: B010  (3.12+)

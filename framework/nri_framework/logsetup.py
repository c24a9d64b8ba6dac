"""Logging set-up: the one place that configures handlers and format.

Decisions log a line per container at info (``assigning container ...``), so
a Synchronize of 1000 emits 1000 records: the formatter strftimes each second
once (``SecondFormatter``), and the record attributes that ``FORMAT`` does not
use (the caller's file and line, thread, process) are not gathered per record
(the logging HOWTO's "Optimization" switches).
"""

from __future__ import annotations

import logging
import sys
import time

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


def setup(level: str = "info", debug: list[str] | None = None) -> None:
    """Log to stderr at ``level``; loggers named in ``debug`` log at DEBUG."""
    handler = logging.StreamHandler(sys.stderr)
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

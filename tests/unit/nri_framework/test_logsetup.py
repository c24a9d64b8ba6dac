"""logsetup: the per-second formatter writes logging.Formatter's text, and
setup gathers no record attribute its format does not use."""

from __future__ import annotations

import io
import logging
import sys
import time

import pytest
from nri_framework import logsetup


def _record(
    created: float, msg: str = "assigning container %s", exc: bool = False
) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord(
        "nri_balloons.policy", logging.INFO, "x.py", 1, msg, ("a/b/c",), exc_info
    )
    rec.created = created  # injected time: the same record goes to both formatters
    rec.msecs = int((created - int(created)) * 1000) + 0.0
    return rec


# Within one second, across a second, a minute and a day boundary, and back in time.
TIMES = [
    1764633600.001,
    1764633600.5,
    1764633600.999,
    1764633601.0,
    1764633659.75,
    1764633660.25,
    1764719999.999,
    1764720000.0,
    1764633600.3,
]


@pytest.mark.parametrize("datefmt", [None, "%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"])
def test_second_formatter_writes_logging_formatters_text(datefmt: str | None) -> None:
    ours = logsetup.SecondFormatter(logsetup.FORMAT, datefmt)
    theirs = logging.Formatter(logsetup.FORMAT, datefmt)
    for t in TIMES:
        assert ours.format(_record(t)) == theirs.format(_record(t))
    assert ours.format(_record(TIMES[0], exc=True)) == theirs.format(_record(TIMES[0], exc=True))


def test_second_formatter_strftimes_each_second_once() -> None:
    calls: list[float | None] = []

    class Counting(logsetup.SecondFormatter):
        def converter(self, t: float | None) -> time.struct_time:  # type: ignore[override]
            calls.append(t)
            return time.localtime(t)

    fmt = Counting(logsetup.FORMAT)
    for t in (100.1, 100.2, 100.9, 101.0, 101.5):
        fmt.format(_record(t))
    assert calls == [100.1, 101.0]


def test_setup_gathers_no_attribute_the_format_does_not_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, name, getattr(logging, name))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    logsetup.setup("info")
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    out = io.StringIO()
    handler.setStream(out)
    seen: list[logging.LogRecord] = []
    handler.addFilter(lambda r: seen.append(r) or True)
    logging.getLogger("nri_test.logsetup").info("assigning container %s", "a/b/c")
    (rec,) = seen
    assert (rec.funcName, rec.lineno, rec.thread, rec.process) == (
        "(unknown function)",
        0,
        None,
        None,
    )
    assert out.getvalue().endswith(" INFO nri_test.logsetup: assigning container a/b/c\n")

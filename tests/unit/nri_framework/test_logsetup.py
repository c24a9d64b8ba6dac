"""logsetup: the per-second formatter writes logging.Formatter's text, setup
gathers no record attribute its format does not use, and the handler writes
the lines of an event-loop turn once after it (WARNING+ at once, bounded,
nothing lost at exit)."""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
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


class _Writes(io.StringIO):
    """A stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def _turn_logger(
    monkeypatch: pytest.MonkeyPatch, limit: int = logsetup.TURN_LINES
) -> tuple[logging.Logger, _Writes]:
    out = _Writes()
    handler = logsetup.TurnHandler(out, limit)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("nri_test.turn")
    monkeypatch.setattr(logger, "handlers", [handler])
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logger, "level", logging.DEBUG)
    return logger, out


def test_lines_of_a_loop_turn_are_written_once_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    log, out = _turn_logger(monkeypatch)
    seen: list[str] = []

    async def turn() -> None:
        for i in range(100):
            log.info("assigning container %s", i)
        seen.append(out.getvalue())  # nothing written while the turn runs
        await asyncio.sleep(0)  # the turn ends
        seen.append(out.getvalue())

    asyncio.run(turn())
    assert seen[0] == ""
    assert seen[1] == "".join(f"INFO assigning container {i}\n" for i in range(100))
    assert out.writes == 1


def test_a_warning_is_written_at_once_after_the_lines_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log, out = _turn_logger(monkeypatch)
    seen: list[str] = []

    async def turn() -> None:
        log.info("one")
        log.warning("two")
        seen.append(out.getvalue())
        log.info("three")
        log.error("four")
        log.debug("five")
        seen.append(out.getvalue())
        await asyncio.sleep(0)

    asyncio.run(turn())
    assert seen == ["INFO one\nWARNING two\n", "INFO one\nWARNING two\nINFO three\nERROR four\n"]
    assert out.getvalue().endswith("ERROR four\nDEBUG five\n")


def test_held_lines_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    log, out = _turn_logger(monkeypatch, limit=8)
    handler = log.handlers[0]
    assert isinstance(handler, logsetup.TurnHandler)
    held: list[int] = []

    async def turn() -> None:
        for i in range(20):
            log.info("line %d", i)
            held.append(len(handler._held))
        await asyncio.sleep(0)

    asyncio.run(turn())
    assert max(held) < 8
    assert out.getvalue() == "".join(f"INFO line {i}\n" for i in range(20))
    assert out.writes == 3  # at 8, at 16, after the turn


def test_outside_a_loop_and_from_other_threads_lines_are_written_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log, out = _turn_logger(monkeypatch)
    log.info("before the loop")
    assert out.getvalue() == "INFO before the loop\n"
    seen: list[str] = []

    async def turn() -> None:
        await asyncio.to_thread(log.info, "from a thread")
        seen.append(out.getvalue())

    asyncio.run(turn())
    assert seen == ["INFO before the loop\nINFO from a thread\n"]


def test_a_loop_closed_before_its_turn_ended_loses_nothing_and_the_next_loop_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log, out = _turn_logger(monkeypatch)

    async def last_turn() -> None:
        log.info("first loop")  # the loop stops and closes before the write it scheduled

    loop = asyncio.new_event_loop()
    loop.call_soon(loop.create_task, last_turn())
    loop.call_soon(lambda: loop.call_soon(loop.stop))
    loop.run_forever()
    loop.close()
    assert out.getvalue() == ""
    logging.getLogger("nri_test.turn").handlers[0].flush()  # what logging.shutdown does
    assert out.getvalue() == "INFO first loop\n"
    seen: list[str] = []

    async def turn() -> None:
        log.info("second loop")
        await asyncio.sleep(0)
        seen.append(out.getvalue())

    asyncio.run(turn())
    assert seen == ["INFO first loop\nINFO second loop\n"]


def test_a_process_that_dies_of_an_exception_mid_turn_writes_its_held_lines() -> None:
    """A real process: the lines held when an exception ends the loop (and the
    process) are written at exit (``logging.shutdown`` flushes), none lost."""
    script = (
        "import asyncio, logging\n"
        "from nri_framework import logsetup\n"
        "logsetup.setup('info')\n"
        "async def main():\n"
        "    for i in range(50):\n"
        "        logging.getLogger('policy').info('assigning container c%d', i)\n"
        "    raise RuntimeError('boom')\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1
    assert "RuntimeError: boom" in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if " INFO policy: assigning container" in ln]
    assert [ln.rsplit(" ", 1)[1] for ln in lines] == [f"c{i}" for i in range(50)]


def test_write_held_writes_what_setups_handler_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the stub calls before it sends replies (a reply is not seen before
    the lines of its decision: tests/integration's e2e read them right after)."""
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing", "_installed"):
        target = logsetup if name == "_installed" else logging
        monkeypatch.setattr(target, name, getattr(target, name))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    logsetup.setup("info")
    seen: list[str] = []

    async def turn() -> None:
        logging.getLogger("nri_test.logsetup").info("assigning container %s", "a/b/c")
        seen.append(out.getvalue())
        logsetup.write_held()
        seen.append(out.getvalue())

    asyncio.run(turn())
    assert seen[0] == ""
    assert seen[1].endswith(" INFO nri_test.logsetup: assigning container a/b/c\n")

"""Bounded backoff and the rarely repeated line of :mod:`nri_sst.retry`."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from nri_sst.retry import REPEAT_EVERY, Backoff, Reporter, worth_reporting


def test_backoff_doubles_up_to_its_bound_and_starts_over() -> None:
    b = Backoff.parse("0.5:4")
    assert [b.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.reset()
    assert b.next() == 0.5
    assert Backoff.parse("0.1").maximum == pytest.approx(2.0)


@pytest.mark.parametrize("text", ["", "x", "0", "-1:2", "2:1", "1:x", "nan"])
def test_a_bad_interval_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid retry interval"):
        Backoff.parse(text)


def test_reported_at_powers_of_two_then_every_repeat() -> None:
    logged = [n for n in range(1, 3 * REPEAT_EVERY + 1) if worth_reporting(n)]
    assert logged == [1, 2, 4, 8, 16, 32, 64, 128, 192]
    assert not worth_reporting(0)


def test_reporter_counts_per_problem_and_honours_grace(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    r = Reporter(logging.getLogger("t"), grace=1)
    for _ in range(5):
        r.failed("a")  # attempts 2..5 are 1..4 after the grace: 1, 2, 4 logged
    r.failed("b")  # a new problem starts the count (and its grace) anew
    r.cleared("unseen")  # never reported: nothing to clear in the log
    r.failed("b")
    r.failed("b")
    r.cleared("fine")
    assert [rec.getMessage() for rec in caplog.records] == [
        "a",
        "a (attempt 2)",
        "a (attempt 4)",
        "b",
        "fine",
    ]


@pytest.mark.parametrize("prog", ["nri_framework", "nri_sst.cli"])
def test_the_commands_refuse_a_bad_interval(prog: str) -> None:
    args = {"nri_framework": ["run", "--policy", "pinner"], "nri_sst.cli": ["serve", "--socket",
            "ipc:///nonexistent/s.sock"]}[prog]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", prog, *args, "--retry-interval", "5:1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "invalid retry interval 5:1" in out.stderr and "Traceback" not in out.stderr

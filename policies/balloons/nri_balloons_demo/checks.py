"""What every demo prints: section titles, one line per check, the last line.

A demo counts its checks in a :class:`Checks`, prints ``== title`` before each
step (:func:`section`) and ends with :func:`finish`, whose value is the exit
status: non-zero when a check failed.
"""

from __future__ import annotations

import time


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        mark = "ok  " if ok else "FAIL"
        print(f"  [{mark}] {what}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def finish(checks: Checks, started: float) -> int:
    """The demo's last line and exit status (non-zero when a check failed)."""
    took = time.monotonic() - started
    if checks.failed:
        print(f"\ndemo: {len(checks.failed)} check(s) FAILED: {'; '.join(checks.failed)}")
        return 1
    print(f"\ndemo: all {checks.passed} checks passed in {took:.1f}s")
    return 0

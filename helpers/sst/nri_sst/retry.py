"""Waiting for a pod to become one a process can work in: bounded backoff,
and the line that says what is wrong, repeated rarely.

A path the pod lacks (a socket directory not shared, sysfs not mounted, a
read-only state directory) is a mistake in the pod's spec, not a reason to
exit: an exiting container is restarted by the kubelet, crash-looping with a
traceback in its log each time, which buries the one line that says what to
change. So the helper and the plugin stay up, try again after a delay that
doubles up to a bound (:class:`Backoff`), and log the problem once when it
starts and then rarely while it lasts (:class:`Reporter`: attempts 1, 2, 4,
8, ... and every :data:`REPEAT_EVERY`-th), so that the log shows the problem
near its end without a line per attempt. Each attempt logs at debug level.

The helper's package is the one both images hold, so this is its one home:
the plugin's start-up (:mod:`nri_framework.startup`) uses it too.
"""

from __future__ import annotations

import logging

import msgspec

#: Past the powers of two, the line is repeated every this many attempts of
#: one problem (about 10 minutes at the default maximum delay of 10 s).
REPEAT_EVERY = 64


class Obstacle(msgspec.Struct, frozen=True):
    """Why a process cannot work in this pod, as its one line: ``path`` is
    ``problem``; ``fix`` names what to change (the chart's value or volume)."""

    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path} {self.problem}: {self.fix}"


def worth_reporting(attempt: int) -> bool:
    """Whether the ``attempt``-th failure (1-based) of one problem is logged."""
    return attempt > 0 and (attempt & (attempt - 1) == 0 or attempt % REPEAT_EVERY == 0)


class Backoff:
    """Delays between attempts: ``initial`` seconds, doubling up to ``maximum``.

    A plain class, not a dataclass: building a dataclass runs the code it
    generates (~0.5 ms of every start, with the import of :mod:`dataclasses`)."""

    __slots__ = ("delay", "initial", "maximum")

    def __init__(self, initial: float = 0.5, maximum: float = 10.0) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(
                f"invalid retry interval {initial:g}:{maximum:g}: want 0 < INITIAL <= MAX seconds"
            )
        self.initial = initial
        self.maximum = maximum
        self.delay = initial

    def __repr__(self) -> str:
        return f"Backoff(initial={self.initial!r}, maximum={self.maximum!r}, delay={self.delay!r})"

    @classmethod
    def parse(cls, text: str) -> Backoff:
        """``"INITIAL[:MAX]"`` seconds (MAX defaults to 20 * INITIAL, at least INITIAL)."""
        first, _, second = text.partition(":")
        try:
            initial = float(first)
            maximum = float(second) if second else max(initial, 20 * initial)
        except ValueError:
            raise ValueError(
                f"invalid retry interval {text!r}: want INITIAL[:MAX] seconds"
            ) from None
        return cls(initial, maximum)

    def next(self) -> float:
        """The delay before the next attempt (and double the one after)."""
        delay = self.delay
        self.delay = min(delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.delay = self.initial


class Reporter:
    """Logs a problem's line at its first attempt and rarely after.

    ``grace``: failed attempts not logged at all (a socket that a sidecar
    starting alongside creates in a moment)."""

    def __init__(self, log: logging.Logger, level: int = logging.ERROR, grace: int = 0) -> None:
        self.log = log
        self.level = level
        self.grace = grace
        self.line = ""
        self.attempts = 0

    def failed(self, line: str) -> None:
        """Attempt failed because of ``line`` (a new line starts the count anew)."""
        if line != self.line:
            self.line = line
            self.attempts = 0
        self.attempts += 1
        n = self.attempts - self.grace
        if worth_reporting(n):
            self.log.log(self.level, "%s", line if n == 1 else f"{line} (attempt {n})")

    def cleared(self, what: str) -> None:
        """The problem is gone (logged when it had been reported)."""
        if self.line and self.attempts > self.grace:
            self.log.info("%s", what)
        self.line = ""
        self.attempts = 0

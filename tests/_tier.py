"""What a test tier does when it cannot set itself up: skip loudly, or fail under CI.

One home for the rule that CI hides no tier: a tier (or one check) that needs
root, a Debian package or a build calls :func:`unavailable` when it cannot have
it. Outside CI that is a skip with a loud message (a developer without root can
still run the rest); under CI (``CI=true``, as ``.ci/run`` is started) or when
the tier's own ``*_REQUIRED=1`` variable is set, it is a failure, so a green CI
means the tier ran.

The loud messages are collected and repeated at the end of the run by
:func:`summary` (call it from the tier's ``pytest_terminal_summary``).

Stdlib + pytest only; the modules that use it put ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import pytest

_LOUD: list[str] = []


def required(variable: str | None = None) -> bool:
    """True when a missing prerequisite must fail: under CI, or ``variable=1``."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return True
    return bool(variable) and os.environ.get(variable or "") == "1"


def unavailable(tier: str, reason: str, variable: str | None = None) -> NoReturn:
    """The tier ``tier`` cannot run for ``reason``: fail if :func:`required`, else skip.

    ``variable``: the tier's own switch (e.g. ``NRI_K8S_REQUIRED``) that makes
    the prerequisite required outside CI too.
    """
    reason = reason if len(reason) < 3000 else reason[:1000] + "\n...\n" + reason[-2000:]
    if required(variable):
        why = "CI=true" if os.environ.get("CI") else f"{variable}=1"
        msg = f"{tier.upper()} FAILED ({why}): {reason}"
        print(f"\n{'!' * 20} {msg}", file=sys.stderr)
        _LOUD.append(msg)
        pytest.fail(msg, pytrace=False)
    msg = f"{tier.upper()} SKIPPED: {reason}"
    print(f"\n{'!' * 20} {msg}", file=sys.stderr)
    _LOUD.append(msg)
    pytest.skip(msg)


def summary(terminalreporter: Any) -> None:
    """Repeat every loud skip/failure of this run at its end (first line of each)."""
    for msg in dict.fromkeys(_LOUD):
        terminalreporter.write_sep("!", msg.splitlines()[0][:200], red=True, bold=True)

"""The hook contract itself: what ``hookspecs`` depends on at run time."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from nri_framework import hookspecs


def test_hookspecs_imports_no_part_of_the_host() -> None:
    """The contract names the host, its metrics and the stub only under
    ``TYPE_CHECKING``: importing it loads none of them (a fresh interpreter,
    so that no other test's imports count)."""
    code = (
        "import json, sys\n"
        "import nri_framework.hookspecs\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('nri_framework'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    loaded = set(json.loads(out))
    assert "nri_framework.hookspecs" in loaded
    for module in ("host", "instrumentation", "stub", "contract"):
        assert f"nri_framework.{module}" not in loaded, module


def specs() -> dict[str, dict[str, Any]]:
    """Hook name -> its ``@hookspec`` options."""
    marker = f"{hookspecs.PROJECT}_spec"
    return {
        name: getattr(fn, marker)
        for name, fn in vars(hookspecs).items()
        if callable(fn) and hasattr(fn, marker)
    }


def test_every_firstresult_hook_is_a_decision_hook() -> None:
    """Only the policy answers a ``firstresult`` hook: pluggy would otherwise
    take the last registered observer's answer."""
    all_specs = specs()
    firstresult = {name for name, opts in all_specs.items() if opts.get("firstresult")}
    assert firstresult <= hookspecs.DECISION_HOOKS
    assert set(all_specs) >= hookspecs.DECISION_HOOKS
    for name in firstresult:
        doc = getattr(hookspecs, name).__doc__
        assert "Stops at the first non-None result" in " ".join(doc.split()), name

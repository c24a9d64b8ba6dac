"""The hook contract itself: what ``hookspecs`` depends on at run time."""

from __future__ import annotations

import json
import subprocess
import sys


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

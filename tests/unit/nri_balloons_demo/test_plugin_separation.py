"""The plugin package carries no test harness: nothing that ``nri_balloons``
imports, directly or through the framework, at module level or inside a
function, reaches the demos, the runtime simulator or the SST helper's server
side (read from the source: :mod:`_imports`)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[2]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

import _imports  # noqa: E402

HARNESS = (
    "nri_balloons_demo",
    "nri_framework.simulate",
    "nri_sst.handler",
    "nri_sst.server",
    "nri_sst.backends",
)


def is_harness(module: str) -> bool:
    return any(module == h or module.startswith(h + ".") for h in HARNESS)


def test_nri_balloons_reaches_no_demo_simulator_or_helper_server() -> None:
    reached = _imports.closure(_imports.modules_of("nri_balloons"))
    assert {m: by for m, by in reached.items() if is_harness(m)} == {}


def test_the_demo_package_is_what_reaches_them() -> None:
    """The check sees function-local and guarded imports: the demos do reach
    the simulator and the helper's handler."""
    reached = _imports.closure(_imports.modules_of("nri_balloons_demo"))
    assert {"nri_framework.simulate.runtime", "nri_sst.handler", "nri_sst.backends.sim"} <= set(
        reached
    )
    local = [i.module for i in _imports.imports("nri_framework.cli") if i.optional]
    assert "nri_framework.simulate.scenario" in local

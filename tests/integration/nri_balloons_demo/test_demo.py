"""The README's main job: ``nri-resource-policy demo`` runs the spec's
walkthrough (pct-managed by default) and the other demos as a user runs them,
as a subprocess; each demo checks the spec's expectations itself and exits
non-zero when one fails."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run_demo(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "nri_framework", "demo", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc.stdout


def test_default_demo_is_the_spec_walkthrough() -> None:
    out = run_demo()
    # the spec's order: step 4 lines, 6.1, 6.5, 6.3, 6.4, 7, 8, 9.1, 9.2
    steps = [
        "== 4.",
        "== 5.",
        "== 6.1",
        "== 6.5",
        "== 6.2",
        "== 6.3",
        "== 6.4",
        "== 7.",
        "== 8.",
        "== 9.1",
        "== 9.2",
    ]
    positions = [out.index(s) for s in steps]
    assert positions == sorted(positions)
    assert "pct: mode=managed, 2 PCT cpuClass(es), 4 punit(s) across 2 package(s)" in out
    assert "pct: programmed CLOS 0 min=2300000 max=4600000 kHz" in out
    assert "pct: fallback CLOS for non-PCT CPUs set to 3 (LP)" in out
    assert "[hp-1]" in out and "threads=2 events_per_sec=" in out and "(simulated)" in out
    assert "[hp-on-lp]" in out
    # step 7 without privileged pods: the plugin's own figures, beside the reporters
    step7 = out[out.index("== 7.") : out.index("== 8.")]
    assert 'nri_policy_balloons_busy_mhz{balloon="hp-bln[0]"' in step7
    assert 'source="sim"} 2300   (simulated)' in step7  # lp-bln[0], capped at base
    assert "[ok  ] the plugin's busy MHz: every HP balloon above the LP balloon" in step7
    assert "speed-select-turbo-freq:disabled" in out
    assert "FAILED" not in out and "demo: all " in out


@pytest.mark.parametrize("scenario", ["pct-assoc-only", "balloons", "pinner"])
def test_other_demos(scenario: str) -> None:
    out = run_demo(scenario)
    assert "demo: all " in out and "FAILED" not in out

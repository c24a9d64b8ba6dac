"""The demo's packaged YAML (nri_balloons_demo/data/pct_managed, what the installed
demo reads) is the operator's copy-paste material in examples/pct-managed."""

from __future__ import annotations

from pathlib import Path

from nri_balloons_demo.data import pods_dir

EXAMPLES = Path(__file__).parents[3] / "examples" / "pct-managed"


def test_packaged_demo_files_match_the_examples() -> None:
    packaged = {p.name: p.read_bytes() for p in pods_dir().glob("*.yaml")}
    examples = {p.name: p.read_bytes() for p in EXAMPLES.glob("*.yaml")}
    assert packaged == examples
    assert "pod-hp-on-lp.yaml" in packaged  # spec step 8

"""The demo's packaged YAML (nri_balloons/demos/pct_managed, what the installed
demo reads) is the operator's copy-paste material in examples/pct-managed."""

from __future__ import annotations

from pathlib import Path

from nri_balloons.demo import pods_dir

EXAMPLES = Path(__file__).parents[3] / "examples" / "pct-managed"


def test_packaged_demo_files_match_the_examples() -> None:
    packaged = {p.name: p.read_bytes() for p in pods_dir().glob("*.yaml")}
    examples = {p.name: p.read_bytes() for p in EXAMPLES.glob("*.yaml")}
    assert packaged == examples
    assert "pod-hp-on-lp.yaml" in packaged  # spec step 8


def test_hp_on_lp_pod_is_the_spec_step_8_heredoc() -> None:
    import pytest

    spec_file = Path("/work/shared/spec/000_c5e1eb908c53c331.txt")
    if not spec_file.exists():
        pytest.skip("the spec is not on this machine")
    spec = spec_file.read_text()
    start = spec.index("cat > pod-hp-on-lp.yaml <<EOF\n") + len("cat > pod-hp-on-lp.yaml <<EOF\n")
    heredoc = spec[start : spec.index("\nEOF\n", start) + 1]
    assert (EXAMPLES / "pod-hp-on-lp.yaml").read_text() == heredoc

"""``nri-resource-policy demo``'s choice of demo: entry points as the installed
metadata lists them (real :class:`importlib.metadata.EntryPoint` objects on our
own modules), the default being the one marked with :func:`harness.default`."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
from nri_balloons_demo import harness

GROUP = harness.DEMO_GROUP


def ep(name: str, value: str) -> EntryPoint:
    return EntryPoint(name, value, GROUP)


def test_the_installed_demos_and_their_default() -> None:
    demos = harness.demo_entry_points()
    assert {"pct-managed", "pct-assoc-only", "balloons", "pinner"} <= set(demos)
    assert harness.default_demo(demos) == "pct-managed"


def test_default_is_the_marked_one_not_the_first_by_name() -> None:
    demos = {
        "aaa": ep("aaa", "nri_balloons_demo.balloons:main"),
        "zzz": ep("zzz", "nri_balloons_demo.pct_managed:main"),
    }
    assert harness.default_demo(demos) == "zzz"


def test_without_a_mark_the_first_by_name_and_a_broken_demo_is_skipped() -> None:
    demos = {
        "b": ep("b", "nri_balloons_demo.pinner:main"),
        "a": ep("a", "nri_balloons_demo.no_such_module:main"),
    }
    assert harness.default_demo(demos) == "a"
    assert harness.default_demo({}) is None


def test_list_marks_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "pct-managed (default)" in lines
    assert {"balloons", "pct-assoc-only", "pinner"} <= set(lines)


def test_a_demo_gets_its_name_and_the_arguments_after_it() -> None:
    args = harness.demo_arguments(
        ["pinner", "--cpus", "4", "--keep"],
        None,
        lambda p: p.add_argument("--cpus", type=int, default=8),
    )
    assert (args.scenario, args.cpus, args.keep) == ("pinner", 4, True)


def test_an_unknown_demo_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        harness.main(["no-such-demo"])
    assert exc.value.code == 2
    assert "invalid choice: 'no-such-demo'" in capsys.readouterr().err

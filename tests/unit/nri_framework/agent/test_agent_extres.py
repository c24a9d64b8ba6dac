"""Extended resources: the diff of Node ``status.capacity`` against the policy's
desired map (reference §13.5) and the desired map the agent builds."""

from __future__ import annotations

import pytest
from nri_framework.agent.extres import ExtendedResources, glob_regex, may_touch, plan

CAPACITY = {
    "cpu": "8",
    "memory": "16Gi",
    "cpuclass.balloons.nri.io/hp-pct": "4",
    "cpuclass.balloons.nri.io/x": "1",
    "example.com/not-owned": "3",
}
OWNED = "cpuclass.balloons.nri.io/*"


def test_guard() -> None:
    assert may_touch("cpuclass.balloons.nri.io/hp")
    assert may_touch("a.nri.io/b")
    assert not may_touch("nri.io/x")  # "*." needs the dot
    assert not may_touch("example.com/not-owned")
    assert not may_touch("cpuclass.balloons.nri.io/a/b")
    assert not may_touch("cpu")


def test_glob_does_not_cross_slashes() -> None:
    g = glob_regex(OWNED)
    assert g.match("cpuclass.balloons.nri.io/hp-pct")
    assert not g.match("cpuclass.balloons.nri.io/a/b")
    assert not g.match("other.nri.io/hp")
    assert glob_regex("a.b/c").match("a.b/c") and not glob_regex("a.b/c").match("aXb/c")


def test_publish_update_and_remove_orphans() -> None:
    p = plan(
        CAPACITY,
        {OWNED: None, "cpuclass.balloons.nri.io/hp-pct": 2, "cpuclass.balloons.nri.io/lp-pct": 96},
    )
    assert p.capacity == {
        "cpuclass.balloons.nri.io/hp-pct": "2",
        "cpuclass.balloons.nri.io/lp-pct": "96",
        "cpuclass.balloons.nri.io/x": None,
    }
    assert p.patch == {"status": {"capacity": p.capacity}}
    assert p.published == {
        "cpuclass.balloons.nri.io/hp-pct": "2",
        "cpuclass.balloons.nri.io/lp-pct": "96",
    }
    assert p.removed == ["cpuclass.balloons.nri.io/x"]
    assert p.refused == []


def test_nothing_to_do_when_in_sync() -> None:
    p = plan(
        CAPACITY,
        {OWNED: None, "cpuclass.balloons.nri.io/hp-pct": 4, "cpuclass.balloons.nri.io/x": 1},
    )
    assert p.capacity == {} and p.published == {} and p.removed == []


def test_ownership_alone_removes_the_whole_domain_but_nothing_else() -> None:
    p = plan(CAPACITY, {OWNED: None})
    assert p.capacity == {
        "cpuclass.balloons.nri.io/hp-pct": None,
        "cpuclass.balloons.nri.io/x": None,
    }
    assert "example.com/not-owned" not in p.capacity


def test_without_ownership_unmentioned_keys_stay() -> None:
    p = plan(CAPACITY, {"cpuclass.balloons.nri.io/hp-pct": 4})
    assert p.capacity == {}


def test_exact_removal_and_missing_keys() -> None:
    p = plan(CAPACITY, {"cpuclass.balloons.nri.io/x": None, "cpuclass.balloons.nri.io/gone": None})
    assert p.capacity == {"cpuclass.balloons.nri.io/x": None}
    assert p.removed == ["cpuclass.balloons.nri.io/x"]


def test_the_guard_refuses_foreign_names() -> None:
    p = plan(
        CAPACITY,
        {
            "example.com/not-owned": None,
            "example.com/*": None,
            "example.com/new": 1,
            "cpuclass.balloons.nri.io/*": 3,
        },
    )
    assert p.capacity == {}
    must = 'name does not match "*.nri.io/*"'
    assert p.refused == [
        f'refusing to remove extended resource "example.com/not-owned": {must}',
        f'refusing to remove extended resource "example.com/*": {must}',
        f'refusing to publish extended resource "example.com/new": {must}',
        'ignoring extended resource "cpuclass.balloons.nri.io/*": wildcards are only allowed on '
        "owned (nil-valued) keys",
    ]


@pytest.mark.parametrize(("count", "text"), [(0, "0"), (32, "32"), (1000, "1k"), (1500, "1500")])
def test_counts_are_kubernetes_quantities(count: int, text: str) -> None:
    p = plan({}, {"cpuclass.balloons.nri.io/hp": count})
    assert p.capacity == {"cpuclass.balloons.nri.io/hp": text}
    # the API server's canonical form reads back as equal: no patch on the next round
    assert (
        plan({"cpuclass.balloons.nri.io/hp": text}, {"cpuclass.balloons.nri.io/hp": count}).capacity
        == {}
    )


def reconciler(answer: dict[str, int | None] | None) -> ExtendedResources:
    return ExtendedResources(node="n1", client=None, io=None, desired=lambda: answer)  # type: ignore[arg-type]


def test_desired_while_a_configuration_is_in_force() -> None:
    r = reconciler({OWNED: None, "cpuclass.balloons.nri.io/hp": 2})
    r.in_force = True
    assert r.desired() == {OWNED: None, "cpuclass.balloons.nri.io/hp": 2}


def test_desired_after_the_configuration_is_gone_keeps_only_removals() -> None:
    r = reconciler({OWNED: None, "cpuclass.balloons.nri.io/hp": 2})
    r.in_force = False
    r.published = {"cpuclass.balloons.nri.io/hp", "other.nri.io/y"}
    assert r.desired() == {OWNED: None, "cpuclass.balloons.nri.io/hp": None, "other.nri.io/y": None}


def test_desired_removes_what_this_process_published_when_no_longer_stated() -> None:
    r = reconciler(None)
    r.in_force = True
    r.published = {"cpuclass.balloons.nri.io/hp"}
    assert r.desired() == {"cpuclass.balloons.nri.io/hp": None}


def test_desired_survives_a_failing_policy() -> None:
    def boom() -> dict[str, int | None]:
        raise RuntimeError("boom")

    r = ExtendedResources(node="n1", client=None, io=None, desired=boom)  # type: ignore[arg-type]
    r.in_force = True
    assert r.desired() == {}

"""Upstream e2e balloons/n4c16/test11-match-expression (match-config.yaml):
a type matched by ``pod/labels/app.kubernetes.io/component``, and
``preserve.matchExpressions`` on container names leaving them unpinned."""

from __future__ import annotations

from balloons_e2e import node

TEST = "test11-match-expression"


async def test_match_expression() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: the precious workload -> special (2 CPUs)
        await n.create("pod0.yaml")
        assert len(n.cpus("pod0c0")) == 2
        assert n.balloon("pod0c0") == "special[0]"
        # pod1: an ordinary workload -> default (maxCPUs 1)
        await n.create("pod1.yaml")
        assert len(n.cpus("pod1c0")) == 1
        assert n.balloon("pod1c0").startswith("default[")
        # pod2: pod2c1 and pod2c2 match preserve: all 16 CPUs
        await n.create("pod2.yaml")
        assert len(n.cpus("pod2c0")) == 1
        assert len(n.cpus("pod2c1")) == 16
        assert len(n.cpus("pod2c2")) == 16
        assert len(n.cpus("pod2c3")) == 1

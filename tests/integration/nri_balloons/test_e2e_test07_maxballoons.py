"""Upstream e2e balloons/n4c16/test07-maxballoons: maxBalloons and maxCPUs
exhaustion fail the pod with ``no suitable balloon instance available``;
``minBalloons > maxBalloons`` keeps the plugin from starting."""

from __future__ import annotations

from balloons_e2e import disjoint, node, start_failure

TEST = "test07-maxballoons"
NO_BALLOON = "no suitable balloon instance available"


async def test_maxballoons() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: 1500/2000 mCPU of the singleton balloon
        await n.create("pod0.yaml")
        assert len(n.cpus("pod0c0")) == 2
        assert n.balloon("pod0c0") == "singleton[0]"
        # pod1: the remaining 500 mCPU
        await n.create("pod1.yaml")
        assert n.cpus("pod1c0") == n.cpus("pod0c0")
        # pod2: does not fit in the full singleton, which may not have a twin
        await n.create("pod2-fails.yaml")
        assert NO_BALLOON in n.errors["pod2c0"]
        assert (
            "balloons: balloon allocation for container default/pod2/pod2c0 failed: " + NO_BALLOON
        ) in n.errors["pod2c0"]
        await n.delete("pod2")
        # pod2: the first dynamictwo balloon
        await n.create("pod2.yaml")
        assert len(n.cpus("pod2c0")) == 1
        assert n.balloon("pod2c0") == "dynamictwo[0]"
        # pod3: the second one
        await n.create("pod3.yaml")
        assert disjoint(n.cpus("pod2c0"), n.cpus("pod3c0"))
        assert n.balloon("pod3c0") == "dynamictwo[1]"
        # pod4: no third balloon, but fits in the second (600 + 300 <= 1000)
        await n.create("pod4.yaml")
        assert n.cpus("pod4c0") == n.cpus("pod3c0")
        assert n.balloon("pod4c0") == "dynamictwo[1]"
        # pod5: no new balloon, and neither existing one has 300 mCPU left
        await n.create("pod5.yaml")
        assert NO_BALLOON in n.errors["pod5c0"]
        await n.delete("pod5")


async def test_min_balloons_over_max_balloons_fails_start() -> None:
    output = await start_failure(TEST, "balloons-impossible.yaml")
    assert (
        "balloons: invalid configuration: balloons: MinBalloons (2) > MaxBalloons (1) in "
        'balloon type "impossible"'
    ) in output

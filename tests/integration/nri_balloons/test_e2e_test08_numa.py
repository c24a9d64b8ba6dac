"""Upstream e2e balloons/n4c16/test08-numa: one balloon type for every
namespace with maxCPUs 4 (a NUMA node): fill and inflate one balloon up to
maxCPUs, BestEffort containers still get a CPU, then a new balloon; deflation
as pods are deleted."""

from __future__ import annotations

from balloons_e2e import disjoint, node

TEST = "test08-numa"


async def test_numa() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: BestEffort, still at least 1 CPU
        await n.create("pod0.yaml")
        assert len(n.cpus("pod0c0")) == 1
        # pod1..pod4: 1 CPU each, all in the same balloon (preferNewBalloons: false)
        for i in (1, 2, 3, 4):
            await n.create(f"pod{i}.yaml")
            same = [n.cpus(f"pod{j}c0") for j in range(i + 1)]
            assert all(len(c) == i for c in same), (i, same)
            assert all(c == same[0] for c in same)
        assert len(n.nodes("pod0c0")) == 1  # the 4 CPUs of one NUMA node
        # pod5: BestEffort fits in the full balloon
        await n.create("pod5.yaml")
        assert n.cpus("pod5c0") == n.cpus("pod0c0")
        assert len(n.cpus("pod5c0")) == 4
        assert n.balloon("pod5c0") == "fit-in-numa[0]"
        # pod6: a new balloon
        await n.create("pod6.yaml")
        assert len(n.cpus("pod6c0")) == 1
        assert all(len(n.cpus(f"pod{j}c0")) == 4 for j in range(6))
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod6c0"))
        assert n.balloon("pod6c0") == "fit-in-numa[1]"

        # one Guaranteed container left in the first balloon: it deflates
        await n.delete("pod1", "pod2", "pod3")
        for c in ("pod0c0", "pod4c0", "pod5c0", "pod6c0"):
            assert len(n.cpus(c)) == 1
        assert n.cpus("pod0c0") == n.cpus("pod4c0") == n.cpus("pod5c0")
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod6c0"))

        # only BestEffort containers left: they still have a CPU
        await n.delete("pod4")
        for c in ("pod0c0", "pod5c0", "pod6c0"):
            assert len(n.cpus(c)) == 1
        assert n.cpus("pod0c0") == n.cpus("pod5c0")
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod6c0"))

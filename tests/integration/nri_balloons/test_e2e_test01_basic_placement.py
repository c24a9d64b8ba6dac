"""Upstream e2e balloons/n4c16/test01-basic-placement (helm-config.yaml):
kube-system on the reserved balloon, containers of a pod sharing a balloon,
preferNewBalloons, minCPUs sizing, the hide-hyperthreads annotation per
container, preferSpreadingPods, and BestEffort containers spreading over new
then existing balloons.

Skipped: the legacy ``control.cpu.classes`` frequencies (cpuClass work item).
"""

from __future__ import annotations

from balloons_e2e import Node, disjoint, node

TEST = "test01-basic-placement"


async def cleanup(n: Node) -> None:
    await n.delete_all()


def union(n: Node, prefix: str) -> set[int]:
    return set().union(*(c for name, c in n.all_cpus().items() if name.startswith(prefix)))


async def test_basic_placement() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: kube-system runs on the reserved CPUs (availableResources 1-15,
        # reservedResources 1 CPU)
        await n.create("pod0.yaml")
        assert n.cpus("pod0c0") == n.cpus("pod0c1")
        assert len(n.cpus("pod0c0")) == 1
        assert n.balloon("pod0c0") == "reserved[0]"
        assert 0 not in n.cpus("pod0c0")

        # pod1: both containers in one two-cpu balloon
        await n.create("pod1.yaml")
        assert n.cpus("pod1c0") == n.cpus("pod1c1")
        assert len(n.cpus("pod1c0")) == 2
        assert n.balloon("pod1c0") == n.balloon("pod1c1") == "two-cpu[0]"

        # pod2: preferNewBalloons -> another two-cpu balloon
        await n.create("pod2.yaml")
        assert len(n.cpus("pod2c0")) == 2
        assert disjoint(n.cpus("pod2c0"), n.cpus("pod1c0"))
        assert n.balloon("pod2c0") == "two-cpu[1]"

        # pod3: namespace "three" -> one three-cpu balloon fits both containers
        await n.create("pod3.yaml")
        assert n.cpus("pod3c0") == n.cpus("pod3c1")
        assert len(n.cpus("pod3c0")) == 3
        assert n.balloon("pod3c0") == n.balloon("pod3c1") == "three-cpu[0]"
        await cleanup(n)

        # pod4: two containers (3+3 CPUs) fill four-cpu[0] up to 6 CPUs, the
        # third goes to a new four-cpu balloon; pod4c1 sees one thread per core
        await n.create("pod4.yaml")
        assert n.cpus("pod4c1") <= n.cpus("pod4c0")
        assert disjoint(n.cpus("pod4c2"), n.cpus("pod4c0"))
        assert len(n.cpus("pod4c0")) == 6
        assert len(n.cpus("pod4c1")) == 3
        assert len(n.cpus("pod4c2")) == 4
        assert n.balloon("pod4c0") == n.balloon("pod4c1") == "four-cpu[0]"
        assert n.balloon("pod4c2") == "four-cpu[1]"
        await cleanup(n)

        # pod5: preferSpreadingPods -> one five-cpu balloon per container
        await n.create("pod5.yaml")
        assert disjoint(n.cpus("pod5c0"), n.cpus("pod5c1"), n.cpus("pod5c2"))
        for c in ("pod5c0", "pod5c1", "pod5c2"):
            assert len(n.cpus(c)) == 2
        assert {n.balloon(f"pod5c{i}") for i in range(3)} == {
            "five-cpu[0]",
            "five-cpu[1]",
            "five-cpu[2]",
        }

        # pod6: BestEffort containers get new 1-CPU balloons
        await n.create("pod6.yaml")
        pod6 = [n.cpus(f"pod6c{i}") for i in range(4)]
        assert {len(c) for c in pod6} == {1}
        assert disjoint(*pod6)
        assert disjoint(union(n, "pod6c"), union(n, "pod5c"))

        # pod7: no CPUs left for new balloons: spread evenly over the pod6
        # balloons (1000 mCPU free each), not the pod5 ones (750 mCPU free)
        await n.create("pod7.yaml")
        pod7 = [n.cpus(f"pod7c{i}") for i in range(4)]
        assert {len(c) for c in pod7} == {1}
        assert disjoint(*pod7)
        assert max(len(c) for c in n.all_cpus().values()) == 2
        assert disjoint(union(n, "pod7c"), union(n, "pod5c"))
        assert {n.balloon(f"pod7c{i}") for i in range(4)} == {
            n.balloon(f"pod6c{i}") for i in range(4)
        }
        await cleanup(n)

"""Upstream e2e balloons/n6-hbm-cxl/test01-memory-types: on a machine with DRAM
(nodes 0, 1), HBM (2, 3) and PMEM (4, 5) nodes, the ``memory-type`` annotation
(hbm / dram / pmem and their combinations) picks each container's memory nodes
next to its CPUs' package, overriding its balloon type's ``memoryTypes`` for
that container only; a type without ``memoryTypes`` gets the DRAM of its CPUs;
``pinMemory: false`` sets no memory nodes (the container keeps all of them)."""

from __future__ import annotations

from balloons_e2e import node

TEST = "n6-test01-memory-types"
# py_consts.var.py
DRAM0, DRAM1, HBM0, HBM1, PMEM0, PMEM1 = range(6)


async def test_memory_types() -> None:
    async with node(TEST, "balloons.yaml", topology="n6-hbm-cxl") as n:
        # pod0: all memory combinations when there is enough memory
        await n.create("pod0.yaml")
        assert not n.errors, n.errors

        def by_package(name: str, pkg0: set[int], pkg1: set[int]) -> bool:
            return n.mems(name) == (pkg0 if n.packages(name) == {"package0"} else pkg1)

        assert by_package("pod0c0", {HBM0}, {HBM1})
        assert by_package("pod0c1", {DRAM0}, {DRAM1})
        assert by_package("pod0c2", {PMEM0}, {PMEM1})
        assert by_package("pod0c3", {HBM0, DRAM0}, {HBM1, DRAM1})
        assert by_package("pod0c4", {DRAM0, PMEM0}, {DRAM1, PMEM1})
        assert by_package("pod0c5", {HBM0, DRAM0, PMEM0}, {HBM1, DRAM1, PMEM1})
        # pod0c6 shares pod0c0's type, without its annotation: the type's memoryTypes
        assert by_package("pod0c6", {HBM0, PMEM0}, {HBM1, PMEM1})
        assert by_package("pod0c7", {DRAM0}, {DRAM1})
        assert n.mems("pod0c8") == {DRAM0, DRAM1, HBM0, HBM1, PMEM0, PMEM1}
        # each container is on one package, as upstream's checks assume
        for i in range(8):
            assert len(n.packages(f"pod0c{i}")) == 1, (i, n.cpus(f"pod0c{i}"))
        assert n.balloon("pod0c0").startswith("mem-types[")
        assert n.balloon("pod0c6").startswith("mem-types[")
        assert n.balloon("pod0c8") == "no-pin-mem[0]"
        await n.delete_all()

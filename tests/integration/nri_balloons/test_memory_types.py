"""Memory types the node does not have, and a malformed ``memory-type``
annotation (not an upstream test): on n4c16 (DRAM only) a balloon type asking
for HBM and containers asking for HBM/PMEM, or for an unknown type, are all
created, on the DRAM node of their CPUs; the plugin warns naming the missing
types and logs upstream's error for the malformed annotation."""

from __future__ import annotations

from balloons_e2e import node

TEST = "memory-types-missing"


async def test_missing_and_invalid_types_leave_creation_alone() -> None:
    async with node(TEST, "balloons.yaml") as n:
        await n.create("pod0.yaml")
        assert not n.errors, n.errors
        for name in ("pod0c0", "pod0c1", "pod0c2"):
            (dram,) = {int(x.removeprefix("node")) for x in n.nodes(name)}
            assert n.mems(name) == {dram}, name
        out = n.plugin.output()
        assert "container default/pod0/pod0c0: memory type(s) HBM not present" in out
        assert "container default/pod0/pod0c1: memory type(s) PMEM,HBM not present" in out
        assert (
            'container default/pod0/pod0c2 has invalid effective "memory-type.resource-policy'
            '.nri.io" annotation ("xpoint"): libmem: invalid type: "xpoint"'
        ) in out

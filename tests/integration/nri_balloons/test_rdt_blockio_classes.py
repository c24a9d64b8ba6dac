"""RDT and block I/O classes through the runtime simulator (as containerd 1.7, NRI
0.6.1): the balloons plugin's CreateContainer adjustment carries ``rdt_class`` and
``blockio_class``, and the runtime's container keeps them. Upstream's e2e suite has
no test of its own for these classes; the expectations are upstream's resmgr's
(annotation scoping, the pod QoS class as the default, nothing when disabled)."""

from __future__ import annotations

from balloons_e2e import node

TEST = "rdt-blockio-classes"


async def test_classes_reach_the_runtime() -> None:
    async with node(TEST, "balloons.yaml") as n:
        await n.create("pods.yaml")

        def got(name: str) -> tuple[str | None, str | None]:
            res = n.rt.container(n.ids[name][1]).resources
            assert res is not None
            return res.rdt_class, res.blockio_class

        assert n.errors == {}  # the malformed annotation fails nothing
        assert got("writer") == ("gold", "slowwriter")
        assert got("reader") == ("gold", None)  # the block I/O class is the writer's
        assert got("besteffort") == ("BestEffort", None)  # rdt: the pod QoS default
        assert got("bad") == ("Guaranteed", None)
        await n.plugin.wait_output("invalid block I/O class annotation", timeout=5)

        # disabled: new containers get no class (upstream's warning for annotated ones)
        await n.delete_all()
        await n.reload("balloons-disabled.yaml")
        await n.create("pods.yaml")
        assert {name: got(name) for name in ("writer", "reader", "besteffort")} == {
            "writer": (None, None),
            "reader": (None, None),
            "besteffort": (None, None),
        }
        await n.plugin.wait_output("RDT class control disabled, omitting class gold", timeout=5)

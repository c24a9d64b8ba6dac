"""Memory capacity accounting through the real plugin (not an upstream test):
on n6-hbm-cxl (HBM nodes 2 and 3, 1 GiB each) one balloon whose containers want
HBM. A container whose memory limit does not fit its HBM node spills to the
next HBM node by distance; one that overcommits the node moves a smaller
container there (its ``cpuset.mems`` updated in the runtime); a deleted
container's memory is free again; a zone is kept from its last allocation (it
never shrinks back) and across a SIGKILL restart of the plugin."""

from __future__ import annotations

import re

from balloons_e2e import Node, node, plugin_command
from nri_framework.simulate.scenario import PluginProcess, wait_registered

TEST = "n6-memory-zones"
HBM0, HBM1 = 2, 3


def own_hbm(n: Node, name: str) -> int:
    """The HBM node next to the package of ``name``'s CPUs."""
    return HBM0 if n.packages(name) == {"package0"} else HBM1


async def restart(n: Node) -> None:
    """SIGKILL the plugin and start a new one on the same state directory."""
    n.plugin.kill()
    await n.plugin.stop()
    state = n.host_root.parent / "state"
    n.plugin = await PluginProcess.launch(
        plugin_command(n.rt.socket_path, n.host_root, state, n.config)
    )
    await wait_registered(n.rt, n.plugin, 10)
    await n.plugin.wait_output("synchronized", timeout=10)


async def test_limits_spill_move_free_and_survive_a_restart() -> None:
    async with node(TEST, "balloons.yaml", topology="n6-hbm-cxl") as n:
        # 1500M does not fit a 1 GiB HBM node: the next HBM node by distance joins
        await n.create("pod0.yaml")
        assert not n.errors, n.errors
        assert n.mems("pod0c0") == {HBM0, HBM1}
        await n.delete("pod0")

        await n.create("pod1.yaml")  # 300M
        own = own_hbm(n, "pod1c0")
        assert n.mems("pod1c0") == {own}
        # 300M + 800M overcommit the node: the smaller one moves, updated in place
        await n.create("pod2.yaml")
        assert own_hbm(n, "pod2c0") == own  # the same balloon
        assert n.mems("pod2c0") == {own}
        assert n.mems("pod1c0") == {HBM0, HBM1}

        # pod2's 800M are free again once it is gone: another 800M fits the node
        await n.delete("pod2")
        await n.create("pod3.yaml")
        assert n.mems("pod3c0") == {own}
        await n.delete("pod3")
        # pod1's zone is kept from its last allocation: alone, it stays on both
        assert n.mems("pod1c0") == {HBM0, HBM1}

        await restart(n)
        assert not any(re.search("assigning container", line) for line in n.plugin.tail)
        assert n.mems("pod1c0") == {HBM0, HBM1}
        await n.create("pod4.yaml")  # 800M: pod1 is not on the node alone
        assert n.mems("pod4c0") == {own}
        assert n.mems("pod1c0") == {HBM0, HBM1}
        await n.delete_all()
        await n.plugin.stop()  # node() stops the plugin it started, not this one

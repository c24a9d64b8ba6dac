"""Upstream e2e balloons/n6-hbm-cxl/test04-nrt: the NodeResourceTopology zones of
two pre-created ``fullsocket`` balloons (one per package, shared idle CPUs in the
package) and of the reserved balloon, then the container subzones
(``showContainersInNrt``): capacity is the CPU limit or the allowed CPUs,
allocatable the request, available 0, ``memory set`` the container's memory
nodes (the DRAM of its package; empty when its memory is preserved); a
CPU-preserved container is in no balloon and has no subzone.

The zones are read from the real plugin's ``/debug/state`` (what the agent
publishes: the simulator has no NRT agent), on a loopback port."""

from __future__ import annotations

import re
from typing import Any

from balloons_e2e import Node, node
from faults import LISTENING, debug_state

TEST = "n6-test04-nrt"


async def nrt(n: Node) -> dict[str, dict[str, Any]]:
    """Zone name -> {"cpu": {capacity, allocatable, available}, attribute: value}."""
    await n.plugin.wait_output("instrumentation HTTP endpoint listening on", timeout=20)
    port = next(int(m.group(1)) for line in n.plugin.tail if (m := LISTENING.search(line)))
    out: dict[str, dict[str, Any]] = {}
    for zone in (await debug_state(port))["zones"]:
        entry: dict[str, Any] = {a["name"]: a["value"] for a in zone.get("attributes") or []}
        for r in zone.get("resources") or []:
            entry[r["name"]] = r
        out[zone["name"]] = entry
    return out


def full(pattern: str, value: str) -> bool:
    """Upstream's ``nrt-verify-zone-attribute`` regex, anchored (a stricter check)."""
    return re.fullmatch(pattern, value) is not None


async def test_nrt() -> None:
    async with node(TEST, "balloons.yaml", "n6-hbm-cxl", ("--metrics-address", "127.0.0.1:0")) as n:
        # The e2e cluster's kube-system pods keep the reserved balloon on its
        # cpuset (minCPUs 0 with a cpuset, reference §20.6): CPU 3 is not idle.
        await n.start_system_pods()
        # zones when the fullsocket balloons hold no containers
        z = await nrt(n)
        assert full("[4567]", z["fullsocket[0]"]["cpuset"])
        assert full("5-7|4,6-7|4-5,7|4-6", z["fullsocket[0]"]["shared cpuset"])
        assert z["fullsocket[0]"]["excess cpus"] == "1000m"
        assert full("0|1", z["fullsocket[1]"]["cpuset"])
        assert full("1-2|0,2", z["fullsocket[1]"]["shared cpuset"])
        assert z["fullsocket[1]"]["excess cpus"] == "1000m"
        assert z["reserved[0]"]["cpuset"] == "3"
        assert z["reserved[0]"]["shared cpuset"] == ""
        assert z["reserved[0]"]["cpu"]["capacity"] == "8"
        assert z["reserved[0]"]["cpu"]["allocatable"] == "6"
        for name in ("fullsocket[0]", "fullsocket[1]"):
            assert (z[name]["cpu"]["allocatable"], z[name]["cpu"]["available"]) == ("4", "4")

        # burstable containers without CPU limits
        await n.create("pod0.yaml")
        assert not n.errors, n.errors
        z = await nrt(n)
        c0 = z["default/pod0/pod0c0"]
        assert (c0["cpu"]["capacity"], c0["cpu"]["allocatable"]) == ("4", "750m")
        assert c0["cpu"]["available"] == "0"
        assert c0["cpuset"] == "4-7"
        assert c0["memory set"] == "1"  # fullsocket's pinMemory: the DRAM of package 1
        assert "default/pod0/pod0c1" not in z  # cpu.preserve: in no balloon
        c2 = z["default/pod0/pod0c2"]
        assert (c2["cpu"]["capacity"], c2["cpu"]["allocatable"]) == ("4", "750m")
        assert c2["memory set"] == ""  # memory.preserve
        assert n.mems("pod0c0") == {1}
        assert n.mems("pod0c2") == set(range(6))  # the runtime's own, untouched

        # burstable containers with CPU limits
        await n.create("pod1.yaml")
        assert not n.errors, n.errors
        z = await nrt(n)
        c = z["default/pod1/pod1c0"]
        assert c["cpu"]["capacity"] == "1500m"  # limit < allowed CPUs
        assert c["cpuset"] == "0-2"  # fullsocket[1]
        assert c["memory set"] == "0"
        await n.delete_all()

"""Upstream's n4c16/test20-config-status, one to one, on the k8s tier's real
API server with the real plugin process (its agent) and the runtime simulator.

Upstream: helm-launch with ``balloons.cfg``; ``kubectl wait`` for the node's
``status`` ``Success``; ``kubectl apply -f broken-balloons-config.yaml``
(minCPUs 33 > maxCPUs 32); ``kubectl wait`` for ``Failure``. Here the
configuration is created in the test's own namespace (no helm; the chart is
rendered and checked in ``tests/chart``), the node is the test's node name,
and both waits and the apply are run with Debian's kubectl, as upstream.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from agent_node import Cluster, eventually, plugin_node

pytestmark = pytest.mark.k8s

DATA = Path(__file__).resolve().parents[1] / "data" / "balloons" / "test20-config-status"


def wait_status(cluster: Cluster, status: str) -> None:
    jsonpath = f"{{.status.nodes['{cluster.node}'].status}}"
    cluster.kubectl.run(
        f"kubectl wait -n {cluster.ns} balloonspolicies/default "
        f'--for=jsonpath="{jsonpath}"="{status}" --timeout=5s'
    )


async def test_config_status(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.stack.create_node, cluster.node)
    good = yaml.safe_load((DATA / "balloons-config.yaml").read_text())
    cluster.create("default", good["spec"])
    async with plugin_node(cluster) as n:
        await eventually(lambda: wait_status(cluster, "Success"), what="initial Success status")

        cluster.kubectl.run(
            f"kubectl apply -n {cluster.ns} -f {DATA / 'broken-balloons-config.yaml'}"
        )
        await eventually(lambda: wait_status(cluster, "Failure"), what="post-update Failure status")
        entry = cluster.entry("default")
        assert entry is not None
        assert "MinCpus (33) > MaxCpus (32) in balloon type" in entry.get("errors", ""), entry
        assert n.plugin.proc.returncode is None  # the running configuration stays

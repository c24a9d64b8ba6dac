"""A hostile BalloonsPolicy from the cluster: the configuration source hands
it to the real balloons policy in a real host, which rejects it with the
position in the custom resource's YAML; the node's status entry says
Failure with that text, and the running configuration stays."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from nri_balloons.plugin import Balloons
from nri_framework.agent.config import ConfigSource
from nri_framework.agent.kube import PolicyResource
from nri_framework.host import PolicyHost
from nri_framework.simulate.sysfs import write_topology


class StatusRecorder:
    """The one API call the source makes here (a stand-in of the API server:
    the k8s tier runs the source against a real one)."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []

    def patch_policy_status(self, namespace: str, name: str, patch: Any) -> Any:
        self.patches.append((name, patch))
        return {}


async def io(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def cr(spec: dict[str, Any], generation: int) -> dict[str, Any]:
    return {
        "apiVersion": "config.nri/v1alpha1",
        "kind": "BalloonsPolicy",
        "metadata": {"name": "default", "namespace": "kube-system", "uid": "u1",
                     "generation": generation},
        "spec": spec,
    }  # fmt: skip


GOOD = {"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "work", "minCPUs": 1}]}


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            {"reservedResources": {"cpu": "cpuset:0-99999999999"}},
            "BalloonsPolicy kube-system/default:8:10: balloons: failed to parse reserved CPU"
            " cpuset '0-99999999999': failed to parse amount '0-99999999999' as cpuset: invalid"
            " cpuset '0-99999999999': id 99999999999 out of range 0-8191",
        ),
        (
            {**GOOD, "balloonTypes": [{"name": "work", "minCPUs": -5}]},
            "BalloonsPolicy kube-system/default:11:14: spec.balloonTypes[0].minCPUs: Invalid"
            " value: -5: spec.balloonTypes[0].minCPUs in body should be greater than or equal to 0",
        ),
        (
            {**GOOD, "balloonTypes": [{"name": "work", "maxCPUs": 10**26}]},
            "BalloonsPolicy kube-system/default:11:14: spec.balloonTypes[0].maxCPUs: Invalid"
            " value: 100000000000000000000000000: spec.balloonTypes[0].maxCPUs in body should be"
            " less than or equal to 8192",
        ),
    ],
)
async def test_hostile_custom_resource_is_a_failure_status(
    tmp_path: Path, spec: dict[str, Any], error: str
) -> None:
    host = PolicyHost("balloons", Balloons(), host_root=str(write_topology(tmp_path, "n4c16")))
    api = StatusRecorder()

    async def apply(text: str, source: str) -> str | None:  # what the agent does
        rejected = await host.try_reconfigure(text, source)
        return None if rejected is None else str(rejected)

    src = ConfigSource(
        node="n1",
        namespace="kube-system",
        group_label="config.nri/group",
        resource=PolicyResource.for_policy("balloons"),
        client=api,  # type: ignore[arg-type]
        io=io,
        apply=apply,
        on_change=lambda spec: None,
    )
    src.on_node("SYNC", [])
    src.on_policies("SYNC", [cr(GOOD, 1)])
    await src.reconcile()
    assert api.patches[-1][1]["status"]["nodes"]["n1"]["status"] == "Success"
    running = host.hook.policy_export_state()

    src.on_policies("MODIFIED", cr(spec, 2))
    await src.reconcile()
    entry = api.patches[-1][1]["status"]["nodes"]["n1"]
    assert (entry["status"], entry["generation"], entry["errors"]) == ("Failure", 2, error)
    assert host.hook.policy_export_state() == running
    host.shutdown()

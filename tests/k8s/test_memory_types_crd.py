"""The chart's CRD rejects a ``memoryTypes`` item that is not DRAM, HBM or PMEM
with upstream's XValidation message, which is also what our stage-1 validation
(:mod:`nri_balloons.crdschema`) reports, against the real API server."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client
from nri_balloons.configyaml import load_policy
from nri_balloons.crdschema import schema_errors
from stack import Stack

pytestmark = pytest.mark.k8s

GROUP, VERSION, PLURAL = "config.nri", "v1alpha1", "balloonspolicies"


@pytest.fixture
def objs(k8s_stack: Stack) -> Iterator[client.CustomObjectsApi]:
    with k8s_stack.api_client() as api:
        yield client.CustomObjectsApi(api)


def test_memory_type_xvalidation(objs: client.CustomObjectsApi) -> None:
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    spec = {"reservedResources": {"cpu": "1000m"}, "balloonTypes": [{"name": "a"}]}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BalloonsPolicy", "metadata": {}}

    spec["balloonTypes"] = [{"name": "a", "memoryTypes": ["HBM", "XPOINT"]}]
    with pytest.raises(client.ApiException) as e:
        objs.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, {**body, "metadata": {"name": "bad"}, "spec": spec}
        )
    assert e.value.status == 422
    ours = schema_errors(load_policy("reservedResources: {cpu: 1000m}\n" + _yaml(spec)).spec)
    assert ours == [
        'spec.balloonTypes[0].memoryTypes[1]: Invalid value: "XPOINT": invalid memory type:'
        " XPOINT, expected DRAM, HBM, or PMEM"
    ]
    assert ours[0] in json.loads(e.value.body)["message"], e.value.body

    spec["balloonTypes"] = [{"name": "a", "memoryTypes": ["HBM", "PMEM", "DRAM"]}]
    objs.create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, {**body, "metadata": {"name": "good"}, "spec": spec}
    )
    objs.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "good")


def _yaml(spec: dict[str, object]) -> str:
    types = spec["balloonTypes"]
    assert isinstance(types, list)
    return "balloonTypes:\n" + "".join(
        f"- {{name: {t['name']}, memoryTypes: [{', '.join(t['memoryTypes'])}]}}\n" for t in types
    )

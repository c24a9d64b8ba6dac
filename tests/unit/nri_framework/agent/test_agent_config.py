"""The configuration source's pure parts: precedence, the text handed to the
policy, status patch bodies, the NRT switch, and when ``run`` uses a cluster."""

from __future__ import annotations

import datetime
import logging

import pytest
from nri_balloons.configyaml import load_policy
from nri_framework.agent.config import (
    ConfigRef,
    effective_name,
    node_group,
    nrt_enabled,
    nrt_window,
    parse_duration,
    policy_text,
    status_patch,
    status_removal,
    timestamp,
)
from nri_framework.agent.kube import PolicyResource
from nri_framework.agent.options import AgentOptions, agent_options

BALLOONS = PolicyResource.for_policy("balloons")


def test_policy_resource_names() -> None:
    assert (
        PolicyResource("config.nri", "v1alpha1", "balloonspolicies", "BalloonsPolicy") == BALLOONS
    )
    assert BALLOONS.api_version == "config.nri/v1alpha1"


@pytest.mark.parametrize(
    ("labels", "want"),
    [
        ({}, ("", "")),
        ({"config.nri/group": "g1"}, ("g1", "config.nri/group")),
        ({"config.nri/group": ""}, ("", "")),
        ({"group.config.nri": "old"}, ("old", "group.config.nri")),
        ({"resource-policy.nri.io/group": "older"}, ("older", "resource-policy.nri.io/group")),
        ({"config.nri/group": "new", "group.config.nri": "old"}, ("new", "config.nri/group")),
        ({"other": "x"}, ("", "")),
    ],
)
def test_node_group(labels: dict[str, str], want: tuple[str, str]) -> None:
    assert node_group(labels) == want


def test_node_group_custom_label() -> None:
    assert node_group({"example.com/pool": "fast"}, "example.com/pool") == (
        "fast",
        "example.com/pool",
    )
    # the default key is a deprecated fallback only in name: it is not read for a custom label
    assert node_group({"config.nri/group": "g"}, "example.com/pool") == ("", "")


@pytest.mark.parametrize(
    ("group", "existing", "want"),
    [
        ("", {"default"}, "default"),
        ("", {"default", "node.n1"}, "node.n1"),
        ("", {"node.n1"}, "node.n1"),
        ("", {"node.n2", "group.g"}, None),
        ("", set(), None),
        ("g", {"default", "group.g"}, "group.g"),
        ("g", {"default", "group.g", "node.n1"}, "node.n1"),
        # a node in a group without its CR has no configuration: no fall back to default
        ("g", {"default", "group.other"}, None),
        ("g", {"default", "node.n1"}, "node.n1"),
        # without a group label the group CRs do not apply
        ("", {"group.g"}, None),
    ],
)
def test_effective_name(group: str, existing: set[str], want: str | None) -> None:
    assert effective_name("n1", group, existing) == want


def cr(name: str, spec: dict[str, object], generation: int = 1) -> dict[str, object]:
    return {
        "apiVersion": "config.nri/v1alpha1",
        "kind": "BalloonsPolicy",
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "uid": f"uid-{name}",
            "generation": generation,
            "resourceVersion": "123",
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": spec,
        "status": {"nodes": {"n1": {"status": "Success", "generation": 1}}},
    }


def test_config_ref() -> None:
    assert ConfigRef.of(cr("default", {}, 3)) == ConfigRef("default", "uid-default", 3)
    assert ConfigRef.of({}) == ConfigRef("", "", 0)


def test_policy_text_is_what_the_balloons_loader_takes() -> None:
    spec = {
        "reservedResources": {"cpu": "cpuset:0"},
        "agent": {"nodeResourceTopology": True},
        "balloonTypes": [{"name": "hp", "minCPUs": 2, "maxCPUs": 4}],
    }
    text = policy_text(cr("default", spec), BALLOONS)
    assert "managedFields" not in text and "resourceVersion" not in text
    assert "status" not in text
    doc = load_policy(text, source="kube-system/default")
    assert doc.name == "default"
    assert doc.spec.balloon_types[0].min_cpus == 2
    assert doc.spec.reserved_resources == {"cpu": "cpuset:0"}


def test_policy_text_fills_api_version_and_kind() -> None:
    obj = cr("default", {"reservedResources": {"cpu": "1"}})
    del obj["apiVersion"], obj["kind"]
    doc = load_policy(policy_text(obj, BALLOONS))
    assert doc.api_version == "config.nri/v1alpha1" and doc.kind == "BalloonsPolicy"


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (None, True),
        ({}, True),
        ({"agent": {}}, False),
        ({"agent": {"nodeResourceTopology": True}}, True),
        ({"agent": {"nodeResourceTopology": False}}, False),
        ({"agent": {"podResourceAPI": True}}, False),
    ],
)
def test_nrt_enabled(spec: dict[str, object] | None, want: bool) -> None:
    assert nrt_enabled(spec) is want


NOW = datetime.datetime(2026, 11, 30, 8, 0, 5, 123456, tzinfo=datetime.UTC)


def test_status_patch_success() -> None:
    assert status_patch("n1", 2, None, NOW) == {
        "status": {
            "nodes": {
                "n1": {
                    "status": "Success",
                    "generation": 2,
                    "errors": "",
                    "timestamp": "2026-11-30T08:00:05Z",
                }
            }
        }
    }


def test_status_patch_failure_carries_the_exact_text() -> None:
    text = 'balloons: invalid configuration: MinCpus (33) > MaxCpus (32) in balloon type "x"'
    body = status_patch("n1", 3, text, NOW)
    assert body["status"]["nodes"]["n1"] == {
        "status": "Failure",
        "generation": 3,
        "errors": text,
        "timestamp": "2026-11-30T08:00:05Z",
    }


def test_status_removal() -> None:
    assert status_removal("n1") == {"status": {"nodes": {"n1": None}}}


def test_timestamp_is_utc() -> None:
    tz = datetime.timezone(datetime.timedelta(hours=2))
    assert timestamp(datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)) == "2026-01-02T01:04:05Z"


# --- when run uses the cluster ---------------------------------------------------------


def opts(**kw: object) -> AgentOptions | None:
    args: dict[str, object] = {
        "config_file": "",
        "namespace": "",
        "group_label": "config.nri/group",
        "kubeconfig": "",
        "environ": {"NODE_NAME": "n1"},
    }
    args.update(kw)
    return agent_options(**args)  # type: ignore[arg-type]


def test_no_cluster_without_namespace_outside_a_pod() -> None:
    assert opts() is None


def test_config_file_wins(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert opts(config_file="/etc/b.yaml", namespace="kube-system") is None
    assert "--config-namespace kube-system is ignored" in caplog.text
    assert opts(config_file="/etc/b.yaml", environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None


def test_namespace_given() -> None:
    assert opts(namespace="nri", kubeconfig="/k") == AgentOptions(
        node="n1", namespace="nri", kubeconfig="/k"
    )


def test_in_a_pod_defaults_to_kube_system() -> None:
    got = opts(environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "NODE_NAME": "w3"})
    assert got == AgentOptions(node="w3", namespace="kube-system")


def test_node_name_falls_back_to_the_host_name(caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with caplog.at_level(logging.WARNING):
        got = opts(namespace="kube-system", environ={})
    assert got is not None and got.node == socket.gethostname()
    assert "NODE_NAME is not set" in caplog.text


# --- how the client finds the API server ----------------------------------------------


@pytest.mark.parametrize(
    ("kubeconfig", "in_cluster", "want"),
    [
        ("", True, "incluster"),
        ("/etc/k.yaml", True, "/etc/k.yaml"),  # an explicit file wins
        ("/etc/k.yaml", False, "/etc/k.yaml"),
        ("", False, None),  # $KUBECONFIG or ~/.kube/config: the client's default
    ],
)
def test_client_configuration_source(
    monkeypatch: pytest.MonkeyPatch, kubeconfig: str, in_cluster: bool, want: str | None
) -> None:
    import kubernetes
    from nri_framework.agent.kube import load_client_configuration

    used: list[str | None] = []
    monkeypatch.setattr(
        kubernetes.config, "load_incluster_config", lambda **kw: used.append("incluster")
    )
    monkeypatch.setattr(
        kubernetes.config, "load_kube_config", lambda config_file, **kw: used.append(config_file)
    )
    if in_cluster:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    else:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    load_client_configuration(kubeconfig)
    assert used == [want]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("0", 0.0), ("1m30s", 90.0), ("1.5s", 1.5), ("250ms", 0.25), ("2h", 7200.0),
     ("-3s", -3.0)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "s", "10 s", "1x", "1s2"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_nrt_window(caplog: pytest.LogCaptureFixture) -> None:
    assert nrt_window(None) == 10.0
    assert nrt_window({"agent": {"nodeResourceTopology": True}}) == 10.0
    assert nrt_window({"agent": {"nodeResourceTopologyWindow": "1m"}}) == 60.0
    assert nrt_window({"agent": {"nodeResourceTopologyWindow": "0"}}) == 0.0
    with caplog.at_level(logging.WARNING, "nri_framework.agent"):
        assert nrt_window({"agent": {"nodeResourceTopologyWindow": "-1s"}}) == 10.0
        assert nrt_window({"agent": {"nodeResourceTopologyWindow": "soon"}}) == 10.0
    assert caplog.text.count("is not usable: using 10s") == 2

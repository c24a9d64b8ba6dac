"""The chart's optional monitoring objects: the Prometheus Operator PodMonitor
and the Grafana dashboard ConfigMap (off by default), rendered, validated and
checked against the DaemonSet they watch; the dashboard's PromQL read by
``tests/_dashboard.py`` (whose names the integration tier checks against a
real scrape: ``tests/integration/nri_balloons/test_dashboard_metrics.py``)."""

from __future__ import annotations

import json
import re
from typing import Any

import _dashboard
import helm_python as helm
import kubernetes_validate
import pytest

from .conftest import CHART, NAME, NAMESPACE, container, find, render, set_values

K8S_VERSION = "1.32"
ON = {"podMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
# The PodMonitor's spec fields we use, with their types (monitoring.coreos.com/v1;
# the operator's CRD is not part of kubernetes-validate's built-in schemas).
POD_MONITOR_SPEC = {"selector": dict, "namespaceSelector": dict, "podMetricsEndpoints": list}
POD_METRICS_ENDPOINT = {"port": str, "path": str, "interval": str, "scrapeTimeout": str}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def check_pod_monitor(pm: dict[str, Any], daemonset: dict[str, Any]) -> None:
    """The PodMonitor's required shape (the operator's CRD, v1) and that it
    selects the DaemonSet's pods on the plugin's named metrics port."""
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["kind"] == "PodMonitor"
    meta = pm["metadata"]
    assert DNS_LABEL.match(meta["name"]) and meta["namespace"] == NAMESPACE
    assert all(isinstance(v, str) for v in meta.get("labels", {}).values())
    spec = pm["spec"]
    assert set(spec) <= set(POD_MONITOR_SPEC), spec
    for key, kind in POD_MONITOR_SPEC.items():
        assert isinstance(spec[key], kind), key
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    template = daemonset["spec"]["template"]
    pod_labels = template["metadata"]["labels"]
    selector = spec["selector"]["matchLabels"]
    assert selector and selector.items() <= pod_labels.items()
    assert spec["podMetricsEndpoints"], "a PodMonitor needs an endpoint"
    ports = {p["name"] for p in container(template["spec"], NAME).get("ports", [])}
    for ep in spec["podMetricsEndpoints"]:
        assert set(ep) <= set(POD_METRICS_ENDPOINT), ep
        assert all(isinstance(ep[k], POD_METRICS_ENDPOINT[k]) for k in ep), ep
        assert ep["port"] in ports and ep["path"] == "/metrics"
        for key in ("interval", "scrapeTimeout"):
            assert key not in ep or DURATION.match(ep[key]), ep


def test_off_by_default(default_docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in default_docs}
    assert "PodMonitor" not in kinds and "ConfigMap" not in kinds


@pytest.mark.parametrize(
    "values",
    [ON, {**ON, "allowPCT": True}, {"podMonitor": {"enabled": True, "interval": "15s"}}],
    ids=["both", "both-allowPCT", "podmonitor-alone"],
)
def test_rendered_monitoring_objects_validate(values: dict[str, Any]) -> None:
    docs = render(values)
    daemonset = find(docs, "DaemonSet", NAME)
    check_pod_monitor(find(docs, "PodMonitor"), daemonset)
    for doc in docs:
        if doc["kind"] not in ("BalloonsPolicy", "PodMonitor"):  # custom resources
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    if values.get("grafanaDashboard"):
        find(docs, "ConfigMap")
    else:
        assert "ConfigMap" not in {d["kind"] for d in docs}


@pytest.mark.parametrize("values", [ON, {**ON, "allowPCT": True}], ids=["both", "allowPCT"])
def test_strict_lint_with_monitoring_on(values: dict[str, Any]) -> None:
    result = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    assert result["errors"] == []
    assert {(m["severity"], m["error"]) for m in result["messages"]} <= {(1, "icon is recommended")}


def test_pod_monitor_values_reach_it() -> None:
    docs = render(
        set_values(
            "podMonitor.enabled=true",
            "podMonitor.interval=1m",
            "podMonitor.scrapeTimeout=20s",
            "podMonitor.labels.release=prometheus",
        )
    )
    pm = find(docs, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    assert pm["spec"]["podMetricsEndpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "1m", "scrapeTimeout": "20s"}
    ]


def test_pod_monitor_follows_another_port() -> None:
    config = {"reservedResources": {"cpu": "1"}, "instrumentation": {"httpEndpoint": ":9100"}}
    docs = render({"podMonitor": {"enabled": True}, "config": config})
    check_pod_monitor(find(docs, "PodMonitor"), find(docs, "DaemonSet", NAME))
    ports = container(find(docs, "DaemonSet", NAME)["spec"]["template"]["spec"], NAME)["ports"]
    assert [(p["name"], p["containerPort"]) for p in ports] == [("http", 9100)]


def test_pod_monitor_without_an_endpoint_is_refused() -> None:
    values = {
        "podMonitor": {"enabled": True},
        "config": {"reservedResources": {"cpu": "1"}, "instrumentation": {"httpEndpoint": ""}},
    }
    with pytest.raises(helm.HelmError, match=r"podMonitor\.enabled needs config\.instrumentation"):
        render(values)


def test_dashboard_configmap_is_the_chart_file_with_the_sidecar_label() -> None:
    cm = find(render(ON), "ConfigMap", "nri-resource-policy-balloons-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NAMESPACE
    (key,) = cm["data"]
    assert key.endswith(".json")
    assert json.loads(cm["data"][key]) == _dashboard.load()


def test_dashboard_label_namespace_and_annotations_are_configurable() -> None:
    docs = render(
        set_values(
            "grafanaDashboard.enabled=true",
            "grafanaDashboard.label=example.com/dashboard",
            "grafanaDashboard.labelValue=nri",
            "grafanaDashboard.namespace=monitoring",
            "grafanaDashboard.annotations.grafana_folder=NRI",
        )
    )
    cm = find(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["example.com/dashboard"] == "nri"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "NRI"}
    kubernetes_validate.validate(cm, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("podMonitor.enabled=maybe", "podMonitor"),
        ("podMonitor.interval=soon", "interval"),
        ("podMonitor.port=http", "port"),
        ("grafanaDashboard.enabled=yes please", "grafanaDashboard"),
        ("grafanaDashboard.label=not a label", "label"),
        ("grafanaDashboard.labelValue=-1-", "labelValue"),
        ("grafanaDashboard.namespace=Not_A_Namespace", "namespace"),
    ],
)
def test_values_schema_rejects_bad_monitoring_values(expr: str, message: str) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmValuesError, match=message):
        chart.validate_schema(set_values(expr))


def test_values_schema_accepts_monitoring_on() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(ON)
        chart.validate_schema(set_values("podMonitor.enabled=true", "podMonitor.interval=1m30s"))


# --- the dashboard's panels and their PromQL ------------------------------------------------

# What the issue asks the dashboard to show, as the metric names a panel must query.
WANTED = {
    "CPUs per balloon and balloon type": {"nri_policy_balloons_cores"},
    "busy frequency per balloon (HP vs LP)": {"nri_policy_balloons_busy_mhz"},
    "PCT state per punit": {"nri_policy_balloons_clos_min_mhz", "nri_policy_balloons_clos_max_mhz"},
    "helper health": {"nri_resource_policy_peer_up"},
    "NRI request latency": {"nri_resource_policy_nri_request_duration_seconds_bucket"},
}


def test_the_dashboard_has_the_panels_the_issue_lists() -> None:
    queried = {
        n for _, q in _dashboard.queries(_dashboard.load()) for n in _dashboard.metric_names(q)
    }
    for topic, names in WANTED.items():
        assert names <= queried, f"no panel for {topic}: {sorted(names - queried)}"
    assert all(n.startswith(("nri_policy_", "nri_resource_policy_")) for n in queried), queried


def test_every_panel_queries_prometheus_through_the_datasource_variable() -> None:
    dash = _dashboard.load()
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert _dashboard.metric_names(target["expr"]), target["expr"]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (pod, balloon) (nri_policy_balloons_cores{namespace="$ns", pod=~"a|b"})',
         {"nri_policy_balloons_cores"}),
        ('histogram_quantile(0.9, sum by (le, m) (rate(x_bucket{a="b"}[$__rate_interval])))',
         {"x_bucket"}),
        ("a / on (pod) group_left (balloon) b + 1e3 * c offset 5m", {"a", "b", "c"}),
        ('label_values(nri_resource_policy_build_info{namespace="$namespace"}, pod)',
         {"nri_resource_policy_build_info"}),
        ("max_over_time(m[5m:1m]) > bool 0 and n unless o", {"m", "n", "o"}),
        ('count(up{job="x"}) or vector(0)', {"up"}),
    ],
)  # fmt: skip
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert _dashboard.metric_names(expr) == names

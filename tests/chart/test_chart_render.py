"""The chart renders, lints clean and produces what the spec's kubectl checks
expect, mapped to our layout (the privileged container is the ``sst-helper``
sidecar, never the plugin)."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from .conftest import (
    CHART,
    NAME,
    NAMESPACE,
    container,
    find,
    render,
    set_values,
)

K8S_VERSION = "1.32"
SELECTOR = {"app.kubernetes.io/name": NAME}
PLUGIN = NAME
HELPER = "sst-helper"
SOCKET = "ipc:///run/nri-sst/helper.sock"

# Helm's own informational lint message; see the chart README ("Lint").
ALLOWED_LINT = {(1, "icon is recommended")}


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "DaemonSet", NAME)["spec"]["template"]["spec"]


def compact(obj: object) -> str:
    """What ``kubectl -o jsonpath`` prints for a map: compact JSON."""
    return json.dumps(obj, separators=(",", ":"))


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def volumes(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in spec["volumes"]}


# --- lint -----------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, {"allowPCT": True}], ids=["default", "allowPCT"])
def test_strict_lint_has_no_errors_or_warnings(values: dict[str, Any]) -> None:
    result = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    assert result["errors"] == []
    left = {(m["severity"], m["error"]) for m in result["messages"]}
    assert left <= ALLOWED_LINT, left


def test_chart_version_is_semver() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["name"] == NAME
    major, minor, patch = meta["version"].split(".")
    assert all(p.isdigit() for p in (major, minor, patch))


# --- every rendered object against the Kubernetes schemas ---------------------------------


FULL = {
    "allowPCT": True,
    "nri": {"plugin": {"index": 7, "annotations": {"example.com/a": "b"}}},
    "configGroupLabel": "example.com/group",
    "extraEnv": {"FOO": "bar", "N": 1},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}
                ]
            }
        }
    },
    "nodeSelector": {"example.com/pct": "true"},
    "podPriorityClassNodeCritical": False,
    "image": {"name": "registry.example/plugin", "tag": "1.2.3", "pullPolicy": "Always"},
    "sstHelperImage": {"name": "registry.example/helper", "tag": "1.2.3", "pullPolicy": "Always"},
}


@pytest.mark.parametrize(
    "values",
    [{}, {"allowPCT": True}, FULL, {"config": {"reservedResources": {"cpu": "1"}}}],
    ids=["default", "allowPCT", "full", "minimal-config"],
)
def test_rendered_objects_validate_strictly(values: dict[str, Any]) -> None:
    docs = render(values)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "BalloonsPolicy",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    for doc in docs:
        if doc["kind"] == "BalloonsPolicy":
            continue  # a custom resource: test_chart_crds.py validates it against the CRD
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_full_values_reach_the_pod() -> None:
    docs = render(FULL)
    spec = pod_spec(docs)
    ds = find(docs, "DaemonSet", NAME)
    plugin = container(spec, PLUGIN)
    assert plugin["image"] == "registry.example/plugin:1.2.3"
    assert container(spec, HELPER)["image"] == "registry.example/helper:1.2.3"
    args = plugin["args"]
    assert args[args.index("--nri-plugin-index") + 1] == "07"
    assert args[args.index("--config-group-label") + 1] == "example.com/group"
    assert {"name": "FOO", "value": "bar"} in plugin["env"]
    assert {"name": "N", "value": "1"} in plugin["env"]
    assert spec["tolerations"] == FULL["tolerations"]
    assert spec["affinity"] == FULL["affinity"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "example.com/pct": "true"}
    assert "priorityClassName" not in spec
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/a"] == "b"


# --- the spec's kubectl checks, on the rendered objects -----------------------------------


@pytest.mark.parametrize("fixture", ["default_docs", "pct_docs"])
def test_label_selector_and_daemonset_name(fixture: str, request: pytest.FixtureRequest) -> None:
    docs = request.getfixturevalue(fixture)
    ds = find(docs, "DaemonSet", "nri-resource-policy-balloons")  # ds/nri-resource-policy-balloons
    assert ds["metadata"]["namespace"] == NAMESPACE
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    # kubectl get pod -l app.kubernetes.io/name=nri-resource-policy-balloons
    assert SELECTOR.items() <= pod_labels.items()
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == NAME


def test_allow_pct_makes_only_the_sidecar_privileged(pct_docs: list[dict[str, Any]]) -> None:
    spec = pod_spec(pct_docs)
    helper = container(spec, HELPER)
    # jsonpath '{.items[0].spec.containers[?(@.name=="sst-helper")].securityContext}'
    assert compact(helper["securityContext"]) == '{"privileged":true}'
    # jsonpath '{...containers[?(@.name=="sst-helper")].volumeMounts[?(@.name=="hostdev")]}'
    hostdev = mounts(helper)["hostdev"]
    assert hostdev["mountPath"] == "/host/dev"
    assert not hostdev.get("readOnly", False)
    assert volumes(spec)["hostdev"]["hostPath"] == {"path": "/dev", "type": "Directory"}
    assert mounts(helper)["hostsysfs"]["readOnly"] is False
    assert volumes(spec)["hostsysfs"]["hostPath"]["path"] == "/sys"
    args = helper["args"]
    assert args[args.index("--backend") + 1] == "auto"
    privileged = [c["name"] for c in spec["containers"] if c["securityContext"].get("privileged")]
    assert privileged == [HELPER]
    assert "initContainers" not in spec


def test_allow_pct_gives_the_helper_the_hosts_irqs(pct_docs: list[dict[str, Any]]) -> None:
    """IRQ affinity (irqClaim, irqMode) through the helper: it reads
    <host-root>/proc/interrupts (read-only) and writes
    <host-root>/proc/irq/N/smp_affinity_list (read-write), and sees nothing
    else of the host's /proc; the plugin gets neither."""
    spec = pod_spec(pct_docs)
    helper = mounts(container(spec, HELPER))
    assert helper["hostprocinterrupts"]["mountPath"] == "/host/proc/interrupts"
    assert helper["hostprocinterrupts"]["readOnly"] is True
    assert helper["hostprocirq"]["mountPath"] == "/host/proc/irq"
    assert not helper["hostprocirq"].get("readOnly", False)
    assert "hostprocfs" not in helper  # not the whole /proc
    assert volumes(spec)["hostprocinterrupts"]["hostPath"] == {
        "path": "/proc/interrupts",
        "type": "File",
    }
    assert volumes(spec)["hostprocirq"]["hostPath"] == {"path": "/proc/irq", "type": "Directory"}
    args = container(spec, HELPER)["args"]
    assert args[args.index("--host-root") + 1] == "/host"  # ProcInterrupts' root
    plugin = mounts(container(spec, NAME))
    assert "hostprocirq" not in plugin and "hostprocinterrupts" not in plugin


def test_without_allow_pct_nothing_is_privileged(default_docs: list[dict[str, Any]]) -> None:
    spec = pod_spec(default_docs)
    helper = container(spec, HELPER)
    sc = helper["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    args = helper["args"]
    assert args[args.index("--backend") + 1] == "none"
    assert "hostdev" not in volumes(spec)
    for c in spec["containers"]:
        assert "hostdev" not in mounts(c)
        assert all(m["mountPath"] != "/host/dev" for m in c["volumeMounts"])
        assert mounts(c)["hostsysfs"]["readOnly"] is True
        # no IRQ affinity without allowPCT (the chart README says so)
        assert "hostprocirq" not in mounts(c) and "hostprocinterrupts" not in mounts(c)
    assert "hostprocirq" not in volumes(spec) and "hostprocinterrupts" not in volumes(spec)


@pytest.mark.parametrize("fixture", ["default_docs", "pct_docs"])
def test_plugin_container_is_never_privileged(fixture: str, request: pytest.FixtureRequest) -> None:
    spec = pod_spec(request.getfixturevalue(fixture))
    assert spec["containers"][0]["name"] == PLUGIN  # containers[0] is the plugin
    plugin = container(spec, PLUGIN)
    sc = plugin["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert "add" not in sc["capabilities"]
    m = mounts(plugin)
    assert "hostdev" not in m
    assert m["hostsysfs"] == {"name": "hostsysfs", "mountPath": "/host/sys", "readOnly": True}
    assert m["nrisockets"]["mountPath"] == "/var/run/nri"
    assert m["resource-policydata"]["mountPath"] == "/var/lib/nri-resource-policy"
    assert m["sst-ipc"]["mountPath"] == "/run/nri-sst"
    # Every other writable mount is an emptyDir or the state dir.
    vols = volumes(spec)
    for name, mount in m.items():
        if not mount.get("readOnly"):
            assert "emptyDir" in vols[name] or name == "resource-policydata", name
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")


@pytest.mark.parametrize("fixture", ["default_docs", "pct_docs"])
def test_plugin_command_line(fixture: str, request: pytest.FixtureRequest) -> None:
    plugin = container(pod_spec(request.getfixturevalue(fixture)), PLUGIN)
    assert plugin["command"] == ["nri-resource-policy"]
    assert plugin["args"] == [
        "run",
        "--policy",
        "balloons",
        "--host-root",
        "/host",
        "--state-dir",
        "/var/lib/nri-resource-policy",
        "--nri-plugin-index",
        "90",
        "--config-namespace",
        NAMESPACE,
        "--sst-helper",
        SOCKET,
        "--metrics-address",
        ":8891",
    ]
    assert plugin["env"][0] == {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }


def test_sidecar_command_line_and_shared_socket_dir(pct_docs: list[dict[str, Any]]) -> None:
    spec = pod_spec(pct_docs)
    helper = container(spec, HELPER)
    assert helper["command"] == ["nri-sst-helper"]
    assert helper["args"] == [
        "serve",
        "--socket",
        SOCKET,
        "--backend",
        "auto",
        "--host-root",
        "/host",
    ]
    assert mounts(helper)["sst-ipc"]["mountPath"] == "/run/nri-sst"
    assert "emptyDir" in volumes(spec)["sst-ipc"]


@pytest.mark.parametrize(
    ("exprs", "backend"),
    [
        (("allowPCT=true", "sstHelperBackend=tpmi"), ["--backend", "tpmi"]),
        (
            ("allowPCT=true", "sstHelperBackend=sim"),
            # the simulated node's state lives in the pod's sst-ipc emptyDir
            ["--backend", "sim", "--sim-state", "/run/nri-sst/sim-state.json"],
        ),
        # without allowPCT the helper never touches hardware, whatever the backend value
        (("sstHelperBackend=sim",), ["--backend", "none"]),
    ],
)
def test_sidecar_backend_value(exprs: tuple[str, ...], backend: list[str]) -> None:
    args = container(pod_spec(render(set_values(*exprs))), HELPER)["args"]
    assert args == ["serve", "--socket", SOCKET, *backend, "--host-root", "/host"]


def test_config_namespace_follows_the_release_namespace() -> None:
    docs = render(namespace="nri-system")
    args = container(pod_spec(docs), PLUGIN)["args"]
    assert args[args.index("--config-namespace") + 1] == "nri-system"
    assert find(docs, "BalloonsPolicy", "default")["metadata"]["namespace"] == "nri-system"
    assert find(docs, "Role")["metadata"]["namespace"] == "nri-system"
    subject = find(docs, "ClusterRoleBinding")["subjects"][0]
    assert subject == {
        "kind": "ServiceAccount",
        "name": NAME,
        "namespace": "nri-system",
    }


@pytest.mark.parametrize(("index", "rendered"), [(0, "00"), (7, "07"), (90, "90"), (99, "99")])
def test_plugin_index_is_two_digits(index: int, rendered: str) -> None:
    args = container(pod_spec(render(set_values(f"nri.plugin.index={index}"))), PLUGIN)["args"]
    assert args[args.index("--nri-plugin-index") + 1] == rendered


# --- probes, metrics ---------------------------------------------------------------------


def test_probes_and_prometheus_annotations(default_docs: list[dict[str, Any]]) -> None:
    ds = find(default_docs, "DaemonSet", NAME)
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8891"
    plugin = container(ds["spec"]["template"]["spec"], PLUGIN)
    assert plugin["ports"] == [{"name": "http", "containerPort": 8891, "protocol": "TCP"}]
    # liveness: the process answers; readiness: registered, configured, synchronized
    # (a plugin waiting for a path the pod lacks must not be restarted into a crash loop)
    assert plugin["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert plugin["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_no_http_endpoint_means_no_probes() -> None:
    docs = render({"config": {"instrumentation": {"httpEndpoint": ""}}})
    ds = find(docs, "DaemonSet", NAME)
    assert "prometheus.io/port" not in ds["spec"]["template"]["metadata"]["annotations"]
    plugin = container(ds["spec"]["template"]["spec"], PLUGIN)
    assert "ports" not in plugin and "livenessProbe" not in plugin
    assert "--metrics-address" not in plugin["args"]


def test_other_port() -> None:
    docs = render({"config": {"instrumentation": {"httpEndpoint": "0.0.0.0:9000"}}})
    plugin = container(pod_spec(docs), PLUGIN)
    assert plugin["ports"][0]["containerPort"] == 9000
    # the plugin listens where the probes and Prometheus look
    args = plugin["args"]
    assert args[args.index("--metrics-address") + 1] == "0.0.0.0:9000"


# --- RBAC, ServiceAccount, the default BalloonsPolicy -----------------------------------------


def rules(doc: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    return [
        (group, res, sorted(r["verbs"]))
        for r in doc["rules"]
        for group in r["apiGroups"]
        for res in r["resources"]
    ]


def test_least_privilege_rbac(default_docs: list[dict[str, Any]]) -> None:
    assert rules(find(default_docs, "ClusterRole", NAME)) == [
        ("", "nodes", ["get", "watch"]),
        ("", "nodes/status", ["get", "patch"]),
        (
            "topology.node.k8s.io",
            "noderesourcetopologies",
            ["create", "delete", "get", "list", "update"],
        ),
    ]
    role = find(default_docs, "Role", NAME)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules(role) == [
        ("config.nri", "balloonspolicies", ["get", "list", "watch"]),
        ("config.nri", "balloonspolicies/status", ["get", "patch", "update"]),
    ]
    for kind, ref in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = find(default_docs, kind, NAME)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": ref,
            "name": NAME,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}
        ]
    find(default_docs, "ServiceAccount", NAME)
    assert pod_spec(default_docs)["serviceAccountName"] == NAME
    assert pod_spec(default_docs)["priorityClassName"] == "system-node-critical"


def test_default_balloons_policy_is_values_config(default_docs: list[dict[str, Any]]) -> None:
    cr = find(default_docs, "BalloonsPolicy", "default")
    assert cr["apiVersion"] == "config.nri/v1alpha1"
    assert cr["metadata"]["namespace"] == NAMESPACE
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert cr["spec"] == values["config"]
    assert cr["spec"]["reservedResources"] == {"cpu": "1000m"}
    assert [t["name"] for t in cr["spec"]["balloonTypes"]] == [
        "dedicated-cpus",
        "shared-local-cpus",
    ]


# --- values.schema.json -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("nri.plugin.index=150", "maximum: got 150, want 99"),
        ("nri.plugin.index=-1", "minimum: got -1, want 0"),
        ("allowPCT=maybe", "allowPCT"),
        ("allowPct=true", "allowPct"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("sstHelperBackend=/dev/mem", "sstHelperBackend"),
        ("sstHelperBackend=none", "sstHelperBackend"),
    ],
)
def test_values_schema_rejects(expr: str, message: str) -> None:
    values = set_values(expr)
    with helm.Chart.load(str(CHART)) as chart:
        with pytest.raises(helm.HelmValuesError, match=message):
            chart.validate_schema(values)
        with pytest.raises(helm.HelmError):
            chart.render(values, name=NAME, namespace=NAMESPACE)
    result = helm.lint(str(CHART), values, strict=True)
    assert result["errors"], expr


def test_values_schema_accepts_defaults_and_set_true() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema({})
        chart.validate_schema(set_values("allowPCT=true"))
        chart.validate_schema(FULL)


@pytest.mark.parametrize("fixture", ["default_docs", "pct_docs"])
def test_only_the_plugin_gets_api_credentials(fixture: str, request: pytest.FixtureRequest) -> None:
    spec = pod_spec(request.getfixturevalue(fixture))
    assert spec["automountServiceAccountToken"] is False
    sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    plugin_mount = mounts(container(spec, PLUGIN))["kube-api-access"]
    assert plugin_mount == {"name": "kube-api-access", "mountPath": sa_dir, "readOnly": True}
    helper = container(spec, HELPER)
    assert all(m["mountPath"] != sa_dir for m in helper["volumeMounts"])
    assert "kube-api-access" not in mounts(helper)
    sources = volumes(spec)["kube-api-access"]["projected"]["sources"]
    assert [next(iter(s)) for s in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert sources[1]["configMap"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert sources[2]["downwardAPI"]["items"][0]["path"] == "namespace"


# --- pod-resources API (agent.podResourceAPI) ---------------------------------------


@pytest.mark.parametrize("enabled", [True, False])
def test_the_plugin_is_told_the_kubelets_pod_resources_socket(enabled: bool) -> None:
    docs = render({"config": {"agent": {"podResourceAPI": enabled}}})
    spec = pod_spec(docs)
    plugin = container(spec, PLUGIN)
    args = plugin["args"]
    if not enabled:
        assert "--pod-resources-socket" not in args
        return
    socket = args[args.index("--pod-resources-socket") + 1]
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    # the socket's directory is the kubelet's, mounted read-only at the same path
    mount = mounts(plugin)["pod-resources-socket"]
    assert mount["mountPath"] + "/kubelet.sock" == socket and mount["readOnly"]
    assert volumes(spec)["pod-resources-socket"]["hostPath"]["path"] == mount["mountPath"]


def test_a_config_without_an_agent_block_renders() -> None:
    docs = render({"config": {"agent": None}})  # null deletes the default's block
    assert "agent" not in find(docs, "BalloonsPolicy", "default")["spec"]
    assert "--pod-resources-socket" not in container(pod_spec(docs), PLUGIN)["args"]

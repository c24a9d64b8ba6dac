"""The spec's operator commands, verbatim (``spec/*.sh``), with Debian's kubectl and jq.

They run through ``bash`` (the spec's ``|`` and quoting) against a stack of this
module's own (:class:`stack.Stack`): the spec's cluster has one node, and its
``.items[0]`` must be ours, not a node another module left on the shared stack.

* Step 6.5: the two NodeResourceTopology queries, on the NRT a real agent (the
  plugin process, the runtime simulator, a 6776P sysfs tree, the SST helper on
  its sim backend) published for the spec's four HP pods and LP pod, under the
  spec's BalloonsPolicy applied with the spec's ``kubectl apply -f``.
* Steps 10 and 9.1: the capacity queries on the Node stand-in, after the agent
  published its ``cpuclass.balloons.nri.io/*`` extended resources, and after the
  spec's ``kubectl delete -f balloons-pct-managed.yaml`` (the reset): ``{}``.
* Step 4: the plugin pod checks on the rendered chart's objects (the DaemonSet
  and the Pod the kubelet would make of its template; stored objects, nothing
  runs them), and the chart README's checks, verbatim from the README.

Step 4's expectation differs from the spec on purpose: the spec's pod has one
container, made privileged by ``allowPCT=true``; ours has two, and
``containers[0]`` is the plugin, never privileged (every capability dropped, a
read-only root filesystem): only the ``sst-helper`` sidecar is privileged, and
only with ``allowPCT=true`` (``charts/.../README.md``). So the spec's literal
commands print the plugin's restricted context and no hostdev mount, and the
README selects the helper by name; both are asserted here.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _tier
import _tools
import pytest
from agent_node import CPUCLASS, EXAMPLES, Cluster, eventually, plugin_node
from kubernetes import client
from nri_framework import cpuset
from spec_commands import REQUIRED, Kubectl, tsv
from stack import Stack

pytestmark = pytest.mark.k8s

HP_PODS = [f"pct-hp-{i}" for i in range(1, 5)]
PODS = [*HP_PODS, "pct-lp"]


@pytest.fixture(scope="module")
def spec_stack(k8s_stack: Stack) -> Iterator[Stack]:
    """A stack of this module's own (``k8s_stack``: the build is there, and cached)."""
    st = Stack(k8s_stack.cache)
    st.start()
    try:
        yield st
    finally:
        st.stop()
        assert not st.leftovers()


@pytest.fixture
def operator(spec_stack: Stack, tools: _tools.Tools) -> Kubectl:
    return Kubectl.on(spec_stack, tools)


@pytest.fixture
def spec_cluster(spec_stack: Stack, operator: Kubectl) -> Iterator[Cluster]:
    """The spec's namespace (its BalloonsPolicy is in kube-system) and a node."""
    with Cluster.opened(spec_stack, "kube-system", f"node-{uuid.uuid4().hex[:6]}", operator) as c:
        yield c


def _node_capacity() -> dict[str, str]:
    """The 6776P node's capacity before the agent publishes anything."""
    return {"cpu": "256", "memory": "512Gi", "pods": "110"}


# --- step 6.5 -------------------------------------------------------------------------


async def test_spec_kubectl_nrt_queries_step_6_5(spec_cluster: Cluster) -> None:
    c = spec_cluster
    await asyncio.to_thread(c.stack.create_node, c.node, None, _node_capacity())
    # step 4's own command, verbatim (the spec's file is the repository's example)
    out = c.kubectl.run("kubectl apply -f balloons-pct-managed.yaml", cwd=EXAMPLES)
    assert out.strip() == "balloonspolicy.config.nri/default created", out
    async with plugin_node(c, "xeon-6776p", sst=True) as n:
        for pod in PODS:
            await n.run_yaml(EXAMPLES / f"{pod.replace('pct-', 'pod-')}.yaml")

        def containers() -> list[list[str]]:
            header, *rows = tsv(c.kubectl.spec("step6.5-containers"))
            assert header == ["NODE", "BALLOON", "CONTAINER", "CPUS"]
            assert sorted(r[2].split("/")[1] for r in rows) == sorted(PODS), rows
            return rows

        rows = await eventually(containers, timeout=30, what="the five pods in the NRT")
        header, *zones = tsv(c.kubectl.spec("step6.5-balloons"))
        assert header == ["NODE", "BALLOON", "CPUSET"]
        # one node, ours: the spec's cluster
        assert {r[0] for r in rows + zones} == {c.node}
        balloons = {name: cpus for _, name, cpus in zones}

        by_pod = {r[2].split("/")[1]: (r[1], r[2], r[3]) for r in rows}
        hp = {by_pod[p][0] for p in HP_PODS}
        # four hp-bln[0]..hp-bln[3] zones, each with a 2-CPU set, one per HP pod
        assert hp == {f"hp-bln[{i}]" for i in range(4)}, by_pod
        assert by_pod["pct-lp"][0] == "lp-bln[0]", by_pod
        for pod, (parent, name, cpus) in by_pod.items():
            assert name.endswith(f"{pod}/bench"), name
            # the container is pinned to its balloon's set, as the runtime sees it too
            assert cpus == balloons[parent] == n.cpus(pod), (pod, parent, cpus)
        for pod in HP_PODS:
            assert cpuset.parse(by_pod[pod][2]).bit_count() == 2, by_pod[pod]
        assert cpuset.parse(by_pod["pct-lp"][2]).bit_count() == 8, by_pod["pct-lp"]
        hp_sets = [cpuset.parse(by_pod[p][2]) for p in HP_PODS]
        assert (
            sum(s.bit_count() for s in hp_sets)
            == cpuset.parse(",".join(by_pod[p][2] for p in HP_PODS)).bit_count()
        ), "HP balloons overlap"
        # a reserved[0] zone: the used subset of the reserved CPUs (0,1,128,129),
        # compacted to what its containers need; none runs there here (the spec's
        # cluster has its kube-system pods there: "0,128"), so it is empty
        assert "reserved[0]" in balloons, balloons
        assert cpuset.parse(balloons["reserved[0]"]) & ~cpuset.parse("0,1,128,129") == 0


# --- steps 10 and 9.1 ---------------------------------------------------------------


async def test_spec_kubectl_capacity_steps_10_and_9_1(spec_cluster: Cluster) -> None:
    from agent_node import pct_spec

    c = spec_cluster
    capacity = {**_node_capacity(), "example.com/not-owned": "3"}
    await asyncio.to_thread(c.stack.create_node, c.node, None, capacity)
    # step 10: the spec's policy with publishExtendedResource on hp-pct and lp-pct
    c.create("default", pct_spec())
    async with plugin_node(c, "xeon-6776p", sst=True) as n:

        def published() -> dict[str, str]:
            out: dict[str, str] = json.loads(c.kubectl.spec("step10-capacity"))
            assert set(out) == {f"{CPUCLASS}hp-pct", f"{CPUCLASS}lp-pct"}, out
            return out

        first = await eventually(published, timeout=30, what="hp-pct and lp-pct published")
        assert all(re.fullmatch(r"\d+k?", v) for v in first.values()), first
        # the same numbers the Python client reads
        cap = c.capacity()
        assert {k: cap[k] for k in first} == first

        # step 9.1: the spec's delete of the BalloonsPolicy, verbatim, is the reset
        out = c.kubectl.run(
            "kubectl delete -f balloons-pct-managed.yaml --ignore-not-found", cwd=EXAMPLES
        )
        assert out.startswith('balloonspolicy.config.nri "default" deleted'), out

        def reset() -> str:
            out = c.kubectl.spec("step9.1-capacity")
            assert json.loads(out) == {}, out
            return out

        # Expect: {} (jq prints it as the spec shows it)
        assert await eventually(reset, timeout=30, what="owned resources removed") == "{}\n"
        assert c.capacity()["example.com/not-owned"] == "3"
        assert n.plugin.proc.returncode is None


# --- step 4 and the chart README ---------------------------------------------------------


def _rendering() -> Any:
    """``tests/chart/rendering.py`` (Helm's Go SDK: ``helm-python-sdk``, in tox -e k8s)."""
    if importlib.util.find_spec("helm_python") is None:
        _tier.unavailable(
            "k8s", "helm-python-sdk is not installed: the chart cannot be rendered", REQUIRED
        )
    from chart import rendering

    return rendering


PLUGIN_SC = (
    '{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]},"privileged":false,'
    '"readOnlyRootFilesystem":true,"seccompProfile":{"type":"RuntimeDefault"}}'
)
ARGS = (
    '["serve","--socket","ipc:///run/nri-sst/helper.sock","--backend","%s","--host-root","/host"]'
)
HELPER = '{.items[0].spec.containers[?(@.name=="sst-helper")]'
PLUGIN = '{.items[0].spec.containers[?(@.name=="nri-resource-policy-balloons")]'

#: the README's jsonpath -> (output with allowPCT=true, output with the defaults)
README_EXPECTED = {
    HELPER + '.securityContext}{"\\n"}': ('{"privileged":true}', PLUGIN_SC),
    HELPER + '.volumeMounts[?(@.name=="hostdev")]}{"\\n"}': (
        '{"mountPath":"/host/dev","name":"hostdev"}',
        "",
    ),
    PLUGIN + '.securityContext}{"\\n"}': (PLUGIN_SC, PLUGIN_SC),
    PLUGIN + '.volumeMounts[?(@.name=="hostdev")]}{"\\n"}': ("", ""),
    '{.spec.template.spec.containers[?(@.name=="sst-helper")].args}{"\\n"}': (
        ARGS % "auto",
        ARGS % "none",
    ),
}

#: the spec's step 4 commands -> (output with allowPCT=true, with the defaults): the
#: plugin's context and no hostdev mount (the spec expects {"privileged":true} and a
#: /host/dev mount of its one-container pod; see the module docstring)
SPEC_EXPECTED = {
    "step4-securitycontext": (PLUGIN_SC, PLUGIN_SC),
    "step4-hostdev": ("", ""),
}


def readme_commands() -> list[str]:
    """Every ``kubectl ... -o jsonpath=`` command of the chart README, as a shell text."""
    from chart.rendering import CHART

    text = (CHART / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = []
    for block in blocks:
        for cmd in re.split(r"\n(?=kubectl )", block):
            cmd = "\n".join(ln for ln in cmd.splitlines() if not ln.startswith("#"))
            if cmd.startswith("kubectl") and "-o jsonpath=" in cmd:
                commands.append(cmd)
    return commands


def _jsonpath(command: str) -> str:
    m = re.search(r"-o jsonpath='([^']*)'", command)
    assert m, command
    return m.group(1)


@pytest.fixture
def rendered_pod(spec_stack: Stack, request: pytest.FixtureRequest) -> Iterator[str]:
    """The rendered DaemonSet and its Pod, stored in the stack (``request.param``:
    ``"pct"`` for ``--set allowPCT=true``, ``"default"``)."""
    r = _rendering()
    values = r.set_values("allowPCT=true") if request.param == "pct" else {}
    ds = r.find(r.render(values), "DaemonSet", r.NAME)
    template = ds["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": f"{r.NAME}-{uuid.uuid4().hex[:5]}",
            "namespace": r.NAMESPACE,
        },
        "spec": template["spec"],
    }
    with spec_stack.api_client() as api:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        apps.create_namespaced_daemon_set(r.NAMESPACE, ds)
        core.create_namespaced_pod(r.NAMESPACE, pod)
        try:
            yield request.param
        finally:
            # (a stand-in's DELETE answers a Status, not the object: not parsed)
            core.delete_namespaced_pod(pod["metadata"]["name"], r.NAMESPACE, _preload_content=False)
            apps.delete_namespaced_daemon_set(r.NAME, r.NAMESPACE, _preload_content=False)


def test_spec_kubectl_readme_documents_exactly_the_checked_commands() -> None:
    _rendering()
    assert sorted(_jsonpath(cmd) for cmd in readme_commands()) == sorted(README_EXPECTED)


@pytest.mark.parametrize("rendered_pod", ["pct", "default"], indirect=True)
def test_spec_kubectl_pod_checks_step_4(rendered_pod: str, operator: Kubectl) -> None:
    column = 0 if rendered_pod == "pct" else 1
    for name, expected in SPEC_EXPECTED.items():
        assert operator.spec(name) == expected[column] + "\n", name
    # kubectl's default (table) output of the spec's selector: the one pod
    header, row = operator.run(SELECT).splitlines()
    assert (
        header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
        or header.split()[0] == "NAME"
    ), header
    assert row.startswith("nri-resource-policy-balloons-"), row
    commands = readme_commands()
    assert len(commands) == len(README_EXPECTED)
    for cmd in commands:
        assert operator.run(cmd) == README_EXPECTED[_jsonpath(cmd)][column] + "\n", cmd


SELECT = "kubectl -n kube-system get pod -l app.kubernetes.io/name=nri-resource-policy-balloons"


def test_spec_kubectl_table_output_without_the_pod(operator: Kubectl) -> None:
    """No pod stored: the spec's selector finds none, and kubectl says so as on a cluster."""
    out = operator.run(f"{SELECT} 2>&1")
    assert out == "No resources found in kube-system namespace.\n", out


# --- what the stack serves kubectl, as a cluster would ----------------------------------


def test_spec_kubectl_apply_leaves_field_validation_to_the_server(
    operator: Kubectl, tmp_path: Path
) -> None:
    """``kubectl apply``'s default ``--validate=strict`` reads the OpenAPI v3 the proxy
    serves for the stand-ins, sends ``fieldValidation=Strict``, and the real server
    rejects an unknown field of the CRD schema (without it: "failed to download
    openapi", and no object)."""
    text = (EXAMPLES / "balloons-pct-managed.yaml").read_text()
    bogus = text.replace("  pinCPU: true\n", "  pinCPU: true\n  bogusField: 1\n")
    assert bogus != text
    (tmp_path / "balloons-pct-managed.yaml").write_text(bogus)
    proc = operator.attempt("kubectl apply -f balloons-pct-managed.yaml", cwd=tmp_path)
    assert proc.returncode == 1, proc
    assert 'strict decoding error: unknown field "spec.bogusField"' in proc.stderr, proc.stderr
    out = operator.run("kubectl -n kube-system get balloonspolicies -o name")
    assert out == "", out


def test_spec_kubectl_not_found_as_on_a_cluster(operator: Kubectl) -> None:
    """Errors name the real resource, and kubectl finds the namespace it looks up."""
    for cmd, message in [
        ("kubectl get node nope", 'nodes "nope" not found'),
        ("kubectl -n kube-system get ds/nope", 'daemonsets.apps "nope" not found'),
        ("kubectl -n kube-system get pod nope", 'pods "nope" not found'),
    ]:
        proc = operator.attempt(cmd)
        assert proc.returncode == 1, proc
        assert proc.stderr == f"Error from server (NotFound): {message}\n", proc.stderr


def test_spec_kubectl_failing_kubectl_fails_the_pipeline(operator: Kubectl) -> None:
    """``| jq`` on the empty output of a failed kubectl does not pass for a result."""
    with pytest.raises(AssertionError, match="exit 1"):
        operator.run("kubectl get node nope -o json | jq .")

"""The kubectl verification commands documented in the chart README, evaluated
on the rendered objects (a pod is its DaemonSet's template with the same spec).

Only the JSONPath subset the README uses is implemented: ``.key``, ``[N]`` and
``[?(@.key=="value")]``; results print the way ``kubectl -o jsonpath`` prints
them (maps and lists as compact JSON with sorted keys, strings bare)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from .conftest import CHART, NAME, find

STEP = re.compile(r'\.([A-Za-z0-9_]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_]+)=="([^"]*)"\)\]')


def jsonpath(obj: Any, expr: str) -> str:
    """Evaluate ``{...}{"\\n"}`` the way kubectl prints it (without the newline)."""
    body = expr.removesuffix('{"\\n"}')
    assert body.startswith("{") and body.endswith("}"), expr
    path = body[1:-1]
    nodes = [obj]
    pos = 0
    while pos < len(path):
        m = STEP.match(path, pos)
        assert m, f"unsupported JSONPath at {path[pos:]!r}"
        key, index, fkey, fval = m.groups()
        nxt: list[Any] = []
        for node in nodes:
            if key is not None and isinstance(node, dict) and key in node:
                nxt.append(node[key])
            elif index is not None and isinstance(node, list) and int(index) < len(node):
                nxt.append(node[int(index)])
            elif fkey is not None and isinstance(node, list):
                nxt.extend(x for x in node if isinstance(x, dict) and x.get(fkey) == fval)
        nodes = nxt
        pos = m.end()
    return " ".join(
        n if isinstance(n, str) else json.dumps(n, separators=(",", ":"), sort_keys=True)
        for n in nodes
    )


def readme_commands() -> list[tuple[str, str]]:
    """``(target, jsonpath)`` of every ``kubectl ... -o jsonpath=`` in the README."""
    text = (CHART / "README.md").read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        if line.startswith("kubectl") and "-o jsonpath=" in line:
            target = "ds" if " ds/" in line else "pods"
            found.append((target, re.search(r"-o jsonpath='([^']*)'", line).group(1)))
    return found


def objects(docs: list[dict[str, Any]], target: str) -> dict[str, Any]:
    ds = find(docs, "DaemonSet", NAME)
    if target == "ds":
        return ds
    # kubectl -n kube-system get pod -l app.kubernetes.io/name=nri-resource-policy-balloons
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == NAME
    pod = {"metadata": ds["spec"]["template"]["metadata"], "spec": ds["spec"]["template"]["spec"]}
    return {"items": [pod]}


HELPER = '{.items[0].spec.containers[?(@.name=="sst-helper")]'
PLUGIN = '{.items[0].spec.containers[?(@.name=="nri-resource-policy-balloons")]'
PLUGIN_SC = (
    '{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]},"privileged":false,'
    '"readOnlyRootFilesystem":true,"seccompProfile":{"type":"RuntimeDefault"}}'
)
ARGS = (
    '["serve","--socket","ipc:///run/nri-sst/helper.sock","--backend","%s","--host-root","/host"]'
)

# jsonpath -> (output with allowPCT=true, output with the defaults)
EXPECTED = {
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


def test_readme_documents_exactly_the_checked_commands() -> None:
    assert sorted(jp for _, jp in readme_commands()) == sorted(EXPECTED)


@pytest.mark.parametrize("target_expr", readme_commands(), ids=lambda t: t[1][:60])
def test_readme_command_outputs(
    target_expr: tuple[str, str],
    pct_docs: list[dict[str, Any]],
    default_docs: list[dict[str, Any]],
) -> None:
    target, expr = target_expr
    with_pct, without = EXPECTED[expr]
    assert jsonpath(objects(pct_docs, target), expr) == with_pct
    assert jsonpath(objects(default_docs, target), expr) == without


def test_the_specs_literal_commands_on_this_chart(
    pct_docs: list[dict[str, Any]],
) -> None:
    """The spec's ``containers[0]`` commands select the plugin here: it is not
    privileged and has no hostdev mount, which is why the README selects the
    ``sst-helper`` container by name instead."""
    pods = objects(pct_docs, "pods")
    assert jsonpath(pods, "{.items[0].spec.containers[0].securityContext}") == PLUGIN_SC
    assert jsonpath(pods, '{.items[0].spec.containers[0].volumeMounts[?(@.name=="hostdev")]}') == ""
    assert jsonpath(pods, "{.items[0].spec.containers[1].securityContext}") == '{"privileged":true}'

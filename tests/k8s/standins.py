"""The built-in kinds the apiextensions-apiserver lacks, served from CRDs (:data:`STANDINS`).

The server has no core API (``/api/v1``): no Namespaces, Pods, Events, Services.
The node proxy (:mod:`node_proxy`) serves these paths from stand-in CRDs:

* Nodes: ``/api/v1/nodes*`` is served by the proxy, backed by a stand-in CRD
  ``nodes.core.fake`` (cluster scope, ``/status`` subresource, any fields kept).
  ``CoreV1Api`` create/get/list/watch/patch/patch_status/delete work, with
  ``apiVersion: v1`` rewritten both ways. Differences from a real Node: status sent
  on create is dropped (``create_node`` seeds it with a ``/status`` merge patch),
  strategic merge patches are applied as JSON merge patches (the same result for
  the ``capacity`` map), JSON patches work as on a real server (``remove`` of a
  missing key: 422), no kubelet derives ``allocatable`` from ``capacity``.
* Pods (``/api/v1/[namespaces/NS/]pods*``, ``pods.core.fake``), Namespaces
  (``default`` and ``kube-system`` exist; a custom resource's namespace still needs
  no object) and DaemonSets
  (``/apis/apps/v1/[namespaces/NS/]daemonsets*``, ``daemonsets.apps.fake``) the
  same way (:data:`STANDINS`): stored objects only, nothing runs them; label
  selectors work. They serve the rendered chart's objects to ``kubectl``.
* Discovery as ``kubectl`` reads it: the proxy serves ``/api``, ``/api/v1``,
  ``/apis`` (the upstream lists no groups of its own) and ``/apis/apps[/v1]``, so
  ``kubectl get node``, ``kubectl -n kube-system get pod -l ...``, ``kubectl get
  ds/NAME`` and ``kubectl get noderesourcetopologies...`` work as on a cluster
  (``*.fake`` groups are left out of ``/apis``); ``kubectl apply -f`` and ``delete
  -f`` of a BalloonsPolicy work too (the server validates fields: the stand-ins'
  OpenAPI says so, see ``_openapi_v3``). No schemas in that OpenAPI: ``kubectl
  explain`` does not work.

Its neighbours (the stack's other modules): see :mod:`stack`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StandIn:
    """A built-in kind the apiextensions-apiserver lacks, served from a CRD of ``fake_group``.

    The proxy maps the real paths (``prefix``: ``/api/v1`` or ``/apis/GROUP/v1``,
    then ``[watch/][namespaces/NS/]PLURAL...``) onto the CRD's, rewrites
    ``apiVersion`` both ways and serves the discovery documents kubectl reads.
    """

    kind: str
    plural: str
    api_version: str  # the real one: "v1", "apps/v1"
    fake_group: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    status: bool = False  # a /status subresource (the Node's capacity is status)
    #: the CRD's plural when it cannot be ``plural`` (the server reads
    #: ``/apis/G/V/namespaces/NAME`` as a namespace, not as an object's name)
    fake_plural: str = ""

    @property
    def crd_plural(self) -> str:
        return self.fake_plural or self.plural

    @property
    def prefix(self) -> str:
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"

    @property
    def fake_api_version(self) -> str:
        return f"{self.fake_group}/v1"

    def crd(self) -> dict[str, Any]:
        version: dict[str, Any] = {
            "name": "v1",
            "served": True,
            "storage": True,
            "schema": {
                "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            },
        }
        if self.status:
            version["subresources"] = {"status": {}}
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{self.crd_plural}.{self.fake_group}"},
            "spec": {
                "group": self.fake_group,
                "scope": "Namespaced" if self.namespaced else "Cluster",
                "names": {
                    "kind": self.kind,
                    "listKind": f"{self.kind}List",
                    "plural": self.crd_plural,
                    "singular": self.kind.lower(),
                },
                "versions": [version],
            },
        }

    def resources(self) -> list[dict[str, Any]]:
        """This kind's entries of its group version's ``APIResourceList``."""
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        main: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        out = [main]
        if self.status:
            out.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return out


#: the built-in kinds the stack serves through stand-ins: Nodes (the agent's
#: capacity patches, the spec's step 9.1/10 queries), the chart's DaemonSet and
#: its Pod (the spec's step 4 and the chart README's kubectl checks), and
#: Namespaces (kubectl looks its namespace up to explain a 404)
STANDINS = (
    StandIn("Node", "nodes", "v1", "core.fake", False, ("no",), status=True),
    StandIn("Namespace", "namespaces", "v1", "core.fake", False, ("ns",), True, "nsobjects"),
    StandIn("Pod", "pods", "v1", "core.fake", True, ("po",), status=True),
    StandIn("DaemonSet", "daemonsets", "apps/v1", "apps.fake", True, ("ds",), status=True),
)
#: the Namespace objects a cluster has from the start (others are not checked)
NAMESPACES = ("default", "kube-system")
FAKE_GROUP = "core.fake"
FAKE_API_VERSION = f"{FAKE_GROUP}/v1"
NODE_CRD: dict[str, Any] = STANDINS[0].crd()


_STANDIN_PATH = re.compile(r"(/watch)?(/namespaces/[^/]+)?/([^/]+)(/.*)?")
#: the group versions only stand-ins serve ("v1", "apps/v1")
_STANDIN_VERSIONS = tuple(dict.fromkeys(kind.api_version for kind in STANDINS))
_FAKE_GROUPS = frozenset(kind.fake_group for kind in STANDINS)


def _standin_path(path: str) -> tuple[StandIn, str] | None:
    """The stand-in for a built-in kind's path and the path of its CRD, else None."""
    for kind in STANDINS:
        if not path.startswith(kind.prefix + "/"):
            continue
        tail = path[len(kind.prefix) :]
        m = _STANDIN_PATH.fullmatch(tail)
        if m and m[3] == kind.plural and (m[2] is None or kind.namespaced):
            watch, ns, _plural, rest = (g or "" for g in m.groups())
            return kind, f"/apis/{kind.fake_api_version}{watch}{ns}/{kind.crd_plural}{rest}"
    return None


def _request_to_fake(kind: StandIn, body: bytes) -> bytes:
    """A body of the real kind (or its list) gets the stand-in's ``apiVersion``."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body
    if (
        isinstance(obj, dict)
        and obj.get("apiVersion") == kind.api_version
        and obj.get("kind") in (kind.kind, f"{kind.kind}List")
    ):
        obj["apiVersion"] = kind.fake_api_version
        return json.dumps(obj).encode()
    return body


def _response_to_real(kind: StandIn, data: bytes, status: int = 200) -> bytes:
    """The stand-in's ``apiVersion`` back to the real one; in an error's Status,
    the resource named as a real server names it (``nodes "x" not found``)."""
    fake = f'"apiVersion":"{kind.fake_api_version}"'.encode()
    data = data.replace(fake, f'"apiVersion":"{kind.api_version}"'.encode())
    if status >= 400:
        group = kind.api_version.rpartition("/")[0]
        real = f"{kind.plural}.{group}" if group else kind.plural
        data = data.replace(f"{kind.crd_plural}.{kind.fake_group}".encode(), real.encode())
    return data


def _resource_list(group_version: str) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            r for kind in STANDINS if kind.api_version == group_version for r in kind.resources()
        ],
    }


def _api_group(group_version: str) -> dict[str, Any]:
    group, version = group_version.split("/")
    gv = {"groupVersion": group_version, "version": version}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [gv],
            "preferredVersion": gv}  # fmt: skip


def _openapi_path(gv: str) -> str:
    """The OpenAPI v3 root's key for a group version (``api/v1``, ``apis/apps/v1``)."""
    return "api/v1" if gv == "v1" else f"apis/{gv}"


def _openapi_v3(gv: str) -> dict[str, Any]:
    """The OpenAPI v3 document of a stand-in group version, as little as kubectl reads:
    each kind's PATCH operation with its GVK and the ``fieldValidation`` parameter.

    kubectl's ``--validate=strict`` (the default of ``apply``/``create``) checks
    there whether the server validates fields itself, and for a custom resource whose
    group it does not find, it checks the Namespace's PATCH in ``api/v1``; then it
    sends ``fieldValidation=Strict`` and the real server validates (the CRD schema's
    unknown fields rejected). Without this document kubectl falls back to
    ``/openapi/v2``, which this server does not have, and refuses."""
    group, _, version = gv.rpartition("/")
    paths: dict[str, Any] = {}
    for kind in STANDINS:
        if kind.api_version != gv:
            continue
        ns = "/namespaces/{namespace}" if kind.namespaced else ""
        paths[f"{kind.prefix}{ns}/{kind.plural}/{{name}}"] = {
            "patch": {
                "x-kubernetes-group-version-kind": {
                    "group": group, "version": version, "kind": kind.kind},
                "parameters": [
                    {"name": name, "in": "query", "schema": {"type": "string"}}
                    for name in ("dryRun", "fieldManager", "fieldValidation", "force")
                ],
                "responses": {"200": {"description": "OK"}},
            }
        }  # fmt: skip
    return {
        "openapi": "3.0.0",
        "info": {"title": "nri-test stand-ins", "version": gv},
        "paths": paths,
        "components": {},
    }


def _discovery(path: str, host: str) -> dict[str, Any] | None:
    """The discovery documents of the stand-ins' group versions (``/api``, ``/api/v1``,
    ``/apis/apps``, ``/apis/apps/v1``); ``/apis`` itself needs the upstream's groups."""
    path = path.rstrip("/") or "/"
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }
    for gv in _STANDIN_VERSIONS:
        if path == f"/openapi/v3/{_openapi_path(gv)}":
            return _openapi_v3(gv)
        if path == ("/api/v1" if gv == "v1" else f"/apis/{gv}"):
            return _resource_list(gv)
        if gv != "v1" and path == f"/apis/{gv.split('/')[0]}":
            return _api_group(gv)
    return None

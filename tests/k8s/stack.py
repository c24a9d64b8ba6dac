#!/usr/bin/env python3
"""A real Kubernetes API server for the k8s test tier: apiextensions-apiserver + etcd.

No ``kube-apiserver`` can be had here (see ``shared/reference/k8s.md``,
Feasibility B1), but the CRD server that is embedded in it can:
``k8s.io/apiextensions-apiserver`` (v1.36 code) is built from Debian **sid**'s Go
source packages in GOPATH mode, ``etcd`` comes from sid's ``etcd-server``. They
serve CRDs and custom resources with real semantics (structural-schema validation
and pruning, the ``/status`` subresource, ``generation``, ``resourceVersion`` and
409 conflicts, ``fieldSelector=metadata.name``, watch).

Tools::

    python tests/k8s/stack.py build   # fetch + build once, cached (~4-5 min fresh)
    python tests/k8s/stack.py up      # start a stack, print its kubeconfig, Ctrl-C stops

API used by the tests (``tests/k8s/conftest.py`` has the session fixture
``k8s_stack`` giving a started :class:`Stack`)::

    with Stack() as st:
        st.kubeconfig          # Path: kubeconfig for the node proxy (plain http, no auth);
                               #   give it to the agent (--kubeconfig) or to
                               #   kubernetes.config.load_kube_config()
        st.server              # "http://127.0.0.1:PORT" (the same proxy)
        st.api_client()        # a new kubernetes.client.ApiClient on st.kubeconfig
                               #   (a context manager: `with st.api_client() as api:`)
        st.create_node("n1", labels={"config.nri/group": "g"}, capacity={"cpu": "8"})
                               # -> V1Node, status.capacity (and allocatable) seeded;
                               #   capacity defaults to cpu 4, memory 8Gi, pods 110
        st.direct_kubeconfig   # the apiserver itself (https + admin client cert)
        st.log_text("apiserver" | "etcd" | "proxy")
        st.work_dir            # temp dir with pki/, etcd/, the kubeconfigs and logs

    Stack(cache, crds_dir=None)   # a bare stack: only the Node stand-in CRD

What the server is, and is not:

* ``build()`` caches the two binaries under ``$NRI_K8S_CACHE/bin`` (default
  ``~/.cache/nri-resource-policy/k8s/bin``) with a stamp (``build.json``); a second
  call costs nothing. The .debs, the unpacked tree and the Go cache are removed
  after the build.
* Installed CRDs: ``charts/nri-resource-policy-balloons/crds/*.yaml``
  (``balloonspolicies.config.nri``, ``noderesourcetopologies.topology.node.k8s.io``),
  both Established and served when ``start()`` returns. The server applies the
  CRDs' defaults (a BalloonsPolicy reads back with e.g. ``pinCPU: true``) and
  prunes unknown fields, so a patch setting a field to its default changes nothing
  and sends no watch event.
* There is no core API (``/api/v1``): no Namespaces, Pods, Events, Services. A
  namespaced custom resource can be created in any namespace (``kube-system``
  included) all the same: namespaces do not exist as objects and are not checked
  (the NamespaceLifecycle admission plugin is off).
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
* Everything listens on 127.0.0.1, on ports picked free at start; the processes are
  stopped by PID and the temporary directory is removed by ``stop()``. If the
  starting process is killed outright, its children get SIGTERM from the kernel
  (``PR_SET_PDEATHSIG``, when started from the main thread); only the
  ``/tmp/nri-k8s-*`` directory is then left.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_TESTS = _HERE.parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from _debian import (  # noqa: E402
    CommandError,
    apt_config,
    apt_env,
    cache_lock,
    debian_source,
    dpkg_extract,
    run,
)

REPO = _TESTS.parent
CHART_CRDS = REPO / "charts" / "nri-resource-policy-balloons" / "crds"

#: bump when the build recipe changes: a cached build of another recipe is redone
RECIPE = 1
#: the packages whose dependency closure (``golang-*``, ``etcd-server``) is fetched
ROOT_PACKAGES = ("golang-k8s-apiextensions-apiserver-dev", "golang-go", "etcd-server")
GO_PACKAGE = "k8s.io/apiextensions-apiserver"
APISERVER = "apiextensions-apiserver"
ETCD = "etcd"
STAMP = "build.json"


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

APISERVER_DISABLED_ADMISSION = (
    "NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
    "ValidatingAdmissionPolicy,MutatingAdmissionPolicy"
)


class StackError(RuntimeError):
    """The binaries cannot be built or the stack cannot be started."""


def _log(msg: str) -> None:
    print(f"[k8s-stack] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """``$NRI_K8S_CACHE`` or ``~/.cache/nri-resource-policy/k8s``."""
    env = os.environ.get("NRI_K8S_CACHE")
    return Path(env or Path.home() / ".cache" / "nri-resource-policy" / "k8s").expanduser()


def binaries(cache: Path | None = None) -> dict[str, Path]:
    """Where the built binaries are (or will be): ``{"apiextensions-apiserver":, "etcd":}``."""
    bindir = (cache or cache_dir()) / "bin"
    return {APISERVER: bindir / APISERVER, ETCD: bindir / ETCD}


def cached_build(cache: Path | None = None) -> dict[str, Any] | None:
    """The stamp of a usable cached build of this recipe, else None."""
    cache = cache or cache_dir()
    try:
        stamp = json.loads((cache / "bin" / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("recipe") != RECIPE:
        return None
    if not all(os.access(p, os.X_OK) for p in binaries(cache).values()):
        return None
    return stamp


# --------------------------------------------------------------------------- build


def _closure(env: dict[str, str]) -> list[str]:
    """``golang-*`` and ``etcd-server`` in the dependency closure of ROOT_PACKAGES."""
    out = run(
        [
            "apt-cache",
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            "--no-pre-depends",
            *ROOT_PACKAGES,
        ],
        env=env,
        error=StackError,
    ).stdout
    names = {ln.strip() for ln in out.splitlines() if ln and not ln[0].isspace()}
    return sorted(n for n in names if n.startswith("golang-") or n == "etcd-server")


def _deb_versions(debs: list[Path]) -> dict[str, str]:
    """``{package: version}`` from ``name_version_arch.deb`` file names."""
    out = {}
    for deb in debs:
        name, version, _arch = deb.stem.split("_")
        out[name] = urllib.parse.unquote(version)
    return out


def _go_bin(root: Path) -> Path:
    def key(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", p.parent.parent.name))

    gos = sorted(root.glob("usr/lib/go-*/bin/go"), key=key)
    if not gos:
        raise StackError(f"no Go toolchain (usr/lib/go-*/bin/go) unpacked under {root}")
    return gos[-1]


def _go_build(root: Path, work: Path, out: Path, say: Callable[[str], None]) -> str:
    """Build GO_PACKAGE in GOPATH mode with the unpacked toolchain; returns ``go version``."""
    go = _go_bin(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    env.update(
        PATH=f"{go.parent}:{env.get('PATH', '/usr/bin:/bin')}",
        GO111MODULE="off",
        GOPATH=str(root / "usr" / "share" / "gocode"),
        GOCACHE=str(work / "gocache"),
        GOENV="off",
        GOPROXY="off",
        GOTOOLCHAIN="local",
        GOFLAGS="",
        CGO_ENABLED="0",
    )
    version = run([str(go), "version"], env=env, error=StackError).stdout.strip()
    say(f"go build {GO_PACKAGE} ({version}, GOPATH mode): a few minutes on 2 cores")
    log = work / "go-build.log"
    cmd = [str(go), "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out), GO_PACKAGE]
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=fh, stderr=subprocess.STDOUT)
        next_note = 30.0
        while proc.poll() is None:
            time.sleep(0.5)
            if time.monotonic() - t0 >= next_note:
                say(f"go build: still compiling ({next_note:.0f}s)")
                next_note += 30
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise StackError(f"go build {GO_PACKAGE} failed ({proc.returncode}):\n{tail}")
    say(f"go build: done in {time.monotonic() - t0:.0f}s")
    return version


def build(
    cache: Path | str | None = None,
    *,
    force: bool = False,
    keep_build_dir: bool = False,
    say: Callable[[str], None] = _log,
) -> dict[str, Path]:
    """Fetch, unpack and build; returns :func:`binaries`. Cached: a second call costs nothing.

    Steps (everything under ``cache/build``, removed afterwards unless
    ``keep_build_dir``): a private APT config for sid (the system's ``/etc/apt``
    is not touched), ``apt-get update``, the ``golang-*`` + ``etcd-server``
    dependency closure of ROOT_PACKAGES, ``apt-get download``, ``dpkg -x``,
    ``go build`` of ``k8s.io/apiextensions-apiserver`` in GOPATH mode, a copy of
    ``etcd``; both land in ``cache/bin`` with the stamp ``build.json``.
    Raises :class:`StackError` on failure (a sid transition, no network...).
    """
    cache = Path(cache).expanduser() if cache else cache_dir()
    cache = cache.resolve()
    bins = binaries(cache)
    if not force and (stamp := cached_build(cache)):
        say(f"cached build ({stamp.get('built', '?')}): {bins[APISERVER].parent}")
        return bins
    for tool in ("apt-get", "apt-cache", "dpkg"):
        if shutil.which(tool) is None:
            raise StackError(f"{tool} not found (a Debian machine is needed to build)")
    with cache_lock(cache):
        if not force and cached_build(cache):  # built by another process meanwhile
            return bins
        work = cache / "build"
        shutil.rmtree(work, ignore_errors=True)
        t0 = time.monotonic()
        try:
            env = apt_env(apt_config(work / "apt", debian_source("sid"), own_status=True))
            say("apt-get update (private sid sources)")
            run(["apt-get", "update", "-q"], env=env, timeout=900, error=StackError)
            names = _closure(env)
            missing = sorted(set(ROOT_PACKAGES) - set(names))
            if missing:
                raise StackError(f"sid has no {missing}")
            debdir = work / "debs"
            debdir.mkdir()
            say(f"apt-get download: {len(names)} packages (~310 MB)")
            run(
                ["apt-get", "download", "-q", *names],
                cwd=debdir,
                env=env,
                timeout=1800,
                error=StackError,
            )
            debs = sorted(debdir.glob("*.deb"))
            size = sum(d.stat().st_size for d in debs) / 1e6
            say(f"dpkg -x {len(debs)} packages ({size:.0f} MB)")
            root = work / "root"
            try:
                dpkg_extract(debs, root)
            except CommandError as e:
                raise StackError(str(e)) from None
            bindir = bins[APISERVER].parent
            bindir.mkdir(parents=True, exist_ok=True)
            (bindir / STAMP).unlink(missing_ok=True)
            tmp_api = work / APISERVER
            go_version = _go_build(root, work, tmp_api, say)
            etcd_src = root / "usr" / "bin" / "etcd"
            if not etcd_src.is_file():
                raise StackError("etcd-server did not unpack usr/bin/etcd")
            tmp_etcd = work / ETCD
            shutil.copy2(etcd_src, tmp_etcd)
            etcd_version = run([str(tmp_etcd), "--version"], error=StackError).stdout
            run([str(tmp_api), "--help"], error=StackError)
            os.replace(tmp_api, bins[APISERVER])
            os.replace(tmp_etcd, bins[ETCD])
            versions = _deb_versions(debs)
            stamp = {
                "recipe": RECIPE,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": round(time.monotonic() - t0, 1),
                "go": go_version,
                "etcd": etcd_version.splitlines()[0] if etcd_version else "",
                "packages": {
                    n: versions.get(n, "?")
                    for n in (*ROOT_PACKAGES, "golang-k8s-apiserver-dev", "golang-k8s-api-dev")
                },
                "package_count": len(debs),
            }
            (bindir / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        finally:
            if not keep_build_dir:
                shutil.rmtree(work, ignore_errors=True)
    say(f"built in {time.monotonic() - t0:.0f}s: {bins[APISERVER]}, {bins[ETCD]}")
    return bins


# --------------------------------------------------------------------------- the stack


def _free_ports(n: int) -> list[int]:
    """``n`` distinct loopback TCP ports that were free a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """preexec_fn: SIGTERM the child when the thread that started it ends (a crash, say)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _kubeconfig(server: str, *, cert: Path | None = None, key: Path | None = None) -> str:
    cluster: dict[str, Any] = {"server": server}
    user: dict[str, Any] = {}
    if server.startswith("https:"):
        cluster["insecure-skip-tls-verify"] = True
    if cert and key:
        user = {"client-certificate": str(cert), "client-key": str(key)}
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "nri-test", "cluster": cluster}],
        "users": [{"name": "admin", "user": user}],
        "contexts": [{"name": "nri-test", "context": {"cluster": "nri-test", "user": "admin"}}],
        "current-context": "nri-test",
    }
    return json.dumps(cfg, indent=1) + "\n"  # JSON is YAML


class Stack:
    """etcd + apiextensions-apiserver + the node proxy on loopback, CRDs installed.

    See the module docstring for the API. ``start()``/``stop()`` or a ``with`` block.
    """

    def __init__(
        self,
        cache: Path | str | None = None,
        *,
        crds_dir: Path | None = CHART_CRDS,
        say: Callable[[str], None] = _log,
    ) -> None:
        self.cache = Path(cache).expanduser() if cache else cache_dir()
        self.crds_dir = crds_dir
        self.say = say
        self.work_dir: Path | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.etcd_url = ""
        self.apiserver_url = ""
        self.server = ""
        self._stopped: list[subprocess.Popen[bytes]] = []
        self._removed: list[Path] = []

    # ---- paths
    def _path(self, name: str) -> Path:
        if self.work_dir is None:
            raise StackError("the stack is not started")
        return self.work_dir / name

    @property
    def kubeconfig(self) -> Path:
        """Kubeconfig of the node proxy (plain http, no credentials needed)."""
        return self._path("kubeconfig")

    @property
    def direct_kubeconfig(self) -> Path:
        """Kubeconfig of the apiserver itself (https, admin client certificate)."""
        return self._path("admin.kubeconfig")

    def log_path(self, name: str) -> Path:
        """Log file of ``etcd``, ``apiserver`` or ``proxy``."""
        return self._path(f"{name}.log")

    def log_text(self, name: str) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ---- lifecycle
    def start(self, *, timeout: float = 90) -> Stack:
        if self.work_dir is not None:
            raise StackError("already started")
        bins = binaries(self.cache) if cached_build(self.cache) else build(self.cache, say=self.say)
        t0 = time.monotonic()
        self.work_dir = Path(tempfile.mkdtemp(prefix="nri-k8s-"))
        try:
            self._pki()
            self._start_etcd(bins[ETCD], timeout)
            self._start_apiserver(bins[APISERVER], timeout)
            self._start_proxy(timeout)
            self._install_crds(timeout)
        except BaseException:
            self.stop()
            raise
        self.say(
            f"up in {time.monotonic() - t0:.1f}s: {self.server} (kubeconfig {self.kubeconfig})"
        )
        return self

    def stop(self) -> None:
        """Stop every process by PID (SIGTERM, then SIGKILL) and remove the work dir."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self._stopped.extend(self.procs.values())
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self._removed.append(self.work_dir)
        self.procs = {}
        self.work_dir = None

    def leftovers(self) -> list[str]:
        """After ``stop()``: processes still running, a work dir still there."""
        left = [f"pid {p.pid} ({p.args[0]})" for p in self._stopped if p.poll() is None]
        return left + [str(d) for d in self._removed if d.exists()]

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- pieces
    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        with open(self.log_path(name), "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                start_new_session=True,  # Ctrl-C of `up` reaches us only; we stop them
                # the death signal follows the starting *thread*: only the main one lives long
                preexec_fn=(
                    _die_with_parent
                    if threading.current_thread() is threading.main_thread()
                    else None
                ),
            )
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, ready: Callable[[], bool], what: str, timeout: float) -> None:
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                raise StackError(
                    f"{name} exited with {proc.returncode} before {what}:\n"
                    f"{self.log_text(name)[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"{name}: no {what} within {timeout}s:\n{self.log_text(name)[-4000:]}"
                )
            time.sleep(0.2)

    def _pki(self) -> None:
        d = self._path("pki")
        d.mkdir()

        def openssl(*args: str) -> None:
            run(["openssl", *args], cwd=d, error=StackError)

        openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
            "-out", "ca.crt", "-days", "3650", "-subj", "/CN=nri-test-ca",
        )  # fmt: skip
        openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "admin.key",
            "-out", "admin.csr", "-subj", "/O=system:masters/CN=admin",
        )  # fmt: skip
        openssl(
            "x509", "-req", "-in", "admin.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "admin.crt", "-days", "3650",
        )  # fmt: skip

    def _client_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        pki = self._path("pki")
        ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        return ctx

    def _get(self, url: str, ctx: ssl.SSLContext | None = None) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (OSError, ValueError):
            return 0, b""

    def _start_etcd(self, etcd: Path, timeout: float) -> None:
        client, peer = _free_ports(2)
        self.etcd_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self._spawn(
            "etcd",
            [
                str(etcd),
                "--name", "default",
                "--data-dir", str(self._path("etcd")),
                "--listen-client-urls", self.etcd_url,
                "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", peer_url,
                "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"default={peer_url}",
                "--unsafe-no-fsync",
            ],
        )  # fmt: skip
        self._wait(
            "etcd",
            lambda: b'"health":"true"' in self._get(f"{self.etcd_url}/health")[1],
            "healthy /health",
            timeout,
        )

    def _start_apiserver(self, apiserver: Path, timeout: float) -> None:
        (port,) = _free_ports(1)
        self.apiserver_url = f"https://127.0.0.1:{port}"
        pki = self._path("pki")
        self.direct_kubeconfig.write_text(
            _kubeconfig(self.apiserver_url, cert=pki / "admin.crt", key=pki / "admin.key")
        )
        kc = str(self.direct_kubeconfig)
        self._spawn(
            "apiserver",
            [
                str(apiserver),
                "--etcd-servers", self.etcd_url,
                "--bind-address", "127.0.0.1",
                "--secure-port", str(port),
                "--cert-dir", str(self._path("certs")),
                "--client-ca-file", str(pki / "ca.crt"),
                "--kubeconfig", kc,
                "--authentication-kubeconfig", kc,
                "--authorization-kubeconfig", kc,
                "--authentication-skip-lookup",
                "--enable-priority-and-fairness=false",
                "--disable-admission-plugins", APISERVER_DISABLED_ADMISSION,
            ],
        )  # fmt: skip
        ctx = self._client_ssl()
        url = f"{self.apiserver_url}/readyz?exclude=informer-sync"
        self._wait("apiserver", lambda: self._get(url, ctx)[0] == 200, "200 on /readyz", timeout)

    def _start_proxy(self, timeout: float) -> None:
        pki = self._path("pki")
        port_file = self._path("proxy.port")
        self._spawn(
            "proxy",
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "proxy",
                "--upstream", self.apiserver_url,
                "--cert", str(pki / "admin.crt"),
                "--key", str(pki / "admin.key"),
                "--port-file", str(port_file),
            ],
        )  # fmt: skip
        self._wait("proxy", port_file.is_file, "port file", timeout)
        self.server = f"http://127.0.0.1:{int(port_file.read_text())}"
        self.kubeconfig.write_text(_kubeconfig(self.server))
        url = f"{self.server}/readyz?exclude=informer-sync"
        self._wait("proxy", lambda: self._get(url)[0] == 200, "200 on /readyz", timeout)

    def _install_crds(self, timeout: float) -> None:
        import yaml
        from kubernetes import client

        docs: list[dict[str, Any]] = [kind.crd() for kind in STANDINS]
        if self.crds_dir is not None:
            for f in sorted(self.crds_dir.glob("*.yaml")):
                docs.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
        with self.api_client() as api:
            ext = client.ApiextensionsV1Api(api)
            objs = client.CustomObjectsApi(api)
            for doc in docs:
                ext.create_custom_resource_definition(doc)
            for doc in docs:
                name = doc["metadata"]["name"]
                spec = doc["spec"]

                def established(name: str = name) -> bool:
                    crd = ext.read_custom_resource_definition(name)
                    conds = (crd.status and crd.status.conditions) or []
                    return any(c.type == "Established" and c.status == "True" for c in conds)

                def served(spec: dict[str, Any] = spec) -> bool:
                    for v in spec["versions"]:
                        if v.get("served"):
                            try:
                                objs.list_cluster_custom_object(
                                    spec["group"], v["name"], spec["names"]["plural"], limit=1
                                )
                            except client.ApiException:
                                return False
                    return True

                self._wait("apiserver", established, f"CRD {name} Established", timeout)
                self._wait("apiserver", served, f"CRD {name} served", timeout)
            core = client.CoreV1Api(api)
            for ns in NAMESPACES:
                core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns}})  # fmt: skip
        self.say(f"CRDs established: {', '.join(d['metadata']['name'] for d in docs)}")

    # ---- for tests
    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` on :attr:`kubeconfig` (close it after use)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def create_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        capacity: dict[str, str | int] | None = None,
        *,
        allocatable: dict[str, str | int] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> Any:
        """Create Node ``name`` and seed its status; returns the ``V1Node`` read back.

        ``capacity`` defaults to ``{"cpu": "4", "memory": "8Gi", "pods": "110"}``;
        ``allocatable`` defaults to ``capacity``. Status cannot be set on create (the
        stand-in has a status subresource), so it is merge-patched on ``/status``.
        """
        from kubernetes import client

        cap = {k: str(v) for k, v in (capacity or {"cpu": 4, "memory": "8Gi", "pods": 110}).items()}
        alloc = {k: str(v) for k, v in (allocatable or cap).items()}
        body = client.V1Node(
            api_version="v1",
            kind="Node",
            metadata=client.V1ObjectMeta(
                name=name, labels=labels or {}, annotations=annotations or {}
            ),
            spec=client.V1NodeSpec(),
        )
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_node(body)
            return core.patch_node_status(
                name,
                {"status": {"capacity": cap, "allocatable": alloc}},
                _content_type="application/merge-patch+json",
            )


# --------------------------------------------------------------------------- node proxy

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


def proxy_main(upstream: str, cert: str, key: str, port_file: str, port: int = 0) -> None:
    """Serve the node proxy on 127.0.0.1:``port`` (0: any) until killed (needs aiohttp).

    Plain HTTP, no auth. The paths of the :data:`STANDINS` (``/api/v1/nodes*``,
    ``/api/v1/[namespaces/NS/]pods*``, ``/apis/apps/v1/[namespaces/NS/]daemonsets*``)
    go to their ``*.fake`` CRDs with the apiVersion rewritten both ways (also inside
    watch streams, line by line), strategic merge patch turned into merge patch, a
    missing Content-Type defaulted to JSON. Discovery as kubectl reads it is served
    here: ``/api``, ``/api/v1``, ``/apis/apps[/v1]`` from the stand-ins, ``/apis`` from
    the upstream's groups (which it does not list: 404 there) without the ``*.fake``
    ones (legacy discovery: kubectl asks for the aggregated kind first and accepts
    a plain ``APIGroupList``), and ``/openapi/v3`` with the stand-ins' group
    versions added (see :func:`_openapi_v3`). Everything else is passed through. Upstream requests
    use the admin client certificate. The bound port is written to ``port_file`` once listening.
    """
    import asyncio
    import logging

    import aiohttp
    from aiohttp import web
    from yarl import URL

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
    sslctx = ssl.create_default_context()
    sslctx.check_hostname = False
    sslctx.verify_mode = ssl.CERT_NONE
    sslctx.load_cert_chain(cert, key)

    async def upstream_json(session: aiohttp.ClientSession, path: str) -> Any:
        """The upstream's JSON at ``path``; None for 404 (a CRD's group not served yet)."""
        async with session.get(URL(upstream + path, encoded=True), ssl=sslctx) as up:
            if up.status == 404:
                return None
            up.raise_for_status()
            return await up.json()

    async def api_groups(session: aiohttp.ClientSession) -> dict[str, Any]:
        """``/apis``: the upstream's groups (which it does not list itself) and the
        stand-ins' built-in groups, without the stand-ins' own ``*.fake`` groups."""
        crds = await upstream_json(
            session, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        )
        names = ["apiextensions.k8s.io"] + [c["spec"]["group"] for c in crds["items"]]
        groups = [_api_group(gv) for gv in _STANDIN_VERSIONS if gv != "v1"]
        for name in dict.fromkeys(names):
            if name not in _FAKE_GROUPS and (
                group := await upstream_json(session, f"/apis/{name}")
            ):
                groups.append(group)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    async def handle(req: web.Request) -> web.StreamResponse:
        path = req.rel_url.raw_path
        session: aiohttp.ClientSession = req.app["session"]
        if req.method == "GET":
            try:
                if path.rstrip("/") == "/apis":
                    doc = await api_groups(session)
                elif path == "/openapi/v3":
                    doc = await upstream_json(session, path)
                    for gv in _STANDIN_VERSIONS:
                        url = f"/openapi/v3/{_openapi_path(gv)}"
                        doc["paths"][_openapi_path(gv)] = {"serverRelativeURL": url}
                else:
                    doc = _discovery(path, req.host)
            except (aiohttp.ClientError, ValueError, KeyError, TypeError) as e:
                return web.json_response(
                    {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 502,
                     "message": f"node proxy: discovery from {upstream}: {e}"},
                    status=502,
                )  # fmt: skip
            if doc is not None:
                return web.json_response(doc)
        standin = _standin_path(path)
        body = await req.read()
        headers = {k: v for k, v in req.headers.items() if k.lower() in ("content-type", "accept")}
        if body and "Content-Type" not in headers:
            headers["Content-Type"] = "application/json"
        kind: StandIn | None = None
        if standin is not None:
            kind, path = standin
            body = _request_to_fake(kind, body) if body else body
            ctype = headers.get("Content-Type", "")
            if ctype.startswith("application/strategic-merge-patch+json"):
                headers["Content-Type"] = "application/merge-patch+json"
        qs = req.rel_url.raw_query_string
        url = URL(upstream + path + (f"?{qs}" if qs else ""), encoded=True)
        watch = req.query.get("watch", "").lower() in ("true", "1", "t") or "/watch/" in path

        def real(data: bytes, status: int = 200) -> bytes:
            return _response_to_real(kind, data, status) if kind is not None else data

        try:
            async with session.request(
                req.method, url, data=body or None, headers=headers, ssl=sslctx
            ) as up:
                out_headers = {"Content-Type": up.headers.get("Content-Type", "application/json")}
                if "Warning" in up.headers:
                    out_headers["Warning"] = ", ".join(up.headers.getall("Warning"))
                if not watch:
                    data = await up.read()
                    body = real(data, up.status)
                    return web.Response(status=up.status, body=body, headers=out_headers)
                resp = web.StreamResponse(status=up.status, headers=out_headers)
                await resp.prepare(req)
                buf = b""
                async for chunk in up.content.iter_any():
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        await resp.write(real(line) + b"\n")
                if buf:
                    await resp.write(real(buf))
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as e:
            return web.json_response(
                {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 502,
                 "message": f"node proxy: upstream {upstream}: {e}"},
                status=502,
            )  # fmt: skip

    async def serve() -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", handle)
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            app["session"] = session
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", port)
            await site.start()
            bound = runner.addresses[0][1]
            tmp = Path(port_file + ".tmp")
            tmp.write_text(f"{bound}\n")
            tmp.replace(port_file)
            logging.info("node proxy on http://127.0.0.1:%d -> %s", bound, upstream)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            # no graceful shutdown: aiohttp would wait for open watches to end
            logging.info("node proxy stopping")
            logging.shutdown()
            os._exit(0)

    asyncio.run(serve())


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=None, help="default: $NRI_K8S_CACHE or ~/.cache/...")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="fetch + build the binaries (cached)")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.add_argument("--keep-build-dir", action="store_true", help="keep debs/root/gocache")
    sub.add_parser("up", help="start a stack and keep it running until Ctrl-C")
    p = sub.add_parser("proxy", help="(internal) the node proxy")
    p.add_argument("--upstream", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--port", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "build":
            t0 = time.monotonic()
            bins = build(a.cache, force=a.force, keep_build_dir=a.keep_build_dir)
            for name, path in bins.items():
                print(f"{name}: {path}")
            print(f"build: {time.monotonic() - t0:.1f}s")
        elif a.cmd == "up":
            stop = False

            def on_signal(signum: int, frame: object) -> None:
                nonlocal stop
                stop = True

            with Stack(a.cache) as st:
                signal.signal(signal.SIGINT, on_signal)
                signal.signal(signal.SIGTERM, on_signal)
                print(f"apiserver:  {st.apiserver_url} (etcd {st.etcd_url})")
                print(f"proxy:      {st.server}")
                print(f"kubeconfig: {st.kubeconfig}")
                print(f"direct:     {st.direct_kubeconfig}")
                print(f"logs:       {st.work_dir}/{{etcd,apiserver,proxy}}.log")
                print(f"try:        kubectl --kubeconfig {st.kubeconfig} get nodes")
                print("Ctrl-C stops", flush=True)
                while not stop and all(p.poll() is None for p in st.procs.values()):
                    time.sleep(0.5)
                dead = [n for n, p in st.procs.items() if p.poll() is not None]
                if dead:
                    print(f"exited: {dead}; stopping", file=sys.stderr)
            print("stopped")
        elif a.cmd == "proxy":
            proxy_main(a.upstream, a.cert, a.key, a.port_file, a.port)
    except StackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

* ``build()`` (:mod:`apiserver_build`) builds the two binaries once and caches them
  under ``$NRI_K8S_CACHE/bin``; ``start()`` builds them when the cache has none.
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
* Nodes, Pods, Namespaces and DaemonSets are stand-ins (:mod:`standins`) served by the
  node proxy (:mod:`node_proxy`), with the discovery documents and the OpenAPI kubectl
  reads.
* Everything listens on 127.0.0.1, on ports picked free at start; the processes are
  stopped by PID and the temporary directory is removed by ``stop()``. If the
  starting process is killed outright, its children get SIGTERM from the kernel
  (``PR_SET_PDEATHSIG``, when started from the main thread); only the
  ``/tmp/nri-k8s-*`` directory is then left.

Neighbours: :mod:`apiserver_build` (the two binaries, built from Debian sources),
:mod:`standins` (the built-in kinds served from CRDs, discovery, OpenAPI),
:mod:`node_proxy` (the loopback proxy that serves them).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
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
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_TESTS = _HERE.parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from _debian import run  # noqa: E402
from apiserver_build import (  # noqa: E402
    APISERVER,
    ETCD,
    StackError,
    _log,
    binaries,
    build,
    cache_dir,
    cached_build,
)
from node_proxy import proxy_main  # noqa: E402
from standins import NAMESPACES, STANDINS  # noqa: E402

REPO = _TESTS.parent
CHART_CRDS = REPO / "charts" / "nri-resource-policy-balloons" / "crds"

APISERVER_DISABLED_ADMISSION = (
    "NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
    "ValidatingAdmissionPolicy,MutatingAdmissionPolicy"
)


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

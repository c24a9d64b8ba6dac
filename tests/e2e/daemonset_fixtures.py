"""What the chart's DaemonSet pod needs around it in the e2e tier (``test_daemonset_e2e``).

* :func:`render_chart`: the chart rendered with the Helm library (as ``tests/chart``
  renders it; the same ``render``), and the DaemonSet / BalloonsPolicy of it;
* :class:`ApiFront`: the in-cluster endpoint the pod's ``kube-api-access`` points
  at: HTTPS on 127.0.0.1 with a CA of its own (the projected ``ca.crt``), every
  request checked for the projected bearer token (401 otherwise), forwarded to the
  k8s tier's API server stack (``tests/k8s/stack.py``, whose proxy needs no
  credentials). Ours, small: it stands in for kube-apiserver's service-account
  authentication, which the stack's apiextensions-apiserver cannot do;
* :func:`images`: the two images built by ``tests/images/builder.py``, imported with
  ``ctr -n k8s.io images import`` into the env's containerd.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import secrets
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

_HERE = Path(__file__).resolve().parent
_TESTS = _HERE.parent
REPO = _TESTS.parent
EXAMPLES = REPO / "examples" / "pct-managed"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
# appended, not prepended: tests/k8s has a conftest.py too, and the e2e modules'
# ``from conftest import ...`` must keep finding tests/e2e's
if str(_TESTS / "k8s") not in sys.path:
    sys.path.append(str(_TESTS / "k8s"))


def _chart_module() -> ModuleType:
    """``tests/chart/rendering.py`` (the chart tier's ``render``), loaded as a plain module."""
    spec = importlib.util.spec_from_file_location(
        "nri_chart_rendering", _TESTS / "chart" / "rendering.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def render_chart(values: dict[str, Any], namespace: str = "kube-system") -> list[dict[str, Any]]:
    """``helm template --namespace NS`` of the chart with ``values`` (the Helm Go SDK)."""
    docs: list[dict[str, Any]] = _chart_module().render(values, namespace=namespace)
    return docs


def find(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind]
    assert len(hits) == 1, f"expected one {kind}, got {len(hits)}"
    return hits[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- API front


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class ApiFront:
    """HTTPS + bearer token in front of ``upstream`` (plain http); see the module doc."""

    def __init__(self, upstream: str, work: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self.work = work
        self.token = secrets.token_urlsafe(32)
        self.port = 0
        self.requests = 0
        self.rejected = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    @property
    def ca_crt(self) -> bytes:
        return (self.work / "ca.crt").read_bytes()

    def _pki(self) -> ssl.SSLContext:
        w = self.work
        w.mkdir(parents=True, exist_ok=True)
        (w / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc\n")
        _openssl(w, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                 "-out", "ca.crt", "-days", "2", "-subj", "/CN=nri-e2e-ca")  # fmt: skip
        _openssl(w, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
                 "-out", "server.csr", "-subj", "/CN=kubernetes")  # fmt: skip
        _openssl(w, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "server.crt", "-days", "2",
                 "-extfile", "san.cnf")  # fmt: skip
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(w / "server.crt", w / "server.key")
        return ctx

    def start(self) -> ApiFront:
        ctx = self._pki()
        ready = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            try:
                asyncio.run(self._serve(ctx, ready))
            except BaseException as exc:  # reported by start()
                errors.append(exc)
                ready.set()

        self._thread = threading.Thread(target=main, name="api-front", daemon=True)
        self._thread.start()
        if not ready.wait(30) or errors:
            raise RuntimeError(f"API front did not start: {errors}")
        return self

    async def _serve(self, ctx: ssl.SSLContext, ready: threading.Event) -> None:
        import aiohttp
        from aiohttp import web

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5))

        async def handle(req: web.Request) -> web.StreamResponse:
            self.requests += 1
            scheme, _, token = req.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token != self.token:  # RFC 7235: any case
                self.rejected += 1
                return web.json_response(
                    {"kind": "Status", "status": "Failure", "code": 401, "reason": "Unauthorized"},
                    status=401,
                )
            headers = {
                k: v
                for k, v in req.headers.items()
                if k.lower() not in ("host", "authorization", "content-length")
            }
            body = await req.read()
            async with session.request(
                req.method, self.upstream + req.path_qs, headers=headers, data=body or None
            ) as up:
                resp = web.StreamResponse(status=up.status)
                for k in ("Content-Type",):
                    if k in up.headers:
                        resp.headers[k] = up.headers[k]
                await resp.prepare(req)
                try:
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                    await resp.write_eof()
                except (aiohttp.ClientError, ConnectionError):
                    pass  # a watch ended by either side (the plugin stopped, the stack stopped)
                return resp

        app = web.Application(client_max_size=4 << 20)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        try:
            await self._stop.wait()
        finally:
            await session.close()  # ends the forwarded watches first
            await runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(15)


@contextlib.contextmanager
def k8s_api(work: Path) -> Iterator[tuple[Any, ApiFront]]:
    """The k8s tier's stack (built once, cached) with an :class:`ApiFront` before it."""
    from apiserver_build import build, cache_dir
    from stack import Stack

    build(cache_dir())
    st = Stack(cache_dir()).start()
    front = None
    try:
        front = ApiFront(st.server, work).start()
        yield st, front
    finally:
        if front is not None:
            front.stop()
        st.stop()


# --------------------------------------------------------------------------- images


def _images_module() -> ModuleType:
    """``tests/images/builder.py`` (loaded by path, as its own module)."""
    spec = importlib.util.spec_from_file_location(
        "nri_images_build", _TESTS / "images" / "builder.py"
    )
    if spec is None or spec.loader is None:
        raise ImportError("tests/images/builder.py is missing")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def build_images(say: Any = print) -> dict[str, Path]:
    """``tests/images/builder.py``'s two archives (``{"plugin": .., "sst-helper": ..}``)."""
    out: dict[str, Path] = _images_module().build_images(say=say)
    return out


def image_refs() -> tuple[str, str]:
    """``(PLUGIN_REF, HELPER_REF)`` of ``tests/images/builder.py``."""
    mod = _images_module()
    return mod.PLUGIN_REF, mod.HELPER_REF

"""The node proxy: the stand-ins' paths onto their CRDs, discovery, the rest passed through.

Started by :class:`stack.Stack` as ``python tests/k8s/stack.py proxy ...`` (a process of
its own, on loopback); see :func:`proxy_main`.

Its neighbours (the stack's other modules): see :mod:`stack`.
"""

from __future__ import annotations

import os
import signal
import ssl
import sys
from pathlib import Path
from typing import Any

from standins import (
    _FAKE_GROUPS,
    _STANDIN_VERSIONS,
    StandIn,
    _api_group,
    _discovery,
    _openapi_path,
    _request_to_fake,
    _response_to_real,
    _standin_path,
)


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

"""The plugin's instrumentation endpoint: ``/healthz``, ``/metrics``, ``/debug/state``.

An HTTP/1.1 server on the plugin's own asyncio event loop (stdlib streams;
``prometheus_client`` only renders the exposition). It shares the loop with
the NRI connection, so every handler is short and synchronous between two
``await``\\ s: a scrape reads the policy's state between two NRI requests,
never during one, and needs no locks. Slow or oversized requests are cut off
(:data:`READ_TIMEOUT`, :data:`MAX_REQUEST`); an NRI reply never waits for a
client.

Address: ``HOST:PORT``; ``:PORT`` listens on every interface, as upstream's
``instrumentation.httpEndpoint`` (``":8891"``, the chart's default, where the
kubelet's probes and Prometheus reach the pod); ``[V6]:PORT`` for IPv6;
port ``0`` picks a free port (logged). ``--metrics-address`` names it, else
the policy's configuration does (:func:`~nri_framework.hookspecs.policy_instrumentation`,
balloons' ``instrumentation.httpEndpoint``): a changed answer moves the
endpoint (the new address bound first, the old one closed; one that cannot
be bound leaves the old one serving), and ``--metrics-address`` overrides it.

Health (``/healthz``): an NRI plugin is *healthy* when the runtime can hand
it decisions, that is when all of these hold:

1. the policy started (``policy_start`` returned); the server starts before
   it, so that a pod lacking a path the start needs (sysfs, a writable state
   directory: :mod:`nri_framework.startup`) answers with that path as the reason,
2. the plugin is registered with the runtime (its RegisterPlugin answered;
   else the reason names the socket and why it cannot be connected to),
3. the runtime configured it (Configure: the event subscription is set),
4. the runtime synchronized it (Synchronize: the policy knows every running
   container), or the runtime never synchronizes this plugin (a pre-launched
   plugin of an NRI before v0.10, which restores from its state file instead), and
5. the SST helper's socket is there, when ``--sst-helper`` names one.

Then ``200 ok``; otherwise ``503`` with the first condition that fails as the
reason (upstream answers 500 with per-checker errors; a probe treats both as
failure). While the runtime restarts, the plugin is unhealthy until it has
reconnected and been synchronized again.

``/livez``: ``200 ok`` whenever the process answers at all, also while it
waits for a path the pod lacks: the liveness probe's endpoint, so that the
kubelet does not restart (and crash-loop) a plugin that is waiting on
purpose; ``/healthz`` is the readiness.

``/metrics``: the Prometheus text exposition (OpenMetrics when the scraper
asks for it) of the process (``process_*``, ``python_*``), of the host
(``nri_resource_policy_*``) and of the policy: what
:func:`~nri_framework.hookspecs.policy_collect_metrics` returns, each family
named ``nri_policy_<name>[_<unit>]`` (upstream's ``policy`` provider with the
``nri`` namespace: the balloons gauge is ``nri_policy_balloons_cores``).
Before ``/metrics`` and ``/debug/state`` collect, the scrape awaits what
:func:`~nri_framework.hookspecs.policy_before_scrape` returns (a policy's
reading of a peer), :data:`SCRAPE_WAIT` seconds at most, NRI requests served
meanwhile.

``/debug/state``: JSON for ``nri-resource-policy inspect``: the plugin, the
runtime, the health, the cached containers with their cpusets, and under
``policy`` what :func:`~nri_framework.hookspecs.policy_inspect` returns.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from nri_framework import __version__
from nri_framework.contract import MetricFamily
from nri_framework.eventloop import running_loop
from nri_framework.nri.versions import synchronizes_prelaunched
from nri_framework.startup import journal_obstacle

if TYPE_CHECKING:
    # prometheus_client (about 20 ms of imports, with http.server and email) is
    # imported by the first scrape, not by a start that registers with the runtime
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import HistogramMetricFamily, Metric

    from nri_framework.host import PolicyHost
    from nri_framework.startup import PeerWatch, Startup
    from nri_framework.stub import PluginStub

log = logging.getLogger("nri_framework.instrumentation")

DEFAULT_PORT = 8891
POLICY_PREFIX = "nri_policy_"
HOST_PREFIX = "nri_resource_policy_"
MAX_REQUEST = 8192
"""Bytes of request line and headers we read at most."""
READ_TIMEOUT = 5.0
"""Seconds a client has to send its request."""
ROUTES = ("/healthz", "/livez", "/metrics", "/debug/state")
SCRAPE_WAIT = 1.0
"""Seconds a scrape waits for the policy's :func:`~nri_framework.hookspecs.policy_before_scrape`."""
SCRAPED = ("/metrics", "/debug/state")


REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
"""Upper bounds (seconds) of :class:`RequestLatency`'s buckets; the runtime gives up at 2 s."""


class RequestLatency:
    """How long the plugin took to answer each NRI request, by method: the
    histogram ``nri_resource_policy_nri_request_duration_seconds`` (from the
    request's last byte read to its answer handed to the socket: decode, the
    policy's hooks, the journal, encode). The stub times only the methods it
    serves (its handler table), so the label set is bounded whatever the runtime
    sends. ``clock`` is injectable (tests)."""

    NAME = HOST_PREFIX + "nri_request_duration_seconds"

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        buckets: tuple[float, ...] = REQUEST_BUCKETS,
    ) -> None:
        self.clock = clock
        self.buckets = buckets
        #: per method: requests per bucket (not cumulative; the last one is +Inf)
        self.counts: dict[str, list[int]] = {}
        self.sums: dict[str, float] = {}

    @contextlib.contextmanager
    def timing(self, method: str) -> Iterator[None]:
        """Observe the time the ``with`` body takes, also when it raises."""
        started = self.clock()
        try:
            yield
        finally:
            self.observe(method, self.clock() - started)

    def observe(self, method: str, seconds: float) -> None:
        counts = self.counts.get(method)
        if counts is None:
            counts = self.counts[method] = [0] * (len(self.buckets) + 1)
        counts[bisect.bisect_left(self.buckets, seconds)] += 1  # the first bound >= seconds
        self.sums[method] = self.sums.get(method, 0.0) + seconds

    def family(self) -> HistogramMetricFamily:
        from prometheus_client.core import HistogramMetricFamily

        fam = HistogramMetricFamily(
            self.NAME,
            "Seconds the plugin took to answer an NRI request, by method",
            labels=["method"],
        )
        for method in sorted(self.counts):
            total, cumulative = 0, []
            for le, n in zip((*self.buckets, float("inf")), self.counts[method], strict=True):
                total += n
                cumulative.append(("+Inf" if le == float("inf") else repr(le), float(total)))
            fam.add_metric([method], cumulative, sum_value=self.sums[method])
        return fam


class AddressError(ValueError):
    """An instrumentation address that is not ``HOST:PORT``."""


def parse_address(text: str) -> tuple[str | None, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; ``":PORT"`` -> ``(None, port)``
    (every interface); ``"[::1]:PORT"`` -> ``("::1", port)``."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise AddressError(f"invalid address {text!r}: want HOST:PORT, :PORT or [IPV6]:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or None), int(port_text)


class Health(msgspec.Struct, frozen=True):
    ok: bool
    reason: str


class Response(msgspec.Struct, frozen=True):
    status: int
    content_type: str
    body: bytes


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _plain(status: int, text: str) -> Response:
    return Response(status, "text/plain; charset=utf-8", (text + "\n").encode())


class _Collector:
    """The host's and the policy's metrics, collected on each scrape."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        host = self.inst.host
        healthy = GaugeMetricFamily(
            HOST_PREFIX + "healthy",
            "1 when registered, configured and synchronized by the NRI runtime (/healthz)",
            value=1 if self.inst.health().ok else 0,
        )
        if host is None:  # still starting: the pod lacks a path (see /healthz)
            yield healthy
            return
        info = GaugeMetricFamily(
            HOST_PREFIX + "build_info",
            "The plugin's version and active policy",
            labels=["version", "policy"],
        )
        info.add_metric([__version__, host.policy_name], 1)
        yield info
        yield healthy
        yield GaugeMetricFamily(
            HOST_PREFIX + "pods", "Pod sandboxes known from the runtime", value=len(host.pods)
        )
        yield GaugeMetricFamily(
            HOST_PREFIX + "containers",
            "Containers known from the runtime",
            value=len(host.containers),
        )
        watch = self.inst.helper
        if watch is not None:
            up = GaugeMetricFamily(
                HOST_PREFIX + "peer_up",
                "1 while the policy's peer (the SST helper for balloons) is reachable (/healthz)",
                labels=["peer"],
            )
            up.add_metric([watch.peer.name], 0 if watch.obstacle is not None else 1)
            yield up
        if self.inst.stub is not None:
            yield self.inst.stub.latency.family()
        yield from policy_metrics(self.inst.policy_families())


def policy_metrics(families: Iterable[MetricFamily]) -> Iterator[Metric]:
    """``prometheus_client`` families of the policy's plain-data ones."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for fam in families:
        cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
        metric = cls(POLICY_PREFIX + fam.name, fam.help, labels=list(fam.labels), unit=fam.unit)
        for values, value in fam.samples:
            metric.add_metric(list(values), value)
        yield metric


class Instrumentation:
    """The HTTP endpoint of one plugin process.

    :param host: the policy host (cache, hooks).
    :param stub: the NRI stub whose registration state ``/healthz`` reports;
        ``None`` (tests of the exposition alone) reports healthy once the
        host was synchronized.
    :param address: where to listen, see :func:`parse_address`.
    :param startup: the start-up still waiting for the pod's paths (``host``
        is ``None`` until it is done: :meth:`attach` then); its obstacle is
        the reason ``/healthz`` fails.
    :param helper: the watch on the SST helper's socket: unhealthy while it is missing.
    :param override: ``--metrics-address``: where the endpoint serves whatever the
        policy's configuration asks (``""``: it follows the configuration, see
        :meth:`follow_policy`).

    ``address`` may be ``""``: nothing is served until the policy's
    configuration names an address.
    """

    def __init__(
        self,
        host: PolicyHost | None,
        stub: PluginStub | None,
        address: str,
        *,
        startup: Startup | None = None,
        helper: PeerWatch | None = None,
        override: str = "",
    ) -> None:
        self.host = host
        self.stub = stub
        self.startup = startup
        self.helper = helper
        self.address = address
        self.bind = parse_address(address) if address else None
        self.override = override
        #: the address the policy's configuration asked for last (acted upon once)
        self.asked: str | None = None
        self._moving: asyncio.Task[None] | None = None
        self.started = time.monotonic()
        self.server: asyncio.Server | None = None
        self._registry: CollectorRegistry | None = None

    @property
    def registry(self) -> CollectorRegistry:
        """The collectors, built (and ``prometheus_client`` imported) on first use."""
        if self._registry is None:
            from prometheus_client import (
                CollectorRegistry,
                GCCollector,
                PlatformCollector,
                ProcessCollector,
            )

            self._registry = CollectorRegistry(auto_describe=False)
            for collector in (ProcessCollector, PlatformCollector, GCCollector):
                collector(registry=self._registry)
            self._registry.register(_Collector(self))
        return self._registry

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Listen (nothing without an address); raises :class:`OSError` when
        the address cannot be bound."""
        if self.bind is None:
            return
        self.server = await self._listen(self.bind)
        self._announce()

    async def _listen(self, bind: tuple[str | None, int]) -> asyncio.Server:
        host, port = bind
        return await asyncio.start_server(
            self._serve, host, port, limit=MAX_REQUEST, reuse_address=True
        )

    def _announce(self) -> None:
        log.info(
            "instrumentation HTTP endpoint listening on %s (%s)",
            ", ".join(self.listening()),
            ", ".join(ROUTES),
        )

    # -- where: --metrics-address, else the policy's configuration -----------------

    def follow_policy(self) -> None:
        """Serve where the policy's configuration asks
        (:func:`~nri_framework.hookspecs.policy_instrumentation`): the host's
        configuration listener, so it runs after every (re)configuration (not
        after every decision). Only a changed answer
        acts; the move runs in a task (latest answer wins), never on the reply path.
        With :attr:`override` the answer is ignored, said once per answer."""
        if self.host is None:
            return
        try:
            asked = self.host.hook.policy_instrumentation()
        except Exception:
            log.exception("policy_instrumentation failed")
            return
        if asked is None or asked == self.asked:
            return
        self.asked = asked
        if self.override:
            if asked != self.override:
                log.info(
                    "instrumentation: the configuration's HTTP endpoint %r is ignored, "
                    "--metrics-address %s is given",
                    asked,
                    self.override,
                )
            return
        loop = running_loop()
        if loop is None:  # a host driven without an event loop: nothing to serve on
            return
        if self._moving is None or self._moving.done():
            self._moving = loop.create_task(self._follow())

    async def settle(self) -> None:
        """Until the move :meth:`follow_policy` started (if any) is done."""
        task = self._moving
        if task is not None:
            await asyncio.wait([task])

    async def _follow(self) -> None:
        while (target := self.asked) is not None and target != self.address:
            if not await self.move(target) and self.asked == target:
                return  # logged; the next changed answer tries again

    async def move(self, address: str) -> bool:
        """Serve on ``address`` instead (``""``: stop serving). The new address is
        bound before the old one closes; when it cannot be bound the old one keeps
        serving and False is returned (logged). Only the same port on another
        host (``:8891`` -> ``127.0.0.1:8891``) closes the old one first, and
        binds it again if the new one fails."""
        if address == self.address and (self.server is not None or not address):
            return True
        if not address:
            await self._close_server()
            self.address, self.bind = "", None
            log.info("instrumentation HTTP endpoint closed: no address configured")
            return True
        try:
            bind = parse_address(address)
        except AddressError as exc:
            log.error("cannot serve instrumentation on %s: %s", address, exc)
            return False
        old, was = self.server, self.bind
        try:
            server = await self._listen(bind)
        except OSError as exc:
            if old is None or was is None or was[1] != bind[1]:
                log.error("%s", self._not_moved(address, exc))
                return False
            await self._close_server()
            try:
                server = await self._listen(bind)
            except OSError as again:
                log.error("%s", self._not_moved(address, again))
                with contextlib.suppress(OSError):
                    self.server = await self._listen(was)
                return False
        else:
            await self._close_server()
        self.server, self.address, self.bind = server, address, bind
        self._announce()
        return True

    def _not_moved(self, address: str, exc: OSError) -> str:
        where = ", ".join(self.listening()) or "nowhere"
        return f"cannot serve instrumentation on {address}: {exc}; still serving on {where}"

    def listening(self) -> list[str]:
        """``host:port`` of every bound socket (the real port when 0 was asked)."""
        if self.server is None:
            return []
        out = []
        for sock in self.server.sockets:
            name = sock.getsockname()
            out.append(f"[{name[0]}]:{name[1]}" if ":" in name[0] else f"{name[0]}:{name[1]}")
        return out

    def attach(self, host: PolicyHost, stub: PluginStub, helper: PeerWatch | None) -> None:
        """The start-up is done: report the policy host and its NRI stub."""
        self.host, self.stub, self.helper = host, stub, helper

    async def close(self) -> None:
        task, self._moving = self._moving, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task], timeout=1.0)
        await self._close_server()

    async def _close_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    # -- what is served ------------------------------------------------------------

    def health(self) -> Health:
        """See the module documentation for what healthy means."""
        if self.startup is not None and self.startup.obstacle is not None:
            return Health(False, f"cannot start: {self.startup.obstacle}")
        if self.host is None:
            return Health(False, "starting")
        stub = self.stub
        if stub is None:
            if self.host.synchronized:
                return Health(True, "ok")
            return Health(False, "not synchronized by an NRI runtime")
        if stub.stopping.is_set():
            return Health(False, "stopping")
        session = stub.session
        if session is None or not stub.connected.is_set():
            where = f"fd {stub.opts.fd}" if stub.opts.fd is not None else f"{stub.opts.socket_path}"
            why = f": {stub.obstacle}" if stub.obstacle is not None else ""
            return Health(False, f"not registered with the NRI runtime ({where}){why}")
        if not session.configured.is_set():
            return Health(False, "registered, waiting for the runtime's Configure")
        no_sync = stub.opts.fd is not None and not synchronizes_prelaunched(session.nri_version)
        if not session.synchronized.is_set() and not no_sync:
            return Health(False, "configured, waiting for the runtime's Synchronize")
        journal = self.host.journal
        if journal is not None and journal.failing:
            return Health(False, f"cannot write the decision journal: {journal_obstacle(journal)}")
        if self.helper is not None and self.helper.obstacle is not None:
            return Health(False, f"{self.helper.peer.name} unreachable: {self.helper.obstacle}")
        return Health(True, "ok")

    def policy_families(self) -> list[MetricFamily]:
        if self.host is None:
            return []
        try:
            results = self.host.hook.policy_collect_metrics()
        except Exception:
            log.exception("policy_collect_metrics failed")
            return []
        return [fam for families in results for fam in families or ()]

    def metrics(self, accept: str = "") -> tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def state(self) -> dict[str, Any]:
        """The JSON document of ``/debug/state``."""
        host = self.host
        health = self.health()
        if host is None:
            return {"health": {"ok": health.ok, "reason": health.reason}}
        opts = self.stub.opts if self.stub is not None else None
        try:
            policy = host.hook.policy_inspect()
        except Exception as exc:
            log.exception("policy_inspect failed")
            policy = {"error": f"policy_inspect failed: {exc}"}
        try:
            zones = [msgspec.to_builtins(z) for z in host.hook.policy_topology_zones() or []]
            extended = host.hook.policy_extended_resources()
        except Exception as exc:
            log.exception("policy zones/extended resources failed")
            zones, extended = [], {"error": f"failed: {exc}"}
        return {
            "plugin": {
                "name": opts.name if opts else "",
                "index": opts.index if opts else "",
                "policy": host.policy_name,
                "version": __version__,
                "pid": os.getpid(),
                "uptime_seconds": round(time.monotonic() - self.started, 1),
            },
            "runtime": {
                "name": host.runtime.name,
                "version": host.runtime.version,
                "nri_version": host.runtime.nri_version,
            },
            "health": {"ok": health.ok, "reason": health.reason},
            "pods": len(host.pods),
            "containers": [
                {
                    "id": c.id,
                    "namespace": pod.namespace if pod else "",
                    "pod": pod.name if pod else c.pod_sandbox_id,
                    "name": c.name,
                    "state": c.state.name.lower(),
                    "cpus": c.cpus,
                    "mems": c.resources.cpu.mems if c.resources and c.resources.cpu else "",
                }
                for c in host.containers.values()
                for pod in (host.pods.get(c.pod_sandbox_id),)
            ],
            "policy": policy or {},
            "zones": zones,
            "extended_resources": extended,
        }

    async def before_scrape(self, method: str, target: str) -> None:
        """Await the policy's readings for a scrape of ``target`` (bounded)."""
        path = urlsplit(target).path
        if self.host is None or method not in ("GET", "HEAD") or path not in SCRAPED:
            return
        try:
            waits = [w for w in self.host.hook.policy_before_scrape(path=path) if w is not None]
        except Exception:
            log.exception("policy_before_scrape failed")
            return
        if not waits:
            return
        tasks = [asyncio.ensure_future(w) for w in waits]
        done, pending = await asyncio.wait(tasks, timeout=SCRAPE_WAIT)
        for task in pending:
            task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("policy_before_scrape %s failed: %r", path, task.exception())
        if pending:
            log.warning("policy_before_scrape %s: unfinished after %.1f s", path, SCRAPE_WAIT)

    def respond(self, method: str, target: str, accept: str = "") -> Response:
        """The answer to one request (no I/O: what the connection handler sends)."""
        if method not in ("GET", "HEAD"):
            return _plain(405, f"method {method} not allowed")
        path = urlsplit(target).path
        if path == "/livez":  # the process answers: what a liveness probe should ask
            return _plain(200, "ok")
        if path == "/healthz":
            health = self.health()
            if health.ok:
                return _plain(200, "ok")
            return _plain(503, f"not ok: {health.reason}")
        if path == "/metrics":
            body, content_type = self.metrics(accept)
            return Response(200, content_type, body)
        if path == "/debug/state":
            body = msgspec.json.format(msgspec.json.encode(self.state()), indent=2)
            return Response(200, "application/json", body + b"\n")
        if path == "/":
            return _plain(200, "\n".join(ROUTES))
        return _plain(404, f"not found: {path} (try {', '.join(ROUTES)})")

    # -- the connection ------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            method, target, accept = _parse_head(head)
            if not method:
                resp = _plain(400, "bad request")
            else:
                try:
                    await self.before_scrape(method, target)
                    resp = self.respond(method, target, accept)
                except Exception as exc:
                    log.exception("instrumentation: %s %s failed", method, target)
                    resp = _plain(500, f"internal error: {exc}")
            header = (
                f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, '')}\r\n"
                f"Content-Type: {resp.content_type}\r\n"
                f"Content-Length: {len(resp.body)}\r\n"
                "Cache-Control: no-store\r\n"
                + ("Allow: GET, HEAD\r\n" if resp.status == 405 else "")
                + "Connection: close\r\n\r\n"
            )
            writer.write(header.encode("latin-1"))
            if method != "HEAD":
                writer.write(resp.body)
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)


def _parse_head(head: bytes) -> tuple[str, str, str]:
    """``(method, target, Accept header)``; ``("", "", "")`` when malformed."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return "", "", ""
    if not version.startswith("HTTP/") or not target.startswith("/"):
        return "", "", ""
    accept = ""
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "accept":
            accept = value.strip()
    return method, target, accept


async def start_instrumentation(
    host: PolicyHost | None,
    stub: PluginStub | None,
    address: str,
    *,
    startup: Startup | None = None,
) -> Instrumentation | None:
    """The endpoint listening on ``address``; ``None`` when ``address`` is empty.

    An address that cannot be bound is logged and the plugin goes on without
    the endpoint: pinning containers matters more than being observed (the
    chart's probes then fail, which shows the problem). ``address`` is
    ``--metrics-address``: the endpoint stays there (``override``)."""
    if not address:
        return None
    inst = Instrumentation(host, stub, address, startup=startup, override=address)
    try:
        await inst.start()
    except OSError as exc:
        log.error("cannot serve instrumentation on %s: %s", address, exc)
        return None
    return inst

"""The instrumentation endpoint over real loopback HTTP: routes, health,
exposition of policy metrics, robustness against bad clients; and the
``inspect`` renderer's data-driven tables."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from nri_framework.contract import MetricFamily
from nri_framework.hookspecs import hookimpl
from nri_framework.host import PolicyHost
from nri_framework.inspect_cli import render, url_for
from nri_framework.instrumentation import (
    AddressError,
    Instrumentation,
    parse_address,
)
from nri_framework.model import Container, CpuResources, Pod, Resources, RuntimeInfo
from nri_framework.policies.pinner import Pinner
from nri_framework.stub import PluginStub, StubOptions
from prometheus_client.parser import text_string_to_metric_families


def sysfs(tmp_path: Path, cpus: str = "0-7") -> str:
    cpu = tmp_path / "root/sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text(cpus + "\n")
    return str(tmp_path / "root")


class Observed:
    """An observer plugin with metrics of its own, and inspect state its
    policy shows (``policy_inspect`` is a decision hook: the policy's alone)."""

    def __init__(self) -> None:
        self.items: dict[str, int] = {"a": 1}
        self.fail = False

    @hookimpl
    def policy_collect_metrics(self) -> list[MetricFamily]:
        if self.fail:
            raise RuntimeError("boom")
        return [
            MetricFamily(
                "things",
                "Things",
                ("thing", "kind"),
                [((k, "x"), float(v)) for k, v in self.items.items()],
                unit="bytes",
                kind="counter",
            )
        ]

    def inspect(self) -> dict[str, Any]:
        return {"mode": "test", "things": [{"name": k, "count": v} for k, v in self.items.items()]}


class InspectedPinner(Pinner):
    """The pinner, showing its observer's state in ``/debug/state``."""

    def __init__(self, observed: Observed) -> None:
        super().__init__()
        self.observed = observed

    @hookimpl
    def policy_inspect(self) -> dict[str, Any]:
        return self.observed.inspect()


def make_host(tmp_path: Path, *observers: Observed) -> PolicyHost:
    policy = InspectedPinner(observers[0]) if observers else Pinner()
    return PolicyHost("pinner", policy, host_root=sysfs(tmp_path), observers=list(observers))


async def request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    if not data:
        return 0, {}, b""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


async def get(port: int, path: str, accept: str = "") -> tuple[int, dict[str, str], bytes]:
    extra = f"Accept: {accept}\r\n" if accept else ""
    return await request(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())


@pytest.fixture
async def served(tmp_path: Path) -> Any:
    obs = Observed()
    host = make_host(tmp_path, obs)
    inst = Instrumentation(host, None, "127.0.0.1:0")
    await inst.start()
    port = int(inst.listening()[0].rsplit(":", 1)[1])
    try:
        yield host, inst, obs, port
    finally:
        await inst.close()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (":8891", (None, 8891)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("0.0.0.0:9000", ("0.0.0.0", 9000)),
        ("[::1]:8891", ("::1", 8891)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_parse_address(text: str, want: tuple[str | None, int]) -> None:
    assert parse_address(text) == want


@pytest.mark.parametrize("text", ["8891", "host:", "host:http", ":70000", ""])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(AddressError):
        parse_address(text)


def test_inspect_url() -> None:
    assert url_for(":8891") == "http://127.0.0.1:8891/debug/state"
    assert url_for("0.0.0.0:1") == "http://127.0.0.1:1/debug/state"
    assert url_for("[::1]:2", "/metrics") == "http://[::1]:2/metrics"


async def test_healthz_follows_synchronization(served: Any) -> None:
    host, _, _, port = served
    status, headers, body = await get(port, "/healthz")
    assert status == 503
    assert body.decode().startswith("not ok: not synchronized")
    assert headers["content-type"].startswith("text/plain")
    host.synchronize([], [])
    status, _, body = await get(port, "/healthz")
    assert (status, body) == (200, b"ok\n")


async def test_health_of_an_unregistered_stub(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    stub = PluginStub(host, StubOptions(socket_path=str(tmp_path / "nri.sock")))
    health = Instrumentation(host, stub, "127.0.0.1:0").health()
    assert not health.ok
    assert health.reason == f"not registered with the NRI runtime ({tmp_path / 'nri.sock'})"
    stub.stop()
    assert Instrumentation(host, stub, "127.0.0.1:0").health().reason == "stopping"


async def test_metrics_exposition(served: Any) -> None:
    host, _, obs, port = served
    host.synchronize([], [])
    status, headers, body = await get(port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    # the policy's (observer's) family, prefixed and with its unit
    things = families["nri_policy_things_bytes"]
    assert things.type == "counter"
    assert [(s.labels, s.value) for s in things.samples if s.name.endswith("_total")] == [
        ({"thing": "a", "kind": "x"}, 1.0)
    ]
    # the host's own
    assert families["nri_resource_policy_healthy"].samples[0].value == 1.0
    info = families["nri_resource_policy_build_info"].samples[0]
    assert info.labels["policy"] == "pinner"
    assert "process_resident_memory_bytes" in families
    # samples follow the state on every scrape
    obs.items = {"b": 2, "c": 3}
    _, _, body = await get(port, "/metrics")
    text = body.decode()
    things = next(
        f for f in text_string_to_metric_families(text) if f.name == "nri_policy_things_bytes"
    )
    assert {s.labels["thing"]: s.value for s in things.samples if s.name.endswith("_total")} == {
        "b": 2.0,
        "c": 3.0,
    }


async def test_openmetrics_when_asked(served: Any) -> None:
    _, _, _, port = served
    status, headers, body = await get(port, "/metrics", "application/openmetrics-text")
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


async def test_failing_policy_metrics_do_not_break_the_scrape(served: Any) -> None:
    _, _, obs, port = served
    obs.fail = True
    status, _, body = await get(port, "/metrics")
    assert status == 200
    assert b"nri_resource_policy_build_info" in body
    assert b"nri_policy_things" not in body


async def test_debug_state(served: Any) -> None:
    host, _, _, port = served
    pod = Pod(id="p", name="web", namespace="shop")
    ctr = Container(
        id="c", pod_sandbox_id="p", name="app",
        resources=Resources(cpu=CpuResources(shares=2048, quota=200000, period=100000)),
    )  # fmt: skip
    host.synchronize([pod], [])
    host.create_container(pod, ctr)
    status, headers, body = await get(port, "/debug/state")
    assert status == 200
    assert headers["content-type"] == "application/json"
    state = json.loads(body)
    assert state["plugin"]["policy"] == "pinner"
    assert state["health"] == {"ok": True, "reason": "ok"}
    (c,) = state["containers"]
    assert (c["namespace"], c["pod"], c["name"]) == ("shop", "web", "app")
    assert c["cpus"]  # the pinner's decision, recorded by the host
    assert state["policy"]["things"] == [{"name": "a", "count": 1}]


async def test_bad_requests(served: Any) -> None:
    _, _, _, port = served
    status, _, _ = await get(port, "/nope")
    assert status == 404
    status, headers, _ = await request(port, b"POST /metrics HTTP/1.1\r\n\r\n")
    assert (status, headers["allow"]) == (405, "GET, HEAD")
    status, _, _ = await request(port, b"garbage\r\n\r\n")
    assert status == 400
    status, headers, body = await request(port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert status == 503 and body == b"" and int(headers["content-length"]) > 0
    # an oversized request is cut off without an answer, and the server goes on
    assert await request(port, b"GET /" + b"x" * 20000 + b" HTTP/1.1\r\n\r\n") == (0, {}, b"")
    status, _, _ = await get(port, "/healthz")
    assert status == 503


async def test_a_silent_client_does_not_block_others(served: Any) -> None:
    _, _, _, port = served
    _, idle = await asyncio.open_connection("127.0.0.1", port)  # sends nothing
    try:
        status, _, _ = await asyncio.wait_for(get(port, "/healthz"), 2)
        assert status == 503
    finally:
        idle.close()


async def test_unbindable_address_is_logged_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from nri_framework.instrumentation import start_instrumentation

    host = make_host(tmp_path)
    first = await start_instrumentation(host, None, "127.0.0.1:0")
    assert first is not None
    taken = first.listening()[0]
    try:
        assert await start_instrumentation(host, None, taken) is None
        assert f"cannot serve instrumentation on {taken}" in caplog.text
    finally:
        await first.close()
    assert await start_instrumentation(host, None, "") is None


# --- where it serves: the configuration moves it, --metrics-address overrides ----


class Configured(Pinner):
    """The pinner with an endpoint in its configuration (``None``: no opinion)."""

    def __init__(self) -> None:
        super().__init__()
        self.endpoint: str | None = None
        self.fail = False

    @hookimpl
    def policy_instrumentation(self) -> str | None:
        if self.fail:
            raise RuntimeError("boom")
        return self.endpoint


@contextmanager
def held(host: str = "127.0.0.1", port: int = 0) -> Iterator[int]:
    """A listening socket nobody else may bind to; yields its port."""
    with socket.socket() as sock:
        sock.bind((host, port))
        sock.listen()
        yield sock.getsockname()[1]


def free_port() -> int:
    with held() as port:
        return port


async def answers(port: int) -> bool:
    """``/livez`` answers on ``127.0.0.1:port``."""
    try:
        status, _, body = await get(port, "/livez")
    except OSError:
        return False
    return (status, body) == (200, b"ok\n")


@pytest.fixture
def policy() -> Configured:
    return Configured()


@pytest.fixture
def configured(tmp_path: Path, policy: Configured) -> PolicyHost:
    return PolicyHost("pinner", policy, host_root=sysfs(tmp_path))


async def follow(inst: Instrumentation, policy: Configured, endpoint: str | None) -> None:
    policy.endpoint = endpoint
    inst.follow_policy()
    await inst.settle()


async def test_the_configuration_moves_the_endpoint(
    configured: PolicyHost, policy: Configured, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    inst = Instrumentation(configured, None, "")
    first, second = free_port(), free_port()
    try:
        await follow(inst, policy, None)  # no opinion: nothing served
        assert inst.server is None
        await follow(inst, policy, f"127.0.0.1:{first}")
        assert await answers(first)
        await follow(inst, policy, f"127.0.0.1:{second}")
        assert await answers(second)
        assert not await answers(first)  # the old one is closed
        assert inst.listening() == [f"127.0.0.1:{second}"]
        await follow(inst, policy, "")  # the configuration names none: not served
        assert not await answers(second)
        assert "instrumentation HTTP endpoint closed" in caplog.text
    finally:
        await inst.close()


async def test_an_unbindable_address_leaves_the_old_one_serving(
    configured: PolicyHost, policy: Configured, caplog: pytest.LogCaptureFixture
) -> None:
    inst = Instrumentation(configured, None, "")
    first = free_port()
    try:
        await follow(inst, policy, f"127.0.0.1:{first}")
        with held() as taken:
            await follow(inst, policy, f"127.0.0.1:{taken}")
            assert await answers(first)
            assert f"cannot serve instrumentation on 127.0.0.1:{taken}" in caplog.text
            assert f"still serving on 127.0.0.1:{first}" in caplog.text
        # the same answer again does not retry (no log flood on every change) ...
        caplog.clear()
        inst.follow_policy()
        await inst.settle()
        assert "cannot serve" not in caplog.text and await answers(first)
        # ... a changed one does
        third = free_port()
        await follow(inst, policy, f"127.0.0.1:{third}")
        assert await answers(third) and not await answers(first)
        # an answer that is no address (the policy's validation missed it)
        await follow(inst, policy, "nonsense")
        assert await answers(third)
        assert "cannot serve instrumentation on nonsense: invalid address" in caplog.text
        # a failing hook is logged, the endpoint stays
        policy.fail = True
        inst.follow_policy()
        assert "policy_instrumentation failed" in caplog.text and await answers(third)
    finally:
        await inst.close()


async def test_the_same_port_on_another_host(configured: PolicyHost, policy: Configured) -> None:
    """``0.0.0.0:P`` -> ``127.0.0.1:P`` cannot bind before the old one closes:
    the old one closes first; when the new one still fails, the old one is
    bound again."""
    inst = Instrumentation(configured, None, "")
    port = free_port()
    try:
        await follow(inst, policy, f"0.0.0.0:{port}")
        await follow(inst, policy, f"127.0.0.1:{port}")
        assert inst.listening() == [f"127.0.0.1:{port}"] and await answers(port)
        with held("127.0.0.2", port):  # takes the port on another loopback address
            await follow(inst, policy, f"0.0.0.0:{port}")
            assert inst.listening() == [f"127.0.0.1:{port}"] and await answers(port)
    finally:
        await inst.close()


async def test_metrics_address_overrides_the_configuration(
    configured: PolicyHost, policy: Configured, caplog: pytest.LogCaptureFixture
) -> None:
    fixed, asked = free_port(), free_port()
    inst = Instrumentation(configured, None, f"127.0.0.1:{fixed}", override=f"127.0.0.1:{fixed}")
    await inst.start()
    try:
        with caplog.at_level("INFO"):
            await follow(inst, policy, f"127.0.0.1:{asked}")
            await follow(inst, policy, f"127.0.0.1:{asked}")
        assert await answers(fixed) and not await answers(asked)
        said = f"the configuration's HTTP endpoint '127.0.0.1:{asked}' is ignored"
        assert caplog.text.count(said) == 1  # once per answer
        assert f"--metrics-address 127.0.0.1:{fixed} is given" in caplog.text
    finally:
        await inst.close()


async def test_the_host_configuration_listener_follows_each_configuration(
    configured: PolicyHost, policy: Configured
) -> None:
    """What ``run`` wires: the host's configuration listener (called after the
    runtime's Configure and every reconfiguration) moves the endpoint."""
    inst = Instrumentation(configured, None, "")
    configured.add_config_listener(inst.follow_policy)
    port, again = free_port(), free_port()
    try:
        policy.endpoint = f"127.0.0.1:{port}"
        configured.configure("", RuntimeInfo(name="containerd", version="2.1.0"))
        await inst.settle()
        assert await answers(port)
        policy.endpoint = f"127.0.0.1:{again}"
        assert await configured.try_reconfigure("{}", "test") is None
        await inst.settle()
        assert await answers(again)
    finally:
        await inst.close()


# --- inspect: tables from the data -------------------------------------------------


def state_doc(**policy: Any) -> dict[str, Any]:
    return {
        "plugin": {"name": "resource-policy", "index": "90", "policy": "balloons"},
        "runtime": {"name": "containerd", "version": "2.1.0"},
        "health": {"ok": True, "reason": "ok"},
        "containers": [
            {"id": "c1", "namespace": "ns", "pod": "p", "name": "c", "cpus": "2-3", "mems": "0"}
        ],
        "policy": policy,
    }


def test_render_without_pct_has_no_clos_or_punit_column() -> None:
    text = render(
        state_doc(
            balloons=[{"name": "b[0]", "type": "b", "cpus": "2-3", "containers": ["ns/p/c"]}],
            containers={"c1": {"balloon": "b[0]"}},
            cpus=[{"cpu": 2, "balloon": "b[0]", "class": ""}, {"cpu": 0, "balloon": "free"}],
        )
    )
    assert "CLOS" not in text and "PUNIT" not in text
    lines = text.splitlines()
    assert "health: ok" in lines
    header = lines[lines.index("CONTAINERS (1)") + 1].split()
    assert header == ["CONTAINER", "CPUS", "MEMS", "BALLOON"]  # no state known: no column
    assert lines[lines.index("CONTAINERS (1)") + 2].split() == ["ns/p/c", "2-3", "0", "b[0]"]


def test_render_with_pct_columns() -> None:
    text = render(
        state_doc(
            balloons=[{"name": "hp[0]", "cpus": "2-3", "punit": ["0/1"], "containers": []}],
            cpus=[
                {"cpu": 2, "balloon": "hp[0]", "class": "hp", "clos": 0, "punit": "0/1"},
                {"cpu": 4, "balloon": "free", "class": "lp"},
            ],
            punits=[{"name": "0/1", "cpus": "0-63", "max_hp": 8}],
        )
    )
    lines = text.splitlines()
    cpu_head = lines[lines.index("CPUS (2)") + 1].split()
    assert cpu_head == ["CPU", "BALLOON", "CLASS", "CLOS", "PUNIT"]
    assert lines[lines.index("CPUS (2)") + 2].split() == ["2", "hp[0]", "hp", "0", "0/1"]
    assert lines[lines.index("CPUS (2)") + 3].split() == ["4", "free", "lp", "-", "-"]
    assert "PUNIT" in lines[lines.index("BALLOONS (1)") + 1]
    assert lines[lines.index("PUNITS (1)") + 1].split() == ["NAME", "CPUS", "MAX-HP"]


def test_render_unhealthy() -> None:
    doc = state_doc()
    doc["health"] = {"ok": False, "reason": "configured, waiting for the runtime's Synchronize"}
    assert "health: NOT OK: configured, waiting for the runtime's Synchronize" in render(doc)

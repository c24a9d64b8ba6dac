"""``policy_before_scrape`` over real loopback HTTP: a scrape waits for the
policy's reading (one per scrape, given the path), at most ``SCRAPE_WAIT``
seconds, then answers with what the policy has; a failing reading is
logged, the scrape answers. And ``inspect``'s marking of simulated columns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
from nri_framework import instrumentation
from nri_framework.contract import MetricFamily
from nri_framework.hookspecs import hookimpl
from nri_framework.host import PolicyHost
from nri_framework.inspect_cli import render
from nri_framework.instrumentation import Instrumentation
from nri_framework.policies.pinner import Pinner
from prometheus_client.parser import text_string_to_metric_families


class Reader:
    """An observer that reads a value before each scrape and shows it."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.value: float | None = None
        self.mode = "answer"
        self.cancelled = 0

    async def read(self) -> None:
        if self.mode == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.mode == "fail":
            raise RuntimeError("peer gone")
        self.value = float(len(self.paths))

    @hookimpl
    def policy_before_scrape(self, path: str) -> Awaitable[None] | None:
        self.paths.append(path)
        return self.read()

    @hookimpl
    def policy_collect_metrics(self) -> list[MetricFamily]:
        if self.value is None:
            return []
        return [MetricFamily("reading", "Read", (), [((), self.value)])]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Reader, int]]:
    cpu = tmp_path / "root/sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-3\n")
    reader = Reader()
    host = PolicyHost("pinner", Pinner(), host_root=str(tmp_path / "root"), observers=[reader])
    inst = Instrumentation(host, None, "127.0.0.1:0")
    await inst.start()
    try:
        yield reader, int(inst.listening()[0].rsplit(":", 1)[1])
    finally:
        await inst.close()


async def get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def reading(text: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        if fam.name == "nri_policy_reading":
            return float(fam.samples[0].value)
    return None


async def test_a_scrape_waits_for_the_reading_of_its_path(served: tuple[Reader, int]) -> None:
    reader, port = served
    status, body = await get(port, "/metrics")
    assert status == 200 and reading(body) == 1.0  # this scrape's own reading
    status, _ = await get(port, "/debug/state")
    await get(port, "/healthz")  # not a scrape: no reading
    assert status == 200 and reader.paths == ["/metrics", "/debug/state"]


async def test_a_reading_that_never_ends_is_cancelled_and_the_scrape_answers(
    served: tuple[Reader, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, port = served
    monkeypatch.setattr(instrumentation, "SCRAPE_WAIT", 0.1)
    reader.mode = "hang"
    status, body = await get(port, "/metrics")  # get() gives up after 5 s
    assert status == 200 and "nri_resource_policy_healthy" in body
    assert reading(body) is None and reader.cancelled == 1


async def test_a_failing_reading_is_logged_and_the_scrape_answers(
    served: tuple[Reader, int], caplog: pytest.LogCaptureFixture
) -> None:
    reader, port = served
    reader.mode = "fail"
    status, body = await get(port, "/metrics")
    assert status == 200 and reading(body) is None
    assert "policy_before_scrape /metrics failed: RuntimeError('peer gone')" in caplog.text


def test_render_marks_the_simulated_columns() -> None:
    policy = {
        "frequency_source": "sim",
        "simulated_columns": ["busy_mhz", "clos0_mhz"],
        "balloons": [{"name": "hp[0]", "cpus": "2-3", "busy_mhz": 4600}],
        "punits": [{"name": "0/0", "cp_enabled": True, "clos0_mhz": "2300-4600"}],
    }
    text = render({"health": {"ok": True}, "containers": [], "policy": policy})
    lines = text.splitlines()
    assert "frequency source: sim (simulated)" in lines
    assert lines[lines.index("BALLOONS (1)") + 1].split() == ["NAME", "CPUS", "BUSY-MHZ(SIM)"]
    head = lines[lines.index("PUNITS (1)") + 1].split()
    assert head == ["NAME", "CP-ENABLED", "CLOS0-MHZ(SIM)"]
    hardware = render(
        {"health": {"ok": True}, "policy": {"frequency_source": "tpmi", "balloons": []}}
    )
    assert "frequency source: tpmi" in hardware.splitlines() and "(SIM)" not in hardware

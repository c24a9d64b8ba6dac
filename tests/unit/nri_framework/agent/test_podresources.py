"""The kubelet pod-resources client (nri_framework.agent.podresources) against
a real gRPC server on a unix socket: tests/_podresources.py, which stands in
for the kubelet (none can run here)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from nri_framework.agent.podresources import (
    MAX_PENDING,
    DeviceAssignment,
    PodResourcesClient,
    socket_path,
)

ROOT = Path(__file__).resolve().parents[4]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from _podresources import Assigned, Kubelet  # noqa: E402

BOUND = 10.0  # seconds: liveness bound of every wait below

NIC0 = Assigned("telco.com/nic", "nic0", (0, 1))
TPU3 = Assigned("tech.com/tpu", "tpu3", (3,))


async def until(check: Callable[[], bool], what: str) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), BOUND)
    except TimeoutError:
        raise AssertionError(f"not within {BOUND} s: {what}") from None


def client(sock: Path, **kw: float) -> PodResourcesClient:
    kw.setdefault("retry_min", 0.05)
    kw.setdefault("retry_max", 0.2)
    return PodResourcesClient(str(sock), **kw)  # type: ignore[arg-type]


def test_socket_path_default_is_under_the_host_root() -> None:
    assert socket_path("/host", "") == "/host/var/lib/kubelet/pod-resources/kubelet.sock"
    assert socket_path("/", "") == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert socket_path("/host", "/x/kubelet.sock") == "/x/kubelet.sock"


async def test_list_fills_the_cache_and_get_adds_a_pod(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    async with Kubelet(sock) as kubelet:
        kubelet.assign("default", "pod0", "pod0c0", NIC0)
        c = client(sock)
        c.start()
        try:
            await until(lambda: c.cache.known("default", "pod0"), "List")
            assert c.cache.devices("default", "pod0", "pod0c0") == (
                DeviceAssignment("telco.com/nic", ("nic0",), (0, 1)),
            )
            assert c.cache.devices("default", "pod0", "other") == ()
            assert c.cache.devices("default", "pod1", "pod1c0") is None  # unknown yet
            kubelet.assign("default", "pod1", "pod1c0", TPU3)
            c.want("default", "pod1")
            await until(lambda: c.cache.known("default", "pod1"), "Get")
            assert "Get" in kubelet.calls
            assert c.cache.devices("default", "pod1", "pod1c0") == (
                DeviceAssignment("tech.com/tpu", ("tpu3",), (3,)),
            )
            c.forget("default", "pod1")
            assert c.cache.devices("default", "pod1", "pod1c0") is None
        finally:
            await c.close()


async def test_a_socket_missing_at_start_is_found_when_it_appears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = tmp_path / "kubelet.sock"
    caplog.set_level(logging.INFO, "nri_framework.podresources")
    c = client(sock)
    c.start()
    try:
        await until(lambda: str(sock) in caplog.text, "the warning naming the socket")
        assert "not reachable" in caplog.text
        async with Kubelet(sock) as kubelet:
            kubelet.assign("default", "pod0", "pod0c0", NIC0)
            await until(lambda: c.cache.known("default", "pod0"), "the retry after the socket came")
        assert "answers again" in caplog.text
        # one warning per outage, however many retries
        assert caplog.text.count("not reachable") == 1
    finally:
        await c.close()


async def test_a_kubelet_that_never_answers_is_given_up_on_at_the_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = tmp_path / "kubelet.sock"
    async with Kubelet(sock, hang=True) as kubelet:
        c = client(sock, timeout=0.2)
        c.start()
        try:
            await until(lambda: "no answer within 0.2 s" in caplog.text, "the deadline")
            assert str(sock) in caplog.text
            await until(lambda: len(kubelet.calls) >= 2, "a retry")  # retried, not stuck
            kubelet.hang = False
            kubelet.assign("default", "pod0", "pod0c0", NIC0)
            await until(lambda: c.cache.known("default", "pod0"), "the answer once it answers")
        finally:
            await c.close()


async def test_a_huge_reply_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sock = tmp_path / "kubelet.sock"
    async with Kubelet(sock, pad=200_000) as kubelet:
        kubelet.assign("default", "pod0", "pod0c0", NIC0)
        c = client(sock, max_reply=64 * 1024)
        c.start()
        try:
            await until(lambda: "larger than 65536 bytes" in caplog.text, "the size bound")
            assert not c.cache.known("default", "pod0")
            kubelet.pad = 0
            await until(lambda: c.cache.known("default", "pod0"), "a reply within the bound")
        finally:
            await c.close()


@pytest.mark.parametrize("how", ["gate", "unimplemented"])
async def test_a_kubelet_without_get_is_served_by_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    sock = tmp_path / "kubelet.sock"
    async with Kubelet(sock, get_disabled=how) as kubelet:
        c = client(sock, list_interval=3600)
        c.start()
        try:
            await until(lambda: kubelet.calls == ["List"], "the first List")
            kubelet.assign("default", "pod0", "pod0c0", NIC0)
            c.want("default", "pod0")
            await until(lambda: c.cache.known("default", "pod0"), "List after Get failed")
            assert "PodResources API Get() disabled, falling back to List()..." in caplog.text
            assert "--feature-gates=KubeletPodResourcesGet=true" in caplog.text
            assert c.no_get
            kubelet.assign("default", "pod1", "pod1c0", TPU3)
            c.want("default", "pod1")
            await until(lambda: c.cache.known("default", "pod1"), "List alone")
            assert kubelet.calls.count("Get") == 1  # not asked again
        finally:
            await c.close()


async def test_pending_gets_are_bounded(tmp_path: Path) -> None:
    c = client(tmp_path / "absent.sock")  # never started: want() only queues
    for i in range(MAX_PENDING + 50):
        c.want("default", f"pod{i}")
    assert len(c._pending) == MAX_PENDING
    assert ("default", f"pod{MAX_PENDING + 49}") in c._pending


async def test_a_malformed_reply_is_an_error_and_the_task_lives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = tmp_path / "kubelet.sock"
    c = client(sock)
    async with Kubelet(sock, malformed=True) as kubelet:
        c.start()
        try:
            await until(lambda: kubelet.calls.count("malformed") >= 2, "a retry")
            assert str(sock) in caplog.text
            assert not c.cache.known("default", "pod0")
        except BaseException:
            await c.close()
            raise
    async with Kubelet(sock) as kubelet:  # the kubelet restarted, well-formed
        kubelet.assign("default", "pod0", "pod0c0", NIC0)
        try:
            await until(lambda: c.cache.known("default", "pod0"), "the task still runs")
        finally:
            await c.close()

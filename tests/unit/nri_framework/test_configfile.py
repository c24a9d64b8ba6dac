"""The SIGHUP reloader: one reload at a time, SIGHUPs coalesced, a read that
hangs (a hung network file system) given up on without a second thread
beside it. The hanging read is a stand-in (ours, small): nothing real hangs
on demand."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from nri_framework import configfile
from nri_framework.configfile import Reloader
from nri_framework.hookspecs import hookimpl
from nri_framework.host import PolicyHost


class Recorder:
    def __init__(self) -> None:
        self.applied: list[str] = []

    @hookimpl
    def policy_reconfigure(self, config: str, source: str, prepared: Any) -> list[Any]:
        self.applied.append(config)
        return []


async def settle(predicate: Any) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_a_hanging_read_is_given_up_on_and_not_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    reads: list[str] = []

    def hanging_read(path: str, limit: int) -> str:
        reads.append(path)
        release.wait(10)
        return "text"

    monkeypatch.setattr(configfile, "read_config_file", hanging_read)
    policy = Recorder()
    host = PolicyHost("t", policy)
    reloader = Reloader(host, str(tmp_path / "c.yaml"), read_timeout=0.2)
    assert await reloader.reload() is False
    assert "no data in 0.2s" in caplog.text
    assert await reloader.reload() is False  # the first read still hangs: no second one
    assert "an earlier read has not returned" in caplog.text
    assert len(reads) == 1
    release.set()
    await settle(lambda: reloader._reading is not None and reloader._reading.done())
    assert await reloader.reload() is True
    assert policy.applied == ["text"]
    host.shutdown()


async def test_sighups_during_a_reload_coalesce(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("one")
    policy = Recorder()
    host = PolicyHost("t", policy)
    reloader = Reloader(host, str(cfg))
    reloader.start()
    try:
        for _ in range(5):  # a burst of SIGHUPs before the task runs
            reloader.request()
        await settle(lambda: reloader.done == 1)
        await asyncio.sleep(0.05)
        assert reloader.done == 1 and policy.applied == ["one"]
        cfg.write_text("two")
        reloader.request()
        await settle(lambda: reloader.done == 2)
        assert policy.applied == ["one", "two"]
    finally:
        await reloader.stop()
        host.shutdown()

"""The start-up (``nri_framework.startup.Startup``): the policy host is made
off the event loop, as it was before the loop ran, so that a policy's start
may wait for its peers (the balloons policy sets up the SST helper with
CONFIG_TIMEOUT per request) while the loop keeps answering ``/livez`` and
``/healthz``."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from nri_framework import startup
from nri_framework.startup import Startup, state_dir_obstacle


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def test_the_host_is_made_without_a_running_loop() -> None:
    seen: list[object] = []

    def make() -> str:
        seen.append(_running_loop())
        seen.append(threading.get_ident())
        return "host"

    assert await Startup([]).wait(make) == "host"
    # the policy's start sees no loop: its blocking start path, not the 50 ms reply budget
    assert seen[0] is None
    assert seen[1] != threading.get_ident()


async def test_the_loop_runs_while_the_host_is_made() -> None:
    answered = threading.Event()

    def make() -> str:
        # a start that waits on something only the loop can do (as the endpoint
        # answering a probe); on the loop itself this would never return
        assert answered.wait(timeout=30), "the event loop was blocked by the start"
        return "host"

    loop = asyncio.get_running_loop()
    loop.call_later(0.01, answered.set)
    assert await asyncio.wait_for(Startup([]).wait(make), 60) == "host"


def test_state_dir_probe_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert state_dir_obstacle(state) is None
    assert state.is_dir() and not any(state.iterdir())


def test_state_dir_probe_name_taken_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = iter([b"\x00" * 6, b"\x00" * 6, b"\x01" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(names))
    taken = tmp_path / f".probe-{'00' * 6}"
    taken.write_text("someone's")
    assert state_dir_obstacle(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == [taken.name]  # theirs left alone
    assert taken.read_text() == "someone's"


def test_state_dir_probe_names_all_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"\x00" * n)
    (tmp_path / f".probe-{'00' * 6}").write_text("")
    obstacle = state_dir_obstacle(tmp_path)
    assert obstacle is not None
    assert (
        obstacle.problem == f"is not usable (no probe name free after {startup.PROBE_TRIES} tries)"
    )


def test_start_imports_no_tempfile_or_shutil() -> None:
    # the state directory's probe is made without tempfile (its random and shutil): ~4 ms;
    # the command line's help formatter finds its width without shutil (bz2, lzma): ~2 ms
    code = textwrap.dedent(
        """
        import sys
        from nri_framework import launch, cli
        from nri_framework.cmdline import policy_name
        from nri_framework.registry import load_policy
        policy = ("balloons", load_policy(policy_name(["--policy", "balloons"])))
        cli.build_parser(policy, commands=False).parse_args(["run", "--policy", "balloons"])
        print(sorted(m for m in ("tempfile", "shutil") if m in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


async def test_a_start_that_waits_resumes_the_collector() -> None:
    # the launch pauses the collector for a start that goes through; one that
    # waits for its pod (a missing path, retried for hours maybe) must not run
    # that long without it (a failed attempt's cycles would never be freed)
    looks: list[bool] = []

    def check() -> startup.Obstacle | None:
        looks.append(gc.isenabled())
        return None if len(looks) > 1 else startup.Obstacle("/x", "does not exist", "mount it")

    async def pause(delay: float) -> None:
        return None

    was = gc.isenabled()
    gc.disable()
    try:
        assert await Startup([check], pause=pause).wait(lambda: "host") == "host"
    finally:
        if was:
            gc.enable()
    assert looks == [False, True]

"""The start-up (``nri_framework.startup.Startup``): the policy host is made
off the event loop, as it was before the loop ran, so that a policy's start
may wait for its peers (the balloons policy sets up the SST helper with
CONFIG_TIMEOUT per request) while the loop keeps answering ``/livez`` and
``/healthz``."""

from __future__ import annotations

import asyncio
import threading

from nri_framework.startup import Startup


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

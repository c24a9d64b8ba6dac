"""sstlink.Backoff: the background's pause between attempts with a helper
that did not answer, which the periodic probe cuts short (the pauses here
are far past any test's time unless woken: a missed wake fails on the
liveness bound, never by a figure of time)."""

from __future__ import annotations

import asyncio

from nri_balloons.sstlink import Backoff

LONG = 60.0
"""Seconds of a pause that only a wake may end in time."""
LIVENESS = 10.0


async def test_a_wake_cuts_a_pause_short() -> None:
    backoff = Backoff()
    asyncio.get_running_loop().call_soon(backoff.wake)
    assert await asyncio.wait_for(backoff.until_woken(LONG), LIVENESS)


async def test_a_wake_while_nobody_pauses_cuts_the_next_pause_only() -> None:
    """A probe that came while an attempt was on the way is not lost; it is
    used up by the pause it cut."""
    backoff = Backoff()
    backoff.wake()
    assert await asyncio.wait_for(backoff.until_woken(LONG), LIVENESS)
    assert not await backoff.until_woken(0.01)


async def test_pause_is_until_woken_without_its_answer() -> None:
    """The shape cpupriority.rediscover's ``pause`` takes."""
    backoff = Backoff()
    asyncio.get_running_loop().call_soon(backoff.wake)
    await asyncio.wait_for(backoff.pause(LONG), LIVENESS)
    assert not await backoff.until_woken(0.01)

"""The helper writer (:class:`nri_balloons.sstlink.HelperWriter`) over a real
ZeroMQ socket: a request in flight when the plugin shuts down.

Seen in the e2e tier: the background's probe awaited the helper when the pod
stopped; ``policy_shutdown`` closed the writer (its clients dropped) and then
the probe's task was cancelled, whose cleanup read the dropped client: an
AttributeError traceback instead of a clean cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
from nri_balloons.sstlink import HelperWriter
from nri_sst import messages as m


async def test_a_request_in_flight_at_close_ends_with_its_cancellation(tmp_path: Path) -> None:
    """A helper that takes requests and never answers (a ZeroMQ ROUTER of
    ours standing in for a stopped helper): the request awaits its reply;
    the writer is closed meanwhile, then the task cancelled: it ends
    cancelled, and the writer asks anew afterwards."""
    endpoint = f"ipc://{tmp_path / 'mute.sock'}"
    context = zmq.Context()
    mute = context.socket(zmq.ROUTER)
    mute.bind(endpoint)
    writer = HelperWriter(endpoint, timeout=30)
    task = asyncio.create_task(writer.request_async(m.Discover(), timeout=30))
    for _ in range(20):  # let it reach its wait for the reply
        await asyncio.sleep(0.005)
    assert not task.done()
    writer.close()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert writer.instance == ""
    again = asyncio.create_task(writer.request_async(m.Discover(), timeout=30))
    await asyncio.sleep(0.01)
    again.cancel()
    with pytest.raises(asyncio.CancelledError):
        await again
    writer.close()
    mute.close(linger=0)
    context.term()

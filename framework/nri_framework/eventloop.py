"""The event loop a caller runs in, if any: hosts, statefiles and policies
are also driven without one (tests, tools), and then act at once."""

from __future__ import annotations

import asyncio


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop, or ``None`` outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

"""The long-lived heap and the garbage collector.

What a start makes (the imports, the policy, its topology, configuration and
saved state) and what a Synchronize converts live as long as the process: each
collection meanwhile walks them for nothing, and each full collection after
walks all of them again. So the collector is paused while they are made
(:func:`pause_heap`) and what is alive then is frozen out of its walk
(:func:`settle_heap`). A module of its own, importing nothing but :mod:`gc`:
the launch pauses the collector before the start's imports (asyncio, msgspec,
protobuf: ~3-5 ms of young collections of a restart otherwise).
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Move every object alive now (the imports, the policy, the topology, the
    containers of a Synchronize) into the garbage collector's permanent
    generation: they live as long as the process, and each full collection
    otherwise walks all of them again, a pause of milliseconds on the event
    loop at 1000 containers, the p99 of whichever request it lands in. Objects
    frozen are still freed when their last reference goes (only a cycle among
    them would stay), so this is called once after start-up and after each
    Synchronize. It also resumes the collector :func:`pause_heap` stopped."""
    gc.freeze()
    gc.enable()


def pause_heap() -> None:
    """Stop the garbage collector while what is made lives on (the start's
    imports and policy, a Synchronize's containers): each collection meanwhile
    would walk them for nothing (about 10 ms of a Synchronize of 1000, and of a
    start's imports). :func:`settle_heap` freezes them and resumes it; what runs
    in between is short (the imports and the policy's start, one Synchronize with
    its reply budget); a start that has to wait resumes it
    (:meth:`nri_framework.startup.Startup.wait`)."""
    gc.disable()

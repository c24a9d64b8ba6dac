"""The ``nri-resource-policy`` console script and ``python -m nri_framework``.

The command line's imports (asyncio, protobuf, msgspec, then the policy's: about
100 ms of a start) make objects that live as long as the process, so the garbage
collector is paused while they are made (:func:`~nri_framework.heap.pause_heap`,
before any of them: this module imports nothing else at its top);
:func:`nri_framework.cli.main` settles the heap (freezes what is alive, resumes
the collector) before a command does its work, ``run`` once its policy host is
made (the topology, the configuration and the saved state of 1000 containers
live as long as the process too: ~5 ms of young collections of a restart).
"""

from __future__ import annotations

from nri_framework.heap import pause_heap


def main(argv: list[str] | None = None) -> int:
    pause_heap()
    from nri_framework.cli import main as cli_main

    return cli_main(argv)

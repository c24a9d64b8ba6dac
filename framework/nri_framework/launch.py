"""The ``nri-resource-policy`` console script and ``python -m nri_framework``.

The command line's imports (asyncio, protobuf, msgspec, then the policy's: about
100 ms of a start) make objects that live as long as the process, so the garbage
collector is paused while they are made (:func:`~nri_framework.startup.pause_heap`);
:func:`nri_framework.cli.main` settles the heap (freezes what is alive, resumes
the collector) before a command does its work, ``run`` once its policy is loaded.
"""

from __future__ import annotations

from nri_framework.startup import pause_heap


def main(argv: list[str] | None = None) -> int:
    pause_heap()
    from nri_framework.cli import main as cli_main

    return cli_main(argv)

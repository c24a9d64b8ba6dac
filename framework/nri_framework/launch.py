"""The ``nri-resource-policy`` console script and ``python -m nri_framework``.

The command line's imports (asyncio, protobuf, msgspec, then the policy's: about
100 ms of a start) make objects that live as long as the process, so the garbage
collector is paused while they are made (:func:`~nri_framework.heap.pause_heap`,
before any of them: this module imports nothing else at its top);
:func:`nri_framework.cli.main` settles the heap (freezes what is alive, resumes
the collector) before a command does its work, ``run`` once its policy host is
made (the topology, the configuration and the saved state of 1000 containers
live as long as the process too: ~5 ms of young collections of a restart).

A ``run``'s sysfs topology is discovered by a child process meanwhile, on
the node's second core (:mod:`nri_framework.topology_child`, forked before
asyncio is imported, once msgspec and the topology's records are).

asyncio is imported without TLS (:func:`import_asyncio_without_tls`): its event
loop speaks NRI over a unix socket and plain HTTP on the metrics endpoint, and
its ``try: import ssl`` would load OpenSSL (~7 ms of every start) for nothing.
msgspec is imported without typing_extensions
(:func:`import_msgspec_without_typing_extensions`, before anything here
imports msgspec): on Python 3.11+ :mod:`typing` has what msgspec takes from it,
and the import of typing_extensions (with :mod:`inspect`) is ~10 ms of a start.
"""

from __future__ import annotations

import sys


def import_without(module: str, blocked: str) -> None:
    """Import ``module`` as on a Python without ``blocked``: for the duration
    of the import ``sys.modules[blocked]`` is ``None``, which makes ``import
    blocked`` raise :class:`ImportError` (the import system's documented way
    to block a name), and ``module`` catches it. Afterwards ``import blocked``
    loads it as usual. A process that has either module already is left as
    it is."""
    if module in sys.modules or blocked in sys.modules:
        return
    sys.modules[blocked] = None  # type: ignore[assignment]
    try:
        __import__(module)
    finally:
        if blocked in sys.modules and sys.modules[blocked] is None:
            del sys.modules[blocked]


def import_asyncio_without_tls() -> None:
    """Import :mod:`asyncio` without :mod:`ssl` (:func:`import_without`):
    asyncio's modules catch the ImportError (``ssl = None``). The Kubernetes
    agent's client (urllib3, blocking, in its own threads) imports ssl later
    and speaks TLS to the API server; only asyncio's own TLS (``ssl=`` of
    ``create_connection``, ``start_server``) stays off in this process, and
    raises ``RuntimeError`` if asked for."""
    import_without("asyncio", "ssl")


def import_msgspec_without_typing_extensions() -> None:
    """Import :mod:`msgspec` without typing_extensions (:func:`import_without`):
    ``msgspec._utils`` catches the ImportError and takes ``get_type_hints``,
    ``Required`` and ``NotRequired`` from :mod:`typing` (3.11+ has them; our
    types use nothing of typing_extensions). Whatever imports typing_extensions
    afterwards (grpc, the Kubernetes client) gets it."""
    import_without("msgspec", "typing_extensions")


import_msgspec_without_typing_extensions()

from nri_framework import topology_child  # noqa: E402  (imports msgspec)
from nri_framework.heap import pause_heap  # noqa: E402


def start_topology_child(argv: list[str]) -> None:
    """A ``run``'s topology discovered by a child beside the imports
    (:mod:`nri_framework.topology_child`), when no thread exists yet (a fork
    of a threaded process may copy a lock some thread holds)."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return
    root = topology_child.host_root_of(argv)
    if root is not None:
        topology_child.start(root)


def main(argv: list[str] | None = None) -> int:
    pause_heap()
    start_topology_child(sys.argv[1:] if argv is None else argv)
    import_asyncio_without_tls()
    from nri_framework.cli import main as cli_main

    return cli_main(argv)

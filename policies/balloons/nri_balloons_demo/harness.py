"""``nri-resource-policy demo [NAME] [--list] [--keep]``: run a demo.

Demos are the entry points of the ``nri_resource_policy.demos`` group, ``name
= module:main``, where ``main(argv: list[str]) -> int`` gets ``[name, *rest]``:
the demo's name, then the arguments after it that this command does not know
(``--keep`` included when given). Without NAME the default demo runs: the
one whose ``main`` is marked with :func:`default` (``pct-managed``, the spec's
walkthrough, the README's main job), else the first by name. ``--list``
prints the installed demos, the default marked.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import TypeVar

DEMO_GROUP = "nri_resource_policy.demos"
"""Entry points of policies' demos: ``name = module:main`` (main(argv) -> int)."""


def demo_entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=DEMO_GROUP)}


Main = Callable[[list[str]], int]
DEFAULT_MARK = "nri_default_demo"
"""The attribute :func:`default` sets on a demo's ``main``."""
M = TypeVar("M", bound=Main)


def default(main: M) -> M:
    """Marks a demo's ``main`` as the one ``demo`` runs without a name."""
    setattr(main, DEFAULT_MARK, True)
    return main


def default_demo(demos: dict[str, EntryPoint]) -> str | None:
    """The demo that runs without a name: the first one (by name) whose
    ``main`` is marked :func:`default`, else the first one; None when no demo
    is installed. A demo that does not load is not the default."""
    for name in sorted(demos):
        try:
            target = demos[name].load()
        except Exception:  # a broken third-party demo fails when it is run by name
            continue
        if getattr(target, DEFAULT_MARK, False) is True:
            return name
    return min(demos, default=None)


def demo_arguments(
    argv: list[str], description: str | None, extra: Callable[[argparse.ArgumentParser], object]
) -> argparse.Namespace:
    """A demo's own arguments: ``[name, *rest]`` as :func:`main` passes them;
    ``extra`` adds the demo's options."""
    parser = argparse.ArgumentParser(
        prog="nri-resource-policy demo",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    extra(parser)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    demos = demo_entry_points()
    parser = argparse.ArgumentParser(
        prog="nri-resource-policy demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", nargs="?", choices=sorted(demos))
    parser.add_argument("--list", action="store_true", help="list the installed demos")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args, rest = parser.parse_known_args(argv)
    if args.list:
        marked = default_demo(demos)
        for name in sorted(demos):
            print(f"{name}{' (default)' if name == marked else ''}")
        return 0
    scenario = args.scenario or default_demo(demos)
    if scenario is None:
        print("nri-resource-policy demo: no demo installed", flush=True)
        return 2
    run: Main = demos[scenario].load()
    return run([scenario, *rest, *(["--keep"] if args.keep else [])])

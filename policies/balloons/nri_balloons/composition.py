"""Checks of composite balloons (upstream ``validateConfig``, the part about
``components``): options a composite type may not have, components that are
unnamed or undefined, circular compositions, and nesting deeper than the
policy builds. The messages are upstream's, without the ``balloons: invalid
configuration: balloons:`` prefix that :mod:`nri_balloons.validation` adds;
the walks are iterative and linear (a chain of thousands of types recurses
nowhere).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from nri_balloons.config import BalloonType
from nri_balloons.gofmt import quote

#: Levels of composite balloons in composite balloons (ours: the policy builds
#: them recursively, and a chain of thousands of types must not reach it).
MAX_COMPOSITION_DEPTH = 32


def composite_type_errors(bt: BalloonType) -> Iterator[str]:
    """What a composite balloon type may not have (upstream ``validateConfig``)."""
    if bt.cpu_class:
        yield f"composite balloon {quote(bt.name)} cannot have CpuClasses"
    forbidden = [
        option
        for option, used in (
            ("PreferSpreadOnPhysicalCores", bt.prefer_spread_on_physical_cores is not None),
            ("AllocatorTopologyBalancing", bt.allocator_topology_balancing is not None),
            ("PreferCloseToDevices", bool(bt.prefer_close_to_devices)),
            ("PreferIsolCpus", bt.prefer_isol_cpus),
            ("PreferCoreType", bool(bt.prefer_core_type)),
        )
        if used
    ]
    if forbidden:
        yield (
            "CPU allocation options not allowed in composite balloons, but"
            f" {quote(bt.name)} has: {', '.join(forbidden)}"
        )


def composition_errors(composites: dict[str, BalloonType], defined: set[str]) -> Iterator[str]:
    """The components of ``composites`` (name -> type): undefined or unnamed
    ones, circular compositions (each loop once), and nesting deeper than
    :data:`MAX_COMPOSITION_DEPTH`; ``defined``: every balloon type's name."""

    def parts(name: str) -> list[str]:
        comp_def = composites.get(name)
        return [c.balloon_type for c in comp_def.components] if comp_def else []

    clean: set[str] = set()  # explored without finding a loop: never leads to one

    def circular(start: str) -> str | None:
        """The first type met twice on a path from ``start`` (upstream's
        depth-first order); iterative and linear: a chain of thousands of
        types does not recurse, shared components are explored once."""
        if start in clean:
            return None
        on_path = {start}
        stack = [(start, iter(parts(start)))]
        while stack:
            name, todo = stack[-1]
            part = next(todo, None)
            if part is None:
                stack.pop()
                on_path.discard(name)
                clean.add(name)
            elif part in on_path:
                return part
            elif part not in clean:
                on_path.add(part)
                stack.append((part, iter(parts(part))))
        return None

    reported: set[str] = set()
    for name, bt in composites.items():
        for i, comp in enumerate(bt.components):
            if not comp.balloon_type:
                yield (
                    "missing or empty component balloonType name in composite balloon"
                    f" {quote(name)} component {i + 1}"
                )
            elif comp.balloon_type not in defined:
                yield (
                    f"balloon type {quote(comp.balloon_type)} in composite balloon"
                    f" {quote(name)} is not defined in balloonTypes"
                )
        loop = circular(name)
        if loop is not None and loop not in reported:
            reported.add(loop)
            yield f"circular composition detected in composite balloon {quote(loop)}"
    if not reported:
        yield from _depth_errors(composites, parts)


def _depth_errors(
    composites: dict[str, BalloonType], parts: Callable[[str], list[str]]
) -> Iterator[str]:
    """Composites of composites at most MAX_COMPOSITION_DEPTH levels deep
    (the policy builds them recursively); the graph has no loops here."""
    depth: dict[str, int] = {}
    for start in composites:
        stack = [(start, False)]
        while stack:
            name, done = stack.pop()
            if name in depth:
                continue
            if done:
                depth[name] = 1 + max((depth[p] for p in parts(name)), default=0)
                continue
            stack.append((name, True))
            stack.extend((p, False) for p in parts(name) if p not in depth)
        if depth[start] > MAX_COMPOSITION_DEPTH:
            yield (
                f"composite balloon {quote(start)} nests components deeper than"
                f" {MAX_COMPOSITION_DEPTH} levels"
            )
            return

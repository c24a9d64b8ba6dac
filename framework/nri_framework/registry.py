"""Finding policies: the entry-point group ``nri_resource_policy.policies``.

An entry point may name a module (registered as it is), a class or factory
(called without arguments to make the plugin object), or an object.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType

from nri_framework import hookspecs

GROUP = "nri_resource_policy.policies"


class PolicyNotFound(LookupError):
    pass


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    target: str
    distribution: str
    version: str
    hooks: tuple[str, ...]


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def instantiate(obj: object) -> object:
    if isinstance(obj, ModuleType):
        return obj
    if callable(obj):
        return obj()
    return obj


def load_policy(name: str) -> object:
    eps = _entry_points()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none"
        raise PolicyNotFound(f"policy {name!r} not found (installed: {known})")
    return instantiate(eps[name].load())


def implemented_hooks(plugin: object) -> tuple[str, ...]:
    spec_names = {
        n
        for n, v in vars(hookspecs).items()
        if inspect.isfunction(v) and hasattr(v, f"{hookspecs.PROJECT}_spec")
    }
    return tuple(
        sorted(
            n for n in spec_names if hasattr(getattr(plugin, n, None), f"{hookspecs.PROJECT}_impl")
        )
    )


def list_policies() -> list[PolicyInfo]:
    out = []
    for name, ep in sorted(_entry_points().items()):
        dist = ep.dist
        try:
            plugin = instantiate(ep.load())
            hooks = implemented_hooks(plugin)
            version = getattr(plugin, "__version__", None) or (dist.version if dist else "?")
        except Exception as exc:  # a broken third-party policy must not break the listing
            hooks = (f"<failed to load: {exc}>",)
            version = dist.version if dist else "?"
        out.append(
            PolicyInfo(
                name=name,
                target=ep.value,
                distribution=dist.metadata["Name"] if dist else "?",
                version=str(version),
                hooks=hooks,
            )
        )
    return out

"""Finding policies and commands through entry points.

Policies: the group ``nri_resource_policy.policies``. An entry point may name
a module (registered as it is), a class or factory (called without arguments
to make the plugin object), or an object.

Commands: the group ``nri_resource_policy.commands``. The entry point's name
is the subcommand of ``nri-resource-policy``, its target a callable
``main(argv: list[str]) -> int`` (the arguments after the subcommand; the
exit status), e.g. ``validate = "nri_balloons.validate_cli:main"``. The
framework's own commands (``run``, ``policies``, ...) win over an entry point
of the same name.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, cast

import msgspec

from nri_framework import hookspecs

if TYPE_CHECKING:
    # importlib.metadata (with email and csv, about 20 ms) is imported only when
    # the declarations must be listed or are not plain: ``run`` reads them itself
    from importlib.metadata import EntryPoint

GROUP = "nri_resource_policy.policies"
COMMANDS = "nri_resource_policy.commands"

#: a command's entry-point target: the arguments after the subcommand -> exit status
Command = Callable[[list[str]], int]


class PolicyNotFound(LookupError):
    pass


class CommandUnavailable(LookupError):
    """An installed command's target cannot be loaded (its distribution, or a
    part of it, is missing)."""


class PolicyInfo(msgspec.Struct, frozen=True):
    name: str
    target: str
    distribution: str
    version: str
    hooks: tuple[str, ...]


def _entry_points(group: str = GROUP) -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=group)}


#: ``EntryPoint.pattern``: a module, its attribute path, extras
_TARGET = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")
_METADATA_DIRS = (".dist-info", ".egg-info")


def _only_declaration(group: str, name: str) -> str | None:
    """The target of entry point ``name`` of ``group`` when exactly one
    distribution on ``sys.path`` declares it, read from the ``entry_points.txt``
    files as :mod:`importlib.metadata` reads them; ``None`` (the caller asks
    :mod:`importlib.metadata`) for anything else: no or several declarations,
    a zip or an egg on the path, another finder of distributions. As there, the
    first metadata directory of a distribution name hides later ones (the
    editable install's ``*.egg-info`` in the current directory hides the
    ``*.dist-info`` in site-packages)."""
    import importlib.machinery

    if any(
        hasattr(f, "find_distributions") and f is not importlib.machinery.PathFinder
        for f in sys.meta_path
    ):
        return None
    found: list[str] = []
    dists: set[str] = set()
    for entry in sys.path:
        root = entry or "."
        if root.endswith(".egg"):
            return None
        try:
            children = os.listdir(root)
        except NotADirectoryError:
            return None  # a zip archive
        except OSError:
            continue
        for child in children:
            low = child.lower()
            if not low.endswith(_METADATA_DIRS):
                continue
            if not child.endswith(_METADATA_DIRS):
                return None  # importlib.metadata names it from its METADATA
            dist = re.sub(r"[-_.]+", "_", low.rpartition(".")[0].partition("-")[0])
            if dist in dists:
                continue
            dists.add(dist)
            try:
                with open(os.path.join(root, child, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
            except (OSError, UnicodeDecodeError):
                return None
            section = None
            for line in map(str.strip, text.splitlines()):
                if not line or line.startswith("#"):
                    continue
                if line.startswith("[") and line.endswith("]"):
                    section = line.strip("[]")
                elif section == group:
                    if "=" not in line:
                        return None
                    key, _, value = line.partition("=")
                    if key.strip() == name:
                        found.append(value.strip())
    return found[0] if len(found) == 1 else None


def distribution(ep: EntryPoint) -> str:
    """The name of the distribution that declares ``ep``."""
    return ep.dist.metadata["Name"] if ep.dist else "?"


def installed_commands() -> dict[str, EntryPoint]:
    """The commands of the group ``nri_resource_policy.commands``, by name."""
    return dict(sorted(_entry_points(COMMANDS).items()))


def load_command(ep: EntryPoint) -> Command:
    """The callable of the command ``ep``; :class:`CommandUnavailable` when it
    cannot be imported or is not callable."""
    try:
        target = ep.load()
    except (ImportError, AttributeError) as exc:
        raise CommandUnavailable(
            f"command {ep.name!r} is not available: {ep.value} cannot be loaded ({exc}); "
            f"install the distribution that provides it ({distribution(ep)} declares it)"
        ) from None
    if not callable(target):
        raise CommandUnavailable(f"command {ep.name!r}: {ep.value} is not callable")
    return cast(Command, target)


def instantiate(obj: object) -> object:
    if isinstance(obj, ModuleType):
        return obj
    if callable(obj):
        return obj()
    return obj


def load_policy(name: str) -> object:
    target = _only_declaration(GROUP, name)
    if target is not None and (match := _TARGET.match(target)):
        module = importlib.import_module(match.group("module"))
        attrs = filter(None, (match.group("attr") or "").split("."))
        return instantiate(functools.reduce(getattr, attrs, module))
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
                distribution=distribution(ep),
                version=str(version),
                hooks=hooks,
            )
        )
    return out

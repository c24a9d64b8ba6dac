"""The command line a policy extends: ``run``'s flags of the policy (the hook
:func:`~nri_framework.hookspecs.policy_addoption`) and their parsed values as
the policy's own typed options.

``run --policy NAME`` reads ``--policy`` first (:func:`policy_name`), loads
that policy, lets it add its flags (:func:`add_policy_flags`), then parses
everything; the host hands the parsed namespace to the policy as
``host.options``, which builds its options from it (:func:`typed_options`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, TypeVar

import msgspec

from nri_framework.hookspecs import PolicyError, plugin_manager

S = TypeVar("S", bound=msgspec.Struct)


def terminal_columns() -> int:
    """The columns :func:`shutil.get_terminal_size` gives (``$COLUMNS`` when a
    positive integer, else the terminal's of ``sys.__stdout__``, else 80), without
    importing :mod:`shutil` (its ``bz2`` and ``lzma``: ~2 ms of a start)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns or 80


class Formatter(argparse.HelpFormatter):
    """argparse's help formatter, its width from :func:`terminal_columns`:
    argparse's own computes it with :mod:`shutil`, imported at the first
    ``add_argument`` (which formats the flag to check it). The same text."""

    def __init__(self, prog: str, *args: Any, **kwargs: Any) -> None:
        if len(args) < 3 and kwargs.get("width") is None:  # argparse: the columns less 2
            kwargs["width"] = terminal_columns() - 2
        super().__init__(prog, *args, **kwargs)


def policy_name(argv: list[str]) -> str | None:
    """The ``--policy`` of ``run``'s arguments ``argv``, before the policy's
    flags are known (they are left for the full parse)."""
    first = argparse.ArgumentParser(
        prog="nri-resource-policy run", add_help=False, formatter_class=Formatter
    )
    first.add_argument("--policy")
    known, _ = first.parse_known_args(argv)
    name: str | None = known.policy
    return name


def add_policy_flags(parser: argparse.ArgumentParser, name: str, policy: object) -> None:
    """Let ``policy`` (loaded as ``name``) add its flags to ``run``'s ``parser``.

    Raises :class:`PolicyError` when a flag cannot be added (one the framework
    or another plugin already has)."""
    pm = plugin_manager()
    pm.register(policy, name=name)
    try:
        pm.hook.policy_addoption(parser=parser)
    except argparse.ArgumentError as exc:
        raise PolicyError(f"policy {name!r} cannot add its flags: {exc}") from None


def typed_options(cls: type[S], options: argparse.Namespace) -> S:
    """``cls`` (a policy's options, a msgspec Struct) from the parsed command
    line: each field is the value of the flag of that name (``--sst-helper``
    is ``sst_helper``); a field the namespace lacks (a host built without a
    command line) keeps its default. Raises :class:`PolicyError` for a value
    of the wrong type."""
    given = {f: getattr(options, f) for f in cls.__struct_fields__ if hasattr(options, f)}
    try:
        return msgspec.convert(given, cls)
    except msgspec.ValidationError as exc:
        raise PolicyError(f"options of the policy: {exc}") from None

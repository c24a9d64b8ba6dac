"""A container's group (``groupBy``, reference §6): the type's ``groupBy`` text
with ``${key}``/``$key`` references to the container and its pod replaced."""

from __future__ import annotations

import re

from nri_balloons.expression import Subject, resolve_ref

__all__ = ["expand_group"]

_REF = re.compile(r"\$\{([^}]*)\}|\$([A-Za-z0-9_./-]+)")


def expand_group(text: str, subject: Subject, must_resolve: bool) -> str:
    """``groupBy`` with ``${key}``/``$key`` references replaced by their values."""

    def sub(m: re.Match[str]) -> str:
        key = m.group(1) if m.group(1) is not None else m.group(2)
        value, found = resolve_ref(subject, key)
        if not found and must_resolve:
            raise KeyError(f"cannot resolve {key!r}")
        return value

    return _REF.sub(sub, text)

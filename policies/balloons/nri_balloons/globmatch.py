"""Go's ``path.Match`` / ``filepath.Match`` (Linux) as a translation to ``re``.

Upstream matches namespaces, expression values, IRQ descriptions and
pod-resource names with these globs, so ours must agree on every pattern:

* ``*`` any run of characters except ``/``; ``?`` one character except ``/``;
* ``[abc]``, ``[a-z]``, ``[^a-z]`` one character (which *may* be ``/``);
  ``\\c`` escapes ``c`` inside and outside classes;
* the whole name must match.

Malformed patterns (``[``, ``[]``, ``[a-]``, a trailing ``\\``, ...) are
``ErrBadPattern`` in Go: :func:`compile_glob` raises :class:`GlobError` and
:func:`go_match` answers ``False``, as upstream does when it drops the error.
Unlike ``fnmatch`` there is no ``[!...]`` negation and an unclosed ``[`` is not
taken literally.
"""

from __future__ import annotations

import functools
import re

BAD_PATTERN = "syntax error in pattern"  # Go's path.ErrBadPattern text


class GlobError(ValueError):
    """A malformed pattern (Go's ``ErrBadPattern``)."""

    def __init__(self) -> None:
        super().__init__(BAD_PATTERN)


def _class_item(pattern: str, i: int) -> tuple[str, int]:
    """Go's ``getEsc``: one (possibly escaped) class character at ``i``."""
    n = len(pattern)
    if i >= n or pattern[i] in "-]":
        raise GlobError()
    if pattern[i] == "\\":
        i += 1
        if i >= n:
            raise GlobError()
    ch = pattern[i]
    i += 1
    if i >= n:  # a class must be closed
        raise GlobError()
    return ch, i


def _translate_class(pattern: str, i: int) -> tuple[str, int]:
    """``pattern[i]`` is just after ``[``; returns the regex and the index after ``]``."""
    negated = i < len(pattern) and pattern[i] == "^"
    if negated:
        i += 1
    ranges: list[tuple[str, str]] = []
    count = 0
    while True:
        if i < len(pattern) and pattern[i] == "]" and count > 0:
            i += 1
            break
        lo, i = _class_item(pattern, i)
        hi = lo
        if pattern[i] == "-":
            hi, i = _class_item(pattern, i + 1)
        count += 1
        if lo <= hi:  # Go silently never matches an inverted range
            ranges.append((lo, hi))
    body = "".join(
        re.escape(lo) if lo == hi else f"{re.escape(lo)}-{re.escape(hi)}" for lo, hi in ranges
    )
    if not body:
        return ("(?s:.)" if negated else "(?!)"), i
    return f"[{'^' if negated else ''}{body}]", i


@functools.lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The regex equivalent of a Go glob; :class:`GlobError` if it is malformed."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "*":
            while i < n and pattern[i] == "*":
                i += 1
            out.append("[^/]*")
            continue
        if ch == "?":
            out.append("[^/]")
        elif ch == "[":
            cls, i = _translate_class(pattern, i + 1)
            out.append(cls)
            continue
        elif ch == "\\":
            i += 1
            if i >= n:
                raise GlobError()
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def check_pattern(pattern: str) -> None:
    """Raise :class:`GlobError` if Go would reject ``pattern``."""
    compile_glob(pattern)


def go_match(pattern: str, name: str) -> bool:
    """``filepath.Match(pattern, name)`` with the error dropped (false)."""
    try:
        return compile_glob(pattern).fullmatch(name) is not None
    except GlobError:
        return False

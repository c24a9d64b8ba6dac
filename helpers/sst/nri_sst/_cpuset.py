"""A private, minimal Linux list-format cpuset parser/formatter.

``nri_framework.cpuset`` is the project's home for cpusets, but the helper
must not import ``nri_framework`` (small attack surface, see the architecture
page), so this module repeats the two functions the helper needs.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``; raises ``ValueError`` on bad text."""
    out: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        lo_s, sep, hi_s = part.strip().partition("-")
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
        if lo < 0 or hi < lo:
            raise ValueError(f"bad cpuset range {part!r}")
        out.update(range(lo, hi + 1))
    return sorted(out)


def format(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``; ``""`` for none."""
    parts: list[str] = []
    start = prev = -2
    for i in sorted(set(ids)):
        if i == prev + 1:
            prev = i
            continue
        if start >= 0:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = i
    if start >= 0:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)

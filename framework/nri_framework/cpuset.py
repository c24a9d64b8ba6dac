"""CPU and memory-node sets: Linux list format <-> int bitmasks.

The one home for cpuset parsing and formatting. A set is a Python ``int``
whose bit ``n`` stands for CPU (or NUMA node) ``n``; set algebra is ``|``,
``&``, ``& ~``; ``mask.bit_count()`` is the size.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

#: Ids a set may hold: 0 .. MAX_IDS - 1. Linux has at most 8192 CPUs
#: (``NR_CPUS`` of ``MAXSMP``) and fewer NUMA nodes; a larger id is a typo or
#: an attack, and building its mask would take memory in proportion to it.
MAX_IDS = 8192
#: Masks :func:`format` remembers (the most recently formatted): the balloons'
#: and their memory nodes' sets with room to spare; bounded, since a set of
#: MAX_IDS ids formats to kilobytes.
FORMAT_CACHE = 512
#: :func:`ids` walks a set of at most this many ids bit by bit, not by runs:
#: as fast for a run of this many, faster for fewer or spread ones (the two
#: threads of a core are two runs)
SPARSE_IDS = 4


class CpusetError(ValueError):
    """Text that is not a Linux list-format set."""


def clip(text: str, width: int = 80) -> str:
    """``text`` shortened for an error message (an input may be megabytes long)."""
    return text if len(text) <= width else text[: width - 3] + "..."


def parse(text: str, *, limit: int = MAX_IDS) -> int:
    """``"0-3,8,10-11"`` -> bitmask. Whitespace and a trailing newline are ignored.

    Ids must be below ``limit``: the mask is built only after every bound is
    checked, so a huge range costs nothing.
    """
    mask = 0
    text = text.strip()
    if not text:
        return 0
    shown = clip(text)
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise CpusetError(f"invalid cpuset {shown!r}: empty element")
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise CpusetError(f"invalid cpuset {shown!r}: bad element {clip(part)!r}") from None
        if lo < 0 or hi < lo:
            raise CpusetError(f"invalid cpuset {shown!r}: bad range {clip(part)!r}")
        if hi >= limit:
            raise CpusetError(f"invalid cpuset {shown!r}: id {hi} out of range 0-{limit - 1}")
        mask |= ((1 << (hi - lo + 1)) - 1) << lo
    return mask


def ranges(mask: int) -> Iterator[tuple[int, int]]:
    """Maximal runs ``(first, last)`` of set bits, ascending."""
    if mask < 0:
        raise CpusetError("negative cpuset mask")
    base = 0
    while mask:
        low = (mask & -mask).bit_length() - 1
        mask >>= low
        base += low
        run = (~mask & (mask + 1)).bit_length() - 1
        yield base, base + run - 1
        mask >>= run
        base += run


@functools.lru_cache(maxsize=FORMAT_CACHE)
def format(mask: int) -> str:
    """Bitmask -> Linux list format (``"0-3,8"``); ``""`` for the empty set.

    Memoized (at most :data:`FORMAT_CACHE` masks): a decision formats the same
    few balloon and node sets for each of its containers."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges(mask))


def from_ids(ids: Iterable[int]) -> int:
    mask = 0
    for i in ids:
        mask |= 1 << i
    return mask


def ids(mask: int) -> list[int]:
    """Bitmask -> ascending list of ids. A set of at most :data:`SPARSE_IDS`
    ids is walked bit by bit (a balloon of a core or two, a decision's
    changed CPUs), a larger one run by run (:func:`ranges`)."""
    count = mask.bit_count()
    if count <= SPARSE_IDS and mask > 0:
        few: list[int] = []
        for _ in range(count):  # (a for: a negative mask's bits never run out)
            low = mask & -mask
            few.append(low.bit_length() - 1)
            mask ^= low
        return few
    out: list[int] = []
    for a, b in ranges(mask):
        out.extend(range(a, b + 1))
    return out


def size(mask: int) -> int:
    return mask.bit_count()


def lowest(mask: int, n: int) -> int:
    """The ``n`` lowest ids of ``mask`` as a mask (fewer if ``mask`` is smaller)."""
    out = 0
    while n > 0 and mask:
        bit = mask & -mask
        out |= bit
        mask ^= bit
        n -= 1
    return out

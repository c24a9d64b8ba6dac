"""Which NRI version a runtime speaks, and which events it accepts.

A subscription bit outside the runtime's ``ValidEvents`` fails registration
("invalid plugin events: 0x800" from containerd 1.7), so the plugin must know
the runtime's NRI version before it asks for events above ``0x400``.
"""

from __future__ import annotations

import re

#: ValidEvents for NRI <= v0.9 (``LAST`` = 12): containerd 1.7, 2.0, 2.1; CRI-O <= 1.33.
VALID_EVENTS_V0_6 = 0x7FF
#: ValidEvents for NRI >= v0.10 (``LAST`` = 15).
VALID_EVENTS_V0_10 = 0x3FFF

# (runtime name, lowest version, NRI version it embeds), from upstream's
# pkg/api/version.go; later rows win.
_RUNTIME_NRI: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = (
    ("containerd", (1, 7, 0), (0, 3, 0)),
    ("containerd", (1, 7, 7), (0, 4, 0)),
    ("containerd", (1, 7, 14), (0, 6, 0)),
    ("containerd", (1, 7, 16), (0, 6, 1)),
    ("containerd", (1, 7, 26), (0, 8, 0)),
    ("containerd", (2, 0, 0), (0, 8, 0)),
    ("containerd", (2, 2, 0), (0, 10, 0)),
    ("containerd", (2, 2, 1), (0, 11, 0)),
    ("cri-o", (1, 30, 0), (0, 6, 0)),
    ("cri-o", (1, 31, 0), (0, 6, 1)),
    ("cri-o", (1, 32, 0), (0, 9, 0)),
    ("cri-o", (1, 34, 0), (0, 10, 0)),
    ("cri-o", (1, 35, 0), (0, 11, 0)),
)


def parse_version(text: str) -> tuple[int, ...]:
    """``"v1.7.24~ds1"`` -> ``(1, 7, 24)``; ``()`` when no number leads."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def runtime_nri_version(
    runtime_name: str, runtime_version: str, nri_version: str = ""
) -> tuple[int, ...]:
    """The NRI version of a runtime: its own word (v0.12+), else the table."""
    if nri_version:
        return parse_version(nri_version)
    name = runtime_name.strip().lower().replace("crio", "cri-o")
    version = parse_version(runtime_version)
    found: tuple[int, ...] = ()
    for rname, lowest, nri in _RUNTIME_NRI:
        if rname == name and version >= lowest:
            found = nri
    return found


def valid_events(runtime_name: str, runtime_version: str, nri_version: str = "") -> int:
    """The subscription bits the runtime accepts; unknown runtimes get the safe set."""
    nri = runtime_nri_version(runtime_name, runtime_version, nri_version)
    return VALID_EVENTS_V0_10 if nri >= (0, 10) else VALID_EVENTS_V0_6


def has_dedicated_rpcs(nri_version: tuple[int, ...]) -> bool:
    """v0.12+ calls per-event RPCs first and falls back to StateChange on UNIMPLEMENTED."""
    return nri_version >= (0, 12)


def synchronizes_prelaunched(nri_version: tuple[int, ...]) -> bool:
    """v0.7+ sends pre-launched plugins Synchronize too (containerd/nri#43: containerd
    2.x, 1.7.26+); before, only external plugins learn the runtime's containers."""
    return nri_version >= (0, 7)

"""Go ``fmt`` verbs that upstream's messages use, so our texts match byte for byte.

Only what the balloons messages need: ``%q`` of a string (:func:`quote`) and
of a ``[]string`` (:func:`quote_list`), ``%v`` of a ``[]string``
(:func:`list_v`) and of a map (:func:`map_v`, keys sorted as Go prints them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

_ESCAPES = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": "\\\\",
    '"': '\\"',
}


def quote(text: str) -> str:
    """``strconv.Quote``: ``"a\\"b"``; printable Unicode is kept, the rest escaped."""
    out = ['"']
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def quote_list(items: Iterable[str]) -> str:
    """``%q`` of a ``[]string``: ``["a" "b"]``."""
    return "[" + " ".join(quote(s) for s in items) + "]"


def list_v(items: Iterable[object]) -> str:
    """``%v`` of a slice: ``[a b]``."""
    return "[" + " ".join(str(s) for s in items) + "]"


def map_v(items: Mapping[str, object] | Iterable[str]) -> str:
    """``%v`` of a map, keys sorted: ``map[a:1 b:2]``; a plain iterable of keys is
    a ``map[string]struct{}`` and prints as ``map[a:{} b:{}]``."""
    if isinstance(items, Mapping):
        pairs = sorted((str(k), str(v)) for k, v in items.items())
    else:
        pairs = [(k, "{}") for k in sorted(set(items))]
    return "map[" + " ".join(f"{k}:{v}" for k, v in pairs) + "]"

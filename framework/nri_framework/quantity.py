"""Kubernetes resource quantities (``resource.Quantity``): the one parser.

``"500m"``, ``"2"``, ``"1.5"``, ``"128Mi"``, ``"1G"``, ``"1e3"`` ... are parsed
exactly (as :class:`fractions.Fraction`), then rounded *up* the way
Kubernetes' ``Value()`` and ``MilliValue()`` do.

Grammar (``k8s.io/apimachinery/pkg/api/resource``)::

    <quantity> ::= <signedNumber><suffix>
    <suffix>   ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI> ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI> ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


#: Largest decimal exponent (``e``/suffix) and number of digits taken: beyond
#: them a quantity is refused, not computed (``1e999999999`` would take
#: gigabytes). Kubernetes' own limit, ``2^63-1`` milli-units, is far inside.
MAX_EXPONENT = 64
MAX_DIGITS = 64


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Fraction:
    """A quantity as an exact fraction: ``"500m"`` -> ``1/2``, ``"1Ki"`` -> ``1024``.

    YAML numbers (``cpu: 2``, ``cpu: 0.5``) are accepted as their decimal text.
    """
    if isinstance(value, bool):
        raise QuantityError(f"quantities must match the regular expression: {value!r}")
    text = repr(value) if isinstance(value, float) else str(value)
    m = _QUANTITY_RE.match(text.strip())
    if m is None:
        raise QuantityError(f"quantities must match the regular expression: {text!r}")
    if len(m.group("num")) > MAX_DIGITS:
        raise QuantityError(f"quantity too large: more than {MAX_DIGITS} digits")
    number = Fraction(m.group("num"))
    if m.group("exp"):
        exp_text = m.group("exp")[1:].lstrip("+-").lstrip("0")
        if len(exp_text) > 4 or int(exp_text or "0") > MAX_EXPONENT:
            raise QuantityError(f"quantity out of range: exponent beyond +-{MAX_EXPONENT}")
        return number * Fraction(10) ** int(m.group("exp")[1:])
    suffix = m.group("suffix") or ""
    if suffix in _BINARY:
        return number * (1 << (10 * _BINARY[suffix]))
    return number * Fraction(10) ** _DECIMAL[suffix]


def value(quantity: str | int | float) -> int:
    """``Quantity.Value()``: whole units, rounded up (bytes for memory)."""
    return math.ceil(parse_quantity(quantity))


def milli_value(quantity: str | int | float) -> int:
    """``Quantity.MilliValue()``: thousandths, rounded up (milli-CPU for cpu)."""
    return math.ceil(parse_quantity(quantity) * 1000)


_SUFFIXES = tuple(sorted(((e, s) for s, e in _DECIMAL.items()), reverse=True))


def format_quantity(quantity: Fraction | int) -> str:
    """A quantity as Kubernetes prints it (``Quantity.String()``, DecimalSI):
    the largest power-of-1000 suffix that keeps the number whole, at least
    nano units (finer amounts round up): ``2`` -> ``"2"``, ``3/2`` ->
    ``"1500m"``, ``1000`` -> ``"1k"``, ``1500`` -> ``"1500"``, ``0`` -> ``"0"``.
    """
    amount = Fraction(quantity)
    if amount == 0:
        return "0"
    sign = "-" if amount < 0 else ""
    nanos = math.ceil(abs(amount) * 10**9)
    for exponent, suffix in _SUFFIXES:
        unit = 10 ** (exponent + 9)
        if nanos % unit == 0:
            return f"{sign}{nanos // unit}{suffix}"
    raise AssertionError("unreachable: every whole number of nanos has a suffix")

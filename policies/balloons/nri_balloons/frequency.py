"""CPU and uncore frequencies of cpuClasses, in kHz (upstream ``policy.Frequency``).

Accepted forms (case-insensitive units, blanks allowed around the number):

* ``"3.2GHz"``/``"3.2G"``, ``"2900MHz"``/``"2900M"``, ``"2900000kHz"``/``"2900000k"``;
* a bare number, as a string or a YAML/JSON number: kHz;
* ``"min"``, ``"base"``, ``"turbo"``: resolved at run time from cpufreq sysfs
  (``cpuinfo_min_freq``, ``base_frequency``, ``cpuinfo_max_freq``);
* ``""`` or ``0``: unset ("don't write").

Values are rounded to whole kHz. The symbolic values are the sentinels upstream
uses (``MaxUint64-2``, ``-1``, ``MaxUint64``), so a :class:`Frequency` is an
``int`` that compares and hashes like upstream's ``uint``.
"""

from __future__ import annotations

import math
import re
from typing import ClassVar

from nri_balloons.gofmt import quote

_MAX_UINT = (1 << 64) - 1
_REGEX = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(GHz|G|MHz|M|kHz|k)?\s*$", re.IGNORECASE)
_SCALE = {"ghz": 1_000_000, "g": 1_000_000, "mhz": 1_000, "m": 1_000, "khz": 1, "k": 1, "": 1}
_SYMBOLS = {"min": _MAX_UINT - 2, "base": _MAX_UINT - 1, "turbo": _MAX_UINT}
_NAMES = {v: k for k, v in _SYMBOLS.items()}


class FrequencyError(ValueError):
    """Text or a number that is not a frequency."""


def _round_half_away(value: float) -> int:
    """Go's ``math.Round`` for non-negative values."""
    return math.floor(value + 0.5)


class Frequency(int):
    """A frequency in kHz, or one of the symbolic sentinels :attr:`MIN`,
    :attr:`BASE`, :attr:`TURBO`."""

    MIN: ClassVar[Frequency]
    BASE: ClassVar[Frequency]
    TURBO: ClassVar[Frequency]

    def __new__(cls, khz: int = 0) -> Frequency:
        if not 0 <= int(khz) <= _MAX_UINT:
            raise FrequencyError(f"invalid frequency: {khz} kHz out of range")
        return super().__new__(cls, khz)

    @classmethod
    def parse(cls, text: str) -> Frequency:
        """Parse the string form (upstream ``parseFrequency``)."""
        s = text.strip()
        if not s:
            return cls(0)
        symbol = _SYMBOLS.get(s.lower())
        if symbol is not None:
            return cls(symbol)
        m = _REGEX.match(s)
        if m is None:
            raise FrequencyError(
                f"invalid frequency {quote(s)}: expected number with optional unit "
                "(GHz, MHz, kHz) or symbolic name (min, base, turbo)"
            )
        val = float(m.group(1)) * _SCALE[(m.group(2) or "").lower()]
        if not val < _SYMBOLS["min"]:  # inf for hundreds of digits: no int of it
            raise FrequencyError(f"invalid frequency {quote(s)}: value out of range")
        khz = _round_half_away(val)
        if khz == 0 and val > 0:
            raise FrequencyError(
                f"invalid frequency {quote(s)}: value too small to represent in kHz"
            )
        if khz >= _SYMBOLS["min"]:
            raise FrequencyError(f"invalid frequency {quote(s)}: value out of range")
        return cls(khz)

    @classmethod
    def from_json(cls, obj: object) -> Frequency:
        """Decode a YAML/JSON value: a string as :meth:`parse`, a number as kHz."""
        if isinstance(obj, str):
            return cls.parse(obj)
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            if obj < 0:
                num = int(obj) if float(obj).is_integer() else obj
                raise FrequencyError(f"invalid frequency: negative value {num}")
            if not math.isfinite(obj) or obj >= _SYMBOLS["min"]:
                raise FrequencyError(f"invalid frequency: value out of range {obj}")
            return cls(_round_half_away(obj) if isinstance(obj, float) else obj)
        text = "null" if obj is None else str(obj).lower() if isinstance(obj, bool) else repr(obj)
        raise FrequencyError(f"invalid frequency: expected string or number, got {text}")

    def to_json(self) -> str | int:
        """Symbolic values as their name, numbers as kHz (upstream ``MarshalJSON``)."""
        return _NAMES.get(int(self), int(self))

    @property
    def khz(self) -> int:
        """The kHz value; the sentinel for symbolic values (resolve them first)."""
        return int(self)

    @property
    def is_symbolic(self) -> bool:
        return int(self) in _NAMES

    def resolve(self, min_khz: int, base_khz: int, max_khz: int) -> int:
        """kHz with ``min``/``base``/``turbo`` replaced by the platform's values."""
        if self == _SYMBOLS["min"]:
            return min_khz
        if self == _SYMBOLS["base"]:
            return base_khz
        if self == _SYMBOLS["turbo"]:
            return max_khz
        return int(self)

    def __str__(self) -> str:
        khz = int(self)
        if khz in _NAMES:
            return _NAMES[khz]
        if khz == 0:
            return "0"
        if khz % 1_000_000 == 0:
            return f"{khz // 1_000_000}GHz"
        if khz % 1_000 == 0:
            return f"{khz // 1_000}MHz"
        return f"{khz}kHz"

    def __repr__(self) -> str:
        return f"Frequency({str(self)!r})"


Frequency.MIN = Frequency(_SYMBOLS["min"])
Frequency.BASE = Frequency(_SYMBOLS["base"])
Frequency.TURBO = Frequency(_SYMBOLS["turbo"])

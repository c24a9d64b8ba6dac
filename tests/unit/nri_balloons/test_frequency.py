"""Frequency: upstream's parsing, formatting, sentinels and error texts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nri_balloons.configdecode import ConfigError
from nri_balloons.configyaml import load_policy
from nri_balloons.frequency import Frequency, FrequencyError

MAX_UINT64 = (1 << 64) - 1


@pytest.mark.parametrize(
    ("text", "khz"),
    [
        ("3.2GHz", 3_200_000),
        ("2G", 2_000_000),
        ("2900MHz", 2_900_000),
        ("2900M", 2_900_000),
        ("2900000kHz", 2_900_000),
        ("2900000k", 2_900_000),
        ("2900000", 2_900_000),
        ("", 0),
        ("0", 0),
        ("  3.2 ghz  ", 3_200_000),
        ("1.5mhz", 1_500),
        (".5GHz", 500_000),
        ("0.5", 1),  # math.Round rounds half away from zero
        ("2.5", 3),
        ("1.4999", 1),
        ("0.0015MHz", 2),
    ],
)
def test_parse_units_and_rounding(text: str, khz: int) -> None:
    f = Frequency.parse(text)
    assert f == khz
    assert f.khz == khz
    assert not f.is_symbolic


@pytest.mark.parametrize(
    ("text", "sentinel"),
    [
        ("min", MAX_UINT64 - 2),
        ("base", MAX_UINT64 - 1),
        ("turbo", MAX_UINT64),
        ("TURBO", MAX_UINT64),
        (" Base ", MAX_UINT64 - 1),
    ],
)
def test_symbolic_values_are_upstreams_sentinels(text: str, sentinel: int) -> None:
    f = Frequency.parse(text)
    assert f == sentinel
    assert f.is_symbolic


def test_symbolic_sentinels_are_distinct_and_named() -> None:
    assert len({Frequency.MIN, Frequency.BASE, Frequency.TURBO}) == 3
    assert [str(f) for f in (Frequency.MIN, Frequency.BASE, Frequency.TURBO)] == [
        "min",
        "base",
        "turbo",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "3GBz",
            'invalid frequency "3GBz": expected number with optional unit (GHz, MHz, kHz)'
            " or symbolic name (min, base, turbo)",
        ),
        (
            "abc",
            'invalid frequency "abc": expected number with optional unit (GHz, MHz, kHz)'
            " or symbolic name (min, base, turbo)",
        ),
        (
            "-5MHz",
            'invalid frequency "-5MHz": expected number with optional unit (GHz, MHz, kHz)'
            " or symbolic name (min, base, turbo)",
        ),
        ("0.4", 'invalid frequency "0.4": value too small to represent in kHz'),
        ("0.0001MHz", 'invalid frequency "0.0001MHz": value too small to represent in kHz'),
    ],
)
def test_parse_errors_are_upstreams_texts(text: str, message: str) -> None:
    with pytest.raises(FrequencyError) as exc:
        Frequency.parse(text)
    assert str(exc.value) == message


def test_error_quotes_the_trimmed_text() -> None:
    with pytest.raises(FrequencyError, match=r'^invalid frequency "1 Hz": '):
        Frequency.parse("  1 Hz ")


@pytest.mark.parametrize(
    ("obj", "khz"),
    [(2_900_000, 2_900_000), (0, 0), (2_900_000.4, 2_900_000), ("3.2GHz", 3_200_000)],
)
def test_json_numbers_are_khz(obj: object, khz: int) -> None:
    assert Frequency.from_json(obj) == khz


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (-1000, "invalid frequency: negative value -1000"),
        (-1.5, "invalid frequency: negative value -1.5"),
        (True, "invalid frequency: expected string or number, got true"),
        (None, "invalid frequency: expected string or number, got null"),
    ],
)
def test_json_errors(obj: object, message: str) -> None:
    with pytest.raises(FrequencyError) as exc:
        Frequency.from_json(obj)
    assert str(exc.value) == message


@pytest.mark.parametrize(
    ("khz", "text"),
    [
        (3_000_000, "3GHz"),
        (2_900_000, "2900MHz"),
        (123, "123kHz"),
        (1_000, "1MHz"),
        (0, "0"),
        (3_200_500, "3200500kHz"),
    ],
)
def test_str_like_upstream(khz: int, text: str) -> None:
    assert str(Frequency(khz)) == text


def test_to_json_symbolic_as_name_numeric_as_khz() -> None:
    assert Frequency.MIN.to_json() == "min"
    assert Frequency.BASE.to_json() == "base"
    assert Frequency.TURBO.to_json() == "turbo"
    assert Frequency(2_900_000).to_json() == 2_900_000
    assert Frequency(0).to_json() == 0


def test_resolve() -> None:
    lo, base, hi = 800_000, 2_300_000, 4_600_000
    assert Frequency.MIN.resolve(lo, base, hi) == lo
    assert Frequency.BASE.resolve(lo, base, hi) == base
    assert Frequency.TURBO.resolve(lo, base, hi) == hi
    assert Frequency(1_500_000).resolve(lo, base, hi) == 1_500_000
    assert Frequency(0).resolve(lo, base, hi) == 0


def test_negative_or_huge_khz_cannot_be_constructed() -> None:
    with pytest.raises(FrequencyError):
        Frequency(-1)
    with pytest.raises(FrequencyError):
        Frequency(MAX_UINT64 + 1)


def test_decoded_from_yaml_cpu_classes() -> None:
    policy = load_policy(
        """
reservedResources: {cpu: "1"}
cpuClasses:
- name: a
  minFreq: 2900000
  maxFreq: 3.2GHz
  uncoreMaxFreq: 2400M
  pctMinFreq: base
  pctMaxFreq: turbo
"""
    )
    cc = policy.spec.cpu_classes[0]
    assert (cc.min_freq, cc.max_freq, cc.uncore_max_freq) == (2_900_000, 3_200_000, 2_400_000)
    assert (cc.pct_min_freq, cc.pct_max_freq) == (Frequency.BASE, Frequency.TURBO)
    assert isinstance(cc.max_freq, Frequency)
    assert cc.uncore_min_freq == 0


def test_yaml_frequency_error_names_the_field() -> None:
    with pytest.raises(ConfigError) as exc:
        load_policy("reservedResources: {cpu: '1'}\ncpuClasses:\n- name: a\n  maxFreq: 3GBz\n")
    assert exc.value.errors == [
        '<config>:4:12: cpuClasses[0].maxFreq: invalid frequency "3GBz": expected number with'
        " optional unit (GHz, MHz, kHz) or symbolic name (min, base, turbo)"
    ]


# --- properties ----------------------------------------------------------------------

KHZ = st.integers(min_value=0, max_value=10**13)


@given(KHZ)
def test_format_then_parse_round_trips(khz: int) -> None:
    f = Frequency(khz)
    assert Frequency.parse(str(f)) == khz


@given(st.sampled_from([Frequency.MIN, Frequency.BASE, Frequency.TURBO]) | KHZ.map(Frequency))
def test_json_round_trips(f: Frequency) -> None:
    assert Frequency.from_json(f.to_json()) == f


@given(
    st.integers(min_value=0, max_value=10**7),
    st.integers(min_value=0, max_value=999),
    st.sampled_from(["GHz", "G", "MHz", "M", "kHz", "k", "", "ghz", "Mhz", "K"]),
)
def test_units_scale_and_round(whole: int, frac: int, unit: str) -> None:
    text = f"{whole}.{frac:03d}{unit}"
    scale = {"g": 10**6, "m": 10**3, "k": 1, "": 1}[unit[:1].lower()]
    value = float(f"{whole}.{frac:03d}") * scale
    expected = int(value + 0.5)
    if expected == 0 and value > 0:
        with pytest.raises(FrequencyError, match="value too small to represent in kHz"):
            Frequency.parse(text)
    else:
        assert Frequency.parse(text) == expected

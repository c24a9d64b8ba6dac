from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nri_framework import cpuset


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("", []),
        ("0", [0]),
        ("0-3", [0, 1, 2, 3]),
        ("0-1,8,10-11\n", [0, 1, 8, 10, 11]),
        ("4095", [4095]),
    ],
)
def test_parse(text: str, ids: list[int]) -> None:
    assert cpuset.ids(cpuset.parse(text)) == ids


@pytest.mark.parametrize("bad", ["a", "1-", "3-1", "1,,2", "-1", "1-2-3"])
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(cpuset.CpusetError):
        cpuset.parse(bad)


def test_format_canonical() -> None:
    assert cpuset.format(cpuset.from_ids([5, 0, 1, 2, 7, 8])) == "0-2,5,7-8"
    assert cpuset.format(0) == ""


@given(st.sets(st.integers(0, 5000), max_size=200))
def test_roundtrip(ids: set[int]) -> None:
    mask = cpuset.from_ids(ids)
    text = cpuset.format(mask)
    assert cpuset.parse(text) == mask
    assert cpuset.ids(mask) == sorted(ids)
    assert cpuset.size(mask) == len(ids)


@given(st.sets(st.integers(0, 300), max_size=50), st.integers(0, 60))
def test_lowest(ids: set[int], n: int) -> None:
    assert cpuset.ids(cpuset.lowest(cpuset.from_ids(ids), n)) == sorted(ids)[:n]


@pytest.mark.parametrize("huge", ["0-99999999999", "0-999999999", "8192", "5,0-8192"])
def test_parse_bounds_ids_before_building_the_mask(huge: str) -> None:
    # without the bound, "0-99999999999" raised MemoryError and "0-999999999"
    # took 900 MB building a mask
    with pytest.raises(cpuset.CpusetError, match="out of range 0-8191"):
        cpuset.parse(huge)
    assert cpuset.parse("8191") == 1 << 8191
    with pytest.raises(cpuset.CpusetError, match="out of range 0-3"):
        cpuset.parse("0-4", limit=4)


def test_parse_error_text_is_bounded() -> None:
    with pytest.raises(cpuset.CpusetError) as exc:
        cpuset.parse("0," * 1_000_000 + "x")
    assert len(str(exc.value)) < 300


def test_format_remembers_a_bounded_number_of_masks() -> None:
    """The memo of :func:`cpuset.format` (each decision formats the same sets)
    holds at most ``FORMAT_CACHE`` masks, whatever a peer makes us format."""
    for i in range(2, cpuset.FORMAT_CACHE + 100):
        assert cpuset.format(1 << i | 1) == f"0,{i}"
    assert cpuset.format.cache_info().currsize <= cpuset.FORMAT_CACHE

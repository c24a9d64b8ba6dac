"""The configuration file's parsed document kept in the state directory
(:mod:`nri_balloons.configcache`), on real files in a temp dir."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from nri_balloons import configcache
from nri_balloons.configcache import MAX_CACHE_BYTES, cache_path, cached_document, keep

TEXT = "spec:\n  reservedResources: {cpu: 1}\n"
DOC = {"spec": {"reservedResources": {"cpu": 1}}}


def test_the_document_of_the_text_kept_is_the_one_given_back(tmp_path: Path) -> None:
    assert cached_document(tmp_path, "balloons", TEXT) is None
    assert keep(tmp_path, "balloons", TEXT, DOC)
    assert cached_document(tmp_path, "balloons", TEXT) == DOC


def test_another_text_or_policy_gets_nothing(tmp_path: Path) -> None:
    keep(tmp_path, "balloons", TEXT, DOC)
    assert cached_document(tmp_path, "balloons", TEXT + "# edited\n") is None
    assert cached_document(tmp_path, "pinner", TEXT) is None
    assert cached_document(None, "balloons", TEXT) is None


@pytest.mark.parametrize(
    "doc",
    [
        {"spec": {"when": datetime.date(2026, 12, 4)}},  # a YAML timestamp
        {"spec": {1: "a key that is no string"}},
        {"spec": {"x": float("nan")}},
    ],
    ids=["timestamp", "int-key", "nan"],
)
def test_a_document_json_would_change_is_not_kept_and_the_old_one_goes(
    tmp_path: Path, doc: dict[str, object]
) -> None:
    keep(tmp_path, "balloons", TEXT, DOC)
    other = "spec: {}\n"
    assert not keep(tmp_path, "balloons", other, doc)
    assert cached_document(tmp_path, "balloons", other) is None
    assert not cache_path(tmp_path, "balloons").exists()


@pytest.mark.parametrize(
    "data",
    [b"", b"{not json", b'{"format": 2, "policy": "balloons", "text": "", "document": {}}', b"[]"],
    ids=["empty", "undecodable", "other-format", "not-an-object"],
)
def test_a_cache_file_that_is_not_ours_is_not_used(tmp_path: Path, data: bytes) -> None:
    cache_path(tmp_path, "balloons").write_bytes(data)
    assert cached_document(tmp_path, "balloons", "") is None


def test_a_cache_file_past_the_bound_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keep(tmp_path, "balloons", TEXT, DOC)
    size = cache_path(tmp_path, "balloons").stat().st_size
    monkeypatch.setattr(configcache, "MAX_CACHE_BYTES", size - 1)
    assert cached_document(tmp_path, "balloons", TEXT) is None
    monkeypatch.setattr(configcache, "MAX_CACHE_BYTES", MAX_CACHE_BYTES)
    assert cached_document(tmp_path, "balloons", TEXT) == DOC


def test_a_state_directory_that_cannot_be_written_keeps_nothing(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a state "directory" that is a file: every write fails
    assert not keep(blocked, "balloons", TEXT, DOC)
    assert cached_document(blocked, "balloons", TEXT) is None

"""The policy lookup of ``run``: the entry points read as importlib.metadata
reads them, without importing it (about 20 ms of a restart), and what a start
leaves unimported until it is needed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from nri_framework import registry


def dist(root: Path, dirname: str, text: str | None) -> None:
    d = root / dirname
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dirname.split('-')[0]}\n")
    if text is not None:
        (d / "entry_points.txt").write_text(textwrap.dedent(text))


@pytest.fixture
def path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    first, second = tmp_path / "first", tmp_path / "second"
    # "hidden" is in both: the first directory's (declaring nothing) hides the second's
    dist(first, "hidden-1.0.dist-info", "[other]\nx = a:b\n")
    dist(second, "hidden-2.0.dist-info", f"[{registry.GROUP}]\nshadowed = mod_s:p\n")
    solo = f"# a comment\n[{registry.GROUP}]\n solo = mod_a : obj.attr \n"
    dist(first, "one-1.0.dist-info", solo)
    dist(second, "two-1.0.dist-info", f"[{registry.GROUP}]\ntwice = mod_b:p\n")
    dist(second, "three-1.0.egg-info", f"[{registry.GROUP}]\ntwice = mod_c:p\n")
    dist(second, "none-1.0.dist-info", None)
    monkeypatch.setattr(sys, "path", [str(first), str(second)])
    return first, second


def test_the_only_declaration_is_importlib_metadatas(path: tuple[Path, Path]) -> None:
    eps = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)}
    assert "shadowed" not in eps  # importlib.metadata: the first "hidden" wins
    assert registry._only_declaration(registry.GROUP, "shadowed") is None
    assert registry._only_declaration(registry.GROUP, "solo") == eps["solo"] == "mod_a : obj.attr"
    # declared twice (the last wins there): left to importlib.metadata
    assert registry._only_declaration(registry.GROUP, "twice") is None
    assert registry._only_declaration(registry.GROUP, "missing") is None


def test_a_zip_on_the_path_is_left_to_importlib_metadata(
    path: tuple[Path, Path], tmp_path: Path
) -> None:
    archive = tmp_path / "a.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))
    sys.path.append(str(archive))
    assert registry._only_declaration(registry.GROUP, "solo") is None


def test_run_imports_neither_importlib_metadata_nor_prometheus_client() -> None:
    code = textwrap.dedent(
        """
        import sys
        from nri_framework import cli
        from nri_framework.registry import load_policy
        policy = ("balloons", load_policy("balloons"))
        cli.build_parser(policy, commands=False).parse_args(["run", "--policy", "balloons"])
        print(sorted(m for m in ("importlib.metadata", "prometheus_client") if m in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr

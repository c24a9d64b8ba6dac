"""The framework imports no policy package: the import graph of every module
under ``framework/nri_framework``, read from the source (every ``import`` and
``from`` statement, function-local ones and ``TYPE_CHECKING`` blocks too)."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[2]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

import _imports  # noqa: E402

FRAMEWORK = Path(__file__).resolve().parents[3] / "framework" / "nri_framework"
#: the groups through which the framework finds policies and their commands
GROUPS = ("nri_resource_policy.policies", "nri_resource_policy.commands")


def modules_under(root: Path) -> dict[str, Path]:
    """Module name -> file, for every module of the package directory ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def offending(root: Path, forbidden: set[str]) -> dict[str, set[str]]:
    """Modules of ``root`` importing a package of ``forbidden`` (or a module in one)."""
    out = {}
    for module, path in modules_under(root).items():
        bad = {i.module for i in _imports.imports_in(path, module)}
        bad = {b for b in bad if b.partition(".")[0] in forbidden}
        if bad:
            out[module] = bad
    return out


def policy_packages() -> set[str]:
    """``nri_balloons``, and every top-level package an installed policy or
    command lives in, but the framework's own (the pinner)."""
    found = {"nri_balloons"}
    for group in GROUPS:
        found.update(ep.module.partition(".")[0] for ep in entry_points(group=group))
    return found - {"nri_framework"}


def test_the_framework_imports_no_policy_package() -> None:
    forbidden = policy_packages()
    assert {"nri_balloons", "nri_policy_example"} <= forbidden  # both installed here
    assert offending(FRAMEWORK, forbidden) == {}


def test_every_kind_of_import_is_seen(tmp_path: Path) -> None:
    """The check itself: a policy import hidden in a function, a
    ``TYPE_CHECKING`` block, or a relative import that climbs out of the
    package is found."""
    root = tmp_path / "nri_framework"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "clean.py").write_text("import os\nfrom nri_framework import cpuset\nfrom . import x\n")
    (root / "local.py").write_text("def f():\n    from nri_balloons.validate_cli import main\n")
    (root / "typing_only.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import nri_policy_example\n"
    )
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "rel.py").write_text("from ...nri_balloons import plugin\n")
    found = offending(root, {"nri_balloons", "nri_policy_example"})
    assert found == {
        "nri_framework.local": {"nri_balloons", "nri_balloons.validate_cli"},
        "nri_framework.typing_only": {"nri_policy_example"},
        "nri_framework.sub.rel": {"nri_balloons", "nri_balloons.plugin"},
    }

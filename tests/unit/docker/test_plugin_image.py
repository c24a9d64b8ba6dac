"""What the plugin image ships (docker/Dockerfile.plugin + docker/plugin/pyproject.toml),
checked without building it: the plugin's import closure lies within the shipped
modules, the test harness and the helper's server side are not among them, and the
shipped files alone run the entry point (the images tier, tests/images, checks the
built image itself)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[2]
for _p in (_TESTS, _TESTS / "images"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _imports  # noqa: E402
from dockerfile import IgnoreRules, stage  # noqa: E402

ROOT = _TESTS.parent
DOCKERFILE = ROOT / "docker" / "Dockerfile.plugin"
IGNORE = ROOT / "docker" / "Dockerfile.plugin.dockerignore"
PROJECT = ROOT / "docker" / "plugin" / "pyproject.toml"
RUNS = ["nri_framework.cli", "nri_balloons.plugin", "nri_balloons.validate_cli"]
"""What the image runs: the console script, the policy it loads, its command."""
NOT_SHIPPED = (
    "nri_framework.simulate",
    "nri_balloons_demo",
    "nri_sst.handler",
    "nri_sst.server",
    "nri_sst.backends",
)
EXAMPLE_POLICY = ROOT / "examples" / "pct-managed" / "balloons-pct-managed.yaml"


def shipped(tmp: Path) -> set[str]:
    """The modules the image's wheel holds: the staged build context's ``.py``
    files in the packages the plugin project lists."""
    stage(DOCKERFILE, IgnoreRules(IGNORE.read_text()), ROOT, tmp)
    packages = set(tomllib.loads(PROJECT.read_text())["tool"]["setuptools"]["packages"])
    out = set()
    for path in tmp.rglob("*.py"):
        parts = path.relative_to(tmp).with_suffix("").parts
        package = ".".join(parts[:-1])
        if package in packages:
            out.add(package if parts[-1] == "__init__" else f"{package}.{parts[-1]}")
    return out


def test_plugin_import_closure_is_shipped(tmp_path: Path) -> None:
    """Every module of ours that the image's code imports unguarded is in the
    image; guarded imports (``except ModuleNotFoundError``) say what is missing."""
    ships = shipped(tmp_path)
    needed = _imports.closure(RUNS, optional=False)
    missing = {m: by for m, by in needed.items() if m not in ships}
    assert missing == {}, f"imported (module: by) but not in docker/plugin: {missing}"


def test_plugin_ships_no_test_harness_nor_helper_server(tmp_path: Path) -> None:
    ships = shipped(tmp_path)
    assert {"nri_framework.cli", "nri_balloons.plugin", "nri_sst.client"} <= ships
    assert sorted(m for m in ships if m.startswith(NOT_SHIPPED)) == []
    assert sorted(p.name for p in tmp_path.rglob("*") if "simulate" in p.name) == []


def run_shipped(tree: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``nri-resource-policy ARGV`` with our packages from ``tree`` only: ``-S``
    skips site's ``.pth`` files (the editable install of the whole repository);
    the dependencies come from this interpreter's site-packages."""
    code = (
        "import sys; sys.path[:0] = sys.argv[1:3]; del sys.argv[1:3]; "
        "from nri_framework.launch import main; sys.exit(main(sys.argv[1:]))"
    )
    site = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-S", "-c", code, str(tree), site, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_shipped_files_run_and_say_what_is_not_installed(tmp_path: Path) -> None:
    stage(DOCKERFILE, IgnoreRules(IGNORE.read_text()), ROOT, tmp_path)
    probe = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import sys; sys.path[:0] = sys.argv[1:3]; import nri_framework, nri_balloons; "
            "print(nri_framework.__file__); print(nri_balloons.__file__)",
            str(tmp_path),
            sysconfig.get_paths()["purelib"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert all(line.startswith(str(tmp_path)) for line in probe.stdout.splitlines())
    sim = run_shipped(tmp_path, "simulate", "--help")
    assert sim.returncode == 2, sim.stderr
    assert sim.stderr == (
        "nri-resource-policy simulate: the simulator (nri_framework.simulate) "
        "is not installed in this image\n"
    )
    helped = run_shipped(tmp_path, "--help")
    assert helped.returncode == 0 and "run" in helped.stdout, helped.stderr
    listed = run_shipped(tmp_path, "policies")
    assert listed.returncode == 0 and "balloons" in listed.stdout, listed.stderr
    valid = run_shipped(tmp_path, "validate", str(EXAMPLE_POLICY))
    assert valid.returncode == 0, valid.stdout + valid.stderr

"""The two images (no Docker daemon here: parse the Dockerfiles). The helper
image must hold only nri_sst, pyzmq and msgspec."""

from __future__ import annotations

import ast
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from .conftest import CHART, ROOT

DOCKER = ROOT / "docker"
HELPER_SRC = ROOT / "helpers" / "sst" / "nri_sst"
FORBIDDEN = ("kubernetes", "grpcio", "grpc", "protobuf", "google", "nri_framework", "nri_balloons")


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per instruction: comments dropped, ``\\``
    continuations joined; unknown instructions fail."""
    known = {
        "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
        "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
    }  # fmt: skip
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        assert word.upper() in known, f"{path.name}: unknown instruction {word!r}"
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path.name}: dangling continuation"
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            result.append([])
        assert result, f"{path.name}: an instruction before FROM"
        result[-1].append(ins)
    return result


def pip_installs(run: str) -> list[list[str]]:
    """The argument lists of every ``pip install`` in a RUN line."""
    found = []
    for part in re.split(r"&&|;", run):
        words = shlex.split(part)
        if words[:2] == ["pip", "install"]:
            found.append(words[2:])
    return found


@pytest.mark.parametrize("name", ["Dockerfile.plugin", "Dockerfile.sst-helper"])
def test_dockerfiles_parse_and_use_python_311_slim(name: str) -> None:
    for stage in stages(DOCKER / name):
        assert stage[0][1].split()[0] == "python:3.11-slim"
    final = stages(DOCKER / name)[-1]
    assert any(i == "ENTRYPOINT" for i, _ in final)


def test_helper_image_installs_only_nri_sst_pyzmq_msgspec() -> None:
    build, final = stages(DOCKER / "Dockerfile.sst-helper")
    copies = [args.split() for i, args in build if i == "COPY"]
    assert copies == [
        ["docker/sst-helper/pyproject.toml", "./pyproject.toml"],
        ["helpers/sst/nri_sst", "./nri_sst"],
    ]
    assert [args for i, args in build if i == "RUN"] == [
        "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ."
    ]
    assert [args for i, args in final if i == "COPY"] == ["--from=build /wheels /wheels"]
    installed: list[str] = []
    for i, args in final:
        if i == "RUN":
            for words in pip_installs(args):
                pkgs = [w for w in words if not w.startswith("-")]
                if any(p.startswith("/wheels/") for p in pkgs):
                    assert "--no-deps" in words
                installed += pkgs
    names = [re.split(r"[<>=!~ ]", p.rsplit("/", 1)[-1])[0] for p in installed]
    assert names == ["nri_sst_helper-*.whl", "pyzmq", "msgspec"]
    text = (DOCKER / "Dockerfile.sst-helper").read_text()
    for word in ("kubernetes", "grpcio", "protobuf", "requirements"):
        assert not re.search(rf"^(?!#).*\b{word}\b", text, re.M), word


def test_helper_project_is_minimal_and_in_step() -> None:
    helper = tomllib.loads((DOCKER / "sst-helper" / "pyproject.toml").read_text())
    main = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = helper["project"]["dependencies"]
    assert sorted(re.split(r"[<>=!~ ]", d)[0] for d in deps) == ["msgspec", "pyzmq"]
    assert set(deps) <= set(main["project"]["dependencies"])
    assert helper["project"]["scripts"] == {"nri-sst-helper": "nri_sst.cli:main"}
    assert (
        helper["project"]["scripts"]["nri-sst-helper"]
        == (main["project"]["scripts"]["nri-sst-helper"])
    )
    # Every package directory of nri_sst is listed (a new subpackage would be lost).
    packages = {
        ".".join(p.parent.relative_to(HELPER_SRC.parent).parts)
        for p in HELPER_SRC.rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert set(helper["tool"]["setuptools"]["packages"]) == packages


def test_nri_sst_imports_only_stdlib_pyzmq_msgspec() -> None:
    """What the helper image holds is enough to run it."""
    allowed = set(sys.stdlib_module_names) | {"zmq", "msgspec", "nri_sst"}
    bad = []
    for path in HELPER_SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in allowed or top in FORBIDDEN:
                    bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert bad == []


def test_plugin_image_installs_the_project_wheel() -> None:
    build, final = stages(DOCKER / "Dockerfile.plugin")
    copied = {args.split()[0] for i, args in build if i == "COPY"}
    assert {"framework", "policies", "helpers"} <= copied
    runs = [args for i, args in final if i == "RUN"]
    assert any("/wheels/nri_resource_policy-*.whl" in r for r in runs)


def test_chart_commands_exist_in_the_images() -> None:
    """The chart's commands are the console scripts the images install."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["name"].endswith("/nri-resource-policy")
    assert values["sstHelperImage"]["name"].endswith("/nri-sst-helper")
    daemonset = (CHART / "templates" / "daemonset.yaml").read_text()
    assert "- nri-resource-policy\n" in daemonset and "- nri-sst-helper\n" in daemonset
    main = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert {"nri-resource-policy", "nri-sst-helper"} <= set(main["project"]["scripts"])

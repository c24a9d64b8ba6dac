"""The Dockerfiles as text (the chart tier; no root). What the built images hold and
run (the helper's file list, its distributions, every nri_sst module importing, the
plugin's entrypoint, each image's config against its Dockerfile) is checked on the
images themselves by the images tier (tests/images, ``tox -e images``)."""

from __future__ import annotations

import re
import sys
import tomllib

import pytest

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "images"))
from dockerfile import stages

DOCKER = ROOT / "docker"


@pytest.mark.parametrize("name", ["Dockerfile.plugin", "Dockerfile.sst-helper"])
def test_dockerfiles_parse_and_use_python_311_slim(name: str) -> None:
    """Every stage is FROM python:3.11-slim (the tag the images tier assembles locally)."""
    for stage in stages(DOCKER / name):
        assert stage[0][1].split()[0] == "python:3.11-slim"
    final = stages(DOCKER / name)[-1]
    assert any(i == "ENTRYPOINT" for i, _ in final)


def test_helper_project_constraints_are_in_step() -> None:
    """The helper's minimal project asks for the same pyzmq/msgspec as the top level."""
    helper = tomllib.loads((DOCKER / "sst-helper" / "pyproject.toml").read_text())
    main = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = helper["project"]["dependencies"]
    assert sorted(re.split(r"[<>=!~ ]", d)[0] for d in deps) == ["msgspec", "pyzmq"]
    assert set(deps) <= set(main["project"]["dependencies"])
    assert (
        helper["project"]["scripts"]["nri-sst-helper"]
        == main["project"]["scripts"]["nri-sst-helper"]
    )


def test_plugin_project_is_in_step() -> None:
    """The plugin's minimal project (docker/plugin) asks for the top level's
    dependencies and installs the same console script and policies; its commands
    are the top level's minus the demos (the image ships no demo package)."""
    plugin = tomllib.loads((DOCKER / "plugin" / "pyproject.toml").read_text())
    main = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert plugin["project"]["version"] == main["project"]["version"]
    assert plugin["project"]["dependencies"] == main["project"]["dependencies"]
    name = "nri-resource-policy"
    assert plugin["project"]["scripts"] == {name: main["project"]["scripts"][name]}
    groups = plugin["project"]["entry-points"]
    main_groups = main["project"]["entry-points"]
    policies = "nri_resource_policy.policies"
    assert groups[policies] == main_groups[policies]
    commands = "nri_resource_policy.commands"
    wanted = {
        k: v
        for k, v in main_groups.get(commands, {}).items()
        if not v.startswith("nri_balloons_demo")
    }
    assert {k: v for k, v in groups[commands].items() if k in wanted} == wanted
    assert "nri_resource_policy.demos" not in groups

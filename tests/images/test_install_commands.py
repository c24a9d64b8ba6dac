"""The README's install path is the one the tiers run.

The README's "Install on a node" block builds each image of :data:`build.IMAGES`
(its Dockerfile, its ref: the chart's default image names and appVersion) with
the builder invocation the images tier uses, writes each as the docker-archive
the e2e tier imports, imports every archive with ``ctr -n k8s.io images
import`` (what the e2e tier does into each containerd), and installs the chart
with values the chart has. Text only: no root, no build.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from builder import CHART, IMAGES, ROOT

README = ROOT / "README.md"


def install_commands() -> list[list[str]]:
    """The shell words of each command in the README's "Install on a node" block."""
    text = README.read_text()
    section = text.split("## Install on a node", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "no bash block under 'Install on a node'"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [shlex.split(ln) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def test_readme_builds_every_image_with_the_tiers_builder() -> None:
    builds = [c for c in install_commands() if c[:2] == ["buildah", "bud"]]
    got = set()
    for cmd in builds:
        # the images tier builds with host networking (the RUN steps reach PyPI)
        assert "--network" in cmd and cmd[cmd.index("--network") + 1] == "host", cmd
        assert cmd[-1] == ".", f"the build context is the repository root: {cmd}"
        got.add((cmd[cmd.index("-f") + 1], cmd[cmd.index("-t") + 1]))
    want = {(str(i.dockerfile.relative_to(ROOT)), i.ref) for i in IMAGES}
    assert got == want


def test_readme_imports_every_built_image_into_containerd() -> None:
    cmds = install_commands()
    pushed = {}
    for cmd in cmds:
        if cmd[:2] == ["buildah", "push"]:
            kind, path, ref = cmd[3].split(":", 2)
            assert kind == "docker-archive", cmd  # the format the tier writes and imports
            assert ref == cmd[2], f"the archive must carry the ref: {cmd}"
            pushed[path] = ref
    assert set(pushed.values()) == {i.ref for i in IMAGES}
    imported = [c[-1] for c in cmds if c[-5:-1] == ["-n", "k8s.io", "images", "import"]]
    assert sorted(imported) == sorted(pushed), (imported, pushed)


def test_readme_installs_the_chart_with_its_own_values() -> None:
    (helm,) = [c for c in install_commands() if c[:2] == ["helm", "install"]]
    assert Path(ROOT / helm[3]).resolve() == CHART.resolve()
    assert helm[helm.index("--namespace") + 1] == "kube-system"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for i, word in enumerate(helm):
        if word == "--set":
            key = helm[i + 1].split("=", 1)[0]
            node = values
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"{key}: not a chart value"
                node = node[part]

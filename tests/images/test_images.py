"""The two images as built (tests/images/builder.py): what they hold, what they run,
and that their config is what the Dockerfiles say.

Everything is read from the docker-archives that ``ctr images import`` takes
(manifest, config, layer tars) or run in a container of them (buildah, chroot
isolation, no network).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

import _tier
import pytest
from builder import (
    BASE_ENV,
    BASE_REF,
    CHART,
    HELPER_REF,
    IMAGES,
    LABEL,
    PLUGIN_REF,
    ROOT,
    Image,
    archive_path,
    base_key,
    build_images,
    image_key,
    manifest,
    read_meta,
    run_in,
)
from dockerfile import IgnoreRules, env_pairs, exec_form, stages

HELPER_SRC = ROOT / "helpers" / "sst" / "nri_sst"
SITE = "usr/local/lib/python3.11/dist-packages/"
# What the helper image adds to the base: nri_sst, pyzmq (zmq + its bundled libzmq),
# msgspec, their metadata and the console script. buildah's chroot isolation leaves
# the (empty) mount points of /etc/hostname, /etc/hosts and /etc/resolv.conf.
HELPER_ADDS = re.compile(
    rf"^({SITE}(nri_sst|zmq|pyzmq\.libs|msgspec)/"
    rf"|{SITE}(nri_sst_helper|pyzmq|msgspec)-[^/]+\.dist-info/"
    r"|usr/local/bin/nri-sst-helper$)"
)
RUNTIME_STUBS = {"etc/hostname", "etc/hosts", "etc/resolv.conf"}
NOT_IN_HELPER = (
    "kubernetes", "grpc", "google.protobuf", "yaml", "aiohttp", "prometheus_client",
    "pluggy", "nri_framework", "nri_balloons",
)  # fmt: skip
NOT_IN_PLUGIN = (
    "nri_framework.simulate", "nri_balloons_demo", "nri_sst.handler", "nri_sst.server",
    "nri_sst.backends", "nri_sst.cli",
)  # fmt: skip
NOT_IN_PLUGIN_ = tuple(f"{m}." for m in NOT_IN_PLUGIN)
PLUGIN_SST = ["nri_sst", "nri_sst.client", "nri_sst.messages", "nri_sst.retry", "nri_sst.zmtp"]
"""The nri_sst modules the plugin image holds: the client's (docker/Dockerfile.plugin)."""
EXAMPLE_POLICY = ROOT / "examples" / "pct-managed" / "balloons-pct-managed.yaml"
DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({d.metadata['Name'].lower().replace('_', '-') "
    "for d in m.distributions()})))"
)


class Archive:
    """A docker-archive: its manifest, image config and layer file lists."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with tarfile.open(path) as tar:
            self.manifest = manifest(tar)
            cfg = tar.extractfile(self.manifest["Config"])
            assert cfg is not None
            self.image: dict[str, Any] = json.load(cfg)
            self.layer_files: list[dict[str, tarfile.TarInfo]] = []
            for name in self.manifest["Layers"]:
                with tarfile.open(fileobj=tar.extractfile(name)) as layer:
                    self.layer_files.append({m.name.removeprefix("./"): m for m in layer})

    @property
    def config(self) -> dict[str, Any]:
        return self.image["config"]  # type: ignore[no-any-return]

    @property
    def env(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.config.get("Env") or [])


def _image(name: str) -> Image:
    return next(i for i in IMAGES if i.name == name)


@pytest.fixture(scope="session")
def base(images: dict[str, Path], images_cache: Path) -> Archive:
    return Archive(archive_path(images_cache, "base", base_key()))


@pytest.fixture(scope="session")
def root_builder(images: dict[str, Path]) -> None:
    """Running a container of an image needs root (buildah, chroot isolation)."""
    if os.geteuid() != 0:
        _tier.unavailable("images", f"running the images needs root (uid {os.geteuid()})",
                          "NRI_IMAGES_REQUIRED")  # fmt: skip


def test_build_returns_both_archives_under_their_refs(images: dict[str, Path]) -> None:
    assert set(images) == {"plugin", "sst-helper"}
    assert Archive(images["plugin"]).manifest["RepoTags"] == [PLUGIN_REF]
    assert Archive(images["sst-helper"]).manifest["RepoTags"] == [HELPER_REF]
    chart = (CHART / "Chart.yaml").read_text()
    version = re.search(r'^appVersion:\s*"?([^"\s]+)', chart, re.M)
    assert version and PLUGIN_REF.endswith(f":{version.group(1)}")
    values = (CHART / "values.yaml").read_text()
    for ref in (PLUGIN_REF, HELPER_REF):
        assert f"name: {ref.rsplit(':', 1)[0]}\n" in values


@pytest.mark.parametrize("name", ["plugin", "sst-helper"])
def test_image_config_is_what_the_dockerfile_says(
    name: str, images: dict[str, Path], base: Archive
) -> None:
    image = _image(name)
    final = stages(image.dockerfile)[-1]
    want_env = dict(BASE_ENV)
    for ins, args in final:
        if ins == "ENV":
            want_env.update(env_pairs(args))
    [user] = [args for ins, args in final if ins == "USER"]
    [entrypoint] = [exec_form(args) for ins, args in final if ins == "ENTRYPOINT"]
    [cmd] = [exec_form(args) for ins, args in final if ins == "CMD"]
    got = Archive(images[name])
    assert got.config["Entrypoint"] == entrypoint
    assert got.config["Cmd"] == cmd
    assert got.config["User"] == user
    assert got.env == want_env
    assert got.config["Labels"][LABEL] == image_key(image)
    # Built FROM the local python:3.11-slim: its layers, then the image's own.
    assert got.manifest["Layers"][: len(base.manifest["Layers"])] == base.manifest["Layers"]
    assert base.manifest["RepoTags"] == [BASE_REF]


def test_the_chart_runs_the_images_entrypoints(images: dict[str, Path]) -> None:
    daemonset = (CHART / "templates" / "daemonset.yaml").read_text()
    for name in ("plugin", "sst-helper"):
        [command] = Archive(images[name]).config["Entrypoint"]
        assert f"- {command}\n" in daemonset


def test_helper_image_adds_only_nri_sst_pyzmq_msgspec(
    images: dict[str, Path], base: Archive
) -> None:
    helper = Archive(images["sst-helper"])
    added = [
        (path, info)
        for layer in helper.layer_files[len(base.layer_files) :]
        for path, info in layer.items()
        if not info.isdir()
    ]
    stray = [p for p, info in added if not HELPER_ADDS.match(p)]
    assert sorted(stray) == sorted(p for p, info in added if p in RUNTIME_STUBS)
    assert all(info.size == 0 for p, info in added if p in RUNTIME_STUBS)
    # nri_sst in the image is exactly the package's sources (no module lost).
    image_py = {
        p.removeprefix(SITE)
        for p, _ in added
        if p.startswith(SITE + "nri_sst/") and "/__pycache__/" not in p
    }
    source_py = {
        p.relative_to(HELPER_SRC.parent).as_posix()
        for p in HELPER_SRC.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert image_py == source_py
    # The base holds the interpreter and pip only (no site package of ours).
    assert not any(p.startswith(SITE) for layer in base.layer_files for p in layer)
    assert "usr/bin/python3.11" in base.layer_files[0]


def test_helper_image_distributions_are_nri_sst_pyzmq_msgspec_and_pip(
    images: dict[str, Path], images_cache: Path, root_builder: None
) -> None:
    """Listed by the image's own interpreter: the base's pip/setuptools/wheel (as in
    python:3.11-slim), nri-sst-helper, pyzmq, msgspec; nothing else importable."""
    archive = f"docker-archive:{images['sst-helper']}"
    dists = json.loads(run_in(images_cache, archive, ["python", "-c", DISTRIBUTIONS]))
    assert dists == sorted({"pip", "setuptools", "wheel", "nri-sst-helper", "pyzmq", "msgspec"})
    probe = (
        "import importlib.util as u, sys; "
        f"print([m for m in {list(NOT_IN_HELPER)!r} if u.find_spec(m.split('.')[0])])"
    )
    assert run_in(images_cache, archive, ["python", "-c", probe]).strip() == "[]"
    # Every nri_sst module imports with what the image holds, and the helper runs.
    modules = sorted(
        ".".join(p.relative_to(HELPER_SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in HELPER_SRC.rglob("*.py")
    )
    code = f"import importlib; [importlib.import_module(m) for m in {modules!r}]; print('ok')"
    assert run_in(images_cache, archive, ["python", "-c", code]).strip() == "ok"
    out = run_in(images_cache, archive, ["nri-sst-helper", "--help"])
    assert "serve" in out


def test_plugin_image_runs_its_entrypoint(
    images: dict[str, Path], images_cache: Path, root_builder: None
) -> None:
    plugin = Archive(images["plugin"])
    archive = f"docker-archive:{images['plugin']}"
    [entry] = plugin.config["Entrypoint"]
    out = run_in(images_cache, archive, [entry, "--help"])
    assert "run" in out
    code = "import nri_balloons, nri_sst.client, kubernetes, grpc; print('ok')"
    assert run_in(images_cache, PLUGIN_REF, ["python", "-c", code]).strip() == "ok"
    listed = run_in(images_cache, archive, [entry, "policies"])
    assert "balloons " in listed and "pinner " in listed
    # validate, on the spec's example policy (the image holds no copy: stdin)
    policy = EXAMPLE_POLICY.read_text()
    script = f'printf %s "$1" | {entry} validate -; echo "rc=$?"'
    valid = run_in(images_cache, archive, ["sh", "-c", script, "sh", policy])
    assert valid.rstrip().endswith("rc=0"), valid
    # the simulator is not there, and the command says so
    script = f"{entry} simulate --help 2>&1; echo rc=$?"
    sim = run_in(images_cache, archive, ["sh", "-c", script])
    assert sim == (
        "nri-resource-policy simulate: the simulator (nri_framework.simulate) "
        "is not installed in this image\nrc=2\n"
    )


def test_plugin_image_holds_no_simulator_demo_or_helper_server(
    images: dict[str, Path], base: Archive
) -> None:
    """The plugin's layers: nri_framework without simulate, nri_balloons, the
    nri_sst client's modules; no demo package, no helper server side."""
    plugin = Archive(images["plugin"])
    ours = {
        p.removeprefix(SITE)
        for layer in plugin.layer_files[len(base.layer_files) :]
        for p, info in layer.items()
        if p.startswith(SITE + "nri_") and p.endswith(".py") and not info.isdir()
    }
    modules = {".".join(Path(p).with_suffix("").parts).removesuffix(".__init__") for p in ours}
    assert {"nri_framework.cli", "nri_balloons.plugin", "nri_balloons.validate_cli"} <= modules
    assert sorted(m for m in modules if m.startswith("nri_sst")) == sorted(PLUGIN_SST)
    assert sorted(m for m in modules if m in NOT_IN_PLUGIN or m.startswith(NOT_IN_PLUGIN_)) == []
    print(f"\n[images] plugin: {len(modules)} modules of ours", file=sys.stderr)


def test_base_is_unmanaged_for_pip(
    images: dict[str, Path], images_cache: Path, root_builder: None
) -> None:
    """No PEP 668 marker (as python:3.11-slim): pip installs into the interpreter."""
    code = (
        "import sysconfig, os; "
        "print(os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"
    )
    assert run_in(images_cache, BASE_REF, ["python", "-c", code]).strip() == "False"


def test_image_sizes(images: dict[str, Path], images_cache: Path) -> None:
    """Printed (compressed archive = gzip of the docker-archive; unpacked = layer bytes)."""
    base = read_meta(archive_path(images_cache, "base", base_key()))
    rows = {"python:3.11-slim (base)": base}
    rows |= {name: read_meta(path) for name, path in images.items()}
    for label, meta in rows.items():
        print(
            f"\n[images] {label}: archive {int(meta['archive']) / 1e6:.1f} MB, "  # type: ignore[call-overload]
            f"gzip {int(meta['gzip']) / 1e6:.1f} MB, unpacked {int(meta['unpacked']) / 1e6:.1f} MB",  # type: ignore[call-overload]
            file=sys.stderr,
        )
    for name, path in images.items():
        assert read_meta(path)["archive"] == path.stat().st_size, name
    # The helper adds its three packages to the base, not a Kubernetes client.
    helper_adds = int(rows["sst-helper"]["unpacked"]) - int(base["unpacked"])  # type: ignore[call-overload]
    assert 0 < helper_adds < 20_000_000


def test_warm_build_builds_nothing(images: dict[str, Path], images_cache: Path) -> None:
    said: list[str] = []
    before = {name: p.stat().st_mtime_ns for name, p in images.items()}
    again = build_images(images_cache, say=said.append)
    assert again == images
    assert {name: p.stat().st_mtime_ns for name, p in again.items()} == before
    # one line, and it says the cache made the build instant (issue #15: no silent step)
    assert said == [
        f"cached: {', '.join(str(p) for p in images.values())} (nothing to fetch or build)"
    ], said


def _context(tmp: Path) -> Path:
    """A copy of what the Dockerfiles read (and a file they do not)."""
    ctx = tmp / "ctx"
    for rel in ("docker", "framework", "policies", "helpers"):
        shutil.copytree(ROOT / rel, ctx / rel, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / rel, ctx / rel)
    (ctx / "tests").mkdir()
    (ctx / "tests" / "t.py").write_text("x = 1\n")
    return ctx


def test_cache_key_follows_what_goes_in(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    plugin, helper = _image("plugin"), _image("sst-helper")
    keys = {i.name: image_key(i, ctx) for i in (plugin, helper)}
    assert keys == {i.name: image_key(i) for i in (plugin, helper)}
    # Ignored files and files no COPY reads change nothing.
    pyc = ctx / "helpers/sst/nri_sst/__pycache__/cli.cpython-311.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"\0")
    (ctx / "tests" / "t.py").write_text("x = 2\n")
    (ctx / "framework" / "nri_framework" / "x.pyc").write_bytes(b"\0")
    assert {i.name: image_key(i, ctx) for i in (plugin, helper)} == keys
    # A change to the helper's server side rebuilds the helper only (the plugin
    # holds the nri_sst client's modules, not the helper's cli/handler/backends).
    (ctx / "helpers/sst/nri_sst/handler.py").write_text("# changed\n", "utf-8")
    server = {i.name: image_key(i, ctx) for i in (plugin, helper)}
    assert server["plugin"] == keys["plugin"] and server["sst-helper"] != keys["sst-helper"]
    # A client change rebuilds both.
    (ctx / "helpers/sst/nri_sst/client.py").write_text("# changed\n", "utf-8")
    changed = {i.name: image_key(i, ctx) for i in (plugin, helper)}
    assert changed["plugin"] != keys["plugin"] and changed["sst-helper"] != server["sst-helper"]
    # The simulator is not sent to the plugin's build.
    (ctx / "framework/nri_framework/simulate/runtime.py").write_text("# changed\n", "utf-8")
    assert image_key(plugin, ctx) == changed["plugin"]
    # A framework change rebuilds the plugin only (the helper image does not hold it).
    (ctx / "framework/nri_framework/cli.py").write_text("# changed\n", "utf-8")
    again = {i.name: image_key(i, ctx) for i in (plugin, helper)}
    assert again["plugin"] != changed["plugin"] and again["sst-helper"] == changed["sst-helper"]
    # The Dockerfile itself is part of the key.
    df = ctx / "docker/Dockerfile.sst-helper"
    df.write_text(df.read_text() + "\n# comment\n")
    assert image_key(helper, ctx) != again["sst-helper"]


def test_dockerignore_rules_match_what_the_builder_sends() -> None:
    helper = IgnoreRules(_image("sst-helper").ignorefile.read_text())
    assert not helper.excluded("docker/sst-helper/pyproject.toml")
    assert not helper.excluded("helpers/sst/nri_sst/backends/sim.py")
    assert helper.excluded("helpers/sst/nri_sst/__pycache__/cli.cpython-311.pyc")
    assert helper.excluded("framework/nri_framework/cli.py")
    assert helper.excluded("pyproject.toml")
    plugin = IgnoreRules(_image("plugin").ignorefile.read_text())
    assert not plugin.excluded("framework/nri_framework/cli.py")
    assert not plugin.excluded("docker/plugin/pyproject.toml")
    assert not plugin.excluded("helpers/sst/nri_sst/client.py")
    assert plugin.excluded("framework/nri_framework/simulate/runtime.py")
    assert plugin.excluded("helpers/sst/nri_sst/handler.py")
    assert plugin.excluded("helpers/sst/nri_sst/backends/sim.py")
    assert plugin.excluded("policies/balloons/nri_balloons_demo/harness.py")
    assert plugin.excluded("tests/unit/x.py")
    assert plugin.excluded("framework/nri_framework/__pycache__/a.pyc")
    assert plugin.excluded("x.egg-info/PKG-INFO")

"""The k8s tier's two binaries, built once from Debian **sid** and cached.

``k8s.io/apiextensions-apiserver`` (v1.36 code) is built from sid's Go source packages
in GOPATH mode, ``etcd`` comes from sid's ``etcd-server``.

``build()`` caches the two binaries under ``$NRI_K8S_CACHE/bin`` (default
``~/.cache/nri-resource-policy/k8s/bin``) with a stamp (``build.json``); a second
call costs nothing. The .debs, the unpacked tree and the Go cache are removed
after the build.

Its neighbours (the stack's other modules): see :mod:`stack`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# tests/ is on sys.path: stack.py and the conftest.py files put it there
from _debian import cache_lock, run
from _gobuild import deb_versions, fetch, go_build, go_version, unpack
from _progress import Progress, write_line

#: bump when the build recipe changes: a cached build of another recipe is redone
RECIPE = 1
#: the packages whose dependency closure (``golang-*``, ``etcd-server``) is fetched
ROOT_PACKAGES = ("golang-k8s-apiextensions-apiserver-dev", "golang-go", "etcd-server")
GO_PACKAGE = "k8s.io/apiextensions-apiserver"
APISERVER = "apiextensions-apiserver"
ETCD = "etcd"
STAMP = "build.json"


class StackError(RuntimeError):
    """The binaries cannot be built or the stack cannot be started."""


def _log(msg: str) -> None:
    write_line(f"[k8s-stack] {msg}")  # live, also in pytest's session fixtures


def cache_dir() -> Path:
    """``$NRI_K8S_CACHE`` or ``~/.cache/nri-resource-policy/k8s``."""
    env = os.environ.get("NRI_K8S_CACHE")
    return Path(env or Path.home() / ".cache" / "nri-resource-policy" / "k8s").expanduser()


def binaries(cache: Path | None = None) -> dict[str, Path]:
    """Where the built binaries are (or will be): ``{"apiextensions-apiserver":, "etcd":}``."""
    bindir = (cache or cache_dir()) / "bin"
    return {APISERVER: bindir / APISERVER, ETCD: bindir / ETCD}


def cached_build(cache: Path | None = None) -> dict[str, Any] | None:
    """The stamp of a usable cached build of this recipe, else None."""
    cache = cache or cache_dir()
    try:
        stamp = json.loads((cache / "bin" / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("recipe") != RECIPE:
        return None
    if not all(os.access(p, os.X_OK) for p in binaries(cache).values()):
        return None
    return stamp


# --------------------------------------------------------------------------- build


def _keep(name: str) -> bool:
    """``golang-*`` and ``etcd-server`` of the closure of ROOT_PACKAGES."""
    return name.startswith("golang-") or name == "etcd-server"


def _go_build(root: Path, work: Path, out: Path, say: Callable[[str], None]) -> str:
    """Build GO_PACKAGE in GOPATH mode with the unpacked toolchain; returns ``go version``."""
    version = go_version(root, work, StackError)
    say(f"go build {GO_PACKAGE} ({version}, GOPATH mode): a few minutes on 2 cores")
    go_build(root, work, GO_PACKAGE, out, cwd=work, say=say, error=StackError)
    return version


def build(
    cache: Path | str | None = None,
    *,
    force: bool = False,
    keep_build_dir: bool = False,
    say: Callable[[str], None] = _log,
) -> dict[str, Path]:
    """Fetch, unpack and build; returns :func:`binaries`. Cached: a second call costs nothing.

    Steps (everything under ``cache/build``, removed afterwards unless
    ``keep_build_dir``): a private APT config for sid (the system's ``/etc/apt``
    is not touched), ``apt-get update``, the ``golang-*`` + ``etcd-server``
    dependency closure of ROOT_PACKAGES, ``apt-get download``, ``dpkg -x``,
    ``go build`` of ``k8s.io/apiextensions-apiserver`` in GOPATH mode, a copy of
    ``etcd``; both land in ``cache/bin`` with the stamp ``build.json``.
    Raises :class:`StackError` on failure (a sid transition, no network...).
    """
    cache = Path(cache).expanduser() if cache else cache_dir()
    cache = cache.resolve()
    bins = binaries(cache)
    if not force and (stamp := cached_build(cache)):
        built = stamp.get("built", "?")
        Progress("", write=say).cached(f"build ({built}): {bins[APISERVER].parent}")
        return bins
    for tool in ("apt-get", "apt-cache", "dpkg"):
        if shutil.which(tool) is None:
            raise StackError(f"{tool} not found (a Debian machine is needed to build)")
    with cache_lock(cache):
        if not force and cached_build(cache):  # built by another process meanwhile
            return bins
        work = cache / "build"
        shutil.rmtree(work, ignore_errors=True)
        t0 = time.monotonic()
        try:
            debs = fetch(
                work,
                "sid",
                ROOT_PACKAGES,
                keep=_keep,
                debdir=work / "debs",
                size_hint="~310 MB",
                say=say,
                error=StackError,
            )
            root = work / "root"
            unpack(debs, root, say=say, error=StackError)
            bindir = bins[APISERVER].parent
            bindir.mkdir(parents=True, exist_ok=True)
            (bindir / STAMP).unlink(missing_ok=True)
            tmp_api = work / APISERVER
            go_version = _go_build(root, work, tmp_api, say)
            etcd_src = root / "usr" / "bin" / "etcd"
            if not etcd_src.is_file():
                raise StackError("etcd-server did not unpack usr/bin/etcd")
            tmp_etcd = work / ETCD
            shutil.copy2(etcd_src, tmp_etcd)
            etcd_version = run([str(tmp_etcd), "--version"], error=StackError).stdout
            run([str(tmp_api), "--help"], error=StackError)
            os.replace(tmp_api, bins[APISERVER])
            os.replace(tmp_etcd, bins[ETCD])
            versions = deb_versions(debs)
            stamp = {
                "recipe": RECIPE,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": round(time.monotonic() - t0, 1),
                "go": go_version,
                "etcd": etcd_version.splitlines()[0] if etcd_version else "",
                "packages": {
                    n: versions.get(n, "?")
                    for n in (*ROOT_PACKAGES, "golang-k8s-apiserver-dev", "golang-k8s-api-dev")
                },
                "package_count": len(debs),
            }
            (bindir / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        finally:
            if not keep_build_dir:
                shutil.rmtree(work, ignore_errors=True)
    say(f"built in {time.monotonic() - t0:.0f}s: {bins[APISERVER]}, {bins[ETCD]}")
    return bins

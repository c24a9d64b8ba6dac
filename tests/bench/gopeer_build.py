"""The benchmark's two Go programs, built once from Debian **trixie** and cached.

``tests/bench/go/peer`` (the NRI runtime peer, on NRI's ``pkg/adaptation``)
and ``tests/bench/go/floor`` (the trivial plugin, on NRI's ``pkg/stub``) are
built offline in GOPATH mode (:mod:`_gobuild`) from trixie's
``golang-github-containerd-nri-dev`` (NRI 0.6.1, the version of the issue's
figures; sid has 0.8.0), its ``golang-*`` dependency closure and trixie's
``golang-go`` (Go 1.24).

Cache (``$NRI_BENCH_GO_CACHE``, default ``~/.cache/nri-resource-policy/bench-go``):

* ``debs-trixie/``: the downloaded ``.deb`` files (``fetched.json`` marks a
  complete download), fetched once;
* ``bin-<key>/{peer,floor,build.json}``: the binaries, ``key`` a hash of the
  recipe, every package version and our Go sources: a changed source or
  package builds anew (from the cached debs, no network), an unchanged one
  costs nothing.

    python tests/bench/gopeer_build.py [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from _debian import cache_lock  # noqa: E402
from _gobuild import deb_versions, fetch, go_build, go_version, unpack  # noqa: E402
from _progress import Progress, write_line  # noqa: E402

#: bump when the build recipe changes
RECIPE = 1
SUITE = "trixie"
ROOT_PACKAGES = ("golang-github-containerd-nri-dev", "golang-go")
#: the closure holds both protobuf 1.3 and 1.5 (alternatives): they ship the
#: same import path, and unpacked together the package does not compile
EXCLUDE = frozenset({"golang-github-golang-protobuf-1-3-dev"})
SOURCES = Path(__file__).resolve().parent / "go"
PROGRAMS = ("peer", "floor")
STAMP = "build.json"


class GoBuildError(RuntimeError):
    """The Go programs cannot be fetched or built."""


def _log(msg: str) -> None:
    write_line(f"[bench-go] {msg}")


def cache_dir() -> Path:
    """``$NRI_BENCH_GO_CACHE`` or ``~/.cache/nri-resource-policy/bench-go``."""
    env = os.environ.get("NRI_BENCH_GO_CACHE")
    return Path(env or Path.home() / ".cache" / "nri-resource-policy" / "bench-go").expanduser()


def _keep(name: str) -> bool:
    return name.startswith("golang-") and name not in EXCLUDE


def build_key(versions: dict[str, str], sources: Path = SOURCES) -> str:
    """The hash of the recipe, the package versions and every file under ``sources``."""
    h = hashlib.sha256(f"{RECIPE}\n{SUITE}\n".encode())
    h.update(json.dumps(sorted(versions.items())).encode())
    for path in sorted(p for p in sources.rglob("*") if p.is_file()):
        h.update(f"\n{path.relative_to(sources)}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _debs(cache: Path, say: Callable[[str], None]) -> list[Path]:
    """The cached .deb files, fetched first when the cache has none."""
    debdir = cache / f"debs-{SUITE}"
    marker = debdir / "fetched.json"
    if marker.is_file():
        return sorted(debdir.glob("*.deb"))
    for tool in ("apt-get", "apt-cache", "dpkg"):
        if shutil.which(tool) is None:
            raise GoBuildError(f"{tool} not found (a Debian machine is needed to build)")
    work = cache / "fetch"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(debdir, ignore_errors=True)
    try:
        debs = fetch(
            work,
            SUITE,
            ROOT_PACKAGES,
            keep=_keep,
            debdir=work / "debs",
            size_hint="~80 MB",
            say=say,
            error=GoBuildError,
        )
        (work / "debs" / "fetched.json").write_text(json.dumps(deb_versions(debs), indent=1))
        os.replace(work / "debs", debdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return sorted(debdir.glob("*.deb"))


def build(
    cache: Path | None = None, *, force: bool = False, say: Callable[[str], None] = _log
) -> dict[str, Path]:
    """``{"peer": path, "floor": path}``, built (or found cached). Raises :class:`GoBuildError`."""
    cache = (cache or cache_dir()).resolve()
    with cache_lock(cache):
        debs = _debs(cache, say)
        versions = deb_versions(debs)
        bindir = cache / f"bin-{build_key(versions)}"
        bins = {name: bindir / name for name in PROGRAMS}
        if not force and (bindir / STAMP).is_file():
            Progress("", write=say).cached(f"Go peer and floor: {bindir}")
            return bins
        t0 = time.monotonic()
        work = cache / "build"
        shutil.rmtree(work, ignore_errors=True)
        try:
            root = work / "root"
            unpack(debs, root, say=say, error=GoBuildError)
            version = go_version(root, work, GoBuildError)
            out = work / "bin"
            out.mkdir()
            for name in PROGRAMS:
                src = work / "src" / name
                shutil.copytree(SOURCES / name, src)
                go_build(root, work, ".", out / name, cwd=src, say=say, error=GoBuildError)
            stamp = {
                "recipe": RECIPE,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": round(time.monotonic() - t0, 1),
                "go": version,
                "packages": {n: versions.get(n, "?") for n in ROOT_PACKAGES},
                "package_count": len(debs),
            }
            (out / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
            shutil.rmtree(bindir, ignore_errors=True)
            os.replace(out, bindir)
            for old in cache.glob("bin-*"):  # builds of other sources or packages
                if old != bindir:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    say(f"built in {time.monotonic() - t0:.0f}s: {bindir}")
    return bins


def stamp(bins: dict[str, Path]) -> dict[str, object]:
    """The build's stamp (versions of Go and NRI)."""
    doc: dict[str, object] = json.loads((bins["peer"].parent / STAMP).read_text())
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    bins = build(force=args.force)
    print(json.dumps({k: str(v) for k, v in bins.items()} | {"stamp": stamp(bins)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Go programs built offline from Debian's Go source packages.

One home for what the tiers that build Go share (k8s: the API server from sid,
the benchmark: the NRI runtime peer and the floor plugin from trixie):

* :func:`fetch`: a private APT configuration for a suite (:mod:`_debian`),
  ``apt-get update``, the ``golang-*`` dependency closure of some root
  packages, ``apt-get download`` and ``dpkg -x`` into one root, with progress;
* :func:`closure`: that dependency closure, by name;
* :func:`deb_versions`: ``{package: version}`` of downloaded ``.deb`` files;
* :func:`go_env` / :func:`go_build`: the unpacked toolchain
  (``usr/lib/go-*/bin/go``) in GOPATH mode over the unpacked
  ``usr/share/gocode`` tree: ``GO111MODULE=off``, ``GOPROXY=off``,
  ``GOTOOLCHAIN=local``, no cgo; nothing is fetched by Go itself.

Stdlib only; the modules that use it put ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from _debian import CommandError, apt_config, apt_env, debian_source, dpkg_extract, run
from _progress import Progress

Say = Callable[[str], None]


def closure(
    env: dict[str, str],
    roots: Iterable[str],
    keep: Callable[[str], bool],
    error: type[Exception] = CommandError,
) -> list[str]:
    """The packages in the dependency closure of ``roots`` that ``keep`` accepts."""
    out = run(
        [
            "apt-cache",
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            "--no-pre-depends",
            *roots,
        ],
        env=env,
        error=error,
    ).stdout
    names = {ln.strip() for ln in out.splitlines() if ln and not ln[0].isspace()}
    return sorted(n for n in names if keep(n))


def deb_versions(debs: Iterable[Path]) -> dict[str, str]:
    """``{package: version}`` from ``name_version_arch.deb`` file names."""
    out = {}
    for deb in debs:
        name, version, _arch = deb.stem.split("_")
        out[name] = urllib.parse.unquote(version)
    return out


def fetch(
    work: Path,
    suite: str,
    roots: Collection[str],
    *,
    keep: Callable[[str], bool],
    debdir: Path,
    size_hint: str,
    say: Say,
    error: type[Exception] = CommandError,
) -> list[Path]:
    """Download the closure of ``roots`` from ``suite`` into ``debdir``; the ``.deb`` files.

    The APT configuration and lists live under ``work/apt`` (the system's
    ``/etc/apt`` is not touched). Raises ``error`` when a root is missing
    from the suite or a command fails."""
    env = apt_env(apt_config(work / "apt", debian_source(suite), own_status=True))
    progress = Progress("", write=say)
    with progress.step(f"apt-get update (private {suite} sources)", watch=work / "apt") as st:
        run(["apt-get", "update", "-q"], env=env, timeout=900, error=error, progress=st)
    names = closure(env, roots, keep, error)
    missing = sorted(set(roots) - set(names))
    if missing:
        raise error(f"{suite} has no {missing}")
    debdir.mkdir(parents=True, exist_ok=True)
    what = f"apt-get download: {len(names)} packages ({size_hint})"
    with progress.step(what, watch=debdir) as st:
        run(
            ["apt-get", "download", "-q", *names],
            cwd=debdir,
            env=env,
            timeout=1800,
            error=error,
            progress=st,
        )
    return sorted(debdir.glob("*.deb"))


def unpack(
    debs: list[Path], root: Path, *, say: Say, error: type[Exception] = CommandError
) -> None:
    """``dpkg -x`` of ``debs`` into ``root``, with progress."""
    size = sum(d.stat().st_size for d in debs) / 1e6
    try:
        with Progress("", write=say).step(
            f"dpkg -x {len(debs)} packages ({size:.0f} MB)", watch=root
        ) as st:
            dpkg_extract(debs, root, progress=st)
    except CommandError as e:
        raise error(str(e)) from None


def go_bin(root: Path, error: type[Exception] = CommandError) -> Path:
    """The newest unpacked ``usr/lib/go-*/bin/go`` under ``root``."""

    def key(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", p.parent.parent.name))

    gos = sorted(root.glob("usr/lib/go-*/bin/go"), key=key)
    if not gos:
        raise error(f"no Go toolchain (usr/lib/go-*/bin/go) unpacked under {root}")
    return gos[-1]


def go_env(root: Path, work: Path, error: type[Exception] = CommandError) -> dict[str, str]:
    """The environment of an offline GOPATH-mode build with the toolchain under ``root``."""
    go = go_bin(root, error)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    env.update(
        PATH=f"{go.parent}:{env.get('PATH', '/usr/bin:/bin')}",
        GO111MODULE="off",
        GOPATH=str(root / "usr" / "share" / "gocode"),
        GOCACHE=str(work / "gocache"),
        GOENV="off",
        GOPROXY="off",
        GOTOOLCHAIN="local",
        GOFLAGS="",
        CGO_ENABLED="0",
    )
    return env


def go_version(root: Path, work: Path, error: type[Exception] = CommandError) -> str:
    """``go version`` of the toolchain under ``root``."""
    go = go_bin(root, error)
    return run([str(go), "version"], env=go_env(root, work, error), error=error).stdout.strip()


def go_build(
    root: Path,
    work: Path,
    target: str,
    out: Path,
    *,
    cwd: Path,
    say: Say,
    error: type[Exception] = CommandError,
    timeout: float = 3600,
) -> None:
    """``go build -o out target`` (an import path, or ``.`` with ``cwd`` the
    package's directory) in GOPATH mode; the log lands in ``work/go-build.log``."""
    go = go_bin(root, error)
    cmd = [str(go), "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out), target]
    with Progress("", write=say).step(f"go build {out.name}", watch=work / "gocache") as step:
        proc = run(
            cmd,
            env=go_env(root, work, error),
            cwd=cwd,
            timeout=timeout,
            check=False,
            progress=step,
        )
        with open(work / "go-build.log", "a") as log:
            log.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise error(f"go build {target} failed ({proc.returncode}):\n{tail}")

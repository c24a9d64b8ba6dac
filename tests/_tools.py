"""The operator's command-line tools for the tests: Debian's ``kubectl`` and ``jq``.

The spec's operator commands (``kubectl get ... -o json | jq -r '...'``) run
verbatim in the k8s tier, with real tools fetched from Debian the way the tiers
fetch their packages (a private APT configuration, see :mod:`_debian`), never
installed into the system and never taken from ``PATH`` (a CI machine has
neither):

* ``kubectl`` is sid's ``kubectl`` (the binary that ``kubernetes-client`` 1.36
  depends on): a Go binary needing only ``libc6 >= 2.34``, so it runs on
  bookworm's glibc 2.36 as unpacked.
* ``jq`` must be >= 1.7: the spec's programs use ``.items.[]``, a syntax error for
  bookworm's jq 1.6. Trixie's jq 1.7.1 (with ``libjq1`` and ``libonig5``) is
  built against glibc 2.38/2.39 and does not load with bookworm's libc, and
  ``LD_LIBRARY_PATH`` alone cannot help (the system's 2.36 loader would be paired
  with a newer libc). So trixie's ``libc6`` is unpacked too and ``jq`` is started
  through trixie's own loader: ``ld-linux-x86-64.so.2 --library-path LIBS jq``,
  from a two-line ``/bin/sh`` wrapper named ``jq``. Trixie (stable, 1.7.1) is
  preferred over sid's 1.8.x: the version the spec's syntax needs, from a suite
  without transitions.

:func:`fetch` returns a :class:`Tools` whose :attr:`Tools.bin` directory holds
``kubectl`` and ``jq``: put it first on ``PATH`` (:meth:`Tools.env`) and run the
spec's text with :meth:`Tools.shell`. Cached under
``$NRI_TOOLS_CACHE`` or ``~/.cache/nri-resource-policy/tools`` with a stamp
(``tools.json``); a second call costs nothing. :class:`ToolsError` when they
cannot be had (no network, no apt-get).

Stdlib only; the modules that use it put ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _debian import (
    CommandError,
    apt_config,
    apt_env,
    cache_lock,
    debian_source,
    dpkg_extract,
    run,
)
from _progress import Progress

#: bump when the recipe changes: a cache of another recipe is redone
RECIPE = 1
#: suite -> packages fetched from it
PACKAGES = {"sid": ("kubectl",), "trixie": ("jq", "libjq1", "libonig5", "libc6")}
STAMP = "tools.json"
_LIBS = "usr/lib/x86_64-linux-gnu"
_LOADER = f"{_LIBS}/ld-linux-x86-64.so.2"


class ToolsError(RuntimeError):
    """kubectl/jq cannot be fetched or do not run here."""


def cache_dir() -> Path:
    """``$NRI_TOOLS_CACHE`` or ``~/.cache/nri-resource-policy/tools``."""
    env = os.environ.get("NRI_TOOLS_CACHE")
    return Path(env or Path.home() / ".cache" / "nri-resource-policy" / "tools").expanduser()


@dataclass(frozen=True)
class Tools:
    """``kubectl`` and ``jq`` in :attr:`bin`, with the versions they report."""

    bin: Path
    kubectl_version: str
    jq_version: str

    @property
    def kubectl(self) -> Path:
        return self.bin / "kubectl"

    @property
    def jq(self) -> Path:
        return self.bin / "jq"

    def env(self, kubeconfig: Path | None = None, home: Path | None = None) -> dict[str, str]:
        """A minimal environment: :attr:`bin` first on ``PATH``, ``KUBECONFIG``, ``HOME``.

        ``home``: where kubectl keeps its discovery cache (``~/.kube/cache``);
        give a directory of the test's so that no run sees another's cache.
        """
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(home or self.bin.parent / "home"),
        }
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return env

    def shell(
        self,
        script: str,
        *,
        kubeconfig: Path | None = None,
        home: Path | None = None,
        cwd: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """``bash -c script`` (the spec's blocks are bash) with :meth:`env`; not checked.

        ``set -o pipefail`` is prepended so that a failing ``kubectl`` before
        ``| jq`` fails the pipeline instead of jq's success on empty input.
        """
        return subprocess.run(
            ["bash", "-c", "set -o pipefail\n" + script],
            env=self.env(kubeconfig, home),
            cwd=cwd,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )


def _jq_wrapper(root: Path) -> str:
    return (
        "#!/bin/sh\n"
        "# trixie's jq with trixie's own loader and libc (see tests/_tools.py)\n"
        f'exec "{root / _LOADER}" --library-path "{root / _LIBS}" "{root}/usr/bin/jq" "$@"\n'
    )


def _probe(bindir: Path) -> tuple[str, str]:
    """The versions kubectl and jq report; raises ToolsError unless both run as needed."""
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(bindir)}
    try:
        out = run(
            [str(bindir / "kubectl"), "version", "--client", "-o", "json"],
            env=env,
            timeout=60,
            error=ToolsError,
        ).stdout
        kubectl = str(json.loads(out)["clientVersion"]["gitVersion"])
        jq = run([str(bindir / "jq"), "--version"], env=env, error=ToolsError).stdout.strip()
        # the syntax the spec's programs use (jq >= 1.7)
        got = subprocess.run(
            [str(bindir / "jq"), "-c", ".items.[]"],
            input='{"items":[{"a":1}]}',
            env=env,
            text=True,
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        raise ToolsError(f"kubectl/jq do not run from {bindir}: {e}") from None
    if got.stdout != '{"a":1}\n':
        raise ToolsError(f"{jq} does not run '.items.[]': {got.stdout!r} {got.stderr!r}")
    return kubectl, jq


def cached(cache: Path | None = None) -> Tools | None:
    """The cached tools of this recipe, if they are there and run."""
    cache = cache or cache_dir()
    try:
        stamp = json.loads((cache / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("recipe") != RECIPE:
        return None
    bindir = cache / "bin"
    if not all(os.access(bindir / t, os.X_OK) for t in ("kubectl", "jq")):
        return None
    return Tools(bindir, str(stamp.get("kubectl", "")), str(stamp.get("jq", "")))


def fetch(cache: Path | str | None = None, *, say: Callable[[str], None] = print) -> Tools:
    """Fetch (once) and return the tools; raises :class:`ToolsError` when they cannot be had.

    Steps (under ``cache``): a private APT configuration per suite of
    :data:`PACKAGES` (``cache/apt-SUITE``), ``apt-get update``, ``apt-get
    download``, ``dpkg -x`` into ``cache/root``, the ``bin/`` directory
    (``kubectl`` linked, ``jq`` the loader wrapper), a probe of both, the stamp.
    The ``.deb`` files and the package lists are removed afterwards.
    """
    cache = (Path(cache).expanduser() if cache else cache_dir()).resolve()
    if tools := cached(cache):
        Progress("[tools]", write=say).cached(f"kubectl, jq in {cache}")
        return tools
    for tool in ("apt-get", "dpkg", "bash"):
        if shutil.which(tool) is None:
            raise ToolsError(f"{tool} not found (a Debian machine is needed to fetch kubectl/jq)")
    with cache_lock(cache):
        if tools := cached(cache):  # fetched by another process meanwhile
            return tools
        t0 = time.monotonic()
        debs = cache / "debs"
        root = cache / "root"
        bindir = cache / "bin"
        (cache / STAMP).unlink(missing_ok=True)
        for d in (debs, root, bindir):
            shutil.rmtree(d, ignore_errors=True)
        debs.mkdir()
        try:
            for suite, names in PACKAGES.items():
                env = apt_env(
                    apt_config(cache / f"apt-{suite}", debian_source(suite), own_status=True)
                )
                what = f"apt-get update ({suite}); download {' '.join(names)}"
                with Progress("[tools]", write=say).step(what, watch=debs) as st:
                    run(["apt-get", "update", "-q"], env=env, timeout=900, error=ToolsError,
                        progress=st)  # fmt: skip
                    run(["apt-get", "download", "-q", *names], cwd=debs, env=env, timeout=900,
                        error=ToolsError, progress=st)  # fmt: skip
            with Progress("[tools]", write=say).step("dpkg -x", watch=root) as st:
                dpkg_extract(sorted(debs.glob("*.deb")), root, progress=st)
        except CommandError as e:
            raise ToolsError(str(e)) from None
        finally:  # the .debs and the suites' package lists (~130 MB) are not needed again
            shutil.rmtree(debs, ignore_errors=True)
            for suite in PACKAGES:
                shutil.rmtree(cache / f"apt-{suite}", ignore_errors=True)
        bindir.mkdir()
        (bindir / "kubectl").symlink_to(root / "usr" / "bin" / "kubectl")
        jq = bindir / "jq"
        jq.write_text(_jq_wrapper(root))
        jq.chmod(0o755)
        kubectl_version, jq_version = _probe(bindir)
        stamp = {
            "recipe": RECIPE,
            "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "kubectl": kubectl_version,
            "jq": jq_version,
            "packages": {s: list(n) for s, n in PACKAGES.items()},
        }
        (cache / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        say(f"[tools] {kubectl_version}, {jq_version} in {time.monotonic() - t0:.0f}s: {bindir}")
        return Tools(bindir, kubectl_version, jq_version)

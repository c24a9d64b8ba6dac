#!/usr/bin/env python3
"""Set up and run nri-resource-policy with nothing but python3.

    python3 dev.py demo   # the main job: a simulated node, the plugin, pods
    python3 dev.py test   # the whole test suite (every tox tier)

Works on a fresh Debian 12 with only ``python3``: when ``ensurepip`` is
missing (Debian's python3-venv not installed) the virtual environment is
created without pip and pip is installed from its wheel on PyPI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("NRI_DEV_VENV", ROOT / ".venv"))
INDEX = os.environ.get("NRI_DEV_PYPI", "https://pypi.org/pypi")
TOX = "tox>=4.20,<5"


def say(msg: str) -> None:
    print(f"dev.py: {msg}", flush=True)


def venv_python(env: Path) -> Path:
    return env / "bin" / "python"


def fetch_pip_wheel(dest: Path) -> Path:
    """Download the newest pip wheel from PyPI (stdlib only)."""
    meta_url = f"{INDEX}/pip/json"
    try:
        with urllib.request.urlopen(meta_url, timeout=60) as resp:
            meta = json.load(resp)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):
            raise SystemExit(
                "dev.py: HTTPS to PyPI failed certificate verification; "
                "install ca-certificates (apt-get install ca-certificates)"
            ) from None
        raise
    for f in meta["urls"]:
        if f["packagetype"] == "bdist_wheel":
            path = dest / f["filename"]
            url = urllib.parse.urljoin(meta_url, f["url"])  # mirrors may answer relative URLs
            with urllib.request.urlopen(url, timeout=120) as resp, open(path, "wb") as out:
                shutil.copyfileobj(resp, out)
            return path
    raise SystemExit("dev.py: no pip wheel found on PyPI")


def ensure_venv(env: Path) -> Path:
    py = venv_python(env)
    if (
        py.exists()
        and subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode == 0
    ):
        return py
    say(f"creating virtual environment {env}")
    # Debian ships ensurepip only in python3-venv: without it, make the venv
    # bare and bring pip from PyPI below
    with_pip = importlib.util.find_spec("ensurepip") is not None
    venv.EnvBuilder(with_pip=with_pip, clear=True).create(env)
    if subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        say("ensurepip is not available: installing pip from its wheel on PyPI")
        with tempfile.TemporaryDirectory() as tmp:
            wheel = fetch_pip_wheel(Path(tmp))
            subprocess.run([py, f"{wheel}/pip", "install", "--quiet", str(wheel)], check=True)
    return py


def pip_install(py: Path, *args: str) -> None:
    """``pip install --quiet``, saying at least every 10 s that it still runs
    (tests/_progress.py; pip's own errors go to the terminal)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _progress import Progress, tree_size  # stdlib only

    cmd = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    site = py.parent.parent / "lib"
    before = tree_size(site)
    with Progress("dev.py:").step(f"pip install {' '.join(args)}", watch=site) as step:
        proc = subprocess.Popen(cmd)
        while True:
            try:
                proc.wait(timeout=step.poll)
                break
            except subprocess.TimeoutExpired:
                step.tick()
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd)
    if tree_size(site) == before:
        say(f"cached: {' '.join(args)} already installed in {py.parent.parent}")


def cmd_demo(rest: list[str]) -> int:
    py = ensure_venv(VENV)
    say("installing nri-resource-policy into the virtual environment")
    pip_install(py, "-e", str(ROOT))
    return subprocess.call([VENV / "bin" / "nri-resource-policy", "demo", *rest])


def interpreter_path() -> str:
    """PATH with every python3.11..3.13 we can find, e.g. pyenv's, appended.

    tox finds interpreters by name on PATH; pyenv shims for versions that
    are installed but not selected fail, so their real bin dirs are added.
    """
    path = os.environ.get("PATH", "")
    extra = []
    for minor in ("3.11", "3.12", "3.13"):
        exe = shutil.which(f"python{minor}")
        if exe and subprocess.run([exe, "-c", ""], capture_output=True).returncode == 0:
            continue
        pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
        for cand in sorted(pyenv.glob(f"{minor}*/bin/python{minor}"), reverse=True):
            extra.append(str(cand.parent))
            break
    if extra:
        say(f"interpreters found outside PATH: {', '.join(extra)}")
    return os.pathsep.join([path, *extra])


def cmd_test(rest: list[str]) -> int:
    py = ensure_venv(VENV)
    pip_install(py, TOX)
    os.environ["PATH"] = interpreter_path()
    tox = [py, "-m", "tox", "--workdir", str(ROOT / ".tox")]
    envs = rest or ["ALL"]
    if envs == ["ALL"]:
        # the envlist (unit + integration on every installed Python, lint, type,
        # chart), then the tiers that need more than a Python: the two images
        # (built daemonless, cached), real containerd 1.7 and 2.1 (the chart's
        # pod on both), a real apiserver (built from Debian packages once,
        # cached) with real kubectl and jq, benchmarks
        rc = subprocess.call([*tox, "run"], cwd=ROOT)
        rc2 = subprocess.call([*tox, "run", "-e", "images,e2e,k8s,bench"], cwd=ROOT)
        return rc or rc2
    return subprocess.call([*tox, "run", "-e", ",".join(envs)], cwd=ROOT)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__.strip())
        return 2
    command, rest = sys.argv[1], sys.argv[2:]
    return cmd_demo(rest) if command == "demo" else cmd_test(rest)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Set up and run nri-resource-policy with nothing but python3.

    python3 dev.py demo   # the main job: a simulated node, the plugin, pods
    python3 dev.py test   # the whole test suite (every tox tier)
    python3 dev.py test py311-unit lint   # some tox envs, one after the other

``test`` with no env runs every tier as CI does: each env its own ``tox run``,
``NRI_DEV_SLOTS`` (2) at a time, each line shown live behind its env's name
and each env's whole output kept in ``.tox/dev-logs/ENV.log`` (see ``SUITE``).

Works on a fresh Debian 12 with only ``python3``: when ``ensurepip`` is
missing (Debian's python3-venv not installed) the virtual environment is
created without pip and pip is installed from its wheel on PyPI.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("NRI_DEV_VENV", ROOT / ".venv"))
INDEX = os.environ.get("NRI_DEV_PYPI", "https://pypi.org/pypi")
TOX = "tox>=4.20,<5"
TOX_UV = "tox-uv>=1.25,<2"  # uv for the envs' installs: seconds, not half a minute each


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


# The whole suite (`dev.py test`, what CI runs): every env of tox.ini's envlist
# (unit + integration on every installed Python, lint, type, chart), then the
# tiers that need more than a Python: the two images (built daemonless,
# cached), real containerd 1.7 and 2.1 (the chart's pod on both), a real
# apiserver (built from Debian packages once, cached) with real kubectl and jq,
# and the benchmarks. Each env is its own `tox run -e ENV`, SLOTS at a time, in
# this order (longest first). An env marked alone runs with nothing beside it:
# the integration tiers (real plugin and helper processes whose liveness
# bounds, a fault suite's among them, are the tier's promises: beside another
# tier on two cores, 4 of 240 failed on a loaded machine) and the bench (its
# figures are the machine's, not a shared core's).
SUITE: tuple[tuple[str, bool], ...] = (
    ("e2e", False),
    ("k8s", False),
    ("py313-unit", False),
    ("py312-unit", False),
    ("py311-unit", False),
    ("images", False),
    ("type", False),
    ("chart", False),
    ("lint", False),
    ("py313-integration", True),
    ("py312-integration", True),
    ("py311-integration", True),
    ("bench", True),
)
SLOTS = int(os.environ.get("NRI_DEV_SLOTS", "2"))
"""Envs run at once: the CI machine's two cores."""
HEARTBEAT = 60.0
"""Seconds between two "still running" lines when no env printed anything."""
SHM = Path("/dev/shm")
SCRATCH_NEED = 2 << 30
"""Free bytes the tiers' temp trees need beside each other (tox.ini's TMPDIR,
``NRI_TEST_TMPDIR``): a unit tier peaks at ~0.4 GB and ~115k files of sysfs
trees. Where /dev/shm has less, the trees go to the disk's temp directory:
slower, never out of space."""


def scratch_base(shm: Path = SHM, need: int = SCRATCH_NEED) -> tuple[Path, str]:
    """Where the envs' temp directories go, and why: ``shm`` (memory, as sysfs
    is) when it has ``need`` bytes and ``need // 4096`` files free, else the
    disk's temp directory."""
    disk = Path(tempfile.gettempdir())
    try:
        st = os.statvfs(shm)
    except OSError as e:
        return disk, f"{shm} is not usable ({e.strerror})"
    free, files = st.f_bavail * st.f_frsize, st.f_favail
    if free < need or (st.f_files and files < need // 4096):
        return (
            disk,
            f"{shm} has {free >> 20} MiB and {files} files free, less than {need >> 20} MiB",
        )
    return shm, f"{shm} has {free >> 20} MiB free"


def build_wheel(py: Path, out: Path) -> Path:
    """The project's wheel, built once for every env (tox's ``--installpkg``)."""
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [py, "-m", "uv", "build", "--quiet", "--wheel", "--out-dir", str(out), str(ROOT)],
        check=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def announced_scratch() -> Path:
    """:func:`scratch_base`, said where it is and why."""
    base, why = scratch_base()
    say(f"temp trees under {base}: {why}")
    return base


class Job:
    """One ``tox run -e ENV``: its output goes, line by line, to its log file and,
    prefixed with the env's name, to our stdout."""

    last_line = 0.0
    """When any job last printed a line (the heartbeat's clock)."""

    def __init__(
        self,
        env: str,
        alone: bool,
        cmd: list[Any],
        log: Path,
        width: int,
        out: threading.Lock,
        scratch: Path,
    ) -> None:
        self.env, self.alone, self.log, self.started = env, alone, log, time.monotonic()
        self.seconds = 0.0
        self.scratch = Path(tempfile.mkdtemp(prefix="nri", dir=scratch))
        """The env's own temp directory under ``scratch`` (``NRI_TEST_TMPDIR``),
        gone when it ends: a short name, as the tests' unix sockets live under
        it and a socket's path has at most 107 bytes."""
        self.proc = subprocess.Popen(
            [str(c) for c in cmd],
            cwd=ROOT,
            env={**os.environ, "NRI_TEST_TMPDIR": str(self.scratch)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # our Ctrl-C reaches tox through stop() only
        )
        self._prefix = f"{env:<{width}} | "
        self._out = out
        self._relay = threading.Thread(target=self._pump, name=f"relay-{env}", daemon=True)
        self._relay.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "wb") as log:
            for line in self.proc.stdout:
                log.write(line)
                text = line.decode("utf-8", "replace").rstrip("\n")
                with self._out:
                    print(self._prefix + text, flush=True)
                    Job.last_line = time.monotonic()

    def done(self) -> bool:
        if self.proc.poll() is None:
            return False
        self._relay.join()
        self.seconds = time.monotonic() - self.started
        shutil.rmtree(self.scratch, ignore_errors=True)
        return True

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)


def closing_counts(log: Path) -> dict[str, int]:
    """The counts of pytest's closing line in ``log`` (empty when it has none)."""
    counts: dict[str, int] = {}
    for line in log.read_text("utf-8", "replace").splitlines():
        if line.startswith("=") and " in " in line and re.search(r"\d+ (passed|failed)", line):
            counts = {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", line)}
    return counts


def run_suite(
    command: Callable[[str], list[Any]],
    suite: tuple[tuple[str, bool], ...],
    slots: int,
    logs: Path,
    scratch: Path | None = None,
) -> int:
    """Run ``command(env)`` for each env of ``suite`` as :data:`SUITE` says, with
    each env's output in ``logs/ENV.log`` and its temp trees in a directory of
    its own under ``scratch`` (default: :func:`scratch_base`), removed when the
    env ends (a failed test's trees too: its output is in the log, and no
    failed run leaves a CI machine's /dev/shm fuller for the next one);
    0 when every env passed."""
    logs.mkdir(parents=True, exist_ok=True)
    say(f"{len(suite)} envs, {slots} at a time; each env's whole output: {logs}/ENV.log")
    if scratch is None:
        scratch = announced_scratch()
    width = max(len(env) for env, _ in suite)
    out = threading.Lock()
    waiting = list(suite)
    running: list[Job] = []
    finished: list[Job] = []
    t0 = Job.last_line = time.monotonic()
    try:
        while waiting or running:
            for job in [j for j in running if j.done()]:
                running.remove(job)
                finished.append(job)
                verdict = "ok" if job.proc.returncode == 0 else f"FAILED (rc {job.proc.returncode})"
                with out:
                    say(f"{job.env} {verdict} in {job.seconds:.0f} s")
            while waiting and len(running) < slots and not any(j.alone for j in running):
                env, alone = waiting[0]
                if alone and running:
                    break
                waiting.pop(0)
                log = logs / f"{env}.log"
                running.append(Job(env, alone, command(env), log, width, out, scratch))
            if time.monotonic() - Job.last_line > HEARTBEAT:
                with out:
                    now = time.monotonic()
                    ages = [f"{j.env} {now - j.started:.0f} s" for j in running]
                    say(f"still running: {', '.join(ages)}")
                    Job.last_line = time.monotonic()
            time.sleep(0.2)
    except KeyboardInterrupt:
        for job in running:
            job.stop()
        for job in running:
            job.proc.wait()
        raise
    finally:
        for job in running:
            shutil.rmtree(job.scratch, ignore_errors=True)
    failed = [j for j in finished if j.proc.returncode != 0]
    for job in failed:  # the failures' output once more, whole
        print(f"\n{'=' * 30} {job.env} (FAILED): {job.log}", flush=True)
        print(job.log.read_text("utf-8", "replace"), flush=True)
    total: dict[str, int] = {}
    print(f"\n{'=' * 30} dev.py test: {time.monotonic() - t0:.0f} s wall time", flush=True)
    for job in finished:
        counts = closing_counts(job.log)
        for k, n in counts.items():
            total[k] = total.get(k, 0) + n
        tests = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no pytest run"
        verdict = "OK" if job.proc.returncode == 0 else f"FAILED (rc {job.proc.returncode})"
        print(f"  {job.env:<{width}} {verdict} in {job.seconds:6.1f} s  ({tests})", flush=True)
    print(f"dev.py: {total.get('passed', 0)} passed, {total.get('failed', 0)} failed", flush=True)
    return 1 if failed else 0


def cmd_test(rest: list[str]) -> int:
    py = ensure_venv(VENV)
    pip_install(py, TOX, TOX_UV)
    os.environ["PATH"] = interpreter_path()
    # an interpreter tox.ini asks for and the machine lacks is skipped (its
    # skip_missing_interpreters), never fetched by uv
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    tox: list[Any] = [py, "-m", "tox", "--workdir", str(ROOT / ".tox")]
    envs = rest or ["ALL"]
    given = os.environ.get("NRI_TEST_TMPDIR")
    if envs == ["ALL"]:
        wheel = build_wheel(py, ROOT / ".tox" / "dev-dist")
        return run_suite(
            lambda env: [*tox, "run", "-e", env, "--installpkg", wheel],
            SUITE,
            SLOTS,
            ROOT / ".tox" / "dev-logs",
            Path(given) if given else None,
        )
    if not given:
        os.environ["NRI_TEST_TMPDIR"] = str(announced_scratch())
    return subprocess.call([*tox, "run", "-e", ",".join(envs)], cwd=ROOT)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__.strip())
        return 2
    command, rest = sys.argv[1], sys.argv[2:]
    return cmd_demo(rest) if command == "demo" else cmd_test(rest)


if __name__ == "__main__":
    sys.exit(main())

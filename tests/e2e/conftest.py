"""Fixtures for end-to-end tests against real containerds (see containerd_env.py).

* ``containerd_cache`` (session, parametrized over the runtime matrix, ids
  ``containerd-1.7`` and ``containerd-2.1``): one runtime's fetched packages/images (under
  ``$NRI_E2E_CACHE`` or ``~/.cache/nri-resource-policy/e2e``), so every test that uses it,
  ``containerd_env`` or ``cri`` runs against each runtime. When the tier cannot set itself
  up (not root, fetch failed) it goes through ``_tier.unavailable``: a loud skip, a
  failure under CI or ``NRI_E2E_REQUIRED=1``.
* ``containerd_env`` (session): a started ``ContainerdEnv`` of that runtime in a temporary
  work dir, stopped (and checked for leftovers) when the tests of that runtime are done
  (pytest runs one runtime's tests, then the other's: one daemon at a time).
* ``cri`` (function): a ``CRIClient`` on that daemon; every pod is removed afterwards.
* ``plugins`` / ``plugin`` (function): NRI plugin processes of this project against that
  daemon (see below).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parents[1]
for _p in (_HERE, _HERE.parent, _REPO / "framework"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _tier  # noqa: E402
from containerd_env import ContainerdEnv  # noqa: E402
from containerd_packages import (  # noqa: E402
    DEFAULT_CACHE,
    RUNTIMES,
    EnvError,
    fetch,
    runtime_cache,
)

TIER = "e2e tests"
REQUIRED = "NRI_E2E_REQUIRED"


def e2e_cache_dir() -> Path:
    return Path(os.environ.get("NRI_E2E_CACHE") or DEFAULT_CACHE).expanduser()


@pytest.fixture(scope="session", params=list(RUNTIMES))
def containerd_cache(request: pytest.FixtureRequest) -> Path:
    """One runtime of the matrix, fetched: its cache directory."""
    runtime: str = request.param
    if os.geteuid() != 0:
        _tier.unavailable(TIER, f"containerd needs root (running as uid {os.geteuid()})", REQUIRED)
    cache = runtime_cache(e2e_cache_dir(), runtime)
    t0 = time.monotonic()
    try:
        fetch(cache, runtime=runtime)
    except (EnvError, OSError, subprocess.SubprocessError) as e:
        _tier.unavailable(
            TIER, f"cannot fetch {runtime} (containerd/runc/busybox) into {cache}: {e}", REQUIRED
        )
    print(f"\n[e2e] {runtime}: fetch into {cache}: {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return cache


@pytest.fixture(scope="session")
def containerd_env(
    containerd_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ContainerdEnv]:
    env = ContainerdEnv(containerd_cache, tmp_path_factory.mktemp("containerd"))
    t0 = time.monotonic()
    try:
        env.start()
    except BaseException:
        env.stop()
        raise
    print(
        f"[e2e] {env.runtime.get('id')}: containerd {env.containerd_version()} up in "
        f"{time.monotonic() - t0:.1f}s, work dir {env.work_dir}",
        file=sys.stderr,
    )
    try:
        yield env
    finally:
        env.stop()
        left = {k: v for k, v in env.leftovers().items() if v}
        assert not left, f"containerd env left things behind: {left}"


@pytest.fixture
def cri(containerd_env: ContainerdEnv) -> Iterator[object]:
    from cri_client import CRIClient

    client = CRIClient(containerd_env.cri_socket, log_root=containerd_env.pod_log_dir)
    try:
        yield client
    finally:
        try:
            client.cleanup()
        finally:
            client.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    _tier.summary(terminalreporter)


# --------------------------------------------------------------------------- NRI plugin processes
#
# * ``plugins`` (function): a factory that starts ``python -m nri_framework run`` as an
#   external NRI plugin of the session's containerd (stderr to a file), waits until both
#   sides say it is in (our "registered as NN-name" and containerd's ``plugin "NN-name"
#   connected``, which containerd 1.7 logs after Configure and Synchronize), and stops
#   every plugin it started at teardown (SIGTERM, then SIGKILL), waiting for containerd to
#   notice the closed connection so the next test starts from a daemon without plugins.
# * ``plugin`` (function): ``plugins.start()``, i.e. the ``pinner`` policy as ``10-pinner``.

PLUGIN_READY_TIMEOUT = 20.0


def _q(text: str) -> str:
    """``text`` as it appears inside a quoted logfmt ``msg="..."`` in containerd's log."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


class PluginProcess:
    """One ``nri_framework run`` process; its stderr goes to ``log_path``."""

    def __init__(
        self,
        env: ContainerdEnv,
        *,
        policy: str,
        index: str,
        name: str,
        state_dir: Path,
        log_path: Path,
        exit_on_disconnect: bool = True,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.env = env
        self.policy = policy
        self.index = index
        self.name = name
        self.state_dir = state_dir
        self.log_path = log_path
        self.cmd = [
            sys.executable,
            "-m",
            "nri_framework",
            "run",
            "--policy",
            policy,
            "--nri-socket",
            str(env.nri_socket),
            "--nri-plugin-index",
            index,
            "--nri-plugin-name",
            name,
            "--state-dir",
            str(state_dir),
            *(["--exit-on-disconnect"] if exit_on_disconnect else []),
            *extra_args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False  # the test ended it on purpose
        self._ctd_log_offset = 0

    @property
    def full_name(self) -> str:
        return f"{self.index}-{self.name}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def containerd_log_since_start(self) -> str:
        """containerd's log from just before this process was started."""
        try:
            with open(self.env.log_path, "rb") as f:
                f.seek(self._ctd_log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self, *, wait: bool = True, timeout: float = PLUGIN_READY_TIMEOUT) -> PluginProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._ctd_log_offset = self.env.log_path.stat().st_size
        except FileNotFoundError:
            self._ctd_log_offset = 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=str(self.state_dir),
                start_new_session=True,
            )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = PLUGIN_READY_TIMEOUT) -> None:
        """Our "registered as NN-name" and containerd's ``plugin "NN-name" connected``."""
        ours = f"registered as {self.full_name}"
        theirs = _q(f'plugin "{self.full_name}" connected')
        self.wait_for(lambda: ours in self.log_text(), f"our log line {ours!r}", timeout)
        self.wait_for(
            lambda: theirs in self.containerd_log_since_start(),
            f"containerd's log line {theirs!r}",
            timeout,
        )

    def wait_for(self, cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"plugin {self.full_name} exited with {self.proc.returncode} before {what}\n"
                    f"--- plugin log:\n{self.log_text()[-4000:]}"
                    f"--- containerd log:\n{self.containerd_log_since_start()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"plugin {self.full_name}: no {what} within {timeout}s\n"
                    f"--- plugin log:\n{self.log_text()[-4000:]}"
                    f"--- containerd log:\n{self.containerd_log_since_start()[-4000:]}"
                )
            time.sleep(0.05)

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 10.0) -> int | None:
        """Send ``sig`` and wait for the process to end; returns its exit status."""
        if self.proc is None:
            return None
        self.killed = True
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def wait_containerd_dropped(self, timeout: float = 10.0) -> bool:
        """Wait for containerd's ``connection to plugin "NN-name" closed``."""
        line = _q(f'connection to plugin "{self.full_name}" closed')
        deadline = time.monotonic() + timeout
        while line not in self.containerd_log_since_start():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


class PluginFactory:
    def __init__(self, env: ContainerdEnv, work: Path) -> None:
        self.env = env
        self.work = work
        self.started: list[PluginProcess] = []

    def start(
        self,
        policy: str = "pinner",
        index: str = "10",
        name: str | None = None,
        *,
        state_dir: Path | None = None,
        exit_on_disconnect: bool = True,
        extra_args: tuple[str, ...] = (),
        wait: bool = True,
    ) -> PluginProcess:
        name = name or policy
        n = sum(1 for p in self.started if p.full_name == f"{index}-{name}")
        p = PluginProcess(
            self.env,
            policy=policy,
            index=index,
            name=name,
            state_dir=state_dir or self.work / f"state-{index}-{name}",
            log_path=self.work / f"plugin-{index}-{name}.{n}.log",
            exit_on_disconnect=exit_on_disconnect,
            extra_args=extra_args,
        )
        self.started.append(p)
        return p.start(wait=wait)

    def stop_all(self) -> list[str]:
        """Stop every plugin (SIGTERM); returns complaints: plugins that died on their own,
        did not exit 0 on SIGTERM, or logged a traceback."""
        problems = []
        for p in self.started:
            if p.proc is None:
                continue
            if p.proc.poll() is not None and not p.killed:
                problems.append(
                    f"plugin {p.full_name} (pid {p.pid}) exited by itself with "
                    f"{p.proc.returncode}:\n{p.log_text()[-3000:]}"
                )
            was_alive = p.alive()
            rc = p.kill(signal.SIGTERM)
            if was_alive and rc != 0:
                problems.append(
                    f"plugin {p.full_name} (pid {p.pid}) exited with {rc} on SIGTERM:\n"
                    f"{p.log_text()[-3000:]}"
                )
            if "Traceback (most recent call last)" in p.log_text():
                problems.append(f"plugin {p.full_name} logged a traceback:\n{p.log_text()[-3000:]}")
            if was_alive and not p.wait_containerd_dropped():
                print(
                    f"[e2e] containerd did not log the close of plugin {p.full_name}",
                    file=sys.stderr,
                )
        return problems


@pytest.fixture
def plugins(containerd_env: ContainerdEnv, tmp_path: Path) -> Iterator[PluginFactory]:
    factory = PluginFactory(containerd_env, tmp_path)
    try:
        yield factory
    finally:
        problems = factory.stop_all()
    assert not problems, "\n".join(problems)


@pytest.fixture
def plugin(plugins: PluginFactory) -> PluginProcess:
    """The ``pinner`` policy registered as external plugin ``10-pinner``."""
    return plugins.start("pinner", "10", "pinner")

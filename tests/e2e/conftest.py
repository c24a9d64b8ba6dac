"""Fixtures for end-to-end tests against a real containerd 1.7 (see containerd_env.py).

* ``containerd_cache`` (session): the fetched packages/images (``$NRI_E2E_CACHE`` or
  ``~/.cache/nri-resource-policy/e2e``); skips the e2e tests, loudly, when not root or
  when the packages cannot be fetched.
* ``containerd_env`` (session): a started ``ContainerdEnv`` in a temporary work dir,
  stopped (and checked for leftovers) at the end of the session.
* ``cri`` (function): a ``CRIClient`` on that daemon; every pod is removed afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parents[1]
for _p in (_HERE, _REPO / "framework"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from containerd_env import DEFAULT_CACHE, ContainerdEnv, EnvError, fetch  # noqa: E402

_SKIPPED: list[str] = []


def e2e_cache_dir() -> Path:
    return Path(os.environ.get("NRI_E2E_CACHE") or DEFAULT_CACHE).expanduser()


def _skip(reason: str) -> None:
    msg = f"E2E TESTS SKIPPED: {reason}"
    _SKIPPED.append(msg)
    print(f"\n{'!' * 20} {msg} {'!' * 20}", file=sys.stderr)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def containerd_cache() -> Path:
    if os.geteuid() != 0:
        _skip(f"containerd needs root (running as uid {os.geteuid()})")
    cache = e2e_cache_dir()
    t0 = time.monotonic()
    try:
        fetch(cache)
    except (EnvError, OSError, subprocess.SubprocessError) as e:
        _skip(f"cannot fetch containerd/runc/busybox into {cache}: {e}")
    print(f"\n[e2e] fetch into {cache}: {time.monotonic() - t0:.1f}s", file=sys.stderr)
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
        f"[e2e] containerd up in {time.monotonic() - t0:.1f}s, work dir {env.work_dir}",
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
    for msg in dict.fromkeys(_SKIPPED):
        terminalreporter.write_sep("!", msg, red=True, bold=True)

"""Fixtures for the k8s tier: a real apiextensions-apiserver + etcd (see ``stack.py``).

* ``k8s_stack`` (session): a started :class:`stack.Stack` (kubeconfig, api_client(),
  create_node(); BalloonsPolicy and NodeResourceTopology CRDs installed, Nodes
  through the node proxy). Built once and cached (``$NRI_K8S_CACHE`` or
  ``~/.cache/nri-resource-policy/k8s``). When it cannot be built or started (no
  network, a sid transition...), every test using it is SKIPPED with a loud
  message, or FAILS when ``NRI_K8S_REQUIRED=1``. Stopped at the end of the
  session, and checked for leftovers.

Every test collected under ``tests/k8s`` gets the ``k8s`` marker. Modules here
import the stack module as ``stack`` (this directory is put on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from stack import Stack, StackError, build, cache_dir  # noqa: E402

_SKIPPED: list[str] = []


def _unavailable(reason: str) -> NoReturn:
    reason = reason if len(reason) < 3000 else reason[:1000] + "\n...\n" + reason[-2000:]
    if os.environ.get("NRI_K8S_REQUIRED") == "1":
        msg = f"K8S TIER FAILED (NRI_K8S_REQUIRED=1): {reason}"
        print(f"\n{'!' * 20} {msg}", file=sys.stderr)
        pytest.fail(msg, pytrace=False)
    msg = f"K8S TESTS SKIPPED: {reason}"
    _SKIPPED.append(msg)
    print(f"\n{'!' * 20} {msg}", file=sys.stderr)
    pytest.skip(msg)


_ERRORS = (StackError, OSError, subprocess.SubprocessError, ImportError)


@pytest.fixture(scope="session")
def k8s_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    capman = request.config.pluginmanager.getplugin("capturemanager")
    # show the build's progress lines live (a fresh build takes minutes)
    show = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    cache = cache_dir()
    t0 = time.monotonic()
    with show:
        try:
            build(cache)
        except _ERRORS as e:
            _unavailable(f"cannot build apiextensions-apiserver/etcd into {cache}: {e}")
        t1 = time.monotonic()
        st = Stack(cache)
        try:
            st.start()
        except _ERRORS as e:
            _unavailable(f"cannot start the apiserver stack: {e}")
        print(
            f"[k8s] build/cache check {t1 - t0:.1f}s, start {time.monotonic() - t1:.1f}s; "
            f"kubeconfig {st.kubeconfig}",
            file=sys.stderr,
        )
    try:
        yield st
    finally:
        st.stop()
        left = st.leftovers()
        assert not left, f"k8s stack left things behind: {left}"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.k8s)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    for msg in dict.fromkeys(_SKIPPED):
        terminalreporter.write_sep("!", msg.splitlines()[0][:200], red=True, bold=True)

"""Fixtures for the k8s tier: a real apiextensions-apiserver + etcd (see ``stack.py``).

* ``k8s_stack`` (session): a started :class:`stack.Stack` (kubeconfig, api_client(),
  create_node(); BalloonsPolicy and NodeResourceTopology CRDs installed, Nodes
  through the node proxy). Built once and cached (``$NRI_K8S_CACHE`` or
  ``~/.cache/nri-resource-policy/k8s``). When it cannot be built or started (no
  network, a sid transition...), every test using it is SKIPPED with a loud
  message, or FAILS when ``NRI_K8S_REQUIRED=1``. Stopped at the end of the
  session, and checked for leftovers.

* ``tools`` (session): Debian's kubectl and jq (``tests/_tools.py``), fetched once
  and cached (``~/.cache/nri-resource-policy/tools``); the same rule when they
  cannot be had.
* ``cluster``: a namespace and a node of the test's own on ``k8s_stack``
  (:class:`agent_node.Cluster`), with an operator's ``kubectl`` on it; cleaned up.

Every test collected under ``tests/k8s`` gets the ``k8s`` marker. Modules here
import the stack module as ``stack`` (this directory is put on ``sys.path``).

A tier that cannot set itself up goes through ``tests/_tier.unavailable``: a
loud skip, a failure under ``CI=true`` or ``NRI_K8S_REQUIRED=1``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

import _tier  # noqa: E402
import _tools  # noqa: E402
from _progress import write_line  # noqa: E402
from apiserver_build import StackError, build, cache_dir  # noqa: E402
from spec_commands import REQUIRED  # noqa: E402
from stack import Stack  # noqa: E402


def _unavailable(reason: str) -> NoReturn:
    _tier.unavailable("k8s", reason, REQUIRED)


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


@pytest.fixture(scope="session")
def tools() -> _tools.Tools:
    try:
        return _tools.fetch(say=write_line)  # live: tests/_progress.py
    except (_tools.ToolsError, OSError, subprocess.SubprocessError) as e:
        _unavailable(f"cannot fetch kubectl/jq into {_tools.cache_dir()}: {e}")


@pytest.fixture
def cluster(k8s_stack: Stack, tools: _tools.Tools) -> Iterator[Any]:
    from agent_node import Cluster, unique
    from spec_commands import Kubectl

    with Cluster.opened(k8s_stack, unique("ns"), unique("node"), Kubectl.on(k8s_stack, tools)) as c:
        yield c


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    _tier.summary(terminalreporter)

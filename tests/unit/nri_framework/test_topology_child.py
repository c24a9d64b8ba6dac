"""The topology discovered by a child beside the start's imports
(``nri_framework.topology_child``): the same topology and log lines as an
in-process discovery, and whatever goes wrong with the child (dead, stopped,
garbage, too much, another root) the parent gets ``None`` (it discovers
in-process then) and the child is reaped.

The children are real forked processes; the faults are real signals
(``SIGKILL``, ``SIGSTOP``). Where the fault is the child's output, the child
is one forked here that writes it (ours, two lines: the real child writes only
what :func:`~nri_framework.sysfs.discover_and_encode` gives).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from nri_framework import sysfs, topology_child
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import TOPOLOGIES
from nri_framework.startup import Startup
from nri_framework.topology import Topology


@pytest.fixture(autouse=True)
def _no_child_left() -> Iterator[None]:
    topology_child.discard()
    yield
    topology_child.discard()


def _facts(t: Topology) -> dict[str, object]:
    facts = dict(vars(t))
    facts.pop("_tree")
    return facts


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str]]:
    out = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    caplog.clear()
    return out


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_the_encoded_discovery_is_the_discovery(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = write_topology(tmp_path / "host", name)
    if name == "n4c16":  # a node without base frequencies: discover's warning
        for f in root.glob("sys/devices/system/cpu/cpu*/cpufreq/base_frequency"):
            f.unlink()
    caplog.set_level(logging.DEBUG)
    direct = sysfs.discover(root)
    want = _lines(caplog)
    data = sysfs.discover_and_encode(str(root))
    caplog.clear()
    got = sysfs.decode_discovery(data, str(root))
    assert _facts(got) == _facts(direct)
    assert got.tree() == direct.tree()
    assert _lines(caplog) == want
    if name in ("n4c16", "n6-hbm-cxl"):
        assert want  # the lines are carried, not only none of them
    # C-state sets shared between CPUs (at least) as the discovery shares them
    assert len({id(c.cstates) for c in got.cpus.values()}) <= len(
        {id(c.cstates) for c in direct.cpus.values()}
    )


def test_a_child_discovers_the_topology(tmp_path: Path) -> None:
    root = str(write_topology(tmp_path / "host", "n4c16"))
    topology_child.start(root)
    assert topology_child.pending()
    pid = topology_child._child.pid  # type: ignore[union-attr]
    got = topology_child.take(root)
    assert got is not None
    assert _facts(got) == _facts(sysfs.discover(root))
    assert _gone(pid)
    assert topology_child.take(root) is None  # once


def _killed_first(sig: signal.Signals, tmp_path: Path) -> tuple[Topology | None, int]:
    root = str(write_topology(tmp_path / "host", "n4c16"))
    topology_child.start(root)
    pid = topology_child._child.pid  # type: ignore[union-attr]
    os.kill(pid, sig)
    return topology_child.take(root), pid


def test_a_killed_child_is_no_answer(tmp_path: Path) -> None:
    got, pid = _killed_first(signal.SIGKILL, tmp_path)
    assert got is None
    assert "status" in topology_child.last_refusal or "answer" in topology_child.last_refusal
    assert _gone(pid)


def test_a_stopped_child_is_waited_for_at_most_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topology_child, "DEADLINE", 0.2)
    t0 = time.monotonic()
    got, pid = _killed_first(signal.SIGSTOP, tmp_path)
    assert got is None
    assert time.monotonic() - t0 < 30  # a liveness bound: the deadline ended the wait
    assert topology_child.last_refusal == "no answer within 0.2s"
    assert _gone(pid)  # killed and reaped


def _fake_child(data: bytes, root: str, status: int = 0) -> int:
    """A forked child that writes ``data`` and ends with ``status``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            view = memoryview(data)
            while view:
                view = view[os.write(w, view) :]
        finally:
            os._exit(status)
    os.close(w)
    topology_child._child = topology_child._Child(pid, r, root)
    return pid


def test_garbage_is_no_answer(tmp_path: Path) -> None:
    root = str(write_topology(tmp_path / "host", "n4c16"))
    good = sysfs.discover_and_encode(root)
    cases = [
        b"\xff\x00 not json",
        good[: len(good) // 2],
        b'{"cpus": [], "nodes": [], "possible": 0, "isolated": 0, "memory_nodes": 0, "lines": []}',
        good.replace(b'"node":0', b'"node":77', 1),  # a CPU of no node
        b"[1, 2, 3]",
    ]
    for data in cases:
        pid = _fake_child(data, root)
        assert topology_child.take(root) is None, data[:40]
        assert "does not decode" in topology_child.last_refusal
        assert _gone(pid)
    pid = _fake_child(good, root, status=3)  # whole but failed
    assert topology_child.take(root) is None
    assert "status" in topology_child.last_refusal
    assert _gone(pid)
    pid = _fake_child(good, root)  # the same bytes from a child that ended well
    assert topology_child.take(root) is not None
    assert _gone(pid)


def test_too_much_is_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology_child, "MAX_ANSWER", 100_000)
    root = str(write_topology(tmp_path / "host", "n4c16"))
    good = sysfs.discover_and_encode(root)
    pid = _fake_child(b" " * 300_000 + good, root)  # padded: it would decode if read whole
    assert topology_child.take(root) is None
    assert topology_child.last_refusal == "answer over 100000 bytes"
    assert _gone(pid)  # killed while it still writes, and reaped


def test_an_answer_for_another_root_is_not_taken(tmp_path: Path) -> None:
    root = str(write_topology(tmp_path / "host", "n4c16"))
    topology_child.start(root)
    pid = topology_child._child.pid  # type: ignore[union-attr]
    assert topology_child.take(root + "/") is None
    assert "not" in topology_child.last_refusal
    assert _gone(pid)


@pytest.mark.parametrize(
    ("argv", "root"),
    [
        (["run", "--policy", "p"], "/"),
        (["run", "--host-root", "/host", "--policy", "p"], "/host"),
        (["run", "--host-root=/h"], "/h"),
        (["run", "--host-ro", "/h"], None),  # an abbreviation: not guessed
        (["run", "--host-root"], None),
        (["policies"], None),
        ([], None),
    ],
)
def test_the_host_root_of_a_command_line(argv: list[str], root: str | None) -> None:
    assert topology_child.host_root_of(argv) == root


async def test_a_start_reaps_a_child_its_policy_did_not_ask(tmp_path: Path) -> None:
    root = str(write_topology(tmp_path / "host", "n4c16"))
    topology_child.start(root)
    pid = topology_child._child.pid  # type: ignore[union-attr]
    startup = Startup([], host_root=root)
    assert await startup.wait(lambda: "host") == "host"
    assert not topology_child.pending()
    assert _gone(pid)


_RUN = """
import os, sys
from nri_framework import launch, topology_child
launch.start_topology_child(sys.argv[1:])
import nri_framework.sysfs
def refuse(root):
    raise AssertionError("discovered in-process")
nri_framework.sysfs.discover = refuse  # the parent's only: the child has forked
from nri_framework.topology import Topology
topo = Topology.from_sysfs(sys.argv[sys.argv.index("--host-root") + 1])
try:
    os.waitpid(-1, os.WNOHANG)
    print("OUT", "a child left")
except ChildProcessError:
    print("OUT", len(topo.cpus), "asyncio" in sys.modules)
"""


def test_a_run_takes_the_topology_of_its_launch_child(
    tmp_path: Path, python_lines: Callable[..., list[str]]
) -> None:
    root = write_topology(tmp_path / "host", "n4c16")
    argv = ["run", "--policy", "balloons", "--host-root", str(root)]
    lines = python_lines(_RUN, *argv)
    assert lines == ["16 False"]  # and no child left unreaped

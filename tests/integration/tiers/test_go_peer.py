"""The benchmark's Go NRI runtime peer (``tests/bench/go/peer``) as a process: it
drives the Go floor plugin over a real NRI socket and prints a document
``bench_floor.parse`` accepts; a plugin that exits before it registers, or
never registers, ends the peer with a clear error (promptly, or at its
``-timeout``); and the plugin it launched dies with it (a real SIGKILL of the
peer). The peer and the floor are built from Debian trixie by ``gopeer_build``
(cached); when they cannot be: ``_tier.unavailable`` (fails under CI)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))

import bench_floor  # noqa: E402
import gopeer_build  # noqa: E402
from _tier import unavailable  # noqa: E402


@pytest.fixture(scope="module")
def bins() -> dict[str, Path]:
    try:
        return gopeer_build.build()
    except gopeer_build.GoBuildError as e:
        unavailable("bench-go", f"the Go peer and floor: {e}", "NRI_BENCH_REQUIRED")


def peer(bins: dict[str, Path], work: Path, *args: str, plugin: list[str]) -> list[str]:
    return [str(bins["peer"]), "-socket", str(work / "nri.sock"), *args, "--", *plugin]


def test_the_peer_drives_the_floor(bins: dict[str, Path], tmp_path: Path) -> None:
    floor = [str(bins["floor"]), "-nri-socket", str(tmp_path / "nri.sock")]
    cmd = peer(bins, tmp_path, "-running", "0,3", "-cycles", "2", "-warmup", "1", plugin=floor)
    proc = subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    result = bench_floor.parse(proc.stdout)
    assert [r.running for r in result.rounds] == [0, 3]
    three = result.at(3)
    assert three.requests["create"].count == 4  # 2 HP + 2 LP, the warm-up not counted
    assert three.requests["create_hp"].count == three.requests["remove"].count / 2 == 2
    assert three.restart_ms is not None and result.at(0).restart_ms is None
    assert three.plugin_rss_mb > 0


def test_a_plugin_that_exits_before_it_registers(bins: dict[str, Path], tmp_path: Path) -> None:
    quits = [sys.executable, "-c", "raise SystemExit(3)"]
    cmd = peer(bins, tmp_path, "-running", "5", "-timeout", "50s", plugin=quits)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=40, check=False)
    assert proc.returncode == 1
    assert "the plugin exited before it registered: exit status 3" in proc.stderr
    assert time.monotonic() - t0 < 40  # not the 50 s registration timeout (liveness bound)


def test_a_plugin_that_never_registers(bins: dict[str, Path], tmp_path: Path) -> None:
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    cmd = peer(bins, tmp_path, "-running", "0", "-timeout", "1s", plugin=silent)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1
    assert "did not register and synchronize in time" in proc.stderr


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "children") as fh:
            out += [int(c) for c in fh.read().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_plugin_dies_with_the_peer(bins: dict[str, Path], tmp_path: Path) -> None:
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    cmd = peer(bins, tmp_path, "-running", "0", "-timeout", "50s", plugin=silent)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not (kids := _children(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kids, "the peer launched no plugin"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(k) for k in kids), "the plugin outlived its peer"
    finally:
        proc.kill()
        proc.wait()
        for k in kids if "kids" in locals() else []:
            if _alive(k):
                os.kill(k, signal.SIGKILL)

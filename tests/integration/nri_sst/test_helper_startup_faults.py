"""The real ``nri-sst-helper serve`` process in a pod lacking a mount: the
socket's directory (the chart's emptyDir ``sst-ipc`` not mounted) or the
host's sysfs under ``--host-root`` (hostPath ``hostsysfs``).

It logs one line naming the path and the chart's volume, repeated at
attempts 1, 2, 4, 8 (counted against its own per-attempt debug lines: no
wall time; the real backoff made short with ``--retry-interval``), stays
alive without a traceback, serves by itself once the path is there, and a
SIGTERM while it waits ends it cleanly."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from helper_process import helper_command
from nri_framework.simulate.sysfs import write_cpu_tree
from nri_sst import messages as m
from nri_sst.client import SyncHelperClient

ATTEMPTS = 9


def start(host_root: Path, sock: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = helper_command(host_root, f"ipc://{sock}", log.parent / "sim.json")
    cmd[cmd.index("serve") : cmd.index("serve") + 1] = ["serve", "--retry-interval", "0.01:0.04"]
    cmd.insert(cmd.index("serve"), "-v")  # the per-attempt debug lines
    with log.open("ab") as err:
        return subprocess.Popen(cmd, stderr=err)


def lines_until(proc: subprocess.Popen[bytes], log: Path, marker: str) -> list[str]:
    """The helper's log up to the first line containing ``marker``."""
    deadline = time.monotonic() + 30
    while True:
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if marker in line:
                return lines[: i + 1]
        assert proc.poll() is None, f"the helper exited:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {marker!r}:\n{log.read_text()}"
        time.sleep(0.02)


def reported(lines: list[str], *parts: str) -> int:
    return sum(" ERROR " in line and all(p in line for p in parts) for line in lines)


def serves(sock: Path) -> bool:
    deadline = time.monotonic() + 20
    while not sock.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with SyncHelperClient(f"ipc://{sock}", timeout=5.0) as c:
        return bool(c.call(m.Discover(), m.DiscoverReply).online_cpus)


def check_waiting(proc: subprocess.Popen[bytes], log: Path, line: str, volume: str) -> None:
    lines = lines_until(proc, log, f"attempt {ATTEMPTS} failed")
    assert reported(lines, f"nri-sst-helper: cannot serve: {line}", volume) == 4, lines
    assert proc.poll() is None
    assert "Traceback" not in log.read_text()


def test_socket_directory_not_shared(host_root: Path, tmp_path: Path) -> None:
    sock = tmp_path / "sst-ipc" / "helper.sock"
    log = tmp_path / "helper.log"
    proc = start(host_root, sock, log)
    try:
        line = f"{sock.parent} does not exist (the socket's directory)"
        check_waiting(proc, log, line, "chart emptyDir volume sst-ipc, mounted at /run/nri-sst")
        sock.parent.mkdir()
        assert serves(sock)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait(10)


def test_host_sysfs_not_mounted(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    sock = tmp_path / "run" / "helper.sock"
    sock.parent.mkdir()
    log = tmp_path / "helper.log"
    proc = start(host, sock, log)
    try:
        line = f"{host}/sys/devices/system/cpu does not exist (sysfs not mounted)"
        check_waiting(proc, log, line, "chart hostPath volume hostsysfs")
        write_cpu_tree(host, 4)
        assert serves(sock)
    finally:
        proc.kill()
        proc.wait(10)


def test_sigterm_while_waiting_ends_cleanly(tmp_path: Path, host_root: Path) -> None:
    sock = tmp_path / "missing" / "helper.sock"
    log = tmp_path / "helper.log"
    proc = start(host_root, sock, log)
    try:
        lines_until(proc, log, "attempt 2 failed")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert "Traceback" not in log.read_text()
    finally:
        proc.kill()
        proc.wait(10)

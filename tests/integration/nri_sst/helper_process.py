"""The helper as a real ``nri-sst-helper serve`` process over its real ipc socket:
:func:`start_helper` runs it on the sim backend and waits for its socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nri_sst.backends.sim import read_state


def proc_status(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


class Helper:
    def __init__(
        self, proc: subprocess.Popen[bytes], endpoint: str, sock: Path, state: Path, log: Path
    ):
        self.proc = proc
        self.endpoint = endpoint
        self.sock = sock
        self.state = state
        self.log = log

    def sim_state(self) -> dict[str, object]:
        doc: dict[str, object] = read_state(self.state)
        return doc

    def peak_rss_mb(self) -> float:
        """The helper's peak resident set (VmHWM) so far, MB."""
        return proc_status(self.proc.pid, "VmHWM") / 1024

    def cpu_ticks(self) -> int:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until the helper used no CPU for 0.3 s (it has done what it will do)."""
        deadline = time.monotonic() + timeout
        last, quiet = self.cpu_ticks(), 0
        while quiet < 3:
            assert time.monotonic() < deadline, "the helper kept busy"
            time.sleep(0.1)
            now = self.cpu_ticks()
            quiet = quiet + 1 if now == last else 0
            last = now

    def open_fds(self) -> int:
        return len(list(Path(f"/proc/{self.proc.pid}/fd").iterdir()))

    def stderr(self) -> str:
        """Everything the helper logged so far."""
        return self.log.read_text(errors="replace")


def helper_command(host_root: Path, endpoint: str, state: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nri_sst.cli",
        *(["-v"] if os.environ.get("NRI_SST_HELPER_DEBUG") else []),
        "serve",
        "--socket",
        endpoint,
        "--backend",
        "sim",
        "--host-root",
        str(host_root),
        "--sim-state",
        str(state),
    ]


def start_helper(
    host_root: Path,
    tmp: Path,
    preexec_fn: Callable[[], None] | None = None,
    sock: Path | None = None,
) -> Helper:
    """Start the helper and wait until its socket file is there."""
    if sock is None:
        sock = tmp / "run" / "helper.sock"
        sock.parent.mkdir(mode=0o700, parents=True)
    state = tmp / "sim.json"
    log = tmp / "helper.log"
    endpoint = f"ipc://{sock}"
    with log.open("ab") as err:  # a file, not a pipe: the helper never blocks on its log
        proc = subprocess.Popen(
            helper_command(host_root, endpoint, state), stderr=err, preexec_fn=preexec_fn
        )
    deadline = time.monotonic() + 20
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(10)
            raise RuntimeError(f"helper did not start: {log.read_text()!r}")
        time.sleep(0.02)
    return Helper(proc, endpoint, sock, state, log)


def stop_helper(h: Helper) -> None:
    if h.proc.poll() is None:
        h.proc.kill()
    h.proc.wait(10)

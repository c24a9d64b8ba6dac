"""``inspect --map`` on a real run: the balloons plugin and the SST helper (sim
backend) on the simulated Xeon 6776P, the runtime simulator as containerd, the
spec's pods created (the demo's node, :mod:`nri_balloons_demo.node`).

The map of that state is the golden ``tests/data/cpumap/demo-map.txt`` (the
spec's four HP balloons on four punits, the LP balloon, the reserved CPUs);
``tests/data/cpumap/demo-state.json`` is the ``/debug/state`` it was drawn from,
for the unit tests. ``NRI_REGENERATE_GOLDEN=1`` rewrites both from this run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nri_balloons_demo import pct_managed
from nri_balloons_demo.checks import Checks
from nri_balloons_demo.data import pods_dir
from nri_balloons_demo.node import Demo, Node
from nri_framework import cpumap

DATA = Path(__file__).resolve().parents[2] / "data" / "cpumap"
GOLDEN_MAP = DATA / "demo-map.txt"
GOLDEN_STATE = DATA / "demo-state.json"


def interrupt_as_a_terminal() -> None:
    """The child's SIGINT as a terminal's foreground job has it (the default
    action, so Python makes it KeyboardInterrupt): a suite started in the
    background of a non-interactive shell inherits SIGINT ignored, and Ctrl-C
    would then never reach the watch."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def watch_frames(address: str) -> tuple[int, str]:
    """``inspect --map --watch 0.2`` as a subprocess, stopped by a real SIGINT
    once it has drawn three frames."""
    cmd = [sys.executable, "-m", "nri_framework", "inspect", "--address", address]
    proc = subprocess.Popen(
        [*cmd, "--map", "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=interrupt_as_a_terminal,
    )
    assert proc.stdout is not None
    out = []
    deadline = time.monotonic() + 30
    while sum(line.startswith("CPU MAP:") for line in out) < 3:
        assert time.monotonic() < deadline, "".join(out)
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        out.append(line)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err
    return proc.returncode, "".join(out) + rest


def test_map_of_the_demo_is_the_golden() -> None:
    seen: dict[str, Any] = {}

    async def body(n: Node, c: Checks) -> None:
        w = pct_managed.Walk(n, c)
        await pct_managed.step_5(w)
        await pct_managed.step_6_1(w)
        n.state()  # the inspect consumer's first reading: the busy MHz start here
        seen["state"] = n.state()
        seen["watch"] = await asyncio.to_thread(watch_frames, n.metrics)

    config = (pods_dir() / "balloons-pct-managed.yaml").read_text()
    checks = asyncio.run(Demo("pct-managed", config).run(body))
    assert not checks.failed, checks.failed
    state = seen["state"]
    text = cpumap.render(cpumap.cpu_map_of(state))
    if os.environ.get("NRI_REGENERATE_GOLDEN") == "1":
        GOLDEN_MAP.write_text(text)
        GOLDEN_STATE.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    assert text == GOLDEN_MAP.read_text()

    status, frames = seen["watch"]
    assert status == 0  # Ctrl-C ends a watch normally
    assert "\x1b" not in frames  # stdout is a pipe: no colour, no clear/home
    first = frames[frames.index("CPU MAP:") :].split("\n\nCPU MAP:")[0]
    assert first.splitlines()[:8] == text.splitlines()[:8]

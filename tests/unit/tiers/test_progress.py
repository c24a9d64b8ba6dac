"""The tiers' progress reporter (``tests/_progress.py``) with an injected clock:
a line at least every 10 s of that clock, sizes of what is fetched, the cached
line; :func:`_debian.run` ticking a step while a real (tiny, local) command
runs; and the lines shown live by a real ``pytest -q`` run whose session
fixture does a fake slow fetch (nothing is downloaded or built)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parents[2]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

import _debian  # noqa: E402
from _progress import EVERY, Progress, human_size  # noqa: E402


class FakeClock:
    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step  # seconds added by every reading (a clock that runs on its own)

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def reporter(clock: FakeClock) -> tuple[Progress, list[tuple[float, str]]]:
    lines: list[tuple[float, str]] = []
    return Progress("[t]", write=lambda s: lines.append((clock.now, s)), clock=clock), lines


def test_a_running_step_says_something_at_least_every_10_seconds(tmp_path: Path) -> None:
    clock = FakeClock()
    progress, lines = reporter(clock)
    dest = tmp_path / "debs"
    dest.mkdir()
    (dest / "old.deb").write_bytes(b"x" * 500)  # there before: not counted
    with progress.step("apt-get download containerd", watch=dest) as step:
        for second in range(1, 96):
            clock.now += step.poll * 1.05  # what run() does: wait a poll (and a bit), tick
            (dest / "containerd.deb").write_bytes(b"x" * 100_000 * second)
            step.tick()
    times = [t for t, _ in lines]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(lines) >= 10 and max(gaps) <= EVERY, lines
    assert lines[0][1] == "[t] apt-get download containerd ..."
    assert lines[1][1] == "[t] apt-get download containerd: 8 s, 800.0 kB so far"
    assert lines[-1][1] == "[t] apt-get download containerd: done in 100 s, 9.5 MB"


def test_a_failed_step_says_so_with_its_time() -> None:
    clock = FakeClock()
    progress, lines = reporter(clock)
    with pytest.raises(RuntimeError), progress.step("go build"):
        clock.now += 42
        raise RuntimeError("compile error")
    assert lines[-1][1] == "[t] go build: failed after 42 s"


def test_the_cached_line() -> None:
    progress, lines = reporter(FakeClock())
    progress.cached("containerd_1.7.24.deb, runc_1.1.deb")
    assert lines == [
        (1000.0, "[t] cached: containerd_1.7.24.deb, runc_1.1.deb (nothing to fetch or build)")
    ]


def test_a_tiers_own_say_keeps_its_prefix() -> None:
    said: list[str] = []
    Progress("", write=said.append).cached("/cache/bin")
    assert said == ["cached: /cache/bin (nothing to fetch or build)"]


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (310_000_000, "310.0 MB"), (5e12, "5000.0 GB")],
)
def test_human_size(n: int, text: str) -> None:
    assert human_size(int(n)) == text


# A fake fetch: a local command that writes a "package" and takes a moment.
FAKE_FETCH = textwrap.dedent("""
    import sys, time
    with open(sys.argv[1], "wb") as fh:
        fh.write(b"p" * 123456)
    time.sleep(0.4)
    print("fetched")
""")


def test_run_ticks_the_step_while_the_command_runs(tmp_path: Path) -> None:
    clock = FakeClock(step=1.0)  # every reading is a second later: ticks say something
    progress, lines = reporter(clock)
    with progress.step("fake fetch", watch=tmp_path, poll=0.02) as step:
        proc = _debian.run([sys.executable, "-c", FAKE_FETCH, str(tmp_path / "p.deb")],
                           progress=step)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "fetched\n"
    ticks = [s for _, s in lines if s.endswith("so far")]
    assert ticks, lines  # the wait was reported, not silent
    assert ticks[-1].endswith("123.5 kB so far"), ticks
    assert lines[-1][1].startswith("[t] fake fetch: done in ")


def test_run_with_progress_still_times_out_and_fails_loudly(tmp_path: Path) -> None:
    progress, _lines = reporter(FakeClock())
    step = progress.step("hung", poll=0.02)
    with pytest.raises(subprocess.TimeoutExpired):
        _debian.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3,
                    progress=step)  # fmt: skip
    with pytest.raises(_debian.CommandError, match="boom"):
        _debian.run([sys.executable, "-c", "import sys; sys.exit('boom')"], progress=step)


def test_dpkg_extract_ticks_while_packages_unpack(tmp_path: Path) -> None:
    clock = FakeClock(step=1.0)
    progress, lines = reporter(clock)
    fake_dpkg = tmp_path / "bin" / "dpkg"  # ours: sleeps instead of unpacking
    fake_dpkg.parent.mkdir()
    fake_dpkg.write_text("#!/bin/sh\nsleep 0.2\n")
    fake_dpkg.chmod(0o755)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{fake_dpkg.parent}:{path}"
    try:
        with progress.step("dpkg -x 3 packages", poll=0.02) as step:
            _debian.dpkg_extract([tmp_path / f"{i}.deb" for i in range(3)], tmp_path / "root",
                                 jobs=1, progress=step)  # fmt: skip
    finally:
        os.environ["PATH"] = path
    assert any("packages)" in s and s.endswith("so far") for _, s in lines), lines


INNER_TEST = textwrap.dedent("""
    import sys
    import pytest
    import _debian
    from _progress import Progress

    class Clock:
        now = 0.0
        def __call__(self):
            self.now += 1.0
            return self.now

    @pytest.fixture(scope="session")
    def fetched(tmp_path_factory):
        dest = tmp_path_factory.mktemp("debs")
        progress = Progress("[fake-tier]", clock=Clock())
        with progress.step("fake fetch", watch=dest, poll=0.02) as step:
            _debian.run([sys.executable, "-c", FETCH, str(dest / "p.deb")], progress=step)
        progress.cached("the second time")
        return dest

    def test_uses_the_fetch(fetched):
        assert (fetched / "p.deb").exists()
""")


def test_pytest_shows_the_lines_live_under_capture_and_q(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(f"FETCH = {FAKE_FETCH!r}\n{INNER_TEST}")
    env = dict(os.environ, PYTHONPATH=str(_TESTS), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_progress",
         "--rootdir", str(tmp_path), "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 passed" in out, out
    assert "[fake-tier] fake fetch ..." in out, out  # a passing test's captured output is hidden
    assert "so far" in out and "[fake-tier] fake fetch: done in " in out, out
    assert "[fake-tier] cached: the second time" in out, out

"""dev.py's suite runner (what CI runs): envs side by side, SLOTS at a time, an
env marked alone with nothing beside it, every failure in the exit code and
shown whole at the end, pytest's counts summed in one closing line.

The envs are real processes (this interpreter running a few lines in place of
``tox run -e ENV``): each writes when it starts and ends, so the test reads
what ran beside what from their own records, not from the runner's.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[3]


def _dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_under_test", _ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_ENV = """
import os, sys, time
rec, env, rc, passed = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def mark(what):
    with open(rec, "a") as f:
        f.write(f"{time.monotonic()} {what} {env}\\n")
mark("start")
scratch = os.environ["NRI_TEST_TMPDIR"]
with open(os.path.join(scratch, "tree"), "w") as f:  # what a tier's fixtures leave
    f.write(env)
with open(rec, "a") as f:
    f.write(f"{time.monotonic()} scratch:{scratch} {env}\\n")
    present = ",".join(sorted(os.listdir(os.path.dirname(scratch))))
    f.write(f"{time.monotonic()} present:{present} {env}\\n")
time.sleep(0.3)
print(f"output of {env}", flush=True)
print(f"======= {passed} passed in 0.30s =======" if rc == 0 else
      f"======= 1 failed, {passed} passed in 0.30s =======", flush=True)
mark("end")
sys.exit(rc)
"""


def _run(tmp_path: Path, suite: tuple[tuple[str, bool], ...], slots: int, fail: set[str]) -> Any:
    dev = _dev()
    rec = tmp_path / "record"
    rec.touch()

    def command(env: str) -> list[Any]:
        rc = 3 if env in fail else 0
        return [sys.executable, "-c", _ENV, rec, env, rc, 2]

    (tmp_path / "scratch").mkdir()
    rc = dev.run_suite(command, suite, slots, tmp_path / "logs", tmp_path / "scratch")
    events = [line.split() for line in rec.read_text().splitlines()]
    return rc, sorted((float(t), what, env) for t, what, env in events if what in ("start", "end"))


def _seen(tmp_path: Path, key: str) -> dict[str, str]:
    """What each env saw as it started: ``scratch``, its NRI_TEST_TMPDIR;
    ``present``, the envs' temp dirs there were then."""
    rows = [line.split() for line in (tmp_path / "record").read_text().splitlines()]
    return {env: what.partition(":")[2] for _t, what, env in rows if what.startswith(key + ":")}


def _most_at_once(events: list[tuple[float, str, str]]) -> tuple[int, dict[str, set[str]]]:
    """How many envs ran at once at most, and for each env the envs beside it."""
    now: set[str] = set()
    beside: dict[str, set[str]] = {}
    most = 0
    for _t, what, env in events:
        if what == "start":
            for other in now:
                beside.setdefault(other, set()).add(env)
                beside.setdefault(env, set()).add(other)
            now.add(env)
            most = max(most, len(now))
        else:
            now.discard(env)
    return most, beside


def test_envs_run_side_by_side_up_to_the_slots_and_the_alone_one_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = (("a", False), ("b", False), ("c", False), ("int", True), ("bench", True), ("d", False))
    rc, events = _run(tmp_path, suite, 2, set())
    assert rc == 0
    ended = sorted(env for _t, what, env in events if what == "end")
    assert ended == ["a", "b", "bench", "c", "d", "int"]
    most, beside = _most_at_once(events)
    assert most == 2
    assert "int" not in beside and "bench" not in beside
    out = capsys.readouterr().out
    assert re.search(r"^a +\| output of a$", out, re.M)  # live, prefixed with the env
    assert out.rstrip().splitlines()[-1] == "dev.py: 12 passed, 0 failed"
    assert (tmp_path / "logs" / "c.log").read_text().startswith("output of c\n")


def test_a_failed_env_fails_the_run_shows_its_output_whole_and_the_rest_still_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = (("a", False), ("b", False), ("c", False))
    rc, events = _run(tmp_path, suite, 2, {"a"})
    assert rc == 1
    assert sorted(env for _t, what, env in events if what == "end") == ["a", "b", "c"]
    out = capsys.readouterr().out
    whole = out[out.index("a (FAILED)") :]
    assert "\noutput of a\n" in whole  # unprefixed: the log, once more
    assert "a FAILED (rc 3)" in out
    assert out.rstrip().splitlines()[-1] == "dev.py: 6 passed, 1 failed"


def test_one_slot_runs_one_env_at_a_time(tmp_path: Path) -> None:
    rc, events = _run(tmp_path, (("a", False), ("b", False), ("c", False)), 1, set())
    assert rc == 0
    assert _most_at_once(events)[0] == 1
    assert [env for _t, what, env in events if what == "start"] == ["a", "b", "c"]


def test_each_env_has_its_own_temp_dir_and_it_is_gone_when_the_run_ends(tmp_path: Path) -> None:
    """The CI machine's /dev/shm is not the developer's: a run removes every
    env's trees, a failed env's too, so no run leaves the next one less room."""
    rc, _events = _run(tmp_path, (("a", False), ("b", False), ("c", True)), 2, {"b"})
    assert rc == 1
    scratches = _seen(tmp_path, "scratch")
    assert sorted(scratches) == ["a", "b", "c"]
    assert len(set(scratches.values())) == 3
    for env, d in scratches.items():
        assert Path(d).is_relative_to(tmp_path / "scratch"), env
        assert Path(d).parent == tmp_path / "scratch", env
        assert len(Path(d).name) <= 12, env  # the tests' unix socket paths live under it
        assert not Path(d).exists(), env
    # a's and b's went as they ended
    assert _seen(tmp_path, "present")["c"] == Path(scratches["c"]).name
    assert list((tmp_path / "scratch").iterdir()) == []


def test_the_temp_trees_go_to_memory_only_where_it_has_room(tmp_path: Path) -> None:
    dev = _dev()
    base, why = dev.scratch_base(tmp_path, need=1 << 20)
    assert base == tmp_path
    assert "MiB free" in why
    base, why = dev.scratch_base(tmp_path, need=1 << 60)
    assert base == Path(tempfile.gettempdir()) and base != tmp_path
    assert f"{tmp_path} has " in why and "less than" in why
    base, why = dev.scratch_base(tmp_path / "absent")
    assert base == Path(tempfile.gettempdir())
    assert "is not usable" in why

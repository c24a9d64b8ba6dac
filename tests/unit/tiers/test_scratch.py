"""``module_tmp`` (``tests/_scratch.py``): a module's shared temp tree is gone
when the module is done, so a tier's trees are not all in /dev/shm at once;
kept when one of the module's tests failed. A real ``pytest`` run over three
small modules, each recording what its temp root held when it began."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[2]

_MODULE = """
import os
from pathlib import Path

def test_tree(module_tmp: Path) -> None:
    (module_tmp / "tree").write_text("x")
    root = module_tmp.parent
    trees = [p for p in root.iterdir() if (p / "tree").exists() and not p.is_symlink()]
    seen = sorted(p.name for p in trees if p != module_tmp)
    with open(os.environ["RECORD"], "a") as f:
        f.write(f"{__name__} {module_tmp.name} {','.join(seen) or '-'}\\n")
    assert __name__ != "test_c_fails"
"""


def test_a_modules_tree_goes_when_the_module_is_done_unless_it_failed(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    conftest = f"import sys\nsys.path.insert(0, {str(_TESTS)!r})\n"
    (suite / "conftest.py").write_text(conftest + "from _scratch import module_tmp  # noqa\n")
    for name in ("test_a", "test_b", "test_c_fails", "test_d"):
        (suite / f"{name}.py").write_text(textwrap.dedent(_MODULE))
    record = tmp_path / "record"
    base = tmp_path / "base"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--basetemp={base}", "."],
        cwd=suite,
        env={"RECORD": str(record), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # test_c_fails failed
    rows = {r.split()[0]: r.split()[1:] for r in record.read_text().splitlines()}
    assert list(rows) == ["test_a", "test_b", "test_c_fails", "test_d"]
    assert rows["test_b"][1] == "-"  # test_a's tree went when test_a was done
    assert rows["test_c_fails"][1] == "-"
    assert rows["test_d"][1] == rows["test_c_fails"][0]  # kept: its test failed
    assert sorted(
        p.name for p in base.iterdir() if (p / "tree").exists() and not p.is_symlink()
    ) == [rows["test_c_fails"][0]]

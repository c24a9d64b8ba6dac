"""``nri-resource-policy simulate``: the real plugin process against the simulator.

The plugin runs as ``python -m nri_framework run --policy pinner ...`` in its
own process, exactly as the command launches it; the pods come from
tests/data/pods/.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nri_framework.simulate.scenario import Row, ScenarioError, format_table, main, run_scenario
from nri_framework.simulate.sysfs import TopologyError, online, prepare_host_root, write_cpu_tree

PODS = Path(__file__).resolve().parents[4] / "tests" / "data" / "pods"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``main`` sets up logging for the process; undo it for the next tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


async def test_pinner_scenario() -> None:
    result = await run_scenario(PODS, "pinner", "cpus:8", timeout=20)
    assert result.ok, (result.failures, result.plugin_output)
    assert result.plugin is not None and result.plugin.full_name == "90-resource-policy"
    placed = {(r.pod, r.container): (r.qos, r.cpus) for r in result.rows}
    assert placed == {
        # 2 whole CPUs in its CFS quota: exclusive, highest ids first
        ("pct-hp-1", "bench"): ("Guaranteed", "6-7"),
        # everything else shares what is left
        ("web", "server"): ("Burstable", "0-5"),
        ("web", "sidecar"): ("Burstable", "0-5"),
        ("idle", "sleeper"): ("BestEffort", "0-5"),
        ("limits-only", "app"): ("Guaranteed", "0-5"),
        ("with-init", "tiny"): ("Burstable", "0-5"),
    }
    assert any("registered as 90-resource-policy" in line for line in result.plugin_output)
    assert result.workdir is None  # removed


def test_main_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--pods", str(PODS), "--policy", "pinner", "--topology", "cpus:4", "--keep"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["POD", "CONTAINER", "QOS", "CPUS", "MEMS"]
    assert lines[1].split() == ["pct-hp-1", "bench", "Guaranteed", "2-3", "(all)"]
    assert lines[2].split() == ["web", "server", "Burstable", "0-1", "(all)"]
    kept = Path(err.split("kept ")[1].split()[0])
    try:
        assert (kept / "host/sys/devices/system/cpu/online").read_text() == "0-3\n"
        assert (kept / "state").is_dir()
    finally:
        shutil.rmtree(kept)


async def test_plugin_that_dies_is_reported() -> None:
    cmd = [sys.executable, "-c", "import sys; print('no policy {policy} here'); sys.exit(3)"]
    with pytest.raises(
        ScenarioError, match=r"exited with code 3 before registering:\nno policy pinner here"
    ):
        await run_scenario(PODS, "pinner", plugin_cmd=cmd, timeout=10)


def test_bad_topology(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pods", str(PODS), "--policy", "pinner", "--topology", "sockets:2"]) == 1
    assert "invalid topology 'sockets:2'" in capsys.readouterr().err


def test_cpu_tree(tmp_path: Path) -> None:
    root = write_cpu_tree(tmp_path, 3)
    cpu = root / "sys/devices/system/cpu"
    for name in ("online", "possible", "present"):
        assert (cpu / name).read_text() == "0-2\n"
    assert (cpu / "cpu2/online").read_text() == "1\n"
    assert (cpu / "cpu2/topology/core_id").read_text() == "2\n"
    assert (cpu / "cpu2/topology/physical_package_id").read_text() == "0\n"
    assert (cpu / "cpu2/topology/die_id").read_text() == "0\n"
    assert (online(root), online(root, "node"), online(tmp_path / "none")) == ("0-2", "0", "")
    assert prepare_host_root(str(tmp_path), tmp_path / "unused") == tmp_path
    with pytest.raises(TopologyError):
        prepare_host_root("cpus:x", tmp_path)
    with pytest.raises(TopologyError):
        write_cpu_tree(tmp_path / "none", 0)


def test_format_table_marks_errors() -> None:
    text = format_table(
        [Row("p", "c", "Burstable", error="boom"), Row("p", "d", "Guaranteed", "1", "0")]
    )
    assert text.splitlines()[1].split() == ["p", "c", "Burstable", "-", "-"]
    assert text.splitlines()[2].split() == ["p", "d", "Guaranteed", "1", "0"]

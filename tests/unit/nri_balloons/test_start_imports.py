"""What a balloons start does not do: import modules needed only off the start
path (each costs a restart its import time), compile the configuration structs'
annotations (msgspec reads them at the first decode and again for the schema walk)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import msgspec
import pytest
from nri_balloons import config
from nri_sst import messages

#: imported only for what a start does not do: difflib for the hint of an
#: unknown field (~1-2 ms)
NOT_AT_START = ("difflib",)


def test_a_start_with_a_valid_configuration_imports_none_of_them() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from nri_framework import cli
        from nri_framework.registry import load_policy
        from nri_balloons_demo.data import pods_dir
        policy = ("balloons", load_policy("balloons"))
        cli.build_parser(policy, commands=False).parse_args(["run", "--policy", "balloons"])
        from nri_balloons.configyaml import load_policy
        text = (pods_dir() / "balloons-pct-managed.yaml").read_text()
        assert load_policy(text).spec.balloon_types
        print(sorted(m for m in {NOT_AT_START!r} if m in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("module", [config, messages], ids=lambda m: m.__name__)
def test_start_structs_have_evaluated_annotations(module: ModuleType) -> None:
    # a string annotation is compiled each time msgspec reads it: the configuration's
    # twice a start (decode and schema walk), the helper protocol's at its import
    structs = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == module.__name__
    ]
    assert len(structs) > 20
    strings = [
        f"{cls.__name__}.{name}"
        for cls in structs
        for name, value in vars(cls).get("__annotations__", {}).items()
        if isinstance(value, str)
    ]
    assert strings == []


#: the spec's cpuClasses on a 16-CPU node
_SMALL_PCT = """\
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata: {name: default}
spec:
  reservedResources: {cpu: "cpuset:0,8"}
  balloonTypes:
  - name: hp-bln
    cpuClass: hp-pct
  cpuClasses:
  - name: hp-pct
    pctPriority: high
    disabledCstates: [C6, C6P]
"""

_START = """
import sys
from nri_framework.launch import main
rc = main(sys.argv[1:])
print("OUT", rc, "yaml" in sys.modules)
"""


def _start(host_root: Path, config: Path, state: Path) -> tuple[str, str]:
    """A whole start of ``run --policy balloons`` in a fresh interpreter (its
    stub's connect finds no runtime: the run ends there); its OUT line and log."""
    argv = ["run", "--policy", "balloons", "--host-root", str(host_root), "--exit-on-disconnect"]
    argv += ["--state-dir", str(state), "--nri-socket", str(state.parent / "nri.sock")]
    argv += ["--config-file", str(config)]
    out = subprocess.run(
        [sys.executable, "-c", _START, *argv], capture_output=True, text=True, timeout=60
    )
    lines = [line[4:] for line in out.stdout.splitlines() if line.startswith("OUT ")]
    assert lines, out.stderr[-3000:]
    return lines[0], out.stderr


def test_a_restart_with_the_same_configuration_file_parses_no_yaml(tmp_path: Path) -> None:
    """The first start parses the file (PyYAML) and keeps its document in the
    state directory; a restart with the same text takes it from there and
    imports no PyYAML; a changed file is parsed again, and its configuration
    is the one applied."""
    from nri_framework.simulate.sysfs import write_topology

    host_root = write_topology(tmp_path / "host", "n4c16")
    config = tmp_path / "config.yaml"
    config.write_text(_SMALL_PCT)
    state = tmp_path / "state"
    first, _ = _start(host_root, config, state)
    assert first == "1 True"
    again, log = _start(host_root, config, state)
    assert again == "1 False"
    assert 'cpuClass "hp-pct" configured' in log
    config.write_text(config.read_text().replace("hp-pct", "hp-fast"))
    changed, log = _start(host_root, config, state)
    assert changed == "1 True"
    assert 'cpuClass "hp-fast" configured' in log and "hp-pct" not in log

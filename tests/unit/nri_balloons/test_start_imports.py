"""What a balloons start does not do: import modules needed only off the start
path (each costs a restart its import time), compile the configuration structs'
annotations (msgspec reads them at the first decode and again for the schema walk)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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

"""The classes a balloons start defines are msgspec Structs or plain classes,
not dataclasses: building a dataclass executes its generated methods (~0.5 ms
each, 1 ms with ``slots``), a start imports about fifty such classes, and
without one it does not import :mod:`dataclasses` either."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_start_builds_no_dataclass_and_imports_no_dataclasses() -> None:
    code = textwrap.dedent(
        """
        import sys
        from nri_framework import cli
        from nri_framework.registry import load_policy
        policy = ("balloons", load_policy("balloons"))
        cli.build_parser(policy, commands=False).parse_args(["run", "--policy", "balloons"])
        import nri_balloons.policy, nri_balloons.state, nri_framework.sysfs
        imported = "dataclasses" in sys.modules
        import dataclasses
        found = sorted(
            f"{name}.{k}"
            for name, mod in list(sys.modules.items())
            if name.split(".")[0] in ("nri_framework", "nri_balloons", "nri_sst")
            for k, v in vars(mod).items()
            if isinstance(v, type) and v.__module__ == name and dataclasses.is_dataclass(v)
        )
        print(" ".join(found) or "-", imported)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["-", "False"], out.stderr

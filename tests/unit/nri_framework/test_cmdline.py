"""A policy's own flags (hook ``policy_addoption``) and commands (group
``nri_resource_policy.commands``), through ``nri_framework.cli.main`` in this
process; the policies are the installed ones (their real entry points)."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import msgspec
import pytest
from nri_framework import cli
from nri_framework.cmdline import (
    Formatter,
    add_policy_flags,
    policy_name,
    terminal_columns,
    typed_options,
)
from nri_framework.hookspecs import PolicyError, hookimpl
from nri_framework.host import PolicyHost
from nri_framework.policies.pinner import Pinner
from nri_framework.simulate.sysfs import write_cpu_tree


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_run_help_after_policy_shows_its_group(capsys: pytest.CaptureFixture[str]) -> None:
    balloons = help_of(["run", "--policy", "balloons", "--help"], capsys)
    assert "balloons:\n  --sst-helper SST_HELPER" in balloons
    assert "--cpus" not in balloons  # the pinner's
    pinner = help_of(["run", "--policy=pinner", "--help"], capsys)
    assert "pinner:\n  --cpus CPUS" in pinner and "--sst-helper" not in pinner
    plain = help_of(["run", "--help"], capsys)
    assert "--sst-helper" not in plain and "--cpus" not in plain
    assert "--config-file" in plain  # the framework's own


def test_a_flag_of_another_policy_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--policy", "pinner", "--sst-helper", "ipc:///x"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --sst-helper" in capsys.readouterr().err


def test_unknown_policy_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--policy", "nope"]) == 2
    assert "policy 'nope' not found (installed: " in capsys.readouterr().err


def test_policy_name_first_pass() -> None:
    assert policy_name(["--nri-socket", "/s", "--policy", "balloons", "--sst-helper", "x"]) == (
        "balloons"
    )
    assert policy_name(["--policy=pinner", "--cpus", "0-3"]) == "pinner"
    assert policy_name(["--help"]) is None


class Clashing:
    """A policy that adds a flag the framework has."""

    @hookimpl
    def policy_addoption(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument_group("clashing").add_argument("--host-root")


def test_a_clashing_flag_is_a_clear_error() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host-root")
    with pytest.raises(PolicyError, match=r"policy 'clashing' cannot add its flags: .*--host-root"):
        add_policy_flags(parser, "clashing", Clashing())


class Opts(msgspec.Struct, frozen=True, kw_only=True):
    name: str = "default"
    count: int = 0


def test_typed_options() -> None:
    assert typed_options(Opts, argparse.Namespace(name="x", other=1)) == Opts(name="x")
    assert typed_options(Opts, argparse.Namespace()) == Opts()
    with pytest.raises(PolicyError, match=r"options of the policy: Expected `int`"):
        typed_options(Opts, argparse.Namespace(count="3"))


def test_pinner_reads_its_cpus_typed(tmp_path: Path) -> None:
    root = tmp_path / "host"
    write_cpu_tree(root, 8)
    pinner = Pinner()
    PolicyHost("pinner", pinner, options=argparse.Namespace(cpus="2-3"), host_root=str(root))
    assert pinner.online == 0b1100
    PolicyHost("pinner", again := Pinner(), options={}, host_root=str(root))
    assert again.online == 0xFF  # no --cpus: the online CPUs


# -- commands ------------------------------------------------------------------------


def distribution(where: Path, name: str, commands: dict[str, str]) -> Path:
    """A real installed distribution's metadata (a ``.dist-info``) under ``where``."""
    info = where / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "\n".join(f"{k} = {v}" for k, v in commands.items())
    (info / "entry_points.txt").write_text(f"[nri_resource_policy.commands]\n{lines}\n")
    return where


def test_installed_command_runs_with_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nri_test_hello.py").write_text(
        textwrap.dedent('''
        def main(argv):
            """Say hello."""
            print("hello", *argv)
            return 7
    ''')
    )
    monkeypatch.syspath_prepend(str(distribution(tmp_path, "nri-test-hello", {
        "hello": "nri_test_hello:main", "run": "nri_test_hello:main"})))  # fmt: skip
    assert cli.main(["hello", "a", "--b"]) == 7
    assert capsys.readouterr().out == "hello a --b\n"
    listed = help_of(["--help"], capsys)
    assert "hello" in listed and "Say hello. (nri-test-hello)" in listed
    # a built-in wins over an entry point of the same name
    assert cli.main(["run", "--policy", "nope"]) == 2


def test_command_whose_distribution_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(
        str(distribution(tmp_path, "nri-test-gone", {"gone": "nri_test_gone_module:main"}))
    )
    assert cli.main(["gone", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nri-resource-policy: command 'gone' is not available: ")
    assert "No module named 'nri_test_gone_module'" in err and "nri-test-gone declares it" in err
    assert "command 'gone' is not available" in help_of(["--help"], capsys)


def test_unknown_command_names_the_installed_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["nosuchcommand"])
    assert exc.value.code == 2
    assert "invalid choice: 'nosuchcommand'" in capsys.readouterr().err


@pytest.mark.parametrize("columns", [None, "57", "200", "0", "-3", "x", ""])
def test_help_width_is_argparse_own(columns: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    # the formatter's width without shutil is the one argparse computes with it
    import shutil

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size().columns
    assert Formatter("x")._width == argparse.HelpFormatter("x")._width
    assert Formatter("x", width=33)._width == 33
    ours = cli.build_parser(commands=False).format_help()
    monkeypatch.setattr(cli, "Formatter", argparse.HelpFormatter)
    assert ours == cli.build_parser(commands=False).format_help()

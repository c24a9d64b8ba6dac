"""The ``validate`` command: a valid example, the checks skipped without a node,
every error printed, a host root, unreadable and unparseable files, several documents.

Every error text is asserted verbatim, each triggered by a concrete YAML.

Where the neighbouring test modules are: see :mod:`config_checks`.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from config_checks import EXAMPLE, INVALID
from nri_balloons import validate_cli

# --- the validate command --------------------------------------------------------------


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = validate_cli.main(list(argv), out=out)
    return rc, out.getvalue()


def test_cli_valid_example() -> None:
    rc, out = run_cli(str(EXAMPLE), "--cpus", "0-255")
    assert rc == 0
    assert out == f'{EXAMPLE}: valid BalloonsPolicy "default", 0 warnings\n'


def test_cli_without_node_notes_the_skipped_checks() -> None:
    rc, out = run_cli(str(EXAMPLE))
    assert rc == 0
    assert out.splitlines()[-1].startswith("note: CPU sets not checked against a node")


def test_cli_prints_every_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        "reservedResources: {cpu: 'cpuset:0-3'}\n"
        "balloonTypes:\n- {name: a, cpuClass: nope}\n"
        "cpuClasses:\n- {name: X, pctPriority: high, sstClosID: 0}\n"
        "- {name: Y, pctPriority: high}\n"
    )
    rc, out = run_cli(str(f), "--cpus", "0-1")
    assert rc == 1
    assert out.splitlines() == [
        "error: balloons: ReservedResources cpus 0-3 contains CPUs not in AllowedResources 0-1,"
        " namely 2-3",
        "error: " + INVALID + 'cpuClass "X": pctPriority and sstClosID are mutually exclusive',
        "error: " + INVALID + "at most one managed PCT cpuClass with pctPriority=high allowed,"
        " got 2: [X Y]",
        'warning: cpuClass "nope" referenced by balloon type "a" is not defined in cpuClasses',
        f"{f}: invalid BalloonsPolicy: 3 errors, 1 warning",
    ]


def test_cli_host_root(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/interrupts").write_text(
        "           CPU0       CPU1\n"
        "  4:          0        115   IO-APIC   4-edge      ttyS0\n"
        "  8:          0          0   IO-APIC   8-edge      rtc0\n"
        "NMI:          0          0   Non-maskable interrupts\n"
    )
    f = tmp_path / "p.yaml"
    f.write_text(
        "reservedResources: {cpu: 'cpuset:3-4'}\ncontrollableInterrupts: ['*rtc0']\n"
        "balloonTypes:\n- {name: a, irqClaim: ['*ttyS0']}\n"
    )
    rc, out = run_cli(str(f), "--host-root", str(tmp_path))
    assert rc == 1
    assert out.splitlines()[:2] == [
        'error: invalid irqclaim ["*ttyS0"]: denied interrupt: irq 4 (IO-APIC 4-edge ttyS0)'
        ' denied but matched by user pattern "*ttyS0"',
        "error: balloons: ReservedResources cpus 3-4 contains CPUs not in AllowedResources 0-3,"
        " namely 4",
    ]


def test_cli_unreadable_and_unparseable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(str(tmp_path / "missing.yaml"))[0] == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec:\n  reservedResources: [\n")
    assert run_cli(str(bad))[0] == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:3:1: invalid YAML: ")
    assert run_cli(str(bad), "--cpus", "0-x")[0] == 2
    assert "cannot read the node's CPUs" in capsys.readouterr().err
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert run_cli(str(empty))[0] == 2


def test_cli_multiple_documents(tmp_path: Path) -> None:
    f = tmp_path / "all.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n"
        + EXAMPLE.read_text()
        + "---\napiVersion: config.nri/v1alpha1\nkind: BalloonsPolicy\nmetadata: {name: n2}\n"
        "spec: {reservedResources: {cpu: '1'}, cpuClasses: [{name: ''}]}\n"
    )
    rc, out = run_cli(str(f), "--cpus", "0-255")
    assert rc == 1
    assert out.splitlines() == [
        "--- document 2",
        f'{f} (document 2): valid BalloonsPolicy "default", 0 warnings',
        "--- document 3",
        "error: " + INVALID + "missing or empty name in a cpuClasses entry",
        f'{f} (document 3): invalid BalloonsPolicy "n2": 1 error, 0 warnings',
        f"{f}: skipped 1 document of other kinds",
    ]

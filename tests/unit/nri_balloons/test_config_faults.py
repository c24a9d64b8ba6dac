"""Hostile configurations: each is rejected with ``FILE:LINE:COLUMN:`` and a
clear text, never a traceback, never unbounded memory or time; the
``validate`` command says the same and exits non-zero.

(The plugin side, SIGHUP with these files, is in
``tests/integration/nri_balloons/test_reload.py``; the agent's status in
``tests/unit/nri_framework/agent/test_agent_config_faults.py``.)"""

from __future__ import annotations

import io
import itertools
import tracemalloc
from pathlib import Path

import pytest
from nri_balloons import validate_cli
from nri_balloons.configdecode import ConfigError, ConfigSyntaxError
from nri_balloons.configyaml import load_policy, parse_yaml
from nri_balloons.frequency import Frequency, FrequencyError
from nri_balloons.plugin import first_few
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.configfile import ConfigFileError, read_config_file
from nri_framework.quantity import QuantityError, milli_value

RES = "reservedResources: {cpu: '1'}\n"

#: (id, text, the one error, as FILE:LINE:COLUMN: message)
HOSTILE: list[tuple[str, str, str]] = [
    ("huge cpuset", "reservedResources: {cpu: 'cpuset:0-99999999999'}\n",
     "x.yaml:1:26: balloons: failed to parse reserved CPU cpuset '0-99999999999': failed to"
     " parse amount '0-99999999999' as cpuset: invalid cpuset '0-99999999999': id 99999999999"
     " out of range 0-8191"),
    ("large cpuset", RES + "availableResources: {cpu: 'cpuset:0-999999999'}\n",
     "x.yaml:2:27: balloons: failed to parse available CPU cpuset '0-999999999': failed to"
     " parse amount '0-999999999' as cpuset: invalid cpuset '0-999999999': id 999999999 out"
     " of range 0-8191"),
    ("deep flow", RES + "x: " + "[" * 10000 + "]" * 10000 + "\n",
     "x.yaml:2:67: invalid YAML: document nested deeper than 64 levels"),
    ("deep block", RES + "x:\n" + "".join(" " * (i + 1) + "-\n" for i in range(1000)),
     "x.yaml:66:65: invalid YAML: document nested deeper than 64 levels"),
    ("NUL byte", RES + 'balloonTypes: [{name: "a\0"}]\n',
     "x.yaml:2:25: invalid YAML: unacceptable character #x0000: special characters are not"
     " allowed"),
    ("maxCPUs 10^26", RES + "balloonTypes:\n- name: a\n  maxCPUs: 100000000000000000000000000\n",
     "x.yaml:4:12: balloonTypes[0].maxCPUs: Invalid value: 100000000000000000000000000:"
     " balloonTypes[0].maxCPUs in body should be less than or equal to 8192"),
    ("minCPUs -5", RES + "balloonTypes:\n- name: a\n  minCPUs: -5\n",
     "x.yaml:4:12: balloonTypes[0].minCPUs: Invalid value: -5: balloonTypes[0].minCPUs in body"
     " should be greater than or equal to 0"),
    ("minBalloons 10^8",
     "spec:\n  " + RES + "  balloonTypes: [{name: a, minBalloons: 100000000}]\n",
     "x.yaml:3:41: spec.balloonTypes[0].minBalloons: Invalid value: 100000000:"
     " spec.balloonTypes[0].minBalloons in body should be less than or equal to 8192"),
    ("int beyond int64", RES + "cpuClasses: [{name: c, turboPriority: 9223372036854775808}]\n",
     "x.yaml:2:39: cpuClasses[0].turboPriority: Invalid value: 9223372036854775808:"
     " cpuClasses[0].turboPriority in body must be of type int64"),
    ("5000 digits", RES + "balloonTypes: [{name: a, minCPUs: " + "9" * 5000 + "}]\n",
     "x.yaml:2:35: invalid YAML: integer of more than 80 digits"),
    ("billion laughs", RES + "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{n}: &{n} [{','.join([f'*{p}'] * 10)}]\n" for p, n in itertools.pairwise("abcdefg")),
     "x.yaml:7:4: invalid YAML: aliases expand the document beyond 1048576 nodes"),
    ("recursive alias", RES + "a: &a [*a]\n",
     "x.yaml:2:4: invalid YAML: recursive alias: a node contains itself"),
    ("huge quantity", "reservedResources: {cpu: '1e999999999'}\n", ""),
    ("frequency overflow", RES + "cpuClasses: [{name: c, maxFreq: '" + "9" * 400 + "GHz'}]\n",
     "x.yaml:2:33: cpuClasses[0].maxFreq: invalid frequency"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_text_is_an_error_with_a_position(text: str, message: str) -> None:
    tracemalloc.start()
    try:
        try:
            policy = load_policy(text, source="x.yaml")
        except ConfigError as exc:
            errors = exc.errors
        else:
            errors = validate(policy, online_cpus=cpuset.parse("0-15")).errors
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20  # "cpuset:0-999999999" took 900 MB
    if message:
        assert errors[0].startswith(message), errors
    else:  # a quantity: the policy's validation, without a position (upstream's text)
        assert errors == [
            "balloons: failed to parse reserved CPU quantity '1e999999999': failed to parse"
            " amount '1e999999999' as resource quantity: quantity out of range: exponent"
            " beyond +-64"
        ]


def test_parse_time_is_bounded_by_an_injected_clock() -> None:
    ticks = itertools.count()
    text = RES + "balloonTypes:\n" + "".join(f"- {{name: t{i}}}\n" for i in range(2000))
    with pytest.raises(ConfigSyntaxError) as exc:
        parse_yaml(text, source="x.yaml", timeout=5, clock=lambda: float(next(ticks)))
    assert "invalid YAML: document takes longer than 5s to parse" in exc.value.errors[0]
    assert exc.value.errors[0].startswith("x.yaml:")
    assert len(parse_yaml(text, source="x.yaml", timeout=None)) == 1


def test_a_chain_of_composite_types_does_not_recurse() -> None:
    n = 3000
    text = (
        RES
        + "balloonTypes:\n"
        + "".join(f"- {{name: c{i}, components: [{{balloonType: c{i + 1}}}]}}\n" for i in range(n))
    )
    chain = validate(load_policy(text + f"- {{name: c{n}}}\n"), online_cpus=None)
    assert chain.errors == [
        'balloons: invalid configuration: balloons: composite balloon "c0" nests components'
        " deeper than 32 levels"
    ]
    loop = validate(load_policy(text.replace(f"c{n}", "c0")), online_cpus=None)
    # every type of the loop is a loop start, as upstream reports them
    assert loop.errors[0] == (
        "balloons: invalid configuration: balloons: circular composition detected in composite"
        ' balloon "c0"'
    )
    assert len(loop.errors) == n


def test_shared_components_are_explored_once() -> None:
    # each type has two components of the next and no loop: 2^30 paths for a
    # walk that does not remember what it explored
    two = "components: [{{balloonType: c{0}}}, {{balloonType: c{0}}}]"
    text = RES + "balloonTypes:\n"
    text += "".join(f"- {{name: c{i}, {two.format(i + 1)}}}\n" for i in range(30))
    text += "- {name: c30}\n"
    assert validate(load_policy(text), online_cpus=None).ok


def test_quantities_and_frequencies_out_of_range() -> None:
    for bad in ("1e999999999", "1e-99999", "9" * 4301):
        with pytest.raises(QuantityError):
            milli_value(bad)
    assert milli_value("1e3") == 1_000_000
    with pytest.raises(FrequencyError, match="value out of range"):
        Frequency.parse("9" * 400 + "GHz")


def test_reported_errors_are_bounded() -> None:
    assert first_few([f"e{i}" for i in range(3)]) == ["e0", "e1", "e2"]
    assert first_few([f"e{i}" for i in range(1000)]) == [
        *(f"e{i}" for i in range(20)),
        "... and 980 more",
    ]


# --- the file: read as the plugin reads it -------------------------------------------------


def test_non_utf8_bytes_are_reported_with_their_position(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_bytes(b"reservedResources: {cpu: '1'}\nballoonTypes: [{name: \"\xc3\xa9t\xff\"}]\n")
    with pytest.raises(ConfigFileError) as exc:
        read_config_file(f)
    assert str(exc.value) == f"{f}:2:26: not UTF-8 text (byte 0xff)"


def test_only_small_regular_files_are_read(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    with pytest.raises(ConfigFileError, match="not a regular file"):
        read_config_file(fifo)
    with pytest.raises(ConfigFileError, match="not a regular file"):
        read_config_file(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 101)
    with pytest.raises(ConfigFileError, match="101 bytes, larger than 100 bytes"):
        read_config_file(big, limit=100)
    assert read_config_file(big, limit=101) == "#" * 101
    with pytest.raises(ConfigFileError, match="cannot read"):
        read_config_file(tmp_path / "missing.yaml")


# --- the validate command ----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_validate_command_rejects_hostile_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(text)
    out = io.StringIO()
    rc = validate_cli.main([str(f), "--cpus", "0-15"], out=out)
    printed = out.getvalue() + capsys.readouterr().err
    assert rc in (validate_cli.EXIT_INVALID, validate_cli.EXIT_UNREADABLE)
    assert "Traceback" not in printed
    if message:
        assert message.replace("x.yaml", str(f)) in printed, printed


def test_validate_command_rejects_non_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "x.yaml"
    f.write_bytes(b"reservedResources: {cpu: '1'}\n\xfe\n")
    assert validate_cli.main([str(f)], out=io.StringIO()) == validate_cli.EXIT_UNREADABLE
    assert capsys.readouterr().err == (
        f"nri-resource-policy validate: {f}:2:1: not UTF-8 text (byte 0xfe)\n"
    )

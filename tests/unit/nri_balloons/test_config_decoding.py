"""BalloonsPolicy decoding: a spec-only document, unknown fields with path, line and
hint, decoding errors, YAML syntax errors, the round trip through builtins, and the
config modules' homes.

Every error text is asserted verbatim, each triggered by a concrete YAML.

Where the neighbouring test modules are: see :mod:`config_checks`.
"""

from __future__ import annotations

import msgspec
import pytest
from config_checks import EXAMPLE
from nri_balloons import configdecode
from nri_balloons.config import BalloonsPolicy, BalloonsPolicySpec, to_builtins
from nri_balloons.configdecode import ConfigError, ConfigSyntaxError
from nri_balloons.configyaml import load_policy
from nri_balloons.frequency import Frequency

# --- decoding --------------------------------------------------------------------------


def test_spec_only_document() -> None:
    policy = load_policy("reservedResources:\n  cpu: cpuset:0\npinMemory: false\n")
    assert isinstance(policy, BalloonsPolicy)
    assert policy.spec.pin_memory is False
    assert policy.name == ""


def test_every_unknown_field_is_reported_with_path_line_and_hint() -> None:
    text = """\
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata:
  name: default
spec:
  reservedResources:
    cpu: "1"
  pinCpu: true
  balloonTypes:
  - name: a
    maxCpus: 2
    matchExpressions:
    - {key: name, op: Equals, values: [a]}
  cpuClasses:
  - name: x
    turboPrio: 1
  wibble: 3
"""
    with pytest.raises(ConfigError) as exc:
        load_policy(text, source="p.yaml")
    assert exc.value.errors == [
        'p.yaml:8:3: unknown field "spec.pinCpu" (did you mean "pinCPU"?)',
        'p.yaml:11:5: unknown field "spec.balloonTypes[0].maxCpus" (did you mean "maxCPUs"?)',
        'p.yaml:13:19: unknown field "spec.balloonTypes[0].matchExpressions[0].op"',
        'p.yaml:16:5: unknown field "spec.cpuClasses[0].turboPrio" (did you mean "turboPriority"?)',
        'p.yaml:17:3: unknown field "spec.wibble"',
    ]


def test_preferFarFromDevices_is_not_settable() -> None:
    with pytest.raises(
        ConfigError, match=r'unknown field "balloonTypes\[0\].preferFarFromDevices"'
    ):
        load_policy(
            "reservedResources: {cpu: '1'}\nballoonTypes:\n- {name: a, preferFarFromDevices: [x]}\n"
        )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("spec: {}\n", '<config>:1:7: missing required field "spec.reservedResources"'),
        ("pinCPU: true\n", '<config>:1:1: missing required field "reservedResources"'),
        ("kind: BalloonsPolicy\n", '<config>:1:1: missing required field "spec"'),
        (
            "reservedResources: {cpu: 2}\n",
            "<config>:1:26: reservedResources.cpu: expected str, got int",
        ),
        (
            "reservedResources: {cpu: '2'}\nballoonTypes:\n- {name: a, minCPUs: two}\n",
            "<config>:3:22: balloonTypes[0].minCPUs: expected int, got str",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nspec: {}\n",
            '<config>:1:13: apiVersion "v1" is not config.nri/v1alpha1',
        ),
        ("- a\n", "<config>:1:1: document is not a mapping"),
        # cpuset amounts are parsed while the positions are known (upstream's words)
        (
            "reservedResources:\n  cpu: cpuset:0-x\n",
            "<config>:2:8: balloons: failed to parse reserved CPU cpuset '0-x': failed to parse"
            " amount '0-x' as cpuset: invalid cpuset '0-x': bad element '0-x'",
        ),
        (
            "reservedResources: {cpu: '1'}\navailableResources: {cpu: 'cpuset:1-'}\n",
            "<config>:2:27: balloons: failed to parse available CPU cpuset '1-': failed to parse"
            " amount '1-' as cpuset: invalid cpuset '1-': bad element '1-'",
        ),
    ],
)
def test_decoding_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_policy(text)
    assert exc.value.errors[0] == message


def test_a_document_msgspec_takes_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema walk (msgspec.inspect's schema and every field visited:
    ~4 ms of every start) runs only where it can find something: a document
    msgspec converts, with string keys and int64 integers, decodes without it."""

    def walk(*args: object) -> None:
        raise AssertionError("the schema walk ran for a valid document")

    monkeypatch.setattr(configdecode, "schema_problems", walk)
    policy = load_policy(EXAMPLE.read_text())
    assert policy.spec.balloon_types[1].max_cpus == 8


def test_what_msgspec_stops_at_is_walked() -> None:
    """msgspec stops at the first problem; the walk names every one, where
    it is (an integer msgspec takes but the API server does not:
    test_config_faults' "int beyond int64")."""
    with pytest.raises(ConfigError) as exc:
        load_policy("reservedResources: {cpu: '1'}\nballoonTypes:\n- {name: a, minCPU: 1, x: 2}\n")
    assert exc.value.errors == [
        '<config>:3:13: unknown field "balloonTypes[0].minCPU" (did you mean "minCPUs"?)',
        '<config>:3:24: unknown field "balloonTypes[0].x"',
    ]


def test_any_key_inside_metadata_is_kept() -> None:
    """metadata holds any value (the walk does not look inside): an integer key
    there sends the document to the walk, which finds nothing, and the
    document decodes."""
    policy = load_policy(
        "apiVersion: config.nri/v1alpha1\nkind: BalloonsPolicy\n"
        "metadata: {name: x, labels: {1: a}}\nspec: {reservedResources: {cpu: '1'}}\n"
    )
    assert policy.metadata["labels"] == {1: "a"}


def test_yaml_syntax_error_has_a_position() -> None:
    with pytest.raises(ConfigSyntaxError) as exc:
        load_policy("spec:\n  reservedResources: {cpu: '1'\n  pinCPU: [\n", source="x.yaml")
    assert exc.value.errors[0].startswith("x.yaml:3:")
    assert "invalid YAML" in exc.value.errors[0]


def test_round_trip_through_builtins() -> None:
    policy = load_policy(EXAMPLE.read_text())
    data = to_builtins(policy)
    assert data["spec"]["cpuClasses"][1]["pctMaxFreq"] == "turbo"
    assert data["spec"]["balloonTypes"][1]["maxCPUs"] == 8
    again = msgspec.convert(
        data["spec"], BalloonsPolicySpec, dec_hook=lambda t, o: Frequency.from_json(o)
    )
    assert again == policy.spec


# --- module homes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "module", ["nri_balloons.configdecode", "nri_balloons.configyaml", "nri_balloons.config"]
)
def test_each_config_module_imports_first(module: str) -> None:
    """config, configdecode and configyaml import one another one way
    (configyaml -> configdecode -> config): each can be the first one a process
    imports, and the loaders are where their users look."""
    import subprocess
    import sys

    code = (
        f"import {module}; from nri_balloons.configdecode import ConfigError; "
        "from nri_balloons.configyaml import load_policy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

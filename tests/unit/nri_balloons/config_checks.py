"""What the BalloonsPolicy tests share: a YAML policy validated on a node
(:func:`check`, :func:`errors`), the spec's example, the error prefixes.

Every error text is asserted verbatim, each triggered by a concrete YAML.

The BalloonsPolicy tests: :mod:`test_config` (validation and every error text),
:mod:`test_config_defaults` (warnings, defaults, built-in balloon types, legacy cpu
classes), :mod:`test_config_decoding` (decoding errors, round trip, module homes),
:mod:`test_validate_cli` (the ``validate`` command); their shared builders
(:func:`~config_checks.check`, :func:`~config_checks.errors`) are in
:mod:`config_checks`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from nri_balloons.configyaml import load_policy
from nri_balloons.validation import Validation, validate
from nri_framework import cpuset

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples/pct-managed/balloons-pct-managed.yaml"
INVALID = "balloons: invalid configuration: "
INVALID_BLN = INVALID + "balloons: "


def check(
    text: str,
    *,
    online: str | None = "0-15",
    interrupts: list[tuple[int, str]] | None = None,
) -> Validation:
    text = textwrap.dedent(text)
    if "reservedResources" not in text:
        text = "reservedResources:\n  cpu: cpuset:0\n" + text
    policy = load_policy(text)
    return validate(
        policy,
        online_cpus=None if online is None else cpuset.parse(online),
        interrupts=interrupts,
    )


def errors(text: str, **kw: object) -> list[str]:
    return check(text, **kw).errors  # type: ignore[arg-type]

"""``nri-resource-policy validate FILE [--cpus LIST | --host-root DIR]``.

Checks a ``BalloonsPolicy`` YAML (the custom resource, or just its spec) the
way the plugin would on a node, and prints every problem, one per line:

* ``error: <text>`` for each error, with upstream's exact text (decoding
  errors carry ``FILE:LINE:COLUMN:``);
* ``warning: <text>`` for each warning upstream would log;
* a summary line.

The node's online CPUs come from ``--cpus`` or from
``DIR/sys/devices/system/cpu/online`` (and IRQs from ``DIR/proc/interrupts``,
if readable) with ``--host-root``; without either, the checks that need the
node's CPUs are skipped, so a file validates the same on any machine.

Exit status: 0 valid, 1 invalid, 2 unreadable or not YAML (or a bad option).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from nri_framework import cpuset
from nri_framework.configfile import (
    MAX_CONFIG_BYTES,
    ConfigFileError,
    decode_text,
    read_config_file,
)

from nri_balloons.config import KIND
from nri_balloons.configdecode import ConfigError, ConfigSyntaxError, decode_policy
from nri_balloons.configyaml import parse_yaml
from nri_balloons.gofmt import quote
from nri_balloons.validation import validate

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nri-resource-policy validate",
        description="Validate a BalloonsPolicy YAML file (the custom resource or its spec).",
    )
    p.add_argument("file", metavar="FILE", help="YAML file, or - for stdin")
    node = p.add_mutually_exclusive_group()
    node.add_argument("--cpus", metavar="LIST", help="the node's online CPUs, e.g. 0-255")
    node.add_argument(
        "--host-root", metavar="DIR", help="read the node's CPUs and IRQs under DIR (e.g. /)"
    )
    return p


def parse_interrupts(text: str) -> list[tuple[int, str]]:
    """Numbered IRQs of ``/proc/interrupts`` with their chip/device description."""
    irqs: list[tuple[int, str]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[0].endswith(":"):
            continue
        try:
            num = int(fields[0][:-1])
        except ValueError:
            continue
        rest = fields[1:]
        start = next((i for i, f in enumerate(rest) if not f.lstrip("+-").isdigit()), len(rest))
        irqs.append((num, " ".join(rest[start:])))
    return irqs


@dataclass(frozen=True)
class _Node:
    """What the command knows about the node: online CPUs, IRQs (None: unknown)."""

    online: int | None
    interrupts: list[tuple[int, str]] | None


def _read_node(args: argparse.Namespace) -> _Node:
    if args.cpus is not None:
        return _Node(cpuset.parse(args.cpus), None)
    if args.host_root is None:
        return _Node(None, None)
    root = Path(args.host_root)
    online = cpuset.parse((root / "sys/devices/system/cpu/online").read_text())
    try:
        interrupts = parse_interrupts((root / "proc/interrupts").read_text())
    except OSError:
        interrupts = None
    return _Node(online, interrupts)


def _read_text(name: str) -> str:
    """The file's text, read as the plugin reads ``--config-file``: a regular
    file of at most 4 MiB of UTF-8 (stdin: the same size and encoding)."""
    if name != "-":
        return read_config_file(name)
    data = sys.stdin.buffer.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigFileError(f"<stdin>: larger than {MAX_CONFIG_BYTES} bytes")
    return decode_text(data, "<stdin>")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _validate_documents(text: str, source: str, node: _Node, out: TextIO) -> int:
    docs = parse_yaml(text, source=source)
    if not docs:
        raise ConfigSyntaxError([f"{source}: no YAML document"])
    policies = [
        (i, d, n)
        for i, (d, n) in enumerate(docs, 1)
        if not (isinstance(d, dict) and "kind" in d and d["kind"] != KIND)
    ]
    if not policies:
        policies = [(i, d, n) for i, (d, n) in enumerate(docs, 1)]
    status = EXIT_VALID
    for i, doc, yaml_node in policies:
        label = f"{source} (document {i})" if len(docs) > 1 else source
        if len(docs) > 1:
            print(f"--- document {i}", file=out)
        errors: list[str] = []
        warnings: list[str] = []
        name = ""
        try:
            policy = decode_policy(doc, source=source, node=yaml_node)
        except ConfigError as exc:
            errors = exc.errors
        else:
            name = policy.name
            result = validate(policy, online_cpus=node.online, interrupts=node.interrupts)
            errors, warnings = result.errors, result.warnings
        for e in errors:
            print(f"error: {e}", file=out)
        for w in warnings:
            print(f"warning: {w}", file=out)
        what = f"{KIND} {quote(name)}" if name else KIND
        if errors:
            status = EXIT_INVALID
            print(
                f"{label}: invalid {what}: {_plural(len(errors), 'error')},"
                f" {_plural(len(warnings), 'warning')}",
                file=out,
            )
        else:
            print(f"{label}: valid {what}, {_plural(len(warnings), 'warning')}", file=out)
    skipped = len(docs) - len(policies)
    if skipped:
        print(f"{source}: skipped {_plural(skipped, 'document')} of other kinds", file=out)
    if node.online is None:
        print(
            "note: CPU sets not checked against a node (use --cpus LIST or --host-root DIR)",
            file=out,
        )
    return status


def main(argv: list[str] | None = None, *, out: TextIO | None = None) -> int:
    """Check a BalloonsPolicy YAML file as the plugin would; returns the exit status."""
    out = out if out is not None else sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    source = "<stdin>" if args.file == "-" else args.file
    try:
        node = _read_node(args)
    except (OSError, cpuset.CpusetError) as exc:
        print(f"nri-resource-policy validate: cannot read the node's CPUs: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        text = _read_text(args.file)
    except ConfigFileError as exc:  # names the file (and the line of a bad byte)
        print(f"nri-resource-policy validate: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except OSError as exc:
        print(f"nri-resource-policy validate: cannot read {source}: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        return _validate_documents(text, source, node, out)
    except ConfigSyntaxError as exc:
        for e in exc.errors:
            print(e, file=sys.stderr)
        return EXIT_UNREADABLE


if __name__ == "__main__":
    sys.exit(main())

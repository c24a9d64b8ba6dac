"""The command line shared by the code generators (genproto.py, gencrd.py):
``--out DIR`` writes the files there, ``--check`` reports stale checked-in files."""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def stale_files(
    generate: Callable[[Path], list[Path]], names: Sequence[str], reference: Path
) -> list[str]:
    """Regenerate into a temp dir; the ``names`` in ``reference`` that differ or lack."""
    with tempfile.TemporaryDirectory(prefix="gen-") as tmp:
        generate(Path(tmp))
        return [
            name
            for name in names
            if not (reference / name).is_file()
            or not filecmp.cmp(Path(tmp) / name, reference / name, shallow=False)
        ]


def run(
    argv: list[str] | None,
    *,
    description: str,
    default_out: Path,
    out_help: str,
    generate: Callable[[Path], list[Path]],
    stale: Callable[[], list[str]],
    stale_message: str,
) -> int:
    parser = argparse.ArgumentParser(description=description)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--out", type=Path, default=default_out, help=out_help)
    group.add_argument(
        "--check", action="store_true", help="only report whether the checked-in files are stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        if bad:
            print(stale_message, file=sys.stderr)
            for name in bad:
                print(f"  {name}", file=sys.stderr)
            return 1
        return 0
    for path in generate(args.out):
        print(path)
    return 0

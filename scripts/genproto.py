#!/usr/bin/env python3
"""Regenerate the protobuf modules in framework/nri_framework/pb from proto/.

    python scripts/genproto.py               # rewrite the checked-in modules
    python scripts/genproto.py --out DIR     # generate into DIR/nri_framework/pb
    python scripts/genproto.py --check       # exit 1 if the checked-in modules are stale

Runs grpc_tools.protoc with ``-I proto``, so the generated modules import each
other as ``from nri_framework.pb import ...``. Only cri.proto and podresources.proto
(the kubelet's pod-resources API) get gRPC stubs: NRI speaks ttrpc, whose framing
lives in nri_framework itself.

Needs only the standard library and grpcio-tools. The output depends on the
grpcio-tools version (it embeds the protobuf gencode version), so pin it in
the tox environment that runs this script.
"""

from __future__ import annotations

import keyword
import re
import sys
from importlib import resources
from pathlib import Path

import _generator

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "framework"
PACKAGE = Path("nri_framework") / "pb"

# Protos compiled to messages only (+ .pyi), and protos that also get gRPC stubs.
MESSAGE_PROTOS = ("nri.proto", "ttrpc.proto")
GRPC_PROTOS = ("cri.proto", "podresources.proto")

INIT_TEXT = (
    '"""Generated protobuf modules (NRI API, ttrpc envelope, CRI subset, kubelet pod-resources).\n'
    "\n"
    "Do not edit: regenerate with `tox -e proto` (scripts/genproto.py) from proto/.\n"
    '"""\n'
)

# Every file this script owns in PACKAGE, relative to the output root.
GENERATED = tuple(
    str(PACKAGE / name)
    for name in (
        "__init__.py",
        "nri_pb2.py",
        "nri_pb2.pyi",
        "ttrpc_pb2.py",
        "ttrpc_pb2.pyi",
        "cri_pb2.py",
        "cri_pb2.pyi",
        "cri_pb2_grpc.py",
        "podresources_pb2.py",
        "podresources_pb2.pyi",
        "podresources_pb2_grpc.py",
    )
)


def _protoc(args: list[str]) -> None:
    # Imported late so --help works without grpcio-tools installed.
    from grpc_tools import protoc  # type: ignore[import-untyped,unused-ignore]

    well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    argv = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{well_known}", *args]
    rc = protoc.main(argv)
    if rc != 0:
        raise SystemExit(f"genproto: protoc failed ({rc}): {' '.join(argv[1:])}")


# protoc's .pyi generator copes with keyword field names (LinuxIOPriority.class)
# but not with keyword enum values (upstream's `Field.None`): it writes
# `None: Field`, which is a syntax error in a stub. Such names can only be
# reached with getattr()/Field.Value("None") anyway, so comment them out.
_KEYWORDS = "|".join(map(re.escape, keyword.kwlist))
_KEYWORD_DECL = re.compile(rf"^(?P<indent>\s*)(?P<decl>(?:{_KEYWORDS})\s*:.*)$", re.MULTILINE)


def _fix_pyi(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    fixed = _KEYWORD_DECL.sub(
        r"\g<indent># \g<decl>  # Python keyword: use getattr()/Value()", text
    )
    if fixed != text:
        path.write_text(fixed, encoding="utf-8")


def generate(out: Path) -> list[Path]:
    """Generate all modules into ``out``/nri_framework/pb; return their paths."""
    out = out.resolve()
    pkg = out / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)

    common = [f"--python_out={out}", f"--pyi_out={out}"]
    _protoc([*common, *(str(PACKAGE / p) for p in MESSAGE_PROTOS)])
    _protoc([*common, f"--grpc_python_out={out}", *(str(PACKAGE / p) for p in GRPC_PROTOS)])
    (pkg / "__init__.py").write_text(INIT_TEXT, encoding="utf-8")
    for pyi in sorted(pkg.glob("*.pyi")):
        _fix_pyi(pyi)

    paths = [out / rel for rel in GENERATED]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"genproto: protoc did not produce: {', '.join(missing)}")
    return paths


def stale(reference: Path = DEFAULT_OUT) -> list[str]:
    """Regenerate into a temp dir; return the files in ``reference`` that differ."""
    return _generator.stale_files(generate, GENERATED, reference)


def main(argv: list[str] | None = None) -> int:
    return _generator.run(
        argv,
        description=(__doc__ or "").splitlines()[0],
        default_out=DEFAULT_OUT,
        out_help="output root; modules go to OUT/nri_framework/pb (default: %(default)s)",
        generate=generate,
        stale=stale,
        stale_message="generated protobuf modules are stale: run tox -e proto",
    )


if __name__ == "__main__":
    sys.exit(main())

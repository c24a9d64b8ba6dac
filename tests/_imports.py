"""The import graph of our packages, read from the source (AST), nothing imported.

One home for the tests that check which module may import which: every
``import`` and ``from ... import`` counts, at module level, inside functions,
under ``if TYPE_CHECKING:`` alike; relative imports are resolved; importing
``a.b.c`` imports ``a`` and ``a.b`` too, and ``from a import b`` imports the
module ``a.b`` when there is one. An import inside ``try:`` whose handler
catches ``ImportError`` or ``ModuleNotFoundError`` is *optional* (the code
says what happens without it): :func:`closure` leaves those out when asked.

Stdlib only; the modules that use it put ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {
    "nri_framework": ROOT / "framework" / "nri_framework",
    "nri_balloons": ROOT / "policies" / "balloons" / "nri_balloons",
    "nri_balloons_demo": ROOT / "policies" / "balloons" / "nri_balloons_demo",
    "nri_sst": ROOT / "helpers" / "sst" / "nri_sst",
}
"""Our top-level packages and their source directories."""
GUARDS = frozenset({"ImportError", "ModuleNotFoundError"})


@dataclass(frozen=True)
class Import:
    """One import statement's module, where it is, and whether it is guarded."""

    module: str
    line: int
    optional: bool


def source_of(module: str) -> Path | None:
    """The file of one of our modules (``pkg/__init__.py`` for a package), or None."""
    top, *rest = module.split(".")
    base = SOURCES.get(top)
    if base is None:
        return None
    path = base.joinpath(*rest)
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    file = path.with_suffix(".py")
    return file if rest and file.is_file() else None


def modules_of(top: str) -> list[str]:
    """Every module of the package ``top`` (packages by their own name)."""
    base = SOURCES[top]
    out = []
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        out.append(".".join((top, *parts)).removesuffix(".__init__"))
    return out


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    for h in handlers:
        names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any(isinstance(n, ast.Name) and n.id in GUARDS for n in names):
            return True
    return False


def _statements(tree: ast.AST, optional: bool = False) -> Iterable[tuple[ast.stmt, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Try):
            inner = optional or _guarded(node.handlers)
            for stmt in node.body:
                yield from _one(stmt, inner)
            for part in (*node.handlers, *node.orelse, *node.finalbody):
                yield from _one(part, optional)
        else:
            yield from _one(node, optional)


def _one(node: ast.AST, optional: bool) -> Iterable[tuple[ast.stmt, bool]]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, optional
    elif isinstance(node, ast.Try):
        yield from _statements(ast.Module(body=[node], type_ignores=[]), optional)
    else:
        yield from _statements(node, optional)


def imports(module: str) -> list[Import]:
    """The modules ``module`` (one of ours) imports, as written and resolved."""
    path = source_of(module)
    if path is None:
        raise ValueError(f"{module}: not one of our modules")
    return imports_in(path, module)


def imports_in(path: Path, module: str) -> list[Import]:
    """The modules the file ``path``, the module named ``module``, imports (a
    ``from a import b`` counts ``a.b`` when that is one of our modules)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []
    for node, optional in _statements(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            assert isinstance(node, ast.ImportFrom)
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base]
            names += [f"{base}.{a.name}" for a in node.names if source_of(f"{base}.{a.name}")]
        for name in names:
            parts = name.split(".")
            for k in range(1, len(parts) + 1):
                out.append(Import(".".join(parts[:k]), node.lineno, optional))
    return out


def closure(starts: Iterable[str], *, optional: bool = True) -> dict[str, str]:
    """Every module of ours that importing ``starts`` can reach, each with the
    module that first imports it (``""`` for a start). ``optional=False``:
    guarded imports are not followed."""
    reached = {s: "" for s in starts}
    todo = list(reached)
    while todo:
        module = todo.pop()
        for imp in imports(module):
            if imp.optional and not optional:
                continue
            if imp.module not in reached and source_of(imp.module) is not None:
                reached[imp.module] = f"{module}:{imp.line}"
                todo.append(imp.module)
    return reached

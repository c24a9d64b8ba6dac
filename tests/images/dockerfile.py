"""Read a Dockerfile and its ``.dockerignore`` the way a builder does (enough for ours).

One home for what the image builder (:mod:`build`: which files go into an image's
cache key) and the tests (what the built image must show) read from ``docker/``:

* :func:`instructions` / :func:`stages`: the instructions, comments dropped and
  ``\\`` continuations joined, grouped per ``FROM`` stage;
* :func:`exec_form`, :func:`env_pairs`: ``ENTRYPOINT``/``CMD`` JSON arrays and
  ``ENV k=v ...`` as the image config holds them;
* :class:`IgnoreRules`: ``.dockerignore`` matching (moby's rules: a pattern
  excludes a path when it matches the path or one of its parent directories,
  ``**`` spans directories, ``!`` re-includes, the last matching rule wins).

Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path

KNOWN = frozenset(
    [
        "FROM",
        "RUN",
        "CMD",
        "LABEL",
        "EXPOSE",
        "ENV",
        "ADD",
        "COPY",
        "ENTRYPOINT",
        "VOLUME",
        "USER",
        "WORKDIR",
        "ARG",
        "ONBUILD",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "SHELL",
    ]
)

Instruction = tuple[str, str]


class DockerfileError(ValueError):
    """A Dockerfile this reader does not understand (named, with the reason)."""


def instructions(path: Path) -> list[Instruction]:
    """``(INSTRUCTION, arguments)`` per instruction; unknown instructions raise."""
    out: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not pending and not line):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        if word.upper() not in KNOWN:
            raise DockerfileError(f"{path.name}: unknown instruction {word!r}")
        out.append((word.upper(), rest.strip()))
    if pending:
        raise DockerfileError(f"{path.name}: dangling continuation")
    return out


def stages(path: Path) -> list[list[Instruction]]:
    """The instructions grouped per build stage (each list starts with its ``FROM``)."""
    result: list[list[Instruction]] = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            result.append([])
        if not result:
            raise DockerfileError(f"{path.name}: an instruction before FROM")
        result[-1].append(ins)
    return result


def exec_form(args: str) -> list[str]:
    """``["a", "b"]`` of an ``ENTRYPOINT``/``CMD`` (only the exec form is used here)."""
    value = json.loads(args)
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise DockerfileError(f"not an exec-form array: {args}")
    return value


def env_pairs(args: str) -> dict[str, str]:
    """``ENV a=1 b="2 3"`` as ``{"a": "1", "b": "2 3"}`` (the ``key=value`` form)."""
    out = {}
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        if not sep:
            raise DockerfileError(f"ENV without '=': {args}")
        out[key] = value
    return out


def copies(path: Path) -> list[tuple[list[str], str]]:
    """``(sources, destination)`` of every ``COPY``/``ADD`` of ``path`` that reads
    the build context (not ``--from``)."""
    out: list[tuple[list[str], str]] = []
    for ins, args in instructions(path):
        if ins not in ("COPY", "ADD"):
            continue
        words = shlex.split(args)
        if any(w.startswith("--from") for w in words):
            continue
        *sources, dest = [w for w in words if not w.startswith("--")]
        out.append((sources, dest))
    return out


def copy_sources(path: Path) -> list[str]:
    """The build-context paths every ``COPY``/``ADD`` of ``path`` reads (not ``--from``)."""
    return [src for sources, _ in copies(path) for src in sources]


def stage(dockerfile: Path, rules: IgnoreRules, context: Path, into: Path) -> list[Path]:
    """Lay out under ``into`` what the ``COPY`` instructions of ``dockerfile`` put
    in its ``WORKDIR`` (relative destinations only, as ours are): a directory's
    sent files below the destination, a file at ``dest`` or ``dest/name`` when
    ``dest`` ends with ``/``. The files written."""
    out: list[Path] = []
    for sources, dest in copies(dockerfile):
        if dest.startswith("/"):
            raise DockerfileError(f"{dockerfile.name}: absolute COPY destination {dest}")
        for src in sources:
            top = src.rstrip("/")
            for rel in rules.files(context, [src]):
                if (context / top).is_dir():
                    target = into / dest / rel.removeprefix(top + "/")
                else:
                    target = into / dest / Path(rel).name if dest.endswith("/") else into / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(context / rel, target)
                out.append(target)
    return out


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        out += "[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


class IgnoreRules:
    """The rules of one ``.dockerignore`` text."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
            self.rules.append((negate, _glob_regex(pattern)))

    def excluded(self, rel: str) -> bool:
        """Whether the context path ``rel`` (``a/b/c``) is left out of the context."""
        parts = rel.split("/")
        prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        out = False
        for negate, regex in self.rules:
            if any(regex.match(p) for p in prefixes):
                out = not negate
        return out

    def files(self, context: Path, sources: list[str]) -> list[str]:
        """The context files under ``sources`` that are sent (sorted, ``/``-separated)."""
        found: set[str] = set()
        for src in sources:
            top = context / src.rstrip("/")
            paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
            if not top.exists():
                raise DockerfileError(f"COPY source {src!r} is not in the context")
            for p in paths:
                rel = p.relative_to(context).as_posix()
                if not self.excluded(rel):
                    found.add(rel)
        return sorted(found)

"""The YAML text of a configuration, parsed within bounds, and
:func:`load_policy` (text -> ``BalloonsPolicy``).

The text may be hostile: nothing in it can make the loader recurse, allocate
or compute without bound. A document nested deeper than :data:`MAX_DEPTH`,
expanding (through aliases) to more than :data:`MAX_NODES` nodes, holding a
recursive alias, or taking longer than its time budget to parse is a
:class:`~nri_balloons.configdecode.ConfigSyntaxError` with the position; a
character YAML forbids (a NUL byte) too. The parsed document is decoded by
:mod:`nri_balloons.configdecode` into the structs of :mod:`nri_balloons.config`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import yaml

from nri_balloons.config import BalloonsPolicy
from nri_balloons.configdecode import ConfigSyntaxError, decode_policy

#: Nesting levels of a document (a real BalloonsPolicy uses about ten).
MAX_DEPTH = 64
#: Nodes of a text's documents, aliases expanded (a 4 MiB file holds fewer).
MAX_NODES = 1 << 20
# --- YAML text --------------------------------------------------------------------------


#: Seconds a text may take to parse (a 4 MiB file takes a few on a busy node).
PARSE_TIMEOUT = 10.0
#: Digits of an integer scalar (Python refuses to convert more than 4300).
MAX_INT_DIGITS = 80


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounds: its composer recurses once per
    nesting level, so depth is checked before each level; every 512 nodes it
    looks at the clock; integer scalars are refused before conversion when
    longer than :data:`MAX_INT_DIGITS`."""

    def __init__(self, text: str, timeout: float | None, clock: Callable[[], float]) -> None:
        self.timeout = timeout
        self.clock = clock
        self.deadline = None if timeout is None else clock() + timeout
        self.depth = 0
        self.composed = 0
        super().__init__(text)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        self.composed += 1
        if self.depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"document nested deeper than {MAX_DEPTH} levels", mark
            )
        if self.deadline is not None and self.composed % 512 == 0 and self.clock() > self.deadline:
            raise yaml.composer.ComposerError(
                None, None, f"document takes longer than {self.timeout:g}s to parse", mark
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"integer of more than {MAX_INT_DIGITS} digits", node.start_mark
            )
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: yaml.Node, budget: int) -> int:
    """Aliases share nodes: the document they expand to must stay within
    :data:`MAX_DEPTH` and ``budget`` nodes (a "billion laughs" text is small),
    and must not contain itself; returns its size. Iterative: the check must
    not recurse either."""
    size: dict[int, tuple[int, int]] = {}  # id -> (nodes, depth) once done
    open_: set[int] = set()  # on the current path
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            kids = [size[id(k)] for k in _children(node)]
            nodes = 1 + sum(n for n, _ in kids)
            depth = 1 + max((d for _, d in kids), default=0)
            if nodes > budget or depth > MAX_DEPTH:
                what = f"{MAX_NODES} nodes" if nodes > budget else f"{MAX_DEPTH} levels"
                raise yaml.composer.ComposerError(
                    None, None, f"aliases expand the document beyond {what}", node.start_mark
                )
            size[key] = (nodes, depth)
            continue
        if key in size:
            continue
        if key in open_:
            raise yaml.composer.ComposerError(
                None, None, "recursive alias: a node contains itself", node.start_mark
            )
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)
    return size[id(root)][0]


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character ``index``."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _yaml_error(source: str, exc: yaml.YAMLError, text: str) -> str:
    if isinstance(exc, yaml.reader.ReaderError):  # a forbidden character: no mark
        line, column = _position(text, exc.position)
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        return (
            f"{source}:{line}:{column}: invalid YAML: unacceptable character {char}: {exc.reason}"
        )
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    return f"{where}: invalid YAML: {context + ', ' if context else ''}{problem}"


def parse_yaml(
    text: str,
    *,
    source: str = "<config>",
    timeout: float | None = PARSE_TIMEOUT,
    clock: Callable[[], float] = time.monotonic,
) -> list[tuple[object, yaml.Node]]:
    """The non-empty documents of a YAML text with their composed nodes.

    Raises :class:`ConfigSyntaxError` for text that is not YAML or is beyond
    the bounds (depth, size, ``timeout`` seconds of ``clock``)."""
    docs: list[tuple[object, yaml.Node]] = []
    nodes = 0  # of every document: MAX_NODES is for the whole text
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text, timeout, clock)  # checks the characters
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            nodes += _check_expansion(node, MAX_NODES - nodes)
            doc = loader.construct_document(node)
            if doc is not None:
                docs.append((doc, node))
    except yaml.YAMLError as exc:
        raise ConfigSyntaxError([_yaml_error(source, exc, text)]) from None
    finally:
        if loader is not None:
            loader.dispose()
    return docs


def parse_policy(
    text: str, *, source: str = "<config>", timeout: float | None = PARSE_TIMEOUT
) -> tuple[object, yaml.Node]:
    """The one document of a YAML text holding a ``BalloonsPolicy`` (or spec),
    with its composed node."""
    docs = parse_yaml(text, source=source, timeout=timeout)
    if len(docs) != 1:
        raise ConfigSyntaxError([f"{source}: expected one YAML document, found {len(docs)}"])
    return docs[0]


def load_policy(
    text: str, *, source: str = "<config>", timeout: float | None = PARSE_TIMEOUT
) -> BalloonsPolicy:
    """Parse and decode a YAML text holding exactly one ``BalloonsPolicy`` (or spec)."""
    doc, node = parse_policy(text, source=source, timeout=timeout)
    return decode_policy(doc, source=source, node=node)

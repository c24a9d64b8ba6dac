"""Decoding a parsed document into a ``BalloonsPolicy`` (the structs of
:mod:`nri_balloons.config`), strictly, with every problem.

Decoding (:func:`~nri_balloons.configyaml.load_policy`, :func:`decode_policy`) is strict, like
upstream's ``--config-file`` (``yaml.UnmarshalStrict``): an unknown field is an
error, not silently dropped (the API server prunes unknown fields of a custom
resource, which hides an operator's typo until the policy misbehaves). The
document is walked against the schema first and *every* problem is reported,
each with ``SOURCE:LINE:COLUMN:`` and its field path:

* ``unknown field "spec.balloonTypes[0].maxCpus" (did you mean "maxCPUs"?)``
* ``spec.balloonTypes[0].minCPUs: expected int, got str``
* ``missing required field "spec.reservedResources"``
* ``spec.cpuClasses[0].maxFreq: invalid frequency "3GBz": ...``

YAML syntax errors raise :class:`ConfigSyntaxError` with the position.

Integers must fit Go's ``int`` (int64) and the counts of CPUs and
balloons lie in ``0..8192`` (``cpuset.MAX_IDS``), reported in the API server's
words with the position::

    x.yaml:4:14: spec.balloonTypes[0].minCPUs: Invalid value: -5:
    spec.balloonTypes[0].minCPUs in body should be greater than or equal to 0

The YAML text is parsed, within bounds, by :mod:`nri_balloons.configyaml`;
enumerations and ranges are checked afterwards by
:mod:`nri_balloons.validation`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import msgspec.inspect as mi
from nri_framework import cpuset

from nri_balloons.config import (
    API_VERSION,
    INT64_MAX,
    INT64_MIN,
    KIND,
    AmountKind,
    BalloonsPolicy,
    BalloonsPolicySpec,
    amount,
    cpuset_error,
)
from nri_balloons.frequency import Frequency, FrequencyError
from nri_balloons.gofmt import quote

if TYPE_CHECKING:
    import yaml

# --- decoding: YAML -> BalloonsPolicy, strictly, with every problem ---------------------


class ConfigError(ValueError):
    """A document that is not a valid ``BalloonsPolicy``; ``errors`` lists them all."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


class ConfigSyntaxError(ConfigError):
    """Text that is not YAML, or holds no document."""


Path = tuple[str | int, ...]


def format_path(path: Path) -> str:
    """``("spec", "balloonTypes", 0, "name")`` -> ``spec.balloonTypes[0].name``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


# --- the schema walk -------------------------------------------------------------------


class Problem(NamedTuple):
    path: Path
    message: str
    at_key: bool = False  # point at the key rather than the value


def _kind(obj: object) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "bool"
    if isinstance(obj, (int, float, str)):
        return type(obj).__name__
    if isinstance(obj, list):
        return "array"
    if isinstance(obj, dict):
        return "object"
    return type(obj).__name__


def _expected(info: mi.Type) -> str:
    if isinstance(info, mi.UnionType):
        return " | ".join(_expected(t) for t in info.types)
    if isinstance(info, mi.CustomType) and info.cls is Frequency:
        return "str | int"
    names: list[tuple[type[mi.Type], str]] = [
        (mi.StrType, "str"),
        (mi.IntType, "int"),
        (mi.BoolType, "bool"),
        (mi.FloatType, "float"),
        (mi.ListType, "array"),
        (mi.DictType, "object"),
        (mi.StructType, "object"),
        (mi.NoneType, "null"),
    ]
    return next((name for cls, name in names if isinstance(info, cls)), "value")


def _accepts(info: mi.Type, obj: object) -> bool:
    """Whether ``obj`` has the right shape for ``info`` (not looking inside)."""
    if isinstance(info, mi.AnyType):
        return True
    if isinstance(info, mi.UnionType):
        return any(_accepts(t, obj) for t in info.types)
    if isinstance(info, mi.CustomType):
        return isinstance(obj, (str, int, float)) and not isinstance(obj, bool)
    if isinstance(info, mi.NoneType):
        return obj is None
    if isinstance(info, mi.BoolType):
        return isinstance(obj, bool)
    if isinstance(info, mi.IntType):
        return isinstance(obj, int) and not isinstance(obj, bool)
    if isinstance(info, mi.FloatType):
        return isinstance(obj, (int, float)) and not isinstance(obj, bool)
    if isinstance(info, mi.StrType):
        return isinstance(obj, str)
    if isinstance(info, mi.ListType):
        return isinstance(obj, list)
    if isinstance(info, (mi.DictType, mi.StructType)):
        return isinstance(obj, dict)
    return True


def _unknown(path: Path, known: list[str]) -> Problem:
    import difflib  # only for a document with a typo: not on every start (~1-2 ms)

    name = str(path[-1])
    guess = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    guess = guess or [k for k in known if k.lower() == name.lower()]
    hint = f" (did you mean {quote(guess[0])}?)" if guess else ""
    return Problem(path, f"unknown field {quote(format_path(path))}{hint}", at_key=True)


def schema_problems(obj: object, info: mi.Type, path: Path = ()) -> Iterator[Problem]:
    """Every place where ``obj`` does not fit the msgspec schema ``info``."""
    if isinstance(info, mi.UnionType):
        fitting = [t for t in info.types if _accepts(t, obj)]
        if fitting:
            yield from schema_problems(obj, fitting[0], path)
            return
    if not _accepts(info, obj):
        where = f"{format_path(path)}: " if path else ""
        yield Problem(path, f"{where}expected {_expected(info)}, got {_kind(obj)}")
    elif isinstance(info, mi.StructType) and isinstance(obj, dict):
        fields = {f.encode_name: f for f in info.fields}
        for key, value in obj.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is None:
                yield _unknown((*path, str(key)), sorted(fields))
            else:
                yield from schema_problems(value, field.type, (*path, key))
        for field in info.fields:
            if field.required and field.encode_name not in obj:
                full = format_path((*path, field.encode_name))
                yield Problem(path, f"missing required field {quote(full)}")
    elif isinstance(info, mi.ListType) and isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from schema_problems(item, info.item_type, (*path, i))
    elif isinstance(info, mi.DictType) and isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                yield Problem((*path, key), f"{format_path(path)}: key {key!r} is not a string")
            else:
                yield from schema_problems(value, info.value_type, (*path, key))
    elif isinstance(info, mi.IntType) and isinstance(obj, int):
        yield from _int_problems(obj, info, path)
    elif isinstance(info, mi.CustomType) and info.cls is Frequency:
        try:
            Frequency.from_json(obj)
        except FrequencyError as exc:
            yield Problem(path, f"{format_path(path)}: {exc}")


def _int_problems(value: int, info: mi.IntType, path: Path) -> Iterator[Problem]:
    """An integer outside its field's bounds, or Go's int64, in the API server's words."""
    at = format_path(path)
    shown = str(value) if value.bit_length() < 256 else f"{str(value)[:20]}... (too large)"
    invalid = f"{at}: Invalid value: {shown}: {at} in body"
    if info.le is not None and value > info.le:
        yield Problem(path, f"{invalid} should be less than or equal to {info.le}")
    elif info.ge is not None and value < info.ge:
        yield Problem(path, f"{invalid} should be greater than or equal to {info.ge}")
    elif not INT64_MIN <= value <= INT64_MAX:
        yield Problem(path, f"{invalid} must be of type int64")


# --- positions ------------------------------------------------------------------------


def _locate(node: yaml.Node | None, path: Path, *, at_key: bool) -> tuple[int, int] | None:
    """1-based line and column of ``path`` in a composed YAML tree (of its key
    when ``at_key``), or of the deepest ancestor found."""
    if node is None:
        return None
    import yaml  # a node is there: the text was parsed, PyYAML is loaded

    at: yaml.Node = node
    for i, part in enumerate(path):
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if pair is None:
                break
            at = pair[0] if at_key and i == len(path) - 1 else pair[1]
            node = pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            at = node = node.value[part]
        else:
            break
    return at.start_mark.line + 1, at.start_mark.column + 1


def _amount_problems(spec: object, path: Path) -> Iterator[Problem]:
    """``cpuset:`` amounts of ``reservedResources``/``availableResources`` that
    do not parse, CPU ids out of range included: reported while the positions
    are known, in upstream's words."""
    if not isinstance(spec, dict):
        return
    for key, what in (("reservedResources", "reserved"), ("availableResources", "available")):
        resources = spec.get(key)
        value = resources.get("cpu") if isinstance(resources, dict) else None
        if not isinstance(value, str):
            continue
        amt, kind = amount({"cpu": value})
        if kind in (AmountKind.CPUSET, AmountKind.EXCLUDE_CPUSET):
            try:
                cpuset.parse(amt)
            except cpuset.CpusetError as exc:
                yield Problem((*path, key, "cpu"), cpuset_error(amt, what, exc))


def _plain(doc: object) -> bool:
    """Every mapping key of ``doc`` is a string and every integer an int64, as
    :func:`schema_problems` wants them (msgspec takes integers up to uint64,
    and any key where a field holds any value). Iterative: a document may
    nest deeper than the interpreter's stack there."""
    stack = [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            if not all(isinstance(k, str) for k in obj):
                return False
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
        elif isinstance(obj, int) and not INT64_MIN <= obj <= INT64_MAX:
            return False
    return True


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is Frequency:
        try:
            return Frequency.from_json(obj)
        except FrequencyError as exc:
            raise ValueError(str(exc)) from None
    raise NotImplementedError(f"cannot decode {tp}")


def _is_resource(doc: dict[Any, Any]) -> bool:
    return any(k in doc for k in ("apiVersion", "kind", "metadata", "spec"))


def decode_policy(
    doc: object, *, source: str = "", node: yaml.Node | None = None
) -> BalloonsPolicy:
    """A parsed document (a ``BalloonsPolicy`` or just its spec) as a
    :class:`BalloonsPolicy`; :class:`ConfigError` lists every problem.
    ``node``, the composed YAML of the same document, adds positions."""

    def where(problem: Problem) -> str:
        pos = _locate(node, problem.path, at_key=problem.at_key)
        prefix = f"{source}:{pos[0]}:{pos[1]}: " if pos else f"{source}: " if source else ""
        return prefix + problem.message

    if not isinstance(doc, dict):
        raise ConfigError([where(Problem((), "document is not a mapping"))])
    problems: list[Problem] = []
    target: type[BalloonsPolicy | BalloonsPolicySpec] = BalloonsPolicySpec
    if _is_resource(doc):
        target = BalloonsPolicy
        for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
            if key in doc and doc[key] != want:
                problems.append(Problem((key,), f"{key} {quote(str(doc[key]))} is not {want}"))
    amounts = list(
        _amount_problems(doc.get("spec"), ("spec",))
        if target is BalloonsPolicy
        else _amount_problems(doc, ())
    )
    decoded: BalloonsPolicy | BalloonsPolicySpec | None = None
    error = "document does not decode"
    if not problems and not amounts:
        try:
            decoded = msgspec.convert(doc, target, dec_hook=_dec_hook)
        except msgspec.ValidationError as exc:
            error = str(exc)
    if decoded is None or not _plain(doc):
        # the walk finds every problem, where msgspec stops at the first; for
        # a document msgspec takes (every struct forbids unknown fields) whose
        # keys are strings and integers int64 (the walk's rules msgspec lacks)
        # it finds none, and is not run: msgspec.inspect's schema of the
        # policy and the walk are ~4 ms of every start
        problems.extend(schema_problems(doc, mi.type_info(target)))
        problems.extend(amounts)
        if not problems and decoded is None:  # the walk missed what msgspec found
            problems.append(Problem((), error))
        if problems:
            raise ConfigError([where(p) for p in problems])
    if isinstance(decoded, BalloonsPolicySpec):
        return BalloonsPolicy(spec=decoded)
    assert isinstance(decoded, BalloonsPolicy)
    return decoded

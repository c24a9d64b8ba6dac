"""Container match expressions ``{key, operator, values}`` (upstream ``resmgr.Expression``).

Used by ``balloonTypes[].matchExpressions`` and ``preserve.matchExpressions``,
and for ``groupBy`` substitution (:func:`expand`).

Keys, evaluated against a container and its pod:

* ``name``, ``namespace``, ``qosclass``, ``labels/<key>``, ``tags/<key>``, ``id``;
* ``pod/name``, ``pod/namespace``, ``pod/qosclass``, ``pod/labels/<key>``,
  ``pod/id``, ``pod/uid``;
* joint keys ``:<ksep><vsep>key1<ksep>key2...`` (or ``:key1:key2``): the
  values of the keys joined by ``vsep``; present if any key is present.

Operators: ``Equals``, ``NotEqual``, ``In``, ``NotIn``, ``Exists``,
``NotExist`` (``NotExists``, the name upstream's documentation uses, is
accepted too), ``AlwaysTrue``, ``Matches``, ``MatchesNot``, ``MatchesAny``,
``MatchesNone``. ``Matches*`` use Go's ``filepath.Match`` globs
(:mod:`nri_balloons.globmatch`); ``*`` as an ``Equals``/``In`` value matches
any present value.

Differences from upstream: ``pod/qosclass`` resolves (upstream's pod returns a
non-string type there, so the key is never found), and evaluating an
expression that failed validation answers ``False`` instead of panicking.
"""

from __future__ import annotations

import enum
import logging
import posixpath
from collections.abc import Mapping

import msgspec
from nri_framework.model import Container, Pod

from nri_balloons.containers import qos_class
from nri_balloons.globmatch import go_match
from nri_balloons.gofmt import quote

log = logging.getLogger("expression")


class Operator(enum.StrEnum):
    EQUALS = "Equals"
    NOT_EQUAL = "NotEqual"
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    NOT_EXIST = "NotExist"
    ALWAYS_TRUE = "AlwaysTrue"
    MATCHES = "Matches"
    MATCHES_NOT = "MatchesNot"
    MATCHES_ANY = "MatchesAny"
    MATCHES_NONE = "MatchesNone"


OPERATOR_ALIASES = {"NotExists": Operator.NOT_EXIST}

KEY_POD = "pod"
KEY_ID = "id"
KEY_UID = "uid"
KEY_NAME = "name"
KEY_NAMESPACE = "namespace"
KEY_QOSCLASS = "qosclass"
KEY_LABELS = "labels"
KEY_TAGS = "tags"

_SINGLE_VALUE = {Operator.EQUALS, Operator.NOT_EQUAL, Operator.MATCHES, Operator.MATCHES_NOT}
_NO_VALUES = {Operator.EXISTS, Operator.NOT_EXIST, Operator.ALWAYS_TRUE}


class ExpressionError(ValueError):
    """An invalid expression or substitution; the text is upstream's."""


def _error(text: str) -> ExpressionError:
    return ExpressionError("expression: " + text)


# --- evaluation subjects ---------------------------------------------------------


_MISSING = object()


class Subject(msgspec.Struct, frozen=True):
    """What an expression is evaluated against: a container, its pod, its tags."""

    container: Container
    pod: Pod | None = None
    tags: Mapping[str, str] = msgspec.field(default_factory=dict)

    def eval_key(self, key: str) -> object:
        c, pod = self.container, self.pod
        if key == KEY_POD:
            return _PodScope(pod, c) if pod is not None else _MISSING
        if key == KEY_NAME:
            return c.name
        if key == KEY_NAMESPACE:
            return pod.namespace if pod is not None else ""
        if key == KEY_QOSCLASS:
            return str(qos_class(pod, c))
        if key == KEY_LABELS:
            return c.labels
        if key == KEY_TAGS:
            return self.tags
        if key == KEY_ID:
            return c.id
        return _MISSING

    def key_value(self, key: str) -> tuple[str, bool]:
        """Upstream ``KeyValue``: the value of a (possibly joint) key and whether
        it was found."""
        keys, vsep = split_keys(key)
        if len(keys) == 1:
            return resolve_ref(self, keys[0])
        values: list[str] = []
        found = False
        for k in keys:
            v, ok = resolve_ref(self, k)
            values.append(v)
            found = found or ok
        return vsep.join(values), found

    def __str__(self) -> str:
        pod = f"{self.pod.namespace}/{self.pod.name}/" if self.pod else ""
        return pod + self.container.name


class _PodScope(msgspec.Struct, frozen=True):
    pod: Pod
    container: Container

    def eval_key(self, key: str) -> object:
        p = self.pod
        if key == KEY_NAME:
            return p.name
        if key == KEY_NAMESPACE:
            return p.namespace
        if key == KEY_QOSCLASS:
            return str(qos_class(p, self.container))
        if key == KEY_LABELS:
            return p.labels
        if key == KEY_ID:
            return p.id
        if key == KEY_UID:
            return p.uid
        return _MISSING


def _go_clean(path: str) -> str:
    """Go's ``path.Clean``."""
    cleaned = posixpath.normpath(path)
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned


def resolve_ref(subject: Subject, spec: str) -> tuple[str, bool]:
    """Upstream ``ResolveRef``: walk ``pod/labels/app`` through the subject."""
    key = _go_clean(spec)
    obj: object = subject
    while True:
        if isinstance(obj, (Subject, _PodScope)):
            pref, _, key = key.partition("/")
            obj = obj.eval_key(pref)
        elif isinstance(obj, Mapping):
            obj = obj.get(key, _MISSING)
            key = ""
        else:
            return "", False
        if obj is _MISSING:
            return "", False
        if key == "":
            break
    return (obj, True) if isinstance(obj, str) else ("", False)


def _valid_separator(ch: str) -> bool:
    return not (ch.isascii() and (ch.isalnum() or ch in "/."))


def split_keys(keys: str) -> tuple[list[str], str]:
    """Split a joint key ``:<ksep><vsep>k1<ksep>k2`` into keys and the value separator."""
    if len(keys) < 4 or keys[0] != ":":
        return [keys], ""
    keys = keys[1:]
    ksep, vsep = keys[0], keys[1]
    if _valid_separator(ksep) and _valid_separator(vsep):
        keys = keys[2:]
    else:
        ksep = vsep = ":"
    return keys.split(ksep), vsep


# --- the expression ----------------------------------------------------------------


class Expression(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """``{key, operator, values}``. A missing key or operator decodes as ``""``
    so that :meth:`validate` reports it with upstream's message."""

    key: str = ""
    operator: str = ""
    values: list[str] = []

    def __post_init__(self) -> None:
        alias = OPERATOR_ALIASES.get(self.operator)
        if alias is not None:
            self.operator = str(alias)

    def validate(self) -> None:
        """Raise :class:`ExpressionError` with upstream's text if invalid."""
        self._validate_key()
        try:
            op = Operator(self.operator)
        except ValueError:
            raise _error(f"invalid expression, unknown operator: {quote(self.operator)}") from None
        if op in _SINGLE_VALUE and len(self.values) != 1:
            raise _error(f"invalid expression, '{op}' requires a single value")
        if op in _NO_VALUES and self.values:
            raise _error(f"invalid expression, '{op}' does not take any values")

    def _validate_key(self) -> None:
        keys, _ = split_keys(self.key)
        for key in keys:
            key = key.lstrip("/")
            while True:
                pref, _, rest = key.partition("/")
                if pref in (KEY_ID, KEY_UID, KEY_NAME, KEY_NAMESPACE, KEY_QOSCLASS):
                    if rest:
                        raise _error(
                            f"invalid expression, trailing key {quote(rest)} after {quote(pref)}"
                        )
                elif pref == KEY_POD:
                    if not rest:
                        raise _error(
                            f"invalid expression, missing trailing pod key after {quote(pref)}"
                        )
                elif pref in (KEY_LABELS, KEY_TAGS):
                    if not rest:
                        raise _error(
                            f"invalid expression, missing trailing map key after {quote(pref)}"
                        )
                    break  # the rest is a map key
                else:
                    raise _error(f"invalid expression, unknown key {quote(pref)}")
                if not rest:
                    break
                key = rest

    def evaluate(
        self, container: Container, pod: Pod | None = None, *, tags: Mapping[str, str] | None = None
    ) -> bool:
        """Whether the container (of the pod) satisfies the expression."""
        return self.evaluate_subject(Subject(container, pod, tags or {}))

    def evaluate_subject(self, subject: Subject) -> bool:
        result = self._evaluate(subject)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s @ %s => %s", self, subject, result)
        return result

    def _evaluate(self, subject: Subject) -> bool:
        op = self.operator
        if op == Operator.ALWAYS_TRUE:
            return True
        value, ok = subject.key_value(self.key)
        first = self.values[0] if self.values else None
        if op == Operator.EQUALS:
            return ok and first is not None and (value == first or first == "*")
        if op == Operator.NOT_EQUAL:
            return not ok or value != first
        if op in (Operator.MATCHES, Operator.MATCHES_NOT):
            match = ok and first is not None and go_match(first, value)
            return match if op == Operator.MATCHES else not match
        if op in (Operator.IN, Operator.NOT_IN):
            member = ok and any(value == v or v == "*" for v in self.values)
            return member if op == Operator.IN else not member
        if op in (Operator.MATCHES_ANY, Operator.MATCHES_NONE):
            match = ok and any(go_match(p, value) for p in self.values)
            return match if op == Operator.MATCHES_ANY else not match
        if op == Operator.EXISTS:
            return ok
        if op == Operator.NOT_EXIST:
            return not ok
        return False

    def __str__(self) -> str:
        return f"<{self.key} {self.operator} {','.join(self.values)}>"


# --- substitution (groupBy) --------------------------------------------------------


def expand(src: str, subject: Subject, must_resolve: bool) -> str:
    """Upstream ``Expand``: replace ``${key}`` and ``$key`` references in ``src``
    with their values (``$$`` is a literal ``$``). An unresolvable key is an
    error when ``must_resolve``, otherwise it expands to ``""``."""
    result: list[str] = []
    key: list[str] | None = None  # collecting a reference when not None
    curly = False

    def substitute(ref: str) -> None:
        val, ok = subject.key_value(ref)
        if not ok and must_resolve:
            raise ExpressionError(
                f"invalid substitution {quote(src)}, unresolvable key {quote(ref)}"
            )
        result.append(val)

    for i, ch in enumerate(src):
        if key is None:
            if ch == "$":
                key = []
            else:
                result.append(ch)
            continue
        if ch == "$":
            if curly:
                raise ExpressionError(
                    f"invalid substitution {quote(src)}, unterminated '}}' (at {quote(src[i:])})"
                )
            if not key:
                result.append("$")
                key = None
                continue
            substitute("".join(key))
            key = []
        elif ch == "{":
            if curly or key:
                raise ExpressionError(
                    f"invalid substitution {quote(src)}, unexpected '{{' (at {quote(src[i:])})"
                )
            curly = True
        elif ch == "}":
            if not curly or not key:
                raise ExpressionError(
                    f"invalid substitution {quote(src)}, unexpected '}}' (at {quote(src[i:])})"
                )
            substitute("".join(key))
            curly = False
            key = None
        else:
            key.append(ch)
    if key is not None:
        if curly or not key:
            raise ExpressionError(f"invalid substitution {quote(src)}, unterminated reference")
        substitute("".join(key))
    return "".join(result)

"""Expressions, Go globs and the QoS class: upstream's semantics and error texts."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nri_balloons.configyaml import load_policy
from nri_balloons.containers import QOSClass, qos_class
from nri_balloons.expression import (
    Expression,
    ExpressionError,
    Subject,
    expand,
    split_keys,
)
from nri_balloons.globmatch import GlobError, check_pattern, go_match
from nri_balloons.validation import validate
from nri_framework.model import Container, CpuResources, MemoryResources, Pod, Resources
from nri_framework.simulate.podspec import pods_from_yaml

POD = Pod(
    id="sandbox-1",
    name="web-0",
    uid="0f1e-uid",
    namespace="shop",
    labels={"app.kubernetes.io/component": "frontend", "tier": "gold"},
    cgroup_parent="/kubepods/burstable/pod0f1e-uid",
)
CTR = Container(
    id="ctr-1",
    pod_sandbox_id="sandbox-1",
    name="nginx",
    labels={"io.kubernetes.container.name": "nginx"},
)
TAGS = {"role": "db"}


def ev(key: str, op: str, *values: str, pod: Pod | None = POD) -> bool:
    return Expression(key=key, operator=op, values=list(values)).evaluate(CTR, pod, tags=TAGS)


# --- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "op", "values", "message"),
    [
        ("name", "Equals", ["a", "b"], "'Equals' requires a single value"),
        ("name", "NotEqual", [], "'NotEqual' requires a single value"),
        ("name", "Matches", [], "'Matches' requires a single value"),
        ("name", "MatchesNot", ["a", "b"], "'MatchesNot' requires a single value"),
        ("name", "Exists", ["x"], "'Exists' does not take any values"),
        ("name", "NotExist", ["x"], "'NotExist' does not take any values"),
        ("name", "AlwaysTrue", ["x"], "'AlwaysTrue' does not take any values"),
        ("name", "Like", [], 'unknown operator: "Like"'),
        ("name", "", [], 'unknown operator: ""'),
        ("foo", "Exists", [], 'unknown key "foo"'),
        ("", "Exists", [], 'unknown key ""'),
        ("pod/bar", "Exists", [], 'unknown key "bar"'),
        ("name/x", "Exists", [], 'trailing key "x" after "name"'),
        ("pod/uid/y", "Exists", [], 'trailing key "y" after "uid"'),
        ("pod", "Exists", [], 'missing trailing pod key after "pod"'),
        ("labels", "Exists", [], 'missing trailing map key after "labels"'),
        ("pod/tags", "Exists", [], 'missing trailing map key after "tags"'),
        (":,-name,nope", "Exists", [], 'unknown key "nope"'),
    ],
)  # fmt: skip
def test_validation_messages(key: str, op: str, values: list[str], message: str) -> None:
    """``message`` follows upstream's ``expression: invalid expression, `` prefix."""
    with pytest.raises(ExpressionError) as exc:
        Expression(key=key, operator=op, values=values).validate()
    assert str(exc.value) == "expression: invalid expression, " + message


@pytest.mark.parametrize(
    ("key", "op", "values"),
    [
        ("name", "Equals", ["a"]),
        ("pod/labels/app.kubernetes.io/component", "In", ["a", "b"]),
        ("labels/x", "NotIn", []),
        ("tags/role", "MatchesAny", ["d*"]),
        ("/namespace", "Exists", []),
        (":,-pod/qosclass,pod/namespace,pod/name,name", "Equals", ["x"]),
        ("pod/uid", "NotExist", []),
        ("qosclass", "AlwaysTrue", []),
    ],
)
def test_valid_expressions(key: str, op: str, values: list[str]) -> None:
    Expression(key=key, operator=op, values=values).validate()


def test_not_exists_is_accepted_as_not_exist() -> None:
    expr = Expression(key="labels/none", operator="NotExists")
    expr.validate()
    assert expr.operator == "NotExist"
    assert expr.evaluate(CTR, POD)
    policy = load_policy(
        "reservedResources: {cpu: '1'}\n"
        "preserve:\n  matchExpressions:\n  - {key: pod/labels/keep, operator: NotExists}\n"
    )
    assert validate(policy, online_cpus=0xFF).errors == []


def test_expression_errors_from_yaml_are_reported_verbatim_and_all() -> None:
    policy = load_policy(
        """
reservedResources: {cpu: "1"}
preserve:
  matchExpressions:
  - {key: name, operator: Equals, values: [a, b]}
balloonTypes:
- name: a
  matchExpressions:
  - {key: pod/label/x, operator: Exists}
  - {key: name, operator: Exists, values: [x]}
  - {key: namespace, operator: Contains, values: [x]}
  - {key: pod, operator: Exists}
  - {key: labels, operator: Exists}
  - {key: qosclass/x, operator: Exists}
"""
    )
    assert validate(policy, online_cpus=0xFF).errors == [
        "expression: invalid expression, 'Equals' requires a single value",
        'expression: invalid expression, unknown key "label"',
        "expression: invalid expression, 'Exists' does not take any values",
        'expression: invalid expression, unknown operator: "Contains"',
        'expression: invalid expression, missing trailing pod key after "pod"',
        'expression: invalid expression, missing trailing map key after "labels"',
        'expression: invalid expression, trailing key "x" after "qosclass"',
    ]


# --- evaluation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("name", "nginx"),
        ("namespace", "shop"),
        ("qosclass", "Burstable"),
        ("id", "ctr-1"),
        ("labels/io.kubernetes.container.name", "nginx"),
        ("tags/role", "db"),
        ("pod/name", "web-0"),
        ("pod/namespace", "shop"),
        ("pod/qosclass", "Burstable"),
        ("pod/id", "sandbox-1"),
        ("pod/uid", "0f1e-uid"),
        ("pod/labels/app.kubernetes.io/component", "frontend"),
        ("pod//labels/tier", "gold"),  # path.Clean
        (":,-pod/name,name", "web-0-nginx"),
        (":|+pod/namespace|name", "shop+nginx"),
        (":pod/name:name", "web-0:nginx"),
        (":,-name,labels/missing", "nginx-"),
    ],
)
def test_key_values(key: str, value: str) -> None:
    assert Subject(CTR, POD, TAGS).key_value(key) == (value, True)
    assert ev(key, "Equals", value)
    assert ev(key, "Exists")


@pytest.mark.parametrize(
    "key",
    [
        "uid",  # containers have no uid
        "labels/missing",
        "tags/missing",
        "pod/labels/missing",
        "pod/tags/role",
        "labels",
        "name/x",
        "nosuch",
        ":,-labels/a,labels/b",
    ],
)
def test_missing_keys(key: str) -> None:
    assert Subject(CTR, POD, TAGS).key_value(key)[1] is False
    assert ev(key, "NotExist")
    assert not ev(key, "Exists")


def test_pod_keys_without_a_pod() -> None:
    assert not ev("pod/name", "Exists", pod=None)
    assert ev("namespace", "Equals", "", pod=None)


@pytest.mark.parametrize(
    ("key", "op", "values", "result"),
    [
        ("name", "Equals", ["nginx"], True),
        ("name", "Equals", ["*"], True),
        ("labels/missing", "Equals", ["*"], False),
        ("name", "NotEqual", ["nginx"], False),
        ("name", "NotEqual", ["x"], True),
        ("labels/missing", "NotEqual", ["x"], True),
        ("name", "In", ["a", "nginx"], True),
        ("name", "In", ["*"], True),
        ("name", "In", ["a"], False),
        ("labels/missing", "In", ["*"], False),
        ("name", "NotIn", ["a"], True),
        ("name", "NotIn", ["nginx"], False),
        ("labels/missing", "NotIn", ["x"], True),
        ("name", "Matches", ["ng*"], True),
        ("name", "Matches", ["ng?n[a-z]"], True),
        ("name", "Matches", ["[^n]*"], False),
        ("name", "Matches", ["["], False),  # bad pattern: no match
        ("labels/missing", "Matches", ["*"], False),
        ("name", "MatchesNot", ["ng*"], False),
        ("labels/missing", "MatchesNot", ["*"], True),
        ("pod/labels/app.kubernetes.io/component", "MatchesAny", ["back*", "front*"], True),
        ("pod/labels/app.kubernetes.io/component", "MatchesAny", ["back*"], False),
        ("pod/labels/app.kubernetes.io/component", "MatchesNone", ["back*"], True),
        ("labels/missing", "MatchesNone", ["*"], True),
        ("labels/missing", "AlwaysTrue", [], True),
        ("name", "Bogus", [], False),
        ("name", "Equals", [], False),  # invalid, but no crash
    ],
)
def test_operators(key: str, op: str, values: list[str], result: bool) -> None:
    assert ev(key, op, *values) is result


def test_str_like_upstream() -> None:
    assert str(Expression(key="name", operator="In", values=["a", "b"])) == "<name In a,b>"
    assert str(Expression(key="name", operator="Exists")) == "<name Exists >"


def test_split_keys() -> None:
    assert split_keys("name") == (["name"], "")
    assert split_keys(":,-a,b") == (["a", "b"], "-")
    assert split_keys(":a:b") == (["a", "b"], ":")
    assert split_keys(":ab") == ([":ab"], "")


# --- groupBy expansion -----------------------------------------------------------------


def test_expand() -> None:
    s = Subject(CTR, POD, TAGS)
    assert expand("${pod/namespace}-${pod/labels/tier}", s, True) == "shop-gold"
    assert expand("ns=$pod/namespace", s, True) == "ns=shop"
    assert expand("cost: $$5", s, True) == "cost: $5"
    assert expand("x${labels/missing}y", s, False) == "xy"


@pytest.mark.parametrize(
    ("src", "message"),
    [
        ("x${labels/missing}",
         'invalid substitution "x${labels/missing}", unresolvable key "labels/missing"'),
        ("${name", 'invalid substitution "${name", unterminated reference'),
        ("$", 'invalid substitution "$", unterminated reference'),
        ("${na$me}", "invalid substitution \"${na$me}\", unterminated '}' (at \"$me}\")"),
        ("$a{b}", "invalid substitution \"$a{b}\", unexpected '{' (at \"{b}\")"),
        ("${}", "invalid substitution \"${}\", unexpected '}' (at \"}\")"),
    ],
)  # fmt: skip
def test_expand_errors(src: str, message: str) -> None:
    with pytest.raises(ExpressionError) as exc:
        expand(src, Subject(CTR, POD, TAGS), True)
    assert str(exc.value) == message


# --- Go globs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "name", "match"),
    [
        ("*", "kube-system", True),
        ("*", "a/b", False),  # no separator crossing
        ("a/*", "a/b", True),
        ("*/b", "a/b", True),
        ("a?b", "a/b", False),
        ("a[/]b", "a/b", True),  # classes may match '/'
        ("a[^x]b", "a/b", True),
        ("monitor-*", "monitor-eu", True),
        ("*-log*", "app-logs", True),
        ("[a-c]x", "bx", True),
        ("[^a-c]x", "bx", False),
        ("[!a]x", "!x", True),  # '!' is no negation in Go
        ("\\*", "*", True),
        ("\\*", "a", False),
        ("[\\]]", "]", True),
        ("[c-a]", "b", False),  # inverted range never matches
        ("[^c-a]", "b", True),
        ("ab", "abc", False),
        ("", "", True),
    ],
)
def test_go_glob_semantics(pattern: str, name: str, match: bool) -> None:
    assert go_match(pattern, name) is match


@pytest.mark.parametrize(
    "pattern", ["[", "[]", "[a", "[a-]", "[-a]", "[]a]", "a\\", "[^]", "x[a-b-c]"]
)
def test_bad_patterns(pattern: str) -> None:
    with pytest.raises(GlobError, match="syntax error in pattern"):
        check_pattern(pattern)
    assert not go_match(pattern, "a")


_CHARS = "abc"


@st.composite
def glob_patterns(draw: st.DrawFn) -> tuple[str, str]:
    """A Go glob without '/' and its fnmatch spelling ('^' negation -> '!')."""
    go, fn = [], []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["lit", "lit", "star", "any", "class"]))
        if kind == "lit":
            ch = draw(st.sampled_from(_CHARS + "-!^]"))
            go.append(ch if ch != "]" else "\\]")
            fn.append(ch if ch != "]" else "[]]")
        elif kind == "star":
            go.append("*")
            fn.append("*")
        elif kind == "any":
            go.append("?")
            fn.append("?")
        else:
            neg = draw(st.booleans())
            items = draw(
                st.lists(
                    st.tuples(st.sampled_from(_CHARS), st.none() | st.sampled_from(_CHARS)),
                    min_size=1,
                    max_size=3,
                )
            )
            body = "".join(lo if hi is None else f"{lo}-{hi}" for lo, hi in items)
            go.append(f"[{'^' if neg else ''}{body}]")
            fn.append(f"[{'!' if neg else ''}{body}]")
    return "".join(go), "".join(fn)


@settings(max_examples=500)
@given(glob_patterns(), st.text(alphabet=_CHARS + "-!^]", max_size=6))
def test_glob_agrees_with_fnmatch_without_separators(pat: tuple[str, str], name: str) -> None:
    go_pattern, fn_pattern = pat
    assert go_match(go_pattern, name) == fnmatch.fnmatchcase(name, fn_pattern)


# --- robustness ----------------------------------------------------------------------

_KEY_PARTS = ["pod", "labels", "tags", "name", "namespace", "qosclass", "id", "uid", "x", ""]


@st.composite
def keys(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return draw(st.text(alphabet=":/.,-ab", max_size=12))
    parts = draw(st.lists(st.sampled_from(_KEY_PARTS), max_size=4))
    key = "/".join(parts)
    return draw(st.sampled_from(["", ":", ":,-", "::"])) + key


@given(
    keys(),
    st.sampled_from(
        ["Equals", "NotEqual", "In", "NotIn", "Exists", "NotExist", "NotExists", "AlwaysTrue",
         "Matches", "MatchesNot", "MatchesAny", "MatchesNone", "", "Bogus"]
    ),
    st.lists(st.text(alphabet="*?[]^-\\/ab", max_size=5), max_size=3),
    st.booleans(),
)  # fmt: skip
def test_expressions_never_crash(key: str, op: str, values: list[str], with_pod: bool) -> None:
    expr = Expression(key=key, operator=op, values=values)
    try:
        expr.validate()
    except ExpressionError as exc:
        assert str(exc).startswith("expression: invalid expression, ")
    assert isinstance(expr.evaluate(CTR, POD if with_pod else None, tags=TAGS), bool)
    assert str(expr).startswith("<")


# --- QoS class ----------------------------------------------------------------------

_PODS = """
apiVersion: v1
kind: Pod
metadata: {name: g}
spec:
  containers:
  - name: c
    resources: {limits: {cpu: "2", memory: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: b}
spec:
  containers:
  - name: c
    resources: {requests: {cpu: 500m}, limits: {cpu: "1"}}
---
apiVersion: v1
kind: Pod
metadata: {name: b2}
spec:
  containers:
  - name: c
    resources: {requests: {cpu: "1", memory: 1Gi}, limits: {cpu: "2", memory: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: be}
spec:
  containers:
  - name: c
"""


@pytest.mark.parametrize("sim", pods_from_yaml(_PODS), ids=lambda s: s.pod.name)
def test_qos_class_from_cgroup_parent_and_from_resources(sim: object) -> None:
    from nri_framework.simulate.podspec import SimPod

    assert isinstance(sim, SimPod)
    ctr = sim.containers[0]
    assert qos_class(sim.pod, ctr) == sim.qos
    no_parent = Pod(id=sim.pod.id, name=sim.pod.name, namespace=sim.pod.namespace)
    assert qos_class(no_parent, ctr) == sim.qos
    assert Expression(key="pod/qosclass", operator="Equals", values=[str(sim.qos)]).evaluate(
        ctr, sim.pod
    )


@pytest.mark.parametrize(
    ("parent", "qos"),
    [
        ("/kubepods/besteffort/pod1", QOSClass.BEST_EFFORT),
        ("/kubepods/burstable/pod1", QOSClass.BURSTABLE),
        ("/kubepods/pod1", QOSClass.GUARANTEED),
        ("kubepods-burstable-pod1.slice", QOSClass.BURSTABLE),
        ("kubepods-besteffort-pod1.slice", QOSClass.BEST_EFFORT),
    ],
)
def test_qos_class_cgroup_parents(parent: str, qos: QOSClass) -> None:
    assert qos_class(Pod(id="p", cgroup_parent=parent)) == qos


def test_qos_class_fallbacks() -> None:
    guaranteed = Container(
        id="c",
        resources=Resources(
            cpu=CpuResources(shares=1024, quota=100_000, period=100_000),
            memory=MemoryResources(limit=1 << 30),
        ),
    )
    assert qos_class(None, guaranteed) == QOSClass.GUARANTEED
    assert qos_class(None, Container(id="c")) == QOSClass.BEST_EFFORT
    assert qos_class(None) == QOSClass.GUARANTEED

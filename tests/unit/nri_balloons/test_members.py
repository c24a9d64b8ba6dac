"""A balloon's members keep their pods and namespaces as they come and go.

The fill methods samePod and sameNamespace ask every balloon of a type for each
container placed; the counts answer without walking the members (a Synchronize
of 1000 containers into one balloon walked 1000 x 1000 of them)."""

from __future__ import annotations

from nri_balloons.balloon import Member, Members


def member(cid: str, pod: str, ns: str, request: int = 100) -> Member:
    return Member(
        id=cid, pod_id=pod, namespace=ns, pod_name=pod, name=cid, request=request, limit=0
    )


def check(ms: Members) -> None:
    pods: dict[str, int] = {}
    namespaces: dict[str, int] = {}
    for m in ms.values():
        pods[m.pod_id] = pods.get(m.pod_id, 0) + 1
        namespaces[m.namespace] = namespaces.get(m.namespace, 0) + 1
    assert ms.pods == pods
    assert ms.namespaces == namespaces
    assert ms.requested == sum(m.request for m in ms.values())


def test_pods_and_namespaces_follow_every_change() -> None:
    ms = Members({"a": member("a", "p1", "n1")})
    check(ms)
    ms["b"] = member("b", "p1", "n2")
    ms["a"] = member("a", "p2", "n2")  # replaced: p1/n1 lose it
    check(ms)
    assert "n1" not in ms.namespaces and ms.pods == {"p1": 1, "p2": 1}
    assert ms.pop("b").pod_id == "p1" and ms.pop("b", None) is None
    check(ms)
    assert "p1" not in ms.pods
    ms.update({"c": member("c", "p3", "n3")}, d=member("d", "p3", "n3"))
    del ms["c"]
    check(ms)
    ms.setdefault("e", member("e", "p2", "n2"))
    ms.popitem()
    check(ms)
    ms.clear()
    check(ms)
    assert ms.pods == {} and ms.namespaces == {}

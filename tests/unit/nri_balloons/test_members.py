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


class PreviousMembers(Members):
    """The counts kept as they were (the oracle): a loop over (counts, key) pairs."""

    def _count(self, member: Member, sign: int) -> None:
        self.requested += sign * member.request
        for counts, key in ((self.pods, member.pod_id), (self.namespaces, member.namespace)):
            n = counts.get(key, 0) + sign
            if n:
                counts[key] = n
            else:
                del counts[key]


def test_the_counts_equal_the_previous_code_on_random_changes() -> None:
    import random

    rng = random.Random(1202)
    for _ in range(40):
        twins = [Members(), PreviousMembers()]
        for _ in range(150):
            cid = f"c{rng.randrange(12)}"
            new = member(cid, f"p{rng.randrange(5)}", f"n{rng.randrange(3)}", rng.randrange(1, 900))
            op = rng.random()
            for ms in twins:
                if op < 0.5:
                    ms[cid] = new
                elif op < 0.7:
                    ms.pop(cid, None)
                elif op < 0.8 and cid in ms:
                    del ms[cid]
                elif op < 0.85 and ms:
                    ms.popitem()
                elif op < 0.87:
                    ms.clear()
                else:
                    ms.update({cid: new})
            a, b = twins
            assert list(a.items()) == list(b.items())
            assert list(a.pods.items()) == list(b.pods.items())
            assert list(a.namespaces.items()) == list(b.namespaces.items())
            assert a.requested == b.requested
            check(a)

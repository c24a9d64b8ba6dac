"""A member's pinning annotations are read only when the pod has one of their
keys: a pod with a few annotations, none of them the pinning's, is not looked
up; the previous reading (four look-ups whenever the pod has annotations, kept
here) is the oracle on random pods; a pod with many annotations is looked up,
never scanned (a hostile pod's thousands cost a scan per member)."""

from __future__ import annotations

import random
from typing import Any

from nri_balloons import annotations as ann
from nri_balloons.policy import SCAN_ANNOTATIONS, _MemberAnnotations
from nri_framework.model import Container, Pod

KEYS = (ann.HIDE_HYPERTHREADS, ann.MEMORY_PRESERVE, ann.MEMORY_TYPE, ann.BALLOON, "other.io")
VALUES = ("true", "false", "1", "F", "garbage", "", "dram", "dram,pmem", "hbm")


def previous_read(pod: Pod, container_id: str, name: str) -> _MemberAnnotations:
    if not pod.annotations:
        return _MemberAnnotations(pod=pod, hide=None, memory_preserved=False, memory_type=None)
    ctr = Container(id=container_id, name=name)
    return _MemberAnnotations(
        pod=pod,
        hide=ann.parse_bool(ann.effective(ann.HIDE_HYPERTHREADS, pod, ctr)),
        memory_preserved=ann.memory_preserved(pod, ctr),
        memory_type=ann.effective(ann.MEMORY_TYPE, pod, ctr),
    )


def annotation_name(rng: random.Random, names: tuple[str, ...]) -> str:
    key = rng.choice(KEYS)
    return rng.choice(
        (key, f"{key}/pod", f"{key}/container.{rng.choice(names)}", f"x{key}", f"{key}x")
    )


def test_the_same_annotations_as_the_previous_reading() -> None:
    rng = random.Random(20261202)
    names = ("ctr", "side", "a.b")
    looked_up = skipped = 0
    for i in range(3000):
        size = rng.choice((0, 1, 2, 5, SCAN_ANNOTATIONS, SCAN_ANNOTATIONS + 1, 60))
        annotations = {annotation_name(rng, names): rng.choice(VALUES) for _ in range(size)}
        if rng.random() < 0.5:  # most pods: none of the pinning's keys
            annotations = {k: v for k, v in annotations.items() if not k.startswith(KEYS[:3])}
        pod = Pod(id=f"p{i}", name=f"p{i}", namespace="n", uid=f"u{i}", annotations=annotations)
        name = rng.choice(names)
        got = _MemberAnnotations.read(pod, f"c{i}", name)
        assert got == previous_read(pod, f"c{i}", name), annotations
        if got.hide is not None or got.memory_preserved or got.memory_type is not None:
            looked_up += 1
        else:
            skipped += 1
    assert looked_up > 300 and skipped > 300


class Counted(dict[str, str]):
    """Annotations that count how often their names are walked."""

    walks = 0

    def __iter__(self) -> Any:
        Counted.walks += 1
        return super().__iter__()


def test_many_annotations_are_looked_up_not_scanned() -> None:
    many = Counted({f"example.io/a{i}": "x" for i in range(5000)})
    many[ann.MEMORY_TYPE] = "dram"
    pod = Pod(id="p", name="p", namespace="n", uid="u", annotations=many)
    Counted.walks = 0
    got = _MemberAnnotations.read(pod, "c", "ctr")
    assert got.memory_type == "dram"
    assert Counted.walks == 0
    few = Counted({f"example.io/a{i}": "x" for i in range(SCAN_ANNOTATIONS)})
    pod = Pod(id="q", name="q", namespace="n", uid="v", annotations=few)
    assert _MemberAnnotations.read(pod, "c", "ctr").memory_type is None
    assert Counted.walks == 1  # a few are scanned (and then not looked up)

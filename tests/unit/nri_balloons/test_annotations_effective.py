"""annotations.effective against its previous implementation (the oracle,
verbatim) on random pod and container annotations: the same value found."""

from __future__ import annotations

import random

import pytest
from nri_balloons import annotations as ann
from nri_framework.model import Container, Pod

KEY = ann.HIDE_HYPERTHREADS


def oracle_effective(key: str, pod: Pod | None, container: Container) -> str | None:
    sources = [container.annotations]
    if pod is not None:
        sources.insert(0, pod.annotations)
    for candidate in (f"{key}/container.{container.name}", f"{key}/pod", key):
        for found in sources:
            if candidate in found:
                return found[candidate]
    return None


def _annotations(rng: random.Random, name: str) -> dict[str, str]:
    keys = [f"{KEY}/container.{name}", f"{KEY}/container.other", f"{KEY}/pod", KEY, "x"]
    return {k: f"{k}={rng.random():.3f}" for k in keys if rng.random() < 0.4}


@pytest.mark.parametrize("seed", range(200))
def test_effective_as_before(seed: int) -> None:
    rng = random.Random(seed)
    name = rng.choice(["a", "b"])
    ctr = Container(id="c", name=name, annotations=_annotations(rng, name))
    pod = None if rng.random() < 0.2 else Pod(id="p", annotations=_annotations(rng, name))
    assert ann.effective(KEY, pod, ctr) == oracle_effective(KEY, pod, ctr)

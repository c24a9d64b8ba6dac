"""The host's cache: a pod's removal forgets its containers (found through
the per-pod index, not a walk of the node's), whatever the runtime sent
before: containers moved between pods, removed, replaced by a Synchronize."""

from __future__ import annotations

import random

import pytest
from nri_framework.cache import Cache
from nri_framework.model import Container, Pod


class ScanCache(Cache):
    """The oracle: the removal of a pod as it was, a walk of every container."""

    def nri_remove_pod_sandbox(self, pod: Pod) -> None:
        self.pods.pop(pod.id, None)
        self.dirty_pods.add(pod.id)
        for cid in [cid for cid, c in self.containers.items() if c.pod_sandbox_id == pod.id]:
            self.containers.pop(cid, None)
            self.dirty_containers.add(cid)


def step(rng: random.Random, caches: tuple[Cache, Cache]) -> None:
    pod = Pod(id=f"p{rng.randrange(6)}")
    ctr = Container(id=f"c{rng.randrange(12)}", pod_sandbox_id=pod.id, name=f"n{rng.random()}")
    kind = rng.random()
    for cache in caches:
        if kind < 0.5:  # a container (maybe one the cache has under another pod)
            cache.put_pod(pod)
            cache.put_container(ctr)
        elif kind < 0.65:
            cache.nri_remove_container(pod, ctr)
        elif kind < 0.9:
            cache.nri_remove_pod_sandbox(pod)
        elif kind < 0.95:  # what is there, as a Synchronize would report it
            cache.replace(list(cache.pods.values()), list(cache.containers.values()))
        else:
            cache.clear_changes()


@pytest.mark.parametrize("seed", range(20))
def test_a_pods_removal_forgets_its_containers_as_a_walk_would(seed: int) -> None:
    rng = random.Random(seed)
    ours, oracle = Cache(), ScanCache()
    for _ in range(300):
        step(rng, (ours, oracle))
        assert ours.containers == oracle.containers
        assert ours.pods == oracle.pods
        assert ours.dirty_containers == oracle.dirty_containers
    # the index holds the cache's containers, each once, and no empty pod
    indexed = [cid for ids in ours._of_pod.values() for cid in ids]
    assert sorted(indexed) == sorted(ours.containers)
    assert all(ours._of_pod.values())


def test_a_container_moved_to_another_pod_goes_with_that_pod() -> None:
    cache = Cache()
    cache.put_container(Container(id="c", pod_sandbox_id="a"))
    cache.put_container(Container(id="c", pod_sandbox_id="b"))  # hostile or a reused id
    cache.nri_remove_pod_sandbox(Pod(id="a"))
    assert "c" in cache.containers
    cache.nri_remove_pod_sandbox(Pod(id="b"))
    assert cache.containers == {} and cache._of_pod == {}


def test_a_pod_resent_as_it_is_is_not_a_change_for_the_journal() -> None:
    """The runtime sends the pod with every request and event of its
    containers: a record holds the pod when it is new or changed, not each
    time it was resent (the journal grows with what changed)."""
    cache = Cache()
    pod = Pod(id="p", name="web", namespace="ns", labels={"a": "1"})
    cache.put_pod(pod)
    assert cache.take_changes(1).pods == {"p": pod}
    cache.put_pod(pod)  # the same object
    cache.put_pod(Pod(id="p", name="web", namespace="ns", labels={"a": "1"}))  # equal
    assert cache.take_changes(2).pods == {}
    changed = Pod(id="p", name="web", namespace="ns", labels={"a": "2"})
    cache.put_pod(changed)
    assert cache.take_changes(3).pods == {"p": changed}
    assert cache.pods["p"] is changed

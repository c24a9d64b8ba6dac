"""The snapshot a host writes from its mirror (``nri_framework.statefile.Mirror``:
the entries of the last journal record, each encoded once, kept as records are
written) is the state a whole snapshot writes: after every step of seeded
random decision sequences (create, stop, remove, a pod sent anew, a
configuration reload, a reconnect), the state file on disk holds the cache's
pods and containers and the policy's whole export, and a restart from it
restores every container's pin."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from msgspec.structs import replace
from nri_balloons.plugin import Balloons
from nri_framework.host import PolicyHost
from nri_framework.model import Event, Pod, Resources
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import N6_HBM_CXL
from nri_framework.statefile import SavedState
from test_incremental_updates import CONFIG, annotations, new_container, new_pod, reconfigure


def host_for(root: Path, config: Path, state: Path, plugin: Balloons) -> PolicyHost:
    return PolicyHost(
        "balloons", plugin, options={"config_file": str(config)}, host_root=str(root),
        state_dir=state,
    )  # fmt: skip


def on_disk(host: PolicyHost) -> SavedState:
    path = host.statefile.path
    assert path is not None
    return msgspec.json.decode(path.read_bytes(), type=SavedState)


def whole(host: PolicyHost) -> tuple[Any, Any, Any]:
    """What a whole snapshot holds, as JSON hands it back."""
    pods, containers = host.cache.snapshot()
    rt = msgspec.json.decode(msgspec.json.encode([pods, containers]))
    return rt[0], rt[1], msgspec.json.decode(msgspec.json.encode(host.hook.policy_export_state()))


@pytest.mark.parametrize("seed", range(5))
def test_the_mirrored_snapshot_is_the_whole_state(tmp_path: Path, seed: int) -> None:
    write_topology(tmp_path / "root", N6_HBM_CXL)
    config = tmp_path / "balloons.yaml"
    config.write_text(CONFIG % {"hide": "false"})
    first = Balloons()
    host = host_for(tmp_path / "root", config, tmp_path / "state", first)
    host.synchronize([], [])  # without a loop each change records, then snapshots
    rnd = random.Random(seed)
    pods: dict[str, Pod] = {}
    live: dict[str, Any] = {}
    stopped: dict[str, Any] = {}  # the runtime still has them: a Synchronize lists them
    mirrored = 0
    for step in range(120):
        op = rnd.random()
        if op < 0.5 or not live:
            pod = new_pod(rnd, step)
            pods[pod.id] = pod
            c = new_container(rnd, pod, step)
            try:
                host.create_container(pod=pod, container=c)
            except Exception:  # a refusal (no room): nothing created
                continue
            live[c.id] = c
        elif op < 0.65:
            c = live.pop(rnd.choice(list(live)))
            stopped[c.id] = c
            host.stop_container(pod=pods[c.pod_sandbox_id], container=c)
        elif op < 0.75:
            gone = stopped if stopped and rnd.random() < 0.7 else live
            c = gone.pop(rnd.choice(list(gone)))
            host.notify(Event.REMOVE_CONTAINER, pods[c.pod_sandbox_id], c)
        elif op < 0.85:
            pid = rnd.choice(list(pods))
            pods[pid] = replace(pods[pid], annotations=annotations(rnd))
            host.update_pod_sandbox(pod=pods[pid], resources=Resources())
        elif op < 0.93:
            text = CONFIG % {"hide": rnd.choice(("true", "false"))}
            if not isinstance(reconfigure(host, text), str):
                config.write_text(text)  # what a restart reads
        else:
            host.synchronize(list(pods.values()), [*live.values(), *stopped.values()])
        host.changed()  # a record and a snapshot (no loop): what an event left unrecorded too
        mirrored += host.statefile._mirror.filled
        saved = on_disk(host)
        got = msgspec.json.decode(msgspec.json.encode([saved.pods, saved.containers]))
        want_pods, want_containers, want_policy = whole(host)
        assert got == [want_pods, want_containers], (seed, step)
        assert saved.policy_state == want_policy, (seed, step)
    assert mirrored > 60  # the snapshots came from the mirror
    second = Balloons()
    again = host_for(tmp_path / "root", config, tmp_path / "state", second)
    again.synchronize(list(pods.values()), [*live.values(), *stopped.values()])
    before, after = placed(first), placed(second)
    assert before and {cid: after.get(cid) for cid in before} == before


def placed(plugin: Balloons) -> dict[str, tuple[str, int]]:
    """Each container's balloon and its CPUs."""
    assert plugin.policy is not None
    return {cid: (b.name, b.cpus) for b in plugin.policy.balloons for cid in b.members}

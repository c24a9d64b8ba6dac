"""The create and release path's skipped work against its previous code as
the oracle: a policy whose balloon creation, deletion, resize, release, shared
idle CPUs and device-hint look-ups are the code before they skipped what had
nothing to do (formatting a balloon's name for an empty device-hint map or a
debug line that is off, ``log_placement`` without PCT, ``share_idle`` for a
type without ``shareIdleCPUsInSame``; kept here verbatim) takes the same
random create/remove sequences as the current one (device hints attached
only for a type with close-to devices): at every step both hold
the same balloons with the same CPUs, shared idle CPUs and members, pin the
same and log the same lines (debug on and off), with PCT (the in-process
helper of :mod:`pct_helpers`), with pod-resource device hints, and without."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from nri_balloons import annotations as ann
from nri_balloons import balloonclass
from nri_balloons.balloon import Balloon, Member
from nri_balloons.composite import new_composite, resize_composite
from nri_balloons.config import BalloonType
from nri_balloons.configyaml import load_policy
from nri_balloons.cputree import CpuTreeAllocator
from nri_balloons.devices import pod_resource_entries, pod_resource_hints
from nri_balloons.gofmt import quote
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.sizing import share_idle
from nri_balloons.validation import validate
from nri_framework.agent.podresources import DeviceAssignment
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.topologies import N4C16
from pct_helpers import InProcessHelper, shared_root  # noqa: F401  (its autouse tree)
from pct_helpers import make as make_pct
from pct_helpers import pod as pct_pod
from test_decision_twin import make, prepared, random_ops
from test_policy_properties import topology
from topologies import topology as spec_topology

log = logging.getLogger("policy")


class PreviousPolicy(BalloonsPolicy):
    """The create and release path as it was (the oracle)."""

    def new_balloon(self, bdef: BalloonType, member: Member | None = None) -> Balloon:
        """A new instance of ``bdef``, at its minCPUs; ``member``: the container it
        is made for, whose ``podresourceapi:`` hints steer it until it leaves."""
        used = {b.instance for b in self.instances(bdef)}
        if bdef.max_balloons and len(used) >= bdef.max_balloons:
            raise BalloonsError(
                f"cannot create new {quote(bdef.name)} balloon, "
                f"MaxBalloons limit ({bdef.max_balloons}) reached"
            )
        instance = 0  # the lowest one not in use
        while instance in used:
            instance += 1
        if bdef.components:
            return new_composite(self, bdef, instance)
        bln = Balloon(bdef=bdef, instance=instance)
        self.device_hints.pop(bln.name, None)
        if member is not None:
            self._attach_device_hints(bln, member)
        if bdef.min_cpus:
            self.resize(bln, bdef.min_cpus * 1000)
        return bln

    def _attach_device_hints(self, bln: Balloon, member: Member) -> None:
        entries = pod_resource_entries(bln.bdef.prefer_close_to_devices)
        if not entries:
            return
        devices = None
        if self.pod_devices is not None:
            devices = self.pod_devices(member.namespace, member.pod_name, member.name)
        hints = pod_resource_hints(
            entries, self.topology, self.allowed, devices, member.id, member.pretty
        )
        if hints:
            self.device_hints[bln.name] = (member.id, hints)

    def _drop_device_hints(self, bln: Balloon, container_id: str, pretty: str) -> None:
        got = self.device_hints.get(bln.name)
        if got is not None and got[0] == container_id:
            del self.device_hints[bln.name]
            log.debug(
                "removed pod-resource device hints of container %s from balloon %s",
                pretty,
                bln.name,
            )

    def _tree(self, bln: Balloon) -> CpuTreeAllocator:
        got = self.device_hints.get(bln.name)
        return self.placement.trees.for_resize(
            bln.bdef, self.balloons, got[1] if got is not None else None
        )

    def resize(self, bln: Balloon, milli: int, exclude: int | None = None) -> None:
        """Resize ``bln`` to fit ``milli`` mCPU (upstream ``resizeBalloon``): the
        CPU count it needs, clamped to its type's min/maxCPUs, then
        :meth:`inflate` or :meth:`deflate`. ``exclude``: CPUs it may not take
        (by default the reserved cpuset unless it is the reserved balloon; the
        components of a composite inherit the composite's)."""
        if exclude is None:
            assert self.config is not None
            exclude = 0 if bln.bdef.name == self.config.reserved_type.name else self.reserved
        if bln.components:
            resize_composite(self, bln, milli, exclude)
            return
        bdef = bln.bdef
        count = math.ceil(milli / 1000)
        if bdef.max_cpus > 0:
            count = min(count, bdef.max_cpus)
        count = max(count, bdef.min_cpus)
        current = bln.cpus.bit_count()
        delta = count - current
        if delta == 0:
            return
        if log.isEnabledFor(logging.DEBUG):
            log.debug("resize %s to fit %d mCPU", bln.name, milli)
            log.debug("- change size from %d to %d full cpus", current, count)
        balloonclass.forget(self.cpu_classes, bln.cpus)
        try:
            if delta > 0:
                self.inflate(bln, delta, exclude)
            else:
                self.deflate(bln, -delta)
        finally:
            balloonclass.use(self.cpu_classes, bln)
        if delta > 0:
            self.cpu_classes.pct.log_placement(bln.name, self.balloon_class(bdef), bln.cpus)

    def delete(self, bln: Balloon, append: bool = True) -> None:
        log.debug("deleting balloon %s", bln.name)
        self.device_hints.pop(bln.name, None)
        for b in bln.walk():
            balloonclass.forget(self.cpu_classes, b.cpus)
            self.free |= b.cpus
            b.cpus = 0
        if bln in self.balloons:
            self.balloons.remove(bln)

    def _share_idle(self) -> None:
        """Shared idle CPUs of every balloon (§9)."""
        free, topology = self.free, self.topology
        for bln in self.balloons:
            bln.shared_idle = share_idle(bln.cpus, free, bln.bdef.share_idle_cpus_in_same, topology)

    def release(self, container_id: str) -> None:
        self.memory.release(container_id)  # upstream dismissContainer: libmem Release
        self._touched.add(container_id)
        bln = self.owner.pop(container_id, None)
        if bln is None:
            log.debug(
                "ReleaseResources: balloon-less container %s, nothing to release", container_id
            )
            return
        member = bln.members.pop(container_id)
        self._drop_device_hints(bln, container_id, member.pretty)
        if member.group:
            bln.groups[member.group] -= 1
            if bln.groups[member.group] <= 0:
                del bln.groups[member.group]
        try:
            if not bln.members:
                log.debug("all containers removed, free balloon allocation %s", bln.name)
                self.resize(bln, 0)
                if len(self.instances(bln.bdef)) > bln.bdef.min_balloons:
                    self.delete(bln)
            else:
                self.resize(bln, max(1, bln.requested))
        except BalloonsError as exc:
            log.warning("failed to deflate balloon %s: %s", bln.name, exc)
        self._share_idle()


def state(policy: BalloonsPolicy) -> list[tuple[str, int, int, int, list[str]]]:
    return [(b.name, b.cpus, b.shared_idle, b.mems, list(b.members)) for b in policy.balloons]


@contextmanager
def lines(level: int) -> Iterator[list[str]]:
    """The lines of the policy's and the cpuClasses' loggers (PCT's placement
    line is cpuclass's)."""
    out: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            out.append(f"{record.name} {record.levelname} {record.getMessage()}")

    handler = Lines(logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("policy", "cpuclass")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(level)
    try:
        yield out
    finally:
        for lg, was in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(was)


Step = Callable[[BalloonsPolicy], str]


def twin(policies: list[BalloonsPolicy], steps: Iterator[Step], debug: bool) -> int:
    """Run each step on both policies; both must say, hold, pin and log the
    same. Returns how many steps made a balloon (the twin saw creations)."""
    pods: dict[str, Pod] = {}
    made = 0
    for step in steps:
        said = []
        for p in policies:
            with lines(logging.DEBUG if debug else logging.INFO) as out:
                try:
                    got = step(p)
                except BalloonsError as exc:
                    got = f"error: {exc}"
                pins = p.pinning(lambda pid: pods.get(pid))
            said.append((got, state(p), pins, out))
        assert said[0] == said[1]
        made += any("assigning container" in line for line in said[0][3])
    return made


def allocate(pod: Pod, ctr: Container) -> Step:
    return lambda p: str(p.allocate(pod, ctr))


def release(cid: str) -> Step:
    def step(p: BalloonsPolicy) -> str:
        p.release(cid)
        return ""

    return step


def sequence(
    rng: random.Random, n: int, new: Callable[[int], tuple[Pod, Container]]
) -> Iterator[Step]:
    alive: list[str] = []
    for i in range(n):
        if alive and rng.random() < 0.35:
            yield release(alive.pop(rng.randrange(len(alive))))
            continue
        pod, ctr = new(i)
        alive.append(ctr.id)
        yield allocate(pod, ctr)


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("name", ["n4c16", "xeon-6776p"])
@pytest.mark.parametrize("seed", range(12))
def test_the_same_decisions_as_the_previous_code(seed: int, name: str, debug: bool) -> None:
    """Types with and without shareIdleCPUsInSame, minBalloons, maxBalloons."""
    topo = topology(name)
    rng = random.Random(seed)
    cfg = prepared(topo, rng.random() < 0.5)
    policies = [BalloonsPolicy(topo), PreviousPolicy(topo)]
    for p in policies:
        p.set_config(cfg)
    ops = list(random_ops(rng, 80))

    def new(i: int) -> tuple[Pod, Container]:
        _, namespace, qos, cpus, grp = ops[i]
        return make(i, namespace, qos, cpus, grp)

    assert twin(policies, sequence(rng, 80, new), debug) > 0


PODRES = """
reservedResources: {cpu: "cpuset:0"}
allocatorTopologyBalancing: false
balloonTypes:
- name: near-tpu
  preferCloseToDevices: ["podresourceapi:tech.com/*"]
  preferNewBalloons: true
- name: near-nic
  preferCloseToDevices: ["podresourceapi:*.com/nic"]
  shareIdleCPUsInSame: numa
- name: plain
  minCPUs: 1
"""
DEVICES = (
    DeviceAssignment("telco.com/nic", ("telconics0-numas01",), (0, 1)),
    DeviceAssignment("telco.com/nic", ("telconics1-numas23",), (2, 3)),
    DeviceAssignment("tech.com/tpu", ("tcomtpu-3-s1-numa2",), (2,)),
    DeviceAssignment("tech.com/tpu", ("tcomtpu-0-s1-numa3",), (3,)),
)


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_the_same_decisions_with_device_hints(seed: int, debug: bool) -> None:
    """Balloons steered by (and forgetting) their first container's devices."""
    topo = spec_topology(N4C16)
    result = validate(load_policy(PODRES), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    rng = random.Random(seed)
    assigned: dict[tuple[str, str], list[DeviceAssignment]] = {}
    policies = [BalloonsPolicy(topo), PreviousPolicy(topo)]
    for p in policies:
        p.pod_devices = lambda ns, pod, c: assigned.get((pod, c))
        p.set_config(result.prepared)

    def new(i: int) -> tuple[Pod, Container]:
        kind = rng.choice(("near-tpu", "near-nic", "plain"))
        pod = Pod(id=f"p{i}", name=f"p{i}", namespace="default", uid=f"u{i}",
                  annotations={ann.BALLOON: kind})  # fmt: skip
        cpus = rng.randint(1, 3)
        cpu = CpuResources(shares=1024 * cpus, quota=100_000 * cpus, period=100_000)
        ctr = Container(id=f"c{i}", pod_sandbox_id=pod.id, name="ctr",
                        resources=Resources(cpu=cpu))  # fmt: skip
        if rng.random() < 0.7:
            assigned[(pod.name, ctr.name)] = rng.sample(DEVICES, rng.randint(1, 2))
        return pod, ctr

    assert twin(policies, sequence(rng, 40, new), debug) > 0


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_the_same_decisions_with_pct(seed: int, debug: bool) -> None:
    """The spec's PCT configuration, each policy with its own in-process
    helper: PCT's placement line ("pct: balloon ... on cpus ...") included."""
    rng = random.Random(seed)
    current, _ = make_pct(helper=InProcessHelper())
    previous = PreviousPolicy(current.topology, current.host_root, writer=InProcessHelper())
    assert current.config is not None
    previous.set_config(current.config)
    assert previous.cpu_classes.commit()
    assert current.cpu_classes.pct.mode and previous.cpu_classes.pct.mode

    def new(i: int) -> tuple[Pod, Container]:
        kind = rng.choice(("hp-bln", "lp-bln", "hp-bln"))
        return pct_pod(f"{kind}-{i}", rng.choice((1, 2, 4)), kind)

    def committed(step: Step) -> Step:
        def run(p: BalloonsPolicy) -> str:
            got = step(p)
            p.cpu_classes.commit()
            return got

        return run

    steps = (committed(s) for s in sequence(rng, 30, new))
    assert twin([current, previous], steps, debug) > 0

"""The balloons decision against its previous code as the oracle: a policy whose
type and instance choice are the code before the fill chain computed a type's
instances and free CPUs once per container and the types' namespaces were
remembered (kept here, verbatim but for names) takes the same random
create/remove sequences as the current one; at every step both hold the same
balloons with the same CPUs and members, pin the same, and log the same lines."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nri_balloons import annotations as ann
from nri_balloons.balloon import Balloon, Member
from nri_balloons.config import BalloonType
from nri_balloons.configyaml import load_policy
from nri_balloons.expression import Subject
from nri_balloons.fillmethod import FillMethod, fill_chain
from nri_balloons.globmatch import go_match as glob_match
from nri_balloons.gofmt import quote
from nri_balloons.policy import BalloonsError, BalloonsPolicy, NotApplicable
from nri_balloons.validation import PreparedConfig, validate
from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.topology import Topology
from test_policy_properties import topology

log = logging.getLogger("policy")

CONFIG = """
reservedResources: {cpu: "cpuset:%(reserved)s"}
allocatorTopologyBalancing: %(balancing)s
balloonTypes:
- name: reserved
  maxCPUs: 4
- name: grouped
  groupBy: ${pod/labels/grp}
  namespaces: [grp-*]
  maxCPUs: 4
- name: team
  namespaces: [team-*]
  minCPUs: 1
  maxCPUs: 3
  minBalloons: 3
  maxBalloons: 4
- name: perns
  namespaces: [ns-*]
  preferPerNamespaceBalloon: true
  maxBalloons: 3
- name: dedicated
  matchExpressions: [{key: qosclass, operator: In, values: [Guaranteed]}]
  preferNewBalloons: true
  preferSpreadingPods: true
  maxCPUs: 8
- name: shared
  matchExpressions: [{key: qosclass, operator: In, values: [BestEffort, Burstable]}]
  shareIdleCPUsInSame: package
  maxBalloons: 2
"""

NAMESPACES = ("default", "kube-system", "team-a", "team-b", "grp-x", "grp-y", "ns-a", "ns-b")


class PreviousPolicy(BalloonsPolicy):
    """The type and instance choice as they were (the oracle)."""

    def choose_type(self, pod: Pod, container: Container) -> BalloonType:
        assert self.config is not None
        name = ann.effective(ann.BALLOON, pod, container)
        if name is not None:
            if name not in self.types:
                raise BalloonsError(f"no balloon for annotation {quote(name)}")
            log.debug("- annotation %r found, using balloon type %r", ann.BALLOON, name)
            return self.types[name]
        subject = Subject(container, pod)
        for bdef in self.config.balloon_types:
            for expr in bdef.match_expressions:
                if expr.evaluate_subject(subject):
                    return bdef
            if any(glob_match(ns, pod.namespace) for ns in bdef.namespaces):
                log.debug(
                    "- namespace %r matches namespaces of balloon type %r", pod.namespace, bdef.name
                )
                return bdef
        log.debug("- no match found, using default balloon type %r", self.config.default_type.name)
        return self.config.default_type

    def choose_instance(self, bdef: BalloonType, member: Member) -> Balloon:
        for method in fill_chain(bdef):
            try:
                candidates = self._previous_fills[method](bdef, member)
            except NotApplicable:
                log.debug("fill method %r not applicable", str(method))
                continue
            if candidates:
                log.debug(
                    "fill method %r suggests any of balloon instances %s",
                    str(method),
                    [b.name for b in candidates],
                )
                return self._previous_best(method, candidates)
            log.debug("fill method %r not applicable", str(method))
        raise BalloonsError(
            f"balloon allocation for container {member.pretty} failed: "
            "no suitable balloon instance available"
        )

    def _previous_best(self, method: FillMethod, candidates: list[Balloon]) -> Balloon:
        def key(b: Balloon) -> tuple[int, int]:
            if method is FillMethod.BALANCED_INFLATE:
                free = b.max_free_milli(self.available(b.bdef))
            else:
                free = b.free_milli
            return (-free, len(b.members))

        return min(candidates, key=key)

    @property
    def _previous_fills(self) -> dict[FillMethod, Callable[[BalloonType, Member], list[Balloon]]]:
        return {
            FillMethod.SAME_GROUP: self._previous_same_group,
            FillMethod.SAME_POD: lambda bdef, m: self._previous_where(
                bdef, m, lambda b: m.pod_id in b.members.pods
            ),
            FillMethod.SAME_NAMESPACE: lambda bdef, m: self._previous_where(
                bdef, m, lambda b: m.namespace in b.members.namespaces
            ),
            FillMethod.BALANCED: lambda bdef, m: [
                b for b in self.instances(bdef) if b.free_milli >= m.request
            ],
            FillMethod.BALANCED_INFLATE: lambda bdef, m: self._previous_where(bdef, m, bool),
            FillMethod.NEW_BALLOON: lambda bdef, m: [self._fill_new(bdef, m.request, m)],
        }

    def _previous_where(
        self, bdef: BalloonType, member: Member, where: Callable[[Balloon], bool]
    ) -> list[Balloon]:
        avail = self.available(bdef)
        return [
            b
            for b in self.instances(bdef)
            if where(b) and b.max_free_milli(avail) >= member.request
        ]

    def _previous_same_group(self, bdef: BalloonType, member: Member) -> list[Balloon]:
        if not member.group:
            raise NotApplicable
        return self._previous_where(bdef, member, lambda b: b.groups[member.group] > 0)


def prepared(topo: Topology, balancing: bool) -> PreparedConfig:
    lowest = cpuset.lowest(topo.online, 2 if topo.online.bit_count() > 4 else 1)
    text = CONFIG % {"reserved": cpuset.format(lowest), "balancing": str(balancing).lower()}
    result = validate(load_policy(text), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    return result.prepared


def make(i: int, namespace: str, qos: str, cpus: int, grp: int) -> tuple[Pod, Container]:
    pod = Pod(
        id=f"pod{i}",
        name=f"pod{i}",
        uid=f"uid{i}",
        namespace=namespace,
        labels={"grp": f"g{grp}"} if grp else {},
        cgroup_parent=f"/kubepods/{qos}pod{i}",
    )
    if qos == "":
        cpu = CpuResources(shares=1024 * cpus, quota=100_000 * cpus, period=100_000)
    elif qos == "besteffort/":
        cpu = CpuResources(shares=2)
    else:
        cpu = CpuResources(shares=256 * cpus)
    ctr = Container(id=f"c{i}", pod_sandbox_id=pod.id, name="ctr", resources=Resources(cpu=cpu))
    return pod, ctr


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name} {record.levelname} {record.getMessage()}")


@contextmanager
def lines(level: int) -> Iterator[list[str]]:
    handler = _Lines()
    loggers = [logging.getLogger(n) for n in ("policy", "nri_balloons")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(level)
    try:
        yield handler.lines
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


def state(policy: BalloonsPolicy) -> list[tuple[str, int, int, list[str]]]:
    return [(b.name, b.cpus, b.shared_idle, list(b.members)) for b in policy.balloons]


def random_ops(rng: random.Random, n: int) -> Iterator[tuple[str, str, str, int, int]]:
    """Creates and removals enough to fill the node (hypothesis's lists stay short)."""
    for _ in range(n):
        yield (
            rng.choice(("add", "add", "add", "remove")),
            rng.choice(NAMESPACES),
            rng.choice(("", "burstable/", "besteffort/")),
            rng.randint(1, 3),
            rng.randint(0, 2),
        )


@pytest.mark.parametrize("name", ["n4c16", "xeon-6776p"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), balancing=st.booleans(), debug=st.booleans())
def test_the_same_decisions_as_the_previous_code(
    name: str, seed: int, balancing: bool, debug: bool
) -> None:
    topo = topology(name)
    cfg = prepared(topo, balancing)
    policies = [BalloonsPolicy(topo), PreviousPolicy(topo)]
    for p in policies:
        p.set_config(cfg)
    rng = random.Random(seed)
    alive: list[str] = []
    pods: dict[str, Pod] = {}
    for i, (op, namespace, qos, cpus, grp) in enumerate(random_ops(rng, 80)):
        if op == "remove" and not alive:
            continue
        victim = alive.pop(rng.randrange(len(alive))) if op == "remove" else ""
        pod, ctr = make(i, namespace, qos, cpus, grp)
        said = []
        for p in policies:
            with lines(logging.DEBUG if debug else logging.INFO) as out:
                if op == "remove":
                    p.release(victim)
                    got = ""
                else:
                    try:
                        got = str(p.allocate(pod, ctr))
                    except BalloonsError as exc:
                        got = f"error: {exc}"
                pins = p.pinning(pods.get)
            said.append((got, state(p), pins, out))
        assert said[0] == said[1]
        if op == "add" and not said[0][0].startswith("error"):
            alive.append(ctr.id)
            pods[pod.id] = pod

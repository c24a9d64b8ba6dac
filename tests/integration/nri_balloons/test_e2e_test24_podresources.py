"""Upstream e2e test24-podresources (reference §18) one to one, through the
runtime simulator, with the balloons plugin and the SST helper (sim backend)
as real processes. No kubelet can run here: the pod-resources API is served
by ``tests/_podresources.py`` (a real gRPC server on a unix socket, ours,
standing in for the kubelet), holding the device assignments upstream's fake
device plugins make the kubelet do (``tech.com/tpu`` one per NUMA node,
``telco.com/nic`` one per package).

Upstream runs on n4c16 ("qemu" numbering: node N = CPUs 4N..4N+3) with a mock
SST; the PCT HP class needs the sim helper, which models the ``pct16``
numbering (SMT sibling = cpu + 8; node N = the two cores 2N, 2N+1 and their
siblings). Upstream's ``availableResources: cpuset:0-7,9-14`` and
``reservedResources: cpuset:0`` leave out the first CPU of node 2 and the
last of node 3 and reserve the first of node 0: the same CPUs in pct16's
numbering are 4, 15 and 0 (:data:`AVAILABLE`). Like upstream, each check
reads the NUMA nodes of a container's device from the plugin's debug line
``pod-resource device "<res>" of container <ctr> matches pattern ..., NUMA
nodes <n>, device IDs [...]`` and verifies that all the CPUs the container may
run on are on those nodes.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from nri_framework import cpuset
from nri_framework.simulate.podspec import RuntimeDefaults, load_pod_file
from nri_framework.simulate.sysfs import online
from sst_node import PCT16_SIM, Node, node

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from _podresources import Assigned, Kubelet  # noqa: E402

AVAILABLE = "0-3,5-14"  # upstream's 0-7,9-14 on n4c16, in pct16's numbering
SIM = {**PCT16_SIM, "tf_buckets": [4]}  # upstream's mock: max_hp_cpus 4 per package

CONFIG = f"""
agent:
  nodeResourceTopology: true
  podResourceAPI: true
allocatorTopologyBalancing: false
availableResources:
  cpu: cpuset:{AVAILABLE}
reservedResources:
  cpu: cpuset:0

pinCPU: true
pinMemory: false

balloonTypes:
- name: hp-near-tpu
  cpuClass: pct-hp
  preferCloseToDevices:
  - podresourceapi:tech.com/*
  preferNewBalloons: true
  preferSpreadingPods: true

- name: near-nic
  preferCloseToDevices:
  - podresourceapi:*.com/nic
  preferNewBalloons: true
  preferSpreadingPods: true
  shareIdleCPUsInSame: package

cpuClasses:
- name: pct-hp
  minFreq: "turbo"
  maxFreq: "turbo"
  pctPriority: high
  publishExtendedResource: true

- name: default
  minFreq: "min"
  maxFreq: "base"
  pctPriority: low

log:
  debug:
    - policy
    - nri-plugin
    - cpu
    - cpuclass
"""

# upstream's fake-tpu.yaml and fake-nic.yaml
TPU = {
    "tcomtpu-0-s1-numa3": (3,),
    "tcomtpu-1-s0-numa1": (1,),
    "tcomtpu-2-s0-numa0": (0,),
    "tcomtpu-3-s1-numa2": (2,),
}
NIC = {"telconics0-numas01": (0, 1), "telconics1-numas23": (2, 3)}


def tpu(device: str) -> Assigned:
    return Assigned("tech.com/tpu", device, TPU[device])


def nic(device: str) -> Assigned:
    return Assigned("telco.com/nic", device, NIC[device])


POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    balloon.balloons.resource-policy.nri.io: {balloon}
spec:
  containers:
{containers}
"""
CONTAINER = """
  - name: {name}
    image: busybox
    resources:
      requests: {{cpu: {req}, memory: {memreq}, {ext}}}
      limits: {{cpu: {lim}, memory: {memlim}, {ext}}}
"""


class Scenario:
    def __init__(self, n: Node, kubelet: Kubelet) -> None:
        self.n = n
        self.kubelet = kubelet
        self.containers: dict[str, str] = {}
        self.pods: dict[str, str] = {}

    async def create(
        self,
        pod: str,
        balloon: str,
        assigned: list[list[Assigned]],
        req: str,
        lim: str,
        mem: tuple[str, str],
        ext: dict[str, str],
    ) -> None:
        """Upstream's ``create balloons-busybox`` with CONTCOUNT containers
        ``<pod>c<i>``; the kubelet has given container i the devices ``assigned[i]``
        by the time the sandbox runs (device plugins allocate at admission)."""
        names = [f"{pod}c{i}" for i in range(len(assigned))]
        for name, devices in zip(names, assigned, strict=True):
            self.kubelet.assign("default", pod, name, *devices)
        extended = ", ".join(f'"{k}": "{v}"' for k, v in ext.items())
        text = POD.format(
            name=pod,
            balloon=balloon,
            containers="".join(
                CONTAINER.format(
                    name=c, req=req, lim=lim, memreq=mem[0], memlim=mem[1], ext=extended
                )
                for c in names
            ),
        )
        path = self.n.work / f"{pod}.yaml"
        path.write_text(text)
        host = self.n.host_root
        (sim,) = load_pod_file(path, RuntimeDefaults(cpus=online(host), mems=online(host, "node")))
        created = await self.n.rt.run_pod(sim.pod)
        self.pods[pod] = created.id
        # the kubelet pulls images meanwhile: the plugin's Get answered first
        await self.n.plugin.wait_output(f"pod-resources of pod default/{pod}:", timeout=10)
        for c in sim.containers:
            ctr = await self.n.rt.create_container(created.id, c)
            await self.n.rt.start_container(ctr.id)
            self.containers[c.name] = ctr.id

    def allowed(self, ctr: str) -> set[int]:
        c = self.n.rt.container(self.containers[ctr])
        assert c.resources and c.resources.cpu
        return set(cpuset.ids(cpuset.parse(c.resources.cpu.cpus)))

    def nodes(self, ctr: str) -> set[int]:
        topo_nodes = {}
        for d in (self.n.host_root / "sys/devices/system/node").glob("node[0-9]*"):
            topo_nodes[int(d.name[4:])] = set(cpuset.ids(cpuset.parse((d / "cpulist").read_text())))
        return {n for n, cpus in topo_nodes.items() if cpus & self.allowed(ctr)}

    def verify_podres_locality(self, resource: str, *ctrs: str) -> dict[str, set[int]]:
        """Upstream's ``verify-podres-locality``."""
        lines = [
            line
            for line in self.n.plugin.output().splitlines()
            if f'pod-resource device "{resource}"' in line
        ]
        assert lines, f"no device-locality log lines for resource {resource}"
        got = {}
        for ctr in ctrs:
            mine = [line for line in lines if f"/{ctr} matches" in line]
            assert mine, f"no device-locality log line for container {ctr} (resource {resource})"
            numas = set()
            for line in mine:
                m = re.search(r"NUMA nodes ([0-9,]*),* device IDs", line)
                assert m, line
                numas |= {int(x) for x in m.group(1).split(",") if x}
            assert numas, f"could not parse NUMA nodes for container {ctr} from: {mine}"
            nodes = self.nodes(ctr)
            assert nodes and nodes <= numas, (ctr, resource, nodes, numas, self.allowed(ctr))
            got[ctr] = nodes
        return got

    async def delete_all(self) -> None:
        for pod, pod_id in list(self.pods.items()):
            await self.n.rt.stop_pod(pod_id)
            await self.n.rt.remove_pod(pod_id)
            del self.pods[pod]


def disjoint(*sets: set[int]) -> bool:
    return sum(len(s) for s in sets) == len(set().union(*sets))


def plugin_node(
    tmp_path: Path, sock: Path, config: str = CONFIG, log_level: str = "debug"
) -> AbstractAsyncContextManager[Node]:
    """The node of :func:`sst_node.node` on pct16 with upstream's mock SST
    shape, its plugin told the kubelet's socket ``sock``."""
    sim = tmp_path / "sim-config.json"
    sim.write_text(json.dumps(SIM))
    return node(
        config,
        log_level=log_level,
        topology="pct16",
        helper_args=("--sim-config", str(sim)),
        plugin_args=("--pod-resources-socket", str(sock)),
    )


@asynccontextmanager
async def podres_node(
    tmp_path: Path, config: str = CONFIG, log_level: str = "debug"
) -> AsyncIterator[Scenario]:
    sock = tmp_path / "kubelet.sock"
    async with Kubelet(sock) as kubelet, plugin_node(tmp_path, sock, config, log_level) as n:
        yield Scenario(n, kubelet)


async def test_test24_podresources(tmp_path: Path) -> None:
    async with podres_node(tmp_path) as t:
        # burstable containers near their NICs
        await t.create(
            "pod0",
            "near-nic",
            [[nic("telconics0-numas01")], [nic("telconics1-numas23")]],
            req="2",
            lim="4",
            mem=("10M", "50M"),
            ext={"telco.com/nic": "1"},
        )
        got = t.verify_podres_locality("telco.com/nic", "pod0c0", "pod0c1")
        assert disjoint(got["pod0c0"], got["pod0c1"])

        # four HP containers, one TPU on each NUMA node (pod0 still runs)
        await t.create(
            "pod1",
            "hp-near-tpu",
            [[tpu(d)] for d in TPU],
            req="1",
            lim="1",
            mem=("10M", "10M"),
            ext={"tech.com/tpu": "1", "cpuclass.balloons.nri.io/pct-hp": "1"},
        )
        got = t.verify_podres_locality("tech.com/tpu", "pod1c0", "pod1c1", "pod1c2", "pod1c3")
        assert disjoint(*got.values())
        # the hp-near-tpu balloons use the pct-hp cpuClass: CLOS 0
        assert re.search(r"associated cpus .* to CLOS 0", t.n.plugin.output())

        await t.delete_all()

        # pods that use both a TPU and a NIC: pod2 near its TPU, pod3 near its NIC
        await t.create(
            "pod2",
            "hp-near-tpu",
            [[tpu("tcomtpu-1-s0-numa1"), nic("telconics1-numas23")]],
            req="2",
            lim="2",
            mem=("10M", "10M"),
            ext={
                "tech.com/tpu": "1",
                "telco.com/nic": "1",
                "cpuclass.balloons.nri.io/pct-hp": "2",
            },
        )
        t.verify_podres_locality("tech.com/tpu", "pod2c0")
        await t.create(
            "pod3",
            "near-nic",
            [[tpu("tcomtpu-3-s1-numa2"), nic("telconics0-numas01")]],
            req="1",
            lim="1",
            mem=("10M", "10M"),
            ext={"tech.com/tpu": "1", "telco.com/nic": "1"},
        )
        t.verify_podres_locality("telco.com/nic", "pod3c0")
        await t.delete_all()


# -- faults ------------------------------------------------------------------------


async def test_hints_work_once_a_missing_socket_appears(tmp_path: Path) -> None:
    """No kubelet socket at start: a warning naming it, containers are created
    (without the hint); once the kubelet serves, the hints steer again."""
    sock = tmp_path / "kubelet.sock"
    async with plugin_node(tmp_path, sock) as n:
        # the warning itself (the start's INFO line names the socket too: waiting
        # for that let the kubelet serve before any List had failed, under load)
        await n.plugin.wait_output(f"pod-resources API at {sock}: ", timeout=10)
        kubelet = Kubelet(sock)
        t = Scenario(n, kubelet)
        # the API is away: the container is created, its hint dropped
        kubelet.assign("default", "early", "earlyc0", tpu("tcomtpu-0-s1-numa3"))
        early = await n.create("early", "hp-near-tpu", cpu="1")
        assert early
        await n.plugin.wait_output(
            'dropping pod-resource device "podresourceapi:tech.com/*" hint: '
            "no device locality for container default/early/earlyc0",
            timeout=5,
        )
        async with kubelet:
            await n.plugin.wait_output(f"pod-resources API at {sock} answers again", timeout=30)
            await t.create(
                "late",
                "hp-near-tpu",
                [[tpu("tcomtpu-0-s1-numa3")]],
                req="1",
                lim="1",
                mem=("10M", "10M"),
                ext={"tech.com/tpu": "1"},
            )
            t.verify_podres_locality("tech.com/tpu", "latec0")
            # the early container stays where it was placed (upstream: nothing
            # moves until the next placement); the plugin says its answer came late
            await n.plugin.wait_output(
                "pod-resources of container default/early/earlyc0 arrived after it was placed",
                timeout=40,
            )
            assert n.cpus("early") == early


async def test_a_kubelet_that_never_answers_delays_no_container(tmp_path: Path) -> None:
    """The kubelet accepts the connection and never answers: CreateContainer
    replies at once (the policy reads the cache, never the kubelet), the
    hint is dropped, and the plugin warns naming the socket."""
    sock = tmp_path / "kubelet.sock"
    async with Kubelet(sock, hang=True) as kubelet:
        kubelet.assign("default", "p", "pc0", tpu("tcomtpu-0-s1-numa3"))
        async with plugin_node(tmp_path, sock) as n:
            # the runtime simulator closes a plugin that does not answer within its
            # 2 s request timeout and creates the container without it: a
            # container pinned to its 1-CPU balloon was answered in time
            cpus = await n.create("p", "hp-near-tpu", cpu="1")
            assert len(cpus) == 1, cpus
            second = await n.create("q", "hp-near-tpu", cpu="1")  # still connected
            assert len(second) == 1 and not second & cpus
            await n.plugin.wait_output(
                'dropping pod-resource device "podresourceapi:tech.com/*" hint: '
                "no device locality for container default/p/pc0",
                timeout=5,
            )
            await n.plugin.wait_output(f"pod-resources API at {sock}: ", timeout=10)
            await n.plugin.wait_output("got no answer within 2 s", timeout=10)


async def test_hints_are_dropped_with_a_warning_when_the_api_is_off(tmp_path: Path) -> None:
    config = CONFIG.replace("podResourceAPI: true", "podResourceAPI: false")
    async with podres_node(tmp_path, config=config, log_level="info") as t:
        out = t.n.plugin.output()
        assert (
            "balloon type 'hp-near-tpu': pod-resources device hints "
            "['podresourceapi:tech.com/*'] need agent.podResourceAPI: true"
        ) in out
        assert "pod-resources API at" not in out  # no client at all
        assert t.kubelet.calls == []


async def test_a_huge_reply_is_refused_and_the_container_created(tmp_path: Path) -> None:
    """A reply over the client's 16 MiB bound (upstream's maxSize) is refused
    by gRPC with a warning naming the socket; the container is created without
    its hint; the plugin lives."""
    sock = tmp_path / "kubelet.sock"
    async with Kubelet(sock, pad=17 * 1024 * 1024) as kubelet:
        kubelet.assign("default", "p", "pc0", tpu("tcomtpu-0-s1-numa3"))
        async with plugin_node(tmp_path, sock) as n:
            await n.plugin.wait_output("larger than 16777216 bytes", timeout=20)
            assert str(sock) in n.lines("larger than 16777216 bytes")[0]
            cpus = await n.create("p", "hp-near-tpu", cpu="1")
            assert len(cpus) == 1
            await n.plugin.wait_output(
                'dropping pod-resource device "podresourceapi:tech.com/*" hint: '
                "no device locality for container default/p/pc0",
                timeout=5,
            )


async def test_a_reload_turns_the_api_on_and_off(tmp_path: Path) -> None:
    """SIGHUP with ``agent.podResourceAPI`` switched: the client starts (hints
    steer the next balloons) and stops again (hints dropped, no Get for a new pod)."""
    off = CONFIG.replace("podResourceAPI: true", "podResourceAPI: false")
    async with podres_node(tmp_path, config=off) as t:
        assert t.kubelet.calls == []
        cfg = t.n.work / "balloons.yaml"
        done = t.n.mark()

        async def reload(text: str) -> None:
            cfg.write_text(text)
            t.n.plugin.proc.send_signal(signal.SIGHUP)
            await t.n.plugin.wait_output("config update from", timeout=10, count=count() + 1)

        def count() -> int:
            return sum("config update from" in line for line in t.n.plugin.tail)

        await reload(CONFIG)
        assert t.n.lines("podresourceapi: hints read the kubelet's pod-resources API", done)
        await t.create(
            "pod1",
            "hp-near-tpu",
            [[tpu("tcomtpu-0-s1-numa3")]],
            req="1",
            lim="1",
            mem=("10M", "10M"),
            ext={"tech.com/tpu": "1"},
        )
        t.verify_podres_locality("tech.com/tpu", "pod1c0")
        await reload(off)
        calls = len(t.kubelet.calls)
        t.kubelet.assign("default", "pod2", "pod2c0", tpu("tcomtpu-2-s0-numa0"))
        await t.n.create("pod2", "hp-near-tpu", cpu="1")
        await t.n.plugin.wait_output(
            'dropping pod-resource device "podresourceapi:tech.com/*" hint: '
            "no device locality for container default/pod2/pod2c0",
            timeout=5,
        )
        assert len(t.kubelet.calls) == calls, t.kubelet.calls[calls:]  # no Get at RunPodSandbox

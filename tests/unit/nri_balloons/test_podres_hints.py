"""Pod-resource device hints (reference §7.3, ``podresourceapi:<glob>``): the
glob resolution against a container's assigned devices, and the policy's use
of them (per balloon, removed when the container leaves, never avoided by
other types). The assignments are what the kubelet's cache would hold."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.devices import (
    container_device_cpus,
    far_devices,
    pod_resource_hints,
)
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import PreparedConfig, validate
from nri_framework import cpuset
from nri_framework.agent.podresources import DeviceAssignment
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.topologies import N4C16
from nri_framework.topology import Topology
from topologies import topology

NIC01 = DeviceAssignment("telco.com/nic", ("telconics0-numas01",), (0, 1))
NIC23 = DeviceAssignment("telco.com/nic", ("telconics1-numas23",), (2, 3))
TPU2 = DeviceAssignment("tech.com/tpu", ("tcomtpu-3-s1-numa2",), (2,))
TPU3 = DeviceAssignment("tech.com/tpu", ("tcomtpu-0-s1-numa3",), (3,))

CONFIG = """
reservedResources: {cpu: "cpuset:0"}
allocatorTopologyBalancing: false
pinMemory: false
balloonTypes:
- name: near-tpu
  preferCloseToDevices: ["podresourceapi:tech.com/*"]
  preferNewBalloons: true
  preferSpreadingPods: true
- name: near-nic
  preferCloseToDevices: ["podresourceapi:*.com/nic"]
  preferNewBalloons: true
  preferSpreadingPods: true
- name: shared-nic
  preferCloseToDevices: ["podresourceapi:*.com/nic"]
- name: near-node3
  preferCloseToDevices: ["/sys/devices/system/node/node3"]
"""


@pytest.fixture
def topo() -> Topology:
    return topology(N4C16)


def node_cpus(topo: Topology, *nodes: int) -> int:
    out = 0
    for n in nodes:
        out |= topo.nodes[n].cpus
    return out


def test_the_glob_matches_resource_names_and_gives_their_numa_nodes(
    topo: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "policy")
    allowed = topo.online & ~1
    cpus = container_device_cpus(topo, allowed, "*.com/nic", [TPU3, NIC01], "default/pod0/c0")
    assert cpus == node_cpus(topo, 0, 1) & allowed  # the NIC's nodes, the TPU ignored
    assert (
        'pod-resource device "telco.com/nic" of container default/pod0/c0 matches pattern '
        '"*.com/nic", NUMA nodes 0,1, device IDs [telconics0-numas01]'
    ) in caplog.text
    assert "tech.com/tpu" not in caplog.text
    # `*` does not cross `/` (Go's path.Match)
    assert container_device_cpus(topo, allowed, "*", [NIC01], "x") is None
    assert container_device_cpus(topo, allowed, "tech.com/*", [TPU2, TPU3], "x") == (
        node_cpus(topo, 2, 3)
    )


def test_nothing_known_or_nothing_matching_is_no_hint(topo: Topology) -> None:
    assert container_device_cpus(topo, topo.online, "tech.com/*", None, "x") is None
    assert container_device_cpus(topo, topo.online, "tech.com/*", [], "x") is None
    assert container_device_cpus(topo, topo.online, "tech.com/*", [NIC01], "x") is None
    no_topology = DeviceAssignment("tech.com/tpu", ("t",), ())
    assert container_device_cpus(topo, topo.online, "tech.com/*", [no_topology], "x") is None


def test_a_malformed_glob_is_upstreams_error(
    topo: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    assert container_device_cpus(topo, topo.online, "tech.com/[", [TPU2], "x") is None
    assert 'invalid resource glob pattern "tech.com/[": syntax error in pattern' in caplog.text


def test_an_unknown_numa_node_is_upstreams_error(
    topo: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    odd = DeviceAssignment("tech.com/tpu", ("t",), (2, 9))
    assert container_device_cpus(topo, topo.online, "tech.com/*", [odd], "ns/p/c") == (
        node_cpus(topo, 2)
    )
    assert (
        'unknown NUMA node 9 in the topology of device "tech.com/*" of container ns/p/c'
    ) in caplog.text
    huge = DeviceAssignment("tech.com/tpu", ("t",), (-1, 2**63 - 1))
    assert container_device_cpus(topo, topo.online, "tech.com/*", [huge], "x") is None


def test_hints_are_named_per_container_and_unresolvable_ones_dropped(
    topo: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "policy")
    entries = ["podresourceapi:tech.com/*", "podresourceapi:*.com/nic"]
    hints = pod_resource_hints(entries, topo, topo.online, [TPU3], "ctr1", "ns/p/c")
    assert list(hints) == ["podresourceapi:tech.com/*"]
    dev = hints["podresourceapi:tech.com/*"]
    assert dev.name == "__podres_ctr1_tech.com/*"
    assert dev.cpusets == [node_cpus(topo, 3)]
    assert (
        'dropping pod-resource device "podresourceapi:*.com/nic" hint: '
        "no device locality for container ns/p/c"
    ) in caplog.text


def test_other_types_never_avoid_pod_resource_hints() -> None:
    close = {"a": ["podresourceapi:*.com/nic", "/sys/x"], "b": []}
    assert far_devices(close, has_isolated=False) == {"a": [], "b": ["/sys/x"]}


# -- the policy --------------------------------------------------------------------


def prepared(text: str, topo: Topology) -> PreparedConfig:
    result = validate(load_policy(text), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    return result.prepared


def ctr(pod: str, name: str, balloon: str, cpus: int = 1) -> tuple[Pod, Container]:
    p = Pod(
        id=pod,
        name=pod,
        namespace="default",
        annotations={"balloon.balloons.resource-policy.nri.io": balloon},
    )
    cpu = CpuResources(shares=1024 * cpus, quota=100_000 * cpus, period=100_000)
    c = Container(id=f"{pod}-{name}", pod_sandbox_id=pod, name=name, resources=Resources(cpu=cpu))
    return p, c


def policy_with(
    topo: Topology, assigned: dict[tuple[str, str], list[DeviceAssignment]]
) -> BalloonsPolicy:
    policy = BalloonsPolicy(topo)
    policy.set_config(prepared(CONFIG, topo))
    policy.pod_devices = lambda ns, pod, c: assigned.get((pod, c))
    return policy


def test_each_container_lands_on_the_nodes_of_its_own_device(topo: Topology) -> None:
    assigned = {("pod0", "c0"): [NIC23], ("pod0", "c1"): [NIC01]}
    policy = policy_with(topo, assigned)
    got = {}
    for name in ("c0", "c1"):
        bln = policy.allocate(*ctr("pod0", name, "near-nic", cpus=2))
        assert bln is not None
        got[name] = bln.cpus
    assert got["c0"] & ~node_cpus(topo, 2, 3) == 0, cpuset.format(got["c0"])
    assert got["c1"] & ~node_cpus(topo, 0, 1) == 0, cpuset.format(got["c1"])


def test_four_tpus_on_four_nodes(topo: Topology) -> None:
    tpus = {n: DeviceAssignment("tech.com/tpu", (f"tpu-{n}",), (n,)) for n in range(4)}
    order = [3, 1, 0, 2]  # as upstream test24's device list
    assigned = {("pod1", f"c{i}"): [tpus[n]] for i, n in enumerate(order)}
    policy = policy_with(topo, assigned)
    for i, n in enumerate(order):
        bln = policy.allocate(*ctr("pod1", f"c{i}", "near-tpu"))
        assert bln is not None and bln.cpus & ~node_cpus(topo, n) == 0, (i, n)


def test_an_unknown_assignment_is_no_hint_and_the_hint_leaves_with_its_container(
    topo: Topology,
) -> None:
    assigned: dict[tuple[str, str], list[DeviceAssignment]] = {("pod0", "c0"): [TPU3]}
    policy = policy_with(topo, assigned)
    bln = policy.allocate(*ctr("pod0", "c0", "near-tpu"))
    assert bln is not None and bln.cpus & ~node_cpus(topo, 3) == 0
    assert set(policy.device_hints) == {bln.name}
    policy.release("pod0-c0")
    assert policy.device_hints == {}
    # no assignment known (the cache has not heard of the pod): placed without it
    other = policy.allocate(*ctr("pod9", "c0", "near-tpu"))
    assert other is not None and policy.device_hints == {}


def test_without_the_api_hints_are_dropped(topo: Topology) -> None:
    policy = BalloonsPolicy(topo)
    policy.set_config(prepared(CONFIG, topo))
    assert policy.pod_devices is None
    bln = policy.allocate(*ctr("pod0", "c0", "near-tpu"))
    assert bln is not None and policy.device_hints == {}


def test_a_hint_steers_only_its_own_balloon(topo: Topology) -> None:
    """The type's tree is shared: the slot of a podres entry holds the resizing
    balloon's device only, so a later balloon of the same type without an
    assignment is not drawn to the first one's node."""
    assigned = {("pod0", "c0"): [TPU3]}
    policy = policy_with(topo, assigned)
    first = policy.allocate(*ctr("pod0", "c0", "near-tpu"))
    assert first is not None and first.cpus & ~node_cpus(topo, 3) == 0
    # node 3 keeps free CPUs; a hint-less balloon goes where the tree puts it
    # (topology balancing off: packing, the first free CPUs), not to node 3
    second = policy.allocate(*ctr("pod1", "c0", "near-tpu"))
    assert second is not None
    assert second.cpus & node_cpus(topo, 3) == 0, cpuset.format(second.cpus)


def test_the_hint_leaves_a_balloon_that_stays(
    topo: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "policy")
    assigned = {("pod0", "c0"): [NIC23], ("pod0", "c1"): [NIC01]}
    policy = policy_with(topo, assigned)
    bln = policy.allocate(*ctr("pod0", "c0", "shared-nic"))
    joined = policy.allocate(*ctr("pod0", "c1", "shared-nic"))
    assert joined is bln  # the same pod's balloon: its hint stays the creator's
    assert policy.device_hints[bln.name][0] == "pod0-c0"
    policy.release("pod0-c0")
    assert bln in policy.balloons and policy.device_hints == {}
    assert (
        f"removed pod-resource device hints of container default/pod0/c0 from balloon {bln.name}"
    ) in caplog.text


def test_hints_without_the_api_get_a_warning_at_configuration() -> None:
    from nri_balloons.features import unimplemented

    text = 'reservedResources: {cpu: "1"}\nballoonTypes: [{name: nic, %s}]\n%s'
    hinted = 'preferCloseToDevices: ["podresourceapi:*.com/nic"]'
    (warning,) = unimplemented(load_policy(text % (hinted, "")).spec)
    assert warning == (
        "balloon type 'nic': pod-resources device hints ['podresourceapi:*.com/nic'] need "
        "agent.podResourceAPI: true (the kubelet's pod-resources API); they are dropped"
    )
    on = "agent: {podResourceAPI: true}\n"
    assert unimplemented(load_policy(text % (hinted, on)).spec) == []
    assert unimplemented(load_policy(text % ("minCPUs: 1", on)).spec) == []


# -- the plugin: an answer after the placement ---------------------------------------


def test_a_late_answer_moves_nothing_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The container was placed before its pod's answer: it stays; the plugin
    says so once however many Lists repeat the answer."""
    from nri_balloons.plugin import Balloons
    from nri_framework.agent.podresources import PodResourcesClient
    from nri_framework.host import PolicyHost
    from nri_framework.simulate.sysfs import write_topology

    caplog.set_level(logging.INFO, "policy")
    root = write_topology(tmp_path / "host", N4C16)
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(CONFIG + "agent: {podResourceAPI: true}\n")
    plugin = Balloons()
    PolicyHost("balloons", plugin, options={"config_file": str(cfg)}, host_root=str(root))
    assert isinstance(plugin.podres, PodResourcesClient)  # not started: no loop yet
    assert plugin.podres.socket == f"{root}/var/lib/kubelet/pod-resources/kubelet.sock"
    assert plugin.policy is not None
    bln = plugin.policy.allocate(*ctr("pod0", "c0", "near-tpu"))
    assert bln is not None and plugin.policy.device_hints == {}
    placed = bln.cpus
    plugin.podres.cache.put(("default", "pod0"), {"c0": (TPU3,)})  # what a List brings
    for _ in range(3):
        plugin._pod_resources_arrived("", "")
    assert bln.cpus == placed
    late = "pod-resources of container default/pod0/c0 arrived after it was placed"
    assert caplog.text.count(late) == 1


def test_a_debug_line_shows_a_bounded_number_of_device_ids(
    topo: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "policy")
    many = DeviceAssignment("tech.com/tpu", tuple(f"id{i}" for i in range(10_000)), (3,))
    assert container_device_cpus(topo, topo.online, "tech.com/*", [many], "x") is not None
    (line,) = [r.getMessage() for r in caplog.records if "device IDs" in r.getMessage()]
    shown = " ".join(f"id{i}" for i in range(16))
    assert line.endswith(f"device IDs [{shown} ...(9984 more)]")


def test_upstreams_podresapi_logger_name_debugs_the_client() -> None:
    from nri_balloons.plugin import Balloons

    plugin = Balloons()
    plugin.debug_loggers(["podresapi"])
    try:
        assert logging.getLogger("nri_framework.podresources").level == logging.DEBUG
    finally:
        plugin.debug_loggers([])
    assert logging.getLogger("nri_framework.podresources").level == logging.NOTSET

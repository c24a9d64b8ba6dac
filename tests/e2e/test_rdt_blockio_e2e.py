"""RDT and block I/O classes on the real containerds (each test once per runtime).

containerd applies a block I/O class from its own ``blockio_config_file`` (goresctrl
blockio; :data:`containerd_config.BLOCKIO_CLASSES` defines ``slowreader``, weight 80):
the balloons plugin sets the class of an annotated container in its CreateContainer
adjustment and the container's OCI spec (``linux.resources.blockIO``) carries the
class's parameters. What the runtimes do with a class they do not know, seen here:

* block I/O: containerd fails the container's creation (``no OCI BlockIO parameters
  for class``); the plugin cannot know the runtime's classes, as upstream cannot, so a
  well-formed name goes to the runtime as it is;
* RDT: containerd writes any class to ``linux.intelRdt.closID`` without looking at
  resctrl (not mounted on this machine), and runc starts the container without a
  resctrl group: an RDT class is only as real as the runtime's RDT configuration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from containerd_host import cgroup_v1_root
from cri_client import CRIClient
from nri_framework.pb import cri_pb2

if TYPE_CHECKING:
    from conftest import PluginFactory, PluginProcess

pytestmark = pytest.mark.e2e

CONFIG = """
reservedResources: {cpu: "cpuset:0"}
balloonTypes:
- name: app
  namespaces: ["*"]
control:
  blockio: {enable: true}
  rdt: {enable: true}
"""

SLEEP = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
BLOCKIO = "blockioclass.resource-policy.nri.io"
RDT = "rdtclass.resource-policy.nri.io"


def runtime_spec(cri: CRIClient, cid: str) -> dict[str, Any]:
    """The OCI spec containerd created the container with (after NRI's adjustment)."""
    status = cri.runtime.ContainerStatus(
        cri_pb2.ContainerStatusRequest(container_id=cid, verbose=True), timeout=cri.timeout
    )
    spec: dict[str, Any] = json.loads(status.info["info"])["runtimeSpec"]
    return spec


def create(cri: CRIClient, name: str, annotations: dict[str, str]) -> str:
    pod = cri.run_pod(name, annotations=annotations)
    return cri.create_container(pod.id, pod.config, "c", command=SLEEP)


@pytest.fixture
def balloons(plugins: PluginFactory, tmp_path: Path) -> PluginProcess:
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(CONFIG)
    return plugins.start("balloons", "10", extra_args=("--config-file", str(cfg)))


def kernel_block_io_weight() -> bool:
    """The kernel takes a block I/O weight (what runc writes for the class at
    start): cgroup v1's blkio hierarchy has a weight file (CFQ's or BFQ's), or
    a cgroup v2 host (``/sys/fs/cgroup`` itself) has the io controller. A
    kernel without (a VM's block devices without BFQ) makes runc fail the
    start: the kernel's doing, not the plugin's, whose part ends in the OCI
    spec."""
    blkio = cgroup_v1_root("blkio")
    if blkio is not None:
        return (blkio / "blkio.weight").exists() or (blkio / "blkio.bfq.weight").exists()
    unified = Path("/sys/fs/cgroup/cgroup.controllers")
    return unified.exists() and "io" in unified.read_text().split()


def test_blockio_class_reaches_the_oci_spec(balloons: PluginProcess, cri: CRIClient) -> None:
    cid = create(cri, "blockio", {f"{BLOCKIO}/container.c": "slowreader"})
    assert runtime_spec(cri, cid)["linux"]["resources"].get("blockIO") == {"weight": 80}
    if kernel_block_io_weight():
        cri.start_container(cid)
        assert cri.container_status(cid).state == cri_pb2.CONTAINER_RUNNING
    plain = create(cri, "plain", {})
    assert "blockIO" not in runtime_spec(cri, plain)["linux"]["resources"]


def test_unknown_blockio_class_fails_in_the_runtime(
    balloons: PluginProcess, cri: CRIClient
) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        create(cri, "unknown", {BLOCKIO: "nosuchclass"})
    assert 'no OCI BlockIO parameters for class "nosuchclass"' in str(failed.value.details())
    # a malformed name never reaches the runtime: the container is created without one
    cid = create(cri, "malformed", {BLOCKIO: "no such class"})
    assert "blockIO" not in runtime_spec(cri, cid)["linux"]["resources"]
    assert "invalid block I/O class annotation" in balloons.log_text()


def test_rdt_class_reaches_the_oci_spec_without_resctrl(
    balloons: PluginProcess, cri: CRIClient
) -> None:
    cid = create(cri, "rdt", {RDT: "gold"})
    assert runtime_spec(cri, cid)["linux"].get("intelRdt") == {"closID": "gold"}
    if Path("/sys/fs/resctrl/schemata").exists():
        return  # resctrl mounted: whether "gold" exists is this machine's
    cri.start_container(cid)  # runc, without resctrl, runs it unpartitioned
    assert cri.container_status(cid).state == cri_pb2.CONTAINER_RUNNING

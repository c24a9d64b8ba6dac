"""The chart's DaemonSet pod with ``agent.podResourceAPI`` on the real runtime:
containerd runs the plugin pod (through the kubelet stand-in), the plugin
reads the kubelet's pod-resources API through the chart's
``pod-resources-socket`` volume and ``--pod-resources-socket``, and a
workload pod lands on the NUMA node of the device assigned to it.

No kubelet can run here: the pod-resources API is ``tests/_podresources.py``
(a real gRPC server, ours, standing in for the kubelet) on a unix socket in
the directory the volume's hostPath is mapped onto. The node's sysfs is the
simulated 6776P (4 NUMA nodes of 64 CPUs): the workload's CPUs are checked in
the OCI spec containerd made from the plugin's adjustment (they are not on
this machine, so it is not started).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import test_daemonset_e2e as _ds
from containerd_env import ContainerdEnv
from cri_client import BUSYBOX_IMAGE, CRIClient
from daemonset_fixtures import find, free_port, render_chart
from daemonset_node import first, ids, node_with_plugin, runtime_cpus, wait
from kubelet import PodObject

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from _podresources import Assigned, Kubelet  # noqa: E402

pytestmark = pytest.mark.e2e

# the DaemonSet tier's fixtures (one home: test_daemonset_e2e)
daemonset_images = _ds.daemonset_images
imported = _ds.imported
api = _ds.api

NS = "nri-podres"
NODE3 = set(range(96, 128)) | set(range(224, 256))  # the 6776P fixture's NUMA node 3


@contextmanager
def kubelet_api(socket: Path) -> Iterator[Kubelet]:
    """The stand-in served from its own thread's event loop (the e2e tests are sync)."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    kubelet = Kubelet(socket)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(kubelet.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30), "the stand-in kubelet did not start"
    try:
        yield kubelet
    finally:
        asyncio.run_coroutine_threadsafe(kubelet.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def tpu_user() -> PodObject:
    one = {"cpu": "2", "memory": "64Mi"}
    return PodObject.from_manifest(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "tpu-user",
                "namespace": "default",
                "annotations": {"balloon.balloons.resource-policy.nri.io": "near-tpu"},
            },
            "spec": {
                "containers": [
                    {
                        "name": "c0",
                        "image": BUSYBOX_IMAGE,
                        "command": ["sleep", "3600"],
                        "resources": {"requests": one, "limits": one},
                    }
                ]
            },
        }
    )


def test_daemonset_pod_reads_the_kubelets_pod_resources(
    containerd_env: ContainerdEnv, cri: CRIClient, imported: None, api: Any, tmp_path: Path
) -> None:
    st, _front = api
    port = free_port()
    config = {
        "instrumentation": {"httpEndpoint": f"127.0.0.1:{port}"},
        "reservedPoolNamespaces": ["kube-system", NS],
        "agent": {"nodeResourceTopology": False, "podResourceAPI": True},
        "balloonTypes": [
            {
                "name": "near-tpu",
                "preferCloseToDevices": ["podresourceapi:tech.com/*"],
                "preferNewBalloons": True,
                "preferSpreadingPods": True,
            }
        ],
        "log": {"debug": ["policy", "nri_framework.podresources"]},
    }
    docs = render_chart({"config": config}, NS)
    from kubernetes import client

    policy = ("config.nri", "v1alpha1", NS, "balloonspolicies")
    with st.api_client() as c:
        client.CustomObjectsApi(c).create_namespaced_custom_object(
            *policy, find(docs, "BalloonsPolicy")
        )
    socket = tmp_path / "node" / "pod-resources" / "kubelet.sock"
    try:
        with kubelet_api(socket) as kubelet:
            # device plugins allocate at admission, before the sandbox runs
            kubelet.assign("default", "tpu-user", "c0", Assigned("tech.com/tpu", "tpu-3", (3,)))
            with node_with_plugin(False, containerd_env, cri, api, tmp_path, docs=docs) as (
                pod,
                kl,
                _dirs,
            ):
                listed = "pod-resources: List gave 1 pods"
                wait(lambda: listed in pod.logs(), "the plugin's List", 30, pod.diag)
                rp = kl.run_pod(tpu_user(), start=False)
                got = ids(runtime_cpus(cri, first(rp)))
                assert len(got) == 2 and got <= NODE3, (sorted(got), pod.diag())
                log = pod.logs()
                assert (
                    'pod-resource device "tech.com/tpu" of container default/tpu-user/c0 '
                    'matches pattern "tech.com/*", NUMA nodes 3, device IDs [tpu-3]'
                ) in log, log[-3000:]
                print(f"[daemonset] pod-resources: tpu-user/c0 on {sorted(got)} (NUMA node 3)")
                kl.stop_pod(rp)
    finally:
        with st.api_client() as c:
            client.CustomObjectsApi(c).delete_namespaced_custom_object(*policy, "default")

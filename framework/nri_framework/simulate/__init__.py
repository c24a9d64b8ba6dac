"""A runtime simulator: containerd's side of NRI, and Pod YAML as the kubelet sees it.

* :mod:`.runtime` -- :class:`SimulatedRuntime`, the NRI runtime side over a unix
  socket: the pod and container store and the CRI-like operations;
* :mod:`.adaptation` -- its plugins: registration, Configure, Synchronize with
  paging, event fan-out, timeouts, plugin updates;
* :mod:`.peer` -- the runtime's end of one plugin trunk;
* :mod:`.merge` -- merging plugin answers with per-field ownership;
* :mod:`.emulation` -- which runtime and NRI version is emulated;
* :mod:`.wire` -- containerd's way of applying new resources to a container;
* :mod:`.podspec` -- Kubernetes Pod YAML -> NRI pods/containers (QoS, shares,
  quota, memory limit, labels);
* :mod:`.sysfs` -- sysfs trees for a simulated host; :mod:`.topologies` -- the
  named topologies they are written from;
* :mod:`.scenario` -- ``nri-resource-policy simulate``.
"""

from nri_framework.kubelet_cpu import QOSClass
from nri_framework.simulate.emulation import CONTAINERD_1_7, NRI_V0_12, Emulation
from nri_framework.simulate.podspec import SimPod, load_pod_dir, pods_from_yaml
from nri_framework.simulate.runtime import NriError, PluginInfo, SimulatedRuntime

__all__ = [
    "CONTAINERD_1_7",
    "NRI_V0_12",
    "Emulation",
    "NriError",
    "PluginInfo",
    "QOSClass",
    "SimPod",
    "SimulatedRuntime",
    "load_pod_dir",
    "pods_from_yaml",
]

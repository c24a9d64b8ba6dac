"""A runtime simulator: containerd's side of NRI, and Pod YAML as the kubelet sees it.

* :mod:`.runtime` -- :class:`SimulatedRuntime`, the NRI runtime side over a unix
  socket (registration, Configure, Synchronize with paging, events, merging
  of plugin answers, timeouts, a container table);
* :mod:`.podspec` -- Kubernetes Pod YAML -> NRI pods/containers (QoS, shares,
  quota, memory limit, labels);
* :mod:`.quantity` -- Kubernetes resource quantities;
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

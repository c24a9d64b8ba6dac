"""nri_sst: the privileged Intel SST helper sidecar and its client.

The helper (``nri-sst-helper serve``) is the only writer to hardware: SST
(CP/TF/BF via ``/dev/isst_interface``), cpufreq, cpuidle and uncore sysfs.
The plugin talks to it through :mod:`nri_sst.client` over the ZeroMQ wire
protocol (ZMTP 3.1; the blocking client and the helper speak it themselves
through :mod:`nri_sst.zmtp`, the asyncio client through pyzmq) with the
closed message set of :mod:`nri_sst.messages`.

At runtime this package imports only itself, ``pyzmq`` and ``msgspec``.
"""

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change of :mod:`nri_sst.messages`."""

__all__ = ["PROTOCOL_VERSION"]

"""The balloons policy's command line: its ``run`` flags (the hook
``policy_addoption``), their values as :class:`BalloonsOptions`, and the SST
helper as the policy's :class:`~nri_framework.contract.Peer`.

The chart gives both containers the helper's socket directory (emptyDir
volume ``sst-ipc`` at ``/run/nri-sst``, ``templates/daemonset.yaml``); the
plugin pins containers without the helper (cpuClasses wait for it), and
``/healthz`` fails until its socket is there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
from nri_framework.contract import Peer
from nri_sst.retry import Obstacle

HELPER_DIR_FIX = (
    "share the SST helper's socket directory: chart emptyDir volume sst-ipc, mounted at "
    "/run/nri-sst in both the plugin and the sst-helper container"
)
HELPER_SOCKET_FIX = (
    "the sst-helper container has not created it: see that container's log; both containers "
    "must mount the chart's emptyDir volume sst-ipc at /run/nri-sst"
)


class BalloonsOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What the command line tells the policy (a host built without one: the defaults)."""

    #: ``--sst-helper``: the helper's socket; empty: cpuClasses are only logged
    sst_helper: str = ""
    #: ``--config-file`` (the framework's flag): the BalloonsPolicy to start with
    config_file: str = ""
    #: ``--pod-resources-socket``: the kubelet's pod-resources API (empty: its
    #: default path under ``--host-root``), used with ``agent.podResourceAPI``
    pod_resources_socket: str = ""


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The policy's own ``run`` flags, in the group ``balloons``."""
    group = parser.add_argument_group("balloons")
    group.add_argument(
        "--sst-helper",
        default="",
        help="the SST helper's socket (ipc://PATH): cpuClasses are applied through it; "
        "without it they are only logged",
    )
    group.add_argument(
        "--pod-resources-socket",
        default="",
        help="the kubelet's pod-resources API socket, read for podresourceapi: device hints "
        "when the configuration sets agent.podResourceAPI (default: "
        "/var/lib/kubelet/pod-resources/kubelet.sock under --host-root)",
    )


def helper_obstacle(endpoint: str) -> Obstacle | None:
    """The SST helper's ``ipc://`` socket (or its directory) is not there."""
    if not endpoint.startswith("ipc://"):
        return None  # not a socket file: nothing to look for
    path = Path(endpoint.removeprefix("ipc://"))
    if not path.parent.is_dir():
        return Obstacle(str(path.parent), "does not exist (SST helper socket directory)",
                        HELPER_DIR_FIX)  # fmt: skip
    if not path.is_socket():
        return Obstacle(str(path), "does not exist (SST helper socket)", HELPER_SOCKET_FIX)
    return None


def helper_peer(options: BalloonsOptions) -> Peer | None:
    """The SST helper the host watches for ``/healthz``; ``None`` without ``--sst-helper``."""
    endpoint = options.sst_helper
    if not endpoint:
        return None
    return Peer("SST helper", endpoint, lambda: helper_obstacle(endpoint))

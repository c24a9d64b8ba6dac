"""The balloons policy's command line: ``--sst-helper`` is its flag, read
typed (:class:`BalloonsOptions`), and names the peer the host watches."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from nri_balloons.cmdline import BalloonsOptions, helper_obstacle
from nri_balloons.plugin import Balloons
from nri_framework.host import PolicyHost
from nri_framework.simulate.sysfs import write_topology


def test_options_reach_the_policy_typed(tmp_path: Path) -> None:
    root = write_topology(tmp_path / "host", "n4c16")
    sock = tmp_path / "sst" / "helper.sock"
    args = argparse.Namespace(sst_helper=f"ipc://{sock}", config_file="", nri_socket="/x")
    plugin = Balloons()
    PolicyHost("balloons", plugin, options=args, host_root=str(root))
    assert plugin.options == BalloonsOptions(sst_helper=f"ipc://{sock}")
    peer = plugin.policy_peer()
    assert peer is not None and (peer.name, peer.endpoint) == ("SST helper", f"ipc://{sock}")
    missing = peer.look()
    assert missing is not None and str(missing).startswith(
        f"{sock.parent} does not exist (SST helper socket directory)"
    )
    assert "emptyDir volume sst-ipc" in str(missing)
    sock.parent.mkdir()
    assert str(peer.look()).startswith(f"{sock} does not exist (SST helper socket)")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(sock))
        assert peer.look() is None


def test_no_helper_no_peer(tmp_path: Path) -> None:
    root = write_topology(tmp_path / "host", "n4c16")
    plugin = Balloons()
    PolicyHost("balloons", plugin, host_root=str(root))
    assert plugin.options == BalloonsOptions()
    assert plugin.policy_peer() is None
    assert helper_obstacle("tcp://127.0.0.1:1") is None  # not a socket file

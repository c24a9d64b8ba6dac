"""The SST helper awaited at start (sstlink.START_GRACE): the plugin's
container may start before the helper's sidecar. While no helper process has
answered, within the grace, its failures are a WARNING (PCT reported degraded
all the same), not an ERROR per decision; after the grace one ERROR. A
helper that answered once is not awaited: its outage is an ERROR at once
(tests/integration/nri_balloons/test_pct_helper_faults.py).

The writer is the plugin's real one on an ``ipc://`` socket nobody serves
(its client fails "not connected" after its connect grace); the clock is
injected."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.sstlink import START_GRACE, HelperWriter
from nri_balloons.validation import validate
from nri_framework.topology import Topology
from pct_helpers import (
    SPEC,
    host_root,
    pod,
    shared_root,  # noqa: F401 (the module's autouse host tree)
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_helper_awaited_at_start_is_a_warning_then_one_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    writer = HelperWriter(f"ipc://{tmp_path}/helper.sock", clock=clock)
    caplog.set_level(logging.INFO, logger="cpuclass")
    topo = Topology.from_sysfs(str(host_root()))
    policy = BalloonsPolicy(topo, str(host_root()), writer=writer)
    result = validate(load_policy(SPEC.read_text()), online_cpus=topo.online)
    assert result.prepared is not None
    try:
        policy.set_config(result.prepared)
        assert not policy.cpu_classes.commit()
        for i in range(3):  # pod starts while the sidecar is not there yet
            assert policy.allocate(*pod(f"hp{i}", 2, "hp-bln")) is not None
            assert not policy.cpu_classes.commit()
            clock.now += START_GRACE / 4
        assert not errors(caplog)
        waiting = [m for m in caplog.messages if "pct: SST helper not there yet:" in m]
        assert len(waiting) == 1, caplog.messages
        assert policy.cpu_classes.pct.degraded  # reported all the same
        clock.now += START_GRACE  # the grace is over: now it is missing
        for i in range(3):
            assert policy.allocate(*pod(f"late{i}", 2, "hp-bln")) is not None
            assert not policy.cpu_classes.commit()
        assert [e.split(":")[0:2] for e in errors(caplog)] == [
            ["pct", " SST helper unavailable"],
            ["cpuclass", " SST helper unavailable"],
        ], errors(caplog)
    finally:
        writer.close()

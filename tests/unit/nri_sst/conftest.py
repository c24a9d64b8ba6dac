"""Host roots for the helper's unit tests.

The full Xeon 6776P tree takes seconds to write, so it is made once per session
and only read; tests that write sysfs use :func:`small_root`, a 16-CPU machine
with the same shape (2 packages x 2 punits, SMT sibling = cpu + ncores).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import GNR_CSTATES, CpuFreqSpec, TopologySpec, UncoreSpec
from nri_sst.backends.sim import SimConfig

SMALL = TopologySpec(
    name="small-6776p",
    packages=2,
    nodes_per_die=2,
    cores_per_node=2,
    threads_per_core=2,
    numbering="smt-last",
    die_id_is_package=True,
    cpufreq=CpuFreqSpec(min_khz=800_000, base_khz=2_300_000, max_khz=4_600_000),
    cstates=GNR_CSTATES,
    uncore=UncoreSpec(),
)
SMALL_SIM = SimConfig(cores_per_punit=2)


@pytest.fixture(scope="session")
def xeon_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dual-socket Xeon 6776P sysfs (read-only: shared by the session)."""
    return write_topology(tmp_path_factory.mktemp("xeon") / "host", "xeon-6776p")


@pytest.fixture
def small_root(tmp_path: Path) -> Path:
    """A 16-CPU 6776P-shaped sysfs the test may write to."""
    return write_topology(tmp_path / "host", SMALL)

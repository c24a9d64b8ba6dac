"""The catalogue of named topologies (:mod:`nri_framework.simulate.topologies`)."""

from __future__ import annotations

import pytest
from nri_framework.simulate.sysfs import TopologyError
from nri_framework.simulate.topologies import (
    N4C16,
    S8C4K,
    TOPOLOGIES,
    XEON_6776P,
    TopologySpec,
)
from nri_framework.topology import TopologyError as DiscoveryError


def test_presets() -> None:
    assert set(TOPOLOGIES) == {"n4c16", "xeon-6776p", "pct16", "s8c4k", "hybrid12", "n6-hbm-cxl"}
    assert (N4C16.ncpus, XEON_6776P.ncpus, S8C4K.ncpus) == (16, 256, 4096)
    assert TopologyError is DiscoveryError


def test_xeon_numbering_matches_sst_reference() -> None:
    # sst.md §5.2: thread = c // 128, core_in_pkg = c % 64, pkg = (c % 128) // 64,
    # punit (= SNC node within the package) = core_in_pkg // 32.
    cpus = list(XEON_6776P.cpus())
    assert [c.cpu for c in cpus] == list(range(256))
    for c in cpus:
        pkg = (c.cpu % 128) // 64
        assert (c.thread, c.core_id, c.package, c.die) == (c.cpu // 128, c.cpu % 64, pkg, pkg)
        assert c.node == 2 * pkg + (c.cpu % 64) // 32


def test_n4c16_numbering_is_qemu() -> None:
    cpus = list(N4C16.cpus())
    assert [(c.package, c.node, c.core_id, c.thread) for c in cpus[:6]] == [
        (0, 0, 0, 0),
        (0, 0, 0, 1),
        (0, 0, 1, 0),
        (0, 0, 1, 1),
        (0, 1, 2, 0),
        (0, 1, 2, 1),
    ]
    assert cpus[15].package == 1 and cpus[15].node == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"packages": 0},
        {"threads_per_core": 0},
        {"dies_per_package": 2, "die_id_is_package": True},
        {"cores_per_node": 3, "cores_per_l2": 2},
        {"online": "0-99"},
        {"online": ""},
        {"online": "x"},
        {"online": "0", "present": "1"},
        {"present": "0-99"},
    ],
)
def test_invalid_specs(kwargs: dict[str, object]) -> None:
    with pytest.raises(TopologyError):
        TopologySpec(**kwargs)  # type: ignore[arg-type]

"""RDT partitions (``control.rdt`` ``partitions``/``options``/``force``):
:func:`nri_balloons.rdtpartitions.resolve` computes goresctrl v0.13's
schemata (the figures below worked by hand through goresctrl's
``cacheResolver`` and ``Overlay``), and the plugin sends them through the SST
helper's own request handler and sim resctrl in-process
(:class:`pct_helpers.InProcessHelper`: only the socket is a stand-in)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.rdtpartitions import RdtConfigError, resolve
from nri_framework.hookspecs import PolicyError
from nri_sst import messages as m
from nri_sst.backends.sim import SimConfig

from .pct_helpers import (  # noqa: F401
    InProcessHelper,
    PluginWithHelper,
    shared_root,
    start,
)

L3 = m.ResctrlResource(name="L3", cache_ids=[0, 1], num_closids=16, cbm_mask=0x7FFF, min_cbm_bits=1)
MB = m.ResctrlResource(
    name="MB", cache_ids=[0, 1], num_closids=16, bandwidth_gran=10, min_bandwidth=10
)
INFO = m.ReadResctrlReply(mounted=True, resources=[L3, MB], groups=[], managed=[])

PARTITIONS = """
reservedResources: {cpu: "cpuset:0-1"}
balloonTypes: [{name: plain, minBalloons: 1, minCPUs: 2, maxCPUs: 2}]
control:
  rdt:
    enable: true
    partitions:
      exclusive:
        l3Allocation: {all: {unified: "60%"}}
        mbAllocation: {all: ["100%"]}
        classes:
          Guaranteed: {l3Allocation: {all: {unified: "100%"}}}
      shared:
        l3Allocation: {all: {unified: "40%"}}
        mbAllocation: {all: ["50%"]}
        classes:
          Burstable: {l3Allocation: {all: {unified: "50%"}}, mbAllocation: {all: ["50%"]}}
          BestEffort:
            l3Allocation: {all: {unified: "50-100%"}, "1": {unified: "0x3"}}
          system/default: {}
"""


def groups(text: str, info: m.ReadResctrlReply = INFO) -> dict[str, dict[str, dict[int, int]]]:
    rdt = load_policy(text).spec.control.rdt
    return {g.name: g.schemata for g in resolve(rdt, info)}


def test_partitions_split_the_ways_and_classes_take_their_share() -> None:
    # 15 ways: shared (40%, the smaller request first) gets 40*15/100 = 6, exclusive
    # (the last) the 9 left; placed from bit 0 in name order: exclusive 0x1ff, shared 0x7e00
    out = groups(PARTITIONS)
    assert out["Guaranteed"]["L3"] == {0: 0x1FF, 1: 0x1FF}
    # 50% of shared's 6 ways from its low end: bits (1-1)*6/100..(50-1)*6/100 = 0..2
    assert out["Burstable"]["L3"] == {0: 0xE00, 1: 0xE00}
    # 50-100%: bits 49*6/100=2 .. 99*6/100=5 of shared; cache id 1: 0x3 << 9
    assert out["BestEffort"]["L3"] == {0: 0x7800, 1: 0x600}
    # system/default is resctrl's root group: its partition's ways whole
    assert out[""]["L3"] == {0: 0x7E00, 1: 0x7E00}
    # MB: the class's percentage of its partition's (50% of 50% = 25, up to the 10 grain)
    assert out["Burstable"]["MB"] == {0: 30, 1: 30}
    assert out["Guaranteed"]["MB"] == {0: 100, 1: 100}
    assert list(out) == ["", "BestEffort", "Burstable", "Guaranteed"]


def test_absolute_partitions_and_min_cbm_bits() -> None:
    info = m.ReadResctrlReply(
        mounted=True,
        resources=[
            m.ResctrlResource(
                name="L3", cache_ids=[0], num_closids=16, cbm_mask=0x7FFF, min_cbm_bits=2
            )
        ],
        groups=[],
        managed=[],
    )
    text = """
reservedResources: {cpu: "1"}
control:
  rdt:
    enable: true
    partitions:
      a:
        l3Allocation: {all: {unified: "0-7"}}
        classes: {A: {l3Allocation: {all: {unified: "1%"}}}}
      b: {l3Allocation: {all: {unified: "0x7f00"}}, classes: {B: {}}}
"""
    out = groups(text, info)
    assert out["A"] == {"L3": {0: 0x3}}  # 1% of 8 ways is 1 bit: widened to min_cbm_bits
    assert out["B"] == {"L3": {0: 0x7F00}}


@pytest.mark.parametrize(
    ("allocations", "error"),
    [
        (
            'a: {l3Allocation: {all: {unified: "70%"}}}'
            ' | b: {l3Allocation: {all: {unified: "40%"}}}',
            "accumulated L3 unified partition allocation requests for cache id 0 "
            "exceeds 100% (110%)",
        ),
        (
            'a: {l3Allocation: {all: {unified: "0-7"}}}'
            ' | b: {l3Allocation: {all: {unified: "7-9"}}}',
            "overlapping L3 partition allocation requests for cache id 0",
        ),
        (
            'a: {l3Allocation: {all: {unified: "0-7"}}}'
            ' | b: {l3Allocation: {all: {unified: "40%"}}}',
            "mixing absolute and relative allocations between partitions not supported",
        ),
        (
            'a: {l3Allocation: {all: {unified: "0x5"}}}',
            'invalid cache bitmask "0x5": more than one continuous block of ones',
        ),
        (
            'a: {l3Allocation: {all: {unified: "101%"}}}',
            "invalid percentage value '101%'",
        ),
        (
            'a: {l3Allocation: {all: {unified: "20-40%"}}}',
            "percentage ranges in partition allocation not supported",
        ),
        (
            'a: {l3Allocation: {all: {unified: "50%"}}} | b: {classes: {B: {}}}',
            'some partitions (b) missing L3 "unified" allocation request for cache id 0',
        ),
        (
            "a: {classes: {B: {l3Allocation: {all: {unified: '50%'}}}}}",
            "L3 allocation missing from partition 'a' but class 'B' specifies L3 schema",
        ),
        (
            "a: {classes: {X: {}}} | b: {classes: {X: {}}}",
            "class names must be unique, 'X' defined multiple times",
        ),
        (
            "a: {classes: {'..': {}}}",
            "unqualified class name '..'",
        ),
    ],
)
def test_invalid_configurations_get_goresctrls_errors(allocations: str, error: str) -> None:
    allocations = allocations.replace(" | ", "\n      ")
    text = f"""
reservedResources: {{cpu: "1"}}
control:
  rdt:
    enable: true
    partitions:
      {allocations}
"""
    with pytest.raises(RdtConfigError) as err:
        groups(text)
    assert str(err.value).startswith("invalid configuration: ")
    assert error.replace("'", "").replace('"', "") in str(err.value).replace("'", "").replace(
        '"', ""
    )


def test_an_allocation_the_system_lacks_fails_unless_optional() -> None:
    no_l2 = """
reservedResources: {cpu: "1"}
control:
  rdt:
    enable: true
    OPTIONS
    partitions:
      a:
        l2Allocation: {all: {unified: "100%"}}
        classes: {A: {l2Allocation: {all: {unified: "50%"}}}}
"""
    with pytest.raises(RdtConfigError, match="L2 cache allocation for 'A' specified in"):
        groups(no_l2.replace("OPTIONS", ""))
    out = groups(no_l2.replace("OPTIONS", "options: {l2: {optional: true}}"))
    assert "L2" not in out["A"] and out["A"]["L3"] == {0: 0x7FFF, 1: 0x7FFF}


# -- the plugin through the helper --------------------------------------------------


def resctrl(helper: InProcessHelper) -> dict[str, dict[str, dict[int, int]]]:
    reply = helper.handler.dispatch(m.ReadResctrl(), b"inspector")
    assert isinstance(reply, m.ReadResctrlReply)
    return {g.name: g.schemata for g in reply.groups}


def test_the_configuration_creates_the_groups_and_a_reload_replaces_them(
    tmp_path: Path,
) -> None:
    helper = InProcessHelper(SimConfig())
    plugin = start(helper, PARTITIONS, tmp_path)
    try:
        now = resctrl(helper)
        assert set(now) == {"", "BestEffort", "Burstable", "Guaranteed"}
        assert now["Guaranteed"]["L3"] == {0: 0x1FF, 1: 0x1FF}
        assert now["Burstable"]["MB"] == {0: 30, 1: 30}
        # a reload without BestEffort: its (empty) group goes, the others are rewritten
        reload = (
            PARTITIONS.replace(
                '          BestEffort:\n            l3Allocation: {all: {unified: "50-100%"}, '
                '"1": {unified: "0x3"}}\n',
                "",
            )
            .replace('unified: "60%"', 'unified: "50%"')
            .replace('unified: "40%"', 'unified: "50%"')
        )
        plugin.reconfigure(reload, "test")
        now = resctrl(helper)
        assert set(now) == {"", "Burstable", "Guaranteed"}
        assert now["Guaranteed"]["L3"] == {0: 0x7F, 1: 0x7F}  # 7 of 15 ways (name order)
    finally:
        plugin.policy_shutdown()


def test_an_invalid_reload_is_refused_and_resctrl_keeps_the_running_one(tmp_path: Path) -> None:
    helper = InProcessHelper(SimConfig())
    plugin = start(helper, PARTITIONS, tmp_path)
    try:
        before = resctrl(helper)
        with pytest.raises(PolicyError, match="failed to configure goresctrl/rdt: invalid"):
            plugin.reconfigure(PARTITIONS.replace('"60%"', '"70%"'), "test")
        assert resctrl(helper) == before
        assert plugin.policy is not None and plugin.policy.config is not None
        assert plugin.policy.config.spec.control.rdt.partitions["exclusive"].l3_allocation
    finally:
        plugin.policy_shutdown()


def test_a_group_the_helper_did_not_create_is_kept_unless_force(tmp_path: Path) -> None:
    helper = InProcessHelper(SimConfig())
    foreign = m.SetResctrl(groups=[m.ResctrlGroup(name="theirs", schemata={})])
    helper.handler.dispatch(m.Hello(protocol=1), b"other")
    assert isinstance(helper.handler.dispatch(foreign, b"other"), m.SetResctrlReply)
    helper.handler.resctrl.managed.discard("theirs")  # as created by someone else
    plugin = start(helper, PARTITIONS, tmp_path)
    try:
        assert "theirs" in resctrl(helper)
        plugin.reconfigure(PARTITIONS.replace("enable: true", "enable: true\n    force: true"), "t")
        assert "theirs" not in resctrl(helper)
    finally:
        plugin.policy_shutdown()

"""resctrl in the helper: the validation of ``SetResctrl`` against resctrl's
``info`` (each refusal writes nothing), the groups it removes (its own, when
empty; every other one only with ``force``), the sim's kernel refusals, and
the real backend's ``info`` reading on a resctrl-shaped temp tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_sst import messages as m
from nri_sst.backends.sim import SimBackend, SimConfig, SimResctrl
from nri_sst.handler import RequestHandler
from nri_sst.resctrl import FsResctrl, ResctrlError

from .conftest import SMALL_SIM

FULL = {"L3": {0: 0x7FFF, 1: 0x7FFF}}


def _handler(root: Path, config: SimConfig = SMALL_SIM) -> RequestHandler:
    h = RequestHandler(SimBackend(config), root)
    h.dispatch(m.Hello(protocol=1), b"t")
    return h


def _now(h: RequestHandler) -> dict[str, dict[str, dict[int, int]]]:
    reply = h.dispatch(m.ReadResctrl(), b"t")
    assert isinstance(reply, m.ReadResctrlReply)
    return {g.name: g.schemata for g in reply.groups}


def _set(h: RequestHandler, *groups: m.ResctrlGroup, force: bool = False) -> m.Reply:
    return m.decode_reply(h.handle(m.encode(m.SetResctrl(groups=list(groups), force=force)), b"t"))


def _refused(h: RequestHandler, *groups: m.ResctrlGroup, code: str = "invalid-argument") -> str:
    before = _now(h)
    reply = _set(h, *groups)
    assert isinstance(reply, m.ErrorReply) and reply.code == code, reply
    assert _now(h) == before  # nothing written
    return reply.message


def group(name: str, **schemata: dict[int, int]) -> m.ResctrlGroup:
    return m.ResctrlGroup(name=name, schemata=schemata)


def test_sim_reads_info_and_writes_groups(small_root: Path) -> None:
    h = _handler(small_root)
    info = h.dispatch(m.ReadResctrl(), b"t")
    assert isinstance(info, m.ReadResctrlReply) and info.mounted
    l3 = {r.name: r for r in info.resources}["L3"]
    assert (l3.cbm_mask, l3.num_closids, l3.cache_ids) == (0x7FFF, 16, [0, 1])
    reply = _set(h, group("gold", L3={0: 0xFF, 1: 0xF}, MB={0: 50}), group("", L3={0: 0x7F00}))
    assert isinstance(reply, m.SetResctrlReply) and reply.groups == ["", "gold"]
    now = _now(h)
    assert now["gold"] == {"L3": {0: 0xFF, 1: 0xF}, "MB": {0: 50, 1: 100}}
    assert now[""]["L3"] == {0: 0x7F00, 1: 0x7FFF}


@pytest.mark.parametrize(
    ("groups", "text"),
    [
        ([group("../etc")], "invalid resctrl group name '../etc'"),
        ([group("a/b")], "invalid resctrl group name"),
        ([group("info")], "invalid resctrl group name 'info'"),
        ([group("x" * 65)], "invalid resctrl group name"),
        ([group("dup"), group("dup")], "resctrl group 'dup' named more than once"),
        ([group(f"g{i}") for i in range(15)], "16 resctrl groups exceed the 15 free CLOSIDs"),
        ([group("g", L4={0: 1})], "unknown resource 'L4'"),
        ([group("g", L3={2: 0xF})], "L3 has no cache id 2"),
        ([group("g", L3={0: 0x505})], "bitmask 0x505 is not one contiguous block of bits"),
        ([group("g", L3={0: 0x18000})], "bitmask 0x18000 not within cbm_mask 0x7fff"),
        ([group("g", L3={0: 0})], "bitmask 0x0 not within cbm_mask"),
        ([group("g", MB={0: 5})], "bandwidth 5% outside 10..100"),
        ([group("g", MB={0: 55})], "not a multiple of 10"),
        ([group("g", MB={0: 110})], "bandwidth 110% outside 10..100"),
    ],
)
def test_invalid_requests_are_refused_whole(
    small_root: Path, groups: list[m.ResctrlGroup], text: str
) -> None:
    h = _handler(small_root)
    assert text in _refused(h, group("fine", L3={0: 0xF}), *groups)


def test_min_cbm_bits_is_enforced(small_root: Path) -> None:
    h = _handler(small_root, SimConfig(cores_per_punit=2, l3_min_cbm_bits=2))
    assert "bitmask 0x1 has fewer than 2 bits" in _refused(h, group("g", L3={0: 0x1}))


def test_no_resctrl_is_not_supported(small_root: Path) -> None:
    h = _handler(small_root, SimConfig(cores_per_punit=2, resctrl=False))
    assert "not mounted" in _refused(h, group("g"), code="not-supported")


def test_too_many_groups_for_the_message_are_refused(small_root: Path) -> None:
    h = _handler(small_root)
    req = m.SetResctrl(groups=[group(f"g{i}") for i in range(m.MAX_RESCTRL_GROUPS + 1)])
    reply = m.decode_reply(h.handle(m.encode(req), b"t"))
    assert isinstance(reply, m.ErrorReply) and "exceed the limit of 256" in reply.message


def test_only_its_own_empty_groups_are_removed_unless_force(small_root: Path) -> None:
    h = _handler(small_root)
    assert isinstance(_set(h, group("mine"), group("busy")), m.SetResctrlReply)
    resctrl = h.resctrl
    assert isinstance(resctrl, SimResctrl)
    resctrl._state["groups"]["theirs"] = {"L3": {"0": 0x7FFF, "1": 0x7FFF}}  # another tool's
    resctrl._state["tasks"]["busy"] = [1234]  # the runtime put a container there
    # busy is the helper's but not empty: refused, as upstream, nothing removed
    text = _refused(h, group("new"))
    assert "refusing to remove non-empty resctrl group 'busy'" in text
    resctrl._state["tasks"]["busy"] = []
    reply = _set(h, group("new"))
    assert isinstance(reply, m.SetResctrlReply) and reply.removed == ["busy", "mine"]
    assert set(_now(h)) == {"", "new", "theirs"}  # not the helper's: kept
    resctrl._state["tasks"]["theirs"] = [99]
    reply = _set(h, group("new"), force=True)  # upstream's force: every other group, tasks or not
    assert isinstance(reply, m.SetResctrlReply) and reply.removed == ["theirs"]
    assert set(_now(h)) == {"", "new"}


def test_the_sims_kernel_refuses_what_the_kernel_refuses(small_root: Path) -> None:
    """Behind the validation (a helper bug): the model says EINVAL as resctrl does."""
    h = _handler(small_root)
    _set(h, group("g"))
    resctrl = h.resctrl
    for line in ("L3:0=505\n", "L3:0=8000f\n", "L3:7=f\n", "L4:0=f\n", "MB:0=5\n"):
        with pytest.raises(ResctrlError, match="Invalid argument"):
            resctrl.write_schemata("g", line)
    assert _now(h)["g"]["L3"] == {0: 0x7FFF, 1: 0x7FFF}


def test_the_real_backend_reads_info_and_groups(tmp_path: Path) -> None:
    base = tmp_path / "sys" / "fs" / "resctrl"
    for res, files in {
        "L3": {"cbm_mask": "7fff", "min_cbm_bits": "1", "num_closids": "16"},
        "MB": {"bandwidth_gran": "10", "min_bandwidth": "10", "num_closids": "8"},
    }.items():
        (base / "info" / res).mkdir(parents=True)
        for name, text in files.items():
            (base / "info" / res / name).write_text(text + "\n")
    (base / "schemata").write_text("    L3:0=7fff;1=7fff\n    MB:0=100;1=100\n")
    (base / "gold").mkdir()
    (base / "gold" / "schemata").write_text("    L3:0=00ff;1=7fff\n    MB:0= 50;1=100\n")
    (base / "mon_groups").mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "mounts").write_text("resctrl /sys/fs/resctrl resctrl rw,mba_MBps 0 0\n")
    info = FsResctrl(tmp_path).read()
    assert info.mounted
    res = {r.name: r for r in info.resources}
    assert res["L3"].cbm_mask == 0x7FFF and res["L3"].cache_ids == [0, 1]
    assert res["MB"].num_closids == 8 and res["MB"].mbps
    assert {g.name: g.schemata for g in info.groups}["gold"] == {
        "L3": {0: 0xFF, 1: 0x7FFF},
        "MB": {0: 50, 1: 100},
    }
    assert [g.name for g in info.groups] == ["", "gold"]
    (base / "info" / "last_cmd_status").write_text("schemata: unknown domain\n")
    with pytest.raises(ResctrlError, match=r"'absent': writing schemata .* unknown domain"):
        FsResctrl(tmp_path).write_schemata("absent", "L3:0=f\n")  # no such group: ENOENT
    with pytest.raises(ValueError, match="bad resctrl group name"):
        FsResctrl(tmp_path).write_schemata("../../etc", "x")  # no path from a name

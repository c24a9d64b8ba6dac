"""The helper as a real subprocess on the sim backend, over a real ipc socket."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helper_process import Helper
from nri_sst import messages as m
from nri_sst.client import (
    HelperClient,
    HelperRequestError,
    HelperUnavailable,
    SyncHelperClient,
)


def span(a: int, b: int) -> list[int]:
    return list(range(a, a + 32)) + list(range(b, b + 32))


async def test_hello_discover_managed_mode_and_sigterm(helper: Helper) -> None:
    assert stat.S_IMODE(os.stat(helper.sock).st_mode) == 0o600
    async with HelperClient(helper.endpoint, timeout=2.0) as c:
        hello = await c.call(m.Hello(protocol=1), m.HelloReply)
        assert hello.backend == "sim" and hello.sst_supported
        d = await c.call(m.Discover(), m.DiscoverReply)
        assert [p.package for p in d.packages] == [0, 1]
        rows = [(pu.package, pu.punit, pu.cpus) for p in d.packages for pu in p.punits]
        assert rows == [
            (0, 0, span(0, 128)),
            (0, 1, span(32, 160)),
            (1, 0, span(64, 192)),
            (1, 1, span(96, 224)),
        ]
        await c.call(m.PrepareManagedMode(), m.PrepareManagedModeReply)
        base, turbo, low = 2_300_000, 4_600_000, 800_000
        r0 = await c.call(
            m.ConfigureClos(clos=0, min_khz=base, max_khz=turbo), m.ConfigureClosReply
        )
        assert (r0.config.min_khz, r0.config.max_khz) == (base, turbo)
        await c.call(m.ConfigureClos(clos=3, min_khz=low, max_khz=base), m.ConfigureClosReply)
        await c.call(m.EnableCP(), m.EnableCPReply)
        await c.call(m.AssociateCpus(clos=3, cpus=list(range(256))), m.AssociateCpusReply)
        await c.call(m.AssociateCpus(clos=0, cpus=[32, 160]), m.AssociateCpusReply)
        got = await c.call(m.GetAssociation(cpus=[32, 160, 33, 64]), m.GetAssociationReply)
        assert got.clos == {32: 0, 160: 0, 33: 3, 64: 3}
        cfg = await c.call(m.GetClosConfig(clos=0), m.GetClosConfigReply)
        assert cfg.config.max_khz == turbo
        # APERF/MPERF give the frequency the model computed: HP 4600, LP 2300.
        a = await c.call(m.ReadFrequency(cpus=[32, 33]), m.ReadFrequencyReply)
        time.sleep(0.05)
        b = await c.call(m.ReadFrequency(cpus=[32, 33]), m.ReadFrequencyReply)
        mhz = [
            b.tsc_mhz * (y.aperf - x.aperf) / (y.mperf - x.mperf)
            for x, y in zip(a.samples, b.samples, strict=True)
        ]
        assert mhz == [pytest.approx(4600, rel=1e-3), pytest.approx(2300, rel=1e-3)]
        with pytest.raises(HelperRequestError) as exc:
            await c.request(m.AssociateCpus(clos=9, cpus=[0]))
        assert exc.value.code == "invalid-argument"
    deadline = time.monotonic() + 5  # the helper saves its state file when idle
    while True:
        state = helper.sim_state()
        punits = state["punits"]
        assert isinstance(punits, dict)
        if all(p["cp_enable"] and p["feature_state"] == 2 for p in punits.values()):
            break
        assert time.monotonic() < deadline, punits
        time.sleep(0.02)
    helper.proc.send_signal(signal.SIGTERM)
    assert helper.proc.wait(10) == 0
    state = helper.sim_state()
    punits = state["punits"]
    assert isinstance(punits, dict)
    for p in punits.values():
        assert not p["cp_enable"]
        assert p["feature_state"] & 0b10 == 0
        assert set(p["assoc"]) == {0}
    log = state["log"]
    assert isinstance(log, list)
    ops = [e["op"] for e in log if e.get("pkg") == 1 and e.get("punit") == 1]
    assert ops[-3:] == ["clos-assoc", "feature", "cp"]


def test_malformed_oversized_unknown_get_errors_and_helper_lives(helper: Helper) -> None:
    import zmq

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(helper.endpoint)
    try:
        cases = [
            [b"", b"1", b"\xc1garbage"],
            [b"", b"2", b"\x00" * (m.MAX_MESSAGE_SIZE + 1)],
            [b"", b"3", m.encode(m.TeardownReply(punits=0))],
            [b"only-one-frame"],
            [b"", b"5", m.encode(m.Discover())],  # no Hello yet
        ]
        codes = []
        for frames in cases:
            s.send_multipart(frames)
            assert s.poll(5000)
            reply = s.recv_multipart()
            decoded = m.decode_reply(reply[-1])
            assert isinstance(decoded, m.ErrorReply)
            codes.append(decoded.code)
        assert codes == [
            "malformed",
            "too-large",
            "unknown-message",
            "malformed",
            "handshake-required",
        ]
    finally:
        s.close(0)
    with SyncHelperClient(helper.endpoint, timeout=2.0) as c:
        assert isinstance(c.request(m.TFStatus()), m.TFStatusReply)
    assert helper.proc.poll() is None


async def test_killed_helper_raises_helper_unavailable(helper: Helper) -> None:
    async with HelperClient(helper.endpoint, timeout=0.1) as c:
        await c.call(m.Hello(protocol=1), m.HelloReply)
        await c.call(m.TFStatus(), m.TFStatusReply)
        helper.proc.kill()
        helper.proc.wait(10)
        with pytest.raises(HelperUnavailable) as exc:
            await c.request(m.TFStatus())
    # one of the two branches bounded by the 100 ms budget (test_sst_client_session):
    # the send finds the helper gone, or the reply's deadline passes
    assert str(exc.value) in (
        f"helper at {helper.endpoint} not connected (TFStatus)",
        f"helper at {helper.endpoint} did not answer TFStatus within 100 ms",
    )


def test_sigterm_outside_managed_mode_leaves_sst_alone(helper: Helper) -> None:
    with SyncHelperClient(helper.endpoint, timeout=2.0) as c:
        c.request(m.TFStatus())
    before = helper.sim_state()["punits"]
    helper.proc.send_signal(signal.SIGTERM)
    assert helper.proc.wait(10) == 0
    assert helper.sim_state()["punits"] == before
    assert not helper.sock.exists()


def test_info_command(host_root: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nri_sst.cli",
            "info",
            "--backend",
            "sim",
            "--host-root",
            str(host_root),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = out.splitlines()
    block = lines[lines.index("SST-PP") : lines.index("SST-BF") + 1]
    rows = [ln.split() for ln in block if ln[:1].isspace() and ln.split()[0].isdigit()]
    assert rows == [
        ["0", "0", "0-31,128-159"],
        ["0", "1", "32-63,160-191"],
        ["1", "0", "64-95,192-223"],
        ["1", "1", "96-127,224-255"],
    ]
    assert "SST-CP" in lines and "SST-TF" in lines

"""The helper as a security boundary: hostile peers, floods, fd exhaustion and
socket-path attacks against the real ``nri-sst-helper serve`` process over its
real ipc socket. In every case the helper lives, a well-behaved client gets
its answers and the helper's peak RSS stays under 40 MB."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helper_process import Helper, helper_command, start_helper, stop_helper
from hostile import (
    CONNECTED,
    DISCOVER,
    ENDED,
    FLOOD,
    GREETING,
    HELLO,
    MORE,
    RawPeer,
    connections,
    flood,
    frame,
    header,
    latencies,
    ready,
    request,
)
from nri_sst import messages as m
from nri_sst.client import HelperUnavailable, SyncHelperClient

RSS_LIMIT_MB = 40


def enter_managed_mode(c: SyncHelperClient) -> None:
    c.call(m.Hello(protocol=1), m.HelloReply, timeout=2.0)
    c.call(m.PrepareManagedMode(), m.PrepareManagedModeReply, timeout=2.0)
    c.call(m.ConfigureClos(clos=3, min_khz=800_000, max_khz=2_300_000), m.ConfigureClosReply)
    c.call(m.EnableCP(), m.EnableCPReply)
    c.call(m.AssociateCpus(clos=3, cpus=[0, 1, 2, 3]), m.AssociateCpusReply)


def assert_torn_down(h: Helper) -> None:
    """SIGTERM in managed mode: exit 0 after CPReset, TF off, CP off."""
    h.proc.send_signal(signal.SIGTERM)
    assert h.proc.wait(10) == 0, h.stderr()
    punits = h.sim_state()["punits"]
    assert isinstance(punits, dict)
    for p in punits.values():
        assert not p["cp_enable"] and p["feature_state"] & 0b10 == 0
        assert set(p["assoc"]) == {0}


def answers(endpoint: str) -> bool:
    """A new well-behaved client gets a typed answer within 2 s (the client
    fails fast while not connected: it is asked again until then)."""
    deadline = time.monotonic() + 2.0
    with SyncHelperClient(endpoint, timeout=2.0) as c:
        while True:
            try:
                return isinstance(c.request(m.TFStatus()), m.TFStatusReply)
            except HelperUnavailable:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)


def reply_of(peer: RawPeer) -> m.Reply:
    frames = peer.read_message()
    assert len(frames) == 3 and frames[0] == b""
    return m.decode_reply(frames[2])


# --------------------------------------------------------------------------- the socket path


RACE_HOOK = """
import os, sys, time

SOCK, VICTIM = os.environ.get("SWAP_SOCK"), os.environ.get("SWAP_VICTIM")


def _race(event, args):
    global SOCK
    if event == "os.chmod":
        time.sleep(0.3)  # the stimulus: any chmod opens a window a racer always wins
    elif event == "open" and SOCK and args and os.fspath(args[0]) == SOCK:
        os.symlink(VICTIM, SOCK + ".link")  # the helper looks at its socket: swap it first
        os.replace(SOCK + ".link", SOCK)
        SOCK = None


sys.addaudithook(_race)
"""
"""The helper's ``sitecustomize``: audit hooks that time a race (ours, small,
only timing: the helper's code is unchanged)."""


def swap_in_a_symlink(sock: Path, victim: Path, give_up: float) -> bool:
    """The moment ``sock`` shows as a socket, put a symlink to ``victim`` in its
    place. False when the socket never showed (the helper refused to start)."""
    link = sock.with_name("link")
    os.symlink(victim, link)
    while time.monotonic() < give_up:
        try:
            if stat.S_ISSOCK(os.lstat(sock).st_mode):
                os.replace(link, sock)
                return True
        except FileNotFoundError:
            pass
    return False


@pytest.mark.parametrize("when", ["at-the-check", "after-bind"])
def test_no_symlink_swapped_in_for_the_socket_gets_chmod(
    host_root: Path, tmp_path: Path, when: str
) -> None:
    """The fresh socket swapped for a symlink to a 0644 file: the file keeps its
    mode and the helper's exit leaves the symlink alone. ``at-the-check``: the
    swap lands right when the helper looks at its socket after bind (an audit
    hook on its ``open`` of the path), so the helper refuses to serve.
    ``after-bind``: a racer swaps it as soon as it shows, and every
    ``os.chmod`` the helper would call takes 300 ms (an audit hook), a window
    the racer always wins; the helper may refuse or serve on, unreachable."""
    victim = tmp_path / "victim"
    victim.write_text("keep my mode")
    victim.chmod(0o644)
    (tmp_path / "sitecustomize.py").write_text(RACE_HOOK)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sock, log = run / "helper.sock", run / "helper.log"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    if when == "at-the-check":
        env |= {"SWAP_SOCK": str(sock), "SWAP_VICTIM": str(victim)}
    with log.open("wb") as err:
        proc = subprocess.Popen(
            helper_command(host_root, f"ipc://{sock}", run / "sim.json"), stderr=err, env=env
        )
    try:
        if when == "at-the-check":
            assert proc.wait(20) == 1
            assert "is not the socket just bound (a symlink" in log.read_text()
        else:
            assert swap_in_a_symlink(sock, victim, time.monotonic() + 20)
            deadline = time.monotonic() + 20  # past any chmod: refused, or serving
            while proc.poll() is None and "serving on" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) in (0, 1)
    finally:
        proc.kill()
        proc.wait(10)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644, log.read_text()
    assert victim.read_text() == "keep my mode" and os.path.islink(sock)


def test_the_socket_is_a_0600_socket_of_the_helpers_user(helper: Helper) -> None:
    st = os.lstat(helper.sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()


def _dir(p: Path) -> None:
    p.mkdir()


def _file(p: Path) -> None:
    p.write_text("precious")


def _symlink(p: Path) -> None:
    (p.parent / "elsewhere").write_text("precious")
    p.symlink_to(p.parent / "elsewhere")


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (_dir, "exists and is a directory"),
        (_file, "exists and is a regular file"),
        (_symlink, "exists and is a symlink"),
    ],
    ids=["directory", "file", "symlink"],
)
def test_something_else_at_the_socket_path_is_refused_and_kept(
    host_root: Path, tmp_path: Path, make: object, text: str
) -> None:
    sock = tmp_path / "helper.sock"
    assert callable(make)
    make(sock)
    before = os.lstat(sock)
    out = subprocess.run(
        helper_command(host_root, f"ipc://{sock}", tmp_path / "sim.json"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and text in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    after = os.lstat(sock)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    if stat.S_ISREG(after.st_mode) or stat.S_ISLNK(after.st_mode):
        assert sock.read_text() == "precious"


def test_a_second_helper_on_a_live_socket_is_refused_and_exits_leave_others_alone(
    host_root: Path, tmp_path: Path
) -> None:
    first = start_helper(host_root, tmp_path)
    try:
        out = subprocess.run(
            helper_command(host_root, first.endpoint, tmp_path / "other.json"),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 1
        assert "another helper is serving on this socket" in out.stderr
        assert answers(first.endpoint)
        # Somebody else's socket at the path by the time the first one exits: kept.
        os.rename(first.sock, tmp_path / "moved.sock")
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(str(first.sock))
        other.close()
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(10) == 0
        assert stat.S_ISSOCK(os.lstat(first.sock).st_mode)
        assert (tmp_path / "moved.sock").exists()  # not found by path any more: not removed
    finally:
        stop_helper(first)


def test_a_stale_socket_is_replaced(host_root: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(run / "helper.sock"))  # bound, never listening: what a killed helper leaves
    dead.close()
    h = start_helper(host_root, tmp_path, sock=run / "helper.sock")
    try:
        deadline = time.monotonic() + 20  # the stale socket was there before the helper
        while "serving on" not in h.stderr():
            assert h.proc.poll() is None and time.monotonic() < deadline, h.stderr()
            time.sleep(0.02)
        assert "removed the stale socket" in h.stderr()
        info = subprocess.run(
            [sys.executable, "-m", "nri_sst.cli", "info", "--socket", h.endpoint],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert info.returncode == 0 and "SST-PP" in info.stdout.splitlines(), info.stderr
    finally:
        stop_helper(h)


@pytest.mark.parametrize(
    ("endpoint", "text"),
    [
        ("tcp://127.0.0.1:5555", "only ipc:// endpoints are served"),
        ("ipc://@nri-sst", "abstract ipc sockets have no access control"),
        ("ipc://helper.sock", "must be absolute"),
    ],
)
def test_only_ipc_socket_files_are_served(host_root: Path, endpoint: str, text: str) -> None:
    out = subprocess.run(
        helper_command(host_root, endpoint, Path("/nonexistent/sim.json")),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and text in out.stderr, out.stderr


# --------------------------------------------------------------------------- file descriptors


def _connect(path: Path, data: bytes = b"", patience: float = 0.0) -> socket.socket | None:
    """A connection that sends ``data`` without waiting for the helper; None when
    the backlog stayed full (the helper not accepting) for ``patience`` seconds."""
    deadline = time.monotonic() + patience
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(path))
            if data:
                s.send(data)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.001)


def soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise KeyError("Max open files")


def test_more_connections_than_the_nofile_limit(host_root: Path, tmp_path: Path) -> None:
    """nofile 64 (soft) / 256 (hard): the helper raises the soft limit; 300
    idle connections, then clients in session until it stops accepting, cost
    it at most its cap of file descriptors. The plugin's session is answered
    throughout, a new client too (it replaces an idle connection, or waits
    for a slot), and SIGTERM with all of them connected still resets SST."""

    def low_nofile() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 256))

    h = start_helper(host_root, tmp_path, preexec_fn=low_nofile)
    held: list[socket.socket] = []
    try:
        assert soft_limit(h.proc.pid) == 256
        plugin = SyncHelperClient(h.endpoint, timeout=0.1)
        enter_managed_mode(plugin)
        for _ in range(300):  # idle: each new one replaces the oldest
            s = _connect(h.sock, patience=1.0)
            assert s is not None
            held.append(s)
            if len(held) % 50 == 0:
                plugin.call(m.TFStatus(), m.TFStatusReply)
        assert h.proc.poll() is None, h.stderr()
        assert h.open_fds() < 256 - 8
        assert answers(h.endpoint)
        sessions: list[RawPeer] = []
        try:
            while len(sessions) < 64:  # in session: the helper stops accepting at its cap
                try:
                    peer = RawPeer(h.sock, timeout=0.5)
                except TimeoutError:
                    break
                sessions.append(peer)
                peer.sock.sendall(HELLO)
                assert isinstance(reply_of(peer), m.HelloReply)
            assert 8 < len(sessions) < 64
            assert "all in session: new connections wait" in h.stderr()
            assert h.open_fds() < 256 - 8
            for _ in range(10):
                plugin.call(m.GetAssociation(cpus=[0, 4]), m.GetAssociationReply)
            sessions.pop().close()  # a slot frees: the waiting connection gets its turn
            assert answers(h.endpoint)
            assert h.peak_rss_mb() < RSS_LIMIT_MB
            assert_torn_down(h)  # with all of them still connected
        finally:
            for p in sessions:
                p.close()
    finally:
        for s in held:
            s.close()
        stop_helper(h)


def test_a_nofile_limit_that_leaves_no_room_for_peers_is_refused(
    host_root: Path, tmp_path: Path
) -> None:
    def tiny_nofile() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))

    out = subprocess.run(
        helper_command(host_root, f"ipc://{tmp_path}/helper.sock", tmp_path / "sim.json"),
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=tiny_nofile,
    )
    assert out.returncode == 1, out.stderr
    assert "the nofile limit 20 leaves no file descriptors for peers" in out.stderr
    assert not (tmp_path / "helper.sock").exists()


def test_running_out_of_file_descriptors(host_root: Path, tmp_path: Path) -> None:
    """The nofile limit lowered under the running helper to what it has open:
    accept fails (EMFILE) and the sim cannot save its state; the helper
    lives, its client is answered, and once the limit is back new clients
    are too and SIGTERM resets SST."""
    h = start_helper(host_root, tmp_path)
    held: list[socket.socket] = []
    try:
        plugin = SyncHelperClient(h.endpoint, timeout=0.1)
        enter_managed_mode(plugin)
        limits = resource.prlimit(h.proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(h.proc.pid, resource.RLIMIT_NOFILE, (h.open_fds(), limits[1]))
        for i in range(50):
            s = _connect(h.sock)
            if s is not None:
                held.append(s)
            clos = 3 if i % 2 else 2
            reply = plugin.call(m.AssociateCpus(clos=clos, cpus=[8]), m.AssociateCpusReply)
            assert reply.clos == clos
            time.sleep(0.01)
        assert h.proc.poll() is None
        assert "accept failed (Too many open files)" in h.stderr()
        resource.prlimit(h.proc.pid, resource.RLIMIT_NOFILE, limits)
        for s in held:
            s.close()
        deadline = time.monotonic() + 5
        while not answers(h.endpoint):
            assert time.monotonic() < deadline
        assert_torn_down(h)
    finally:
        for s in held:
            s.close()
        stop_helper(h)


# --------------------------------------------------------------------------- memory


def test_memory_floods_keep_the_helper_under_40mb(host_root: Path, tmp_path: Path) -> None:
    """One message of 256 x 1 MiB frames (510 MB of RSS with libzmq and
    recv_multipart), one of 2000 x 60 KB frames (each under libzmq's
    per-frame limit), 1 MiB payloads, 40 clients that never read their
    Discover replies: the helper drops or throttles them and the plugin is
    answered."""
    h = start_helper(host_root, tmp_path)
    try:
        plugin = SyncHelperClient(h.endpoint, timeout=0.1)
        enter_managed_mode(plugin)
        with flood(h.sock, ["multi-frame", "small-frames", "oversized"], seconds=1.5) as f:
            while f.poll() is None:
                plugin.call(m.GetClosConfig(clos=3), m.GetClosConfigReply)
                time.sleep(0.01)
        assert f.returncode == 0
        readers = [RawPeer(h.sock) for _ in range(24)]  # the cap leaves room for a few more
        try:
            for r in readers:  # 90 MB of replies, if the helper kept them
                r.sock.sendall(HELLO + DISCOVER * 1000)
            plugin.call(m.Discover(), m.DiscoverReply)
            h.wait_idle()
            assert h.proc.poll() is None
        finally:
            for r in readers:
                r.close()
        plugin.call(m.TFStatus(), m.TFStatusReply)
        assert h.peak_rss_mb() < RSS_LIMIT_MB, h.peak_rss_mb()
        assert_torn_down(h)
    finally:
        stop_helper(h)


# --------------------------------------------------------------------------- malformed peers


def test_malformed_peers_are_refused_and_the_helper_lives(helper: Helper) -> None:
    dropped = {
        "garbage greeting": (b"GET / HTTP/1.1\r\n" * 8, None),
        "ZMTP 2.0": (GREETING[:10] + b"\x01\x03" + bytes(52), None),
        "CURVE": (GREETING[:12] + b"CURVE".ljust(20, b"\0") + GREETING[32:], b"ERROR"),
        "REQ socket": (GREETING + ready(b"REQ"), b"ERROR"),
        "PUB socket": (GREETING + ready(b"PUB"), b"ERROR"),
        "message before READY": (GREETING + frame(b"x"), None),
        "reserved flags": (GREETING + ready(b"DEALER") + bytes([0x40, 1, 0]), None),
        "command inside a message": (
            GREETING + ready(b"DEALER") + frame(b"", MORE) + ready(b"DEALER"),
            None,
        ),
        "endless frame": (
            GREETING + ready(b"DEALER") + frame(b"", MORE) + header(1 << 40) + bytes(1 << 20),
            None,
        ),
        "endless frame count": (GREETING + ready(b"DEALER") + frame(b"", MORE) * 100, None),
        "huge command": (
            GREETING + ready(b"DEALER") + bytes([0x06]) + (1 << 40).to_bytes(8, "big"),
            None,
        ),
    }
    for name, (data, error) in dropped.items():
        peer = RawPeer(helper.sock, handshake=False)
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                peer.sock.sendall(data)  # may be hung up on before the end of it
            got = b""
            peer.sock.settimeout(2.0)
            try:
                while chunk := peer.sock.recv(4096):
                    got += chunk
            except ConnectionResetError:
                pass
            assert got[:1] == b"\xff", name  # the helper's greeting, then it hung up
            if error is not None:
                assert error in got, name
        finally:
            peer.close()
    deep = b"\x81\xa1x" * 20_000 + b"\xc0"  # {"x": {"x": ...}}
    errors = {
        "deep nesting": (request(deep), "malformed", "nested too deeply"),
        "one frame": (frame(b"only-one-frame"), "malformed", "expected frames"),
        "four frames": (
            frame(b"", MORE) + frame(b"rid-4444", MORE) + frame(b"x", MORE) + frame(b"y"),
            "malformed",
            "got 4 frames",
        ),
        "100 KiB": (request(bytes(100 * 1024), b"rid-tool"), "too-large", "exceeds the limit"),
        "not msgpack": (request(b"\xc1garbage"), "malformed", "malformed message"),
    }
    peer = RawPeer(helper.sock)
    try:
        for name, (data, code, text) in errors.items():
            peer.sock.sendall(data)
            frames = peer.read_message()
            reply = m.decode_reply(frames[-1])
            assert isinstance(reply, m.ErrorReply), name
            assert reply.code == code and text in reply.message, (name, reply)
            if name == "100 KiB":
                assert frames[1] == b"rid-tool"
        peer.sock.sendall(HELLO)
        assert isinstance(reply_of(peer), m.HelloReply)
    finally:
        peer.close()
    assert answers(helper.endpoint)
    assert helper.proc.poll() is None


def test_pings_are_answered(helper: Helper) -> None:
    """ZMTP 3.1 heartbeats: PING gets PONG with the same context."""
    peer = RawPeer(helper.sock)
    try:
        peer.sock.sendall(frame(b"\x04PING\x00\x0actx-42", 0x04))
        flags, body = peer.read_frame()
        assert flags & 0x04 and body == b"\x04PONGctx-42"
    finally:
        peer.close()


# --------------------------------------------------------------------------- sessions


def test_other_clients_do_not_end_the_plugins_session(helper: Helper) -> None:
    """1100 clients say Hello and go (``nri-sst-helper info`` runs, clients
    that time out and reconnect), 16 stay: the plugin's handshake survives."""
    plugin = RawPeer(helper.sock)
    stay: list[RawPeer] = []
    try:
        plugin.sock.sendall(HELLO)
        assert isinstance(reply_of(plugin), m.HelloReply)
        for i in range(1100):
            peer = RawPeer(helper.sock)
            peer.sock.sendall(HELLO)
            assert isinstance(reply_of(peer), m.HelloReply)
            if i % 70 == 0 and len(stay) < 16:
                stay.append(peer)
            else:
                peer.close()
        plugin.sock.sendall(request(m.encode(m.TFStatus())))
        assert isinstance(reply_of(plugin), m.TFStatusReply)
    finally:
        plugin.close()
        for p in stay:
            p.close()


# --------------------------------------------------------------------------- the bounded flood


def test_a_client_is_answered_during_a_flood(helper: Helper) -> None:
    """Six hostile clients for 2.5 s (garbage, 1 MiB payloads, endless and
    many-frame messages, unread replies, connection churn): every request of a
    well-behaved client is answered, many of them, while the attackers go on
    connecting (fairness by count; the liveness bound is a 2 s timeout per
    request; the round trip's p99 is a figure of tests/bench/bench_sst.py,
    ``sst.flood_rt_p99``)."""
    with flood(helper.sock, FLOOD, seconds=2.5) as f:
        before = connections(f, CONNECTED)
        samples = latencies(helper.endpoint, until=lambda: f.poll() is not None, timeout=2.0)
        after = connections(f, ENDED)
    assert len(samples) > 50  # a miss would have raised HelperUnavailable
    assert set(before) == set(after) == set(FLOOD)
    assert after["churn"] > before["churn"] and after["garbage"] > before["garbage"]
    assert helper.proc.poll() is None
    assert helper.peak_rss_mb() < RSS_LIMIT_MB, helper.peak_rss_mb()

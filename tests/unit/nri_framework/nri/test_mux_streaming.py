"""Big mux frames: NRI v0.6.1 (containerd 1.7) writes a message of up to 16 MiB as one
frame (v0.8+ splits at 10 + 4 MiB). The plugin passes a frame's payload on as it
arrives: a message over ttrpc's 4 MiB is answered RESOURCE_EXHAUSTED and dropped
without being held, and the connection lives (seen on the real containerd 1.7 with a
4.8 MB Synchronize, see tests/e2e/test_nri_versions_e2e.py)."""

from __future__ import annotations

import struct

from nri_framework.nri import mux, ttrpc
from nri_framework.nri.connection import ConnectionClosed, NriConnection, Role
from nri_framework.nri.ttrpc import Code, ProtocolNotice, RequestReceived
from nri_framework.pb import ttrpc_pb2

READ = 65536  # what the stub reads from the socket at a time


def request(stream_id: int, payload: bytes) -> bytes:
    env = ttrpc_pb2.Request(
        service="nri.pkg.api.v1alpha1.Plugin", method="Synchronize", payload=payload
    ).SerializeToString()
    # encode by hand: ttrpc.encode_message refuses (rightly) to build an oversized one
    return struct.pack(">IIBB", len(env), stream_id, ttrpc.MSG_REQUEST, 0) + env


def one_frame(conn_id: int, data: bytes) -> bytes:
    return struct.pack(">II", conn_id, len(data)) + data


def test_oversized_message_in_one_frame_is_refused_not_fatal() -> None:
    plugin = NriConnection(Role.PLUGIN)
    big = one_frame(mux.PLUGIN_SERVICE_CONN, request(1, b"s" * (5 << 20)))
    events = []
    most_buffered = 0
    for off in range(0, len(big), READ):
        events += plugin.receive_data(big[off : off + READ])
        most_buffered = max(most_buffered, plugin._mux.buffered, plugin._server._decoder.buffered)
    assert not any(isinstance(e, ConnectionClosed) for e in events), events
    assert [type(e) for e in events] == [ProtocolNotice]
    assert "RESOURCE_EXHAUSTED" in events[0].reason  # type: ignore[union-attr]
    assert most_buffered < READ  # never held the 5 MiB
    client = ttrpc.TtrpcClient()
    client._pending.add(1)
    [resp] = client.feed(b"".join(p for _, p in mux.MuxDecoder().feed(plugin.data_to_send())))
    assert resp.code == Code.RESOURCE_EXHAUSTED  # type: ignore[union-attr]
    # and the next request is served
    [ev] = plugin.receive_data(one_frame(mux.PLUGIN_SERVICE_CONN, request(3, b"ok")))
    assert isinstance(ev, RequestReceived) and ev.payload == b"ok"


def test_payload_pieces_join_across_frames_and_reads() -> None:
    data = request(1, bytes(range(256)) * 300)
    frames = mux.encode_frames(mux.PLUGIN_SERVICE_CONN, data, 1000)
    dec = mux.MuxDecoder()
    got = b""
    for off in range(0, len(frames), 777):
        for conn, piece in dec.feed(frames[off : off + 777]):
            assert conn == mux.PLUGIN_SERVICE_CONN
            got += piece
        assert dec.buffered < mux.HEADER_LEN
    assert got == data


def test_garbage_length_still_closes() -> None:
    conn = NriConnection(Role.PLUGIN)
    [ev] = conn.receive_data(struct.pack(">II", 1, mux.MAX_IN_PAYLOAD + 1))
    assert isinstance(ev, ConnectionClosed)

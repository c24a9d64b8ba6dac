"""The sans-IO mux and ttrpc codecs: golden bytes, limits, stream rules, splitting."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nri_framework.nri import mux, ttrpc
from nri_framework.nri.connection import (
    PLUGIN_SERVICE,
    RUNTIME_SERVICE,
    ConnectionClosed,
    NriConnection,
    Role,
)
from nri_framework.nri.ttrpc import Code, ProtocolNotice, RequestReceived, ResponseReceived
from nri_framework.pb import ttrpc_pb2

# --- golden bytes -------------------------------------------------------------


def test_mux_frame_golden() -> None:
    assert mux.encode_frames(2, b"abc") == bytes.fromhex("00000002 00000003 616263")


def test_ttrpc_request_golden() -> None:
    client = ttrpc.TtrpcClient()
    sid, data = client.request("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"\x0a\x01x")
    envelope = (
        b"\x0a\x1cnri.pkg.api.v1alpha1.Runtime"  # service = 1
        b"\x12\x0eRegisterPlugin"  # method = 2
        b"\x1a\x03\x0a\x01x"  # payload = 3
    )
    assert sid == 1
    assert data == struct.pack(">IIBB", len(envelope), 1, 1, 0) + envelope


def test_success_response_has_no_status() -> None:
    data = ttrpc.encode_response(7, b"\x10\x08")
    assert data == bytes.fromhex("00000004 00000007 02 00 1202 1008")
    assert ttrpc.encode_response(9) == bytes.fromhex("00000000 00000009 02 00")


def test_error_response_golden() -> None:
    data = ttrpc.encode_response(3, code=Code.UNIMPLEMENTED, message="method X")
    status = b"\x08\x0c\x12\x08method X"
    assert data[10:] == b"\x0a" + bytes([len(status)]) + status


def test_stream_ids_are_odd_and_increasing() -> None:
    client = ttrpc.TtrpcClient()
    ids = [client.request("s", "m", b"")[0] for _ in range(4)]
    assert ids == [1, 3, 5, 7]


# --- server rules ---------------------------------------------------------------


def request_bytes(
    stream_id: int, service: str = PLUGIN_SERVICE, method: str = "Configure"
) -> bytes:
    env = ttrpc_pb2.Request(service=service, method=method, payload=b"").SerializeToString()
    return ttrpc.encode_message(stream_id, ttrpc.MSG_REQUEST, env)


def parse_responses(data: bytes) -> list[tuple[int, int, str]]:
    client = ttrpc.TtrpcClient()
    client._pending.update(range(0, 100))  # accept any stream id in this test
    return [
        (e.stream_id, e.code, e.message)
        for e in client.feed(data)
        if isinstance(e, ResponseReceived)
    ]


def test_even_stream_id_rejected() -> None:
    server = ttrpc.TtrpcServer()
    events = server.feed(request_bytes(2))
    assert isinstance(events[0], ProtocolNotice)
    assert parse_responses(server.data_to_send()) == [
        (2, Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams")
    ]


def test_reused_stream_id_rejected() -> None:
    server = ttrpc.TtrpcServer()
    assert isinstance(server.feed(request_bytes(5))[0], RequestReceived)
    server.feed(request_bytes(3))
    assert parse_responses(server.data_to_send()) == [
        (3, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment")
    ]


def test_oversized_request_answered_resource_exhausted_and_stream_recovers() -> None:
    server = ttrpc.TtrpcServer()
    big = ttrpc.MAX_MESSAGE + 1
    header = struct.pack(">IIBB", big, 1, ttrpc.MSG_REQUEST, 0)
    events = server.feed(header + b"\0" * 1000)
    assert isinstance(events[0], ProtocolNotice)
    assert parse_responses(server.data_to_send()) == [
        (1, Code.RESOURCE_EXHAUSTED, f"message length {big} exceed maximum message size of 4194304")
    ]
    # the rest of the oversized data is skipped, then a good request is served
    events = server.feed(b"\0" * (big - 1000) + request_bytes(3))
    assert [type(e) for e in events] == [RequestReceived]


def test_client_refuses_oversized_locally() -> None:
    client = ttrpc.TtrpcClient()
    with pytest.raises(ttrpc.TtrpcError) as err:
        client.request("s", "m", b"x" * (ttrpc.MAX_MESSAGE + 1))
    assert err.value.code == Code.RESOURCE_EXHAUSTED
    assert client.request("s", "m", b"")[0] == 1  # no stream id was consumed


def test_garbage_envelope_is_invalid_argument() -> None:
    server = ttrpc.TtrpcServer()
    events = server.feed(ttrpc.encode_message(1, ttrpc.MSG_REQUEST, b"\xff\xff\xff"))
    assert isinstance(events[0], ProtocolNotice)
    [(sid, code, _)] = parse_responses(server.data_to_send())
    assert (sid, code) == (1, Code.INVALID_ARGUMENT)


def test_response_on_inactive_stream_dropped() -> None:
    client = ttrpc.TtrpcClient()
    events = client.feed(ttrpc.encode_response(11, b""))
    assert events == [ProtocolNotice("received message on inactive stream 11")]


def test_late_response_after_forget_dropped() -> None:
    client = ttrpc.TtrpcClient()
    sid, _ = client.request("s", "m", b"")
    client.forget(sid)
    assert isinstance(client.feed(ttrpc.encode_response(sid, b""))[0], ProtocolNotice)


def test_missing_status_means_ok() -> None:
    client = ttrpc.TtrpcClient()
    sid, _ = client.request("s", "m", b"")
    resp = ttrpc_pb2.Response(payload=b"\x08\x01").SerializeToString()
    [ev] = client.feed(ttrpc.encode_message(sid, ttrpc.MSG_RESPONSE, resp))
    assert ev == ResponseReceived(sid, 0, "", b"\x08\x01")


# --- mux limits -------------------------------------------------------------------


def test_outgoing_frames_at_most_4096() -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    out = mux.encode_frames(1, data)
    sizes = []
    pos = 0
    while pos < len(out):
        conn, length = struct.unpack_from(">II", out, pos)
        assert conn == 1
        sizes.append(length)
        pos += 8 + length
    assert sizes == [4096, 4096, 2048]
    assert mux.MuxDecoder().feed(out) and b"".join(p for _, p in mux.MuxDecoder().feed(out)) == data


def test_mux_oversized_frame_closes() -> None:
    conn = NriConnection(Role.PLUGIN)
    events = conn.receive_data(struct.pack(">II", 1, mux.MAX_IN_PAYLOAD + 1))
    assert isinstance(events[0], ConnectionClosed)
    assert conn.receive_data(b"more") == []


@pytest.mark.parametrize(
    ("conn_id", "length", "error"),
    [(0, 4, "reserved conn id 0"), (1, 65, "65 bytes on conn 1 exceeds the limit of 64")],
)
def test_mux_bad_whole_frame_in_one_read_raises(conn_id: int, length: int, error: str) -> None:
    """One whole frame in one read (the decoder's shortcut) is checked as any frame."""
    with pytest.raises(mux.MuxError, match=error):
        mux.MuxDecoder(max_payload=64).feed(struct.pack(">II", conn_id, length) + b"x" * length)


def test_large_incoming_frame_accepted() -> None:
    """Go peers may send the remainder of a big message in one large frame."""
    runtime = NriConnection(Role.RUNTIME, max_out_payload=mux.MAX_IN_PAYLOAD)
    plugin = NriConnection(Role.PLUGIN)
    payload = b"p" * 100_000
    runtime.send_request("CreateContainer", payload)
    [ev] = plugin.receive_data(runtime.data_to_send())
    assert isinstance(ev, RequestReceived) and ev.payload == payload


def test_unknown_conn_id_dropped() -> None:
    conn = NriConnection(Role.PLUGIN)
    assert conn.receive_data(mux.encode_frames(7, request_bytes(1))) == []


# --- both sides together, split at every boundary ----------------------------------


def exchange() -> tuple[bytes, list[tuple[str, bytes]]]:
    runtime = NriConnection(Role.RUNTIME)
    calls = [
        ("Configure", b"\x12\x0acontainerd"),
        ("Synchronize", b"x" * 5000),
        ("StateChange", b""),
    ]
    for method, payload in calls:
        runtime.send_request(method, payload, timeout_nano=2_000_000_000, metadata=(("k", "v"),))
    return runtime.data_to_send(), calls


def drain(conn: NriConnection, chunks: list[bytes]) -> list[RequestReceived]:
    got = []
    for chunk in chunks:
        for ev in conn.receive_data(chunk):
            assert isinstance(ev, RequestReceived), ev
            got.append(ev)
    return got


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_split_reassembles(data: st.DataObject) -> None:
    wire, calls = exchange()
    cuts = sorted(data.draw(st.sets(st.integers(1, len(wire) - 1), max_size=40)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    got = drain(NriConnection(Role.PLUGIN), chunks)
    assert [(e.method, e.payload) for e in got] == calls
    assert all(e.service == PLUGIN_SERVICE and e.metadata == (("k", "v"),) for e in got)
    assert [e.stream_id for e in got] == [1, 3, 5]


def test_every_single_split_point() -> None:
    wire, calls = exchange()
    for cut in range(1, len(wire)):
        got = drain(NriConnection(Role.PLUGIN), [wire[:cut], wire[cut:]])
        assert [(e.method, e.payload) for e in got] == calls


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=9000), min_size=1, max_size=6), st.integers(1, 4096))
def test_merged_frames_roundtrip(payloads: list[bytes], max_out: int) -> None:
    """Several messages packed into one write and re-cut at any frame size."""
    plugin = NriConnection(Role.PLUGIN, max_out_payload=max_out)
    runtime = NriConnection(Role.RUNTIME)
    sids = [plugin.send_request("UpdateContainers", p) for p in payloads]
    got = runtime.receive_data(plugin.data_to_send())
    assert [(e.stream_id, e.service, e.payload) for e in got if isinstance(e, RequestReceived)] == [
        (s, RUNTIME_SERVICE, p) for s, p in zip(sids, payloads, strict=True)
    ]
    for ev in got:
        assert isinstance(ev, RequestReceived)
        runtime.send_response(ev.stream_id, ev.payload[::-1])
    answers = plugin.receive_data(runtime.data_to_send())
    assert [(e.stream_id, e.payload) for e in answers if isinstance(e, ResponseReceived)] == [
        (s, p[::-1]) for s, p in zip(sids, payloads, strict=True)
    ]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_garbage_never_raises(blob: bytes) -> None:
    conn = NriConnection(Role.PLUGIN)
    for ev in conn.receive_data(blob):
        assert isinstance(ev, RequestReceived | ProtocolNotice | ConnectionClosed)
    conn.data_to_send()

"""A success Response written without building its protobuf message, against
the previous encoding (the oracle, verbatim: ``ttrpc_pb2.Response`` serialized,
then cut into mux frames) on random payloads, stream ids and frame sizes."""

from __future__ import annotations

import random

import pytest
from nri_framework.nri import mux, ttrpc
from nri_framework.nri.connection import NriConnection, Role
from nri_framework.nri.ttrpc import Code, TtrpcError
from nri_framework.pb import ttrpc_pb2


def oracle_encode_response(
    stream_id: int, payload: bytes = b"", code: int = 0, message: str = ""
) -> bytes:
    resp = ttrpc_pb2.Response()
    if code:
        resp.status.code = int(code)
        resp.status.message = message
    elif payload:
        resp.payload = payload
    return ttrpc.encode_message(stream_id, ttrpc.MSG_RESPONSE, resp.SerializeToString())


#: payload lengths around the varint's byte boundaries and the mux frame size
LENGTHS = [0, 1, 2, 126, 127, 128, 129, 4000, 4080, 4083, 4084, 4085, 4096, 16383, 16384, 70000]


@pytest.mark.parametrize("seed", range(60))
def test_success_response_as_before(seed: int) -> None:
    rng = random.Random(seed)
    conn = NriConnection(Role.PLUGIN, max_out_payload=rng.choice([64, 4096, 1 << 16]))
    for _ in range(20):
        n = rng.choice(LENGTHS) if rng.random() < 0.5 else rng.randrange(0, 9000)
        payload = rng.randbytes(n)
        sid = rng.choice([1, 3, 127, 129, 1 << 31 | 1, (1 << 32) - 1])
        expected = oracle_encode_response(sid, payload)
        assert ttrpc.encode_response(sid, payload) == expected
        conn.send_response(sid, payload)
        frames = mux.encode_frames(conn.serve_conn, expected, conn.max_out_payload)
        assert conn.data_to_send() == frames


def test_error_response_as_before() -> None:
    rng = random.Random(5)
    for code in Code:
        if code:
            message = rng.randbytes(rng.randrange(300)).hex()
            assert ttrpc.encode_response(9, b"x", code, message) == oracle_encode_response(
                9, b"x", code, message
            )


def test_oversized_success_response_is_refused_as_before() -> None:
    payload = bytes(ttrpc.MAX_MESSAGE - 3)  # its Response is 5 bytes more
    with pytest.raises(TtrpcError) as old:
        oracle_encode_response(1, payload)
    with pytest.raises(TtrpcError) as new:
        ttrpc.encode_response(1, payload)
    assert (new.value.code, str(new.value)) == (old.value.code, str(old.value))
    conn = NriConnection(Role.PLUGIN)
    with pytest.raises(TtrpcError):
        conn.send_response(1, payload)
    assert conn.data_to_send() == b""
    # the largest that fits is written whole
    fits = bytes(ttrpc.MAX_MESSAGE - 5)
    assert ttrpc.encode_response(1, fits) == oracle_encode_response(1, fits)

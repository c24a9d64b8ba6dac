"""ttrpc messages over one byte stream, sans-IO (``containerd/ttrpc`` upstream).

A ttrpc message is a 10-byte header -- data length (uint32 BE), stream id
(uint32 BE), message type (uint8), flags (uint8) -- followed by the data. A
Request's data is a serialized :class:`ttrpc.Request` envelope, a
Response's a :class:`ttrpc.Response`. NRI uses unary calls only.

:class:`TtrpcServer` and :class:`TtrpcClient` are the two ends of one byte
stream. They eat bytes and return events; protocol errors that the peer must
hear about (bad stream ids, oversized messages, undecodable envelopes) are
answered automatically through :meth:`TtrpcServer.data_to_send`.
"""

from __future__ import annotations

import enum
import struct

import msgspec
from google.protobuf.message import DecodeError

from nri_framework.pb import ttrpc_pb2

HEADER = struct.Struct(">IIBB")
HEADER_LEN = HEADER.size

#: Largest ttrpc message data length (``messageLengthMax`` upstream).
MAX_MESSAGE = 4 << 20

MSG_REQUEST = 0x01
MSG_RESPONSE = 0x02
MSG_DATA = 0x03


class Code(enum.IntEnum):
    """gRPC status codes, as ttrpc uses them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class TtrpcError(Exception):
    """A call failed with a ttrpc status (raised by clients, returned by handlers)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(
            f"{Code(code).name if code in Code._value2member_map_ else code}: {message}"
        )
        self.code = int(code)
        self.message = message


def oversized_message(length: int) -> str:
    return f"message length {length} exceed maximum message size of {MAX_MESSAGE}"


# --- events -----------------------------------------------------------------


class RequestReceived(msgspec.Struct, frozen=True):
    """A unary request arrived on a server stream."""

    stream_id: int
    service: str
    method: str
    payload: bytes
    timeout_nano: int
    metadata: tuple[tuple[str, str], ...]


class ResponseReceived(msgspec.Struct, frozen=True):
    """The answer to one of our requests. ``code`` 0 means OK."""

    stream_id: int
    code: int
    message: str
    payload: bytes


class ProtocolNotice(msgspec.Struct, frozen=True):
    """Something the peer sent was dropped or answered with an error; log it."""

    reason: str


TtrpcEvent = RequestReceived | ResponseReceived | ProtocolNotice


# --- framing ----------------------------------------------------------------


def encode_message(stream_id: int, msg_type: int, data: bytes, flags: int = 0) -> bytes:
    if len(data) > MAX_MESSAGE:
        raise TtrpcError(Code.RESOURCE_EXHAUSTED, oversized_message(len(data)))
    return HEADER.pack(len(data), stream_id, msg_type, flags) + data


class Frame(msgspec.Struct, frozen=True):
    stream_id: int
    msg_type: int
    flags: int
    data: bytes


class OversizedFrame(msgspec.Struct, frozen=True):
    """A header announced more than :data:`MAX_MESSAGE`; its data is discarded."""

    stream_id: int
    msg_type: int
    length: int


class FrameDecoder:
    """Cuts a byte stream into ttrpc frames; keeps partial data between feeds."""

    __slots__ = ("_buf", "_skip")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame | OversizedFrame]:
        out: list[Frame | OversizedFrame] = []
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
        buf = self._buf
        # nothing kept from before (the common case): cut ``data`` itself, keep the rest
        src: bytes | bytearray = buf if buf else data
        if buf:
            buf += data
        pos = 0
        end = len(src)
        unpack = HEADER.unpack_from
        while end - pos >= HEADER_LEN:
            length, stream_id, msg_type, flags = unpack(src, pos)
            if length > MAX_MESSAGE:
                out.append(OversizedFrame(stream_id, msg_type, length))
                pos += HEADER_LEN
                avail = end - pos
                if avail >= length:
                    pos += length
                    continue
                self._skip = length - avail
                pos = end
                break
            if end - pos - HEADER_LEN < length:
                break
            start = pos + HEADER_LEN
            out.append(Frame(stream_id, msg_type, flags, bytes(src[start : start + length])))
            pos = start + length
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < end:
            buf += data[pos:]
        return out


# --- server -----------------------------------------------------------------


def _varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: the tag of ``Response.payload`` (field 2, length-delimited)
_PAYLOAD_TAG = b"\x12"


def response_head(stream_id: int, payload_len: int) -> bytes:
    """What precedes a successful Response's payload on the wire: the ttrpc
    header and the serialized Response up to its payload (which is the
    Response's only field then: no status, as Go peers send it). The bytes
    ``ttrpc_pb2.Response(payload=...)`` serializes to, without building the
    message and copying the payload into it."""
    if not payload_len:
        return HEADER.pack(0, stream_id, MSG_RESPONSE, 0)
    field = _PAYLOAD_TAG + _varint(payload_len)
    length = len(field) + payload_len
    if length > MAX_MESSAGE:
        raise TtrpcError(Code.RESOURCE_EXHAUSTED, oversized_message(length))
    return HEADER.pack(length, stream_id, MSG_RESPONSE, 0) + field


def encode_response(
    stream_id: int, payload: bytes = b"", code: int = 0, message: str = ""
) -> bytes:
    """A Response message. Success carries no status at all, like Go peers send it."""
    if not code:
        return response_head(stream_id, len(payload)) + payload
    resp = ttrpc_pb2.Response()
    resp.status.code = int(code)
    resp.status.message = message
    return encode_message(stream_id, MSG_RESPONSE, resp.SerializeToString())


class TtrpcServer:
    """The serving end of a ttrpc byte stream.

    :meth:`feed` returns :class:`RequestReceived` for every well-formed unary
    request. Requests that break the stream-id rules, announce an oversized
    message or carry an undecodable envelope are answered here with the
    status upstream's Go server uses, and reported as :class:`ProtocolNotice`.
    """

    __slots__ = ("_decoder", "_last_stream", "_out")

    def __init__(self) -> None:
        self._decoder = FrameDecoder()
        self._last_stream = 0
        self._out = bytearray()

    def data_to_send(self) -> bytes:
        data = bytes(self._out)
        self._out.clear()
        return data

    def _reject(self, stream_id: int, code: Code, message: str) -> ProtocolNotice:
        self._out += encode_response(stream_id, code=code, message=message)
        return ProtocolNotice(f"stream {stream_id}: {code.name}: {message}")

    def _check_stream(self, stream_id: int) -> ProtocolNotice | None:
        if stream_id % 2 == 0:
            return self._reject(
                stream_id,
                Code.INVALID_ARGUMENT,
                "StreamID must be odd for client initiated streams",
            )
        if stream_id <= self._last_stream:
            return self._reject(
                stream_id, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment"
            )
        self._last_stream = stream_id
        return None

    def feed(self, data: bytes) -> list[TtrpcEvent]:
        events: list[TtrpcEvent] = []
        for frame in self._decoder.feed(data):
            if isinstance(frame, OversizedFrame):
                if frame.msg_type == MSG_REQUEST and (bad := self._check_stream(frame.stream_id)):
                    events.append(bad)
                    continue
                events.append(
                    self._reject(
                        frame.stream_id, Code.RESOURCE_EXHAUSTED, oversized_message(frame.length)
                    )
                )
                continue
            if frame.msg_type != MSG_REQUEST:
                events.append(
                    ProtocolNotice(
                        f"stream {frame.stream_id}: dropped message of type {frame.msg_type} "
                        "on a server stream"
                    )
                )
                continue
            if bad := self._check_stream(frame.stream_id):
                events.append(bad)
                continue
            req = ttrpc_pb2.Request()
            try:
                req.ParseFromString(frame.data)
            except DecodeError as exc:
                events.append(
                    self._reject(
                        frame.stream_id, Code.INVALID_ARGUMENT, f"unmarshal request: {exc}"
                    )
                )
                continue
            events.append(
                RequestReceived(
                    frame.stream_id,
                    req.service,
                    req.method,
                    req.payload,
                    req.timeout_nano,
                    tuple((kv.key, kv.value) for kv in req.metadata) if req.metadata else (),
                )
            )
        return events


# --- client -----------------------------------------------------------------


class TtrpcClient:
    """The calling end of a ttrpc byte stream: odd, increasing stream ids."""

    __slots__ = ("_decoder", "_next_stream", "_pending")

    def __init__(self) -> None:
        self._decoder = FrameDecoder()
        self._next_stream = 1
        self._pending: set[int] = set()

    @property
    def pending(self) -> frozenset[int]:
        return frozenset(self._pending)

    def request(
        self,
        service: str,
        method: str,
        payload: bytes,
        timeout_nano: int = 0,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> tuple[int, bytes]:
        """Encode a request; returns its stream id and the bytes to send.

        Raises :class:`TtrpcError` (RESOURCE_EXHAUSTED) for an oversized
        message without consuming a stream id.
        """
        req = ttrpc_pb2.Request(service=service, method=method, payload=payload)
        if timeout_nano:
            req.timeout_nano = timeout_nano
        for key, value in metadata:
            req.metadata.add(key=key, value=value)
        stream_id = self._next_stream
        data = encode_message(stream_id, MSG_REQUEST, req.SerializeToString())
        self._next_stream += 2
        self._pending.add(stream_id)
        return stream_id, data

    def forget(self, stream_id: int) -> None:
        """Stop waiting for ``stream_id`` (timed out); a late answer is dropped."""
        self._pending.discard(stream_id)

    def feed(self, data: bytes) -> list[TtrpcEvent]:
        events: list[TtrpcEvent] = []
        for frame in self._decoder.feed(data):
            sid = frame.stream_id
            if sid not in self._pending:
                events.append(ProtocolNotice(f"received message on inactive stream {sid}"))
                continue
            if isinstance(frame, OversizedFrame):
                self._pending.discard(sid)
                events.append(
                    ResponseReceived(
                        sid, Code.RESOURCE_EXHAUSTED, oversized_message(frame.length), b""
                    )
                )
                continue
            if frame.msg_type != MSG_RESPONSE:
                events.append(
                    ProtocolNotice(f"stream {sid}: dropped message of type {frame.msg_type}")
                )
                continue
            self._pending.discard(sid)
            resp = ttrpc_pb2.Response()
            try:
                resp.ParseFromString(frame.data)
            except DecodeError as exc:
                events.append(
                    ResponseReceived(sid, Code.INTERNAL, f"unmarshal response: {exc}", b"")
                )
                continue
            if resp.HasField("status") and resp.status.code != 0:
                events.append(ResponseReceived(sid, resp.status.code, resp.status.message, b""))
            else:
                events.append(ResponseReceived(sid, 0, "", resp.payload))
        return events

"""NRI multiplexer framing (``pkg/net/multiplex`` upstream), sans-IO.

A mux frame is an 8-byte header -- conn id (uint32 big-endian), payload
length (uint32 big-endian) -- followed by the payload. Each conn id carries an
independent byte stream: a ttrpc message may be split over several frames
and one frame may hold the end of one message and the start of the next.

Outgoing payloads are cut into frames of at most :data:`MAX_OUT_PAYLOAD`
bytes: Go peers read a frame into a 4096-byte bufio buffer and close the
connection ("ttrpc: closed") when a frame is larger.
"""

from __future__ import annotations

import struct

HEADER = struct.Struct(">II")
HEADER_LEN = HEADER.size

#: conn 1: the plugin serves ``nri.pkg.api.v1alpha1.Plugin``.
PLUGIN_SERVICE_CONN = 1
#: conn 2: the runtime serves ``nri.pkg.api.v1alpha1.Runtime``.
RUNTIME_SERVICE_CONN = 2

#: Largest payload we put in one outgoing frame (Go's bufio reader size).
MAX_OUT_PAYLOAD = 4096
#: Largest incoming frame payload we accept: a whole maximal ttrpc message.
MAX_IN_PAYLOAD = 10 + (4 << 20)


class MuxError(Exception):
    """The trunk carries something that is not NRI mux framing; close it."""


def encode_frames(conn_id: int, data: bytes, max_payload: int = MAX_OUT_PAYLOAD) -> bytes:
    """Return ``data`` for ``conn_id`` as mux frames of at most ``max_payload`` bytes."""
    if not data:
        return b""
    pack = HEADER.pack
    if len(data) <= max_payload:
        return pack(conn_id, len(data)) + data
    out = bytearray()
    view = memoryview(data)
    for off in range(0, len(data), max_payload):
        chunk = view[off : off + max_payload]
        out += pack(conn_id, len(chunk))
        out += chunk
    return bytes(out)


class MuxDecoder:
    """Splits the trunk byte stream into ``(conn_id, payload)`` pieces.

    Feed it whatever the socket returned; it keeps partial frames between
    calls. A frame whose declared length exceeds :data:`MAX_IN_PAYLOAD` or
    whose conn id is 0 raises :class:`MuxError` (the connection must be
    closed: the stream cannot be resynchronised).
    """

    __slots__ = ("_buf", "max_payload")

    def __init__(self, max_payload: int = MAX_IN_PAYLOAD) -> None:
        self._buf = bytearray()
        self.max_payload = max_payload

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a complete frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        frames: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        unpack = HEADER.unpack_from
        while end - pos >= HEADER_LEN:
            conn_id, length = unpack(buf, pos)
            if conn_id == 0:
                raise MuxError("mux frame with reserved conn id 0")
            if length > self.max_payload:
                raise MuxError(
                    f"mux frame of {length} bytes on conn {conn_id} exceeds "
                    f"the limit of {self.max_payload}"
                )
            if end - pos - HEADER_LEN < length:
                break
            start = pos + HEADER_LEN
            frames.append((conn_id, bytes(buf[start : start + length])))
            pos = start + length
        if pos:
            del buf[:pos]
        return frames

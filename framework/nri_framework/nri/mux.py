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
#: Largest incoming frame payload we accept: what NRI v0.6.1 writes at most
#: (16 MiB, it returns EMSGSIZE beyond; v0.8+ splits writes at 10 + 4 MiB).
#: Payloads are passed on as they arrive, never buffered whole, so this bounds
#: nothing in memory: a larger length means the trunk is not NRI framing.
MAX_IN_PAYLOAD = 16 << 20


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
    """Splits the trunk byte stream into ``(conn_id, bytes)`` pieces.

    Feed it whatever the socket returned. A frame's payload is handed on as it
    arrives, in pieces (each conn id is a byte stream: the ttrpc layer joins
    them and discards an oversized message without holding it), so a frame of
    many MiB from an NRI v0.6.1 runtime costs no memory here; only a partial
    8-byte header is kept between calls. A frame whose declared length exceeds
    :data:`MAX_IN_PAYLOAD` or whose conn id is 0 raises :class:`MuxError` (the
    connection must be closed: the stream cannot be resynchronised).
    """

    __slots__ = ("_conn", "_hdr", "_left", "max_payload")

    def __init__(self, max_payload: int = MAX_IN_PAYLOAD) -> None:
        self._hdr = bytearray()
        self._conn = 0
        self._left = 0  # payload bytes of the current frame still to come
        self.max_payload = max_payload

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned (a partial frame header)."""
        return len(self._hdr)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if not self._left and not self._hdr and len(data) > HEADER_LEN:
            # the common read: exactly one whole frame (a request and its answer)
            conn_id, length = HEADER.unpack_from(data)
            if length == len(data) - HEADER_LEN and conn_id and length <= self.max_payload:
                return [(conn_id, data[HEADER_LEN:])]
        pieces: list[tuple[int, bytes]] = []
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            if self._left:
                n = min(self._left, end - pos)
                if pieces and pieces[-1][0] == self._conn:
                    pieces[-1] = (self._conn, pieces[-1][1] + view[pos : pos + n])
                else:
                    pieces.append((self._conn, bytes(view[pos : pos + n])))
                self._left -= n
                pos += n
                continue
            need = HEADER_LEN - len(self._hdr)
            self._hdr += view[pos : pos + need]
            pos += min(need, end - pos)
            if len(self._hdr) < HEADER_LEN:
                break
            conn_id, length = HEADER.unpack(self._hdr)
            self._hdr.clear()
            if conn_id == 0:
                raise MuxError("mux frame with reserved conn id 0")
            if length > self.max_payload:
                raise MuxError(
                    f"mux frame of {length} bytes on conn {conn_id} exceeds "
                    f"the limit of {self.max_payload}"
                )
            self._conn, self._left = conn_id, length
        return pieces

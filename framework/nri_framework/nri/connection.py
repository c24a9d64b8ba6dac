"""One side of an NRI trunk: the mux plus a ttrpc server and a ttrpc client.

On conn 1 the plugin serves ``nri.pkg.api.v1alpha1.Plugin`` and the runtime
calls it; on conn 2 the runtime serves ``nri.pkg.api.v1alpha1.Runtime`` and
the plugin calls it. :class:`NriConnection` is that arrangement for either
side, sans-IO in the style of h11: ``receive_data`` eats trunk bytes and
returns events, ``send_*`` queue bytes that :meth:`data_to_send` hands over.
"""

from __future__ import annotations

import enum

import msgspec

from nri_framework.nri import mux
from nri_framework.nri.ttrpc import (
    ProtocolNotice,
    RequestReceived,
    ResponseReceived,
    TtrpcClient,
    TtrpcServer,
    encode_response,
    response_head,
)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"


class Role(enum.Enum):
    PLUGIN = "plugin"
    RUNTIME = "runtime"


class ConnectionClosed(msgspec.Struct, frozen=True):
    """The trunk carried something unrecoverable; close the socket."""

    reason: str


NriEvent = RequestReceived | ResponseReceived | ProtocolNotice | ConnectionClosed


class NriConnection:
    """The protocol state of one NRI trunk, for the plugin or the runtime side."""

    def __init__(self, role: Role, max_out_payload: int = mux.MAX_OUT_PAYLOAD) -> None:
        self.role = role
        self.max_out_payload = max_out_payload
        self._mux = mux.MuxDecoder()
        self._server = TtrpcServer()
        self._client = TtrpcClient()
        if role is Role.PLUGIN:
            self.serve_conn, self.call_conn = mux.PLUGIN_SERVICE_CONN, mux.RUNTIME_SERVICE_CONN
            self.served_service, self.called_service = PLUGIN_SERVICE, RUNTIME_SERVICE
        else:
            self.serve_conn, self.call_conn = mux.RUNTIME_SERVICE_CONN, mux.PLUGIN_SERVICE_CONN
            self.served_service, self.called_service = RUNTIME_SERVICE, PLUGIN_SERVICE
        self._out = bytearray()
        self.closed: str | None = None

    # -- input ----------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[NriEvent]:
        if self.closed is not None:
            return []
        try:
            frames = self._mux.feed(data)
        except mux.MuxError as exc:
            self.closed = str(exc)
            return [ConnectionClosed(self.closed)]
        events: list[NriEvent] = []
        for conn_id, payload in frames:
            if conn_id == self.serve_conn:
                events.extend(self._server.feed(payload))
                auto = self._server.data_to_send()
                if auto:
                    self._out += mux.encode_frames(self.serve_conn, auto, self.max_out_payload)
            elif conn_id == self.call_conn:
                events.extend(self._client.feed(payload))
            # Frames for a conn nobody opened are dropped, as upstream does.
        return events

    # -- output ---------------------------------------------------------------

    def send_request(
        self,
        method: str,
        payload: bytes,
        timeout_nano: int = 0,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> int:
        """Queue a call of ``method`` on the peer's service; returns the stream id."""
        stream_id, data = self._client.request(
            self.called_service, method, payload, timeout_nano, metadata
        )
        self._out += mux.encode_frames(self.call_conn, data, self.max_out_payload)
        return stream_id

    def send_response(
        self, stream_id: int, payload: bytes = b"", code: int = 0, message: str = ""
    ) -> None:
        if not code:  # success: the payload appended as it is, no message built
            head = response_head(stream_id, len(payload))
            length = len(head) + len(payload)
            if length <= self.max_out_payload:  # one mux frame (a decision's reply)
                out = self._out
                out += mux.HEADER.pack(self.serve_conn, length)
                out += head
                out += payload
                return
        data = encode_response(stream_id, payload, code, message)
        self._out += mux.encode_frames(self.serve_conn, data, self.max_out_payload)

    def forget(self, stream_id: int) -> None:
        self._client.forget(stream_id)

    def data_to_send(self) -> bytes:
        data = bytes(self._out)
        self._out.clear()
        return data

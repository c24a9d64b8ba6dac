"""How the plugin reaches the privileged SST helper: the one connection the
cpuClass handler (cpufreq, C-states, uncore) and Priority Core Turbo share.

:class:`HelperWriter` sends typed requests over the helper's ZeroMQ socket
(blocking, each with the client's 100 ms timeout); :class:`NullWriter` stands
in when there is no ``--sst-helper`` and only logs at debug level.
"""

from __future__ import annotations

import logging
from typing import Protocol

from nri_sst import messages as m
from nri_sst.client import HelperRequestError, HelperUnavailable, SyncHelperClient

log = logging.getLogger("cpuclass")

WriteRequest = m.SetCpufreq | m.SetCstates | m.SetUncore


class WriterUnavailable(Exception):
    """The writer cannot deliver anything now (the helper is gone)."""


class WriteRefused(Exception):
    """The helper refused one request (its message says why)."""


class Writer(Protocol):
    """Delivers hardware requests; raises :class:`WriterUnavailable` or
    :class:`WriteRefused`. ``endpoint`` is "" when there is no helper;
    ``generation`` changes whenever the connection to the helper was
    re-established (helper-side state may be gone then)."""

    endpoint: str

    def send(self, request: WriteRequest, timeout: float | None = None) -> None: ...

    def request(self, request: m.Request, timeout: float | None = None) -> m.Reply: ...

    @property
    def generation(self) -> int: ...

    def close(self) -> None: ...


class NullWriter:
    """No helper: log what would be written, at debug level."""

    endpoint = ""

    def send(self, request: WriteRequest, timeout: float | None = None) -> None:
        log.debug("cpuclass: no SST helper, not writing %s", request)

    def request(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        raise WriterUnavailable("no SST helper configured (--sst-helper)")

    @property
    def generation(self) -> int:
        return 0

    def close(self) -> None:
        pass


class HelperWriter:
    """Requests to the SST helper over its ZeroMQ socket (blocking, with the
    client's short timeout, so a dead helper costs one timeout per commit)."""

    def __init__(self, endpoint: str, timeout: float = 0.1) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._client: SyncHelperClient | None = None
        self._closed_handshakes = 0

    def send(self, request: WriteRequest, timeout: float | None = None) -> None:
        self.request(request, timeout)

    def request(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        if self._client is None:
            self._client = SyncHelperClient(
                self.endpoint, timeout=self.timeout, client="nri-resource-policy"
            )
        try:
            return self._client.request(request, timeout)
        except HelperUnavailable as exc:
            raise WriterUnavailable(str(exc)) from None
        except HelperRequestError as exc:
            raise WriteRefused(str(exc)) from None

    @property
    def generation(self) -> int:
        if self._client is None:
            return self._closed_handshakes
        return self._closed_handshakes + self._client.handshakes

    def close(self) -> None:
        if self._client is not None:
            self._closed_handshakes += self._client.handshakes
            self._client.close()
            self._client = None

"""The NRI protocol, sans-IO.

Everything in this package works on bytes and returns events; no sockets,
no asyncio. The transport (:mod:`nri_framework.transport`) is a thin shell
around :class:`~nri_framework.nri.connection.NriConnection`.

Layers, bottom up:

* :mod:`.mux` -- the NRI multiplexer: 8-byte frames that carry two
  independent byte streams (conn 1: Plugin service, conn 2: Runtime service)
  over one unix stream socket.
* :mod:`.ttrpc` -- ttrpc messages: a 10-byte header, Request/Response
  envelopes, stream-id rules.
* :mod:`.connection` -- both combined for one side of an NRI trunk.
"""

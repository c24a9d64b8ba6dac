"""The NRI protocol, sans-IO.

Everything in this package works on bytes and returns events; no sockets,
no asyncio. The asyncio shells around
:class:`~nri_framework.nri.connection.NriConnection` live outside it: the
plugin's :mod:`nri_framework.stub` and the runtime simulator's
:mod:`nri_framework.simulate.peer`.

Layers, bottom up:

* :mod:`.mux` -- the NRI multiplexer: 8-byte frames that carry two
  independent byte streams (conn 1: Plugin service, conn 2: Runtime service)
  over one unix stream socket.
* :mod:`.ttrpc` -- ttrpc messages: a 10-byte header, Request/Response
  envelopes, stream-id rules.
* :mod:`.connection` -- both combined for one side of an NRI trunk.
* :mod:`.lifecycle` -- the plugin's lifecycle on a trunk (registering,
  configured, synchronized, ...) as a transition table; a request out of
  order is a :class:`~nri_framework.nri.lifecycle.LifecycleError`.
* :mod:`.versions` -- which NRI version a runtime speaks and what that
  version accepts and sends.
"""

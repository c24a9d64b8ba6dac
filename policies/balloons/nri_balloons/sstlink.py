"""How the plugin reaches the privileged SST helper: the one link the
cpuClass handler (cpufreq, C-states, uncore) and Priority Core Turbo share.

Whatever talks to the helper is written once, as *steps*: a generator that
yields an :class:`Ask` (a request and its timeout) and is sent the typed
reply, or has :class:`WriterUnavailable` / :class:`WriteRefused` thrown in at
that point. Two drivers run steps:

* :func:`exchange`, blocking, for the plugin's reply path (a hook on the
  event loop). With a :class:`Budget` every wait of the hook together ends at
  the budget's deadline (100 ms): the helper can never hold an NRI reply
  longer. A blocking call is given its :class:`Wait` (per-request timeout
  and budget) as an argument. When the budget is spent, :class:`BudgetSpent` is thrown in and
  the rest is left to the background.
* :func:`exchange_async`, for the plugin's background work (re-programming
  SST after a restarted helper, retries while it is away, the periodic
  probe): an asyncio task awaiting the asyncio client, with the longer
  timeouts SoC-wide operations need, never blocking the event loop.

:class:`HelperWriter` owns one client session for each (the reply path's
blocking one and the background's asyncio one); :class:`NullWriter` stands
in when there is no ``--sst-helper``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import NamedTuple, Protocol, TypeVar

from nri_sst import messages as m
from nri_sst.client import (
    DEFAULT_TIMEOUT,
    HelperClient,
    HelperRequestError,
    HelperUnavailable,
    SyncHelperClient,
)

log = logging.getLogger("cpuclass")

WriteRequest = m.SetCpufreq | m.SetCstates | m.SetUncore
T = TypeVar("T")
REPLY_BUDGET = DEFAULT_TIMEOUT / 2
"""Seconds a hook on the event loop may wait for the helper in total: half
the 100 ms a container's reply may take, so that the reply (the policy's
own work included) stays within it while the helper is away or hung; a
healthy helper answers in well under a millisecond."""


class WriterUnavailable(Exception):
    """The writer cannot deliver anything now (the helper is gone)."""


class BudgetSpent(WriterUnavailable):
    """The reply path's budget is spent: nothing more was sent (the helper
    may be fine; the background goes on)."""


class WriteRefused(Exception):
    """The helper refused one request (its message says why)."""


class Ask(NamedTuple):
    """One request of a step generator; ``timeout`` None: the writer's default."""

    request: m.Request
    timeout: float | None = None


Steps = Generator[Ask, m.Reply, T]
"""Steps that talk to the helper and end with a ``T``."""


class Writer(Protocol):
    """Delivers requests; raises :class:`WriterUnavailable` or
    :class:`WriteRefused`. ``endpoint`` is "" when there is no helper;
    ``instance`` names the helper process that answered the last request
    (it changes when the helper was restarted, never on a re-handshake)."""

    endpoint: str

    @property
    def instance(self) -> str: ...

    def request(self, request: m.Request, timeout: float | None = None) -> m.Reply: ...

    async def request_async(self, request: m.Request, timeout: float | None = None) -> m.Reply: ...

    def close(self) -> None: ...


class NullWriter:
    """No helper: log what would be written, at debug level."""

    endpoint = ""
    instance = ""

    def request(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        if isinstance(request, m.SetCpufreq):
            log.debug("cpuclass: no SST helper, not writing %s", request)
            return m.SetCpufreqReply(cpus=request.cpus)
        if isinstance(request, m.SetCstates):
            log.debug("cpuclass: no SST helper, not writing %s", request)
            return m.SetCstatesReply(cpus=request.cpus, disabled=request.disabled)
        if isinstance(request, m.SetUncore):
            log.debug("cpuclass: no SST helper, not writing %s", request)
            return m.SetUncoreReply(package=request.package, die=request.die)
        raise WriterUnavailable("no SST helper configured (--sst-helper)")

    async def request_async(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        return self.request(request, timeout)

    def close(self) -> None:
        pass


class HelperWriter:
    """Requests to the SST helper over its ZeroMQ socket: :meth:`request`
    blocks (each call ends at its timeout, ``timeout`` by default);
    :meth:`request_async` awaits, on a session of its own."""

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.instance = ""
        self._client: SyncHelperClient | None = None
        self._async: HelperClient | None = None

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
        finally:
            self.instance = self._client.instance or self.instance

    async def request_async(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        if self._async is None:
            self._async = HelperClient(
                self.endpoint, timeout=self.timeout, client="nri-resource-policy"
            )
        try:
            return await self._async.request(request, timeout)
        except HelperUnavailable as exc:
            raise WriterUnavailable(str(exc)) from None
        except HelperRequestError as exc:
            raise WriteRefused(str(exc)) from None
        finally:
            self.instance = self._async.instance or self.instance

    def close(self) -> None:
        for client in (self._client, self._async):
            if client is not None:
                client.close()
        self._client = self._async = None


class Budget:
    """The reply path's total wait for the helper: :meth:`timeout` caps each
    request at what is left and raises :class:`BudgetSpent` once nothing is."""

    def __init__(self, seconds: float = REPLY_BUDGET, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self.deadline = clock() + seconds

    def left(self) -> float:
        """Seconds of the budget not spent yet (negative once spent)."""
        return self.deadline - self.clock()

    def timeout(self, wanted: float | None) -> float:
        left = self.deadline - self.clock()
        if left <= 0:
            raise BudgetSpent(
                f"the reply path's {self.seconds * 1000:.0f} ms for the SST helper are spent"
            )
        return left if wanted is None else min(wanted, left)


class Wait(NamedTuple):
    """How long one blocking call may wait for the helper, given to the call
    (never set on an object around it): ``timeout`` per request (None: the
    writer's default), ``budget`` every request of the call together (None:
    no total; on the reply path the hook's :class:`Budget`, shared by every
    call the hook makes)."""

    timeout: float | None = None
    budget: Budget | None = None


DEFAULT_WAIT = Wait()
"""The writer's default timeout per request, no total."""


def exchange(steps: Steps[T], writer: Writer, budget: Budget | None = None) -> T:
    """Run ``steps`` to their end with blocking requests (see the module doc)."""
    try:
        ask = next(steps)
        while True:
            try:
                timeout = ask.timeout if budget is None else budget.timeout(ask.timeout)
                reply = writer.request(ask.request, timeout)
            except (WriterUnavailable, WriteRefused) as exc:
                ask = steps.throw(exc)
            else:
                ask = steps.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


async def exchange_async(steps: Steps[T], writer: Writer) -> T:
    """Run ``steps`` to their end, awaiting each request (see the module doc).
    Cancelled, the steps are closed where they wait (their ``finally``
    blocks run; the request's outcome is unknown)."""
    try:
        ask = next(steps)
        while True:
            try:
                reply = await writer.request_async(ask.request, ask.timeout)
            except (WriterUnavailable, WriteRefused) as exc:
                ask = steps.throw(exc)
            else:
                ask = steps.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()

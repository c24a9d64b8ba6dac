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
  timeouts SoC-wide operations need, never blocking the event loop. Its
  retries pause in a :class:`Backoff`, which the periodic probe cuts short:
  a helper back (or gone) is noticed at the probe's pace, whatever the
  backoff has grown to.

A decision's writes go in one round trip: steps yield an ``Apply`` of their
independent writes, and :func:`together` runs several steps side by side,
sending the writes they ask for at the same time as one ``Apply``
(protocol: :class:`nri_sst.messages.Apply`). A helper without the ``apply``
capability (an older one) gets them as separate requests, and so does an
``Apply`` the helper refused whole (one invalid item refuses it): each write
then stands or falls by itself, as before.

:class:`HelperWriter` owns one client session for each (the reply path's
blocking one and the background's asyncio one); :class:`NullWriter` stands
in when there is no ``--sst-helper``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Generator
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, cast

from nri_sst import messages as m
from nri_sst.client import (
    DEFAULT_TIMEOUT,
    Call,
    HelperClient,
    HelperRequestError,
    HelperUnavailable,
    SyncHelperClient,
)

log = logging.getLogger("cpuclass")

WriteRequest = m.SetCpufreq | m.SetCstates | m.SetUncore
T = TypeVar("T")
APPLY = "apply"
"""The helper capability of :class:`nri_sst.messages.Apply`."""
REPLY_BUDGET = DEFAULT_TIMEOUT / 2
"""Seconds a hook on the event loop may wait for the helper in total: half
the 100 ms a container's reply may take, so that the reply (the policy's
own work included) stays within it while the helper is away or hung; a
healthy helper answers in well under a millisecond."""
START_GRACE = 20.0
"""Seconds from the plugin's start during which a helper that has not
answered yet is awaited rather than missing: its sidecar may start after the
plugin's container (the chart's does). Failures meanwhile are logged as a
WARNING (PCT is reported degraded all the same); the ERROR comes only if it
still does not answer after that. A helper that answered once is never
awaited again: its outage is an ERROR at once."""


class WriterUnavailable(Exception):
    """The writer cannot deliver anything now (the helper is gone)."""


class BudgetSpent(WriterUnavailable):
    """The reply path's budget is spent: nothing more was sent (the helper
    may be fine; the background goes on)."""


class WriteRefused(Exception):
    """The helper refused one request (its message says why; ``error``: the
    helper's typed refusal, when it gave one)."""

    def __init__(self, message: str, error: m.ErrorReply | None = None) -> None:
        super().__init__(message)
        self.error = error


def refused(error: m.ErrorReply) -> WriteRefused:
    """The :class:`WriteRefused` of the helper's typed refusal ``error``."""
    return WriteRefused(f"{error.code}: {error.message}", error)


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

    def supports(self, capability: str) -> bool:
        """The helper that answered last has ``capability`` (its Hello said so)."""
        ...

    def close(self) -> None: ...


class NullWriter:
    """No helper: log what would be written, at debug level."""

    endpoint = ""
    instance = ""

    @staticmethod
    def silent() -> bool:
        """Nothing sent here would even be logged (cpuclass debug is off): a
        commit need not plan what it would send."""
        return not log.isEnabledFor(logging.DEBUG)

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

    def supports(self, capability: str) -> bool:
        return False

    def close(self) -> None:
        pass


class HelperWriter:
    """Requests to the SST helper over its socket (ZMTP): :meth:`request`
    blocks (each call ends at its timeout, ``timeout`` by default);
    :meth:`request_async` awaits, on a session of its own."""

    def __init__(
        self,
        endpoint: str,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.instance = ""
        self._clock = clock
        self._started = clock()
        self._client: SyncHelperClient | None = None
        self._async: HelperClient | None = None

    def request(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        return self.finish(self.start(request, timeout))

    def start(self, request: m.Request, timeout: float | None = None) -> Call:
        """Send ``request`` now; :meth:`finish` waits for its reply (see
        :meth:`nri_sst.client.SyncHelperClient.start`)."""
        if self._client is None:
            self._client = SyncHelperClient(
                self.endpoint, timeout=self.timeout, client="nri-resource-policy"
            )
        client = self._client
        try:
            return client.start(request, timeout)
        except HelperUnavailable as exc:
            raise WriterUnavailable(str(exc)) from None
        finally:
            self.instance = client.instance or self.instance

    def finish(self, call: Call) -> m.Reply:
        """The reply of the request :meth:`start` sent, within its timeout."""
        client = self._client
        assert client is not None
        try:
            return client.finish(call)
        except HelperUnavailable as exc:
            raise WriterUnavailable(str(exc)) from None
        except HelperRequestError as exc:
            raise refused(m.ErrorReply(code=exc.code, message=exc.message)) from None
        finally:
            self.instance = client.instance or self.instance

    async def request_async(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        if self._async is None:
            self._async = HelperClient(
                self.endpoint, timeout=self.timeout, client="nri-resource-policy"
            )
        client = self._async  # its own: close() (at shutdown) may drop it meanwhile
        try:
            return await client.request(request, timeout)
        except HelperUnavailable as exc:
            raise WriterUnavailable(str(exc)) from None
        except HelperRequestError as exc:
            raise refused(m.ErrorReply(code=exc.code, message=exc.message)) from None
        finally:
            self.instance = client.instance or self.instance

    def awaited(self) -> bool:
        """No helper process has answered yet, and this writer (the plugin)
        started less than :data:`START_GRACE` ago."""
        return not self.instance and self._clock() - self._started < START_GRACE

    def supports(self, capability: str) -> bool:
        return any(
            c is not None and c.hello is not None and capability in c.hello.capabilities
            for c in (self._client, self._async)
        )

    def close(self) -> None:
        for client in (self._client, self._async):
            if client is not None:
                client.close()
        self._client = self._async = None


def sidecar_awaited(writer: Writer) -> bool:
    """``writer``'s helper is awaited (:meth:`HelperWriter.awaited`): its
    failures are not an outage to log as an ERROR yet. Only a helper's
    socket is awaited (no stand-in is)."""
    return isinstance(writer, HelperWriter) and writer.awaited()


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


Delivery = Generator[tuple[m.Request, float | None], m.Reply, m.Reply]
"""How one :class:`Ask` reaches the helper: the requests it takes (each
with its timeout), ending with the ask's reply."""


def delivery(ask: Ask, batches: bool) -> Delivery:
    """``ask`` as the helper takes it: an ``Apply`` as is when the helper has
    the ``apply`` capability (``batches``), else (or when it refused the
    ``Apply`` whole) each write alone, their replies (a refused one as its
    :class:`~nri_sst.messages.ErrorReply`) gathered into the ``ApplyReply``."""
    req = ask.request
    if not isinstance(req, m.Apply):
        return (yield req, ask.timeout)
    if batches:
        try:
            return (yield req, ask.timeout)
        except WriteRefused:
            if len(req.items) < 2:
                raise
            log.debug("cpuclass: the SST helper refused a batch; its writes one by one")
    replies: list[m.ApplyItemReply] = []
    for item in req.items:
        try:
            reply = yield item, ask.timeout
        except WriteRefused as exc:
            replies.append(exc.error or m.ErrorReply(code="invalid-argument", message=str(exc)))
            continue
        if isinstance(reply, m.ApplyItemReply):
            replies.append(reply)
        else:
            replies.append(m.ErrorReply(code="internal", message=type(reply).__name__))
    return m.ApplyReply(replies=replies)


def exchange(steps: Steps[T], writer: Writer, budget: Budget | None = None) -> T:
    """Run ``steps`` to their end with blocking requests (see the module doc)."""
    return Exchange(steps, writer, budget).finish()


class Exchange(Generic[T]):
    """:func:`exchange` in two halves, so that the reply path works while the
    helper does: built, it runs ``steps`` to their first request and sends
    it (a :class:`HelperWriter`; any other writer is asked in
    :meth:`finish`); :meth:`finish` waits for that reply, within the same
    per-request timeout and ``budget`` as :func:`exchange`, and runs the
    steps to their end. Each one must be finished (``try``/``finally``): the
    steps learn the outcome of what was sent only then."""

    def __init__(self, steps: Steps[T], writer: Writer, budget: Budget | None = None) -> None:
        self.steps = steps
        self.writer = writer
        self.budget = budget
        self._done = False
        self._result: T | None = None
        self._ask: Ask | None = None
        self._sent: tuple[Delivery, Call] | None = None
        self._error: Exception | None = None
        try:
            self._ask = next(steps)
        except StopIteration as done:
            self._end(done.value)
            return
        except BaseException:
            steps.close()
            raise
        if isinstance(writer, HelperWriter):
            try:
                self._start(writer, self._ask)
            except BaseException:
                steps.close()
                raise

    def _end(self, result: T) -> None:
        self._done = True
        self._result = result
        self.steps.close()

    def _timeout(self, wanted: float | None) -> float | None:
        return wanted if self.budget is None else self.budget.timeout(wanted)

    def _start(self, writer: HelperWriter, ask: Ask) -> None:
        """The first request of ``ask`` sent; a failure to send is kept for
        :meth:`finish` (thrown into the steps there, as :func:`exchange`
        would have)."""
        send = delivery(ask, writer.supports(APPLY))
        req, wanted = next(send)
        try:
            self._sent = send, writer.start(req, self._timeout(wanted))
        except (WriterUnavailable, WriteRefused) as exc:
            send.close()
            self._error = exc

    def _deliver(self, ask: Ask) -> m.Reply:
        try:
            if self._sent is not None:  # its first request is out: the reply
                send, call = self._sent
                self._sent = None
                assert isinstance(self.writer, HelperWriter)
                try:
                    reply = self.writer.finish(call)
                except WriteRefused as exc:
                    req, wanted = send.throw(exc)
                else:
                    req, wanted = send.send(reply)
            else:
                send = delivery(ask, self.writer.supports(APPLY))
                req, wanted = next(send)
            while True:
                try:
                    reply = self.writer.request(req, self._timeout(wanted))
                except WriteRefused as exc:
                    req, wanted = send.throw(exc)
                else:
                    req, wanted = send.send(reply)
        except StopIteration as done:
            result: m.Reply = done.value
            return result

    def finish(self) -> T:
        """The steps' result (see the class doc); a second call returns it again."""
        if self._done:
            return cast(T, self._result)
        steps = self.steps
        try:
            ask = self._ask
            assert ask is not None
            while True:
                try:
                    if self._error is not None:
                        exc, self._error = self._error, None
                        raise exc
                    reply = self._deliver(ask)
                except (WriterUnavailable, WriteRefused) as exc:
                    ask = steps.throw(exc)
                else:
                    ask = steps.send(reply)
        except StopIteration as done:
            self._end(done.value)
            return cast(T, done.value)
        finally:
            self._done = True
            steps.close()


async def exchange_async(steps: Steps[T], writer: Writer) -> T:
    """Run ``steps`` to their end, awaiting each request (see the module doc).
    Cancelled, the steps are closed where they wait (their ``finally``
    blocks run; the request's outcome is unknown)."""

    async def deliver(ask: Ask) -> m.Reply:
        send = delivery(ask, writer.supports(APPLY))
        try:
            req, timeout = next(send)
            while True:
                try:
                    reply = await writer.request_async(req, timeout)
                except WriteRefused as exc:
                    req, timeout = send.throw(exc)
                else:
                    req, timeout = send.send(reply)
        except StopIteration as done:
            result: m.Reply = done.value
            return result

    try:
        ask = next(steps)
        while True:
            try:
                reply = await deliver(ask)
            except (WriterUnavailable, WriteRefused) as exc:
                ask = steps.throw(exc)
            else:
                ask = steps.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


class Backoff:
    """The pause of a background task between its attempts with a helper that
    did not answer, cut short by :meth:`wake` (the periodic probe: it is time
    to ask again). A wake while nobody pauses cuts the next pause: a probe
    that came while an attempt was on the way is not lost."""

    def __init__(self) -> None:
        self._woken = asyncio.Event()

    def wake(self) -> None:
        self._woken.set()

    async def until_woken(self, seconds: float) -> bool:
        """Pause at most ``seconds``; True when woken before."""
        try:
            await asyncio.wait_for(self._woken.wait(), seconds)
        except TimeoutError:
            return False
        finally:
            self._woken.clear()
        return True

    async def pause(self, seconds: float) -> None:
        """:meth:`until_woken` as a plain pause (cpupriority.rediscover's)."""
        await self.until_woken(seconds)


def _writes(request: m.Request) -> list[m.ApplyItem] | None:
    """The writes of ``request`` an ``Apply`` can carry (None: it cannot)."""
    if isinstance(request, m.Apply):
        return list(request.items)
    if isinstance(request, m.ApplyItem):
        return [request]
    return None


def together(*steps: Steps[Any]) -> Steps[list[Any]]:
    """Run ``steps`` side by side, to the results of each (in order): the
    writes they ask for at the same time go as one ``Apply`` (one round
    trip), each step sent its own reply (an item the helper refused thrown in
    as :class:`WriteRefused`), so independent steps cost one request per
    turn. A request that is no write (a Discover, a read) goes alone first,
    the others wait for it. What is thrown into the whole goes to every
    step that waits."""
    results: list[Any] = [None] * len(steps)
    asks: dict[int, Ask] = {}

    def advance(i: int, reply: m.Reply | None = None, exc: Exception | None = None) -> None:
        try:
            if exc is not None:
                asks[i] = steps[i].throw(exc)
            elif reply is None:
                asks[i] = next(steps[i])
            else:
                asks[i] = steps[i].send(reply)
        except StopIteration as done:
            asks.pop(i, None)
            results[i] = done.value

    try:
        for i in range(len(steps)):
            advance(i)  # to its first ask
        while asks:
            if len(asks) == 1:  # one step still asks: its ask as it is (what follows gives)
                i = next(iter(asks))
                try:
                    reply = yield asks[i]
                except (WriterUnavailable, WriteRefused) as exc:
                    advance(i, exc=exc)
                else:
                    advance(i, reply)
                continue
            alone = [i for i, a in asks.items() if _writes(a.request) is None][:1]
            waiting = alone or sorted(asks)
            parts = {i: _writes(asks[i].request) or [] for i in waiting}
            items = [item for i in waiting for item in parts[i]]
            timeouts = [t for i in waiting if (t := asks[i].timeout) is not None]
            timeout = min(timeouts) if timeouts else None
            if len(waiting) == 1:
                batch = asks[waiting[0]]  # as the step asked
            elif len(items) == 1:
                batch = Ask(items[0], timeout)
            else:
                batch = Ask(m.Apply(items=items), timeout)
            try:
                reply = yield batch
            except (WriterUnavailable, WriteRefused) as exc:
                for i in waiting:
                    advance(i, exc=exc)
                continue
            if len(waiting) == 1:
                advance(waiting[0], reply)
                continue
            replies = reply.replies if isinstance(reply, m.ApplyReply) else []
            at = 0
            for i in waiting:
                mine = list(replies[at : at + len(parts[i])])
                at += len(parts[i])
                answer = _answer(asks[i], mine)
                if isinstance(answer, WriteRefused):
                    advance(i, exc=answer)
                else:
                    advance(i, answer)
        return results
    finally:
        for s in steps:
            s.close()


def _answer(ask: Ask, replies: list[m.ApplyItemReply]) -> m.Reply | WriteRefused:
    """The reply of ``ask`` out of its items' ``replies`` (or its refusal)."""
    if isinstance(ask.request, m.Apply):
        return m.ApplyReply(replies=replies)
    if len(replies) != 1:
        return WriteRefused(f"no reply to {type(ask.request).__name__}")
    if isinstance(replies[0], m.ErrorReply):
        return refused(replies[0])
    return replies[0]


def item_replies(reply: m.Reply, count: int) -> list[m.Reply | WriteRefused]:
    """The replies of an ``Apply`` of ``count`` items, each refused one as
    :class:`WriteRefused` (a reply of another shape: every item refused)."""
    if not isinstance(reply, m.ApplyReply) or len(reply.replies) != count:
        return [WriteRefused(f"unexpected reply {type(reply).__name__}")] * count
    return [refused(r) if isinstance(r, m.ErrorReply) else r for r in reply.replies]

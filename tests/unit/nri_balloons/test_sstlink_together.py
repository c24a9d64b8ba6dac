"""sstlink.together against its previous implementation (the oracle, copied
verbatim from before its one-step fast path) on random steps and replies:
the same batches asked, the same replies and errors given to each step, the
same results."""

from __future__ import annotations

import random
from typing import Any

import pytest
from nri_balloons.sstlink import (
    Ask,
    Steps,
    WriteRefused,
    WriterUnavailable,
    _answer,
    _writes,
    together,
)
from nri_sst import messages as m


def oracle_together(*steps: Steps[Any]) -> Steps[list[Any]]:
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


def _request(rng: random.Random) -> m.Request:
    cpus = sorted(rng.sample(range(16), rng.randint(1, 3)))
    kind = rng.randrange(4)
    if kind == 0:
        return m.SetCstates(cpus=cpus, disabled=["C6"])
    if kind == 1:
        return m.SetCpufreq(cpus=cpus, max_khz=rng.choice([1_000_000, 2_000_000]))
    if kind == 2:
        return m.Apply(items=[m.SetCstates(cpus=cpus, disabled=[]), m.SetCpufreq(cpus=cpus)])
    return m.Discover()  # no write: goes alone


def step(seed: int, log: list[Any]) -> Steps[list[str]]:
    """A step asking up to 4 requests, recording what it is given."""
    rng = random.Random(seed)
    seen: list[str] = []
    try:
        for _ in range(rng.randint(0, 4)):
            timeout = rng.choice([None, 0.5, 1.0])
            try:
                reply = yield Ask(_request(rng), timeout)
            except (WriterUnavailable, WriteRefused) as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
                if rng.random() < 0.3:
                    return seen
                continue
            seen.append(repr(reply))
    finally:
        log.append((seed, "closed"))
    return seen


def _reply(rng: random.Random, ask: Ask) -> m.Reply:
    req = ask.request
    if isinstance(req, m.Apply):
        return m.ApplyReply(
            replies=[
                m.ErrorReply(code="internal", message="no")
                if rng.random() < 0.2
                else m.SetCstatesReply(cpus=[], disabled=[])
                for _ in req.items
            ]
        )
    if isinstance(req, m.Discover):
        if rng.random() < 0.1:
            return m.ErrorReply(code="internal", message="odd")
        return m.HelloReply(protocol=1, backend="sim", sst_supported=True, capabilities=[])
    return m.SetCpufreqReply(cpus=[])


def drive(impl: Any, seed: int) -> tuple[list[Any], list[Any], Any]:
    rng = random.Random(seed)
    log: list[Any] = []
    steps = [step(seed * 100 + k, log) for k in range(rng.randint(1, 3))]
    gen = impl(*steps)
    asked: list[Any] = []
    try:
        ask = next(gen)
        while True:
            asked.append(ask)
            r = rng.random()
            if r < 0.15:
                ask = gen.throw(WriterUnavailable("away"))
            elif r < 0.25:
                ask = gen.throw(WriteRefused("refused"))
            else:
                ask = gen.send(_reply(rng, ask))
    except StopIteration as done:
        return asked, log, done.value


@pytest.mark.parametrize("seed", range(300))
def test_together_as_before(seed: int) -> None:
    assert drive(together, seed) == drive(oracle_together, seed)

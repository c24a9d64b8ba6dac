"""The policy's state on disk: the snapshot and the decision journal.

``<policy>.state.json`` is the snapshot (:class:`SavedState`): the cache as
last decided and the policy's own state; ``<policy>.journal`` holds the
records appended since (:mod:`nri_framework.journal`), one per change,
before the reply that announces it leaves. The snapshot is rewritten off
the reply path (:data:`SAVE_DELAY` after a change, on the next turn of the
loop once the journal passes ``COMPACT_BYTES``), then the journal emptied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from nri_sst.retry import Reporter

from nri_framework.cache import Cache
from nri_framework.journal import COMPACT_BYTES, Journal
from nri_framework.model import Container, Pod

# the host's logger: these lines were the host's and keep its name
log = logging.getLogger("nri_framework.host")

STATE_VERSION = 1
#: Coalescing delay of snapshots (seconds): the compaction of the journal,
#: off the reply path (the journal record is what is on the reply path).
SAVE_DELAY = 0.05

#: The policy's state to persist, asked for only when there is somewhere to
#: persist it (``policy_export_state``).
Export = Callable[[], Any]


class SavedState(msgspec.Struct, kw_only=True):
    """The snapshot: the cache as last decided, and the policy's own state;
    ``seq`` is the last journal record it holds."""

    version: int = STATE_VERSION
    policy: str = ""
    seq: int = 0
    pods: dict[str, Pod] = {}
    containers: dict[str, Container] = {}
    policy_state: Any = None


class StateFile:
    """Snapshot and journal of one policy in ``state_dir`` (nothing is kept
    when it is ``None``)."""

    def __init__(self, state_dir: Path | None, policy_name: str) -> None:
        self.state_dir = state_dir
        self.policy_name = policy_name
        self.journal = Journal(state_dir / f"{policy_name}.journal") if state_dir else None
        #: the last journal record written
        self.seq = 0
        self._policy_state = b""  # the last one journaled, encoded
        self._save_handle: asyncio.Handle | None = None
        self._save_reporter = Reporter(log)
        self._save_urgent = False

    @property
    def path(self) -> Path | None:
        return self.state_dir / f"{self.policy_name}.state.json" if self.state_dir else None

    def _load_snapshot(self) -> SavedState | None:
        path = self.path
        if path is None or not path.exists():
            return None
        try:
            state = msgspec.json.decode(path.read_bytes(), type=SavedState)
        except (OSError, msgspec.DecodeError) as exc:
            log.error("ignoring unreadable state file %s: %s", path, exc)
            return None
        if state.version != STATE_VERSION or state.policy != self.policy_name:
            log.warning(
                "ignoring state file %s of policy %r, version %d", path, state.policy, state.version
            )
            return None
        return state

    def load(self) -> SavedState | None:
        """The snapshot with the journal's later records applied."""
        state = self._load_snapshot()
        replayed = 0
        if self.journal is not None:
            base = state or SavedState(policy=self.policy_name)
            for d in self.journal.replay():
                if d.seq <= base.seq:
                    continue  # compacted already: the snapshot holds it
                if d.reset:
                    base.pods, base.containers = {}, {}
                for pid, pod in d.pods.items():
                    if pod is None:
                        base.pods.pop(pid, None)
                    else:
                        base.pods[pid] = pod
                for cid, ctr in d.containers.items():
                    if ctr is None:
                        base.containers.pop(cid, None)
                    else:
                        base.containers[cid] = ctr
                policy_state = d.state()
                if policy_state is not msgspec.UNSET:
                    base.policy_state = policy_state
                base.seq = d.seq
                replayed += 1
            if replayed:
                state = base
        if state is None:
            return None
        self.seq = state.seq
        log.info(
            "loaded state of %d container(s) from %s (%d journal record(s) after the snapshot)",
            len(state.containers),
            self.path,
            replayed,
        )
        return state

    def record(self, cache: Cache, export: Export) -> None:
        """One journal record: the cache entries that changed, the policy's
        state if it did (one small ``write(2)``; see :mod:`nri_framework.journal`)."""
        if self.journal is None:
            return
        self.seq += 1
        decision = cache.take_changes(self.seq)
        try:
            policy_state = msgspec.msgpack.encode(export())
        except (msgspec.EncodeError, TypeError, OverflowError) as exc:  # a policy bug
            log.error("cannot journal the policy's state: %s", exc)
            policy_state = self._policy_state
        if policy_state != self._policy_state:
            decision.policy_state = msgspec.Raw(policy_state)
            self._policy_state = policy_state
        self.journal.append(decision)

    def schedule(self, save: Callable[[], None]) -> None:
        """Call ``save`` (which writes the snapshot) soon, after the reply is out:
        :data:`SAVE_DELAY` from now, or on the next turn of the loop once the
        journal passes ``COMPACT_BYTES``; at once without a running loop."""
        if self.state_dir is None:
            return
        urgent = self.journal is not None and self.journal.size > COMPACT_BYTES
        if self._save_handle is not None and not (urgent and not self._save_urgent):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            save()
            return
        if self._save_handle is not None:
            self._save_handle.cancel()
        # past COMPACT_BYTES: on the next turn of the loop (still after the reply)
        if urgent:
            self._save_handle = loop.call_soon(save)
        else:
            self._save_handle = loop.call_later(SAVE_DELAY, save)
        self._save_urgent = urgent

    def save(self, cache: Cache, export: Export) -> None:
        """Write the snapshot, then empty the journal it holds."""
        if self._save_handle is not None:
            self._save_handle.cancel()
        self._save_handle = None
        path = self.path
        if path is None:
            return
        pods, containers = cache.snapshot()
        cache.clear_changes()
        state = SavedState(
            policy=self.policy_name,
            seq=self.seq,
            pods=pods,
            containers=containers,
            policy_state=export(),
        )
        tmp = path.with_suffix(".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(msgspec.json.encode(state))
            os.replace(tmp, path)
        except OSError as exc:
            # every change tries again: the line is repeated rarely (nri_sst.retry)
            self._save_reporter.failed(f"failed to save state to {path}: {exc}")
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self._save_reporter.cleared(f"state saved to {path} again")
        if self.journal is not None:
            self.journal.reset()
            self._policy_state = b""  # each journal carries the policy's state again

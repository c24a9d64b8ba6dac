"""The policy's state on disk: the snapshot and the decision journal.

``<policy>.state.json`` is the snapshot (:class:`SavedState`): the cache as
last decided and the policy's own state; ``<policy>.journal`` holds the
records appended since (:mod:`nri_framework.journal`), one per change,
before the reply that announces it leaves. A record holds what changed: the
cache entries, and the policy's state, whole (compared with the last one) or,
for a policy with keyed state (:func:`~nri_framework.hookspecs.policy_state_changes`),
the parts that changed, so that a decision costs what it changes.

The snapshot (compaction) is rewritten off the reply path, then the journal
emptied: once the node has been quiet for :data:`SAVE_DELAY` (no change), at
shutdown, and as soon as it is *due*: when the journal is past
``COMPACT_BYTES``, or when the record just written is large enough that one
more like it would carry the journal there (no room is left for another
record of its size: a Synchronize's, the whole node, or any decision that
changed much, whatever the request kind). A due snapshot is written after the
reply of the record that made it due, on a later turn of the loop (the stub
answers the requests of one read in its read callback, and writes their
replies before that callback returns), never inside a request's reply path;
with no running loop, at once. Otherwise it waits: not while a stream of
requests goes on (a snapshot costs the whole node).

Replay at start is bounded: a record that does not make the snapshot due
leaves room for another as large, so the journal passes ``COMPACT_BYTES``
only by (part of) the one record that carried it there, and the snapshot is
due at once: replay reads at most ``COMPACT_BYTES`` plus one record, as long
as the runtime waits for each reply before its next request (every NRI
runtime does; requests sent without waiting land in one read, and their
records all precede the snapshot's turn).

Snapshot versions: 1 (``policy_state`` whole, as the policy exported it); 2
(the same, or the merged parts of a keyed policy: a dict). Both read.
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
from nri_framework.journal import COMPACT_BYTES, Decision, Journal, StateChanges, merge_parts
from nri_framework.model import Container, Pod

# the host's logger: these lines were the host's and keep its name
log = logging.getLogger("nri_framework.host")

STATE_VERSION = 2
#: Snapshot versions this code reads (see the module doc).
READ_VERSIONS = (1, 2)
#: How long the node must be quiet (seconds, no change) before the snapshot:
#: the compaction of the journal, off the reply path (the journal record is
#: what is on the reply path), not in the middle of a stream of requests.
SAVE_DELAY = 1.0

#: The policy's state to persist, asked for only when there is somewhere to
#: persist it (``policy_export_state``).
Export = Callable[[], Any]
#: The policy's keyed changes since the last call (``policy_state_changes``;
#: ``None``: the policy's state is not keyed).
Changes = Callable[[], StateChanges | None]


class SavedState(msgspec.Struct, kw_only=True):
    """The snapshot: the cache as last decided, and the policy's own state;
    ``seq`` is the last journal record it holds."""

    version: int = STATE_VERSION
    policy: str = ""
    seq: int = 0
    pods: dict[str, Pod] = {}
    containers: dict[str, Container] = {}
    policy_state: Any = None


class _EncodedState(msgspec.Struct, kw_only=True):
    """:class:`SavedState` as written: the same fields, in the same order (the
    same bytes), with each pod and container already encoded."""

    version: int = STATE_VERSION
    policy: str = ""
    seq: int = 0
    pods: dict[str, msgspec.Raw] = {}
    containers: dict[str, msgspec.Raw] = {}
    policy_state: Any = None


_encoder = msgspec.json.Encoder()


class Fragments:
    """Each cache entry's JSON, encoded once while the entry is the same
    (frozen) object: a snapshot encodes what changed since the last one, and
    copies the rest (about 0.9 ms less per snapshot of 1000 containers)."""

    def __init__(self) -> None:
        self._of: dict[str, tuple[object, msgspec.Raw]] = {}

    def encoded(self, entries: dict[str, Pod] | dict[str, Container]) -> dict[str, msgspec.Raw]:
        old, new = self._of, {}
        for key, entry in entries.items():
            known = old.get(key)
            if known is None or known[0] is not entry:
                known = (entry, msgspec.Raw(_encoder.encode(entry)))
            new[key] = known
        self._of = new  # the entries gone are forgotten
        return {key: known[1] for key, known in new.items()}


def replace_file(path: Path, data: bytes) -> None:
    """``data`` as the file ``path`` (its directory made), atomically: written
    to ``path`` with the suffix ``.tmp``, renamed over it (a crash leaves the
    old file or the new one, never a part). Raises ``OSError``; the temporary
    file does not stay."""
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


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
        #: a keyed record was written by this process (the first one is whole:
        #: what is on disk may be another version's)
        self._keyed = False
        self._save_handle: asyncio.Handle | None = None
        self._last_change = 0.0
        self._save_reporter = Reporter(log)
        self._pods, self._containers = Fragments(), Fragments()
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
        if state.version not in READ_VERSIONS or state.policy != self.policy_name:
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
                if d.parts or d.parts_reset:
                    base.policy_state = merge_parts(base.policy_state, d)
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

    def record(self, cache: Cache, export: Export, changes: Changes | None = None) -> None:
        """One journal record: the cache entries that changed, the policy's
        state if it did (one small ``write(2)``; see :mod:`nri_framework.journal`):
        the parts ``changes`` names when the policy's state is keyed, else the
        whole ``export`` when it differs from the last one. Without a journal
        what changed is forgotten all the same (it would pile up)."""
        if self.journal is None:
            cache.clear_changes()
            if changes is not None:
                changes()
            return
        self.seq += 1
        decision = cache.take_changes(self.seq)
        self._record(decision, export, changes)

    def _record(self, decision: Decision, export: Export, changes: Changes | None) -> None:
        assert self.journal is not None
        delta = changes() if changes is not None else None
        if delta is not None:
            self._policy_state = b""  # a whole record after keyed ones is never left out
            if delta.reset or not self._keyed:
                parts = export()
                if isinstance(parts, dict):
                    decision.parts, decision.parts_reset = parts, True
                    self._keyed = True
                else:  # a policy bug: keyed changes, unkeyed state
                    log.error(
                        "cannot journal the policy's state: keyed changes of a %s",
                        type(parts).__name__,
                    )
            else:
                decision.parts = delta.parts
            try:
                self.journal.append(decision)
            except (msgspec.EncodeError, TypeError, OverflowError) as exc:  # a policy bug
                log.error("cannot journal the policy's state: %s", exc)
                decision.parts, decision.parts_reset = {}, False
                self._keyed = False  # the next record is the whole state again
                self.journal.append(decision)
            return
        self._keyed = False  # a keyed record after this one starts whole again
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
        """Call ``save`` (which writes the snapshot) after the reply is out, once
        the node has been quiet for :data:`SAVE_DELAY` (each change puts it
        off), or on the next turn of the loop once it is due (:meth:`due`); at
        once without a running loop."""
        if self.state_dir is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            save()
            return
        self._last_change = loop.time()
        urgent = self.due()
        if self._save_handle is not None and not (urgent and not self._save_urgent):
            return  # the quiet timer looks at _last_change when it fires
        if self._save_handle is not None:
            self._save_handle.cancel()
        # due: on the next turn of the loop (still after the reply)
        if urgent:
            self._save_handle = loop.call_soon(save)
        else:
            self._save_handle = loop.call_later(SAVE_DELAY, self._when_quiet, save)
        self._save_urgent = urgent

    def due(self) -> bool:
        """A snapshot is due: the journal is past ``COMPACT_BYTES``, or has no
        room left for another record as large as the last one written (see the
        module doc: this bounds the replay whatever the records are)."""
        journal = self.journal
        return journal is not None and journal.size + journal.last > COMPACT_BYTES

    def _when_quiet(self, save: Callable[[], None]) -> None:
        """The quiet timer: save when nothing changed for :data:`SAVE_DELAY`,
        else wait for the rest of it (one timer, not one per change)."""
        loop = asyncio.get_running_loop()
        rest = self._last_change + SAVE_DELAY - loop.time()
        if rest > 0:
            self._save_handle = loop.call_later(rest, self._when_quiet, save)
        else:
            save()

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
        state = _EncodedState(
            policy=self.policy_name,
            seq=self.seq,
            pods=self._pods.encoded(pods),
            containers=self._containers.encoded(containers),
            policy_state=export(),
        )
        try:
            replace_file(path, _encoder.encode(state))
        except OSError as exc:
            # every change tries again: the line is repeated rarely (nri_sst.retry)
            self._save_reporter.failed(f"failed to save state to {path}: {exc}")
            return
        self._save_reporter.cleared(f"state saved to {path} again")
        if self.journal is not None:
            self.journal.reset()
            self._policy_state = b""  # each journal carries the policy's state again

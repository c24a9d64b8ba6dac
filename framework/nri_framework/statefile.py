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
requests goes on (a snapshot writes the whole node's file). A scheduled
snapshot is encoded on the loop and its file written by a thread (about 2 ms
at 1000 containers through the Go bench peer, which a request arriving
meanwhile waited for when it was written on the loop); the journal then
keeps the records appended while it was written. At shutdown, or asked
directly, the snapshot is written at once (after the one in the background).

A snapshot encodes what changed, not the node: :class:`Mirror` keeps each
entry's JSON as of the last record (each record notes its entries), and the
snapshot, after a record of what changed since the last one, joins them.

Replay at start is bounded: a record that does not make the snapshot due
leaves room for another as large, so the journal passes ``COMPACT_BYTES``
only by (part of) the one record that carried it there, and the snapshot is
due at once: replay reads at most ``COMPACT_BYTES`` plus one record, and the
records decided while the due snapshot's file was being written, as long as
the runtime waits for each reply before its next request (every NRI runtime
does; requests sent without waiting land in one read, and their records all
precede the snapshot's turn).

Snapshot versions: 1 (``policy_state`` whole, as the policy exported it); 2
(the same, or the merged parts of a keyed policy: a dict). Both read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
from nri_sst.retry import Reporter

from nri_framework.atomicfile import replace_file
from nri_framework.cache import Cache
from nri_framework.eventloop import running_loop
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


class Mirror:
    """The snapshot's entries as of the last journal record, each encoded,
    kept as records are written: a record notes what it changed (a dict
    update, on the reply path), a snapshot encodes those and joins the rest
    as they are. A snapshot of 1000 containers is then the encoding of what
    changed since the last one and one write, not a walk of the node (the
    cache's copy, every entry looked at, the policy's whole export: ~2 ms of
    a request that waits behind it).

    Holds nothing until a snapshot made the whole way fills it
    (:meth:`fill`); the policy's part only while its state is keyed and every
    record since carried its parts (else each snapshot exports it whole,
    until a record carries the whole keyed state again: the first keyed
    record after an unkeyed one always does)."""

    def __init__(self) -> None:
        self.filled = False
        self.pods: dict[str, msgspec.Raw] = {}
        self.containers: dict[str, msgspec.Raw] = {}
        self.parts: dict[str, msgspec.Raw] | None = None
        self._pods: dict[str, Pod | None] = {}
        self._containers: dict[str, Container | None] = {}
        self._parts: dict[str, Any] = {}

    def fill(
        self,
        pods: dict[str, msgspec.Raw],
        containers: dict[str, msgspec.Raw],
        policy_state: Any,
        keyed: bool,
    ) -> None:
        """What a whole snapshot wrote: the mirror from now on."""
        self.filled = True
        self.pods, self.containers = dict(pods), dict(containers)
        self.parts = None
        if keyed and isinstance(policy_state, dict):
            self.parts = _encoded(policy_state)
        self._pods, self._containers, self._parts = {}, {}, {}

    def note(self, decision: Decision, keyed_parts: bool) -> None:
        """What one journal record changed; ``keyed_parts``: it carries the
        policy's keyed parts (else the policy's part is exported at the next
        snapshot, and kept again from there)."""
        if not self.filled:
            return
        if decision.reset:
            self.pods, self.containers = {}, {}
            self._pods, self._containers = dict(decision.pods), dict(decision.containers)
        else:
            self._pods.update(decision.pods)
            self._containers.update(decision.containers)
        if not keyed_parts:
            self.parts, self._parts = None, {}
        elif self.parts is not None or decision.parts_reset:
            if decision.parts_reset:
                self.parts, self._parts = {}, {}
            self._parts.update(decision.parts)

    def image(self) -> tuple[dict[str, msgspec.Raw], dict[str, msgspec.Raw], Any]:
        """The pods, containers and (None: not kept) policy parts of the
        last record, encoded."""
        _encode_into(self.pods, self._pods)
        _encode_into(self.containers, self._containers)
        if self.parts is not None:
            _encode_into(self.parts, self._parts)
        return self.pods, self.containers, self.parts


def _encoded(entries: Mapping[str, Any]) -> dict[str, msgspec.Raw]:
    return {key: msgspec.Raw(_encoder.encode(entry)) for key, entry in entries.items()}


def _encode_into(
    raw: dict[str, msgspec.Raw],
    changed: dict[str, Pod | None] | dict[str, Container | None] | dict[str, Any],
) -> None:
    for key, value in changed.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = msgspec.Raw(_encoder.encode(value))
    changed.clear()


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
        self._mirror = Mirror()
        self._save_urgent = False
        self._scheduled: Callable[[], None] | None = None
        """the save :meth:`schedule` was last given (a write in flight puts it off)"""
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._writing: tuple[concurrent.futures.Future[None], int] | None = None
        """the snapshot file being written off the loop, and the journal bytes it holds"""
        self._again = False
        """a save was asked for while a snapshot was being written"""
        self._buffer = bytearray()
        """the last snapshot's encoding (reused: see :meth:`save`)"""

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
        self._record(decision, export, changes() if changes is not None else None)

    def _record(self, decision: Decision, export: Export, delta: StateChanges | None) -> None:
        """Journal ``decision`` with the policy's state: the keyed ``delta``,
        or (``None``: not keyed) the whole export when it changed."""
        assert self.journal is not None
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
            self._mirror.note(decision, keyed_parts=self._keyed)
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
        self._mirror.note(decision, keyed_parts=False)

    def _catch_up(self, cache: Cache, export: Export, changes: Changes | None) -> None:
        """A record of what changed since the last one, if anything did."""
        delta = changes() if changes is not None else None
        if cache.dirty or (delta is not None and (delta.parts or delta.reset)):
            self.seq += 1
            self._record(cache.take_changes(self.seq), export, delta)

    def schedule(self, save: Callable[[], None]) -> None:
        """Call ``save`` (which writes the snapshot) after the reply is out, once
        the node has been quiet for :data:`SAVE_DELAY` (each change puts it
        off), or on the next turn of the loop once it is due (:meth:`due`); at
        once without a running loop."""
        if self.state_dir is None:
            return
        self._scheduled = save
        loop = running_loop()
        if loop is None:
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

    def save(
        self,
        cache: Cache,
        export: Export,
        changes: Changes | None = None,
        *,
        background: bool = False,
    ) -> None:
        """Write the snapshot, then empty the journal it holds; what changed
        since the last record (an event the runtime sent, a policy's part
        changed outside a decision) is a record first, so that the snapshot
        is the state now. ``background`` (a scheduled snapshot, in a running
        loop): the snapshot is encoded now and its file written by a thread,
        so that a request arriving meanwhile is not held up by the write; the
        journal then keeps the records appended meanwhile
        (:meth:`~nri_framework.journal.Journal.drop_head`). Otherwise (at
        shutdown, when asked directly) the file is written now, after the
        one being written in the background, if any."""
        if self._save_handle is not None:
            self._save_handle.cancel()
        self._save_handle = None
        path, journal = self.path, self.journal
        if path is None or journal is None:  # both or neither: the state directory's
            return
        loop = running_loop() if background else None
        if self._writing is not None:
            if loop is not None:
                self._again = True  # once the file being written is in place
                return
            self._write_ended(wait=True)
        mirror = self._mirror
        if mirror.filled:
            self._catch_up(cache, export, changes)  # the last record is the state now
            pods_raw, containers_raw, parts = mirror.image()
            state = _EncodedState(
                policy=self.policy_name,
                seq=self.seq,
                pods=pods_raw,
                containers=containers_raw,
                policy_state=export() if parts is None else parts,
            )
        else:
            pods, containers = cache.snapshot()
            cache.clear_changes()
            state = _EncodedState(
                policy=self.policy_name,
                seq=self.seq,
                pods=_encoded(pods),
                containers=_encoded(containers),
                policy_state=export(),
            )
            mirror.fill(state.pods, state.containers, state.policy_state, keyed=self._keyed)
        # into the buffer of the last snapshot (written before the next one is
        # encoded): a fresh 650 KB of output per snapshot, grown by doubling
        # and faulted in page by page, made the encode of 1000 containers'
        # joined entries 0.9 ms (p50, through the Go bench peer) instead of 0.25
        _encoder.encode_into(state, self._buffer)
        data = self._buffer
        covered = journal.size
        if loop is not None:
            if self._writer is None:
                self._writer = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="nri-snapshot"
                )
            written = self._writer.submit(replace_file, path, data)
            self._writing = (written, covered)
            written.add_done_callback(lambda _: _call_soon(loop, self._write_ended))
            return
        try:
            replace_file(path, data)
        except OSError as exc:
            self._failed(path, exc)
            return
        self._saved(path, covered)

    def _write_ended(self, wait: bool = False) -> None:
        """The snapshot written in the background is in place (or failed):
        the journal drops what it holds. ``wait``: for the write (a save
        that cannot wait for the loop)."""
        if self._writing is None:
            return  # taken by a save that waited for it
        written, covered = self._writing
        if not wait and not written.done():
            return
        self._writing = None
        path = self.path
        assert path is not None
        try:
            written.result()
        except OSError as exc:
            self._failed(path, exc)
        else:
            self._saved(path, covered)
        again, self._again = self._again, False  # a save that waited is that save
        if again and not wait and self._scheduled is not None:
            self.schedule(self._scheduled)

    def _failed(self, path: Path, exc: OSError) -> None:
        # every change tries again: the line is repeated rarely (nri_sst.retry)
        self._save_reporter.failed(f"failed to save state to {path}: {exc}")

    def _saved(self, path: Path, covered: int) -> None:
        """The snapshot holding the journal's first ``covered`` bytes is in place."""
        self._save_reporter.cleared(f"state saved to {path} again")
        assert self.journal is not None  # a snapshot's path is the journal's directory's
        self.journal.drop_head(covered)
        self._policy_state = b""  # each journal carries the policy's state again

    async def written(self) -> None:
        """Until the snapshot being written off the loop, if any, is in place
        and the journal cut (the host's tests, a caller that reads the files)."""
        while self._writing is not None:
            await asyncio.wrap_future(self._writing[0])
            self._write_ended()

    def close(self) -> None:
        """Wait for the snapshot being written, if any; close the journal."""
        if self._writing is not None:
            self._write_ended(wait=True)
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self.journal is not None:
            self.journal.close()


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback`` on ``loop`` (from the writer's thread); nothing once the
    loop is closed (a save that waits takes the write over)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)

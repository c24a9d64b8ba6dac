"""The decision journal: each decision is on disk before its reply leaves.

The host keeps its state in two files of the state directory:

* ``<policy>.state.json``, the snapshot (:class:`~nri_framework.statefile.SavedState`):
  the whole cache and the policy's state, written off the reply path
  (coalesced, to a temporary file renamed over the old one);
* ``<policy>.journal``, this journal: one :class:`Decision` record per change
  since that snapshot, appended *before* the NRI reply that announces the
  change is written. A restarted plugin reads the snapshot, then every record
  of a higher sequence number, so it knows every decision the runtime acted
  on and moves no running container.

Compaction is the snapshot: once written (and renamed into place) the journal
drops the records it holds (:meth:`Journal.drop_head`: the records appended
while its file was being written stay). A crash between the two leaves
records the snapshot already holds; their sequence numbers (at most the
snapshot's) make the restart skip them. The journal stays small: it holds
the records since the node was last quiet, and the host compacts after the
reply once it passes :data:`COMPACT_BYTES`, or once the last record leaves no
room for another as large (:meth:`nri_framework.statefile.StateFile.due`); a
record holds what its decision changed (the cache entries; the parts of a
keyed policy state, see :class:`Decision`).

A record is ``length (u32 LE) | CRC-32 (u32 LE) | payload`` (the payload a
msgpack :class:`Decision`), written with a single ``write(2)`` on an
``O_APPEND`` descriptor. A crash can tear only the last record: a short
header or payload, or a CRC that does not match, ends the replay there; the
torn tail is cut off (so later records do not land behind garbage) and the
plugin starts with everything before it. A bad journal is never a reason not
to start.

Durability: no ``fsync``. What must survive is a *process* crash (SIGKILL,
OOM kill, a bug): data handed to ``write(2)`` is in the kernel's page cache
the moment the call returns and reaches the disk whether or not the process
lives, so a record written before the reply survives the plugin's death. An
``fsync`` would add the disk's flush latency (milliseconds, more than a
whole decision) to every CreateContainer and protect only against a
*machine* crash or power loss, after which no container survives to be
moved: the node boots, the runtime creates every container anew, and a
restored state only keeps the containers the runtime still reports. What a
power loss can do to unsynced files (a torn or zero-length record or
snapshot) is detected (CRC, decoding) and ignored. Benchmarks print the cost
of the append (``bench_balloons.py``: CreateContainer with and without).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from nri_framework.atomicfile import replace_file
from nri_framework.model import Container, Pod

log = logging.getLogger("nri_framework.journal")

HEADER = struct.Struct("<II")
#: A record longer than this is taken for garbage (a torn length field).
MAX_RECORD = 64 * 1024 * 1024
#: Journal size past which the host compacts without waiting: it bounds the
#: replay at start (about 10-30 ms for 256 KiB of small records).
COMPACT_BYTES = 256 * 1024


class Decision(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What one change did to the host's state.

    ``pods``/``containers`` hold the entries that changed (``None``: removed);
    with ``reset`` they are the whole cache (a Synchronize). ``policy_state``
    is the policy's exported state after the change, left out when it did not
    change since the previous record (a policy without
    :func:`~nri_framework.hookspecs.policy_state_changes`).

    A policy with keyed state (``policy_state_changes``) has ``parts``
    instead: the parts of its state that changed (``None``: removed), merged
    over the parts before (with ``parts_reset``, over none: they are the
    whole state). Records without these fields (written before them) read
    as records without parts.
    """

    seq: int
    reset: bool = False
    pods: dict[str, Pod | None] = {}
    containers: dict[str, Container | None] = {}
    policy_state: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    parts: dict[str, Any] = {}
    parts_reset: bool = False

    def state(self) -> Any:
        """The decoded policy state (``UNSET`` when the record has none)."""
        if isinstance(self.policy_state, msgspec.Raw):
            return msgspec.msgpack.decode(self.policy_state)
        return msgspec.UNSET


class StateChanges(msgspec.Struct, kw_only=True):
    """What a policy's keyed state did since its last record
    (:func:`~nri_framework.hookspecs.policy_state_changes`)."""

    parts: dict[str, Any] = {}
    """the parts that changed, by key (``None``: the part is gone)"""
    reset: bool = False
    """``parts`` is the whole state (the parts before are gone)"""


def merge_parts(state: Any, d: Decision) -> Any:
    """The keyed policy ``state`` (a dict of parts) with the parts of record ``d``
    merged over it; a changed part moves last (the order of the last change)."""
    if d.parts_reset or not isinstance(state, dict):
        state = {}
    for key, part in d.parts.items():
        state.pop(key, None)
        if part is not None:
            state[key] = part
    return state


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Decision)


def frame(payload: bytes) -> bytes:
    """One record on disk."""
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class Journal:
    """The append-only record file at ``path`` (opened on first append)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        #: the bytes of the last record written (0: none since the journal
        #: was opened or emptied, or the last append failed)
        self.last = 0
        self._fd: int | None = None
        self._failing = False

    # -- reading (at start) ----------------------------------------------------------

    def replay(self) -> Iterator[Decision]:
        """Every intact record, oldest first; a torn or undecodable tail is
        reported, cut off, and ends the replay."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below, also when abandoned
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("ignoring unreadable journal %s: %s", self.path, exc)
            return
        good = 0
        problem = ""
        try:
            while True:
                head = f.read(HEADER.size)
                if not head:
                    break
                if len(head) < HEADER.size:
                    problem = "torn record header"
                    break
                length, crc = HEADER.unpack(head)
                if length > MAX_RECORD:
                    problem = f"record length {length} out of range"
                    break
                payload = f.read(length)
                if len(payload) < length:
                    problem = "torn record"
                    break
                if zlib.crc32(payload) != crc:
                    problem = "record checksum mismatch"
                    break
                try:
                    decision = _decoder.decode(payload)
                except msgspec.DecodeError as exc:
                    problem = f"undecodable record: {exc}"
                    break
                good = f.tell()
                yield decision
        except OSError as exc:
            problem = f"read error: {exc}"
        finally:
            f.close()
        self.size = good
        if problem:
            log.warning(
                "journal %s: %s at offset %d; ignoring the rest (a crash while writing)",
                self.path,
                problem,
                good,
            )
            try:
                os.truncate(self.path, good)
            except OSError as exc:
                log.error("cannot cut the journal %s at offset %d: %s", self.path, good, exc)

    # -- writing ---------------------------------------------------------------------

    def append(self, decision: Decision) -> bool:
        """Write one record (one ``write(2)``, no fsync: see the module doc).

        ``False`` when it could not be written (logged once until a write
        succeeds again); a partial write is cut off again."""
        data = frame(_encoder.encode(decision))
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(
                    self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
                self.size = os.fstat(self._fd).st_size
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
        except OSError as exc:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self.size)
            self.last = 0
            if not self._failing:
                self._failing = True
                log.error("cannot write the decision journal %s: %s", self.path, exc)
            return False
        self.size += written
        self.last = written
        if self._failing:
            self._failing = False
            log.info("decision journal %s written again", self.path)
        return True

    @property
    def failing(self) -> bool:
        """The last append could not be written (``/healthz`` reports it)."""
        return self._failing

    def reset(self) -> None:
        """Empty the journal: a snapshot now holds everything in it."""
        try:
            if self._fd is not None:
                os.ftruncate(self._fd, 0)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.truncate(self.path, 0)
        except OSError as exc:
            log.error("cannot empty the journal %s: %s", self.path, exc)
            return
        self.size = 0
        self.last = 0

    def drop_head(self, covered: int) -> None:
        """A snapshot now holds the first ``covered`` bytes (the records it
        was made from; later ones were appended while it was written): keep
        the rest alone, atomically (a new file renamed over this one; a crash
        leaves the whole journal, whose first records the snapshot holds and
        the restart skips by their sequence numbers). An error leaves the
        journal whole, logged."""
        if covered >= self.size:
            self.reset()
            return
        rest = self.size - covered
        try:
            with open(self.path, "rb") as f:
                f.seek(covered)
                tail = f.read(rest)
            if len(tail) != rest:
                raise OSError(f"{len(tail)} of the {rest} bytes after offset {covered}")
            replace_file(self.path, tail)
        except OSError as exc:
            log.error("cannot cut the journal %s at offset %d: %s", self.path, covered, exc)
            return
        self.close()  # the next append opens the new file
        self.size = rest

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

"""The configuration file's last text and its parsed YAML document, kept in
the state directory: a restart with the same file takes the document from
there, so that it neither imports PyYAML nor parses the text (~15 ms of a
restart, of the 150 ms issue #14 allows; the decoding and validation of the
document still run, as for any configuration).

Only what parses back to the same document is kept: a YAML document that JSON
cannot hold as it is (a timestamp, a key that is no string, a NaN) is parsed
from its text at every start. The file is ours, but is read as any input:
larger than :data:`MAX_CACHE_BYTES`, undecodable, of another policy or format,
or for another text, it is not used (and the text is parsed); a cache that
cannot be written costs the next start the parse, nothing else. Its document
goes through the same decoding and validation as a parsed one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import msgspec
from nri_framework.atomicfile import replace_file
from nri_framework.configfile import MAX_CONFIG_BYTES

from nri_balloons.config import BalloonsPolicy
from nri_balloons.configdecode import decode_policy

FORMAT = 1
"""The cache file's format (a different one is not read)."""
MAX_CACHE_BYTES = 4 * MAX_CONFIG_BYTES
"""A cache file larger than this is not read (its text is at most
:data:`~nri_framework.configfile.MAX_CONFIG_BYTES`, its document about as much)."""


class ParsedConfig(msgspec.Struct, frozen=True):
    """One configuration text and the document it parsed to."""

    format: int
    policy: str
    text: str
    document: object


_decoder = msgspec.json.Decoder(ParsedConfig)


def cache_path(state_dir: Path, policy: str) -> Path:
    return state_dir / f"{policy}.config-cache.json"


def cached_document(state_dir: Path | None, policy: str, text: str) -> object | None:
    """The document ``text`` parsed to when it was last kept (:func:`keep`);
    None when there is none for this text (then parse it)."""
    if state_dir is None:
        return None
    path = cache_path(state_dir, policy)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CACHE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_CACHE_BYTES:
        return None
    try:
        cached = _decoder.decode(data)
    except msgspec.DecodeError:
        return None
    if cached.format != FORMAT or cached.policy != policy or cached.text != text:
        return None
    return cached.document


def keep(state_dir: Path | None, policy: str, text: str, document: object) -> bool:
    """Keep ``text`` and the ``document`` it parsed to (written atomically:
    :func:`~nri_framework.atomicfile.replace_file`) when JSON holds the document
    as it is; the old cache goes either way. False when nothing was kept."""
    if state_dir is None:
        return False
    path = cache_path(state_dir, policy)
    try:
        data = msgspec.json.encode(ParsedConfig(FORMAT, policy, text, document))
        same = msgspec.json.decode(data, type=ParsedConfig).document == document
    except (TypeError, ValueError, OverflowError):  # msgspec's EncodeError is a ValueError
        same = False
    try:
        if not same:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return False
        replace_file(path, data)
    except OSError:
        return False
    return True


def load_policy(state_dir: Path | None, policy: str, text: str, *, source: str) -> BalloonsPolicy:
    """``text`` as a :class:`~nri_balloons.config.BalloonsPolicy`: decoded from
    the document kept for it in ``state_dir`` when there is one, else parsed
    (:func:`~nri_balloons.configyaml.parse_policy`, which loads PyYAML) and
    its document kept for the next start. Raises
    :class:`~nri_balloons.configdecode.ConfigError`."""
    document = cached_document(state_dir, policy, text)
    if document is not None:
        return decode_policy(document, source=source)
    from nri_balloons.configyaml import parse_policy  # PyYAML: only when parsed

    document, node = parse_policy(text, source=source)
    decoded = decode_policy(document, source=source, node=node)
    keep(state_dir, policy, text, document)
    return decoded

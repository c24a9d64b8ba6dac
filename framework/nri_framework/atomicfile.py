"""A file replaced whole: the snapshot, the journal's cut, the configuration
cache. A crash leaves the old file or the new one, never a part of it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def replace_file(path: Path, data: bytes | bytearray) -> None:
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

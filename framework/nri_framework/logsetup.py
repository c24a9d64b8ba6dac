"""Logging set-up: the one place that configures handlers and format."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup(level: str = "info", debug: list[str] | None = None) -> None:
    """Log to stderr at ``level``; loggers named in ``debug`` log at DEBUG."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in debug or ():
        logging.getLogger(name).setLevel(logging.DEBUG)

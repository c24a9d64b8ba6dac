"""The demos' YAML, read from the installed package.

``pct_managed/``: the spec's BalloonsPolicy and pods (the same files as
``examples/pct-managed``, a test checks it); ``pinner/``: the pinner demo's
four Kubernetes pods.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def pods_dir() -> Path:
    """The spec's walkthrough files (``pct_managed/``)."""
    return Path(str(resources.files(__package__) / "pct_managed"))


def pinner_pods() -> Path:
    """The pinner demo's pods (``pinner/``)."""
    return Path(str(resources.files(__package__) / "pinner"))

"""The error of a balloons placement decision."""

from __future__ import annotations

__all__ = ["BalloonsError"]


class BalloonsError(Exception):
    """A placement failure; the text goes back to the runtime."""

    def __init__(self, text: str) -> None:
        super().__init__(f"balloons: {text}")

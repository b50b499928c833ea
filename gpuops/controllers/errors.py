"""Errors every controller shares."""

from __future__ import annotations

__all__ = ["SpecError"]


class SpecError(ValueError):
    """A spec the controller cannot act on: `field` is its JSON path, the message says how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field

"""Bounded sets of value encodings per schema node, for answers that are pure functions of schema and value.

The emulator's decode, pruning and validation walks give the same answer for the same value under the same
schema node; remembering which encodings passed lets a write that repeats hundreds of list items (a status
ledger rewritten to add one entry) walk the new ones only. Errors are never remembered, only passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["EncodingsBySchema"]


class EncodingsBySchema:
    """A set of encodings per schema node, keyed by the node's id; the node is held, so its id cannot be reused
    by another while cached. Each set holds at most `per_schema` encodings (cleared when full) and at most
    `schemas` nodes are tracked (all forgotten beyond that)."""

    def __init__(self, per_schema: int, schemas: int) -> None:
        self.per_schema = per_schema
        self.schemas = schemas
        self._sets: dict[int, tuple[Mapping[str, Any], set[bytes]]] = {}

    def of(self, schema: Mapping[str, Any]) -> set[bytes]:
        hit = self._sets.get(id(schema))
        if hit is not None and hit[0] is schema:
            if len(hit[1]) >= self.per_schema:
                hit[1].clear()
            return hit[1]
        if len(self._sets) > self.schemas:
            self._sets.clear()
        fresh: set[bytes] = set()
        self._sets[id(schema)] = (schema, fresh)
        return fresh

    def remember(self, schema: Mapping[str, Any], encoding: bytes) -> None:
        """Add a passing encoding unless the set is full (a full set is cleared at its next lookup)."""
        found = self.of(schema)
        if len(found) < self.per_schema:
            found.add(encoding)

"""The table's text form: one entry per line, so that a change upstream is a small diff, and a summary of what
differs between two tables for the reviewer of a re-derivation."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _dump(value: Any) -> str:
    """Compact one-line JSON with spaces after separators, for readable one-entry-per-line diffs."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def render(table: Mapping[str, Any]) -> str:
    """JSON with one entry of each top-level object or array per line, so that a new field is a one-line diff."""
    lines = ["{"]
    keys = list(table)
    for position, key in enumerate(keys):
        value, comma = table[key], "," if position < len(keys) - 1 else ""
        if isinstance(value, dict) and value:
            entries = [f"  {_dump(k)}: {_dump(v)}" for k, v in value.items()]
            lines += [f" {_dump(key)}: {{", ",\n".join(entries), f" }}{comma}"]
        elif isinstance(value, list) and value:
            lines += [f" {_dump(key)}: [", ",\n".join(f"  {_dump(v)}" for v in value), f" ]{comma}"]
        else:
            lines.append(f" {_dump(key)}: {_dump(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def diff_summary(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 40) -> list[str]:
    """What changed between two tables: header keys, messages added or removed, and fields changed per message."""
    header = sorted((set(old) | set(new)) - {"messages"})
    lines = [f"{key} differs" for key in header if old.get(key) != new.get(key)]
    before, after = old.get("messages", {}), new.get("messages", {})
    lines += [f"message removed: {fq}" for fq in sorted(set(before) - set(after))]
    lines += [f"message added: {fq}" for fq in sorted(set(after) - set(before))]
    for fq in sorted(set(before) & set(after)):
        if before[fq] == after[fq]:
            continue
        was = {tuple(row) for row in before[fq]}
        now = {tuple(row) for row in after[fq]}
        changes = [f"-{_dump(list(row))}" for row in sorted(was - now)]
        changes += [f"+{_dump(list(row))}" for row in sorted(now - was)]
        lines.append(f"message changed: {fq}: {' '.join(changes) or 'field order'}")
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])

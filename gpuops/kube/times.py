"""Kubernetes timestamps <-> integer microseconds since the epoch (the unit of `gpuops.accounting`).

metav1.Time is whole seconds and MicroTime has six decimals; both parse here, any offset, any fraction length
(truncated to microseconds), so controllers do exact arithmetic on instants without floats.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

__all__ = ["format_time", "parse_time", "parse_time_or_none", "wall_clock"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:\d{2})"
)


def parse_time(text: str) -> int:
    """RFC 3339 (any fraction length, any offset) -> integer microseconds since the epoch (fraction truncated)."""
    m = _RFC3339.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp (e.g. 2025-01-02T03:04:05Z)")
    date, clock, fraction, offset = m.groups()
    zone = "+00:00" if offset in ("Z", "z") else offset
    whole = datetime.fromisoformat(f"{date}T{clock}{zone}")
    micros = int((fraction or "").ljust(6, "0")[:6] or 0)
    return (whole - _EPOCH) // timedelta(microseconds=1) + micros


def format_time(micros: int) -> str:
    """Integer microseconds since the epoch -> RFC 3339 UTC, with a fraction only when it is not zero."""
    seconds, fraction = divmod(micros, 1_000_000)
    text = (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{fraction:06d}Z" if fraction else f"{text}Z"


def parse_time_or_none(text: str | None) -> int | None:
    """`parse_time` for optional status fields: None for a missing or unreadable stamp."""
    if not text:
        return None
    try:
        return parse_time(text)
    except ValueError:
        return None


def wall_clock() -> int:
    """Now, in integer microseconds since the epoch (the unit of `gpuops.accounting`)."""
    return time.time_ns() // 1000

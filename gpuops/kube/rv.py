"""resourceVersion ordering (KEP-5504).

resourceVersions were opaque for years; KEP-5504 makes them comparable: a resourceVersion is a positive
decimal integer without leading zeros, so comparing lengths first and then the digits lexically orders them
without parsing arbitrarily large numbers. Anything else ("", "0", "01", "abc", a non-etcd store's token)
is not comparable, and callers must fall back to treating the values as opaque.
"""

from __future__ import annotations

__all__ = ["NotComparable", "comparable", "compare", "is_newer_or_equal"]


class NotComparable(ValueError):
    """At least one resourceVersion is not in the KEP-5504 comparable form."""


def comparable(rv: str) -> bool:
    """True for a positive decimal integer without leading zeros (ASCII digits only)."""
    return bool(rv) and rv.isascii() and rv.isdigit() and rv[0] != "0"


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as `a` is older than, equal to, or newer than `b`; `NotComparable` if either is malformed."""
    if not comparable(a) or not comparable(b):
        raise NotComparable(f"resourceVersions {a!r} and {b!r} are not comparable")
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    if a == b:
        return 0
    return -1 if a < b else 1


def is_newer_or_equal(a: str, b: str) -> bool:
    """Whether `a` is at least as new as `b` (read-your-own-writes: has the cache caught up with my write?).

    Raises `NotComparable` like `compare`: guessing either way would hide stale reads or stall forever.
    """
    return compare(a, b) >= 0

"""One figure per instant: when a budget's usage is counted, and why a reported amount is never taken back.

Kubernetes stores a container's startedAt and finishedAt in whole seconds, while a clock reads microseconds.
Counting a running pod up to a microsecond `now` and ending it later at its truncated finishedAt took back up
to a second of its GPUs (all of it for a pod stopped within the second it started): an Event could say "over
quota" and the next status show less, under quota. Two rules make every figure (status, Events, the
enforcement decision, metrics) one consistent series:

1. Whole seconds. A figure is `window_usage` evaluated at the counting instant, `now` rounded down to the whole
   second (`counting_instant`): a running pod counts up to the last whole second, exactly what its finishedAt
   will say if it stops within the current second. The same inputs in the same second give the same figure,
   whoever asks. Instants at which the answer changes (`Usage.next_change`, `Usage.exhausted_at`) are rounded
   up to the first counting instant that sees the change.
2. No take-back within the record's own precision. A pod's end is raised to the instant through which an
   already reported figure counted it (`counted_through`: the reporting instant for a pod reported open, its
   reported end, if earlier, for one reported finished), but never past one second after its finishedAt
   (`settle_end`, `settle`). Rule 1 alone is monotone only while the caller's view of the pods is current: a
   view that still shows a finished pod running (the kubelet's report, or the watch carrying it, lagged) has
   counted it past its finishedAt. A container that finished "at second 10" stopped somewhere in [10, 11):
   counting it through 11 is within what Kubernetes recorded, counting it further is provably too much.
   What is counted past the recorded end is the record's `late` part: the figures keep it, and their error
   bound (`Usage.error_bound`) names it, so a reader knows how much of a figure the records do not show.

Together, while nothing leaves the window and the view lags by less than a second, usage reported at t1 <= usage
reported at t2 for t1 <= t2; with any lag, a finished pod counts at most one second more than its record says,
and a figure that counted a pod further than that is corrected down when the pod's finish arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

import msgspec

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import Interval, Ledger, Usage
from gpuops.accounting.windows import RollingWindow, Window, usage_in

__all__ = [
    "RESOLUTION",
    "counted_through",
    "counting_instant",
    "next_counting_instant",
    "reported_usage",
    "settle",
    "settle_end",
]

RESOLUTION = 1_000_000
"""Microseconds between counting instants: one second, the resolution of Kubernetes' container timestamps."""


def _instant(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AccountingError(f"{what} must be an int instant in microseconds, got {value!r}")
    return value


def counting_instant(now: int) -> int:
    """The instant a figure asked for at `now` is computed at: `now` rounded down to the whole second."""
    now = _instant(now, "now")
    return now - now % RESOLUTION


def next_counting_instant(at: int) -> int:
    """The first counting instant at or after `at` (rounded up to the whole second)."""
    at = _instant(at, "at")
    return -(-at // RESOLUTION) * RESOLUTION


def reported_usage(
    live: Iterable[Interval],
    ledger: Ledger = Ledger(),  # noqa: B008 - immutable frozen Struct
    *,
    now: int,
    window: Window | int,
    quota: Fraction | int,
) -> Usage:
    """The usage in `window` (an int: a rolling window of that many microseconds) at the counting instant of
    `now`, its change instants rounded up to counting instants.

    Status, Events, the enforcement decision and metrics all call this, so the same inputs in the same second
    give them the same figure, and the over-quota answer holds on `[now, next_change)` as they see it.
    """
    at = counting_instant(now)
    shape = RollingWindow(window) if isinstance(window, int) else window
    usage = usage_in(shape, live, ledger, now=at, quota=quota)
    exhausted, change = usage.exhausted_at, usage.next_change
    return msgspec.structs.replace(
        usage,
        exhausted_at=None if exhausted is None else next_counting_instant(exhausted),
        next_change=None if change is None else next_counting_instant(change),
    )


def counted_through(intervals: Iterable[Interval], *, at: int) -> dict[str, int]:
    """Through which instant a figure reported at `at` counted each interval, by UID.

    An open interval counted up to `at`; a finished one up to its end, or `at` if that came first.
    """
    at = _instant(at, "at")
    out: dict[str, int] = {}
    for item in intervals:
        if not isinstance(item, Interval):
            raise AccountingError(f"intervals must hold Interval values, got {item!r}")
        through = at if item.end is None else min(item.end, at)
        if through > out.get(item.uid, through - 1):
            out[item.uid] = through
    return out


def settle_end(start: int, end: int, counted: int | None = None) -> int:
    """A finished pod's end to count: its reported end, no earlier than its start, raised to `counted` (what a
    figure already reported counted it through, so that figure is not taken back) but by at most one second,
    the precision of the reported end."""
    start = _instant(start, "start")
    end = max(start, _instant(end, "end"))
    return end if counted is None else max(end, min(_instant(counted, "counted"), end + RESOLUTION))


def settle(intervals: Iterable[Interval], counted: Mapping[str, int]) -> tuple[Interval, ...]:
    """The intervals with each finished one's end raised by `settle_end` towards what `counted` holds for its UID,
    the part raised past the given end added to its `late` part.

    Open intervals are kept as they are (they count up to every later instant anyway).
    """
    out: list[Interval] = []
    for item in intervals:
        if not isinstance(item, Interval):
            raise AccountingError(f"intervals must hold Interval values, got {item!r}")
        if item.end is not None:
            end = settle_end(item.start, item.end, counted.get(item.uid))
            if end != item.end:
                item = msgspec.structs.replace(item, end=end, late=item.late + end - item.end)
        out.append(item)
    return tuple(out)

"""GPU-hours consumed in a rolling window, from live pod intervals plus a durable ledger of gone pods.

Why not a stateless sum over the pods still in the API: every pod an Evict action deleted (or a Job TTL, or
`kubectl delete`) would take its GPU-hours with it, the budget would drop back under quota and the workload
would be re-admitted (oscillation). Here the caller keeps a ledger of finished or
deleted pods (e.g. in the budget's status) and passes it along with the live intervals.

Model. Instants and durations are integer microseconds; GPU amounts and GPU-hours are exact Fractions. The
window at `now` is the half-open `[now - W, now)`. An interval `[start, end)` (end None: still running)
contributes `gpus * |[start, end) ∩ window|`; one GPU for one hour is `MICROS_PER_HOUR` GPU-microseconds.
Over quota means `consumed >= quota` (equality triggers, as in the seed).

Live vs ledger (dedup by pod UID). Every UID counts once. Among all records carrying a UID (live intervals
and ledger entries), the one with the latest end wins, an open interval ending latest of all; on equal ends
the live interval wins (it is the API's current word); remaining ties go to the earlier start, then the
larger GPU count. So a live interval wins whenever it is open or ends at/after the ledger's end, and a ledger
entry wins only if it records a strictly later end than a finished live pod shows (e.g. it was written from
a deletion timestamp): we never count less than either source saw ending. The winner's whole interval counts.

Compaction keeps the ledger bounded. Entries that left the window for good (end <= now - W) are dropped:
exact for every later instant. If more than `max_entries` remain, the oldest eligible entries (by end) are
merged into buckets on a fixed grid of width w (`[k*w, (k+1)*w)`): a bucket stores its GPU-microseconds G and
an upper bound P on the GPUs concurrently in use inside it. A bucket counts whole while it overlaps the window
(conservative: never less than the truth) and stops counting once the window's trailing edge passes its end.
Only the bucket holding the trailing edge `e = t - W` is then inexact; it over-counts exactly what it held
before e, so for every t at or after the compaction instant

    0 <= consumed_compacted(t) - consumed_exact(t) <= sum over buckets with start < e < end of
                                                        min(G, P * (e - start))  <=  P * w

(per grid and key, at most one bucket straddles e). `Usage.error_bound` reports that sum in GPU-hours, plus the late
parts below. Buckets are
at most ceil(W / w) + 1 per grid and key, since only cells overlapping [now - W, now) survive. Entries carry a
`key` (what the usage was of, e.g. a GPU model); a bucket holds the entries of one key, so `consumed_by_key`
can still tell the keys' usage apart after compaction. Merged entries lose
their UID, so the caller passes `live_uids` (the UIDs still in the API) and entries of those are never merged.

Late parts. A caller that reported a figure counting a pod further than the pod's recorded end later shows
(its finish arrived late) keeps counting it that far, so the figure is not taken back, and says so: the
record's `late` microseconds before its end (a bucket's `late_gpu_micros`) are counted but lie past the record.
`error_bound` adds them (their part inside the window; a bucket's whole while it overlaps the window), so
`consumed - error_bound` never exceeds the usage the records' own ends give.

Next change. Between breakpoints the consumption is affine in t: with "the known future" (open intervals
keep running, nothing new starts, the ledger does not change) it changes slope only when the window's leading
edge reaches an interval's start or end (t = start, end) or its trailing edge does (t = start + W, end + W),
and it jumps when a bucket enters (t = start + 1) or leaves (t = end + W). `next_change` is the earliest of
those instants after `now` and the first integer microsecond at which over-quota flips inside the current
affine piece; so nothing in the answer (over-quota, remaining == 0, which records are entering/leaving the
window) changes on [now, next_change), apart from the continuous accrual of the consumed value itself.
`exhausted_at` is the first microsecond at which over-quota becomes true in that same known future. Unlike a
plain "remaining / burn rate" it accounts for usage sliding out of the window, so a steady load that plateaus
below the quota never exhausts it (None); with a window longer than the horizon the two agree.

Periods. A calendar period `[start, end)` is a window whose trailing edge stays at `start` while `now` moves
through the period: at `now` it is the window of length `now - start` (empty at `start`), and nothing leaves
it before `end`, where the next period begins with nothing counted. `period_usage` gives its answer: the
consumption, error bound and members are the window's; the consumption only grows until `end`, so
`exhausted_at` is the first microsecond the known future reaches the quota before `end` (None if it does not),
and `next_change` is at the latest `end`.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Collection, Iterable, Mapping
from fractions import Fraction
from typing import NamedTuple, TypeVar

import msgspec

from gpuops.accounting.errors import AccountingError, IntervalError, NegativeValueError

__all__ = [
    "MAX_BUCKETS",
    "MICROS_PER_HOUR",
    "Interval",
    "Ledger",
    "LedgerBucket",
    "LedgerEntry",
    "Usage",
    "compact_ledger",
    "compaction_error_bound",
    "consumed_by_key",
    "counted_intervals",
    "first_at_or_below",
    "format_gpu_hours",
    "gpu_hours",
    "keyed_records",
    "late_error_bound",
    "period_usage",
    "record",
    "window_usage",
]

MICROS_PER_HOUR = 3_600_000_000
"""GPU-microseconds in one GPU-hour."""

MAX_BUCKETS = 100_000
"""Most grid buckets one window may be split into; a finer grid would cost more than the entries it replaces."""

_T = TypeVar("_T")


def _instant(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AccountingError(f"{what} must be an int instant/duration in microseconds, got {value!r}")
    return value


def _gpus(value: object, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, Fraction | int):
        raise AccountingError(f"{what} must be an exact GPU amount (Fraction or int), got {value!r}")
    amount = Fraction(value)
    if amount < 0:
        raise NegativeValueError(f"{what} must be >= 0, got {amount}")
    return amount


def _window(value: object) -> int:
    """A window length; 0 is the empty window (a calendar period at its first instant)."""
    window = _instant(value, "window")
    if window < 0:
        raise IntervalError(f"window must be >= 0 microseconds, got {window}")
    return window


def _check_span(kind: str, uid: object, start: object, end: object, late: object, *, open_ok: bool) -> None:
    if not isinstance(uid, str) or not uid:
        raise AccountingError(f"{kind}.uid must be a non-empty string (the pod UID), got {uid!r}")
    _instant(start, f"{kind} {uid!r} start")
    late = _instant(late, f"{kind} {uid!r} late")
    if end is None and open_ok:
        if late:
            raise IntervalError(f"{kind} {uid!r} is still running: late must be 0 (nothing ended late), got {late}")
        return
    _instant(end, f"{kind} {uid!r} end")
    assert isinstance(start, int) and isinstance(end, int)
    if end < start:
        raise IntervalError(
            f"{kind} {uid!r} ends ({end}) before it starts ({start}); clamp skewed timestamps before accounting"
        )
    if not 0 <= late <= end - start:
        raise IntervalError(f"{kind} {uid!r} late must be within [0, end - start] = [0, {end - start}], got {late}")


class Interval(msgspec.Struct, frozen=True, kw_only=True):
    """A live pod's GPU allocation: from `start` to `end` (None while it still runs), holding `gpus`.

    `late`: the last `late` microseconds of `[start, end)` lie past the pod's recorded end. A reported figure
    counted the pod that far before its finish arrived, and a figure is never taken back, so they count; but
    `Usage.error_bound` names them, so `consumed - error_bound` never exceeds usage by the record."""

    uid: str
    start: int
    end: int | None = None
    gpus: Fraction
    late: int = 0

    def __post_init__(self) -> None:
        _check_span("Interval", self.uid, self.start, self.end, self.late, open_ok=True)
        msgspec.structs.force_setattr(self, "gpus", _gpus(self.gpus, f"Interval {self.uid!r} gpus"))


class LedgerEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A finished or deleted pod, recorded so its usage keeps counting after it leaves the API (`late`: as
    for `Interval`). `key` says what the usage was of (e.g. the GPU model and capacity type it ran on):
    compaction merges only entries of one key into a bucket, so usage can still be told apart by key."""

    uid: str
    start: int
    end: int
    gpus: Fraction
    late: int = 0
    key: str = ""

    def __post_init__(self) -> None:
        _check_span("LedgerEntry", self.uid, self.start, self.end, self.late, open_ok=False)
        msgspec.structs.force_setattr(self, "gpus", _gpus(self.gpus, f"LedgerEntry {self.uid!r} gpus"))


class LedgerBucket(msgspec.Struct, frozen=True, kw_only=True):
    """Merged ledger entries in `[start, end)`: `gpu_micros` used in total, at most `peak_gpus` at once;
    `late_gpu_micros` of `gpu_micros` lie past the merged pods' recorded ends (see `Interval.late`)."""

    start: int
    end: int
    gpu_micros: Fraction
    peak_gpus: Fraction
    late_gpu_micros: Fraction = Fraction(0)
    key: str = ""
    """The key of the entries merged into it (one bucket per cell and key)."""

    def __post_init__(self) -> None:
        start = _instant(self.start, "LedgerBucket.start")
        end = _instant(self.end, "LedgerBucket.end")
        if end <= start:
            raise IntervalError(f"LedgerBucket must have end > start, got [{start}, {end})")
        used = _gpus(self.gpu_micros, "LedgerBucket.gpu_micros")
        peak = _gpus(self.peak_gpus, "LedgerBucket.peak_gpus")
        if used > peak * (end - start):
            raise AccountingError(
                f"LedgerBucket [{start}, {end}) holds {used} GPU-microseconds, more than peak_gpus {peak} times"
                " its width allows; the peak must bound the concurrent GPUs"
            )
        late = _gpus(self.late_gpu_micros, "LedgerBucket.late_gpu_micros")
        if late > used:
            raise AccountingError(
                f"LedgerBucket [{start}, {end}) has late_gpu_micros {late} above its gpu_micros {used}; the late"
                " part is a part of what the bucket used"
            )
        msgspec.structs.force_setattr(self, "gpu_micros", used)
        msgspec.structs.force_setattr(self, "peak_gpus", peak)
        msgspec.structs.force_setattr(self, "late_gpu_micros", late)


class Ledger(msgspec.Struct, frozen=True, kw_only=True):
    """Individual entries (deduplicated by UID) plus compacted buckets."""

    entries: tuple[LedgerEntry, ...] = ()
    buckets: tuple[LedgerBucket, ...] = ()

    def __post_init__(self) -> None:
        for field, kind in (("entries", LedgerEntry), ("buckets", LedgerBucket)):
            items = tuple(getattr(self, field))
            for item in items:
                if not isinstance(item, kind):
                    raise AccountingError(f"Ledger.{field} must hold {kind.__name__} values, got {item!r}")
            msgspec.structs.force_setattr(self, field, items)


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """The budget's answer at `now`.

    consumed/remaining/error_bound are GPU-hours; burn_rate is GPUs held at `now`; exhausted_at and
    next_change are instants (microseconds) or None. `consumed - error_bound <= usage by the record <= consumed`,
    where the record is the inputs with each `late` part removed and each bucket exact (`usage_error_bound`).
    `pods_in_window` counts the UIDs whose GPU usage overlaps the window (compacted ones are not counted).
    """

    consumed: Fraction
    remaining: Fraction
    over_quota: bool
    burn_rate: Fraction
    exhausted_at: int | None
    next_change: int | None
    error_bound: Fraction
    pods_in_window: int


def _winner_key(item: Interval | LedgerEntry) -> tuple[bool, int, bool, int, Fraction]:
    end = item.end
    return (end is None, end if end is not None else 0, isinstance(item, Interval), -item.start, item.gpus)


def _dedupe(items: Iterable[Interval | LedgerEntry]) -> dict[str, Interval | LedgerEntry]:
    records = list(items)
    best: dict[str, Interval | LedgerEntry] = {item.uid: item for item in records}
    if len(best) == len(records):  # every UID once (the usual case): nothing to arbitrate
        return best
    best = {}
    for item in records:
        current = best.get(item.uid)
        if current is None or _winner_key(item) > _winner_key(current):
            best[item.uid] = item
    return best


def _checked(items: Iterable[_T], kind: type[_T], what: str) -> list[_T]:
    out = list(items)
    for item in out:
        if not isinstance(item, kind):
            raise AccountingError(f"{what} must hold {kind.__name__} values, got {item!r}")
    return out


def _winners(live: Iterable[Interval], ledger: Ledger | Iterable[LedgerEntry]) -> dict[str, Interval | LedgerEntry]:
    live_items = _checked(live, Interval, "live intervals")
    entries = ledger.entries if isinstance(ledger, Ledger) else _checked(ledger, LedgerEntry, "ledger entries")
    return _dedupe([*entries, *live_items])


def counted_intervals(live: Iterable[Interval], ledger: Ledger | Iterable[LedgerEntry] = ()) -> tuple[Interval, ...]:
    """The records that count, one per UID, by the rule in the module docstring (sorted by UID)."""
    best = _winners(live, ledger)
    return tuple(
        item if isinstance(item, Interval)
        else Interval(uid=item.uid, start=item.start, end=item.end, gpus=item.gpus, late=item.late)
        for _, item in sorted(best.items())
    )


def gpu_hours(intervals: Iterable[Interval], *, now: int, window: int) -> Fraction:
    """GPU-hours of the given intervals inside `[now - window, now)`, summed as given (no UID dedup)."""
    now = _instant(now, "now")
    window = _window(window)
    # Exact without a Fraction per interval: sum(g * overlap) is regrouped by the denominator of g, so the hot
    # loop multiplies and adds ints only and the few per-denominator sums become Fractions once at the end.
    whole = 0
    by_den: dict[int, int] = {}
    back = now - window
    for item in list(intervals):
        if not isinstance(item, Interval):
            raise AccountingError(f"intervals must hold Interval values, got {item!r}")
        end = item.end
        if end is None or end > now:
            end = now
        start = item.start
        if start < back:
            start = back
        if end > start:
            num, den = item.gpus.as_integer_ratio()
            if den == 1:
                whole += num * (end - start)
            else:
                by_den[den] = by_den.get(den, 0) + num * (end - start)
    total = Fraction(whole) + sum((Fraction(used, den) for den, used in by_den.items()), Fraction(0))
    return total / MICROS_PER_HOUR


def keyed_records(
    live: Mapping[str, Iterable[Interval]], ledger: Ledger | Iterable[LedgerEntry] = ()
) -> list[tuple[Interval, str]]:
    """The records that count (one per UID, as `counted_intervals`), each with its key: `live` intervals
    under the key they are given, ledger entries under their own (sorted by UID)."""
    key_of: dict[int, str] = {}
    flat: list[Interval] = []
    for key, items in live.items():
        for item in _checked(items, Interval, "live intervals"):
            key_of[id(item)] = key
            flat.append(item)
    out: list[tuple[Interval, str]] = []
    for _, record in sorted(_winners(flat, ledger).items()):
        if isinstance(record, Interval):
            out.append((record, key_of[id(record)]))
        else:
            out.append((Interval(uid=record.uid, start=record.start, end=record.end, gpus=record.gpus,
                                 late=record.late), record.key))
    return out


def consumed_by_key(
    live: Mapping[str, Iterable[Interval]],
    ledger: Ledger = Ledger(),  # noqa: B008 - immutable frozen Struct
    *,
    now: int,
    window: int,
) -> dict[str, Fraction]:
    """GPU-hours in `[now - window, now)` by key: `live` intervals under their key, ledger entries and buckets
    under theirs. The records that count are `window_usage`'s (one per UID; the winner's key is the one its
    usage goes to) and buckets count whole while they overlap the window, so the keys' figures add up to its
    `consumed` exactly."""
    now, window = _instant(now, "now"), _window(window)
    grouped: dict[str, list[Interval]] = {}
    for record, key in keyed_records(live, ledger):
        grouped.setdefault(key, []).append(record)
    out = {key: gpu_hours(items, now=now, window=window) for key, items in grouped.items()}
    for b in ledger.buckets:
        if b.start < now and now - window < b.end and b.gpu_micros:
            out[b.key] = out.get(b.key, Fraction(0)) + b.gpu_micros / MICROS_PER_HOUR
    return out


def record(ledger: Ledger, entry: LedgerEntry) -> Ledger:
    """The ledger with `entry` added; if its UID is already there, the winner of the dedup rule stays."""
    if not isinstance(entry, LedgerEntry):
        raise AccountingError(f"entry must be a LedgerEntry, got {entry!r}")
    best = _dedupe([*ledger.entries, entry])
    entries = tuple(sorted((e for e in best.values() if isinstance(e, LedgerEntry)), key=lambda e: (e.start, e.uid)))
    return Ledger(entries=entries, buckets=ledger.buckets)


_Span = tuple[int, int | None, int]  # start, end (None: open), GPUs times the common scale
_Step = tuple[int, int, int]  # start, end, GPU-microseconds times the common scale (a compacted bucket)


def _exhaustion(
    spans: list[_Span], steps: list[_Step], now: int, window: int, used: int, slope: int, quota: int
) -> int | None:
    """Walk the breakpoints after `now` in time order until the consumption reaches `quota` (ints on one scale)."""
    slopes, jumps = _window_breakpoints(spans, steps, now, window)
    # past the last breakpoint every record is wholly in or out of the window: the slope is 0, the value stays
    return _walk(slopes, jumps, now, used, slope, quota)


def _window_breakpoints(
    spans: list[_Span], steps: list[_Step], now: int, window: int
) -> tuple[dict[int, int], dict[int, int]]:
    """Slope changes and jumps of a rolling window's consumption after `now` in the known future (ints on one
    scale): records starting or ending at either edge, buckets entering or leaving."""
    slopes: dict[int, int] = {}
    get = slopes.get
    for start, end, gpus in spans:
        if start > now:
            slopes[start] = get(start, 0) + gpus
        at = start + window
        if at > now:
            slopes[at] = get(at, 0) - gpus
        if end is not None:
            if end > now:
                slopes[end] = get(end, 0) - gpus
            at = end + window
            if at > now:
                slopes[at] = get(at, 0) + gpus
    jumps: dict[int, int] = {}
    for start, end, micros in steps:
        for at, jump in ((start + 1, micros), (end + window, -micros)):
            if at > now:
                jumps[at] = jumps.get(at, 0) + jump
                slopes.setdefault(at, 0)
    return slopes, jumps


def first_at_or_below(
    live: Iterable[Interval],
    ledger: Ledger = Ledger(),  # noqa: B008 - immutable frozen Struct
    *,
    now: int,
    window: int,
    level: Fraction | int,
) -> int | None:
    """The first microsecond at or after `now` at which the consumption in the rolling window is at most `level`
    GPU-hours in the known future (open intervals keep running, nothing new starts, the ledger does not change);
    None if it never is (running pods keep it above, or `level` is below zero).

    Why: a budget holding pods back says until when; with pods still running the consumption may keep rising,
    so this walks the same breakpoints as `exhausted_at` rather than waiting for old usage to leave."""
    now = _instant(now, "now")
    window = _window(window)
    level = Fraction(level)
    if level < 0:
        return None
    _, scaled, edges = _evaluate(live, ledger, level, now, window)
    if edges.used <= scaled.quota:
        return now
    slopes, jumps = _window_breakpoints(scaled.spans, scaled.steps, now, window)
    return _walk_down(slopes, jumps, now, edges.used, edges.burn - edges.leaving, scaled.quota)


def compaction_error_bound(ledger: Ledger, *, now: int, window: int) -> Fraction:
    """Most GPU-hours the ledger's buckets can over-count at `now`: the bucket the trailing edge is inside
    counts whole what it held before the edge, and every bucket in the window its late part (0 when no bucket
    straddles the edge and none holds late usage)."""
    now = _instant(now, "now")
    edge = now - _window(window)
    total = Fraction(0)
    for b in ledger.buckets:
        if b.start < edge < b.end:
            total += min(b.gpu_micros, b.late_gpu_micros + b.peak_gpus * (edge - b.start))
        elif b.start < now and edge < b.end:
            total += b.late_gpu_micros
    return total / MICROS_PER_HOUR


def late_error_bound(records: Iterable[Interval | LedgerEntry], *, now: int, window: int) -> Fraction:
    """GPU-hours of the records' late parts (counted past their recorded ends) inside `[now - window, now)`,
    summed as given (no UID dedup)."""
    late: list[Interval] = []
    for r in records:
        if not isinstance(r, Interval | LedgerEntry):
            raise AccountingError(f"records must hold Interval or LedgerEntry values, got {r!r}")
        if r.late and r.end is not None:
            late.append(Interval(uid=r.uid, start=r.end - r.late, end=r.end, gpus=r.gpus))
    return gpu_hours(late, now=now, window=window)


def window_usage(
    live: Iterable[Interval],
    ledger: Ledger = Ledger(),  # noqa: B008 - immutable frozen Struct
    *,
    now: int,
    window: int,
    quota: Fraction | int,
) -> Usage:
    """Consumption in `[now - window, now)` against `quota` GPU-hours, with what to expect next.

    The projection and next change assume the known future described in the module docstring.
    """
    now = _instant(now, "now")
    window = _window(window)
    records, scaled, edges = _evaluate(live, ledger, quota, now, window)
    used, quota_scaled = edges.used, scaled.quota
    slope = edges.burn - edges.leaving
    over = used >= quota_scaled
    return _answer(
        records, ledger, scaled, edges, now=now, window=window,
        exhausted=None if over else _exhaustion(scaled.spans, scaled.steps, now, window, used, slope, quota_scaled),
        next_change=_next_change(edges.first, now, used, over, slope, quota_scaled),
    )


def _evaluate(live: Iterable[Interval], ledger: Ledger, quota: Fraction | int, now: int,
              window: int) -> tuple[list[Interval | LedgerEntry], _Scaled, _Edges]:
    """The records that count, on one integer scale with the quota, and one sweep of them at `now`."""
    quota_micros = _gpus(quota, "quota") * MICROS_PER_HOUR
    if not isinstance(ledger, Ledger):
        raise AccountingError(f"ledger must be a Ledger, got {ledger!r}")
    records = list(_winners(live, ledger).values())
    scaled = _on_common_scale(records, ledger.buckets, quota_micros)
    return records, scaled, _sweep(scaled.spans, scaled.steps, now, window)


def _answer(records: list[Interval | LedgerEntry], ledger: Ledger, scaled: _Scaled, edges: _Edges, *, now: int,
            window: int, exhausted: int | None, next_change: int | None) -> Usage:
    """The Usage of one sweep, its figures back in GPU-hours."""
    used, quota_scaled, scale = edges.used, scaled.quota, scaled.scale
    per_hour = scale * MICROS_PER_HOUR
    return Usage(
        consumed=Fraction(used, per_hour),
        remaining=max(Fraction(0), Fraction(quota_scaled - used, per_hour)),
        over_quota=used >= quota_scaled,
        burn_rate=Fraction(edges.burn, scale),
        exhausted_at=exhausted,
        next_change=next_change,
        error_bound=compaction_error_bound(ledger, now=now, window=window)
        + late_error_bound(records, now=now, window=window),
        pods_in_window=edges.members,
    )


def period_usage(
    live: Iterable[Interval],
    ledger: Ledger = Ledger(),  # noqa: B008 - immutable frozen Struct
    *,
    now: int,
    start: int,
    end: int,
    quota: Fraction | int,
) -> Usage:
    """Consumption in the period `[start, end)` up to `now` against `quota` GPU-hours (see Periods above)."""
    now, start, end = _instant(now, "now"), _instant(start, "start"), _instant(end, "end")
    if not start <= now < end:
        raise IntervalError(f"now must lie in the period [start, end), got {now} outside [{start}, {end})")
    records, scaled, edges = _evaluate(live, ledger, quota, now, now - start)
    used, quota_scaled = edges.used, scaled.quota
    slopes, jumps = _period_breakpoints(scaled.spans, scaled.steps, now, end)
    over = used >= quota_scaled
    exhausted = None if over else _walk(slopes, jumps, now, used, edges.burn, quota_scaled)
    flips = [] if over or edges.burn <= 0 else [now - (used - quota_scaled) // edges.burn]
    return _answer(records, ledger, scaled, edges, now=now, window=now - start,
                   exhausted=exhausted if exhausted is not None and exhausted < end else None,
                   next_change=min([end, *slopes, *flips]))


def _period_breakpoints(
    spans: list[_Span], steps: list[_Step], now: int, end: int
) -> tuple[dict[int, int], dict[int, int]]:
    """Slope changes (records starting or ending) and jumps (buckets entering) inside `(now, end)` of a period
    (its trailing edge stays put, so nothing leaves)."""
    slopes: dict[int, int] = {}
    for first, last, gpus in spans:
        if now < first < end:
            slopes[first] = slopes.get(first, 0) + gpus
        if last is not None and now < last < end:
            slopes[last] = slopes.get(last, 0) - gpus
    jumps: dict[int, int] = {}
    for first, _, micros in steps:
        if now < first + 1 < end:
            jumps[first + 1] = jumps.get(first + 1, 0) + micros
            slopes.setdefault(first + 1, 0)
    return slopes, jumps


def _walk(slopes: dict[int, int], jumps: dict[int, int], now: int, used: int, slope: int, quota: int) -> int | None:
    """The first microsecond the consumption, moving along `slope` and changing at the breakpoints, reaches
    `quota`; None if it never does after the last breakpoint."""
    t, value = now, used
    for at in sorted(slopes):
        if slope > 0:
            hit = t - (value - quota) // slope  # t + ceil((quota - value) / slope)
            if hit < at:
                return hit
        value += slope * (at - t) + jumps.get(at, 0)
        slope += slopes[at]
        t = at
        if value >= quota:
            return t
    return t - (value - quota) // slope if slope > 0 else None


def _walk_down(slopes: dict[int, int], jumps: dict[int, int], now: int, used: int, slope: int,
               level: int) -> int | None:
    """The first microsecond the consumption (above `level` at `now`), moving along `slope` and changing at the
    breakpoints, is at most `level`; None if it stays above past the last breakpoint."""
    t, value = now, used
    for at in sorted(slopes):
        if slope < 0:
            hit = t - (level - value) // -slope  # t + ceil((value - level) / -slope)
            if hit < at:
                return hit
        value += slope * (at - t) + jumps.get(at, 0)
        slope += slopes[at]
        t = at
        if value <= level:
            return t
    return None  # past the last breakpoint the slope is 0: every record is wholly in or out of the window


class _Scaled(NamedTuple):
    """Records and buckets as ints on one common scale, with the quota on that scale."""

    scale: int
    spans: list[_Span]
    steps: list[_Step]
    quota: int


def _on_common_scale(
    records: list[Interval | LedgerEntry], buckets: tuple[LedgerBucket, ...], quota_micros: Fraction
) -> _Scaled:
    """GPU amounts, bucket GPU-microseconds and the quota as ints on one scale (the LCM of every denominator,
    usually 1), so the sweep is integer arithmetic throughout and results become Fractions once, at the end.

    Zero-GPU and zero-length records never contribute: they are not members of any window and add no
    breakpoints; empty buckets neither.
    """
    ratios = [r.gpus.as_integer_ratio() for r in records]
    bucket_ratios = [(b, b.gpu_micros.as_integer_ratio()) for b in buckets]
    scale = math.lcm(quota_micros.denominator, *{den for _, den in ratios}, *{den for _, (_, den) in bucket_ratios})
    factor = {den: scale // den for den in {den for _, den in ratios}}
    spans: list[_Span] = [
        (r.start, r.end, num * factor[den])
        for r, (num, den) in zip(records, ratios, strict=True)
        if num and (r.end is None or r.end > r.start)
    ]
    steps: list[_Step] = [(b.start, b.end, num * (scale // den)) for b, (num, den) in bucket_ratios if num]
    quota = quota_micros.numerator * (scale // quota_micros.denominator)
    return _Scaled(scale=scale, spans=spans, steps=steps, quota=quota)


class _Edges(NamedTuple):
    """What one pass over the scaled records finds at `now` (ints on the common scale)."""

    used: int
    """Consumption inside the window."""
    burn: int
    """GPUs held at the leading edge."""
    leaving: int
    """GPUs held at the trailing edge."""
    members: int
    """Records overlapping the window."""
    first: int | None
    """The first breakpoint after `now`."""


def _sweep(spans: list[_Span], steps: list[_Step], now: int, window: int) -> _Edges:
    """Consumption, GPUs held at the leading and trailing edges, members and the first breakpoint, in one pass
    (the records may number hundreds of thousands, so the loop stays inline)."""
    back = now - window
    used = burn = leaving = members = 0
    first: int | None = None
    for start, end, gpus in spans:
        hi = now if end is None or end > now else end
        lo = back if start < back else start
        if hi > lo:
            used += gpus * (hi - lo)
            members += 1
        if start <= now and (end is None or now < end):
            burn += gpus
        if start <= back and (end is None or back < end):
            leaving += gpus
        # the first of start, start + W, end, end + W after now (start <= end: no sorting needed)
        if start > now:
            at: int | None = start
        else:
            at = start + window
            if at <= now:  # the start already left through the trailing edge
                at = None if end is None else end if end > now else end + window if end + window > now else None
            elif end is not None and now < end < at:
                at = end
        if at is not None and (first is None or at < first):
            first = at
    for start, end, micros in steps:
        if start < now and back < end:
            used += micros
        for at in (start + 1, end + window):
            if at > now and (first is None or at < first):
                first = at
    return _Edges(used=used, burn=burn, leaving=leaving, members=members, first=first)


def _next_change(first: int | None, now: int, used: int, over: bool, slope: int, quota: int) -> int | None:
    """The first breakpoint after `now`, or earlier the first microsecond at which over-quota flips while the
    consumption moves along its current slope (ints on one scale)."""
    candidates = [] if first is None else [first]
    if over and slope < 0:
        candidates.append(now + (used - quota) // -slope + 1)  # first microsecond below the quota
    elif not over and slope > 0:
        candidates.append(now - (used - quota) // slope)  # first microsecond at/over the quota
    return min(candidates) if candidates else None


def _peak(pieces: list[tuple[int, int, Fraction]]) -> Fraction:
    """Most GPUs held at once by half-open pieces (an end and a start at the same instant do not overlap)."""
    points = sorted([(lo, 1, g) for lo, _, g in pieces] + [(hi, 0, -g) for _, hi, g in pieces])
    level = peak = Fraction(0)
    for _, _, delta in points:
        level += delta
        peak = max(peak, level)
    return peak


def compact_ledger(
    ledger: Ledger,
    *,
    now: int,
    window: int,
    max_entries: int,
    bucket_width: int,
    live_uids: Collection[str] = frozenset(),
    cuts: Collection[int] = (),
) -> Ledger:
    """Drop what left the window for good and merge the oldest entries into grid buckets (see module doc).

    Valid for evaluations at instants >= `now` (time only moves forward) with the same window: what lies
    before `now - window` is discarded, so widening the window later cannot bring it back. Entries ending
    after `now` or whose UID is in `live_uids` are never merged, so the result holds at most `max_entries`
    entries plus those, and at most ceil(window / bucket_width) + 1 buckets per bucket width ever used, plus
    one per cut inside the window.

    `cuts`: instants no new bucket straddles (a grid cell holding one is split there), so whatever changes at a
    cut (e.g. a price) can be told from a bucket's start.
    """
    now, window, width, limit = _compaction_args(ledger, now, window, max_entries, bucket_width)
    horizon = now - window

    best = _dedupe(ledger.entries)
    keep = [e for e in best.values() if isinstance(e, LedgerEntry) and e.end > horizon]
    grid = _surviving_cells(ledger.buckets, horizon)

    if len(keep) > limit:
        merged = _oldest_mergeable(keep, len(keep) - limit, live_uids, now)
        merged_uids = {e.uid for e in merged}
        keep = [e for e in keep if e.uid not in merged_uids]
        cells, late_cells = _pieces_by_cell(merged, horizon, width, sorted(set(cuts)))
        for cell, pieces in cells.items():
            slot = grid.setdefault(cell, [Fraction(0), Fraction(0), Fraction(0)])
            slot[0] += sum((g * (hi - lo) for lo, hi, g in pieces), Fraction(0))
            slot[1] += _peak(pieces)
            slot[2] += late_cells.get(cell, Fraction(0))

    return Ledger(
        entries=tuple(sorted(keep, key=lambda e: (e.start, e.uid))),
        buckets=tuple(
            LedgerBucket(start=start, end=end, gpu_micros=used, peak_gpus=peak, late_gpu_micros=late, key=key)
            for (start, end, key), (used, peak, late) in sorted(grid.items())
        ),
    )


def _compaction_args(
    ledger: object, now: object, window: object, max_entries: object, bucket_width: object
) -> tuple[int, int, int, int]:
    """`now`, `window`, bucket width and entry limit, checked; a grid finer than `MAX_BUCKETS` cells per window
    is refused because it would cost more than the entries it replaces."""
    now = _instant(now, "now")
    window = _window(window)
    width = _instant(bucket_width, "bucket_width")
    if width <= 0:
        raise IntervalError(f"bucket_width must be > 0 microseconds, got {width}")
    if -(-window // width) > MAX_BUCKETS:
        raise IntervalError(
            f"bucket_width {width} splits the window {window} into more than {MAX_BUCKETS} buckets;"
            f" use bucket_width >= {-(-window // MAX_BUCKETS)}"
        )
    limit = _instant(max_entries, "max_entries")
    if limit < 0:
        raise NegativeValueError(f"max_entries must be >= 0, got {limit}")
    if not isinstance(ledger, Ledger):
        raise AccountingError(f"ledger must be a Ledger, got {ledger!r}")
    return now, window, width, limit


def _surviving_cells(buckets: Iterable[LedgerBucket], horizon: int) -> dict[tuple[int, int, str], list[Fraction]]:
    """The buckets still reaching past `horizon`, by cell and key: [GPU-microseconds, peak GPUs, late part].
    Buckets of one cell and key add up (their peaks too, which keeps the sum an upper bound)."""
    grid: dict[tuple[int, int, str], list[Fraction]] = {}
    for b in buckets:
        if b.end > horizon:
            slot = grid.setdefault((b.start, b.end, b.key), [Fraction(0), Fraction(0), Fraction(0)])
            slot[0] += b.gpu_micros
            slot[1] += b.peak_gpus
            slot[2] += b.late_gpu_micros
    return grid


def _oldest_mergeable(keep: list[LedgerEntry], count: int, live_uids: Collection[str], now: int) -> list[LedgerEntry]:
    """Up to `count` entries to merge, oldest end first; a live pod's entry or one ending after `now` must keep
    its UID, so it is never merged."""
    eligible = sorted(
        (e for e in keep if e.uid not in live_uids and e.end <= now), key=lambda e: (e.end, e.start, e.uid)
    )
    return eligible[:count]


def _pieces_by_cell(
    merged: list[LedgerEntry], horizon: int, width: int, cuts: list[int]
) -> tuple[dict[tuple[int, int, str], list[tuple[int, int, Fraction]]], dict[tuple[int, int, str], Fraction]]:
    """The merged entries cut at the grid lines and at `cuts` (sorted): per cell (start, end, key), the pieces
    (start, end, GPUs) and the GPU-microseconds of their late parts."""
    cells: dict[tuple[int, int, str], list[tuple[int, int, Fraction]]] = {}
    late_cells: dict[tuple[int, int, str], Fraction] = {}
    for e in merged:
        lo = max(e.start, horizon)  # the part before the horizon can never be in a later window
        if e.gpus == 0 or lo >= e.end:
            continue
        for k in range(lo // width, (e.end - 1) // width + 1):
            for cell_lo, cell_hi in _cut_cell(k * width, (k + 1) * width, cuts):
                piece_lo, piece_hi = max(lo, cell_lo), min(e.end, cell_hi)
                if piece_hi <= piece_lo:
                    continue
                cell = (cell_lo, cell_hi, e.key)
                cells.setdefault(cell, []).append((piece_lo, piece_hi, e.gpus))
                late = piece_hi - max(piece_lo, e.end - e.late)
                if late > 0:
                    late_cells[cell] = late_cells.get(cell, Fraction(0)) + e.gpus * late
    return cells, late_cells


def _cut_cell(lo: int, hi: int, cuts: list[int]) -> list[tuple[int, int]]:
    """The grid cell [lo, hi) split at the cuts strictly inside it."""
    inside = cuts[bisect.bisect_right(cuts, lo):bisect.bisect_left(cuts, hi)]
    bounds = [lo, *inside, hi]
    return list(itertools.pairwise(bounds))


def format_gpu_hours(value: Fraction | int, places: int = 6) -> str:
    """Fixed-point text with `places` decimals, rounded half to even ("12.345679").

    Six decimals keep the rounding error (<= 5e-7 GPU-hours) below 1e-4 of a 2.5-GPU-minute amount
    (0.041667 GPU-hours), where rounding to milli-units would cost 2.4 %. The text is also a valid quantity.
    """
    if isinstance(value, bool) or not isinstance(value, Fraction | int):
        raise AccountingError(f"value must be an exact Fraction or int of GPU-hours, got {value!r}")
    if isinstance(places, bool) or not isinstance(places, int) or places < 0:
        raise AccountingError(f"places must be an int >= 0, got {places!r}")
    scaled = round(Fraction(value) * 10**places)  # Fraction.__round__ rounds half to even
    sign = "-" if scaled < 0 else ""
    digits = str(abs(scaled)).rjust(places + 1, "0")
    if places == 0:
        return f"{sign}{digits}"
    return f"{sign}{digits[:-places]}.{digits[-places:]}"

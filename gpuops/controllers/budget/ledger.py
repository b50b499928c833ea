"""The ledger as a budget's status keeps it: how finished usage is recorded, compacted and read back.

The arithmetic is `gpuops.accounting.gpuhours`; this module is its durable form (status.ledger) and the watermark
that tells a merged pod from one never recorded.

    A finished pod is written into status.ledger in the same status write that first sees it finished, while
    it is still in the cache, so a later deletion loses nothing; a pod deleted before that is taken from the
    informer's delete event (its last known state) and written on the next reconcile. Bounds (`compact`):
    entries that left the window are dropped (exact for every later instant); beyond `max_ledger_entries`
    the oldest finished entries, up to one end instant recorded as ledger.compactedThrough, are merged into
    buckets of `window / bucket_divisions` with `compact_ledger`. A finished pod still in the API that ends
    at or before compactedThrough is counted through its bucket only, so finished pods need not leave the API
    for the ledger to stay bounded. Entries: at most max_ledger_entries plus those that ended within
    `compaction_margin` (60 s: the cache may lag a pod's final status, and an entry is merged only once no
    late pod can still end before the watermark). Buckets: at most bucket_divisions + 1 per bucket width.
    Error: buckets never under-count; they over-count by at most peak GPUs in one bucket x the bucket width,
    and only while a bucket straddles the window's trailing edge. Time counted past a pod's recorded finish (a
    figure had counted it running before the finish arrived: `settle_end`) is an entry's `late` part, kept in
    status as recordedEnd and in buckets as lateGpuSeconds. status.ledger.errorBoundGpuHours is the sum of
    both, so consumedGpuHours minus it never exceeds the usage the pods' own records give.
    With accounting.retainFinishedPods, matched pods carry the `gpuops.io/budget-accounting` finalizer (added
    before any enforcement), removed right after a successful status write holds their final usage (in every
    retaining budget that selects them), so deletions while the operator is down lose nothing either. Without
    it, a pod that finishes and is deleted while we are down, or is never seen at all, is lost (at most its
    GPUs x its runtime); a mutating webhook adding the finalizer at admission would close the last gap.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from fractions import Fraction

import structlog

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import Ledger, LedgerBucket, LedgerEntry, compact_ledger, format_gpu_hours
from gpuops.accounting.quantity import format_quantity, parse_quantity, round_up_to_nano
from gpuops.kube.times import parse_time_or_none as _t

from .api import LedgerBucketStatus, LedgerEntryStatus, LedgerStatus, format_time, parse_time
from .kinds import join, split

__all__ = ["Book", "LedgerMemo", "compact", "ledger_from_status", "ledger_to_status", "recorded", "usage_quantity"]

log = structlog.get_logger("gpuops.controllers.budget")

_SECOND = 1_000_000


def usage_quantity(value: Fraction) -> str:
    """A usage figure as status records it: rounded up, so never less than was used."""
    return format_quantity(round_up_to_nano(value))


@dataclass(frozen=True, slots=True)
class Book:
    """A budget's ledger as the accounting package wants it, plus what status keeps beside it."""

    ledger: Ledger = field(default_factory=Ledger)
    names: dict[str, str] = field(default_factory=dict)
    compacted_through: int | None = None
    """Finished pods ending at or before this instant are inside the buckets, or out of the window."""

    def covers(self, end: int) -> bool:
        return self.compacted_through is not None and end <= self.compacted_through


EntryText = tuple[str, str, str, str, str | None, str | None, str | None]
"""A ledger entry as status holds it: (uid, start, end, gpus, recordedEnd, model, capacityType)."""


@dataclass(slots=True)
class LedgerMemo:
    """One budget's ledger entries parsed and formatted at its previous reconcile. A ledger holds up to
    max_ledger_entries (500) entries and every reconcile read and rewrote all of them: exact time and quantity
    parsing and formatting were two thirds of a reconcile's time (measured with bench/scale.py). Entries are
    immutable once written, so each is parsed and formatted once; each use keeps only the entries still in
    the ledger (bounded by it), and a forgotten budget drops its memo."""

    parsed: dict[EntryText, LedgerEntry] = field(default_factory=dict)
    texts: dict[LedgerEntry, tuple[str, str, str, str | None, str | None, str | None]] = field(default_factory=dict)


def ledger_from_status(status: LedgerStatus | None, resource: str, memo: LedgerMemo | None = None) -> Book:
    """The ledger kept in status; unreadable items are skipped (and logged).

    A ledger kept for another resource name (spec.gpuResourceName changed) is not comparable: it starts over.
    `memo`: entries parsed at the previous call for the same budget are reused (and only the current ones kept).
    """
    if status is None or (status.resource_name and status.resource_name != resource):
        return Book()
    entries: list[LedgerEntry] = []
    names: dict[str, str] = {}
    known = memo.parsed if memo is not None else {}
    kept: dict[EntryText, LedgerEntry] = {}
    for e in status.entries or ():
        text = (e.uid, e.start, e.end, e.gpus, e.recorded_end, e.model, e.capacity_type)
        entry = known.get(text)
        if entry is None:
            try:
                entry = _entry_from_status(e)
            except (ValueError, AccountingError) as err:
                log.warning("ledger entry unreadable; skipped", uid=e.uid, error=str(err))
                continue
        kept[text] = entry
        entries.append(entry)
        names[e.uid] = e.name
    if memo is not None:
        memo.parsed = kept
    buckets: list[LedgerBucket] = []
    for b in status.buckets or ():
        try:
            buckets.append(LedgerBucket(start=parse_time(b.start), end=parse_time(b.end),
                                        gpu_micros=parse_quantity(b.gpu_seconds) * _SECOND,
                                        peak_gpus=parse_quantity(b.peak_gpus),
                                        late_gpu_micros=min(parse_quantity(b.late_gpu_seconds),
                                                            parse_quantity(b.gpu_seconds)) * _SECOND,
                                        key=join(b.model, b.capacity_type)))
        except (ValueError, AccountingError) as err:
            log.warning("ledger bucket unreadable; skipped", start=b.start, error=str(err))
    return Book(Ledger(entries=tuple(entries), buckets=tuple(buckets)), names, _t(status.compacted_through))


def _entry_from_status(e: LedgerEntryStatus) -> LedgerEntry:
    """Raises ValueError or AccountingError on an unreadable uid, start, end or gpus. An unreadable recordedEnd
    only loses the late part's mark (logged): the usage itself still counts."""
    start, end = parse_time(e.start), parse_time(e.end)
    late = 0
    if e.recorded_end is not None:
        try:
            late = end - min(end, max(start, parse_time(e.recorded_end)))
        except ValueError as err:
            log.warning("ledger entry's recordedEnd unreadable; its late part is not marked", uid=e.uid,
                        error=str(err))
    return LedgerEntry(uid=e.uid, start=start, end=end, gpus=parse_quantity(e.gpus), late=late,
                       key=join(e.model, e.capacity_type))


def ledger_to_status(
    book: Book, *, resource: str, max_entries: int, bucket_width: int, error: Fraction,
    memo: LedgerMemo | None = None,
) -> LedgerStatus:
    """`memo`: entries formatted at the previous call for the same budget are reused (only the current kept)."""
    ledger, names = book.ledger, book.names
    known = memo.texts if memo is not None else {}
    kept: dict[LedgerEntry, tuple[str, str, str, str | None, str | None, str | None]] = {}
    entries = []
    for e in ledger.entries:
        text = known.get(e)
        if text is None:
            text = (format_time(e.start), format_time(e.end), usage_quantity(e.gpus),
                    format_time(e.end - e.late) if e.late else None, *split(e.key))
        kept[e] = text
        entries.append(LedgerEntryStatus(uid=e.uid, name=names.get(e.uid, ""), start=text[0], end=text[1],
                                         gpus=text[2], recorded_end=text[3], model=text[4],
                                         capacity_type=text[5]))
    if memo is not None:
        memo.texts = kept
    return LedgerStatus(
        resource_name=resource,
        max_entries=max_entries,
        bucket_seconds=bucket_width // _SECOND,
        error_bound_gpu_hours=format_gpu_hours(error),
        compacted_through=format_time(book.compacted_through) if book.compacted_through is not None else None,
        entries=tuple(entries) or None,
        buckets=tuple(
            LedgerBucketStatus(start=format_time(b.start), end=format_time(b.end),
                               gpu_seconds=usage_quantity(b.gpu_micros / _SECOND),
                               peak_gpus=usage_quantity(b.peak_gpus),
                               late_gpu_seconds=usage_quantity(b.late_gpu_micros / _SECOND),
                               model=split(b.key)[0], capacity_type=split(b.key)[1])
            for b in ledger.buckets
        ) or None,
    )


def compact(
    book: Book, fresh: Iterable[LedgerEntry], *, now: int, window: int, max_entries: int, bucket_width: int,
    open_uids: Collection[str], margin: int, cuts: Collection[int] = (),
) -> Book:
    """Add `fresh` entries, drop what left the window, and merge the oldest finished entries beyond
    `max_entries` into buckets, always all entries up to one end instant (the new `compacted_through`), so
    "end <= compacted_through" tells a merged pod from one never recorded. Only entries that ended at least
    `margin` ago and whose pods are not open (`open_uids`) are merged: a pod the cache still shows running
    cannot have ended before the watermark. Entries kept: at most `max_entries` plus those that ended within
    `margin`; buckets: at most `window / bucket_width + 1` per bucket width, plus one per cut (`compact_ledger`).
    """
    merged = Ledger(entries=(*book.ledger.entries, *fresh), buckets=book.ledger.buckets)
    step = compact_ledger(merged, now=now, window=window, max_entries=len(merged.entries), bucket_width=bucket_width,
                          live_uids=open_uids)  # dedup and drop what left the window; merges nothing
    through = book.compacted_through
    excess = len(step.entries) - max_entries
    eligible = sorted(e.end for e in step.entries if e.uid not in open_uids and e.end <= now - margin)
    if excess > 0 and eligible:
        cutoff = eligible[min(excess, len(eligible)) - 1]
        count = sum(1 for end in eligible if end <= cutoff)
        step = compact_ledger(step, now=now, window=window, max_entries=len(step.entries) - count,
                              bucket_width=bucket_width, live_uids=open_uids, cuts=cuts)
        through = cutoff if through is None else max(through, cutoff)
    kept = {e.uid for e in step.entries}
    return Book(step, {u: n for u, n in book.names.items() if u in kept}, through)


def recorded(ledger: LedgerStatus | None, uid: str, end: int) -> bool:
    """Does a (cached) status ledger hold this pod's usage, as an entry or under its watermark?"""
    if ledger is None:
        return False
    through = _t(ledger.compacted_through)
    return (through is not None and end <= through) or any(e.uid == uid for e in ledger.entries or ())

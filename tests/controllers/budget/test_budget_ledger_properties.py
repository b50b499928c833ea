"""The ledger's promise "merged pods are never counted twice", for any sequence of compactions: the watermark
`compactedThrough` only moves forward, no entry at or below it is kept beside the buckets that hold it, nothing is
lost (bucketed GPU-seconds equal the merged entries'), and a pod the status ledger records (as an entry or under the
watermark) is known as recorded, so its finalizer is released and it is not counted again."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.gpuhours import Ledger, LedgerEntry
from gpuops.controllers.budget.api import LedgerEntryStatus, LedgerStatus
from gpuops.controllers.budget.ledger import Book, compact
from gpuops.controllers.budget.ledger import recorded as _recorded
from gpuops.kube.times import format_time

S = 1_000_000
WINDOW = 3600 * S
WIDTH = 15 * S
MARGIN = 60 * S


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[int, list[LedgerEntry]]]:
    """Reconciles in time order, each adding the pods that finished since the one before."""
    out, now, n = [], 0, 0
    for _ in range(draw(st.integers(1, 6))):
        now += draw(st.integers(1, 300)) * S
        fresh = []
        for _ in range(draw(st.integers(0, 12))):
            end = draw(st.integers(max(0, now - 400 * S), now))
            start = draw(st.integers(max(0, end - 120 * S), end))
            fresh.append(LedgerEntry(uid=f"u{n}", start=start, end=end, gpus=Fraction(draw(st.integers(1, 8)))))
            n += 1
        out.append((now, fresh))
    return out


def bucketed(book: Book) -> Fraction:
    return sum((b.gpu_micros for b in book.ledger.buckets), Fraction(0))


@settings(max_examples=200)
@given(batches(), st.integers(1, 8))
def test_successive_compactions_keep_a_forward_watermark_and_lose_nothing(
    reconciles: list[tuple[int, list[LedgerEntry]]], max_entries: int,
) -> None:
    book = Book()
    recorded: dict[str, LedgerEntry] = {}
    for now, drawn in reconciles:
        before = book.compacted_through
        # what the reconciler passes: a pod ending at or below the watermark is one merged already (covered)
        fresh = [e for e in drawn if not book.covers(e.end)]
        book = compact(book, fresh, now=now, window=WINDOW, max_entries=max_entries, bucket_width=WIDTH,
                       open_uids=(), margin=MARGIN)
        recorded.update({e.uid: e for e in fresh})
        through = book.compacted_through
        if before is not None:
            assert through is not None and through >= before  # the watermark never moves back
        kept = {e.uid for e in book.ledger.entries}
        assert len(kept) == len(book.ledger.entries)  # each pod once
        if through is not None:
            assert all(e.end > through for e in book.ledger.entries)  # merged pods are not also kept
        merged = [e for u, e in recorded.items() if u not in kept]
        assert bucketed(book) == sum(((e.end - e.start) * e.gpus for e in merged), Fraction(0))
        assert all(through is not None and e.end <= through for e in merged)  # every merged pod is covered
        over = len(book.ledger.entries) - max_entries
        assert over <= sum(1 for e in book.ledger.entries if e.end > now - MARGIN)  # only recent ones in excess


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.booleans())
def test_a_pod_is_recorded_by_its_entry_or_under_the_watermark(end_s: int, through_s: int, listed: bool) -> None:
    end, through = end_s * S, through_s * S
    entries = (LedgerEntryStatus(uid="pod", start=format_time(0), end=format_time(end), gpus="1"),) if listed else ()
    ledger = LedgerStatus(compacted_through=format_time(through), entries=entries or None)
    assert _recorded(ledger, "pod", end) is (listed or end <= through)
    assert _recorded(ledger, "other", end) is (end <= through)
    assert _recorded(LedgerStatus(entries=entries or None), "pod", end) is listed
    assert _recorded(None, "pod", end) is False


def test_a_second_compaction_of_the_same_ledger_merges_more_and_keeps_the_first_buckets() -> None:
    first = [LedgerEntry(uid=f"a{i}", start=i * S, end=(i + 5) * S, gpus=Fraction(1)) for i in range(6)]
    book = compact(Book(Ledger(), {}), first, now=200 * S, window=WINDOW, max_entries=2, bucket_width=WIDTH,
                   open_uids=(), margin=MARGIN)
    assert book.compacted_through == 8 * S and len(book.ledger.entries) == 2
    second = [LedgerEntry(uid=f"b{i}", start=100 * S, end=(110 + i) * S, gpus=Fraction(2)) for i in range(3)]
    again = compact(book, second, now=400 * S, window=WINDOW, max_entries=2, bucket_width=WIDTH, open_uids=(),
                    margin=MARGIN)
    assert again.compacted_through == 110 * S
    assert {e.uid for e in again.ledger.entries} == {"b1", "b2"}
    assert bucketed(again) == 6 * 5 * S + 10 * 2 * S  # a0..a3 first, then a4, a5 and b0 (10 s of 2 GPUs)

"""Usage told apart by key (what it was of, e.g. a GPU model and capacity type) through compaction: buckets hold
one key each, the keys' figures add up to the total, and each key's compacted figure never falls below its exact
one and exceeds it by no more than the error bound says."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.gpuhours import (
    MICROS_PER_HOUR,
    Interval,
    Ledger,
    LedgerEntry,
    compact_ledger,
    compaction_error_bound,
    consumed_by_key,
    window_usage,
)

F = Fraction
KEYS = st.sampled_from(["H100|Spot", "H100|OnDemand", "L4|OnDemand", ""])
GPUS = st.sampled_from([F(0), F(1, 7), F(1, 2), F(1), F(2)])


@st.composite
def inputs(draw: st.DrawFn) -> tuple[dict[str, list[Interval]], Ledger]:
    live: dict[str, list[Interval]] = {}
    for i in range(draw(st.integers(0, 4))):
        start = draw(st.integers(0, 4_000))
        end = None if draw(st.booleans()) else start + draw(st.integers(0, 2_000))
        uid = draw(st.sampled_from([f"l{i}", "d0", "d1"]))  # sometimes the same pod as a ledger entry
        live.setdefault(draw(KEYS), []).append(Interval(uid=uid, start=start, end=end, gpus=draw(GPUS)))
    entries = []
    for i in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, 4_000))
        entries.append(LedgerEntry(uid=f"d{i}", start=start, end=start + draw(st.integers(0, 2_000)),
                                   gpus=draw(GPUS), key=draw(KEYS)))
    return live, Ledger(entries=tuple(entries))


@settings(max_examples=300, deadline=None)
@given(inputs(), st.integers(0, 6_000), st.integers(1, 5_000))
def test_the_keys_add_up_to_the_window_usage(data: tuple[dict[str, list[Interval]], Ledger], now: int,
                                             window: int) -> None:
    live, ledger = data
    flat = [i for items in live.values() for i in items]
    by_key = consumed_by_key(live, ledger, now=now, window=window)
    assert sum(by_key.values(), F(0)) == window_usage(flat, ledger, now=now, window=window, quota=1).consumed


@settings(max_examples=300, deadline=None)
@given(inputs(), st.integers(0, 2_000), st.integers(1, 3_000), st.integers(1, 700), st.integers(0, 3),
       st.integers(0, 2_000))
def test_compaction_keeps_each_keys_usage_apart_and_within_the_bound(
        data: tuple[dict[str, list[Interval]], Ledger], extra: int, window: int, width: int, keep: int,
        later: int) -> None:
    _, ledger = data
    cut = max((e.end for e in ledger.entries), default=0) + extra
    compacted = compact_ledger(ledger, now=cut, window=window, max_entries=keep, bucket_width=width)
    now = cut + later
    compacted = compact_ledger(compacted, now=now, window=window, max_entries=0, bucket_width=width)  # again
    keys_of = {e.key for e in ledger.entries}
    assert {b.key for b in compacted.buckets} <= keys_of
    exact = consumed_by_key({}, ledger, now=now, window=window)
    merged = consumed_by_key({}, compacted, now=now, window=window)
    bound = compaction_error_bound(compacted, now=now, window=window)
    over = F(0)
    for key in keys_of:
        assert merged.get(key, F(0)) >= exact.get(key, F(0))  # never less for any key
        over += merged.get(key, F(0)) - exact.get(key, F(0))
    assert over <= bound


def test_a_bucket_holds_one_key_and_its_usage_stays_under_it() -> None:
    a = LedgerEntry(uid="a", start=0, end=100, gpus=F(1), key="H100|Spot")
    b = LedgerEntry(uid="b", start=0, end=100, gpus=F(2), key="L4|OnDemand")
    compacted = compact_ledger(Ledger(entries=(a, b)), now=100, window=1_000, max_entries=0, bucket_width=100)
    assert sorted((x.key, x.gpu_micros) for x in compacted.buckets) == [("H100|Spot", 100), ("L4|OnDemand", 200)]
    got = consumed_by_key({}, compacted, now=100, window=1_000)
    assert got == {"H100|Spot": F(100, MICROS_PER_HOUR), "L4|OnDemand": F(200, MICROS_PER_HOUR)}

"""GPU-hours in a rolling window: seed regressions, the live/ledger rule, compaction bound, next-change exactness."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import TypeVar

import msgspec
import pytest
from hypothesis import assume, event, example, given, settings
from hypothesis import strategies as st

from gpuops.accounting.errors import AccountingError, IntervalError, NegativeValueError
from gpuops.accounting.gpuhours import (
    MICROS_PER_HOUR,
    Interval,
    Ledger,
    LedgerBucket,
    LedgerEntry,
    compact_ledger,
    compaction_error_bound,
    counted_intervals,
    first_at_or_below,
    format_gpu_hours,
    gpu_hours,
    late_error_bound,
    record,
    window_usage,
)
from gpuops.accounting.quantity import parse_quantity

F = Fraction
H = MICROS_PER_HOUR
S = 1_000_000  # one second in microseconds
_R = TypeVar("_R", Interval, LedgerEntry)


def iv(uid: str, start: int, end: int | None, gpus: int | Fraction = 1) -> Interval:
    return Interval(uid=uid, start=start, end=end, gpus=F(gpus))


def le(uid: str, start: int, end: int, gpus: int | Fraction = 1) -> LedgerEntry:
    return LedgerEntry(uid=uid, start=start, end=end, gpus=F(gpus))


# ------------------------------------------------------------------------------------------ fixed regression cases


def bench_pods(runtime_s: int) -> list[Interval]:
    """The seed's bench: 50 pods, 10 pods/s, 100m "GPU" each (cpu-as-GPU), `runtime_s` seconds each."""
    gpus = parse_quantity("100m")
    return [iv(f"pod-{i}", i * S // 10, i * S // 10 + runtime_s * S, gpus) for i in range(50)]


def test_seed_bench_value_is_exact_and_six_decimals_cost_under_1e4() -> None:
    usage = window_usage(bench_pods(30), now=45 * S, window=1 * H, quota=1)
    assert usage.consumed == F(50 * 30, 10 * 3600)  # 0.041666... GPU-hours
    text = format_gpu_hours(usage.consumed)
    assert text == "0.041667"
    assert abs(F(text) - usage.consumed) / usage.consumed < F(1, 10**4)
    assert F(1, 1000) / usage.consumed > F(2, 100)  # the seed's milli-GPU-hour quantum is 2.4 % of the value
    assert usage.pods_in_window == 50 and usage.burn_rate == 0


def test_seed_chaos_value() -> None:
    usage = window_usage(bench_pods(60), now=120 * S, window=1 * H, quota=1)
    assert format_gpu_hours(usage.consumed) == "0.083333"


def test_deleted_pods_keep_counting_through_the_ledger() -> None:
    """The seed's Evict erased its own evidence: the evicted pod vanished and the budget fell back under quota."""
    live = [iv("a", 0, None, 2), iv("b", 0, None, 2)]
    before = window_usage(live, now=2 * H, window=24 * H, quota=8)
    assert before.over_quota and before.consumed == 8
    # b is evicted at 2h: it leaves the API, the controller records it
    ledger = record(Ledger(), le("b", 0, 2 * H, 2))
    after = window_usage([iv("a", 0, None, 2)], ledger, now=2 * H, window=24 * H, quota=8)
    assert after.consumed == 8 and after.over_quota
    later = window_usage([iv("a", 0, None, 2)], ledger, now=3 * H, window=24 * H, quota=8)
    assert later.consumed == 10


def test_half_open_window_edges() -> None:
    w, now = 10 * H, 20 * H
    assert gpu_hours([iv("x", 0, now - w)], now=now, window=w) == 0  # ends exactly at the window start
    assert gpu_hours([iv("x", now, None)], now=now, window=w) == 0  # starts at now
    assert gpu_hours([iv("x", now - 1, None)], now=now, window=w) == F(1, H)
    assert gpu_hours([iv("x", 0, None, 3)], now=now, window=w) == 30
    assert gpu_hours([iv("x", now - w - 5, now - w + 5, F(1, 2))], now=now, window=w) == F(5, 2 * H)
    assert gpu_hours([iv("x", 5, 5, 4)], now=now, window=w) == 0
    assert gpu_hours([iv("x", now + H, None, 4)], now=now, window=w) == 0


def test_over_quota_at_equality_and_remaining_clamped() -> None:
    at = window_usage([iv("x", 0, None, 1)], now=5 * H, window=24 * H, quota=5)
    assert at.over_quota and at.remaining == 0 and at.exhausted_at is None
    past = window_usage([iv("x", 0, None, 1)], now=7 * H, window=24 * H, quota=5)
    assert past.over_quota and past.remaining == 0
    zero = window_usage([], now=0, window=H, quota=0)
    assert zero.over_quota and zero.consumed == 0


def test_exhaustion_and_next_change_under_quota() -> None:
    usage = window_usage([iv("x", 0, None, 2)], now=1 * H, window=10 * H, quota=4)
    assert usage.consumed == 2 and usage.burn_rate == 2 and usage.remaining == 2
    assert usage.exhausted_at == 2 * H
    assert usage.next_change == 2 * H


def test_plateau_below_quota_never_exhausts() -> None:
    # 1 GPU forever in a 1h window plateaus at 1 GPU-hour; remaining/burn would predict exhaustion at 2h
    usage = window_usage([iv("x", 0, None, 1)], now=H // 2, window=H, quota=2)
    assert usage.exhausted_at is None
    assert usage.next_change == H  # the trailing edge reaches the start: the value stops growing


def test_recovery_instant_when_usage_slides_out() -> None:
    # 1 GPU on [0, 10h), window 8h, quota 5: at t >= 10h consumed = 18h - t; equals 5 at 13h (still over)
    usage = window_usage([], Ledger(entries=(le("x", 0, 10 * H),)), now=10 * H, window=8 * H, quota=5)
    assert usage.over_quota and usage.consumed == 8
    assert usage.next_change == 13 * H + 1
    assert window_usage([], Ledger(entries=(le("x", 0, 10 * H),)), now=13 * H, window=8 * H, quota=5).over_quota
    after = window_usage([], Ledger(entries=(le("x", 0, 10 * H),)), now=13 * H + 1, window=8 * H, quota=5)
    assert not after.over_quota


def test_next_change_is_none_when_nothing_can_change() -> None:
    assert window_usage([], now=10 * H, window=H, quota=1).next_change is None
    gone = window_usage([iv("x", 0, H)], now=10 * H, window=H, quota=1)
    assert gone.consumed == 0 and gone.next_change is None and gone.exhausted_at is None


def test_dedup_rule() -> None:
    # live open beats a closed ledger entry (pod still terminating): it keeps accruing
    rec = counted_intervals([iv("p", 10, None)], [le("p", 0, 50)])
    assert rec == (iv("p", 10, None),)
    # a finished live pod that ends at/after the ledger's end wins; ties go to the live one
    assert counted_intervals([iv("p", 10, 50)], [le("p", 0, 50)]) == (iv("p", 10, 50),)
    assert counted_intervals([iv("p", 10, 60)], [le("p", 0, 50)]) == (iv("p", 10, 60),)
    # the ledger wins only with a strictly later end (e.g. recorded from a deletion timestamp)
    assert counted_intervals([iv("p", 10, 40)], [le("p", 0, 50)]) == (iv("p", 0, 50),)
    # within the ledger the same rule keeps one entry per UID
    ledger = record(record(Ledger(), le("p", 0, 50)), le("p", 5, 40))
    assert ledger.entries == (le("p", 0, 50),)
    assert record(ledger, le("p", 5, 70)).entries == (le("p", 5, 70),)


def test_compaction_fixed_case() -> None:
    # two 1-GPU entries in [0, 100) and [50, 150); grid width 100; window 1000; compact at 200
    ledger = Ledger(entries=(le("a", 0, 100), le("b", 50, 150), le("c", 180, 190, 3)))
    small = compact_ledger(ledger, now=200, window=1000, max_entries=1, bucket_width=100)
    assert small.entries == (le("c", 180, 190, 3),)
    assert small.buckets == (
        LedgerBucket(start=0, end=100, gpu_micros=F(150), peak_gpus=F(2)),
        LedgerBucket(start=100, end=200, gpu_micros=F(50), peak_gpus=F(1)),
    )
    # at t = 1050 the trailing edge (50) is inside bucket [0, 100): it still counts whole
    exact = window_usage([], ledger, now=1050, window=1000, quota=1).consumed
    approx = window_usage([], small, now=1050, window=1000, quota=1)
    assert exact == F(50 + 100 + 30, H) and approx.consumed == F(150 + 50 + 30, H)
    assert approx.error_bound == F(min(150, 2 * 50), H) == compaction_error_bound(small, now=1050, window=1000)
    # once the edge passes a bucket's end it stops counting; entries past the window are dropped
    assert window_usage([], small, now=1100, window=1000, quota=1).consumed == F(50 + 30, H)
    assert compact_ledger(small, now=1150, window=1000, max_entries=1, bucket_width=100) == Ledger(
        entries=(le("c", 180, 190, 3),), buckets=(LedgerBucket(start=100, end=200, gpu_micros=F(50), peak_gpus=F(1)),)
    )
    assert compact_ledger(small, now=1200, window=1000, max_entries=1, bucket_width=100) == Ledger()


def test_compaction_never_merges_live_uids_or_running_entries() -> None:
    ledger = Ledger(entries=(le("a", 0, 100), le("b", 0, 100), le("future", 0, 500)))
    out = compact_ledger(ledger, now=200, window=1000, max_entries=0, bucket_width=100, live_uids={"a"})
    assert {e.uid for e in out.entries} == {"a", "future"}
    assert sum(b.gpu_micros for b in out.buckets) == 100


def test_format_gpu_hours() -> None:
    assert format_gpu_hours(F(12345678901, 10**9)) == "12.345679"
    assert format_gpu_hours(F(1, 2 * 10**6)) == "0.000000"  # half to even
    assert format_gpu_hours(F(3, 2 * 10**6)) == "0.000002"
    assert format_gpu_hours(F(-1, 10**9)) == "0.000000"
    assert format_gpu_hours(F(-3, 2)) == "-1.500000"
    assert format_gpu_hours(7) == "7.000000"
    assert format_gpu_hours(F(5, 2), places=0) == "2"
    assert format_gpu_hours(F(1, 3), places=9) == "0.333333333"
    assert parse_quantity(format_gpu_hours(F(1, 3))) == F(333333, 10**6)  # the text is a valid quantity
    with pytest.raises(AccountingError):
        format_gpu_hours(0.5)  # type: ignore[arg-type]
    with pytest.raises(AccountingError):
        format_gpu_hours(F(1), places=-1)


BAD_INPUT = [
    # (what is built, error class, text the message must hold: the field at fault and what it must be)
    (lambda: iv("x", 10, 5), IntervalError, r"Interval 'x' ends \(5\) before it starts \(10\); clamp"),
    (lambda: le("x", 10, 5), IntervalError, r"LedgerEntry 'x' ends \(5\) before it starts \(10\)"),
    (
        lambda: LedgerEntry(uid="x", start=0, end=None, gpus=F(1)),  # type: ignore[arg-type]
        AccountingError,
        r"LedgerEntry 'x' end must be an int",
    ),
    (lambda: iv("x", 0, 5, -1), NegativeValueError, r"Interval 'x' gpus must be >= 0, got -1"),
    (lambda: le("x", 0, 5, -1), NegativeValueError, r"LedgerEntry 'x' gpus must be >= 0, got -1"),
    (
        lambda: Interval(uid="x", start=0, end=None, gpus=0.5),  # type: ignore[arg-type]
        AccountingError,
        r"Interval 'x' gpus must be an exact GPU amount",
    ),
    (
        lambda: Interval(uid="", start=0, end=None, gpus=F(1)),
        AccountingError,
        r"Interval\.uid must be a non-empty string",
    ),
    (
        lambda: LedgerEntry(uid="", start=0, end=1, gpus=F(1)),
        AccountingError,
        r"LedgerEntry\.uid must be a non-empty string",
    ),
    (
        lambda: Interval(uid="x", start=True, end=None, gpus=F(1)),
        AccountingError,
        r"Interval 'x' start must be an int instant",
    ),
    (
        lambda: LedgerBucket(start=0.5, end=10, gpu_micros=F(1), peak_gpus=F(1)),  # type: ignore[arg-type]
        AccountingError,
        r"LedgerBucket\.start must be an int",
    ),
    (
        lambda: LedgerBucket(start=0, end=None, gpu_micros=F(1), peak_gpus=F(1)),  # type: ignore[arg-type]
        AccountingError,
        r"LedgerBucket\.end must be an int",
    ),
    (
        lambda: LedgerBucket(start=10, end=10, gpu_micros=F(0), peak_gpus=F(0)),
        IntervalError,
        r"LedgerBucket must have end > start, got \[10, 10\)",
    ),
    (
        lambda: LedgerBucket(start=0, end=10, gpu_micros=F(-1), peak_gpus=F(1)),
        NegativeValueError,
        r"LedgerBucket\.gpu_micros must be >= 0",
    ),
    (
        lambda: LedgerBucket(start=0, end=10, gpu_micros=F(1), peak_gpus=F(-1)),
        NegativeValueError,
        r"LedgerBucket\.peak_gpus must be >= 0",
    ),
    # 30 GPU-microseconds cannot fit in 10 microseconds at 2 GPUs (the bucket does not start at 0, so the width
    # is end - start, not end)
    (
        lambda: LedgerBucket(start=100, end=110, gpu_micros=F(30), peak_gpus=F(2)),
        AccountingError,
        r"LedgerBucket \[100, 110\) holds 30 GPU-microseconds, more than peak_gpus 2 times its width allows;"
        r" the peak must bound the concurrent GPUs$",
    ),
    (
        lambda: Ledger(entries=(iv("x", 0, 1),)),  # type: ignore[arg-type]
        AccountingError,
        r"Ledger\.entries must hold LedgerEntry values",
    ),
    (lambda: gpu_hours([], now=0, window=-1), IntervalError, r"window must be >= 0 microseconds, got -1"),
    (lambda: gpu_hours([], now=0.0, window=1), AccountingError, r"^now must be an int"),  # type: ignore[arg-type]
    (
        lambda: gpu_hours([le("x", 0, 1)], now=0, window=1),  # type: ignore[list-item]
        AccountingError,
        r"intervals must hold Interval values",
    ),
    (
        lambda: record(Ledger(), iv("x", 0, 1)),  # type: ignore[arg-type]
        AccountingError,
        r"entry must be a LedgerEntry, got Interval",
    ),
    (lambda: window_usage([], now=0, window=H, quota=-1), NegativeValueError, r"quota"),
    (
        lambda: window_usage([le("x", 0, 1)], now=0, window=H, quota=1),  # type: ignore[list-item]
        AccountingError,
        r"live intervals must hold Interval",
    ),
    (
        lambda: compact_ledger(Ledger(), now=0, window=H, max_entries=1, bucket_width=0),
        IntervalError,
        r"bucket_width must be > 0",
    ),
    (lambda: window_usage([], now=None, window=H, quota=1), AccountingError, r"^now must be an int"),  # type: ignore[arg-type]
    (lambda: window_usage([], now=0, window=H, quota=0.5), AccountingError, r"^quota must be an exact GPU amount"),  # type: ignore[arg-type]
    (lambda: window_usage([], (), now=0, window=H, quota=1), AccountingError, r"^ledger must be a Ledger, got \(\)$"),  # type: ignore[arg-type]
    (lambda: compaction_error_bound(Ledger(), now="0", window=H), AccountingError, r"^now must be an int"),  # type: ignore[arg-type]
    (
        lambda: compact_ledger(Ledger(), now=0, window=H, max_entries=1, bucket_width=1),
        IntervalError,
        r"^bucket_width 1 splits the window 3600000000 into more than 100000 buckets; use bucket_width >= 36000$",
    ),
    (lambda: compact_ledger(Ledger(), now=0.5, window=H, max_entries=1, bucket_width=S), AccountingError, r"^now must"),  # type: ignore[arg-type]
    (
        lambda: compact_ledger(Ledger(), now=0, window=H, max_entries=1, bucket_width=1.5),  # type: ignore[arg-type]
        AccountingError,
        r"^bucket_width must be an int",
    ),
    (
        lambda: compact_ledger(Ledger(), now=0, window=H, max_entries=None, bucket_width=S),  # type: ignore[arg-type]
        AccountingError,
        r"^max_entries must be an int",
    ),
    (
        lambda: compact_ledger(Ledger(), now=0, window=H, max_entries=-1, bucket_width=S),
        NegativeValueError,
        r"^max_entries must be >= 0, got -1$",
    ),
    (
        lambda: compact_ledger((), now=0, window=H, max_entries=1, bucket_width=S),  # type: ignore[arg-type]
        AccountingError,
        r"^ledger must be a Ledger, got \(\)$",
    ),
    (
        lambda: format_gpu_hours(0.5),  # type: ignore[arg-type]
        AccountingError,
        r"value must be an exact Fraction or int of GPU-hours, got 0\.5",
    ),
    (lambda: format_gpu_hours(F(1), places=-1), AccountingError, r"places must be an int >= 0, got -1"),
    (lambda: format_gpu_hours(F(1), places=True), AccountingError, r"places must be an int >= 0, got True"),
    (
        lambda: format_gpu_hours(F(1), places="2"),  # type: ignore[arg-type]
        AccountingError,
        r"places must be an int >= 0, got '2'",
    ),
    # late parts (what was counted past a recorded end)
    (lambda: LedgerEntry(uid="p", start=0, end=10, gpus=F(1), late=1.5),  # type: ignore[arg-type]
     AccountingError, r"^LedgerEntry 'p' late must be an int"),
    (lambda: LedgerEntry(uid="p", start=5, end=10, gpus=F(1), late=6), IntervalError,
     r"^LedgerEntry 'p' late must be within \[0, end - start\] = \[0, 5\], got 6$"),
    (lambda: LedgerEntry(uid="p", start=5, end=10, gpus=F(1), late=-1), IntervalError, r"late must be within"),
    (lambda: LedgerBucket(start=0, end=10, gpu_micros=F(5), peak_gpus=F(1), late_gpu_micros=-1),
     NegativeValueError, r"^LedgerBucket\.late_gpu_micros must be >= 0, got -1$"),
    (lambda: LedgerBucket(start=0, end=10, gpu_micros=F(5), peak_gpus=F(1), late_gpu_micros=0.5),  # type: ignore[arg-type]
     AccountingError, r"^LedgerBucket\.late_gpu_micros must be an exact GPU amount"),
    (lambda: LedgerBucket(start=0, end=10, gpu_micros=F(5), peak_gpus=F(1), late_gpu_micros=F(6)), AccountingError,
     r"^LedgerBucket \[0, 10\) has late_gpu_micros 6 above its gpu_micros 5; the late part is a part of what"),
    (lambda: late_error_bound([object()], now=0, window=1),  # type: ignore[list-item]
     AccountingError, r"^records must hold Interval or LedgerEntry values, got <object"),
]


@pytest.mark.parametrize(("build", "error", "message"), BAD_INPUT)
def test_bad_input_is_refused_with_a_message_naming_the_field(
    build: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        build()


def test_compaction_bounds_the_grid_at_exactly_max_buckets_and_sums_buckets_of_one_cell() -> None:
    # a window of exactly MAX_BUCKETS cells is allowed (one cell more is not)
    assert compact_ledger(Ledger(), now=0, window=H, max_entries=1, bucket_width=H // 100_000) == Ledger()
    with pytest.raises(IntervalError):
        compact_ledger(Ledger(), now=0, window=H + 1, max_entries=1, bucket_width=H // 100_000)
    # two buckets of one cell (two ledgers merged by hand, say) become one holding both: usage and peak add up
    cell = {"start": 0, "end": 100}
    twice = Ledger(buckets=(LedgerBucket(**cell, gpu_micros=F(30), peak_gpus=F(1), late_gpu_micros=F(10)),
                            LedgerBucket(**cell, gpu_micros=F(50), peak_gpus=F(2), late_gpu_micros=F(20))))
    assert compact_ledger(twice, now=200, window=1000, max_entries=5, bucket_width=100).buckets == (
        LedgerBucket(**cell, gpu_micros=F(80), peak_gpus=F(3), late_gpu_micros=F(30)),)
    # entries merged into a cell that already holds a bucket add their late part to the bucket's; an entry of
    # zero GPUs merges into nothing (no empty bucket)
    merged = compact_ledger(Ledger(entries=(LedgerEntry(uid="p", start=20, end=60, gpus=F(2), late=5),
                                            le("idle", 110, 150, 0)), buckets=twice.buckets[:1]),
                            now=200, window=1000, max_entries=0, bucket_width=100)
    assert merged == Ledger(buckets=(
        LedgerBucket(**cell, gpu_micros=F(30 + 80), peak_gpus=F(1 + 2), late_gpu_micros=F(10 + 2 * 5)),))
    # an entry ending exactly at the window's trailing edge has left it for good: dropped, not kept
    edge = Ledger(entries=(le("gone", 0, 200), le("in", 0, 201)))
    assert compact_ledger(edge, now=1200, window=1000, max_entries=5, bucket_width=100).entries == (le("in", 0, 201),)


def test_the_error_bound_counts_each_bucket_the_trailing_edge_is_inside_and_only_before_the_edge() -> None:
    fine = LedgerBucket(start=100, end=200, gpu_micros=F(150), peak_gpus=F(3))  # 3 GPUs at most, 150 in all
    coarse = LedgerBucket(start=0, end=300, gpu_micros=F(40), peak_gpus=F(1))
    ledger = Ledger(buckets=(fine, coarse))
    # edge 120 (now 1120, window 1000): fine held at most 3 x 20 before it, coarse at most 1 x 120 of its 40
    assert compaction_error_bound(ledger, now=1120, window=1000) == F(60 + 40, H)
    # edge 150: fine's bound is its whole 150 (3 x 50 = 150), coarse still 40
    assert compaction_error_bound(ledger, now=1150, window=1000) == F(150 + 40, H)
    # edge at fine's end: fine no longer counts at all, so it over-counts nothing
    assert compaction_error_bound(ledger, now=1200, window=1000) == F(40, H)
    # edge at fine's start: it counts whole and all of it is inside the window: exact
    assert compaction_error_bound(Ledger(buckets=(fine,)), now=1100, window=1000) == 0


def test_record_keeps_buckets_and_orders_entries_by_start_then_uid() -> None:
    bucket = LedgerBucket(start=0, end=100, gpu_micros=F(50), peak_gpus=F(1))
    ledger = Ledger(entries=(le("b", 200, 300),), buckets=(bucket,))
    ledger = record(record(record(ledger, le("c", 150, 400)), le("a", 200, 250)), le("z", 100, 110))
    assert ledger.buckets == (bucket,)
    assert [e.uid for e in ledger.entries] == ["z", "c", "a", "b"]


def test_dedup_ties_go_to_the_earlier_start_then_the_larger_gpu_count() -> None:
    assert record(record(Ledger(), le("p", 5, 50)), le("p", 0, 50)).entries == (le("p", 0, 50),)
    assert record(record(Ledger(), le("p", 0, 50)), le("p", 5, 50)).entries == (le("p", 0, 50),)
    assert record(record(Ledger(), le("p", 0, 50, 2)), le("p", 0, 50, 1)).entries == (le("p", 0, 50, 2),)
    assert counted_intervals([iv("p", 5, 50)], [le("p", 0, 50)]) == (iv("p", 5, 50),)  # equal ends: live wins


# ---------------------------------------------------------------------------------------------------- properties

T_MAX = 5_000
INSTANTS = st.integers(0, T_MAX)
GPUS = st.sampled_from([F(0), F(1, 10), F(1, 2), F(1), F(2), F(7, 3)])
WINDOWS = st.integers(1, 3_000)


@st.composite
def spans(draw: st.DrawFn, uid: str, *, open_ok: bool = True) -> tuple[int, int | None, Fraction]:
    start = draw(INSTANTS)
    end = None if open_ok and draw(st.booleans()) else start + draw(st.integers(0, 2_000))
    return start, end, draw(GPUS)


@st.composite
def live_lists(draw: st.DrawFn, prefix: str = "l", max_size: int = 6, open_ok: bool = True) -> list[Interval]:
    n = draw(st.integers(0, max_size))
    return [iv(f"{prefix}{i}", *draw(spans(f"{prefix}{i}", open_ok=open_ok))) for i in range(n)]


@st.composite
def ledgers(draw: st.DrawFn, prefix: str = "d", max_size: int = 6, min_size: int = 0) -> list[LedgerEntry]:
    n = draw(st.integers(min_size, max_size))
    out = []
    for i in range(n):
        start, end, gpus = draw(spans(f"{prefix}{i}", open_ok=False))
        assert end is not None
        out.append(le(f"{prefix}{i}", start, end, gpus))
    return out


@settings(max_examples=200, deadline=None)
@given(a=live_lists("a"), b=live_lists("b"), now=INSTANTS, window=WINDOWS)
def test_additive_over_disjoint_sets(a: list[Interval], b: list[Interval], now: int, window: int) -> None:
    both = gpu_hours(a + b, now=now, window=window)
    assert both == gpu_hours(a, now=now, window=window) + gpu_hours(b, now=now, window=window)


@settings(max_examples=200, deadline=None)
@given(span=spans("x"), cut=st.integers(0, 2_000), now=INSTANTS, window=WINDOWS)
def test_additive_when_an_interval_is_split(
    span: tuple[int, int | None, Fraction], cut: int, now: int, window: int
) -> None:
    start, end, gpus = span
    middle = start + cut if end is None else min(start + cut, end)
    whole = gpu_hours([iv("x", start, end, gpus)], now=now, window=window)
    parts = [iv("x1", start, middle, gpus), iv("x2", middle, end, gpus)]
    assert whole == gpu_hours(parts, now=now, window=window)


@settings(max_examples=200, deadline=None)
@given(live=live_lists(), now=INSTANTS, w1=WINDOWS, w2=WINDOWS)
def test_monotone_in_window(live: list[Interval], now: int, w1: int, w2: int) -> None:
    small, large = sorted((w1, w2))
    assert gpu_hours(live, now=now, window=small) <= gpu_hours(live, now=now, window=large)


@settings(max_examples=200, deadline=None)
@given(live=live_lists(), t1=INSTANTS, t2=INSTANTS)
def test_monotone_in_time_while_nothing_leaves_the_window(live: list[Interval], t1: int, t2: int) -> None:
    early, late = sorted((t1, t2))
    window = late + 1  # the trailing edge stays before every start
    assert gpu_hours(live, now=early, window=window) <= gpu_hours(live, now=late, window=window)


@settings(max_examples=200, deadline=None)
@given(closed=live_lists(open_ok=False), window=WINDOWS)
def test_tiling_windows_sum_to_the_total_and_then_zero(closed: list[Interval], window: int) -> None:
    total = sum((i.gpus * (i.end - i.start) for i in closed if i.end is not None), F(0)) / H
    last_end = max((i.end for i in closed if i.end is not None), default=0)
    tiles = range(1, last_end // window + 2)  # windows [(k-1)W, kW) cover [0, last_end)
    assert sum((gpu_hours(closed, now=k * window, window=window) for k in tiles), F(0)) == total
    assert gpu_hours(closed, now=last_end + window, window=window) == 0


@settings(max_examples=200, deadline=None)
@given(live=live_lists(), now=INSTANTS, window=WINDOWS)
def test_zero_for_future_empty_or_gpu_less(live: list[Interval], now: int, window: int) -> None:
    futures = [iv(i.uid, now + i.start, None if i.end is None else now + i.end, i.gpus) for i in live]
    empties = [iv(i.uid, i.start, i.start, i.gpus) for i in live]
    gpu_less = [iv(i.uid, i.start, i.end, 0) for i in live]
    for case in (futures, empties, gpu_less):
        assert gpu_hours(case, now=now, window=window) == 0


@settings(max_examples=200, deadline=None)
@given(
    pods=live_lists("p", max_size=8),
    where=st.lists(st.sampled_from(["live", "ledger", "both", "both-open"]), min_size=8, max_size=8),
    now=INSTANTS,
    window=WINDOWS,
)
def test_live_and_ledger_never_double_count(pods: list[Interval], where: list[str], now: int, window: int) -> None:
    live: list[Interval] = []
    ledger: list[LedgerEntry] = []
    expected = F(0)
    for pod, place in zip(pods, where, strict=False):
        end = pod.end if pod.end is not None else pod.start + 100
        closed = iv(pod.uid, pod.start, end, pod.gpus)
        if place in ("live", "both"):
            live.append(closed)
        if place in ("ledger", "both", "both-open"):
            ledger.append(le(pod.uid, pod.start, end, pod.gpus))
        if place == "both-open":  # still terminating in the API while already recorded
            live.append(iv(pod.uid, pod.start, None, pod.gpus))
            expected += gpu_hours([iv(pod.uid, pod.start, None, pod.gpus)], now=now, window=window)
        else:
            expected += gpu_hours([closed], now=now, window=window)
    usage = window_usage(live, Ledger(entries=tuple(ledger)), now=now, window=window, quota=1)
    assert usage.consumed == expected
    assert len(counted_intervals(live, ledger)) == len({p.uid for p in live} | {e.uid for e in ledger})


@settings(max_examples=150, deadline=None)
@given(
    entries=ledgers(max_size=12),
    window=WINDOWS,
    width=st.integers(1, 800),
    keep=st.integers(0, 4),
    later=st.lists(st.integers(0, 6_000), min_size=1, max_size=6),
    live_uids=st.sets(st.sampled_from([f"d{i}" for i in range(12)]), max_size=3),
)
def test_compaction_error_bound_holds(
    entries: list[LedgerEntry], window: int, width: int, keep: int, later: list[int], live_uids: set[str]
) -> None:
    now = max((e.end for e in entries), default=0) + 10  # everything finished: all eligible
    ledger = Ledger(entries=tuple(entries))
    small = compact_ledger(ledger, now=now, window=window, max_entries=keep, bucket_width=width, live_uids=live_uids)
    assert len(small.entries) <= max(keep, len([e for e in entries if e.uid in live_uids]))
    assert len(small.buckets) <= -(-window // width) + 1
    peak = max((b.peak_gpus for b in small.buckets), default=F(0))
    for dt in [0, *later]:
        t = now + dt
        exact = window_usage([], ledger, now=t, window=window, quota=1).consumed
        approx = window_usage([], small, now=t, window=window, quota=1)
        assert exact <= approx.consumed <= exact + approx.error_bound
        assert approx.error_bound <= peak * width / H
    # compacting again is stable under the same parameters
    again = compact_ledger(small, now=now, window=window, max_entries=keep, bucket_width=width, live_uids=live_uids)
    assert again == small


def _with_late(record: _R, late: int) -> _R:
    return record if record.end is None else msgspec.structs.replace(record, late=min(late, record.end - record.start))


def by_record(live: list[Interval], ledger: Ledger, *, now: int, window: int) -> Fraction:
    """The usage the records' own ends give: every winner of the dedup rule without its late part."""
    return gpu_hours([i if i.end is None else iv(i.uid, i.start, i.end - i.late, i.gpus)
                      for i in counted_intervals(live, ledger)], now=now, window=window)


@settings(max_examples=200, deadline=None)
@given(
    entries=ledgers(max_size=12),
    live=live_lists("d", max_size=4),
    lates=st.lists(st.integers(0, 400), min_size=16, max_size=16),
    window=WINDOWS,
    width=st.integers(1, 800),
    keep=st.integers(0, 4),
    later=st.lists(st.integers(0, 6_000), min_size=1, max_size=4),
)
def test_consumed_less_the_error_bound_never_exceeds_the_usage_by_the_records(
    entries: list[LedgerEntry], live: list[Interval], lates: list[int], window: int, width: int, keep: int,
    later: list[int],
) -> None:
    """Late parts (counted past a recorded end so a reported figure is not taken back) and compaction both
    over-count; the error bound names all of it, before and after compaction, at every later instant."""
    entries = [_with_late(e, n) for e, n in zip(entries, lates, strict=False)]
    live = [_with_late(i, n) for i, n in zip(live, lates[::-1], strict=False)]
    now = max((e.end for e in entries), default=0) + 10
    ledger = Ledger(entries=tuple(entries))
    small = compact_ledger(ledger, now=now, window=window, max_entries=keep, bucket_width=width,
                           live_uids={i.uid for i in live})
    late_total = sum((b.late_gpu_micros for b in small.buckets), F(0))
    merged_uids = {e.uid for e in entries} - {e.uid for e in small.entries}
    assert late_total <= sum((e.gpus * e.late for e in entries if e.uid in merged_uids), F(0))
    for t in (now + dt for dt in [0, *later]):
        truth = by_record(live, ledger, now=t, window=window)
        for book in (ledger, small):
            usage = window_usage(live, book, now=t, window=window, quota=1)
            assert usage.consumed - usage.error_bound <= truth <= usage.consumed
        exact = window_usage(live, ledger, now=t, window=window, quota=1)
        assert exact.error_bound == late_error_bound(counted_intervals(live, ledger), now=t, window=window)


def test_a_bucket_late_part_counts_only_while_the_bucket_overlaps_the_window() -> None:
    """[now - W, now) is the window: a bucket ending at its trailing edge, or starting at now, is outside it."""
    def late(start: int, end: int) -> Ledger:
        return Ledger(buckets=(LedgerBucket(start=start, end=end, gpu_micros=F(20), peak_gpus=F(1),
                                            late_gpu_micros=F(10)),))

    assert compaction_error_bound(late(0, 100), now=1100, window=1000) == 0  # ends at the edge
    assert compaction_error_bound(late(1100, 1200), now=1100, window=1000) == 0  # starts at now
    assert compaction_error_bound(late(0, 50), now=2000, window=1000) == 0  # long gone
    assert compaction_error_bound(late(1000, 1050), now=1100, window=1000) == F(10, H)  # inside: its late part
    assert compaction_error_bound(late(1090, 1120), now=1100, window=1000) == F(10, H)  # overlaps now


def test_a_late_part_is_named_by_the_error_bound_while_in_the_window_and_carried_into_its_bucket() -> None:
    late = LedgerEntry(uid="p", start=0, end=300, gpus=F(2), late=100)  # recorded end 200, counted through 300
    usage = window_usage([], Ledger(entries=(late,)), now=1000, window=1000, quota=1)
    assert (usage.consumed, usage.error_bound) == (F(600, H), F(200, H))
    assert window_usage([], Ledger(entries=(late,)), now=1250, window=1000, quota=1).error_bound == F(100, H)
    assert window_usage([], Ledger(entries=(late,)), now=1300, window=1000, quota=1).error_bound == 0
    small = compact_ledger(Ledger(entries=(late,)), now=1000, window=1000, max_entries=0, bucket_width=250)
    assert [(b.start, b.gpu_micros, b.late_gpu_micros) for b in small.buckets] == [(0, 500, 100), (250, 100, 100)]
    # while the trailing edge is inside the first bucket, it over-counts what it held before the edge and its
    # late part; the second bucket counts its late part whole
    assert compaction_error_bound(small, now=1100, window=1000) == F(min(500, 100 + 2 * 100) + 100, H)
    with pytest.raises(IntervalError, match="late must be 0"):
        Interval(uid="r", start=0, end=None, gpus=F(1), late=1)
    with pytest.raises(IntervalError, match=r"late must be within \[0, end - start\]"):
        LedgerEntry(uid="r", start=0, end=10, gpus=F(1), late=11)
    with pytest.raises(AccountingError, match="late_gpu_micros 11 above its gpu_micros 10"):
        LedgerBucket(start=0, end=10, gpu_micros=F(10), peak_gpus=F(1), late_gpu_micros=F(11))


def phases(records: tuple[Interval, ...], buckets: tuple[LedgerBucket, ...], t: int, w: int) -> tuple[bool, ...]:
    """Where the window edges are relative to every record's boundaries (what "window membership" means)."""
    out: list[bool] = []
    for r in records:
        if r.gpus == 0 or r.end == r.start:
            continue
        out += [t >= r.start, t >= r.start + w]
        if r.end is not None:
            out += [t >= r.end, t >= r.end + w]
    for b in buckets:
        if b.gpu_micros:
            out += [t > b.start, t >= b.end + w]
    return tuple(out)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Interval], Ledger, int, int, Fraction]:
    live = draw(live_lists("l", max_size=5))
    entries = draw(ledgers("d", max_size=5, min_size=draw(st.integers(0, 2))))
    window = draw(WINDOWS)
    ledger = Ledger(entries=tuple(entries))
    if draw(st.integers(0, 2)) and entries:
        cut = max(e.end for e in entries)
        ledger = compact_ledger(ledger, now=cut, window=window, max_entries=1, bucket_width=draw(st.integers(1, 500)))
        now = cut + draw(st.integers(0, 3_000))
    else:
        now = draw(INSTANTS)
    if draw(st.booleans()):  # near the current value, so that over-quota flips soon in either direction
        current = window_usage(live, ledger, now=now, window=window, quota=0).consumed
        quota = max(F(0), current + F(draw(st.integers(-300, 300)), H) * draw(st.sampled_from([F(1), F(1, 3)])))
    else:
        quota = F(draw(st.integers(0, 6_000)), H) * draw(st.sampled_from([F(1), F(1, 3), F(5, 2)]))
    return live, ledger, now, window, quota


@settings(max_examples=200, deadline=None)
@given(scenario=scenarios(), probes=st.lists(st.floats(0, 1, exclude_max=True), max_size=8))
def test_next_change_is_exact(scenario: tuple[list[Interval], Ledger, int, int, Fraction], probes: list[float]) -> None:
    live, ledger, now, window, quota = scenario
    usage = window_usage(live, ledger, now=now, window=window, quota=quota)
    records = counted_intervals(live, ledger)

    def at(t: int) -> tuple[bool, tuple[bool, ...], Fraction]:
        u = window_usage(live, ledger, now=t, window=window, quota=quota)
        return u.over_quota, phases(records, ledger.buckets, t, window), u.consumed

    over0, phase0, value0 = at(now)
    end = usage.next_change
    horizon = end if end is not None else now + 4 * T_MAX + 2 * window
    step = at(now + 1)[2] - value0 if horizon > now + 1 else F(0)
    for t in {now, now + 1, horizon - 1, *(now + int(p * (horizon - now)) for p in probes)}:
        if now <= t < horizon:
            over, phase, value = at(t)
            assert (over, phase) == (over0, phase0)  # nothing changes strictly before next_change
            assert value == value0 + step * (t - now)  # only the affine accrual of the value itself
    if end is not None:
        assert end > now
        over, phase, _ = at(end)
        assert over != over0 or phase != phase0  # and something does change at it


@settings(max_examples=200, deadline=None)
@given(scenario=scenarios(), probes=st.lists(st.floats(0, 1, exclude_max=True), max_size=6))
def test_exhaustion_instant_is_the_first_over_quota_microsecond(
    scenario: tuple[list[Interval], Ledger, int, int, Fraction], probes: list[float]
) -> None:
    live, ledger, now, window, quota = scenario
    usage = window_usage(live, ledger, now=now, window=window, quota=quota)

    def over(t: int) -> bool:
        return window_usage(live, ledger, now=t, window=window, quota=quota).over_quota

    if usage.over_quota:
        assert usage.exhausted_at is None
        return
    if usage.exhausted_at is not None:
        hit = usage.exhausted_at
        assert hit > now and over(hit) and not over(hit - 1)
        assert usage.next_change is not None and usage.next_change <= hit
        assert not any(over(now + int(p * (hit - now))) for p in probes)
    else:
        far = now + 4 * T_MAX + 2 * window  # past every breakpoint: the value is constant from there on
        assert not any(over(now + int(p * (far - now))) for p in [*probes, 0.999999])
        assert not over(far)


@settings(max_examples=100, deadline=None)
@given(scenario=scenarios())
def test_burn_rate_and_consistency(scenario: tuple[list[Interval], Ledger, int, int, Fraction]) -> None:
    live, ledger, now, window, quota = scenario
    usage = window_usage(live, ledger, now=now, window=window, quota=quota)
    records = counted_intervals(live, ledger)
    running = sum((r.gpus for r in records if r.start <= now and (r.end is None or now < r.end)), F(0))
    assert usage.burn_rate == running
    assert usage.remaining == max(F(0), quota - usage.consumed)
    assert usage.over_quota == (usage.consumed >= quota)
    assert usage.consumed >= 0 and usage.error_bound >= 0
    assume(not ledger.buckets)
    assert usage.consumed == gpu_hours(records, now=now, window=window)


GRID = st.integers(0, 50).map(lambda k: k * 100)  # instants on a coarse grid: records share breakpoints


@st.composite
def edge_scenarios(draw: st.DrawFn) -> tuple[list[Interval], Ledger, int, int, Fraction, list[int]]:
    """Scenarios at the edges the exhaustion walk must get exactly right: records sharing breakpoints, `now`
    on a breakpoint (or one microsecond off), a quota equal to the usage at a later breakpoint. Also returns
    every breakpoint (where the slope or a bucket's contribution changes)."""
    live = []
    for i in range(draw(st.integers(0, 4))):
        start = draw(GRID)
        end = None if draw(st.booleans()) else start + draw(GRID)
        live.append(iv(f"l{i}", start, end, draw(GPUS)))
    entries = [le(f"d{i}", s, s + draw(GRID), draw(GPUS)) for i, s in enumerate(draw(st.lists(GRID, max_size=4)))]
    window = draw(st.integers(1, 30)) * 100
    ledger = Ledger(entries=tuple(entries))
    if entries and draw(st.booleans()):
        cut = max(e.end for e in entries)
        ledger = compact_ledger(ledger, now=cut, window=window, max_entries=draw(st.integers(0, 1)),
                                bucket_width=draw(st.sampled_from([100, 300, 1000])))
    points = {t for r in counted_intervals(live, ledger) for t in (r.start, r.start + window,
                                                                  *(() if r.end is None else (r.end, r.end + window)))}
    points |= {t for b in ledger.buckets for t in (b.start + 1, b.end + window)}
    floor = max((b.end for b in ledger.buckets), default=0)  # compaction assumed time moves on from its instant
    now = max(floor, draw(st.sampled_from(sorted(points))) if points else 0) + draw(st.sampled_from([0, 0, 1, -1]))
    now = max(now, floor)
    def value(t: int) -> Fraction:
        return window_usage(live, ledger, now=t, window=window, quota=0).consumed

    current = value(now)
    higher = [v for t in points if t > now and (v := value(t)) > current]  # reached later, not yet
    if higher and draw(st.integers(0, 3)):
        quota = draw(st.sampled_from(higher))
    else:
        quota = max(F(0), current + F(draw(st.integers(-100, 3_000)), H))
    return live, ledger, now, window, quota, sorted(points)


_LEAVING = Ledger(buckets=(LedgerBucket(start=0, end=100, gpu_micros=F(100), peak_gpus=F(1)),))


@settings(max_examples=300, deadline=None)
@given(scenario=edge_scenarios())
# a bucket leaves the window (t = 1100) before an open pod brings the usage to the quota (t = 1200)
@example(scenario=([iv("o", 500, None)], _LEAVING, 600, 1000, F(700, H), [1, 500, 1100, 1500]))
# the same with the quota reached exactly as the bucket leaves, and a second pod starting there too
@example(scenario=([iv("o", 500, None), iv("p", 1100, None)], _LEAVING, 600, 1000, F(600, H),
                   [1, 500, 1100, 1500, 2100]))
# a pod ending exactly now: its end is no change to come
@example(scenario=([iv("a", 0, 100)], Ledger(), 100, 1000, F(1, H), [0, 100, 1000, 1100]))
# two buckets of different grids leave together (t = 1300): both leave
@example(scenario=([iv("o", 500, None, 2)], Ledger(buckets=(
    LedgerBucket(start=200, end=300, gpu_micros=F(100), peak_gpus=F(1)),
    LedgerBucket(start=0, end=300, gpu_micros=F(300), peak_gpus=F(1)))), 600, 1000, F(1999, H),
    [201, 500, 1300, 1500]))
def test_exhaustion_instant_is_exact_at_shared_breakpoints_and_quota_equalities(
    scenario: tuple[list[Interval], Ledger, int, int, Fraction, list[int]],
) -> None:
    """Between breakpoints the usage is affine, so it first reaches the quota at a breakpoint or at the one
    instant inside a rising piece `exhausted_at` computes: checking every breakpoint before it (and the instant
    before it) checks it is the first; None means no later instant is over quota."""
    live, ledger, now, window, quota, points = scenario
    usage = window_usage(live, ledger, now=now, window=window, quota=quota)

    def over(t: int) -> bool:
        return window_usage(live, ledger, now=t, window=window, quota=quota).over_quota

    event(f"buckets={bool(ledger.buckets)} over={usage.over_quota} hit={usage.exhausted_at is not None}")
    assert usage.over_quota == over(now)
    # next_change: after now, and no breakpoint of a record that counts lies before it
    counting = [r for r in counted_intervals(live, ledger) if r.gpus and r.end != r.start]
    changes = {t for r in counting
               for t in (r.start, r.start + window, *(() if r.end is None else (r.end, r.end + window)))}
    changes |= {t for b in ledger.buckets if b.gpu_micros for t in (b.start + 1, b.end + window)}
    if usage.next_change is not None:
        assert usage.next_change > now
        assert not any(now < t < usage.next_change for t in changes), (usage.next_change, sorted(changes))
    if usage.over_quota:
        assert usage.exhausted_at is None
        return
    hit = usage.exhausted_at
    if hit is None:
        assert not any(over(t) for t in points if t > now)
        assert not over(max([now, *points]) + 1)
        return
    assert hit > now and over(hit) and not over(hit - 1)
    assert not any(over(t) for t in points if now < t < hit)


@st.composite
def drain_scenarios(draw: st.DrawFn) -> tuple[list[Interval], Ledger, int, int, Fraction, list[int]]:
    """The edge scenarios with a level the usage may fall to: a value it takes at a later breakpoint (often
    lower: old usage leaves), or the current usage minus up to a GPU-hour, or a level below zero."""
    live, ledger, now, window, _, points = draw(edge_scenarios())

    def value(t: int) -> Fraction:
        return window_usage(live, ledger, now=t, window=window, quota=0).consumed

    later = [value(t) for t in points if t > now]
    choice = draw(st.integers(0, 3))
    if later and choice < 2:
        level = draw(st.sampled_from(later))
    elif choice == 2:
        level = value(now) - F(draw(st.integers(0, 3_000)), H)
    else:
        level = F(-1, H)
    return live, ledger, now, window, level, points


@settings(max_examples=300, deadline=None)
@given(scenario=drain_scenarios())
# a bucket leaving (t = 1100) is what brings the usage down to the level, while an open pod keeps it rising
@example(scenario=([iv("o", 500, None)], _LEAVING, 600, 1000, F(500, H), [1, 500, 1100, 1500]))
# a pod that ended: its usage slides out between end + W... start + W, so the level is met inside that piece
@example(scenario=([iv("a", 0, 100, 2)], Ledger(), 500, 1000, F(50, H), [0, 100, 1000, 1100]))
def test_first_instant_at_or_below_a_level_is_exact(
    scenario: tuple[list[Interval], Ledger, int, int, Fraction, list[int]],
) -> None:
    """The usage is affine between breakpoints, so checking the answer, the microsecond before it and every
    breakpoint in between checks that it is the first instant at or below the level; None means no breakpoint
    after now (and no instant past the last) gets there."""
    live, ledger, now, window, level, points = scenario

    def below(t: int) -> bool:
        return window_usage(live, ledger, now=t, window=window, quota=0).consumed <= level

    hit = first_at_or_below(live, ledger, now=now, window=window, level=level)
    event(f"hit={'now' if hit == now else hit is not None} level<0={level < 0}")
    if hit is None:
        assert not below(now) and not any(below(t) for t in points if t > now)
        assert not below(max([now, *points]) + window + 1)
        return
    assert hit >= now and below(hit)
    assert hit == now or not below(hit - 1)
    assert not any(below(t) for t in points if now <= t < hit)

"""GPU-hours in a calendar period: usage from the period's first instant, never sliding out before its end.

The oracle is a direct sum written here from the definition (each counted record's GPUs times its overlap with
`[start, t)`), and evaluating the answer at every instant it makes a claim about: `exhausted_at` is the first
over-quota microsecond, nothing changes before `next_change`.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.errors import IntervalError
from gpuops.accounting.gpuhours import (
    MICROS_PER_HOUR,
    Interval,
    Ledger,
    LedgerBucket,
    LedgerEntry,
    compact_ledger,
    counted_intervals,
    period_usage,
)

F = Fraction
H = MICROS_PER_HOUR
GPUS = st.sampled_from([F(0), F(1, 10), F(1, 2), F(1), F(2), F(7, 3)])
START, END = 1_000, 6_000
"""The period [START, END); records start anywhere from 0 (before the period) to past its end."""


@st.composite
def records(draw: st.DrawFn) -> tuple[list[Interval], Ledger]:
    live, entries = [], []
    for i in range(draw(st.integers(0, 5))):
        start = draw(st.integers(0, 7_000))
        end = None if draw(st.booleans()) else start + draw(st.integers(0, 3_000))
        live.append(Interval(uid=f"l{i}", start=start, end=end, gpus=draw(GPUS)))
    for i in range(draw(st.integers(0, 4))):
        start = draw(st.integers(0, 5_000))
        entries.append(LedgerEntry(uid=f"d{i}", start=start, end=start + draw(st.integers(0, 2_000)),
                                   gpus=draw(GPUS)))
    return live, Ledger(entries=tuple(entries))


def direct(live: list[Interval], ledger: Ledger, t: int) -> Fraction:
    """GPU-hours in [START, t) by the definition: every counted record's GPUs times its overlap."""
    total = F(0)
    for r in counted_intervals(live, ledger):
        hi = t if r.end is None else min(r.end, t)
        total += r.gpus * max(0, hi - max(r.start, START))
    return total / H


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Interval], Ledger, int, Fraction]:
    live, ledger = draw(records())
    now = draw(st.integers(START, END - 1))
    if draw(st.booleans()):  # near the current value: over-quota comes soon, or has just come
        quota = max(F(0), direct(live, ledger, now) + F(draw(st.integers(-300, 3_000)), H))
    else:
        quota = F(draw(st.integers(0, 9_000)), H) * draw(st.sampled_from([F(1), F(1, 3)]))
    return live, ledger, now, quota


def usage(live: list[Interval], ledger: Ledger, t: int, quota: Fraction) -> tuple[Fraction, bool]:
    u = period_usage(live, ledger, now=t, start=START, end=END, quota=quota)
    return u.consumed, u.over_quota


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.lists(st.integers(START, END - 1), max_size=6))
def test_consumption_is_the_direct_sum_from_the_period_start_and_never_falls(
        scenario: tuple[list[Interval], Ledger, int, Fraction], later: list[int]) -> None:
    live, ledger, now, quota = scenario
    u = period_usage(live, ledger, now=now, start=START, end=END, quota=quota)
    assert u.consumed == direct(live, ledger, now)
    assert u.over_quota == (u.consumed >= quota) and u.remaining == max(F(0), quota - u.consumed)
    running = [r for r in counted_intervals(live, ledger) if r.start <= now and (r.end is None or now < r.end)]
    assert u.burn_rate == sum((r.gpus for r in running), F(0))
    for t in later:
        if t >= now:
            assert usage(live, ledger, t, quota)[0] >= u.consumed  # nothing slides out before the period ends


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.lists(st.floats(0, 1, exclude_max=True), max_size=6))
def test_exhaustion_is_the_first_over_quota_microsecond_before_the_period_ends(
        scenario: tuple[list[Interval], Ledger, int, Fraction], probes: list[float]) -> None:
    live, ledger, now, quota = scenario
    u = period_usage(live, ledger, now=now, start=START, end=END, quota=quota)
    if u.over_quota:
        assert u.exhausted_at is None
        return
    hit = u.exhausted_at
    if hit is None:
        assert not usage(live, ledger, END - 1, quota)[1]  # consumption only grows: never over in this period
        return
    assert now < hit < END and usage(live, ledger, hit, quota)[1] and not usage(live, ledger, hit - 1, quota)[1]
    assert u.next_change is not None and u.next_change <= hit
    assert not any(usage(live, ledger, now + int(p * (hit - now)), quota)[1] for p in probes)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.lists(st.floats(0, 1, exclude_max=True), max_size=8))
def test_nothing_but_the_accrual_changes_before_next_change_and_the_period_end_is_one(
        scenario: tuple[list[Interval], Ledger, int, Fraction], probes: list[float]) -> None:
    live, ledger, now, quota = scenario
    u = period_usage(live, ledger, now=now, start=START, end=END, quota=quota)
    change = u.next_change
    assert change is not None and now < change <= END
    rate = u.burn_rate / H
    for t in {now, change - 1, *(now + int(p * (change - now)) for p in probes)}:
        consumed, over = usage(live, ledger, t, quota)
        assert over == u.over_quota and consumed == u.consumed + rate * (t - now)
    if change < END:  # at it the flag flips, the value jumps (a bucket enters) or the slope changes
        then = period_usage(live, ledger, now=change, start=START, end=END, quota=quota)
        assert (then.over_quota, then.consumed, then.burn_rate) != (u.over_quota, u.consumed + rate * (change - now),
                                                                    u.burn_rate)


@settings(max_examples=200, deadline=None)
@given(records(), st.integers(1, 400), st.integers(START, END - 1))
def test_compacted_buckets_count_whole_and_the_error_bound_covers_them(
        recs: tuple[list[Interval], Ledger], width: int, now: int) -> None:
    live, ledger = recs
    cut = max((e.end for e in ledger.entries), default=START)
    if cut > now:
        return
    compacted = compact_ledger(ledger, now=cut, window=max(0, cut - START), max_entries=0, bucket_width=width)
    exact = period_usage(live, ledger, now=now, start=START, end=END, quota=1)
    u = period_usage(live, compacted, now=now, start=START, end=END, quota=1)
    assert u.consumed - u.error_bound <= exact.consumed <= u.consumed


def test_at_the_first_instant_nothing_is_counted_yet_and_the_running_pods_burn() -> None:
    live = [Interval(uid="a", start=0, end=None, gpus=F(2)), Interval(uid="b", start=START + 10, end=None, gpus=F(1))]
    u = period_usage(live, now=START, start=START, end=END, quota=F(1, H))
    assert (u.consumed, u.burn_rate, u.pods_in_window) == (0, 2, 0)
    assert u.exhausted_at == START + 1  # 2 GPUs reach 1 GPU-microsecond... in half a microsecond, so at the next
    assert u.next_change == START + 1


def test_a_bucket_entering_later_jumps_the_consumption_and_can_exhaust_the_quota() -> None:
    """Buckets hold merged past usage, so one starting after `now` is rare (a clock that went back), but the
    answer must still be exact: it counts whole from its start's next microsecond."""
    bucket = LedgerBucket(start=START + 100, end=START + 200, gpu_micros=F(H), peak_gpus=F(H))
    u = period_usage([], Ledger(buckets=(bucket,)), now=START + 50, start=START, end=END, quota=F(1))
    assert (u.consumed, u.exhausted_at, u.next_change) == (0, START + 101, START + 101)


def test_the_period_end_resets_and_is_announced() -> None:
    u = period_usage([Interval(uid="a", start=0, end=None, gpus=F(1))], now=END - 10, start=START, end=END,
                     quota=F(1))
    assert u.over_quota is False and u.exhausted_at is None and u.next_change == END


@pytest.mark.parametrize("now", [START - 1, END])
def test_an_instant_outside_the_period_is_refused(now: int) -> None:
    with pytest.raises(IntervalError, match=r"now must lie in the period \[start, end\)"):
        period_usage([], now=now, start=START, end=END, quota=1)

"""One figure per instant: counting instants are whole seconds, the same second gives the same figure, and a
reported amount is never taken back when a pod's truncated finishedAt arrives (monotone through a pod's life,
also when the view of the pods lags, also for a pod stopped within the second it started)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import MICROS_PER_HOUR, Interval, Ledger, LedgerEntry, gpu_hours, window_usage
from gpuops.accounting.reporting import (
    RESOLUTION,
    counted_through,
    counting_instant,
    next_counting_instant,
    reported_usage,
    settle,
    settle_end,
)

S = 1_000_000
H = MICROS_PER_HOUR
F = Fraction

instants = st.integers(min_value=-10**15, max_value=10**15)


# ------------------------------------------------------------------------------------------ counting instants


@given(instants)
def test_the_counting_instant_is_the_whole_second_at_or_before_now(now: int) -> None:
    at = counting_instant(now)
    assert at % RESOLUTION == 0 and at <= now < at + RESOLUTION
    assert counting_instant(at) == at
    up = next_counting_instant(now)
    assert up % RESOLUTION == 0 and now <= up < now + RESOLUTION
    assert (up == now) == (at == now)


@given(instants, instants)
def test_counting_instants_are_monotone(a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    assert counting_instant(lo) <= counting_instant(hi)
    assert next_counting_instant(lo) <= next_counting_instant(hi)


def test_instants_must_be_ints_and_the_error_names_the_argument() -> None:
    for bad in (1.5, True, "1", None):
        with pytest.raises(AccountingError, match=r"^now must be an int instant in microseconds"):
            counting_instant(bad)  # type: ignore[arg-type]
        with pytest.raises(AccountingError, match=r"^at must be an int instant in microseconds"):
            next_counting_instant(bad)  # type: ignore[arg-type]
        for args, name in (((bad, 1), "start"), ((1, bad), "end"), ((1, 2, bad), "counted")):
            if bad is None and name == "counted":
                continue  # counted None: nothing was reported yet
            with pytest.raises(AccountingError, match=rf"^{name} must be an int instant in microseconds"):
                settle_end(*args)  # type: ignore[arg-type]
        with pytest.raises(AccountingError, match=r"^at must be an int instant"):
            counted_through([], at=bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ one figure per second

gpus = st.fractions(min_value=0, max_value=8, max_denominator=4)


@st.composite
def intervals(draw: st.DrawFn, n: int = 6) -> list[Interval]:
    out = []
    for i in range(draw(st.integers(0, n))):
        start = draw(st.integers(0, 30 * S))
        end = draw(st.none() | st.integers(start, 40 * S))
        out.append(Interval(uid=f"u{i}", start=start, end=end, gpus=draw(gpus)))
    return out


@given(intervals(), st.integers(0, 60 * S), st.integers(0, RESOLUTION - 1),
       st.fractions(min_value=F(1, 3600), max_value=F(1, 20), max_denominator=3600))
def test_the_same_second_gives_the_same_figure_and_change_instants_are_whole_seconds(
    live: list[Interval], now: int, later: int, quota: Fraction,
) -> None:
    """Status, Events, the decision and a scrape asking within one second get one answer: that of the second."""
    window = H // 60  # one minute: intervals also leave the window within the range drawn
    usage = reported_usage(live, now=now, window=window, quota=quota)
    at = counting_instant(now)
    assert reported_usage(live, now=at + later, window=window, quota=quota) == usage
    exact = window_usage(live, now=at, window=window, quota=quota)
    assert (usage.consumed, usage.remaining, usage.over_quota, usage.burn_rate) == (
        exact.consumed, exact.remaining, exact.over_quota, exact.burn_rate)
    for instant in (usage.next_change, usage.exhausted_at):
        assert instant is None or (instant % RESOLUTION == 0 and instant > at)
    if usage.next_change is not None:
        # nothing in the answer changes before next_change, as every reader sees it (at counting instants)
        for t in range(at, usage.next_change, RESOLUTION):
            assert reported_usage(live, now=t, window=window, quota=quota).over_quota == usage.over_quota
    if usage.exhausted_at is not None:
        assert reported_usage(live, now=usage.exhausted_at, window=window, quota=quota).over_quota


# ------------------------------------------------------------------------------------------ no take-back


@given(intervals(), st.integers(0, 60 * S))
def test_counted_through_is_what_the_figure_at_that_instant_counted(live: list[Interval], at: int) -> None:
    at = counting_instant(at)
    counted = counted_through(live, at=at)
    assert set(counted) == {i.uid for i in live}
    for item in live:
        through = counted[item.uid]
        assert through <= at
        cut = Interval(uid=item.uid, start=item.start, end=max(item.start, through), gpus=item.gpus)
        assert gpu_hours([cut], now=at, window=H) == gpu_hours([item], now=at, window=H)


def test_counted_through_keeps_the_furthest_instant_a_uid_was_counted_and_refuses_other_records() -> None:
    """Two records of one pod (a live view and a ledger entry, say): the figure counted it through the later."""
    ends = (Interval(uid="p", start=0, end=9 * S, gpus=F(1)), Interval(uid="p", start=0, end=4 * S, gpus=F(1)))
    assert counted_through(ends, at=20 * S) == {"p": 9 * S}
    assert counted_through(ends[::-1], at=20 * S) == {"p": 9 * S}
    for call in (lambda: counted_through([object()], at=0), lambda: settle([object()], {})):  # type: ignore[list-item]
        with pytest.raises(AccountingError, match=r"^intervals must hold Interval values, got <object"):
            call()


@given(intervals(), st.dictionaries(st.sampled_from([f"u{i}" for i in range(8)]), st.integers(0, 60 * S)))
def test_settle_only_raises_finished_ends_to_what_was_counted(live: list[Interval], counted: dict[str, int]) -> None:
    settled = settle(live, counted)
    assert [i.uid for i in settled] == [i.uid for i in live]
    for before, after in zip(live, settled, strict=True):
        assert (after.start, after.gpus) == (before.start, before.gpus)
        if before.end is None:
            assert after.end is None
            continue
        assert after.end is not None and after.end >= before.end
        assert after.end == max(before.end, min(counted.get(before.uid, before.end), before.end + S))
        assert after.late == before.late + after.end - before.end  # what settling added is marked late
    if len({i.uid for i in live}) == len(live):  # settling the record again against its settled ends is stable
        assert settle(live, {a.uid: a.end for a in settled if a.end is not None}) == settled


def test_settle_end_keeps_an_end_after_its_start_and_checks_its_arguments() -> None:
    assert settle_end(5 * S, 3 * S) == 5 * S
    assert settle_end(5 * S, 7 * S, 6 * S) == 7 * S
    assert settle_end(5 * S, 5 * S, 6 * S) == 6 * S
    assert settle_end(5 * S, 5 * S, 9 * S) == 6 * S  # at most a second past the recorded end: its precision
    with pytest.raises(AccountingError):
        settle_end(0, 1.5)  # type: ignore[arg-type]
    with pytest.raises(AccountingError):
        settle([LedgerEntry(uid="u", start=0, end=1, gpus=F(1))], {})  # type: ignore[list-item]


# ------------------------------------------------------------------------------------------ a pod's life


@dataclass(frozen=True)
class Pod:
    """A pod as it really ran (microseconds); the API shows its timestamps in whole seconds."""

    uid: str
    start: int
    end: int | None
    gpus: Fraction

    def seen(self, view: int) -> Interval | None:
        """What a cache current up to instant `view` shows: nothing before it started, then an open interval
        from its truncated startedAt, then a finished one ending at its truncated finishedAt."""
        if view < self.start:
            return None
        started = self.start - self.start % S
        if self.end is None or view < self.end:
            return Interval(uid=self.uid, start=started, end=None, gpus=self.gpus)
        return Interval(uid=self.uid, start=started, end=self.end - self.end % S, gpus=self.gpus)


@st.composite
def pods(draw: st.DrawFn) -> list[Pod]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        start = draw(st.integers(0, 10 * S))
        # lengths down to 1 µs: pods stopped within the second they started are drawn often
        end = draw(st.none() | st.integers(start + 1, start + 3 * S))
        out.append(Pod(f"p{i}", start, end, F(draw(st.integers(1, 4)))))
    return out


@st.composite
def readings(draw: st.DrawFn, lagging: bool) -> list[tuple[int, int, bool]]:
    """(instant, view instant, is a scrape) in time order; the view never goes back, and lags only if asked."""
    out = []
    t = view = 0
    for _ in range(draw(st.integers(1, 25))):
        t += draw(st.integers(0, 700_000))
        lag = draw(st.integers(0, S - 1)) if lagging else 0
        view = max(view, t - lag)
        out.append((t, view, lagging and draw(st.booleans())))
    return out


def view_of(truth: list[Pod], view: int) -> list[Interval]:
    return [i for p in truth if (i := p.seen(view)) is not None]


WINDOW = H  # nothing leaves a one-hour window within the minute drawn
QUOTA = 10**6


@settings(max_examples=300)
@given(pods(), readings(lagging=True))
# scrapes alone for 1.2 s after the pod's finish: the finish must have woken a reconcile before
@example(truth=[Pod("p0", 0, 790_319, F(1))], reads=[(0, 0, False), (790_318, 790_318, False),
                                                     (1_232_950, 1_232_950, True), (2_000_000, 2_000_000, True),
                                                     (2_000_000, 2_000_000, False)])
def test_reported_usage_never_decreases_through_pods_lives_with_a_lagging_view(
    truth: list[Pod], reads: list[tuple[int, int, bool]],
) -> None:
    """A reporter that keeps its last figure's inputs (a reconcile's snapshot, extended by scrapes) and settles
    each new view against them: every figure it reports is at least the one before, although the view it
    reconciles from may show a finished pod running for up to a second more, then its finishedAt truncated to
    the second."""
    live: tuple[Interval, ...] = ()
    published: int | None = None
    seen = 0  # the view of the last reconcile
    figures = []
    for t, view, scrape in reads:
        # a pod's finish reaches the reconciler within a second (the lag drawn), and wakes a reconcile: a scrape
        # only extends the last snapshot while no finish has been pending for longer
        overdue = any(p.end is not None and seen < p.end <= t - S for p in truth)
        if scrape and published is not None and not overdue:
            published = max(published, counting_instant(t))
        else:
            counted = counted_through(live, at=published) if published is not None else {}
            live = settle(view_of(truth, view), counted)
            published = counting_instant(t)
            seen = view
        figures.append(reported_usage(live, Ledger(), now=t, window=WINDOW, quota=QUOTA).consumed)
    assert figures == sorted(figures), figures


@settings(max_examples=300)
@given(pods(), st.integers(0, 5 * S), st.lists(st.integers(0, 20 * S), min_size=1, max_size=10))
def test_a_lagging_view_over_counts_a_finished_pod_by_at_most_a_second(
    truth: list[Pod], lag: int, instants: list[int],
) -> None:
    """However far the view lags, settling against what earlier figures counted never ends a finished pod more
    than one second after its recorded finishedAt (the record's precision); the final figure, once every pod's
    finish is in view, is within a second per pod of the exact one."""
    live: tuple[Interval, ...] = ()
    published: int | None = None
    for t in sorted(instants):
        counted = counted_through(live, at=published) if published is not None else {}
        live = settle(view_of(truth, max(0, t - lag)), counted)
        published = counting_instant(t)
    end_of_all = 30 * S
    counted = counted_through(live, at=published) if published is not None else {}
    final = settle(view_of(truth, end_of_all), counted)
    exact = view_of(truth, end_of_all)
    for got, want in zip(final, exact, strict=True):
        if want.end is not None:
            assert got.end is not None and want.end <= got.end <= want.end + S
    # what was counted past the records is exactly what the figure's error bound names
    figure = reported_usage(final, now=end_of_all, window=WINDOW, quota=QUOTA)
    assert figure.consumed - figure.error_bound == reported_usage(exact, now=end_of_all, window=WINDOW,
                                                                  quota=QUOTA).consumed


@settings(max_examples=300)
@given(pods(), readings(lagging=False))
def test_reported_usage_never_decreases_from_a_current_view_without_any_memory(
    truth: list[Pod], reads: list[tuple[int, int, bool]],
) -> None:
    """Whole seconds alone (what survives a restart, which loses the last snapshot): from a current view, the
    figure at each instant never drops, though each running pod counted up to then is ended later at its
    truncated finishedAt, and a pod stopped in its first second counts zero throughout."""
    figures = [reported_usage(view_of(truth, view), now=t, window=WINDOW, quota=QUOTA).consumed
               for t, view, _ in reads]
    assert figures == sorted(figures), figures

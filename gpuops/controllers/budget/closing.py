"""What a calendar budget's previous period used, frozen in status.previousPeriod when the next period begins.

Chargeback needs the figures of a closed month, not only the running one. At the first reconcile of a new period,
the budget still holds every record of the period it accounted until then (its ledger is compacted only up to the
start of that period, as for the carry-over), so the closed period's usage by GPU model and capacity type, and its
weighted hours and cost at the prices in force while it ran, are computed once from them and kept through the
current period. Only a period the budget accounted is summarised: a new budget, or one whose status describes an
older period, has no previous period to show.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

from gpuops.accounting.gpuhours import Interval, Ledger, format_gpu_hours
from gpuops.accounting.windows import period_of
from gpuops.kube.times import format_time, parse_time_or_none

from .api import BudgetStatus, ParsedSpec, PeriodSummary
from .pricebook import Priced
from .status import usage_items
from .units import totals

__all__ = ["previous_period"]


def previous_period(spec: ParsedSpec, status: BudgetStatus, priced: Priced | None,
                    live: Mapping[str, Iterable[Interval]], ledger: Ledger, at: int) -> PeriodSummary | None:
    """The summary of the period before the one `at` lies in: the one status holds, else computed from the
    budget's records (`live` by kind, and the ledger before this reconcile compacts it) if the status accounted
    that period; None otherwise, and for rolling windows."""
    period = period_of(spec.window, at)
    previous = period_of(spec.window, period.start - 1) if period is not None else None
    if previous is None:
        return None
    kept = status.previous_period
    if kept is not None and parse_time_or_none(kept.start) == previous.start:
        return kept
    if parse_time_or_none(status.period_start) != previous.start:
        return None
    by_kind = totals(priced, live, ledger, now=previous.end, window=previous.end - previous.start)
    with_prices = priced is not None

    def total(index: int) -> Fraction:
        return sum((t[index] for t in by_kind.values()), Fraction(0))

    return PeriodSummary(
        start=format_time(previous.start), end=format_time(previous.end), gpu_hours=format_gpu_hours(total(0)),
        weighted_gpu_hours=format_gpu_hours(total(1)) if with_prices else None,
        cost=format_gpu_hours(total(2)) if with_prices else None,
        currency=priced.currency if priced is not None else None,
        usage=usage_items(by_kind, with_prices),
    )

"""What a calendar budget's previous period left unused, and the spec one reconcile counts against.

With `carryOver: Unused` the quota of a period is the spec's quota plus what the previous period left unused
(at most one quota). The amount is computed once, at the first reconcile in the new period, from the records the
budget still holds for the previous period (its ledger is compacted only up to the start of the period it last
accounted, so nothing of that period has been dropped), and frozen in status with the period it belongs to
(status.periodStart): status.carriedOverGpuHours, or allowance.carriedOver in a weighted or cost quota's unit.
Later reconciles, a restart or a failover read it back instead of recomputing it from records that compaction has
since merged or dropped. It is rounded down to the status's six decimals, so the figure in status is the one
counted. Only a period the budget accounted carries over: a new budget, or one whose status describes an older
period (its operator missed a whole period), carries nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from fractions import Fraction

from gpuops.accounting.gpuhours import Interval, Ledger, LedgerEntry, window_usage
from gpuops.accounting.windows import period_of
from gpuops.kube.times import parse_time_or_none

from .api import BudgetStatus, ParsedSpec

__all__ = ["in_period"]

_UNIT = 1_000_000
"""Status figures have six decimals of a GPU-hour."""


def in_period(spec: ParsedSpec, status: BudgetStatus, live: Iterable[Interval], ledger: Ledger,
              fresh: Iterable[LedgerEntry], at: int) -> ParsedSpec:
    """`spec` with the quota of the window `at` lies in: what carried over added (and recorded in `carried`).
    `live`, `ledger` and `fresh` are the budget's records before this reconcile compacts its ledger."""
    period = period_of(spec.window, at)
    if period is None:
        return spec
    carried = Fraction(0)
    accounted = parse_time_or_none(status.period_start)
    recorded = _recorded(spec, status)
    if spec.carry_over and accounted == period.start and recorded is not None:
        carried = Fraction(recorded)  # frozen at the period's first reconcile
    elif spec.carry_over:
        previous = period_of(spec.window, period.start - 1)
        if previous is not None and accounted == previous.start:
            before = Fraction(recorded or "0")
            records = Ledger(entries=(*ledger.entries, *fresh), buckets=ledger.buckets)
            used = window_usage(live, records, now=previous.end, window=previous.end - previous.start,
                                quota=spec.quota).consumed
            unused = min(spec.quota, max(Fraction(0), spec.quota + before - used))
            carried = Fraction(math.floor(unused * _UNIT), _UNIT)
    return dataclasses.replace(spec, quota=spec.quota + carried, carried=carried)


def _recorded(spec: ParsedSpec, status: BudgetStatus) -> str | None:
    """What the status froze as carried over, in the quota's unit (none if the status counted another unit)."""
    if spec.unit == "GPUHours":
        return status.carried_over_gpu_hours
    allowance = status.allowance
    if allowance is None or allowance.unit != spec.unit or allowance.currency != spec.currency:
        return None
    return allowance.carried_over

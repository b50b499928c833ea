"""What a calendar budget carries from one period into the next (`carryover.in_period`), case by case: nothing by
default, nothing into a budget's first period or after a missed period, the unused part capped at one quota and
rounded down to the status's six decimals, and a frozen amount read back rather than recomputed."""

from __future__ import annotations

import datetime
from fractions import Fraction
from typing import Any

import msgspec
import pytest

from gpuops.accounting.gpuhours import Interval, Ledger, LedgerEntry
from gpuops.controllers.budget.api import BudgetSpec, BudgetStatus, parse_spec
from gpuops.controllers.budget.carryover import in_period
from gpuops.kube.times import format_time

S = 1_000_000
H = 3_600 * S
DAY = 24 * H
MIDNIGHT = int(datetime.datetime(2026, 3, 2, tzinfo=datetime.UTC).timestamp()) * S
"""A UTC midnight: the day before it is [MIDNIGHT - DAY, MIDNIGHT)."""


def spec(carry: str = "Unused", quota: str = "10") -> Any:
    body = {"selector": {"matchLabels": {"a": "1"}},
            "quota": {"gpuHours": quota, "window": {"calendar": "Day", "timeZone": "UTC", "carryOver": carry}}}
    return parse_spec(msgspec.convert(body, BudgetSpec))


def status(period_start: int | None, carried: str | None) -> BudgetStatus:
    return BudgetStatus(period_start=format_time(period_start) if period_start is not None else None,
                        carried_over_gpu_hours=carried)


def used_yesterday(hours: Fraction) -> tuple[list[Interval], Ledger]:
    """A finished pod (in the ledger) and a running one, together `hours` GPU-hours inside yesterday."""
    entry = LedgerEntry(uid="done", start=MIDNIGHT - DAY + H, end=MIDNIGHT - DAY + 2 * H, gpus=Fraction(1))
    rest = (hours - 1) * H
    running = Interval(uid="run", start=MIDNIGHT - round(rest), end=None, gpus=Fraction(1))
    return [running], Ledger(entries=(entry,))


@pytest.mark.parametrize(("accounted", "before", "used", "carried"), [
    (MIDNIGHT - DAY, "0", Fraction(4), Fraction(6)),        # 10 - 4
    (MIDNIGHT - DAY, "3.5", Fraction(4), Fraction(19, 2)),   # 10 + 3.5 - 4
    (MIDNIGHT - DAY, "9", Fraction(2), Fraction(10)),        # 17 unused, capped at one quota
    (MIDNIGHT - DAY, "0", Fraction(12), Fraction(0)),        # over quota: nothing, never negative
    (None, None, Fraction(4), Fraction(0)),                  # a new budget: its first period inherits nothing
    (MIDNIGHT - 2 * DAY, "5", Fraction(4), Fraction(0)),     # the status is of an older period: one was missed
])
def test_the_first_reconcile_of_a_period_carries_what_the_accounted_previous_one_left(
        accounted: int | None, before: str | None, used: Fraction, carried: Fraction) -> None:
    live, ledger = used_yesterday(used)
    got = in_period(spec(), status(accounted, before), live, ledger, (), MIDNIGHT + 10 * S)
    assert (got.carried, got.quota) == (carried, 10 + carried)


def test_fresh_entries_count_and_the_amount_is_rounded_down_to_six_decimals() -> None:
    third = LedgerEntry(uid="t", start=MIDNIGHT - 1_200 * S, end=MIDNIGHT, gpus=Fraction(1))  # 1/3 GPU-hour
    got = in_period(spec(quota="1"), status(MIDNIGHT - DAY, "0"), [], Ledger(), [third], MIDNIGHT)
    assert got.carried == Fraction(666_666, 10**6)


def test_within_a_period_the_frozen_amount_is_read_back_not_recomputed() -> None:
    live, ledger = used_yesterday(Fraction(4))
    got = in_period(spec(), status(MIDNIGHT, "1.25"), live, ledger, (), MIDNIGHT + H)
    assert (got.carried, got.quota) == (Fraction(5, 4), Fraction(45, 4))


def test_none_carries_nothing_and_a_rolling_window_has_no_carry_at_all() -> None:
    live, ledger = used_yesterday(Fraction(1))
    got = in_period(spec(carry="None"), status(MIDNIGHT - DAY, "0"), live, ledger, (), MIDNIGHT + H)
    assert (got.carried, got.quota) == (0, 10)
    rolling = parse_spec(msgspec.convert({"selector": {"matchLabels": {"a": "1"}},
                                          "quota": {"gpuHours": "10", "windowHours": 24}}, BudgetSpec))
    assert in_period(rolling, status(None, None), live, ledger, (), MIDNIGHT) is rolling

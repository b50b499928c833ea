"""The two shapes of a budget's window, and the usage in either.

A rolling window of length W at `now` is `[now - W, now)`: usage slides out of it continuously. A calendar
window is the current day, ISO week or month of a time zone (`calendar.period_at`): usage counts from the
period's first instant and nothing leaves before the period ends, when the next one starts empty. Callers
that need a window length at one instant (compaction, the usage of one pod) take `length_at`, the length of
the window that instant sees; in a calendar period that is the time since the period began, so what lies before
the period is exactly what a window of that length leaves out.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from fractions import Fraction
from typing import NamedTuple

from gpuops.accounting.calendar import Calendar, Period, period_at
from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import Interval, Ledger, Usage, period_usage, window_usage

__all__ = ["CalendarWindow", "RollingWindow", "Window", "length_at", "nominal_length", "period_of", "usage_in"]

_HOUR = 3_600_000_000


class RollingWindow(NamedTuple):
    length: int
    """Microseconds, > 0."""


class CalendarWindow(NamedTuple):
    calendar: Calendar
    zone: datetime.tzinfo


Window = RollingWindow | CalendarWindow


def period_of(window: Window, at: int) -> Period | None:
    """The calendar period holding `at`; None for a rolling window."""
    if isinstance(window, CalendarWindow):
        return period_at(at, window.calendar, window.zone)
    return None


def length_at(window: Window, at: int) -> int:
    """The length of the window `at` sees: the rolling length, or the time since the period began."""
    if isinstance(window, RollingWindow):
        return window.length
    if isinstance(window, CalendarWindow):
        return at - period_at(at, window.calendar, window.zone).start
    raise AccountingError(f"window must be a RollingWindow or a CalendarWindow, got {window!r}")


def nominal_length(window: Window) -> int:
    """The longest the window can be, for sizing ledger buckets: a day of 25 hours, a week of 169, a month
    of 31 days and an hour."""
    if isinstance(window, RollingWindow):
        return window.length
    return {"Day": 25, "Week": 169, "Month": 745}[window.calendar] * _HOUR


def usage_in(
    window: Window,
    live: Iterable[Interval],
    ledger: Ledger = Ledger(),  # noqa: B008 - immutable frozen Struct
    *,
    now: int,
    quota: Fraction | int,
) -> Usage:
    """`window_usage` for a rolling window, `period_usage` for the calendar period holding `now`."""
    if isinstance(window, RollingWindow):
        return window_usage(live, ledger, now=now, window=window.length, quota=quota)
    period = period_at(now, window.calendar, window.zone)
    return period_usage(live, ledger, now=now, start=period.start, end=period.end, quota=quota)

"""Calendar periods: the day, week or month of a named time zone that contains an instant.

A budget that renews "per month in Europe/Berlin" counts usage from the first instant of the month on Berlin's
wall clock to the first instant of the next one. Months have 28 to 31 days and, where the zone observes
daylight saving time, days have 23, 24 or 25 hours (or other lengths: Lord Howe shifts by 30 minutes, and a
few zones have moved their clocks by a whole day). Periods are therefore computed on the wall clock and
converted to instants, never by adding a fixed number of seconds.

The first instant of a local date D is local midnight of D. Where midnight occurs twice (the clock falls back
across it), the first occurrence; where it does not occur (the clock jumps over it), the instant the jump
happens, whose wall-clock reading is the first one of D. Equivalently: the first instant whose local date is D
after an instant whose local date is before D. Weeks start on Monday (ISO 8601).

Instants are integer microseconds since the Unix epoch, as everywhere in this package. The zone is an argument
(a `datetime.tzinfo`, usually a `zoneinfo.ZoneInfo` the caller loaded), so nothing here reads a clock or a file.
"""

from __future__ import annotations

import datetime
from typing import Final, Literal, NamedTuple

from gpuops.accounting.errors import AccountingError

__all__ = ["CALENDARS", "Calendar", "Period", "first_instant_of", "local_date", "period_at"]

Calendar = Literal["Day", "Week", "Month"]
CALENDARS: Final[tuple[Calendar, ...]] = ("Day", "Week", "Month")

_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MIN_DATE: Final = datetime.date(1, 1, 8)
_MAX_DATE: Final = datetime.date(9999, 11, 30)
"""Dates whose periods (and the days around them) stay within what `datetime` can represent."""


class Period(NamedTuple):
    """The half-open `[start, end)` in microseconds, and the local dates it spans, `[first_day, next_first_day)`."""

    start: int
    end: int
    first_day: datetime.date
    next_first_day: datetime.date


def _to_datetime(instant: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(microseconds=instant)


def _to_instant(moment: datetime.datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _wall(instant: int, zone: datetime.tzinfo) -> datetime.datetime:
    """The naive wall-clock reading of `zone` at `instant`."""
    return _to_datetime(instant).astimezone(zone).replace(tzinfo=None)


def local_date(instant: int, zone: datetime.tzinfo) -> datetime.date:
    """The date on `zone`'s wall clock at `instant`."""
    return _wall(instant, zone).date()


def first_instant_of(day: datetime.date, zone: datetime.tzinfo) -> int:
    """The first instant of local date `day` in `zone` (see the module docstring for gaps and folds)."""
    if not _MIN_DATE <= day <= _MAX_DATE:
        raise AccountingError(f"date {day.isoformat()} is outside the supported range")
    midnight = datetime.datetime(day.year, day.month, day.day)
    readings = []
    for fold in (0, 1):
        instant = _to_instant(midnight.replace(tzinfo=zone, fold=fold))
        if _wall(instant, zone) == midnight:
            readings.append(instant)
    if readings:
        return min(readings)
    return _end_of_gap(midnight, zone)


def _end_of_gap(moment: datetime.datetime, zone: datetime.tzinfo) -> int:
    """The instant the clock jumps over the nonexistent wall time `moment`: the first instant reading later.

    Read with the offset before the jump, `moment` lands after it; read with the offset after, before it. The
    wall clock is increasing between the two (a single jump lies there), so bisection finds the jump."""
    a = _to_instant(moment.replace(tzinfo=zone, fold=0))
    b = _to_instant(moment.replace(tzinfo=zone, fold=1))
    low, high = min(a, b), max(a, b)
    while _wall(low, zone) > moment:  # widen in case the offsets disagree with the zone's rules near `moment`
        low -= 86_400_000_000
    while _wall(high, zone) < moment:
        high += 86_400_000_000
    while high - low > 1:  # invariant: wall(low) < moment <= wall(high)
        mid = (low + high) // 2
        if _wall(mid, zone) < moment:
            low = mid
        else:
            high = mid
    return high


def _first_day(day: datetime.date, calendar: Calendar) -> tuple[datetime.date, datetime.date]:
    if calendar == "Day":
        return day, day + datetime.timedelta(days=1)
    if calendar == "Week":
        monday = day - datetime.timedelta(days=day.weekday())
        return monday, monday + datetime.timedelta(days=7)
    if calendar == "Month":
        first = day.replace(day=1)
        following = first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(
            month=first.month + 1)
        return first, following
    raise AccountingError(f"unknown calendar {calendar!r}: use Day, Week or Month")


def period_at(instant: int, calendar: Calendar, zone: datetime.tzinfo) -> Period:
    """The day, week or month of `zone`'s calendar that contains `instant`: `start <= instant < end`.

    Where the wall clock falls back across midnight, the instants read as the previous date after the first
    midnight still belong to the new period (periods are contiguous and never overlap)."""
    day = local_date(instant, zone)
    first, following = _first_day(day, calendar)
    start = first_instant_of(first, zone)
    end = first_instant_of(following, zone)
    if instant >= end:  # the clock fell back across the next midnight: the new period has begun
        return period_at(end, calendar, zone)
    return Period(start, end, first, following)

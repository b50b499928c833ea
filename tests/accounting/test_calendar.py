"""Calendar periods against the C library's reading of the same time-zone database (GNU `date`), for every zone.

Python's zoneinfo and glibc read the tz database independently; `date` renders an instant as a local date with
glibc, so where the two disagree on where a day, week or month starts, these tests fail. Properties hold for
arbitrary instants from 1900 to 2200 in every zone the machine has, including zones whose clocks jump over or
fall back across midnight.
"""

from __future__ import annotations

import calendar as stdcalendar
import datetime
import os
import subprocess
import zoneinfo
from functools import cache

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuops.accounting.calendar import CALENDARS, Calendar, Period, first_instant_of, local_date, period_at
from gpuops.accounting.errors import AccountingError

ZONES = sorted(zoneinfo.available_timezones() - {"Factory", "localtime"})
"""Every zone the machine's tz database has ("Factory" is a placeholder, not a place)."""
HOUR = 3_600_000_000
LOW = int(datetime.datetime(1900, 1, 1, tzinfo=datetime.UTC).timestamp()) * 1_000_000
HIGH = int(datetime.datetime(2200, 1, 1, tzinfo=datetime.UTC).timestamp()) * 1_000_000


@cache
def zone(name: str) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(name)


def glibc_dates(name: str, seconds: list[int]) -> list[datetime.date]:
    """The local dates GNU `date` (glibc) gives these Unix seconds in zone `name`."""
    out = subprocess.run(["date", "-f", "-", "+%Y-%m-%d"], input="".join(f"@{s}\n" for s in seconds),
                         capture_output=True, text=True, check=True, env={**os.environ, "TZ": name})
    return [datetime.date.fromisoformat(line) for line in out.stdout.split()]


def glibc_midnight(name: str, day: datetime.date) -> int | None:
    """Unix seconds of local midnight of `day` by glibc's mktime; None where `date` finds no such time."""
    out = subprocess.run(["date", "-d", f"{day.isoformat()} 00:00", "+%s"], capture_output=True, text=True,
                         env={**os.environ, "TZ": name})
    return int(out.stdout) if out.returncode == 0 else None


def at(name: str, year: int, month: int, day: int, hour: int = 0) -> int:
    """Microseconds of a wall-clock time in zone `name` (fold 0)."""
    return int(datetime.datetime(year, month, day, hour, tzinfo=zone(name)).timestamp()) * 1_000_000


MIDNIGHT_ZONES = ("America/Santiago", "America/Havana", "Asia/Beirut", "America/Asuncion", "America/Sao_Paulo",
                  "Asia/Tehran", "America/Goose_Bay", "America/St_Johns", "Africa/Cairo", "Asia/Gaza",
                  "Pacific/Apia", "Australia/Lord_Howe", "America/Scoresbysund", "Europe/Berlin")
"""Zones whose clocks jump over midnight, fall back across it or to it, by half an hour, or by a day."""


@cache
def transitions(name: str, year: int) -> tuple[int, ...]:
    """Unix seconds at which zone `name` changes its UTC offset during `year` (daily steps, then bisection)."""
    z = zone(name)
    first = int(datetime.datetime(year, 1, 1, tzinfo=datetime.UTC).timestamp())

    def offset(second: int) -> datetime.timedelta | None:
        return datetime.datetime.fromtimestamp(second, z).utcoffset()

    found = []
    for day in range(366):
        low, high = first + day * 86_400, first + (day + 1) * 86_400
        if offset(low) != offset(high):
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if offset(mid) == offset(low) else (low, mid)
            found.append(high)
    return tuple(found)


@st.composite
def near_a_transition(draw: st.DrawFn) -> tuple[str, int]:
    """An instant within a day and a half of one of the zone's clock changes, when the drawn year has any."""
    name = draw(st.sampled_from(MIDNIGHT_ZONES) | st.sampled_from(ZONES))
    year = draw(st.integers(1970, 2040))
    changes = transitions(name, year)
    if not changes:
        return name, draw(st.integers(LOW, HIGH))
    second = draw(st.sampled_from(changes)) + draw(st.integers(-120, 3600) | st.integers(-36 * 3600, 36 * 3600))
    return name, second * 1_000_000 + draw(st.sampled_from((0, 1, 999_999)))


cases = st.tuples(st.sampled_from(ZONES), st.integers(LOW, HIGH)) | near_a_transition()
calendars = st.sampled_from(CALENDARS)


@settings(max_examples=300, deadline=None)
@given(cases, calendars)
@example(("Pacific/Apia", 1_325_239_199_000_000), "Day")
def test_a_period_holds_its_instant_starts_a_date_and_ends_where_the_next_begins(
        case: tuple[str, int], cal: Calendar) -> None:
    name, instant = case
    p = period_at(instant, cal, zone(name))
    assert p.start <= instant < p.end
    assert period_at(p.start, cal, zone(name)) == p
    assert period_at(p.end - 1, cal, zone(name)) == p
    following = period_at(p.end, cal, zone(name))
    assert following.start == p.end and following.first_day >= p.next_first_day  # later where that date was skipped


@settings(max_examples=300, deadline=None)
@given(cases, calendars)
@example(("Pacific/Apia", 1_325_239_199_000_000), "Day")  # the day before the one Samoa skipped
def test_glibc_reads_the_bounds_as_the_first_instants_of_their_dates(case: tuple[str, int], cal: Calendar) -> None:
    """The second before `start` is on an earlier date by glibc's reading, `start` on the period's first date
    (and the same at `end`): the bounds are where the C library sees the dates change."""
    name, instant = case
    p = period_at(instant, cal, zone(name))
    assert p.start % 1_000_000 == 0 and p.end % 1_000_000 == 0  # the tz database moves clocks on whole seconds
    before_start, start, before_end, end = glibc_dates(
        name, [p.start // 1_000_000 - 1, p.start // 1_000_000, p.end // 1_000_000 - 1, p.end // 1_000_000])
    assert before_start < p.first_day <= start  # the clock may jump past a first day (Samoa skipped 2011-12-30)
    assert before_end < p.next_first_day <= end


@settings(max_examples=300, deadline=None)
@given(cases, calendars)
def test_periods_are_days_iso_weeks_or_calendar_months(case: tuple[str, int], cal: Calendar) -> None:
    name, instant = case
    p = period_at(instant, cal, zone(name))
    first, nxt = p.first_day, p.next_first_day
    if cal == "Day":
        assert nxt - first == datetime.timedelta(days=1)
    elif cal == "Week":
        assert first.isoweekday() == 1 and nxt - first == datetime.timedelta(days=7)
    else:
        assert first.day == 1 and (nxt - first).days == stdcalendar.monthrange(first.year, first.month)[1]


@settings(max_examples=200, deadline=None)
@given(cases)
def test_where_midnight_exists_once_it_is_the_first_instant_glibc_agrees(case: tuple[str, int]) -> None:
    name, instant = case
    z = zone(name)
    day = local_date(instant, z)
    start = first_instant_of(day, z)
    midnight = datetime.datetime(day.year, day.month, day.day)
    readings = {datetime.datetime.fromtimestamp(start / 1e6, z).replace(fold=f).replace(tzinfo=None)
                for f in (0, 1)}
    glibc = glibc_midnight(name, day)
    if glibc is None:  # glibc knows no such wall time: the clock jumps over it, and we start after the jump
        assert midnight not in readings
        assert local_date(start - 1, z) < day == local_date(start, z)
    else:
        both = {midnight.replace(tzinfo=z, fold=f).utcoffset() for f in (0, 1)}
        if len(both) == 1:  # unambiguous: glibc's mktime and we must name the same second
            assert start == glibc * 1_000_000


@pytest.mark.parametrize(("name", "fields", "cal", "hours", "first_wall"), [
    ("Europe/Berlin", (2026, 3, 15, 12), "Month", 743, (2026, 3, 1, 0, 0)),
    ("Europe/Berlin", (2026, 10, 31, 23), "Month", 745, (2026, 10, 1, 0, 0)),
    ("Europe/Berlin", (2026, 3, 29, 12), "Day", 23, (2026, 3, 29, 0, 0)),
    ("Europe/Berlin", (2026, 10, 25, 12), "Day", 25, (2026, 10, 25, 0, 0)),
    ("Europe/Berlin", (2024, 2, 29, 12), "Month", 29 * 24, (2024, 2, 1, 0, 0)),
    ("Europe/Berlin", (2026, 3, 25, 12), "Week", 7 * 24 - 1, (2026, 3, 23, 0, 0)),
    ("America/Santiago", (2026, 9, 6, 12), "Day", 23, (2026, 9, 6, 1, 0)),
    ("Australia/Lord_Howe", (2026, 10, 4, 12), "Day", 23.5, (2026, 10, 4, 0, 0)),
    ("Pacific/Apia", (2011, 12, 15, 12), "Month", 30 * 24, (2011, 12, 1, 0, 0)),
    ("Pacific/Apia", (2011, 12, 29, 12), "Day", 24, (2011, 12, 29, 0, 0)),
    ("America/Goose_Bay", (2006, 10, 29, 12), "Day", 25, (2006, 10, 29, 0, 0)),
    ("UTC", (2026, 2, 10, 0), "Month", 28 * 24, (2026, 2, 1, 0, 0)),
])
def test_known_calendar_facts(name: str, fields: tuple[int, int, int, int], cal: Calendar, hours: float,
                              first_wall: tuple[int, ...]) -> None:
    """Berlin's DST months and days, a leap February, Santiago's midnight that does not exist (the day starts at
    01:00), Lord Howe's half-hour shift, Samoa's December 2011, which lost the 30th to the date line, and Goose
    Bay's clocks falling back from 00:01 to 23:01 of the day before."""
    p = period_at(at(name, *fields), cal, zone(name))
    assert (p.end - p.start) / HOUR == hours
    wall = datetime.datetime.fromtimestamp(p.start / 1e6, zone(name))
    assert (wall.year, wall.month, wall.day, wall.hour, wall.minute) == first_wall


def test_samoas_skipped_day_ends_the_29th_at_the_31st() -> None:
    p = period_at(at("Pacific/Apia", 2011, 12, 29, 12), "Day", zone("Pacific/Apia"))
    assert p == Period(p.start, p.end, datetime.date(2011, 12, 29), datetime.date(2011, 12, 30))
    assert local_date(p.end, zone("Pacific/Apia")) == datetime.date(2011, 12, 31)


def test_an_unknown_calendar_and_out_of_range_dates_are_refused() -> None:
    with pytest.raises(AccountingError, match="unknown calendar 'Year'"):
        period_at(0, "Year", zone("UTC"))  # type: ignore[arg-type]
    with pytest.raises(AccountingError, match="outside the supported range"):
        first_instant_of(datetime.date(1, 1, 1), zone("UTC"))


def test_the_hour_read_as_the_previous_date_after_a_fall_back_across_midnight_belongs_to_the_new_day() -> None:
    """Goose Bay, 2006-10-29: midnight came, and a minute later the clocks went back to 23:01 of the 28th. Those
    59 minutes lie after the 29th began, so they are the 29th's (periods never overlap or leave holes)."""
    z = zone("America/Goose_Bay")
    change = transitions("America/Goose_Bay", 2006)[1] * 1_000_000
    assert local_date(change + 600_000_000, z) == datetime.date(2006, 10, 28)
    p = period_at(change + 600_000_000, "Day", z)
    assert (p.first_day, p.start) == (datetime.date(2006, 10, 29), change - 60_000_000)


class JumpOverMidnight(datetime.tzinfo):
    """A zone whose clock jumps from 23:30 on 1 March 2030 to 00:30 on the 2nd (UTC+0 to UTC+1), so midnight of
    the 2nd does not exist and the gap does not start at it: the tz database has no such jump today, but nothing
    forbids one."""

    CHANGE = datetime.datetime(2030, 3, 1, 23, 30)
    """The UTC time of the jump (the wall clock reads the same just before it)."""
    BEFORE, AFTER = datetime.timedelta(0), datetime.timedelta(hours=1)

    def utcoffset(self, dt: datetime.datetime | None) -> datetime.timedelta:
        assert dt is not None
        wall = dt.replace(tzinfo=None)
        if wall < self.CHANGE + self.BEFORE:
            return self.BEFORE
        if wall >= self.CHANGE + self.AFTER:
            return self.AFTER
        return self.BEFORE if dt.fold == 0 else self.AFTER  # PEP 495: in a gap, fold 0 reads the old offset

    def fromutc(self, dt: datetime.datetime) -> datetime.datetime:
        utc = dt.replace(tzinfo=None)
        return (utc + (self.BEFORE if utc < self.CHANGE else self.AFTER)).replace(tzinfo=self)

    def dst(self, dt: datetime.datetime | None) -> datetime.timedelta:
        return self.utcoffset(dt) - self.BEFORE

    def tzname(self, dt: datetime.datetime | None) -> str:
        return "JMP"


def test_a_gap_spanning_midnight_starts_the_day_at_the_jump_not_at_midnight_read_with_either_offset() -> None:
    z = JumpOverMidnight()
    jump = int(JumpOverMidnight.CHANGE.replace(tzinfo=datetime.UTC).timestamp()) * 1_000_000
    assert first_instant_of(datetime.date(2030, 3, 2), z) == jump
    p = period_at(jump + 1, "Day", z)
    assert (p.first_day, p.start) == (datetime.date(2030, 3, 2), jump)
    assert period_at(jump - 1, "Day", z).end == jump

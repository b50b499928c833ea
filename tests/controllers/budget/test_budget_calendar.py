"""A budget with a calendar window against the emulated API server, its clock moved across a Berlin midnight:
usage counts from the period's first instant, the status names the period, the reconcile comes back exactly when
the period ends, and the next period starts with nothing carried over."""

from __future__ import annotations

import datetime
import math
import zoneinfo
from fractions import Fraction
from pathlib import Path

import pytest
from budget_harness import NS, Clock, Reconciles, at, budget, environment, pod, running_since

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.kube import conditions as cond
from gpuops.kube.controller import Request

pytestmark = pytest.mark.anyio

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def next_berlin_midnight(second: int) -> int:
    """The Unix second of the first Berlin midnight after `second` (late November: no clock change near it)."""
    day = datetime.datetime.fromtimestamp(second, BERLIN).date() + datetime.timedelta(days=1)
    return int(datetime.datetime.combine(day, datetime.time(0), BERLIN).timestamp())


async def test_a_daily_budget_counts_from_local_midnight_and_renews_at_the_next(tmp_path: Path) -> None:
    """2 GPUs running since t0 against 1 GPU-hour per calendar day in Berlin. Ten minutes before midnight the
    day's usage (from t0) is over quota and the reconcile asks to come back at midnight; 15 minutes after it
    the new day holds 0.5 GPU-hours, is within quota, and will be exhausted at 00:30."""
    window = {"calendar": "Day", "timeZone": "Europe/Berlin"}
    async with environment(tmp_path) as env:
        await env.create_budget(budget("daily", "1", delay=0, quota={"gpuHours": "1", "window": window}))
        await env.create_pod(pod("p", 2))
        t0 = await env.until("p running", lambda: running_since(env, "p"))
        midnight = next_berlin_midnight(t0)
        if midnight - t0 < 3_600:  # the pod must have run an hour before midnight: take the next one
            midnight = next_berlin_midnight(midnight)
        clock = Clock()
        clock.set(midnight - 600)
        handle = await env.start(clock=clock)
        seen = Reconciles(handle)
        req = Request(NS, "daily")

        before = await seen.after(env, req)
        st = (await env.budget("daily")).status
        day_start = midnight - 86_400
        used = 2 * (midnight - 600 - max(t0, day_start)) / 3_600
        assert (st.period_start, st.period_end, st.carried_over_gpu_hours) == (at(day_start), at(midnight), "0.000000")
        assert st.consumed_gpu_hours == f"{used:.6f}" and st.exhausts_at is None
        assert cond.is_true(st.conditions, "QuotaExceeded")
        ready = cond.get_condition(st.conditions, "Ready")
        assert ready is not None and ready.message.endswith("per calendar day (Europe/Berlin)")
        assert before.result is not None and before.result.requeue_after == pytest.approx(600.001, abs=1e-9)

        after = await seen.after(env, req, lambda: clock.set(midnight + 900))
        st = (await env.budget("daily")).status
        assert (st.period_start, st.period_end) == (at(midnight), at(next_berlin_midnight(midnight)))
        assert (st.consumed_gpu_hours, st.remaining_gpu_hours, st.quota_gpu_hours) == ("0.500000", "0.500000",
                                                                                       "1.000000")
        assert not cond.is_true(st.conditions, "QuotaExceeded") and st.over_quota_since is None
        assert st.exhausts_at == at(midnight + 1_800)
        assert after.result is not None and after.result.requeue_after == pytest.approx(900.001, abs=1e-9)
        closed = st.previous_period  # the day that ended, frozen for chargeback: the pod's hours up to midnight
        day = Fraction(2 * (midnight - max(t0, day_start)), 3_600)
        assert closed is not None and (closed.start, closed.end, closed.gpu_hours) == (
            at(day_start), at(midnight), format_gpu_hours(day))
        assert [(u.capacity_type, u.gpu_hours) for u in closed.usage or ()] == [("OnDemand", format_gpu_hours(day))]


async def test_unused_quota_carries_into_the_next_day_at_most_one_quota(tmp_path: Path) -> None:
    """1 GPU since t0 against 100 GPU-hours per Berlin day, carryOver Unused. The day before midnight used
    U = (midnight - max(t0, day start)) / 3600 GPU-hours; the next day's quota is 100 + (100 - U), frozen in
    status at its first reconcile and read back after a restart of the controller."""
    window = {"calendar": "Day", "timeZone": "Europe/Berlin", "carryOver": "Unused"}
    async with environment(tmp_path) as env:
        await env.create_budget(budget("rolls", "100", quota={"gpuHours": "100", "window": window}))
        await env.create_pod(pod("p", 1))
        t0 = await env.until("p running", lambda: running_since(env, "p"))
        midnight = next_berlin_midnight(t0)
        clock = Clock()
        clock.set(midnight - 600)
        handle = await env.start(clock=clock)
        req = Request(NS, "rolls")
        await Reconciles(handle).after(env, req)
        st = (await env.budget("rolls")).status
        assert (st.period_start, st.carried_over_gpu_hours, st.quota_gpu_hours) == (
            at(midnight - 86_400), "0.000000", "100.000000")  # the budget is new: nothing before it carries over

        await Reconciles(handle).after(env, req, lambda: clock.set(midnight + 60))
        used_before = Fraction(midnight - max(t0, midnight - 86_400), 3_600)
        carried = 100 - used_before
        st = (await env.budget("rolls")).status
        assert st.period_start == at(midnight)
        assert Fraction(st.carried_over_gpu_hours or "") == math.floor(carried * 10**6) / Fraction(10**6)
        assert Fraction(st.quota_gpu_hours) == 100 + Fraction(st.carried_over_gpu_hours or "")
        frozen = st.carried_over_gpu_hours

        await env.stop()  # a new controller reads the frozen amount back; it does not recompute it
        handle = await env.start(clock=clock)
        await Reconciles(handle).after(env, req, lambda: clock.set(midnight + 120))
        st = (await env.budget("rolls")).status
        assert (st.carried_over_gpu_hours, st.consumed_gpu_hours) == (frozen, f"{2 / 60:.6f}")
        assert st.previous_period is not None and st.previous_period.gpu_hours == format_gpu_hours(used_before)

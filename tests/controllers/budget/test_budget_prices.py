"""Priced and weighted budgets against the emulated API server: a GPUPriceList prices each pod's GPU-hours by the
model and capacity type of its node, a cost quota is enforced in money, a price change applies from the write that
made it (the API server's managed fields time) and never reprices earlier time, and a budget that cannot be priced
says why. The expected figures are computed here from the pods' start times, the node labels and the prices."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from budget_harness import NS, Clock, Env, Reconciles, budget, environment, pod, running_since, seconds
from prometheus_client import REGISTRY

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.accounting.reporting import next_counting_instant
from gpuops.controllers.budget.api import BUDGETS, GPUWorkloadBudget
from gpuops.controllers.budget.pricelist import PRICE_LISTS, GPUPriceList
from gpuops.kube import conditions as cond
from gpuops.kube.controller import Request
from gpuops.kube.errors import Invalid
from gpuops.kube.resources import NODES
from gpuops.kube.times import format_time

pytestmark = pytest.mark.anyio

A100 = "NVIDIA-A100-SXM4-80GB"
F = Fraction
S = 1_000_000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def price_list(name: str, on_demand: str, spot: str, *, currency: str = "EUR", default: bool = True) -> dict[str, Any]:
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUPriceList", "metadata": {"name": name},
            "spec": {"currency": currency, "default": default,
                     "prices": [{"model": A100, "onDemand": on_demand, "spot": spot, "weight": "4"}],
                     "fallback": {"onDemand": "2"}}}


def on(node: str, name: str, gpus: int) -> dict[str, Any]:
    body = pod(name, gpus)
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def cost_budget(name: str, amount: str, currency: str = "EUR", **extra: Any) -> dict[str, Any]:
    body = budget(name, "1", window=24, **extra)
    body["spec"]["quota"] = {"cost": {"amount": amount, "currency": currency}, "windowHours": 24}
    return body


async def spec_written_at(env: Env, name: str) -> int:
    """When the API server recorded the latest write of the price list's spec (its managed fields), seconds."""
    got = await env.client.get(PRICE_LISTS, name)
    times = [seconds(e.time) for e in got.metadata.managed_fields or ()
             if e.time and not e.subresource and "f:spec" in (e.fields_v1 or {})]
    assert times, got.metadata.managed_fields
    return max(times)


async def wall_second_after(env: Env, second: int) -> int:
    """Wait until the wall clock has passed `second`; the whole second it is then."""
    clock = Clock()
    return await env.until(f"the wall clock past {second}", lambda: _past(clock, second))


async def _past(clock: Clock, second: int) -> int | None:
    now = clock() // S
    return now if now > second else None


async def test_a_cost_quota_charges_each_hour_at_the_prices_in_force_when_it_ran(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.client.patch(NODES, "a100-1", {"metadata": {"labels": {"karpenter.sh/capacity-type": "spot"}}})
        await env.client.create(PRICE_LISTS, price_list("cloud", "3", "1"))
        await env.create_budget(cost_budget("money", "100"))
        await env.create_pod(on("a100-0", "steady", 1))
        await env.create_pod(on("a100-1", "cheap", 2))
        t_steady = await env.until("steady running", lambda: running_since(env, "steady"))
        t_cheap = await env.until("cheap running", lambda: running_since(env, "cheap"))
        first = await wall_second_after(env, max(t_steady, t_cheap) + 1)
        clock = Clock()
        clock.set(first)
        handle = await env.start(clock=clock)
        req = Request(NS, "money")
        await Reconciles(handle).after(env, req)

        def at_old_prices(t: int) -> tuple[Fraction, Fraction]:
            """(GPU-hours on demand, GPU-hours spot) from the pods' starts to t."""
            return F(t - t_steady, 3_600), 2 * F(t - t_cheap, 3_600)

        od, sp = at_old_prices(first)
        st = (await env.budget("money")).status
        assert (st.price_list, st.currency) == ("cloud", "EUR")
        assert st.cost_so_far == format_gpu_hours(3 * od + 1 * sp)
        assert st.consumed_weighted_gpu_hours == format_gpu_hours(4 * (od + sp))
        assert st.consumed_gpu_hours == format_gpu_hours(od + sp)
        assert st.allowance is not None and (st.allowance.unit, st.allowance.currency) == ("Cost", "EUR")
        assert (st.allowance.quota, st.allowance.consumed) == ("100.000000", st.cost_so_far)
        assert st.allowance.remaining == format_gpu_hours(100 - 3 * od - sp)
        assert (st.quota_gpu_hours, st.remaining_gpu_hours) == ("", "")  # not a GPU-hours quota
        assert [(u.model, u.capacity_type, u.cost, u.weighted_gpu_hours) for u in st.usage or ()] == [
            (A100, "OnDemand", format_gpu_hours(3 * od), format_gpu_hours(4 * od)),
            (A100, "Spot", format_gpu_hours(sp), format_gpu_hours(4 * sp))]
        for capacity, cost in (("OnDemand", 3 * od), ("Spot", sp)):
            labels = {"namespace": NS, "name": "money", "model": A100, "capacity_type": capacity, "currency": "EUR"}
            assert REGISTRY.get_sample_value("gpuops_budget_usage_cost", labels) == float(cost)

        recorded = await env.until("the price history", lambda: _history(env, "cloud", 1))
        assert recorded[0].generation == 1

        # the price doubles: the API server's time of that write is when it takes effect
        await env.client.patch(PRICE_LISTS, "cloud", {"spec": {"prices": [
            {"model": A100, "onDemand": "6", "spot": "2", "weight": "4"}]}})
        changed = await spec_written_at(env, "cloud")
        history = await env.until("the new version recorded", lambda: _history(env, "cloud", 2))
        assert [h.since for h in history][1] == format_time(changed * S)
        assert changed >= first

        async def cached() -> bool:
            got = handle.reconciler.prices.price_lists.store.get("cloud") if handle.reconciler.prices else None
            return got is not None and got.metadata.generation == 2

        await env.until("the controller sees the new prices", cached)
        later = changed + 60
        await Reconciles(handle).after(env, req, lambda: clock.set(later))
        od_then, sp_then = at_old_prices(changed)
        burn = 6 * 1 + 2 * 2  # EUR per hour now
        cost = 3 * od_then + 1 * sp_then + burn * F(60, 3_600)
        st = (await env.budget("money")).status
        assert st.cost_so_far == format_gpu_hours(cost)  # the hours before the change keep their old price
        assert st.allowance is not None and st.allowance.remaining == format_gpu_hours(100 - cost)
        expected_exhaustion = later * S + (100 - cost) / burn * 3_600 * S
        assert st.exhausts_at == format_time(next_counting_instant(int(-(-expected_exhaustion // 1))))

        # over a quota in money: the condition says so in the currency
        await _set_quota(env, "money", "0.01")
        st = await env.until("over quota", lambda: _condition_true(env, "money", "QuotaExceeded"))
        message = cond.get_condition(st.status.conditions, "QuotaExceeded")
        assert message is not None and "of 0.010000 EUR per 24h" in message.message


async def _set_quota(env: Env, name: str, amount: str) -> None:
    await env.client.patch(BUDGETS, name, {"spec": {"quota": {"cost": {"amount": amount}}}}, namespace=NS)


async def _condition_true(env: Env, name: str, kind: str) -> GPUWorkloadBudget | None:
    b = await env.budget(name)
    return b if cond.is_true(b.status.conditions, kind) and b.status.observed_generation == b.metadata.generation \
        else None


async def _history(env: Env, name: str, count: int) -> tuple[Any, ...] | None:
    got: GPUPriceList = await env.client.get(PRICE_LISTS, name)
    history = got.status.history or ()
    return history if len(history) >= count else None


async def _ready(env: Env, name: str, status: str) -> GPUWorkloadBudget | None:
    b = await env.budget(name)
    c = cond.get_condition(b.status.conditions, "Ready")
    return b if c is not None and c.status == status and b.status.observed_generation == b.metadata.generation \
        else None


async def test_a_budget_that_cannot_be_priced_says_why_and_recovers(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.start()
        weighted = budget("weighted", "1")
        weighted["spec"]["quota"] = {"weightedGpuHours": "40", "windowHours": 1}
        await env.create_budget(weighted)
        st = await env.until("not ready", lambda: _ready(env, "weighted", "False"))
        ready = cond.get_condition(st.status.conditions, "Ready")
        assert ready is not None and ready.reason == "InvalidSpec"
        assert ready.message.startswith("spec.priceList: no GPUPriceList is default")

        await env.create_budget(cost_budget("dollars", "10", "USD"))
        await env.client.create(PRICE_LISTS, price_list("cloud", "3", "1"))
        st = await env.until("ready once a default list exists", lambda: _ready(env, "weighted", "True"))
        assert st.status.allowance is not None and st.status.allowance.unit == "WeightedGPUHours"
        dollars = await env.until("the currency refused", lambda: _ready(env, "dollars", "False"))
        ready = cond.get_condition(dollars.status.conditions, "Ready")
        assert ready is not None and ready.message.startswith(
            "spec.quota.cost.currency: is USD but GPUPriceList cloud prices in EUR")


async def test_admission_refuses_two_quotas_and_a_currency_change(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        both = budget("both", "10")
        both["spec"]["quota"]["cost"] = {"amount": "5", "currency": "EUR"}
        one_of = "set exactly one of spec.quota.gpuHours, spec.quota.weightedGpuHours"
        with pytest.raises(Invalid, match=re.escape(one_of)):
            await env.create_budget(both)
        await env.client.create(PRICE_LISTS, price_list("cloud", "3", "1"))
        with pytest.raises(Invalid, match=re.escape("spec.currency cannot change")):
            await env.client.patch(PRICE_LISTS, "cloud", {"spec": {"currency": "USD"}})
        bad = price_list("bad", "3.1234567", "1")
        with pytest.raises(Invalid, match="onDemand"):
            await env.client.create(PRICE_LISTS, bad)

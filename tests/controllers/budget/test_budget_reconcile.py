"""The budget reconciler against the emulated API server (real CRD, real HTTP), its time moved by hand: requeues
land exactly on the instant the answer changes; finished pods still in the API are compacted without being counted
twice; an invalid spec that slipped past admission shows in the conditions once; a pod event maps to exactly the
budgets that select it. Whatever the server does with the controller's writes (pruning to the schema, merge
patches, the status subresource, Events) is the emulator's doing, not the test's."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from budget_harness import (
    NS,
    Clock,
    Env,
    Reconciles,
    at,
    budget,
    environment,
    pod,
    pod_spec,
    running_since,
    seconds,
)

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.controllers.budget.api import BUDGETS, BudgetStatus, GPUWorkloadBudget
from gpuops.controllers.budget.reconciler import Options
from gpuops.kube import conditions as cond
from gpuops.kube.controller import Request
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import Informer
from gpuops.kube.objects import Pod
from gpuops.kube.resources import NAMESPACES, PODS

pytestmark = pytest.mark.anyio

HALF_UNIT = Fraction(1, 2_000_000)
"""Status figures are rounded to 6 decimals of a GPU-hour."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"



async def _quota_events(env: Env, recorder: EventRecorder) -> list[dict[str, Any]]:
    """The QuotaExceeded Events in the API once everything the controller recorded has been written."""
    assert await recorder.flush(5.0), "events still queued after 5 s"
    return await env.events("QuotaExceeded")


async def test_requeue_lands_on_the_crossing_the_delay_and_the_reminder(tmp_path: Path) -> None:
    """2 GPUs from t0 against 1 GPU-hour per 24 h, AlertOnly after 60 s: each reconcile asks to come back when
    the answer changes (1 ms late on purpose): the quota crossing at t0 + 1800 s, the end of the delay, the
    alert reminder. The one alert is one Event in the API; the reconciles in between neither repeat nor count it."""
    async with environment(tmp_path) as env:
        await env.create_budget(budget("b", "1", window=24, delay=60))
        await env.create_pod(pod("p", 2))  # runs until deleted
        t0 = await env.until("p running", lambda: running_since(env, "p"))
        clock = Clock()
        clock.set(t0 + 600)
        handle = await env.start(clock=clock)
        seen = Reconciles(handle)
        req = Request(NS, "b")

        first = await seen.after(env, req)
        assert first.result is not None and first.result.requeue_after == pytest.approx(1_200.001, abs=1e-9)
        st = (await env.budget("b")).status
        assert (st.consumed_gpu_hours, st.exhausts_at, st.burn_rate_gpus) == ("0.333333", at(t0 + 1_800), "2")

        crossing = await seen.after(env, req, lambda: clock.set(t0 + 1_800))  # over quota (equality): delay starts
        assert crossing.result is not None and crossing.result.requeue_after == pytest.approx(60.001, abs=1e-9)
        st = (await env.budget("b")).status
        assert (st.consumed_gpu_hours, st.over_quota_since) == ("1.000000", at(t0 + 1_800))
        assert cond.is_true(st.conditions, "QuotaExceeded") and st.last_enforcement is None
        assert await _quota_events(env, handle.recorder) == []

        alert = await seen.after(env, req, lambda: clock.set(t0 + 1_860))  # the delay expired: one alert
        assert alert.result is not None and alert.result.requeue_after == pytest.approx(600.001, abs=1e-9)
        st = (await env.budget("b")).status
        assert st.last_enforcement is not None and st.last_enforcement.time == at(t0 + 1_860)
        assert st.over_quota_since == at(t0 + 1_800)  # the persisted start of the delay, not reset
        assert len(await _quota_events(env, handle.recorder)) == 1

        quiet = await seen.after(env, req, lambda: clock.set(t0 + 1_900))  # no storm: the reminder is due at 2460 s
        assert quiet.result is not None and quiet.result.requeue_after == pytest.approx(560.001, abs=1e-9)
        events = await _quota_events(env, handle.recorder)
        assert len(events) == 1 and events[0].get("count", 1) == 1
        assert (await env.budget("b")).status.last_enforcement == st.last_enforcement
        cached = handle.reconciler.pods.store.get(f"{NS}/p")
        assert cached is not None and handle.reconciler.map_pod(cached) == [req]


# ---------------------------------------------------------------------------------------------- compaction


def truth_in_window(pods: list[dict[str, Any]], horizon: int, now: int) -> Fraction:
    """GPU-hours of finished pods inside [horizon, now] (whole seconds), from their container timestamps."""
    total = Fraction(0)
    for p in pods:
        terms = [(cs.get("state") or {}).get("terminated") or {} for cs in p["status"]["containerStatuses"]]
        start = min(seconds(t["startedAt"]) for t in terms)
        end = max(seconds(t["finishedAt"]) for t in terms)
        gpus = sum(Fraction(c["resources"]["limits"]["nvidia.com/gpu"]) for c in p["spec"]["containers"])
        total += gpus * Fraction(max(0, min(end, now) - max(start, horizon)), 3600)
    return total


def within_bound(st: BudgetStatus, truth: Fraction) -> Fraction:
    """The consumed figure, checked against the truth: buckets never under-count and over-count by at most the
    ledger's stated error bound (both figures rounded to 6 decimals)."""
    assert st.consumed_gpu_hours is not None and st.ledger is not None
    consumed = Fraction(st.consumed_gpu_hours)
    bound = Fraction(st.ledger.error_bound_gpu_hours or "0")
    assert truth - HALF_UNIT <= consumed <= truth + bound + 2 * HALF_UNIT, (
        f"consumed {st.consumed_gpu_hours} vs truth {float(truth):.7f} (error bound {st.ledger.error_bound_gpu_hours})")
    return consumed


async def test_finished_pods_still_in_the_api_are_compacted_without_double_counting(tmp_path: Path) -> None:
    """8 finished pods stay in the API while the ledger keeps 3 entries: once they are past the compaction margin
    the oldest merge into buckets up to status.ledger.compactedThrough, which must survive the status write (the
    server prunes what the CRD schema lacks) or every later reconcile counts the merged pods again. Pod events
    and hours passing later, consumed is still the truth from the pods' own timestamps within the stated error
    bound, and it never grows."""
    async with environment(tmp_path) as env:
        clock = Clock()
        handle = await env.start(clock=clock, options=Options(max_ledger_entries=3))
        seen = Reconciles(handle)
        req = Request(NS, "b")
        await env.create_budget(budget("b", "100"))  # a 1 h window: 15 s buckets
        names = [f"p{i}" for i in range(8)]
        for i, name in enumerate(names):  # 5 end a second or more before the other 3: those stay entries
            await env.create_pod(pod(name, 1 + i % 2, 1.0 if i < 5 else 2.0))
        await env.until("all finished", lambda: env.all_finished(names), within=20)
        pods = await env.raw_pods(names)
        first = min(seconds(p["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"]) for p in pods)
        last = max(seconds(p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]) for p in pods)
        truth = truth_in_window(pods, first, last)
        assert truth > 0

        async def all_counted() -> BudgetStatus | None:
            """All 8 recorded as finished: a pod whose end the cache has not seen yet counts as running up to the
            clock, which can equal the truth by chance while the ledger holds fewer entries."""
            st = (await env.budget("b")).status
            recorded = len(st.ledger.entries or ()) if st.ledger is not None else 0
            counted = st.tracked_pods == 8 and st.consumed_gpu_hours == format_gpu_hours(truth)
            return st if counted and recorded == 8 else None

        st = await env.until("the 8 pods counted and recorded", all_counted)
        assert st.ledger is not None and len(st.ledger.entries or ()) == 8  # all ended within the 60 s margin
        assert st.ledger.compacted_through is None

        # two minutes on: past the margin, the oldest 5 of the 8 entries merge into buckets (or more: merging
        # takes every entry up to one end instant, and pods ending in the same second go together)
        await seen.after(env, req, lambda: clock.advance(120))
        st = (await env.budget("b")).status
        assert st.ledger is not None and len(st.ledger.entries or ()) <= 3 and st.ledger.buckets
        figure = within_bound(st, truth)

        # pod events on the finished pods, each followed by a reconcile that saw it
        for i, name in enumerate(names):
            patched = await env.client.patch(PODS, name, {"metadata": {"annotations": {"nudge": str(i)}}},
                                             namespace=NS)
            rv = patched.metadata.resource_version
            await env.until(f"{name}'s event cached", lambda n=name, v=rv: _seen(handle.reconciler.pods, n, v))
            await seen.after(env, req)
            st = (await env.budget("b")).status
            assert within_bound(st, truth) == figure, f"consumed moved after {name}'s event"

        for minutes in (10, 30):  # time passing, nothing leaving the window yet
            await seen.after(env, req, lambda m=minutes: clock.advance(m * 60))
            st = (await env.budget("b")).status
            assert within_bound(st, truth) == figure, f"consumed moved after {minutes} more minutes"
        assert st.ledger is not None and st.ledger.compacted_through is not None
        assert st.ledger.error_bound_gpu_hours == "0.000000"  # no bucket straddles the window's edge yet

        # the window's trailing edge inside the merged pods: the buckets it cuts over-count within the bound
        for edge in range(first + 1, last + 1):
            await seen.after(env, req, lambda e=edge: clock.set(e + 3_600))
            st = (await env.budget("b")).status
            consumed = within_bound(st, truth_in_window(pods, edge, edge + 3_600))
            assert consumed <= figure, f"consumed grew as the window's edge passed {edge}"
            figure = consumed
        await seen.after(env, req, lambda: clock.set(last + 3_600 + 60))  # everything left the window
        st = (await env.budget("b")).status
        assert (st.consumed_gpu_hours, st.tracked_pods) == ("0.000000", 0)
        assert st.ledger is not None and st.ledger.error_bound_gpu_hours == "0.000000"


async def _seen(informer: Informer[Any], name: str, rv: str) -> bool:
    """Has the controller's cache caught up with a write of `name` (in NS) that returned `rv`?"""
    return informer.seen(f"{NS}/{name}", rv)


# ---------------------------------------------------------------------------------------------- invalid spec


async def test_an_invalid_spec_that_slipped_past_admission_shows_in_conditions_once(tmp_path: Path) -> None:
    """Admission refuses an empty selector; one stored anyway (written past the emulator's validation) makes the
    budget Ready=False/InvalidSpec and Degraded, with one Event and one status write however often it is
    reconciled."""
    async with environment(tmp_path) as env:
        await env.create_budget(budget("b", "1"))
        handle = await env.start()
        seen = Reconciles(handle)
        req = Request(NS, "b")

        async def ready() -> bool:
            return cond.is_true((await env.budget("b")).status.conditions, "Ready")

        await env.until("b Ready", ready)
        env.edit_stored_budget("b", lambda obj: obj["spec"].update(selector={}))
        generation = (await env.budget("b")).metadata.generation

        async def invalid() -> GPUWorkloadBudget | None:
            b = await env.budget("b")
            return b if b.status.observed_generation == generation else None

        written = await env.until("the invalid spec in status", invalid)
        st = written.status
        ready_cond = cond.get_condition(st.conditions, "Ready")
        assert ready_cond is not None and (ready_cond.status, ready_cond.reason) == ("False", "InvalidSpec")
        assert ready_cond.message.startswith("spec.selector:")
        assert [c.status for c in st.conditions or () if c.type == "Degraded"] == ["True"]
        for _ in range(2):
            again = await seen.after(env, req)
            assert again.result is None
        assert (await env.budget("b")).metadata.resource_version == written.metadata.resource_version  # one write
        assert await handle.recorder.flush(5.0)
        events = await env.events("InvalidSpec")
        assert len(events) == 1 and events[0].get("count", 1) == 1  # once, not per reconcile


# ---------------------------------------------------------------------------------------------- pod -> budgets


async def test_a_pod_event_maps_to_exactly_the_budgets_that_select_it_through_the_anchor_index(
        tmp_path: Path) -> None:
    """Equality, In, Exists-only and NotIn-only selectors, an invalid budget, and a budget elsewhere; the index
    follows a selector changed through the API."""
    async with environment(tmp_path) as env:
        await env.client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": "other"}})
        selectors: dict[str, dict[str, Any]] = {
            "eq": {"matchLabels": {"team": "a"}},
            "in": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
            "exists": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
            "notin": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]},
            "other-team": {"matchLabels": {"team": "b"}},
            "invalid": {"matchLabels": {"team": "a"}},  # emptied below, past admission
        }
        for name, selector in selectors.items():
            body = budget(name, "1")
            body["spec"]["selector"] = selector
            await env.create_budget(body)
        await env.client.create(BUDGETS, budget("elsewhere", "1"), "other")
        invalid_rv = env.edit_stored_budget("invalid", lambda obj: obj["spec"].update(selector={}))
        for name, labels in (("team-a", {"team": "a"}), ("team-c", {"team": "c"}), ("unlabelled", {})):
            await env.create_pod({"apiVersion": "v1", "kind": "Pod",
                                  "metadata": {"name": name, "labels": labels}, "spec": pod_spec(0)})
        handle = await env.start()
        rec = handle.reconciler
        await env.until("invalid's edit cached", lambda: _seen(rec.budgets, "invalid", invalid_rv))

        async def cached(name: str) -> Pod | None:
            return rec.pods.store.get(f"{NS}/{name}")

        async def mapped(name: str) -> list[str]:
            got = await env.until(f"pod {name} cached", lambda: cached(name))
            return sorted(r.name for r in rec.map_pod(got))

        assert await mapped("team-a") == ["eq", "exists", "in"]
        assert await mapped("team-c") == ["exists", "notin"]
        assert await mapped("unlabelled") == ["notin"]
        changed = await env.client.patch(BUDGETS, "other-team", {"spec": {"selector": {"matchLabels": {"team": "c"}}}},
                                         namespace=NS)
        rv = changed.metadata.resource_version
        await env.until("other-team's change cached", lambda: _seen(rec.budgets, "other-team", rv))
        assert await mapped("team-c") == ["exists", "notin", "other-team"]
        await env.create_pod({"apiVersion": "v1", "kind": "Pod",
                              "metadata": {"name": "team-b", "labels": {"team": "b"}}, "spec": pod_spec(0)})
        assert await mapped("team-b") == ["exists", "in", "notin"]

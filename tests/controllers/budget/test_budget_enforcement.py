"""Enforcement on the emulated cluster: equality triggers QuotaExceeded at the predicted instant, the delay
holds then fires (and survives a restart), AlertOnly touches nothing and emits one Event, Pause suspends a Job
and resumes it once under quota, Evict takes the largest consumer first and a PDB's 429 shows as Degraded
with backoff (no hot loop) while consumption never drops."""

from __future__ import annotations

import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from budget_harness import NS, Env, budget, environment, pod, pod_spec, seconds
from prometheus_client import REGISTRY

from gpuops.controllers.budget.api import BUDGETS, PAUSED_BY, GPUWorkloadBudget, parse_time
from gpuops.controllers.budget.enforcement import EnforcementOptions
from gpuops.controllers.budget.reconciler import Options
from gpuops.kube import conditions as cond
from gpuops.kube.resources import JOBS, PDBS, PODS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def actions(budget: str, action: str, result: str) -> float:
    return REGISTRY.get_sample_value(
        "gpuops_budget_enforcement_actions_total",
        {"namespace": NS, "name": budget, "action": action, "result": result}) or 0.0


async def over(env: Env, name: str) -> GPUWorkloadBudget | None:
    b = await env.budget(name)
    return b if cond.is_true(b.status.conditions, "QuotaExceeded") else None


async def under(env: Env, name: str) -> GPUWorkloadBudget | None:
    b = await env.budget(name)
    return b if cond.is_false(b.status.conditions, "QuotaExceeded") else None


async def test_equality_triggers_and_the_delay_holds_then_fires_once_alert_only(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.start()
        alerted = actions("alert", "AlertOnly", "Alerted")
        # 3 GPUs reach 0.0025 GPU-hours (9 GPU-seconds) exactly 3 s after their start
        await env.create_budget(budget("eq", "0.0025", labels={"kind": "eq"}, delay=3600))
        await env.create_pod(pod("eq-finished", 3, 3.0, labels={"kind": "eq"}))
        await env.create_budget(budget("alert", "0.0025", labels={"kind": "alert"}, delay=3))
        await env.create_pod(pod("hog", 3, 600.0, labels={"kind": "alert"}))

        # equality at a quiet instant: exactly the quota is over quota
        b = await env.until("eq over quota", lambda: over(env, "eq"))
        await env.until("eq-finished finished", lambda: env.all_finished(["eq-finished"]))

        async def exactly_the_quota() -> GPUWorkloadBudget | None:
            b = await env.budget("eq")
            return b if b.status.consumed_gpu_hours == "0.002500" else None

        b = await env.until("eq at exactly its quota", exactly_the_quota)
        assert b.status.remaining_gpu_hours == "0.000000" and cond.is_true(b.status.conditions, "QuotaExceeded")
        assert b.status.last_enforcement is None  # its delay (an hour) has not passed

        # crossing in the middle of a run is found by the requeue at the predicted instant, no pod event needed
        b = await env.until("alert over quota", lambda: over(env, "alert"), within=10)
        hog = (await env.raw_pods(["hog"]))[0]
        started = seconds(hog["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
        assert b.status.over_quota_since is not None
        since = parse_time(b.status.over_quota_since) / 1e6
        assert 0 <= since - (started + 3) < 1.0, (since, started)
        assert b.status.last_enforcement is None  # the delay holds ...

        # ... across a restart of the controller (the delay counts from the persisted transition)
        await env.stop()
        await env.start()

        async def fired() -> GPUWorkloadBudget | None:
            b = await env.budget("alert")
            return b if b.status.last_enforcement is not None else None

        b = await env.until("AlertOnly fired", fired, within=10)
        last = b.status.last_enforcement
        assert last is not None and (last.action, last.result, last.pod) == ("AlertOnly", "Alerted", "hog")
        assert 3.0 <= parse_time(last.time) / 1e6 - since < 5.0

        # more reconciles (metadata changes, a pod) while still over quota: no second Event, pods untouched
        for i in range(4):
            before = (await env.budget("alert")).status.computed_at
            assert before is not None

            async def next_second(before: str = before) -> bool:
                return time.time() >= parse_time(before) / 1e6 + 1

            # figures are counted in whole seconds: a nudge in a later second than the last status has a new
            # figure to write (hog still runs), so computedAt moving proves the nudge's reconcile ran
            await env.until("a second after the last status", next_second)
            await env.client.patch(BUDGETS, "alert", {"metadata": {"labels": {"nudge": str(i)}}}, namespace=NS)

            async def recomputed(before: str | None = before) -> bool:
                return (await env.budget("alert")).status.computed_at != before

            await env.until("reconciled after a nudge", recomputed)
        events = await env.events("QuotaExceeded")
        assert len(events) == 1 and events[0]["count"] == 1 and events[0]["type"] == "Warning"
        assert events[0]["involvedObject"]["name"] == "alert" and "AlertOnly" in events[0]["message"]
        assert actions("alert", "AlertOnly", "Alerted") == alerted + 1
        p = await env.client.get(PODS, "hog", NS)
        assert p.status.phase == "Running" and p.metadata.deletion_timestamp is None
        assert PAUSED_BY not in (p.metadata.annotations or {})

        # deleting the budget removes its enforcement series, as it removes its gauges
        await env.client.delete(BUDGETS, "alert", NS)

        async def series_gone() -> bool:
            labels = {"namespace": NS, "name": "alert"}
            counted = {**labels, "action": "AlertOnly", "result": "Alerted"}
            return (REGISTRY.get_sample_value("gpuops_budget_over_quota", labels) is None
                    and REGISTRY.get_sample_value("gpuops_budget_enforcement_actions_total", counted) is None)

        await env.until("the deleted budget's series removed", series_gone)


def job(name: str, runtime: float, parallelism: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
                 "template": {"metadata": {"labels": {"team": "a"},
                                           "annotations": {"sim.gpuops.io/runtime-seconds": str(runtime)}},
                              "spec": pod_spec(1)}},
    }


async def test_pause_suspends_the_job_marks_bare_pods_and_resumes_under_quota(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.start()
        await env.client.create(JOBS, job("train", 600.0), NS)
        await env.create_pod(pod("bare", 1, 600.0))
        steps = ("Suspended", "Marked", "Resumed", "Unmarked")
        before = {step: actions("pause", "Pause", step) for step in steps}  # another test's "pause" may have counted
        await env.create_budget(budget("pause", "0.0005", action="Pause"))  # 1.8 GPU-seconds

        async def suspended() -> dict[str, Any] | None:
            j = await env.job("train")
            return j if j["spec"].get("suspend") else None

        j = await env.until("job suspended", suspended)
        assert j["metadata"]["annotations"][PAUSED_BY] == f"{NS}/pause"

        async def bare_marked() -> bool:
            p = await env.client.get(PODS, "bare", NS)
            return (p.metadata.annotations or {}).get(PAUSED_BY) == f"{NS}/pause"

        await env.until("bare pod marked", bare_marked)

        async def job_pods_gone() -> bool:
            return not [p for p in await env.raw_pods() if p["metadata"]["name"].startswith("train-")]

        await env.until("the job's pods deleted by the Job controller", job_pods_gone)
        b = await env.budget("pause")
        entries = b.status.ledger.entries if b.status.ledger else None
        assert len([e for e in entries or () if e.name.startswith("train-")]) == 2  # they keep counting
        assert cond.is_true(b.status.conditions, "QuotaExceeded")
        last = b.status.last_enforcement
        assert last is not None and last.action == "Pause"
        assert await env.events("Paused")

        # raising the quota puts the budget under it: what we paused is resumed, nothing else
        await env.client.patch(BUDGETS, "pause", {"spec": {"quota": {"gpuHours": "10"}}}, namespace=NS)
        await env.until("under quota", lambda: under(env, "pause"))

        async def resumed() -> dict[str, Any] | None:
            j = await env.job("train")
            return j if j["spec"].get("suspend") is False and PAUSED_BY not in (
                j["metadata"].get("annotations") or {}) else None

        await env.until("job resumed", resumed)

        async def bare_unmarked() -> bool:
            p = await env.client.get(PODS, "bare", NS)
            return PAUSED_BY not in (p.metadata.annotations or {})

        await env.until("bare pod unmarked", bare_unmarked)

        async def job_pods_back() -> bool:
            return len([p for p in await env.raw_pods() if p["metadata"]["name"].startswith("train-")]) == 2

        await env.until("the job runs again", job_pods_back)
        assert await env.events("Resumed")
        b = await env.budget("pause")
        assert b.status.observed_generation == b.metadata.generation == 2
        # counted under the budget's own labels, the resume (which knows only the budget's key) too
        assert {step: actions("pause", "Pause", step) - before[step] for step in steps} == dict.fromkeys(steps, 1)


async def test_evict_largest_first_pdb_blocks_with_backoff_and_usage_never_drops(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        opts = Options(enforcement=EnforcementOptions(
            evictions_per_batch=1, eviction_interval=1.5, eviction_backoff_base=0.2, eviction_backoff_max=1.0))
        await env.start(options=opts)
        await env.client.create(PDBS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}, NS)
        await env.create_pod(pod("big", 4, 600.0))
        await env.create_pod(pod("small", 1, 600.0))
        await env.create_pod(pod("guarded", 1, 600.0, labels={"team": "a", "app": "guarded"}))

        async def all_running() -> bool:
            return all([await env.phase(n) == "Running" for n in ("big", "small", "guarded")])

        await env.until("pods running", all_running)
        blocked = actions("evict", "Evict", "Blocked")
        evicted = actions("evict", "Evict", "Evicted")
        await env.create_budget(budget("evict", "0.001", action="Evict"))  # 3.6 GPU-seconds

        seen: list[Fraction] = []
        scraped: list[Fraction] = []  # the scrape-time gauge too: evicted pods stop accruing as evicted, not later

        def scrape() -> None:
            value = REGISTRY.get_sample_value("gpuops_budget_consumed_gpu_seconds", {"namespace": NS, "name": "evict"})
            if value is not None:
                scraped.append(Fraction(value) / 3600)  # GPU-hours, exact

        async def big_gone() -> bool:
            b = await env.budget("evict")
            scrape()
            if b.status.consumed_gpu_hours:
                seen.append(Fraction(b.status.consumed_gpu_hours))
            return await env.pod_gone("big")

        await env.until("big evicted", big_gone)
        small = await env.client.get(PODS, "small", NS)  # the largest consumer went first, one per 1.5 s batch
        assert small.status.phase == "Running" and small.metadata.deletion_timestamp is None

        async def degraded() -> GPUWorkloadBudget | None:
            b = await env.budget("evict")
            scrape()
            if b.status.consumed_gpu_hours:
                seen.append(Fraction(b.status.consumed_gpu_hours))
            c = cond.get_condition(b.status.conditions, "Degraded")
            entries = {e.name for e in (b.status.ledger.entries or ())} if b.status.ledger else set()
            blocked = c is not None and c.status == "True" and c.reason == "EvictionBlocked"
            return b if blocked and {"big", "small"} <= entries and await env.pod_gone("small") else None

        b = await env.until("small evicted too, guarded blocked, both in the ledger", degraded, within=20)
        assert {e["message"].split()[2] for e in await env.events("Evicted")} == {"big", "small"}
        assert actions("evict", "Evict", "Evicted") == evicted + 2
        assert await env.events("EvictionBlocked")
        c = cond.get_condition(b.status.conditions, "Degraded")
        assert c is not None and "guarded" in c.message and "PodDisruptionBudget" in c.message

        # no hot loop: the blocked pod is retried after the PDB's Retry-After (10 s), capped here at 1 s
        start, t0 = actions("evict", "Evict", "Blocked"), time.monotonic()

        async def retried_a_few_times() -> bool:
            return actions("evict", "Evict", "Blocked") >= start + 3

        await env.until("a few retries", retried_a_few_times, within=10)
        assert time.monotonic() - t0 >= 2.0
        assert actions("evict", "Evict", "Blocked") - blocked <= 8
        assert await env.phase("guarded") == "Running"

        # consumption never dropped while pods were evicted (a refused eviction only ever adds back)
        assert seen == sorted(seen), seen
        assert scraped == sorted(scraped), scraped

        # the PDB goes: the next retry evicts, Degraded clears
        await env.client.delete(PDBS, "guard", NS)

        async def healed() -> GPUWorkloadBudget | None:
            b = await env.budget("evict")
            settled = b.status.running_pods == 0 and b.status.tracked_pods == 3  # guarded's usage in the ledger
            healthy = cond.is_false(b.status.conditions, "Degraded")
            return b if settled and healthy and await env.pod_gone("guarded") else None

        b = await env.until("guarded evicted once the PDB is gone", healed, within=15)
        assert Fraction(b.status.consumed_gpu_hours) >= seen[-1]

"""Budget accounting against the emulated cluster: zero pods, sums, accuracy against the pods' own container
timestamps, the ledger keeping deleted pods, overlapping budgets, and metrics computed at scrape time."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from fractions import Fraction
from pathlib import Path

import pytest
from budget_harness import NS, Env, budget, environment, pod, truth_gpu_hours
from prometheus_client import REGISTRY

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.controllers.budget.api import BUDGETS, GPUWorkloadBudget, parse_time
from gpuops.controllers.budget.reconciler import Options
from gpuops.kube import conditions as cond
from gpuops.kube.resources import PODS

pytestmark = pytest.mark.anyio

TOLERANCE = Fraction(1, 1_000_000)  # GPU-hours
KUBECTL = str(Path(sys.executable).parent / "kubectl")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def consumed(b: GPUWorkloadBudget) -> Fraction:
    return Fraction(b.status.consumed_gpu_hours or "0")


def gauge(name: str, budget_name: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"namespace": NS, "name": budget_name})


def gauge_hours(name: str, budget_name: str) -> Fraction | None:
    """A *_gpu_seconds gauge in GPU-hours: the exact quotient of its float by 3600."""
    value = gauge(name, budget_name)
    return None if value is None else Fraction(value) / 3600


async def quiet(env: Env, name: str, want: Fraction) -> GPUWorkloadBudget:
    """The budget once its status shows `want` (within the tolerance)."""

    async def probe() -> GPUWorkloadBudget | None:
        b = await env.budget(name)
        return b if b.status.consumed_gpu_hours and abs(consumed(b) - want) <= TOLERANCE else None

    return await env.until(f"{name} consumed == {float(want):.6f}", probe)


async def test_zero_pods_sums_accuracy_and_scrape_time_metrics(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.start()
        await env.create_budget(budget("team-a", "0.5"))

        async def ready() -> GPUWorkloadBudget | None:
            b = await env.budget("team-a")
            return b if cond.is_true(b.status.conditions, "Ready") else None

        b = await env.until("Ready with zero pods", ready)
        assert (b.status.consumed_gpu_hours, b.status.remaining_gpu_hours) == ("0.000000", "0.500000")
        assert b.status.quota_gpu_hours == "0.500000" and b.status.exhausts_at is None
        assert (b.status.tracked_pods, b.status.running_pods) == (0, 0)
        # and `kubectl get gwb` prints PODS 0 rather than a blank cell (a zero count is written, not omitted)
        kubectl = [KUBECTL, "--kubeconfig", str(env.kubeconfig), "get", "gwb", "team-a", "-n", NS]
        table = await asyncio.to_thread(subprocess.run, kubectl, capture_output=True, text=True, timeout=60)
        header, row = table.stdout.splitlines()
        assert dict(zip(header.split(), row.split(), strict=True))["PODS"] == "0", table.stdout
        assert cond.is_false(b.status.conditions, "QuotaExceeded")
        assert cond.is_false(b.status.conditions, "Degraded")
        assert b.status.observed_generation == b.metadata.generation
        assert gauge_hours("gpuops_budget_consumed_gpu_seconds", "team-a") == 0
        assert gauge_hours("gpuops_budget_quota_gpu_seconds", "team-a") == Fraction(1, 2)
        assert gauge_hours("gpuops_budget_remaining_gpu_seconds", "team-a") == Fraction(1, 2)

        names = ["p1", "p2", "p3"]
        for name, gpus, runtime in zip(names, (1, 2, 3), (1.0, 2.0, 1.5), strict=True):
            await env.create_pod(pod(name, gpus, runtime))
        await env.create_pod(pod("other", 4, 1.0, labels={"team": "b"}))  # not selected

        async def running() -> GPUWorkloadBudget | None:
            b = await env.budget("team-a")
            return b if (b.status.running_pods or 0) >= 1 else None

        b = await env.until("a pod seen running", running)
        # projected: running pods that kept running would reach 0.5 GPU-hours within the hour
        assert Fraction(b.status.burn_rate_gpus) > 0 and b.status.exhausts_at is not None
        # while pods run, the gauge is computed at scrape time: it grows between two scrapes with no reconcile
        g1 = gauge("gpuops_budget_consumed_gpu_seconds", "team-a")

        async def grew() -> bool:
            g2 = gauge("gpuops_budget_consumed_gpu_seconds", "team-a")
            return g1 is not None and g2 is not None and g2 > g1

        await env.until("gauge accrues between scrapes", grew, within=5)

        await env.until("all finished", lambda: env.all_finished([*names, "other"]))
        truth = truth_gpu_hours(await env.raw_pods(names))
        assert truth > 0
        b = await quiet(env, "team-a", truth)
        assert abs(consumed(b) - truth) <= TOLERANCE  # accuracy at a quiet instant, within 1e-6 GPU-hours
        assert b.status.tracked_pods == 3 and b.status.running_pods == 0
        assert b.status.remaining_gpu_hours == format_gpu_hours(Fraction("0.5") - truth)
        assert b.status.ledger is not None and {e.name for e in b.status.ledger.entries or ()} == set(names)
        metric = gauge_hours("gpuops_budget_consumed_gpu_seconds", "team-a")
        assert metric is not None and abs(metric - truth) < Fraction(1, 10**9)  # GPU-hours
        assert gauge("gpuops_budget_tracked_pods", "team-a") == 3.0

        # deleting the budget removes its series
        await env.client.delete(BUDGETS, "team-a", NS)

        async def series_gone() -> bool:
            return gauge("gpuops_budget_consumed_gpu_seconds", "team-a") is None

        await env.until("series removed", series_gone)


async def test_ledger_keeps_deleted_pods_and_overlapping_budgets_both_count(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.start()
        await env.create_budget(budget("team", "100"))
        await env.create_budget(budget("train", "100", labels={"kind": "train"}))
        shared = {"team": "a", "kind": "train"}
        await env.create_pod(pod("done", 2, 1.0, labels=shared))
        await env.create_pod(pod("long", 1, 600.0))
        await env.until("done finished", lambda: env.all_finished(["done"]))
        truth = truth_gpu_hours(await env.raw_pods(["done"]))
        # both budgets count the shared pod: "train" only it, "team" it plus the running one
        await quiet(env, "train", truth)

        async def ledgered(name: str) -> GPUWorkloadBudget | None:
            b = await env.budget(name)
            entries = b.status.ledger.entries if b.status.ledger else None
            return b if any(e.name == "done" for e in entries or ()) else None

        await env.until("done in team's ledger", lambda: ledgered("team"))
        await env.until("done in train's ledger", lambda: ledgered("train"))

        # a finished pod deleted: nothing is lost
        await env.client.delete(PODS, "done", NS)
        await env.until("done gone", lambda: env.pod_gone("done"))
        await env.create_pod(pod("nudge", 1, 1.0, labels={"kind": "train"}))  # a later reconcile of "train"
        await env.until("nudge finished", lambda: env.all_finished(["nudge"]))
        nudge = truth_gpu_hours(await env.raw_pods(["nudge"]))
        b = await quiet(env, "train", truth + nudge)
        assert b.status.tracked_pods == 2

        # a running pod deleted counts until it went (its final usage goes into the ledger)
        await env.until("long running", lambda: _running(env, "long"))
        before = consumed(await env.budget("team"))
        await env.client.delete(PODS, "long", NS, grace_period_seconds=0)
        await env.until("long gone", lambda: env.pod_gone("long"))

        async def long_in_ledger() -> GPUWorkloadBudget | None:
            b = await ledgered("team")
            entries = b.status.ledger.entries if b is not None and b.status.ledger else None
            return b if any(e.name == "long" for e in entries or ()) and b.status.running_pods == 0 else None

        b = await env.until("long in the ledger", long_in_ledger)
        assert consumed(b) >= before  # consumption never drops when a pod goes
        assert b.status.tracked_pods == 2


async def _running(env: Env, name: str) -> bool:
    return await env.phase(name) == "Running"


async def test_status_refresh_rewrites_the_status_while_pods_run_and_not_when_idle(tmp_path: Path) -> None:
    """`gpuops run --budget-status-refresh`: `kubectl get gwb` stays fresh between pod changes."""
    async with environment(tmp_path) as env:
        await env.start(options=Options(status_refresh=0.5))
        await env.create_budget(budget("team-a", "10"))
        await env.create_pod(pod("long", 1))  # runs until deleted: after it is Running, no more pod events

        async def running() -> GPUWorkloadBudget | None:
            b = await env.budget("team-a")
            return b if b.status.running_pods == 1 and b.status.computed_at else None

        first = await env.until("the pod counted", running)

        async def refreshed() -> GPUWorkloadBudget | None:
            b = await env.budget("team-a")
            return b if b.status.computed_at != first.status.computed_at and consumed(b) > consumed(first) else None

        later = await env.until("a newer status with more consumed", refreshed, within=10)
        assert later.status.running_pods == 1
        await env.client.delete(PODS, "long", namespace=NS)
        idle = await env.until("the pod gone from the status", lambda: _no_running(env))
        # no pods run: nothing changes by itself, so no refresh (a write would be a new resourceVersion)
        for _ in range(3):
            await env.until("a refresh period passes", _after(0.5))
            assert (await env.budget("team-a")).metadata.resource_version == idle.metadata.resource_version


async def _no_running(env: Env) -> GPUWorkloadBudget | None:
    """No pod runs and the figure is final: computed at or after the deleted pod's end (figures are counted at
    whole seconds, and a pod deleted while running ends when it was seen gone, within a second)."""
    b = await env.budget("team-a")
    st = b.status
    if st.running_pods != 0 or st.tracked_pods != 1 or st.ledger is None or not st.ledger.entries:
        return None
    final = st.computed_at is not None and parse_time(st.computed_at) >= parse_time(st.ledger.entries[0].end)
    return b if final else None


def _after(seconds: float) -> Callable[[], Awaitable[bool]]:
    deadline = time.monotonic() + seconds

    async def probe() -> bool:
        return time.monotonic() >= deadline

    return probe

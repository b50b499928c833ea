"""Two promises of the budget README held at the moment they are easiest to break, on the emulated cluster:

- An eviction never changes a figure after the fact. The scrape between the evicting reconcile and the next one
  reads that reconcile's snapshot, which still lists the pod as running; the evictor edits it at once: a pod
  evicted without grace ends at the instant the eviction was sent, one whose eviction was refused counts on.
  A scrape a minute later (nothing else reconciled) shows exactly that.
- A finished pod keeps counting after deletion. Its accounting finalizer stays until every retaining budget that
  selects it holds its final usage in a ledger, not only the budget whose reconcile ran first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest
from budget_harness import NS, Clock, Env, Reconciles, budget, environment, pod, running_since
from prometheus_client import REGISTRY

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.controllers.budget.api import BUDGETS, FINALIZER
from gpuops.controllers.budget.enforcement import EnforcementOptions
from gpuops.controllers.budget.podcontract import pod_span
from gpuops.controllers.budget.reconciler import Options
from gpuops.controllers.budget.setup import BudgetController
from gpuops.kube.controller import Request, Result
from gpuops.kube.resources import PDBS, PODS

pytestmark = pytest.mark.anyio
S = 1_000_000
LATER = 60
"""Seconds past the reconcile's instant at which the scrape after it is taken."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def consumed_gpu_seconds(name: str) -> float | None:
    return REGISTRY.get_sample_value("gpuops_budget_consumed_gpu_seconds", {"namespace": NS, "name": name})


class ScrapeAfterEach:
    """Right after each reconcile returns (before anything else runs on the loop), a scrape taken LATER seconds
    past the controller's fixed clock: what a Prometheus scrape in the gap before the next reconcile reads."""

    def __init__(self, handle: BudgetController, clock: Clock, name: str) -> None:
        self.values: dict[int, float | None] = {}
        controller = handle.controller
        inner = controller.reconcile
        seq = 0

        async def scraped(req: Request) -> Result | None:
            nonlocal seq
            seq += 1
            mine = seq
            result = await inner(req)
            assert clock.fixed is not None, "the clock must be set before the first reconcile"
            clock.fixed += LATER * S
            try:
                self.values[mine] = consumed_gpu_seconds(name)
            finally:
                clock.fixed -= LATER * S
            return result

        controller.reconcile = scraped


async def _start_clocked(env: Env, wall: int) -> tuple[BudgetController, Clock, Reconciles, ScrapeAfterEach]:
    clock = Clock()
    clock.set(wall)
    # one eviction per ten minutes: the evicting reconcile stops the largest pod only, the others run on
    handle = await env.start(clock=clock, options=Options(enforcement=EnforcementOptions(
        evictions_per_batch=1, eviction_interval=600.0)))
    scrapes = ScrapeAfterEach(handle, clock, "ev")  # inside: Reconciles' numbering is the order reconciles start
    return handle, clock, Reconciles(handle), scrapes



@dataclass
class Evicted:
    scraped: float | None
    """The scrape right after the evicting reconcile, LATER seconds on."""
    expected_small: float
    """What `small` (half a GPU, running throughout) adds to that scrape."""
    handle: BudgetController
    hog_uid: str


async def _evict_at_second_two(env: Env, setup: Callable[[], Awaitable[None]] | None = None) -> Evicted:
    """`hog` (4 GPUs) and `small` (half a GPU, started first) run under `ev` (Evict at once, no grace, 7.2
    GPU-seconds): under quota at hog's first second, over at its second, where the reconcile evicts hog (the
    largest). Returns the scrape right after that reconcile, and what `small` adds to it."""
    handle, clock, seen, scrapes = await _start_clocked(env, int(time.time()))
    await env.create_budget(budget("ev", "0.002", enforcement={
        "action": "Evict", "delaySeconds": 0, "evictionGracePeriodSeconds": 0}))
    if setup is not None:
        await setup()
    await env.create_pod(pod("small", "500m", 600.0))
    hog = await env.create_pod(pod("hog", 4, 600.0, labels={"team": "a", "app": "hog"}))
    s0 = await env.until("hog running", lambda: running_since(env, "hog"))
    s1 = await env.until("small running", lambda: running_since(env, "small"))
    assert s1 <= s0

    async def cached_running() -> bool:  # the reconciles below must see what the API says
        store = handle.reconciler.pods.store
        return all((p := store.get(f"{NS}/{n}")) is not None and p.status.phase == "Running" for n in ("hog", "small"))

    await env.until("the controller's cache shows both running", cached_running)
    req = Request(NS, "ev")
    under = await seen.after(env, req, lambda: clock.set(s0 + 1))
    # under quota: both run on, and count on in the gap
    assert scrapes.values[under.seq] == 4 * (1 + LATER) + 0.5 * (s0 + 1 + LATER - s1)
    evicting = await seen.after(env, req, lambda: clock.set(s0 + 2))
    status = (await env.budget("ev")).status
    assert status.consumed_gpu_hours == format_gpu_hours(Fraction(8 + Fraction(s0 + 2 - s1, 2), 3600))
    return Evicted(scrapes.values[evicting.seq], 0.5 * (s0 + 2 + LATER - s1), handle, hog.metadata.uid)


async def test_a_scrape_after_an_eviction_without_grace_counts_the_pod_up_to_the_eviction_only(
    tmp_path: Path,
) -> None:
    """...and only that pod: `small` counts on. Once the evicted pod's final usage is in the ledger, the
    evictor forgets its stop (memory stays bounded)."""
    async with environment(tmp_path) as env:
        got = await _evict_at_second_two(env)
        assert any("evicted pod hog " in e["message"] for e in await env.events("Evicted"))
        assert got.scraped == 8.0 + got.expected_small, f"a scrape {LATER} s on counted {got.scraped} GPU-seconds"

        async def recorded() -> bool:
            ledger = (await env.budget("ev")).status.ledger
            return ledger is not None and any(e.name == "hog" for e in ledger.entries or ())

        await env.until("hog in the ledger", recorded)
        enforcer = got.handle.reconciler.enforcer

        async def forgotten() -> bool:
            return got.hog_uid not in enforcer.stopped_at and got.hog_uid not in enforcer.answered_at

        await env.until("the stop of hog forgotten once its usage is recorded", forgotten)


async def test_a_scrape_after_a_refused_eviction_keeps_counting_the_pod(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:

        async def guard() -> None:
            await env.client.create(PDBS, {
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "hog"}}}}, NS)

        got = await _evict_at_second_two(env, guard)
        assert await env.phase("hog") == "Running"
        assert got.scraped == 4 * (2 + LATER) + got.expected_small, f"the scrape counted {got.scraped} GPU-seconds"


async def test_a_deleted_pod_that_never_started_is_not_recorded(tmp_path: Path) -> None:
    """A GPU pod that never ran (unschedulable) and is deleted used nothing: the reconcile after its deletion
    records nothing for it (and does not fail on its missing start)."""
    async with environment(tmp_path) as env:
        handle = await env.start()
        seen = Reconciles(handle)
        await env.create_budget(budget("b", "100"))
        await env.create_pod(pod("huge", 64, 600.0))  # no node has 64 GPUs
        await env.until("b reconciled", lambda: _has_status(env, "b"))
        await env.client.delete(PODS, "huge", NS)
        await env.until("huge gone", lambda: env.pod_gone("huge"))
        await seen.after(env, Request(NS, "b"))  # raises if that reconcile failed
        ledger = (await env.budget("b")).status.ledger
        assert ledger is None or not any(e.name == "huge" for e in ledger.entries or ())


async def _has_status(env: Env, name: str) -> bool:
    return (await env.budget(name)).status.observed_generation > 0


async def test_a_finished_pod_keeps_its_finalizer_until_every_retaining_budget_recorded_it(tmp_path: Path) -> None:
    """Both budgets first record `q`, so each has a ledger; then `lag`'s reconciles are held back while `p` runs
    and finishes: `first` records `p` and must leave its finalizer (a ledger that does not hold `p` is no record
    of it); once `lag` runs and records `p`, the finalizer goes and the deleted pod leaves the API."""
    async with environment(tmp_path) as env:
        handle = await env.start()
        seen = Reconciles(handle)  # counts only the reconciles let through: a held one is not "in flight"
        gate = asyncio.Event()
        gate.set()
        controller = handle.controller
        inner = controller.reconcile

        async def held_back(req: Request) -> Result | None:
            if req.name == "lag":
                await gate.wait()
            return await inner(req)

        controller.reconcile = held_back
        try:
            retain = {"retainFinishedPods": True}
            await env.create_budget(budget("first", "100", accounting=retain))
            await env.create_budget(budget("lag", "100", accounting=retain))

            async def finalizers(name: str) -> tuple[str, ...]:
                return (await env.client.get(PODS, name, NS)).metadata.finalizers or ()

            async def recorded_by(budget_name: str, pod_name: str) -> bool:
                ledger = (await env.budget(budget_name)).status.ledger
                return ledger is not None and any(e.name == pod_name for e in ledger.entries or ())

            await env.create_pod(pod("q", 1, 0.5))
            await env.until("first recorded q", lambda: recorded_by("first", "q"))
            await env.until("lag recorded q", lambda: recorded_by("lag", "q"))
            gate.clear()

            await env.create_pod(pod("p", 1, 1.0))
            await env.until("p holds the accounting finalizer", lambda: _holds(finalizers("p")))
            await env.until("p finished", lambda: env.all_finished(["p"]))
            await env.until("first recorded p", lambda: recorded_by("first", "p"))
            # a reconcile of `first` that started after its ledger held p has run its finalizer release
            await seen.after(env, Request(NS, "first"))
            assert FINALIZER in await finalizers("p"), "released before lag recorded the pod"
            await env.client.delete(PODS, "p", NS)
            assert await env.phase("p") is not None, "p left the API before lag recorded it"

            gate.set()
            await env.until("lag recorded p", lambda: recorded_by("lag", "p"), within=20)
            await env.until("p gone once both ledgers hold it", lambda: env.pod_gone("p"), within=20)
            for name in ("first", "lag"):
                assert await recorded_by(name, "p")
        finally:
            gate.set()  # a held reconcile would hold the manager's stop


async def _holds(finalizers: Awaitable[tuple[str, ...]]) -> bool:
    return FINALIZER in await finalizers


async def test_the_budgets_a_finished_pod_waits_for_are_every_retaining_one_that_has_not_recorded_it(
    tmp_path: Path,
) -> None:
    """Of the budgets selecting a finished pod, it keeps its finalizer for exactly the retaining ones, other
    than the one releasing it, that are not being deleted, count its GPUs, still have it in their window and have
    not recorded it, in whatever order the index lists them (each one asked to look again by name)."""
    async with environment(tmp_path) as env:
        handle = await env.start()
        rec = handle.reconciler
        held = asyncio.Event()  # no budget reconciles here: none records p, the cache is all this test reads

        async def never(req: Request) -> Result | None:
            await held.wait()
            return None

        handle.controller.reconcile = never
        try:
            retain = {"retainFinishedPods": True}
            await env.create_pod(pod("p", 1, 0.3))
            await env.until("p finished", lambda: env.all_finished(["p"]))
            names = ["a-first", "b-plain", "c-going", "d-other-resource", "b2-short", "e-wait", "f-wait"]
            for name in names:
                body = budget(name, "100", accounting=retain, window=1 if name == "b2-short" else 2)
                if name == "b-plain":
                    body = budget(name, "100", window=2)
                if name == "d-other-resource":
                    body["spec"]["gpuResourceName"] = "example.com/gpu"
                if name == "c-going":
                    body["metadata"]["finalizers"] = ["test.gpuops.io/hold"]
                await env.create_budget(body)
            await env.client.delete(BUDGETS, "c-going", NS)

            async def cached() -> bool:
                going = rec.budgets.store.get(f"{NS}/c-going")
                return all(rec.budgets.store.get(f"{NS}/{n}") is not None for n in names) and going is not None \
                    and going.metadata.deletion_timestamp is not None and rec.pods.store.get(f"{NS}/p") is not None

            await env.until("every budget and p cached", cached)
            p = rec.pods.store.get(f"{NS}/p")
            assert p is not None
            span = pod_span(p)
            assert span.final and span.end is not None
            hour = 3600 * S
            waiting = [Request(NS, "e-wait"), Request(NS, "f-wait")]
            assert sorted(rec._needers(p, span, span.end + S, exclude=f"{NS}/a-first")) == sorted(
                [*waiting, Request(NS, "b2-short")])
            for now in (span.end + hour, span.end + 2 * hour - 1):  # out of b2-short's one-hour window only
                got = rec._needers(p, span, now, exclude=f"{NS}/a-first")
                assert sorted(got) == waiting, (now, got)
            assert rec._needers(p, span, span.end + 2 * hour, exclude=f"{NS}/a-first") == []  # left every window
            await env.client.patch(BUDGETS, "c-going", {"metadata": {"finalizers": []}}, namespace=NS)
        finally:
            held.set()

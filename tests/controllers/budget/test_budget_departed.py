"""Deleted pods the budget controller remembers until a ledger holds them (so a pod deleted between two reconciles
keeps counting), and the eviction stops it forgets only once no budget needs them.

The reconciler's memory is driven by hand on the emulated cluster: its informers are real and filled by the API
server, its reconcile is held (nothing writes a ledger behind the test's back), and its clock stands still where
the test sets it, so each boundary (the window plus the compaction margin, a ledger entry, a second budget that
still waits) is asserted at the exact instant it moves.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from budget_harness import NS, S, held_reconciler

from gpuops.controllers.budget.api import GPUWorkloadBudget, LedgerEntryStatus, LedgerStatus
from gpuops.controllers.budget.reconciler import BudgetReconciler
from gpuops.kube.controller import Request

pytestmark = pytest.mark.anyio
HOUR = 3600 * S
MARGIN = 90.0
"""The compaction margin these tests run with (seconds; the default is 60)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def cached(rec: BudgetReconciler, name: str, holding: str | None = None) -> GPUWorkloadBudget:
    """The budget as cached, its ledger holding an entry for pod UID `holding` if given."""
    b = rec.budgets.store.get(f"{NS}/{name}")
    assert b is not None
    if holding is None:
        return b
    entry = LedgerEntryStatus(uid=holding, name="p", start="2026-01-01T00:00:00Z", end="2026-01-01T00:00:01Z",
                              gpus="1")
    ledger = LedgerStatus(resource_name="nvidia.com/gpu", entries=(entry,))
    return msgspec.structs.replace(b, status=msgspec.structs.replace(b.status, ledger=ledger))


async def test_a_deleted_pod_is_remembered_per_budget_until_its_ledger_holds_it(tmp_path: Path) -> None:
    async with held_reconciler(tmp_path, MARGIN, ["one", "two"]) as (rec, clock, p):
        uid = p.metadata.uid
        clock.set(50_000)
        rec._facts[uid] = rec._memo(p)  # what the reconciler knew of the live pod goes with it
        assert sorted(rec.map_deleted_pod(p)) == [Request(NS, "one"), Request(NS, "two")]
        assert uid not in rec._facts
        assert {k: {u: seen for u, (_, seen, _) in v.items()} for k, v in rec._departed.items()} == {
            f"{NS}/one": {uid: 50_000 * S}, f"{NS}/two": {uid: 50_000 * S}}
        rec.enforcer.stopped_at[uid] = 49_990 * S  # we evicted it without grace
        rec.enforcer.answered_at[uid] = 49_991 * S
        rec.prune_departed(cached(rec, "one"))  # its ledger does not hold p yet: kept
        assert uid in rec._departed[f"{NS}/one"]
        rec.prune_departed(cached(rec, "one", holding="another-pod"))
        assert uid in rec._departed[f"{NS}/one"]
        rec.prune_departed(cached(rec, "one", holding=uid))  # held: forgotten by this budget only
        assert f"{NS}/one" not in rec._departed and uid in rec._departed[f"{NS}/two"]
        assert rec.enforcer.stopped_at == {uid: 49_990 * S}  # budget two still needs where the eviction ended it
        rec.prune_departed(cached(rec, "two", holding=uid))
        assert rec._departed == {}
        assert rec.enforcer.stopped_at == {} and rec.enforcer.answered_at == {}


async def test_a_deleted_pod_is_forgotten_once_it_left_the_window_and_the_margin(tmp_path: Path) -> None:
    async with held_reconciler(tmp_path, MARGIN, ["one", "bad"]) as (rec, clock, p):
        uid = p.metadata.uid
        clock.set(50_000)
        assert rec.map_deleted_pod(p) == [Request(NS, "one")]  # an invalid budget selects nothing
        rec.enforcer.stopped_at[uid] = 49_990 * S
        horizon = 50_000 * S + HOUR + round(MARGIN * S)  # seen + window + margin: the last instant it is kept
        clock.fixed = horizon
        rec.prune_departed(cached(rec, "one"))
        assert uid in rec._departed[f"{NS}/one"] and uid in rec.enforcer.stopped_at
        clock.fixed = horizon + 1
        rec.prune_departed(cached(rec, "one"))
        assert rec._departed == {} and rec.enforcer.stopped_at == {}


async def test_an_invalid_budget_forgets_a_deleted_pod_only_through_its_ledger(tmp_path: Path) -> None:
    async with held_reconciler(tmp_path, MARGIN, ["bad"]) as (rec, clock, p):
        uid = p.metadata.uid
        clock.set(50_000)
        rec._departed[f"{NS}/bad"] = {uid: (p, 50_000 * S, "")}  # remembered while its spec was still valid
        rec.enforcer.stopped_at[uid] = 49_990 * S
        clock.set(50_000 + 10 * 24 * 3600)  # no window to leave: time alone forgets nothing
        rec.prune_departed(cached(rec, "bad"))
        assert uid in rec._departed[f"{NS}/bad"] and uid in rec.enforcer.stopped_at
        rec.prune_departed(cached(rec, "bad", holding=uid))
        assert rec._departed == {} and rec.enforcer.stopped_at == {}


async def test_forgetting_a_pod_that_was_not_stopped_leaves_the_other_stops(tmp_path: Path) -> None:
    async with held_reconciler(tmp_path, MARGIN, ["one"]) as (rec, clock, p):
        uid = p.metadata.uid
        clock.set(50_000)
        rec.map_deleted_pod(p)
        rec.enforcer.stopped_at["other"] = 49_990 * S  # another pod's stop, still needed
        rec.prune_departed(cached(rec, "one", holding=uid))
        assert rec._departed == {} and rec.enforcer.stopped_at == {"other": 49_990 * S}
        rec.prune_departed(cached(rec, "one", holding=uid))  # nothing remembered: nothing to do
        assert rec._departed == {}

"""An eviction without grace edits the budget's scrape snapshot at once: the evicted pod's interval ends at the
counting instant the eviction was sent, never before what a reported figure already counted, and a refused
eviction reopens it. Scrapes between two reconciles read this snapshot, so this is what keeps a scrape from
counting an evicted pod on (or taking back a counted second). The reconciler is real (held, its informers filled
by the emulated API server); the snapshot is set by the test so each instant is exact."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from budget_harness import NS, S, held_reconciler

from gpuops.accounting.gpuhours import Interval, Ledger
from gpuops.controllers.budget.api import BudgetSpec, Quota, parse_spec
from gpuops.controllers.budget.metrics import Published, Snapshot
from gpuops.controllers.budget.reconciler import BudgetReconciler
from gpuops.kube.objects import LabelSelector

pytestmark = pytest.mark.anyio
KEY = f"{NS}/one"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def publish(rec: BudgetReconciler, at: float) -> None:
    """A snapshot of two running pods (u1: 2 GPUs, u2: 1 GPU, both from 100 s), reported through `at` s."""
    live = (Interval(uid="u1", start=100 * S, gpus=Fraction(2)), Interval(uid="u2", start=100 * S, gpus=Fraction(1)))
    spec = parse_spec(BudgetSpec(selector=LabelSelector(match_labels={"team": "a"}),
                                 quota=Quota(gpu_hours="1", window_hours=1)))
    rec._snapshots[(NS, "one")] = Snapshot(live, Ledger(), spec, Published(round(at * S)))


def ends(rec: BudgetReconciler) -> dict[str, int | None]:
    return {i.uid: i.end for i in rec._snapshots[(NS, "one")].live}


async def test_an_eviction_ends_the_pod_in_the_snapshot_at_its_counting_instant(tmp_path: Path) -> None:
    async with held_reconciler(tmp_path, 60.0, ["one"]) as (rec, _clock, _p):
        publish(rec, 120.2)
        rec.enforcer.stopped_at["u1"] = 150_500_000  # sent at 150.5 s, after the last report
        rec._stop_counting(KEY, "u1", 150_500_000)
        assert rec.enforcer.stopped_at == {"u1": 150_500_000}
        assert ends(rec) == {"u1": 150 * S, "u2": None}  # the counting instant of the send; u2 untouched
        rec._stop_counting(KEY, "u1", None)  # refused: it runs on
        assert ends(rec) == {"u1": None, "u2": None}


async def test_an_eviction_never_ends_the_pod_before_what_a_figure_counted(tmp_path: Path) -> None:
    async with held_reconciler(tmp_path, 60.0, ["one"]) as (rec, _clock, _p):
        publish(rec, 200.0)  # a scrape already counted both pods through 200 s
        rec.enforcer.stopped_at["u1"] = 150_500_000
        rec._stop_counting(KEY, "u1", 150_500_000)
        assert rec.enforcer.stopped_at == {"u1": 200 * S}  # raised to what was counted: nothing taken back
        assert ends(rec) == {"u1": 200 * S, "u2": None}


async def test_a_stop_before_the_pod_started_ends_it_at_its_start(tmp_path: Path) -> None:
    async with held_reconciler(tmp_path, 60.0, ["one"]) as (rec, _clock, _p):
        publish(rec, 10.0)
        rec.enforcer.stopped_at["u2"] = 50 * S
        rec._stop_counting(KEY, "u2", 50 * S)
        assert ends(rec) == {"u1": None, "u2": 100 * S}  # an empty interval, never a negative one


async def test_a_stop_this_process_did_not_record_ends_at_the_instant_given_and_records_nothing(
    tmp_path: Path,
) -> None:
    async with held_reconciler(tmp_path, 60.0, ["one"]) as (rec, _clock, _p):
        publish(rec, 300.0)
        rec._stop_counting(KEY, "u2", 250_700_000)
        assert rec.enforcer.stopped_at == {}
        assert ends(rec) == {"u1": None, "u2": 250 * S}
        before = dict(rec._snapshots)
        rec._stop_counting(f"{NS}/no-such-budget", "u1", 250 * S)  # no snapshot: nothing to edit
        assert rec._snapshots == before and rec.enforcer.stopped_at == {}

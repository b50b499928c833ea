"""Wiring: informers (pods and Jobs shared with other controllers, budgets), the Controller, the Event writer
and the metrics source, all added to a `Manager`. `gpuops run` calls `setup` through its ControllerRegistry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuops.kube.controller import Controller, Predicate, resource_version_changed
from gpuops.kube.events import EventRecorder
from gpuops.kube.manager import Manager
from gpuops.kube.objects import Job, Pod
from gpuops.kube.resources import JOBS, PODS

from .api import BUDGETS, PAUSED_BY, GPUWorkloadBudget
from .enforcement import Enforcer
from .metrics import COLLECTOR
from .reconciler import BudgetReconciler, Options, wall_clock

__all__ = ["COMPONENT", "CONTROLLER_NAME", "BudgetController", "install", "setup"]

DEFAULT_STATUS_REFRESH = 60.0
"""Seconds between status rewrites while pods run (what `kubectl get gwb` shows drifts by at most this)."""
DEFAULT_WORKERS = 16
"""A budget reconcile mostly waits on its one status write: with 1,000 budgets and 100 pod completions/s the
4 workers other controllers use were all busy waiting (bench/scale.py) while the work queue grew."""
CONTROLLER_NAME = "budget"
COMPONENT = "gpuops-budget-controller"
"""source.component / reportingComponent of our Events."""


@dataclass(frozen=True, slots=True)
class BudgetController:
    reconciler: BudgetReconciler
    controller: Controller
    recorder: EventRecorder


def _spec_or_meta_changed(old: GPUWorkloadBudget, new: GPUWorkloadBudget) -> bool:
    """Our own status writes must not wake us (each would be a reconcile that writes again)."""
    a, b = old.metadata, new.metadata
    return (a.uid, a.generation, a.deletion_timestamp, a.labels, a.annotations, a.finalizers) != (
        b.uid, b.generation, b.deletion_timestamp, b.labels, b.annotations, b.finalizers
    )


def _paused(job: Job) -> bool:
    return PAUSED_BY in (job.metadata.annotations or {})


def _never(*_: Any) -> bool:
    return False


def install(
    manager: Manager,
    *,
    clock: Callable[[], int] = wall_clock,
    options: Options | None = None,
    **controller_options: Any,
) -> BudgetController:
    """Create and add everything; returns the parts (tests and benchmarks look inside)."""
    pods = manager.informer(PODS)
    budgets = manager.informer(BUDGETS)
    jobs = manager.informer(JOBS)
    opts = options or Options()
    recorder = EventRecorder(manager.client, COMPONENT)
    enforcer = Enforcer(manager.client, pods, jobs, recorder, opts.enforcement, clock=clock)
    reconciler = BudgetReconciler(manager.client, pods, budgets, jobs, enforcer, clock=clock, options=opts)
    controller = Controller(CONTROLLER_NAME, reconciler.reconcile, client=manager.client, **controller_options)
    controller.watch(budgets, predicates=[Predicate(update=_spec_or_meta_changed)])
    controller.watch(pods, reconciler.map_pod, predicates=[Predicate(delete=_never), resource_version_changed()])
    # Deleted pods are remembered from the start, on a standby too (its caches are warm, its controllers idle):
    # a pod that finishes and is deleted between a leader's death and the takeover is still accounted. The
    # keys queue until the controller runs; each budget's own updates prune what its ledger already holds.
    def on_pod_deleted(pod: Pod) -> None:
        for req in reconciler.map_deleted_pod(pod):
            controller.enqueue(req, trigger=f"delete pod {pod.metadata.namespace}/{pod.metadata.name}")

    pods.add_handler(on_delete=on_pod_deleted)
    budgets.add_handler(on_update=lambda _old, new: reconciler.prune_departed(new))
    controller.watch(jobs, reconciler.map_job, predicates=[
        Predicate(create=_paused, update=lambda a, b: _paused(a) or _paused(b), delete=_paused)])
    reconciler.controller = controller
    manager.add(controller)

    async def side_tasks() -> None:
        unregister = COLLECTOR.register(reconciler)
        recorder.start()
        try:
            await asyncio.Event().wait()
        finally:
            unregister()
            await recorder.stop(timeout=2.0)

    manager.add_runnable(f"{CONTROLLER_NAME}-events-and-metrics", side_tasks)
    return BudgetController(reconciler, controller, recorder)


async def setup(manager: Manager) -> None:
    """The ControllerRegistry entry: `CONTROLLERS.register("budget", "gpuops.controllers.budget:setup")`.

    Reads `budget_status_refresh` (seconds, 0 = only on changes) and `budget_max_concurrent_reconciles` from
    the manager's settings (`gpuops run --budget-status-refresh`, `--budget-max-concurrent-reconciles`)."""
    refresh = float(manager.settings.get("budget_status_refresh", DEFAULT_STATUS_REFRESH))
    workers = int(manager.settings.get("budget_max_concurrent_reconciles", DEFAULT_WORKERS))
    install(manager, options=Options(status_refresh=refresh or None), max_concurrent_reconciles=workers)

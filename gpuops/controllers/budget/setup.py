"""Wiring: informers (pods and Jobs shared with other controllers, budgets), the Controller, the Event writer
and the metrics source, all added to a `Manager`. `gpuops run` calls `setup` through its ControllerRegistry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuops.controllers.wiring import Installed, add_side_tasks
from gpuops.kube.controller import Controller, Predicate, Request, generation_changed, resource_version_changed
from gpuops.kube.events import EventRecorder
from gpuops.kube.manager import Manager
from gpuops.kube.objects import Job, Pod
from gpuops.kube.ownnamespace import own_namespace
from gpuops.kube.resources import JOBS, NODES, PODS

from .api import BUDGETS, PAUSED_BY, GPUWorkloadBudget
from .enforcement import Enforcer
from .gatehook import follow
from .gating import Gatekeeper
from .metrics import COLLECTOR
from .pricebook import PriceBook
from .pricelist import PRICE_LISTS
from .reconciler import BudgetReconciler, Options, wall_clock
from .settings import DEFAULT_NAMESPACE, Settings

__all__ = ["COMPONENT", "CONTROLLER_NAME", "BudgetController", "install", "setup"]

CONTROLLER_NAME = "budget"
PRICE_HISTORY = "budget-price-history"
"""The controller that records each GPUPriceList generation in its status.history."""
COMPONENT = "gpuops-budget-controller"
"""source.component / reportingComponent of our Events."""


BudgetController = Installed[BudgetReconciler]


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
    nodes = manager.informer(NODES)  # a pod's GPU model and capacity type are its node's
    opts = options or Options()
    recorder = EventRecorder(manager.client, COMPONENT)
    enforcer = Enforcer(manager.client, pods, jobs, recorder, opts.enforcement, clock=clock)
    prices = PriceBook(manager.client, manager.informer(PRICE_LISTS), clock=clock)
    gatekeeper = Gatekeeper(manager.client, pods)
    reconciler = BudgetReconciler(manager.client, pods, budgets, jobs, enforcer, nodes=nodes, prices=prices,
                                  gatekeeper=gatekeeper, clock=clock, options=opts)
    follow(budgets, gatekeeper.book, reconciler.spec_of)  # every replica's webhook answers as the leader decided
    controller = Controller(CONTROLLER_NAME, reconciler.reconcile, client=manager.client, **controller_options)
    controller.watch(budgets, predicates=[Predicate(update=_spec_or_meta_changed)])
    # A price list's new spec reprices every budget that may count with it; its history writes change nothing.
    controller.watch(prices.price_lists, lambda _: [Request(b.metadata.namespace, b.metadata.name)
                                                    for b in budgets.store.list()],
                     predicates=[generation_changed()])
    history = Controller(PRICE_HISTORY, prices.reconcile, client=manager.client)
    history.watch(prices.price_lists, predicates=[generation_changed()])
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
    manager.add(history)
    add_side_tasks(manager, CONTROLLER_NAME, recorder, lambda: COLLECTOR.register(reconciler))
    return Installed(reconciler, controller, recorder)


def setup(manager: Manager, settings: Settings) -> None:
    """The registry's entry (settings.CONTROLLER): the controller and, with a webhook port, the Gate webhook."""
    parts = install(manager, options=Options(status_refresh=settings.status_refresh or None),
                    max_concurrent_reconciles=settings.max_concurrent_reconciles)
    if settings.webhook_port:
        from . import gatewebhook  # the webhook's certificates need the cryptography package

        gatewebhook.install(manager, parts.reconciler, service=settings.webhook_service,
                            namespace=settings.webhook_namespace or own_namespace() or DEFAULT_NAMESPACE,
                            port=settings.webhook_port, host=settings.webhook_host or None,
                            cert_dir=settings.webhook_cert_dir)

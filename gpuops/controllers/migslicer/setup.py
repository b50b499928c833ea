"""Wiring of the MIG allocator into a `Manager`: informers (pods and nodes shared with the other controllers,
MigNodes, claims), the allocator's controller, Events and metrics. `gpuops run` calls `setup` through its
ControllerRegistry, together with the admission webhook (which serves on every replica)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuops.controllers.coexistence import mig_manager_conflict
from gpuops.controllers.wiring import Installed, add_side_tasks
from gpuops.kube.controller import Controller, Predicate, resource_version_changed
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import INDEX_NODE, Informer, pods_by_node
from gpuops.kube.manager import Manager
from gpuops.kube.objects import Node
from gpuops.kube.ownnamespace import own_namespace
from gpuops.kube.resources import NODES, PODS
from gpuops.kube.times import wall_clock

from .allocator import (
    INDEX_CLAIMS_BY_NODE,
    INDEX_CLAIMS_BY_POD,
    INDEX_GATED,
    Allocator,
    claims_by_node,
    claims_by_pod,
    gated,
)
from .api import CLAIMS, MIG_NODES, OUR_PREFIX, MigNode
from .conflicts import MigConflicts
from .metrics import STATE_COLLECTOR
from .settings import DEFAULT_NAMESPACE, Settings

__all__ = ["COMPONENT", "CONTROLLER_NAME", "MigAllocatorController", "install", "setup"]

CONTROLLER_NAME = "migslicer"
COMPONENT = "gpuops-mig-allocator"


MigAllocatorController = Installed[Allocator]


def _mig_allocatable_changed(old: Node, new: Node) -> bool:
    def mig(n: Node) -> dict[str, object]:
        return {k: v for k, v in (n.status.allocatable or {}).items() if k.startswith(OUR_PREFIX)}

    return mig(old) != mig(new) or _conflict_changed(old, new)


def _conflict_changed(old: Node, new: Node) -> bool:
    """Another MIG manager's labels came or went: the node is held, or may be planned on again."""
    return mig_manager_conflict(old.metadata.labels) != mig_manager_conflict(new.metadata.labels)


def _slices_changed(old: MigNode, new: MigNode) -> bool:
    """Heartbeats alone do not wake gated pods; a change of GPUs or slices does."""
    return old.status.gpus != new.status.gpus


def install(
    manager: Manager,
    *,
    settings: Settings | None = None,
    clock: Callable[[], int] = wall_clock,
    **controller_options: Any,
) -> MigAllocatorController:
    pods = manager.informer(PODS)
    pods.add_index(INDEX_GATED, gated)
    pods.add_index(INDEX_NODE, pods_by_node)
    nodes = manager.informer(NODES)
    mig_nodes = manager.informer(MIG_NODES)
    claims = manager.informer(CLAIMS, namespace=None)
    claims.add_index(INDEX_CLAIMS_BY_POD, claims_by_pod)
    claims.add_index(INDEX_CLAIMS_BY_NODE, claims_by_node)
    recorder = EventRecorder(manager.client, COMPONENT)
    allocator = Allocator(manager.client, pods, nodes, mig_nodes, claims, recorder, settings=settings or Settings(),
                          clock=clock)
    # one worker: plans see each other's claims at once (the in-process reservations), never the same slice
    controller = Controller(CONTROLLER_NAME, allocator.reconcile, client=manager.client,
                            **{"max_concurrent_reconciles": 1, **controller_options})
    controller.watch(pods, allocator.map_pod, predicates=[resource_version_changed()])
    controller.watch(mig_nodes, allocator.map_capacity, predicates=[Predicate(update=_slices_changed)])
    controller.watch(claims, allocator.map_claim, predicates=[resource_version_changed()])
    # a node's allocatable catching up with the advertised slices lets its waiting pods be ungated
    controller.watch(nodes, allocator.map_capacity, predicates=[Predicate(update=_mig_allocatable_changed)])
    allocator.controller = controller
    manager.add(controller)
    _install_conflicts(manager, nodes, mig_nodes, recorder)

    def _gated() -> int:
        return len(pods.store.by_index(INDEX_GATED, ""))

    add_side_tasks(manager, CONTROLLER_NAME, recorder,
                   lambda: STATE_COLLECTOR.register((mig_nodes.store.list, claims.store.list, _gated)))
    return Installed(allocator, controller, recorder)


def _install_conflicts(manager: Manager, nodes: Informer[Node], mig_nodes: Informer[MigNode],
                       recorder: EventRecorder) -> Controller:
    """The MigNodes' ConflictDetected condition (conflicts.py), a controller of its own: the allocator's single
    worker is for placements, and a label change must not wait behind them."""
    conflicts = MigConflicts(manager.client, nodes, mig_nodes, recorder)
    controller = Controller(f"{CONTROLLER_NAME}-conflicts", conflicts.reconcile, client=manager.client)
    controller.watch(nodes, conflicts.map_node, predicates=[Predicate(update=_conflict_changed)])
    controller.watch(mig_nodes, conflicts.map_mig_node, predicates=[Predicate(update=_conditions_or_node_changed)])
    manager.add(controller)
    return controller


def _conditions_or_node_changed(old: MigNode, new: MigNode) -> bool:
    """Heartbeats alone change nothing here; a new MigNode's first report, or its conditions edited, do."""
    return old.status.conditions != new.status.conditions or old.spec != new.spec


def setup(manager: Manager, settings: Settings) -> None:
    """The registry's entry (settings.CONTROLLER): the allocator (leader-elected) and, unless the webhook port
    is 0, the admission webhook with its caBundle patcher (on every replica)."""
    install(manager, settings=settings)
    if settings.webhook_port:
        from . import webhook

        webhook.install(manager, service=settings.webhook_service,
                        namespace=settings.webhook_namespace or own_namespace() or DEFAULT_NAMESPACE,
                        port=settings.webhook_port, host=settings.webhook_host or None,
                        cert_dir=settings.webhook_cert_dir)

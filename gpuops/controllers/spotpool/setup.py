"""Wiring: informers (pods and nodes shared with the other controllers, pools), the reconciler, Events and
metrics, all added to a `Manager`. `gpuops run` calls `setup` through its ControllerRegistry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from gpuops.controllers.coexistence import karpenter_nodepool
from gpuops.controllers.secretscope import SecretScope
from gpuops.controllers.wiring import Installed, add_side_tasks
from gpuops.kube import conditions as cond
from gpuops.kube.controller import Controller, Predicate, resource_version_changed
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import INDEX_NODE, pods_by_node
from gpuops.kube.manager import Manager
from gpuops.kube.objects import Node
from gpuops.kube.resources import NODES, PODS
from gpuops.kube.times import wall_clock

from . import nodes as nd
from .api import POOLS, SpotPool
from .metrics import STATE_COLLECTOR
from .providers import make_provider
from .providers.base import Provider, ProviderConfig
from .reconciler import INDEX_UNSCHEDULABLE, SpotPoolReconciler, unschedulable
from .settings import MIN_RESYNC, Settings

__all__ = ["COMPONENT", "CONTROLLER_NAME", "SpotPoolController", "install", "setup"]

CONTROLLER_NAME = "spotpool"
COMPONENT = "gpuops-spotpool-controller"


SpotPoolController = Installed[SpotPoolReconciler]


def _node_facts(n: Node) -> tuple[Any, ...]:
    """What a pool reacts to on its nodes; heartbeats and other status churn are not among them."""
    return (cond.is_true(n.status.conditions, "Ready"), nd.notice_at(n), tuple(sorted((n.status.allocatable or {})
            .items())), (n.metadata.labels or {}).get(nd.POOL_LABEL), n.spec.provider_id,
            tuple((t.key, t.effect) for t in n.spec.taints or ()), n.metadata.deletion_timestamp,
            karpenter_nodepool(n))


def _node_changed(old: Node, new: Node) -> bool:
    return _node_facts(old) != _node_facts(new)


def _spec_or_meta_changed(old: SpotPool, new: SpotPool) -> bool:
    """Our own status writes do not wake the pool: the reconcile that wrote them asked for its requeue."""
    a, b = old.metadata, new.metadata
    return (a.generation, a.deletion_timestamp, a.finalizers) != (b.generation, b.deletion_timestamp, b.finalizers)


def install(
    manager: Manager,
    *,
    settings: Settings | None = None,
    clock: Callable[[], int] = wall_clock,
    provider_factory: Callable[[str, ProviderConfig], Provider] = make_provider,
    **controller_options: Any,
) -> SpotPoolController:
    pods = manager.informer(PODS)
    pods.add_index(INDEX_NODE, pods_by_node)
    pods.add_index(INDEX_UNSCHEDULABLE, unschedulable)
    nodes = manager.informer(NODES)
    nodes.add_index(nd.INDEX_INSTANCE, nd.nodes_by_instance)
    pools = manager.informer(POOLS)
    recorder = EventRecorder(manager.client, COMPONENT)
    reconciler = SpotPoolReconciler(manager.client, pools, nodes, pods, recorder, settings=settings or Settings(),
                                    clock=clock, provider_factory=provider_factory)
    controller = Controller(CONTROLLER_NAME, reconciler.reconcile, client=manager.client, **controller_options)
    controller.watch(pools, reconciler.map_pool, predicates=[Predicate(update=_spec_or_meta_changed)])
    controller.watch(nodes, reconciler.map_node, predicates=[Predicate(update=_node_changed)])
    controller.watch(pods, reconciler.map_pod, predicates=[resource_version_changed()])
    reconciler.controller = controller
    manager.add(controller)

    add_side_tasks(manager, CONTROLLER_NAME, recorder, lambda: STATE_COLLECTOR.register(pools.store.list),
                   close=[reconciler.close])
    return Installed(reconciler, controller, recorder)


def setup(manager: Manager, settings: Settings) -> None:
    """The registry's entry (settings.CONTROLLER): Secrets may be read in this process's namespace and
    `settings.secret_namespaces`."""
    install(manager, settings=msgspec.structs.replace(
        settings, resync_seconds=max(MIN_RESYNC, settings.resync_seconds),
        secret_scope=SecretScope.of_process(settings.secret_namespaces)))

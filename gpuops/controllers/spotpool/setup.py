"""Wiring: informers (pods and nodes shared with the other controllers, pools), the reconciler, Events and
metrics, all added to a `Manager`. `gpuops run` calls `setup` through its ControllerRegistry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuops.controllers.coexistence import karpenter_nodepool
from gpuops.controllers.secretscope import SecretScope
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
from .reconciler import INDEX_UNSCHEDULABLE, Settings, SpotPoolReconciler, unschedulable

__all__ = ["COMPONENT", "CONTROLLER_NAME", "SpotPoolController", "install", "setup"]

CONTROLLER_NAME = "spotpool"
COMPONENT = "gpuops-spotpool-controller"


@dataclass(frozen=True, slots=True)
class SpotPoolController:
    reconciler: SpotPoolReconciler
    controller: Controller
    recorder: EventRecorder


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
    reconciler = SpotPoolReconciler(manager.client, pools, nodes, pods, recorder, settings=settings, clock=clock,
                                    provider_factory=provider_factory)
    controller = Controller(CONTROLLER_NAME, reconciler.reconcile, client=manager.client, **controller_options)
    controller.watch(pools, reconciler.map_pool, predicates=[Predicate(update=_spec_or_meta_changed)])
    controller.watch(nodes, reconciler.map_node, predicates=[Predicate(update=_node_changed)])
    controller.watch(pods, reconciler.map_pod, predicates=[resource_version_changed()])
    reconciler.controller = controller
    manager.add(controller)

    async def side_tasks() -> None:
        unregister = STATE_COLLECTOR.register(pools.store.list)
        recorder.start()
        try:
            await asyncio.Event().wait()
        finally:
            unregister()
            await recorder.stop(timeout=2.0)
            await reconciler.close()

    manager.add_runnable(f"{CONTROLLER_NAME}-events-and-metrics", side_tasks)
    return SpotPoolController(reconciler, controller, recorder)


async def setup(manager: Manager) -> None:
    """The ControllerRegistry entry; reads `spotpool_resync`, `spotpool_call_timeout` and `secret_namespaces` from
    the manager's settings (`gpuops run` flags)."""
    resync = max(1.0, float(manager.settings.get("spotpool_resync", 30.0)))
    timeout = float(manager.settings.get("spotpool_call_timeout", 15.0))
    install(manager, settings=Settings(resync_seconds=resync, call_timeout=timeout,
                                       secret_scope=SecretScope.from_settings(manager.settings)))

"""Wiring: informers (pods and nodes shared with other controllers, groups), the webhook client, the
Controller, Events and metrics, all added to a `Manager`; k8s-gpu-autoprovision's GPU_NODE_<n>_* environment variables
become GPUNodeGroup objects at start. `gpuops run` calls `setup` through its ControllerRegistry."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import structlog

from gpuops.controllers.apigroup import API_VERSION
from gpuops.controllers.secretscope import SecretScope
from gpuops.controllers.wiring import Installed, add_side_tasks
from gpuops.kube.controller import Controller, Predicate, resource_version_changed
from gpuops.kube.errors import AlreadyExists
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import INDEX_NAMESPACE, INDEX_NODE, by_namespace, pods_by_node
from gpuops.kube.manager import Manager
from gpuops.kube.resources import NODES, PDBS, PODS

from .api import GROUPS, KIND, EnvGroup, GPUNodeGroup, groups_from_env
from .metrics import STATE_COLLECTOR
from .power import PowerClient
from .reconciler import Autoprovisioner, wall_clock
from .settings import Settings

__all__ = ["COMPONENT", "CONTROLLER_NAME", "AutoprovisionController", "install", "setup"]

CONTROLLER_NAME = "autoprovision"
COMPONENT = "gpuops-autoprovision-controller"
FIELD_MANAGER = "gpuops-autoprovision-env"
log = structlog.get_logger("gpuops.controllers.autoprovision")


AutoprovisionController = Installed[Autoprovisioner]


def _spec_or_meta_changed(old: GPUNodeGroup, new: GPUNodeGroup) -> bool:
    """Our own status writes wake the group's state machine only through the explicit requeues."""
    a, b = old.metadata, new.metadata
    return (a.generation, a.deletion_timestamp, a.labels) != (b.generation, b.deletion_timestamp, b.labels) or \
        (old.status.state, old.status.transition) != (new.status.state, new.status.transition)


def _never(*_: Any) -> bool:
    return False


def install(
    manager: Manager,
    *,
    settings: Settings | None = None,
    clock: Callable[[], int] = wall_clock,
    power: PowerClient | None = None,
    env: Mapping[str, str] | None = None,
    **controller_options: Any,
) -> AutoprovisionController:
    pods = manager.informer(PODS)
    pods.add_index(INDEX_NODE, pods_by_node)
    nodes = manager.informer(NODES)
    groups = manager.informer(GROUPS)
    pdbs = manager.informer(PDBS)
    pdbs.add_index(INDEX_NAMESPACE, by_namespace)
    recorder = EventRecorder(manager.client, COMPONENT)
    client = power or PowerClient()
    reconciler = Autoprovisioner(manager.client, groups, nodes, pods, recorder, client, pdbs=pdbs,
                                 settings=settings or Settings(), clock=clock)
    controller = Controller(CONTROLLER_NAME, reconciler.reconcile, client=manager.client, **controller_options)
    controller.watch(groups, reconciler.map_group, predicates=[Predicate(update=_spec_or_meta_changed)])
    controller.watch(nodes, reconciler.map_node, predicates=[resource_version_changed()])
    controller.watch(pods, reconciler.map_pod, predicates=[Predicate(delete=_never), resource_version_changed()])
    controller.watch(pods, reconciler.map_deleted_pod, predicates=[Predicate(create=_never, update=_never)])
    reconciler.controller = controller
    manager.add(controller)
    seed = groups_from_env(os.environ if env is None else env)
    add_side_tasks(manager, CONTROLLER_NAME, recorder, lambda: STATE_COLLECTOR.register(groups.store.list),
                   first=lambda: _create_seed_groups(manager, seed), close=[client.close])
    return Installed(reconciler, controller, recorder)


async def _create_seed_groups(manager: Manager, seed: list[EnvGroup]) -> None:
    """k8s-gpu-autoprovision's environment variables (GPU_NODE_<n>_*), as objects users can see and edit."""
    for g in seed:
        body = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": g.spec.node_name, "labels": {"gpuops.io/from-env": g.prefix.lower()}},
                "spec": msgspec.to_builtins(g.spec)}
        try:
            await manager.client.create(GROUPS, body, field_manager=FIELD_MANAGER)
            log.info("node group created from environment", group=g.spec.node_name, prefix=g.prefix)
        except AlreadyExists:
            pass  # created by an earlier start (or by hand): the object is the truth now


def setup(manager: Manager, settings: Settings) -> None:
    """The registry's entry (settings.CONTROLLER): Secrets may be read in this process's namespace and
    `settings.secret_namespaces`."""
    scope = SecretScope.of_process(settings.secret_namespaces)
    install(manager, settings=msgspec.structs.replace(settings, secret_scope=scope))

"""An instance leaving on its own (stopping, stopped, shut down) is out of capacity from the moment it is first
seen going, and that moment is kept: it comes from the pool's status, so a resync writes nothing new."""

from __future__ import annotations

from typing import Any

from gpuops.accounting.pool import InstanceState
from gpuops.controllers.spotpool.api import InstanceStatus, PoolStatus, SpotPool
from gpuops.controllers.spotpool.nodes import INDEX_INSTANCE, nodes_by_instance
from gpuops.controllers.spotpool.providers.base import CloudInstance
from gpuops.controllers.spotpool.reconciler import SpotPoolReconciler
from gpuops.kube.informer import INDEX_NODE, Informer, pods_by_node
from gpuops.kube.objects import Node, Pod
from gpuops.kube.resources import NODES, PODS
from gpuops.kube.times import format_time

SECOND = 1_000_000
T0 = 1_900_000_000 * SECOND


class _NoClient:
    """Never called: `_view` reads only the (empty) informer stores."""

    host = "unused"


def reconciler() -> SpotPoolReconciler:
    client: Any = _NoClient()
    nodes: Informer[Node] = Informer(client, NODES)
    nodes.add_index(INDEX_INSTANCE, nodes_by_instance)
    pods: Informer[Pod] = Informer(client, PODS)
    pods.add_index(INDEX_NODE, pods_by_node)
    return SpotPoolReconciler(client, Informer(client, NODES), nodes, pods, client)  # type: ignore[arg-type]


def test_first_seen_leaving_is_kept_across_resyncs() -> None:
    r = reconciler()
    stopped = CloudInstance(id="ins-1", state=InstanceState.STOPPED)
    first = r._view(SpotPool(), stopped, T0)
    assert first.doomed_at == T0
    recorded = SpotPool(status=PoolStatus(instances=(InstanceStatus(id="ins-1", reclaim_at=format_time(T0)),)))
    again = r._view(recorded, stopped, T0 + 30 * SECOND)
    assert again.doomed_at == T0, "a resync moved the recorded moment (and would rewrite the status)"


def test_a_live_instance_is_not_doomed() -> None:
    r = reconciler()
    running = CloudInstance(id="ins-2", state=InstanceState.RUNNING)
    assert r._view(SpotPool(), running, T0).doomed_at is None

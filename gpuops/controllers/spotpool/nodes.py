"""Instances <-> Nodes: which Node an instance became, whether it is Ready, whether a node agent reported a
spot termination notice on it, and the writes a pool makes to its nodes (join labels and taints, cordon for
a drain, evictions).

Matching needs no cooperation from the boot script: the node's `spec.providerID` ends with the instance id on
every cloud controller manager we know (`aws:///<zone>/<id>`, `qcloud:///<zone>/<id>`); failing that the node
name is the provider's hint, or the cloud's default host name `ip-a-b-c-d` of the private IP.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

import msgspec
import structlog

from gpuops.accounting.quantity import parse_quantity
from gpuops.controllers.nodelabels import SPOT_POOL_LABEL
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, Conflict, NotFound
from gpuops.kube.informer import INDEX_NODE, Informer
from gpuops.kube.objects import Node, Pod, Taint
from gpuops.kube.resources import NODES
from gpuops.kube.times import parse_time_or_none

from .providers.base import CloudInstance

__all__ = [
    "INDEX_INSTANCE",
    "NOTICE_ANNOTATION",
    "NOTICE_TAINTS",
    "POOL_LABEL",
    "RETIRE_TAINT",
    "drain",
    "gpus_allocatable",
    "join",
    "match",
    "nodes_by_instance",
    "notice_at",
    "ready",
    "set_retire_taint",
    "workload_pods",
]

log = structlog.get_logger("gpuops.controllers.spotpool")

POOL_LABEL = SPOT_POOL_LABEL
"""On every node of a pool (the value names it); budgets read it as spot capacity."""
RETIRE_TAINT = "gpuops.io/spot-retire"
NOTICE_ANNOTATION = "gpuops.io/spot-termination-time"
"""Set by a node agent that polls the instance metadata service (Tencent `spot/termination-time`, AWS
`spot/instance-action`): the RFC 3339 instant the cloud will take the instance."""
NOTICE_TAINTS = ("aws-node-termination-handler/spot-itn", "gpuops.io/spot-termination")
"""Taints other node agents put on a node under a spot interruption notice."""
INDEX_INSTANCE = "gpuops.io/instance-id"
_TERMINAL = ("Succeeded", "Failed")


def _instance_id(provider_id: str) -> str:
    return provider_id.rstrip("/").rsplit("/", 1)[-1] if provider_id else ""


def nodes_by_instance(node: Node) -> tuple[str, ...]:
    """Index function: the instance id at the end of the node's providerID."""
    iid = _instance_id(node.spec.provider_id)
    return (iid,) if iid else ()


def match(nodes: Informer[Node], inst: CloudInstance) -> Node | None:
    """The Node this instance became, if it has joined: by providerID, else by name."""
    found = nodes.store.by_index(INDEX_INSTANCE, inst.id)
    if found:
        return found[0]
    for name in (inst.node_name, "ip-" + inst.private_ip.replace(".", "-") if inst.private_ip else None):
        if name:
            node = nodes.store.get(name)
            if node is not None:
                return node
    return None


def gpus_allocatable(node: Node, resource: str) -> Fraction:
    raw = (node.status.allocatable or {}).get(resource)
    if raw is None:
        return Fraction(0)
    try:
        return parse_quantity(raw)
    except ValueError:
        return Fraction(0)


def ready(node: Node | None, resource: str) -> bool:
    """Ready with its GPUs advertised: a GPU node whose device plugin is not up yet is not capacity."""
    return node is not None and cond.is_true(node.status.conditions, "Ready") and \
        gpus_allocatable(node, resource) > 0


def notice_at(node: Node | None) -> int | None:
    """When a node agent says the cloud takes this node's instance (microseconds); None without a notice."""
    if node is None:
        return None
    raw = (node.metadata.annotations or {}).get(NOTICE_ANNOTATION)
    if raw:
        at = parse_time_or_none(raw)
        if at is not None:
            return at
    for t in node.spec.taints or ():
        if t.key in NOTICE_TAINTS:
            return parse_time_or_none(t.time_added) or 0
    return None


async def join(client: Client, node: Node, pool: str, labels: Mapping[str, str], taints: Iterable[Taint]) -> bool:
    """Give a newly joined node the pool's label and the template's labels and taints (the boot script may
    already have: then nothing is written). True when a write was made."""
    have = node.metadata.labels or {}
    want = {POOL_LABEL: pool, **labels}
    missing_labels = {k: v for k, v in want.items() if have.get(k) != v}
    current = list(node.spec.taints or ())
    keys = {(t.key, t.effect) for t in current}
    missing_taints = [t for t in taints if (t.key, t.effect) not in keys]
    if not missing_labels and not missing_taints:
        return False
    body: dict[str, object] = {"metadata": {"labels": missing_labels,
                                            "resourceVersion": node.metadata.resource_version}}
    if missing_taints:
        body["spec"] = {"taints": msgspec.to_builtins([*current, *missing_taints])}
    try:
        await client.patch(NODES, node.metadata.name, body)
    except (Conflict, NotFound) as e:
        log.debug("node join update skipped", node=node.metadata.name, error=str(e))
        return False
    log.info("node joined pool", node=node.metadata.name, pool=pool)
    return True


async def set_retire_taint(client: Client, node: Node, on: bool) -> None:
    """Cordon (NoSchedule taint, so DaemonSets and tolerating pods are judged as for a drain) or uncordon."""
    taints = list(node.spec.taints or ())
    has = any(t.key == RETIRE_TAINT for t in taints)
    if has == on:
        return
    taints = [*taints, Taint(key=RETIRE_TAINT, value="scale-in", effect="NoSchedule")] if on else \
        [t for t in taints if t.key != RETIRE_TAINT]
    body = {"metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": msgspec.to_builtins(taints) or None}}
    try:
        await client.patch(NODES, node.metadata.name, body)
    except (Conflict, NotFound) as e:
        log.debug("node taint update skipped", node=node.metadata.name, error=str(e))


def _daemon(pod: Pod) -> bool:
    return any(r.kind == "DaemonSet" and r.controller for r in pod.metadata.owner_references or ())


def workload_pods(pods: Informer[Pod], node: str) -> list[Pod]:
    """Pods a drain must move: not finished, not DaemonSet-owned."""
    return [p for p in pods.store.by_index(INDEX_NODE, node)
            if p.status.phase not in _TERMINAL and not _daemon(p)]


async def drain(client: Client, pods: Informer[Pod], node: str) -> int:
    """Evict the node's workload pods through the Eviction API (PDBs decide); returns how many are left."""
    left = workload_pods(pods, node)
    for p in left:
        if p.metadata.deletion_timestamp:
            continue
        try:
            await client.evict(p.metadata.name, p.metadata.namespace)
        except NotFound:
            pass
        except ApiError as e:  # 429 from a PodDisruptionBudget: try again on the next pass
            log.info("eviction refused while draining", pod=f"{p.metadata.namespace}/{p.metadata.name}",
                     node=node, error=str(e))
    return len(left)

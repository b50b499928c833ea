"""What the scheduler would say about a pod, as the controllers need it: its effective request of a resource,
whether it is unschedulable or holding a node's GPUs, and whether a node (labels, taints) admits it.

Shared by the autoprovision and spot pool controllers, which both ask "could this pending pod run on a node we
would bring up?" before the node exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.requests import Container, PodSpecRequests, pod_request
from gpuops.kube.objects import NodeSelectorRequirement, Pod, Taint, Toleration

__all__ = [
    "INDEX_UNSCHEDULABLE",
    "gpu_request",
    "is_unschedulable",
    "node_admits",
    "required_affinity_holds",
    "tolerates_all",
    "unschedulable",
    "uses_gpus",
]

_TERMINAL = ("Succeeded", "Failed")
_BLOCKING = ("NoSchedule", "NoExecute")


def _container(c: object) -> Container:
    r = getattr(c, "resources", None)
    return Container(
        getattr(c, "name", ""),
        requests=dict(r.requests or {}) if r is not None else {},
        limits=dict(r.limits or {}) if r is not None else {},
        restartable=getattr(c, "restart_policy", None) == "Always",
    )


_REQUESTS: dict[tuple[str, str, str], Fraction] = {}
"""gpu_request's memo: (pod uid, resourceVersion, resource) -> request. A resourceVersion names one content of
the object, so an entry is never stale; it is cleared whole when full (amortised O(1), bounded memory)."""
REQUESTS_MAX = 16_384


def gpu_request(pod: Pod, resource: str) -> Fraction:
    """The pod's effective request of `resource` (0 when unreadable: the API server would not have taken it).

    Memoised per pod version: the planners ask again for the same cached pods on every plan (the autoprovisioner
    twice per managed node per plan), and parsing the quantities exactly is what a plan's time went to (~180 ms
    per plan at 200 node groups, bench/scale.py). Pods without a uid or resourceVersion (built in memory, never
    read from the API) are computed every time."""
    meta = pod.metadata
    key = (meta.uid, meta.resource_version, resource) if meta.uid and meta.resource_version else None
    if key is not None:
        hit = _REQUESTS.get(key)
        if hit is not None:
            return hit
    value = _gpu_request(pod, resource)
    if key is not None:
        if len(_REQUESTS) >= REQUESTS_MAX:
            _REQUESTS.clear()
        _REQUESTS[key] = value
    return value


def _gpu_request(pod: Pod, resource: str) -> Fraction:
    spec = pod.spec
    try:
        return pod_request(PodSpecRequests(
            init_containers=[_container(c) for c in spec.init_containers or ()],
            containers=[_container(c) for c in spec.containers or ()],
            overhead=dict(spec.overhead or {}),
        ), resource)
    except AccountingError:
        return Fraction(0)


def is_unschedulable(pod: Pod) -> bool:
    if pod.spec.node_name or pod.metadata.deletion_timestamp or pod.status.phase in _TERMINAL:
        return False
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in pod.status.conditions or ())


INDEX_UNSCHEDULABLE = "gpuops.io/unschedulable"
"""Pod index of the pods the scheduler gave up on, under one key (""): demand is read from it, not from a scan of
every pod. Shared by the controllers that read demand; the same function object, so adding it twice is a no-op."""


def unschedulable(pod: Pod) -> tuple[str, ...]:
    """Index function for INDEX_UNSCHEDULABLE."""
    return ("",) if is_unschedulable(pod) else ()


def uses_gpus(pod: Pod, resource: str) -> bool:
    """A pod bound to a node that holds (or is about to hold) its GPUs: not finished."""
    return bool(pod.spec.node_name) and pod.status.phase not in _TERMINAL and gpu_request(pod, resource) > 0


def _tolerated(taint: Taint, tolerations: Iterable[Toleration]) -> bool:
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists":
            if not t.key or t.key == taint.key:
                return True
        elif t.key == taint.key and t.value == taint.value:
            return True
    return False


def _requirement_holds(req: NodeSelectorRequirement, value: str | None) -> bool:
    values = req.values or ()
    op = req.operator
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def required_affinity_holds(pod: Pod, node_name: str, labels: Mapping[str, str]) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution: any term whose expressions (labels) and fields
    (metadata.name, the only field the scheduler supports) all hold; no terms at all match nothing."""
    affinity = pod.spec.affinity
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution \
        if affinity is not None and affinity.node_affinity is not None else None
    if required is None:
        return True
    for term in required.node_selector_terms or ():
        if not (term.match_expressions or term.match_fields):
            continue  # an empty term matches no node
        if all(_requirement_holds(r, labels.get(r.key)) for r in term.match_expressions or ()) and all(
            _requirement_holds(r, node_name if r.key == "metadata.name" else None) for r in term.match_fields or ()
        ):
            return True
    return False


def tolerates_all(pod: Pod, taints: Iterable[Taint]) -> bool:
    tolerations = pod.spec.tolerations or ()
    return all(_tolerated(t, tolerations) for t in taints if t.effect in _BLOCKING)


def node_admits(pod: Pod, node_name: str, labels: Mapping[str, str], taints: Iterable[Taint]) -> bool:
    """nodeSelector, required node affinity and NoSchedule/NoExecute taints, as the scheduler filters them."""
    selector = pod.spec.node_selector or {}
    return (all(labels.get(k) == v for k, v in selector.items()) and tolerates_all(pod, taints)
            and required_affinity_holds(pod, node_name, labels))

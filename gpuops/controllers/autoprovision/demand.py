"""Pods and nodes -> the inputs of `gpuops.accounting.capacity`: what is pending, and where it could run.

Demand is a pod the scheduler gave up on (PodScheduled=False, reason Unschedulable), not terminating, not
bound, asking for a group's GPU resource (its effective request: init containers, sidecars and overhead as
the scheduler counts them). Pods bound to a node and still starting are not demand; they make their node busy.
A pod may go to a group when the node's labels (its Node's once it has joined, else the template's) satisfy
the pod's nodeSelector and required node affinity, and the pod tolerates the node's NoSchedule/NoExecute taints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

from gpuops.accounting.capacity import PendingPod
from gpuops.accounting.errors import AccountingError
from gpuops.accounting.requests import Container, PodSpecRequests, pod_request
from gpuops.kube.objects import Node, NodeSelectorRequirement, Pod, Taint, Toleration

__all__ = [
    "NodeView",
    "demand",
    "gpu_request",
    "is_unschedulable",
    "required_affinity_holds",
    "tolerates_all",
    "uses_gpus",
]

_TERMINAL = ("Succeeded", "Failed")
_BLOCKING = ("NoSchedule", "NoExecute")
_CONDITION_TAINTS = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")


def _container(c: object) -> Container:
    r = getattr(c, "resources", None)
    return Container(
        getattr(c, "name", ""),
        requests=dict(r.requests or {}) if r is not None else {},
        limits=dict(r.limits or {}) if r is not None else {},
        restartable=getattr(c, "restart_policy", None) == "Always",
    )


def gpu_request(pod: Pod, resource: str) -> Fraction:
    """The pod's effective request of `resource` (0 when unreadable: the API server would not have taken it)."""
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


class NodeView:
    """One group's node as pods see it: labels and taints (the joined Node's, else the template's)."""

    __slots__ = ("group", "labels", "name", "resource", "taints")

    def __init__(self, group: str, name: str, resource: str, labels: Mapping[str, str],
                 taints: Sequence[Taint]) -> None:
        self.group = group
        self.name = name
        self.resource = resource
        self.labels = labels
        self.taints = taints

    @classmethod
    def of(cls, group: str, name: str, resource: str, node: Node | None, template_labels: Mapping[str, str] | None,
           template_taints: Sequence[Taint] | None, ignore_taint: str, *, ready: bool = True) -> NodeView:
        """A node that is not Ready (off, booting) is judged without the taints Kubernetes puts on it for being
        down (node.kubernetes.io/*, the cloud provider's shutdown taint): the machine we would power on will not
        have them, as cluster-autoscaler treats its template nodes. Our own drain taint is ours: ignored."""
        if node is not None:
            labels: Mapping[str, str] = node.metadata.labels or {}
            taints = [t for t in node.spec.taints or ()
                      if t.key != ignore_taint and (ready or not t.key.startswith(_CONDITION_TAINTS))]
        else:
            labels = {"kubernetes.io/hostname": name, **(template_labels or {})}
            taints = list(template_taints or ())
        return cls(group, name, resource, labels, taints)

    def admits(self, pod: Pod) -> bool:
        selector = pod.spec.node_selector or {}
        return (all(self.labels.get(k) == v for k, v in selector.items()) and tolerates_all(pod, self.taints)
                and required_affinity_holds(pod, self.name, self.labels))


def demand(pods: Iterable[Pod], views: Sequence[NodeView]) -> list[PendingPod]:
    """Unschedulable pods asking for a group's resource, each with the nodes that may take it (possibly none:
    the planner then reports it as having no eligible node)."""
    out: list[PendingPod] = []
    resources = {v.resource for v in views}
    for pod in pods:
        if not is_unschedulable(pod):
            continue
        for resource in sorted(resources):
            gpus = gpu_request(pod, resource)
            if gpus <= 0:
                continue
            eligible = frozenset(v.name for v in views if v.resource == resource and v.admits(pod))
            out.append(PendingPod(name=f"{pod.metadata.namespace}/{pod.metadata.name}", gpus=gpus,
                                  eligible=eligible))
            break
    return out

"""Pods and nodes -> the inputs of `gpuops.accounting.capacity`: what is pending, and where it could run.

Demand is a pod the scheduler gave up on (PodScheduled=False, reason Unschedulable), not terminating, not
bound, asking for a group's GPU resource (its effective request: init containers, sidecars and overhead as
the scheduler counts them). Pods bound to a node and still starting are not demand; they make their node busy.
A pod may go to a group when the node's labels (its Node's once it has joined, else the template's) satisfy
the pod's nodeSelector and required node affinity, and the pod tolerates the node's NoSchedule/NoExecute taints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuops.accounting.capacity import PendingPod
from gpuops.controllers.scheduling import (
    gpu_request,
    is_unschedulable,
    node_admits,
    required_affinity_holds,
    tolerates_all,
    uses_gpus,
)
from gpuops.kube.objects import Node, Pod, Taint

__all__ = [
    "NodeView",
    "demand",
    "gpu_request",
    "is_unschedulable",
    "required_affinity_holds",
    "tolerates_all",
    "uses_gpus",
]

_CONDITION_TAINTS = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")


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
        return node_admits(pod, self.name, self.labels, self.taints)


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

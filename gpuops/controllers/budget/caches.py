"""What the reconciler derives from informer objects and keeps while those objects stay the same.

Informer objects are immutable and replaced whole on every change, so the identity of an object's parts says
"unchanged": what was derived from them still holds. A reconcile goes over every pod its budget selects, and
each pod event looks up the budgets selecting it: parsing specs and pod requests again each time was work
repeated for objects that had not changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpuops.accounting.gpuhours import Interval
from gpuops.kube.objects import Pod

from .api import GPUWorkloadBudget, ParsedSpec, SpecError, parse_spec
from .podcontract import PodSpan, pod_gpus, pod_span

__all__ = ["PodFacts", "SpecCache", "facts_of"]


class SpecCache:
    """Each budget's checked spec (or why it does not check), parsed once per generation."""

    def __init__(self) -> None:
        self._specs: dict[str, tuple[str, int, ParsedSpec | SpecError]] = {}

    def get(self, budget: GPUWorkloadBudget) -> ParsedSpec | SpecError:
        meta = budget.metadata
        key = f"{meta.namespace}/{meta.name}"
        hit = self._specs.get(key)
        if hit is not None and hit[0] == meta.uid and hit[1] == meta.generation:
            return hit[2]
        try:
            parsed: ParsedSpec | SpecError = parse_spec(budget.spec)
        except SpecError as e:
            parsed = e
        self._specs[key] = (meta.uid, meta.generation, parsed)
        return parsed

    def forget(self, key: str) -> None:
        self._specs.pop(key, None)


@dataclass(slots=True)
class PodFacts:
    """What the reconciler derived from one pod, kept while the parts it came from stay the same objects: its
    requests (per resource name) while its containers and overhead do, its span while its status and deletion
    stamp do, and its last accounting interval while that is the same."""

    containers: Any
    init_containers: Any
    overhead: Any
    requests: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    """By (resource name, GPU model): MIG slices count as their share of their model's GPU."""
    status: Any = None
    deleted: str | None = None
    span: PodSpan | None = None
    interval: Interval | None = None
    kind: str | None = None
    """Its GPU model and capacity type (`kinds`), once its node was known: kept for the pod's life."""

    def gpus_of(self, pod: Pod, resource: str, model: str = "") -> Fraction:
        """`pod_gpus`, computed once per resource name and GPU model."""
        gpus = self.requests.get((resource, model))
        if gpus is None:
            gpus = self.requests[(resource, model)] = pod_gpus(pod, resource, model)
        return gpus

    def span_of(self, pod: Pod) -> PodSpan:
        """`pod_span`, computed once."""
        if self.span is None:
            self.span = pod_span(pod)
        return self.span

    def interval_of(self, uid: str, start: int, end: int | None, gpus: Fraction, late: int) -> Interval:
        """The pod's accounting interval, reused while it is the same (building one validates its fields)."""
        hit = self.interval
        if hit is None or hit.start != start or hit.end != end or hit.gpus is not gpus or hit.late != late:
            hit = self.interval = Interval(uid=uid, start=start, end=end, gpus=gpus, late=late)
        return hit


def facts_of(memo: dict[str, PodFacts], pod: Pod) -> PodFacts:
    """The pod's entry in `memo` (made if new), emptied of what a new spec, status or deletion stamp invalidates."""
    spec, status, deleted = pod.spec, pod.status, pod.metadata.deletion_timestamp
    facts = memo.get(pod.metadata.uid)
    if facts is None:
        facts = memo[pod.metadata.uid] = PodFacts(spec.containers, spec.init_containers, spec.overhead)
    elif not (facts.containers is spec.containers and facts.init_containers is spec.init_containers
              and facts.overhead is spec.overhead):
        facts.containers, facts.init_containers, facts.overhead = spec.containers, spec.init_containers, spec.overhead
        facts.requests.clear()
    if facts.status is not status or facts.deleted != deleted:
        facts.status, facts.deleted, facts.span = status, deleted, None
    return facts

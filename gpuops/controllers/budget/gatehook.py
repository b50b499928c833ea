"""The Gate budgets' admission webhook: a new pod that a closed Gate budget selects is admitted held.

Scheduling gates can only be added when a pod is created, so holding pods back needs a mutating webhook on pod
CREATE (`manifests/webhook/budget-gate.yaml`). It adds the gate `gpuops.io/budget` and names the budgets holding
the pod in the annotation `gpuops.io/gated-by`; the reconciler (`gating.py`) writes the pod's condition and
removes the gate when the budgets allow. Whatever creates the pod (a bare pod, a Job, a JobSet, Kueue once it
admits a workload) is held the same way, and nobody's Job is suspended.

Which budgets are closed is the leader's decision, written as each budget's Gating condition; every replica
follows the conditions into its `GateBook` (`follow`), so the webhook answers from memory, on its own thread,
without a call to the API server, whichever replica the Service sends the call to. A budget is closed while it
is over quota past its delay, and while pods it holds wait, so a new pod never overtakes older held ones.
`failurePolicy: Ignore`: an operator outage admits pods ungated rather than blocking them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import msgspec
import structlog

from gpuops.kube import conditions as cond
from gpuops.kube.admission.review import JSONPatchOp, MutationResult
from gpuops.kube.informer import Informer
from gpuops.kube.objects import Pod
from gpuops.kube.selectors import Selector

from .api import GATE, GATED_BY, GPUWorkloadBudget, ParsedSpec, SpecError
from .podcontract import pod_gpus

__all__ = ["GATING", "Closed", "GateBook", "closed_of", "follow", "gate_names", "gating_mutation"]

log = structlog.get_logger("gpuops.controllers.budget.gate")


@dataclass(frozen=True, slots=True)
class Closed:
    """A Gate budget that holds new pods now."""

    name: str
    selector: Selector
    resource: str
    message: str
    """Why and until when, as the pod's condition will say it (the webhook returns it as a warning)."""


class GateBook:
    """The closed Gate budgets by namespace. Written by the reconciler on the controllers' event loop, read by the
    webhook's thread: every write replaces the whole read-only mapping, so a reader sees one or the other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_namespace: Mapping[str, Mapping[str, Closed]] = MappingProxyType({})

    def closed_in(self, namespace: str) -> tuple[Closed, ...]:
        return tuple(self._by_namespace.get(namespace, {}).values())

    def close(self, namespace: str, entry: Closed) -> None:
        with self._lock:
            if self._by_namespace.get(namespace, {}).get(entry.name) == entry:
                return
            ns = dict(self._by_namespace.get(namespace, {}))
            ns[entry.name] = entry
            self._replace(namespace, ns)

    def open(self, namespace: str, name: str) -> None:
        with self._lock:
            if name not in self._by_namespace.get(namespace, {}):
                return
            ns = dict(self._by_namespace[namespace])
            del ns[name]
            self._replace(namespace, ns)

    def _replace(self, namespace: str, entries: dict[str, Closed]) -> None:
        everything = dict(self._by_namespace)
        if entries:
            everything[namespace] = MappingProxyType(entries)
        else:
            everything.pop(namespace, None)
        self._by_namespace = MappingProxyType(everything)


GATING: Final = "Gating"
"""The Gate budget's condition: True while it holds new pods (its message says why and until when)."""


def closed_of(budget: GPUWorkloadBudget, spec: ParsedSpec | SpecError) -> Closed | None:
    """What the webhook must know of `budget`: None unless it is a valid Gate budget whose Gating is True."""
    if isinstance(spec, SpecError) or spec.action != "Gate" or budget.metadata.deletion_timestamp:
        return None
    gating = cond.get_condition(budget.status.conditions, GATING)
    if gating is None or gating.status != "True":
        return None
    return Closed(budget.metadata.name, spec.selector, spec.resource, gating.message)


def follow(budgets: Informer[GPUWorkloadBudget], book: GateBook,
           spec_of: Callable[[GPUWorkloadBudget], ParsedSpec | SpecError]) -> None:
    """Keep `book` as the budgets' Gating conditions say, on every replica (a standby's informers run too): the
    leader decides, each replica's webhook answers from its own cache."""

    def seen(budget: GPUWorkloadBudget) -> None:
        meta = budget.metadata
        entry = closed_of(budget, spec_of(budget))
        if entry is None:
            book.open(meta.namespace, meta.name)
        else:
            book.close(meta.namespace, entry)

    budgets.add_handler(on_add=lambda budget, _initial: seen(budget), on_update=lambda _old, new: seen(new),
                        on_delete=lambda gone: book.open(gone.metadata.namespace, gone.metadata.name))


def gate_names(annotations: Mapping[str, str] | None) -> list[str]:
    """The budgets named in a pod's gpuops.io/gated-by annotation."""
    raw = (annotations or {}).get(GATED_BY, "")
    return [n for n in (part.strip() for part in raw.split(",")) if n]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _ops(pod: Mapping[str, Any], names: list[str]) -> list[JSONPatchOp]:
    """Add our gate (unless there) and set the annotation to `names`."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    ops: list[JSONPatchOp] = []
    gates = spec.get("schedulingGates")
    if not gates:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]})
    elif not any(isinstance(g, Mapping) and g.get("name") == GATE for g in gates):
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}})
    value = ",".join(names)
    if not meta.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {GATED_BY: value}})
    else:
        ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(GATED_BY)}", "value": value})
    return ops


def gating_mutation(book: GateBook) -> Callable[[Mapping[str, Any]], MutationResult]:
    """The webhook's mutation: hold the pod if a closed Gate budget of its namespace selects it and it requests
    the budget's resource; otherwise admit it unchanged."""

    def mutate(pod: Mapping[str, Any]) -> MutationResult:
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            return MutationResult()
        closed = book.closed_in(str(meta.get("namespace") or ""))
        if not closed:
            return MutationResult()
        labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
        candidates = [c for c in closed if c.selector.matches(labels)]
        if not candidates:
            return MutationResult()
        try:
            typed = msgspec.convert(pod, Pod)
        except msgspec.ValidationError as e:  # the API server's validation will name what is wrong
            log.debug("pod not readable; admitted ungated", error=str(e))
            return MutationResult()
        holding = [c for c in candidates if pod_gpus(typed, c.resource) > 0]
        if not holding:
            return MutationResult()
        names = sorted({*gate_names(meta.get("annotations")), *(c.name for c in holding)})
        return MutationResult(patch=_ops(pod, names), warnings=[c.message for c in holding])

    return mutate

"""Which pods a budget selects and which budgets select a pod, through informer indexes instead of scans.

A pod event must find the budgets that may select it in O(its labels), not O(budgets in its namespace), and a
reconcile must find its budget's pods without going over the namespace's, when its selector allows.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuops.kube.informer import INDEX_NAMESPACE, Informer
from gpuops.kube.objects import Pod
from gpuops.kube.selectors import anchors_of

from .api import FINALIZER, GPUWorkloadBudget, ParsedSpec, SpecError

__all__ = ["INDEX_ANCHOR", "INDEX_HELD", "Selection"]

INDEX_HELD = "gpuops.io/budget-accounting"
"""Pods carrying our finalizer, by namespace."""
INDEX_ANCHOR = "gpuops.io/selector-anchor"
"""Budgets by "<namespace>/<anchor>" of their selector (`gpuops.kube.selectors`)."""
_LABEL_INDEX = "gpuops.io/label:"
"""Prefix of the per-key indexes "<namespace>/<label value>" that find a selector's pods without a scan."""


def _held(pod: Pod) -> tuple[str, ...]:
    return (pod.metadata.namespace,) if FINALIZER in (pod.metadata.finalizers or ()) else ()


def _label_index(key: str) -> Callable[[Pod], tuple[str, ...]]:
    def index(pod: Pod) -> tuple[str, ...]:
        labels = pod.metadata.labels
        value = labels.get(key) if labels else None
        return (f"{pod.metadata.namespace}/{value}",) if value is not None else ()

    return index


class Selection:
    """The indexes on the pod and budget informers (both indexed by namespace already), and the lookups on them.
    `spec_of` gives a budget's checked spec (parsed once per generation)."""

    def __init__(
        self,
        pods: Informer[Pod],
        budgets: Informer[GPUWorkloadBudget],
        spec_of: Callable[[GPUWorkloadBudget], ParsedSpec | SpecError],
    ) -> None:
        self.pods = pods
        self.budgets = budgets
        self.spec_of = spec_of
        self._label_indexes: set[str] = set()
        pods.add_index(INDEX_HELD, _held)
        budgets.add_index(INDEX_ANCHOR, self._anchors)

    def _anchors(self, budget: GPUWorkloadBudget) -> tuple[str, ...]:
        spec = self.spec_of(budget)
        if isinstance(spec, SpecError):
            return ()
        ns = budget.metadata.namespace
        return tuple(f"{ns}/{a}" for a in spec.selector.anchors())

    def pods_of(self, namespace: str, spec: ParsedSpec) -> list[Pod]:
        """The pods `spec` selects, through a label index on its anchor requirement when it has one."""
        anchor = spec.selector.anchor()
        store = self.pods.store
        if anchor is not None:
            key, values = anchor
            name = _LABEL_INDEX + key
            if name not in self._label_indexes:
                self.pods.add_index(name, _label_index(key))
                self._label_indexes.add(name)
            candidates = [p for v in values for p in store.by_index(name, f"{namespace}/{v}")]
        else:
            candidates = store.by_index(INDEX_NAMESPACE, namespace)
        return [p for p in candidates if spec.selector.matches(p.metadata.labels)]

    def budgets_selecting(self, pod: Pod) -> list[tuple[GPUWorkloadBudget, ParsedSpec]]:
        """The valid budgets of the pod's namespace whose selector matches it."""
        meta = pod.metadata
        labels = meta.labels
        store = self.budgets.store
        out = []
        for anchor in anchors_of(labels):
            for b in store.by_index(INDEX_ANCHOR, f"{meta.namespace}/{anchor}"):
                spec = self.spec_of(b)
                if isinstance(spec, ParsedSpec) and spec.selector.matches(labels):
                    out.append((b, spec))
        return out

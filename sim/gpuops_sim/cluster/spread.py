"""kube-scheduler's PodTopologySpread filter, for the constraints that must hold (`whenUnsatisfiable:
DoNotSchedule`): a node passes when placing the pod there keeps the number of matching pods in its topology
domain within `maxSkew` of the least loaded eligible domain.

As documented: only nodes with the constraint's topology key count as domains; `nodeAffinityPolicy` (default
Honor) and `nodeTaintsPolicy` (default Ignore) say whether the pod's node affinity and taint tolerations decide
which nodes are eligible; fewer eligible domains than `minDomains` make the global minimum 0; pods being
deleted and finished pods are not counted; the incoming pod counts itself when the selector matches it.
`ScheduleAnyway` constraints only score nodes and are ignored here, as is `matchLabelKeys`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..apiserver.selectors import LabelSelector, label_selector_from_object

REASON_SPREAD = "node(s) didn't match pod topology spread constraints"
REASON_SPREAD_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"


@dataclass(frozen=True, slots=True)
class Spread:
    max_skew: int
    topology_key: str
    selector: LabelSelector
    min_domains: int
    honor_affinity: bool
    honor_taints: bool
    self_match: bool


def spread_constraints(spec: Mapping[str, Any], labels: Mapping[str, str] | None) -> tuple[Spread, ...]:
    """The pod's DoNotSchedule constraints (an invalid selector selects nothing, as validation would refuse it)."""
    out = []
    for raw in spec.get("topologySpreadConstraints") or ():
        if not isinstance(raw, dict) or raw.get("whenUnsatisfiable") != "DoNotSchedule":
            continue
        try:
            selector = label_selector_from_object(raw.get("labelSelector"))
        except ValueError:
            selector = label_selector_from_object(None)
        out.append(Spread(max_skew=max(1, int(raw.get("maxSkew") or 1)), topology_key=str(raw.get("topologyKey", "")),
                          selector=selector, min_domains=int(raw.get("minDomains") or 1),
                          honor_affinity=raw.get("nodeAffinityPolicy", "Honor") == "Honor",
                          honor_taints=raw.get("nodeTaintsPolicy", "Ignore") == "Honor",
                          self_match=selector.matches(labels or {})))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class EligibleNode:
    name: str
    labels: Mapping[str, str]
    matches_affinity: bool
    tolerated: bool


def domain_counts(spread: Spread, nodes: Iterable[EligibleNode], pods: Iterable[Mapping[str, Any]]
                  ) -> dict[str, int]:
    """Matching pods per topology domain, over the domains of the nodes the policies include."""
    domain_of: dict[str, str] = {}
    for n in nodes:
        if spread.topology_key not in n.labels:
            continue
        if (spread.honor_affinity and not n.matches_affinity) or (spread.honor_taints and not n.tolerated):
            continue
        domain_of[n.name] = n.labels[spread.topology_key]
    counts = dict.fromkeys(domain_of.values(), 0)
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or node not in domain_of or meta.get("deletionTimestamp"):
            continue
        if status.get("phase") in ("Succeeded", "Failed") or not spread.selector.matches(meta.get("labels") or {}):
            continue
        counts[domain_of[node]] += 1
    return counts


def spread_reason(spreads: tuple[Spread, ...], counts: list[dict[str, int]], labels: Mapping[str, str]) -> str | None:
    """Why the node with `labels` fails the filter, None when it passes (counts: one dict per constraint)."""
    for spread, per_domain in zip(spreads, counts, strict=True):
        domain = labels.get(spread.topology_key)
        if domain is None:
            return REASON_SPREAD_LABEL
        floor = min(per_domain.values(), default=0) if len(per_domain) >= spread.min_domains else 0
        if per_domain.get(domain, 0) + int(spread.self_match) - floor > spread.max_skew:
            return REASON_SPREAD
    return None


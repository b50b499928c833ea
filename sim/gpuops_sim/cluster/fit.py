"""The scheduler's per-pod inputs, compiled once per distinct shape: request vectors and filter constraints.

kube-scheduler compares requests in integer units (cpu in milli-units, everything else in whole units, both
rounded up) and evaluates the filter plugins NodeUnschedulable, TaintToleration and NodeAffinity in that
order, stopping at the first that fails. Pods of one Job share their spec, so both the effective request
(`podrequests`, the emulator's own reading of the documented formula) and the compiled constraints are
memoised by the JSON encoding of the fields that decide them: 100,000 pods cost a handful of parses.

Reason strings are kube-scheduler's (noderesources/fit.go, nodeunschedulable, tainttoleration,
nodeaffinity) so `kubectl describe pod` reads as on a real cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import msgspec

from ..apiserver.quantity import parse_quantity
from .podrequests import effective_requests
from .spread import Spread, spread_constraints

__all__ = [
    "HOSTNAME_LABEL",
    "POD_SLOTS",
    "REASON_AFFINITY",
    "REASON_TOO_MANY_PODS",
    "REASON_UNSCHEDULABLE",
    "Constraints",
    "Taint",
    "Vec",
    "allocatable",
    "constraints",
    "insufficient",
    "pod_vector",
    "taint_reason",
    "to_units",
]

Vec = tuple[tuple[str, int], ...]
"""A pod's effective request in scheduler units, sorted by resource name, zero amounts dropped, plus
("pods", 1): the pod's slot, checked against allocatable pods like any other resource."""

Taint = tuple[str, str, str]  # (key, value, effect)

POD_SLOTS = "pods"
HOSTNAME_LABEL = "kubernetes.io/hostname"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_TOO_MANY_PODS = "Too many pods"

_encode = msgspec.json.encode
_MEMO_LIMIT = 50_000


def to_units(resource: str, value: Fraction) -> int:
    """cpu in milli-units, the rest in whole units; rounded up like `Quantity.MilliValue()`/`Value()`."""
    return math.ceil(value * 1000) if resource == "cpu" else math.ceil(value)


def insufficient(resource: str) -> str:
    return REASON_TOO_MANY_PODS if resource == POD_SLOTS else f"Insufficient {resource}"


def taint_reason(taint: Taint) -> str:
    return f"node(s) had untolerated taint {{{taint[0]}: {taint[1]}}}"


# ------------------------------------------------------------------------------------------ requests

_vectors: dict[bytes, Vec] = {}


def _compute_vector(spec: Mapping[str, Any]) -> Vec:
    try:
        amounts = effective_requests(spec)
    except (TypeError, ValueError):
        amounts = {}  # the apiserver validates pods; a malformed one only takes its slot
    units = {r: to_units(r, v) for r, v in amounts.items() if r != POD_SLOTS}
    units = {r: u for r, u in units.items() if u > 0}
    units[POD_SLOTS] = 1
    return tuple(sorted(units.items()))


def pod_vector(spec: Mapping[str, Any]) -> Vec:
    """The pod's effective request (init containers, sidecars, overhead, pod-level resources included)."""
    key = _encode(
        (
            [(c.get("resources"), c.get("restartPolicy")) for c in spec.get("initContainers") or ()],
            [c.get("resources") for c in spec.get("containers") or ()],
            spec.get("overhead"),
            spec.get("resources"),
        )
    )
    got = _vectors.get(key)
    if got is None:
        if len(_vectors) >= _MEMO_LIMIT:
            _vectors.clear()
        got = _vectors[key] = _compute_vector(spec)
    return got


def allocatable(status: Mapping[str, Any] | None) -> dict[str, int]:
    """Node allocatable in scheduler units; `pods` is always present (0 when the node does not say)."""
    out: dict[str, int] = {}
    for r, q in ((status or {}).get("allocatable") or {}).items():
        try:
            out[r] = to_units(r, parse_quantity(q))
        except (TypeError, ValueError):
            continue
    out.setdefault(POD_SLOTS, 0)
    return out


# ------------------------------------------------------------------------------------------ constraints

Requirement = tuple[str, str, tuple[str, ...]]  # (key, operator, values)


@dataclass(frozen=True, slots=True)
class _Term:
    exprs: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]
    names: frozenset[str] | None  # matchFields metadata.name In: the only nodes this term can match
    hosts: frozenset[str] | None  # kubernetes.io/hostname In: likewise, by hostname label


def _requirements(raw: Any) -> tuple[Requirement, ...]:
    out: list[Requirement] = []
    for r in raw or ():
        if isinstance(r, dict):
            values = tuple(str(v) for v in r.get("values") or ())
            out.append((str(r.get("key") or ""), str(r.get("operator") or ""), values))
    return tuple(out)


def _label_match(req: Requirement, labels: Mapping[str, str]) -> bool:
    key, op, values = req
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels or len(values) != 1:
            return False
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _field_match(req: Requirement, name: str) -> bool:
    key, op, values = req
    if key != "metadata.name":
        return False
    if op == "In":
        return name in values
    if op == "NotIn":
        return name not in values
    return False


def _tolerates(tolerations: Sequence[tuple[str, str, str, str]], taint: Taint) -> bool:
    key, value, effect = taint
    for t_key, t_op, t_value, t_effect in tolerations:
        if t_effect and t_effect != effect:
            continue
        if t_key and t_key != key:
            continue
        if t_op == "Exists" or (t_op in ("", "Equal") and t_value == value):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Constraints:
    """What decides whether a node passes the filters for a pod, independent of free resources.

    `per_node` is set when the pod names nodes individually (hostname label or metadata.name), which node
    classes do not capture, or spreads over topology domains (`spread`, checked against the pods of its
    `namespace`); such pods are matched node by node, among `candidates()` when those are known.
    """

    key: bytes
    selector: tuple[tuple[str, str], ...]
    terms: tuple[_Term, ...] | None
    tolerations: tuple[tuple[str, str, str, str], ...]
    never_preempts: bool
    per_node: bool
    spread: tuple[Spread, ...] = ()
    namespace: str = ""

    def _affinity(self, name: str, labels: Mapping[str, str]) -> bool:
        for k, v in self.selector:
            if labels.get(k) != v:
                return False
        if self.terms is None:
            return True
        for term in self.terms:
            if not term.exprs and not term.fields:
                continue  # an empty term matches no node
            if all(_label_match(e, labels) for e in term.exprs) and all(_field_match(f, name) for f in term.fields):
                return True
        return False

    def class_reason(
        self, labels: Mapping[str, str], taints: tuple[Taint, ...], unschedulable: bool
    ) -> str | None:
        """First failing filter for nodes with these properties (affinity skipped when per-node)."""
        if unschedulable and not _tolerates(self.tolerations, (UNSCHEDULABLE_TAINT, "", "NoSchedule")):
            return REASON_UNSCHEDULABLE
        for taint in taints:
            if not _tolerates(self.tolerations, taint):
                return taint_reason(taint)
        if not self.per_node and not self._affinity("", labels):
            return REASON_AFFINITY
        return None

    def node_ok(self, name: str, labels: Mapping[str, str]) -> bool:
        """The node-specific affinity check of a per-node pod."""
        return self._affinity(name, labels)

    def tolerates(self, taints: Sequence[Taint]) -> bool:
        return all(_tolerates(self.tolerations, t) for t in taints)

    def candidates(self, by_host: Mapping[str, set[str]]) -> set[str] | None:
        """Node names a per-node pod can only land on, or None when it cannot be narrowed down."""
        out: set[str] | None = None
        if self.terms is not None:
            out = set()
            for term in self.terms:
                if term.names is not None:
                    out |= term.names
                elif term.hosts is not None:
                    for h in term.hosts:
                        out |= by_host.get(h, set())
                else:
                    out = None
                    break
        for k, v in self.selector:
            if k == HOSTNAME_LABEL:
                pinned = by_host.get(v, set())
                out = set(pinned) if out is None else out & pinned
        return out


def _term(raw: Any) -> _Term:
    raw = raw if isinstance(raw, dict) else {}
    exprs = _requirements(raw.get("matchExpressions"))
    fields = _requirements(raw.get("matchFields"))
    names = next((frozenset(v) for k, op, v in fields if k == "metadata.name" and op == "In"), None)
    hosts = next((frozenset(v) for k, op, v in exprs if k == HOSTNAME_LABEL and op == "In"), None)
    return _Term(exprs, fields, names, hosts)


def _compile(key: bytes, spec: Mapping[str, Any], meta: Mapping[str, Any]) -> Constraints:
    selector = tuple(sorted((str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items()))
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = None if required is None else tuple(_term(t) for t in (required or {}).get("nodeSelectorTerms") or ())
    tolerations = tuple(
        (str(t.get("key") or ""), str(t.get("operator") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("tolerations") or ()
        if isinstance(t, dict)
    )
    per_node = any(k == HOSTNAME_LABEL for k, _ in selector) or any(
        term.fields or any(e[0] == HOSTNAME_LABEL for e in term.exprs) for term in terms or ()
    )
    spread = spread_constraints(spec, meta.get("labels"))
    return Constraints(key, selector, terms, tolerations, spec.get("preemptionPolicy") == "Never",
                       per_node or bool(spread), spread, str(meta.get("namespace", "")))


_constraints: dict[bytes, Constraints] = {}


def constraints(spec: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Constraints:
    """The pod's compiled filter inputs; equal for pods whose scheduling-relevant fields are equal (a pod that
    spreads over topology domains also by its namespace and labels, which decide what it counts)."""
    spreads = spec.get("topologySpreadConstraints")
    meta = meta or {}
    key = _encode(
        (
            spec.get("nodeSelector"),
            ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            ),
            spec.get("tolerations"),
            spec.get("preemptionPolicy"),
            *((spreads, meta.get("namespace"), meta.get("labels")) if spreads else ()),
        )
    )
    got = _constraints.get(key)
    if got is None:
        if len(_constraints) >= _MEMO_LIMIT:
            _constraints.clear()
        got = _constraints[key] = _compile(key, spec, meta)
    return got

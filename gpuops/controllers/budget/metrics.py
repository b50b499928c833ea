"""Budget metrics, computed when Prometheus scrapes: at that instant, not at the last reconcile.

Each reconcile leaves a `Snapshot` of its accounting inputs (live intervals, ledger, window, quota); a scrape
evaluates `reported_usage` on them at the scrape's counting instant (whole seconds, the same computation as the
status and Events: the same inputs in the same second give the same figure), so running pods accrue between
reconciles and intervals sliding out of the window drop out on time. A deleted budget's snapshot is dropped and
its series vanish with it. Sources register while their controller runs (several managers may share one test
process; the latest snapshot of a budget wins).

The enforcement counter is an ordinary Counter labelled by the budget (namespace, name), action and result; a
deleted budget's enforcement series are removed with it (`forget_enforcement`), as its gauges vanish with its
snapshot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily

from gpuops.accounting.gpuhours import Interval, Ledger
from gpuops.accounting.reporting import counting_instant
from gpuops.kube.collector import SourcedCollector

from .api import ParsedSpec
from .kinds import split
from .pricebook import Priced
from .units import figures

__all__ = [
    "COLLECTOR", "ENFORCEMENT_ACTIONS", "BudgetCollector", "Published", "Snapshot", "SnapshotSource",
    "count_enforcement", "forget_enforcement",
]

ACTIONS = ("AlertOnly", "Pause", "Evict", "Gate")
RESULTS = ("Alerted", "Suspended", "Marked", "Resumed", "Unmarked", "Evicted", "Blocked", "Released", "Error")

ENFORCEMENT_ACTIONS = Counter(
    "gpuops_budget_enforcement_actions",
    f"Enforcement steps taken by GPUWorkloadBudgets, by budget (namespace, name), action ({', '.join(ACTIONS)})"
    f" and result ({', '.join(RESULTS)}).",
    ["namespace", "name", "action", "result"],
)


def count_enforcement(namespace: str, name: str, action: str, result: str) -> None:
    ENFORCEMENT_ACTIONS.labels(namespace=namespace, name=name, action=action, result=result).inc()


def forget_enforcement(namespace: str, name: str) -> None:
    """Remove a deleted budget's enforcement series: a budget created again under its name starts from 0 rather
    than inheriting the old one's counts, and the series of deleted budgets do not pile up."""
    for action in ACTIONS:
        for result in RESULTS:
            with contextlib.suppress(KeyError):  # older prometheus_client raise it for a series never counted
                ENFORCEMENT_ACTIONS.remove(namespace, name, action, result)


@dataclass(slots=True)
class Published:
    """The latest counting instant up to which a snapshot's open intervals were reported (its reconcile, then
    scrapes): the reconciler ends a pod of the snapshot no earlier (`counted_through`), so a pod finishing, evicted
    or deleted never takes back a reported figure."""

    at: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    live: tuple[Interval, ...]
    ledger: Ledger
    spec: ParsedSpec
    """The spec of the reconcile (its window, quota and unit, with what carried over)."""
    published: Published
    kinds: Mapping[str, str] = field(default_factory=dict)
    """The live intervals' kinds (GPU model and capacity type, `kinds`) by UID."""
    priced: Priced | None = None
    """The price list the budget counts with."""

    def live_by_kind(self) -> dict[str, list[Interval]]:
        live: dict[str, list[Interval]] = {}
        for interval in self.live:
            live.setdefault(self.kinds.get(interval.uid, ""), []).append(interval)
        return live


class SnapshotSource(Protocol):
    def snapshots(self) -> Mapping[tuple[str, str], Snapshot]: ...

    def now(self) -> int: ...


# Amounts are in Prometheus' base unit, GPU-seconds (= GPU-hours x 3600; the status and the CRD speak GPU-hours);
# weighted amounts in weighted GPU-seconds; cost in the price list's currency (label `currency`).
_GAUGES = (
    ("gpuops_budget_tracked_pods", "Pods (live or in the ledger) whose GPU usage overlaps the window."),
    ("gpuops_budget_over_quota", "1 while consumption >= quota (in the quota's unit), else 0."),
    ("gpuops_budget_consumed_gpu_seconds", "GPU-seconds used inside the budget's window, at scrape time."),
)
_GPU_QUOTA = (
    ("gpuops_budget_quota_gpu_seconds", "The budget's quota in GPU-seconds per window (GPU-hours quotas)."),
    ("gpuops_budget_remaining_gpu_seconds", "Quota minus consumption in GPU-seconds, floored at 0, at scrape time "
                                            "(GPU-hours quotas)."),
)
_WEIGHTED_QUOTA = (
    ("gpuops_budget_quota_weighted_gpu_seconds", "The quota in weighted GPU-seconds per window (weighted quotas)."),
    ("gpuops_budget_remaining_weighted_gpu_seconds", "Quota minus consumption in weighted GPU-seconds, floored at "
                                                     "0, at scrape time (weighted quotas)."),
)
_COST_QUOTA = (
    ("gpuops_budget_quota_cost", "The quota in money per window, in `currency` (cost quotas)."),
    ("gpuops_budget_remaining_cost", "Quota minus cost so far, floored at 0, at scrape time (cost quotas)."),
)
_HOUR = 3600
_KIND_LABELS = ["namespace", "name", "model", "capacity_type"]
_BY_KIND = (
    ("gpuops_budget_usage_gpu_seconds",
     "GPU-seconds used inside the budget's window on one GPU model and capacity type, at scrape time (the kinds add "
     "up to gpuops_budget_consumed_gpu_seconds)."),
    ("gpuops_budget_usage_weighted_gpu_seconds",
     "Weighted GPU-seconds (GPU-seconds times the model's weight in the budget's price list) inside the window by "
     "GPU model and capacity type, at scrape time; budgets with a price list."),
    ("gpuops_budget_usage_cost",
     "What the GPU time inside the window cost by GPU model and capacity type, at the prices in force while it ran, "
     "in `currency`, at scrape time; budgets with a price list."),
)

_Row = tuple[list[str], float]


class BudgetCollector(SourcedCollector[SnapshotSource]):
    def families(self) -> dict[str, GaugeMetricFamily]:
        out = {name: GaugeMetricFamily(name, text, labels=["namespace", "name"])
               for name, text in (*_GAUGES, *_GPU_QUOTA, *_WEIGHTED_QUOTA)}
        out.update({name: GaugeMetricFamily(name, text, labels=["namespace", "name", "currency"])
                    for name, text in _COST_QUOTA})
        out[_BY_KIND[0][0]] = GaugeMetricFamily(*_BY_KIND[0], labels=_KIND_LABELS)
        out[_BY_KIND[1][0]] = GaugeMetricFamily(*_BY_KIND[1], labels=_KIND_LABELS)
        out[_BY_KIND[2][0]] = GaugeMetricFamily(*_BY_KIND[2], labels=[*_KIND_LABELS, "currency"])
        return out

    def collect(self) -> Iterable[GaugeMetricFamily]:
        rows: dict[str, list[_Row]] = {}
        for source in self.sources.current():
            now = source.now()
            for labels, snap in list(source.snapshots().items()):
                at = counting_instant(now)
                if at > snap.published.at:
                    snap.published.at = at
                for name, row in _rows(list(labels), snap, at):
                    rows.setdefault(name, []).append(row)
        families = self.families()
        for name, items in rows.items():
            for label_values, value in sorted(items):
                families[name].add_metric(label_values, value)
        return list(families.values())


def _rows(labels: list[str], snap: Snapshot, at: int) -> list[tuple[str, _Row]]:
    """One budget's samples at counting instant `at`: the figures its status would show (`units.figures`)."""
    spec = snap.spec
    fig = figures(spec, snap.priced, snap.live_by_kind(), snap.ledger, at=at)
    out: list[tuple[str, _Row]] = [
        ("gpuops_budget_tracked_pods", (labels, float(fig.gpu_hours.pods_in_window))),
        ("gpuops_budget_over_quota", (labels, 1.0 if fig.quota.over_quota else 0.0)),
        ("gpuops_budget_consumed_gpu_seconds", (labels, float(fig.gpu_hours.consumed * _HOUR))),
    ]
    currency = snap.priced.currency if snap.priced is not None else ""
    quota_rows = {"GPUHours": (_GPU_QUOTA, labels, _HOUR), "WeightedGPUHours": (_WEIGHTED_QUOTA, labels, _HOUR),
                  "Cost": (_COST_QUOTA, [*labels, currency], 1)}
    (quota_name, _), (remaining_name, _) = quota_rows[spec.unit][0]
    quota_labels, scale = quota_rows[spec.unit][1], quota_rows[spec.unit][2]
    out.append((quota_name, (quota_labels, float(spec.quota * scale))))
    out.append((remaining_name, (quota_labels, float(fig.quota.remaining * scale))))
    for key, totals in fig.by_kind.items():
        model, capacity = split(key)
        kind = [*labels, model or "", capacity or ""]
        out.append((_BY_KIND[0][0], (kind, float(totals.gpu_hours * _HOUR))))
        if snap.priced is not None:
            out.append((_BY_KIND[1][0], (kind, float(totals.weighted_gpu_hours * _HOUR))))
            out.append((_BY_KIND[2][0], ([*kind, currency], float(totals.cost))))
    return out


COLLECTOR = BudgetCollector()
REGISTRY.register(COLLECTOR)

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
from fractions import Fraction
from typing import Protocol

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily

from gpuops.accounting.gpuhours import Interval, Ledger, consumed_by_key
from gpuops.accounting.reporting import counting_instant, reported_usage
from gpuops.accounting.windows import Window, length_at
from gpuops.kube.collector import SourcedCollector

from .kinds import split

__all__ = [
    "COLLECTOR", "ENFORCEMENT_ACTIONS", "BudgetCollector", "Published", "Snapshot", "SnapshotSource",
    "count_enforcement", "forget_enforcement",
]

ACTIONS = ("AlertOnly", "Pause", "Evict")
RESULTS = ("Alerted", "Suspended", "Marked", "Resumed", "Unmarked", "Evicted", "Blocked", "Error")

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
    window: Window
    quota: Fraction
    published: Published
    kinds: Mapping[str, str] = field(default_factory=dict)
    """The live intervals' kinds (GPU model and capacity type, `kinds`) by UID."""


class SnapshotSource(Protocol):
    def snapshots(self) -> Mapping[tuple[str, str], Snapshot]: ...

    def now(self) -> int: ...


# Amounts are in Prometheus' base unit, GPU-seconds (= GPU-hours x 3600; the status and the CRD speak GPU-hours).
_GAUGES = (
    ("gpuops_budget_tracked_pods", "Pods (live or in the ledger) whose GPU usage overlaps the window."),
    ("gpuops_budget_over_quota", "1 while consumption >= quota, else 0."),
    ("gpuops_budget_consumed_gpu_seconds", "GPU-seconds used inside the budget's window, at scrape time."),
    ("gpuops_budget_quota_gpu_seconds", "The budget's quota in GPU-seconds per window."),
    ("gpuops_budget_remaining_gpu_seconds", "Quota minus consumption in GPU-seconds, floored at 0, at scrape time."),
)
_HOUR = 3600


_BY_KIND = ("gpuops_budget_usage_gpu_seconds",
            "GPU-seconds used inside the budget's window on one GPU model and capacity type, at scrape time (the "
            "kinds add up to gpuops_budget_consumed_gpu_seconds).")


class BudgetCollector(SourcedCollector[SnapshotSource]):
    def families(self) -> dict[str, GaugeMetricFamily]:
        out = {name: GaugeMetricFamily(name, text, labels=["namespace", "name"]) for name, text in _GAUGES}
        out[_BY_KIND[0]] = GaugeMetricFamily(*_BY_KIND, labels=["namespace", "name", "model", "capacity_type"])
        return out

    def collect(self) -> Iterable[GaugeMetricFamily]:
        sources = self.sources.current()
        rows: dict[tuple[str, str], tuple[float, ...]] = {}
        kinds: dict[tuple[str, str, str, str], float] = {}
        for source in sources:
            now = source.now()
            for labels, snap in list(source.snapshots().items()):
                usage = reported_usage(snap.live, snap.ledger, now=now, window=snap.window, quota=snap.quota)
                at = counting_instant(now)
                if at > snap.published.at:
                    snap.published.at = at
                rows[labels] = (
                    float(usage.pods_in_window),
                    1.0 if usage.over_quota else 0.0,
                    float(usage.consumed * _HOUR),
                    float(snap.quota * _HOUR),
                    float(usage.remaining * _HOUR),
                )
                for key, used in _by_kind(snap, at).items():
                    model, capacity = split(key)
                    kinds[(*labels, model or "", capacity or "")] = float(used * _HOUR)
        families = list(self.families().values())
        *per_budget, per_kind = families
        for labels, values in sorted(rows.items()):
            for family, value in zip(per_budget, values, strict=True):
                family.add_metric(list(labels), value)
        for kind_labels, value in sorted(kinds.items()):
            per_kind.add_metric(list(kind_labels), value)
        return families


def _by_kind(snap: Snapshot, at: int) -> dict[str, Fraction]:
    """The snapshot's usage at counting instant `at` by kind (`consumed_by_key`)."""
    live: dict[str, list[Interval]] = {}
    for interval in snap.live:
        live.setdefault(snap.kinds.get(interval.uid, ""), []).append(interval)
    return consumed_by_key(live, snap.ledger, now=at, window=length_at(snap.window, at))


COLLECTOR = BudgetCollector()
REGISTRY.register(COLLECTOR)

"""The operator's Kubernetes Events as the emulated API server stores them, for the live view and the report.

Only Events our controllers recorded count: the emulated cluster's own components (scheduler, kubelets, Job
controller, ...) are left out, so what shows is what the operator did.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..cluster.cluster import SimCluster

__all__ = ["SIM_COMPONENTS", "OperatorEvent", "Recorder"]

EVENTS = ("", "events")
SIM_COMPONENTS = ("default-scheduler", "kubelet", "job-controller", "node-controller", "taint-eviction-controller",
                  "pod-garbage-collector", "sim-workload", "spot-agent", "cloud-node-lifecycle-controller")
"""Events from these components are the emulated cluster's own; everything else is an operator's doing."""
KEEP = 10_000


@dataclass(frozen=True, slots=True)
class OperatorEvent:
    t: float
    """Seconds since the recorder's start."""
    component: str
    reason: str
    type: str
    involved: str
    message: str

    def line(self, width: int = 150) -> str:
        return f"{self.component}: {self.reason} {self.involved}: {self.message}"[:width]


class Recorder:
    """Keeps the operator's Events: the latest few, counts by (component, reason), and the whole run's list."""

    def __init__(self, keep_recent: int = 8, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.start = clock()
        self.recent: deque[OperatorEvent] = deque(maxlen=keep_recent)
        self.by_reason: Counter[tuple[str, str]] = Counter()
        self.all: list[OperatorEvent] = []
        self.seen = 0
        """Occurrences recorded so far (the live view's plain mode prints those after the last count it saw)."""
        self._counts: dict[str, int] = {}  # Event object (namespace/name) -> the count already recorded

    def attach(self, cluster: SimCluster) -> Recorder:
        cluster.access.listen(self._on_change)
        return self

    def restart_clock(self) -> None:
        """Count event times from now (when the workload starts): earlier Events get negative times."""
        now = self.clock()
        shift = now - self.start
        self.start = now
        self.all = [replace(e, t=e.t - shift) for e in self.all]
        self.recent = deque((replace(e, t=e.t - shift) for e in self.recent), maxlen=self.recent.maxlen)

    def _on_change(self, ev: Any) -> None:
        if ev.gr == EVENTS and ev.type in ("ADDED", "MODIFIED"):
            self.record(ev.new.obj)

    def record(self, obj: dict[str, Any]) -> OperatorEvent | None:
        """Count an Event object as written or updated: a recorder that coalesces repeats patches `count` (or
        `series.count`) of the Event it wrote first, so each increase counts as that many occurrences."""
        component = obj.get("reportingComponent") or (obj.get("source") or {}).get("component") or ""
        if not component or component in SIM_COMPONENTS or component.startswith("system:"):
            return None
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        count = max(1, int(obj.get("count") or (obj.get("series") or {}).get("count") or 1))
        new = count - self._counts.get(key, 0) if meta.get("name") else 1
        if new <= 0:
            return None
        if meta.get("name"):
            self._counts[key] = count
        inv = obj.get("involvedObject") or obj.get("regarding") or {}
        ns = f"{inv['namespace']}/" if inv.get("namespace") else ""
        e = OperatorEvent(
            t=self.clock() - self.start,
            component=str(component),
            reason=str(obj.get("reason", "")),
            type=str(obj.get("type", "Normal")),
            involved=f"{inv.get('kind', '')}/{ns}{inv.get('name', '')}",
            message=str(obj.get("message") or obj.get("note") or ""),
        )
        self.recent.append(e)
        self.by_reason[(e.component, e.reason)] += new
        for _ in range(min(new, KEEP - len(self.all))):
            self.all.append(e)
        self.seen += new
        return e

    def since(self, count: int) -> list[OperatorEvent]:
        """Events after the first `count` recorded (of those still kept)."""
        return self.all[count:] if count < len(self.all) else []

    def times(self, reason: str, component: str | None = None) -> list[float]:
        return [e.t for e in self.all if e.reason == reason and (component is None or e.component == component)]

    def count(self, reasons: tuple[str, ...], involved: str) -> int:
        """Events with one of `reasons` about one object (`Kind/namespace/name`)."""
        return sum(1 for e in self.all if e.reason in reasons and e.involved == involved)

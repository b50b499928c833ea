"""MIG slicer metrics (`gpuops_migslicer_*`): slices by profile and state, pods waiting for slices and the
fragmentation of each GPU, computed at scrape time from the informers; allocation latency as it happens."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily

from gpuops.accounting import mig
from gpuops.accounting.errors import AccountingError
from gpuops.kube.collector import SourcedCollector
from gpuops.kube.times import parse_time, wall_clock

from .api import GATE, AllocationClaim, MigNode, MigSlice

__all__ = ["ALLOCATION_SECONDS", "PLAN_FAILURES", "STATE_COLLECTOR", "SliceCollector"]

ALLOCATION_SECONDS = Histogram(
    "gpuops_migslicer_allocation_seconds",
    "From a MIG pod's creation to its gate being lifted (slices made and offered to the kubelet).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
PLAN_FAILURES = PromCounter(
    "gpuops_migslicer_plan_failures_total",
    "Times a gated MIG pod was found held back, by reason: no place for its slices (NoCapacity, Unsatisfiable, "
    "InvalidRequest, AgentNotRegistered, AgentNotReporting, AgentReportRefused, MigDisabled, MigResetPending, "
    "UnknownGPUModel), its "
    "slices made but not offered to the kubelet in time (DeviceNotAdvertised), or its ungate refused "
    "(UngateRefused).",
    ["reason"],
)


SliceSource = tuple[Callable[[], Iterable[MigNode]], Callable[[], Iterable[AllocationClaim]], Callable[[], int]]
"""A running allocator's MigNodes, its claims, and how many pods are gated."""


class SliceCollector(SourcedCollector[SliceSource]):
    """gpuops_migslicer_slices{node,profile,state}, gpuops_migslicer_claims{phase},
    gpuops_migslicer_pods_waiting and gpuops_migslicer_gpu_fragmentation{node,gpu} (the share of a GPU's free
    memory slices that no whole-GPU-sized profile can use: 0 for an empty or a full GPU)."""

    def families(self) -> dict[str, GaugeMetricFamily]:
        return {
            "slices": GaugeMetricFamily("gpuops_migslicer_slices", "MIG slices on the nodes, by profile and state "
                                        "(claimed: made for a claim; orphaned: no claim owns it).",
                                        labels=["node", "profile", "state"]),
            "claims": GaugeMetricFamily("gpuops_migslicer_claims", "AllocationClaims by phase.", labels=["phase"]),
            "waiting": GaugeMetricFamily("gpuops_migslicer_pods_waiting",
                                         f"Pods still carrying the {GATE} scheduling gate."),
            "fragmentation": GaugeMetricFamily(
                "gpuops_migslicer_gpu_fragmentation",
                "1 - (largest profile size that still fits / free memory slices), per GPU; 0 when empty or full.",
                labels=["node", "gpu"]),
            "gpus": GaugeMetricFamily(
                "gpuops_migslicer_gpus", "GPUs the node agents report, by state: Enabled (slices can be made), "
                "Disabled (MIG mode off), Pending (a mode change waits for a GPU reset), UnknownModel (no MIG "
                "geometry known for the GPU). Every reporting node has every state, 0 included.",
                labels=["node", "state"]),
            "heartbeat_age": GaugeMetricFamily(
                "gpuops_migslicer_agent_heartbeat_age_seconds",
                "Seconds since the node agent last wrote its MigNode (it does at least every --heartbeat seconds).",
                labels=["node"]),
        }

    def collect(self) -> Iterable[GaugeMetricFamily]:
        fams = self.families()
        phases: Counter[str] = Counter()
        waiting = 0
        for nodes, claims, gated in self.sources.current():
            for c in claims():
                phases[c.status.phase] += 1
            waiting += gated()
            for mn in nodes():
                node = mn.spec.node_name or mn.metadata.name
                self._agent(fams, node, mn)
                states: Counter[tuple[str, str]] = Counter()
                for g in mn.status.gpus:
                    for s in g.slices:
                        states[(s.profile, "claimed" if s.claim else "orphaned")] += 1
                    fams["fragmentation"].add_metric([node, g.uuid], _fragmentation(g.model, g.slices))
                for (profile, state), n in sorted(states.items()):
                    fams["slices"].add_metric([node, profile, state], n)
        for phase in ("Pending", "Created", "Bound", "Released", "Failed"):
            fams["claims"].add_metric([phase], phases.get(phase, 0))
        fams["waiting"].add_metric([], waiting)
        return list(fams.values())

    @staticmethod
    def _agent(fams: dict[str, GaugeMetricFamily], node: str, mn: MigNode) -> None:
        """The node's GPUs by state, and how long ago its agent last reported."""
        gpu_states = Counter("UnknownModel" if not g.model else g.mig_mode for g in mn.status.gpus)
        for state in GPU_STATES:
            fams["gpus"].add_metric([node, state], gpu_states.get(state, 0))
        if mn.status.heartbeat:
            with contextlib.suppress(ValueError):
                age = (wall_clock() - parse_time(mn.status.heartbeat)) / 1_000_000
                fams["heartbeat_age"].add_metric([node], max(0.0, age))


GPU_STATES = ("Enabled", "Disabled", "Pending", "UnknownModel")


def _fragmentation(model: str, slices: Iterable[MigSlice]) -> float:
    try:
        geom = mig.geometry(model)
        layout = [mig.Placement(s.profile, s.start, s.size) for s in slices]
        free = geom.slices - sum(p.size for p in layout)
        if free <= 0 or not layout:
            return 0.0
        places = mig.free_placements(geom, layout)
        largest = max((geom.profile(name).size for name, starts in places.items() if starts), default=0)
        return round(1 - largest / free, 4)
    except (AccountingError, ValueError):
        return 0.0


STATE_COLLECTOR = SliceCollector()
REGISTRY.register(STATE_COLLECTOR)

"""Autoprovision metrics: groups by state (computed at scrape time from the informer), planning time, and the
GPU-seconds machines spent powered on with no GPU pods (the cost the controller exists to cut). Webhook
request counts and durations live with the client (`power.py`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily

from gpuops.kube.collector import SourcedCollector

from .api import STATES, GPUNodeGroup

__all__ = ["BOOT_TIMEOUTS", "DECISION_SECONDS", "IDLE_GPU_SECONDS", "PLAN_SECONDS", "STATE_COLLECTOR", "StateCollector"]

PLAN_SECONDS = Histogram(
    "gpuops_autoprovision_plan_seconds",
    "Time to compute one power plan (demand -> machines to power on and off).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
DECISION_SECONDS = Histogram(
    "gpuops_autoprovision_decision_seconds",
    "From the controller seeing a pod Unschedulable to its power-on decision being persisted, per pod.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
IDLE_GPU_SECONDS = PromCounter(
    "gpuops_autoprovision_idle_gpu_seconds",
    "GPU-seconds of powered-on managed machines with no GPU pods (Ready, idle), summed over machines.",
)

BOOT_TIMEOUTS = PromCounter(
    "gpuops_autoprovision_boot_timeouts",
    "Power-ons whose machine was not Ready with its GPUs by the boot deadline (group -> Failed, BootTimeout).",
)
"""No labels, so the series exists (at 0) from the start and increase() sees the first timeout; which group
failed is in the BootTimeout Event and in gpuops_autoprovision_node_groups{state="Failed"}."""


class StateCollector(SourcedCollector[Callable[[], Iterable[GPUNodeGroup]]]):
    """gpuops_autoprovision_node_groups{state}: every state reported, 0 included, so alerts can use absent();
    gpuops_autoprovision_group_refused{group,reason}: 1 for each group the controller does not manage (its Ready
    reason says why: NodeClaimed, InvalidSpec)."""

    def families(self) -> dict[str, GaugeMetricFamily]:
        return {
            "groups": GaugeMetricFamily("gpuops_autoprovision_node_groups", "GPUNodeGroups by power state.",
                                        labels=["state"]),
            "refused": GaugeMetricFamily("gpuops_autoprovision_group_refused", "1 for each GPUNodeGroup the "
                                         "controller does not manage, labelled with why (its Ready reason: "
                                         "NodeClaimed, InvalidSpec, SecretNotAllowed, InsecureTransport).",
                                         labels=["group", "reason"]),
        }

    def collect(self) -> Iterable[GaugeMetricFamily]:
        fams = self.families()
        counts: Counter[str] = Counter()
        for source in self.sources.current():
            for g in source():
                counts[g.status.state or "Off"] += 1
                ready = next((c for c in g.status.conditions or () if c.type == "Ready"), None)
                if ready is not None and ready.status == "False" and ready.reason in REFUSALS:
                    fams["refused"].add_metric([g.metadata.name, ready.reason], 1)
        for state in STATES:
            fams["groups"].add_metric([state], counts.get(state, 0))
        return list(fams.values())


REFUSALS = ("InvalidSpec", "NodeClaimed", "SecretNotAllowed", "InsecureTransport")
"""Ready reasons of a group the controller does not manage."""


STATE_COLLECTOR = StateCollector()
REGISTRY.register(STATE_COLLECTOR)

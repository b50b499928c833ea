"""Prometheus series of the spot pool controller and its providers (`gpuops_spotpool_*`)."""

from __future__ import annotations

from collections import Counter as PyCounter
from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from gpuops.kube import conditions as cond
from gpuops.kube.collector import SourcedCollector

from .api import SpotPool

PROVIDER_CALLS = Counter(
    "gpuops_spotpool_provider_calls_total",
    "Cloud API calls made by spot pool providers, by provider, operation and result (ok or an error kind).",
    ["provider", "operation", "result"],
)
PROVIDER_CALL_SECONDS = Histogram(
    "gpuops_spotpool_provider_call_duration_seconds",
    "Duration of cloud API calls made by spot pool providers (one SDK call, after rate limiting).",
    ["provider", "operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LAUNCHES = Counter(
    "gpuops_spotpool_launches_total",
    "Instances requested by launch calls, by pool and result (ok, capacity, quota, credentials, error).",
    ["pool", "result"],
)
TERMINATIONS = Counter(
    "gpuops_spotpool_terminations_total",
    "Instances the controller asked the cloud to terminate, by pool, reason (scale-in, launch-failed, deletion,"
    " reclaimed) and result.",
    ["pool", "reason", "result"],
)
REPLACEMENT_SECONDS = Histogram(
    "gpuops_spotpool_replacement_latency_seconds",
    "From a reclaim becoming observable (termination notice on the node, or the instance leaving a live state) "
    "to the replacement launch being accepted by the cloud.",
    ["pool"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)


class PoolCollector(SourcedCollector[Callable[[], Iterable[SpotPool]]]):
    """At scrape time from the pools' status: gpuops_spotpool_instances{pool,state} (every pool reports every
    state, 0 included, so alerts can use absent()), and the pool's desired, size, ready, minimum, maximum."""

    STATES = ("PENDING", "RUNNING", "STARTING", "REBOOTING", "STOPPING", "STOPPED", "SHUTDOWN", "TERMINATING",
              "LAUNCH_FAILED", "RECLAIMING")

    def families(self) -> dict[str, GaugeMetricFamily]:
        return {
            "instances": GaugeMetricFamily("gpuops_spotpool_instances", "Instances a SpotPool owns, by state "
                                           "(RECLAIMING: under a spot termination notice).", labels=["pool", "state"]),
            "desired": GaugeMetricFamily("gpuops_spotpool_desired_instances", "The size the pool is heading for.",
                                         labels=["pool"]),
            "size": GaugeMetricFamily("gpuops_spotpool_size", "Live instances (pending, starting or running, not "
                                      "reclaiming).", labels=["pool"]),
            "ready": GaugeMetricFamily("gpuops_spotpool_ready_instances", "Instances whose node is Ready with GPUs.",
                                       labels=["pool"]),
            "minimum": GaugeMetricFamily("gpuops_spotpool_minimum", "spec.minimum", labels=["pool"]),
            "maximum": GaugeMetricFamily("gpuops_spotpool_maximum", "spec.maximum", labels=["pool"]),
            "capacity_error": GaugeMetricFamily("gpuops_spotpool_capacity_error", "1 while the pool's CapacityError "
                                                "condition is True.", labels=["pool"]),
            "not_ready": GaugeMetricFamily("gpuops_spotpool_not_ready", "1 while the pool's Ready condition is "
                                           "False, labelled with its reason (SecretNotFound, CloudUnavailable, "
                                           "InvalidSpec, ...); 0 otherwise.", labels=["pool", "reason"]),
        }

    def collect(self) -> Iterable[GaugeMetricFamily]:
        fams = self.families()
        for source in self.sources.current():
            for pool in source():
                name = pool.metadata.name
                st = pool.status
                counts: PyCounter[str] = PyCounter(
                    "RECLAIMING" if i.reclaim_at and i.state in ("PENDING", "RUNNING", "STARTING") else i.state
                    for i in st.instances)
                for state in self.STATES:
                    fams["instances"].add_metric([name, state], counts.get(state, 0))
                fams["desired"].add_metric([name], st.desired)
                fams["size"].add_metric([name], st.size)
                fams["ready"].add_metric([name], st.ready)
                fams["minimum"].add_metric([name], pool.spec.minimum)
                fams["maximum"].add_metric([name], pool.spec.maximum)
                fams["capacity_error"].add_metric([name], 1 if cond.is_true(st.conditions, "CapacityError") else 0)
                ready = cond.get_condition(st.conditions, "Ready")
                down = ready is not None and ready.status == "False"
                fams["not_ready"].add_metric([name, ready.reason if down and ready is not None else ""], int(down))
        return list(fams.values())


STATE_COLLECTOR = PoolCollector()
REGISTRY.register(STATE_COLLECTOR)

"""Prometheus metric objects of the reconciler framework, on the default registry.

Each metric is created once at import, so several managers in one process share them. Every owner keeps
its metrics in its own block below, under a `# --- <owner>` header.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# --- workqueue
# Names, labels and help texts follow controller-runtime (client-go's names plus the `controller` label and
# `priority` on depth), so existing dashboards work. `workqueue_retries_total` counts every add_after /
# add_rate_limited call with a positive delay (deduplicated or not); zero-delay adds are not retries.

WORKQUEUE_BUCKETS = (1e-08, 1e-07, 1e-06, 1e-05, 1e-04, 1e-03, 1e-02, 1e-01, 1.0, 10.0, 100.0, 1000.0)
"""ExponentialBuckets(10e-9, 10, 12): 10 ns .. 1000 s."""

WORKQUEUE_DEPTH = Gauge(
    "workqueue_depth",
    "Current depth of workqueue by workqueue and priority",
    ["name", "controller", "priority"],
)
WORKQUEUE_ADDS = Counter(
    "workqueue_adds", "Total number of adds handled by workqueue", ["name", "controller"]
)
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested",
    ["name", "controller"],
    buckets=WORKQUEUE_BUCKETS,
)
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes.",
    ["name", "controller"],
    buckets=WORKQUEUE_BUCKETS,
)
WORKQUEUE_RETRIES = Counter(
    "workqueue_retries", "Total number of retries handled by workqueue", ["name", "controller"]
)

_UNFINISHED_HELP = (
    "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. "
    "Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate "
    "at which this increases."
)
_LONGEST_HELP = "How many seconds has the longest running processor for workqueue been running."


class InflightSource(Protocol):
    """A queue that can report its in-flight work when scraped."""

    @property
    def metric_labels(self) -> tuple[str, str]: ...  # (name, controller)

    def inflight(self) -> tuple[float, float]: ...  # (sum of ages of in-flight items, oldest age), seconds


class _InflightCollector(Collector):
    """Computes unfinished/longest-running gauges at scrape time instead of on a 500 ms ticker.

    Queues are held weakly, so a dropped queue stops reporting; queues sharing labels are summed (unfinished)
    and maxed (longest).
    """

    def __init__(self) -> None:
        self._queues: weakref.WeakSet[InflightSource] = weakref.WeakSet()

    def track(self, queue: InflightSource) -> None:
        self._queues.add(queue)

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        labels = ["name", "controller"]
        return (
            GaugeMetricFamily("workqueue_unfinished_work_seconds", _UNFINISHED_HELP, labels=labels),
            GaugeMetricFamily("workqueue_longest_running_processor_seconds", _LONGEST_HELP, labels=labels),
        )

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        totals: dict[tuple[str, str], list[float]] = {}
        for queue in list(self._queues):
            unfinished, longest = queue.inflight()
            acc = totals.setdefault(queue.metric_labels, [0.0, 0.0])
            acc[0] += unfinished
            acc[1] = max(acc[1], longest)
        unfinished_family, longest_family = self._families()
        for (name, controller), (unfinished, longest) in sorted(totals.items()):
            unfinished_family.add_metric([name, controller], unfinished)
            longest_family.add_metric([name, controller], longest)
        return (unfinished_family, longest_family)


WORKQUEUE_INFLIGHT = _InflightCollector()
REGISTRY.register(WORKQUEUE_INFLIGHT)

# --- events
# `reason` on gpuops_events_total is the Event's reason (CamelCase constants in our code, so bounded);
# on gpuops_events_dropped_total it is why the Event was not written: spam (per-object token bucket),
# queue_full, rejected (a 4xx other than 404/409), write_failed (retries exhausted), shutdown, error.

EVENTS_TOTAL = Counter(
    "gpuops_events_total",
    "Kubernetes Events recorded by gpuops components (before correlation and spam filtering)",
    ["type", "reason"],
)
EVENTS_DROPPED = Counter(
    "gpuops_events_dropped_total",
    "Kubernetes Events not written to the API server, by why",
    ["reason"],
)

# --- rest client
# controller-runtime's client-go adapter names: `code` is the HTTP status or "<error>"
# when no answer arrived; `method`/`verb` the HTTP method; `host` the API server's host:port. A request is
# timed until its body is read, a watch until its response headers arrive, as client-go does.

REST_CLIENT_LATENCY_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
"""client-go's request latency buckets: 5 ms .. 60 s."""

REST_CLIENT_REQUESTS = Counter(
    "rest_client_requests",
    "Number of HTTP requests, partitioned by status code, method, and host.",
    ["code", "method", "host"],
)
REST_CLIENT_REQUEST_DURATION = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds. Broken down by verb, and host.",
    ["verb", "host"],
    buckets=REST_CLIENT_LATENCY_BUCKETS,
)

# --- leader election
# client-go's names (k8s.io/component-base leader election metrics); `name` is the Lease's name.

LEADER_ELECTION_MASTER_STATUS = Gauge(
    "leader_election_master_status",
    "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. "
    "'name' is the string used to identify the lease. Please make sure to group by name.",
    ["name"],
)
LEADER_ELECTION_SLOWPATH = Counter(
    "leader_election_slowpath",
    "Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the "
    "lease. Please make sure to group by name.",
    ["name"],
)

# --- informer
# Labels `name` (the informer's name), `group`, `version`, `resource` on every metric, as the component-base
# informer metrics have them. The names carry our prefix: client-go's alpha `informer_*` gauges count a FIFO our
# informers do not have, so the same name would mean something else. `gpuops_informer_queued_items` counts
# notifications waiting in handler buffers (there is no FIFO between the watch and the store; the handler buffers
# are the queue); `gpuops_informer_processing_latency_seconds` is the time from a watch frame's arrival until it
# is in the store and handed to every handler buffer (including any wait for room);
# `gpuops_informer_store_resource_version` holds the 15 least significant digits of the resourceVersion the store
# is current at. Relist reasons: initial, expired (410 or an unusable resourceVersion), error, fallback
# (streaming list refused), continue_expired; watch restart reasons: closed, very_short, transport, throttled,
# server_error, watchdog.

INFORMER_LABELS = ["name", "group", "version", "resource"]
INFORMER_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""1 ms .. 10 s."""

INFORMER_PROCESSING_LATENCY = Histogram(
    "gpuops_informer_processing_latency_seconds",
    "Time taken to process an event from the watch into the store and the handler buffers.",
    INFORMER_LABELS,
    buckets=INFORMER_LATENCY_BUCKETS,
)
INFORMER_EVENTS = Counter(
    "gpuops_informer_events", "Watch events received by informers, by type", [*INFORMER_LABELS, "type"]
)
INFORMER_RELISTS = Counter(
    "gpuops_informer_relists",
    "Lists (initial and relists) started by informers, by reason",
    [*INFORMER_LABELS, "reason"],
)
INFORMER_WATCH_RESTARTS = Counter(
    "gpuops_informer_watch_restarts",
    "Watches restarted without a relist, by why the previous watch ended",
    [*INFORMER_LABELS, "reason"],
)
INFORMER_LIST_DURATION = Histogram(
    "gpuops_informer_list_duration_seconds",
    "Duration of complete lists (all pages, or a streaming list up to its initial-events-end bookmark)",
    INFORMER_LABELS,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
INFORMER_INITIAL_SYNC_DURATION = Gauge(
    "gpuops_informer_initial_sync_duration_seconds",
    "Seconds from an informer's start until its first complete list was in the store",
    INFORMER_LABELS,
)
INFORMER_HANDLER_BLOCKED = Counter(
    "gpuops_informer_handler_blocked_seconds",
    "Seconds the reflector waited for room in full handler buffers (backpressure)",
    INFORMER_LABELS,
)
INFORMER_HANDLER_ERRORS = Counter(
    "gpuops_informer_handler_errors", "Exceptions raised by informer event handlers", INFORMER_LABELS
)


class InformerSource(Protocol):
    """An informer as the scrape-time collector sees it."""

    @property
    def metric_labels(self) -> tuple[str, str, str, str]: ...  # (name, group, version, resource)

    def queued(self) -> int: ...

    def objects(self) -> int: ...

    def last_event_age(self) -> float: ...

    def synced(self) -> bool: ...

    def store_resource_version(self) -> str: ...


class _InformerCollector(Collector):
    """Gauges computed at scrape time, so the hot path pays nothing for them. Informers are held weakly;
    informers sharing labels are summed (queued, objects) or take the freshest value (age, rv, synced)."""

    def __init__(self) -> None:
        self._informers: weakref.WeakSet[InformerSource] = weakref.WeakSet()

    def track(self, informer: InformerSource) -> None:
        self._informers.add(informer)

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "gpuops_informer_queued_items",
                "Number of notifications waiting in handler buffers",
                labels=INFORMER_LABELS,
            ),
            GaugeMetricFamily(
                "gpuops_informer_store_resource_version",
                "Resource version the store is current at (15 least significant digits)",
                labels=INFORMER_LABELS,
            ),
            GaugeMetricFamily("gpuops_informer_objects", "Objects in the informer's store", labels=INFORMER_LABELS),
            GaugeMetricFamily(
                "gpuops_informer_last_event_age_seconds",
                "Seconds since the informer last heard from the API server (event, bookmark or list)",
                labels=INFORMER_LABELS,
            ),
            GaugeMetricFamily(
                "gpuops_informer_synced", "1 once the informer's first list is complete", labels=INFORMER_LABELS
            ),
        )

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        acc: dict[tuple[str, str, str, str], list[float]] = {}
        for inf in list(self._informers):
            rv = inf.store_resource_version()
            rv_num = float(int(rv[-15:])) if rv.isdigit() else 0.0
            row = acc.get(inf.metric_labels)
            values = [float(inf.queued()), rv_num, float(inf.objects()), inf.last_event_age(), float(inf.synced())]
            if row is None:
                acc[inf.metric_labels] = values
            else:
                row[0] += values[0]
                row[1] = max(row[1], values[1])
                row[2] += values[2]
                row[3] = min(row[3], values[3])
                row[4] = max(row[4], values[4])
        families = self._families()
        for labels, values in sorted(acc.items()):
            for family, value in zip(families, values, strict=True):
                family.add_metric(list(labels), value)
        return families


INFORMER_COLLECTOR = _InformerCollector()
REGISTRY.register(INFORMER_COLLECTOR)

# --- controller
# controller-runtime's names, labels and buckets, so its Grafana dashboards work as they are;
# `result` is one of success, error, requeue, requeue_after (all set to 0 when a controller starts). A reconcile
# cut by its timeout counts in reconcile_timeouts_total and as an error. The read-your-own-writes gate is ours.

RECONCILE_TIME_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0,
    40.0, 50.0, 60.0,
)
"""controller-runtime's reconcile_time_seconds buckets: 5 ms .. 60 s."""

RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile", "Total number of reconciliations per controller", ["controller", "result"]
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors", "Total number of reconciliation errors per controller", ["controller"]
)
TERMINAL_RECONCILE_ERRORS = Counter(
    "controller_runtime_terminal_reconcile_errors",
    "Total number of terminal reconciliation errors per controller",
    ["controller"],
)
RECONCILE_PANICS = Counter(
    "controller_runtime_reconcile_panics", "Total number of reconciliation panics per controller", ["controller"]
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller",
    ["controller"],
    buckets=RECONCILE_TIME_BUCKETS,
)
MAX_CONCURRENT_RECONCILES = Gauge(
    "controller_runtime_max_concurrent_reconciles",
    "Maximum number of concurrent reconciles per controller",
    ["controller"],
)
ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers", "Number of currently used workers per controller", ["controller"]
)
RECONCILE_TIMEOUTS = Counter(
    "controller_runtime_reconcile_timeouts", "Total number of reconciliation timeouts per controller", ["controller"]
)
READ_YOUR_WRITES_TIMEOUTS = Counter(
    "gpuops_read_your_writes_timeouts",
    "Keys released to a reconcile before the cache had seen the previous reconcile's writes (gate timed out)",
    ["controller"],
)
READ_YOUR_WRITES_WAIT = Histogram(
    "gpuops_read_your_writes_wait_seconds",
    "How long keys were held after a reconcile until the cache had seen its writes",
    ["controller"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

# --- manager
# Event-loop health as the manager's /healthz judges it: the lag of a periodic timer (how late it fired).

EVENT_LOOP_LAG = Gauge(
    "gpuops_event_loop_lag_seconds", "How late the manager's periodic event-loop probe last woke up"
)

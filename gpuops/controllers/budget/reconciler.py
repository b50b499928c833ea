"""Reconcile a GPUWorkloadBudget: pods + budget -> accounting inputs -> status, enforcement, finalizers.

Level-triggered: every reconcile recomputes from the informer caches plus the ledger kept in the budget's
own status; nothing is accumulated in memory except pods seen deleted and not yet written to a ledger.

Pod contract (what "usage" means)
    gpus   the effective request of `spec.gpuResourceName` (`gpuops.accounting.requests`: init containers,
           sidecars and overhead as the scheduler counts them); `cpu` works and may be fractional.
    start  the earliest container start (init and regular: state.running/terminated.startedAt,
           lastState.terminated.startedAt), else status.startTime; a pod with neither has not used anything.
    end    for a Succeeded/Failed pod, or a deleted pod whose containers have all terminated: the latest
           finishedAt, else deletionTimestamp, else its latest condition transition. Otherwise the pod is open
           (it accrues up to now, CrashLoopBackOff included: the device stays allocated). A pod that vanishes
           while still open has no recorded finish: it ends when we saw it vanish (microseconds), or at its
           deletionTimestamp if earlier. A pod we evict with no grace period stops accruing at once, at the
           counting instant we sent the eviction (`Enforcer.stopped_at`), in the scrape snapshot too; its
           finishedAt, never earlier, replaces that end once it is in, or, if it vanished while still running,
           the middle of the eviction request (microseconds; the server stopped it inside).
One figure (`gpuops.accounting.reporting`). Every figure, status, Events, the enforcement decision and the
metrics, is `reported_usage` at the counting instant: the clock rounded down to the whole second, the
resolution of the container timestamps, so a running pod counts up to the last whole second, as its finishedAt
will. And a pod's end is never before what an already reported figure counted it through (`counted_through`
of the budget's last snapshot: its reconcile or a later scrape): a cache that still showed a finished pod
running made us report more than its finishedAt says, and that figure stands. So, while nothing leaves the
window, no figure is lower than one reported before it, whether a pod finishes, is evicted or is deleted.
A pod counts in every budget (of its namespace) that selects it.

Ledger
    A finished pod is written into status.ledger in the same status write that first sees it finished, while
    it is still in the cache, so a later deletion loses nothing; a pod deleted before that is taken from the
    informer's delete event (its last known state) and written on the next reconcile. Bounds (`compact`):
    entries that left the window are dropped (exact for every later instant); beyond `max_ledger_entries`
    the oldest finished entries, up to one end instant recorded as ledger.compactedThrough, are merged into
    buckets of `window / bucket_divisions` with `compact_ledger`. A finished pod still in the API that ends
    at or before compactedThrough is counted through its bucket only, so finished pods need not leave the API
    for the ledger to stay bounded. Entries: at most max_ledger_entries plus those that ended within
    `compaction_margin` (60 s: the cache may lag a pod's final status, and an entry is merged only once no
    late pod can still end before the watermark). Buckets: at most bucket_divisions + 1 per bucket width.
    Error: buckets never under-count; they over-count by at most peak GPUs in one bucket x the bucket width,
    and only while a bucket straddles the window's trailing edge. Time counted past a pod's recorded finish (a
    figure had counted it running before the finish arrived: `settle_end`) is an entry's `late` part, kept in
    status as recordedEnd and in buckets as lateGpuSeconds. status.ledger.errorBoundGpuHours is the sum of
    both, so consumedGpuHours minus it never exceeds the usage the pods' own records give.
    With accounting.retainFinishedPods, matched pods carry the `gpuops.io/budget-accounting` finalizer (added
    before any enforcement), removed right after a successful status write holds their final usage (in every
    retaining budget that selects them), so deletions while the operator is down lose nothing either. Without
    it, a pod that finishes and is deleted while we are down, or is never seen at all, is lost (at most its
    GPUs x its runtime); a mutating webhook adding the finalizer at admission would close the last gap.

Requeue: at the earliest of the accounting's next change (quota crossing, an interval entering or leaving the
window), the end of the enforcement delay, and enforcement's own timers; events do the rest.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

import msgspec
import structlog

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import (
    Interval,
    Ledger,
    LedgerBucket,
    LedgerEntry,
    Usage,
    compact_ledger,
    format_gpu_hours,
    gpu_hours,
)
from gpuops.accounting.quantity import format_quantity, parse_quantity, round_up_to_nano
from gpuops.accounting.reporting import (
    counted_through,
    counting_instant,
    next_counting_instant,
    reported_usage,
    settle_end,
)
from gpuops.accounting.requests import Container, PodSpecRequests, pod_request
from gpuops.controllers.coexistence import CONDITION, NO_CONFLICT
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result, requeue_at
from gpuops.kube.errors import Conflict, NotFound
from gpuops.kube.informer import INDEX_NAMESPACE, Informer, by_namespace
from gpuops.kube.objects import Condition, Job, Pod
from gpuops.kube.resources import PODS
from gpuops.kube.selectors import anchors_of
from gpuops.kube.times import parse_time_or_none as _t
from gpuops.kube.times import wall_clock

from .api import (
    BUDGETS,
    FINALIZER,
    PAUSED_BY,
    BudgetStatus,
    GPUWorkloadBudget,
    LastEnforcement,
    LedgerBucketStatus,
    LedgerEntryStatus,
    LedgerStatus,
    ParsedSpec,
    SpecError,
    format_time,
    parse_spec,
    parse_time,
)
from .enforcement import EnforcementOptions, Enforcer, Situation, Target
from .metrics import Published, Snapshot

__all__ = [
    "Book",
    "BudgetReconciler",
    "LedgerMemo",
    "Options",
    "PodSpan",
    "compact",
    "ledger_from_status",
    "ledger_to_status",
    "pod_gpus",
    "pod_span",
    "wall_clock",
]

log = structlog.get_logger("gpuops.controllers.budget")

_SECOND = 1_000_000
_TERMINAL = ("Succeeded", "Failed")

INDEX_HELD = "gpuops.io/budget-accounting"
"""Pods carrying our finalizer, by namespace."""
INDEX_ANCHOR = "gpuops.io/selector-anchor"
"""Budgets by "<namespace>/<anchor>" of their selector (`gpuops.kube.selectors`): a pod event finds the budgets
that may select it in O(its labels), not O(budgets in its namespace)."""
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



@dataclass(frozen=True, slots=True)
class Options:
    max_ledger_entries: int = 500
    """Ledger entries kept individually; older ones are merged into buckets (bounded error, see module doc)."""
    bucket_divisions: int = 240
    """Buckets per window: 15 s buckets for a 1 h window, 6 min for 24 h."""
    finalizer_recheck: float = 1.0
    """Seconds before asking another budget again to record a pod both retain."""
    compaction_margin: float = 60.0
    """Only entries that ended at least this long ago are merged (the cache may lag a pod's final status)."""
    status_refresh: float | None = None
    """If set, rewrite the status at least this often (seconds) while pods run; None: only on changes."""
    enforcement: EnforcementOptions = field(default_factory=EnforcementOptions)


# ---------------------------------------------------------------------------------------------- pods


class PodSpan(NamedTuple):
    start: int | None
    end: int | None
    final: bool



def pod_span(pod: Pod) -> PodSpan:
    """When the pod started and ended using its devices (see the module docstring for the contract)."""
    st = pod.status
    starts: list[int] = []
    finishes: list[int] = []
    statuses = pod.status.container_statuses or ()
    all_terminated = bool(statuses)
    for i, cs in enumerate((*statuses, *(st.init_container_statuses or ()))):
        state = cs.state
        if i < len(statuses) and (state is None or state.terminated is None):
            all_terminated = False
        for s in (state, cs.last_state):
            if s is None:
                continue
            if s.running is not None and (at := _t(s.running.started_at)) is not None:
                starts.append(at)
            if s.terminated is not None:
                if (at := _t(s.terminated.started_at)) is not None:
                    starts.append(at)
                if s is state and (at := _t(s.terminated.finished_at)) is not None:
                    finishes.append(at)
    start = min(starts) if starts else _t(st.start_time)
    deleted = _t(pod.metadata.deletion_timestamp)
    final = st.phase in _TERMINAL or (deleted is not None and all_terminated)
    if start is None or not final:
        return PodSpan(start, None, final)
    if finishes:
        end = max(finishes)
    elif deleted is not None:
        end = deleted
    else:
        end = max((t for c in st.conditions or () if (t := _t(c.last_transition_time)) is not None), default=start)
    return PodSpan(start, max(start, end), True)


def _container(c: Any) -> Container:
    r = c.resources
    return Container(
        c.name,
        requests=dict(r.requests or {}) if r is not None else {},
        limits=dict(r.limits or {}) if r is not None else {},
        restartable=c.restart_policy == "Always",
    )


def pod_gpus(pod: Pod, resource: str) -> Fraction:
    """The pod's effective request of `resource` (0 when malformed: the API server would not have taken it)."""
    spec = pod.spec
    try:
        return pod_request(
            PodSpecRequests(
                init_containers=[_container(c) for c in spec.init_containers or ()],
                containers=[_container(c) for c in spec.containers or ()],
                overhead=dict(spec.overhead or {}),
            ),
            resource,
        )
    except AccountingError as e:
        log.warning("pod requests unreadable; counted as 0", pod=f"{pod.metadata.namespace}/{pod.metadata.name}",
                    error=str(e))
        return Fraction(0)


# ---------------------------------------------------------------------------------------------- ledger <-> status


def _quantity(value: Fraction) -> str:
    return format_quantity(round_up_to_nano(value))  # rounding up: never record less than was used


@dataclass(frozen=True, slots=True)
class Book:
    """A budget's ledger as the accounting package wants it, plus what status keeps beside it."""

    ledger: Ledger = field(default_factory=Ledger)
    names: dict[str, str] = field(default_factory=dict)
    compacted_through: int | None = None
    """Finished pods ending at or before this instant are inside the buckets, or out of the window."""

    def covers(self, end: int) -> bool:
        return self.compacted_through is not None and end <= self.compacted_through


EntryText = tuple[str, str, str, str, str | None]
"""A ledger entry as status holds it: (uid, start, end, gpus, recordedEnd)."""


@dataclass(slots=True)
class LedgerMemo:
    """One budget's ledger entries parsed and formatted at its previous reconcile. A ledger holds up to
    max_ledger_entries (500) entries and every reconcile read and rewrote all of them: exact time and quantity
    parsing and formatting were two thirds of a reconcile's time (measured with bench/scale.py). Entries are
    immutable once written, so each is parsed and formatted once; each use keeps only the entries still in
    the ledger (bounded by it), and a forgotten budget drops its memo."""

    parsed: dict[EntryText, LedgerEntry] = field(default_factory=dict)
    texts: dict[LedgerEntry, tuple[str, str, str, str | None]] = field(default_factory=dict)


def ledger_from_status(status: LedgerStatus | None, resource: str, memo: LedgerMemo | None = None) -> Book:
    """The ledger kept in status; unreadable items are skipped (and logged).

    A ledger kept for another resource name (spec.gpuResourceName changed) is not comparable: it starts over.
    `memo`: entries parsed at the previous call for the same budget are reused (and only the current ones kept).
    """
    if status is None or (status.resource_name and status.resource_name != resource):
        return Book()
    entries: list[LedgerEntry] = []
    names: dict[str, str] = {}
    known = memo.parsed if memo is not None else {}
    kept: dict[EntryText, LedgerEntry] = {}
    for e in status.entries or ():
        text = (e.uid, e.start, e.end, e.gpus, e.recorded_end)
        entry = known.get(text)
        if entry is None:
            try:
                entry = _entry_from_status(e)
            except (ValueError, AccountingError) as err:
                log.warning("ledger entry unreadable; skipped", uid=e.uid, error=str(err))
                continue
        kept[text] = entry
        entries.append(entry)
        names[e.uid] = e.name
    if memo is not None:
        memo.parsed = kept
    buckets: list[LedgerBucket] = []
    for b in status.buckets or ():
        try:
            buckets.append(LedgerBucket(start=parse_time(b.start), end=parse_time(b.end),
                                        gpu_micros=parse_quantity(b.gpu_seconds) * _SECOND,
                                        peak_gpus=parse_quantity(b.peak_gpus),
                                        late_gpu_micros=min(parse_quantity(b.late_gpu_seconds),
                                                            parse_quantity(b.gpu_seconds)) * _SECOND))
        except (ValueError, AccountingError) as err:
            log.warning("ledger bucket unreadable; skipped", start=b.start, error=str(err))
    return Book(Ledger(entries=tuple(entries), buckets=tuple(buckets)), names, _t(status.compacted_through))


def _entry_from_status(e: LedgerEntryStatus) -> LedgerEntry:
    """Raises ValueError or AccountingError on an unreadable uid, start, end or gpus. An unreadable recordedEnd
    only loses the late part's mark (logged): the usage itself still counts."""
    start, end = parse_time(e.start), parse_time(e.end)
    late = 0
    if e.recorded_end is not None:
        try:
            late = end - min(end, max(start, parse_time(e.recorded_end)))
        except ValueError as err:
            log.warning("ledger entry's recordedEnd unreadable; its late part is not marked", uid=e.uid,
                        error=str(err))
    return LedgerEntry(uid=e.uid, start=start, end=end, gpus=parse_quantity(e.gpus), late=late)


def ledger_to_status(
    book: Book, *, resource: str, max_entries: int, bucket_width: int, error: Fraction,
    memo: LedgerMemo | None = None,
) -> LedgerStatus:
    """`memo`: entries formatted at the previous call for the same budget are reused (only the current kept)."""
    ledger, names = book.ledger, book.names
    known = memo.texts if memo is not None else {}
    kept: dict[LedgerEntry, tuple[str, str, str, str | None]] = {}
    entries = []
    for e in ledger.entries:
        text = known.get(e)
        if text is None:
            text = (format_time(e.start), format_time(e.end), _quantity(e.gpus),
                    format_time(e.end - e.late) if e.late else None)
        kept[e] = text
        entries.append(LedgerEntryStatus(uid=e.uid, name=names.get(e.uid, ""), start=text[0], end=text[1],
                                         gpus=text[2], recorded_end=text[3]))
    if memo is not None:
        memo.texts = kept
    return LedgerStatus(
        resource_name=resource,
        max_entries=max_entries,
        bucket_seconds=bucket_width // _SECOND,
        error_bound_gpu_hours=format_gpu_hours(error),
        compacted_through=format_time(book.compacted_through) if book.compacted_through is not None else None,
        entries=tuple(entries) or None,
        buckets=tuple(
            LedgerBucketStatus(start=format_time(b.start), end=format_time(b.end),
                               gpu_seconds=_quantity(b.gpu_micros / _SECOND), peak_gpus=_quantity(b.peak_gpus),
                               late_gpu_seconds=_quantity(b.late_gpu_micros / _SECOND))
            for b in ledger.buckets
        ) or None,
    )


def compact(
    book: Book, fresh: Iterable[LedgerEntry], *, now: int, window: int, max_entries: int, bucket_width: int,
    open_uids: Collection[str], margin: int,
) -> Book:
    """Add `fresh` entries, drop what left the window, and merge the oldest finished entries beyond
    `max_entries` into buckets, always all entries up to one end instant (the new `compacted_through`), so
    "end <= compacted_through" tells a merged pod from one never recorded. Only entries that ended at least
    `margin` ago and whose pods are not open (`open_uids`) are merged: a pod the cache still shows running
    cannot have ended before the watermark. Entries kept: at most `max_entries` plus those that ended within
    `margin`; buckets: at most `window / bucket_width + 1` per bucket width.
    """
    merged = Ledger(entries=(*book.ledger.entries, *fresh), buckets=book.ledger.buckets)
    step = compact_ledger(merged, now=now, window=window, max_entries=len(merged.entries), bucket_width=bucket_width,
                          live_uids=open_uids)  # dedup and drop what left the window; merges nothing
    through = book.compacted_through
    excess = len(step.entries) - max_entries
    eligible = sorted(e.end for e in step.entries if e.uid not in open_uids and e.end <= now - margin)
    if excess > 0 and eligible:
        cutoff = eligible[min(excess, len(eligible)) - 1]
        count = sum(1 for end in eligible if end <= cutoff)
        step = compact_ledger(step, now=now, window=window, max_entries=len(step.entries) - count,
                              bucket_width=bucket_width, live_uids=open_uids)
        through = cutoff if through is None else max(through, cutoff)
    kept = {e.uid for e in step.entries}
    return Book(step, {u: n for u, n in book.names.items() if u in kept}, through)


# ---------------------------------------------------------------------------------------------- status diff


def _diff(current: msgspec.Struct | None, desired: msgspec.Struct, nested: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON merge patch turning `current` into `desired` (fields named in `nested` are diffed one level down)."""
    out: dict[str, Any] = {}
    cls = type(desired)  # the class attributes, not msgspec.structs.fields (which re-resolves annotations)
    for name, wire in zip(cls.__struct_fields__, cls.__struct_encode_fields__, strict=True):
        new = getattr(desired, name)
        old = getattr(current, name) if current is not None else None
        if new == old:
            continue
        if name in nested and isinstance(new, msgspec.Struct) and isinstance(old, msgspec.Struct):
            out[wire] = _diff(old, new)
        else:
            out[wire] = msgspec.to_builtins(new) if new is not None else None
    return out


def _conditions(items: list[dict[str, Any]]) -> tuple[Condition, ...]:
    return msgspec.convert(items, tuple[Condition, ...])


JOBS_LEFT_ALONE = "ExternallyManagedJobs"
"""ConflictDetected reason (and Event reason) of a budget whose Pause left Jobs to the controller owning them."""


def _with_conflict(budget: GPUWorkloadBudget, desired: BudgetStatus, left_alone: list[tuple[str, str]],
                   now: int) -> tuple[BudgetStatus, str | None]:
    """`desired` with ConflictDetected set from the Jobs Pause left alone, and the message to send as a Warning
    Event when that is news (None otherwise). A budget that never had a conflict gets no such condition."""
    current = cond.get_condition(budget.status.conditions, CONDITION)
    if left_alone:
        names = sorted({name for name, _ in left_alone})
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        value, reason = "True", JOBS_LEFT_ALONE
        message = (f"over quota, but Pause did not suspend Job(s) {shown}: {left_alone[0][1]}. Stop them through "
                   "that controller (Kueue: a ClusterQueue or LocalQueue stopPolicy, a smaller quota, or the "
                   "Workload's spec.active=false), or use the Evict action, which works on any pod")
    elif current is not None and current.status != "False":
        value, reason = "False", NO_CONFLICT
        message = "no Job this budget would pause is owned by another controller"
    else:
        return desired, None
    items = cond.set_condition(desired.conditions, CONDITION, value, reason, message[:1024],
                               budget.metadata.generation, now=format_time(now - now % _SECOND))
    # news: the conflict starts, or a Job joins it (one that finished or went leaves quietly)
    news = value == "True" and (current is None or current.status != "True"
                                or bool({n for n, _ in left_alone} - _jobs_named(current.message)))
    return msgspec.structs.replace(desired, conditions=_conditions(items)), message if news else None


_NAMED = re.compile(r"did not suspend Job\(s\) (.*?)(?: and \d+ more)?: ")


def _jobs_named(message: str) -> set[str]:
    """The Jobs a ConflictDetected message of ours names (beyond the first ten: not listed, so taken as news)."""
    found = _NAMED.search(message)
    return set(found.group(1).split(", ")) if found else set()


# ---------------------------------------------------------------------------------------------- reconciler


@dataclass(slots=True)
class _PodFacts:
    """What the reconciler derived from one pod, kept while the parts it came from stay the same objects."""

    containers: Any
    init_containers: Any
    overhead: Any
    gpus: dict[str, Fraction] = field(default_factory=dict)
    status: Any = None
    deleted: str | None = None
    span: PodSpan | None = None
    interval: Interval | None = None


@dataclass(slots=True)
class _Member:
    pod: Pod
    span: PodSpan
    gpus: Fraction
    interval: Interval | None


class BudgetReconciler:
    """Reconciles budgets; see the module docstring. `controller` is set by `setup` (for delayed enqueues)."""

    def __init__(
        self,
        client: Client,
        pods: Informer[Pod],
        budgets: Informer[GPUWorkloadBudget],
        jobs: Informer[Job],
        enforcer: Enforcer,
        *,
        clock: Callable[[], int] = wall_clock,
        options: Options | None = None,
    ) -> None:
        self.client = client
        self.pods = pods
        self.budgets = budgets
        self.jobs = jobs
        self.enforcer = enforcer
        self.clock = clock
        self.options = options or Options()
        self.controller: Controller | None = None
        for inf in (pods, budgets, jobs):
            inf.add_index(INDEX_NAMESPACE, by_namespace)
        pods.add_index(INDEX_HELD, _held)
        self._label_indexes: set[str] = set()
        self._specs: dict[str, tuple[str, int, ParsedSpec | SpecError]] = {}
        self._departed: dict[str, dict[str, tuple[Pod, int]]] = {}
        self._facts: dict[str, _PodFacts] = {}
        self._snapshots: dict[tuple[str, str], Snapshot] = {}
        self._ledgers: dict[str, LedgerMemo] = {}  # budget key -> its ledger entries, parsed and formatted
        budgets.add_index(INDEX_ANCHOR, self._anchors)  # after _specs: the index parses specs through spec_of
        enforcer.on_stop = self._stop_counting

    # ------------------------------------------------------------------------------------------ metrics source

    def snapshots(self) -> dict[tuple[str, str], Snapshot]:
        return self._snapshots

    def now(self) -> int:
        """The instant figures are computed at: the clock, held back to when the pod cache was last known current
        (while the pods watch is down, a pod the cache shows running may have stopped: counting it further
        would report GPU-seconds that a later, exact figure must not take back)."""
        now = self.clock()
        lag = time.monotonic() - self.pods.current_through()
        return now - round(lag * _SECOND) if lag > 0 else now

    # ------------------------------------------------------------------------------------------ caches

    def spec_of(self, budget: GPUWorkloadBudget) -> ParsedSpec | SpecError:
        """The checked spec, parsed once per generation."""
        meta = budget.metadata
        key = f"{meta.namespace}/{meta.name}"
        hit = self._specs.get(key)
        if hit is not None and hit[0] == meta.uid and hit[1] == meta.generation:
            return hit[2]
        try:
            parsed: ParsedSpec | SpecError = parse_spec(budget.spec)
        except SpecError as e:
            parsed = e
        self._specs[key] = (meta.uid, meta.generation, parsed)
        return parsed

    def _memo(self, pod: Pod) -> _PodFacts:
        """The pod's memo entry, emptied of what a new spec or status invalidates.

        Informer objects are immutable and replaced whole, so identity of the (shared) parts says "unchanged".
        """
        spec, status, deleted = pod.spec, pod.status, pod.metadata.deletion_timestamp
        facts = self._facts.get(pod.metadata.uid)
        if facts is None:
            facts = self._facts[pod.metadata.uid] = _PodFacts(spec.containers, spec.init_containers, spec.overhead)
        elif not (facts.containers is spec.containers and facts.init_containers is spec.init_containers
                  and facts.overhead is spec.overhead):
            facts.containers, facts.init_containers, facts.overhead = (
                spec.containers, spec.init_containers, spec.overhead)
            facts.gpus.clear()
        if facts.status is not status or facts.deleted != deleted:
            facts.status, facts.deleted, facts.span = status, deleted, None
        return facts

    def _gpus(self, pod: Pod, resource: str) -> Fraction:
        """`pod_gpus`, memoized per pod while its container tuples stay the same."""
        facts = self._memo(pod)
        gpus = facts.gpus.get(resource)
        if gpus is None:
            gpus = facts.gpus[resource] = pod_gpus(pod, resource)
        return gpus

    def _interval(self, pod: Pod, start: int, end: int | None, gpus: Fraction, late: int) -> Interval:
        """The pod's accounting interval, reused while it is the same (building one validates its fields)."""
        facts = self._facts[pod.metadata.uid]  # _gpus/_span made it
        hit = facts.interval
        if hit is None or hit.start != start or hit.end != end or hit.gpus is not gpus or hit.late != late:
            hit = facts.interval = Interval(uid=pod.metadata.uid, start=start, end=end, gpus=gpus, late=late)
        return hit

    def _publish(self, ns: str, name: str, live: tuple[Interval, ...], ledger: Ledger, spec: ParsedSpec,
                 now: int) -> None:
        """Leave the accounting inputs for scrapes; `now` is the first (counting) instant they report."""
        self._snapshots[(ns, name)] = Snapshot(live, ledger, spec.window, spec.quota, Published(now))

    def _stop_counting(self, key: str, uid: str, at: int | None) -> None:
        """An eviction without grace is being sent (at `at`) or was refused (`at` None): end that pod's interval in
        the budget's scrape snapshot at once, at the counting instant of the send, no earlier than a scrape
        already counted (or reopen it)."""
        ns, _, name = key.partition("/")
        snap = self._snapshots.get((ns, name))
        if snap is None:
            return
        stopped = self.enforcer.stopped_at
        if at is not None and uid in stopped:
            stopped[uid] = max(at, snap.published.at)
        halt = None if at is None else counting_instant(stopped.get(uid, at))
        live = tuple(
            msgspec.structs.replace(i, end=None if halt is None else max(i.start, halt))
            if i.uid == uid else i  # an evicted pod is open, or ended by us: never finished on its own
            for i in snap.live
        )
        self._snapshots[(ns, name)] = Snapshot(live, snap.ledger, snap.window, snap.quota, snap.published)

    def _span(self, pod: Pod) -> PodSpan:
        """`pod_span`, memoized per pod while its status and deletion stamp stay the same."""
        facts = self._memo(pod)
        if facts.span is None:
            facts.span = pod_span(pod)
        return facts.span

    def _anchors(self, budget: GPUWorkloadBudget) -> tuple[str, ...]:
        spec = self.spec_of(budget)
        if isinstance(spec, SpecError):
            return ()
        ns = budget.metadata.namespace
        return tuple(f"{ns}/{a}" for a in spec.selector.anchors())

    def _selected(self, namespace: str, spec: ParsedSpec) -> list[Pod]:
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

    def _budgets_selecting(self, pod: Pod) -> list[tuple[GPUWorkloadBudget, ParsedSpec]]:
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

    # ------------------------------------------------------------------------------------------ mappers

    def map_pod(self, pod: Pod) -> list[Request]:
        """Every budget of the pod's namespace that selects it; plus a namespace sweep for an orphaned finalizer."""
        ns = pod.metadata.namespace
        out: list[Request] = []
        retained = False
        for b, spec in self._budgets_selecting(pod):
            out.append(Request(ns, b.metadata.name))
            retained = retained or (spec.retain and not b.metadata.deletion_timestamp)
        if not retained and FINALIZER in (pod.metadata.finalizers or ()):
            out.append(Request(ns, ""))
        return out

    def map_deleted_pod(self, pod: Pod) -> list[Request]:
        """Keep the pod's last known state for each budget that selects it until a ledger holds it."""
        uid = pod.metadata.uid
        seen = self.clock()
        requests = self.map_pod(pod)
        for req in requests:
            if req.name:
                self._departed.setdefault(req.key, {})[uid] = (pod, seen)
        self._facts.pop(uid, None)
        return requests

    def prune_departed(self, budget: GPUWorkloadBudget) -> None:
        """Forget remembered deleted pods this budget's ledger now holds (whichever replica wrote it), or whose
        deletion left the window. A standby records deletions too (so a failover loses none) but writes no
        ledger: this keeps its memory to the pods deleted since the leader's last write."""
        key = f"{budget.metadata.namespace}/{budget.metadata.name}"
        pending = self._departed.get(key)
        if not pending:
            return
        ledger = budget.status.ledger
        held = {e.uid for e in (ledger.entries or ())} if ledger is not None else set()
        spec = self.spec_of(budget)
        horizon = self.clock() - spec.window - round(self.options.compaction_margin * _SECOND) \
            if not isinstance(spec, SpecError) else None
        stopped = self.enforcer.stopped_at
        for uid, (_, seen) in list(pending.items()):
            if uid in held or (horizon is not None and seen < horizon):
                del pending[uid]
                if uid in stopped and not any(uid in d for d in self._departed.values()):
                    self.enforcer.forget_stop(uid)
        if not pending:
            del self._departed[key]

    @staticmethod
    def map_job(job: Job) -> list[Request]:
        """Jobs we paused map to their budget (so a manual unsuspend is noticed)."""
        ref = (job.metadata.annotations or {}).get(PAUSED_BY, "")
        ns, _, name = ref.partition("/")
        return [Request(ns, name)] if ns and name else []

    # ------------------------------------------------------------------------------------------ reconcile

    async def reconcile(self, req: Request) -> Result | None:
        if not req.name:
            await self._sweep(req.namespace)
            return None
        budget = self.budgets.store.get(req.key)
        if budget is None or budget.metadata.deletion_timestamp:
            self._forget(req.key)
            await self._sweep(req.namespace)
            self.enforcer.forget_series(req.key)  # after the sweep, whose resumes count under the budget too
            return None
        now = self.now()
        spec = self.spec_of(budget)
        if isinstance(spec, SpecError):
            self._forget(req.key)
            await self._write_invalid(budget, spec, now)
            return None
        return await self._reconcile(budget, spec, now)

    def _forget(self, key: str) -> None:
        ns, _, name = key.partition("/")
        self._snapshots.pop((ns, name), None)
        self._departed.pop(key, None)
        self._specs.pop(key, None)
        self._ledgers.pop(key, None)
        self.enforcer.forget(key)

    def _bucket_width(self, spec: ParsedSpec) -> int:
        divisions = max(1, self.options.bucket_divisions)
        return max(_SECOND, math.ceil(spec.window / divisions / _SECOND) * _SECOND)

    async def _reconcile(self, budget: GPUWorkloadBudget, spec: ParsedSpec, now: int) -> Result | None:
        """`now` is the clock; every figure is computed at its counting instant `at` (whole seconds)."""
        at = counting_instant(now)
        meta = budget.metadata
        ns, name = meta.namespace, meta.name
        key = f"{ns}/{name}"
        opts = self.options
        selected = self._selected(ns, spec)

        # 1. pods -> intervals; finished and departed pods -> ledger entries
        members: list[_Member] = []
        fresh: list[LedgerEntry] = []
        memo = self._ledgers.setdefault(key, LedgerMemo())
        prev_book = ledger_from_status(budget.status.ledger, spec.resource, memo)
        names = dict(prev_book.names)
        open_uids: set[str] = set()
        stopped = self.enforcer.stopped_at
        last = self._snapshots.get((ns, name))
        counted = counted_through(last.live, at=last.published.at) if last is not None else {}
        for pod in selected:
            uid = pod.metadata.uid
            gpus = self._gpus(pod, spec.resource)
            span = self._span(pod)
            if span.end is None:
                open_uids.add(uid)
            interval = None
            halt = stopped.get(uid)
            end, late = _counted_end(span, None if halt is None else counting_instant(halt), counted.get(uid))
            if span.start is not None and gpus > 0 and not (
                span.end is not None and end is not None and prev_book.covers(end)
            ):
                interval = self._interval(pod, span.start, end, gpus, late)
                if span.end is not None and end is not None:
                    fresh.append(LedgerEntry(uid=uid, start=span.start, end=end, gpus=gpus, late=late))
                    names[uid] = pod.metadata.name
            members.append(_Member(pod, span, gpus, interval))
        departed = dict(self._departed.get(key, {}))
        for uid, (pod, seen) in departed.items():
            entry = _departed_entry(pod, seen, pod_gpus(pod, spec.resource), self.enforcer.vanished_end(uid),
                                    counted.get(uid))
            if entry is not None and not prev_book.covers(entry.end):
                fresh.append(entry)
                names[uid] = pod.metadata.name
        horizon = at - spec.window
        width = self._bucket_width(spec)
        book = compact(
            Book(prev_book.ledger, names, prev_book.compacted_through), fresh, now=at, window=spec.window,
            max_entries=opts.max_ledger_entries, bucket_width=width, open_uids=open_uids,
            margin=round(opts.compaction_margin * _SECOND),
        )
        ledger = book.ledger
        # a finished pod merged just now counts through its bucket only
        live = tuple(m.interval for m in members if m.interval is not None
                     and not (m.interval.end is not None and book.covers(m.interval.end)))
        usage = reported_usage(live, ledger, now=at, window=spec.window, quota=spec.quota)
        self._publish(ns, name, live, ledger, spec, at)

        await self._hold(spec, members)

        # 2. over-quota bookkeeping (persisted: a restart does not reset the delay) and enforcement
        prev = budget.status
        over_since: int | None = None
        if usage.over_quota:
            over_since = at
            if cond.is_true(prev.conditions, "QuotaExceeded"):
                held = _t(prev.over_quota_since)
                if held is None:
                    c = cond.get_condition(prev.conditions, "QuotaExceeded")
                    held = _t(c.last_transition_time) if c is not None else None
                over_since = held if held is not None else at
        due_at = over_since + spec.delay if over_since is not None else None
        def targets() -> list[Target]:  # per-pod usage costs a Fraction sum per pod: only when acting
            return [Target(m.pod, gpu_hours((m.interval,), now=at, window=spec.window), m.span.end is None,
                           m.span.final) for m in members if m.interval is not None]

        # the decision and its Events use the figure the status below records (same usage, same instant);
        # only the enforcer's own timers run on the clock itself
        crossed = usage.over_quota and not cond.is_true(prev.conditions, "QuotaExceeded")
        situation = Situation(now=now, over=usage.over_quota, due=due_at is not None and at >= due_at,
                              consumed=usage.consumed, quota=spec.quota, window_hours=spec.window_hours,
                              crossed=crossed)
        outcome = await self.enforcer.apply(budget, spec, situation, targets, prev.last_enforcement, over_since)
        # 3. status (one merge patch of what changed), then what may only follow a durable ledger
        desired = self._status(budget, spec, usage, book, width, over_since, outcome.last or prev.last_enforcement,
                               outcome.degraded, members, at)
        desired, conflict_news = _with_conflict(budget, desired, outcome.left_alone, at)
        if not await self._write_status(budget, desired, at):
            return None
        if conflict_news is not None:  # once per change of what is left alone, not once per reconcile
            self.enforcer.event(budget, "Warning", JOBS_LEFT_ALONE, conflict_news)
            log.warning("pause left jobs to another controller", budget=key, message=conflict_news)
        pending = self._departed.get(key)
        if pending is not None:
            for uid, item in departed.items():
                if pending.get(uid) is item:
                    del pending[uid]
                    if uid in stopped and not any(uid in d for d in self._departed.values()):
                        self.enforcer.forget_stop(uid)  # every budget that counted it has its final usage in a ledger
            if not pending:
                del self._departed[key]
        wake = [outcome.wake_at, usage.next_change]
        if due_at is not None and at < due_at:
            wake.append(next_counting_instant(due_at))  # the first counting instant it is due at
        wake.append(await self._release(budget, spec, members, book, horizon, at))
        if opts.status_refresh and usage.burn_rate > 0:
            wake.append(now + round(opts.status_refresh * _SECOND))
        log.debug("budget reconciled", budget=key, consumed=format_gpu_hours(usage.consumed),
                  over=usage.over_quota, members=len(members), ledger=len(ledger.entries))
        return requeue_at(now, wake)

    def _status(
        self,
        budget: GPUWorkloadBudget,
        spec: ParsedSpec,
        usage: Usage,
        book: Book,
        width: int,
        over_since: int | None,
        last: LastEnforcement | None,
        degraded: tuple[str, str] | None,
        members: list[_Member],
        now: int,
    ) -> BudgetStatus:
        gen = budget.metadata.generation
        stamp = format_time(now - now % _SECOND)
        quota_text = format_gpu_hours(spec.quota)
        window = f"{spec.window_hours}h"
        items = cond.set_condition(
            budget.status.conditions, "Ready", "True", "Accounted",
            f"usage of {spec.resource} by the selected pods is accounted over a {window} window", gen, now=stamp,
        )
        if usage.over_quota:
            msg = f"consumption reached the quota of {quota_text} GPU-hours per {window}"
            if over_since is not None:
                msg += f" (since {format_time(over_since)}); action {spec.action}"
            items = cond.set_condition(items, "QuotaExceeded", "True", "QuotaReached", msg, gen, now=stamp)
        else:
            items = cond.set_condition(items, "QuotaExceeded", "False", "WithinBudget",
                                       f"consumption is below the quota of {quota_text} GPU-hours per {window}",
                                       gen, now=stamp)
        if degraded is None:
            items = cond.set_condition(items, "Degraded", "False", "AsExpected",
                                       "accounting and enforcement work as expected", gen, now=stamp)
        else:
            items = cond.set_condition(items, "Degraded", "True", degraded[0], degraded[1], gen, now=stamp)
        running = sum(1 for m in members if m.interval is not None and m.span.end is None)
        return BudgetStatus(
            observed_generation=gen,
            consumed_gpu_hours=format_gpu_hours(usage.consumed),
            remaining_gpu_hours=format_gpu_hours(usage.remaining),
            quota_gpu_hours=quota_text,
            burn_rate_gpus=_quantity(usage.burn_rate),
            tracked_pods=usage.pods_in_window,
            running_pods=running,
            computed_at=budget.status.computed_at,
            over_quota_since=format_time(over_since) if over_since is not None else None,
            exhausts_at=format_time(usage.exhausted_at) if usage.exhausted_at is not None else None,
            ledger=ledger_to_status(book, resource=spec.resource, max_entries=self.options.max_ledger_entries,
                                    bucket_width=width, error=usage.error_bound,
                                    memo=self._ledgers.get(f"{budget.metadata.namespace}/{budget.metadata.name}")),
            last_enforcement=last,
            conditions=_conditions(items),
        )

    async def _write_status(self, budget: GPUWorkloadBudget, desired: BudgetStatus, now: int) -> bool:
        """Merge-patch what changed (guarded by resourceVersion); False if the budget is gone. computedAt is the
        counting instant of `now`: the whole second the figures were computed at."""
        patch = _diff(budget.status, desired, nested=("ledger", "last_enforcement"))
        if not patch:
            return True
        patch["computedAt"] = format_time(counting_instant(now))
        meta = budget.metadata
        try:
            await self.client.patch(
                BUDGETS, meta.name, {"metadata": {"resourceVersion": meta.resource_version}, "status": patch},
                namespace=meta.namespace, subresource="status",
            )
        except NotFound:
            return False
        return True

    async def _write_invalid(self, budget: GPUWorkloadBudget, err: SpecError, now: int) -> None:
        gen = budget.metadata.generation
        stamp = format_time(now - now % _SECOND)
        items = cond.set_condition(budget.status.conditions, "Ready", "False", "InvalidSpec", str(err), gen, now=stamp)
        items = cond.set_condition(items, "Degraded", "True", "InvalidSpec", str(err), gen, now=stamp)
        desired = msgspec.structs.replace(budget.status, observed_generation=gen, conditions=_conditions(items))
        if desired != budget.status:
            self.enforcer.event(budget, "Warning", "InvalidSpec", str(err))
            log.warning("budget spec invalid", budget=f"{budget.metadata.namespace}/{budget.metadata.name}",
                        field=err.field, error=str(err))
        await self._write_status(budget, desired, now)

    # ------------------------------------------------------------------------------------------ finalizers

    def _needers(self, pod: Pod, span: PodSpan, now: int, exclude: str | None) -> list[Request]:
        """Retaining budgets (other than `exclude`) that still need `pod` to keep the accounting finalizer."""
        meta = pod.metadata
        out = []
        for b, spec in self._budgets_selecting(pod):
            bkey = f"{b.metadata.namespace}/{b.metadata.name}"
            if bkey == exclude or not spec.retain or b.metadata.deletion_timestamp:
                continue
            if self._gpus(pod, spec.resource) == 0:
                continue
            if span.final and (span.start is None or span.end is None or span.end <= now - spec.window):
                continue  # never ran, or its usage already left this budget's window
            if span.final and span.end is not None and _recorded(b.status.ledger, meta.uid, span.end):
                continue
            out.append(Request(b.metadata.namespace, b.metadata.name))
        return out

    async def _hold(self, spec: ParsedSpec, members: list[_Member]) -> None:
        """retainFinishedPods: every matched pod that may still use GPUs carries the accounting finalizer
        (added before any enforcement, so an evicted pod stays until its final usage is in the ledger)."""
        if not spec.retain:
            return
        for m in members:
            meta = m.pod.metadata
            if m.span.final or m.gpus <= 0 or meta.deletion_timestamp or FINALIZER in (meta.finalizers or ()):
                continue
            await self._set_finalizers(m.pod, [*(meta.finalizers or ()), FINALIZER])

    async def _release(
        self,
        budget: GPUWorkloadBudget,
        spec: ParsedSpec,
        members: list[_Member],
        book: Book,
        horizon: int,
        now: int,
    ) -> int | None:
        recorded = {e.uid for e in book.ledger.entries}
        key = f"{budget.metadata.namespace}/{budget.metadata.name}"
        mine = {m.pod.metadata.uid: m for m in members} if spec.retain else {}
        wake: int | None = None
        for pod in self.pods.store.by_index(INDEX_HELD, budget.metadata.namespace):
            meta = pod.metadata
            member = mine.get(meta.uid)
            if member is not None and not member.span.final:
                continue
            span = member.span if member is not None else self._span(pod)
            ours = member is not None and member.interval is not None and span.end is not None and span.end > horizon
            if ours and meta.uid not in recorded and not (span.end is not None and book.covers(span.end)):
                continue  # not in our ledger (cannot happen after a successful write; be safe)
            others = self._needers(pod, span, now, exclude=key)
            if others:  # an open pod stays held; a finished one waits for the others' ledgers
                if span.final:
                    wake = self._ask(others, now, wake)
                continue
            await self._set_finalizers(pod, [f for f in meta.finalizers or () if f != FINALIZER])
        return wake

    def _ask(self, requests: Iterable[Request], now: int, wake: int | None) -> int:
        delay = self.options.finalizer_recheck
        if self.controller is not None:
            for req in requests:
                self.controller.enqueue(req, after=delay, trigger="finalizer recheck")
        at = now + round(delay * _SECOND)
        return at if wake is None else min(wake, at)

    async def _sweep(self, namespace: str) -> None:
        """Release accounting finalizers no valid retaining budget needs, resume what gone budgets paused."""
        now = self.clock()
        for pod in self.pods.store.by_index(INDEX_HELD, namespace):
            span = pod_span(pod)
            needers = self._needers(pod, span, now, exclude=None)
            if not needers:
                await self._set_finalizers(pod, [f for f in pod.metadata.finalizers or () if f != FINALIZER])
            elif span.final:
                self._ask(needers, now, None)
        alive = {b.metadata.name for b in self.budgets.store.by_index(INDEX_NAMESPACE, namespace)
                 if not b.metadata.deletion_timestamp}
        await self.enforcer.resume_orphans(namespace, alive)

    async def _set_finalizers(self, pod: Pod, finalizers: list[str]) -> None:
        meta = pod.metadata
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.resource_version}}
        try:
            await self.client.patch(PODS, meta.name, patch, namespace=meta.namespace)
        except (Conflict, NotFound) as e:  # the pod changed or went: its event brings us back
            log.debug("finalizer update skipped", pod=f"{meta.namespace}/{meta.name}", error=str(e))


def _recorded(ledger: LedgerStatus | None, uid: str, end: int) -> bool:
    """Does a (cached) status ledger hold this pod's usage, as an entry or under its watermark?"""
    if ledger is None:
        return False
    through = _t(ledger.compacted_through)
    return (through is not None and end <= through) or any(e.uid == uid for e in ledger.entries or ())


def _counted_end(span: PodSpan, halted: int | None, counted: int | None) -> tuple[int | None, int]:
    """The end to count for a pod still in the cache (None: it still runs), and how much of it lies past the
    recorded end (the interval's `late` part).

    A pod we evicted with no grace period (`halted`: the counting instant we sent the eviction) ends then while
    the cache still shows it running; once its final state is in, at its finishedAt (the server stopped it
    after we sent). Either end is raised to `counted`, what an already reported figure counted it through
    (`halted` itself, once a figure was reported after it), so its reported usage never shrinks (`settle_end`).
    """
    if span.start is None:
        return span.end, 0
    end = span.end if span.end is not None else halted
    return (None, 0) if end is None else _settled(span.start, end, counted)


def _settled(start: int, end: int, counted: int | None) -> tuple[int, int]:
    """`settle_end`, and the part of the settled end past the given one (the record's late part)."""
    settled = settle_end(start, end, counted)
    return settled, settled - max(start, end)


def _departed_entry(
    pod: Pod, seen: int, gpus: Fraction, halted: int | None = None, counted: int | None = None
) -> LedgerEntry | None:
    """The final usage of a pod that left the API (its last known state, `seen` when it went).

    A finished one ends at its finishedAt. One that vanished still running has no recorded finish: it ends when
    our eviction without grace stopped it (`halted`, `Enforcer.vanished_end`), else when we saw it gone or at
    its deletionTimestamp if earlier (microseconds: our own clock's). Either is raised to `counted` (see
    `_counted_end`)."""
    span = pod_span(pod)
    if span.start is None or gpus <= 0:
        return None
    end = span.end
    if end is None:
        end = halted if halted is not None else seen
        deleted = _t(pod.metadata.deletion_timestamp)
        if halted is None and deleted is not None:
            end = min(end, deleted)
    settled, late = _settled(span.start, end, counted)
    return LedgerEntry(uid=pod.metadata.uid, start=span.start, end=settled, gpus=gpus, late=late)

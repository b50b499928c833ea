"""Reconcile a GPUWorkloadBudget: pods + budget -> accounting inputs -> status, enforcement, finalizers.

Level-triggered: every reconcile recomputes from the informer caches plus the ledger kept in the budget's
own status; nothing is accumulated in memory except pods seen deleted and not yet written to a ledger.
What a pod's usage is: podcontract.py. How finished usage is kept in the status, compacted and made durable:
ledger.py.

One figure (`gpuops.accounting.reporting`). Every figure, status, Events, the enforcement decision and the
metrics, is `reported_usage` at the counting instant: the clock rounded down to the whole second, the
resolution of the container timestamps, so a running pod counts up to the last whole second, as its finishedAt
will. And a pod's end is never before what an already reported figure counted it through (`counted_through`
of the budget's last snapshot: its reconcile or a later scrape): a cache that still showed a finished pod
running made us report more than its finishedAt says, and that figure stands. So, while nothing leaves the
window, no figure is lower than one reported before it, whether a pod finishes, is evicted or is deleted.

Requeue: at the earliest of the accounting's next change (quota crossing, an interval entering or leaving the
window, a held pod's turn), taken at the first counting instant that sees it, the end of the enforcement delay,
and enforcement's own timers; events do the rest.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from fractions import Fraction

import msgspec
import structlog

from gpuops.accounting.gpuhours import (
    Interval,
    Ledger,
    LedgerEntry,
    Usage,
    format_gpu_hours,
    gpu_hours,
)
from gpuops.accounting.reporting import counted_through, counting_instant, next_counting_instant
from gpuops.accounting.windows import nominal_length
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result, requeue_at
from gpuops.kube.errors import Conflict, NotFound
from gpuops.kube.informer import INDEX_NAMESPACE, Informer, by_namespace
from gpuops.kube.objects import Job, Node, Pod
from gpuops.kube.resources import PODS
from gpuops.kube.times import parse_time_or_none as _t
from gpuops.kube.times import wall_clock

from .api import FINALIZER, PAUSED_BY, BudgetStatus, GPUWorkloadBudget, ParsedSpec, PeriodSummary, SpecError
from .caches import PodFacts, SpecCache, facts_of
from .carryover import in_period
from .closing import previous_period
from .enforcement import EnforcementOptions, Enforcer, Outcome, Situation, Target
from .gating import Gatekeeper, GateOutcome, GateView, gated_by
from .kinds import key_of_node, model_of
from .ledger import Book, LedgerMemo, compact, ledger_from_status, ledger_to_status, recorded
from .metrics import Published, Snapshot
from .podcontract import PodSpan, counted_end, departed_entry, pod_gpus, pod_span
from .pricebook import PriceBook, Priced
from .selection import INDEX_HELD, Selection
from .status import JOBS_LEFT_ALONE, desired_status, invalid_status, with_conflict, write_status
from .units import Figures, cuts, figures, in_unit

__all__ = ["BudgetReconciler", "Options", "wall_clock"]

log = structlog.get_logger("gpuops.controllers.budget")

_SECOND = 1_000_000

Departed = dict[str, tuple[Pod, int, str]]
"""One budget's pods seen deleted and not yet in its ledger: uid -> (last known state, when we saw it go, its
kind)."""


@dataclass(frozen=True, slots=True)
class Options:
    max_ledger_entries: int = 500
    """Ledger entries kept individually; older ones are merged into buckets (bounded error, see ledger.py)."""
    bucket_divisions: int = 240
    """Buckets per window: 15 s buckets for a 1 h window, 6 min for 24 h."""
    finalizer_recheck: float = 1.0
    """Seconds before asking another budget again to record a pod both retain."""
    compaction_margin: float = 60.0
    """Only entries that ended at least this long ago are merged (the cache may lag a pod's final status)."""
    status_refresh: float | None = None
    """If set, rewrite the status at least this often (seconds) while pods run; None: only on changes."""
    enforcement: EnforcementOptions = field(default_factory=EnforcementOptions)


@dataclass(slots=True)
class _Member:
    """A selected pod as this reconcile counts it; `interval` None: it counts for nothing, or in a bucket."""

    pod: Pod
    span: PodSpan
    gpus: Fraction
    interval: Interval | None
    kind: str = ""
    """Its GPU model and capacity type (`kinds`)."""


@dataclass(slots=True)
class _Tally:
    """The budget's pods, counted: its selected pods, and ledger entries for the finished and departed ones."""

    names: dict[str, str]
    """Pod names of the ledger's entries, by uid (status shows them)."""
    members: list[_Member] = field(default_factory=list)
    fresh: list[LedgerEntry] = field(default_factory=list)
    open_uids: set[str] = field(default_factory=set)

    def record(self, entry: LedgerEntry, name: str) -> None:
        self.fresh.append(entry)
        self.names[entry.uid] = name


def _key(budget: GPUWorkloadBudget) -> str:
    return f"{budget.metadata.namespace}/{budget.metadata.name}"


@dataclass(eq=False, repr=False)
class BudgetReconciler:
    """Reconciles budgets; see the module docstring. `controller` is set by `setup` (for delayed enqueues)."""

    client: Client
    pods: Informer[Pod]
    budgets: Informer[GPUWorkloadBudget]
    jobs: Informer[Job]
    enforcer: Enforcer
    _: KW_ONLY
    nodes: Informer[Node] | None = None
    """Where pods ran: their kind (GPU model, capacity type) comes from their node's labels."""
    prices: PriceBook | None = None
    """The price lists: weighted and cost figures, and the quotas in those units."""
    gatekeeper: Gatekeeper | None = None
    """Gate budgets' held pods (`gating.py`); None: Gate holds nothing back (no admission webhook installed)."""
    clock: Callable[[], int] = wall_clock
    options: Options = field(default_factory=Options)
    controller: Controller | None = field(default=None, init=False)
    _specs: SpecCache = field(default_factory=SpecCache, init=False)
    _selection: Selection = field(init=False)
    _departed: dict[str, Departed] = field(default_factory=dict, init=False)
    _facts: dict[str, PodFacts] = field(default_factory=dict, init=False)
    _snapshots: dict[tuple[str, str], Snapshot] = field(default_factory=dict, init=False)
    _ledgers: dict[str, LedgerMemo] = field(default_factory=dict, init=False)
    """Budget key -> its ledger entries, parsed and formatted."""

    def __post_init__(self) -> None:
        for inf in (self.pods, self.budgets, self.jobs):
            inf.add_index(INDEX_NAMESPACE, by_namespace)
        self._selection = Selection(self.pods, self.budgets, self.spec_of)
        self.enforcer.on_stop = self._stop_counting

    def spec_of(self, budget: GPUWorkloadBudget) -> ParsedSpec | SpecError:
        """The checked spec, parsed once per generation."""
        return self._specs.get(budget)

    def _memo(self, pod: Pod) -> PodFacts:
        """What was derived from the pod and still holds (`caches.facts_of`)."""
        return facts_of(self._facts, pod)

    def _gpus(self, pod: Pod, resource: str) -> Fraction:
        return self._memo(pod).gpus_of(pod, resource)

    def _kind(self, pod: Pod, facts: PodFacts | None = None) -> str:
        """The pod's kind (`kinds`): taken from its node the first time the node is known, then kept."""
        if facts is not None and facts.kind is not None:
            return facts.kind
        node = self.nodes.store.get(pod.spec.node_name) if self.nodes is not None and pod.spec.node_name else None
        if node is None:
            return ""
        kind = key_of_node(node.metadata.labels or {})
        if facts is not None:
            facts.kind = kind
        return kind

    def _span(self, pod: Pod) -> PodSpan:
        return self._memo(pod).span_of(pod)

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

    def _publish(self, ns: str, name: str, live: tuple[Interval, ...], ledger: Ledger, spec: ParsedSpec,
                 now: int, members: list[_Member], priced: Priced | None) -> None:
        """Leave the accounting inputs for scrapes; `now` is the first (counting) instant they report."""
        kinds = {m.interval.uid: m.kind for m in members if m.interval is not None and m.kind}
        self._snapshots[(ns, name)] = Snapshot(live, ledger, spec, Published(now), kinds, priced)

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
        self._snapshots[(ns, name)] = dataclasses.replace(snap, live=live)

    # ------------------------------------------------------------------------------------------ mappers

    def map_pod(self, pod: Pod) -> list[Request]:
        """Every budget of the pod's namespace that selects it; plus a namespace sweep for an orphaned finalizer."""
        ns = pod.metadata.namespace
        out: list[Request] = []
        retained = False
        for b, spec in self._selection.budgets_selecting(pod):
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
        kind = self._kind(pod, self._facts.get(uid))  # as first seen: the node may be relabelled or gone later
        for req in requests:
            if req.name:
                self._departed.setdefault(req.key, {})[uid] = (pod, seen, kind)
        self._facts.pop(uid, None)
        return requests

    def prune_departed(self, budget: GPUWorkloadBudget) -> None:
        """Forget remembered deleted pods this budget's ledger now holds (whichever replica wrote it), or whose
        deletion left the window. A standby records deletions too (so a failover loses none) but writes no
        ledger: this keeps its memory to the pods deleted since the leader's last write."""
        key = _key(budget)
        pending = self._departed.get(key)
        if not pending:
            return
        ledger = budget.status.ledger
        held = {e.uid for e in (ledger.entries or ())} if ledger is not None else set()
        spec = self.spec_of(budget)
        horizon = spec.edge_at(self.clock()) - round(self.options.compaction_margin * _SECOND) \
            if not isinstance(spec, SpecError) else None
        self._forget_departed(key, pending, [uid for uid, (_, seen, _) in pending.items()
                                             if uid in held or (horizon is not None and seen < horizon)])

    def _forget_departed(self, key: str, pending: Departed, uids: Iterable[str]) -> None:
        """Drop `uids` from what budget `key` remembers of deleted pods. The stop an eviction recorded for one goes
        too once no budget remembers the pod: every budget that counted it has its final usage in a ledger."""
        stopped = self.enforcer.stopped_at
        for uid in uids:
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
        priced = self._priced(spec) if not isinstance(spec, SpecError) else None
        invalid = spec if isinstance(spec, SpecError) else priced if isinstance(priced, SpecError) else None
        if invalid is not None or isinstance(spec, SpecError) or isinstance(priced, SpecError):
            self._forget(req.key)
            await self._write_invalid(budget, invalid or SpecError("spec", "invalid"), now)
            if self.gatekeeper is not None:
                await self.gatekeeper.let_all_go(req.namespace, req.name, f"budget {req.name}'s spec is invalid")
            return None
        return await self._reconcile(budget, spec, priced, now)

    def _priced(self, spec: ParsedSpec) -> Priced | SpecError | None:
        """The price list the budget counts with (None: none, and it counts GPU-hours only); a SpecError if its
        quota needs one it cannot have."""
        found = self.prices.lookup(spec.price_list) if self.prices is not None else None
        if spec.unit == "GPUHours":
            return found if isinstance(found, Priced) else None
        if isinstance(found, str):
            return SpecError("spec.priceList", found)
        if found is None:
            which = f"no GPUPriceList named {spec.price_list!r}" if spec.price_list else "no GPUPriceList is default"
            return SpecError("spec.priceList", f"{which}: a {spec.unit} quota needs prices; create one (or mark one "
                                               "default: true) or name an existing one")
        if spec.unit == "Cost" and found.currency != spec.currency:
            return SpecError("spec.quota.cost.currency", f"is {spec.currency} but GPUPriceList {found.name} prices "
                                                         f"in {found.currency}: use {found.currency}, or a price list "
                                                         f"in {spec.currency}")
        return found

    def _forget(self, key: str) -> None:
        ns, _, name = key.partition("/")
        self._snapshots.pop((ns, name), None)
        self._departed.pop(key, None)
        self._specs.forget(key)
        self._ledgers.pop(key, None)
        self.enforcer.forget(key)

    async def _reconcile(self, budget: GPUWorkloadBudget, spec: ParsedSpec, priced: Priced | None,
                         now: int) -> Result | None:
        """Count the budget's pods (selected, and deleted ones its ledger lacks), put the finished ones in the
        ledger, publish the figure, hold finalizers, enforce, write the status; then what may only follow a durable
        ledger: forget the deleted pods it holds, release finalizers. `now` is the clock; every figure is computed
        at its counting instant `at` (whole seconds)."""
        at = counting_instant(now)
        key = _key(budget)
        prev_book = ledger_from_status(budget.status.ledger, spec.resource, self._ledgers.setdefault(key, LedgerMemo()))
        counted = self._counted(budget)
        tally = self._count_pods(budget.metadata.namespace, spec, prev_book, counted)
        departed = self._count_departed(key, spec, prev_book, counted, tally)
        before = Ledger(entries=(*prev_book.ledger.entries, *tally.fresh), buckets=prev_book.ledger.buckets)
        live_before = _live_by_kind(tally.members, prev_book)
        closed = previous_period(spec, budget.status, priced, live_before, before, at)
        spec = in_period(spec, budget.status, *in_unit(spec, priced, live_before, before), (), at)
        book = self._compact(prev_book, tally, spec, at, cuts(priced))
        live = _live(tally.members, book)
        fig = figures(spec, priced, _live_by_kind(tally.members, book), book.ledger, at=at)
        usage = fig.quota
        self._publish(budget.metadata.namespace, budget.metadata.name, live, book.ledger, spec, at, tally.members,
                      priced)
        await self._hold(spec, tally.members)
        over_since = _over_since(budget.status, usage.over_quota, at)
        due_at = over_since + spec.delay if over_since is not None else None
        outcome = await self._enforce(budget, spec, usage, tally.members, over_since, due_at, now)
        if spec.action == "Gate" and outcome.degraded is None and not (self.gatekeeper and self.gatekeeper.webhook):
            outcome.degraded = ("GateWebhookOff", "action Gate holds no new pod back: this operator runs without its "
                                "admission webhook (gpuops run --budget-webhook-port; manifests/webhook)")
        # before the status write: once the status says over quota, the webhook already holds new pods
        gate = await self._gate(budget, spec, priced, fig, tally.members, book,
                                due=due_at is not None and at >= due_at, at=at)
        if not await self._write_status(budget, spec, fig, book, tally.members, outcome, at, over_since=over_since,
                                        closed=closed, gate=gate):
            return None
        self._forget_recorded(key, departed)
        released = await self._release(budget, spec, tally.members, book, spec.edge_at(at), at)
        log.debug("budget reconciled", budget=key, consumed=format_gpu_hours(usage.consumed),
                  over=usage.over_quota, members=len(tally.members), ledger=len(book.ledger.entries))
        return requeue_at(now, [*self._wake_at(usage, outcome, due_at, released, now),
                                _counted_from(fig.gpu_hours.next_change),
                                _counted_from(gate.until if gate is not None else None)])

    def _counted(self, budget: GPUWorkloadBudget) -> dict[str, int]:
        """Through which instant the budget's last reported figure (its snapshot) counted each pod."""
        last = self._snapshots.get((budget.metadata.namespace, budget.metadata.name))
        return counted_through(last.live, at=last.published.at) if last is not None else {}

    def _count_pods(self, ns: str, spec: ParsedSpec, prev_book: Book, counted: dict[str, int]) -> _Tally:
        """The selected pods as intervals, and ledger entries for the finished ones `prev_book` does not cover.
        A pod we stopped by an eviction without grace ends at that eviction while the cache shows it running."""
        tally = _Tally(dict(prev_book.names))
        stopped = self.enforcer.stopped_at
        for pod in self._selection.pods_of(ns, spec):
            uid = pod.metadata.uid
            facts = self._memo(pod)
            kind = self._kind(pod, facts)
            gpus, span = facts.gpus_of(pod, spec.resource, model_of(kind)), facts.span_of(pod)
            if span.end is None:
                tally.open_uids.add(uid)
            interval = None
            halt = stopped.get(uid)
            end, late = counted_end(span, None if halt is None else counting_instant(halt), counted.get(uid))
            if span.start is not None and gpus > 0 and not (
                span.end is not None and end is not None and prev_book.covers(end)
            ):
                interval = facts.interval_of(uid, span.start, end, gpus, late)
                if span.end is not None and end is not None:
                    tally.record(LedgerEntry(uid=uid, start=span.start, end=end, gpus=gpus, late=late, key=kind),
                                 pod.metadata.name)
            tally.members.append(_Member(pod, span, gpus, interval, kind))
        return tally

    def _count_departed(self, key: str, spec: ParsedSpec, prev_book: Book, counted: dict[str, int],
                        tally: _Tally) -> Departed:
        """Ledger entries for the pods seen deleted before a ledger held them; returns the memory they came from,
        for `_forget_recorded` once a status write holds them."""
        departed = dict(self._departed.get(key, {}))
        for uid, (pod, seen, kind) in departed.items():
            entry = departed_entry(pod, seen, pod_gpus(pod, spec.resource, model_of(kind)),
                                   self.enforcer.vanished_end(uid),
                                   counted.get(uid))
            if entry is not None and not prev_book.covers(entry.end):
                tally.record(msgspec.structs.replace(entry, key=kind), pod.metadata.name)
        return departed

    def _bucket_width(self, spec: ParsedSpec) -> int:
        divisions = max(1, self.options.bucket_divisions)
        return max(_SECOND, math.ceil(nominal_length(spec.window) / divisions / _SECOND) * _SECOND)

    def _compact(self, prev_book: Book, tally: _Tally, spec: ParsedSpec, at: int, price_changes: tuple[int, ...]
                 ) -> Book:
        """The ledger to write: the previous one with the fresh entries, within its bounds (`ledger.compact`); no
        bucket spans a price change, so each is priced by the version at its start."""
        opts = self.options
        return compact(
            Book(prev_book.ledger, tally.names, prev_book.compacted_through), tally.fresh, now=at,
            window=spec.length_at(at), max_entries=opts.max_ledger_entries, bucket_width=self._bucket_width(spec),
            open_uids=tally.open_uids, margin=round(opts.compaction_margin * _SECOND), cuts=price_changes,
        )

    async def _enforce(self, budget: GPUWorkloadBudget, spec: ParsedSpec, usage: Usage, members: list[_Member],
                       over_since: int | None, due_at: int | None, now: int) -> Outcome:
        """Let the enforcer act. The decision and its Events use the figure the status records (same usage, same
        counting instant); only the enforcer's own timers run on the clock itself (`now`)."""
        at = counting_instant(now)

        def targets() -> list[Target]:  # per-pod usage costs a Fraction sum per pod: only when acting
            return [Target(m.pod, gpu_hours((m.interval,), now=at, window=spec.length_at(at)), m.span.end is None,
                           m.span.final) for m in members if m.interval is not None]

        prev = budget.status
        crossed = usage.over_quota and not cond.is_true(prev.conditions, "QuotaExceeded")
        situation = Situation(now=now, over=usage.over_quota, due=due_at is not None and at >= due_at,
                              consumed=usage.consumed, quota=spec.quota, during=spec.during, unit=spec.unit_name,
                              crossed=crossed)
        return await self.enforcer.apply(budget, spec, situation, targets, prev.last_enforcement, over_since)

    async def _write_status(self, budget: GPUWorkloadBudget, spec: ParsedSpec, fig: Figures, book: Book,
                            members: list[_Member], outcome: Outcome, at: int, *, over_since: int | None,
                            closed: PeriodSummary | None, gate: GateOutcome | None = None) -> bool:
        """Write the status (one merge patch of what changed); False if the budget is gone. Then the Warning Event
        of a conflict that is news: once per change of what Pause leaves alone, not once per reconcile."""
        key = _key(budget)
        ledger = ledger_to_status(book, resource=spec.resource, max_entries=self.options.max_ledger_entries,
                                  bucket_width=self._bucket_width(spec), error=fig.gpu_hours.error_bound,
                                  memo=self._ledgers.get(key))
        running = sum(1 for m in members if m.interval is not None and m.span.end is None)
        desired = desired_status(budget, spec, fig, ledger, over_since=over_since, previous=closed,
                                 last=outcome.last or budget.status.last_enforcement, degraded=outcome.degraded,
                                 running=running, held=gate.held if gate is not None else None,
                                 gating=(gate.closed, gate.message) if gate is not None else None, now=at)
        desired, conflict_news = with_conflict(budget, desired, outcome.left_alone, at)
        if not await write_status(self.client, budget, desired, at):
            return False
        if conflict_news is not None:
            self.enforcer.event(budget, "Warning", JOBS_LEFT_ALONE, conflict_news)
            log.warning("pause left jobs to another controller", budget=key, message=conflict_news)
        return True

    async def _gate(self, budget: GPUWorkloadBudget, spec: ParsedSpec, priced: Priced | None, fig: Figures,
                    members: list[_Member], book: Book, *, due: bool, at: int) -> GateOutcome | None:
        """Gate: release the held pods the budget has room for, tell the others until when (`gating.py`); any
        other action lets go what this budget still holds (None: not a Gate budget)."""
        keeper = self.gatekeeper
        meta = budget.metadata
        if keeper is None or spec.action != "Gate":
            if keeper is not None:
                await keeper.let_all_go(meta.namespace, meta.name, f"budget {meta.name}'s action is {spec.action}")
            return None
        unit_live, unit_ledger = in_unit(spec, priced, _live_by_kind(members, book), book.ledger)
        # the reserve covers every admitted pod not finished: running, and released or admitted but not started
        admitted = sum((m.gpus for m in members if not m.span.final and not m.pod.metadata.deletion_timestamp
                        and not gated_by(m.pod)), Fraction(0))
        return await keeper.reconcile(GateView(
            budget=budget, spec=spec, priced=priced, consumed=fig.quota.consumed, running_gpus=admitted,
            live=unit_live, ledger=unit_ledger, over=fig.quota.over_quota, due=due, at=at))

    def _forget_recorded(self, key: str, departed: Departed) -> None:
        """After a successful status write: the deleted pods it recorded are forgotten, unless they were
        remembered anew meanwhile."""
        pending = self._departed.get(key)
        if pending is not None:
            self._forget_departed(key, pending, [uid for uid, item in departed.items() if pending.get(uid) is item])

    def _wake_at(self, usage: Usage, outcome: Outcome, due_at: int | None, released: int | None,
                 now: int) -> list[int | None]:
        """When to reconcile again, events aside (see the module docstring)."""
        wake = [outcome.wake_at, _counted_from(usage.next_change), released]
        if due_at is not None and counting_instant(now) < due_at:
            wake.append(next_counting_instant(due_at))  # the first counting instant it is due at
        if self.options.status_refresh and usage.burn_rate > 0:
            wake.append(now + round(self.options.status_refresh * _SECOND))
        return wake

    async def _write_invalid(self, budget: GPUWorkloadBudget, err: SpecError, now: int) -> None:
        desired = invalid_status(budget, err, now)
        if desired != budget.status:
            self.enforcer.event(budget, "Warning", "InvalidSpec", str(err))
            log.warning("budget spec invalid", budget=_key(budget), field=err.field, error=str(err))
        await write_status(self.client, budget, desired, now)

    # ------------------------------------------------------------------------------------------ finalizers

    def _needers(self, pod: Pod, span: PodSpan, now: int, exclude: str | None) -> list[Request]:
        """Retaining budgets (other than `exclude`) that still need `pod` to keep the accounting finalizer."""
        meta = pod.metadata
        out = []
        for b, spec in self._selection.budgets_selecting(pod):
            bkey = f"{b.metadata.namespace}/{b.metadata.name}"
            if bkey == exclude or not spec.retain or b.metadata.deletion_timestamp:
                continue
            if self._gpus(pod, spec.resource) == 0:
                continue
            if span.final and (span.start is None or span.end is None or span.end <= spec.edge_at(now)):
                continue  # never ran, or its usage already left this budget's window
            if span.final and span.end is not None and recorded(b.status.ledger, meta.uid, span.end):
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
        """Take the accounting finalizer off the namespace's held pods that no other retaining budget needs and
        this one no longer does (its ledger, just written, holds their usage); returns when to ask again the
        budgets a finished pod still waits for."""
        recorded_uids = {e.uid for e in book.ledger.entries}
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
            if ours and meta.uid not in recorded_uids and not (span.end is not None and book.covers(span.end)):
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
        budgets = [b for b in self.budgets.store.by_index(INDEX_NAMESPACE, namespace)
                   if not b.metadata.deletion_timestamp]
        alive = {b.metadata.name for b in budgets}
        await self.enforcer.resume_orphans(namespace, alive)
        if self.gatekeeper is not None:
            gating = [b.metadata.name for b in budgets
                      if not isinstance(spec := self.spec_of(b), SpecError) and spec.action == "Gate"]
            await self.gatekeeper.sweep(namespace, gating)

    async def _set_finalizers(self, pod: Pod, finalizers: list[str]) -> None:
        meta = pod.metadata
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.resource_version}}
        try:
            await self.client.patch(PODS, meta.name, patch, namespace=meta.namespace)
        except (Conflict, NotFound) as e:  # the pod changed or went: its event brings us back
            log.debug("finalizer update skipped", pod=f"{meta.namespace}/{meta.name}", error=str(e))


def _live(members: list[_Member], book: Book) -> tuple[Interval, ...]:
    """The members' intervals to count beside the ledger: a finished pod merged just now counts through its bucket
    only."""
    return tuple(m.interval for m in members if m.interval is not None
                 and not (m.interval.end is not None and book.covers(m.interval.end)))


def _live_by_kind(members: list[_Member], book: Book) -> dict[str, list[Interval]]:
    """`_live`, by the members' kinds."""
    out: dict[str, list[Interval]] = {}
    for m in members:
        if m.interval is not None and not (m.interval.end is not None and book.covers(m.interval.end)):
            out.setdefault(m.kind, []).append(m.interval)
    return out


def _counted_from(change: int | None) -> int | None:
    """When a reconcile first sees a change the accounting says happens at `change`: figures are computed at whole
    seconds, so at the first counting instant at or after it. Waking earlier (the change lies between this
    reconcile's counting instant and its clock) would only find the same answer, again and again."""
    return None if change is None else next_counting_instant(change)


def _over_since(prev: BudgetStatus, over: bool, at: int) -> int | None:
    """Since when the budget is over quota (None: it is not), persisted in status (overQuotaSince, else the
    QuotaExceeded condition's transition) so that a restart does not start the enforcement delay over."""
    if not over:
        return None
    if not cond.is_true(prev.conditions, "QuotaExceeded"):
        return at
    held = _t(prev.over_quota_since)
    if held is None:
        c = cond.get_condition(prev.conditions, "QuotaExceeded")
        held = _t(c.last_transition_time) if c is not None else None
    return held if held is not None else at

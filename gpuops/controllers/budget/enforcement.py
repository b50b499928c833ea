"""What a budget does once it has been over quota for `delaySeconds`: AlertOnly, Pause, Evict or Gate.

Every action is idempotent and checks state before acting, so a retried reconcile never doubles it:
* AlertOnly: a Warning Event `QuotaExceeded` when enforcement starts, then at most one reminder per
  `alert_reminder` (10 min). The last alert's time is persisted in status.lastEnforcement, so a restart
  does not repeat it. Pods are never touched.
* Pause: the controlling batch/v1 Job of each matched pod is suspended (`spec.suspend: true`; the Job
  controller then deletes its active pods) and annotated `gpuops.io/paused-by: <ns>/<budget>`; other matched
  pods only get the annotation (a cooperating workload controller can act on it). Once the budget is back
  under quota, or its action changes, or it is deleted, exactly what carries our annotation is resumed.
  A Job another controller owns (Kueue's queue-name label, a spec.managedBy naming another controller) is
  left alone: it is listed in `Outcome.left_alone` and the reconciler reports it (`gpuops.controllers.coexistence`).
* Evict: policy/v1 Evictions of the running matched pods, largest in-window usage first, at most
  `evictions_per_batch` every `eviction_interval`. A PodDisruptionBudget's 429 backs that pod off
  exponentially (never a hot loop) and shows as Degraded/EvictionBlocked plus an Event. Evicted pods keep
  counting: the reconciler puts their final usage in the ledger.
* Gate: alerts as AlertOnly; holding new pods back and releasing them is `gating.py`'s.
Backoff state is in memory: after a restart blocked evictions are simply tried again, once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import structlog

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.controllers.apigroup import API_VERSION
from gpuops.controllers.coexistence import kueue_owner
from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, Conflict, NotFound, TooManyRequests
from gpuops.kube.events import EventRecorder, EventType
from gpuops.kube.informer import Informer
from gpuops.kube.objects import Job, Pod
from gpuops.kube.resources import JOBS, PODS

from .api import (
    KIND,
    PAUSED_AT,
    PAUSED_BY,
    GPUWorkloadBudget,
    LastEnforcement,
    ParsedSpec,
    format_time,
    parse_time,
)
from .metrics import count_enforcement, forget_enforcement

__all__ = ["INDEX_PAUSED_BY", "EnforcementOptions", "Enforcer", "Outcome", "Situation", "Target", "controlling_job"]

log = structlog.get_logger("gpuops.controllers.budget.enforcement")

_SECOND = 1_000_000

INDEX_PAUSED_BY = "gpuops.io/paused-by"
"""Pods and Jobs by the budget ("ns/name") that paused them: resuming never scans a namespace."""


def paused_by(obj: Any) -> tuple[str, ...]:
    ref = (obj.metadata.annotations or {}).get(PAUSED_BY)
    return (ref,) if ref else ()


@dataclass(frozen=True, slots=True)
class EnforcementOptions:
    evictions_per_batch: int = 3
    eviction_interval: float = 1.0
    """Seconds between eviction batches of one budget."""
    eviction_backoff_base: float = 1.0
    eviction_backoff_max: float = 60.0
    alert_reminder: float = 600.0
    error_retry: float = 5.0
    """Seconds before an action that failed (other than a PDB's 429) is tried again."""


@dataclass(frozen=True, slots=True)
class Target:
    """A matched live pod: its in-window usage (GPU-hours), whether it holds GPUs now, whether it ended."""

    pod: Pod
    usage: Fraction
    running: bool
    final: bool


@dataclass(frozen=True, slots=True)
class Situation:
    """What the reconcile found. `over`, `due` and `consumed` are the figure its status records (computed at its
    counting instant), so an Event never names another; `now` is the clock, for the enforcer's own timers."""

    now: int
    over: bool
    due: bool
    """Over quota for at least delaySeconds: act."""
    consumed: Fraction
    quota: Fraction
    during: str
    """The window as the messages name it: "in the last 24h", "this calendar month (Europe/Berlin)"."""

    @property
    def used(self) -> str:
        """"12.000000 of 10.000000 GPU-hours", for messages."""
        return f"{format_gpu_hours(self.consumed)} of {format_gpu_hours(self.quota)} {self.unit}"

    unit: str = "GPU-hours"
    """What consumed and quota count: "GPU-hours", "weighted GPU-hours" or a currency."""
    crossed: bool = False
    """The previous status said within quota: a new over-quota episode starts with this reconcile (its alert is
    not the previous episode's, even within the same second)."""


@dataclass(slots=True)
class Outcome:
    last: LastEnforcement | None = None
    degraded: tuple[str, str] | None = None
    """(reason, message) for the Degraded condition, None when enforcement is healthy."""
    wake_at: int | None = None
    left_alone: list[tuple[str, str]] = field(default_factory=list)
    """(Job name, why) of the Jobs Pause would have suspended but another controller owns (Kueue, a managedBy)."""

    def wake(self, at: int) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)


@dataclass(slots=True)
class _Blocked:
    attempts: int
    next_at: int
    reason: str
    message: str


@dataclass(slots=True)
class _Evictions:
    batch_at: int | None = None
    blocked: dict[str, _Blocked] = field(default_factory=dict)


def controlling_job(pod: Pod) -> str | None:
    for ref in pod.metadata.owner_references or ():
        if ref.controller and ref.kind == "Job" and ref.api_version.startswith("batch/"):
            return ref.name
    return None


def _count(ref: str, action: str, result: str) -> None:
    """Count an enforcement step of budget `ref` ("namespace/name")."""
    namespace, _, name = ref.partition("/")
    count_enforcement(namespace, name, action, result)


class Enforcer:
    """Side effects of one controller; `apply` is called by every reconcile of a valid budget."""

    def __init__(
        self,
        client: Client,
        pods: Informer[Pod],
        jobs: Informer[Job],
        recorder: EventRecorder,
        options: EnforcementOptions | None = None,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.client = client
        self.pods = pods
        self.jobs = jobs
        self.recorder = recorder
        self.options = options or EnforcementOptions()
        self.clock = clock or (lambda: time.time_ns() // 1000)
        self._evictions: dict[str, _Evictions] = {}
        self.stopped_at: dict[str, int] = {}
        """Pods we evict with no grace period, by UID: when we sent the eviction (the server stops such a pod as it
        accepts the eviction, not before). The reconciler counts the pod up to this instant's counting instant
        (whole second) at once, so its finishedAt (whole seconds, never earlier) replaces it without taking back
        a reported figure (a pod that vanishes still running, with no finishedAt: `vanished_end`)."""
        self.on_stop: Callable[[str, str, int | None], None] | None = None
        """Called with (budget key, pod UID, instant) as such an eviction is sent (None: it was refused)."""
        self.answered_at: dict[str, int] = {}
        """When the server answered such an eviction, by UID: it stopped the pod between our request and this."""
        pods.add_index(INDEX_PAUSED_BY, paused_by)
        jobs.add_index(INDEX_PAUSED_BY, paused_by)

    def forget(self, key: str) -> None:
        self._evictions.pop(key, None)

    @staticmethod
    def forget_series(key: str) -> None:
        """Drop the enforcement series of budget `key` ("namespace/name"), once it is deleted."""
        namespace, _, name = key.partition("/")
        forget_enforcement(namespace, name)

    def vanished_end(self, uid: str) -> int | None:
        """Where a pod we evicted without grace ends if it leaves the API still running (no finishedAt exists):
        the middle of the eviction request once answered (the server stopped it inside), else its send instant."""
        sent = self.stopped_at.get(uid)
        answered = self.answered_at.get(uid)
        return sent if sent is None or answered is None else (sent + answered) // 2

    def forget_stop(self, uid: str) -> None:
        """The pod's final usage is in every ledger that counts it: its stop is no longer needed."""
        self.stopped_at.pop(uid, None)
        self.answered_at.pop(uid, None)

    def event(self, budget: GPUWorkloadBudget, type: EventType, reason: str, message: str) -> None:
        self.recorder.record(budget, type, reason, message, kind=KIND, api_version=API_VERSION)

    async def apply(
        self,
        budget: GPUWorkloadBudget,
        spec: ParsedSpec,
        situation: Situation,
        targets: Callable[[], list[Target]],
        previous: LastEnforcement | None,
        over_since: int | None,
    ) -> Outcome:
        """Act on `situation`; `targets` (the matched pods with their in-window usage) is called only when due."""
        meta = budget.metadata
        key = f"{meta.namespace}/{meta.name}"
        out = Outcome()
        if spec.action != "Evict" or not situation.due:
            self._evictions.pop(key, None)
        if spec.action != "Pause" or not situation.over:
            await self.resume(meta.namespace, key, out, budget, situation.now)
        if not situation.due:
            return out
        ranked = sorted(targets(), key=lambda t: (-t.usage, t.pod.metadata.name))
        if spec.action in ("AlertOnly", "Gate"):  # Gate's holding back is the reconciler's (gating.py)
            self._alert(budget, spec.action, situation, ranked, previous, over_since, out)
        elif spec.action == "Pause":
            await self._pause(budget, situation, ranked, out)
        else:
            await self._evict(budget, spec, situation, ranked, out)
        return out

    # ------------------------------------------------------------------------------------------ AlertOnly

    def _alert(
        self,
        budget: GPUWorkloadBudget,
        action: str,
        sit: Situation,
        ranked: list[Target],
        previous: LastEnforcement | None,
        over_since: int | None,
        out: Outcome,
    ) -> None:
        reminder = round(self.options.alert_reminder * _SECOND)
        last = _time_of(previous) if previous is not None and previous.action == action else None
        same_episode = not sit.crossed and (over_since is None or last is None or last >= over_since)
        if last is not None and same_episode and sit.now < last + reminder:
            out.wake(last + reminder)
            return
        top = ranked[0] if ranked else None
        who = f"; largest consumer {top.pod.metadata.name} ({format_gpu_hours(top.usage)} GPU-hours)" if top else ""
        message = (
            f"GPU budget exceeded: {sit.used} used"
            f" {sit.during}{who}. "
            + ("Action AlertOnly: no pod is touched." if action == "AlertOnly" else
               "Action Gate: new pods it selects are held (scheduling gate gpuops.io/budget); running pods are not "
               "touched.")
        )
        self.event(budget, "Warning", "QuotaExceeded", message)
        _count(f"{budget.metadata.namespace}/{budget.metadata.name}", action, "Alerted")
        out.last = LastEnforcement(
            action=action, pod=top.pod.metadata.name if top else "", time=format_time(sit.now),
            result="Alerted", message=message,
        )
        out.wake(sit.now + reminder)

    # ------------------------------------------------------------------------------------------ Pause

    async def _pause(self, budget: GPUWorkloadBudget, sit: Situation, ranked: list[Target], out: Outcome) -> None:
        ns, ref = budget.metadata.namespace, f"{budget.metadata.namespace}/{budget.metadata.name}"
        stamp = format_time(sit.now)
        seen_jobs: set[str] = set()
        for t in ranked:
            pod = t.pod
            if t.final or pod.metadata.deletion_timestamp:
                continue
            job_name = controlling_job(pod)
            if job_name is not None:
                if job_name in seen_jobs:
                    continue
                seen_jobs.add(job_name)
                job = self.jobs.store.get(f"{ns}/{job_name}")
                if job is None or job.spec.suspend:  # not in the cache yet, or already suspended (ours or not)
                    continue
                owner = kueue_owner(job)
                if owner is not None:  # its spec.suspend is another controller's: writing it would fight that one
                    out.left_alone.append((job_name, owner))
                    continue
                patch: dict[str, Any] = {
                    "metadata": {"annotations": {PAUSED_BY: ref, PAUSED_AT: stamp}},
                    "spec": {"suspend": True},
                }
                what, result = f"Job {job_name}", "Suspended"
                ok = await self._write(JOBS, job_name, ns, patch, ref, "Pause", out, sit.now, what)
            else:
                if (pod.metadata.annotations or {}).get(PAUSED_BY) == ref:
                    continue
                patch = {"metadata": {"annotations": {PAUSED_BY: ref, PAUSED_AT: stamp}}}
                what, result = f"pod {pod.metadata.name}", "Marked"
                ok = await self._write(PODS, pod.metadata.name, ns, patch, ref, "Pause", out, sit.now, what)
            if not ok:
                continue
            message = (
                f"paused {what} (pod {pod.metadata.name}, {format_gpu_hours(t.usage)} GPU-hours in the window):"
                f" budget over quota ({sit.used})"
            )
            self.event(budget, "Warning", "Paused", message)
            _count(ref, "Pause", result)
            out.last = LastEnforcement(
                action="Pause", pod=pod.metadata.name, job=job_name or "", time=stamp, result=result, message=message
            )

    async def resume(
        self, namespace: str, ref: str, out: Outcome, budget: GPUWorkloadBudget | None = None, now: int | None = None
    ) -> None:
        """Undo what budget `ref` ("ns/name") paused: unsuspend its Jobs, unmark its pods. Failures raise (the
        reconcile is retried with backoff)."""
        for job in self.jobs.store.by_index(INDEX_PAUSED_BY, ref):
            patch: dict[str, Any] = {
                "metadata": {"annotations": {PAUSED_BY: None, PAUSED_AT: None}},
                "spec": {"suspend": False},
            }
            name = job.metadata.name
            if await self._write(JOBS, name, namespace, patch, ref, "Pause", out, None, f"Job {name}"):
                _count(ref, "Pause", "Resumed")
                message = f"resumed Job {name}: budget {ref} is under quota, changed its action or is gone"
                log.info("resumed job", job=f"{namespace}/{name}", budget=ref)
                if budget is not None:
                    self.event(budget, "Normal", "Resumed", message)
                    stamp = format_time(now) if now is not None else ""
                    out.last = LastEnforcement(action="Pause", job=name, time=stamp, result="Resumed", message=message)
        for pod in self.pods.store.by_index(INDEX_PAUSED_BY, ref):
            patch = {"metadata": {"annotations": {PAUSED_BY: None, PAUSED_AT: None}}}
            name = pod.metadata.name
            if await self._write(PODS, name, namespace, patch, ref, "Pause", out, None, f"pod {name}"):
                _count(ref, "Pause", "Unmarked")

    async def resume_orphans(self, namespace: str, live_budgets: set[str]) -> None:
        """Resume what budgets that no longer exist paused (deleted while we were down, say)."""
        refs = {*self.jobs.store.index_values(INDEX_PAUSED_BY), *self.pods.store.index_values(INDEX_PAUSED_BY)}
        for ref in sorted(refs):
            ns, _, name = ref.partition("/")
            if ns != namespace or name in live_budgets:
                continue
            await self.resume(namespace, ref, Outcome())
            self.forget_series(ref)  # the budget is gone: so go the series the resume just counted

    # ------------------------------------------------------------------------------------------ Evict

    async def _evict(
        self, budget: GPUWorkloadBudget, spec: ParsedSpec, sit: Situation, ranked: list[Target], out: Outcome
    ) -> None:
        opts = self.options
        meta = budget.metadata
        state = self._evictions.setdefault(f"{meta.namespace}/{meta.name}", _Evictions())
        now, interval = sit.now, round(opts.eviction_interval * _SECOND)
        # a pod this process already stopped is not evicted again while the cache still shows it running: a failed
        # second eviction used to erase the first one's stop, and the pod was counted until the cache heard of it
        running = [t for t in ranked if t.running and not t.final and not t.pod.metadata.deletion_timestamp
                   and t.pod.metadata.uid not in self.stopped_at]
        uids = {t.pod.metadata.uid for t in running}
        for uid in [u for u in state.blocked if u not in uids]:
            del state.blocked[uid]
        # Pods never refused go first, so a pod a PDB protects cannot starve the others of the batch.
        fresh = [t for t in running if t.pod.metadata.uid not in state.blocked]
        retries = [t for t in running if (b := state.blocked.get(t.pod.metadata.uid)) is not None and b.next_at <= now]
        gate = state.batch_at + interval if state.batch_at is not None else now
        batch = [*fresh, *retries][: opts.evictions_per_batch] if now >= gate else []
        for t in batch:
            await self._evict_one(budget, spec, sit, t, state, out)
        if batch:
            state.batch_at, gate = now, now + interval
        if len(fresh) > len(batch):  # more to evict at the next batch
            out.wake(gate)
        if state.blocked:
            out.wake(max(gate, min(b.next_at for b in state.blocked.values())))
            reasons = {b.reason for b in state.blocked.values()}
            reason = "EvictionBlocked" if reasons == {"EvictionBlocked"} else "EnforcementFailed"
            detail = "; ".join(b.message for b in sorted(state.blocked.values(), key=lambda b: b.next_at)[:3])
            out.degraded = (reason, f"{len(state.blocked)} pod(s) could not be evicted: {detail}")

    async def _evict_one(
        self, budget: GPUWorkloadBudget, spec: ParsedSpec, sit: Situation, t: Target, state: _Evictions, out: Outcome
    ) -> None:
        pod = t.pod
        uid = pod.metadata.uid
        grace = spec.eviction_grace if spec.eviction_grace is not None else pod.spec.termination_grace_period_seconds
        key = f"{budget.metadata.namespace}/{budget.metadata.name}"
        sent = self.clock()
        if grace == 0:  # it stops the moment the server accepts: stop counting it now, not when the cache hears
            self.stopped_at[uid] = sent
            if self.on_stop is not None:
                self.on_stop(key, uid, sent)
        # Only the version we decided on: a cache behind the API can show a pod running that has finished (or
        # changed); evicting it anyway recorded a stop later than its real end, and the no-drop rule kept that.
        pre = {"uid": uid, **({"resourceVersion": pod.metadata.resource_version}
                              if pod.metadata.resource_version else {})}
        try:
            await self.client.evict(pod.metadata.name, pod.metadata.namespace,
                                    grace_period_seconds=spec.eviction_grace, preconditions=pre)
        except NotFound:
            state.blocked.pop(uid, None)
            return
        except Conflict:  # the pod changed since the cache's copy: its update event brings a fresh decision
            self._unstop(key, uid)
            log.info("eviction skipped: the pod changed since the cached copy",
                     pod=f"{pod.metadata.namespace}/{pod.metadata.name}")
            return
        except ApiError as e:
            self._unstop(key, uid)  # refused: it runs on, and counts on
            self._refused(budget, pod, e, state, out, sit.now)
            return
        state.blocked.pop(uid, None)
        if uid in self.stopped_at:
            self.answered_at[uid] = self.clock()
        self._evicted(budget, t, sit, out)

    def _unstop(self, key: str, uid: str) -> None:
        """The eviction was not taken: withdraw the stop recorded as it was sent, if any."""
        self.answered_at.pop(uid, None)
        if self.stopped_at.pop(uid, None) is not None and self.on_stop is not None:
            self.on_stop(key, uid, None)

    def _refused(
        self, budget: GPUWorkloadBudget, pod: Pod, e: ApiError, state: _Evictions, out: Outcome, now: int
    ) -> None:
        """Back the pod off (exponentially, from a shorter base for a PodDisruptionBudget's refusal) and say so:
        an Event, the enforcement series, status.lastEnforcement."""
        opts = self.options
        name, uid = pod.metadata.name, pod.metadata.uid
        prior = state.blocked.get(uid)
        attempts = (prior.attempts if prior else 0) + 1
        # 429 is also the API server's throttling (with Retry-After): only the eviction's own answer names a PDB
        pdb = isinstance(e, TooManyRequests) and "disruption budget" in (e.message or "").lower()
        base = opts.eviction_backoff_base if pdb else opts.error_retry
        delay = min(opts.eviction_backoff_max, base * 2 ** (attempts - 1))
        if e.retry_after:
            delay = max(delay, min(e.retry_after, opts.eviction_backoff_max))
        reason = "EvictionBlocked" if pdb else "EvictionFailed"
        why = "a PodDisruptionBudget allows no disruption now" if pdb else f"{e.status} {e.reason}: {e.message}"
        message = f"eviction of pod {name} refused ({why}); attempt {attempts}, next try in {delay:g}s"
        state.blocked[uid] = _Blocked(attempts, now + round(delay * _SECOND), reason, message)
        self.event(budget, "Warning", reason, message)
        _count(f"{budget.metadata.namespace}/{budget.metadata.name}", "Evict", "Blocked" if pdb else "Error")
        out.last = LastEnforcement(action="Evict", pod=name, time=format_time(now),
                                   result="Blocked" if pdb else "Failed", message=message)
        log.warning("eviction refused", pod=f"{pod.metadata.namespace}/{name}", reason=reason,
                    attempt=attempts, retry_in=delay, error=str(e))

    def _evicted(self, budget: GPUWorkloadBudget, t: Target, sit: Situation, out: Outcome) -> None:
        """Say that the pod was evicted: Events on the budget and the pod, the series, status.lastEnforcement."""
        pod = t.pod
        name, usage = pod.metadata.name, format_gpu_hours(t.usage)
        message = (
            f"evicted pod {name} ({usage} GPU-hours in the window): budget over quota"
            f" ({sit.used}); its usage keeps counting"
        )
        self.event(budget, "Warning", "Evicted", message)
        with contextlib.suppress(ValueError):
            self.recorder.record(pod, "Warning", "EvictedByBudget",
                                 f"evicted by GPUWorkloadBudget {budget.metadata.name}: the budget is over quota")
        _count(f"{budget.metadata.namespace}/{budget.metadata.name}", "Evict", "Evicted")
        out.last = LastEnforcement(action="Evict", pod=name, time=format_time(sit.now), result="Evicted",
                                   message=message)
        log.info("evicted pod", pod=f"{pod.metadata.namespace}/{name}", usage_gpu_hours=usage)

    # ------------------------------------------------------------------------------------------ writes

    async def _write(
        self, rt: Any, name: str, namespace: str, patch: dict[str, Any], ref: str, action: str, out: Outcome,
        now: int | None, what: str,
    ) -> bool:
        """Patch an object for budget `ref` ("namespace/name"); False when it is gone or the write failed."""
        try:
            await self.client.patch(rt, name, patch, namespace=namespace)
        except NotFound:
            return False
        except ApiError as e:
            _count(ref, action, "Error")
            log.warning("enforcement write failed", target=f"{namespace}/{name}", action=action, error=str(e))
            out.degraded = ("EnforcementFailed", f"{action} could not update {what}: {e.status} {e.reason}: {e}")
            if now is not None:
                out.wake(now + round(self.options.error_retry * _SECOND))
            else:
                raise
            return False
        return True


def _time_of(last: LastEnforcement) -> int | None:
    try:
        return parse_time(last.time) if last.time else None
    except ValueError:
        return None

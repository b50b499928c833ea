"""The Job controller of kube-controller-manager (batch/v1), including the TTL-after-finished controller.

It follows the 1.31+ behaviour users observe: pods carry the `batch.kubernetes.io/job-tracking` finalizer
until the controller has recorded them (through `status.uncountedTerminatedPods`, so nothing is counted twice
or lost), `FailureTarget` / `SuccessCriteriaMet` come first and the terminal `Failed` / `Complete` only once
no pod of the Job is still running or terminating, suspension deletes active pods without counting them.

Work is driven by the store listener: pods are indexed by the uid of their controlling Job, and only Jobs
touched by a change (or a due timer: backoff, active deadline) are synced. TTL expiry is one sorted heap
swept on a single timer, so thousands of finished Jobs cost no per-Job wake-ups.
"""

from __future__ import annotations

import contextlib
import heapq
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.objects import rfc3339
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent, clone
from .access import JOBS, PODS, ClusterAccess
from .loop import Loop

log = structlog.get_logger("gpuops_sim.jobs")

USER = "system:serviceaccount:kube-system:job-controller"
COMPONENT = "job-controller"
MANAGED_BY = "kubernetes.io/job-controller"
TRACKING = "batch.kubernetes.io/job-tracking"
INDEX = "batch.kubernetes.io/job-completion-index"
INDEX_ENV = "JOB_COMPLETION_INDEX"
EXPECTATIONS_TIMEOUT = 300.0  # client-go's ExpectationsTimeout: a lost watch event never blocks a Job forever
GENERATE_NAME_ATTEMPTS = 8  # kube-apiserver retries a colliding generated name too (RetryGenerateName, GA 1.31)
MAX_GENERATED_NAME = 58  # 63 minus the 5 random characters the apiserver appends to generateName

Key = tuple[str, str]


@dataclass
class JobOptions:
    events: bool = True  # SuccessfulCreate / SuccessfulDelete / Completed / BackoffLimitExceeded Events
    ttl_check_seconds: float = 1.0  # the TTL sweep's period (it also notices a clock moved by tests)
    backoff_base_seconds: float = 10.0  # replacement delay after failures: 10 s, 20 s, 40 s ... as documented
    backoff_max_seconds: float = 360.0  # "capped at six minutes"


@dataclass
class _JobState:
    """What the controller remembers about one Job uid beyond the store: its pods and its expectations."""

    namespace: str = ""
    pods: set[str] = field(default_factory=set)
    creates: int = 0  # creates issued whose ADDED event has not been seen yet
    deletes: set[str] = field(default_factory=set)  # pod uids whose deletion has not been seen yet
    expect_until: float = 0.0
    failures: int = 0  # failures since the last success (for the replacement backoff)
    last_failure: float = 0.0
    gone: bool = False


# ------------------------------------------------------------------------------------------ pure helpers


def controller_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the Job that controls this pod, if any."""
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref.get("uid") or "") or None
    return None


def parse_indexes(text: str) -> set[int]:
    """`status.completedIndexes` ("0-2,5") as a set."""
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        with contextlib.suppress(ValueError):
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def format_indexes(indexes: set[int]) -> str:
    """Sorted intervals, as the Job controller writes `completedIndexes`."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def completion_index(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(INDEX)
    if value is None:
        value = (pod["metadata"].get("labels") or {}).get(INDEX)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns `old` into `new` (nested dicts merged, lists replaced)."""
    patch: dict[str, Any] = {}
    for k, v in new.items():
        ov = old.get(k)
        if isinstance(v, dict) and isinstance(ov, dict):
            sub = merge_diff(ov, v)
            if sub:
                patch[k] = sub
        elif k not in old or ov != v:
            patch[k] = v
    for k in old:
        if k not in new:
            patch[k] = None
    return patch


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _condition(conds: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    for c in conds:
        if c.get("type") == type_:
            return c
    return None


def _is_true(conds: list[dict[str, Any]], type_: str) -> bool:
    c = _condition(conds, type_)
    return c is not None and c.get("status") == "True"


def finished(job: dict[str, Any]) -> bool:
    conds = (job.get("status") or {}).get("conditions") or []
    return _is_true(conds, "Complete") or _is_true(conds, "Failed")


def finish_time(job: dict[str, Any]) -> datetime | None:
    """When the Job finished, as the TTL-after-finished controller reads it (terminal condition time)."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return _parse_time(c.get("lastTransitionTime"))
    return None


def _ensure(conds: list[dict[str, Any]], type_: str, status: str, reason: str, message: str, stamp: str) -> bool:
    """Set a condition (ensureJobConditionStatus); a False condition is only written over an existing one."""
    c = _condition(conds, type_)
    if c is None:
        if status != "True":
            return False
        conds.append({"type": type_, "status": status, "lastProbeTime": stamp, "lastTransitionTime": stamp,
                      "reason": reason, "message": message})
        return True
    if c.get("status") == status and c.get("reason") == reason and c.get("message") == message:
        return False
    i = conds.index(c)
    conds[i] = {**c, "status": status, "reason": reason, "message": message, "lastProbeTime": stamp,
                "lastTransitionTime": stamp if c.get("status") != status else c.get("lastTransitionTime", stamp)}
    return True


def _int(value: Any, default: int) -> int:
    return default if value is None else int(value)


def _pod_ready(pod: dict[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def _restarts(pod: dict[str, Any]) -> int:
    st = pod.get("status") or {}
    return sum(int(cs.get("restartCount") or 0) for kind in ("initContainerStatuses", "containerStatuses")
               for cs in st.get(kind) or ())


def _removal_order(pod: dict[str, Any]) -> tuple[int, int, int, str]:
    """Which active pods to delete first (activePodsForRemoval): unscheduled, pending, unready, newest."""
    phase = (pod.get("status") or {}).get("phase")
    return (
        1 if (pod.get("spec") or {}).get("nodeName") else 0,
        {"Pending": 0, "Unknown": 1, "Running": 2}.get(str(phase), 0),
        1 if _pod_ready(pod) else 0,
        _neg(str(pod["metadata"].get("creationTimestamp", ""))),
    )


def _neg(stamp: str) -> str:
    """A key that sorts newer RFC 3339 stamps first."""
    return "".join(chr(0x10FFFF - ord(ch)) for ch in stamp)


def generate_name(job_name: str, index: int | None) -> str:
    if index is None:
        return f"{job_name}-"
    suffix = f"-{index}-"
    prefix = job_name + suffix
    if len(prefix) > MAX_GENERATED_NAME:
        prefix = prefix[: MAX_GENERATED_NAME - len(suffix)] + suffix
    return prefix


def pod_from_template(job: dict[str, Any], index: int | None, clone_spec: Any) -> dict[str, Any]:
    """The pod the Job controller creates (`clone_spec` deep-copies the template's spec)."""
    meta = job["metadata"]
    tmpl = job["spec"]["template"]
    tmeta = tmpl.get("metadata") or {}
    labels = dict(tmeta.get("labels") or {})
    annotations = dict(tmeta.get("annotations") or {})
    spec: dict[str, Any] = clone_spec(tmpl.get("spec") or {})
    if index is not None:
        labels[INDEX] = annotations[INDEX] = str(index)
        if not spec.get("hostname"):
            spec["hostname"] = f"{meta['name']}-{index}"
        env_ref = {"name": INDEX_ENV,
                   "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}}}
        for kind in ("initContainers", "containers"):
            for c in spec.get(kind) or ():
                env = c.setdefault("env", [])
                if not any(e.get("name") == INDEX_ENV for e in env):
                    env.append(dict(env_ref))
    pmeta: dict[str, Any] = {
        "generateName": generate_name(meta["name"], index),
        "namespace": meta.get("namespace", "default"),
        "labels": labels,
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                             "controller": True, "blockOwnerDeletion": True}],
        "finalizers": [*(f for f in tmeta.get("finalizers") or () if f != TRACKING), TRACKING],
    }
    if annotations:
        pmeta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pmeta, "spec": spec}


@dataclass
class _View:
    """The parts of a Job spec a sync reads, with the API's defaults applied."""

    indexed: bool
    completions: int | None
    parallelism: int
    backoff_limit: int
    suspended: bool
    deleting: bool
    only_failed: bool  # podReplacementPolicy Failed: a terminating pod is replaced only once it is Failed
    restart_policy: str | None
    active_deadline: int | None

    @classmethod
    def of(cls, job: dict[str, Any]) -> _View:
        spec = job.get("spec") or {}
        default_policy = "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
        ads = spec.get("activeDeadlineSeconds")
        return cls(
            indexed=spec.get("completionMode") == "Indexed",
            completions=None if spec.get("completions") is None else int(spec["completions"]),
            parallelism=_int(spec.get("parallelism"), 1),
            backoff_limit=_int(spec.get("backoffLimit"), 6),
            suspended=bool(spec.get("suspend")),
            deleting=bool(job["metadata"].get("deletionTimestamp")),
            only_failed=(spec.get("podReplacementPolicy") or default_policy) == "Failed",
            restart_policy=((spec.get("template") or {}).get("spec") or {}).get("restartPolicy"),
            active_deadline=None if ads is None else int(ads),
        )


@dataclass
class _Tally:
    """Pods counted so far: in status (succeeded, failed, completed) and still uncounted (finalizer pending)."""

    succeeded: int
    failed: int
    completed: set[int]
    uncounted_succeeded: list[str]
    uncounted_failed: list[str]
    indexed: bool

    @property
    def pending(self) -> bool:
        return bool(self.uncounted_succeeded or self.uncounted_failed)

    @property
    def effective_succeeded(self) -> int:
        return len(self.completed) if self.indexed else self.succeeded + len(self.uncounted_succeeded)

    @property
    def effective_failed(self) -> int:
        return self.failed + len(self.uncounted_failed)


def _uncounted(succeeded: list[str], failed: list[str]) -> dict[str, list[str]]:
    return {k: v for k, v in (("succeeded", succeeded), ("failed", failed)) if v}


def _set(status: dict[str, Any], key: str, value: Any) -> None:
    """Omit zero / empty values as the Go types' omitempty does."""
    if value:
        status[key] = value
    else:
        status.pop(key, None)


def _active(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and not pod["metadata"].get(
        "deletionTimestamp")


def _terminating(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp")) and (pod.get("status") or {}).get("phase") not in (
        "Succeeded", "Failed")


def _complete(completions: int | None, succeeded: int, active: int) -> bool:
    if completions is None:
        return succeeded > 0 and active == 0  # work queue: any success, then every pod done
    return succeeded >= completions and active == 0  # extra pods are first removed by the manage step


def _conclude(conds: list[dict[str, Any]], status: dict[str, Any], target: dict[str, Any] | None, stamp: str,
              events: list[tuple[str, str, str]]) -> None:
    """The terminal condition, once no pod of a decided Job is left: Failed with the target's reason, or
    Complete."""
    if target is not None:
        reason, message = str(target.get("reason", "")), str(target.get("message", ""))
        _ensure(conds, "Failed", "True", reason, message, stamp)
        events.append(("Warning", reason, message))
    else:
        _ensure(conds, "Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods", stamp)
        status["completionTime"] = stamp
        events.append(("Normal", "Completed", "Job completed"))


def _record_finished(
    pods: list[dict[str, Any]], view: _View, unc_s: list[str], unc_f: list[str], completed: set[int]
) -> tuple[int, int, list[dict[str, Any]]]:
    """Add pods that finished since the last sync to the uncounted lists (or, indexed, their completion
    index); returns how many newly succeeded and failed, and the tracked pods whose finalizer can go."""
    seen = set(unc_s) | set(unc_f)
    new_s = new_f = 0
    release: list[dict[str, Any]] = []
    for pod in pods:
        pm = pod["metadata"]
        puid = pm.get("uid", "")
        if TRACKING not in (pm.get("finalizers") or ()):
            continue
        phase = (pod.get("status") or {}).get("phase")
        terminal = phase in ("Succeeded", "Failed")
        if puid in seen:
            if _releasable(pod, terminal):
                release.append(pod)
            continue
        dying = bool(pm.get("deletionTimestamp")) and phase != "Succeeded"
        # An unscheduled pod that is being deleted never runs again (PodGC would mark it Failed).
        unscheduled = not (pod.get("spec") or {}).get("nodeName")
        if phase == "Succeeded":
            new_s += 1
            ix = completion_index(pod) if view.indexed else None
            if not view.indexed:
                unc_s.append(puid)
            elif ix is not None and view.completions is not None and 0 <= ix < view.completions:
                completed.add(ix)
        elif phase == "Failed" or (dying and (not view.only_failed or unscheduled)):
            new_f += 1
            unc_f.append(puid)
        elif not view.deleting:
            continue  # still running: counted when it ends
        if _releasable(pod, terminal):
            release.append(pod)
    return new_s, new_f, release


def _releasable(pod: dict[str, Any], terminal: bool) -> bool:
    """Work-around: the emulator deletes an object whose last finalizer goes even while a kubelet still has a
    grace period to run, so a bound terminating pod keeps the finalizer until it is terminal (or force-deleted)."""
    meta = pod["metadata"]
    return not (
        meta.get("deletionTimestamp")
        and not terminal
        and (pod.get("spec") or {}).get("nodeName")
        and int(meta.get("deletionGracePeriodSeconds") or 0) > 0
    )


# ------------------------------------------------------------------------------------------ controller


class JobController(Loop):
    """batch/v1 Job controller plus TTL-after-finished, writing as the job-controller service account."""

    name = "job-controller"

    def __init__(self, server: APIServer, options: JobOptions | None = None) -> None:
        super().__init__()
        self.options = options or JobOptions()
        self.access = ClusterAccess(server, USER, component=COMPONENT,
                                    groups=("system:serviceaccounts", "system:serviceaccounts:kube-system"))
        self.store = self.access.store
        self._states: dict[str, _JobState] = {}
        self._dirty: set[str] = set()
        self._orphans: set[Key] = set()
        self._wake_at: dict[str, float] = {}
        self._ttl: list[tuple[datetime, str]] = []
        self._ttl_at: dict[str, datetime] = {}
        self._ttl_timer: float | None = None
        self._writing: str | None = None
        self._scanned = False
        self.syncs = 0
        self.pods_created = 0
        self.pods_deleted = 0
        self.access.listen(self._on_event)

    # ------------------------------------------------------------------------------------ intake

    def _state(self, uid: str) -> _JobState:
        st = self._states.get(uid)
        if st is None:
            st = self._states[uid] = _JobState()
        return st

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr == PODS:
            self._on_pod(ev)
        elif ev.gr == JOBS:
            self._on_job(ev)

    def _on_job(self, ev: WatchEvent) -> None:
        obj = ev.new.obj
        uid = obj["metadata"].get("uid", "")
        if ev.type == "DELETED":
            st = self._states.get(uid)
            self._dirty.discard(uid)
            self._ttl_at.pop(uid, None)
            if st is not None:
                st.gone = True
                self._orphans.update((st.namespace, p) for p in st.pods)
                if not st.pods:
                    del self._states[uid]
            self.wake()
            return
        st = self._state(uid)
        st.namespace = ev.key[0]
        if (
            self._writing == uid
            and ev.prev is not None
            and ev.prev.obj.get("spec") == obj.get("spec")
            and ev.prev.obj["metadata"].get("deletionTimestamp") == obj["metadata"].get("deletionTimestamp")
        ):
            return  # our own status write: nothing new to react to
        self._dirty.add(uid)
        self.wake()

    def _on_pod(self, ev: WatchEvent) -> None:
        new = ev.new.obj
        name = ev.key[1]
        uid = controller_uid(new)
        prev_uid = controller_uid(ev.prev.obj) if ev.prev is not None else None
        if prev_uid and prev_uid != uid:
            self._forget(prev_uid, name)  # ownership changed (orphaned or adopted)
        if uid is None:
            if ev.type != "DELETED" and TRACKING in (new["metadata"].get("finalizers") or ()):
                self._orphans.add(ev.key)  # e.g. `--cascade=orphan`: nobody would ever count it
                self.wake()
            return
        pod_uid = new["metadata"].get("uid", "")
        if ev.type == "DELETED":
            self._forget(uid, name)
            st = self._states.get(uid)
            if st is not None:
                st.deletes.discard(pod_uid)
                self._dirty.add(uid)
            self.wake()
            return
        st = self._state(uid)
        st.namespace = ev.key[0]
        st.pods.add(name)
        if ev.type == "ADDED" and st.creates > 0:
            st.creates -= 1
        if new["metadata"].get("deletionTimestamp"):
            st.deletes.discard(pod_uid)
        if st.gone:
            self._orphans.add(ev.key)
        else:
            self._dirty.add(uid)
        self.wake()

    def _forget(self, uid: str, name: str) -> None:
        st = self._states.get(uid)
        if st is None:
            return
        st.pods.discard(name)
        if st.gone and not st.pods:
            del self._states[uid]

    def _scan(self) -> None:
        """The informer's initial list: Jobs and pods that existed before this controller was built."""
        self._scanned = True
        for job in self.access.iter(JOBS):
            uid = job["metadata"].get("uid", "")
            self._state(uid).namespace = job["metadata"].get("namespace", "")
            self._dirty.add(uid)
        for pod in self.access.iter(PODS):
            uid = controller_uid(pod)
            if uid is None:
                continue
            st = self._state(uid)
            st.namespace = pod["metadata"].get("namespace", "")
            st.pods.add(pod["metadata"]["name"])
            if uid not in self.store.by_uid:
                st.gone = True
                self._orphans.add((st.namespace, pod["metadata"]["name"]))

    def _requeue(self, uid: str, delay: float) -> None:
        when = self.clock() + max(0.0, delay)
        cur = self._wake_at.get(uid)
        if cur is None or when < cur - 1e-3:
            self._wake_at[uid] = when
            self.at(("job", uid), when)

    # ------------------------------------------------------------------------------------ loop

    async def step(self) -> None:
        if not self._scanned:
            self._scan()
        now = self.clock()
        sweep = False
        for key in self.due(now):
            if key == "ttl":
                if self._ttl_timer is not None and self._ttl_timer <= now:
                    self._ttl_timer = None
                sweep = True
            elif isinstance(key, tuple) and key[0] == "job":
                uid = str(key[1])
                if self._wake_at.get(uid, now + 1) <= now:
                    del self._wake_at[uid]
                self._dirty.add(uid)
        if sweep:
            await self._sweep_ttl()
        if self._orphans:
            orphans, self._orphans = self._orphans, set()
            for ns, name in orphans:
                await self._release_orphan(ns, name)
        dirty, self._dirty = self._dirty, set()
        for uid in dirty:
            try:
                await self._sync(uid)
            except StatusError as e:
                if e.code == 404:
                    continue  # the Job went away mid-sync: its DELETED event handles the rest
                log.warning("job sync failed", job_uid=uid, code=e.code, error=str(e))
                self._requeue(uid, 1.0)
            except Exception:  # one broken Job must not stall the others; retry it later
                self.errors += 1
                log.exception("job sync failed", job_uid=uid)
                self._requeue(uid, 1.0)
        if self._dirty or self._orphans:
            self.wake()  # changes our own writes caused: handled on the next turn, after other components ran

    # ------------------------------------------------------------------------------------ TTL

    def _track_ttl(self, uid: str, job: dict[str, Any]) -> None:
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        done = finish_time(job)
        if ttl is None or done is None or job["metadata"].get("deletionTimestamp"):
            return
        expire = done + timedelta(seconds=int(ttl))
        if self._ttl_at.get(uid) == expire:
            return
        self._ttl_at[uid] = expire
        heapq.heappush(self._ttl, (expire, uid))
        self._schedule_ttl()

    def _schedule_ttl(self) -> None:
        if not self._ttl:
            return
        remaining = (self._ttl[0][0] - self.access.now()).total_seconds()
        when = self.clock() + min(max(remaining, 0.0), self.options.ttl_check_seconds)
        if self._ttl_timer is None or when < self._ttl_timer - 1e-3:
            self._ttl_timer = when
            self.at("ttl", when)

    async def _sweep_ttl(self) -> None:
        now = self.access.now()
        while self._ttl and self._ttl[0][0] <= now:
            expire, uid = heapq.heappop(self._ttl)
            if self._ttl_at.get(uid) != expire:
                continue  # superseded or the Job is gone
            del self._ttl_at[uid]
            where = self.store.by_uid.get(uid)
            if where is None or where[0] != JOBS:
                continue
            ns, name = where[1]
            job = self.access.get(JOBS, ns, name)
            if job is None or job["metadata"].get("deletionTimestamp") or not finished(job):
                continue
            log.info("job ttl expired", job=name, namespace=ns)
            with contextlib.suppress(StatusError):  # a 409 on the uid precondition: a new Job took the name
                await self.access.delete(JOBS, ns, name, uid=uid, propagation="Background")
        self._schedule_ttl()

    # ------------------------------------------------------------------------------------ finalizers

    async def _release(self, pod: dict[str, Any]) -> bool:
        """Remove the tracking finalizer; True once it is gone (or the pod is)."""
        meta = pod["metadata"]
        fins = [f for f in meta.get("finalizers") or () if f != TRACKING]
        body = {"metadata": {"finalizers": fins or None, "resourceVersion": meta.get("resourceVersion")}}
        try:
            await self.access.patch(PODS, meta.get("namespace", ""), meta["name"], body)
        except StatusError as e:
            if e.code == 404:
                return True
            if e.code == 409:
                return False  # changed meanwhile: its MODIFIED event has marked the Job dirty again
            raise
        return True

    async def _release_orphan(self, ns: str, name: str) -> None:
        pod = self.access.get(PODS, ns, name)
        if pod is None or TRACKING not in (pod["metadata"].get("finalizers") or ()):
            return
        uid = controller_uid(pod)
        where = self.store.by_uid.get(uid or "")
        if where is not None and where[0] == JOBS:
            job = self.access.get(JOBS, *where[1])
            if job is not None and not finished(job):
                return  # its Job is alive: the Job's own sync counts it first
        if not _releasable(pod, (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")):
            return  # retried on the pod's next change (it turns terminal)
        if not await self._release(pod):
            self._orphans.add((ns, name))
            self.wake()

    # ------------------------------------------------------------------------------------ pod writes

    def _satisfied(self, st: _JobState) -> bool:
        if st.creates <= 0 and not st.deletes:
            return True
        if self.clock() > st.expect_until:
            st.creates, st.deletes = 0, set()
            return True
        return False

    async def _event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        if self.options.events:
            await self.access.event(job, "Job", type_, reason, message)

    async def _create(self, job: dict[str, Any], st: _JobState, index: int | None) -> bool:
        st.creates += 1
        st.expect_until = self.clock() + EXPECTATIONS_TIMEOUT
        ns = job["metadata"].get("namespace", "default")
        try:
            for attempt in range(GENERATE_NAME_ATTEMPTS):
                try:
                    pod = await self.access.create(PODS, ns, pod_from_template(job, index, clone))
                    break
                except StatusError as e:  # a generateName collision: draw another suffix (RetryGenerateName)
                    if e.reason != "AlreadyExists" or attempt == GENERATE_NAME_ATTEMPTS - 1:
                        raise
        except StatusError as e:
            st.creates = max(0, st.creates - 1)
            log.warning("job pod create failed", job=job["metadata"]["name"], namespace=ns, code=e.code,
                        error=str(e))
            await self._event(job, "Warning", "FailedCreate", f"Error creating: {e}")
            return False
        self.pods_created += 1
        await self._event(job, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}")
        return True

    async def _delete(self, job: dict[str, Any], st: _JobState, pod: dict[str, Any], *, uncounted: bool) -> bool:
        """Delete an active pod; `uncounted` (suspend, scale-down) drops the finalizer first so that it is
        not recorded as a failure, otherwise (Job failing or succeeded) it keeps it and is counted failed."""
        meta = pod["metadata"]
        ns, name, uid = meta.get("namespace", ""), meta["name"], meta.get("uid", "")
        if uncounted and TRACKING in (meta.get("finalizers") or ()) and not await self._release(pod):
            return False
        st.deletes.add(uid)
        st.expect_until = self.clock() + EXPECTATIONS_TIMEOUT
        try:
            gone = await self.access.delete(PODS, ns, name, uid=uid)
        except StatusError as e:
            st.deletes.discard(uid)
            if e.code == 409:
                return False
            raise
        if gone is None:
            st.deletes.discard(uid)
            return False
        self.pods_deleted += 1
        await self._event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {name}")
        return True

    async def _write_status(self, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        patch = merge_diff(job.get("status") or {}, status)
        if not patch:
            return job
        self._writing = meta["uid"]
        try:
            return await self.access.patch(JOBS, meta.get("namespace", ""), meta["name"], {"status": patch},
                                           subresource="status")
        finally:
            self._writing = None

    # ------------------------------------------------------------------------------------ sync

    def _pods(self, st: _JobState) -> list[dict[str, Any]]:
        out = []
        for name in st.pods:
            pod = self.access.get(PODS, st.namespace, name)
            if pod is not None:
                out.append(pod)
        return out

    async def _sync(self, uid: str) -> None:
        where = self.store.by_uid.get(uid)
        st = self._states.get(uid)
        if st is None:
            return
        job = self.access.get(JOBS, *where[1]) if where is not None and where[0] == JOBS else None
        if job is None:  # pods that name a Job we never saw alive: release them like orphans
            st.gone = True
            self._orphans.update((st.namespace, p) for p in st.pods)
            if not st.pods:
                del self._states[uid]
            return
        self.syncs += 1
        spec = job.get("spec") or {}
        if spec.get("managedBy") not in (None, MANAGED_BY):
            return  # delegated to another controller (JobManagedBy)
        pods = self._pods(st)
        if finished(job):
            for pod in pods:
                terminal = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                if TRACKING in (pod["metadata"].get("finalizers") or ()) and _releasable(pod, terminal):
                    await self._release(pod)
            self._track_ttl(uid, job)
            return
        await self._sync_running(uid, st, job, pods)

    async def _sync_running(self, uid: str, st: _JobState, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        view = _View.of(job)
        now = self.access.now()
        stamp = rfc3339(now)
        job, status, tally = await self._account(st, job, view, pods)
        conds: list[dict[str, Any]] = [dict(c) for c in status.get("conditions") or ()]
        events: list[tuple[str, str, str]] = []
        if status.get("startTime") is None and not view.suspended:
            status["startTime"] = stamp
        active_pods = [p for p in pods if _active(p)]
        target, success = self._verdict(uid, view, conds, status, tally, active_pods, now, stamp, events)
        await self._converge_pods(job, st, view, tally, pods, active_pods, decided=target is not None or success)
        active, ready, terminating = self._live_pod_counts(st)
        if (target is not None or success) and active == terminating == 0 and not tally.pending:
            _conclude(conds, status, target, stamp, events)
        _set(status, "active", active)
        status["ready"] = ready
        status["terminating"] = terminating
        _set(status, "succeeded", tally.succeeded)
        _set(status, "failed", tally.failed)
        _set(status, "conditions", conds)
        job = await self._write_status(job, status)
        for type_, reason, message in events:
            await self._event(job, type_, reason, message)
        if finished(job):
            meta = job["metadata"]
            log.info("job finished", job=meta["name"], namespace=meta.get("namespace"), succeeded=tally.succeeded,
                     failed=tally.failed, outcome="Failed" if target is not None else "Complete")
            self._track_ttl(uid, job)

    def _verdict(self, uid: str, view: _View, conds: list[dict[str, Any]], status: dict[str, Any], tally: _Tally,
                 active_pods: list[dict[str, Any]], now: datetime, stamp: str,
                 events: list[tuple[str, str, str]]) -> tuple[dict[str, Any] | None, bool]:
        """A failure or success target first (the FailureTarget condition, or success); without one, Suspended
        follows spec.suspend (a resume restarts startTime: activeDeadlineSeconds counts continuous activity)."""
        if not view.deleting and not _is_true(conds, "FailureTarget") and not _is_true(conds, "SuccessCriteriaMet"):
            self._judge(uid, view, conds, status, tally, active_pods, now, stamp)
        target = _condition(conds, "FailureTarget") if _is_true(conds, "FailureTarget") else None
        success = target is None and _is_true(conds, "SuccessCriteriaMet")
        if target is None and not success and not view.deleting:
            if view.suspended:
                if _ensure(conds, "Suspended", "True", "JobSuspended", "Job suspended", stamp):
                    events.append(("Normal", "Suspended", "Job suspended"))
            elif _ensure(conds, "Suspended", "False", "JobResumed", "Job resumed", stamp):
                events.append(("Normal", "Resumed", "Job resumed"))
                status["startTime"] = stamp  # activeDeadlineSeconds counts continuous activity
        return target, success

    async def _converge_pods(self, job: dict[str, Any], st: _JobState, view: _View, tally: _Tally,
                             pods: list[dict[str, Any]], active_pods: list[dict[str, Any]], *, decided: bool) -> None:
        """Terminate the active pods on a verdict (or while suspended), otherwise converge on the wanted set."""
        if decided:
            for pod in active_pods:
                await self._delete(job, st, pod, uncounted=False)
        elif not view.deleting and self._satisfied(st):
            if view.suspended:
                for pod in active_pods:
                    await self._delete(job, st, pod, uncounted=True)
            elif view.indexed and view.completions is not None:
                await self._manage_indexed(job, st, view, pods, active_pods, tally.completed)
            else:
                await self._manage(job, st, view, pods, active_pods, tally.effective_succeeded)

    def _live_pod_counts(self, st: _JobState) -> tuple[int, int, int]:
        """(active, ready, terminating) among the Job's unfinished pods, as the store now shows them."""
        active = ready = terminating = 0
        for pod in self._pods(st):
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if pod["metadata"].get("deletionTimestamp"):
                terminating += 1
            else:
                active += 1
                ready += _pod_ready(pod)
        return active, ready, terminating

    async def _account(
        self, st: _JobState, job: dict[str, Any], view: _View, pods: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, Any], _Tally]:
        """Count finished pods: record them in uncountedTerminatedPods, drop their finalizers, then move them
        to succeeded/failed, so a crash or a lost write can neither lose nor double-count a pod."""
        old = job.get("status") or {}
        unc = old.get("uncountedTerminatedPods") or {}
        unc_s: list[str] = list(unc.get("succeeded") or [])
        unc_f: list[str] = list(unc.get("failed") or [])
        completed = parse_indexes(old.get("completedIndexes", "")) if view.indexed else set()
        new_s, new_f, release = _record_finished(pods, view, unc_s, unc_f, completed)
        if new_s:
            st.failures = 0
        if new_f:
            st.failures += new_f
            st.last_failure = self.clock()
        status: dict[str, Any] = dict(old)
        status["uncountedTerminatedPods"] = _uncounted(unc_s, unc_f)
        if view.indexed:
            _set(status, "completedIndexes", format_indexes(completed))
            _set(status, "succeeded", len(completed))
        if release:
            job = await self._write_status(job, status)
            status = dict(job.get("status") or {})
        released = set()
        for pod in release:
            if await self._release(pod):
                released.add(pod["metadata"].get("uid", ""))
        present = {pod["metadata"].get("uid", ""): pod for pod in pods}

        def counted(puid: str) -> bool:
            pod = present.get(puid)
            return pod is None or puid in released or TRACKING not in (pod["metadata"].get("finalizers") or ())

        keep_s = [u for u in unc_s if not counted(u)]
        keep_f = [u for u in unc_f if not counted(u)]
        succeeded = len(completed) if view.indexed else int(old.get("succeeded") or 0) + len(unc_s) - len(keep_s)
        failed = int(old.get("failed") or 0) + len(unc_f) - len(keep_f)
        status["uncountedTerminatedPods"] = _uncounted(keep_s, keep_f)
        return job, status, _Tally(succeeded, failed, completed, keep_s, keep_f, view.indexed)

    def _judge(self, uid: str, view: _View, conds: list[dict[str, Any]], status: dict[str, Any], tally: _Tally,
               active_pods: list[dict[str, Any]], now: datetime, stamp: str) -> None:
        """Add FailureTarget or SuccessCriteriaMet when the Job has met its fate (failure checked first)."""
        past_restarts = False
        if view.restart_policy == "OnFailure":
            restarts = sum(_restarts(p) for p in active_pods)
            past_restarts = restarts > 0 if view.backoff_limit == 0 else restarts >= view.backoff_limit
        if tally.effective_failed > view.backoff_limit or past_restarts:
            _ensure(conds, "FailureTarget", "True", "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit", stamp)
        elif self._past_deadline(uid, view, status, now):
            _ensure(conds, "FailureTarget", "True", "DeadlineExceeded",
                    "Job was active longer than specified deadline", stamp)
        elif _complete(view.completions, tally.effective_succeeded, len(active_pods)):
            _ensure(conds, "SuccessCriteriaMet", "True", "CompletionsReached",
                    "Reached expected number of succeeded pods", stamp)

    def _past_deadline(self, uid: str, view: _View, status: dict[str, Any], now: datetime) -> bool:
        start = _parse_time(status.get("startTime"))
        if view.active_deadline is None or start is None or view.suspended:
            return False
        remaining = (start + timedelta(seconds=view.active_deadline) - now).total_seconds()
        if remaining <= 0:
            return True
        self._requeue(uid, remaining)
        return False

    def _backoff_remaining(self, st: _JobState) -> float:
        if st.failures <= 0:
            return 0.0
        delay = min(self.options.backoff_base_seconds * 2.0 ** (st.failures - 1), self.options.backoff_max_seconds)
        return st.last_failure + delay - self.clock()

    async def _manage(self, job: dict[str, Any], st: _JobState, view: _View, pods: list[dict[str, Any]],
                      active_pods: list[dict[str, Any]], succeeded: int) -> None:
        active = len(active_pods)
        if view.completions is None:
            want = active if succeeded > 0 else view.parallelism  # work queue: no new pods after a success
        else:
            want = max(0, min(view.parallelism, view.completions - succeeded))
        if active > want:
            for pod in sorted(active_pods, key=_removal_order)[: active - want]:
                await self._delete(job, st, pod, uncounted=True)
            return
        diff = want - active
        if view.only_failed:
            diff -= sum(1 for p in pods if _terminating(p))
        if diff <= 0:
            return
        wait = self._backoff_remaining(st)
        if wait > 0:
            self._requeue(job["metadata"]["uid"], wait)
            return
        for _ in range(diff):
            if not await self._create(job, st, None):
                self._requeue(job["metadata"]["uid"], 1.0)
                break

    async def _manage_indexed(self, job: dict[str, Any], st: _JobState, view: _View, pods: list[dict[str, Any]],
                              active_pods: list[dict[str, Any]], completed: set[int]) -> None:
        completions = view.completions or 0
        by_index: dict[int, list[dict[str, Any]]] = {}
        extra: list[dict[str, Any]] = []
        for pod in active_pods:
            ix = completion_index(pod)
            if ix is None or not 0 <= ix < completions or ix in completed:
                extra.append(pod)
            else:
                by_index.setdefault(ix, []).append(pod)
        for ix, group in by_index.items():
            if len(group) > 1:  # keep the most advanced pod of a duplicated index
                group.sort(key=_removal_order, reverse=True)
                extra.extend(group[1:])
                by_index[ix] = group[:1]
        for pod in extra:
            await self._delete(job, st, pod, uncounted=True)
        active = len(by_index)
        want = max(0, min(view.parallelism, completions - len(completed)))
        if active > want:
            for ix in sorted(by_index, reverse=True)[: active - want]:  # scale down from the highest index
                await self._delete(job, st, by_index[ix][0], uncounted=True)
            return
        diff = want - active
        if diff <= 0:
            return
        wait = self._backoff_remaining(st)
        if wait > 0:
            self._requeue(job["metadata"]["uid"], wait)
            return
        busy = set(by_index) | completed
        if view.only_failed:
            busy.update(ix for p in pods if _terminating(p) and (ix := completion_index(p)) is not None)
        for ix in range(completions):
            if diff <= 0:
                break
            if ix in busy:
                continue
            if not await self._create(job, st, ix):
                self._requeue(job["metadata"]["uid"], 1.0)
                break
            diff -= 1



__all__ = ["JobController", "JobOptions", "format_indexes", "merge_diff", "parse_indexes", "pod_from_template"]

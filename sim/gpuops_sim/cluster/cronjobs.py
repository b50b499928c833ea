"""The CronJob controller of kube-controller-manager (batch/v1) and the cron schedules it reads.

Schedules are those of robfig/cron v3's standard parser, which upstream uses: five fields (minute, hour,
day of month, month, day of week; `*`, `?`, lists, ranges, steps, month and weekday names) or a descriptor
(@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration>), optionally prefixed
with `TZ=<zone>` / `CRON_TZ=<zone>`. Day of month and day of week are ORed unless either starts with `*`
(or `?`), in which case they are ANDed. The next time is the first whole minute strictly after the given
instant whose wall clock in the schedule's zone matches, searched at most five years ahead; across a
daylight-saving change that means a skipped wall time does not run and a repeated one runs twice, as upstream.

The controller follows `syncCronJob` and `cleanupFinishedJobs`: it keeps `status.active` to the Jobs still
running, records lastScheduleTime / lastSuccessfulTime, starts a Job named `<cronjob>-<minutes since epoch>`
for the most recent unmet schedule unless it is past startingDeadlineSeconds, respects suspend and the
Allow / Forbid / Replace concurrency policies, and deletes the oldest finished Jobs beyond the history limits.

Time is the emulator's wall clock (`api.clock`, which tests may replace); due times are kept in one heap and
one Loop timer wakes the controller at the earliest of them, at least every `clock_check_seconds` so that a
clock moved by a test is noticed.
"""

from __future__ import annotations

import heapq
import itertools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.objects import rfc3339
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent, clone
from .access import CRONJOBS, JOBS, ClusterAccess
from .jobs import merge_diff
from .loop import Loop
from .revisions import controller_ref, controller_uid, parse_time

log = structlog.get_logger("gpuops_sim.cronjobs")

USER = "system:serviceaccount:kube-system:cronjob-controller"
COMPONENT = "cronjob-controller"
KIND = "CronJob"
SCHEDULED_ANNOTATION = "batch.kubernetes.io/cronjob-scheduled-timestamp"
NEXT_SCHEDULE_DELTA = timedelta(milliseconds=100)  # requeue slack for clock skew, as upstream
RETRY_SECONDS = 1.0
YEAR_LIMIT = 5  # robfig/cron gives up after five years without a match
MANY_MISSED = 100

Key = tuple[str, str]

# ------------------------------------------------------------------------------------------ schedules

STAR = 1 << 63  # the field was `*` or `?`: marks an unrestricted day-of-month / day-of-week
_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                                       "dec"), start=1)}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_BOUNDS = ((0, 59, None), (0, 23, None), (1, 31, None), (1, 12, _MONTHS), (0, 6, _DAYS))
_INT = re.compile(r"\+?[0-9]+")
_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class CronError(ValueError):
    """A schedule robfig/cron's standard parser refuses."""


def _bits(lo: int, hi: int, step: int = 1) -> int:
    return sum(1 << i for i in range(lo, hi + 1, step))


def _number(text: str, names: dict[str, int] | None) -> int:
    if names is not None and text.lower() in names:
        return names[text.lower()]
    if _INT.fullmatch(text) is None:
        raise CronError(f'failed to parse int from {text}: strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


def _range(expr: str, lo: int, hi: int, names: dict[str, int] | None) -> int:
    """One `a`, `a-b`, `*`, each with an optional `/step` (`getRange`)."""
    range_step = expr.split("/")
    low_high = range_step[0].split("-")
    extra = 0
    if low_high[0] in ("*", "?"):
        start, end, extra = lo, hi, STAR
    else:
        start = _number(low_high[0], names)
        if len(low_high) > 2:
            raise CronError(f"too many hyphens: {expr}")
        end = _number(low_high[1], names) if len(low_high) == 2 else start
    step = 1
    if len(range_step) > 2:
        raise CronError(f"too many slashes: {expr}")
    if len(range_step) == 2:
        step = _number(range_step[1], None)
        if len(low_high) == 1:
            end = hi  # `N/step` means `N-max/step`
        if step > 1:
            extra = 0
    if start < lo:
        raise CronError(f"beginning of range ({start}) below minimum ({lo}): {expr}")
    if end > hi:
        raise CronError(f"end of range ({end}) above maximum ({hi}): {expr}")
    if start > end:
        raise CronError(f"beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise CronError(f"step of range should be a positive number: {expr}")
    return _bits(start, end, step) | extra


def _field(text: str, index: int) -> int:
    lo, hi, names = _BOUNDS[index]
    out = 0
    for expr in text.split(","):
        if expr:  # empty list items are skipped (strings.FieldsFunc); an empty field matches nothing
            out |= _range(expr, lo, hi, names)
    return out


def load_zone(name: str) -> tzinfo:
    """`time.LoadLocation`: "" and "UTC" are UTC; "Local" is the controller's zone, UTC here."""
    if name in ("", "UTC", "Local"):
        return UTC
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError) as e:
        raise CronError(f"unknown time zone {name}") from e


def _go_duration(text: str) -> float:
    """Go's `time.ParseDuration` for the positive durations @every takes, in seconds."""
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(body):
        m = _DURATION.match(body, pos)
        if m is None or m.group(1) in ("", "."):
            raise CronError(f'failed to parse duration {text}: time: invalid duration "{text}"')
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not body:
        raise CronError(f'failed to parse duration {text}: time: invalid duration "{text}"')
    return sign * total


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: bit sets per field (STAR marks `*`), or a constant delay for @every."""

    minute: int = 0
    hour: int = 0
    dom: int = 0
    month: int = 0
    dow: int = 0
    zone: tzinfo = UTC
    every: float = 0.0

    def day_matches(self, wall: datetime) -> bool:
        dom = bool(self.dom >> wall.day & 1)
        dow = bool(self.dow >> (wall.isoweekday() % 7) & 1)
        if self.dom & STAR or self.dow & STAR:
            return dom and dow
        return dom or dow

    def matches(self, instant: datetime) -> bool:
        """Whether the wall clock of `instant` in the schedule's zone matches every field (seconds ignored)."""
        wall = instant.astimezone(self.zone)
        return bool(self.month >> wall.month & 1 and self.hour >> wall.hour & 1 and self.minute >> wall.minute & 1
                    and self.day_matches(wall))

    def next(self, after: datetime) -> datetime | None:
        """The first matching whole minute strictly after `after` (UTC), or None within five years."""
        if self.every:
            base = after.replace(microsecond=0)
            return (base + timedelta(seconds=self.every)).astimezone(UTC)
        c = after.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = c.astimezone(self.zone).year + YEAR_LIMIT
        while True:
            wall = c.astimezone(self.zone)
            if wall.year > limit:
                return None
            target = self._skip(wall)
            if target is None:
                return c
            c = self._jump(c, wall, target)

    def _skip(self, wall: datetime) -> list[datetime] | None:
        """None when `wall` matches; else wall-clock targets to jump to, coarsest first (each skips only
        non-matching times)."""
        naive = wall.replace(tzinfo=None)
        next_minute = naive + timedelta(minutes=1)
        next_hour = naive.replace(minute=0) + timedelta(hours=1)
        next_day = naive.replace(hour=0, minute=0) + timedelta(days=1)
        if not self.month >> wall.month & 1:
            year, month = (naive.year + 1, 1) if naive.month == 12 else (naive.year, naive.month + 1)
            return [naive.replace(year=year, month=month, day=1, hour=0, minute=0), next_day, next_hour, next_minute]
        if not self.day_matches(wall):
            return [next_day, next_hour, next_minute]
        if not self.hour >> wall.hour & 1:
            return [next_hour, next_minute]
        if self.minute >> wall.minute & 1:
            return None
        later = [m for m in range(wall.minute + 1, 60) if self.minute >> m & 1]
        return [naive.replace(minute=later[0]) if later else next_hour, next_minute]

    def _jump(self, c: datetime, wall: datetime, targets: list[datetime]) -> datetime:
        """The instant of the first target reachable without crossing a UTC-offset change (where wall time is
        not linear); one minute is always safe."""
        offset = wall.utcoffset()
        naive = wall.replace(tzinfo=None)
        for target in targets[:-1]:
            candidate = c + (target - naive)
            if (candidate - timedelta(minutes=1)).astimezone(self.zone).utcoffset() == offset:
                return candidate
        return c + timedelta(minutes=1)


_DESCRIPTORS = {
    "@yearly": ("0", "0", "1", "1", "*"),
    "@annually": ("0", "0", "1", "1", "*"),
    "@monthly": ("0", "0", "1", "*", "*"),
    "@weekly": ("0", "0", "*", "*", "0"),
    "@daily": ("0", "0", "*", "*", "*"),
    "@midnight": ("0", "0", "*", "*", "*"),
    "@hourly": ("0", "*", "*", "*", "*"),
}


def parse_schedule(spec: str) -> Schedule:
    """`cron.ParseStandard`: five fields or a descriptor, with an optional TZ= / CRON_TZ= prefix."""
    text = spec.strip()
    zone: tzinfo = UTC
    if text.startswith(("TZ=", "CRON_TZ=")):
        space = text.find(" ")
        name = text[text.find("=") + 1: space if space >= 0 else len(text)]
        try:
            zone = load_zone(name)
        except CronError as e:
            raise CronError(f"provided bad location {name}: {e}") from e
        text = text[space:].strip() if space >= 0 else ""
    if not text:
        raise CronError("empty spec string")
    if text.startswith("@every "):
        seconds = _go_duration(text[len("@every "):].strip())
        seconds = float(int(max(seconds, 1.0)))  # at least a second, whole seconds
        return Schedule(zone=zone, every=seconds)
    if text.startswith("@"):
        if text not in _DESCRIPTORS:
            raise CronError(f"unrecognized descriptor: {text}")
        fields: list[str] = list(_DESCRIPTORS[text])
    else:
        fields = text.split()
        if len(fields) != 5:
            raise CronError(f"expected exactly 5 fields, found {len(fields)}: [{' '.join(fields)}]")
    bits = [_field(f, i) for i, f in enumerate(fields)]
    return Schedule(bits[0], bits[1], bits[2], bits[3], bits[4], zone)


def format_schedule(cronjob: dict[str, Any]) -> str:
    """`formatSchedule`: spec.timeZone becomes a TZ= prefix unless the schedule already names one."""
    spec = cronjob.get("spec") or {}
    schedule = str(spec.get("schedule") or "")
    tz = spec.get("timeZone")
    if "TZ" in schedule or tz is None:
        return schedule
    try:
        load_zone(str(tz))
    except CronError:
        return schedule
    return f"TZ={tz} {schedule}"


# ------------------------------------------------------------------------------------------ schedule arithmetic

NONE_MISSED, FEW_MISSED, MANY_MISSED_LEVEL = 0, 1, 2


@dataclass
class CronTimes:
    """What `mostRecentScheduleTime` reads of a CronJob."""

    created: datetime
    last_schedule: datetime | None
    deadline: int | None


def most_recent(times: CronTimes, now: datetime, sched: Schedule,
                with_deadline: bool) -> tuple[datetime, datetime | None, int]:
    """`mostRecentScheduleTime`: (earliest time considered, most recent unmet schedule or None, how many missed).

    Raises CronError for a schedule that never fires (say February 31st)."""
    earliest = times.last_schedule or times.created
    if with_deadline and times.deadline is not None:
        earliest = max(earliest, now - timedelta(seconds=times.deadline))
    t1 = sched.next(earliest)
    t2 = sched.next(t1) if t1 is not None else None
    if t1 is not None and now < t1:
        return earliest, None, NONE_MISSED
    if t1 is not None and t2 is not None and now < t2:
        return earliest, t1, NONE_MISSED
    between = round((t2 - t1).total_seconds()) if t1 is not None and t2 is not None else 0
    if t1 is None or between < 1:
        raise CronError("time difference between two schedules is less than 1 second")
    missed = int((now - t1).total_seconds()) // between + 1
    recent: datetime | None = None
    t: datetime | None = sched.next(t1 + timedelta(seconds=(missed - 2) * between))
    while t is not None and t <= now:
        recent = t
        t = sched.next(t)
    level = MANY_MISSED_LEVEL if missed > MANY_MISSED else FEW_MISSED if missed > 0 else NONE_MISSED
    return earliest, recent, level


def next_due(times: CronTimes, now: datetime, sched: Schedule) -> datetime | None:
    """`nextScheduleTimeDuration` as an instant: the next schedule after the most recent one, plus slack."""
    try:
        earliest, recent, missed = most_recent(times, now, sched, False)
        base = recent or (earliest if missed == NONE_MISSED else now)
    except CronError:
        base = now
    nxt = sched.next(base)
    return None if nxt is None else nxt + NEXT_SCHEDULE_DELTA


def job_name(cronjob_name: str, scheduled: datetime) -> str:
    return f"{cronjob_name}-{int(scheduled.timestamp()) // 60}"


def go_rfc3339(t: datetime) -> str:
    """Go's time.RFC3339 (`Z` for a zero offset, else `+hh:mm`), to the second."""
    text = t.replace(microsecond=0).isoformat()
    return text[:-6] + "Z" if t.utcoffset() == timedelta(0) else text


def job_for(cronjob: dict[str, Any], scheduled: datetime) -> dict[str, Any]:
    """`getJobFromTemplate2`: the template's labels and annotations, the scheduled-time annotation in the
    CronJob's zone, the CronJob as controller."""
    meta = cronjob["metadata"]
    spec = cronjob.get("spec") or {}
    template = spec.get("jobTemplate") or {}
    tmeta = template.get("metadata") or {}
    zone = load_zone(str(spec.get("timeZone") or ""))
    annotations = {**(tmeta.get("annotations") or {}), SCHEDULED_ANNOTATION: go_rfc3339(scheduled.astimezone(zone))}
    jmeta: dict[str, Any] = {"name": job_name(meta["name"], scheduled), "namespace": meta.get("namespace", "default"),
                             "annotations": annotations,
                             "ownerReferences": [controller_ref(cronjob, KIND, "batch/v1")]}
    if tmeta.get("labels"):
        jmeta["labels"] = dict(tmeta["labels"])
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": jmeta, "spec": clone(template.get("spec") or {})}


def finished_as(job: dict[str, Any]) -> str | None:
    """"Complete" or "Failed" once the Job has that condition True, else None."""
    for c in (job.get("status") or {}).get("conditions") or ():
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def start_order(job: dict[str, Any]) -> tuple[int, str, str]:
    """`byJobStartTime`: started Jobs first, oldest first, then by name."""
    start = (job.get("status") or {}).get("startTime")
    return (0 if start else 1), str(start or ""), str(job["metadata"]["name"])


# ------------------------------------------------------------------------------------------ controller


@dataclass
class CronJobOptions:
    events: bool = True
    # Longest sleep while a CronJob is due later. Due times are exact on a real clock; this bound only matters
    # when the emulator's clock is moved (tests lower it to notice that quickly).
    clock_check_seconds: float = 30.0


@dataclass
class _Work:
    """The status being rebuilt in one sync."""

    active: list[dict[str, Any]]
    last_schedule: datetime | None
    last_successful: datetime | None
    changed: bool = False
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, cronjob: dict[str, Any]) -> _Work:
        st = cronjob.get("status") or {}
        return cls([dict(r) for r in st.get("active") or ()], parse_time(st.get("lastScheduleTime")),
                   parse_time(st.get("lastSuccessfulTime")))

    def has(self, uid: str) -> bool:
        return any(r.get("uid") == uid for r in self.active)

    def drop(self, uid: str) -> None:
        self.active = [r for r in self.active if r.get("uid") != uid]
        self.changed = True


class CronJobController(Loop):
    """batch/v1 CronJob controller, writing as the cronjob-controller service account."""

    name = "cronjob-controller"

    def __init__(self, server: APIServer, options: CronJobOptions | None = None) -> None:
        super().__init__()
        self.options = options or CronJobOptions()
        self.access = ClusterAccess(server, USER, component=COMPONENT,
                                    groups=("system:serviceaccounts", "system:serviceaccounts:kube-system"))
        self.store = self.access.store
        self._jobs: dict[str, set[Key]] = {}  # CronJob uid -> its Jobs
        self._dirty: set[Key] = set()
        self._heap: list[tuple[datetime, int, Key]] = []
        self._due_at: dict[Key, datetime] = {}
        self._seq = itertools.count()
        self._tick: float | None = None
        self._writing: str | None = None
        self._scanned = False
        self.syncs = 0
        self.jobs_created = 0
        self.access.listen(self._on_event)

    # ------------------------------------------------------------------------------------ intake

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr == JOBS:
            self._on_job(ev)
        elif ev.gr == CRONJOBS:
            self._on_cronjob(ev)

    def _mark_uid(self, uid: str) -> None:
        where = self.store.by_uid.get(uid)
        if where is not None and where[0] == CRONJOBS:
            self._dirty.add(where[1])
            self.wake()

    def _on_job(self, ev: WatchEvent) -> None:
        uid = controller_uid(ev.new.obj, KIND)
        prev = controller_uid(ev.prev.obj, KIND) if ev.prev is not None else None
        if prev and prev != uid:
            self._jobs.get(prev, set()).discard(ev.key)
            self._mark_uid(prev)
        if not uid:
            return
        if ev.type == "DELETED":
            self._jobs.get(uid, set()).discard(ev.key)
        else:
            self._jobs.setdefault(uid, set()).add(ev.key)
        self._mark_uid(uid)

    def _on_cronjob(self, ev: WatchEvent) -> None:
        obj = ev.new.obj
        uid = obj["metadata"].get("uid", "")
        if ev.type == "DELETED":
            self._jobs.pop(uid, None)
            self._due_at.pop(ev.key, None)
            self._dirty.discard(ev.key)
            return
        prev = ev.prev.obj if ev.prev is not None else None
        if prev is not None and (prev.get("spec") or {}) == (obj.get("spec") or {}) and (
                prev["metadata"].get("deletionTimestamp") == obj["metadata"].get("deletionTimestamp")):
            return  # a status or metadata write: nothing to schedule
        if prev is not None and format_schedule(prev) != format_schedule(obj):
            self._reschedule(ev.key, obj)  # upstream waits for the new schedule's next time
            return
        self._dirty.add(ev.key)
        self.wake()

    def _reschedule(self, key: Key, cronjob: dict[str, Any]) -> None:
        try:
            sched = parse_schedule(format_schedule(cronjob))
        except CronError:
            self._dirty.add(key)  # the sync reports the unparseable schedule
            self.wake()
            return
        due = next_due(self._times(cronjob), self.access.now(), sched)
        if due is not None:
            self._due(key, due)

    def _scan(self) -> None:
        """The informers' initial list: Jobs and CronJobs that existed before this controller started."""
        self._scanned = True
        for job in self.access.iter(JOBS):
            uid = controller_uid(job, KIND)
            if uid:
                meta = job["metadata"]
                self._jobs.setdefault(uid, set()).add((meta.get("namespace", ""), meta["name"]))
        for cj in self.access.iter(CRONJOBS):
            self._dirty.add((cj["metadata"].get("namespace", ""), cj["metadata"]["name"]))

    # ------------------------------------------------------------------------------------ time

    @staticmethod
    def _times(cronjob: dict[str, Any]) -> CronTimes:
        meta, spec, st = cronjob["metadata"], cronjob.get("spec") or {}, cronjob.get("status") or {}
        created = parse_time(meta.get("creationTimestamp")) or datetime.now(UTC)
        deadline = spec.get("startingDeadlineSeconds")
        return CronTimes(created, parse_time(st.get("lastScheduleTime")), None if deadline is None else int(deadline))

    def _due(self, key: Key, when: datetime) -> None:
        """Sync `key` at wall time `when`; an earlier pending time wins, as a delaying work queue does."""
        cur = self._due_at.get(key)
        if cur is not None and cur <= when:
            return
        self._due_at[key] = when
        heapq.heappush(self._heap, (when, next(self._seq), key))
        self._arm()

    def _arm(self) -> None:
        if not self._heap:
            return
        remaining = (self._heap[0][0] - self.access.now()).total_seconds()
        when = self.clock() + min(max(remaining, 0.0), self.options.clock_check_seconds)
        if self._tick is None or when < self._tick - 1e-3:
            self._tick = when
            self.at("tick", when)

    def _pop_due(self) -> None:
        now = self.access.now()
        while self._heap and self._heap[0][0] <= now:
            when, _, key = heapq.heappop(self._heap)
            if self._due_at.get(key) == when:
                del self._due_at[key]
                self._dirty.add(key)

    # ------------------------------------------------------------------------------------ loop

    async def step(self) -> None:
        if not self._scanned:
            self._scan()
        for item in self.due():
            if item == "tick" and self._tick is not None and self._tick <= self.clock():
                self._tick = None
            elif isinstance(item, tuple) and item[0] == "retry":
                self._dirty.add(item[1])
        self._pop_due()
        dirty, self._dirty = self._dirty, set()
        for key in sorted(dirty):
            await self._sync_one(key)
        self._arm()
        if self._dirty:
            self.wake()

    async def _sync_one(self, key: Key) -> None:
        """One CronJob's sync; a failure is logged and retried without stopping the others."""
        try:
            await self._sync(key)
        except StatusError as e:
            if e.code == 404:
                return
            log.warning("cronjob sync failed", namespace=key[0], cronjob=key[1], code=e.code, error=str(e))
            self.after(("retry", key), RETRY_SECONDS)  # real seconds: a stopped test clock must not stall it
        except Exception:
            self.errors += 1
            log.exception("cronjob sync failed", namespace=key[0], cronjob=key[1])
            self.after(("retry", key), RETRY_SECONDS)
        finally:
            self._writing = None

    def _children(self, uid: str) -> list[dict[str, Any]]:
        out = []
        for key in list(self._jobs.get(uid, ())):
            job = self.access.get(JOBS, *key)
            if job is not None and controller_uid(job, KIND) == uid:
                out.append(job)
        return out

    async def _sync(self, key: Key) -> None:
        cj = self.access.get(CRONJOBS, *key)
        if cj is None:
            return
        self.syncs += 1
        uid = cj["metadata"]["uid"]
        self._writing = uid
        work = _Work.of(cj)
        try:
            await self._cleanup(cj, self._children(uid), work)
            due = await self._reconcile(cj, self._children(uid), work)
        finally:  # what was done is recorded even when a later write failed (the sync is retried)
            for type_, reason, message in work.events:
                await self._event(cj, type_, reason, message)
            if work.changed:
                await self._write_status(cj, work)
        if due is not None:
            self._due(key, due)

    async def _write_status(self, cj: dict[str, Any], work: _Work) -> None:
        old = cj.get("status") or {}
        new = {k: v for k, v in old.items() if k not in ("active", "lastScheduleTime", "lastSuccessfulTime")}
        if work.active:
            new["active"] = work.active
        if work.last_schedule is not None:
            new["lastScheduleTime"] = rfc3339(work.last_schedule)
        if work.last_successful is not None:
            new["lastSuccessfulTime"] = rfc3339(work.last_successful)
        patch = merge_diff(old, new)
        if patch:
            meta = cj["metadata"]
            await self.access.patch(CRONJOBS, meta.get("namespace", ""), meta["name"], {"status": patch},
                                    subresource="status")

    # ------------------------------------------------------------------------------------ reconcile

    def _reconcile_children(self, jobs: list[dict[str, Any]], work: _Work) -> None:
        """Active list and lastSuccessfulTime from the Jobs as they are now."""
        seen = set()
        for job in jobs:
            juid, name = job["metadata"]["uid"], job["metadata"]["name"]
            seen.add(juid)
            outcome = finished_as(job)
            if not work.has(juid) and outcome is None:
                work.events.append(("Warning", "UnexpectedJob",
                                    f"Saw a job that the controller did not create or forgot: {name}"))
            elif work.has(juid) and outcome is not None:
                work.drop(juid)
                work.events.append(("Normal", "SawCompletedJob", f"Saw completed job: {name}, status: {outcome}"))
            if outcome == "Complete" and not work.has(juid):
                done = parse_time((job.get("status") or {}).get("completionTime"))
                if done is not None and (work.last_successful is None or done > work.last_successful):
                    work.last_successful = done
                    work.changed = True
        for ref in list(work.active):
            if ref.get("uid") not in seen and self.access.get(JOBS, str(ref.get("namespace") or ""),
                                                             str(ref.get("name") or "")) is None:
                work.events.append(("Normal", "MissingJob", f"Active job went missing: {ref.get('name')}"))
                work.drop(str(ref.get("uid")))

    async def _reconcile(self, cj: dict[str, Any], jobs: list[dict[str, Any]], work: _Work) -> datetime | None:
        """`syncCronJob`: returns when to look again (None: not until the CronJob changes)."""
        self._reconcile_children(jobs, work)
        spec = cj.get("spec") or {}
        if cj["metadata"].get("deletionTimestamp"):
            return None
        tz = spec.get("timeZone")
        if tz is not None:
            try:
                load_zone(str(tz))
            except CronError as e:
                work.events.append(("Warning", "UnknownTimeZone", f'invalid timeZone: "{tz}": {e}'))
                return None
        if spec.get("suspend"):
            return None
        return await self._schedule(cj, work)

    def _parse(self, cj: dict[str, Any], work: _Work) -> Schedule | None:
        schedule = str((cj.get("spec") or {}).get("schedule") or "")
        if "TZ" in schedule:
            work.events.append(("Warning", "UnsupportedSchedule", f'CRON_TZ or TZ used in schedule "{schedule}" is '
                                "not officially supported, see https://kubernetes.io/docs/concepts/workloads/"
                                "controllers/cron-jobs/ for more details"))
        try:
            return parse_schedule(format_schedule(cj))
        except CronError as e:
            work.events.append(("Warning", "UnparseableSchedule", f'unparseable schedule: "{schedule}" : {e}'))
            return None

    async def _schedule(self, cj: dict[str, Any], work: _Work) -> datetime | None:
        """Start the most recent unmet schedule if it is still in time and the concurrency policy allows."""
        sched = self._parse(cj, work)
        if sched is None:
            return None
        spec, now = cj.get("spec") or {}, self.access.now()
        times = self._times(cj)
        times.last_schedule = work.last_schedule
        try:
            _, scheduled, missed = most_recent(times, now, sched, True)
        except CronError as e:
            work.events.append(("Warning", "InvalidSchedule", f"invalid schedule: {spec.get('schedule')} : {e}"))
            return None
        if scheduled is not None and missed == MANY_MISSED_LEVEL:
            work.events.append(("Warning", "TooManyMissedTimes", "too many missed start times. Set or decrease "
                                ".spec.startingDeadlineSeconds or check clock skew"))
        deadline = spec.get("startingDeadlineSeconds")
        if scheduled is None:
            pass
        elif deadline is not None and scheduled + timedelta(seconds=int(deadline)) < now:
            work.events.append(("Warning", "MissSchedule", "Missed scheduled time to start a job: "
                                + scheduled.astimezone(UTC).strftime("%a, %d %b %Y %H:%M:%S +0000")))
        elif any(r.get("name") == job_name(cj["metadata"]["name"], scheduled) for r in work.active) or (
                work.last_schedule == scheduled):
            pass  # already started
        elif spec.get("concurrencyPolicy") == "Forbid" and work.active:
            work.events.append(("Normal", "JobAlreadyActive",
                                "Not starting job because prior execution is running and concurrency policy is Forbid"))
        else:
            await self._start(cj, work, scheduled)
        times.last_schedule = work.last_schedule
        return next_due(times, now, sched)

    async def _start(self, cj: dict[str, Any], work: _Work, scheduled: datetime) -> None:
        """Replace the running Jobs if asked, then create this schedule's Job (or adopt it into the active list
        if an earlier attempt created it but the status write was lost)."""
        ns = cj["metadata"].get("namespace", "")
        if (cj.get("spec") or {}).get("concurrencyPolicy") == "Replace":
            for ref in list(work.active):
                job = self.access.get(JOBS, ns, str(ref.get("name") or ""))
                if job is not None:
                    await self._delete_job(cj, job, work)
        body = job_for(cj, scheduled)
        try:
            job = await self.access.create(JOBS, ns, body)
            self.jobs_created += 1
            work.events.append(("Normal", "SuccessfulCreate", f"Created job {job['metadata']['name']}"))
        except StatusError as e:
            if e.reason != "AlreadyExists":
                work.events.append(("Warning", "FailedCreate", f"Error creating job: {e}"))
                raise
            existing = self.access.get(JOBS, ns, body["metadata"]["name"])
            if existing is None or controller_uid(existing, KIND) != cj["metadata"]["uid"]:
                return
            if work.has(existing["metadata"]["uid"]):
                return
            job = existing
        meta = job["metadata"]
        work.active.append({"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "namespace": ns,
                            "resourceVersion": meta.get("resourceVersion", ""), "uid": meta["uid"]})
        work.last_schedule = scheduled
        work.changed = True

    # ------------------------------------------------------------------------------------ history

    async def _cleanup(self, cj: dict[str, Any], jobs: list[dict[str, Any]], work: _Work) -> None:
        """`cleanupFinishedJobs`: the oldest finished Jobs beyond successful/failedJobsHistoryLimit go."""
        spec = cj.get("spec") or {}
        for outcome, limit_key, default in (("Complete", "successfulJobsHistoryLimit", 3),
                                            ("Failed", "failedJobsHistoryLimit", 1)):
            limit = spec.get(limit_key, default)
            if limit is None:
                continue
            done = sorted((j for j in jobs if finished_as(j) == outcome), key=start_order)
            for job in done[: max(len(done) - int(limit), 0)]:
                await self._delete_job(cj, job, work)

    async def _delete_job(self, cj: dict[str, Any], job: dict[str, Any], work: _Work) -> None:
        meta = job["metadata"]
        try:
            await self.access.delete(JOBS, meta.get("namespace", ""), meta["name"], propagation="Background")
        except StatusError as e:
            log.warning("cronjob job delete failed", job=meta["name"], namespace=meta.get("namespace"), error=str(e))
            work.events.append(("Warning", "FailedDelete", f"Deleted job: {e}"))
            return
        if work.has(meta["uid"]):
            work.drop(meta["uid"])
        work.changed = True
        work.events.append(("Normal", "SuccessfulDelete", f"Deleted job {meta['name']}"))

    async def _event(self, cj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        if self.options.events:
            await self.access.event(cj, KIND, type_, reason, message)


__all__ = ["CronError", "CronJobController", "CronJobOptions", "CronTimes", "Schedule", "format_schedule", "job_for",
           "job_name", "most_recent", "next_due", "parse_schedule"]

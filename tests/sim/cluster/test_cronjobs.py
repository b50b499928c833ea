"""The CronJob controller and its cron schedules.

Schedules are checked as properties against an independent reading of the cron text and a brute-force scan
of every minute; the controller runs against the emulated API server with a wall clock the test moves, and
is driven through kubernetes-asyncio and kubectl (over TLS) as a user would.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client as aclient
from kubernetes_asyncio import config as aconfig
from waiting import until_holds

from gpuops_sim.apiserver import APIServer
from gpuops_sim.cluster.access import CRONJOBS, EVENTS, JOBS
from gpuops_sim.cluster.cronjobs import (
    SCHEDULED_ANNOTATION,
    CronError,
    CronJobController,
    CronJobOptions,
    CronTimes,
    job_name,
    most_recent,
    parse_schedule,
)

KUBECTL = str(Path(sys.executable).parent / "kubectl")
NS = "default"
ZONES = ["", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata"]
FIELDS: tuple[tuple[int, int, dict[str, int]], ...] = ((0, 59, {}), (0, 23, {}), (1, 31, {}),
          (1, 12, {m: i for i, m in enumerate(
              ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}),
          (0, 6, {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}))


# ------------------------------------------------------------------------------------------ an independent reading


def _values(item: str, lo: int, hi: int, names: dict[str, int]) -> tuple[set[int], bool]:
    """The values one list item of a cron field allows, and whether it is a bare `*`/`?`."""
    base, _, step_text = item.partition("/")
    step = int(step_text) if step_text else 1
    if base in ("*", "?"):
        return set(range(lo, hi + 1, step)), step == 1
    first, _, last = base.partition("-")
    a = names[first.lower()] if first.lower() in names else int(first)
    b = (names[last.lower()] if last.lower() in names else int(last)) if last else (hi if step_text else a)
    return set(range(a, b + 1, step)), False


def field_allows(text: str, index: int, value: int) -> tuple[bool, bool]:
    lo, hi, names = FIELDS[index]
    allowed: set[int] = set()
    star = False
    for item in text.split(","):
        values, bare = _values(item, lo, hi, names)
        allowed |= values
        star = star or bare
    return value in allowed, star


def cron_matches(fields: list[str], wall: datetime) -> bool:
    """Whether a wall-clock minute matches five cron fields, day of month and week ORed unless one is `*`."""
    minute, _ = field_allows(fields[0], 0, wall.minute)
    hour, _ = field_allows(fields[1], 1, wall.hour)
    month, _ = field_allows(fields[3], 3, wall.month)
    dom, dom_star = field_allows(fields[2], 2, wall.day)
    dow, dow_star = field_allows(fields[4], 4, wall.isoweekday() % 7)
    day = (dom and dow) if (dom_star or dow_star) else (dom or dow)
    return minute and hour and month and day


def minute_scan(fields: list[str], zone: str, after: datetime, horizon: timedelta) -> datetime | None:
    tz = ZoneInfo(zone) if zone else UTC
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while t <= after + horizon:
        if cron_matches(fields, t.astimezone(tz)):
            return t
        t += timedelta(minutes=1)
    return None


def _item(lo: int, hi: int, names: dict[str, int]) -> st.SearchStrategy[str]:
    number = st.integers(lo, hi)
    named = st.sampled_from(sorted(names)) if names else number.map(str)
    span = st.tuples(number, number).map(lambda ab: f"{min(ab)}-{max(ab)}")
    return st.one_of(
        st.just("*"), number.map(str), named, span,
        st.integers(1, hi - lo + 1).map(lambda k: f"*/{k}"),
        st.tuples(span, st.integers(1, 10)).map(lambda sk: f"{sk[0]}/{sk[1]}"),
        st.tuples(number, st.integers(1, 10)).map(lambda nk: f"{nk[0]}/{nk[1]}"),
    )


def _field(index: int) -> st.SearchStrategy[str]:
    lo, hi, names = FIELDS[index]
    return st.lists(_item(lo, hi, names), min_size=1, max_size=3).map(",".join)


@st.composite
def schedules(draw: st.DrawFn) -> list[str]:
    """Dense enough that most schedules fire within the scan; day fields are often `*` as in real use."""
    dom = draw(st.one_of(st.just("*"), _field(2)))
    month = draw(st.one_of(st.just("*"), st.just("*"), _field(3)))
    dow = draw(st.one_of(st.just("*"), _field(4)))
    return [draw(_field(0)), draw(_field(1)), dom, month, dow]


# ------------------------------------------------------------------------------------------ schedule properties


@settings(max_examples=150, deadline=None)
@given(fields=schedules(), zone=st.sampled_from(ZONES),
       after=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)))
def test_next_is_later_matches_the_fields_and_agrees_with_a_minute_scan(fields: list[str], zone: str,
                                                                       after: datetime) -> None:
    spec = (f"TZ={zone} " if zone else "") + " ".join(fields)
    nxt = parse_schedule(spec).next(after)
    horizon = timedelta(days=2)
    scanned = minute_scan(fields, zone, after, horizon)
    if nxt is not None:
        assert nxt > after and nxt.second == 0 and nxt.microsecond == 0
        assert cron_matches(fields, nxt.astimezone(ZoneInfo(zone) if zone else UTC))
    if scanned is not None:
        assert nxt == scanned
    else:
        assert nxt is None or nxt > after + horizon


@settings(max_examples=60, deadline=None)
@given(after=st.datetimes(min_value=datetime(2001, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)))
def test_descriptors_equal_their_five_field_forms(after: datetime) -> None:
    for descriptor, fields in (("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"),
                               ("@weekly", "0 0 * * 0"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
                               ("@hourly", "0 * * * *")):
        assert parse_schedule(descriptor).next(after) == parse_schedule(fields).next(after), descriptor


def test_schedule_details_as_robfig_cron_has_them() -> None:
    t = datetime(2026, 3, 8, 6, 30, 15, tzinfo=UTC)
    assert parse_schedule("@every 90s").next(t) == datetime(2026, 3, 8, 6, 31, 45, tzinfo=UTC)
    assert parse_schedule("0 0 29 2 *").next(t) == datetime(2028, 2, 29, tzinfo=UTC)
    assert parse_schedule("0 0 31 2 *").next(t) is None  # never: gives up after five years
    assert parse_schedule("0 0 13 * fri").next(t) == datetime(2026, 3, 13, tzinfo=UTC)  # 13th OR Friday
    assert parse_schedule("0 0 13 * FRI").next(datetime(2026, 3, 13, 1, tzinfo=UTC)) == datetime(
        2026, 3, 20, tzinfo=UTC)
    assert parse_schedule("0 0 */2 * 1").next(t) == datetime(2026, 3, 9, tzinfo=UTC)  # */2 is no `*`: OR
    new_york = parse_schedule("CRON_TZ=America/New_York 30 2 * * *")
    assert new_york.next(datetime(2026, 3, 8, 5, tzinfo=UTC)) == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)  # 2:30 skipped
    twice = parse_schedule("TZ=America/New_York 30 1 * * *")
    first = twice.next(datetime(2026, 11, 1, 4, tzinfo=UTC))
    assert first is not None
    assert (first, twice.next(first)) == (datetime(2026, 11, 1, 5, 30, tzinfo=UTC),
                                          datetime(2026, 11, 1, 6, 30, tzinfo=UTC))  # 1:30 EDT, then EST
    for bad, message in (("* * * *", "expected exactly 5 fields"), ("60 * * * *", "above maximum"),
                         ("* * * * 7", "above maximum"), ("*/0 * * * *", "positive"), ("@reboot", "unrecognized"),
                         ("TZ=Mars/Base * * * * *", "bad location"), ("5-1 * * * *", "beyond end"), ("", "empty")):
        with pytest.raises(CronError, match=message):
            parse_schedule(bad)


def test_most_recent_schedule_counts_missed_runs() -> None:
    sched = parse_schedule("*/5 * * * *")
    created = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
    times = CronTimes(created, None, None)
    assert most_recent(times, datetime(2026, 3, 1, 12, 4, tzinfo=UTC), sched, True)[1] is None
    _, recent, _ = most_recent(times, datetime(2026, 3, 1, 12, 17, tzinfo=UTC), sched, True)
    assert recent == datetime(2026, 3, 1, 12, 15, tzinfo=UTC)
    assert most_recent(times, created + timedelta(days=1), sched, True)[2] == 2  # more than 100 missed
    times.deadline = 60  # nothing older than a minute is considered
    assert most_recent(times, datetime(2026, 3, 1, 12, 17, tzinfo=UTC), sched, True)[1] is None
    with pytest.raises(CronError):
        most_recent(times, created, parse_schedule("0 0 31 2 *"), True)


# ------------------------------------------------------------------------------------------ the controller


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


T0 = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


class Env:
    """The emulator with only the CronJob controller (Jobs stay as created; the test finishes them)."""

    def __init__(self, server: APIServer, ctl: CronJobController, kubeconfig: Path, api: aclient.ApiClient) -> None:
        self.server = server
        self.ctl = ctl
        self.kubeconfig = kubeconfig
        self.batch = aclient.BatchV1Api(api)
        self.core = aclient.CoreV1Api(api)
        self.now = T0
        server.api.clock = lambda: self.now

    def at(self, hh: int, mm: int, ss: int = 0) -> None:
        self.now = T0.replace(hour=hh, minute=mm, second=ss)

    async def create(self, name: str, schedule: str = "*/5 * * * *", **spec: Any) -> None:
        body: Any = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
                "spec": {"schedule": schedule, "jobTemplate": {
                    "metadata": {"labels": {"cron": name}, "annotations": {"team": "a"}},
                    "spec": {"template": {"spec": {"restartPolicy": "Never",
                                                   "containers": [{"name": "c", "image": "busybox"}]}}}},
                         **spec}}
        before = self.ctl.syncs
        await self.batch.create_namespaced_cron_job(NS, body)
        await self.until(lambda: self.ctl.syncs > before, "first sync")

    def jobs(self, cron: str) -> list[dict[str, Any]]:
        out = [s.obj for s in self.server.store.iter(JOBS, NS)
               if (s.obj["metadata"].get("labels") or {}).get("cron") == cron]
        return sorted(out, key=lambda j: str(j["metadata"]["name"]))

    def has_job(self, cron: str, name: str) -> Callable[[], bool]:
        return lambda: any(j["metadata"]["name"] == name for j in self.jobs(cron))

    def active(self, cron: str) -> list[str]:
        return [str(a["name"]) for a in self.status(cron).get("active") or []]

    def status(self, name: str) -> dict[str, Any]:
        s = self.server.store.get(CRONJOBS, NS, name)
        return dict((s.obj if s else {}).get("status") or {})

    def events(self, name: str) -> list[str]:
        return [e.obj["reason"] for e in self.server.store.iter(EVENTS, NS)
                if e.obj["involvedObject"]["name"] == name and e.obj["involvedObject"]["kind"] == "CronJob"]

    async def finish(self, job: str, outcome: str = "Complete") -> None:
        """Finish a Job as the Job controller would, through the status subresource."""
        stamp = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
        first = ("SuccessCriteriaMet", "CompletionsReached") if outcome == "Complete" else (
            "FailureTarget", "BackoffLimitExceeded")
        conds = [{"type": t, "status": "True", "reason": first[1], "lastTransitionTime": stamp, "lastProbeTime": stamp}
                 for t in (first[0], outcome)]
        status: dict[str, Any] = {"conditions": conds, "startTime": stamp}
        if outcome == "Complete":
            status["completionTime"] = stamp
        await self.merge_patch("patch_namespaced_job_status", job, {"status": status})

    async def merge_patch(self, method: str, name: str, body: dict[str, Any]) -> None:
        """A JSON merge patch through kubernetes-asyncio (its stubs do not declare `_content_type`)."""
        api: Any = self.batch
        await getattr(api, method)(name, NS, body, _content_type="application/merge-patch+json")

    async def until(self, pred: Callable[[], Any], what: str, within: float = 5.0) -> Any:
        return await until_holds(what, pred, within)

    async def settle(self) -> None:
        """Proof that the controller looked at the moved clock: two full passes after the move (its clock check
        wakes it every 20 ms), so one of them began after the clock changed and acted on what was due."""
        before = self.ctl.steps
        await self.until(lambda: self.ctl.steps >= before + 2, "two controller passes")

    async def kubectl(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.kubeconfig.parent / "cache"),
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        return out.decode()


def minutes(hh: int, mm: int) -> int:
    return int(T0.replace(hour=hh, minute=mm, second=0).timestamp()) // 60


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with APIServer(tls=True) as server:
        ctl = CronJobController(server, CronJobOptions(clock_check_seconds=0.02))
        kubeconfig = tmp_path / "kubeconfig"
        server.write_kubeconfig(kubeconfig)
        cfg = aclient.Configuration()
        await aconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        async with aclient.ApiClient(cfg) as api:
            e = Env(server, ctl, kubeconfig, api)
            ctl.start()
            try:
                yield e
            finally:
                await ctl.stop()
        assert ctl.errors == 0


@pytest.mark.anyio
async def test_creates_a_named_annotated_owned_job_per_schedule(env: Env) -> None:
    await env.create("tick")
    env.at(12, 4, 59)
    await env.settle()
    assert env.jobs("tick") == []
    env.at(12, 5, 1)
    jobs = await env.until(lambda: env.jobs("tick"), "the 12:05 job")
    job = await env.batch.read_namespaced_job(jobs[0]["metadata"]["name"], NS)
    assert job.metadata.name == f"tick-{minutes(12, 5)}" == job_name("tick", T0.replace(minute=5, second=0))
    assert job.metadata.annotations == {"team": "a", SCHEDULED_ANNOTATION: "2026-03-01T12:05:00Z"}
    assert job.metadata.labels["cron"] == "tick"
    ref = job.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.controller, ref.block_owner_deletion) == ("CronJob", "tick", True, True)
    cj = await env.until(lambda: env.status("tick").get("active") and env.status("tick"), "active")
    assert [a["name"] for a in cj["active"]] == [job.metadata.name]
    assert cj["active"][0]["uid"] == job.metadata.uid and cj["active"][0]["kind"] == "Job"
    assert cj["lastScheduleTime"] == "2026-03-01T12:05:00Z"
    env.at(12, 10, 1)  # Allow: a second run while the first is active
    await env.until(lambda: len(env.status("tick").get("active") or []) == 2, "two active")
    env.at(12, 11)
    await env.finish(job.metadata.name)
    await env.until(lambda: len(env.status("tick").get("active") or []) == 1, "the finished job left active")
    assert env.status("tick")["lastSuccessfulTime"] == "2026-03-01T12:11:00Z"
    await env.until(lambda: "SawCompletedJob" in env.events("tick"), "SawCompletedJob")
    assert env.events("tick").count("SuccessfulCreate") == 2
    out = await env.kubectl("get", "cronjob", "tick", "--no-headers")
    assert out.split()[:5] == ["tick", "*/5", "*", "*", "*"]


@pytest.mark.anyio
async def test_forbid_skips_while_active_then_starts_the_missed_run(env: Env) -> None:
    await env.create("solo", concurrencyPolicy="Forbid")
    env.at(12, 5, 1)
    first = (await env.until(lambda: env.jobs("solo"), "first job"))[0]["metadata"]["name"]
    env.at(12, 10, 1)
    await env.until(lambda: "JobAlreadyActive" in env.events("solo"), "JobAlreadyActive")
    assert len(env.jobs("solo")) == 1
    env.at(12, 12)
    await env.finish(first)
    jobs = await env.until(lambda: len(env.jobs("solo")) == 2 and env.jobs("solo"), "the 12:10 run, late")
    assert jobs[1]["metadata"]["name"] == f"solo-{minutes(12, 10)}"
    assert env.status("solo")["lastScheduleTime"] == "2026-03-01T12:10:00Z"


@pytest.mark.anyio
async def test_replace_deletes_the_running_job(env: Env) -> None:
    await env.create("swap", concurrencyPolicy="Replace")
    env.at(12, 5, 1)
    old = (await env.until(lambda: env.jobs("swap"), "first job"))[0]["metadata"]["name"]
    env.at(12, 10, 1)
    await env.until(lambda: [j["metadata"]["name"] for j in env.jobs("swap")] == [f"swap-{minutes(12, 10)}"],
                    "replaced")
    assert [a["name"] for a in env.status("swap")["active"]] == [f"swap-{minutes(12, 10)}"]
    assert old != f"swap-{minutes(12, 10)}"
    await env.until(lambda: "SuccessfulDelete" in env.events("swap"), "SuccessfulDelete")


@pytest.mark.anyio
async def test_starting_deadline_and_suspend(env: Env) -> None:
    await env.create("late", startingDeadlineSeconds=30)
    env.at(12, 6)  # a minute after 12:05: too late to start it
    await env.settle()
    assert env.jobs("late") == []
    env.at(12, 10, 5)
    await env.until(lambda: [j["metadata"]["name"] for j in env.jobs("late")] == [f"late-{minutes(12, 10)}"],
                    "the 12:10 run")
    await env.create("paused", suspend=True)
    env.at(12, 15, 1)
    await env.settle()
    assert env.jobs("paused") == []
    await env.merge_patch("patch_namespaced_cron_job", "paused", {"spec": {"suspend": False}})
    await env.until(lambda: [j["metadata"]["name"] for j in env.jobs("paused")] == [f"paused-{minutes(12, 15)}"],
                    "the missed run starts on resume")


@pytest.mark.anyio
async def test_history_limits_keep_the_newest_finished_jobs(env: Env) -> None:
    await env.create("hist", successfulJobsHistoryLimit=2, failedJobsHistoryLimit=1)
    for i, outcome in enumerate(["Complete", "Complete", "Failed", "Complete", "Failed"]):
        env.at(12, 5 * (i + 1), 1)
        name = f"hist-{minutes(12, 5 * (i + 1))}"
        await env.until(env.has_job("hist", name), name)
        await env.finish(name, outcome)
        await env.until(lambda: not env.active("hist"), "nothing active")
    await env.until(lambda: len(env.jobs("hist")) == 3, "three kept")
    kept = [j["metadata"]["name"] for j in env.jobs("hist")]
    assert kept == [f"hist-{minutes(12, m)}" for m in (10, 20, 25)]


@pytest.mark.anyio
async def test_time_zone_sets_the_schedule_and_the_annotation(env: Env) -> None:
    await env.create("berlin", schedule="0 13 * * *", timeZone="Europe/Berlin")
    env.at(12, 59)
    await env.settle()
    assert env.jobs("berlin") == []  # 13:00 in Berlin is 12:00 UTC: that was before creation
    env.now = datetime(2026, 3, 2, 12, 0, 1, tzinfo=UTC)
    jobs = await env.until(lambda: env.jobs("berlin"), "the Berlin 13:00 run")
    assert jobs[0]["metadata"]["annotations"][SCHEDULED_ANNOTATION] == "2026-03-02T13:00:00+01:00"


@pytest.mark.anyio
async def test_kubectl_create_job_from_cronjob(env: Env) -> None:
    await env.create("tick")
    await env.kubectl("create", "job", "--from=cronjob/tick", "tick-manual")
    job = await env.batch.read_namespaced_job("tick-manual", NS)
    assert job.metadata.annotations["cronjob.kubernetes.io/instantiate"] == "manual"
    assert job.metadata.owner_references[0].kind == "CronJob" and job.metadata.owner_references[0].name == "tick"
    await env.until(lambda: "UnexpectedJob" in env.events("tick"), "UnexpectedJob")  # not one it scheduled
    assert "active" not in env.status("tick")
    env.at(12, 2)
    await env.finish("tick-manual")
    await env.until(lambda: env.status("tick").get("lastSuccessfulTime") == "2026-03-01T12:02:00Z",
                    "its success is recorded")

"""The Job controller: pod creation and replacement, completion modes, failure, suspension, TTL, finalizers."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from waiting import two_passes, until_holds

from gpuops_sim.apiserver import APIServer
from gpuops_sim.cluster.access import EVENTS, JOBS, PODS, ClusterAccess
from gpuops_sim.cluster.jobs import (
    INDEX,
    TRACKING,
    JobController,
    JobOptions,
    format_indexes,
    merge_diff,
    parse_indexes,
)

NS = "default"
KUBECTL = shutil.which("kubectl", path=str(Path(os.__file__).parents[3] / "bin")) or shutil.which("kubectl")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Env:
    """An in-process emulator with the Job controller running and an admin handle to drive pods."""

    def __init__(self, server: APIServer, ctl: JobController) -> None:
        self.server = server
        self.ctl = ctl
        self.admin = ClusterAccess(server, "admin", component="test")

    def job(self, name: str) -> dict[str, Any] | None:
        return self.admin.get(JOBS, NS, name)

    def status(self, name: str) -> dict[str, Any]:
        job = self.job(name)
        assert job is not None
        return dict(job.get("status") or {})

    def pods(self, job: str, *, active: bool = False) -> list[dict[str, Any]]:
        out = [p for p in self.admin.iter(PODS, NS) if (p["metadata"].get("labels") or {}).get("job-name") == job]
        if active:
            out = [p for p in out if p["status"].get("phase") not in ("Succeeded", "Failed")
                   and not p["metadata"].get("deletionTimestamp")]
        return sorted(out, key=lambda p: p["metadata"]["name"])

    def conditions(self, name: str) -> list[tuple[str, str, str]]:
        return [(c["type"], c["status"], c.get("reason", "")) for c in self.status(name).get("conditions") or []]

    def events(self, name: str) -> list[str]:
        return [e["reason"] for e in self.admin.iter(EVENTS, NS) if e["involvedObject"]["name"] == name]

    async def create(self, name: str, **spec: Any) -> dict[str, Any]:
        body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                "spec": {"template": {"spec": {"restartPolicy": "Never",
                                               "containers": [{"name": "main", "image": "busybox"}]}}, **spec}}
        return await self.admin.create(JOBS, NS, body)

    async def patch_spec(self, name: str, **spec: Any) -> None:
        await self.admin.patch(JOBS, NS, name, {"spec": spec})

    async def phase(self, pod: dict[str, Any], phase: str) -> None:
        await self.admin.patch(PODS, NS, pod["metadata"]["name"], {"status": {"phase": phase}}, subresource="status")

    def has(self, name: str, key: str, value: Any) -> Callable[[], bool]:
        return lambda: self.status(name).get(key) == value

    async def until(self, pred: Callable[[], Any], what: str, limit_s: float = 5.0) -> Any:
        return await until_holds(what, pred, limit_s)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with APIServer() as server:
        ctl = JobController(server, JobOptions(ttl_check_seconds=0.05, backoff_base_seconds=0.0))
        ctl.start()
        try:
            yield Env(server, ctl)
        finally:
            await ctl.stop()
            assert ctl.errors == 0


def _finished(env: Env, name: str) -> bool:
    return any(t in ("Complete", "Failed") and s == "True" for t, s, _ in env.conditions(name))


# ------------------------------------------------------------------------------------------ pure helpers


def test_completed_indexes_round_trip() -> None:
    assert format_indexes({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert parse_indexes("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert format_indexes(set()) == "" and parse_indexes("") == set()


def test_merge_diff_deletes_nested_keys_and_replaces_lists() -> None:
    old = {"a": 1, "u": {"failed": ["x"]}, "c": [1]}
    new = {"a": 1, "u": {}, "c": [1, 2], "d": 3}
    assert merge_diff(old, new) == {"u": {"failed": None}, "c": [1, 2], "d": 3}


# ------------------------------------------------------------------------------------------ behaviour


@pytest.mark.anyio
async def test_parallelism_two_completions_four_replaces_as_pods_succeed(env: Env) -> None:
    job = await env.create("work", parallelism=2, completions=4)
    uid = job["metadata"]["uid"]
    pods = await env.until(lambda: len(env.pods("work")) == 2 and env.pods("work"), "two pods")
    for p in pods:
        meta = p["metadata"]
        assert meta["name"].startswith("work-") and meta["generateName"] == "work-"
        assert meta["labels"]["batch.kubernetes.io/controller-uid"] == uid
        assert meta["labels"]["job-name"] == "work"
        assert meta["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": "work", "uid": uid,
                                            "controller": True, "blockOwnerDeletion": True}]
        assert TRACKING in meta["finalizers"]
    st = await env.until(lambda: env.status("work").get("active") == 2 and env.status("work"), "active 2")
    assert st["ready"] == 0 and st["terminating"] == 0 and st["startTime"]
    assert st["uncountedTerminatedPods"] == {}

    max_active = 0
    succeeded = 0
    while succeeded < 4:
        active = env.pods("work", active=True)
        max_active = max(max_active, len(active))
        assert active, "the controller keeps pods running until four succeeded"
        await env.phase(active[0], "Succeeded")
        succeeded += 1
        await env.until(env.has("work", "succeeded", succeeded), f"succeeded {succeeded}")
        # the finalizer goes only once the pod is counted
        done = [p for p in env.pods("work") if p["status"]["phase"] == "Succeeded"]
        assert all(TRACKING not in (p["metadata"].get("finalizers") or []) for p in done)
    assert max_active <= 2
    await env.until(lambda: _finished(env, "work"), "Complete")
    st = env.status("work")
    assert [(t, s, r) for t, s, r in env.conditions("work")] == [
        ("SuccessCriteriaMet", "True", "CompletionsReached"), ("Complete", "True", "CompletionsReached")]
    assert st["succeeded"] == 4 and "failed" not in st and "active" not in st
    assert st["completionTime"] >= st["startTime"] and st["ready"] == 0 and st["terminating"] == 0
    assert len(env.pods("work")) == 4  # completed pods stay, without finalizers
    assert all(not p["metadata"].get("finalizers") for p in env.pods("work"))
    await env.until(lambda: env.events("work").count("SuccessfulCreate") == 4 and "Completed" in env.events("work"),
                    "events")


@pytest.mark.anyio
async def test_indexed_job_gives_each_index_one_success(env: Env) -> None:
    await env.create("idx", parallelism=3, completions=3, completionMode="Indexed")
    pods = await env.until(lambda: len(env.pods("idx")) == 3 and env.pods("idx"), "three pods")
    by_index = {int(p["metadata"]["annotations"][INDEX]): p for p in pods}
    assert set(by_index) == {0, 1, 2}
    for i, p in by_index.items():
        assert p["metadata"]["labels"][INDEX] == str(i)
        assert p["metadata"]["generateName"] == f"idx-{i}-"
        assert p["spec"]["hostname"] == f"idx-{i}"
        env_vars = {e["name"]: e for e in p["spec"]["containers"][0]["env"]}
        assert "JOB_COMPLETION_INDEX" in env_vars
    await env.phase(by_index[1], "Failed")  # index 1 is retried
    await env.until(lambda: env.status("idx").get("failed") == 1, "failed 1")
    retry = await env.until(
        lambda: [p for p in env.pods("idx", active=True) if p["metadata"]["annotations"][INDEX] == "1"], "retry of 1")
    await env.phase(by_index[0], "Succeeded")
    await env.phase(by_index[2], "Succeeded")
    await env.until(lambda: env.status("idx").get("completedIndexes") == "0,2", "completedIndexes 0,2")
    assert env.status("idx")["succeeded"] == 2
    assert len(env.pods("idx", active=True)) == 1  # no new pods for completed indexes
    await env.phase(retry[0], "Succeeded")
    await env.until(lambda: _finished(env, "idx"), "Complete")
    st = env.status("idx")
    assert st["completedIndexes"] == "0-2" and st["succeeded"] == 3 and st["failed"] == 1
    assert env.conditions("idx")[-1] == ("Complete", "True", "CompletionsReached")


@pytest.mark.anyio
async def test_backoff_limit_exceeded_fails_the_job_and_terminates_active_pods(env: Env) -> None:
    await env.create("bad", parallelism=2, completions=4, backoffLimit=1)
    pods = await env.until(lambda: len(env.pods("bad", active=True)) == 2 and env.pods("bad", active=True), "pods")
    await env.phase(pods[0], "Failed")  # 1 failure: within the limit, replaced
    await env.until(lambda: env.status("bad").get("failed") == 1 and len(env.pods("bad", active=True)) == 2,
                    "replacement")
    active = env.pods("bad", active=True)
    await env.phase(active[0], "Failed")  # 2 failures > backoffLimit 1
    await env.until(lambda: _finished(env, "bad"), "Failed")
    assert env.conditions("bad") == [("FailureTarget", "True", "BackoffLimitExceeded"),
                                     ("Failed", "True", "BackoffLimitExceeded")]
    st = env.status("bad")
    assert st["failed"] == 3  # the terminated still-active pod counts as a failure too
    assert "active" not in st and st["terminating"] == 0 and "completionTime" not in st
    assert env.pods("bad", active=True) == []
    assert all(not p["metadata"].get("finalizers") for p in env.pods("bad"))
    await env.until(lambda: "BackoffLimitExceeded" in env.events("bad"), "warning event")
    assert "SuccessfulDelete" in env.events("bad")


@pytest.mark.anyio
async def test_active_deadline_fails_with_deadline_exceeded(env: Env) -> None:
    await env.create("slow", activeDeadlineSeconds=1)
    await env.until(lambda: env.pods("slow", active=True), "pod")
    await env.until(lambda: _finished(env, "slow"), "deadline", limit_s=4)
    assert env.conditions("slow")[-1] == ("Failed", "True", "DeadlineExceeded")
    assert env.pods("slow", active=True) == []


@pytest.mark.anyio
async def test_suspend_deletes_active_pods_and_resume_recreates_them(env: Env) -> None:
    clock = [datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)]
    env.server.api.clock = lambda: clock[0]
    await env.create("sus", parallelism=2, completions=5)
    await env.until(lambda: len(env.pods("sus")) == 2, "two pods")
    started = env.status("sus")["startTime"]
    clock[0] += timedelta(minutes=1)
    await env.patch_spec("sus", suspend=True)
    await env.until(lambda: not env.pods("sus"), "pods deleted")
    st = await env.until(lambda: ("Suspended", "True", "JobSuspended") in env.conditions("sus") and env.status("sus"),
                         "Suspended")
    assert "active" not in st and "failed" not in st  # suspension is not a failure
    assert st["startTime"] == started
    clock[0] += timedelta(minutes=1)
    await env.patch_spec("sus", suspend=False)
    await env.until(lambda: len(env.pods("sus", active=True)) == 2, "pods recreated")
    await env.until(lambda: ("Suspended", "False", "JobResumed") in env.conditions("sus"), "Resumed")
    assert env.status("sus")["startTime"] > started  # activeDeadlineSeconds restarts on resume
    events = env.events("sus")
    await env.until(lambda: "Resumed" in env.events("sus"), "Resumed event")
    assert "Suspended" in events and "SuccessfulDelete" in events


@pytest.mark.anyio
async def test_created_suspended_job_starts_nothing(env: Env) -> None:
    await env.create("later", suspend=True)
    await env.until(lambda: ("Suspended", "True", "JobSuspended") in env.conditions("later"), "Suspended")
    assert env.pods("later") == [] and "startTime" not in env.status("later")
    await env.patch_spec("later", suspend=False)
    await env.until(lambda: env.pods("later"), "pod")
    assert env.status("later")["startTime"]


@pytest.mark.anyio
async def test_ttl_after_finished_deletes_the_job_and_gc_removes_its_pods(env: Env) -> None:
    await env.create("ttl0", ttlSecondsAfterFinished=0)
    pod = (await env.until(lambda: env.pods("ttl0"), "pod"))[0]
    await env.phase(pod, "Succeeded")
    await env.until(lambda: env.job("ttl0") is None, "job deleted")
    await env.until(lambda: not env.pods("ttl0"), "pods garbage-collected")


@pytest.mark.anyio
async def test_ttl_waits_for_its_time(env: Env) -> None:
    clock = [datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)]
    env.server.api.clock = lambda: clock[0]
    await env.create("ttl60", ttlSecondsAfterFinished=60)
    pod = (await env.until(lambda: env.pods("ttl60"), "pod"))[0]
    await env.phase(pod, "Failed")
    await env.create("ttl60b", ttlSecondsAfterFinished=60, backoffLimit=0)
    await env.until(lambda: env.pods("ttl60b"), "pod b")
    await env.phase(env.pods("ttl60b")[0], "Failed")
    await env.until(lambda: _finished(env, "ttl60b"), "b failed")
    await two_passes(env.ctl)
    assert env.job("ttl60b") is not None  # 60 s have not passed on the API clock
    clock[0] += timedelta(seconds=61)
    await env.until(lambda: env.job("ttl60b") is None, "deleted after the ttl")
    await env.until(lambda: not env.pods("ttl60b"), "its pods garbage-collected")
    assert env.job("ttl60") is not None  # not finished (one failure is within backoffLimit 6)


@pytest.mark.anyio
async def test_work_queue_completes_once_any_pod_succeeded_and_none_is_active(env: Env) -> None:
    await env.create("queue", parallelism=3)
    pods = await env.until(lambda: len(env.pods("queue")) == 3 and env.pods("queue"), "three pods")
    await env.phase(pods[0], "Succeeded")
    await env.until(lambda: env.status("queue").get("succeeded") == 1, "one success")
    await two_passes(env.ctl)
    assert len(env.pods("queue")) == 3  # no new pods after a success
    assert not _finished(env, "queue")
    await env.phase(pods[1], "Succeeded")
    await env.phase(pods[2], "Succeeded")
    await env.until(lambda: _finished(env, "queue"), "Complete")
    assert env.status("queue")["succeeded"] == 3


@pytest.mark.anyio
async def test_deleted_pods_are_replaced_and_counted_as_failed(env: Env) -> None:
    await env.create("del", parallelism=2, completions=2)
    pods = await env.until(lambda: len(env.pods("del")) == 2 and env.pods("del"), "two pods")
    await env.admin.delete(PODS, NS, pods[0]["metadata"]["name"])  # e.g. kubectl delete pod
    await env.until(lambda: env.admin.get(PODS, NS, pods[0]["metadata"]["name"]) is None, "deleted pod gone")
    await env.until(lambda: len(env.pods("del", active=True)) == 2, "replacement")
    assert env.status("del")["failed"] == 1
    # A pod that vanishes without the controller seeing it finish (finalizer stripped by someone) is just replaced.
    victim = env.pods("del", active=True)[0]["metadata"]["name"]
    await env.admin.patch(PODS, NS, victim, {"metadata": {"finalizers": None}})
    await env.admin.delete(PODS, NS, victim)
    await env.until(lambda: len(env.pods("del", active=True)) == 2 and victim not in
                    [p["metadata"]["name"] for p in env.pods("del")], "second replacement")
    assert env.status("del")["failed"] == 1
    assert env.ctl.pods_created == 4


@pytest.mark.anyio
async def test_bound_terminating_pod_is_replaced_and_shown_as_terminating(env: Env) -> None:
    await env.create("graceful", parallelism=1, completions=1)
    pod = (await env.until(lambda: env.pods("graceful"), "pod"))[0]
    name = pod["metadata"]["name"]
    await env.admin.bind(NS, name, "node-a")
    await env.admin.patch(PODS, NS, name, {"status": {"phase": "Running"}}, subresource="status")
    await env.admin.delete(PODS, NS, name)  # graceful: the kubelet would finish it
    await env.until(lambda: len(env.pods("graceful", active=True)) == 1, "replacement while terminating")
    st = await env.until(lambda: env.status("graceful").get("terminating") == 1 and env.status("graceful"),
                         "terminating 1")
    assert st["active"] == 1
    old = env.admin.get(PODS, NS, name)
    assert old is not None and TRACKING in old["metadata"]["finalizers"]  # held until terminal
    await env.admin.patch(PODS, NS, name, {"status": {"phase": "Failed"}}, subresource="status")
    await env.until(lambda: env.status("graceful").get("failed") == 1 and env.status("graceful")["terminating"] == 0,
                    "counted")
    gone = env.admin.get(PODS, NS, name)
    assert gone is None or TRACKING not in (gone["metadata"].get("finalizers") or [])


@pytest.mark.anyio
async def test_scale_down_deletes_pods_without_counting_failures(env: Env) -> None:
    await env.create("scale", parallelism=3, completions=10)
    await env.until(lambda: len(env.pods("scale", active=True)) == 3, "three pods")
    await env.patch_spec("scale", parallelism=1)
    await env.until(lambda: len(env.pods("scale")) == 1, "scaled down")
    await env.until(lambda: env.status("scale").get("active") == 1, "status active 1")
    assert "failed" not in env.status("scale")


@pytest.mark.anyio
async def test_orphaned_pods_lose_the_finalizer_when_the_job_is_deleted(env: Env) -> None:
    await env.create("gone", parallelism=2, completions=2)
    pods = await env.until(lambda: len(env.pods("gone")) == 2 and env.pods("gone"), "two pods")
    await env.admin.delete(JOBS, NS, "gone", propagation="Orphan")
    await env.until(lambda: env.job("gone") is None, "job gone")
    await env.until(lambda: all(not (env.admin.get(PODS, NS, p["metadata"]["name"]) or {"metadata": {}})
                                ["metadata"].get("finalizers") for p in pods), "finalizers released")


@pytest.mark.anyio
async def test_no_duplicate_pods_under_concurrent_wakeups(env: Env) -> None:
    await env.create("many", parallelism=50, completions=200)
    await env.until(lambda: len(env.pods("many")) == 50, "fifty pods")
    for _ in range(5):  # spurious wake-ups (two_passes wakes the controller) must not create more
        await two_passes(env.ctl)
    assert len(env.pods("many")) == 50
    t0 = time.perf_counter()
    done = 0
    while done < 200:
        active = env.pods("many", active=True)
        assert len(active) <= 50
        for p in active:
            await env.phase(p, "Succeeded")
        done += len(active)
        await env.until(env.has("many", "succeeded", done), f"{done} succeeded", limit_s=10)
    await env.until(lambda: _finished(env, "many"), "Complete")
    elapsed = time.perf_counter() - t0
    assert len(env.pods("many")) == 200 and env.status("many")["succeeded"] == 200
    print(f"200 pod completions through the Job controller in {elapsed:.3f}s")


@pytest.mark.anyio
async def test_kubectl_sees_consistent_status(env: Env, tmp_path: Path) -> None:
    await env.create("pi", parallelism=2, completions=3)
    for _ in range(3):
        active = await env.until(lambda: env.pods("pi", active=True), "an active pod")
        await env.phase(active[0], "Succeeded")
    await env.until(lambda: _finished(env, "pi"), "Complete")
    cfg = tmp_path / "kubeconfig"
    env.server.write_kubeconfig(cfg)

    async def kubectl(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(str(KUBECTL), f"--kubeconfig={cfg}", *args,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode()

    job = json.loads(await kubectl("get", "job", "pi", "-o", "json"))
    st = job["status"]
    assert st["succeeded"] == 3 and st["ready"] == 0 and st["terminating"] == 0
    assert st["uncountedTerminatedPods"] == {} and "active" not in st
    assert [c["type"] for c in st["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    described = await kubectl("describe", "job", "pi")
    assert "0 Active (0 Ready) / 3 Succeeded / 0 Failed" in described
    assert "Completed At:" in described and "SuccessfulCreate" in described
    pods = json.loads(await kubectl("get", "pods", "-l", "job-name=pi", "-o", "json"))["items"]
    assert len(pods) == 3 and all(p["status"]["phase"] == "Succeeded" for p in pods)


@pytest.mark.anyio
async def test_on_failure_restarts_count_towards_the_backoff_limit(env: Env) -> None:
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "restarts"},
            "spec": {"backoffLimit": 2, "template": {"spec": {"restartPolicy": "OnFailure",
                                                               "containers": [{"name": "main", "image": "busybox"}]}}}}
    await env.admin.create(JOBS, NS, body)
    pod = (await env.until(lambda: env.pods("restarts"), "pod"))[0]
    await env.admin.patch(PODS, NS, pod["metadata"]["name"], {"status": {"phase": "Running", "containerStatuses": [
        {"name": "main", "image": "busybox", "imageID": "", "ready": False, "restartCount": 2,
         "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {}}]}}, subresource="status")
    await env.until(lambda: _finished(env, "restarts"), "Failed")
    assert env.conditions("restarts")[-1] == ("Failed", "True", "BackoffLimitExceeded")
    assert env.pods("restarts", active=True) == []


@pytest.mark.anyio
async def test_replacements_after_failures_back_off_exponentially() -> None:
    async with APIServer() as server:
        ctl = JobController(server, JobOptions(events=False, backoff_base_seconds=0.2))
        ctl.start()
        env = Env(server, ctl)
        try:
            await env.create("flaky", backoffLimit=5)
            pod = (await env.until(lambda: env.pods("flaky"), "pod"))[0]
            t0 = time.monotonic()
            await env.phase(pod, "Failed")
            await env.until(lambda: env.pods("flaky", active=True), "first replacement")
            first = time.monotonic() - t0
            t1 = time.monotonic()
            await env.phase(env.pods("flaky", active=True)[0], "Failed")
            await env.until(lambda: env.pods("flaky", active=True), "second replacement")
            second = time.monotonic() - t1
            assert 0.18 <= first < 0.35 and 0.38 <= second < 0.6, (first, second)  # 0.2 s, then 0.4 s
            assert env.events("flaky") == []  # events=False
        finally:
            await ctl.stop()


@pytest.mark.anyio
async def test_generated_name_collision_is_retried(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    await env.admin.create(PODS, NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "coll-aaaaa"},
                                      "spec": {"containers": [{"name": "m", "image": "x"}]}})
    suffixes = iter(["aaaaa", "bbbbb"])
    monkeypatch.setattr(random, "choices", lambda *a, **k: list(next(suffixes, "ccccc")))
    await env.create("coll")
    await env.until(lambda: env.pods("coll"), "pod created after a collision")
    assert [p["metadata"]["name"] for p in env.pods("coll")] == ["coll-bbbbb"]
    assert "FailedCreate" not in env.events("coll")

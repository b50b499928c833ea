"""The Evict action's own arithmetic, one path at a time, against the emulated API server's eviction subresource.

The enforcer is driven by hand (its caches are informers that are never started; the targets are fresh copies
read from the server) with a clock the test sets, so every figure it derives can be asserted exactly: which pods
each batch takes and when the next batch is due, the backoff of a refused eviction (a PodDisruptionBudget's 429,
an injected 500, a throttling 429 with Retry-After), the Degraded reason and message, the Events and the last
enforcement it reports, and where a pod evicted without grace ends if it leaves the API still running (the middle
of the eviction request). Events are captured at `record` (the enforcer's call), not read back from the server:
what the server does with an Event is not what these tests are about.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from budget_harness import NS, Env, S, budget, environment, pod
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from gpuops.controllers.budget.api import GPUWorkloadBudget, LastEnforcement, format_time, parse_spec
from gpuops.controllers.budget.enforcement import EnforcementOptions, Enforcer, Outcome, Situation, Target
from gpuops.controllers.budget.setup import COMPONENT
from gpuops.kube.errors import NotFound
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import Informer
from gpuops.kube.resources import JOBS, PDBS, PODS
from gpuops_sim.apiserver.auth import Decision

pytestmark = pytest.mark.anyio
T0 = 10_000 * S


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Recorder(EventRecorder):
    """Keeps each Event the enforcer records, as (object name, type, reason, message)."""

    def __init__(self, env: Env) -> None:
        super().__init__(env.client, COMPONENT)
        self.seen: list[tuple[str, str, str, str]] = []

    def record(self, regarding: Any, type: Any, reason: str, message: str, **_: Any) -> None:  # type: ignore[override]
        self.seen.append((regarding.metadata.name, type, reason, message))


@dataclass
class Rig:
    env: Env
    enforcer: Enforcer
    recorder: Recorder
    budget: GPUWorkloadBudget
    clock: list[int]
    evictions: list[str] = field(default_factory=list)
    stops: list[tuple[str, str, int | None]] = field(default_factory=list)

    async def targets(self, usage: dict[str, int]) -> list[Target]:
        """Fresh copies of the pods named, ranked as `apply` ranks them (largest usage first, then name)."""
        out = []
        for name, gpu_seconds in usage.items():
            try:
                p = await self.env.client.get(PODS, name, NS)
            except NotFound:
                continue  # evicted and gone
            out.append(Target(pod=p, usage=Fraction(gpu_seconds, 3600), running=True, final=False))
        return sorted(out, key=lambda t: (-t.usage, t.pod.metadata.name))

    async def evict(self, at: float, targets: list[Target], of: GPUWorkloadBudget | None = None) -> Outcome:
        """One `_evict` of budget `of` (default: guard) at `at` seconds."""
        self.clock[0] = round(at * S)
        sit = Situation(now=round(at * S), over=True, due=True, consumed=Fraction(9, 3600), quota=Fraction(1, 3600),
                        during="in the last 24h")
        out = Outcome()
        of = of or self.budget
        await self.enforcer._evict(of, parse_spec(of.spec), sit, targets, out)
        return out


@asynccontextmanager
async def rig(tmp_path: Path, names: list[str], options: EnforcementOptions, *, grace: int | None = None,
              labels: dict[str, str] | None = None, pod_grace: int = 0) -> AsyncIterator[Rig]:
    """Budget `guard` (Evict; `grace`: its evictionGracePeriodSeconds) and running 1-GPU pods `names` with
    terminationGracePeriodSeconds `pod_grace`."""
    async with environment(tmp_path) as env:
        body = budget("guard", "0.000277", action="Evict")
        if grace is not None:
            body["spec"]["enforcement"]["evictionGracePeriodSeconds"] = grace
        created = await env.create_budget(body)
        for name in names:
            body = pod(name, 1, labels=labels)
            body["spec"]["terminationGracePeriodSeconds"] = pod_grace
            await env.create_pod(body)

        async def running() -> bool:  # settled: a copy read now is still current when the enforcer acts on it
            return all([await env.phase(n) == "Running" for n in names])

        await env.until("the pods running", running)
        recorder = Recorder(env)
        clock = [T0]
        pods, jobs = Informer(env.client, PODS, namespace=NS), Informer(env.client, JOBS, namespace=NS)
        enforcer = Enforcer(env.client, pods, jobs, recorder, options, clock=lambda: clock[0])
        r = Rig(env, enforcer, recorder, created, clock)
        enforcer.on_stop = lambda key, uid, at: r.stops.append((key, uid, at))

        def audit(d: Decision) -> None:
            if d.attrs.subresource == "eviction" and d.attrs.verb == "create":
                r.evictions.append(d.attrs.name)

        env.cluster.server.audit_hooks.append(audit)
        yield r


def actions(result: str, budget: str = "guard") -> float:
    return REGISTRY.get_sample_value("gpuops_budget_enforcement_actions_total",
                                     {"namespace": NS, "name": budget, "action": "Evict", "result": result}) or 0.0


async def test_batches_take_the_largest_first_and_the_next_batch_waits_one_interval(tmp_path: Path) -> None:
    usage = {"p1": 50, "p2": 40, "p3": 30, "p4": 20, "p5": 10}
    opts = EnforcementOptions(evictions_per_batch=2, eviction_interval=2.5)
    async with rig(tmp_path, list(usage), opts) as r:
        evicted = actions("Evicted")
        with capture_logs() as logs:
            out = await r.evict(10_000, await r.targets(usage))
        assert r.evictions == ["p1", "p2"]
        assert out.wake_at == 10_002_500_000  # one interval after the batch
        said = ("evicted pod p2 (0.011111 GPU-hours in the window): budget over quota (0.002500 of 0.000278 "
                "GPU-hours); its usage keeps counting")
        assert out.last == LastEnforcement(action="Evict", pod="p2", time=format_time(10_000 * S), result="Evicted",
                                           message=said)
        assert out.degraded is None
        assert [(e["event"], e["log_level"], e.get("pod"), e.get("usage_gpu_hours")) for e in logs] == [
            ("evicted pod", "info", f"{NS}/p1", "0.013889"), ("evicted pod", "info", f"{NS}/p2", "0.011111")]
        # inside the interval: nothing is sent, and the wake-up stays at the batch's end
        out = await r.evict(10_001, await r.targets(usage))
        assert r.evictions == ["p1", "p2"] and out.wake_at == 10_002_500_000 and out.last is None
        # p1 and p2 now carry a deletionTimestamp (their grace runs): they are not evicted again
        out = await r.evict(10_002.5, await r.targets(usage))
        assert r.evictions == ["p1", "p2", "p3", "p4"] and out.wake_at == 10_005_000_000
        out = await r.evict(10_005, await r.targets(usage))
        assert r.evictions == ["p1", "p2", "p3", "p4", "p5"]
        assert out.wake_at is None  # nothing left: no wake-up asked for
        assert actions("Evicted") - evicted == 5
        # no evictionGracePeriodSeconds: the pods' own grace (0) applies, so each stopped as its eviction was sent
        assert [at for _, _, at in r.stops] == [10_000 * S, 10_000 * S, 10_002_500_000, 10_002_500_000, 10_005 * S]
        evented = [(name, kind, reason) for name, kind, reason, _ in r.recorder.seen]
        mine = r.budget.metadata.name
        assert evented == [e for p in ("p1", "p2", "p3", "p4", "p5")
                           for e in ((mine, "Warning", "Evicted"), (p, "Warning", "EvictedByBudget"))]
        assert r.recorder.seen[1][3] == f"evicted by GPUWorkloadBudget {mine}: the budget is over quota"
        first = r.recorder.seen[0][3]
        assert first == ("evicted pod p1 (0.013889 GPU-hours in the window): budget over quota (0.002500 of "
                         "0.000278 GPU-hours); its usage keeps counting"), first


async def test_each_budget_paces_its_own_evictions(tmp_path: Path) -> None:
    opts = EnforcementOptions(evictions_per_batch=1, eviction_interval=5.0)
    async with rig(tmp_path, ["p1", "p2"], opts) as r:
        other = await r.env.create_budget(budget("other", "0.000277", action="Evict"))
        out = await r.evict(10_000, await r.targets({"p1": 20}))
        assert r.evictions == ["p1"] and out.wake_at is None
        out = await r.evict(10_001, await r.targets({"p2": 10}), of=other)  # guard's batch does not hold it back
        assert r.evictions == ["p1", "p2"] and out.last is not None and out.last.pod == "p2"


async def test_a_pdb_refusal_backs_off_exponentially_and_is_retried_exactly_when_due(tmp_path: Path) -> None:
    opts = EnforcementOptions(evictions_per_batch=3, eviction_interval=1.0, eviction_backoff_base=4.0,
                              eviction_backoff_max=30.0)
    async with rig(tmp_path, ["held"], opts, labels={"app": "held"}) as r:
        await r.env.client.create(PDBS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}}}, NS)

        async def guarded() -> bool:  # a PDB not yet observed refuses too, but with another message
            stored = r.env.cluster.server.store.get(("policy", "poddisruptionbudgets"), NS, "keep")
            healthy = (stored.obj.get("status") or {}).get("currentHealthy") if stored is not None else None
            return healthy == 1

        await r.env.until("held counted healthy by its PDB", guarded)
        blocked = actions("Blocked")
        usage = {"held": 30}
        with capture_logs() as logs:
            out = await r.evict(10_000, await r.targets(usage))
        assert r.evictions == ["held"]
        (logged,) = logs
        assert {k: v for k, v in logged.items() if k != "error"} == {
            "event": "eviction refused", "log_level": "warning", "pod": f"{NS}/held", "reason": "EvictionBlocked",
            "attempt": 1, "retry_in": 10.0}
        assert "429" in logged["error"] and "disruption budget" in logged["error"]
        # the server's Retry-After (10 s) is a floor under the backoff (4 s, then 8 s), which doubles up to its cap
        message = ("eviction of pod held refused (a PodDisruptionBudget allows no disruption now); attempt 1, next "
                   "try in 10s")
        assert out.degraded == ("EvictionBlocked", f"1 pod(s) could not be evicted: {message}")
        assert out.last == LastEnforcement(action="Evict", pod="held", time=format_time(10_000 * S),
                                           result="Blocked", message=message)
        assert out.wake_at == 10_010 * S
        assert r.recorder.seen == [(r.budget.metadata.name, "Warning", "EvictionBlocked", message)]
        assert actions("Blocked") - blocked == 1
        # one microsecond early: not retried, still Degraded, still due at the same instant
        out = await r.evict(10_010 - 1e-6, await r.targets(usage))
        assert r.evictions == ["held"] and out.wake_at == 10_010 * S and out.degraded is not None
        assert out.last is None
        for attempt, at, delay in ((2, 10_010, 10), (3, 10_020, 16), (4, 10_036, 30)):  # exactly when due
            out = await r.evict(at, await r.targets(usage))
            assert r.evictions == ["held"] * attempt and out.wake_at == (at + delay) * S, (attempt, out)
            assert out.degraded is not None and f"attempt {attempt}, next try in {delay}s" in out.degraded[1]
        assert actions("Blocked") - blocked == 4
        # the pod no longer runs (finished, or gone): nothing is blocked any more, and Degraded clears
        out = await r.evict(10_040, [])
        assert out.degraded is None and out.wake_at is None and r.evictions == ["held"] * 4


@pytest.mark.parametrize("pod_grace", [0, 30])  # stopped as sent (a refusal takes the stop back), or running on
async def test_a_failed_eviction_is_enforcement_failed_and_a_retry_after_is_honoured(tmp_path: Path,
                                                                                      pod_grace: int) -> None:
    opts = EnforcementOptions(evictions_per_batch=3, eviction_interval=1.0, error_retry=1.0, eviction_backoff_max=30.0,
                              eviction_backoff_base=3.0)  # not a PDB: the error retry applies, not this
    async with rig(tmp_path, ["a", "b", "c", "d"], opts, pod_grace=pod_grace) as r:
        usage = {"a": 40, "b": 30, "c": 20, "d": 10}
        faults = r.env.cluster.server.faults
        failed = actions("Error")
        rule = faults.add_error(500, verbs=["create"], resources=["pods"], count=1)
        throttle = faults.add_error(429, verbs=["create"], resources=["pods"], retry_after=7, count=1)
        out = await r.evict(10_000, await r.targets(usage))
        faults.rules.remove(rule)
        faults.rules.remove(throttle)
        assert r.evictions == ["a", "b", "c"]
        assert out.degraded is not None and out.degraded[0] == "EnforcementFailed"
        reasons = [reason for _, _, reason, _ in r.recorder.seen]
        assert reasons == ["EvictionFailed", "EvictionFailed", "Evicted", "EvictedByBudget"]
        first, second = r.recorder.seen[0][3], r.recorder.seen[1][3]
        assert first.startswith("eviction of pod a refused (500 InternalError: ") and first.endswith(
            "attempt 1, next try in 1s"), first
        assert second.startswith("eviction of pod b refused (429 TooManyRequests: ") and second.endswith(
            "attempt 1, next try in 7s"), second  # the server's Retry-After, above the 1 s retry
        # the sooner retry is named first; both are in the message, joined
        assert out.degraded[1] == f"2 pod(s) could not be evicted: {first}; {second}"
        assert actions("Error") - failed == 2
        # d waits for the next batch, the refused ones for their retries: the earliest is the batch at 10 001 s
        assert out.wake_at == 10_001 * S
        if pod_grace:  # nothing stopped as sent, so a refusal has no stop to take back
            assert r.stops == []
        out = await r.evict(10_001, await r.targets(usage))
        assert r.evictions == ["a", "b", "c", "d", "a"]  # fresh pods first, then the due retries
        assert out.degraded is not None and out.degraded[1].startswith("1 pod(s) could not be evicted: eviction of "
                                                                       "pod b refused (429")
        assert out.wake_at == 10_007 * S


async def test_a_pod_evicted_without_grace_ends_in_the_middle_of_the_eviction_request(tmp_path: Path) -> None:
    opts = EnforcementOptions(evictions_per_batch=2)
    async with rig(tmp_path, ["fast", "gone"], opts, grace=0, pod_grace=30) as r:  # the budget's grace wins
        targets = await r.targets({"fast": 20, "gone": 10})
        fast, gone = (t.pod.metadata.uid for t in targets)
        await r.env.client.delete(PODS, "gone", NS, grace_period_seconds=0)  # deleted meanwhile: its eviction 404s
        await r.env.until("gone is gone", lambda: r.env.pod_gone("gone"))
        ticks = iter([10_000 * S, 10_003 * S, 10_004 * S])
        r.enforcer.clock = lambda: next(ticks)  # sent and answered (fast); sent (gone), never answered
        out = await r.evict(10_000, targets)
        key = f"{NS}/{r.budget.metadata.name}"
        assert r.evictions == ["fast", "gone"]
        assert r.enforcer.stopped_at == {fast: 10_000 * S, gone: 10_004 * S}
        assert r.enforcer.answered_at == {fast: 10_003 * S}
        assert r.enforcer.vanished_end(fast) == 10_001_500_000  # the server stopped it inside the request
        assert r.enforcer.vanished_end(gone) == 10_004 * S  # no answer: no later than our request
        assert r.enforcer.vanished_end("never-evicted") is None
        assert r.stops == [(key, fast, 10_000 * S), (key, gone, 10_004 * S)]
        assert out.degraded is None and [reason for _, _, reason, _ in r.recorder.seen] == ["Evicted",
                                                                                           "EvictedByBudget"]
        r.enforcer.answered_at.pop(fast)  # an answer never received: the send instant is all there is
        assert r.enforcer.vanished_end(fast) == 10_000 * S
        r.enforcer.forget_stop(fast)
        r.enforcer.forget_stop(gone)  # stopped, never answered: forgetting what is not there is no error
        r.enforcer.forget_stop("never-evicted")
        assert r.enforcer.stopped_at == {} and r.enforcer.answered_at == {} and r.enforcer.vanished_end(fast) is None


async def test_a_refused_eviction_without_grace_takes_its_stop_back(tmp_path: Path) -> None:
    opts = EnforcementOptions(error_retry=1.0)
    async with rig(tmp_path, ["p"], opts, grace=0) as r:
        targets = await r.targets({"p": 10})
        uid = targets[0].pod.metadata.uid
        rule = r.env.cluster.server.faults.add_error(500, verbs=["create"], resources=["pods"], count=1)
        with capture_logs() as logs:
            out = await r.evict(10_000, targets)
        r.env.cluster.server.faults.rules.remove(rule)
        key = f"{NS}/{r.budget.metadata.name}"
        assert r.stops == [(key, uid, 10_000 * S), (key, uid, None)]  # it runs on, and counts on
        assert r.enforcer.stopped_at == {} and r.enforcer.answered_at == {}
        message = r.recorder.seen[0][3]
        assert out.last == LastEnforcement(action="Evict", pod="p", time=format_time(10_000 * S), result="Failed",
                                           message=message)
        assert [(e["event"], e["reason"], e["attempt"], e["retry_in"], "500" in e["error"]) for e in logs] == [
            ("eviction refused", "EvictionFailed", 1, 1.0, True)]
        # a stale copy (the pod changed since): the server's Conflict takes the stop back the same way
        await r.env.client.patch(PODS, "p", {"metadata": {"labels": {"changed": "yes"}}}, namespace=NS)
        with capture_logs() as logs:
            out = await r.evict(10_001, targets)
        assert [(e["event"], e["log_level"], e["pod"]) for e in logs] == [
            ("eviction skipped: the pod changed since the cached copy", "info", f"{NS}/p")]
        assert r.stops[2:] == [(key, uid, 10_001 * S), (key, uid, None)]
        assert r.enforcer.stopped_at == {} and out.degraded is not None  # still blocked from the 500 until retried


async def test_a_stale_copy_with_grace_is_skipped_with_no_stop_to_take_back(tmp_path: Path) -> None:
    """With a grace period nothing stops at send time, so a Conflict (the pod changed since the cached copy) or a
    refusal has no stop to take back: the pod is skipped, its usage untouched, and no error escapes."""
    async with rig(tmp_path, ["p"], EnforcementOptions(error_retry=1.0), pod_grace=30) as r:
        targets = await r.targets({"p": 10})
        await r.env.client.patch(PODS, "p", {"metadata": {"labels": {"changed": "yes"}}}, namespace=NS)
        with capture_logs() as logs:
            out = await r.evict(10_000, targets)
        assert [(e["event"], e["pod"]) for e in logs] == [
            ("eviction skipped: the pod changed since the cached copy", f"{NS}/p")]
        assert r.stops == [] and r.enforcer.stopped_at == {} and out.degraded is None and out.last is None

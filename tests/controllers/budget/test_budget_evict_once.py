"""A pod the Evict enforcement already stopped is not evicted again while the cache still shows it running.

Found by the all-controllers API chaos run: the first eviction was accepted (its stop recorded), the cache lagged,
a second eviction of the same pod got an injected 500, and the failure path erased the first eviction's stop, so
the pod counted on until the informer heard of its deletion (28 GPU-seconds over the truth). Here the emulated API
server answers the evictions (the first for real, later ones with its injected 500) and the enforcer's caches are
real informers that are never started: a cache that never hears of the eviction."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from budget_harness import NS, S, budget, environment, pod

from gpuops.controllers.budget.api import parse_spec
from gpuops.controllers.budget.enforcement import Enforcer, Outcome, Situation, Target
from gpuops.controllers.budget.setup import COMPONENT
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import Informer
from gpuops.kube.resources import JOBS, PODS
from gpuops_sim.apiserver.auth import Decision

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_stopped_pod_is_not_evicted_again_and_its_stop_survives_a_failed_retry(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        body = budget("b", "1", action="Evict")
        body["spec"]["enforcement"]["evictionGracePeriodSeconds"] = 0
        created = await env.create_budget(body)
        await env.create_pod(pod("p", 2))

        async def running() -> bool:
            return await env.phase("p") == "Running"

        await env.until("p running", running)
        cached = await env.client.get(PODS, "p", NS)  # the copy the stale cache keeps showing
        server = env.cluster.server
        evictions: list[str] = []

        def audit(d: Decision) -> None:
            if d.attrs.subresource == "eviction":
                evictions.append(d.attrs.name)

        server.audit_hooks.append(audit)
        recorder = EventRecorder(env.client, COMPONENT)
        recorder.start()
        clock = [1_000 * S]
        pods, jobs = Informer(env.client, PODS, namespace=NS), Informer(env.client, JOBS, namespace=NS)
        enforcer = Enforcer(env.client, pods, jobs, recorder, clock=lambda: clock[0])
        stops: list[int | None] = []
        enforcer.on_stop = lambda _key, _uid, at: stops.append(at)
        spec = parse_spec(created.spec)
        target = Target(pod=cached, usage=Fraction(2), running=True, final=False)
        try:
            for t in (1_000, 1_002, 1_004):  # batches 1 s apart; the cache never hears of the eviction meanwhile
                clock[0] = t * S
                sit = Situation(now=t * S, over=True, due=True, consumed=Fraction(2), quota=Fraction(1),
                                during="in the last 1h")
                await enforcer._evict(created, spec, sit, [target], Outcome())
                if t == 1_000:  # accepted: every later eviction request gets the chaos run's injected 500
                    await env.until("p gone", lambda: env.pod_gone("p"))
                    server.faults.add_error(500, verbs=["create"], resources=["pods"])
        finally:
            await recorder.stop()
        assert evictions == ["p"] and server.faults.injected == 0
        assert enforcer.stopped_at == {cached.metadata.uid: 1_000 * S}
        assert None not in stops

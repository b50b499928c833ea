"""A pod the Evict enforcement already stopped is not evicted again while the cache still shows it running.

Found by the all-controllers API chaos run: the first eviction was accepted (its stop recorded), the cache lagged,
a second eviction of the same pod got an injected 500, and the failure path erased the first eviction's stop, so
the pod counted on until the informer heard of its deletion (28 GPU-seconds over the truth)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import msgspec
import pytest
from test_budget_units import FakeInformer, FakeRecorder, mkpod

from gpuops.controllers.budget.api import GPUWorkloadBudget, parse_spec
from gpuops.controllers.budget.enforcement import Enforcer, Outcome, Situation, Target
from gpuops.kube.errors import ServerError

pytestmark = pytest.mark.anyio
S = 1_000_000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class EvictOnceThenFail:
    """Accepts the first eviction, answers 500 to every later one (the API chaos run's injected errors)."""

    def __init__(self) -> None:
        self.evictions: list[str] = []

    async def evict(self, name: str, namespace: str, **_: Any) -> None:
        self.evictions.append(name)
        if len(self.evictions) > 1:
            raise ServerError(500, "InternalError", "injected")


async def test_a_stopped_pod_is_not_evicted_again_and_its_stop_survives_a_failed_retry() -> None:
    budget = msgspec.convert({
        "metadata": {"name": "b", "namespace": "ns", "uid": "bu", "generation": 1, "resourceVersion": "1"},
        "spec": {"selector": {"matchLabels": {"team": "a"}}, "quota": {"gpuHours": "1", "windowHours": 1},
                 "enforcement": {"action": "Evict", "evictionGracePeriodSeconds": 0}}}, GPUWorkloadBudget)
    running = mkpod(spec={"terminationGracePeriodSeconds": 0}, status={"phase": "Running"})
    client, clock = EvictOnceThenFail(), [1_000 * S]
    enforcer = Enforcer(client, FakeInformer([running]), FakeInformer([]), FakeRecorder(),  # type: ignore[arg-type]
                        clock=lambda: clock[0])
    stops: list[int | None] = []
    enforcer.on_stop = lambda _key, _uid, at: stops.append(at)
    spec = parse_spec(budget.spec)
    target = Target(pod=running, usage=Fraction(2), running=True, final=False)

    for t in (1_000, 1_002, 1_004):  # batches 1 s apart; the cache never hears of the eviction meanwhile
        clock[0] = t * S
        sit = Situation(now=t * S, over=True, due=True, consumed=Fraction(2), quota=Fraction(1), window_hours=1)
        await enforcer._evict(budget, spec, sit, [target], Outcome())

    assert client.evictions == ["p"]
    assert enforcer.stopped_at == {"u1": 1_000 * S}
    assert None not in stops

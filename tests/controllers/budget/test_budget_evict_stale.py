"""Evict enforcement evicts the pod version it decided on: an eviction carrying the cached copy's uid and
resourceVersion is refused (Conflict) once the pod changed, e.g. finished while the cache showed it running.
And the API server's throttling 429 is not a PodDisruptionBudget."""

from __future__ import annotations

from pathlib import Path

import pytest
from budget_harness import NS, environment, pod

from gpuops.kube.errors import Conflict
from gpuops.kube.resources import PODS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_an_eviction_of_a_stale_copy_is_refused_and_of_the_current_one_accepted(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.create_pod(pod("p", 1, 600.0))

        async def running() -> bool:
            return await env.phase("p") == "Running"

        await env.until("p running", running)
        cached = await env.client.get(PODS, "p", NS)
        await env.client.patch(PODS, "p", {"metadata": {"labels": {"changed": "yes"}}}, namespace=NS)
        stale = {"uid": cached.metadata.uid, "resourceVersion": cached.metadata.resource_version}
        with pytest.raises(Conflict):
            await env.client.evict("p", NS, grace_period_seconds=0, preconditions=stale)
        assert await env.phase("p") == "Running"
        fresh = await env.client.get(PODS, "p", NS)
        await env.client.evict("p", NS, grace_period_seconds=0, preconditions={
            "uid": fresh.metadata.uid, "resourceVersion": fresh.metadata.resource_version})
        await env.until("p gone", lambda: env.pod_gone("p"))

"""Pause beside Kueue on the emulated cluster: a Job carrying Kueue's queue-name label, and one whose spec.managedBy
names MultiKueue, are never suspended by a budget over quota (their spec.suspend is another controller's); the
budget says which Jobs it left running in ConflictDetected, with one Warning Event, while a plain Job matched by
the same budget is paused as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from budget_harness import NS, Env, Reconciles, budget, environment, pod_spec

from gpuops.controllers.budget.api import PAUSED_BY, GPUWorkloadBudget
from gpuops.controllers.coexistence import CONDITION, KUEUE_QUEUE_NAME
from gpuops.kube import conditions as cond
from gpuops.kube.controller import Request
from gpuops.kube.resources import JOBS, PODS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def job(name: str, *, labels: dict[str, str] | None = None, managed_by: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": 1, "completions": 1, "backoffLimit": 0,
        "template": {"metadata": {"labels": {"team": "a"}, "annotations": {"sim.gpuops.io/runtime-seconds": "600"}},
                     "spec": pod_spec(1)}}
    if managed_by is not None:
        spec["managedBy"] = managed_by
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels or {}},
            "spec": spec}


async def pod_of_delegated_job(env: Env, job_name: str) -> None:
    """A Job handed to another controller (spec.managedBy) gets no pods from the Job controller: make the one its
    controller would, owned by it, as MultiKueue's worker-side copy would be here."""
    j = await env.job(job_name)
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job_name}-0", "labels": {"team": "a"},
                         "annotations": {"sim.gpuops.io/runtime-seconds": "600"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                              "uid": j["metadata"]["uid"], "controller": True}]},
            "spec": pod_spec(1)}
    await env.client.create(PODS, body, NS)


async def test_pause_leaves_kueue_and_managed_by_jobs_alone_and_says_so_once(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        handle = await env.start()
        reconciles = Reconciles(handle)
        await env.client.create(JOBS, job("queued", labels={KUEUE_QUEUE_NAME: "team-a"}), NS)
        await env.client.create(JOBS, job("remote", managed_by="kueue.x-k8s.io/multikueue"), NS)
        await env.client.create(JOBS, job("plain"), NS)
        await pod_of_delegated_job(env, "remote")

        async def all_running() -> bool:
            pods = await env.raw_pods()
            return len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods)

        await env.until("one running pod per Job", all_running)
        await env.create_budget(budget("pause", "0.0005", action="Pause"))  # 1.8 GPU-seconds: over at once

        async def conflict() -> GPUWorkloadBudget | None:
            b = await env.budget("pause")
            return b if cond.is_true(b.status.conditions, CONDITION) else None

        b = await env.until("ConflictDetected on the budget", conflict)
        c = cond.get_condition(b.status.conditions, CONDITION)
        assert c is not None and c.reason == "ExternallyManagedJobs"
        assert "queued, remote" in c.message and "plain" not in c.message and "Evict" in c.message

        async def plain_paused() -> bool:  # the same Pause that left the others alone
            return bool((await env.job("plain"))["spec"].get("suspend"))

        await env.until("the plain Job suspended", plain_paused)
        for i in range(2):  # later reconciles, over quota all along, change nothing and say nothing more
            await env.client.patch(JOBS, "plain", {"metadata": {"labels": {"nudge": str(i)}}}, namespace=NS)
            await reconciles.after(env, Request(NS, "pause"))
        for name in ("queued", "remote"):
            j = await env.job(name)
            assert not j["spec"].get("suspend"), name
            assert PAUSED_BY not in (j["metadata"].get("annotations") or {}), name
        events = await env.events("ExternallyManagedJobs")
        assert len(events) == 1 and events[0]["count"] == 1 and events[0]["type"] == "Warning"
        assert events[0]["involvedObject"]["name"] == "pause" and "queued, remote" in events[0]["message"]
        b = await env.budget("pause")
        assert cond.is_true(b.status.conditions, "QuotaExceeded")

        # the Kueue Job goes (Kueue would have finished it): the condition clears, with no new Warning
        for name in ("queued", "remote"):
            await env.client.request("DELETE", JOBS.path(NS, name), query={"propagationPolicy": "Background"})

        async def cleared() -> GPUWorkloadBudget | None:
            b = await env.budget("pause")
            return b if cond.is_false(b.status.conditions, CONDITION) else None

        b = await env.until("ConflictDetected False once no such Job is left", cleared, within=30)
        assert len(await env.events("ExternallyManagedJobs")) == 1

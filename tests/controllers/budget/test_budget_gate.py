"""Gate budgets end to end: the emulated API server calls our admission webhook (the shipped configuration,
over HTTPS with the CA the operator put in its caBundle) on every pod CREATE; held pods carry the scheduling gate
and a condition saying who holds them until when, and are released oldest first as the budget allows."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget_harness import NS, Env, budget, environment, pod
from waiting import until_holds

from gpuops.controllers.budget import gatewebhook
from gpuops.controllers.budget.api import BUDGETS, GATE, GATE_CONDITION, GATED_BY
from gpuops.controllers.budget.caches import SpecCache
from gpuops.controllers.budget.gatehook import GateBook, follow, gating_mutation
from gpuops.controllers.budget.setup import BudgetController, install
from gpuops.kube import conditions as cond
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.objects import Pod
from gpuops.kube.resources import JOBS, PODS
from gpuops_sim.harness import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.apiserver_warnings("held by GPUWorkloadBudget")]

CONFIG = Path(__file__).resolve().parents[3] / "manifests" / "webhook" / "budget-gate.yaml"
SERVICE = ("gpuops-system", "gpuops-budget-webhook")


@asynccontextmanager
async def gated(tmp_path: Path) -> AsyncIterator[tuple[Env, BudgetController]]:
    """The budget controller with its Gate webhook, behind the shipped MutatingWebhookConfiguration."""
    async with environment(tmp_path) as env:
        port = free_port()
        env.cluster.server.service_endpoints[SERVICE] = f"127.0.0.1:{port}"
        config = next(d for d in yaml.safe_load_all(CONFIG.read_text()) if d["kind"] == "MutatingWebhookConfiguration")
        await env.client.request("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                                 body=json.dumps(config).encode(), content_type="application/json")
        mgr = Manager(env.client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        handle = install(mgr)
        hook = gatewebhook.install(mgr, handle.reconciler, service=SERVICE[1], namespace=SERVICE[0], port=port,
                                   host="127.0.0.1", ca_check_interval=0.2)
        env.runs.append((mgr, asyncio.create_task(mgr.run())))
        assert hook.patcher is not None
        await until_holds("the webhook serving and trusted", lambda: hook.server.listening and hook.patcher.trusted)
        yield env, handle


def gate_budget(quota: str, **enforcement: Any) -> dict[str, Any]:
    body = budget("gate", quota, action="Gate", window=1)
    body["spec"]["enforcement"].update(enforcement)
    return body


async def exhausted(env: Env) -> None:
    """Run a 1-GPU pod for 6 s against a 5.04 GPU-second quota: the budget goes over quota, and nothing runs."""
    await env.create_pod(pod("burner", 1, runtime=6))

    async def over() -> bool:
        b = await env.budget("gate")
        return cond.is_true(b.status.conditions, "QuotaExceeded") and b.status.running_pods == 0

    await env.until("the budget over quota, its pod finished", over, 30)


async def held_condition(env: Env, name: str) -> cond.Condition | None:
    p = await env.client.get(PODS, name, NS)
    c = cond.get_condition(p.status.conditions, GATE_CONDITION)
    return c if c is not None and c.status == "True" else None


def is_gated(p: Pod) -> bool:
    return any(g.name == GATE for g in p.spec.scheduling_gates or ())


async def set_quota(env: Env, gpu_hours: str) -> None:
    await env.client.patch(BUDGETS, "gate", {"spec": {"quota": {"gpuHours": gpu_hours}}}, namespace=NS)


async def test_new_pods_are_held_told_why_and_released_oldest_first_within_the_quota(tmp_path: Path) -> None:
    async with gated(tmp_path) as (env, _):
        await env.create_budget(gate_budget("0.0014", gateHorizonMinutes=10))  # 5.04 GPU-seconds
        await exhausted(env)
        for name in ("p1", "p2", "p3"):
            created = await env.create_pod(pod(name, 1, runtime=600))
            assert is_gated(created), created.spec.scheduling_gates
            assert (created.metadata.annotations or {}).get(GATED_BY) == "gate"
        for name in ("p1", "p2", "p3"):
            c = await env.until(f"{name}'s held condition", lambda n=name: held_condition(env, n))  # type: ignore[misc]
            # 10 minutes of one GPU (1/6 GPU-hour) can never fit in 0.0014 GPU-hours: the pod is told what to change
            assert c.message.startswith("held by GPUWorkloadBudget gate: its quota of 0.001400 GPU-hours per 1h is "
                                        "smaller than 10 minutes"), c.message
            assert "gateHorizonMinutes" in c.message
        await env.until("status.heldPods 3", lambda: _held_in_status(env, 3))
        # 0.35 GPU-hours: room for 10 minutes of two 1-GPU pods (1/3 GPU-hour), not of three (1/2)
        await set_quota(env, "0.35")

        async def two_released() -> bool:
            pods = {n: await env.client.get(PODS, n, NS) for n in ("p1", "p2", "p3")}
            return not is_gated(pods["p1"]) and not is_gated(pods["p2"]) and is_gated(pods["p3"])

        await env.until("the two oldest released, the third held", two_released, 15)
        for name in ("p1", "p2"):
            p = await env.client.get(PODS, name, NS)
            c = cond.get_condition(p.status.conditions, GATE_CONDITION)
            assert c is not None and c.status == "False" and c.reason == "Released", c
            assert GATED_BY not in (p.metadata.annotations or {})
        await env.until("the released pods running", lambda: _phases(env, ["p1", "p2"], "Running"), 15)
        assert is_gated(await env.client.get(PODS, "p3", NS))
        await env.until("status.heldPods 1", lambda: _held_in_status(env, 1))
        await set_quota(env, "10")
        await env.until("the third released", lambda: _ungated(env, "p3"), 15)
        await env.until("status.heldPods 0", lambda: _held_in_status(env, 0))


async def test_job_pods_are_held_without_suspending_the_job(tmp_path: Path) -> None:
    async with gated(tmp_path) as (env, _):
        await env.create_budget(gate_budget("0.0014", gateHorizonMinutes=0))
        await exhausted(env)
        template = pod("ignored", 1, runtime=5)
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
               "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0,
                        "template": {"metadata": {k: v for k, v in template["metadata"].items() if k != "name"},
                                     "spec": template["spec"]}}}
        await env.client.create(JOBS, job, NS)

        async def job_pods_held() -> bool:
            pods = [p for p in (await env.client.list(PODS, NS))[1] if p.metadata.name.startswith("train-")]
            return len(pods) == 2 and all(is_gated(p) for p in pods)

        await env.until("both Job pods held", job_pods_held, 15)
        assert not (await env.job("train"))["spec"].get("suspend")
        await set_quota(env, "10")
        await env.until("the Job complete", lambda: _job_complete(env, "train"), 30)


async def test_a_budget_that_stops_gating_lets_its_pods_go(tmp_path: Path) -> None:
    async with gated(tmp_path) as (env, _):
        await env.create_budget(gate_budget("0.0014"))
        await exhausted(env)
        await env.create_pod(pod("a", 1, runtime=5))
        await env.create_pod(pod("b", 1, runtime=5))
        await env.until("a held", lambda: held_condition(env, "a"))
        await env.client.patch(BUDGETS, "gate", {"spec": {"enforcement": {"action": "AlertOnly"}}}, namespace=NS)
        await env.until("a released once the action is AlertOnly", lambda: _ungated(env, "a"), 15)
        await env.client.patch(BUDGETS, "gate", {"spec": {"enforcement": {"action": "Gate"}}}, namespace=NS)

        async def b_held_again() -> bool:  # b was let go with a; a new pod is held again
            await env.create_pod(pod(f"c{len(await env.raw_pods())}", 1, runtime=5))
            return any(is_gated(p) for p in (await env.client.list(PODS, NS))[1] if p.metadata.name.startswith("c"))

        await env.until("new pods held again", b_held_again, 15)
        await env.client.delete(BUDGETS, "gate", NS)

        async def none_held() -> bool:
            return not any(is_gated(p) for p in (await env.client.list(PODS, NS))[1])

        await env.until("every pod released once the budget is deleted", none_held, 15)


async def test_a_replica_that_does_not_lead_holds_the_same_pods(tmp_path: Path) -> None:
    """The Service sends the API server's call to any replica: a standby (informers only, no reconciles) follows
    the leader's Gating condition into its own book, closed and open again as the leader decides."""
    async with gated(tmp_path) as (env, _):
        standby = Manager(env.client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        book = GateBook()
        follow(standby.informer(BUDGETS), book, SpecCache().get)
        env.runs.append((standby, asyncio.create_task(standby.run())))
        await env.create_budget(gate_budget("0.0014"))
        await exhausted(env)
        b = await env.budget("gate")
        gating = cond.get_condition(b.status.conditions, "Gating")
        assert gating is not None and gating.status == "True" and gating.reason == "HoldingNewPods", gating
        await until_holds("the standby's book closed", lambda: [c.name for c in book.closed_in(NS)] == ["gate"])
        held = gating_mutation(book)(pod("via-standby", 1, runtime=5) | {"metadata": {
            "name": "via-standby", "namespace": NS, "labels": {"team": "a"}}})
        assert held.patch and held.warnings == [gating.message]
        await set_quota(env, "10")
        await until_holds("the standby's book open", lambda: not book.closed_in(NS))


async def test_pods_the_budget_does_not_select_or_that_request_no_gpu_are_admitted_ungated(tmp_path: Path) -> None:
    async with gated(tmp_path) as (env, handle):
        await env.create_budget(gate_budget("0.0014"))
        await exhausted(env)
        other = await env.create_pod(pod("other-team", 1, runtime=5, labels={"team": "b"}))
        cpu_only = await env.create_pod(pod("cpu-only", 1, runtime=5, resource="cpu"))
        held = await env.create_pod(pod("mine", 1, runtime=5))
        assert not is_gated(other) and not is_gated(cpu_only) and is_gated(held)
        reviews = gatewebhook.REQUESTS.labels("mutated")._value.get()
        assert reviews >= 1
        assert handle.reconciler.gatekeeper is not None


async def _held_in_status(env: Env, count: int) -> bool:
    return (await env.budget("gate")).status.held_pods == count


async def _phases(env: Env, names: list[str], phase: str) -> bool:
    return all([await env.phase(n) == phase for n in names])


async def _ungated(env: Env, name: str) -> bool:
    return not is_gated(await env.client.get(PODS, name, NS))


async def _job_complete(env: Env, name: str) -> bool:
    job = await env.job(name)
    return any(c.get("type") == "Complete" and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or ())

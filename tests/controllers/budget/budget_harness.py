"""A small emulated GPU cluster with our CRD installed and the budget controller run by a Manager over HTTP.

Every wait is a condition with a deadline (`Env.until`); nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpuops.controllers.budget import BudgetController, install
from gpuops.controllers.budget.api import BUDGETS, GPUWorkloadBudget
from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, NotFound
from gpuops.kube.manager import Manager
from gpuops.kube.objects import Pod
from gpuops.kube.resources import JOBS, PODS
from gpuops.sim.cluster.cluster import SimCluster
from gpuops.sim.scenario import parse

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "manifests" / "crds" / "gpuworkloadbudgets.gpuops.io.yaml"
NS = "team-a"
RUNTIME = "sim.gpuops.io/runtime-seconds"

SCENARIO = {
    "name": "budget-tests",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.5, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [
        {"name": "a100", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": 2,
         "bootSeconds": 0.05, "devicePluginSeconds": 0.05},
    ],
}


def pod(name: str, gpus: int | str, runtime: float | None = None, labels: dict[str, str] | None = None,
        resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    ann = {RUNTIME: str(runtime)} if runtime is not None else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"team": "a"}, "annotations": ann},
        "spec": pod_spec(gpus, resource),
    }


def pod_spec(gpus: int | str, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {resource: str(gpus)}}}],
    }


def budget(name: str, gpu_hours: str, *, labels: dict[str, str] | None = None, action: str = "AlertOnly",
           delay: int = 0, window: int = 1, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": labels or {"team": "a"}},
        "quota": {"gpuHours": gpu_hours, "windowHours": window},
        "enforcement": {"action": action, "delaySeconds": delay},
    }
    spec.update(extra)
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget", "metadata": {"name": name},
            "spec": spec}


def seconds(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def truth_gpu_hours(pods: list[dict[str, Any]], resource: str = "nvidia.com/gpu") -> Fraction:
    """Usage of finished pods straight from their container timestamps (independent of the controller)."""
    total = Fraction(0)
    for p in pods:
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        terms = [(s.get("state") or {}).get("terminated") or {} for s in statuses]
        starts = [seconds(t["startedAt"]) for t in terms if t.get("startedAt")]
        ends = [seconds(t["finishedAt"]) for t in terms if t.get("finishedAt")]
        assert starts and ends, f"pod {p['metadata']['name']} has not finished"
        gpus = sum(Fraction(c["resources"]["limits"][resource]) for c in p["spec"]["containers"])
        total += gpus * Fraction(max(ends) - min(starts), 3600)
    return total


class Env:
    def __init__(self, cluster: SimCluster, client: Client, kubeconfig: Path) -> None:
        self.cluster = cluster
        self.client = client
        self.kubeconfig = kubeconfig
        self.runs: list[tuple[Manager, asyncio.Task[None]]] = []

    async def start(self, **options: Any) -> BudgetController:
        mgr = Manager(self.client, metrics_bind_address="0", health_probe_bind_address="0")
        handle = install(mgr, **options)
        self.runs.append((mgr, asyncio.create_task(mgr.run())))
        return handle

    async def stop(self) -> None:
        mgr, task = self.runs.pop()
        mgr.request_stop()
        await asyncio.wait_for(task, 15)

    async def until(self, what: str, probe: Callable[[], Awaitable[T | None]], within: float = 15.0) -> T:
        deadline = time.monotonic() + within
        while True:
            got = await probe()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within}s waiting for {what}")
            await asyncio.sleep(0.05)

    async def create_budget(self, body: dict[str, Any]) -> GPUWorkloadBudget:
        return await self.client.create(BUDGETS, body, NS)

    async def budget(self, name: str) -> GPUWorkloadBudget:
        return await self.client.get(BUDGETS, name, NS)

    async def create_pod(self, body: dict[str, Any]) -> Pod:
        return await self.client.create(PODS, body, NS)

    async def raw_pods(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        data = json.loads(await self.client.request("GET", PODS.path(NS)))
        return [p for p in data["items"] if names is None or p["metadata"]["name"] in names]

    async def phase(self, name: str) -> str | None:
        try:
            return (await self.client.get(PODS, name, NS)).status.phase
        except NotFound:
            return None

    async def all_finished(self, names: list[str]) -> bool:
        return all([await self.phase(n) in ("Succeeded", "Failed") for n in names])

    async def pod_gone(self, name: str) -> bool:
        return await self.phase(name) is None and not await self._exists(name)

    async def _exists(self, name: str) -> bool:
        try:
            await self.client.get(PODS, name, NS)
        except NotFound:
            return False
        return True

    async def events(self, reason: str) -> list[dict[str, Any]]:
        data = json.loads(await self.client.request("GET", f"/api/v1/namespaces/{NS}/events"))
        return [e for e in data["items"] if e.get("reason") == reason]

    async def job(self, name: str) -> dict[str, Any]:
        return json.loads(await self.client.request("GET", JOBS.path(NS, name)))


async def install_crd(client: Client) -> None:
    crd = yaml.safe_load(CRD.read_text())
    await client.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                         body=json.dumps(crd).encode(), content_type="application/json")
    deadline = time.monotonic() + 10
    while True:  # served once established
        try:
            await client.list(BUDGETS, NS)
            return
        except ApiError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[Env]:
    async with SimCluster(parse(SCENARIO), workload=False) as cluster:
        kubeconfig = tmp_path / "kubeconfig"
        cluster.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        env = Env(cluster, client, kubeconfig)
        try:
            await install_crd(client)
            assert await cluster.wait_ready(10)
            yield env
        finally:
            while env.runs:
                await env.stop()
            await client.close()

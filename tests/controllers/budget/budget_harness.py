"""A small emulated GPU cluster with our CRD installed and the budget controller run by a Manager over HTTP.

Every wait is a condition with a deadline (`Env.until`); nothing sleeps and hopes. `Clock` and `Reconciles` let a
test move the controller's time by hand and know which reconcile saw which instant (and what it asked for).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import yaml
from waiting import until

from gpuops.controllers.budget.api import BUDGETS, GPUWorkloadBudget, format_time
from gpuops.controllers.budget.pricelist import PRICE_LISTS
from gpuops.controllers.budget.reconciler import BudgetReconciler, Options, wall_clock
from gpuops.controllers.budget.setup import BudgetController, install
from gpuops.kube.client import Client
from gpuops.kube.controller import Request, Result
from gpuops.kube.errors import ApiError, NotFound
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.objects import Pod
from gpuops.kube.resources import JOBS, PODS
from gpuops_sim.apiserver.store import clone
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import parse

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "manifests" / "crds" / "gpuworkloadbudgets.gpuops.io.yaml"
PRICE_CRD = ROOT / "manifests" / "crds" / "gpupricelists.gpuops.io.yaml"
NS = "team-a"
RUNTIME = "sim.gpuops.io/runtime-seconds"
BUDGETS_STORED = ("gpuops.io", "gpuworkloadbudgets")
"""Where the emulator's store keeps budgets (group, plural)."""
S = 1_000_000
"""Microseconds per second: the controller's clock counts microseconds."""

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


async def running_since(env: Env, name: str) -> int | None:
    """When the pod's container started running (whole seconds), once it has."""
    for p in await env.raw_pods([name]):
        for cs in p["status"].get("containerStatuses") or ():
            started = (cs.get("state") or {}).get("running", {}).get("startedAt")
            if started:
                return seconds(started)
    return None


def at(second: int) -> str:
    """An instant as the controller writes it in status (RFC 3339, whole seconds here)."""
    return format_time(second * S)


class Clock:
    """The budget controller's clock (integer microseconds). Unset, it is the wall clock moved on by what
    `advance` added (the kubelet's timestamps stay in the past, and an hour passes in a call); once `set`, it
    stands still at that instant until set again, so a reconcile's figures and requeues are exact."""

    def __init__(self) -> None:
        self.fixed: int | None = None
        self.offset = 0

    def __call__(self) -> int:
        return self.fixed if self.fixed is not None else wall_clock() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += round(seconds * S)

    def set(self, second: int) -> None:
        self.fixed = second * S


@dataclass(frozen=True, slots=True)
class Reconciled:
    seq: int
    """Order of the reconcile's start (1 = the controller's first)."""
    request: Request
    result: Result | None
    error: Exception | None


class Reconciles:
    """The reconciles the running budget controller makes: it calls its reconcile function through this, so a
    test knows how many started, which are in flight, and each finished one's Result. Before asserting what a
    reconcile did (or did not do), a test waits for one that started after the change it made (`after`)."""

    def __init__(self, handle: BudgetController) -> None:
        self.controller = handle.controller
        self.started = 0
        self.running = 0
        self.finished: list[Reconciled] = []
        inner = handle.controller.reconcile

        async def observed(req: Request) -> Result | None:
            self.started += 1
            seq = self.started
            self.running += 1
            try:
                result = await inner(req)
            except Exception as e:
                self.finished.append(Reconciled(seq, req, None, e))
                raise
            finally:
                self.running -= 1
            self.finished.append(Reconciled(seq, req, result, None))
            return result

        handle.controller.reconcile = observed

    async def after(self, env: Env, req: Request, change: Callable[[], None] | None = None,
                    within: float = 10.0) -> Reconciled:
        """Make `change` (e.g. move the clock) while no reconcile is in flight, queue `req` (as its requeue
        timer or an event would) and return the first reconcile of it that started after the change."""

        async def idle() -> bool:
            return self.running == 0

        await env.until("no reconcile in flight", idle, within)
        if change is not None:
            change()
        mark = self.started
        self.controller.enqueue(req, trigger="test")

        async def done() -> Reconciled | None:
            return next((r for r in self.finished if r.seq > mark and r.request == req), None)

        got = await env.until(f"a reconcile of {req} after the change", done, within)
        if got.error is not None:
            raise AssertionError(f"the reconcile of {req} failed: {got.error!r}") from got.error
        return got


class Env:
    def __init__(self, cluster: SimCluster, client: Client, kubeconfig: Path) -> None:
        self.cluster = cluster
        self.client = client
        self.kubeconfig = kubeconfig
        self.runs: list[tuple[Manager, asyncio.Task[None]]] = []

    async def start(self, **options: Any) -> BudgetController:
        mgr = Manager(self.client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        handle = install(mgr, **options)
        self.runs.append((mgr, asyncio.create_task(mgr.run())))
        return handle

    async def stop(self) -> None:
        mgr, task = self.runs.pop()
        mgr.request_stop()
        await asyncio.wait_for(task, 15)

    async def until(self, what: str, probe: Callable[[], Awaitable[T | None]], within: float = 15.0) -> T:
        """tests/waiting.py's `until`, with the budget tests' usual deadline."""
        return await until(what, probe, within)

    async def create_budget(self, body: dict[str, Any]) -> GPUWorkloadBudget:
        return await self.client.create(BUDGETS, body, NS)

    async def budget(self, name: str, namespace: str = NS) -> GPUWorkloadBudget:
        return await self.client.get(BUDGETS, name, namespace)

    def edit_stored_budget(self, name: str, change: Callable[[dict[str, Any]], None]) -> str:
        """Change a stored budget in the emulator's store, past admission and schema validation (as an object
        stored before a validation rule existed, or written by a server that did not check it, would be);
        metadata.generation moves on as for a spec change. Returns the new resourceVersion."""
        store = self.cluster.server.store
        stored = store.get(BUDGETS_STORED, NS, name)
        assert stored is not None, f"budget {name} is not stored"
        obj = clone(stored.obj)
        change(obj)
        obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        return str(store.put(BUDGETS_STORED, obj).obj["metadata"]["resourceVersion"])

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
    """The budget controller's CRDs: budgets and the price lists it reads."""
    for path in (CRD, PRICE_CRD):
        crd = yaml.safe_load(path.read_text())
        await client.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                             body=json.dumps(crd).encode(), content_type="application/json")

    async def served() -> bool:  # once established
        await client.list(BUDGETS, NS)
        await client.list(PRICE_LISTS)
        return True

    await until("the budget CRDs served", served, 10, every=0.02, ignoring=(ApiError,))


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


@asynccontextmanager
async def held_reconciler(tmp_path: Path, margin: float, budgets: list[str],
                          ) -> AsyncIterator[tuple[BudgetReconciler, Clock, Pod]]:
    """A budget reconciler whose reconciles never run (nothing writes a ledger behind the test's back), its clock
    standing where the test sets it, with `budgets` (one-hour windows; "bad" is stored with an invalid spec), one
    pod `p` they all select, cached, and `margin` as compaction margin."""
    async with environment(tmp_path) as env:
        clock = Clock()
        handle = await env.start(clock=clock, options=Options(compaction_margin=margin))
        rec = handle.reconciler
        release = asyncio.Event()

        async def never(req: Request) -> Result | None:
            await release.wait()
            return None

        handle.controller.reconcile = never
        try:
            for name in budgets:
                await env.create_budget(budget(name, "100", window=1))
            if "bad" in budgets:  # stored past admission (as before a validation rule existed): a SpecError here
                env.edit_stored_budget("bad", lambda o: o["spec"]["quota"].__setitem__("gpuHours", "-1"))
            await env.create_pod(pod("p", 1))

            async def cached() -> Pod | None:
                if any(rec.budgets.store.get(f"{NS}/{n}") is None for n in budgets):
                    return None
                bad = rec.budgets.store.get(f"{NS}/bad")
                if bad is not None and bad.spec.quota.gpu_hours != "-1":
                    return None
                return rec.pods.store.get(f"{NS}/p")

            yield rec, clock, await env.until("budgets and p cached", cached)
        finally:
            release.set()

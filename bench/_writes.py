"""bench/apiserver.py's write-cost figure: the emulator's CPU seconds per 1,000 object updates.

What bench/scale.py's emulator spends its core on, without our operator: the `scale` cluster (bench/_scale_sim.py's
scenario at a small fraction) with its kubelets, scheduler and Lease renewals in this process, and a pod lifecycle
driven at a fixed rate:

  client    (in-process) creates each pod as its own field manager, so the pod carries managedFields from birth;
  scheduler binds it; the kubelet writes its status (Running, then Succeeded);
  operator  (another process, over HTTP, as the budget controller does) watches pods and, for each one that
            finished, merge-patches the status of its GPUWorkloadBudget (a ledger entry appended to a bounded
            ledger; resourceVersion-guarded; /status subresource);
  TTL       (in-process) deletes each finished pod a second after it finished.

An object update is a write that changed a stored object (every ADDED, MODIFIED and DELETED the store emits, of
any resource: Leases and Nodes too). CPU is this process's (time.process_time) from the first create until the
last pod is deleted and the operator has written every completion: the API server's HTTP handling and watch
encoding are in it, the operator's own work is not. The driver's share (building pod bodies) is small.
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
from _scale_sim import CRDS, budget_of, pod, scenario, size_of

from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.cluster.access import PODS, ClusterAccess
from gpuops_sim.cluster.cluster import SimCluster

FRACTION = 0.02  # 100 nodes (86 plain, 4 node-group machines, 10 MIG), 20 budgets
LEDGER_ENTRIES = 40  # what a budget's ledger holds here (~12 KB budgets, as at scale)
TTL_SECONDS = 1.0


@dataclass
class _Tally:
    """Store listener: object updates by resource and event type, and when each pod finished."""

    counting: bool = False
    updates: collections.Counter[str] = field(default_factory=collections.Counter)
    finished: collections.deque[tuple[float, str, str]] = field(default_factory=collections.deque)

    def on_event(self, ev: WatchEvent) -> None:
        if self.counting:
            self.updates[f"{ev.gr[1]} {ev.type}"] += 1
        if ev.gr != PODS or ev.type != "MODIFIED" or ev.prev is None:
            return
        phase = (ev.new.obj.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed") and (ev.prev.obj.get("status") or {}).get("phase") != phase:
            self.finished.append((ev.time + TTL_SECONDS, *ev.key))


def _budget(i: int) -> dict[str, Any]:
    ns, name = budget_of(i)
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": {"team": name}},
                     "quota": {"gpuHours": "1000000", "windowHours": 1},
                     "enforcement": {"action": "AlertOnly", "delaySeconds": 60}}}


# ------------------------------------------------------------------------------------ the operator process


def _stamp(serial: int) -> str:
    return f"2026-11-21T{serial // 3600 % 24:02d}:{serial // 60 % 60:02d}:{serial % 60:02d}Z"


def _status(entries: list[dict[str, Any]], serial: int) -> dict[str, Any]:
    """A budget status as the budget controller writes it: figures, conditions and the bounded ledger."""
    conds = [{"type": t, "status": s, "observedGeneration": 1, "reason": r, "message": r,
              "lastTransitionTime": "2026-11-21T00:00:00Z"}
             for t, s, r in (("OverQuota", "False", "WithinQuota"), ("Degraded", "False", "AllPodsCounted"),
                             ("Ready", "True", "Computed"))]
    return {"observedGeneration": 1, "consumedGpuHours": f"{serial / 3600:.6f}", "remainingGpuHours": "999999",
            "quotaGpuHours": "1000000", "burnRateGpus": "3", "trackedPods": serial, "runningPods": 3,
            "computedAt": _stamp(serial), "conditions": conds,
            "ledger": {"resourceName": "nvidia.com/gpu", "maxEntries": LEDGER_ENTRIES, "bucketSeconds": 60,
                       "errorBoundGpuHours": "0", "entries": entries}}


class _Operator:
    """The budget controller's writes: one status merge patch per finished pod, over HTTP."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.rvs: dict[tuple[str, str], str] = {}
        self.ledgers: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
        self.written = 0

    async def list_budgets(self) -> None:
        async with self.session.get(f"{self.url}/apis/gpuops.io/v1alpha1/gpuworkloadbudgets") as r:
            for b in (await r.json())["items"]:
                self.rvs[(b["metadata"]["namespace"], b["metadata"]["name"])] = b["metadata"]["resourceVersion"]

    async def finished(self, p: dict[str, Any]) -> None:
        meta = p["metadata"]
        key = (meta["namespace"], meta["labels"]["team"])
        self.written += 1
        entries = self.ledgers[key]
        entries.append({"uid": meta["uid"], "name": meta["name"], "start": _stamp(self.written),
                        "end": _stamp(self.written + 2), "gpus": "1", "recordedEnd": _stamp(self.written + 3),
                        "model": "A100-80GB", "capacityType": "on-demand"})
        del entries[:-LEDGER_ENTRIES]
        body = {"metadata": {"resourceVersion": self.rvs[key]}, "status": _status(entries, self.written)}
        url = f"{self.url}/apis/gpuops.io/v1alpha1/namespaces/{key[0]}/gpuworkloadbudgets/{key[1]}/status"
        async with self.session.patch(url, data=msgspec.json.encode(body),
                                      headers={"Content-Type": "application/merge-patch+json"}) as r:
            assert r.status == 200, (r.status, await r.text())
            self.rvs[key] = (await r.json())["metadata"]["resourceVersion"]

    async def watch(self, expected: int) -> None:
        """Pods from now on; every first Succeeded or Failed is written into its budget, until `expected`."""
        seen: set[str] = set()
        buf = b""
        timeout = aiohttp.ClientTimeout(total=900, sock_read=120)
        async with self.session.get(f"{self.url}/api/v1/pods", params={"watch": "1", "resourceVersion": "0"},
                                    timeout=timeout) as resp:
            async for chunk in resp.content.iter_any():
                lines = (buf + chunk).split(b"\n")
                buf = lines.pop()
                for line in lines:
                    obj = msgspec.json.decode(line)["object"]
                    uid = obj["metadata"]["uid"]
                    if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed") and uid not in seen:
                        seen.add(uid)
                        await self.finished(obj)
                if self.written >= expected:
                    return


def _operator_main(url: str, token: str, expected: int, out: Any) -> None:
    async def run() -> int:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
            op = _Operator(session, url)
            await op.list_budgets()
            await op.watch(expected)
            return op.written

    out.put(asyncio.run(run()))


# ------------------------------------------------------------------------------------ the emulator side


async def _drive(cluster: SimCluster, tally: _Tally, pods: int, rate: float, runtime: float) -> None:
    """Create `pods` pods at `rate`/s over the budgets; delete each TTL_SECONDS after it finished."""
    client = ClusterAccess(cluster.server, "bench-client", component="bench-client")
    budgets = size_of(FRACTION).budgets
    t0 = time.monotonic()
    created = deleted = 0
    deadline = t0 + pods / rate + 120
    while deleted < pods and time.monotonic() < deadline:
        now = time.monotonic()
        while tally.finished and tally.finished[0][0] <= now:
            _, ns, name = tally.finished.popleft()
            await client.delete(PODS, ns, name, grace_seconds=0)
            deleted += 1
        while created < pods and t0 + created / rate <= now:
            ns, team = budget_of(created % budgets)
            await client.create(PODS, ns, pod(f"w-{created:06d}", ns, team, runtime))
            created += 1
        await asyncio.sleep(0.01)
    if deleted < pods:
        raise TimeoutError(f"only {deleted} of {pods} pods went through their lifecycle")


async def _operator_done(proc: Any, out: Any, expected: int) -> int:
    got: int = await asyncio.to_thread(out.get, True, 120)
    await asyncio.to_thread(proc.join, 30)
    if got < expected:
        raise RuntimeError(f"the operator wrote {got} of {expected} completions")
    return got


async def _window(cluster: SimCluster, tally: _Tally, pods: int, rate: float, runtime: float,
                  profile: str | None) -> tuple[float, float]:
    """The measured part: (wall seconds, CPU seconds) with the operator process watching."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_operator_main, args=(cluster.server.url, cluster.server.admin_token, pods, out))
    proc.start()
    deadline = time.monotonic() + 60
    while not cluster.server.store.all_watchers():
        if time.monotonic() > deadline:
            raise TimeoutError("the operator process did not watch")
        await asyncio.sleep(0.05)
    prof = cProfile.Profile() if profile else None
    tally.counting = True
    t0, cpu0 = time.monotonic(), time.process_time()
    if prof is not None:
        prof.enable()
    await asyncio.gather(_drive(cluster, tally, pods, rate, runtime), _operator_done(proc, out, pods))
    if prof is not None:
        prof.disable()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    tally.counting = False
    if prof is not None and profile:
        prof.dump_stats(profile)
    return wall, cpu


async def run(pods: int, rate: float = 100.0, runtime: float = 1.0, profile: str | None = None) -> dict[str, Any]:
    """The measured workload (see the module docstring); `profile`: a cProfile dump of the window."""
    size = size_of(FRACTION)
    cluster = SimCluster(scenario(size, 30.0), workload=False, faults=False, manifests=CRDS)
    tally = _Tally()
    cluster.access.listen(tally.on_event)
    await cluster.start()
    try:
        if not await cluster.wait_ready(within=120):
            raise TimeoutError("the emulated nodes did not become Ready")
        for i in range(size.budgets):
            await cluster.access.create_object(_budget(i))
        wall, cpu = await _window(cluster, tally, pods, rate, runtime, profile)
    finally:
        await cluster.stop()
    updates = sum(tally.updates.values())
    return {"pods": pods, "rate": rate, "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 3),
            "object_updates": updates, "updates_by_kind": dict(sorted(tally.updates.items())),
            "cpu_share": round(cpu / wall, 3), "cpu_s_per_1000_updates": round(cpu * 1000 / max(1, updates), 4)}

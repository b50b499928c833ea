"""bench/scale.py's emulator process: the resized `scale` cluster, its objects, the fill, the churn, the recorder.

Runs in a child process (multiprocessing, spawn) so the benchmark's own loop never competes with it; the parent
talks to it over a Pipe: ("ready", info) after the fill, then ("churn", ...) / ("status", ...) / ("stop", ...).

What the child measures itself (store listeners: in-process, synchronous, `WatchEvent.time` on one clock):
  * pod watch events by type during the churn window, creates and completions (Succeeded transitions);
  * budget latency: a churn pod's Succeeded write -> the first status write of its budget whose ledger has an
    entry for the pod's uid (the budget controller writes a finished pod into the ledger in the same status
    write that first sees it finished: the status write that reflects the event, unambiguous under churn);
  * MIG: a gated MIG pod's creation -> the write that removes its scheduling gate (the allocator's decision);
  * the emulator's own cost from the churn's start to its reply (window and drain): object updates (every event
    the store emits, of any resource: the operator's writes, the kubelets', the scheduler's, Leases) and this
    process's CPU seconds (time.process_time), reported as `emulator_cpu_s_per_1000_updates` in the churn reply.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import multiprocessing as mp
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gpuops import logs
from gpuops.kube.gctune import tune_for_large_heaps
from gpuops_sim.cluster.access import BUDGETS, GROUPS, NODES, PODS, POOLS, WatchEvent
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.demo import repo_crds
from gpuops_sim.migfarm import MigAgentFarm
from gpuops_sim.scenario import Scenario, load

CRDS = repo_crds()
RUNTIME = "sim.gpuops.io/runtime-seconds"
GPU = "nvidia.com/gpu"
MIG_TAINT = {"key": "gpuops.io/mig", "value": "true", "effect": "NoSchedule"}
SPOT_TAINT = {"key": "gpuops.io/spot", "value": "true", "effect": "NoSchedule"}
MIG_GATE = "gpuops.io/mig-slicer"
MIG_RESOURCE = "gpuops.io/mig-1g.10gb"
SPOT_TYPE = "sim.gpu.l4.1x"
BUDGETS_PER_NAMESPACE = 20
FULL = {"nodes": 5_000, "pods": 100_000, "budgets": 1_000, "groups": 200, "pools": 50, "mig": 500}


@dataclass(frozen=True)
class Size:
    fraction: float
    nodes: int
    pods: int
    budgets: int
    groups: int
    pools: int
    mig: int

    @property
    def regular(self) -> int:
        """Nodes of the plain GPU group (the rest are node-group machines and MIG nodes)."""
        return self.nodes - self.groups - self.mig

    @property
    def namespaces(self) -> list[str]:
        return [f"team-{i:03d}" for i in range(math.ceil(self.budgets / BUDGETS_PER_NAMESPACE))]


def size_of(fraction: float) -> Size:
    n = {k: max(1, round(v * fraction)) for k, v in FULL.items()}
    return Size(fraction, n["nodes"], n["pods"], n["budgets"], n["groups"], n["pools"], n["mig"])


def budget_of(i: int) -> tuple[str, str]:
    """(namespace, name) of budget i; it selects the pods labelled team=<name>."""
    return f"team-{i // BUDGETS_PER_NAMESPACE:03d}", f"t-{i:04d}"


@dataclass(frozen=True)
class Params:
    fraction: float
    workdir: str
    churn_events_per_s: float = 200.0
    runtime: tuple[float, float] = (2.0, 4.0)  # churn pods' runtimes (uniform)
    mig_share: float = 0.02  # of churn creates: gated MIG pods
    delete_after: float = 3.0  # churn pods are deleted this long after they finish (a TTL controller)
    lease_seconds: float = 30.0  # kubelet Lease renewals: the emulator's own load, no input of the operator's
    seed: int = 11

    @property
    def creates_per_s(self) -> float:
        return self.churn_events_per_s / 2  # every create is followed by one completion

    def reserve_gpus(self) -> int:
        """GPUs left free for the churn: its pods in flight (start latency and runtime) with 30% slack."""
        mean = sum(self.runtime) / 2
        return math.ceil(self.creates_per_s * (mean + 1.0) * 1.3)


def scenario(size: Size, lease_seconds: float = 10.0) -> Scenario:
    """The shipped `scale` scenario resized, with node-group machines and MIG nodes carved out of it."""
    sc = load("scale")
    sc = msgspec.structs.replace(sc, kubelet=msgspec.structs.replace(sc.kubelet, lease_seconds=lease_seconds))
    base = sc.node_groups[0]
    regular = msgspec.structs.replace(base, count=size.regular)
    machines = msgspec.structs.replace(base, name="ng", count=size.groups)
    mig = msgspec.structs.replace(base, name="mig", count=size.mig, taints=[dict(MIG_TAINT)])
    cloud = msgspec.convert({"launchSeconds": 1.0, "bootSeconds": 2.0, "devicePluginSeconds": 0.5,
                             "instanceTypes": [{"name": SPOT_TYPE, "gpuModel": "L4-24GB", "gpus": 1, "cpu": "16",
                                                "memory": "64Gi", "capacity": size.pools * 2 + 10}]},
                            type(sc.cloud))
    history = max(sc.apiserver.history_size, 10_000)
    return msgspec.structs.replace(sc, name=f"scale-{size.fraction:g}", namespaces=size.namespaces,
                                   node_groups=[regular, machines, mig], cloud=cloud,
                                   apiserver=msgspec.structs.replace(sc.apiserver, history_size=history))


def pod(name: str, ns: str, team: str, runtime: float, *, mig: bool = False) -> dict[str, Any]:
    res = {MIG_RESOURCE: "1"} if mig else {GPU: "1"}
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": res, "requests": res}}],
    }
    if mig:  # as the MIG slicer's webhook leaves it: resource renamed, gate added
        spec["schedulingGates"] = [{"name": MIG_GATE}]
        spec["tolerations"].append({"key": MIG_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"team": team},
                         "annotations": {RUNTIME: f"{runtime:.2f}"}},
            "spec": spec}


def objects(size: Size, cloud_url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(size.budgets):
        ns, name = budget_of(i)
        out.append({"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"selector": {"matchLabels": {"team": name}},
                             "quota": {"gpuHours": "1000000", "windowHours": 1},
                             "enforcement": {"action": "AlertOnly", "delaySeconds": 60}}})
    for i in range(size.groups):
        m = f"ng-{i}"
        base = f"{cloud_url}/power/v1/machines/{m}"
        out.append({"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": m},
                    "spec": {"nodeName": m, "gpuCount": 8, "scaleUp": {"url": f"{base}/start"},
                             "scaleDown": {"url": f"{base}/stop"}, "bootTimeoutSeconds": 300,
                             # machines stay on during the run: the fleet's capacity does not move under the load
                             "scaleDownUnneededSeconds": 86400}})
    for i in range(size.pools):
        out.append({"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": f"spot-{i:02d}"},
                    "spec": {"provider": "sim", "endpoint": f"{cloud_url}/spot/v1", "minimum": 1, "maximum": 2,
                             "template": {"instanceTypes": [SPOT_TYPE], "gpusPerInstance": 1,
                                          "labels": {"gpuops.io/capacity-type": "spot"},
                                          "taints": [dict(SPOT_TAINT)]}}})
    return out


# ---------------------------------------------------------------------------------------------- recording


def _phase(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase") or "Pending")


@dataclass
class Recorder:
    """Store listener: counts and latencies (see the module docstring). Synchronous and cheap by contract."""

    recording: bool = False
    matching: bool = False
    running: collections.Counter[str] = field(default_factory=collections.Counter)  # by name prefix
    finished: collections.Counter[str] = field(default_factory=collections.Counter)
    created: collections.Counter[str] = field(default_factory=collections.Counter)
    window_pod_events: collections.Counter[str] = field(default_factory=collections.Counter)
    window_creates: int = 0
    window_completions: int = 0
    window_budget_writes: int = 0
    pending: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # budget -> pod uid -> t
    budget_latencies: list[float] = field(default_factory=list)
    mig_created: dict[tuple[str, str], float] = field(default_factory=dict)
    mig_ungate_latencies: list[float] = field(default_factory=list)
    to_delete: collections.deque[tuple[float, str, str]] = field(default_factory=collections.deque)
    delete_after: float = 3.0
    updates: collections.Counter[str] = field(default_factory=collections.Counter)  # by resource, all the time

    def on_event(self, ev: WatchEvent) -> None:
        self.updates[ev.gr[1]] += 1
        if ev.gr == PODS:
            self._pod(ev)
        elif ev.gr == BUDGETS and ev.type == "MODIFIED" and self.matching:
            self._budget(ev)

    def _pod(self, ev: WatchEvent) -> None:
        ns, name = ev.key
        prefix = name[:2]
        if self.recording:
            self.window_pod_events[ev.type] += 1
        if ev.type == "DELETED":
            return
        if ev.type == "ADDED":
            self.created[prefix] += 1
            if self.recording:
                self.window_creates += 1
                if prefix == "m-":
                    self.mig_created[ev.key] = ev.time
            return
        obj, prev = ev.new.obj, ev.prev.obj if ev.prev is not None else None
        if prefix == "m-" and ev.key in self.mig_created and not obj["spec"].get("schedulingGates") and \
                (prev or {}).get("spec", {}).get("schedulingGates"):
            self.mig_ungate_latencies.append(ev.time - self.mig_created.pop(ev.key))
        new, old = _phase(obj), _phase(prev)
        if new == old:
            return
        if new == "Running":
            self.running[prefix] += 1
        elif new in ("Succeeded", "Failed"):
            self.finished[prefix] += 1
            if prefix in ("c-", "m-"):
                self.to_delete.append((ev.time + self.delete_after, ns, name))
                if self.recording:
                    self.window_completions += 1
                    if prefix == "c-":
                        team = obj["metadata"]["labels"]["team"]
                        self.pending.setdefault((ns, team), {})[obj["metadata"]["uid"]] = ev.time

    def _budget(self, ev: WatchEvent) -> None:
        if self.recording:
            self.window_budget_writes += 1
        waiting = self.pending.get(ev.key)
        if not waiting:
            return
        entries = (((ev.new.obj.get("status") or {}).get("ledger") or {}).get("entries")) or ()
        uids = {e.get("uid") for e in entries}
        for uid in [u for u in waiting if u in uids]:
            self.budget_latencies.append(ev.time - waiting.pop(uid))

    def not_reflected(self) -> int:
        return sum(len(v) for v in self.pending.values())


# ---------------------------------------------------------------------------------------------- the child


class Emulator:
    def __init__(self, p: Params) -> None:
        self.p = p
        self.size = size_of(p.fraction)
        self.cluster = SimCluster(self.scenario(), workload=False, faults=False, manifests=CRDS)
        self.rec = Recorder(delete_after=p.delete_after)
        self.cluster.access.listen(self.rec.on_event)
        self.rng = random.Random(p.seed)
        self.farm: MigAgentFarm | None = None
        self.deleter: asyncio.Task[None] | None = None
        self.serial = 0
        self.info: dict[str, Any] = {}

    def scenario(self) -> Scenario:
        """The cluster to emulate (chaos/_ha.py's subclass adds machines of its own)."""
        return scenario(self.size, self.p.lease_seconds)

    def gpus_allocatable(self) -> int:
        total = 0
        for n in self.cluster.access.iter(NODES):
            alloc = (n.get("status") or {}).get("allocatable") or {}
            with contextlib.suppress(ValueError):
                total += int(alloc.get(GPU, "0"))
        return total

    async def boot(self) -> None:
        t0 = time.monotonic()
        await self.cluster.start()
        s = self.size
        ok = await self.cluster.wait_ready(within=300 + s.nodes / 10)
        if not ok:
            raise TimeoutError("the emulated nodes did not become Ready")
        want = s.nodes * 8
        deadline = time.monotonic() + 120
        while self.gpus_allocatable() < want and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        self.info["boot_seconds"] = round(time.monotonic() - t0, 1)
        kubeconfig = Path(self.p.workdir) / "kubeconfig"
        self.cluster.write_kubeconfig(kubeconfig)
        self.info["kubeconfig"] = str(kubeconfig)
        t1 = time.monotonic()
        for obj in objects(s, self.cluster.cloud.url):
            await self.cluster.access.create_object(obj)
        self.farm = MigAgentFarm(self.cluster.access, [(f"mig-{i}", "A100-80GB", 8) for i in range(s.mig)])
        await self.farm.start()
        self.info["objects_seconds"] = round(time.monotonic() - t1, 1)
        self.deleter = asyncio.create_task(self._delete_finished())

    async def fill(self) -> None:
        """Long-running pods on all GPUs but the churn's reserve, then short ones that finish (Succeeded pods,
        the bulk of a real cluster's pods), with at most `cap` pods in flight so the scheduler's queue stays
        short. The operator is not running yet: it starts cold on the filled cluster."""
        s, t0 = self.size, time.monotonic()
        regular_gpus = (s.regular + s.groups) * 8
        # at most 80% of the GPUs minus the churn's reserve: the emulator's own lag under load keeps finished
        # pods' GPUs a while, and a standing backlog of Unschedulable pods would measure the autoprovisioner's
        # planner (see the report) instead of a steady churn
        long_n = max(0, min(int(s.pods * 0.35), int(regular_gpus * 0.8) - self.p.reserve_gpus()))
        short_n = s.pods - long_n
        cap = max(300, min(3000, regular_gpus - long_n))
        rec = self.rec
        for i in range(long_n):
            ns, team = budget_of(i % s.budgets)
            await self.cluster.access.create(PODS, ns, pod(f"l-{i:06d}", ns, team, 86400.0))
            if i % 200 == 199:
                await asyncio.sleep(0)
        for i in range(short_n):
            while rec.created["s-"] - rec.finished["s-"] >= cap:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            ns, team = budget_of((long_n + i) % s.budgets)
            await self.cluster.access.create(PODS, ns, pod(f"s-{i:06d}", ns, team, 1.0))
            if i % 200 == 199:
                await asyncio.sleep(0)
        deadline = time.monotonic() + 300 + s.pods / 50
        while (rec.running["l-"] < long_n or rec.finished["s-"] < short_n) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        self.info.update({"fill_seconds": round(time.monotonic() - t0, 1), "long_pods": long_n,
                          "short_pods": short_n, "long_running": rec.running["l-"],
                          "short_finished": rec.finished["s-"], "reserve_gpus": self.p.reserve_gpus(),
                          "pods_in_store": self.count(PODS)})

    def count(self, gr: tuple[str, str]) -> int:
        return sum(1 for _ in self.cluster.access.iter(gr))

    async def _delete_finished(self) -> None:
        q = self.rec.to_delete
        while True:
            await asyncio.sleep(0.2)
            now = time.monotonic()
            while q and q[0][0] <= now:
                _, ns, name = q.popleft()
                with contextlib.suppress(Exception):
                    await self.cluster.access.delete(PODS, ns, name, grace_seconds=0)

    def status(self) -> dict[str, Any]:
        """How far the operator got: budgets with a first status, node groups and pools with a state."""
        budgets = sum(1 for b in self.cluster.access.iter(BUDGETS) if (b.get("status") or {}).get("computedAt"))
        groups = collections.Counter(str((g.get("status") or {}).get("state") or "-")
                                     for g in self.cluster.access.iter(GROUPS))
        ready = sum(int((p.get("status") or {}).get("ready") or 0) for p in self.cluster.access.iter(POOLS))
        sizes = [len(st.raw) for st in self.cluster.server.store.iter(BUDGETS, None)]
        unschedulable = sum(1 for p in self.cluster.access.iter(PODS)
                            if any(c.get("reason") == "Unschedulable"
                                   for c in (p.get("status") or {}).get("conditions") or ()))
        return {"budgets_with_status": budgets, "budgets": self.size.budgets, "group_states": dict(groups),
                "spot_ready": ready, "pools": self.size.pools, "unschedulable_pods": unschedulable,
                "budget_bytes_avg": round(sum(sizes) / max(1, len(sizes))), "budget_bytes_max": max(sizes, default=0)}

    async def churn(self, seconds: float, drain: float) -> dict[str, Any]:
        rate = self.p.creates_per_s
        rec = self.rec
        rec.window_pod_events.clear()
        rec.window_creates = rec.window_completions = rec.window_budget_writes = 0
        rec.budget_latencies.clear()
        rec.mig_ungate_latencies.clear()
        rec.pending.clear()
        rec.recording = rec.matching = True
        farm0 = (self.farm.claims_created, self.farm.claims_released) if self.farm else (0, 0)
        updates0, cpu0 = collections.Counter(rec.updates), time.process_time()
        t0 = time.monotonic()
        i = 0
        late = 0.0
        s = self.size
        while True:
            due = t0 + i / rate
            now = time.monotonic()
            if due - t0 >= seconds:
                break
            if due > now:
                await asyncio.sleep(due - now)
            else:
                late = max(late, now - due)
            self.serial += 1
            j = self.serial
            ns, team = budget_of(j % s.budgets)
            runtime = self.rng.uniform(*self.p.runtime)
            if self.rng.random() < self.p.mig_share:
                body = pod(f"m-{j:07d}", ns, team, runtime, mig=True)
            else:
                body = pod(f"c-{j:07d}", ns, team, runtime)
            await self.cluster.access.create(PODS, ns, body)
            i += 1
        window = time.monotonic() - t0
        rec.recording = False
        # completions inside the window are matched until their budget's status shows them (or `drain` passes)
        deadline = time.monotonic() + drain
        while rec.not_reflected() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        rec.matching = False
        farm1 = (self.farm.claims_created, self.farm.claims_released) if self.farm else (0, 0)
        cpu = time.process_time() - cpu0
        updates = rec.updates - updates0
        total = sum(updates.values())
        return {
            "emulator_cpu_seconds": round(cpu, 2), "object_updates": total,
            "object_updates_by_resource": dict(updates.most_common()),
            "emulator_cpu_s_per_1000_updates": round(cpu * 1000 / max(1, total), 4),
            "window_seconds": round(window, 2), "creates": rec.window_creates, "completions": rec.window_completions,
            "creator_max_lag_seconds": round(late, 3),
            "pod_events": dict(rec.window_pod_events), "pod_events_total": sum(rec.window_pod_events.values()),
            "budget_status_writes": rec.window_budget_writes,
            "budget_latencies": sorted(rec.budget_latencies), "not_reflected": rec.not_reflected(),
            "mig_ungate_latencies": sorted(rec.mig_ungate_latencies), "mig_not_ungated": len(rec.mig_created),
            "mig_claims_created": farm1[0] - farm0[0], "mig_claims_released": farm1[1] - farm0[1],
            "farm_errors": self.farm.errors if self.farm else 0,
            "pods_in_store": self.count(PODS),
            "loop_errors": {c.name: c.errors for c in (self.cluster.kubelets, self.cluster.scheduler,
                                                         self.cluster.node_lifecycle, self.cluster.jobs)},
        }

    async def stop(self) -> None:
        if self.deleter is not None:
            self.deleter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.deleter
        if self.farm is not None:
            await self.farm.stop()
        await self.cluster.stop()


Reply = tuple[str, Any]


async def serve(conn: Any, emu: Emulator, answer: Callable[[Any], Awaitable[Reply | None]],
                prepare: Callable[[], Awaitable[None]] | None = None) -> None:
    """The child's side of the pipe, for bench/scale.py and chaos/ha_failover.py alike: the emulator booted,
    `prepare`d and filled, then ("ready", its facts); one reply per command until `answer` returns None (the
    parent is done); an exception goes back as ("error", ...) and is raised; ("stopped", {}) once it is down."""
    try:
        await emu.boot()
        if prepare is not None:
            await prepare()
        await emu.fill()
        conn.send(("ready", {**emu.info, "size": emu.size.__dict__, "status": emu.status()}))
        while (reply := await answer(await asyncio.to_thread(conn.recv))) is not None:
            conn.send(reply)
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        raise
    finally:
        await emu.stop()
        conn.send(("stopped", {}))


def quiet_child() -> None:
    """An emulator child's process settings: its log quiet in the terminal, the collector tuned for its heap."""
    logs.configure(json=False, level="WARNING")
    tune_for_large_heaps()


async def _serve(conn: Any, p: Params) -> None:
    emu = Emulator(p)

    async def answer(msg: Any) -> Reply | None:
        if msg[0] == "status":
            return "status", emu.status()
        if msg[0] == "churn":
            return "churned", await emu.churn(float(msg[1]), float(msg[2]))
        return None

    await serve(conn, emu, answer)


def child_main(conn: Any, p: Params, profile: str | None = None) -> None:
    """The child process's entry point (multiprocessing target)."""
    quiet_child()
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            asyncio.run(_serve(conn, p))
        finally:
            prof.disable()
            prof.dump_stats(profile)
    else:
        asyncio.run(_serve(conn, p))


class EmulatorProcess:
    """A spawned emulator child (`target(conn, *args)`) and its pipe: (kind, payload) messages each way; shared by
    bench/scale.py and chaos/ha_failover.py."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(theirs, *args), daemon=True)
        self.proc.start()

    def expect(self, kind: str, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"the emulator sent no {kind!r} within {timeout:g} s")
        got, payload = self.conn.recv()
        if got != kind:
            raise RuntimeError(f"the emulator answered {got!r} instead of {kind!r}: {payload}")
        return payload

    def ask(self, msg: tuple[Any, ...], kind: str, timeout: float) -> Any:
        self.conn.send(msg)
        return self.expect(kind, timeout)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("stop",))
                self.expect("stopped", 60)
            except (TimeoutError, RuntimeError, OSError, EOFError):
                pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)

"""Node autoprovisioning on the emulated cluster: our controller against the seed's algorithm.

Two runs of the SAME seeded workload, concurrently, each on its own `SimCluster` with 12 power-managed machines
(3 each of 1, 2, 4 and 8 GPUs, all powered off at start; full mode: 20 s boot + 5 s until the device plugin
reports GPUs, 5 s shutdown; --quick divides every time, including the baseline's poll, by 20):

  ours      `gpuops run --controllers autoprovision` (OperatorHarness subprocess), one GPUNodeGroup per machine
            (CRD from manifests/crds/) whose scaleUp/scaleDown URLs point at a recording proxy run by this
            bench, which timestamps each POST as it arrives and forwards it to the sim power API.
            scaleDownUnneededSeconds = scaleDownDelayAfterScaleUpSeconds = 30 s (2 s in --quick): about one
            boot (25 s), the break-even point of keeping a machine warm in this compressed timeline, instead of
            the defaults of 600 s sized for real machines that boot in minutes. bootTimeoutSeconds = 120 (10).
  baseline  the seed's main.go algorithm (dseif0x/k8s-gpu-autoprovision) re-implemented below
            (`SeedAutoprovisioner`, which lists the steps it follows and the defects it keeps), POSTing through
            the same kind of recording proxy to the same sim power API. No operator process.

Workload (seeded, identical offsets in both runs): bursts of 3-7 bare pods (restartPolicy Never) at random
instants of the first 480 s, each pod 1/2/4/8 GPUs (weights 35/30/20/15 %), short (30-60 s, 70 %) or long
(180-300 s, 30 %, only in bursts before 280 s), runtimes through `sim.gpuops.io/runtime-seconds`, created
in-process (`cluster.access.create`) so the bench's own HTTP does not pace them. Every run is observed for the
same horizon: 660 s after its first pod (the 10-minute workload plus a minute for scale-down).

Measured in the bench process, on one monotonic clock:
  * from a store listener on each emulator: when each pod first had PodScheduled=False reason=Unschedulable,
    when it was bound (and to which machine), when it first was Running, when it stopped running;
  * from a fleet subscriber: every machine power transition (off/booting/on/shutting-down);
  * from the proxy: every POST's arrival time, machine, direction, the machine's power state at arrival and
    the power API's answer (202 = a transition started, 200 = already in that state: a no-op).
Definitions:
  * decision latency (per pod): for a pod that became Unschedulable at u while the machine it eventually ran
    on was not powered (off or shutting down), the arrival time of the first power-on POST for that machine
    in [u, bind time] minus u. Pods placed on machines already powered/booting at u need no power-on for
    themselves and are counted separately (`pods_without_own_power_on`). Percentiles are nearest-rank.
  * wait per pod: first Running - creation; makespan: last pod's first Running - first pod's creation.
  * idle GPU-hours (cost): integral over the horizon, for every machine not "off" (booting, on, shutting
    down: all draw power), of its GPUs minus the GPUs of Running pods bound to it; broken down by state.
  * pods left unschedulable: pods never Running by the end of the horizon.
  * duplicate power-on POSTs: power-on POSTs arriving while the machine is already booting (the seed has no
    power state); redundant POSTs: any POST the power API answered 200 (machine already on/booting, or
    off/stopping).
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cli, compare

from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.cluster.access import PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.cluster.machines import Machine
from gpuops_sim.harness import OperatorHarness, free_port, metric_value, until
from gpuops_sim.scenario import Scenario, parse

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "manifests" / "crds" / "gpunodegroups.gpuops.io.yaml"
GROUPS_PATH = "/apis/gpuops.io/v1alpha1/gpunodegroups"
NS = "bench"
SIZES = (1, 2, 4, 8)
PER_SIZE = 3
GPU = "nvidia.com/gpu"
LATENCY_TARGET = 0.2


@dataclass(frozen=True)
class Mode:
    scale: float  # every time of the full run is multiplied by this
    boot: float
    device_plugin: float
    shutdown: float
    seed_poll: float
    unneeded: int
    delay_after_up: int
    boot_timeout: int
    horizon: float


FULL = Mode(1.0, 20.0, 5.0, 5.0, 10.0, 30, 30, 120, 660.0)
QUICK = Mode(1 / 20, 1.0, 0.25, 0.25, 0.5, 2, 2, 10, 33.0)


# ---------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class JobSpec:
    name: str
    at: float
    gpus: int
    runtime: float
    long: bool


def workload(seed: int, scale: float) -> list[JobSpec]:
    rng = random.Random(seed)
    bursts = sorted([0.0, *(rng.uniform(20.0, 480.0) for _ in range(8))])
    jobs: list[JobSpec] = []
    for b in bursts:
        for _ in range(rng.randint(3, 7)):
            at = b + rng.uniform(0.0, 3.0)
            gpus = rng.choices(SIZES, weights=(35, 30, 20, 15))[0]
            long = b <= 280.0 and rng.random() < 0.3
            runtime = rng.uniform(180.0, 300.0) if long else rng.uniform(30.0, 60.0)
            jobs.append(JobSpec(f"job-{len(jobs):03d}", round(at * scale, 3), gpus, round(runtime * scale, 2), long))
    return sorted(jobs, key=lambda j: j.at)


def pod_body(j: JobSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": j.name, "namespace": NS, "labels": {"app": "autoprovision-bench"},
                         "annotations": {"sim.gpuops.io/runtime-seconds": str(j.runtime)}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {GPU: str(j.gpus)}}}]}}


def scenario(name: str, mode: Mode) -> Scenario:
    groups = [{"name": f"g{n}", "gpuModel": "A100-80GB", "gpusPerNode": n, "count": PER_SIZE,
               "poweredOff": PER_SIZE, "bootSeconds": mode.boot, "devicePluginSeconds": mode.device_plugin,
               "shutdownSeconds": mode.shutdown} for n in SIZES]
    return parse({
        "name": name, "namespaces": [NS],
        "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": max(0.3, 2.0 * mode.scale),
                    "nodeStatusSeconds": 60, "events": False},
        "scheduler": {"events": False},
        "nodeLifecycle": {"nodeMonitorGraceSeconds": max(1.0, 8.0 * mode.scale),
                          "podGcOrphanSeconds": max(2.0, 40.0 * mode.scale)},
        "nodeGroups": groups,
    })


def machines() -> list[tuple[str, int]]:
    """The machines in "environment order" (the seed's GPU_NODE_<n>_* order): by size, then index."""
    return [(f"g{n}-{i}", n) for n in SIZES for i in range(PER_SIZE)]


# ---------------------------------------------------------------------------------------------- recording


@dataclass
class PodRec:
    created: float
    gpus: int
    unschedulable: float | None = None
    node: str | None = None
    bound: float | None = None
    running: float | None = None
    stopped: float | None = None
    deleted: float | None = None


@dataclass
class Post:
    at: float
    op: str
    machine: str
    state: str  # the machine's power state when the POST arrived
    status: int = 0


@dataclass
class Recorder:
    """Everything one run's emulator and proxy saw, and the idle-GPU integral."""

    cluster: SimCluster
    pods: dict[str, PodRec] = field(default_factory=dict)
    posts: list[Post] = field(default_factory=list)
    power: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=lambda: {"booting": 0.0, "on": 0.0, "shutting-down": 0.0})
    powered_gpu_seconds: float = 0.0
    t0: float | None = None
    end: float | None = None
    _last: float | None = None
    _used: dict[str, int] = field(default_factory=dict)
    _on: dict[str, tuple[str, int]] = field(default_factory=dict)

    def attach(self) -> None:
        for m in self.cluster.fleet.machines.values():
            self.power[m.name] = [(time.monotonic(), m.state)]
        self.cluster.fleet.subscribe(self._on_machine)
        self.cluster.access.listen(self._on_event)

    def start(self, t0: float) -> None:
        self.t0 = self._last = t0

    def finish(self, end: float) -> None:
        self._advance(end)
        self.end = end

    def state_at(self, machine: str, t: float) -> str:
        state = "off"
        for when, st in self.power.get(machine, ()):
            if when > t:
                break
            state = st
        return state

    def _advance(self, now: float) -> None:
        if self._last is None or self.end is not None or now <= self._last:
            return
        dt = now - self._last
        self._last = now
        for m in self.cluster.fleet.machines.values():
            if m.state != "off":
                self.idle[m.state] += dt * max(0, m.gpus - self._used.get(m.name, 0))
                self.powered_gpu_seconds += dt * m.gpus

    def _on_machine(self, m: Machine, ev: str) -> None:
        now = time.monotonic()
        self._advance(now)  # the fleet changed state already; the interval before `now` was in the old one
        self.power.setdefault(m.name, []).append((now, m.state))

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr != PODS or ev.key[0] != NS:
            return
        obj = ev.new.obj
        name = obj["metadata"]["name"]
        rec = self.pods.get(name)
        if rec is None:
            return
        now = ev.time
        if ev.type == "DELETED" and rec.deleted is None:
            rec.deleted = now
        st = obj.get("status") or {}
        if rec.unschedulable is None and any(
                c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
                for c in st.get("conditions") or ()):
            rec.unschedulable = now
        node = (obj.get("spec") or {}).get("nodeName")
        if node and rec.node is None:
            rec.node, rec.bound = node, now
        running = st.get("phase") == "Running" and ev.type != "DELETED" and not obj["metadata"].get(
            "deletionTimestamp")
        if running and name not in self._on and node:
            self._advance(now)
            self._on[name] = (node, rec.gpus)
            self._used[node] = self._used.get(node, 0) + rec.gpus
            if rec.running is None:
                rec.running = now
        elif not running and name in self._on:
            self._advance(now)
            n, g = self._on.pop(name)
            self._used[n] -= g
            rec.stopped = now


class RecordingProxy:
    """POST /power/v1/machines/{name}/{start|stop}: timestamped on arrival, then forwarded to the sim power API."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/power/v1/machines/{name}/{op}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        name, op = request.match_info["name"], request.match_info["op"]
        m = self.rec.cluster.fleet.get(name)
        post = Post(arrived, op, name, m.state if m else "unknown")
        self.rec.posts.append(post)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length", "connection", "transfer-encoding")}
        assert self._http is not None
        async with self._http.post(f"{self.rec.cluster.cloud.url}{request.path}", data=body, headers=headers) as r:
            data = await r.read()
            post.status = r.status
            out = {k: v for k, v in r.headers.items() if k.lower() in ("content-type", "idempotent-replayed")}
            return web.Response(body=data, status=r.status, headers=out)


# ---------------------------------------------------------------------------------------------- the seed


class SeedAutoprovisioner:
    """dseif0x/k8s-gpu-autoprovision main.go at HEAD, step by step.

    Followed (each step of main.go in quotes, then where it is here):
      * "Loop: time.Ticker(10s); each tick does a full cluster-wide Pods("").List()" -> `run`/`tick`
        (a Ticker's first tick comes one period after start; the tick period is scaled in --quick).
      * "GPU accounting (collectGpuInfo): for each pod, for each regular container with a non-zero
        nvidia.com/gpu request: add to requested; if pod phase is Pending add to pending (regardless of
        spec.nodeName ...); if phase Running add to usage[spec.nodeName]" -> `collect`.
      * "Active node = configured node that appears in usage ... currentCap = sum of GPU counts of active nodes,
        used = sum of their usage, available = currentCap - used" -> `tick`.
      * "Scale up if pending > available: needed = pending - available; take all non-active nodes, sort
        ascending by GPU count, POST scale-up to each in order, subtracting its GPU count from needed, stop when
        needed <= 0; then return (no scale-down in that tick)" -> `tick` (ties keep env order).
      * "Scale down otherwise: among all configured nodes with no Running GPU pods, pick the one with the
        largest GPU count (ties: first in env order) and POST scale-down to it. At most one POST-down per tick."
      * "Webhook call (safePost): POST url with body {}, Content-Type: application/json, 5 s timeout; logs
        status code; never checks it; errors only logged." -> `post`.
    Defects reproduced on purpose: it re-POSTs the largest idle node even when off, so smaller idle nodes stay
    on; no power state (it re-POSTs scale-up to booting nodes every tick); bound-but-starting pods count as
    pending; no taint, no drain; no unneeded time; sums, not bin-packing; no filter on why a pod is pending;
    init containers ignored; fire-and-forget webhooks.
    """

    def __init__(self, cluster: SimCluster, proxy: RecordingProxy, poll: float) -> None:
        self.cluster = cluster
        self.nodes = machines()  # env order
        self.up = {n: f"{proxy.url}/power/v1/machines/{n}/start" for n, _ in self.nodes}
        self.down = {n: f"{proxy.url}/power/v1/machines/{n}/stop" for n, _ in self.nodes}
        self.poll = poll
        self.ticks = 0
        self._http: aiohttp.ClientSession | None = None

    def collect(self) -> tuple[int, int, dict[str, int]]:
        requested = pending = 0
        usage: dict[str, int] = {}
        for p in self.cluster.access.iter(PODS):  # Pods("").List(): every namespace
            phase = (p.get("status") or {}).get("phase")
            for c in (p.get("spec") or {}).get("containers") or ():  # regular containers only: init containers ignored
                res = c.get("resources") or {}
                raw = (res.get("requests") or {}).get(GPU) or (res.get("limits") or {}).get(GPU)
                try:
                    g = int(raw) if raw else 0
                except ValueError:
                    g = 0  # AsInt64 failure silently yields 0
                if not g:
                    continue
                requested += g
                if phase == "Pending":
                    pending += g  # regardless of spec.nodeName: bound pods too
                elif phase == "Running":
                    node = (p.get("spec") or {}).get("nodeName") or ""
                    usage[node] = usage.get(node, 0) + g
        return requested, pending, usage

    async def post(self, url: str) -> None:
        assert self._http is not None
        try:
            async with self._http.post(url, data=b"{}", headers={"Content-Type": "application/json"},
                                       timeout=aiohttp.ClientTimeout(total=5)) as r:
                await r.read()  # the status code is logged by the seed, never checked
        except (aiohttp.ClientError, TimeoutError):
            pass  # errors only logged

    async def tick(self) -> None:
        self.ticks += 1
        _, pending, usage = self.collect()
        active = [(n, g) for n, g in self.nodes if n in usage]
        available = sum(g for _, g in active) - sum(usage[n] for n, _ in active)
        if pending > available:
            needed = pending - available
            for n, g in sorted(((n, g) for n, g in self.nodes if n not in usage), key=lambda x: x[1]):
                await self.post(self.up[n])  # booting or on-but-empty nodes get POSTed again
                needed -= g
                if needed <= 0:
                    break
            return
        idle = [(n, g) for n, g in self.nodes if n not in usage]  # whether or not already off
        if idle:
            biggest = max(g for _, g in idle)
            name = next(n for n, g in idle if g == biggest)
            await self.post(self.down[name])

    async def run(self, stop: asyncio.Event) -> None:
        self._http = aiohttp.ClientSession()
        try:
            start = time.monotonic()
            while not stop.is_set():
                due = start + (self.ticks + 1) * self.poll
                try:
                    await asyncio.wait_for(stop.wait(), max(0.0, due - time.monotonic()))
                    return
                except TimeoutError:
                    pass
                await self.tick()
        finally:
            await self._http.close()


# ---------------------------------------------------------------------------------------------- one run


async def drive(rec: Recorder, jobs: list[JobSpec], horizon: float) -> None:
    t0 = time.monotonic()
    rec.start(t0)
    for j in jobs:
        await asyncio.sleep(max(0.0, t0 + j.at - time.monotonic()))
        rec.pods[j.name] = PodRec(time.monotonic(), j.gpus)
        await rec.cluster.access.create(PODS, NS, pod_body(j))
    await asyncio.sleep(max(0.0, t0 + horizon - time.monotonic()))
    rec.finish(time.monotonic())


def group_body(name: str, gpus: int, proxy: RecordingProxy, mode: Mode) -> dict[str, Any]:
    base = f"{proxy.url}/power/v1/machines/{name}"
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": name},
            "spec": {"nodeName": name, "gpuCount": gpus, "scaleUp": {"url": f"{base}/start"},
                     "scaleDown": {"url": f"{base}/stop"}, "bootTimeoutSeconds": mode.boot_timeout,
                     "scaleDownUnneededSeconds": mode.unneeded,
                     "scaleDownDelayAfterScaleUpSeconds": mode.delay_after_up}}


async def run_ours(jobs: list[JobSpec], mode: Mode, workdir: Path) -> dict[str, Any]:
    cluster = SimCluster(scenario("autoprovision-ours", mode), workload=False, faults=False)
    rec = Recorder(cluster)
    proxy = RecordingProxy(rec)
    async with OperatorHarness(cluster, workdir, crds=[CRD], controllers=["autoprovision"]) as rig:
        rec.attach()
        await proxy.start()
        try:
            for name, gpus in machines():
                await rig.request("POST", GROUPS_PATH, group_body(name, gpus, proxy, mode))

            async def settled() -> bool:
                items = (await rig.request("GET", GROUPS_PATH))["items"]
                return len(items) == len(machines())

            await until("the GPUNodeGroups listed", settled, 30)
            await asyncio.sleep(1.0)  # the operator's informers have them
            await drive(rec, jobs, mode.horizon)
            text, _, _ = await rig.scrape()
            extra = {
                "operator_decision_seconds_count": metric_value(text, "gpuops_autoprovision_decision_seconds_count"),
                "operator_decision_seconds_sum": metric_value(text, "gpuops_autoprovision_decision_seconds_sum"),
                "operator_idle_gpu_seconds": metric_value(text, "gpuops_autoprovision_idle_gpu_seconds_total"),
                "group_states": sorted(f"{g['metadata']['name']}={(g.get('status') or {}).get('state')}"
                                       for g in (await rig.request("GET", GROUPS_PATH))["items"]),
            }
        finally:
            await proxy.stop()
    return {**summarize(rec), **extra}


async def run_baseline(jobs: list[JobSpec], mode: Mode) -> dict[str, Any]:
    async with SimCluster(scenario("autoprovision-seed", mode), workload=False, faults=False) as cluster:
        rec = Recorder(cluster)
        rec.attach()
        proxy = RecordingProxy(rec)
        await proxy.start()
        seed = SeedAutoprovisioner(cluster, proxy, mode.seed_poll)
        stop = asyncio.Event()
        loop = asyncio.create_task(seed.run(stop))
        try:
            await drive(rec, jobs, mode.horizon)
        finally:
            stop.set()
            await loop
            await proxy.stop()
        return {**summarize(rec), "seed_ticks": seed.ticks}


# ---------------------------------------------------------------------------------------------- figures


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def summarize(rec: Recorder) -> dict[str, Any]:
    assert rec.t0 is not None and rec.end is not None
    latencies: list[float] = []
    without = 0
    for p in rec.pods.values():
        if p.unschedulable is None or p.node is None or p.bound is None:
            continue
        if rec.state_at(p.node, p.unschedulable) in ("booting", "on"):
            without += 1
            continue
        first = next((x.at for x in rec.posts if x.op == "start" and x.machine == p.node
                      and p.unschedulable <= x.at <= p.bound), None)
        if first is None:
            without += 1
            continue
        latencies.append(first - p.unschedulable)
    ran = [p for p in rec.pods.values() if p.running is not None and p.running <= rec.end]
    waits = [p.running - p.created for p in ran if p.running is not None]
    first_created = min((p.created for p in rec.pods.values()), default=rec.t0)
    left = len(rec.pods) - len(ran)
    starts = [x for x in rec.posts if x.op == "start"]
    stops = [x for x in rec.posts if x.op == "stop"]
    hours = 3600.0
    return {
        "pods": len(rec.pods),
        "pods_unschedulable_at_some_point": sum(1 for p in rec.pods.values() if p.unschedulable is not None),
        "decision_latency_n": len(latencies),
        "decision_latency_p50_s": r3(pct(latencies, 0.5)),
        "decision_latency_p99_s": r3(pct(latencies, 0.99)),
        "decision_latency_max_s": r3(max(latencies, default=None)),
        "pods_without_own_power_on": without,
        "makespan_s": r3(max(p.running for p in ran if p.running is not None) - first_created) if not left and ran
        else None,
        "wait_p50_s": r3(pct(waits, 0.5)),
        "wait_p99_s": r3(pct(waits, 0.99)),
        "wait_max_s": r3(max(waits, default=None)),
        "pods_left_unschedulable": left,
        "pods_deleted_before_running": sum(1 for p in rec.pods.values() if p.running is None and p.deleted),
        "idle_gpu_hours": round(sum(rec.idle.values()) / hours, 4),
        "idle_gpu_hours_booting": round(rec.idle["booting"] / hours, 4),
        "idle_gpu_hours_on": round(rec.idle["on"] / hours, 4),
        "idle_gpu_hours_shutting_down": round(rec.idle["shutting-down"] / hours, 4),
        "powered_gpu_hours": round(rec.powered_gpu_seconds / hours, 4),
        "power_on_posts": len(starts),
        "power_on_effective": sum(1 for x in starts if x.status == 202),
        "power_on_duplicates_while_booting": sum(1 for x in starts if x.state == "booting"),
        "power_on_redundant": sum(1 for x in starts if x.status == 200),
        "power_off_posts": len(stops),
        "power_off_effective": sum(1 for x in stops if x.status == 202),
        "power_off_redundant": sum(1 for x in stops if x.status == 200),
        "power_cycles": sum(m.power_cycles for m in rec.cluster.fleet.machines.values()),
        "power_cycles_by_machine": {m.name: m.power_cycles for m in rec.cluster.fleet.machines.values()},
        "machines_powered_at_end": sorted(m.name for m in rec.cluster.fleet.machines.values() if m.state != "off"),
        "wait_max_including_left_s": r3(max([*waits, *(rec.end - p.created for p in rec.pods.values()
                                                         if p.running is None or p.running > rec.end)],
                                                default=None)),
        "horizon_s": round(rec.end - rec.t0, 3),
        "pods_detail": [{"name": n, "gpus": p.gpus, "created": r3(p.created - rec.t0),
                         **{k: r3(v - rec.t0) if v is not None else None for k, v in
                            (("unschedulable", p.unschedulable), ("bound", p.bound), ("running", p.running),
                             ("stopped", p.stopped), ("deleted", p.deleted))}, "node": p.node}
                        for n, p in sorted(rec.pods.items())],
        "posts_detail": [{"at": r3(x.at - rec.t0), "op": x.op, "machine": x.machine, "state": x.state,
                          "status": x.status} for x in rec.posts],
    }


METRICS = ("decision_latency_p50_s", "decision_latency_p99_s", "decision_latency_max_s", "makespan_s",
           "wait_p50_s", "wait_p99_s", "wait_max_s", "wait_max_including_left_s", "idle_gpu_hours", "powered_gpu_hours",
           "pods_left_unschedulable", "pods_deleted_before_running", "power_on_posts", "power_on_effective",
           "power_on_duplicates_while_booting",
           "power_on_redundant", "power_off_posts", "power_off_effective", "power_off_redundant", "power_cycles")


def figures_of(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, float | int]:
    fig: dict[str, float | int] = {}
    for k in METRICS:
        for who, d in (("ours", ours), ("baseline", base)):
            v = d.get(k)
            fig[f"{who}_{k}"] = v if v is not None else -1
    fig["idle_gpu_hours_ratio_baseline_over_ours"] = round(base["idle_gpu_hours"] / ours["idle_gpu_hours"], 3) \
        if ours["idle_gpu_hours"] else -1
    p99 = ours["decision_latency_p99_s"]
    fig["meets_latency_target"] = int(p99 is not None and p99 <= LATENCY_TARGET)
    ow, bw = ours["wait_max_including_left_s"], base["wait_max_including_left_s"]
    fig["meets_cost_target"] = int(ours["idle_gpu_hours"] < base["idle_gpu_hours"] and ow is not None
                                   and (bw is None or ow <= bw) and ours["pods_left_unschedulable"]
                                   <= base["pods_left_unschedulable"])
    return fig


def markdown(fig: dict[str, float | int], ours: dict[str, Any], base: dict[str, Any], command: str,
             mode: Mode, jobs: list[JobSpec]) -> str:
    rows = "\n".join(f"| {k} | {_fmt(ours.get(k))} | {_fmt(base.get(k))} |" for k in METRICS)
    gpu_s = sum(j.gpus * j.runtime for j in jobs)
    return f"""# Node autoprovisioning: ours vs the seed's algorithm

`{command}` - {len(jobs)} pods ({sum(j.long for j in jobs)} long), {gpu_s / 3600:.3f} GPU-hours of work,
12 power-managed machines (3 x 1/2/4/8 GPUs, all off at start, boot {mode.boot:g} s + device plugin
{mode.device_plugin:g} s), horizon {mode.horizon:g} s; ours: scaleDownUnneededSeconds {mode.unneeded},
scaleDownDelayAfterScaleUpSeconds {mode.delay_after_up}; seed poll {mode.seed_poll:g} s. Both runs
concurrently in one bench process (each its own emulator; ours with a `gpuops run` subprocess).

| metric | ours | seed baseline |
|---|---|---|
{rows}

- idle GPU-hours baseline / ours: {fig['idle_gpu_hours_ratio_baseline_over_ours']}
- meets_latency_target (ours p99 <= {LATENCY_TARGET} s): {bool(fig['meets_latency_target'])}
- meets_cost_target (ours idle < baseline idle, ours max wait <= baseline max wait, no more pods left):
  {bool(fig['meets_cost_target'])}
- machines powered at the end: ours {ours['machines_powered_at_end']}, baseline {base['machines_powered_at_end']}

Decision latency: Unschedulable (first time, from the emulator's store) to the arrival at the recording proxy
of the first power-on POST for the machine the pod later ran on, for pods whose machine was off at that
instant (ours: {ours['decision_latency_n']} pods, baseline: {base['decision_latency_n']}). Idle GPU-hours:
GPUs of every machine not off (booting, on, shutting down) minus GPUs of Running pods, integrated over the
horizon. Percentiles are nearest-rank. Definitions in the module docstring of bench/autoprovision.py.
"""


def _fmt(v: Any) -> str:
    return "n/a" if v is None else str(v)


def main() -> int:
    args = cli(__doc__, "every time / 20 (CI: under a minute)", seed=7)
    mode = QUICK if args.quick else FULL
    jobs = workload(args.seed, mode.scale)
    compare("autoprovision", args, mode, jobs, recorded={"workload": [j.__dict__ for j in jobs]},
            ours=lambda tmp: run_ours(jobs, mode, tmp), baseline=lambda: run_baseline(jobs, mode),
            figures_of=figures_of, markdown=markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

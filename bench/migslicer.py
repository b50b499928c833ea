"""The MIG slicer end to end on the emulated cluster: allocation latency, packing through the controller, orders.

One `SimCluster` (this process) with 8 emulated MIG nodes, `gpuops run --controllers migslicer` as a subprocess
(OperatorHarness; webhook on 127.0.0.1, its Service mapped to it, the MutatingWebhookConfiguration of
manifests/webhook/ applied before the operator starts so its CA patcher finds it) and one
`gpuops agent --emulated` subprocess per node (device plugins registered with the simulated kubelets). Every
pod is created in-process with NVIDIA names (`nvidia.com/mig-<p>`), so it goes through the webhook as a
user's pod would; the kubelet's start latency is START_LATENCY. Three phases, one after the other, each on
its own nodes (nodeSelector on the node group, or on one node) so they never share GPUs:

  latency   4 nodes x 2 A100-40GB; pods at a steady rate, 1-3 slices from accounting's "small-heavy" mix,
            runtimes drawn uniformly (short, so slices recycle at about half the compute offered).
            Measured from the pod's ADDED event in the emulator's store to the update that removes the gate
            `gpuops.io/mig-slicer`, and to Running. Pods that were told NoCapacity before their gate went
            (`gpuops.io/MigSlices=False`) waited for slices to be freed: reported apart, and the p99 <= 500 ms
            target applies to the others (the pods that fit on arrival).
  orders    2 nodes x 1 A100-40GB; feasible single-GPU batches (accounting's definition: one request of several
            slices) sent as one pod whose containers list the slices in a given order, on an empty GPU.
            Batches are drawn among those where DAS's lowest-free-slot fails in some order; each in a DAS-
            failing order and another one. Placed = ungated within ORDER_DEADLINE, every slice's claim Bound
            (the kubelet's Allocate reached the agent) and the pod Succeeded. `bench_orders` of
            bench/accounting.py (all feasible batches, every order, accounting level) runs alongside.
  packing   2 nodes x 8 A100-40GB; the churn sequences `churn(seed, n, 0.8, uniform)` of bench/accounting.py (its
            headline mix and load) for `Mode.pack_seeds` seeds, each on its own empty node, the two nodes side by
            side; time scaled so a seed's arrivals span `Mode.pack_span` s. One pod per arrival, runtime = its
            lifetime. Verdict, the same rule as the accounting simulation (a request is judged once, at arrival,
            and dropped if it does not fit): accepted = the gate is lifted; rejected = the allocator's first answer
            is NoCapacity, or no gate lift within ACCEPT_WINDOW. Rejected pods are deleted at once; after a seed's
            last verdict its running pods are deleted and the node must hold no slice before the next seed. The
            same events go through accounting's `simulate` with `ours` and `das_lowest_free_slot` and through the
            per-GPU repack bound (`simulate_repack`); the target is accounting's: our gain over DAS end to end
            >= RATIO_TARGET of the bound's gain, means over the seeds. The end-to-end figure differs from
            accounting's `ours` only by timing: a pod holds its slices from its plan until its claims end after
            it finishes (Released: the allocator plans on those placements from then; or the agent destroyed
            the slices, if that came first), not exactly [arrival, arrival + lifetime). That hold is measured
            per pod; a replay of `ours` with the measured arrivals and holds shows how much of the gap timing
            explains, and every policy is also run with the measured arrivals and the mean measured hold
            extension.

Everything is timed on this process's monotonic clock (store events carry it). Percentiles are nearest-rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cli, publish
from accounting import (
    BATCH_SIZES,
    GEOM,
    MIXES,
    PROFILES,
    RATIO_TARGET,
    Event,
    Placer,
    _das_single_gpu,
    _distinct_orders,
    bench_orders,
    churn,
    das_lowest_free_slot,
    ours,
    simulate,
    simulate_repack,
)

from gpuops.accounting import mig
from gpuops.controllers.migslicer.allocator import CONDITION
from gpuops.controllers.migslicer.api import GATE, NVIDIA_PREFIX, OUR_PREFIX
from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.store import GroupResource, WatchEvent
from gpuops_sim.cluster.access import PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, free_port, metric_value, until
from gpuops_sim.scenario import Scenario, parse

ROOT = Path(__file__).resolve().parents[1]
CRDS = [ROOT / "manifests" / "crds" / f"{n}.gpuops.io.yaml" for n in ("mignodes", "allocationclaims")]
WEBHOOK = ROOT / "manifests" / "webhook" / "mutatingwebhookconfiguration.yaml"
CLAIMS_GR: GroupResource = ("gpuops.io", "allocationclaims")
MIGNODES_GR: GroupResource = ("gpuops.io", "mignodes")
MODEL = "A100-40GB"
GROUP_LABEL = "gpuops.io/node-group"
HOSTNAME = "kubernetes.io/hostname"
LAT_NS, ORD_NS, PACK_NS = "lat", "ord", "pack"
NODE_GROUPS = {"lat": (4, 2), "ord": (2, 1), "pack": (2, 8)}  # group -> (nodes, GPUs per node)
START_LATENCY = 0.1  # emulated kubelet: bind -> Running
SEED = 2026  # bench/accounting.py's seed
PACK_MIX, PACK_RHO = "uniform", 0.8  # bench/accounting.py's HEADLINE
ACCEPT_WINDOW = 2.0
# The allocator's condition reasons that refuse a pod (its `_no_fit`): no placement now, or a plan that failed.
REFUSALS = frozenset({"NoCapacity", "Unsatisfiable", "InvalidRequest", "DeviceNotAdvertised", "UngateRefused",
                      "AgentNotReporting", "AgentNotRegistered", "MigDisabled", "MigResetPending", "UnknownGPUModel",
                      "AgentReportRefused", "MigManagerConflict"})
ORDER_DEADLINE = 10.0
DRAIN_DEADLINE = 60.0  # a packing node's slices all gone after its sequence's leftover pods are deleted
LATENCY_TARGET_MS = 500.0


@dataclass(frozen=True)
class Mode:
    lat_rate: float  # pods per second
    lat_seconds: float
    lat_runtime: tuple[float, float]
    pack_events: int  # per seed
    pack_span: float  # seconds of wall time one seed's arrivals span
    pack_seeds: int
    order_batches: int
    orders_samples: int  # bench_orders(samples, cap)
    orders_cap: int
    headline_20k: bool


# Packing: 2 nodes side by side at 1 pod/s each (full), so the operator sees 2 pods/s in all and a lifetime (about
# 13 s) is long against the measured hold extension; the quick run's 2 seeds are a smoke test, not a figure.
FULL = Mode(4.0, 45.0, (1.0, 3.0), 160, 160.0, 10, 60, 3000, 720, True)
QUICK = Mode(3.0, 8.0, (0.5, 1.5), 50, 25.0, 2, 10, 300, 120, False)


# ---------------------------------------------------------------------------------------------- recording


@dataclass(eq=False)
class ClaimRec:
    pod: PodRec
    node: str
    added: float
    created: float | None = None
    advertised: float | None = None
    bound: float | None = None  # the kubelet's Allocate reached the agent
    device: str = ""
    history: list[tuple[float, str, str]] = field(default_factory=list)  # (time, phase, message) changes
    present: bool = False  # its slice was seen in the MigNode
    gone: float | None = None  # ... and then no longer
    ended: float | None = None  # Released or Failed: the allocator plans on its placement from then

    @property
    def freed(self) -> float | None:
        """When its placement was free to plan on: the claim ended or its slice went, whichever came first."""
        return min((t for t in (self.ended, self.gone) if t is not None), default=None)


@dataclass(eq=False)
class PodRec:
    ns: str
    name: str
    profiles: tuple[str, ...]
    runtime: float
    due: float
    call_start: float = 0.0
    call_end: float = 0.0
    error: str = ""
    uid: str = ""
    added: float | None = None
    gated_at_admission: bool = False
    renamed: bool = False
    planned: float | None = None
    no_fit: float | None = None
    no_fit_reason: str = ""
    ungated: float | None = None
    bound: float | None = None
    node: str = ""
    running: float | None = None
    finished: float | None = None
    end_phase: str = ""
    end_reason: str = ""
    deleted: float | None = None
    released: float | None = None  # every placement free to plan on (claims ended, or slices gone)
    slices_gone: float | None = None  # every slice gone from the agent's report
    verdict: str = ""
    claims: list[ClaimRec] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def all_claims(self, attr: str) -> float | None:
        """When every slice reached a claim milestone (`created`, `advertised`), or None."""
        got: list[float | None] = [getattr(c, attr) for c in self.claims]
        done = [x for x in got if x is not None]
        return max(done) if len(done) == len(got) >= len(self.profiles) else None


class Recorder:
    """A synchronous store listener: pod milestones, claim phases, and slices appearing/vanishing on MigNodes."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], PodRec] = {}
        self.claims: dict[tuple[str, str], ClaimRec] = {}
        self.node_devices: dict[str, set[str]] = {}
        self._watch: dict[str, set[ClaimRec]] = {}  # node -> claims with a device not yet seen gone
        self.changed = asyncio.Event()

    def on_event(self, ev: WatchEvent) -> None:
        if ev.gr == PODS:
            self._pod(ev)
        elif ev.gr == CLAIMS_GR:
            self._claim(ev)
        elif ev.gr == MIGNODES_GR:
            self._mignode(ev)
        else:
            return
        self.changed.set()

    def _pod(self, ev: WatchEvent) -> None:
        rec = self.pods.get(ev.key)
        if rec is None:
            return
        obj, t = ev.new.obj, ev.time
        spec, st = obj.get("spec") or {}, obj.get("status") or {}
        if ev.type == "ADDED" and rec.added is None:
            rec.added, rec.uid = t, obj["metadata"].get("uid", "")
            rec.gated_at_admission = any(g.get("name") == GATE for g in spec.get("schedulingGates") or ())
            keys = [k for c in spec.get("containers") or () for k in ((c.get("resources") or {}).get("limits") or {})]
            rec.renamed = bool(keys) and all(k.startswith(OUR_PREFIX) for k in keys)
        if ev.type == "DELETED":
            rec.deleted = rec.deleted or t
            rec.event.set()
            return
        if rec.added is not None and rec.ungated is None and not any(
                g.get("name") == GATE for g in spec.get("schedulingGates") or ()):
            rec.ungated = t
        if rec.no_fit is None:
            for c in st.get("conditions") or ():
                # Only a refusal counts: the allocator also sets False while a planned pod waits (Planned,
                # CreatingSlices, WaitingForNode: the hand-off queue, the agent, the kubelet), which is progress
                if c.get("type") == CONDITION and c.get("status") == "False" and c.get("reason") in REFUSALS:
                    rec.no_fit, rec.no_fit_reason = t, str(c.get("reason") or "")
        if spec.get("nodeName") and rec.bound is None:
            rec.bound, rec.node = t, spec["nodeName"]
        phase = st.get("phase")
        if phase == "Running" and rec.running is None:
            rec.running = t
        if phase in ("Succeeded", "Failed") and rec.finished is None:
            rec.finished, rec.end_phase = t, phase
            rec.end_reason = f"{st.get('reason') or ''}: {st.get('message') or ''}"[:300]
        rec.event.set()

    def _claim(self, ev: WatchEvent) -> None:
        obj, t = ev.new.obj, ev.time
        spec, st = obj.get("spec") or {}, obj.get("status") or {}
        c = self.claims.get(ev.key)
        if c is None:
            pod = self.pods.get((ev.key[0], spec.get("podName", "")))
            if ev.type == "DELETED" or pod is None or spec.get("podUID") != pod.uid:
                return
            c = self.claims[ev.key] = ClaimRec(pod, spec.get("nodeName", ""), t)
            pod.claims.append(c)
            pod.planned = pod.planned or t
        phase, message = str(st.get("phase") or "Pending"), str(st.get("message") or "")
        if not c.history or c.history[-1][1:] != (phase, message):
            c.history.append((t, phase, message[:200]))
        if st.get("phase") in ("Created", "Bound") and c.created is None:
            c.created = t
        if st.get("phase") == "Bound" and c.bound is None:
            c.bound = t
        if st.get("advertised") and c.advertised is None:
            c.advertised = t
        if phase in ("Released", "Failed") and c.ended is None:
            c.ended = t
            _check_released(c.pod)
        device = st.get("deviceUUID") or ""
        if device and not c.device:
            c.device = device
            c.present = device in self.node_devices.get(c.node, ())
            self._watch.setdefault(c.node, set()).add(c)
        c.pod.event.set()

    def _mignode(self, ev: WatchEvent) -> None:
        obj = ev.new.obj
        node = (obj.get("spec") or {}).get("nodeName") or obj["metadata"]["name"]
        devices = set() if ev.type == "DELETED" else {
            s["deviceUUID"] for g in (obj.get("status") or {}).get("gpus") or () for s in g.get("slices") or ()
            if s.get("deviceUUID")}
        self.node_devices[node] = devices
        watched = self._watch.get(node, set())
        for c in list(watched):
            if c.device in devices:
                c.present = True
            elif c.present:
                c.gone = ev.time
                watched.discard(c)
                _check_released(c.pod)
                c.pod.event.set()


def _check_released(pod: PodRec) -> None:
    """A pod's slices are released once every one of its placements is free to plan on."""
    if len(pod.claims) != len(pod.profiles):
        return
    if pod.released is None and all(x.freed is not None for x in pod.claims):
        pod.released = max(x.freed for x in pod.claims if x.freed is not None)
    if pod.slices_gone is None and all(x.gone is not None for x in pod.claims):
        pod.slices_gone = max(x.gone for x in pod.claims if x.gone is not None)


async def wait_on(event: asyncio.Event, ready: Callable[[], bool], deadline: float) -> bool:
    """Until `ready()` (re-checked whenever the listener sets `event`) or the monotonic deadline."""
    while not ready():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), left)
    return True


async def sleep_until(when: float) -> None:
    """Pacing of the arrival schedule (not a wait for a condition)."""
    await asyncio.sleep(max(0.0, when - time.monotonic()))


def resource(profile: str) -> str:
    return NVIDIA_PREFIX + profile.replace("+", "-")


def pod_body(rec: PodRec, selector: dict[str, str], per_container: bool) -> dict[str, Any]:
    """One container asking for every slice, or (per_container) one container per slice in `profiles` order."""
    if per_container:
        containers = [{"name": f"c{i}", "image": "cuda", "resources": {"limits": {resource(p): "1"}}}
                      for i, p in enumerate(rec.profiles)]
    else:
        limits = {resource(p): str(n) for p, n in sorted(Counter(rec.profiles).items())}
        containers = [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": rec.name, "namespace": rec.ns,
                         "annotations": {"sim.gpuops.io/runtime-seconds": f"{rec.runtime:.3f}"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "nodeSelector": selector,
                     "containers": containers}}


# ---------------------------------------------------------------------------------------------- the rig


def scenario() -> Scenario:
    return parse({
        "name": "migslicer-bench", "namespaces": [LAT_NS, ORD_NS, PACK_NS, "gpuops-system"],
        "kubelet": {"startLatencySeconds": START_LATENCY, "leaseSeconds": 2, "nodeStatusSeconds": 30,
                    "events": False},
        "scheduler": {"events": False},
        "nodeGroups": [{"name": g, "gpuModel": MODEL, "gpusPerNode": k, "count": n}
                       for g, (n, k) in NODE_GROUPS.items()],
    })


class Rig:
    """The cluster, the recorder, the operator (harness) and the agents' processes."""

    def __init__(self, cluster: SimCluster, rig: OperatorHarness, recorder: Recorder) -> None:
        self.cluster = cluster
        self.rig = rig
        self.rec = recorder
        self.agents: list[subprocess.Popen[bytes]] = []

    def start_agents(self, plugin_root: Path) -> None:
        for group, (count, gpus) in NODE_GROUPS.items():
            for i in range(count):
                node = f"{group}-{i}"
                with (self.rig.workdir / f"agent-{node}.log").open("ab") as log:
                    self.agents.append(subprocess.Popen(
                        [sys.executable, "-m", "gpuops", "agent", "--emulated", "--gpus", f"{MODEL}:{gpus}",
                         "--node-name", node, "--kubeconfig", str(self.rig.kubeconfig),
                         "--device-plugin-dir", str(plugin_root / node), "--orphan-grace", "1",
                         "--heartbeat", "2", "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
                         "--log-level", "WARNING", "--log-format", "json"],
                        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))

    async def stop_agents(self) -> None:
        for p in self.agents:
            if p.poll() is None:
                p.terminate()
        for p in self.agents:
            try:
                await asyncio.wait_for(asyncio.to_thread(p.wait), 10)
            except TimeoutError:
                p.kill()
                await asyncio.to_thread(p.wait)

    async def ready(self) -> None:
        """Every agent reports its GPUs with MIG enabled, and the webhook answers with the operator's CA."""
        want = {f"{g}-{i}": k for g, (n, k) in NODE_GROUPS.items() for i in range(n)}

        async def reported() -> bool:
            for p in self.agents:
                if p.poll() is not None:
                    raise RuntimeError(f"an agent exited with {p.returncode}; see {self.rig.workdir}")
            for node, gpus in want.items():
                mn = self.cluster.access.get(MIGNODES_GR, "", node)
                got = ((mn or {}).get("status") or {}).get("gpus") or []
                if len(got) != gpus or any(g.get("migMode") != "Enabled" for g in got):
                    return False
            return True

        await until("every agent's MigNode", reported, 60)

        async def webhook_answers() -> bool:  # an unknown profile is denied by the webhook itself
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "webhook-probe"},
                    "spec": {"containers": [{"name": "c", "image": "cuda",
                                             "resources": {"limits": {"nvidia.com/mig-9g.99gb": "1"}}}]}}
            try:
                await self.cluster.access.create(PODS, LAT_NS, body)
            except StatusError as e:
                return "denied the request" in str(e)
            raise RuntimeError("the webhook admitted a pod asking for an unknown MIG profile")

        await until("the webhook trusted and answering", webhook_answers, 60, every=0.2)

    async def create(self, ns: str, name: str, profiles: tuple[str, ...], runtime: float, selector: dict[str, str],
                     *, per_container: bool = False, due: float | None = None) -> PodRec:
        rec = PodRec(ns, name, profiles, runtime, due if due is not None else time.monotonic())
        self.rec.pods[(ns, name)] = rec
        body = pod_body(rec, selector, per_container)
        rec.call_start = time.monotonic()
        try:
            await self.cluster.access.create(PODS, ns, body)
        except StatusError as e:
            rec.error = str(e)
        rec.call_end = time.monotonic()
        return rec

    async def delete(self, rec: PodRec) -> None:
        await self.cluster.access.delete(PODS, rec.ns, rec.name, grace_seconds=0)


# ---------------------------------------------------------------------------------------------- statistics


def pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def ms(x: float | None) -> float:
    return -1.0 if x is None else round(1000 * x, 1)


def dist(xs: Sequence[float]) -> dict[str, float | int]:
    """n, p50, p99, max in ms (-1 when empty)."""
    return {"n": len(xs), "p50_ms": ms(pct(xs, 0.5)), "p99_ms": ms(pct(xs, 0.99)),
            "max_ms": ms(max(xs) if xs else None)}


def spans(recs: Iterable[PodRec], start: Callable[[PodRec], float | None],
          end: Callable[[PodRec], float | None]) -> list[float]:
    out = []
    for r in recs:
        a, b = start(r), end(r)
        if a is not None and b is not None:
            out.append(b - a)
    return out


def anomalies(recs: Iterable[PodRec]) -> list[dict[str, Any]]:
    """Ungated pods that failed, never ran, or lost their slices before their runtime was over: each with its
    timeline (ms from creation) and its claims' phase changes, as evidence."""
    out = []
    for r in recs:
        if r.ungated is None or r.added is None or (r.deleted is not None and r.finished is None):
            continue
        why = []
        if r.end_phase == "Failed":
            why.append("pod Failed")
        if r.finished is not None and r.running is None:
            why.append("finished without Running")
        if r.released is not None and r.released - r.added < r.runtime:
            why.append("slices destroyed before its runtime was over")
        if not why:
            continue
        rel = {k: ms(v - r.added) if v is not None else None for k, v in (
            ("planned", r.planned), ("ungated", r.ungated), ("bound", r.bound), ("running", r.running),
            ("finished", r.finished), ("slices_freed", r.released))}
        out.append({"pod": f"{r.ns}/{r.name}", "profiles": list(r.profiles), "runtime_s": round(r.runtime, 3),
                    "why": why, "node": r.node, "end": r.end_phase, "end_reason": r.end_reason, **rel,
                    "claims": [[(ms(t - r.added), ph, m) for t, ph, m in c.history] for c in r.claims]})
    return out


# ---------------------------------------------------------------------------------------------- phase: latency


async def phase_latency(rig: Rig, mode: Mode) -> dict[str, Any]:
    rng = random.Random(SEED + 1)
    names, weights = [m for m, _ in MIXES["small-heavy"]], [w for _, w in MIXES["small-heavy"]]
    sizes, size_w = [b for b, _ in BATCH_SIZES], [w for _, w in BATCH_SIZES]
    n = round(mode.lat_rate * mode.lat_seconds)
    recs: list[PodRec] = []
    t0 = time.monotonic()
    for i in range(n):
        due = t0 + i / mode.lat_rate
        await sleep_until(due)
        profiles = tuple(rng.choices(names, weights, k=rng.choices(sizes, size_w)[0]))
        runtime = round(rng.uniform(*mode.lat_runtime), 3)
        recs.append(await rig.create(LAT_NS, f"lat-{i:04d}", profiles, runtime, {GROUP_LABEL: "lat"}, due=due))
    everyone = [r for r in recs if not r.error]
    started = await wait_on(rig.rec.changed, lambda: all(r.running or r.finished for r in everyone),
                            time.monotonic() + 60)
    fit = [r for r in everyone if r.no_fit is None or (r.ungated is not None and r.ungated < r.no_fit)]
    waited = [r for r in everyone if r not in fit]
    offered = sum(PROFILES[p].compute for r in recs for p in r.profiles) * statistics.fmean(mode.lat_runtime)
    return {
        "pods": n,
        "create_failures": n - len(everyone),
        "create_errors": sorted({r.error[:200] for r in recs if r.error}),
        "all_started_within_60s": started,
        "offered_compute_share": round(offered / (mode.lat_seconds * 4 * 2 * GEOM.compute_slices), 3),
        "gated_and_renamed_by_webhook": sum(r.gated_at_admission and r.renamed for r in everyone),
        "fit_on_arrival": len(fit),
        "waited_for_capacity": len(waited),
        "never_ungated": sum(r.ungated is None for r in everyone),
        "admission_call": dist([r.call_end - r.call_start for r in everyone]),
        "arrival_lateness_max_ms": ms(max((r.call_start - r.due for r in recs), default=0.0)),
        "fit_to_ungated": dist(spans(fit, lambda r: r.added, lambda r: r.ungated)),
        "fit_to_running": dist(spans(fit, lambda r: r.added, lambda r: r.running)),
        "waited_to_ungated": dist(spans(waited, lambda r: r.added, lambda r: r.ungated)),
        "waited_to_running": dist(spans(waited, lambda r: r.added, lambda r: r.running)),
        "stages_fit": {
            "created_to_planned": dist(spans(fit, lambda r: r.added, lambda r: r.planned)),
            "planned_to_slices_made": dist(spans(fit, lambda r: r.planned, lambda r: r.all_claims("created"))),
            "slices_made_to_advertised": dist(spans(fit, lambda r: r.all_claims("created"),
                                                    lambda r: r.all_claims("advertised"))),
            "advertised_to_ungated": dist(spans(fit, lambda r: r.all_claims("advertised"), lambda r: r.ungated)),
            "ungated_to_bound": dist(spans(fit, lambda r: r.ungated, lambda r: r.bound)),
            "bound_to_running": dist(spans(fit, lambda r: r.bound, lambda r: r.running)),
        },
        "anomalies": anomalies(everyone),
        "slowest_fit": [{"pod": r.name, "profiles": list(r.profiles), "ms": ms(r.ungated - r.added)}
                        for r in sorted(fit, key=lambda r: (r.added or 0) - (r.ungated or 0))[:5]
                        if r.ungated is not None and r.added is not None],
    }


# ---------------------------------------------------------------------------------------------- phase: orders


def order_trials(n_batches: int) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(batch, order): batches where DAS fails in some order, each in one DAS-failing order and one other."""
    rng = random.Random(SEED + 2)
    names = [p.name for p in GEOM.profiles]
    hard: list[tuple[tuple[str, ...], list[tuple[str, ...]], list[tuple[str, ...]]]] = []
    for size in range(2, GEOM.slices + 1):
        for batch in itertools.combinations_with_replacement(names, size):
            if mig.place(GEOM, [], batch) is None:
                continue
            orders = _distinct_orders(batch, 720, rng)
            bad = [o for o in orders if not _das_single_gpu(GEOM, (), o)]
            if bad:
                hard.append((batch, bad, [o for o in orders if o not in bad] or bad))
    trials = []
    for batch, bad, other in rng.sample(hard, min(n_batches, len(hard))):
        first = rng.choice(bad)
        rest = [o for o in other if o != first] or [o for o in bad if o != first]
        trials.append((batch, first))
        if rest:
            trials.append((batch, rng.choice(rest)))
    return trials


async def phase_orders(rig: Rig, mode: Mode) -> dict[str, Any]:
    trials = order_trials(mode.order_batches)
    nodes = [f"ord-{i}" for i in range(NODE_GROUPS["ord"][0])]
    results: list[dict[str, Any]] = []

    async def one(node: str, idx: int, batch: tuple[str, ...], order: tuple[str, ...]) -> None:
        rec = await rig.create(ORD_NS, f"ord-{idx:03d}", order, 0.2, {HOSTNAME: node}, per_container=True)
        placed = not rec.error and await wait_on(rec.event, lambda: rec.ungated is not None,
                                                 (rec.added or time.monotonic()) + ORDER_DEADLINE)
        def empty() -> bool:
            return not rig.rec.node_devices.get(node)

        if placed:  # it runs 0.2 s, its claims are released, the agent destroys its slices: the GPU is empty
            await wait_on(rec.event, lambda: rec.finished is not None, time.monotonic() + ORDER_DEADLINE)
            clean = await wait_on(rig.rec.changed, empty, time.monotonic() + 15)
            await rig.delete(rec)
        else:  # its claims go with it; the agent frees their slices after its orphan grace
            await rig.delete(rec)
            clean = await wait_on(rig.rec.changed, empty, time.monotonic() + 15)
        results.append({"batch": list(batch), "order": list(order), "node": node, "placed": placed,
                        "devices": len({c.device for c in rec.claims if c.bound is not None and c.node == node}),
                        "ungate_ms": ms(rec.ungated - rec.added) if placed and rec.added
                        and rec.ungated else -1, "told_no_capacity_first": rec.no_fit is not None
                        and (rec.ungated is None or rec.no_fit < rec.ungated),
                        "ended": rec.end_phase, "gpu_empty_after": clean, "error": rec.error[:200],
                        "das_places_this_order": _das_single_gpu(GEOM, (), order)})

    async def worker(k: int) -> None:
        for idx in range(k, len(trials), len(nodes)):
            await one(nodes[k], idx, *trials[idx])

    await asyncio.gather(*(worker(k) for k in range(len(nodes))))
    ok = [r for r in results if r["placed"] and r["devices"] == len(r["batch"]) and r["ended"] == "Succeeded"]
    return {
        "trials": len(results),
        "batches": len({tuple(r["batch"]) for r in results}),
        "placed_and_started": len(ok),
        "placed_share": len(ok) / len(results) if results else 0.0,
        "das_share_same_trials": sum(r["das_places_this_order"] for r in results) / len(results) if results else 0.0,
        "told_no_capacity_first": sum(r["told_no_capacity_first"] for r in results),
        "gpu_not_empty_after_trial": sum(not r["gpu_empty_after"] for r in results),
        "ungate": dist([r["ungate_ms"] / 1000 for r in results if r["ungate_ms"] >= 0]),
        "anomalies": anomalies(rig.rec.pods[(ORD_NS, f"ord-{i:03d}")] for i in range(len(trials))
                               if (ORD_NS, f"ord-{i:03d}") in rig.rec.pods),
        "detail": results,
    }


def sequential_single_slice_context() -> dict[str, float]:
    """Context, accounting level: the slices of each feasible empty-GPU batch as separate one-slice pods
    arriving in every order (an online sequence, not one request): how often every order fits."""
    rng = random.Random(SEED + 3)
    names = [p.name for p in GEOM.profiles]
    total = ours_ok = das_ok = 0
    for size in range(1, GEOM.slices + 1):
        for batch in itertools.combinations_with_replacement(names, size):
            if mig.place(GEOM, [], batch) is None:
                continue
            total += 1
            orders = _distinct_orders(batch, 720, rng)
            das_ok += all(_das_single_gpu(GEOM, (), o) for o in orders)
            good = True
            for o in orders:
                gpus = [mig.GPU("gpu0", MODEL)]
                for p in o:
                    got = ours(gpus, (p,))
                    if got is None:
                        good = False
                        break
                    gpus = [mig.GPU("gpu0", MODEL, mig.allocate(GEOM, gpus[0].slices, [pl for _, pl in got]))]
                if not good:
                    break
            ours_ok += good
    return {"batches": total, "ours_share": ours_ok / total, "das_share": das_ok / total}


# ---------------------------------------------------------------------------------------------- phase: packing


def recording(placer: Placer, out: list[bool]) -> Placer:
    def run(gpus: list[mig.GPU], request: tuple[str, ...]) -> list[tuple[int, mig.Placement]] | None:
        got = placer(gpus, request)
        out.append(got is not None)
        return got

    return run


def compute(request: Sequence[str]) -> int:
    return sum(PROFILES[p].compute for p in request)


def acceptance(events: list[Event], placer: Placer) -> float:
    return simulate(events, placer)["compute_weighted_acceptance"]


async def pack_sequence(rig: Rig, mode: Mode, node: str, seed: int) -> dict[str, Any]:
    """One churn sequence through the controller on `node` (empty at the start), then the node drained: the pods
    still running are deleted once every arrival has its verdict, and the node's slices must all be gone."""
    events = churn(seed, mode.pack_events, PACK_RHO, MIXES[PACK_MIX])
    scale = mode.pack_span / events[-1][0]  # wall seconds per time unit of the churn
    recs: list[PodRec] = []
    tasks: list[asyncio.Task[None]] = []

    async def decide(rec: PodRec) -> None:
        if rec.error or rec.added is None:
            rec.verdict = "create failed"
            return
        await wait_on(rec.event, lambda: rec.ungated is not None or rec.no_fit is not None,
                      rec.added + ACCEPT_WINDOW)
        if rec.ungated is not None and (rec.no_fit is None or rec.ungated < rec.no_fit):
            rec.verdict = "accepted"
            return
        rec.verdict = rec.no_fit_reason or "no verdict in window"
        await rig.delete(rec)

    t0 = time.monotonic()
    for i, (t, life, request) in enumerate(events):
        due = t0 + t * scale
        await sleep_until(due)
        rec = await rig.create(PACK_NS, f"pack-{seed}-{i:04d}", request, life * scale, {HOSTNAME: node}, due=due)
        recs.append(rec)
        tasks.append(asyncio.create_task(decide(rec)))
    await asyncio.gather(*tasks)
    end = time.monotonic()
    cut = {r.name for r in recs if r.verdict == "accepted" and r.finished is None}
    for r in recs:
        if r.name in cut:
            await rig.delete(r)
    drained = await wait_on(rig.rec.changed, lambda: not rig.rec.node_devices.get(node) and all(
        r.deleted is not None or r.finished is not None or r.verdict != "accepted" for r in recs),
        time.monotonic() + DRAIN_DEADLINE)
    out = pack_analysis(events, recs, t0, end, scale, cut)
    return {"seed": seed, "node": node, "drained": drained, **out}


def pack_analysis(events: list[Event], recs: list[PodRec], t0: float, end: float, scale: float,
                  cut: set[str]) -> dict[str, Any]:
    """Acceptance through the controller beside ours, DAS and the per-GPU repack bound at accounting level on
    the same events, nominal and with the measured timing (arrivals as created, every lifetime + the mean
    measured hold extension: policy-neutral), plus the replay of `ours` with each pod's own measured hold."""
    offered = sum(compute(r) for _, _, r in events)
    accepted = [r.verdict == "accepted" for r in recs]
    e2e = sum(compute(r.profiles) for r, ok in zip(recs, accepted, strict=True) if ok) / offered
    acct_decisions: list[bool] = []
    acct = acceptance(events, recording(ours, acct_decisions))
    # Timing: how long each accepted pod held its slices, against its lifetime (pods cut by the drain excluded).
    holds = {r.name: r.released - r.added for r in recs
             if r.verdict == "accepted" and r.released and r.added and r.name not in cut}
    ext = [holds[r.name] - r.runtime for r in recs if r.name in holds]
    mean_ext = statistics.fmean(ext) if ext else 0.0
    # the same, until the agent's report dropped the slices (how holds were measured before claims ending freed
    # their placements for planning)
    ext_gone = [r.slices_gone - r.added - r.runtime for r in recs if r.name in holds and r.slices_gone and r.added]
    replay_events: list[Event] = []
    matched: list[Event] = []
    for (_, life, request), r in zip(events, recs, strict=True):
        arrival = ((r.added or r.call_start) - t0) / scale
        matched.append((arrival, life + mean_ext / scale, request))
        if r.name in holds:
            hold = holds[r.name] / scale
        elif r.verdict == "accepted":  # still running at the end: holds past every later arrival
            hold = (end - (r.added or r.call_start)) / scale + 1e6
        else:
            hold = life + mean_ext / scale
        replay_events.append((arrival, hold, request))
    replay_decisions: list[bool] = []
    replay = acceptance(replay_events, recording(ours, replay_decisions))
    acc = [r for r in recs if r.verdict == "accepted"]
    return {
        "events": len(events),
        "scale_seconds_per_unit": round(scale, 5),
        "arrival_lateness_max_ms": ms(max(r.call_start - r.due for r in recs)),
        "verdicts": dict(Counter(r.verdict for r in recs)),
        "e2e_ours": e2e,
        "acct_ours": acct,
        "acct_das": acceptance(events, das_lowest_free_slot),
        "acct_repack": simulate_repack(events, across_gpus=False),
        "matched_ours": acceptance(matched, ours),
        "matched_das": acceptance(matched, das_lowest_free_slot),
        "matched_repack": simulate_repack(matched, across_gpus=False),
        "replay_ours_measured_timing": replay,
        "decisions_differing_from_acct": sum(a != b for a, b in zip(accepted, acct_decisions, strict=True)),
        "decisions_differing_from_replay": sum(a != b for a, b in zip(accepted, replay_decisions, strict=True)),
        "rejected_but_planned_before_deletion": sum(1 for r in recs if r.verdict != "accepted" and r.claims),
        "cut_by_drain": len(cut),
        "anomalies": anomalies(r for r in recs if r.name not in cut),
        "hold_extension": dist(ext),
        "hold_extension_mean_ms": ms(mean_ext),
        "hold_extension_until_slices_gone_mean_ms": ms(statistics.fmean(ext_gone)) if ext_gone else None,
        "accepted_to_ungated": dist(spans(acc, lambda r: r.added, lambda r: r.ungated)),
        "start_overhead": dist(spans(acc, lambda r: r.added, lambda r: r.running)),
        "release_after_finish": dist(spans(acc, lambda r: r.finished, lambda r: r.released)),
        "pods": [{"name": r.name, "profiles": list(r.profiles), "verdict": r.verdict, "acct_ours": d,
                  "created_s": round((r.added or 0) - t0, 3), "runtime_s": round(r.runtime, 3),
                  "hold_s": round(holds[r.name], 3) if r.name in holds else None}
                 for r, d in zip(recs, acct_decisions, strict=True)],
    }


async def phase_packing(rig: Rig, mode: Mode) -> dict[str, Any]:
    """`mode.pack_seeds` sequences, as many at once as there are packing nodes (each node runs its share one
    after the other), then their means."""
    nodes = [f"pack-{i}" for i in range(NODE_GROUPS["pack"][0])]
    seeds = [SEED + k for k in range(mode.pack_seeds)]

    async def lane(k: int) -> list[dict[str, Any]]:
        return [await pack_sequence(rig, mode, nodes[k], s) for s in seeds[k::len(nodes)]]

    runs = sorted((r for lst in await asyncio.gather(*(lane(k) for k in range(len(nodes)))) for r in lst),
                  key=lambda r: r["seed"])
    return {"seeds": seeds, "runs": runs, "summary": pack_summary(runs)}


def pack_summary(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Means over the seeds, the gains (points) and the share of the bound's gain (ratio of the means)."""
    mean = {k: statistics.fmean(r[k] for r in runs) for k in (
        "e2e_ours", "acct_ours", "acct_das", "acct_repack", "matched_ours", "matched_das", "matched_repack",
        "replay_ours_measured_timing")}
    gains = [100 * (r["e2e_ours"] - r["acct_das"]) for r in runs]
    out = {**mean,
           "gain_e2e": 100 * (mean["e2e_ours"] - mean["acct_das"]),
           "gain_e2e_stdev": statistics.stdev(gains) if len(gains) > 1 else 0.0,
           "gain_acct": 100 * (mean["acct_ours"] - mean["acct_das"]),
           "bound_gain": 100 * (mean["acct_repack"] - mean["acct_das"]),
           "gain_e2e_matched": 100 * (mean["e2e_ours"] - mean["matched_das"]),
           "bound_gain_matched": 100 * (mean["matched_repack"] - mean["matched_das"]),
           "hold_extension_mean_ms": statistics.fmean(r["hold_extension_mean_ms"] for r in runs),
           "hold_extension_until_slices_gone_mean_ms": statistics.fmean(
               r["hold_extension_until_slices_gone_mean_ms"] or 0.0 for r in runs)}
    out["ratio_e2e"] = out["gain_e2e"] / out["bound_gain"] if out["bound_gain"] > 0 else math.nan
    out["ratio_acct"] = out["gain_acct"] / out["bound_gain"] if out["bound_gain"] > 0 else math.nan
    out["ratio_e2e_matched"] = (out["gain_e2e_matched"] / out["bound_gain_matched"]
                                if out["bound_gain_matched"] > 0 else math.nan)
    return out


# ---------------------------------------------------------------------------------------------- run


async def run(mode: Mode) -> dict[str, Any]:
    plugins = Path(tempfile.mkdtemp(prefix="mb", dir="/tmp"))  # unix socket paths must stay short
    workdir = Path(tempfile.mkdtemp(prefix="migslicer-bench-"))
    port = free_port()
    cluster = SimCluster(scenario(), workload=False, faults=False, manifests=[WEBHOOK], device_plugin_root=plugins)
    cluster.server.service_endpoints[("gpuops-system", "gpuops-webhook")] = f"127.0.0.1:{port}"
    recorder = Recorder()
    timings: dict[str, float] = {}
    t = time.monotonic()
    try:
        async with OperatorHarness(cluster, workdir, crds=CRDS, controllers=("migslicer",),
                                   extra_args=["--mig-webhook-port", str(port), "--mig-webhook-host",
                                               "127.0.0.1"]) as harness:
            cluster.access.listen(recorder.on_event)
            rig = Rig(cluster, harness, recorder)
            rig.start_agents(plugins)
            try:
                await rig.ready()
                timings["setup_s"] = time.monotonic() - t
                t = time.monotonic()
                latency = await phase_latency(rig, mode)
                timings["latency_phase_s"] = time.monotonic() - t
                t = time.monotonic()
                orders_e2e = await phase_orders(rig, mode)
                timings["orders_phase_s"] = time.monotonic() - t
                t = time.monotonic()
                packing = await phase_packing(rig, mode)
                timings["packing_phase_s"] = time.monotonic() - t
                text, _, _ = await harness.scrape()
                operator = {
                    "allocation_seconds_count": metric_value(text, "gpuops_migslicer_allocation_seconds_count"),
                    "allocation_seconds_sum": metric_value(text, "gpuops_migslicer_allocation_seconds_sum"),
                    "plan_failures_no_capacity": metric_value(text, "gpuops_migslicer_plan_failures_total",
                                                              {"reason": "NoCapacity"}),
                    # the same quantity measured here, for every pod the allocator ungated
                    "measured_ungate_count": len(ungated := [r.ungated - r.added for r in recorder.pods.values()
                                                             if r.ungated is not None and r.added is not None]),
                    "measured_ungate_sum": sum(ungated),
                    "operator_alive": harness.proc is not None and harness.proc.poll() is None,
                    "agents_alive": sum(p.poll() is None for p in rig.agents),
                }
            finally:
                await rig.stop_agents()
    finally:
        shutil.rmtree(plugins, ignore_errors=True)
    logs_seen = log_problems(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    return {"latency": latency, "orders_e2e": orders_e2e, "packing": packing, "operator": operator,
            "logs": logs_seen, "timings": timings}


def log_problems(workdir: Path) -> dict[str, Any]:
    """Warnings and errors the operator and the agents logged (JSON lines), with a few examples: evidence."""
    out: dict[str, Any] = {"warning": 0, "error": 0, "examples": []}
    for path in sorted(workdir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            level = next((lv for lv in ("error", "critical", "warning") if f'"level": "{lv}"' in line
                          or f'"level":"{lv}"' in line), "error" if line.startswith("Traceback") else "")
            if not level:
                continue
            out["warning" if level == "warning" else "error"] += 1
            if len(out["examples"]) < 8:
                out["examples"].append(f"{path.name}: {line[:400]}")
    return out


def main() -> int:
    args = cli(__doc__, "short run for CI (under a minute)")
    mode = QUICK if args.quick else FULL
    started = time.monotonic()
    got = asyncio.run(run(mode))
    t = time.monotonic()
    orders_acct = bench_orders(mode.orders_samples, mode.orders_cap)
    sequential = sequential_single_slice_context()
    headline: dict[str, float] = {}
    if mode.headline_20k:
        ev = churn(SEED, 20_000, PACK_RHO, MIXES[PACK_MIX])
        headline = {"ours": acceptance(ev, ours), "das": acceptance(ev, das_lowest_free_slot),
                    "repack": simulate_repack(ev, across_gpus=False)}
    got["timings"]["accounting_level_s"] = time.monotonic() - t
    got["timings"]["total_s"] = time.monotonic() - started
    fig = figures(got, orders_acct, sequential, headline)
    md = markdown(fig, got, orders_acct, sequential, headline, mode, args.quick)
    extra = {"mode": "quick" if args.quick else "full", "mode_settings": mode.__dict__, "seed": SEED,
             "start_latency_s": START_LATENCY, "accept_window_s": ACCEPT_WINDOW, **got,
             "orders_accounting": orders_acct, "sequential_single_slice_context": sequential,
             "accounting_20k_headline": headline}
    publish("migslicer", fig, md, extra, args.out)
    return 0


def pack_figures(pk: dict[str, Any]) -> dict[str, float | int]:
    """Section (b)'s figures: means over the seeds (JSON `packing.runs` holds each seed's)."""
    sm, runs = pk["summary"], pk["runs"]
    return {
        "pack_seeds": len(runs),
        "pack_events_per_seed": runs[0]["events"],
        "pack_e2e_ours_pct": round(100 * sm["e2e_ours"], 2),
        "pack_acct_ours_pct": round(100 * sm["acct_ours"], 2),
        "pack_acct_das_pct": round(100 * sm["acct_das"], 2),
        "pack_acct_per_gpu_repack_pct": round(100 * sm["acct_repack"], 2),
        "pack_gain_e2e_vs_das_points": round(sm["gain_e2e"], 2),
        "pack_gain_e2e_stdev_points": round(sm["gain_e2e_stdev"], 2),
        "pack_gain_acct_vs_das_points": round(sm["gain_acct"], 2),
        "pack_bound_gain_points": round(sm["bound_gain"], 2),
        "pack_gain_e2e_share_of_bound": round(sm["ratio_e2e"], 3),
        "pack_gain_acct_share_of_bound": round(sm["ratio_acct"], 3),
        "pack_gain_e2e_share_of_bound_timing_matched": round(sm["ratio_e2e_matched"], 3),
        "pack_e2e_minus_acct_points": round(100 * (sm["e2e_ours"] - sm["acct_ours"]), 2),
        "pack_replay_measured_timing_pct": round(100 * sm["replay_ours_measured_timing"], 2),
        "pack_decisions_differing_from_acct": sum(r["decisions_differing_from_acct"] for r in runs),
        "pack_decisions_differing_from_replay": sum(r["decisions_differing_from_replay"] for r in runs),
        "pack_hold_extension_mean_ms": round(sm["hold_extension_mean_ms"], 1),
        "pack_hold_extension_until_slices_gone_mean_ms": round(sm["hold_extension_until_slices_gone_mean_ms"], 1),
        "pack_no_verdict_in_window": sum(r["verdicts"].get("no verdict in window", 0) for r in runs),
        "pack_rejected_but_planned": sum(r["rejected_but_planned_before_deletion"] for r in runs),
        "pack_accepted_pods_failed_or_slices_lost": sum(len(r["anomalies"]) for r in runs),
        "pack_nodes_not_drained": sum(not r["drained"] for r in runs),
        "pack_accepted_ungate_p99_ms_max": max(r["accepted_to_ungated"]["p99_ms"] for r in runs),
        "target_gain_share_of_bound": RATIO_TARGET,
        "meets_gain_target": int(sm["ratio_e2e"] >= RATIO_TARGET),
    }


def pack_markdown(pk: dict[str, Any], mode: Mode, headline: dict[str, float]) -> str:
    sm, runs = pk["summary"], pk["runs"]
    rows = "\n".join(
        f"| {r['seed']} | {r['node']} | {100 * r['e2e_ours']:.1f} | {100 * r['acct_ours']:.1f} | "
        f"{100 * r['acct_das']:.1f} | {100 * r['acct_repack']:.1f} | {100 * (r['e2e_ours'] - r['acct_das']):+.1f} | "
        f"{100 * (r['acct_repack'] - r['acct_das']):+.1f} | {r['hold_extension_mean_ms']:.0f} | "
        f"{r['decisions_differing_from_acct']} | {r['verdicts'].get('accepted', 0)}/{r['events']} |"
        for r in runs)
    met = sm["ratio_e2e"] >= RATIO_TARGET
    head = (f"On the 20,000-event sequence of seed {SEED} at accounting level: ours {100 * headline['ours']:.1f} %, "
            f"DAS {100 * headline['das']:.1f} %, per-GPU repack {100 * headline['repack']:.1f} %.") if headline else \
        "(The 20,000-event accounting figures: full run only; bench/accounting.py has them over seeds.)"
    return f"""## (b) Packing through the controller, {NODE_GROUPS['pack'][0]} nodes x 8 {MODEL}

{len(runs)} seeds ({runs[0]['seed']}-{runs[-1]['seed']}{', quick run: fewer seeds' if mode.pack_seeds < 10 else ''}), \
each `churn(seed, {mode.pack_events}, {PACK_RHO}, {PACK_MIX})` from
bench/accounting.py on its own empty node (the {NODE_GROUPS['pack'][0]} nodes run their seeds side by side, each
node its seeds one after the other), arrivals over {mode.pack_span:g} s per seed (mean lifetime about
{100 * runs[0]['scale_seconds_per_unit']:.1f} s). Accepted: gate lifted; rejected: the allocator's first answer
NoCapacity (or nothing within {ACCEPT_WINDOW:g} s), pod deleted at once. After the last verdict the pods still
running are deleted and the node must hold no slice before its next seed. DAS and the per-GPU repack bound run
at accounting level on the same events. Compute-weighted acceptance, %:

| seed | node | ours end to end | ours accounting | DAS | per-GPU repack | gain e2e | bound gain | \
hold ext. ms | decisions != acct | accepted pods |
|---|---|---|---|---|---|---|---|---|---|---|
{rows}
| **mean** | | **{100 * sm['e2e_ours']:.2f}** | {100 * sm['acct_ours']:.2f} | {100 * sm['acct_das']:.2f} | \
{100 * sm['acct_repack']:.2f} | **{sm['gain_e2e']:+.2f}** | {sm['bound_gain']:+.2f} | | | |

**Gain end to end {sm['gain_e2e']:+.2f} points (stdev over seeds {sm['gain_e2e_stdev']:.2f}) vs the bound's gain
{sm['bound_gain']:+.2f}: {100 * sm['ratio_e2e']:.1f} % of the bound; target >= {100 * RATIO_TARGET:.0f} %: \
{'met' if met else 'NOT met'}.** At accounting level on the same events: {sm['gain_acct']:+.2f} points,
{100 * sm['ratio_acct']:.1f} % of the bound.

Timing: accepted pods held their slices {sm['hold_extension_mean_ms']:.0f} ms longer than their lifetimes on
average (until their claims ended; {sm['hold_extension_until_slices_gone_mean_ms']:.0f} ms until the agent's
report no longer listed the slices), so the controller runs a slightly heavier load than the accounting
simulation. With every policy given the measured arrivals and that extension (policy-neutral): ours end to end vs DAS \
{sm['gain_e2e_matched']:+.2f} points, bound {sm['bound_gain_matched']:+.2f}
({100 * sm['ratio_e2e_matched']:.1f} %); ours replayed with each pod's own measured hold \
{100 * sm['replay_ours_measured_timing']:.2f} % (end to end {100 * sm['e2e_ours']:.2f} %).
Rejected pods planned before their deletion: {sum(r['rejected_but_planned_before_deletion'] for r in runs)};
accepted pods that failed, never ran, or lost their slices before their runtime was over (pods cut by the drain
excluded): {sum(len(r['anomalies']) for r in runs)} (JSON `packing.runs[].anomalies`); nodes not drained within
{DRAIN_DEADLINE:g} s: {sum(not r['drained'] for r in runs)}. {head}
"""


def figures(got: dict[str, Any], orders_acct: dict[str, Any], sequential: dict[str, float],
            headline: dict[str, float]) -> dict[str, float | int]:
    lat, oe, pk, op, logs_seen = got["latency"], got["orders_e2e"], got["packing"], got["operator"], got["logs"]
    timings: dict[str, float] = got["timings"]
    fig: dict[str, float | int] = {
        "lat_pods": lat["pods"],
        "lat_fit_on_arrival": lat["fit_on_arrival"],
        "lat_waited_for_capacity": lat["waited_for_capacity"],
        "lat_never_ungated": lat["never_ungated"],
        "lat_create_failures": lat["create_failures"],
        "lat_fit_ungate_p50_ms": lat["fit_to_ungated"]["p50_ms"],
        "lat_fit_ungate_p99_ms": lat["fit_to_ungated"]["p99_ms"],
        "lat_fit_ungate_max_ms": lat["fit_to_ungated"]["max_ms"],
        "lat_fit_running_p50_ms": lat["fit_to_running"]["p50_ms"],
        "lat_fit_running_p99_ms": lat["fit_to_running"]["p99_ms"],
        "lat_fit_running_max_ms": lat["fit_to_running"]["max_ms"],
        "lat_waited_ungate_p50_ms": lat["waited_to_ungated"]["p50_ms"],
        "lat_waited_ungate_p99_ms": lat["waited_to_ungated"]["p99_ms"],
        "lat_waited_running_p99_ms": lat["waited_to_running"]["p99_ms"],
        "lat_admission_call_p99_ms": lat["admission_call"]["p99_ms"],
        "kubelet_start_latency_ms": round(1000 * START_LATENCY),
        "meets_latency_target": int(0 <= lat["fit_to_ungated"]["p99_ms"] <= LATENCY_TARGET_MS),
        **pack_figures(pk),
        "lat_pods_failed_or_slices_lost": len(lat["anomalies"]),
        "orders_e2e_trials": oe["trials"],
        "orders_e2e_placed_pct": round(100 * oe["placed_share"], 2),
        "orders_e2e_das_same_trials_pct": round(100 * oe["das_share_same_trials"], 2),
        "orders_acct_ours_every_order_pct": round(100 * min(o["ours_share_every_order"]
                                                            for o in orders_acct.values()), 2),
        "orders_acct_das_every_order_pct": round(100 * min(o["das_share_every_order"]
                                                           for o in orders_acct.values()), 2),
        "orders_sequential_single_slice_ours_pct": round(100 * sequential["ours_share"], 2),
        "orders_sequential_single_slice_das_pct": round(100 * sequential["das_share"], 2),
        "meets_order_target": int(oe["placed_share"] == 1.0 and min(o["ours_share_every_order"]
                                                                   for o in orders_acct.values()) == 1.0),
    }
    count = op.get("allocation_seconds_count")
    fig["operator_allocation_mean_ms"] = round(1000 * op["allocation_seconds_sum"] / count, 1) if count else -1
    fig["measured_allocation_mean_ms"] = round(1000 * op["measured_ungate_sum"] / op["measured_ungate_count"], 1) \
        if op["measured_ungate_count"] else -1
    fig["log_errors"] = logs_seen["error"]
    fig["log_warnings"] = logs_seen["warning"]
    if headline:
        fig["acct_20k_ours_pct"] = round(100 * headline["ours"], 2)
        fig["acct_20k_das_pct"] = round(100 * headline["das"], 2)
    fig.update({f"time_{k}": round(v, 1) for k, v in timings.items()})
    return fig


def markdown(fig: dict[str, float | int], got: dict[str, Any], orders_acct: dict[str, Any],
             sequential: dict[str, float], headline: dict[str, float], mode: Mode,
             quick: bool) -> str:
    lat, oe, pk, op = got["latency"], got["orders_e2e"], got["packing"], got["operator"]
    stage_rows = "\n".join(f"| {k.replace('_', ' ')} | {v['p50_ms']} | {v['p99_ms']} | {v['max_ms']} |"
                           for k, v in lat["stages_fit"].items())
    acct_rows = "\n".join(f"| {m} | {100 * o['ours_share_every_order']:.1f} % | "
                          f"{100 * o['das_share_every_order']:.1f} % |" for m, o in orders_acct.items())
    return f"""# MIG slicer end to end ({'quick' if quick else 'full'} run)

Emulated cluster in-process, `gpuops run --controllers migslicer` and one `gpuops agent --emulated` per node as
subprocesses; pods created with `nvidia.com/mig-*` names through the admission webhook. Emulated kubelet start
latency {1000 * START_LATENCY:.0f} ms. Total {got['timings']['total_s']:.0f} s.

## (a) Latency, 4 nodes x 2 {MODEL}

{lat['pods']} pods at {mode.lat_rate:g}/s for {mode.lat_seconds:g} s, 1-3 slices (small-heavy mix), runtime
U{mode.lat_runtime} s (offered about {100 * lat['offered_compute_share']:.0f} % of the compute slices).
All gated and renamed by the webhook: {lat['gated_and_renamed_by_webhook']}/{lat['pods'] - lat['create_failures']}.

| from the pod's creation | pods | p50 ms | p99 ms | max ms |
|---|---|---|---|---|
| to gate removed, fit on arrival | {lat['fit_to_ungated']['n']} | {lat['fit_to_ungated']['p50_ms']} | \
{lat['fit_to_ungated']['p99_ms']} | {lat['fit_to_ungated']['max_ms']} |
| to Running, fit on arrival | {lat['fit_to_running']['n']} | {lat['fit_to_running']['p50_ms']} | \
{lat['fit_to_running']['p99_ms']} | {lat['fit_to_running']['max_ms']} |
| to gate removed, waited for capacity (NoCapacity first) | {lat['waited_to_ungated']['n']} | \
{lat['waited_to_ungated']['p50_ms']} | {lat['waited_to_ungated']['p99_ms']} | {lat['waited_to_ungated']['max_ms']} |
| to Running, waited for capacity | {lat['waited_to_running']['n']} | {lat['waited_to_running']['p50_ms']} | \
{lat['waited_to_running']['p99_ms']} | {lat['waited_to_running']['max_ms']} |
| pod create call (webhook included) | {lat['admission_call']['n']} | {lat['admission_call']['p50_ms']} | \
{lat['admission_call']['p99_ms']} | {lat['admission_call']['max_ms']} |

Pods that failed, never ran or lost their slices early: {len(lat['anomalies'])} (JSON `latency.anomalies`).
Target p99 <= {LATENCY_TARGET_MS:.0f} ms to gate removal (pods that fit on arrival): \
{'met' if fig['meets_latency_target'] else 'NOT met'}.

Stages, pods that fit on arrival (ms):

| stage | p50 | p99 | max |
|---|---|---|---|
{stage_rows}

{pack_markdown(pk, mode, headline)}
## Feasible single-GPU batches in any order

End to end: {oe['trials']} trials ({oe['batches']} batches where DAS fails in some order, a DAS-failing order and
another), one pod per trial whose containers list the slices in that order, on an empty 1-GPU node:
placed and started (every claim Bound, pod Succeeded) {oe['placed_and_started']}/{oe['trials']} \
({100 * oe['placed_share']:.0f} %); DAS would place {100 * oe['das_share_same_trials']:.0f} % of the same trials.
Gate lifted p50 {oe['ungate']['p50_ms']} ms, max {oe['ungate']['max_ms']} ms.

Accounting level (`bench_orders({mode.orders_samples}, {mode.orders_cap})`: every feasible batch on an empty GPU
plus random ones on partly used GPUs, every order):

| model | ours | DAS |
|---|---|---|
{acct_rows}

Context (not the target, which is about one request): the slices of each of the {sequential['batches']} feasible
empty-GPU batches as separate one-slice pods arriving one after another, every order: ours places all of them
in every order for {100 * sequential['ours_share']:.1f} % of the batches, DAS for \
{100 * sequential['das_share']:.1f} %.

Operator metric `gpuops_migslicer_allocation_seconds` (creation to gate lifted): mean
{fig['operator_allocation_mean_ms']:.0f} ms over {op['allocation_seconds_count']:.0f} pods; the same interval measured
here: mean {fig['measured_allocation_mean_ms']:.0f} ms over {op['measured_ungate_count']} pods. NoCapacity plans
{op['plan_failures_no_capacity']}; operator alive at the end: {op['operator_alive']}, agents alive
{op['agents_alive']}/{sum(n for n, _ in NODE_GROUPS.values())}; log lines at warning / error level (operator and \
agents): {got['logs']['warning']} /
{got['logs']['error']}.
Command: `python bench/migslicer.py{' --quick' if quick else ''}`; phases (s): \
{', '.join(f'{k} {v:.0f}' for k, v in got['timings'].items())}.
"""


if __name__ == "__main__":
    raise SystemExit(main())

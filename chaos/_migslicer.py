"""What the MIG slicer chaos scenarios share: the rig, the ground truth, the driver's hands, the two global checks.

Rig. An emulated cluster of `nodes` MIG nodes (2 x A100-40GB each, kubelet device managers on short unix-socket
paths), the MigNode/AllocationClaim CRDs, the MutatingWebhookConfiguration of manifests/webhook (its Service
resolved to the operator's webhook port on loopback), `gpuops run --controllers migslicer` as a subprocess
(OperatorHarness: kill -9, restart) and one `gpuops agent --emulated` subprocess per node (killable and
restartable the same way), each on its own fake-driver state file. Processes, not tasks: a kill -9 must end a
process mid-call, which an in-process manager cannot show.

Ground truth. `Tracker` is a synchronous listener on the emulator's store (attached before the cluster starts):
every version of every pod of NS and of every AllocationClaim, deleted ones included, with monotonic instants.
It checks two invariants on every claim change (a pod never holds more live claims than slices it asks for;
two live claims never share a memory slice of one GPU), so a transient double claim cannot slip between polls.
The driver's truth is read from the state file itself (a `MigBackend` on a fresh `FakeNVML` of the same file,
the same code path the agent uses), never from the MigNode the agent writes.

The driver's hands. A separate agent process only shares the state file with us, so the fake's in-object chaos
hooks (`set_delay`, `fail_next`) cannot reach it. `DriverGate` holds the file's lock instead: every NVML call of
the agent blocks on it (a driver that hangs), and `step_until` lets the agent through one call at a time until
the state shows what a scenario wants to kill it in (a GPU instance without its compute instance, say).
A "reboot" deletes the state file (MIG instances do not survive one; the fake then starts empty).

Global checks (every scenario ends with both):
  gated   every gated pod is ungated within a deadline or carries `gpuops.io/MigSlices=False` with a reason;
  leaks   every slice in every node's driver state belongs to a live claim (Pending/Created/Bound, same GPU,
          start and profile) of a pod that exists and has not finished; no claim Pending/Created/Bound whose pod
          is gone or finished; every MigNode lists exactly the driver's slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import Found, OnHarness, log_records, wait_for

from gpuops.controllers.migslicer.agent.gpus import MigBackend, SliceInfo
from gpuops.controllers.migslicer.allocator import CONDITION
from gpuops.controllers.migslicer.api import ADVERTISE, GATE, NVIDIA_PREFIX, profile_of_resource
from gpuops.kube.times import parse_time_or_none
from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.cluster.access import PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.fakenvml import FakeNVML, gpu_uuid
from gpuops_sim.harness import OperatorHarness, free_port, until
from gpuops_sim.scenario import parse

__all__ = [
    "CLAIMS", "COMMON_NOTES", "GPU_SPEC", "LIVE", "MIGNODES", "NS", "SYSTEM_NS", "Agent", "ClaimRecord", "DriverGate",
    "FreezeWhenCreated", "MigRig", "PodRecord", "Tracker", "condition", "is_gated", "open_mig_rig", "pace",
    "requested",
]

ROOT = Path(__file__).resolve().parents[1]
CRDS = [ROOT / "manifests" / "crds" / f"{n}.gpuops.io.yaml" for n in ("mignodes", "allocationclaims")]
WEBHOOK = ROOT / "manifests" / "webhook" / "mutatingwebhookconfiguration.yaml"
NS = "chaos"
SYSTEM_NS = "gpuops-system"
GPU_MODEL = "A100-40GB"
GPUS_PER_NODE = 2
GPU_SPEC = f"{GPU_MODEL}:{GPUS_PER_NODE}"
CLAIMS = ("gpuops.io", "allocationclaims")
MIGNODES = ("gpuops.io", "mignodes")
LIVE = ("Pending", "Created", "Bound")
RUNTIME = "sim.gpuops.io/runtime-seconds"
HOSTNAME = "kubernetes.io/hostname"


# ---------------------------------------------------------------------------------------------- ground truth


def requested(pod: Mapping[str, Any]) -> list[str]:
    """One profile per slice the pod asks for (either spelling: before or after the webhook's rename)."""
    out: list[str] = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for k, v in sorted(asked.items()):
            profile = profile_of_resource(k)
            if profile is not None:
                out.extend([profile] * int(v))
    return sorted(out)


def is_gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def condition(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The allocator's `gpuops.io/MigSlices` pod condition, if set."""
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None)


@dataclass
class PodRecord:
    name: str
    uid: str
    first: dict[str, Any]
    """As admitted: the webhook's rename and gate are visible here."""
    last: dict[str, Any]
    created_at: float
    ungated_at: float | None = None
    scheduled_at: float | None = None
    running_at: float | None = None
    terminal_at: float | None = None
    gone_at: float | None = None
    reasons: list[str] = field(default_factory=list)
    """Every distinct reason the MigSlices condition carried, in order."""

    @property
    def profiles(self) -> list[str]:
        return requested(self.first)

    @property
    def phase(self) -> str:
        return str((self.last.get("status") or {}).get("phase") or "")


@dataclass
class ClaimRecord:
    name: str
    namespace: str
    uid: str
    pod_uid: str
    node: str
    gpu: str
    start: int
    size: int
    profile: str
    created_at: float
    last: dict[str, Any]
    phases: list[tuple[str, float]] = field(default_factory=list)
    gone_at: float | None = None
    annotated_at: float | None = None
    """First seen with the allocator's advertise annotation."""
    advertised_at: float | None = None
    """First seen with status.advertised (the agent's device plugin lists the slice)."""

    @property
    def phase(self) -> str:
        return str((self.last.get("status") or {}).get("phase") or "Pending")

    @property
    def device(self) -> str:
        return str((self.last.get("status") or {}).get("deviceUUID") or "")

    @property
    def live(self) -> bool:
        return self.gone_at is None and self.phase in LIVE

    def reached(self, phase: str) -> float | None:
        return next((t for p, t in self.phases if p == phase), None)


class Tracker:
    """Every pod of NS and every claim as the store had them (module docstring); attach before the cluster starts."""

    def __init__(self, cluster: SimCluster) -> None:
        self.pods: dict[str, PodRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self.violations: list[str] = []
        self.max_live_per_pod: dict[str, int] = {}
        self._flight_pairs: set[tuple[str, ...]] = set()
        self.hooks: list[Callable[[str, Any], None]] = []
        """Called synchronously with ("pod", PodRecord) or ("claim", ClaimRecord) after each change (a kill
        that must land right after some state was written)."""
        cluster.access.listen(self._on_event)

    def _on_event(self, ev: WatchEvent) -> None:
        now = time.monotonic()
        obj = ev.new.obj  # stored objects are never mutated in place
        if ev.gr == PODS and ev.key[0] == NS:
            self._pod(obj, ev.type, now)
        elif ev.gr == CLAIMS:
            self._claim(obj, ev.type, now)

    def _pod(self, obj: dict[str, Any], kind: str, now: float) -> None:
        meta = obj["metadata"]
        rec = self.pods.get(meta["uid"])
        if rec is None:
            rec = self.pods[meta["uid"]] = PodRecord(meta["name"], meta["uid"], obj, obj, now)
        rec.last = obj
        if rec.ungated_at is None and is_gated(rec.first) and not is_gated(obj):
            rec.ungated_at = now
        phase = (obj.get("status") or {}).get("phase")
        if rec.scheduled_at is None and (obj.get("spec") or {}).get("nodeName"):
            rec.scheduled_at = now
        if rec.running_at is None and phase in ("Running", "Succeeded"):
            rec.running_at = now
        if rec.terminal_at is None and phase in ("Succeeded", "Failed"):
            rec.terminal_at = now
        c = condition(obj)
        if c is not None and c.get("reason") and (not rec.reasons or rec.reasons[-1] != c["reason"]):
            rec.reasons.append(str(c["reason"]))
        if kind == "DELETED":
            rec.gone_at = now
        for hook in self.hooks:
            hook("pod", rec)

    def _claim(self, obj: dict[str, Any], kind: str, now: float) -> None:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        rec = self.claims.get(meta["uid"])
        if rec is None:
            rec = self.claims[meta["uid"]] = ClaimRecord(
                meta["name"], meta.get("namespace", ""), meta["uid"], str(spec.get("podUID") or ""),
                str(spec.get("nodeName") or ""), str(spec.get("gpuUUID") or ""), int(spec.get("start") or 0),
                int(spec.get("size") or 0), str(spec.get("profile") or ""), now, obj)
        rec.last = obj
        if rec.annotated_at is None and ADVERTISE in (meta.get("annotations") or {}):
            rec.annotated_at = now
        if rec.advertised_at is None and (obj.get("status") or {}).get("advertised"):
            rec.advertised_at = now
        if not rec.phases or rec.phases[-1][0] != rec.phase:
            rec.phases.append((rec.phase, now))
        if kind == "DELETED":
            rec.gone_at = now
        self._check(rec)
        for hook in self.hooks:
            hook("claim", rec)

    def _in_flight(self, rec: ClaimRecord) -> None:
        """The allocator's rule: one pod per (node, profile) has advertised slices until its containers start
        (the kubelet hands a container any free device of the resource, so two such pods could swap slices)."""
        if not rec.live or rec.phase != "Created" or ADVERTISE not in (rec.last["metadata"].get("annotations") or {}):
            return
        for o in self.claims.values():
            if (o.pod_uid == rec.pod_uid or not o.live or o.phase != "Created" or o.node != rec.node
                    or o.profile != rec.profile or ADVERTISE not in (o.last["metadata"].get("annotations") or {})):
                continue
            a, b = self.pods.get(rec.pod_uid), self.pods.get(o.pod_uid)
            if a is None or b is None or a.phase != "Pending" or b.phase != "Pending":
                continue
            pair = tuple(sorted((a.name, b.name)))
            if pair not in self._flight_pairs:
                self._flight_pairs.add(pair)
                self.violations.append(f"pods {pair[0]} and {pair[1]} both had {rec.profile} slices on {rec.node} "
                                       "marked for advertising before either started (claims "
                                       f"{o.name}, {rec.name})")

    def _check(self, rec: ClaimRecord) -> None:
        self._in_flight(rec)
        mine = [c for c in self.claims.values() if c.pod_uid == rec.pod_uid and c.live]
        self.max_live_per_pod[rec.pod_uid] = max(self.max_live_per_pod.get(rec.pod_uid, 0), len(mine))
        pod = self.pods.get(rec.pod_uid)
        if pod is not None and len(mine) > len(pod.profiles):
            self.violations.append(f"pod {pod.name} held {len(mine)} live claims for {len(pod.profiles)} slice(s): "
                                   + ", ".join(c.name for c in mine))
        if not rec.live:
            return
        for o in self.claims.values():
            if (o.uid != rec.uid and o.live and o.node == rec.node and o.gpu == rec.gpu
                    and o.start < rec.start + rec.size and rec.start < o.start + o.size):
                self.violations.append(f"live claims {o.name} and {rec.name} share memory slices of "
                                       f"{rec.node}/{rec.gpu[:12]} ({o.start}+{o.size} vs {rec.start}+{rec.size})")

    def pod(self, name: str) -> PodRecord | None:
        """The newest pod of that name."""
        recs = [r for r in self.pods.values() if r.name == name]
        return max(recs, key=lambda r: r.created_at) if recs else None

    def claims_of(self, pod_uid: str) -> list[ClaimRecord]:
        return [c for c in self.claims.values() if c.pod_uid == pod_uid]

    def live_claims(self, node: str | None = None) -> list[ClaimRecord]:
        return [c for c in self.claims.values() if c.live and (node is None or c.node == node)]


# ---------------------------------------------------------------------------------------------- the driver


def driver_slices(node: str, state_file: Path) -> list[SliceInfo]:
    """The node's slices as its driver has them (blocking: run in a thread; never while holding a DriverGate)."""
    backend = MigBackend(FakeNVML.from_spec(GPU_SPEC, node, state_file=state_file))
    backend.open()
    try:
        found: list[SliceInfo] = backend.slices()
        return found
    finally:
        backend.close()


class DriverGate:
    """The fake driver's file lock held by us: the agent's NVML calls wait (module docstring)."""

    def __init__(self, node: str, state_file: Path) -> None:
        self.node = node
        self.state_file = state_file
        self._fd: int | None = None
        self.steps = 0

    @property
    def held(self) -> bool:
        return self._fd is not None

    async def hold(self) -> None:
        if self._fd is not None:
            return
        fd = os.open(f"{self.state_file}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        self._fd = fd

    def hold_now(self) -> None:
        """`hold` without the event loop (from a store listener): blocks while the agent finishes one call."""
        if self._fd is None:
            fd = os.open(f"{self.state_file}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def raw(self) -> dict[str, Any]:
        """The state file as the driver last wrote it (consistent only while held)."""
        try:
            return dict(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return {"gpus": []}

    def instances(self) -> list[tuple[str, int, int, int, int]]:
        """(GPU UUID, GI id, start, size, compute instances) of every GPU instance in the raw state."""
        out = []
        for i, g in enumerate(self.raw().get("gpus") or []):
            for gi in g.get("gis") or []:
                out.append((gpu_uuid(self.node, i), int(gi["id"]), int(gi["start"]), int(gi["size"]),
                            len(gi.get("cis") or [])))
        return out

    async def step_until(self, want: Callable[[], bool], within: float) -> bool:
        """Let the agent through one driver call at a time (release, yield, take back) until `want()` holds
        while we hold the lock; False after `within` s (the lock is held on return either way)."""
        await self.hold()
        deadline = time.monotonic() + within
        while not want():
            if time.monotonic() > deadline:
                return False
            self.release()
            await asyncio.sleep(0)  # the agent's waiting call takes the lock; ours queues right behind it
            await self.hold()
            self.steps += 1
        return True

    def reboot(self) -> None:
        """Power-cycle the GPUs: every GPU/compute instance gone (MIG mode kept: the fake starts enabled)."""
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()


# ---------------------------------------------------------------------------------------------- processes


class FreezeWhenCreated:
    """A tracker hook that holds `gate` (a node's fake driver) the moment the `claims` claims of the pods in `uids`
    are all Created, so a scenario can act between a slice's making and its advertising: the agent's next
    reconcile, the one that would advertise, waits on the lock. Holding it inside the hook is brief: the agent
    holds the lock for one driver call at most."""

    def __init__(self, track: Tracker, gate: DriverGate, claims: int) -> None:
        self.track = track
        self.gate = gate
        self.claims = claims
        self.uids: set[str] = set()
        self.frozen_at: float | None = None

    def __call__(self, what: str, rec: Any) -> None:
        if self.frozen_at is not None or not isinstance(rec, ClaimRecord) or rec.pod_uid not in self.uids:
            return
        mine = [c for c in self.track.claims.values() if c.pod_uid in self.uids]
        if len(mine) == self.claims and all(c.phase == "Created" for c in mine):
            self.gate.hold_now()
            self.frozen_at = time.monotonic()


class Agent:
    """`gpuops agent --emulated` of one node, as a DaemonSet pod would run it."""

    def __init__(self, node: str, workdir: Path, kubeconfig: Path, plugin_dir: Path, state_file: Path, *,
                 grace: float, heartbeat: float) -> None:
        self.node = node
        self.log_path = workdir / f"agent-{node}.log"
        self.kubeconfig = kubeconfig
        self.plugin_dir = plugin_dir
        self.state_file = state_file
        self.grace = grace
        self.heartbeat = heartbeat
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0
        self.started_wall = 0.0

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"the agent of {self.node} is already running")
        self.starts += 1
        self.started_wall = time.time()
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuops", "agent", "--emulated", "--gpus", GPU_SPEC,
                 "--node-name", self.node, "--kubeconfig", str(self.kubeconfig),
                 "--device-plugin-dir", str(self.plugin_dir), "--state-file", str(self.state_file),
                 "--orphan-grace", f"{self.grace:g}", "--heartbeat", f"{self.heartbeat:g}",
                 "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
                 "--log-format", "json", "--log-level", "INFO"],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def kill(self) -> None:
        """kill -9 (synchronous: safe inside a store listener)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self, event: str) -> list[dict[str, Any]]:
        """Its JSON log records (all starts) whose `event` is `event`."""
        return log_records(self.log_path, event)


# ---------------------------------------------------------------------------------------------- the rig


async def pace(seconds: float) -> None:
    """A hold of a fault for a set time (the scenario's timeline), never a wait for state."""
    await asyncio.sleep(seconds)


@dataclass
class MigRig(OnHarness):
    track: Tracker
    agents: dict[str, Agent]
    state_dir: Path
    grace: float
    heartbeat: float
    refusals: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return sorted(self.agents)

    def gate(self, node: str) -> DriverGate:
        return DriverGate(node, self.agents[node].state_file)

    # ------------------------------------------------------------------------------------------ pods

    @staticmethod
    def pod_body(name: str, profiles: Iterable[str], *, runtime: float | None = None, node: str | None = None,
                 labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A one-container pod asking for `nvidia.com/mig-<profile>` per slice (none: a plain CPU pod);
        `runtime`: it ends after that many seconds (None: runs until deleted); `node`: a nodeSelector on it."""
        limits: dict[str, str] = {}
        for p in profiles:
            key = NVIDIA_PREFIX + p.replace("+", "-")
            limits[key] = str(int(limits.get(key, "0")) + 1)
        spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                "containers": [{"name": "main", "image": "cuda",
                                                "resources": {"limits": limits} if limits else {}}]}
        if node is not None:
            spec["nodeSelector"] = {HOSTNAME: node}
        meta: dict[str, Any] = {"name": name, "labels": {"app": "chaos", **(labels or {})}}
        if runtime is not None:
            meta["annotations"] = {RUNTIME: f"{runtime:g}"}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    async def create_pod(self, body: dict[str, Any], namespace: str = NS) -> None:
        """Over HTTP, as kubectl would (admission, webhook included); RuntimeError with the Status if refused."""
        await self.rig.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)

    async def create_pods(self, bodies: Iterable[dict[str, Any]]) -> None:
        for b in bodies:
            await self.create_pod(b)

    async def delete_pod(self, name: str) -> None:
        with contextlib.suppress(Exception):
            await self.cluster.access.delete(PODS, NS, name)

    def pod(self, name: str) -> dict[str, Any] | None:
        got = self.cluster.access.get(PODS, NS, name)
        return dict(got) if got is not None else None

    def ran_at(self, name: str) -> float:
        """When the named pod was first seen Running (0 if never: a caller's bug, not a scenario outcome)."""
        r = self.track.pod(name)
        return r.running_at if r is not None and r.running_at is not None else 0.0

    def live_pods(self) -> list[dict[str, Any]]:
        return list(self.cluster.access.iter(PODS, NS))

    async def wait_running(self, names: Iterable[str], within: float) -> dict[str, float]:
        """Until every named pod has run (Running or Succeeded) or ended without running; seconds from its
        creation to Running for those that ran. A pod that never runs is for `never_ran` to report; a timeout
        raises with every laggard described."""
        names = list(names)

        def settled() -> bool:
            return all((r := self.track.pod(n)) is not None and (r.running_at is not None or r.terminal_at is not None
                                                                 or r.gone_at is not None) for n in names)

        try:
            await wait_for(f"{len(names)} pods to run", settled, within)
        except TimeoutError as e:
            late = [n for n in names if (r := self.track.pod(n)) is None or r.running_at is None]
            raise TimeoutError(f"{e}: " + "; ".join(self.describe(n) for n in late[:8])) from None
        out = {}
        for n in names:
            r = self.track.pod(n)
            if r is not None and r.running_at is not None:
                out[n] = round(r.running_at - r.created_at, 3)
        return out

    def never_ran(self, names: Iterable[str] | None = None) -> list[str]:
        """MIG pods (all, or the named) that ended or vanished without running, described."""
        recs = ([r for n in names if (r := self.track.pod(n)) is not None] if names is not None
                else list(self.track.pods.values()))
        return [self.describe(r.name) for r in recs
                if r.profiles and r.running_at is None and (r.terminal_at is not None)]

    def describe(self, name: str) -> str:
        """One pod's story for a report: phase and reason, gate, MigSlices reasons, node, claims."""
        r = self.track.pod(name)
        if r is None:
            return f"{name}: never created"
        st = r.last.get("status") or {}
        claims = ", ".join(f"{c.name[-10:]}:{c.phase}@{c.node}/{c.gpu[4:12]}/{c.start}"
                           + ("(advertised)" if (c.last.get("status") or {}).get("advertised") else "")
                           for c in self.track.claims_of(r.uid))
        sched = next((c for c in st.get("conditions") or [] if c.get("type") == "PodScheduled"
                      and c.get("status") == "False"), None)
        unsched = f" unschedulable: {(sched.get('message') or '')[:160]}" if sched else ""
        return (f"{name}: phase {st.get('phase')} {st.get('reason') or ''} {(st.get('message') or '')[:160]}{unsched} "
                f"gated={is_gated(r.last)} reasons={r.reasons} node={(r.last.get('spec') or {}).get('nodeName')} "
                f"claims=[{claims}]")

    async def wait_admitting(self, within: float) -> float:
        """Until a MIG pod is admitted (dry run: nothing is created); the seconds it took. The operator's fresh CA
        reaches the caBundle asynchronously after its start."""
        t0 = time.monotonic()
        body = self.pod_body("probe", ["1g.5gb"])

        async def probe() -> bool:
            try:
                await self.rig.request("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All", body)
            except RuntimeError:
                return False
            return True

        await until("the MIG webhook to admit a pod", probe, within, every=0.1)
        return round(time.monotonic() - t0, 3)

    # ------------------------------------------------------------------------------------------ agents

    def mig_node(self, node: str) -> dict[str, Any] | None:
        got = self.cluster.access.get(MIGNODES, "", node)
        return dict(got) if got is not None else None

    async def start_agent(self, node: str, within: float = 40.0) -> float:
        """Start the node's agent and wait for its first MigNode report; the seconds that took."""
        a = self.agents[node]
        a.start()
        t0 = time.monotonic()
        since = int(a.started_wall * 1_000_000)

        def reported() -> bool:
            if not a.alive:
                raise RuntimeError(f"the agent of {node} exited: {a.log_path.read_text()[-2000:]}")
            st = (self.mig_node(node) or {}).get("status") or {}
            beat = parse_time_or_none(st.get("heartbeat"))
            return beat is not None and beat >= since and len(st.get("gpus") or []) == GPUS_PER_NODE

        await wait_for(f"the agent of {node} to report", reported, within)
        return round(time.monotonic() - t0, 3)

    async def driver(self, node: str) -> list[SliceInfo]:
        return await asyncio.to_thread(driver_slices, node, self.agents[node].state_file)

    # ------------------------------------------------------------------------------------------ checks

    def env_problems(self) -> tuple[list[str], list[str]]:
        """(foreign, short) from the kubelet's Allocate envs of every MIG pod that started: foreign names a device
        that is not one of its own claims' slices (a pod given another pod's slice: a failure); short lists pods
        whose NVIDIA_VISIBLE_DEVICES holds fewer devices than slices they asked for. Short is a known finding,
        not a chaos effect: each profile has its own device plugin, each Allocate answers NVIDIA_VISIBLE_DEVICES
        with its own slices only, and the kubelet keeps one value per key (the emulator the last, a real kubelet
        the first), so a container asking for two profiles sees one profile's slices (CDI devices are unioned)."""
        foreign, short = [], []
        for rec in self.track.pods.values():
            if rec.running_at is None or not rec.profiles:
                continue
            env = self.cluster.kubelets.allocations.get((NS, rec.name)) or {}
            mine = {c.device for c in self.track.claims_of(rec.uid) if c.device}
            got = sorted(d for d in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if d)
            if not set(got) <= mine:
                owners = {o.name for d in set(got) - mine for c in self.track.claims.values() if c.device == d
                          and (o := self.track.pods.get(c.pod_uid)) is not None}
                foreign.append(f"pod {rec.name} started with devices {got}; its claims' slices: {sorted(mine)}; "
                               f"the others belong to {sorted(owners)}; timeline: "
                               + self.timeline([rec.name, *sorted(owners)]))
            if len(got) < len(rec.profiles):
                short.append(f"{rec.name} ({'+'.join(rec.profiles)}): NVIDIA_VISIBLE_DEVICES has {len(got)} of "
                             f"{len(rec.profiles)}")
        return foreign, short

    def timeline(self, names: Iterable[str]) -> str:
        """Pods' and their claims' instants (s since the first of them): evidence for a report."""
        recs = [r for n in names if (r := self.track.pod(n)) is not None]
        claims = [c for r in recs for c in self.track.claims_of(r.uid)]
        events: list[tuple[float, str]] = []
        for r in recs:
            for what, t in (("created", r.created_at), ("ungated", r.ungated_at), ("bound to node", r.scheduled_at),
                            ("running", r.running_at), ("finished", r.terminal_at)):
                if t is not None:
                    events.append((t, f"pod {r.name} {what}"))
        for c in claims:
            for what, t in (("annotated", c.annotated_at), ("advertised", c.advertised_at)):
                if t is not None:
                    events.append((t, f"claim {c.name} {what}"))
            events += [(t, f"claim {c.name} {p}") for p, t in c.phases]
        if not events:
            return ""
        t0 = min(t for t, _ in events)
        return "; ".join(f"+{t - t0:.3f}s {e}" for t, e in sorted(events))

    def gated_offenders(self) -> list[str]:
        """Live, not finished pods still gated without a False MigSlices condition that has a reason."""
        out = []
        now = time.monotonic()
        for pod in self.live_pods():
            if not is_gated(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            c = condition(pod)
            if c is not None and c.get("status") == "False" and c.get("reason"):
                continue
            rec = self.track.pods.get(pod["metadata"]["uid"])
            age = now - rec.created_at if rec is not None else -1.0
            claims = [f"{c.name}:{c.phase}" for c in self.track.claims_of(pod["metadata"]["uid"]) if c.gone_at is None]
            out.append(f"{pod['metadata']['name']} gated {age:.1f}s without a reason (claims: {claims or 'none'})")
        return out

    async def check_gated(self, within: float) -> tuple[list[str], float]:
        """Global check 1: wait up to `within` for no pod gated without a reason; (offenders, seconds waited)."""
        t0 = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await wait_for("no pod gated without a reason", lambda: not self.gated_offenders(), within, every=0.1)
        return self.gated_offenders(), round(time.monotonic() - t0, 3)

    async def leaks(self) -> list[str]:
        """Global check 2, now (see the module docstring)."""
        out = []
        pods = {p["metadata"]["uid"]: p for p in self.live_pods()}

        def pod_alive(uid: str) -> bool:
            p = pods.get(uid)
            return p is not None and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")

        claims = [c for c in self.track.claims.values() if c.gone_at is None]
        for c in claims:
            if c.phase in LIVE and not pod_alive(c.pod_uid):
                out.append(f"claim {c.name} is {c.phase} but its pod is gone or finished")
        for node in self.nodes:
            slices = await self.driver(node)
            owners = {(c.gpu, c.start): c for c in claims if c.node == node and c.phase in LIVE}
            for s in slices:
                owner = owners.get((s.gpu_uuid, s.start))
                if owner is None or owner.profile != s.profile or not pod_alive(owner.pod_uid):
                    out.append(f"slice {s.profile} at {node}/{s.gpu_uuid[:12]}/{s.start} (GI {s.gpu_instance_id}"
                               f"{'' if s.complete else ', no compute instance'}) has no live claim of a live pod"
                               + (f" ({owner.name} {owner.phase})" if owner is not None else ""))
            reported = sorted((g["uuid"], s["start"], s["profile"])
                              for g in ((self.mig_node(node) or {}).get("status") or {}).get("gpus") or []
                              for s in g.get("slices") or [])
            actual = sorted((s.gpu_uuid, s.start, s.profile) for s in slices)
            if reported != actual:
                out.append(f"MigNode {node} lists {len(reported)} slice(s), its driver has {len(actual)}")
        return out

    async def check_leaks(self, within: float) -> tuple[list[str], float]:
        """Global check 2 with a deadline (orphans wait out the agents' grace); (leaks, seconds waited)."""
        t0 = time.monotonic()
        deadline = t0 + within
        while True:
            found = await self.leaks()
            if not found or time.monotonic() > deadline:
                return found, round(time.monotonic() - t0, 3)
            await asyncio.sleep(0.25)

    async def slice_count(self) -> int:
        total = 0
        for n in self.nodes:
            total += len(await self.driver(n))
        return total

    def verdict(self, figures: dict[str, Any], problems: list[str], **detail: Any) -> Found:
        """A MIG scenario's run: it passes without a problem; its detail names the pods whose
        NVIDIA_VISIBLE_DEVICES holds one profile's slices (`env_problems`: a known finding every MIG scenario
        reports, not a chaos effect)."""
        return figures, {"problems": problems, **detail, "env_short": self.env_problems()[1]}, not problems

    async def final_checks(self, problems: list[str], *, gated_within: float = 10.0,
                           leak_within: float | None = None) -> dict[str, Any]:
        """Both global checks plus the tracker's invariants and the Allocate envs; adds to `problems`, returns the
        figures every scenario reports. Call once the pods are finished or deleted."""
        gated, gated_wait = await self.check_gated(gated_within)
        leaks, leak_wait = await self.check_leaks(self.grace + 2 * self.heartbeat + 10 if leak_within is None
                                                  else leak_within)
        foreign, short = self.env_problems()
        problems += [f"gated without a reason: {g}" for g in gated] + [f"leak: {x}" for x in leaks]
        problems += self.track.violations + [f"foreign device: {f}" for f in foreign]
        problems += [f"never ran: {d}" for d in self.never_ran()]
        mig_pods = [p for p in self.track.pods.values() if p.profiles]
        return {
            "mig_pods": len(mig_pods),
            "mig_pods_ran": sum(1 for p in mig_pods if p.running_at is not None),
            "claims_created": len(self.track.claims),
            "slices_asked": sum(len(p.profiles) for p in mig_pods),
            "max_live_claims_over_slices": max((self.track.max_live_per_pod.get(u, 0) - len(p.profiles)
                                                for u, p in self.track.pods.items() if p.profiles), default=0),
            "invariant_violations": len(self.track.violations),
            "foreign_devices": len(foreign),
            "env_short_pods": len(short),
            "gated_without_reason": len(gated),
            "gated_check_wait_s": gated_wait,
            "leaked_slices_at_end": len(leaks),
            "leak_check_wait_s": leak_wait,
            "slices_at_end": await self.slice_count(),
        }


def _scenario(name: str, nodes: int) -> Any:
    return parse({
        "name": name, "namespaces": [NS, SYSTEM_NS],
        "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
        "scheduler": {"events": False},
        "nodeGroups": [{"name": "mig", "gpuModel": GPU_MODEL, "gpusPerNode": GPUS_PER_NODE, "count": nodes}],
    })


@contextlib.asynccontextmanager
async def open_mig_rig(name: str, *, nodes: int = 3, grace: float = 3.0,
                       heartbeat: float = 2.0) -> AsyncIterator[MigRig]:
    """The rig of the module docstring, agents reporting and the webhook admitting; logs kept in /tmp after."""
    port = free_port()
    plugins = Path(tempfile.mkdtemp(prefix="mg", dir="/tmp"))  # unix socket paths must stay short
    cluster = SimCluster(_scenario(name, nodes), workload=False, faults=False, device_plugin_root=plugins,
                         manifests=[WEBHOOK])
    cluster.server.service_endpoints[(SYSTEM_NS, "gpuops-webhook")] = f"127.0.0.1:{port}"
    track = Tracker(cluster)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            state = work / "gpus"
            state.mkdir()
            async with OperatorHarness(cluster, work, crds=CRDS, controllers=("migslicer",), log_level="INFO",
                                       extra_args=("--mig-webhook-port", str(port),
                                                   "--mig-webhook-host", "127.0.0.1")) as rig:
                agents = {f"mig-{i}": Agent(f"mig-{i}", work, rig.kubeconfig, plugins / f"mig-{i}",
                                            state / f"mig-{i}.json", grace=grace, heartbeat=heartbeat)
                          for i in range(nodes)}
                mr = MigRig(rig, track, agents, state, grace, heartbeat)
                try:
                    await asyncio.gather(*(mr.start_agent(n) for n in agents))
                    await mr.wait_admitting(30)
                    yield mr
                finally:
                    for a in agents.values():
                        a.stop()
                    for path in (rig.log_path, *(a.log_path for a in agents.values())):
                        with contextlib.suppress(OSError):
                            shutil.copyfile(path, Path(tempfile.gettempdir()) / f"{name}-{path.name}")
    finally:
        shutil.rmtree(plugins, ignore_errors=True)


COMMON_NOTES = {
    "claims_created": "AllocationClaims ever created (a re-plan makes new ones)",
    "slices_asked": "slices the MIG pods asked for in all",
    "max_live_claims_over_slices": "worst (live claims - slices asked) of any pod at any instant (must be <= 0)",
    "invariant_violations": "double claims or two live claims sharing memory slices, seen on any change (must be 0)",
    "foreign_devices": "pods whose Allocate handed them a slice that is not one of their claims' (must be 0)",
    "env_short_pods": "pods asking for 2 profiles whose NVIDIA_VISIBLE_DEVICES names one profile's slices "
                      "(known finding, not a chaos effect: see the report)",
    "gated_without_reason": "pods still gated with no MigSlices=False reason at the end of the deadline (must be 0)",
    "leaked_slices_at_end": "driver slices without a live claim of a live pod, stale live claims, MigNode/driver "
                            "mismatches at the end (must be 0)",
    "leak_check_wait_s": "how long the end state took to hold (orphans wait out the agents' grace)",
    "slices_at_end": "slices left in all drivers at the end",
}


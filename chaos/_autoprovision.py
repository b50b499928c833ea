"""What the autoprovision chaos scenarios share: the rig, the ground truth of power calls, pods and machines.

Rig. An emulated cluster whose GPU machines all start powered off (8 x A100 each, compressed timings: boot and
shutdown in seconds), `gpuops run --controllers autoprovision` as a subprocess (log level INFO, so its
"power transition decided" records name every decision's Idempotency-Key), and one GPUNodeGroup per machine
whose webhooks are the emulated cloud's power API (`POST /power/v1/machines/{name}/start|stop`).

Ground truth, none of it read through the API under test:
  * `calls`: every power API start/stop request as the cloud's HTTP server received it (machine, op,
    Idempotency-Key, the machine's power state on arrival, the HTTP status answered, whether the answer was
    a replay), recorded by wrapping the cloud's request gate, so injected failures and hangs are seen too;
  * `machines`: every power state change of every machine (`Fleet.subscribe`) and `power_cycles`;
  * `pods`: when each pod of NS was first Running and where (a synchronous listener on the store);
  * `decisions`: the operator's own log of each transition it decided (node, direction, key).

The power checks (`power_report`): a duplicate transition is a *new* Idempotency-Key for a start arriving
while the machine is already booting or on (or for a stop while it is shutting down or off): a second
decision for a transition already under way. A retry of one decision re-sends its key (the cloud replays the
answer); every key sent must be one the operator logged as decided; and no machine is powered on more often
than the operator decided to power it on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import OnHarness
from aiohttp import web

from gpuops_sim.apiserver.faults import Faults
from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.budget_workload import pod
from gpuops_sim.cloud.faults import CloudFaults
from gpuops_sim.cluster.access import EVENTS, PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.cluster.machines import Machine
from gpuops_sim.harness import OperatorHarness, until
from gpuops_sim.scenario import parse

__all__ = ["CRD", "GPU", "GROUPS", "NS", "ApRig", "Call", "Sink", "burst", "group_body", "open_ap_rig", "power_report"]

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "manifests" / "crds" / "gpunodegroups.gpuops.io.yaml"
NS = "chaos-ap"
GPU = "nvidia.com/gpu"
GROUPS = ("gpuops.io", "gpunodegroups")
GROUPS_PATH = "/apis/gpuops.io/v1alpha1/gpunodegroups"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@dataclass
class Call:
    at: float
    machine: str
    op: str  # start | stop
    key: str | None
    state_before: str  # the machine's power state when the request arrived
    new_key: bool  # the first request carrying this key
    status: int = 0  # HTTP status answered (0: none, the handler was cancelled)
    replayed: bool = False
    seconds: float = 0.0


@dataclass
class PodSeen:
    created: float
    running: float | None = None
    node: str = ""
    phase: str = ""
    unschedulable: float | None = None
    """When the scheduler first marked it PodScheduled=False, reason Unschedulable (demand for the planner)."""


@dataclass
class ApRig(OnHarness):
    calls: list[Call]
    pods: dict[str, PodSeen]
    transitions: list[tuple[float, str, str]]  # (time, machine, fleet event)
    hooks: list[Callable[[Call], None]] = field(default_factory=list)
    """Called synchronously after the cloud performed a start/stop, before it answers (e.g. kill -9)."""

    @property
    def machines(self) -> dict[str, Machine]:
        return self.cluster.fleet.machines

    async def create_groups(self, names: list[str], **spec: Any) -> None:
        for name in names:
            await self.rig.request("POST", GROUPS_PATH, group_body(self.cluster.cloud.url, name, 8, **spec))

    async def create_group(self, body: dict[str, Any]) -> None:
        await self.rig.request("POST", GROUPS_PATH, body)

    def group(self, name: str) -> dict[str, Any]:
        obj = self.cluster.access.get(GROUPS, "", name)
        if obj is None:
            raise LookupError(f"GPUNodeGroup {name} is gone")
        return obj

    def state(self, name: str) -> str:
        return str((self.group(name).get("status") or {}).get("state") or "Off")

    async def create_pod(self, name: str, gpus: int, runtime: float, node: str | None = None) -> None:
        """In-process (faults injected into HTTP requests are the operator's to face, not the driver's);
        `node`: a nodeSelector on that hostname."""
        self.pods.setdefault(name, PodSeen(time.time()))
        body = pod(name, {"chaos": "autoprovision"}, GPU, str(gpus), runtime)
        if node is not None:
            body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        await self.cluster.access.create(PODS, NS, body)

    def events(self, reason: str, name: str | None = None) -> int:
        return sum(int(e.get("count") or 1) for e in self.cluster.access.iter(EVENTS)
                   if e.get("reason") == reason and (name is None or e["involvedObject"].get("name") == name))

    def decisions(self) -> list[dict[str, Any]]:
        """The operator's "power transition decided" log records, all its starts."""
        out = []
        for line in self.rig.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == "power transition decided":
                    out.append(rec)
        return out

    def trace(self) -> dict[str, Any]:
        """For the results file: the operator's decisions and each pod's creation / first Running (s from the
        first pod) and node."""
        t0 = min((p.created for p in self.pods.values()), default=0.0)
        return {
            "decisions": [{k: d.get(k) for k in ("timestamp", "node", "direction", "key", "why")}
                          for d in self.decisions()],
            "pods": {k: {"created": round(p.created - t0, 3),
                         "unschedulable": round(p.unschedulable - t0, 3) if p.unschedulable else None,
                         "running": round(p.running - t0, 3) if p.running else None, "node": p.node}
                     for k, p in sorted(self.pods.items())},
        }

    def all_running(self) -> bool:
        return bool(self.pods) and all(p.running is not None for p in self.pods.values())

    async def wait_all_running(self, within: float) -> float:
        """Until every pod created was Running at least once; returns when the last one first ran."""
        async def probe() -> bool:
            return self.all_running()

        await until("every pod Running", probe, within, every=0.1)
        return max(p.running or 0.0 for p in self.pods.values())

    async def wait_all_off(self, names: list[str], within: float) -> float:
        """Until every group is Off and its machine powered off; returns when that was first seen."""
        async def probe() -> bool:
            return all(self.state(n) == "Off" and self.machines[n].state == "off" for n in names)

        await until("every machine powered off and every group Off", probe, within, every=0.1)
        return time.time()


def group_body(cloud: str, machine: str, gpus: int, *, boot_timeout: int = 60, unneeded: int = 3,
               delay_after_up: int = 0, webhook_timeout: int = 10, up_url: str | None = None,
               node: str | None = None, name: str | None = None) -> dict[str, Any]:
    base = f"{cloud}/power/v1/machines/{machine}"
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": name or machine},
            "spec": {"nodeName": node or machine, "gpuCount": gpus,
                     "scaleUp": {"url": up_url or f"{base}/start", "timeoutSeconds": webhook_timeout},
                     "scaleDown": {"url": f"{base}/stop", "timeoutSeconds": webhook_timeout},
                     "bootTimeoutSeconds": boot_timeout, "scaleDownUnneededSeconds": unneeded,
                     "scaleDownDelayAfterScaleUpSeconds": delay_after_up,
                     "template": {"taints": [GPU_TAINT]}}}


def _scenario(name: str, machines: int, boot: float, device: float, shutdown: float) -> Any:
    return parse({
        "name": name,
        "namespaces": [NS],
        "kubelet": {"startLatencySeconds": 0.2, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
        "scheduler": {"events": False},
        "nodeLifecycle": {"nodeMonitorGraceSeconds": 1.0, "podGcOrphanSeconds": 2.0},
        "nodeGroups": [{"name": "gpu", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": machines,
                        "poweredOff": machines, "bootSeconds": boot, "devicePluginSeconds": device,
                        "shutdownSeconds": shutdown}],
    })


def _record_calls(cluster: SimCluster, calls: list[Call], hooks: list[Callable[[Call], None]]) -> None:
    """Wrap the cloud's request gate for power start/stop (before it starts: it binds the routes then)."""
    cloud = cluster.cloud
    gate = cloud._api
    seen: set[str] = set()

    def api(api_name: str, op: str, fn: Callable[[web.Request], Awaitable[web.Response]]) -> Any:
        if api_name == "power" and op in ("start", "stop"):
            inner = fn

            async def traced_fn(request: web.Request) -> web.Response:
                resp = await inner(request)
                call = request.get("chaos_call")
                if call is not None:
                    for hook in list(hooks):
                        hook(call)
                return resp

            fn = traced_fn
        handler = gate(api_name, op, fn)
        if api_name != "power" or op not in ("start", "stop"):
            return handler

        async def traced(request: web.Request) -> web.Response:
            name = request.match_info["name"]
            key = request.headers.get("Idempotency-Key")
            m = cluster.fleet.get(name)
            call = Call(time.time(), name, op, key, m.state if m is not None else "unknown",
                        key is not None and key not in seen)
            if key is not None:
                seen.add(key)
            request["chaos_call"] = call
            calls.append(call)
            t0 = time.monotonic()
            try:
                resp = await handler(request)
                call.status = resp.status
                call.replayed = resp.headers.get("Idempotent-Replayed") == "true"
                return resp
            finally:
                call.seconds = round(time.monotonic() - t0, 3)

        return traced

    cloud._api = api  # type: ignore[method-assign]


class Sink:
    """A power endpoint that accepts every request (202) and powers nothing: a machine that never boots."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, str | None]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def accept(request: web.Request) -> web.Response:
            self.requests.append((time.time(), request.headers.get("Idempotency-Key")))
            return web.json_response({"state": "booting"}, status=202)

        app = web.Application()
        app.router.add_post("/{tail:.*}", accept)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@contextlib.asynccontextmanager
async def open_ap_rig(name: str, machines: int, *, seed: int, boot: float, device: float = 0.3,
                      shutdown: float = 0.3) -> AsyncIterator[ApRig]:
    cluster = SimCluster(_scenario(name, machines, boot, device, shutdown), workload=False, faults=False)
    cluster.server.faults = Faults(seed)
    cluster.cloud.faults = CloudFaults(seed)
    calls: list[Call] = []
    hooks: list[Callable[[Call], None]] = []
    _record_calls(cluster, calls, hooks)
    transitions: list[tuple[float, str, str]] = []
    cluster.fleet.subscribe(lambda m, ev: transitions.append((time.time(), m.name, ev)))
    pods: dict[str, PodSeen] = {}

    def on_pod(ev: WatchEvent) -> None:
        if ev.gr != PODS or ev.key[0] != NS:
            return
        obj = ev.new.obj
        rec = pods.setdefault(obj["metadata"]["name"], PodSeen(time.time()))
        phase = (obj.get("status") or {}).get("phase") or ""
        rec.phase = phase
        if rec.unschedulable is None and any(
                c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
                for c in (obj.get("status") or {}).get("conditions") or ()):
            rec.unschedulable = time.time()
        if phase in ("Running", "Succeeded") and rec.running is None:
            rec.running = time.time()
            rec.node = obj["spec"].get("nodeName") or ""

    cluster.access.listen(on_pod)
    with tempfile.TemporaryDirectory() as tmp:
        async with OperatorHarness(cluster, Path(tmp), crds=[CRD], controllers=("autoprovision",),
                                   log_level=os.environ.get("CHAOS_AP_LOG_LEVEL", "INFO")) as rig:
            try:
                yield ApRig(rig, calls, pods, transitions, hooks)
            finally:  # kept for a look after the run (the rig's folder goes with it)
                with contextlib.suppress(OSError):
                    shutil.copyfile(rig.log_path, Path(tempfile.gettempdir()) / f"{name}-operator.log")


def power_report(ap: ApRig, names: list[str]) -> tuple[dict[str, int], dict[str, Any], list[str]]:
    """Figures, per-machine detail and the list of violations (empty: the power checks pass)."""
    decided = ap.decisions()
    keys = {d["key"]: d for d in decided}
    ups = Counter(d["node"] for d in decided if d.get("direction") == "up")
    downs = Counter(d["node"] for d in decided if d.get("direction") == "down")
    problems: list[str] = []
    per: dict[str, Any] = {}
    dup_total = unknown_total = 0
    for n in names:
        mine = [c for c in ap.calls if c.machine == n]
        dups = [c for c in mine if c.new_key and (
            (c.op == "start" and c.state_before in ("booting", "on"))
            or (c.op == "stop" and c.state_before in ("shutting-down", "off")))]
        unknown = [c for c in mine if c.key not in keys]
        cycles = ap.machines[n].power_cycles
        start_keys = {c.key for c in mine if c.op == "start"}
        stop_keys = {c.key for c in mine if c.op == "stop"}
        per[n] = {"power_cycles": cycles, "up_decisions": ups[n], "down_decisions": downs[n],
                  "start_keys": len(start_keys), "stop_keys": len(stop_keys),
                  "start_requests": sum(1 for c in mine if c.op == "start"),
                  "stop_requests": sum(1 for c in mine if c.op == "stop"),
                  "replayed": sum(1 for c in mine if c.replayed),
                  "duplicates": [(c.op, c.key, c.state_before) for c in dups],
                  "undecided_keys": sorted({str(c.key) for c in unknown})}
        dup_total += len(dups)
        unknown_total += len(unknown)
        if dups:
            problems.append(f"{n}: {len(dups)} new key(s) for a transition already under way: "
                            f"{[(c.op, c.key, c.state_before) for c in dups]}")
        if unknown:
            problems.append(f"{n}: keys sent that the operator never logged as decided: {per[n]['undecided_keys']}")
        if cycles > ups[n]:
            problems.append(f"{n}: powered on {cycles} times for {ups[n]} power-on decision(s)")
        if len(start_keys) > ups[n] or len(stop_keys) > downs[n]:
            problems.append(f"{n}: {len(start_keys)}/{len(stop_keys)} start/stop keys for "
                            f"{ups[n]}/{downs[n]} decisions")
    first_sent: dict[str, float] = {}
    for c in ap.calls:
        if c.key is not None:
            first_sent.setdefault(c.key, c.at)
    lags = [first_sent[d["key"]] - _stamp(d.get("timestamp")) for d in decided
            if d["key"] in first_sent and d.get("node") in names and d.get("timestamp")]
    hosted = {p.node for p in ap.pods.values() if p.node}
    figures = {
        "decision_to_first_request_seconds_max": round(max(lags), 3) if lags else 0.0,
        "machines_powered_on_that_ran_no_pod": sum(1 for n in names if ap.machines[n].power_cycles and n not in hosted),
        "webhook_requests": sum(1 for c in ap.calls if c.machine in names),
        "webhook_requests_replayed": sum(1 for c in ap.calls if c.machine in names and c.replayed),
        "power_on_decisions": sum(ups[n] for n in names),
        "power_off_decisions": sum(downs[n] for n in names),
        "power_on_decided_events": sum(ap.events("PowerOnDecided", n) for n in names),
        "power_cycles": sum(ap.machines[n].power_cycles for n in names),
        "duplicate_transitions": dup_total,
        "undecided_keys_sent": unknown_total,
    }
    return figures, per, problems


def _stamp(text: str | None) -> float:
    """A log record's timestamp (ISO 8601, UTC) as Unix seconds (the operator logs after its status write, so
    this is a little after the decision itself)."""
    return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


async def burst(ap: ApRig, count: int, gpus: int, runtime: float, spacing: float, prefix: str = "p") -> float:
    """`count` pods of `gpus` GPUs each, `spacing` s apart; returns when the first was created."""
    t0 = time.time()
    for i in range(count):
        await asyncio.sleep(max(0.0, t0 + i * spacing - time.time()))
        await ap.create_pod(f"{prefix}-{i:03d}", gpus, runtime)
    return t0


"""An in-process "agent farm": what `gpuops agent` does on many MIG nodes, reduced to its effects on the API.

Hundreds of MIG nodes cannot each run an agent process on one machine, so the scale benchmark runs this farm
inside the emulator's process instead. Per node it keeps a MigNode (every GPU MIG-enabled, its slices, a
heartbeat refreshed every `heartbeat_seconds`), answers AllocationClaims like the agent does (Pending ->
Created with a device UUID; the ADVERTISE annotation -> `advertised` and the slice counted in the node's
allocatable; Released or deleted -> the slice is gone), exactly as tests/controllers/migslicer's FakeAgent.

It is event-driven: a store listener marks the node of a changed claim dirty and one task works the dirty
nodes, so the farm costs nothing while the allocator is idle. It reads the store directly and writes through
the API's handlers (`ClusterAccess`), so the operator sees ordinary watch events.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterable
from typing import Any

import structlog

from .apiserver.errors import StatusError
from .apiserver.objects import rfc3339
from .cluster.access import NODES, ClusterAccess, WatchEvent

__all__ = ["ADVERTISE", "CLAIMS", "MIG_NODES", "MigAgentFarm"]

log = structlog.get_logger("gpuops_sim.migfarm")

CLAIMS = ("gpuops.io", "allocationclaims")
MIG_NODES = ("gpuops.io", "mignodes")
ADVERTISE = "gpuops.io/advertise"
OUR_PREFIX = "gpuops.io/mig-"
API_VERSION = "gpuops.io/v1alpha1"

Slice = tuple[str, int, int, str]  # gpu uuid, start, size, profile


def mig_uuid(namespace: str, claim: str) -> str:
    """The MIG device UUID of the slice made for a claim, in NVML's MIG-<uuid> form."""
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{namespace}/{claim}')}"


def gpu_uuids(node: str, count: int) -> list[str]:
    return [f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{i}')}" for i in range(count)]  # NVML's form


class _FarmNode:
    __slots__ = ("claims", "gpus", "model", "name", "offered", "slices")

    def __init__(self, name: str, model: str, gpus: int) -> None:
        self.name = name
        self.model = model
        self.gpus = gpu_uuids(name, gpus)
        self.claims: set[tuple[str, str]] = set()  # live claim keys (namespace, name) naming this node
        self.slices: dict[tuple[str, str], Slice] = {}
        self.offered: dict[str, int] = {}


class MigAgentFarm:
    """`await farm.start()` publishes a MigNode per node; `await farm.stop()` ends its tasks."""

    def __init__(self, access: ClusterAccess, nodes: Iterable[tuple[str, str, int]],
                 heartbeat_seconds: float = 30.0) -> None:
        """`nodes`: (node name, GPU model, GPUs) of every MIG node the farm plays the agent of."""
        self.access = access
        self.nodes = {n: _FarmNode(n, model, g) for n, model, g in nodes}
        self.heartbeat_seconds = heartbeat_seconds
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.claims_created = 0
        self.claims_released = 0
        self.writes = 0
        self.errors = 0

    # ------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        for n in self.nodes.values():
            body = {"apiVersion": API_VERSION, "kind": "MigNode", "metadata": {"name": n.name},
                    "spec": {"nodeName": n.name}}
            with contextlib.suppress(StatusError):  # already there (a restarted farm)
                await self.access.create(MIG_NODES, "", body)
            await self._publish(n)
        self.access.listen(self._on_event)
        self._tasks = [asyncio.create_task(self._work()), asyncio.create_task(self._heartbeats())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    # ------------------------------------------------------------------------------------ events

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr != CLAIMS:
            return
        node = str(((ev.new.obj.get("spec") or {}).get("nodeName")) or "")
        n = self.nodes.get(node)
        if n is None:
            return
        if ev.type == "DELETED":
            n.claims.discard(ev.key)
        else:
            n.claims.add(ev.key)
        self._dirty.add(node)
        self._wake.set()

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                node = self._dirty.pop()
                try:
                    await self._sync(self.nodes[node])
                except Exception as e:  # one node's failure must not stop the farm: retry it on its next event
                    self.errors += 1
                    log.warning("agent farm: node sync failed", node=node, error=str(e))

    async def _sync(self, n: _FarmNode) -> None:
        changed = False
        offered: dict[str, int] = {}
        for key in list(n.claims):
            ns, name = key
            c = self.access.get(CLAIMS, ns, name)
            if c is None:
                n.claims.discard(key)
                if n.slices.pop(key, None) is not None:
                    changed = True
                continue
            spec, status = c.get("spec") or {}, c.get("status") or {}
            phase = status.get("phase") or "Pending"
            advertise = ADVERTISE in ((c.get("metadata") or {}).get("annotations") or {})
            if phase == "Pending":
                n.slices[key] = (str(spec.get("gpuUUID", "")), int(spec.get("start", 0)), int(spec.get("size", 0)),
                                 str(spec.get("profile", "")))
                device = mig_uuid(ns, name)
                await self._status(key, {"phase": "Created", "deviceUUID": device,
                                         "message": f"slice {device} made on {n.name}"})
                self.claims_created += 1
                changed = True
                phase = "Created"
            elif phase in ("Released", "Failed"):
                n.claims.discard(key)
                if n.slices.pop(key, None) is not None:
                    self.claims_released += 1
                    changed = True
                continue
            if phase == "Created" and advertise and not status.get("advertised"):
                await self._status(key, {"advertised": True})
            if phase in ("Created", "Bound") and advertise:
                r = OUR_PREFIX + str(spec.get("profile", "")).replace("+", "-")
                offered[r] = offered.get(r, 0) + 1
        if changed:
            await self._publish(n)
        if offered != n.offered:
            res = {**{r: "0" for r in n.offered}, **{r: str(v) for r, v in offered.items()}}
            await self.access.patch(NODES, "", n.name, {"status": {"capacity": res, "allocatable": res}}, "status")
            self.writes += 1
            n.offered = offered

    async def _status(self, key: tuple[str, str], status: dict[str, Any]) -> None:
        try:
            await self.access.patch(CLAIMS, key[0], key[1], {"status": status}, "status")
            self.writes += 1
        except StatusError as e:
            if e.code != 404:  # the claim went away meanwhile (its pod was deleted): nothing to answer
                raise

    # ------------------------------------------------------------------------------------ MigNode

    def _gpus(self, n: _FarmNode) -> list[dict[str, Any]]:
        out = []
        for i, g in enumerate(n.gpus):
            mine = sorted(((k, s) for k, s in n.slices.items() if s[0] == g), key=lambda ks: ks[1][1])
            out.append({"index": i, "uuid": g, "model": n.model, "migMode": "Enabled",
                        "slices": [{"profile": p, "start": st, "size": sz, "deviceUUID": mig_uuid(k[0], k[1]),
                                    "claim": f"{k[0]}/{k[1]}"} for k, (_, st, sz, p) in mine]})
        return out

    async def _publish(self, n: _FarmNode) -> None:
        await self.access.patch(MIG_NODES, "", n.name, {"status": {
            "backend": "emulated", "agentVersion": "sim-farm", "gpus": self._gpus(n),
            "heartbeat": rfc3339(self.access.now())}}, "status")
        self.writes += 1

    async def _heartbeats(self) -> None:
        """Every node's heartbeat refreshed once per `heartbeat_seconds`, spread evenly over the interval."""
        names = sorted(self.nodes)
        gap = self.heartbeat_seconds / max(1, len(names))
        while True:
            for name in names:
                await asyncio.sleep(gap)
                try:
                    await self.access.patch(MIG_NODES, "", name, {"status": {
                        "heartbeat": rfc3339(self.access.now())}}, "status")
                    self.writes += 1
                except StatusError as e:
                    self.errors += 1
                    log.warning("agent farm: heartbeat failed", node=name, error=str(e))

"""The node agent: makes the slices its node's claims ask for, offers them to the kubelet, reports the node.

One reconcile per change of the node's claims (label `gpuops.io/node=<node>`) and on a heartbeat timer. It reads
the layout from the GPUs every time (the device is the truth, not memory, so a restarted agent needs no state):
  Pending claim    its slice is made at the claim's exact placement (or adopted, if an earlier agent made it and
                   died before writing Created; never the slice of an ended claim) -> Created with the device
                   UUID. A placement taken by a slice no claim owns is freed first; one taken by another claim's
                   slice, or any non-retryable NVML error, -> Failed with the reason (the allocator plans again).
                   Retryable errors are retried.
  Created claim    whose slice vanished (a reboot: MIG instances do not survive one) is made again; a Bound one
                   (its container had the device) -> Failed: the pod lost its device.
  advertised       claims annotated `gpuops.io/advertise` have their slice listed by the device plugin of its
                   profile (`gpuops.io/mig-<profile>`), then status.advertised; the kubelet's Allocate of a slice
                   marks its claim Bound.
  orphans          slices of Released and Failed claims are destroyed at once, first of all (the allocator plans
                   newer claims on their placements once their pods finished); slices no claim names (the claim
                   was deleted, or an agent died between making a slice and its claim going away) after `grace`
                   seconds.
  MigNode          GPUs, MIG mode, and the slices with their claims, written when they change and on heartbeats.
  held             while the operator's answer to that write carries ConflictDetected=True (another MIG manager or
                   MIG device plugin on the node, see `gpuops.controllers.migslicer.conflicts`), no slice is made
                   or destroyed: Pending claims wait (the allocator plans them elsewhere), slices no claim owns are
                   left to their owner. Offering made slices and reporting go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import msgspec
import structlog

from gpuops import __version__
from gpuops.controllers.coexistence import CONDITION
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result
from gpuops.kube.deviceplugin.server import AllocationResult, Device, DevicePluginServer
from gpuops.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from gpuops.kube.informer import Informer
from gpuops.kube.manager import Manager
from gpuops.kube.times import format_time, wall_clock

from ..api import (
    ADVERTISE,
    CLAIMS,
    MIG_NODES,
    NODE_LABEL,
    AllocationClaim,
    MigGPU,
    MigNode,
    MigNodeStatus,
    MigSlice,
    resource_of_profile,
)
from .gpus import GpuInfo, MigBackend, MigBackendError, SliceInfo
from .plugins import mig_allocation

__all__ = ["AgentSettings", "NodeAgent", "install"]

log = structlog.get_logger("gpuops.controllers.migslicer.agent")
T = TypeVar("T")
_LIVE = ("Pending", "Created", "Bound")


@dataclass(frozen=True, slots=True)
class AgentSettings:
    grace: float = 30.0
    """A slice no claim names is destroyed after this long (a claim and its slice are never made in one step)."""
    heartbeat: float = 15.0
    retry: float = 1.0
    backend_name: str = "nvml"


@dataclass(eq=False, repr=False)
class NodeAgent:
    """Makes one node's MIG slices match its claims, offers them to the kubelet, and reports the node."""

    client: Client
    node: str
    backend: MigBackend
    claims: Informer[AllocationClaim]
    _: KW_ONLY
    plugin_dir: Path | None = None
    settings: AgentSettings = field(default_factory=AgentSettings)
    clock: Callable[[], int] = wall_clock
    request: Request = field(init=False)
    plugins: dict[str, DevicePluginServer] = field(default_factory=dict, init=False)
    _offered: dict[str, list[str]] = field(default_factory=dict, init=False)
    """Resource -> device UUIDs listed by its plugin."""
    _orphans: dict[tuple[str, int], float] = field(default_factory=dict, init=False)
    """(gpu, start) -> monotonic time first seen unclaimed."""
    _published: MigNodeStatus | None = field(default=None, init=False)
    _published_at: float = field(default=0.0, init=False)
    held: str | None = field(default=None, init=False)
    """The operator's ConflictDetected message while another MIG manager owns the node's geometry, else None."""
    held_at: float | None = field(default=None, init=False)
    """When (monotonic) a reconcile last left the slices alone because of `held`."""
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    def __post_init__(self) -> None:
        self.request = Request("", self.node)

    def map_claim(self, _claim: AllocationClaim) -> list[Request]:
        return [self.request]

    async def _call(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn)

    # ------------------------------------------------------------------------------------------ reconcile

    async def reconcile(self, _req: Request) -> Result | None:
        async with self._lock:
            return await self._reconcile()

    async def _reconcile(self) -> Result | None:
        gpus = await self._call(self.backend.gpus)
        slices = await self._call(self.backend.slices)
        claims = sorted(self.claims.store.list(), key=lambda c: (c.metadata.creation_timestamp or "", c.metadata.name))
        retry = False
        if self.held is None:
            # first the slices of ended claims: the allocator plans newer claims on their placements already
            ended = _ended_devices(claims)
            slices = await self._clean(claims, slices, ended)
            for c in claims:
                if c.status.phase in ("Pending", "Created", "Bound"):
                    changed = await self._ensure(c, slices, ended)
                    if changed is None:
                        retry = True
                    elif changed:
                        slices = await self._call(self.backend.slices)
        else:
            self._orphans.clear()  # their grace starts over once the node is ours again
            self.held_at = time.monotonic()
        await self._advertise(claims, slices)
        await self._publish(gpus, slices, claims)
        return Result(requeue_after=self.settings.retry if retry else self.settings.heartbeat)

    @staticmethod
    def _at(slices: Sequence[SliceInfo], c: AllocationClaim) -> SliceInfo | None:
        return next((s for s in slices if s.gpu_uuid == c.spec.gpu_uuid and s.start == c.spec.start), None)

    async def _ensure(self, c: AllocationClaim, slices: list[SliceInfo], ended: set[str]) -> bool | None:
        """Make the claim's slice exist; True when the layout changed, None when it should be retried. An ended
        claim's slice is never taken over: its pod's processes may still hold it (a force-deleted pod), so it is
        destroyed (which NVML refuses while in use) and made anew."""
        s = self._at(slices, c)
        owners = {(x.spec.gpu_uuid, x.spec.start): x for x in self.claims.store.list() if x.status.phase in _LIVE}
        if (s is not None and s.profile == c.spec.profile and s.complete
                and (s.device_uuid not in ended or s.device_uuid == c.status.device_uuid)):
            if c.status.phase == "Pending" or c.status.device_uuid != s.device_uuid:
                await self._status(c, {"phase": "Created" if c.status.phase == "Pending" else c.status.phase,
                                       "deviceUUID": s.device_uuid, "createdAt": format_time(self.clock()),
                                       "message": f"slice {s.device_uuid} exists on {self.node}"})
            return False
        if c.status.phase == "Bound":
            await self._status(c, {"phase": "Failed", "message": "the slice is gone (the node rebooted or the GPU "
                                   "was reset); the pod lost its MIG device"})
            return False
        try:
            if s is not None and s.profile == c.spec.profile and not s.complete:
                made = await self._call(lambda: self.backend.finish(s.gpu_uuid, s.gpu_instance_id))
            else:
                if s is not None:
                    owner = owners.get((s.gpu_uuid, s.start))
                    if owner is not None and owner.metadata.uid != c.metadata.uid:
                        await self._status(c, {"phase": "Failed", "message": f"placement {c.spec.gpu_uuid}/"
                                               f"{c.spec.start} holds {owner.metadata.name}'s slice"})
                        return False
                    await self._call(lambda: self.backend.destroy(s.gpu_uuid, s.gpu_instance_id))
                made = await self._call(lambda: self.backend.create(c.spec.gpu_uuid, c.spec.profile, c.spec.start))
        except MigBackendError as e:
            if e.retryable:
                log.info("slice creation will be retried", claim=_key(c), error=str(e))
                return None
            overlap = [x for x in slices if x.gpu_uuid == c.spec.gpu_uuid and x.start < c.spec.start + c.spec.size
                       and c.spec.start < x.start + x.size]
            if overlap and all((x.gpu_uuid, x.start) not in owners for x in overlap):
                try:
                    for x in overlap:  # slices no claim owns overlap it: free them, make it next pass
                        await self._destroy(x)
                except MigBackendError as err:  # still in use (its pod's processes are ending): next pass
                    log.info("slice in the way not destroyed yet", claim=_key(c), error=str(err))
                return None
            await self._status(c, {"phase": "Failed", "message": f"cannot create {c.spec.profile} at "
                                   f"{c.spec.gpu_uuid}/{c.spec.start}: {e}"})
            return False
        log.info("slice created", claim=_key(c), gpu=made.gpu_uuid, start=made.start, profile=made.profile,
                 device=made.device_uuid)
        await self._status(c, {"phase": "Created", "deviceUUID": made.device_uuid,
                               "createdAt": format_time(self.clock()),
                               "message": f"slice {made.device_uuid} made on {self.node}"})
        return True

    async def _clean(self, claims: list[AllocationClaim], slices: list[SliceInfo], ended: set[str]
                     ) -> list[SliceInfo]:
        live = {(c.spec.gpu_uuid, c.spec.start): c for c in claims if c.status.phase in _LIVE}
        released = {(c.spec.gpu_uuid, c.spec.start) for c in claims if c.status.phase in ("Released", "Failed")}
        now = time.monotonic()
        changed = False
        seen: set[tuple[str, int]] = set()
        for s in slices:
            key = (s.gpu_uuid, s.start)
            c = live.get(key)
            if c is not None and c.spec.profile == s.profile and (
                    s.device_uuid not in ended or s.device_uuid == c.status.device_uuid):
                continue
            seen.add(key)
            first = self._orphans.setdefault(key, now)
            if key in released or now - first >= self.settings.grace:
                try:
                    await self._destroy(s)
                    log.info("slice destroyed", gpu=s.gpu_uuid, start=s.start, profile=s.profile,
                             reason="released" if key in released else "no claim")
                    changed = True
                except MigBackendError as e:
                    log.info("slice not destroyed yet", gpu=s.gpu_uuid, start=s.start, error=str(e))
        for key in [k for k in self._orphans if k not in seen]:
            del self._orphans[key]
        return await self._call(self.backend.slices) if changed else slices

    async def _destroy(self, s: SliceInfo) -> bool:
        return await self._call(lambda: self.backend.destroy(s.gpu_uuid, s.gpu_instance_id))

    # ------------------------------------------------------------------------------------------ kubelet

    async def _advertise(self, claims: list[AllocationClaim], slices: list[SliceInfo]) -> None:
        by_place = {(s.gpu_uuid, s.start): s for s in slices if s.complete}
        offer: dict[str, list[tuple[str, AllocationClaim]]] = {}
        for c in claims:
            s = by_place.get((c.spec.gpu_uuid, c.spec.start))
            if (c.status.phase in ("Created", "Bound") and ADVERTISE in (c.metadata.annotations or {})
                    and s is not None and s.profile == c.spec.profile):
                offer.setdefault(resource_of_profile(c.spec.profile), []).append((s.device_uuid, c))
        for resource in sorted(set(offer) | set(self._offered)):
            ids = sorted(d for d, _ in offer.get(resource, []))
            if self._offered.get(resource) != ids:
                self._offered[resource] = ids
                await self._plugin(resource)
        for resource, pairs in offer.items():
            if not self._registered(resource):
                continue  # offered to no kubelet yet: `advertised` would claim what is not so
            for _, c in pairs:
                if not c.status.advertised:
                    await self._status(c, {"advertised": True})

    def _registered(self, resource: str) -> bool:
        """The plugin of `resource` is registered with the kubelet (always, with no kubelet to talk to)."""
        if self.plugin_dir is None:
            return True
        plugin = self.plugins.get(resource)
        if plugin is not None and plugin.registered:
            return True
        log.warning("slices not advertised: device plugin not registered with the kubelet", resource=resource,
                    kubelet=str(self.plugin_dir), fix="is the kubelet's device-plugins directory mounted at this "
                    "path and the kubelet running? the plugin registers by itself once it is")
        return False

    async def _plugin(self, resource: str) -> None:
        plugin = self.plugins.get(resource)
        if plugin is None:
            if self.plugin_dir is None:
                return  # no kubelet to talk to (tests of the agent alone)
            plugin = DevicePluginServer(resource, self.plugin_dir, lambda r=resource: self._devices(r),  # type: ignore[misc]
                                        self._allocate)
            self.plugins[resource] = plugin
            await plugin.start()
            try:
                await plugin.register()
            except Exception as e:  # the kubelet is not up yet: the plugin registers when it appears
                log.info("device plugin not registered yet", resource=resource, error=str(e))
        else:
            plugin.update()

    def _devices(self, resource: str) -> list[Device]:
        """The plugin's devices, slices made but not yet handed to a container first. The kubelet frees a
        finished pod's devices before the allocator has withdrawn them, so for a moment a Bound slice and the
        slice made for the next pod can both be free; GetPreferredAllocation proposes in this order, so the
        kubelet takes the one that was made for the pod it admits."""
        ids = self._offered.get(resource, [])
        waiting = {c.status.device_uuid for c in self.claims.store.list()
                   if c.status.phase == "Created" and c.status.device_uuid}
        return [Device(d) for d in sorted(ids, key=lambda d: d not in waiting)]

    async def _allocate(self, ids: list[str]) -> AllocationResult:
        """The kubelet gives these slices to a container: their claims are Bound."""
        for c in self.claims.store.list():
            if c.status.device_uuid in ids and c.status.phase == "Created":
                await self._status(c, {"phase": "Bound", "boundAt": format_time(self.clock()),
                                       "message": f"slice {c.status.device_uuid} given to a container"})
        return mig_allocation(ids)

    # ------------------------------------------------------------------------------------------ API writes

    async def _status(self, c: AllocationClaim, status: dict[str, Any]) -> None:
        with contextlib.suppress(NotFound):
            await self.client.patch(CLAIMS, c.metadata.name, {"status": status}, namespace=c.metadata.namespace,
                                    subresource="status")

    async def _publish(self, gpus: list[GpuInfo], slices: list[SliceInfo], claims: list[AllocationClaim]) -> None:
        owner = {(c.spec.gpu_uuid, c.spec.start): f"{c.metadata.namespace}/{c.metadata.name}"
                 for c in claims if c.status.phase in _LIVE}
        report = MigNodeStatus(
            backend=self.settings.backend_name, agent_version=__version__,
            gpus=tuple(MigGPU(
                index=g.index, uuid=g.uuid, model=g.model, product=g.product, memory_mib=g.memory_mib,
                mig_mode=g.mig_mode,
                slices=tuple(MigSlice(profile=s.profile, start=s.start, size=s.size, device_uuid=s.device_uuid,
                                      claim=owner.get((s.gpu_uuid, s.start), ""),
                                      gpu_instance_id=s.gpu_instance_id, compute_instance_id=s.compute_instance_id)
                             for s in sorted(slices, key=lambda s: s.start) if s.gpu_uuid == g.uuid),
            ) for g in gpus),
        )
        due = time.monotonic() - self._published_at >= self.settings.heartbeat
        if report == self._published and not due:
            return
        body = {"status": {**msgspec.to_builtins(report), "heartbeat": format_time(self.clock()),
                           "gpus": msgspec.to_builtins(report.gpus)}}
        try:
            written = await self.client.patch(MIG_NODES, self.node, body, subresource="status")
        except NotFound:
            with contextlib.suppress(AlreadyExists):
                await self.client.create(MIG_NODES, {"apiVersion": "gpuops.io/v1alpha1", "kind": "MigNode",
                                                     "metadata": {"name": self.node},
                                                     "spec": {"nodeName": self.node}})
            written = await self.client.patch(MIG_NODES, self.node, body, subresource="status")
        except (Conflict, ApiError) as e:
            log.info("MigNode not written", node=self.node, error=str(e))
            return
        self._published = report
        self._published_at = time.monotonic()
        self._follow(written)

    def _follow(self, report: MigNode) -> None:
        """Take the operator's verdict from our MigNode as the API server returned it: the agent may not read
        Nodes, so it learns of another MIG manager on its node through the condition the operator keeps there."""
        found = cond.get_condition(report.status.conditions, CONDITION)
        held = found.message if found is not None and found.status == "True" else None
        if held != self.held:
            if held is not None:
                log.warning("slices left alone: another MIG manager on this node", node=self.node, reason=held)
            else:
                log.info("slices managed again: no other MIG manager on this node", node=self.node)
        self.held = held

    async def close(self) -> None:
        for plugin in self.plugins.values():
            await plugin.stop()
        self.plugins.clear()


def _key(c: AllocationClaim) -> str:
    return f"{c.metadata.namespace}/{c.metadata.name}"


def install(manager: Manager, node: str, backend: MigBackend, *, plugin_dir: str | Path | None = None,
            settings: AgentSettings | None = None) -> NodeAgent:
    """The agent under a Manager of its own (every node runs one: no leader election)."""
    claims = manager.informer(CLAIMS, namespace=None, label_selector=f"{NODE_LABEL}={node}")
    plugins = None if plugin_dir is None else Path(plugin_dir)
    agent = NodeAgent(manager.client, node, backend, claims, plugin_dir=plugins, settings=settings or AgentSettings())
    controller = Controller("mig-agent", agent.reconcile, client=manager.client, max_concurrent_reconciles=1)
    controller.watch(claims, agent.map_claim)
    manager.add(controller)
    backend.open()  # NVML init is quick; a node without a usable driver fails here, before anything is served

    async def lifecycle() -> None:
        controller.enqueue(agent.request, trigger="start")  # report the node even before any claim exists
        try:
            await asyncio.Event().wait()
        finally:
            with anyio.CancelScope(shield=True):  # we are being cancelled: the cleanup must still run
                await agent.close()  # the device plugins go first: the kubelet stops offering our slices at once
                with anyio.move_on_after(5):  # a driver call that hangs must not hold the shutdown
                    await anyio.to_thread.run_sync(backend.close, abandon_on_cancel=True)

    manager.add_runnable("mig-agent-lifecycle", lifecycle, need_leader_election=False)
    return agent


def _ended_devices(claims: Sequence[AllocationClaim]) -> set[str]:
    """Device UUIDs of Released and Failed claims that no live claim holds: slices to destroy, never to adopt."""
    live = {c.status.device_uuid for c in claims if c.status.phase in _LIVE and c.status.device_uuid}
    return {c.status.device_uuid for c in claims
            if c.status.phase in ("Released", "Failed") and c.status.device_uuid and c.status.device_uuid not in live}

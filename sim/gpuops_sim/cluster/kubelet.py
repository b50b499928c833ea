"""The kubelets of every machine in a `Fleet`, run as one component (KWOK-like: no containers, only status).

A machine that is on has a live kubelet: it registers its Node, renews its Lease, posts node status, admits
the pods bound to it and walks them through their phases with the timestamps a real kubelet writes. A machine
that goes off has none: its Node and pods freeze until the node lifecycle controller notices, as on a real
cluster. One task and one timer heap carry all nodes and pods; nothing here is per pod but a small record.

Time: every scheduled moment (container start, exit, restart, kill) is kept as a monotonic float and turned
into wall time through one fixed offset, so a 2 s runtime is exactly 2 s apart in the stored RFC 3339
timestamps (which Kubernetes truncates to seconds) even when the loop runs late.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import math
import random
import time
import uuid
from collections.abc import Hashable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

import structlog

from .. import gpus
from ..apiserver.errors import StatusError
from ..apiserver.objects import micro_time, rfc3339
from ..apiserver.quantity import parse_quantity
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent
from .access import LEASES, NODE_LEASE_NAMESPACE, NODES, PODS, ClusterAccess
from .loop import Loop
from .machines import Fleet, FleetEvent, Machine
from .podrequests import effective_requests
from .podspec import ContainerConfigError
from .processes import ProcessRuntime, runs_as_process

log = structlog.get_logger("gpuops_sim.kubelet")

RUNTIME_ANNOTATION = "sim.gpuops.io/runtime-seconds"
EXIT_CODE_ANNOTATION = "sim.gpuops.io/exit-code"
TERMINATION_ANNOTATION = "sim.gpuops.io/termination-seconds"
KUBELET_VERSION = "v1.37.0"
LEASE_DURATION_SECONDS = 40
TERMINAL = ("Succeeded", "Failed")
_GONE = "The container could not be located when the pod was terminated"
_GONE_DELETED = "The container could not be located when the pod was deleted.  The container used to be Running"

Key = tuple[str, str]




@dataclass
class KubeletOptions:
    start_latency_seconds: float = 1.0  # bound -> containers running
    lease_seconds: float = 10.0  # Lease renew interval (kube-node-lease/<node>), leaseDurationSeconds 40
    node_status_seconds: float = 60.0  # periodic node status (lastHeartbeatTime) besides changes
    pod_cidr_prefix: str = "10.244"  # pod IPs: one /24 per node inside <prefix>.0.0/8's second octet onwards
    events: bool = True  # Pulled/Created/Started/Killing events (off for huge benches)
    restart_backoff_seconds: float = 10.0  # CrashLoopBackOff: first restart at once, then 10 s, 20 s, ...
    restart_backoff_max_seconds: float = 300.0
    admission: bool = True  # reject pods the node cannot hold (OutOfcpu, UnexpectedAdmissionError, ...)
    # Every node gets a device manager on <device_plugin_root>/<node>/kubelet.sock, where device plugins
    # (the gpuops MIG agent) register over gRPC; None: no device plugins.
    device_plugin_root: str | None = None


@dataclass(slots=True, eq=False)
class _Node:
    name: str
    block: int  # index of the node's pod /24
    serial: int  # stable number for its InternalIP
    machine: Machine | None = None
    live: bool = False
    adopt: bool = False  # first kubelet start in this process: containers of Running pods still exist
    boot: int = 0
    boot_id: str = ""
    host_ip: str = ""
    plugin_ready: bool = True
    plugin_at: float = 0.0
    next_lease: float = math.inf
    next_status: float = math.inf
    used: dict[str, Fraction] = field(default_factory=dict)
    pods_used: int = 0
    ips: set[int] = field(default_factory=set)
    next_ip: int = 1
    alloc_rv: str = ""
    alloc: dict[str, Fraction] = field(default_factory=dict)
    dm: Any = None  # devicemanager.KubeletDeviceManager while the kubelet runs (MIG nodes with device plugins)
    sliced: bool = False  # a device plugin (the MIG agent) registered since the kubelet started: GPUs are its
    devices: dict[Key, dict[str, list[str]]] = field(default_factory=dict)  # pod -> resource -> device ids


@dataclass(slots=True, eq=False)
class _Pod:
    key: Key
    uid: str
    node: str
    boot: int
    seen: float  # when this kubelet took the pod: status.startTime
    state: str = "waiting"  # waiting | running | backoff | terminating
    due: float | None = None
    started: float = 0.0  # current container start
    finish: float | None = None  # natural exit of the current container
    restarts: int = 0
    backoff: float = 0.0  # delay before the next restart
    runtime: float | None = None
    exit_code: int = 0
    deadline: float | None = None  # activeDeadlineSeconds
    ip: str = ""
    ip_host: int = 0
    req: dict[str, Fraction] = field(default_factory=dict)
    last: dict[str, Any] | None = None  # lastState.terminated of the containers
    kill_code: int = 143
    needs_gpu: bool = False
    claimed: bool = False  # holds node resources and a pod IP of this kubelet incarnation
    phase: str = "Pending"
    process: bool = False  # its containers run as processes (ProcessRuntime), not for a simulated time
    ready: bool = True  # what its readiness probe says while it runs (simulated pods are ready when started)


def _float_annotation(meta: dict[str, Any], name: str) -> float | None:
    raw = (meta.get("annotations") or {}).get(name)
    if raw is None:
        return None
    try:
        v = float(raw)
    except (TypeError, ValueError):
        log.warning("ignoring malformed annotation", annotation=name, value=raw)
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _int_annotation(meta: dict[str, Any], name: str, default: int) -> int:
    raw = (meta.get("annotations") or {}).get(name)
    if raw is None:
        return default
    try:
        return int(str(raw).strip())
    except ValueError:
        log.warning("ignoring malformed annotation", annotation=name, value=raw)
        return default


def pod_resource_requests(spec: dict[str, Any]) -> dict[str, Fraction]:
    """The pod's effective requests as the kubelet's admission (and the scheduler) compute them."""
    return {k: v for k, v in effective_requests(spec).items() if v > 0}


def _show_amount(resource: str, v: Fraction) -> int:
    return math.ceil(v * 1000) if resource == "cpu" else math.ceil(v)


def _image_ref(image: str) -> tuple[str, str]:
    """(image, imageID) as containerd reports them: registry and tag filled in, a stable digest."""
    ref = image
    first = ref.split("/", 1)[0]
    if "/" not in ref or not ("." in first or ":" in first or first == "localhost"):
        ref = f"docker.io/{ref}" if "/" in ref else f"docker.io/library/{ref}"
    name = ref.split("@", 1)[0]
    if "@" not in ref and ":" not in name.rsplit("/", 1)[-1]:
        ref += ":latest"
        name = ref
    repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    digest = hashlib.sha256(ref.encode()).hexdigest()
    return ref, f"{repo}@sha256:{digest}"


class Kubelets(Loop):
    """All kubelets of a fleet. Writes as `system:node:<name>` through one `ClusterAccess` per node."""

    name = "kubelets"

    def __init__(self, server: APIServer, fleet: Fleet, options: KubeletOptions | None = None) -> None:
        super().__init__()
        self.server = server
        self.fleet = fleet
        self.options = options or KubeletOptions()
        self.reader = ClusterAccess(server, "system:kubelets", component="kubelet")
        self._mono0 = self.clock()
        self._wall0: datetime = self.reader.now()
        self._nodes: dict[str, _Node] = {}
        self._pods: dict[Key, _Pod] = {}
        self._by_node: dict[str, set[Key]] = {}
        self._dirty_pods: set[Key] = set()
        self._dirty_nodes: set[str] = set()
        self._went_down: set[str] = set()
        self._access: dict[str, ClusterAccess] = {}
        self._images: dict[str, tuple[str, str]] = {}
        self._blocks_used: set[int] = set()
        self._next_block = 0
        self._slice = time.perf_counter()
        prefix = self.options.pod_cidr_prefix.split(".")
        self._cidr_base = (int(prefix[0]) << 24) | (int(prefix[1]) << 16)
        # counters
        self.transitions = 0  # pod phase changes written
        self.started = 0  # pods that reached Running
        self.finished = 0  # pods that reached Succeeded/Failed through this kubelet
        self.restarts = 0
        self.rejected = 0
        self.deleted = 0  # grace-0 deletes confirming a graceful deletion
        self.writes = 0
        self.write_seconds = 0.0  # time spent inside the emulator's write path
        self.allocations: dict[Key, dict[str, str]] = {}  # pod -> the env its device plugins' Allocate returned
        self._tasks: set[asyncio.Task[Any]] = set()
        self.runtime: ProcessRuntime | None = None  # runs pods of the gpuops image as processes when set
        for s in self.server.store.iter(NODES):  # keep the pod CIDRs of Nodes registered earlier
            block = self._block_of(s.obj)
            if block is not None:
                self._blocks_used.add(block)
        fleet.subscribe(self._on_machine)
        self.reader.listen(self._on_event)
        for s in self.server.store.iter(PODS):
            self._index(s.obj, (s.obj["metadata"].get("namespace", ""), s.obj["metadata"]["name"]))
        for m in list(fleet.machines.values()):
            n = self._node(m.name)
            n.adopt = m.powered
            self._dirty_nodes.add(m.name)

    # ------------------------------------------------------------------------------------ intake (synchronous)

    def _on_machine(self, m: Machine, ev: FleetEvent) -> None:
        if ev in ("off", "removed"):
            self._went_down.add(m.name)
        self._dirty_nodes.add(m.name)
        self.wake()

    def _index(self, obj: dict[str, Any], key: Key) -> bool:
        node = (obj.get("spec") or {}).get("nodeName")
        if not node:
            return False
        if (obj.get("status") or {}).get("phase") in TERMINAL:
            keys = self._by_node.get(node)
            if keys is not None:
                keys.discard(key)
            return key in self._pods
        self._by_node.setdefault(node, set()).add(key)
        return True

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr != PODS:
            return
        key = ev.key
        obj = ev.new.obj
        if ev.type == "DELETED":
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                keys = self._by_node.get(node)
                if keys is not None:
                    keys.discard(key)
            if key in self._pods:
                self._dirty_pods.add(key)
                self.wake()
            return
        prev = ev.prev.obj if ev.prev is not None else None
        if prev is not None:
            pnode = (prev.get("spec") or {}).get("nodeName")
            node = (obj.get("spec") or {}).get("nodeName")
            pm, m = prev["metadata"], obj["metadata"]
            if (
                pnode == node
                and pm.get("uid") == m.get("uid")
                and pm.get("deletionTimestamp") == m.get("deletionTimestamp")
                and pm.get("deletionGracePeriodSeconds") == m.get("deletionGracePeriodSeconds")
                and (prev.get("status") or {}).get("phase") == (obj.get("status") or {}).get("phase")
            ):
                return  # a status write (ours, or a condition from a controller): nothing for the kubelet
            if pnode and pnode != node:
                keys = self._by_node.get(pnode)
                if keys is not None:
                    keys.discard(key)
        if self._index(obj, key):
            self._dirty_pods.add(key)
            self.wake()

    # ------------------------------------------------------------------------------------ helpers

    def _node(self, name: str) -> _Node:
        n = self._nodes.get(name)
        if n is None:
            n = self._nodes[name] = _Node(name=name, block=-1, serial=len(self._nodes))
        return n

    def _acc(self, node: str) -> ClusterAccess:
        a = self._access.get(node)
        if a is None:
            a = self._access[node] = ClusterAccess(
                self.server, f"system:node:{node}", component="kubelet", groups=("system:nodes",)
            )
        return a

    def _wall(self, mono: float) -> datetime:
        return self._wall0 + timedelta(seconds=mono - self._mono0)

    def _stamp(self, mono: float) -> str:
        return rfc3339(self._wall(mono))

    def _alive(self, n: _Node) -> bool:
        """The machine is on right now (it may have gone off while this step awaited a write)."""
        m = self.fleet.machines.get(n.name)
        return n.live and m is not None and m is n.machine and m.powered and n.name not in self._went_down

    def _image(self, image: str) -> tuple[str, str]:
        got = self._images.get(image)
        if got is None:
            got = self._images[image] = _image_ref(image)
        return got

    @staticmethod
    def _block_of(node: dict[str, Any]) -> int | None:
        cidr = (node.get("spec") or {}).get("podCIDR")
        if not cidr:
            return None
        try:
            net = ipaddress.IPv4Network(cidr, strict=False)
        except ValueError:
            return None
        return int(net.network_address) >> 8

    def _assign_block(self, n: _Node, existing: dict[str, Any] | None) -> None:
        block = self._block_of(existing) if existing is not None else None
        if block is None:
            while True:
                off = ((self._cidr_base & 0xFFFFFF) + self._next_block * 256) % (1 << 24)
                block = ((self._cidr_base & 0xFF000000) | off) >> 8
                self._next_block += 1
                if block not in self._blocks_used:
                    break
        self._blocks_used.add(block)
        n.block = block

    def _pod_cidr(self, n: _Node) -> str:
        return f"{ipaddress.IPv4Address(n.block << 8)}/24"

    def _alloc_ip(self, n: _Node) -> tuple[str, int]:
        for _ in range(254):
            h = n.next_ip
            n.next_ip = n.next_ip % 254 + 1
            if h not in n.ips:
                n.ips.add(h)
                return str(ipaddress.IPv4Address((n.block << 8) | h)), h
        h = n.next_ip  # more live pods than a /24 holds (max_pods > 254): reuse, as an exhausted IPAM would not
        return str(ipaddress.IPv4Address((n.block << 8) | h)), h

    async def _breathe(self) -> None:
        """Yield to the HTTP server and the other components every ~20 ms of work."""
        if time.perf_counter() - self._slice > 0.02:
            await asyncio.sleep(0)
            self._slice = time.perf_counter()

    def _schedule(self, p: _Pod, when: float | None) -> None:
        if p.deadline is not None and (when is None or p.deadline < when):
            when = p.deadline
        p.due = when
        if when is not None:
            self.at(("pod", *p.key), when)

    # ------------------------------------------------------------------------------------ the loop

    async def step(self) -> None:
        self._slice = time.perf_counter()
        names, self._dirty_nodes = sorted(self._dirty_nodes), set()
        for i, name in enumerate(names):
            try:
                await self._guard(self._sync_machine(name), "machine", name)
                await self._breathe()
            except asyncio.CancelledError:  # stopped mid-step: keep what is left for the next start
                self._dirty_nodes.update(names[i:])
                raise
        keys, self._dirty_pods = list(self._dirty_pods), set()
        for i, key in enumerate(keys):
            try:
                await self._guard(self._sync_pod(key), "pod", key)
                await self._breathe()
            except asyncio.CancelledError:
                self._dirty_pods.update(keys[i:])
                raise
        now = self.clock()
        due = self.due(now)
        for i, tkey in enumerate(due):
            try:
                await self._guard(self._timer(tkey, now), "timer", tkey)
                await self._breathe()
            except asyncio.CancelledError:
                for rest in due[i:]:
                    self.at(rest, now)
                raise

    async def _guard(self, work: Any, what: str, key: Hashable) -> None:
        try:
            await work
        except Exception:  # one bad object must not starve the others
            self.errors += 1
            log.exception("kubelet work failed", item=what, key=str(key))

    async def _timer(self, tkey: Hashable, now: float) -> None:
        assert isinstance(tkey, tuple)
        kind = tkey[0]
        if kind == "pod":
            p = self._pods.get((tkey[1], tkey[2]))
            if p is not None and p.due is not None and p.due <= now:
                await self._pod_due(p, now)
            return
        if kind == "machine":
            await self._sync_machine(tkey[1])
            return
        if kind == "ready":
            await self._post_readiness((tkey[1], tkey[2]))
            return
        n = self._nodes.get(tkey[1])
        if n is None or not self._alive(n):
            return
        if kind == "lease" and n.next_lease <= now:
            n.next_lease = now + self.options.lease_seconds
            self.at(("lease", n.name), n.next_lease)
            await self._renew_lease(n)
        elif kind == "status" and n.next_status <= now:
            await self._post_status(n)
        elif kind == "plugin" and not n.plugin_ready and n.plugin_at <= now:
            n.plugin_ready = True
            await self._post_status(n)
            for key in list(self._by_node.get(n.name, ())):
                p = self._pods.get(key)
                if p is not None and p.state == "waiting" and p.needs_gpu and p.due is None:
                    self._schedule(p, max(now, p.seen + self.options.start_latency_seconds))

    # ------------------------------------------------------------------------------------ machines

    async def _sync_machine(self, name: str) -> None:
        m = self.fleet.machines.get(name)
        n = self._node(name)
        went_down = name in self._went_down
        self._went_down.discard(name)
        if n.live and (went_down or m is None or not m.powered or m is not n.machine):
            self._stop(n)
        if m is not None and m.powered and not n.live:
            await self._start_kubelet(n, m)

    def _stop(self, n: _Node) -> None:
        """The kubelet dies with its machine: no more writes; the API keeps whatever it last said."""
        if n.dm is not None:
            self._spawn(n.dm.stop())
            n.dm = None
        n.devices.clear()
        n.sliced = False
        n.live = False
        n.adopt = False
        n.next_lease = n.next_status = math.inf
        for key in list(self._by_node.get(n.name, ())):
            p = self._pods.get(key)
            if p is not None:
                self._forget(p)
        n.used.clear()
        n.pods_used = 0
        n.ips.clear()
        log.info("kubelet stopped", node=n.name)

    async def _start_kubelet(self, n: _Node, m: Machine) -> None:
        acc = self._acc(n.name)
        now = self.clock()
        n.machine = m
        n.live = True
        n.boot += 1
        n.boot_id = str(uuid.uuid4())
        n.next_ip = 1
        n.plugin_ready = m.gpus <= 0 or m.device_plugin_seconds <= 0
        n.plugin_at = now + max(0.0, m.device_plugin_seconds)
        existing = acc.get(NODES, "", n.name)
        if n.block < 0 or (existing is not None and self._block_of(existing) is not None):
            self._assign_block(n, existing)
        n.host_ip = self._host_ip(n, existing)
        await self._start_device_manager(n, m)
        try:
            await self._register(n, existing)
        except Exception:
            n.live = False
            self.at(("machine", n.name), now + 1.0)  # retried, as a kubelet retries registration
            raise
        if not self._alive(n):
            return
        await self._renew_lease(n)
        jitter = random.uniform(0.5, 1.0)  # real kubelets are spread over the interval; so are these
        n.next_lease = now + self.options.lease_seconds * jitter
        self.at(("lease", n.name), n.next_lease)
        n.next_status = now + self.options.node_status_seconds * jitter
        self.at(("status", n.name), n.next_status)
        if not n.plugin_ready:
            self.at(("plugin", n.name), n.plugin_at)
        self._dirty_pods.update(self._by_node.get(n.name, ()))
        self.wake()
        log.info("kubelet started", node=n.name, boot=n.boot)

    async def stop(self) -> None:
        await super().stop()
        for n in self._nodes.values():
            if n.dm is not None:
                await n.dm.stop()
                n.dm = None
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task

    # ------------------------------------------------------------------------------------ device plugins

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_device_manager(self, n: _Node, m: Machine) -> None:
        """The kubelet's device manager, on every node as on a real kubelet: plugins register on its socket, their
        devices become the node's capacity and allocatable (posted at once on every change). Until a plugin
        registers, a GPU machine offers its whole GPUs as nvidia.com/gpu (NVIDIA's plugin, simulated); once one
        did (the MIG agent), its GPUs are sliced and only the plugins' resources count."""
        root = self.options.device_plugin_root
        if root is None or n.dm is not None:
            return
        from pathlib import Path

        from .devicemanager import KubeletDeviceManager  # grpc: only with device plugins

        def changed(_resource: str) -> None:
            if n.live:
                n.next_status = self.clock()
                self.at(("status", n.name), n.next_status)
                self.wake()

        path = Path(root) / n.name
        path.mkdir(parents=True, exist_ok=True)
        n.dm = KubeletDeviceManager(path, on_change=changed)
        await n.dm.start()

    async def _allocate_devices(self, n: _Node, key: Key, req: dict[str, Fraction]) -> tuple[str, str] | None:
        """Allocate the pod's device-plugin resources (free devices, the plugin's preference, then Allocate), as
        the kubelet does before starting containers; (reason, message) when it cannot."""
        dm = n.dm
        if dm is None:
            return None
        wanted = {r: int(v) for r, v in req.items() if v > 0 and r in dm.devices}
        if not wanted:
            return None
        taken = {d for other, got in n.devices.items() if other != key for ids in got.values() for d in ids}
        granted: dict[str, list[str]] = {}
        envs: dict[str, str] = {}
        for r, need in sorted(wanted.items()):
            free = [d for d, healthy in sorted(dm.devices[r].items()) if healthy and d not in taken]
            if len(free) < need:
                return ("UnexpectedAdmissionError", f"Allocate failed due to requested number of devices "
                        f"unavailable for {r}. Requested: {need}, Available: {len(free)}, which is unexpected")
            try:
                ids = (await dm.preferred(r, free, [], need))[:need] or free[:need]
                if len(ids) < need:
                    ids = free[:need]
                resp = await dm.allocate(r, ids)
            except Exception as e:  # the plugin refused or went away
                return ("UnexpectedAdmissionError", f"Allocate failed for {r}: {e}")
            granted[r] = list(ids)
            envs.update(resp.envs)
        n.devices[key] = granted
        self.allocations[key] = envs
        return None

    def _host_ip(self, n: _Node, existing: dict[str, Any] | None) -> str:
        for a in ((existing or {}).get("status") or {}).get("addresses") or []:
            if a.get("type") == "InternalIP" and a.get("address"):
                return str(a["address"])
        return str(ipaddress.IPv4Address(0xAC100000 + (n.serial % 0xFFFFE) + 1))  # 172.16.0.0/12

    def _labels(self, m: Machine) -> dict[str, str]:
        itype = f"sim-{m.cpu}c-{m.gpus}x{m.gpu_model.lower()}" if m.gpu_model and m.gpus else f"sim-{m.cpu}c"
        labels = {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": m.name,
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": itype,
        }
        if m.gpu_model and m.gpus:
            try:
                labels.update(gpus.node_labels(m.gpu_model, m.gpus))
            except ValueError:
                log.warning("unknown GPU model: no GPU labels", node=m.name, model=m.gpu_model)
        labels.update(m.labels)
        return labels

    def _node_status(self, n: _Node, existing: dict[str, Any] | None) -> dict[str, Any]:
        m = n.machine
        assert m is not None
        now = self._stamp(self.clock())
        old_status = (existing or {}).get("status") or {}
        old = {c.get("type"): c for c in old_status.get("conditions") or []}
        conds = []
        for type_, status, reason, message in (
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ):
            prev = old.pop(type_, None)
            since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
            conds.append({"type": type_, "status": status, "lastHeartbeatTime": now,
                          "lastTransitionTime": since or now, "reason": reason, "message": message})
        conds.extend(old.values())  # conditions other agents own (NetworkUnavailable, problem detectors)
        plugged_capacity: dict[str, int] = n.dm.capacity() if n.dm is not None else {}
        plugged_allocatable: dict[str, int] = n.dm.allocatable() if n.dm is not None else {}
        capacity: dict[str, Any] = {
            "cpu": m.cpu,
            "memory": m.memory,
            "pods": str(m.max_pods),
            "ephemeral-storage": "1Ti",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
        }
        n.sliced = n.sliced or bool(plugged_capacity)
        if m.gpus > 0 and not n.sliced:  # a MIG node's GPUs are sliced: only its device plugins' resources count
            if n.plugin_ready:
                capacity[gpus.GPU_RESOURCE] = str(m.gpus)
            elif gpus.GPU_RESOURCE in (old_status.get("capacity") or {}):
                capacity[gpus.GPU_RESOURCE] = "0"  # the kubelet zeroes device-plugin resources until re-registration
        allocatable = dict(capacity)
        for r, v in plugged_capacity.items():
            capacity[r] = str(v)
            allocatable[r] = str(plugged_allocatable.get(r, 0))
        machine_id = hashlib.sha256(n.name.encode()).hexdigest()[:32]
        return {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conds,
            "addresses": [{"type": "InternalIP", "address": n.host_ip}, {"type": "Hostname", "address": n.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": machine_id,
                "systemUUID": str(uuid.UUID(machine_id)),
                "bootID": n.boot_id,
                "kernelVersion": "6.8.0-1015-gpuops-sim",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.20",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def _register(self, n: _Node, existing: dict[str, Any] | None) -> None:
        m = n.machine
        assert m is not None
        acc = self._acc(n.name)
        labels = self._labels(m)
        status = self._node_status(n, existing)
        cidr = self._pod_cidr(n)
        annotations = {"node.alpha.kubernetes.io/ttl": "0",
                       "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
        if existing is None:
            spec: dict[str, Any] = {"podCIDR": cidr, "podCIDRs": [cidr]}
            if m.provider_id:
                spec["providerID"] = m.provider_id
            if m.taints:
                spec["taints"] = [dict(t) for t in m.taints]
            obj = {"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": n.name, "labels": labels, "annotations": annotations},
                   "spec": spec, "status": status}
            try:
                await self._write(acc.create(NODES, "", obj))
                if self.options.events:
                    await self._node_event(n, "Normal", "Starting", "Starting kubelet.")
                    await self._node_event(n, "Normal", "NodeReady", f"Node {n.name} status is now: NodeReady")
                return
            except StatusError as e:
                if e.code != 409:
                    raise
                existing = acc.get(NODES, "", n.name)
                if existing is None:
                    raise
                status = self._node_status(n, existing)
        # The Node survived (reboot, kubelet restart): reconcile labels, keep taints others manage.
        old_meta = existing["metadata"]
        patch: dict[str, Any] = {}
        want_labels = {k: v for k, v in labels.items() if (old_meta.get("labels") or {}).get(k) != v}
        if want_labels:
            patch.setdefault("metadata", {})["labels"] = want_labels
        spec_patch: dict[str, Any] = {}
        if m.provider_id and not (existing.get("spec") or {}).get("providerID"):
            spec_patch["providerID"] = m.provider_id
        if not (existing.get("spec") or {}).get("podCIDR"):
            spec_patch.update(podCIDR=cidr, podCIDRs=[cidr])
        if spec_patch:
            patch["spec"] = spec_patch
        if patch:
            await self._write(acc.patch(NODES, "", n.name, patch))
        await self._write(acc.patch(NODES, "", n.name, {"status": status}, subresource="status"))
        if self.options.events:
            await self._node_event(n, "Normal", "Starting", "Starting kubelet.")
            if (existing.get("status") or {}).get("nodeInfo", {}).get("bootID") not in (None, "", n.boot_id):
                await self._node_event(n, "Warning", "Rebooted",
                                       f"Node {n.name} has been rebooted, boot id: {n.boot_id}")
            await self._node_event(n, "Normal", "NodeReady", f"Node {n.name} status is now: NodeReady")

    async def _node_event(self, n: _Node, type_: str, reason: str, message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name, "uid": n.name}}
        await self._write(self._acc(n.name).event(involved, "Node", type_, reason, message, host=n.name))

    async def _post_status(self, n: _Node) -> None:
        acc = self._acc(n.name)
        existing = acc.get(NODES, "", n.name)
        n.next_status = self.clock() + self.options.node_status_seconds
        self.at(("status", n.name), n.next_status)
        if existing is None:
            log.warning("node object is gone; this kubelet does not re-register until it restarts", node=n.name)
            return
        await self._write(acc.patch(NODES, "", n.name, {"status": self._node_status(n, existing)},
                                    subresource="status"))

    async def _renew_lease(self, n: _Node) -> None:
        acc = self._acc(n.name)
        node = acc.get(NODES, "", n.name)
        if node is None:
            return
        renew = micro_time(self.reader.now())
        lease = acc.get(LEASES, NODE_LEASE_NAMESPACE, n.name)
        if lease is None:
            obj = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": n.name, "namespace": NODE_LEASE_NAMESPACE,
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": n.name,
                                                  "uid": node["metadata"]["uid"]}]},
                "spec": {"holderIdentity": n.name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                         "renewTime": renew},
            }
            try:
                await self._write(acc.create(LEASES, NODE_LEASE_NAMESPACE, obj))
                return
            except StatusError as e:
                if e.code != 409:
                    raise
        await self._write(acc.patch(LEASES, NODE_LEASE_NAMESPACE, n.name,
                                    {"spec": {"holderIdentity": n.name, "renewTime": renew,
                                              "leaseDurationSeconds": LEASE_DURATION_SECONDS}}))

    async def _write(self, coro: Any) -> Any:
        t = time.perf_counter()
        try:
            return await coro
        finally:
            self.write_seconds += time.perf_counter() - t
            self.writes += 1

    # ------------------------------------------------------------------------------------ pods

    def _forget(self, p: _Pod) -> None:
        if self._pods.get(p.key) is p:
            del self._pods[p.key]
        n = self._nodes.get(p.node)
        if n is not None:
            n.devices.pop(p.key, None)
        if n is not None and p.claimed and p.boot == n.boot:
            for r, v in p.req.items():
                n.used[r] = n.used.get(r, Fraction(0)) - v
            n.pods_used -= 1
            if p.ip_host:
                n.ips.discard(p.ip_host)
        if p.process and self.runtime is not None:
            self.runtime.forget(p.key, p.ip)
            p.process = False
        p.req = {}
        p.ip_host = 0
        p.claimed = False
        p.due = None

    async def _sync_pod(self, key: Key) -> None:
        s = self.reader.store.get(PODS, *key)
        p = self._pods.get(key)
        if s is None:
            if p is not None:
                self._forget(p)
            return
        pod = s.obj
        meta, spec = pod["metadata"], pod.get("spec") or {}
        status = pod.get("status") or {}
        node = spec.get("nodeName")
        if p is not None and (p.uid != meta.get("uid") or p.node != node):
            self._forget(p)
            p = None
        if not node:
            return
        n = self._nodes.get(node)
        if n is None or not self._alive(n):
            return  # no kubelet runs there: the pod stays as the API last saw it
        phase = status.get("phase")
        if phase in TERMINAL:
            if p is not None:
                self._forget(p)  # made terminal by someone else (PodGC): stop tracking it
            return
        if meta.get("deletionTimestamp"):
            await self._terminate(n, pod, p)
            return
        if p is not None:
            return
        running_before = phase == "Running" or any(
            "running" in (c.get("state") or {}) for c in status.get("containerStatuses") or []
        )
        if running_before and n.adopt:
            self._adopt(n, pod)
        elif running_before:
            await self._rebooted(n, pod)
        else:
            await self._admit(n, pod)

    def _new_pod(self, n: _Node, pod: dict[str, Any], now: float) -> _Pod:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        key = (meta.get("namespace", ""), meta["name"])
        p = _Pod(key=key, uid=meta.get("uid", ""), node=n.name, boot=n.boot, seen=now)
        p.runtime = _float_annotation(meta, RUNTIME_ANNOTATION)
        p.exit_code = _int_annotation(meta, EXIT_CODE_ANNOTATION, 0)
        ads = spec.get("activeDeadlineSeconds")
        if isinstance(ads, int | float) and ads > 0:
            p.deadline = now + float(ads)
        return p

    def _claim(self, n: _Node, p: _Pod, spec: dict[str, Any], req: dict[str, Fraction]) -> None:
        for r, v in req.items():
            n.used[r] = n.used.get(r, Fraction(0)) + v
        n.pods_used += 1
        p.req = req
        p.claimed = True
        p.needs_gpu = req.get(gpus.GPU_RESOURCE, Fraction(0)) > 0 and bool(n.machine and n.machine.gpus > 0)
        if spec.get("hostNetwork"):
            p.ip = n.host_ip
        else:
            p.ip, p.ip_host = self._alloc_ip(n)
        self._pods[p.key] = p

    def _allocatable(self, n: _Node) -> dict[str, Fraction]:
        s = self.reader.store.get(NODES, "", n.name)
        if s is None:
            return {}
        rv = s.obj["metadata"].get("resourceVersion", "")
        if rv != n.alloc_rv:
            alloc: dict[str, Fraction] = {}
            for r, v in ((s.obj.get("status") or {}).get("allocatable") or {}).items():
                try:
                    alloc[r] = parse_quantity(v)
                except Exception:  # an agent wrote something odd: that resource is unknown
                    continue
            n.alloc, n.alloc_rv = alloc, rv
        return n.alloc

    def _admission_error(self, n: _Node, req: dict[str, Fraction]) -> tuple[str, str] | None:
        """Why the kubelet would reject the pod (reason, message), as its predicate admit handler says it."""
        m = n.machine
        if req.get(gpus.GPU_RESOURCE, Fraction(0)) > 0 and m is not None and m.gpus > 0 and not n.plugin_ready:
            want = _show_amount(gpus.GPU_RESOURCE, req[gpus.GPU_RESOURCE])
            return ("UnexpectedAdmissionError",
                    f"Allocate failed due to requested number of devices unavailable for {gpus.GPU_RESOURCE}. "
                    f"Requested: {want}, Available: 0, which is unexpected")
        alloc = self._allocatable(n)
        if not alloc:
            return None
        pods_cap = alloc.get("pods")
        if pods_cap is not None and n.pods_used + 1 > pods_cap:
            return ("OutOfpods", f"Pod was rejected: Node didn't have enough resource: pods, requested: 1, "
                                 f"used: {n.pods_used}, capacity: {int(pods_cap)}")
        for r, v in req.items():
            cap = alloc.get(r)
            if cap is None:
                continue  # not advertised by the node: dropped before the fit check, as upstream does
            used = n.used.get(r, Fraction(0))
            if used + v > cap:
                return (f"OutOf{r}", f"Pod was rejected: Node didn't have enough resource: {r}, requested: "
                                     f"{_show_amount(r, v)}, used: {_show_amount(r, used)}, "
                                     f"capacity: {_show_amount(r, cap)}")
        return None

    async def _admit(self, n: _Node, pod: dict[str, Any]) -> None:
        now = self.clock()
        spec = pod.get("spec") or {}
        p = self._new_pod(n, pod, now)
        try:
            req = pod_resource_requests(spec)
        except Exception:  # the apiserver validated the quantities already; never block on our parser
            req = {}
        if self.options.admission:
            why = self._admission_error(n, req)
            if why is not None:
                await self._reject(n, pod, *why)
                return
        why = await self._allocate_devices(n, p.key, req)
        if why is not None:
            await self._reject(n, pod, *why)
            return
        self._claim(n, p, spec, req)
        self._schedule(p, now + self.options.start_latency_seconds)

    async def _reject(self, n: _Node, pod: dict[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]
        status = {"phase": "Failed", "reason": reason, "message": message,
                  "startTime": self._stamp(self.clock())}
        if await self._patch_status(n, (meta.get("namespace", ""), meta["name"]), status):
            self.rejected += 1
            self.transitions += 1
            if self.options.events:
                await self._pod_event(n, pod, "Warning", reason, message)

    def _adopt(self, n: _Node, pod: dict[str, Any]) -> None:
        """This process restarted while the machine kept running: the containers are still there."""
        status = pod.get("status") or {}
        now = self.clock()
        p = self._new_pod(n, pod, now)
        started = now
        for c in status.get("containerStatuses") or []:
            at = (c.get("state") or {}).get("running", {}).get("startedAt")
            if at:
                try:
                    wall = datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=self._wall0.tzinfo)
                    started = self._mono0 + (wall - self._wall0).total_seconds()
                except ValueError:
                    pass
            p.restarts = max(p.restarts, int(c.get("restartCount") or 0))
        try:
            req = pod_resource_requests(pod.get("spec") or {})
        except Exception:
            req = {}
        self._claim(n, p, pod.get("spec") or {}, req)
        if status.get("podIP"):
            if p.ip_host:
                n.ips.discard(p.ip_host)
            p.ip = str(status["podIP"])
            try:
                host = int(ipaddress.IPv4Address(p.ip)) - (n.block << 8)
                p.ip_host = host if 0 < host < 255 else 0
                if p.ip_host:
                    n.ips.add(p.ip_host)
            except ValueError:
                p.ip_host = 0
        p.state, p.phase, p.started = "running", "Running", started
        p.finish = started + p.runtime if p.runtime is not None else None
        self._schedule(p, p.finish)

    async def _rebooted(self, n: _Node, pod: dict[str, Any]) -> None:
        """The machine rebooted under a Running pod: its containers are gone, as containerd forgot them."""
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        now = self.clock()
        p = self._new_pod(n, pod, now)
        p.restarts = max((int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or []), default=0)
        gone = {"exitCode": 137, "reason": "ContainerStatusUnknown", "message": _GONE}
        if spec.get("restartPolicy", "Always") == "Never":
            await self._write_terminal(n, pod, p, "Failed", gone)
            return
        try:
            req = pod_resource_requests(spec)
        except Exception:
            req = {}
        self._claim(n, p, spec, req)
        p.phase = "Running"
        p.restarts += 1
        self.restarts += 1
        p.last = {"terminated": gone}
        st = self._base_status(n, p, "Running", pod=pod, waiting=("ContainerCreating", ""))
        await self._patch_status(n, p.key, st)
        if p.needs_gpu and not n.plugin_ready:
            p.due = None  # started when the device plugin is back (see the "plugin" timer)
        else:
            self._schedule(p, now + self.options.start_latency_seconds)

    # ------------------------------------------------------------------------------------ pod status

    def _container_status(
        self, n: _Node, p: _Pod, c: dict[str, Any], state: dict[str, Any], *, ready: bool, started: bool,
        restarts: int, last: dict[str, Any] | None,
    ) -> dict[str, Any]:
        image, image_id = self._image(str(c.get("image", "")))
        out: dict[str, Any] = {"name": c.get("name", ""), "state": state, "lastState": last or {},
                               "ready": ready, "restartCount": restarts, "image": image, "imageID": image_id,
                               "started": started}
        if "waiting" not in state or last:
            seed = f"{p.uid}/{c.get('name')}/{restarts}/{n.boot_id}"
            out["containerID"] = "containerd://" + hashlib.sha256(seed.encode()).hexdigest()
        return out

    def _conditions(
        self, pod: dict[str, Any], want: list[tuple[str, str, str]], at: str
    ) -> list[dict[str, Any]]:
        old = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
        out: list[dict[str, Any]] = []
        for type_, status, reason in want:
            prev = old.pop(type_, None)
            since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
            c: dict[str, Any] = {"type": type_, "status": status, "lastProbeTime": None,
                                 "lastTransitionTime": since or at}
            if reason:
                c["reason"] = reason
            out.append(c)
        sched = old.pop("PodScheduled", None)
        out.append(sched or {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                             "lastTransitionTime": at})
        out.extend(old.values())  # DisruptionTarget and other conditions controllers own
        return out

    def _base_status(
        self, n: _Node, p: _Pod, phase: str, *, pod: dict[str, Any], waiting: tuple[str, str] | None = None,
        running_since: float | None = None, terminated: dict[str, Any] | None = None, ready: bool = True,
    ) -> dict[str, Any]:
        """A full status: exactly one of waiting / running_since / terminated describes the containers."""
        spec = pod.get("spec") or {}
        at = self._containers_changed_at(running_since, terminated)
        state, ready, started = self._container_state(waiting, running_since, terminated, ready)
        containers = [self._container_status(n, p, c, state, ready=ready, started=started, restarts=p.restarts,
                                             last=p.last)
                      for c in sorted(spec.get("containers") or [], key=lambda c: str(c.get("name", "")))]
        inits = self._init_statuses(n, p, spec, waiting, running_since, terminated, at)
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": self._conditions(pod, _wanted_conditions(phase, ready), at),
            "hostIP": n.host_ip,
            "hostIPs": [{"ip": n.host_ip}],
            "startTime": self._stamp(p.seen),
            "containerStatuses": containers,
        }
        if p.ip:
            status["podIP"] = p.ip
            status["podIPs"] = [{"ip": p.ip}]
        if inits:
            status["initContainerStatuses"] = inits
        if not ready and phase not in TERMINAL:
            unready = " ".join(str(c.get("name", "")) for c in containers)
            for c in status["conditions"]:
                if c["type"] in ("Ready", "ContainersReady") and c["status"] == "False":
                    c["message"] = f"containers with unready status: [{unready}]"
        return status

    def _containers_changed_at(self, running_since: float | None, terminated: dict[str, Any] | None) -> str:
        """Conditions change when the containers did (start or exit), not when this write happens to run."""
        if running_since is not None:
            return self._stamp(running_since)
        if terminated is not None and terminated.get("finishedAt"):
            return str(terminated["finishedAt"])
        return self._stamp(self.clock())

    def _container_state(self, waiting: tuple[str, str] | None, running_since: float | None,
                         terminated: dict[str, Any] | None, ready: bool) -> tuple[dict[str, Any], bool, bool]:
        """(the app containers' state, ready, started)."""
        if waiting is not None:
            state: dict[str, Any] = {"waiting": {"reason": waiting[0]}}
            if waiting[1]:
                state["waiting"]["message"] = waiting[1]
            return state, False, False
        if running_since is not None:
            return {"running": {"startedAt": self._stamp(running_since)}}, ready, True
        assert terminated is not None
        return {"terminated": terminated}, False, False

    def _init_statuses(self, n: _Node, p: _Pod, spec: dict[str, Any], waiting: tuple[str, str] | None,
                       running_since: float | None, terminated: dict[str, Any] | None,
                       at: str) -> list[dict[str, Any]]:
        """Init containers completed before the app ones; sidecars (restartPolicy Always) run alongside them."""
        init_at = self._stamp(running_since if running_since is not None else p.seen)
        inits = []
        for c in spec.get("initContainers") or []:
            if c.get("restartPolicy") != "Always":
                done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": init_at,
                                       "finishedAt": init_at}}
                inits.append(self._container_status(n, p, c, done, ready=True, started=False, restarts=0,
                                                    last=None))
                continue
            if terminated is not None:
                side: dict[str, Any] = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": init_at,
                                                       "finishedAt": terminated.get("finishedAt", at)}}
            elif waiting is not None:
                side = {"waiting": {"reason": "PodInitializing"}}
            else:
                side = {"running": {"startedAt": init_at}}
            inits.append(self._container_status(n, p, c, side, ready="running" in side, started="running" in side,
                                                restarts=0, last=None))
        return inits

    async def _patch_status(self, n: _Node, key: Key, status: dict[str, Any]) -> bool:
        if not self._alive(n):
            return False
        try:
            await self._write(self._acc(n.name).patch(PODS, key[0], key[1], {"status": status},
                                                      subresource="status"))
        except StatusError as e:
            if e.code == 404:
                p = self._pods.get(key)
                if p is not None:
                    self._forget(p)
                return False
            raise
        return True

    async def _pod_event(self, n: _Node, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await self._write(self._acc(n.name).event(pod, "Pod", type_, reason, message, host=n.name))

    # ------------------------------------------------------------------------------------ pod timers

    async def _pod_due(self, p: _Pod, now: float) -> None:
        n = self._nodes.get(p.node)
        if n is None or p.boot != n.boot or not self._alive(n):
            self._forget(p)
            return
        s = self.reader.store.get(PODS, *p.key)
        if s is None or s.obj["metadata"].get("uid") != p.uid:
            self._forget(p)
            return
        pod = s.obj
        due = p.due
        assert due is not None
        p.due = None
        if p.state == "terminating":
            await self._kill(n, pod, p, due)
        elif p.deadline is not None and due >= p.deadline:
            await self._deadline(n, pod, p, due)
        elif p.state in ("waiting", "backoff"):
            await self._start_containers(n, pod, p, due)
        elif p.state == "running":
            await self._exited(n, pod, p, due)

    async def _start_containers(self, n: _Node, pod: dict[str, Any], p: _Pod, at: float) -> None:
        """Start the containers at monotonic time `at` (again, after a crash loop back-off)."""
        if p.needs_gpu and not n.plugin_ready:
            return  # rebooted GPU pod: the plugin timer reschedules it
        if p.state == "backoff":
            p.restarts += 1
            self.restarts += 1
        if self.runtime is not None and runs_as_process(pod) and not await self._start_process(n, pod, p):
            return
        p.started = at
        p.finish = at + p.runtime if p.runtime is not None and not p.process else None
        p.state = "running"
        status = self._base_status(n, p, "Running", pod=pod, running_since=at, ready=p.ready)
        if not await self._patch_status(n, p.key, status):
            return
        if p.phase != "Running":
            p.phase = "Running"
            self.transitions += 1
            self.started += 1
        self._schedule(p, p.finish)
        if self.options.events:
            for c in (pod.get("spec") or {}).get("containers") or []:
                image = str(c.get("image", ""))
                cname = str(c.get("name", ""))
                await self._pod_event(n, pod, "Normal", "Pulled",
                                      f'Container image "{image}" already present on machine')
                await self._pod_event(n, pod, "Normal", "Created", f"Created container: {cname}")
                await self._pod_event(n, pod, "Normal", "Started", f"Started container {cname}")

    async def _start_process(self, n: _Node, pod: dict[str, Any], p: _Pod) -> bool:
        """Start the pod's processes (ProcessRuntime); False, with the pod waiting in CreateContainerConfigError
        (or RunContainerError when the process could not start) and a retry in 10 s, when it cannot run."""
        assert self.runtime is not None
        try:
            p.ready = await self.runtime.start(
                pod, node=n.name, pod_ip=p.ip,
                on_exit=lambda code: self._process_exited(p, code),
                on_ready=lambda ready: self._process_ready(p, ready))
        except (ContainerConfigError, OSError) as e:
            p.state = "waiting"
            reason = "CreateContainerConfigError" if isinstance(e, ContainerConfigError) else "RunContainerError"
            status = self._base_status(n, p, "Pending" if p.phase == "Pending" else "Running", pod=pod,
                                       waiting=(reason, str(e)))
            if await self._patch_status(n, p.key, status):
                await self._pod_event(n, pod, "Warning", "Failed", f"Error: {e}")
                self._schedule(p, self.clock() + 10.0)
            return False
        p.process = True
        return True

    def _process_exited(self, p: _Pod, code: int) -> None:
        if self._pods.get(p.key) is not p:
            return
        if p.state == "running":
            p.exit_code = code
        elif p.state == "terminating":
            p.kill_code = code
        else:
            return
        self._schedule(p, self.clock())
        self.wake()

    def _process_ready(self, p: _Pod, ready: bool) -> None:
        if self._pods.get(p.key) is p and p.state == "running":
            p.ready = ready
            self.at(("ready", *p.key), self.clock())

    async def _post_readiness(self, key: Key) -> None:
        """A readiness probe changed its verdict: the pod's Ready condition follows."""
        p = self._pods.get(key)
        n = self._nodes.get(p.node) if p is not None else None
        s = self.reader.store.get(PODS, *key)
        if p is None or n is None or s is None or p.state != "running" or not p.process:
            return
        await self._patch_status(n, key, self._base_status(n, p, "Running", pod=s.obj, running_since=p.started,
                                                           ready=p.ready))

    def _terminated(self, p: _Pod, code: int, at: float, reason: str | None = None) -> dict[str, Any]:
        return {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"),
                "startedAt": self._stamp(p.started), "finishedAt": self._stamp(at)}

    async def _exited(self, n: _Node, pod: dict[str, Any], p: _Pod, at: float) -> None:
        """The containers exited on their own at `at`; restart them where the restart policy says so."""
        code = p.exit_code
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        term = self._terminated(p, code, at)
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            await self._write_terminal(n, pod, p, "Succeeded" if code == 0 else "Failed", term)
            return
        # CrashLoopBackOff: the first restart is immediate, then 10 s doubling up to 5 min; a container that
        # ran for twice the cap starts the sequence over.
        opts = self.options
        if at - p.started >= 2 * opts.restart_backoff_max_seconds:
            p.backoff = 0.0
        delay = p.backoff
        p.backoff = opts.restart_backoff_seconds if delay <= 0 else min(2 * delay, opts.restart_backoff_max_seconds)
        p.last = {"terminated": term}
        p.state = "backoff"
        if delay <= 0:
            await self._start_containers(n, pod, p, at)
            return
        cname = str(((pod.get("spec") or {}).get("containers") or [{}])[0].get("name", ""))
        msg = f"back-off {int(delay)}s restarting failed container={cname} pod={p.key[1]}_{p.key[0]}({p.uid})"
        status = self._base_status(n, p, "Running", pod=pod, waiting=("CrashLoopBackOff", msg))
        if await self._patch_status(n, p.key, status):
            self._schedule(p, at + delay)
            if self.options.events:
                await self._pod_event(n, pod, "Warning", "BackOff", f"Back-off restarting failed container "
                                      f"{cname} in pod {p.key[1]}_{p.key[0]}({p.uid})")

    async def _deadline(self, n: _Node, pod: dict[str, Any], p: _Pod, at: float) -> None:
        if p.state == "running":
            term = self._terminated(p, 137, at)
        else:
            term = {"exitCode": 137, "reason": "ContainerStatusUnknown", "message": _GONE}
        await self._write_terminal(n, pod, p, "Failed", term, reason="DeadlineExceeded",
                                   message="Pod was active on the node longer than the specified deadline")

    async def _write_terminal(
        self, n: _Node, pod: dict[str, Any], p: _Pod, phase: str, term: dict[str, Any], *,
        reason: str = "", message: str = "",
    ) -> bool:
        p.ip = p.ip or str((pod.get("status") or {}).get("podIP") or "")
        status = self._base_status(n, p, phase, pod=pod, terminated=term)
        if reason:
            status["reason"] = reason
            status["message"] = message
        ok = await self._patch_status(n, p.key, status)
        if ok:
            self.transitions += 1
            self.finished += 1
        self._forget(p)
        return ok

    # ------------------------------------------------------------------------------------ graceful deletion

    async def _terminate(self, n: _Node, pod: dict[str, Any], p: _Pod | None) -> None:
        """deletionTimestamp is set: stop the containers within the grace period, then confirm (grace 0)."""
        meta = pod["metadata"]
        now = self.clock()
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)
        if p is not None and p.state == "terminating":
            if p.due is not None and now + grace < p.due:  # a shorter grace period was asked for: SIGKILL then
                p.kill_code = 137
                self._schedule(p, now + grace)
            return
        if p is not None and p.state == "running" and p.process and self.runtime is not None:
            self.runtime.terminate(p.key)  # SIGTERM now; SIGKILL when the grace period ends (or it exits first)
            p.state, p.deadline, p.kill_code = "terminating", None, 137
            self._schedule(p, now + grace)
            if self.options.events:
                for c in (pod.get("spec") or {}).get("containers") or []:
                    await self._pod_event(n, pod, "Normal", "Killing", f"Stopping container {c.get('name')}")
            return
        if p is not None and p.state == "running":
            took = _float_annotation(meta, TERMINATION_ANNOTATION) or 0.0
            kill = now + min(took, grace)
            p.kill_code = 143 if took <= grace else 137
            if p.finish is not None and p.finish <= kill:  # it exits on its own before the signal lands
                kill, p.kill_code = p.finish, p.exit_code
            p.state = "terminating"
            p.deadline = None
            self._schedule(p, kill)
            if self.options.events:
                for c in (pod.get("spec") or {}).get("containers") or []:
                    await self._pod_event(n, pod, "Normal", "Killing", f"Stopping container {c.get('name')}")
            return
        # Nothing runs (not started yet, backing off, or the machine rebooted under it): finish at once.
        if p is None:
            p = self._new_pod(n, pod, now)
            p.restarts = max((int(c.get("restartCount") or 0)
                              for c in (pod.get("status") or {}).get("containerStatuses") or []), default=0)
            ran = (pod.get("status") or {}).get("phase") == "Running"
            term = {"exitCode": 137, "reason": "ContainerStatusUnknown", "message": _GONE_DELETED if ran else _GONE}
        else:
            term = {"exitCode": 137, "reason": "ContainerStatusUnknown", "message": _GONE}
        await self._write_terminal(n, pod, p, "Failed", term)
        await self._confirm_delete(n, p)

    async def _kill(self, n: _Node, pod: dict[str, Any], p: _Pod, at: float) -> None:
        if p.process and self.runtime is not None:
            await self.runtime.kill(p.key)
        code = p.kill_code
        term = self._terminated(p, code, at)
        await self._write_terminal(n, pod, p, "Succeeded" if code == 0 else "Failed", term)
        await self._confirm_delete(n, p)

    async def _confirm_delete(self, n: _Node, p: _Pod) -> None:
        if not self._alive(n):
            return
        try:
            await self._write(self._acc(n.name).delete(PODS, p.key[0], p.key[1], grace_seconds=0, uid=p.uid))
        except StatusError as e:
            if e.code != 409:  # 409: the uid changed, a new pod of the same name is not ours to delete
                raise
            return
        self.deleted += 1


__all__ = [
    "EXIT_CODE_ANNOTATION",
    "RUNTIME_ANNOTATION",
    "TERMINATION_ANNOTATION",
    "KubeletOptions",
    "Kubelets",
    "pod_resource_requests",
]


def _wanted_conditions(phase: str, ready: bool) -> list[tuple[str, str, str]]:
    """(type, status, reason) of the pod conditions the kubelet owns, for a phase and readiness."""
    if phase in TERMINAL:
        why = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        return [("PodReadyToStartContainers", "False", ""),
                ("Initialized", "True", "PodCompleted" if phase == "Succeeded" else ""),
                ("Ready", "False", why), ("ContainersReady", "False", why)]
    if ready:
        return [("PodReadyToStartContainers", "True", ""), ("Initialized", "True", ""),
                ("Ready", "True", ""), ("ContainersReady", "True", "")]
    return [("PodReadyToStartContainers", "True", ""), ("Initialized", "True", ""),
            ("Ready", "False", "ContainersNotReady"), ("ContainersReady", "False", "ContainersNotReady")]

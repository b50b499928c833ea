"""kube-controller-manager's node lifecycle, taint eviction and PodGC, and the cloud node lifecycle controller.

What a cluster does about a machine that went away, so the emulated cluster does it too:
- node lifecycle: a node whose kubelet stopped heartbeating (Lease renewTime and Ready lastHeartbeatTime) for
  longer than the grace period gets its kubelet conditions set to Unknown and the `unreachable` taints
  (`not-ready` when the kubelet itself reports Ready=False); NoExecute tainting is rate limited per zone and
  stops when every zone is fully disrupted, as upstream does; taints go when the node is Ready again;
- taint eviction: pods that do not tolerate a NoExecute taint (or only for `tolerationSeconds`) are marked
  with DisruptionTarget and deleted, gracefully, so on a dead node they stay Terminating;
- PodGC: pods bound to a Node that has been gone for the quarantine period are failed and force-deleted, and
  so are terminating pods on a NotReady node with the `out-of-service` taint;
- cloud node lifecycle: a NotReady Node whose machine no longer exists is deleted.
Heartbeats are judged by when this controller *observed* them change (upstream's probe timestamp), so clock
skew between writers cannot make a node look dead or alive.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.objects import rfc3339
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent
from .access import LEASES, NODE_LEASE_NAMESPACE, NODES, PODS, ClusterAccess
from .loop import Loop
from .machines import Fleet, FleetEvent, Machine

log = structlog.get_logger("gpuops_sim.nodelifecycle")

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
SHUTDOWN = "node.cloudprovider.kubernetes.io/shutdown"
OURS = (NOT_READY, UNREACHABLE, SHUTDOWN)
KUBELET_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
TERMINAL = ("Succeeded", "Failed")

Key = tuple[str, str]


@dataclass
class NodeLifecycleOptions:
    node_monitor_grace_seconds: float = 40.0
    monitor_period_seconds: float = 5.0
    pod_gc_orphan_seconds: float = 40.0  # quarantine before deleting pods whose Node is gone
    eviction_rate: float = 0.1  # nodes per second and zone that get NoExecute taints (--node-eviction-rate)
    secondary_eviction_rate: float = 0.01  # in a partially disrupted large zone
    unhealthy_zone_threshold: float = 0.55
    large_cluster_size_threshold: int = 50
    events: bool = True


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def _ready_status(node: dict[str, Any]) -> str | None:
    c = _condition(node, "Ready")
    return str(c.get("status")) if c is not None else None


def tolerates(tol: dict[str, Any], taint: dict[str, Any]) -> bool:
    """One toleration against one taint, as `ToleratesTaint` in k8s.io/api/core/v1 decides."""
    effect = tol.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = tol.get("key") or ""
    if key and key != taint.get("key"):
        return False
    op = tol.get("operator") or "Equal"
    if op == "Exists":
        return True
    return op == "Equal" and (tol.get("value") or "") == (taint.get("value") or "")


def _rv(obj: dict[str, Any]) -> dict[str, Any]:
    """A resourceVersion precondition for a merge patch: 409 if the object changed since we read it."""
    return {"resourceVersion": obj["metadata"]["resourceVersion"]}


def _zone(node: dict[str, Any]) -> str:
    labels = node["metadata"].get("labels") or {}
    return f"{labels.get(REGION_LABEL, '')}:\x00:{labels.get(ZONE_LABEL, '')}"


class NodeLifecycle(Loop):
    """The node, taint-eviction, pod-GC and cloud-node-lifecycle controllers; each writes as its own account."""

    name = "node-lifecycle"

    def __init__(
        self, server: APIServer, fleet: Fleet | None = None, options: NodeLifecycleOptions | None = None
    ) -> None:
        super().__init__()
        self.server = server
        self.fleet = fleet
        self.options = options or NodeLifecycleOptions()

        def account(sa: str) -> ClusterAccess:
            return ClusterAccess(server, f"system:serviceaccount:kube-system:{sa}", component=sa)

        self.node_access = account("node-controller")
        self.taint_access = account("taint-eviction-controller")
        self.gc_access = account("pod-garbage-collector")
        self.cloud_access = account("cloud-node-lifecycle-controller")
        self.store = server.store
        self._mono0 = self.clock()
        self._wall0: datetime = self.node_access.now()
        self._probe: dict[str, float] = {}  # node -> when we last saw its heartbeat change
        self._noexec: dict[str, list[dict[str, Any]]] = {}  # node -> its NoExecute taints
        self._pods_on: dict[str, set[Key]] = {}
        self._pod_node: dict[Key, str] = {}
        self._absent: dict[str, float] = {}  # node names pods are bound to, gone since (monotonic)
        self._evict_at: dict[Key, float] = {}
        self._added: dict[tuple[str, str], tuple[str, float]] = {}  # (node, taint key) -> (timeAdded, exact)
        self._buckets: dict[str, tuple[float, float]] = {}  # zone -> (tokens, at)
        self._zone_rates: dict[str, float] = {}
        self._master_disruption = False
        self._removed: set[str] = set()  # machines the fleet reported gone
        self._dirty_nodes: set[str] = set()
        self._dirty_pods: set[Key] = set()
        self._slice = time.perf_counter()
        self.marked_unknown = 0
        self.evicted = 0
        self.orphans_deleted = 0
        self.nodes_deleted = 0
        now = self.clock()
        for s in self.store.iter(NODES):
            self._probe[s.obj["metadata"]["name"]] = now
            self._track_node(s.obj)
        for s in self.store.iter(PODS):
            meta = s.obj["metadata"]
            self._track_pod((meta.get("namespace", ""), meta["name"]), s.obj)
        self.node_access.listen(self._on_event)
        if fleet is not None:
            fleet.subscribe(self._on_machine)
        self.at("monitor", now + self.options.monitor_period_seconds)

    # ------------------------------------------------------------------------------------ intake (synchronous)

    def _on_machine(self, m: Machine, ev: FleetEvent) -> None:
        if ev == "removed":
            self._removed.add(m.name)
        elif ev == "added":
            self._removed.discard(m.name)
        self._dirty_nodes.add(m.name)
        self.wake()

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr == PODS:
            self._on_pod(ev)
        elif ev.gr == NODES:
            self._on_node(ev)
        elif ev.gr == LEASES and ev.key[0] == NODE_LEASE_NAMESPACE and ev.type != "DELETED":
            renew = (ev.new.obj.get("spec") or {}).get("renewTime")
            old = (ev.prev.obj.get("spec") or {}).get("renewTime") if ev.prev is not None else None
            if renew != old:
                self._probe[ev.key[1]] = self.clock()

    def _track_node(self, obj: dict[str, Any]) -> bool:
        """Cache the node's NoExecute taints; True when they changed."""
        name = obj["metadata"]["name"]
        taints = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
        old = self._noexec.get(name)
        if taints:
            self._noexec[name] = taints
        else:
            self._noexec.pop(name, None)
        now = self.clock()
        for t in taints:  # when a taint without timeAdded was first seen counts as its start
            k = (name, str(t.get("key", "")))
            stamp = str(t.get("timeAdded") or "")
            if k not in self._added or self._added[k][0] != stamp:
                self._added[k] = (stamp, self._parse_mono(stamp) if stamp else now)
        return (old or []) != taints

    def _on_node(self, ev: WatchEvent) -> None:
        name = ev.key[1]
        if ev.type == "DELETED":
            self._noexec.pop(name, None)
            self._probe.pop(name, None)
            if self._pods_on.get(name):
                self._mark_absent(name)
            return
        obj = ev.new.obj
        self._absent.pop(name, None)
        prev = ev.prev.obj if ev.prev is not None else None
        ready, was = _condition(obj, "Ready"), (_condition(prev, "Ready") if prev is not None else None)
        if prev is None or (ready or {}).get("lastHeartbeatTime") != (was or {}).get("lastHeartbeatTime"):
            self._probe[name] = self.clock()
        changed = self._track_node(obj)
        if changed:  # NoExecute taints came or went: every pod there is judged again
            self._dirty_pods.update(self._pods_on.get(name, ()))
        if (
            prev is None
            or changed
            or (ready or {}).get("status") != (was or {}).get("status")
            or (obj.get("spec") or {}).get("taints") != (prev.get("spec") or {}).get("taints")
        ):
            self._dirty_nodes.add(name)
            self.wake()

    def _track_pod(self, key: Key, obj: dict[str, Any] | None) -> str | None:
        node = ((obj or {}).get("spec") or {}).get("nodeName") if obj is not None else None
        old = self._pod_node.get(key)
        if old != node:
            if old is not None:
                keys = self._pods_on.get(old)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._pods_on[old]
                del self._pod_node[key]
            if node:
                self._pod_node[key] = node
                self._pods_on.setdefault(node, set()).add(key)
        if node and node not in self._absent and self.store.get(NODES, "", node) is None:
            self._mark_absent(node)
        return str(node) if node else None

    def _mark_absent(self, node: str) -> None:
        if node not in self._absent:
            self._absent[node] = self.clock()
            self.at(("orphan", node), self._absent[node] + self.options.pod_gc_orphan_seconds)

    def _on_pod(self, ev: WatchEvent) -> None:
        key = ev.key
        if ev.type == "DELETED":
            self._track_pod(key, None)
            self._evict_at.pop(key, None)
            return
        obj = ev.new.obj
        prev = ev.prev.obj if ev.prev is not None else None
        if prev is not None:
            s, ps = obj.get("spec") or {}, prev.get("spec") or {}
            if (
                s.get("nodeName") == ps.get("nodeName")
                and s.get("tolerations") == ps.get("tolerations")
                and obj["metadata"].get("deletionTimestamp") == prev["metadata"].get("deletionTimestamp")
            ):
                return  # a status write: nothing here depends on it
        node = self._track_pod(key, obj)
        if node and (node in self._noexec or obj["metadata"].get("deletionTimestamp")):
            self._dirty_pods.add(key)
            self.wake()

    # ------------------------------------------------------------------------------------ helpers

    def _parse_mono(self, stamp: str) -> float:
        try:
            wall = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=self._wall0.tzinfo)
        except ValueError:
            return self.clock()
        return self._mono0 + (wall - self._wall0).total_seconds()

    def _now_stamp(self) -> str:
        return rfc3339(self.node_access.now())

    async def _breathe(self) -> None:
        if time.perf_counter() - self._slice > 0.02:
            await asyncio.sleep(0)
            self._slice = time.perf_counter()

    async def _guard(self, work: Any, what: str, key: Hashable) -> None:
        try:
            await work
        except StatusError as e:
            if e.code not in (404, 409):  # gone or changed under us: the next event or pass retries
                self.errors += 1
                log.warning("node lifecycle write failed", item=what, key=str(key), code=e.code, error=str(e))
        except Exception:
            self.errors += 1
            log.exception("node lifecycle work failed", item=what, key=str(key))

    # ------------------------------------------------------------------------------------ the loop

    async def step(self) -> None:
        self._slice = time.perf_counter()
        now = self.clock()
        due = self.due(now)
        for i, tkey in enumerate(due):
            try:
                await self._timer(tkey, now)
            except asyncio.CancelledError:  # stopped mid-step: keep what is left for the next start
                for rest in due[i:]:
                    self.at(rest, now)
                raise
        names, self._dirty_nodes = sorted(self._dirty_nodes), set()
        for i, name in enumerate(names):
            try:
                await self._guard(self._reconcile_node(name), "node", name)
                await self._breathe()
            except asyncio.CancelledError:
                self._dirty_nodes.update(names[i:])
                raise
        keys, self._dirty_pods = list(self._dirty_pods), set()
        for i, key in enumerate(keys):
            try:
                await self._guard(self._eval_pod(key), "pod", key)
                await self._breathe()
            except asyncio.CancelledError:
                self._dirty_pods.update(keys[i:])
                raise

    async def _timer(self, tkey: Hashable, now: float) -> None:
        if tkey == "monitor":
            self.at("monitor", now + self.options.monitor_period_seconds)
            await self._guard(self._monitor(), "monitor", "")
        elif isinstance(tkey, tuple) and tkey[0] == "evict":
            self._dirty_pods.add((tkey[1], tkey[2]))
        elif isinstance(tkey, tuple) and tkey[0] == "orphan":
            await self._guard(self._gc_orphans(tkey[1]), "orphans", tkey[1])
        elif isinstance(tkey, tuple) and tkey[0] == "taint":
            self._dirty_nodes.add(tkey[1])

    # ------------------------------------------------------------------------------------ node health

    async def _monitor(self) -> None:
        now = self.clock()
        grace = self.options.node_monitor_grace_seconds
        for s in list(self.store.iter(NODES)):
            name = s.obj["metadata"]["name"]
            probe = self._probe.setdefault(name, now)
            if now - probe > grace and _ready_status(s.obj) != "Unknown":
                await self._guard(self._mark_unknown(name), "unknown", name)
                await self._breathe()
        self._compute_zones()
        for s in list(self.store.iter(NODES)):
            if _ready_status(s.obj) == "True" and not any(
                t.get("key") in OURS for t in (s.obj.get("spec") or {}).get("taints") or []
            ):
                continue  # healthy and untainted: nothing to reconcile (events cover changes)
            await self._guard(self._reconcile_node(s.obj["metadata"]["name"]), "node", s.obj["metadata"]["name"])
            await self._breathe()

    async def _mark_unknown(self, name: str) -> None:
        """The kubelet is silent: its conditions become Unknown (heartbeat times stay as it last wrote)."""
        node = self.node_access.get(NODES, "", name)
        if node is None:
            return
        stamp = self._now_stamp()
        conds = []
        seen = set()
        was_ready = _ready_status(node) == "True"
        for c in (node.get("status") or {}).get("conditions") or []:
            c = dict(c)
            if c.get("type") in KUBELET_CONDITIONS:
                seen.add(c["type"])
                if c.get("status") != "Unknown":
                    c["lastTransitionTime"] = stamp
                c.update(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.")
            conds.append(c)
        for type_ in KUBELET_CONDITIONS:
            if type_ not in seen:
                conds.append({"type": type_, "status": "Unknown", "reason": "NodeStatusNeverUpdated",
                              "message": "Kubelet never posted node status.",
                              "lastHeartbeatTime": node["metadata"].get("creationTimestamp"),
                              "lastTransitionTime": stamp})
        await self.node_access.patch(NODES, "", name, {"metadata": _rv(node), "status": {"conditions": conds}},
                                     subresource="status")
        self.marked_unknown += 1
        log.info("node status unknown", node=name)
        if self.options.events:
            await self.node_access.event({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": name}},
                                         "Node", "Normal", "NodeNotReady", f"Node {name} status is now: NodeNotReady")
        if was_ready:
            await self._mark_pods_not_ready(name)

    async def _mark_pods_not_ready(self, name: str) -> None:
        stamp = self._now_stamp()
        for key in list(self._pods_on.get(name, ())):
            pod = self.node_access.get(PODS, *key)
            if pod is None or (pod.get("status") or {}).get("phase") in TERMINAL:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                continue  # the emulator finishes a pending graceful deletion on any update (upstream does not)
            conds = [dict(c) for c in (pod.get("status") or {}).get("conditions") or []]
            changed = False
            for c in conds:
                if c.get("type") == "Ready" and c.get("status") == "True":
                    c.update(status="False", lastTransitionTime=stamp)
                    changed = True
            if changed:
                await self._guard(self.node_access.patch(PODS, key[0], key[1], {"status": {"conditions": conds}},
                                                         subresource="status"), "pod-not-ready", key)
                await self._breathe()

    def _compute_zones(self) -> None:
        """Zone states as upstream: Normal, PartialDisruption (many NotReady) or FullDisruption (none Ready)."""
        counts: dict[str, list[int]] = {}
        for s in self.store.iter(NODES):
            c = counts.setdefault(_zone(s.obj), [0, 0])
            c[0 if _ready_status(s.obj) == "True" else 1] += 1
        o = self.options
        rates: dict[str, float] = {}
        full = 0
        for zone, (ready, not_ready) in counts.items():
            if ready == 0 and not_ready > 0:
                full += 1
                rates[zone] = o.eviction_rate
            elif not_ready > 2 and not_ready / (ready + not_ready) >= o.unhealthy_zone_threshold:
                rates[zone] = o.secondary_eviction_rate if ready + not_ready > o.large_cluster_size_threshold else 0.0
            else:
                rates[zone] = o.eviction_rate
        master = bool(counts) and full == len(counts)
        if master != self._master_disruption:
            log.warning("all nodes are not ready: no taint-based eviction until one is back" if master
                        else "a node is ready again: taint-based eviction resumes")
        self._master_disruption = master
        self._zone_rates = rates

    def _take_token(self, zone: str, node: str) -> bool:
        """The per-zone NoExecute tainting rate limiter (token bucket, burst 1)."""
        rate = self._zone_rates.get(zone, self.options.eviction_rate)
        if math.isinf(rate):
            return True
        if rate <= 0:
            return False  # re-examined on each monitor pass
        now = self.clock()
        tokens, at = self._buckets.get(zone, (1.0, now))
        tokens = min(1.0, tokens + (now - at) * rate)
        if tokens >= 1.0:
            self._buckets[zone] = (tokens - 1.0, now)
            return True
        self._buckets[zone] = (tokens, now)
        self.at(("taint", node), now + (1.0 - tokens) / rate)
        return False

    async def _reconcile_node(self, name: str) -> None:
        node = self.node_access.get(NODES, "", name)
        if node is None:
            return
        ready = _ready_status(node)
        want = {"False": NOT_READY, "Unknown": UNREACHABLE}.get(ready or "")
        taints: list[dict[str, Any]] = list((node.get("spec") or {}).get("taints") or [])
        had_noexec = any(t.get("key") in (NOT_READY, UNREACHABLE) and t.get("effect") == "NoExecute" for t in taints)
        new = [t for t in taints
               if t.get("key") not in (NOT_READY, UNREACHABLE)
               or (t.get("key") == want and not (t.get("effect") == "NoExecute" and self._master_disruption))]
        stamp = self._now_stamp()
        if want is not None:
            if not any(t.get("key") == want and t.get("effect") == "NoSchedule" for t in new):
                new.append({"key": want, "effect": "NoSchedule"})
            if not self._master_disruption and not any(
                t.get("key") == want and t.get("effect") == "NoExecute" for t in new
            ) and (had_noexec or self._take_token(_zone(node), name)):  # a swap is not rate limited
                new.append({"key": want, "effect": "NoExecute", "timeAdded": stamp})
                self._added[(name, want)] = (stamp, self.clock())
        machine = self.fleet.machines.get(name) if self.fleet is not None else None
        shut = ready != "True" and machine is not None and machine.state == "off"
        has_shut = any(t.get("key") == SHUTDOWN for t in new)
        if shut and not has_shut:
            new.append({"key": SHUTDOWN, "effect": "NoSchedule"})
        elif not shut and has_shut and ready == "True":
            new = [t for t in new if t.get("key") != SHUTDOWN]
        if new != taints:
            await self.node_access.patch(NODES, "", name, {"metadata": _rv(node), "spec": {"taints": new or None}})
            node = self.node_access.get(NODES, "", name) or node
        if ready != "True" and self.fleet is not None and name not in self.fleet.machines and (
            name in self._removed or (node.get("spec") or {}).get("providerID")
        ):
            await self._delete_node(name, node)
            return
        if ready != "True" and any(t.get("key") == OUT_OF_SERVICE for t in new):
            for key in list(self._pods_on.get(name, ())):
                pod = self.gc_access.get(PODS, *key)
                if pod is not None and pod["metadata"].get("deletionTimestamp"):
                    await self._guard(self._fail_and_force_delete(pod, None, ""), "out-of-service", key)

    async def _delete_node(self, name: str, node: dict[str, Any]) -> None:
        """The instance is gone (cloud node lifecycle): so goes its Node; its Lease follows by owner reference."""
        if self.options.events:
            await self.cloud_access.event({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": name}},
                                          "Node", "Normal", "DeletingNode",
                                          f"Deleting node {name} because it does not exist in the cloud provider")
        gone = await self.cloud_access.delete(NODES, "", name, uid=node["metadata"].get("uid"))
        if gone is not None:
            self.nodes_deleted += 1
            self._removed.discard(name)
            log.info("deleted node of a vanished machine", node=name)

    # ------------------------------------------------------------------------------------ taint eviction

    def _eviction_time(self, node: str, pod: dict[str, Any], taints: list[dict[str, Any]]) -> float | None:
        """When the pod must go (monotonic), or None when it tolerates every NoExecute taint forever."""
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        when = math.inf
        for t in taints:
            tol = next((x for x in tolerations if tolerates(x, t)), None)
            if tol is None:
                return self.clock()
            secs = tol.get("tolerationSeconds")
            if secs is None:
                continue
            start = self._added.get((node, str(t.get("key", ""))), ("", self.clock()))[1]
            when = min(when, start + max(0.0, float(secs)))
        return None if math.isinf(when) else when

    async def _eval_pod(self, key: Key) -> None:
        pod = self.taint_access.get(PODS, *key)
        if pod is None:
            self._evict_at.pop(key, None)
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        if pod["metadata"].get("deletionTimestamp"):
            self._evict_at.pop(key, None)
            n = self.gc_access.get(NODES, "", node)
            if n is not None and _ready_status(n) != "True" and any(
                t.get("key") == OUT_OF_SERVICE for t in (n.get("spec") or {}).get("taints") or []
            ):
                await self._fail_and_force_delete(pod, None, "")
            return
        taints = self._noexec.get(node)
        when = self._eviction_time(node, pod, taints) if taints else None
        if when is None:
            self._evict_at.pop(key, None)
            return
        if when <= self.clock():
            self._evict_at.pop(key, None)
            await self._evict(pod)
        elif self._evict_at.get(key) != when:
            self._evict_at[key] = when
            self.at(("evict", *key), when)

    def _with_condition(self, pod: dict[str, Any], reason: str, message: str) -> list[dict[str, Any]]:
        old = (pod.get("status") or {}).get("conditions") or []
        conds = [dict(c) for c in old if c.get("type") != "DisruptionTarget"]
        conds.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                      "lastTransitionTime": self._now_stamp(), "reason": reason, "message": message})
        return conds

    async def _evict(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        await self.taint_access.patch(
            PODS, ns, name,
            {"status": {"conditions": self._with_condition(pod, "DeletionByTaintManager",
                                                           "Taint manager: deleting due to NoExecute taint")}},
            subresource="status",
        )
        if self.options.events:
            await self.taint_access.event(pod, "Pod", "Normal", "TaintManagerEviction",
                                          f"Marking for deletion Pod {ns}/{name}")
        await self.taint_access.delete(PODS, ns, name, uid=meta.get("uid"))
        self.evicted += 1
        log.info("evicted pod from tainted node", pod=f"{ns}/{name}", node=(pod.get("spec") or {}).get("nodeName"))

    # ------------------------------------------------------------------------------------ pod GC

    async def _gc_orphans(self, node: str) -> None:
        since = self._absent.get(node)
        if since is None or self.store.get(NODES, "", node) is not None:
            self._absent.pop(node, None)
            return
        due = since + self.options.pod_gc_orphan_seconds
        if self.clock() < due:
            self.at(("orphan", node), due)
            return
        del self._absent[node]
        for key in list(self._pods_on.get(node, ())):
            pod = self.gc_access.get(PODS, *key)
            if pod is None or (pod.get("spec") or {}).get("nodeName") != node:
                continue
            await self._guard(self._fail_and_force_delete(pod, "DeletionByPodGC", "PodGC: node no longer exists"),
                              "orphan", key)
            self.orphans_deleted += 1
            await self._breathe()

    async def _fail_and_force_delete(self, pod: dict[str, Any], reason: str | None, message: str) -> None:
        """PodGC's markFailedAndDeletePodWithCondition: phase Failed (+ DisruptionTarget), then grace 0."""
        meta = pod["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        if (pod.get("status") or {}).get("phase") not in TERMINAL:
            status: dict[str, Any] = {"phase": "Failed"}
            if reason:
                status["conditions"] = self._with_condition(pod, reason, message)
            await self.gc_access.patch(PODS, ns, name, {"status": status}, subresource="status")
        await self.gc_access.delete(PODS, ns, name, grace_seconds=0, uid=meta.get("uid"))
        log.info("force-deleted pod", pod=f"{ns}/{name}", node=(pod.get("spec") or {}).get("nodeName"),
                 reason=reason or "out-of-service")


__all__ = ["NOT_READY", "OUT_OF_SERVICE", "SHUTDOWN", "UNREACHABLE", "NodeLifecycle", "NodeLifecycleOptions",
           "tolerates"]

"""The MIG allocator: choose where a gated pod's slices go, have the node agent make them, then let the default
scheduler bind the pod there.

One pod, from admission to its container holding the slices:
  1. The webhook renamed `nvidia.com/mig-<p>` to `gpuops.io/mig-<p>` and added the gate `gpuops.io/mig-slicer`.
  2. Plan: the MigNodes' slices (but those of ended claims, which the agent destroys first) plus every live
     claim (and the claims this process created that the cache has not shown yet) are the occupancy;
     `gpuops.accounting.mig.place_in_cluster` picks node, GPUs and starts among the nodes that admit the pod
     (nodeSelector, required affinity, taints; Ready, schedulable, agent alive, no other MIG manager:
     `gpuops.controllers.coexistence`). One AllocationClaim per slice, owned by the pod, labelled with the node
     for its agent.
     Nothing fits: the pod stays gated with the condition `gpuops.io/MigSlices=False` and a
     FailedMigAllocation Event saying why; any change of MigNodes or claims wakes it.
  3. The agent creates each slice and reports the claim Created (device UUID).
  4. Advertise: the allocator annotates the claims (`gpuops.io/advertise`); the agent's device plugin then
     offers those slices to the kubelet and sets `status.advertised`. Only one pod per (node, profile) is in
     this state until its containers start: the kubelet gives a container any free device of the resource, and
     with one candidate pod the free devices are exactly that pod's slices.
  5. Ungate: one update pins the pod to the node (nodeSelector `kubernetes.io/hostname`, allowed on gated pods
     since Kubernetes 1.30) and removes the gate; the default scheduler binds it; the kubelet's Allocate (the
     agent's device plugin) marks the claims Bound.
  6. A finished pod's claims become Released (the agent destroys the slices); a deleted pod's claims are
     garbage-collected with it (the agent destroys slices whose claim is gone after a grace period).
A claim the agent reports Failed, or one left Pending past `pending_timeout`, is deleted and the pod planned
again.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field

import msgspec
import structlog

from gpuops.accounting import mig
from gpuops.accounting.errors import AccountingError
from gpuops.controllers.apigroup import API_VERSION
from gpuops.controllers.coexistence import mig_manager_conflict
from gpuops.controllers.scheduling import gpu_request, node_admits
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result
from gpuops.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import INDEX_NODE, Informer
from gpuops.kube.objects import Node, Pod
from gpuops.kube.resources import PODS
from gpuops.kube.times import format_time, parse_time_or_none, wall_clock

from .api import (
    ADVERTISE,
    CLAIMS,
    GATE,
    MIG_NODE_KIND,
    NODE_LABEL,
    OUR_PREFIX,
    POD_UID_LABEL,
    AllocationClaim,
    MigNode,
    claim_name,
    profile_of_resource,
    resource_of_profile,
)
from .metrics import ALLOCATION_SECONDS, PLAN_FAILURES
from .reports import refused_reports
from .settings import Settings

__all__ = [
    "CONDITION",
    "INDEX_CLAIMS_BY_NODE",
    "INDEX_CLAIMS_BY_POD",
    "INDEX_GATED",
    "Allocator",
    "Settings",
    "claims_by_node",
    "claims_by_pod",
    "gated",
    "requested_profiles",
]

log = structlog.get_logger("gpuops.controllers.migslicer")

CONDITION = "gpuops.io/MigSlices"
INDEX_GATED = "gpuops.io/mig-gated"
INDEX_CLAIMS_BY_POD = "gpuops.io/pod-uid"
INDEX_CLAIMS_BY_NODE = "gpuops.io/claim-node"
HOSTNAME = "kubernetes.io/hostname"
_SECOND = 1_000_000
_LIVE = ("Pending", "Created", "Bound")
_ENDED = ("Released", "Failed")
"""Claims whose slice the agent destroys at once, unless a live claim has taken it over."""
_DONE = ("Succeeded", "Failed")


def gated(pod: Pod) -> tuple[str, ...]:
    """Index function: pods carrying our scheduling gate."""
    return ("",) if any(g.name == GATE for g in pod.spec.scheduling_gates or ()) else ()


def claims_by_node(claim: AllocationClaim) -> tuple[str, ...]:
    """Index function: the node a claim's slice is on."""
    return (claim.spec.node_name,) if claim.spec.node_name else ()


def claims_by_pod(claim: AllocationClaim) -> tuple[str, ...]:
    return (claim.spec.pod_uid,) if claim.spec.pod_uid else ()


def requested_profiles(pod: Pod) -> list[str]:
    """One profile name per slice the pod needs (its effective request of each `gpuops.io/mig-*` resource:
    init containers and sidecars counted as the scheduler counts them)."""
    names: set[str] = set()
    for c in (*(pod.spec.init_containers or ()), *(pod.spec.containers or ())):
        r = c.resources
        if r is not None:
            names.update(k for k in (*(r.requests or {}), *(r.limits or {})) if k.startswith(OUR_PREFIX))
    out: list[str] = []
    for resource in sorted(names):
        profile = profile_of_resource(resource)
        count = gpu_request(pod, resource)
        if profile is None or count <= 0:
            continue
        out.extend([profile] * math.ceil(count))
    return out


@dataclass(eq=False, repr=False)
class Allocator:
    """Plans MIG slices for gated pods and lifts their gate once the slices are offered. `controller` is set by
    `install`, for delayed enqueues."""

    client: Client
    pods: Informer[Pod]
    nodes: Informer[Node]
    mig_nodes: Informer[MigNode]
    claims: Informer[AllocationClaim]
    recorder: EventRecorder
    _: KW_ONLY
    settings: Settings = field(default_factory=Settings)
    clock: Callable[[], int] = wall_clock
    controller: Controller | None = field(default=None, init=False)
    _reserved: dict[str, AllocationClaim] = field(default_factory=dict, init=False)
    """Claims created by this process that the cache may not show yet: planning counts them, so two pods planned
    back to back never get the same slice."""
    _seen_waiting: dict[tuple[str, str], int] = field(default_factory=dict, init=False)
    """Pod key -> when first seen gated (the metric)."""
    _advertising: dict[tuple[str, str], tuple[set[str], str]] = field(default_factory=dict, init=False)
    """(node, pod uid) -> (profiles, when) of pods whose slices this process asked to offer, until they start: the
    cache may not show our annotation yet, and two pods offered at once would get each other's slices."""
    _refused_seen: dict[str, str] = field(default_factory=dict, init=False)
    """MigNode name -> why its report is not planned on (Event once)."""

    # ------------------------------------------------------------------------------------------ mapping

    def map_pod(self, pod: Pod) -> list[Request]:
        if gated(pod) or self.claims.store.by_index(INDEX_CLAIMS_BY_POD, pod.metadata.uid):
            return [Request(pod.metadata.namespace, pod.metadata.name)]
        return []

    def map_capacity(self, obj: object) -> list[Request]:
        """A MigNode's slices or a Node's MIG allocatable changed: the gated pods it can concern."""
        if isinstance(obj, MigNode):
            return self._concerned(obj.spec.node_name or obj.metadata.name)
        if isinstance(obj, Node):
            return self._concerned(obj.metadata.name)
        return self._concerned(None)

    def map_claim(self, claim: AllocationClaim) -> list[Request]:
        own = Request(claim.metadata.namespace, claim.spec.pod_name)
        return [own, *(r for r in self._concerned(claim.spec.node_name) if r != own)]

    def _concerned(self, node: str | None) -> list[Request]:
        """Gated pods a change on `node` can move: those not planned yet (capacity there changed) and those
        whose claims are on that node (hand-off order, the kubelet's allocatable). Pods whose claims are on
        other nodes are not: every check of theirs is about their own node. Waking every gated pod on every
        claim change made the single worker's load grow with the square of the pods in hand-off.
        `node` None (an unknown object): every gated pod."""
        out: dict[Request, None] = {}
        for p in self.pods.store.by_index(INDEX_GATED, ""):
            if node is None or not self.claims.store.by_index(INDEX_CLAIMS_BY_POD, p.metadata.uid):
                out[Request(p.metadata.namespace, p.metadata.name)] = None
        if node is not None:
            for c in self.claims.store.by_index(INDEX_CLAIMS_BY_NODE, node):
                owner = self.pods.store.get(f"{c.metadata.namespace}/{c.spec.pod_name}")
                if owner is not None and gated(owner):
                    out[Request(c.metadata.namespace, c.spec.pod_name)] = None
        return list(out)

    # ------------------------------------------------------------------------------------------ reconcile

    async def reconcile(self, req: Request) -> Result | None:
        """Plan, create and offer a gated pod's MIG slices, then ungate it; release a finished pod's claims."""
        pod = self.pods.store.get(f"{req.namespace}/{req.name}")
        if pod is None:
            self._seen_waiting.pop((req.namespace, req.name), None)
            return None  # its claims go with it (ownerReferences); the agent destroys their slices
        claims = self._claims_of(pod)
        if pod.status.phase in _DONE or pod.metadata.deletion_timestamp:
            for c in claims:
                await self._release(c)
            return None
        if not gated(pod):
            lost = [c for c in claims if c.status.phase == "Failed" and c.status.device_uuid]
            if lost and pod.spec.node_name:
                await self._evict_lost(pod, lost[0].status.message)
            return None
        profiles = requested_profiles(pod)
        if not profiles:
            await self._ungate(pod, None, "the pod asks for no MIG slice")
            return None
        now = self.clock()
        self._seen_waiting.setdefault((pod.metadata.namespace, pod.metadata.name), now)
        live = [c for c in claims if c.status.phase in _LIVE]
        broken = [c for c in claims if c.status.phase == "Failed" or self._stuck(c, now) or self._held(c)]
        missing = _missing(profiles, live)
        if not broken and live and missing and await self._complete(pod, live, missing):
            return None
        if broken or (live and sorted(c.spec.profile for c in live) != sorted(profiles)):
            why = broken[0].status.message if broken else "the pod's request changed"
            log.info("replanning pod", pod=_key(pod), reason=why)
            for c in claims:
                await self._delete(c)
            return Result(requeue_after=self.settings.failed_backoff)
        if not live:
            return await self._plan(pod, profiles)
        if any(c.status.phase == "Pending" for c in live):
            return await self._creating(pod, live, now)
        return await self._offer(pod, live, now)

    async def _creating(self, pod: Pod, live: list[AllocationClaim], now: int) -> Result:
        """Wait for the agent to create the Pending slices; look again when the oldest claim would be stuck."""
        pending = [c for c in live if c.status.phase == "Pending"]
        await self._waiting(pod, "CreatingSlices", f"waiting for the node agent on {live[0].spec.node_name} to"
                            f" create {len(pending)} slice(s) ({', '.join(c.spec.profile for c in pending)})")
        created = min(parse_time_or_none(c.metadata.creation_timestamp) or now for c in live)
        return Result(requeue_after=max(0.1, (created + self.settings.pending_timeout * _SECOND - now) / _SECOND))

    async def _offer(self, pod: Pod, live: list[AllocationClaim], now: int) -> Result | None:
        """Every slice exists: advertise them (one pod per node and profile at a time), then ungate the pod once
        the agent offers them and the kubelet lists them."""
        node = live[0].spec.node_name
        profiles_here = {c.spec.profile for c in live}
        if not all(ADVERTISE in (c.metadata.annotations or {}) for c in live):
            busy = self._blocker(node, profiles_here, pod.metadata.uid, None)
            if busy is not None:
                await self._waiting(pod, "WaitingForNode", busy)
                return Result(requeue_after=self.settings.retry)  # its start, release or deletion wakes us too
            stamp = format_time(now)
            for c in live:
                await self._annotate(c, stamp)
            self._advertising[(node, pod.metadata.uid)] = (profiles_here, stamp)
            return None
        mine = min((c.metadata.annotations or {}).get(ADVERTISE, "") for c in live)
        if not all(c.status.advertised for c in live):
            return await self._not_offered(pod, mine, "Advertising", f"the node agent on {node} to offer the "
                                           "slice(s) to the kubelet", "its device plugin is not registered with the "
                                           f"kubelet? see the agent's log on {node}")  # its status write wakes us
        busy = self._blocker(node, profiles_here, pod.metadata.uid, (mine, pod.metadata.uid))  # a pod may have ended
        if busy is not None:
            await self._waiting(pod, "WaitingForNode", busy)
            return Result(requeue_after=self.settings.retry)
        if not self._kubelet_has(node, live, pod):  # the Node's next status (allocatable) wakes us
            return await self._not_offered(pod, mine, "WaitingForKubelet", f"the kubelet on {node} to list the "
                                           "slice(s) in the Node's allocatable", "the kubelet does not take the "
                                           "agent's devices? see the kubelet's and the agent's logs")
        await self._ungate(pod, node, f"{len(live)} slice(s) on {node}: "
                           + ", ".join(f"{c.spec.profile}@{c.spec.gpu_uuid[:12]}/{c.spec.start}" for c in live))
        return None

    async def _not_offered(self, pod: Pod, stamp: str, reason: str, what: str, hint: str) -> Result:
        """A wait for the agent or the kubelet after the slices were offered (`stamp`, the advertise annotation):
        routine at first, DeviceNotAdvertised (Warning Event, metric, warning log) past `advertise_timeout`, so a
        device plugin that never registered does not leave the pod gated with nothing saying so."""
        now = self.clock()
        since = parse_time_or_none(stamp)
        waited = 0.0 if since is None else max(0.0, (now - since) / _SECOND)
        limit = self.settings.advertise_timeout
        if waited < limit:
            await self._waiting(pod, reason, f"waiting for {what}")
            return Result(requeue_after=max(0.1, min(self.settings.retry, limit - waited)))
        await self._no_fit(pod, "DeviceNotAdvertised", f"still waiting for {what}, more than {limit:g} s after "
                           f"they were offered at {stamp} ({hint}); the pod stays gated until they are")
        return Result(requeue_after=self.settings.retry)

    # ------------------------------------------------------------------------------------------ planning

    def _claims_of(self, pod: Pod) -> list[AllocationClaim]:
        cached = {c.metadata.name: c for c in self.claims.store.by_index(INDEX_CLAIMS_BY_POD, pod.metadata.uid)}
        for name, c in list(self._reserved.items()):
            if self.claims.store.get(f"{c.metadata.namespace}/{name}") is not None:
                del self._reserved[name]  # the cache has it now
            elif c.spec.pod_uid == pod.metadata.uid:
                cached.setdefault(name, c)
        return list(cached.values())

    def _held(self, claim: AllocationClaim) -> bool:
        """A claim still Pending on a node another MIG manager took over: its agent will not make it."""
        if claim.status.phase != "Pending":
            return False
        node = self.nodes.store.get(claim.spec.node_name)
        return node is not None and mig_manager_conflict(node.metadata.labels) is not None

    def _stuck(self, claim: AllocationClaim, now: int) -> bool:
        if claim.status.phase != "Pending":
            return False
        created = parse_time_or_none(claim.metadata.creation_timestamp)
        return created is not None and now - created > self.settings.pending_timeout * _SECOND

    def _occupancy(self) -> dict[str, dict[str, set[tuple[int, int, str]]]]:
        """node -> GPU UUID -> (start, size, profile) of every slice that exists or is claimed, but for slices on
        their way out: at the placement of an ended (Released or Failed) claim whose pod finished or is gone, a
        slice no live claim owns is destroyed by the agent at once (before it makes the slices of newer claims),
        so it is free to plan on already. Waiting for the agent's next report held every freed slice a few
        hundred milliseconds past its pod's end. A terminating pod's containers may still use theirs: those
        stay taken until the agent's report drops them."""
        out: dict[str, dict[str, set[tuple[int, int, str]]]] = {}
        claims = [*self.claims.store.list(), *self._reserved.values()]
        leaving = {(c.spec.node_name, c.spec.gpu_uuid, c.spec.start) for c in claims
                   if c.status.phase in _ENDED and not self._pod_may_run(c)}
        for mn in self.mig_nodes.store.list():
            name = mn.spec.node_name or mn.metadata.name
            gpus = out.setdefault(name, {})
            for g in mn.status.gpus:
                held = gpus.setdefault(g.uuid, set())
                held.update((s.start, s.size, s.profile) for s in g.slices if (name, g.uuid, s.start) not in leaving)
        for c in claims:
            if c.status.phase in _LIVE:
                out.setdefault(c.spec.node_name, {}).setdefault(c.spec.gpu_uuid, set()).add(
                    (c.spec.start, c.spec.size, c.spec.profile))
        return out

    def _pod_may_run(self, claim: AllocationClaim) -> bool:
        """Whether the claim's pod may still have a container on its slice: it exists and has not finished."""
        pod = self.pods.store.get(f"{claim.metadata.namespace}/{claim.spec.pod_name}")
        return pod is not None and pod.metadata.uid == claim.spec.pod_uid and pod.status.phase not in _DONE

    def _refused(self) -> dict[str, str]:
        """Reports left out of planning (see reports.py); each newly refused one gets a Warning Event and a log."""
        refused = refused_reports(self.mig_nodes.store.list())
        for name, why in refused.items():
            if self._refused_seen.get(name) != why:
                mn = self.mig_nodes.store.get(name)
                if mn is not None:
                    self.recorder.record(mn, "Warning", "ReportRefused", f"not used for MIG placement: it {why}",
                                         kind=MIG_NODE_KIND, api_version=API_VERSION)
                log.warning("MIG node report refused", mig_node=name, reason=why)
        self._refused_seen = refused
        return refused

    def _candidates(self, pod: Pod, now: int) -> tuple[list[mig.Node], Counter[str]]:
        held = self._occupancy()
        out: list[mig.Node] = []
        why: Counter[str] = Counter()
        refused = self._refused()
        for mn in self.mig_nodes.store.list():
            name = mn.spec.node_name or mn.metadata.name
            node = self.nodes.store.get(name)
            beat = parse_time_or_none(mn.status.heartbeat)
            if node is not None and not node_admits(pod, name, node.metadata.labels or {}, node.spec.taints or ()):
                why[NOT_FOR_POD] += 1  # not a node this pod may use: its state is no reason for the wait
                continue
            if node is not None and mig_manager_conflict(node.metadata.labels) is not None:
                why[OTHER_MIG_MANAGER] += 1  # two owners of one GPU's geometry would undo each other's slices
                continue
            if mn.metadata.name in refused:
                why[REPORT_REFUSED] += 1
                continue
            if node is None or not cond.is_true(node.status.conditions, "Ready"):
                why["node not Ready"] += 1
                continue
            if node.spec.unschedulable:
                why["node cordoned"] += 1
                continue
            if beat is None or now - beat > self.settings.agent_stale * _SECOND:
                why[AGENT_SILENT] += 1
                continue
            gpus = []
            unusable = 0
            modes = Counter(g.mig_mode for g in mn.status.gpus)
            for g in mn.status.gpus:
                if g.mig_mode != "Enabled":
                    continue
                slices = held.get(name, {}).get(g.uuid, set())
                placements = tuple(mig.Placement(p, s, z) for s, z, p in sorted(slices))
                try:  # one GPU we cannot reason about (a model without tables, a layout the driver should
                    mig.check_layout(mig.geometry(g.model), placements)  # not have) must not block the rest
                except AccountingError as e:
                    unusable += 1
                    log.debug("GPU left out of MIG placement", node=name, gpu=g.uuid, model=g.model, error=str(e))
                    continue
                gpus.append(mig.GPU(g.uuid, g.model, placements))
            if gpus:
                out.append(mig.Node(name, tuple(gpus)))
            elif unusable:
                why[UNKNOWN_MODEL] += 1
            else:
                why[RESET_PENDING if modes.get("Pending") else MIG_DISABLED] += 1
        return out, why

    def _agentless(self, pod: Pod) -> int:
        """Nodes the pod may use that have no MigNode at all: no gpuops agent ever reported there (not deployed,
        or not scheduled on them), which no freed slice will change."""
        reporting = {mn.spec.node_name or mn.metadata.name for mn in self.mig_nodes.store.list()}
        return sum(1 for n in self.nodes.store.list() if n.metadata.name not in reporting
                   and node_admits(pod, n.metadata.name, n.metadata.labels or {}, n.spec.taints or ()))

    def _handing_off(self) -> dict[str, set[str]]:
        """node -> profiles whose slices are on their way to a pod that has not started yet. The kubelet hands
        a container any free device of a resource, so a node offers one such pod per profile at a time."""
        out: dict[str, set[str]] = {}
        for c in [*self.claims.store.list(), *self._reserved.values()]:
            if c.status.phase not in _LIVE:
                continue
            pod = self.pods.store.get(f"{c.metadata.namespace}/{c.spec.pod_name}")
            if pod is None or pod.metadata.uid != c.spec.pod_uid or pod.status.phase != "Pending" or _started(pod):
                continue
            out.setdefault(c.spec.node_name, set()).add(c.spec.profile)
        return out

    def _place(self, candidates: list[mig.Node], profiles: list[str]) -> mig.NodePlacement | None:
        """Best placement among nodes not already handing these profiles to another pod, else among all.
        Packing everything onto the fullest node queued MIG pods behind each other's hand-off (one at a time
        per node and profile): at 2 MIG pods/s over 500 nodes most waited tens of seconds (bench/scale.py).
        Arrivals now spread over as many nodes as are in hand-off at once; each still packs."""
        busy = self._handing_off()
        wanted = set(profiles)
        idle = [n for n in candidates if not busy.get(n.name, set()) & wanted]
        if idle and len(idle) < len(candidates):
            plan = mig.place_in_cluster(idle, profiles)
            if plan is not None:
                return plan
        return mig.place_in_cluster(candidates, profiles)

    async def _plan(self, pod: Pod, profiles: list[str]) -> Result | None:
        now = self.clock()
        candidates, why = self._candidates(pod, now)
        try:
            plan = self._place(candidates, profiles)
        except AccountingError as e:
            await self._no_fit(pod, "InvalidRequest", f"cannot place {', '.join(profiles)}: {e}")
            return None
        if plan is None:
            agentless = 0 if candidates else self._agentless(pod)
            if agentless:
                why[NO_AGENT] += agentless
            never = never_fits(candidates, profiles)
            if never is not None:  # retried all the same: a node with other GPUs may join
                await self._no_fit(pod, "Unsatisfiable", never)
                return Result(requeue_after=self.settings.retry)
            if candidates:
                why["not enough free slices in a placement that fits"] += len(candidates)
            reasons = "; ".join(f"{n} {w}" for w, n in why.most_common()) or "no MIG node reports"
            await self._no_fit(pod, "NoCapacity" if candidates else waiting_reason(why),
                               f"no node can hold {', '.join(profiles)} now ({reasons}); retried when slices are "
                               "freed or nodes change")
            return Result(requeue_after=self.settings.retry)
        await self._create_claims(pod, plan, range(len(plan.slices)))
        log.info("slices planned", pod=_key(pod), node=plan.node,
                 slices=[f"{s.placement.profile}@{s.gpu}/{s.placement.start}" for s in plan.slices])
        await self._waiting(pod, "Planned", f"{len(plan.slices)} slice(s) planned on {plan.node}: "
                            + ", ".join(f"{s.placement.profile}@{s.gpu[:12]}/{s.placement.start}" for s in plan.slices))
        return None

    async def _complete(self, pod: Pod, live: list[AllocationClaim], missing: list[str]) -> bool:
        """A plan whose claims were only partly made (a create failed midway: an API error, an outage) gets the
        missing ones on the same node. Deleting the made ones and planning again made and destroyed slices for
        nothing and gave the pod more claims than slices. False when they no longer fit there (plan again)."""
        node = live[0].spec.node_name
        if any(c.spec.node_name != node for c in live):
            return False
        candidates = [n for n in self._candidates(pod, self.clock())[0] if n.name == node]
        try:
            plan = mig.place_in_cluster(candidates, missing) if candidates else None
        except AccountingError:
            return False
        if plan is None:
            return False
        taken = {c.metadata.name for c in live}
        free = (i for i in range(len(live) + len(missing) + len(taken))
                if claim_name(pod.metadata.name, pod.metadata.uid, i) not in taken)
        # a name taken on the server only (its create answered nothing) may hold another placement: stop there,
        # the cache brings it and the next reconcile completes the rest around it
        await self._create_claims(pod, plan, free, stop_if_exists=True)
        log.info("plan completed", pod=_key(pod), node=plan.node,
                 slices=[f"{s.placement.profile}@{s.gpu}/{s.placement.start}" for s in plan.slices])
        return True

    async def _create_claims(self, pod: Pod, plan: mig.NodePlacement, indices: Iterable[int], *,
                             stop_if_exists: bool = False) -> None:
        """One claim per slice of `plan`, named by the next of `indices`."""
        uid = pod.metadata.uid
        for i, gp in zip(indices, plan.slices, strict=False):
            body = {
                "apiVersion": "gpuops.io/v1alpha1", "kind": "AllocationClaim",
                "metadata": {"name": claim_name(pod.metadata.name, uid, i), "namespace": pod.metadata.namespace,
                             "labels": {NODE_LABEL: plan.node, POD_UID_LABEL: uid},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                                                  "uid": uid, "controller": True, "blockOwnerDeletion": False}]},
                "spec": {"podName": pod.metadata.name, "podUID": uid, "nodeName": plan.node, "gpuUUID": gp.gpu,
                         "profile": gp.placement.profile, "start": gp.placement.start, "size": gp.placement.size},
            }
            try:
                made = await self.client.create(CLAIMS, body, namespace=pod.metadata.namespace)
            except AlreadyExists:
                if stop_if_exists:
                    return
                continue  # an earlier attempt made it: the cache brings it
            self._reserved[made.metadata.name] = made
            await self._mark_pending(made)

    async def _mark_pending(self, claim: AllocationClaim) -> None:
        """Write the new claim's phase, so `kubectl get allocationclaims` shows Pending (not a blank) until its
        agent reports. Only on the version just created: an agent that already wrote Created wins."""
        body = {"metadata": {"resourceVersion": claim.metadata.resource_version},
                "status": {"phase": "Pending", "message": f"waiting for the node agent on {claim.spec.node_name} "
                           f"to make the slice (placed again if not made within {self.settings.pending_timeout:g} s)"}}
        try:
            await self.client.patch(CLAIMS, claim.metadata.name, body, namespace=claim.metadata.namespace,
                                    subresource="status")
        except (Conflict, NotFound):
            return
        except ApiError as e:
            log.info("claim phase not written", claim=claim.metadata.name, error=str(e))

    def _kubelet_has(self, node: str, live: list[AllocationClaim], pod: Pod) -> bool:
        """The node's kubelet lists exactly the slices offered for each of these profiles: its allocatable equals
        the advertised claims of the profile there. Ungating earlier lets the scheduler bind a pod the kubelet
        then refuses (its device list is still the previous one: too short, or holding a destroyed slice)."""
        n = self.nodes.store.get(node)
        if n is None:
            return False
        allocatable = n.status.allocatable or {}
        for profile in {c.spec.profile for c in live}:
            offered = sum(1 for c in self.claims.store.by_index(INDEX_CLAIMS_BY_NODE, node)
                          if c.spec.node_name == node and c.spec.profile == profile and c.status.advertised
                          and c.status.phase in ("Created", "Bound"))
            resource = resource_of_profile(profile)
            have = allocatable.get(resource)
            try:
                if have is None or int(have) != offered:
                    return False
            except ValueError:
                return False
            # the kubelet admits the pod only if the pods it still runs there (terminating ones too) leave room
            used = sum(gpu_request(p, resource) for p in self.pods.store.by_index(INDEX_NODE, node)
                       if p.status.phase not in _DONE and p.metadata.uid != pod.metadata.uid)
            if used + sum(1 for c in live if c.spec.profile == profile) > int(have):
                return False
        return True

    def _blocker(self, node: str, profiles: set[str], uid: str, mine: tuple[str, str] | None) -> str | None:
        """Why another pod's slices of these profiles on this node keep ours from being offered to the kubelet
        now (None: nothing does). The kubelet hands a container any free device of the resource, so a device
        must be free only for the pod it was made for:
          - another pod offered slices and has not started yet (in the cache, or annotated by this process a
            moment ago and not in the cache yet);
          - a finished or deleted pod's slices are still offered (the kubelet freed them, the agent has not
            withdrawn them yet).
        `mine`: (advertise stamp, uid) once ours are offered too (after an operator restart two pods can be): the
        earlier one goes first, so they never wait for each other."""
        for (n, other_uid), (profs, _) in list(self._advertising.items()):
            if n != node or other_uid == uid or not profs & profiles:
                continue
            other = self._pod_by_uid(other_uid)
            if other is None or other.status.phase != "Pending" or (other.spec.node_name and _started(other)):
                del self._advertising[(n, other_uid)]
                continue
            if mine is not None and (self._advertising[(n, other_uid)][1], other_uid) > mine:
                continue
            return f"pod {_key(other)} is being handed its slices on {node}; ours follow once it starts"
        for c in self.claims.store.by_index(INDEX_CLAIMS_BY_NODE, node):
            if (c.spec.node_name != node or c.spec.pod_uid == uid or c.spec.profile not in profiles
                    or c.status.phase not in ("Created", "Bound")
                    or not (c.status.advertised or ADVERTISE in (c.metadata.annotations or {}))):
                continue
            other = self.pods.store.get(f"{c.metadata.namespace}/{c.spec.pod_name}")
            if other is None or other.metadata.uid != c.spec.pod_uid or other.status.phase in _DONE \
                    or other.metadata.deletion_timestamp:
                return f"the slice of {c.metadata.namespace}/{c.spec.pod_name}, which ended, is still offered on " \
                       f"{node} until it is withdrawn"
            if other.status.phase == "Pending" and not _started(other):
                theirs = ((c.metadata.annotations or {}).get(ADVERTISE, ""), c.spec.pod_uid)
                if mine is not None and theirs > mine:
                    continue  # offered after ours: it waits for us
                return f"pod {_key(other)} is being handed its slices on {node}; ours follow once it starts"
        return None

    def _pod_by_uid(self, uid: str) -> Pod | None:
        for c in self.claims.store.by_index(INDEX_CLAIMS_BY_POD, uid):
            p = self.pods.store.get(f"{c.metadata.namespace}/{c.spec.pod_name}")
            if p is not None and p.metadata.uid == uid:
                return p
        return None

    # ------------------------------------------------------------------------------------------ writes

    async def _annotate(self, claim: AllocationClaim, stamp: str) -> None:
        with contextlib.suppress(NotFound):
            await self.client.patch(CLAIMS, claim.metadata.name, {"metadata": {"annotations": {ADVERTISE: stamp}}},
                                    namespace=claim.metadata.namespace)

    async def _release(self, claim: AllocationClaim) -> None:
        if claim.status.phase == "Released":
            return
        with contextlib.suppress(NotFound):
            await self.client.patch(CLAIMS, claim.metadata.name, {"status": {"phase": "Released",
                                    "message": "the pod finished"}}, namespace=claim.metadata.namespace,
                                    subresource="status")

    async def _delete(self, claim: AllocationClaim) -> None:
        self._reserved.pop(claim.metadata.name, None)
        with contextlib.suppress(NotFound):
            await self.client.delete(CLAIMS, claim.metadata.name, claim.metadata.namespace)

    async def _ungate(self, pod: Pod, node: str | None, message: str) -> None:
        gates = [msgspec.to_builtins(g) for g in pod.spec.scheduling_gates or () if g.name != GATE]
        spec: dict[str, object] = {"schedulingGates": gates or None}
        if node is not None:
            spec["nodeSelector"] = {**(pod.spec.node_selector or {}), HOSTNAME: node}
        try:
            await self.client.patch(PODS, pod.metadata.name, {
                "metadata": {"resourceVersion": pod.metadata.resource_version}, "spec": spec},
                namespace=pod.metadata.namespace)
        except (Conflict, NotFound) as e:
            log.debug("ungate skipped", pod=_key(pod), error=str(e))
            return
        except ApiError as e:
            await self._no_fit(pod, "UngateRefused", f"the pod could not be pinned to {node}: {e}")
            return
        started = self._seen_waiting.pop((pod.metadata.namespace, pod.metadata.name), None)
        created = parse_time_or_none(pod.metadata.creation_timestamp)
        if node is not None:  # from when this process first saw the pod (creationTimestamp has whole seconds)
            ALLOCATION_SECONDS.observe(max(0.0, (self.clock() - (started or created or self.clock())) / _SECOND))
            await self._condition(pod, "True", "Allocated", message)
            self.recorder.record(pod, "Normal", "MigSlicesAllocated", message)
        log.info("pod ungated", pod=_key(pod), node=node)

    async def _waiting(self, pod: Pod, reason: str, message: str) -> None:
        """Our condition says why the pod still waits, without an Event (this wait is short and routine)."""
        await self._condition(pod, "False", reason, message)

    async def _evict_lost(self, pod: Pod, why: str) -> None:
        """A running pod whose slice vanished (node reboot, GPU reset) computes on nothing: delete it, so its
        controller makes a new one that gets a new slice, and say so."""
        message = f"the pod lost its MIG slice ({why}); deleted so that it is scheduled again"
        self.recorder.record(pod, "Warning", "MigSliceLost", message)
        log.info("pod lost its slice", pod=_key(pod), reason=why)
        with contextlib.suppress(NotFound):
            await self.client.delete(PODS, pod.metadata.name, pod.metadata.namespace)

    async def _no_fit(self, pod: Pod, reason: str, message: str) -> None:
        PLAN_FAILURES.labels(reason).inc()
        changed = await self._condition(pod, "False", reason, message)
        if changed:
            self.recorder.record(pod, "Warning", "FailedMigAllocation", message)
            # a wait for slices to be freed is routine; a wait no freed slice can end needs someone
            emit = log.info if reason == "NoCapacity" else log.warning
            emit("pod waits for MIG slices", pod=_key(pod), reason=reason, message=message)

    async def _condition(self, pod: Pod, value: str, reason: str, message: str) -> bool:
        """Set our pod condition; True when it changed (so an Event is worth sending)."""
        items = cond.set_condition(pod.status.conditions, CONDITION, value, reason, message[:1024],
                                   now=format_time(wall_clock() // _SECOND * _SECOND))
        current = cond.get_condition(pod.status.conditions, CONDITION)
        if current is not None and (current.status, current.reason, current.message) == (value, reason, message[:1024]):
            return False
        mine = next(c for c in items if c["type"] == CONDITION)
        try:
            await self.client.patch(PODS, pod.metadata.name, {"status": {"conditions": [mine]}},
                                    namespace=pod.metadata.namespace, patch_type="strategic",
                                    subresource="status")
        except (NotFound, Conflict):
            return False
        except ApiError as e:
            log.info("pod condition not written", pod=_key(pod), error=str(e))
            return False
        return True


def _missing(profiles: list[str], live: list[AllocationClaim]) -> list[str] | None:
    """The profiles asked for that no live claim holds; None if a claim holds one not asked for."""
    left = Counter(profiles)
    left.subtract(c.spec.profile for c in live)
    if any(n < 0 for n in left.values()):
        return None
    return sorted(left.elements())


def _started(pod: Pod) -> bool:
    """The kubelet has admitted the pod (its containers have devices): a container status or phase past Pending."""
    return pod.status.phase != "Pending" or bool(pod.status.container_statuses)


def _key(pod: Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def waiting(pods: Iterable[Pod]) -> int:
    return sum(1 for p in pods if gated(p))


def never_fits(candidates: list[mig.Node], profiles: list[str]) -> str | None:
    """Why the pod's slices fit on none of the nodes that could take it even with every GPU empty (None: they
    would fit once slices are freed). A profile no GPU there offers, or more slices than one node holds, is not
    a wait for capacity: the message says what to ask for instead."""
    if not candidates:
        return None
    models = {g.model for n in candidates for g in n.gpus}
    offered: set[str] = set()
    unknown: list[str] = []
    for model in models:
        offered.update(p.name for p in mig.geometry(model).profiles)
    for name in dict.fromkeys(profiles):
        if not any(_offers(model, name) for model in models):
            unknown.append(name)
    if unknown:
        return (f"no MIG node that may run this pod has a GPU offering {', '.join(unknown)} "
                f"({', '.join(sorted(models))} offer {', '.join(sorted(offered))}): ask for one of those profiles")
    emptied = [mig.Node(n.name, tuple(mig.GPU(g.name, g.model) for g in n.gpus)) for n in candidates]
    if mig.place_in_cluster(emptied, profiles) is None:
        return (f"{len(profiles)} slices ({', '.join(profiles)}) fit on no single node even with all its GPUs empty, "
                "and a pod's slices must all be on its node: ask for fewer or smaller slices, or split the work "
                "over several pods")
    return None


def _offers(model: str, profile: str) -> bool:
    try:
        mig.parse_profile(mig.geometry(model), profile)
    except AccountingError:
        return False
    return True


NOT_FOR_POD = "node selector, affinity or taints"
AGENT_SILENT = "agent not reporting"
NO_AGENT = "node without a gpuops agent (no MigNode: is the agent DaemonSet scheduled there?)"
MIG_DISABLED = "MIG disabled on its GPUs"
RESET_PENDING = "MIG mode change waiting for a GPU reset"
UNKNOWN_MODEL = "only GPUs of a model without MIG tables (or a layout gpuops cannot read)"
REPORT_REFUSED = "agent report contradicting another (see the MigNode's ReportRefused Event)"
OTHER_MIG_MANAGER = "another MIG manager or MIG device plugin on the node (see the MigNode's ConflictDetected)"
_SPECIFIC = {AGENT_SILENT: "AgentNotReporting", NO_AGENT: "AgentNotRegistered", MIG_DISABLED: "MigDisabled",
             RESET_PENDING: "MigResetPending", UNKNOWN_MODEL: "UnknownGPUModel", REPORT_REFUSED: "AgentReportRefused",
             OTHER_MIG_MANAGER: "MigManagerConflict"}


def waiting_reason(why: Counter[str]) -> str:
    """The MigSlices reason for a pod no node may take now: when every node it may use is held back by the same
    configuration cause, that cause (AgentNotRegistered, AgentNotReporting, AgentReportRefused, MigDisabled,
    MigResetPending, UnknownGPUModel, MigManagerConflict), which no freed slice will end; else NoCapacity."""
    causes = {w for w, n in why.items() if n and w != NOT_FOR_POD}
    if len(causes) == 1:
        return _SPECIFIC.get(causes.pop(), "NoCapacity")
    return "NoCapacity"

"""Power GPU machines on for pending GPU pods and off when idle: one planner, one state machine per group.

Two kinds of work items share the controller's queue:
  PLAN     the cluster-wide decision (`gpuops.accounting.capacity`): which Off groups to power on for the
           unschedulable GPU pods (per-pod packing, smallest sufficient machine first, machines already powering
           on counted until their boot deadline) and which idle Ready groups to power off (largest first, every
           one in time, a warm minimum and a cap on concurrent power-offs). A decision is written to the group's
           status (state, a PendingTransition with its Idempotency-Key) before anything is sent, so a restart or
           a retry never sends a second transition for one decision.
  <group>  that group's state machine, driving what the plan decided:
           PoweringOn  POST scale-up (once: `transition.sent`), then Ready when the Node is Ready with its GPUs
                       allocatable (a Ready node with 0 GPUs is still booting); past bootDeadline -> Failed.
           Failed      backs off (5 min doubling to 30 min), then Off: offered to the planner again.
           Draining    taint NoSchedule, evict the node's remaining non-DaemonSet pods (Eviction API), then POST
                       scale-down -> PoweringOff; a GPU pod landing meanwhile aborts back to Ready, and so does a
                       mark of another autoscaler or a do-not-remove annotation (`power_off_hold`).
           PoweringOff Off once the Node is NotReady or gone.
           Off/Ready   follow the Node (powered on or off by someone else).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from fractions import Fraction
from typing import Any

import msgspec
import structlog

from gpuops.accounting.capacity import (
    GpuNode,
    NodeState,
    ScaleDownPlan,
    ScaleDownPolicy,
    ScaleUpPlan,
    plan_scale_down,
    plan_scale_up,
)
from gpuops.accounting.quantity import parse_quantity
from gpuops.controllers.apigroup import API_VERSION
from gpuops.controllers.coexistence import CONDITION, DO_NOT_DISRUPT, conflict_to_write, power_off_hold
from gpuops.controllers.scheduling import INDEX_UNSCHEDULABLE, unschedulable
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result, requeue_at
from gpuops.kube.errors import ApiError, Conflict, NotFound
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import INDEX_NAMESPACE, INDEX_NODE, Informer
from gpuops.kube.objects import Condition, Node, Pod, PodDisruptionBudget, Taint
from gpuops.kube.redact import SECRET_VALUES
from gpuops.kube.resources import NODES, PODS, SECRETS
from gpuops.kube.selectors import SelectorError, compile_selector
from gpuops.kube.times import format_time, wall_clock
from gpuops.kube.times import parse_time_or_none as _t

from .api import (
    GROUPS,
    KIND,
    GPUNodeGroup,
    GroupStatus,
    LastWebhook,
    PendingTransition,
    SpecError,
    Webhook,
    check_spec,
    plain_http_credentials,
    secret_refs,
)
from .demand import NodeView, demand, gpu_request, is_unschedulable, uses_gpus
from .metrics import BOOT_TIMEOUTS, DECISION_SECONDS, IDLE_GPU_SECONDS, PLAN_SECONDS, REFUSALS
from .power import WEBHOOK_REQUESTS, Endpoint, Outcome, PowerClient, Transition, display_url, idempotency_key
from .settings import Settings

__all__ = ["DRAIN_TAINT", "PLAN", "Autoprovisioner", "Observed", "Settings", "wall_clock"]

log = structlog.get_logger("gpuops.controllers.autoprovision")

PLAN = Request("", "~plan")
"""The planner's work item ("~" cannot start a group name, so it never collides with one)."""
DRAIN_TAINT = "gpuops.io/power-off"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
INDEX_GROUP_NODE = "gpuops.io/group-node"
_SECOND = 1_000_000
_STATE = {"Off": NodeState.OFF, "PoweringOn": NodeState.POWERING_ON, "Ready": NodeState.READY,
          "Draining": NodeState.DRAINING, "PoweringOff": NodeState.POWERING_OFF}



@dataclass(frozen=True, slots=True)
class _Hold:
    """No new request for a transition before `until` (µs) after its webhook failed. Kept in memory because the
    status write that records the failure wakes the group at once: a requeue delay alone would not hold it.
    `identity` is (transition key, generation): a new decision or a fixed spec is tried at once."""

    identity: tuple[str, int]
    until: int
    refusals: int


@dataclass(frozen=True, slots=True)
class Observed:
    node: Node | None
    ready: bool
    gpus: Fraction
    """Allocatable GPUs of the group's resource (0 until the device plugin is up)."""
    gpu_pods: int
    used: Fraction


def _node_ready(node: Node | None) -> bool:
    return node is not None and cond.is_true(node.status.conditions, "Ready")


@dataclass(eq=False, repr=False)
class Autoprovisioner:
    """Decides and performs power transitions for GPUNodeGroups. `controller` is set by `install`: decisions
    enqueue the group they concern at once."""

    client: Client
    groups: Informer[GPUNodeGroup]
    nodes: Informer[Node]
    pods: Informer[Pod]
    recorder: EventRecorder
    power: PowerClient
    _: KW_ONLY
    pdbs: Informer[PodDisruptionBudget] | None = None
    settings: Settings = field(default_factory=Settings)
    clock: Callable[[], int] = wall_clock
    controller: Controller | None = field(default=None, init=False)
    _idle_mark: dict[str, int] = field(default_factory=dict, init=False)
    _holds: dict[str, _Hold] = field(default_factory=dict, init=False)
    """Group uid -> the wait after its last failed webhook call."""
    _conflicts: set[str] = field(default_factory=set, init=False)
    """Groups whose status write lost to a newer version in this reconcile."""
    _pending_since: dict[str, float] = field(default_factory=dict, init=False)
    """When this process first saw each pending pod Unschedulable (monotonic), for DECISION_SECONDS."""

    def __post_init__(self) -> None:
        self.groups.add_index(INDEX_GROUP_NODE, lambda g: (g.spec.node_name,) if g.spec.node_name else ())
        self.pods.add_index(INDEX_UNSCHEDULABLE, unschedulable)  # plan() reads demand from it, never every pod

    # ------------------------------------------------------------------------------------------ mappers

    def _group_of(self, node_name: str) -> list[Request]:
        return [Request("", g.metadata.name) for g in self.groups.store.by_index(INDEX_GROUP_NODE, node_name)]

    def map_pod(self, pod: Pod) -> list[Request]:
        """Unschedulable pods are demand; pods on a managed node change its business (idle, draining)."""
        out = self._group_of(pod.spec.node_name) if pod.spec.node_name else []
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        pending = is_unschedulable(pod)
        if pending:
            self._pending_since.setdefault(key, time.monotonic())
        else:
            self._pending_since.pop(key, None)
        if out or pending:
            out.append(PLAN)
        return out

    def map_deleted_pod(self, pod: Pod) -> list[Request]:
        self._pending_since.pop(f"{pod.metadata.namespace}/{pod.metadata.name}", None)
        return self.map_pod(pod) if pod.spec.node_name else [PLAN]

    def map_node(self, node: Node) -> list[Request]:
        out = self._group_of(node.metadata.name)
        return [*out, PLAN] if out else []

    def map_group(self, group: GPUNodeGroup) -> list[Request]:
        """The group, the plan, and the other groups naming its node (one of them may manage it now)."""
        rivals = [r for r in self._group_of(group.spec.node_name) if r.name != group.metadata.name]
        return [Request("", group.metadata.name), *rivals, PLAN]

    def owner(self, group: GPUNodeGroup) -> GPUNodeGroup:
        """Of the groups naming one node, the one created first (then by name) manages it: two groups driving
        one machine would power it on and off against each other. The others wait (Ready=False, NodeClaimed)."""
        rivals = [g for g in self.groups.store.by_index(INDEX_GROUP_NODE, group.spec.node_name)
                  if not g.metadata.deletion_timestamp]
        return min([group, *rivals], key=_seniority)

    # ------------------------------------------------------------------------------------------ observing

    def observe(self, group: GPUNodeGroup) -> Observed:
        spec = group.spec
        node = self.nodes.store.get(spec.node_name)
        gpus = Fraction(0)
        if node is not None:
            raw = (node.status.allocatable or {}).get(spec.gpu_resource_name)
            if raw is not None:
                try:
                    gpus = parse_quantity(str(raw))
                except Exception:
                    gpus = Fraction(0)
        busy = [p for p in self.pods.store.by_index(INDEX_NODE, spec.node_name) if uses_gpus(p, spec.gpu_resource_name)]
        used = sum((gpu_request(p, spec.gpu_resource_name) for p in busy), Fraction(0))
        return Observed(node, _node_ready(node), gpus, len(busy), used)

    def blocker(self, group: GPUNodeGroup) -> str | None:
        """Why this idle node must not be drained (cluster-autoscaler's and Karpenter's rules), or None."""
        hold = power_off_hold(self.nodes.store.get(group.spec.node_name))
        if hold is not None:
            return hold[1]
        for pod in self.pods.store.by_index(INDEX_NODE, group.spec.node_name):
            if pod.status.phase in ("Succeeded", "Failed") or _daemon(pod):
                continue
            ann = pod.metadata.annotations or {}
            ref = f"{pod.metadata.namespace}/{pod.metadata.name}"
            if ann.get(SAFE_TO_EVICT) == "false":
                return f"pod {ref} has {SAFE_TO_EVICT}=false"
            if ann.get(DO_NOT_DISRUPT) == "true":
                return f"pod {ref} has {DO_NOT_DISRUPT}=true"
            if self.pdbs is not None:
                for pdb in self.pdbs.store.by_index(INDEX_NAMESPACE, pod.metadata.namespace):
                    if pdb.status.disruptions_allowed > 0 or pdb.spec.selector is None:
                        continue
                    try:
                        selector = compile_selector(pdb.spec.selector, allow_empty=True)
                    except SelectorError:
                        continue
                    if selector.matches(pod.metadata.labels):
                        return f"pod {ref} is protected by PodDisruptionBudget {pdb.metadata.name} (0 allowed)"
        return None

    # ------------------------------------------------------------------------------------------ reconcile

    async def reconcile(self, req: Request) -> Result | None:
        if req == PLAN:
            return await self.plan()
        group = self.groups.store.get(req.name)
        if group is None or group.metadata.deletion_timestamp:
            return None
        try:
            check_spec(group.spec)
        except SpecError as e:
            await self._refuse(group, "InvalidSpec", str(e))
            return None
        refusal = self._refusal(group)
        if refusal is not None:
            await self._refuse(group, *refusal)
            return None
        owner = self.owner(group)
        if owner.metadata.uid != group.metadata.uid:
            await self._refuse(group, "NodeClaimed", f"node {group.spec.node_name} is managed by GPUNodeGroup"
                               f" {owner.metadata.name}, created earlier; give this group another spec.nodeName"
                               " or delete one of the two")
            return None
        if group.status.state and await self._report_conflict(group):
            return Result(requeue=True)  # a condition-only write wakes no one: drive on the written version
        self._conflicts.discard(group.metadata.name)
        result = await self.drive(group)
        if group.metadata.name in self._conflicts:
            # our cached copy was behind (the planner wrote a decision meanwhile): status-only updates do not
            # wake a group, so look again once the cache has the newer version instead of waiting for an event
            self._conflicts.discard(group.metadata.name)
            return Result(requeue=True)
        return result

    async def _report_conflict(self, group: GPUNodeGroup) -> bool:
        """ConflictDetected from the marks other autoscalers (or users) put on the node (`power_off_hold`), with a
        Warning Event when it starts or changes. True when the status was written."""
        hold = power_off_hold(self.nodes.store.get(group.spec.node_name))
        want = conflict_to_write(group.status.conditions, hold,
                                 "nothing keeps the node from being powered off when idle")
        if want is None or not await self._write(group, self._with_condition(group, CONDITION, *want)):
            return False
        if want.status == "True":
            self.recorder.record(group, "Warning", want.reason, want.message, kind=KIND, api_version=API_VERSION)
            log.warning("node kept powered on for another controller", group=group.metadata.name, reason=want.reason)
        return True

    def _refusal(self, group: GPUNodeGroup) -> tuple[str, str] | None:
        """(reason, message) when the group's credentials may not be used: a Secret outside the operator's
        namespaces, or a token that would go over plain HTTP without the spec allowing it."""
        try:
            self.settings.secret_scope.check_all(secret_refs(group.spec), KIND)
        except SpecError as e:
            return "SecretNotAllowed", str(e)
        for where, hook in plain_http_credentials(group.spec):
            if not hook.insecure_allow_http:
                return "InsecureTransport", (f"{where}.url: the token of {where}.secretRef would go over plain HTTP; "
                                             f"use an https URL, or set {where}.insecureAllowHTTP: true for a "
                                             "loopback or trusted network")
        return None

    async def _refuse(self, group: GPUNodeGroup, reason: str, message: str) -> None:
        """A group we cannot act on: Ready=False naming why, and (when that is news) a Warning Event and a log."""
        current = cond.get_condition(group.status.conditions, "Ready")
        news = current is None or (current.status, current.reason, current.message) != ("False", reason, message)
        if await self._write(group, self._with_condition(group, "Ready", "False", reason, message)) and news:
            self.recorder.record(group, "Warning", reason, message, kind=KIND, api_version=API_VERSION)
            log.warning("node group not managed", group=group.metadata.name, reason=reason, error=message)

    # ------------------------------------------------------------------------------------------ the planner

    async def plan(self) -> Result | None:
        """The cluster-wide decision: which groups to power on for the unschedulable GPU pods and which idle
        ones to power off. Each decision is written to its group's status before anything is sent."""
        now = self.clock()
        s = self.settings
        by_node = self._managed_by_node()
        valid = list(by_node.values())
        wake: list[int] = []
        nodes, views = self._plan_inputs(valid, now, wake)
        # the index holds only the pods the scheduler gave up on (a scan of every pod cost O(pods) per plan);
        # in name order, so the plan does not depend on the index's set order
        waiting = sorted(self.pods.store.by_index(INDEX_UNSCHEDULABLE, ""),
                         key=lambda p: (p.metadata.namespace, p.metadata.name))
        pending = demand(waiting, views)
        started = time.perf_counter()
        up = plan_scale_up(nodes, pending)
        policy = ScaleDownPolicy(min_warm_gpus=s.min_warm_gpus, max_concurrent_power_offs=s.max_concurrent_power_offs,
                                 unneeded_time=0, scale_up_cooldown=0)
        held = self._kept_on(nodes, by_node)
        down = plan_scale_down(nodes, now=now, policy=policy, needed={*up.placements.values(), *held})
        PLAN_SECONDS.observe(time.perf_counter() - started)
        lost = await self._decide_all(up, down, by_node, now)
        for u in up.unschedulable:
            log.debug("pending pod fits no managed node", pod=u.pod, reason=str(u.reason))
        wake += await self._track_idle(valid, now)
        if lost:  # the event that made the group newer may be the one that started this plan: nothing else wakes it
            return Result(requeue=True)
        return requeue_at(now, wake)

    def _managed_by_node(self) -> dict[str, GPUNodeGroup]:
        """The group that manages each node: valid, allowed its credentials, not being deleted, and the first of
        the groups naming the node (`owner`)."""
        by_node: dict[str, GPUNodeGroup] = {}
        for g in sorted(self.groups.store.list(), key=_seniority):
            try:
                check_spec(g.spec)
            except SpecError:
                continue
            if self._refusal(g) is not None:
                continue
            if not g.metadata.deletion_timestamp:
                by_node.setdefault(g.spec.node_name, g)
        return by_node

    def _plan_inputs(self, valid: list[GPUNodeGroup], now: int,
                     wake: list[int]) -> tuple[list[GpuNode], list[NodeView]]:
        """The groups as the planner sees them, and as pending pods' selectors and tolerations see their nodes;
        adds their wake-ups. A group whose data cannot be planned is left out with a Warning Event."""
        last_up = max((t for g in valid if (t := _t(g.status.last_scale_up)) is not None), default=None)
        nodes: list[GpuNode] = []
        views: list[NodeView] = []
        for g in valid:
            try:
                planned = self._planned(g, now, last_up, wake)
            except Exception as e:  # one group's data must not stop the plan of every other group
                log.exception("node group left out of the plan", group=g.metadata.name, error=str(e))
                self.recorder.record(g, "Warning", "PlanningFailed", f"left out of the power plan: {e}",
                                     kind=KIND, api_version=API_VERSION)
                continue
            if planned is not None:
                nodes.append(planned[0])
                views.append(planned[1])
        return nodes, views

    def _kept_on(self, nodes: list[GpuNode], by_node: dict[str, GPUNodeGroup]) -> dict[str, str]:
        """Idle Ready nodes that must not be drained (`blocker`), with why."""
        held = {n.name: why for n in nodes if n.state is NodeState.READY and n.gpu_pods == 0
                and (why := self.blocker(by_node[n.name])) is not None}
        for name, why in held.items():
            log.debug("idle node kept on", node=name, reason=why)
        return held

    async def _decide_all(self, up: ScaleUpPlan, down: ScaleDownPlan, by_node: dict[str, GPUNodeGroup],
                          now: int) -> bool:
        """Write every power-on, then every power-off decision. True when a write lost to a newer version of
        its group: plan again once the cache has it."""
        lost = False
        for name in up.power_on:
            g = by_node[name]
            pods = sorted(p for p, n in up.placements.items() if n == name)
            if await self._decide(g, "up", now, f"{len(pods)} pending pod(s) fit: {', '.join(pods[:5])}"):
                decided = time.monotonic()
                for p in pods:
                    if (seen := self._pending_since.pop(p, None)) is not None:
                        DECISION_SECONDS.observe(decided - seen)
            else:
                lost = self._lost_to_conflict(g) or lost
        for name in down.power_off:
            if not await self._decide(by_node[name], "down", now, "no GPU pods for scaleDownUnneededSeconds"):
                lost = self._lost_to_conflict(by_node[name]) or lost
        return lost

    def _lost_to_conflict(self, group: GPUNodeGroup) -> bool:
        if group.metadata.name in self._conflicts:
            self._conflicts.discard(group.metadata.name)
            return True
        return False

    def _planned(self, g: GPUNodeGroup, now: int, last_up: int | None,
                 wake: list[int]) -> tuple[GpuNode, NodeView] | None:
        """The group as the planner sees it (None while a failed power-on backs off); adds its wake-ups."""
        st, spec = g.status, g.spec
        state = st.state or "Off"
        if state == "Failed":
            until = _t(st.backoff_until)
            if until is not None and now < until:
                wake.append(until)
                return None
            state = "Off"
        obs = self.observe(g)
        capacity = obs.gpus if obs.ready and obs.gpus > 0 else Fraction(spec.gpu_count)
        idle_since = _t(st.idle_since) if state == "Ready" and obs.gpu_pods == 0 else None
        if idle_since is not None:  # this group's own thresholds decide when it may go
            due = idle_since + spec.scale_down_unneeded_seconds * _SECOND
            if last_up is not None:
                due = max(due, last_up + spec.scale_down_delay_after_scale_up_seconds * _SECOND)
            if now < due:
                wake.append(due)
                idle_since = None
        node = GpuNode(name=spec.node_name, capacity=capacity, state=_STATE[state], used=obs.used,
                       gpu_pods=obs.gpu_pods, idle_since=idle_since, priority=spec.priority)
        view = NodeView.of(g.metadata.name, spec.node_name, spec.gpu_resource_name, obs.node,
                           spec.template.labels, spec.template.taints, DRAIN_TAINT, ready=obs.ready)
        return node, view

    async def _decide(self, group: GPUNodeGroup, direction: str, now: int, why: str) -> bool:
        spec = group.spec
        stamp = format_time(now)
        key = idempotency_key(spec.node_name, direction, group.metadata.generation, stamp)
        transition = PendingTransition(direction="up" if direction == "up" else "down", key=key, decided_at=stamp)
        if direction == "up":
            status = msgspec.structs.replace(
                group.status, state="PoweringOn", since=stamp, transition=transition, last_scale_up=stamp,
                boot_deadline=format_time(now + spec.boot_timeout_seconds * _SECOND), idle_since=None)
            reason, message = "PowerOnDecided", f"powering on {spec.node_name} ({spec.gpu_count} GPUs): {why}"
        else:
            status = msgspec.structs.replace(group.status, state="Draining", since=stamp, transition=transition)
            reason, message = "PowerOffDecided", f"powering off {spec.node_name}: {why}"
        status = _condition(status, group, "Ready", "False", reason, message)  # no longer what it said before
        try:
            written = await self._write(group, status)
        except Exception as e:  # a lost answer: the write may have landed, and its key be sent by a later turn
            log.warning("power transition decided", group=group.metadata.name, node=spec.node_name,
                        direction=direction, key=key, why=why, outcome="status write unconfirmed", error=str(e))
            raise
        if not written:
            return False
        if self.controller is not None:  # do not wait for the status event alone to bring the group's turn
            self.controller.enqueue(Request("", group.metadata.name), trigger=f"power {direction} decided")
        self.recorder.record(group, "Normal", reason, message, kind=KIND, api_version=API_VERSION)
        log.info("power transition decided", group=group.metadata.name, node=spec.node_name,
                 direction=direction, key=key, why=why)
        return True

    async def _track_idle(self, groups: list[GPUNodeGroup], now: int) -> list[int]:
        """Persist since when each Ready group has had no GPU pods (a restart keeps the count), and add the idle
        GPU-seconds since the last plan to IDLE_GPU_SECONDS. Returns when newly idle groups may be powered off."""
        wake: list[int] = []
        for g in groups:
            name = g.metadata.name
            if (g.status.state or "Off") != "Ready":
                self._idle_mark.pop(name, None)
                continue
            idle = self.observe(g).gpu_pods == 0
            since = _t(g.status.idle_since)
            if idle and since is not None:
                mark = max(since, self._idle_mark.get(name, since))
                if now > mark:
                    IDLE_GPU_SECONDS.inc(g.spec.gpu_count * (now - mark) / _SECOND)
                self._idle_mark[name] = now
            else:
                self._idle_mark.pop(name, None)
            if idle and g.status.idle_since is None:
                await self._write(g, msgspec.structs.replace(g.status, idle_since=format_time(now)))
                wake.append(now + g.spec.scale_down_unneeded_seconds * _SECOND)
            elif not idle and g.status.idle_since is not None:
                await self._write(g, msgspec.structs.replace(g.status, idle_since=None))
        return wake

    # ------------------------------------------------------------------------------------------ one group

    async def drive(self, group: GPUNodeGroup) -> Result | None:
        """One step of the group's state machine (see the module docstring)."""
        now = self.clock()
        state = group.status.state or "Off"
        obs = self.observe(group)
        up = obs.ready and obs.gpus > 0
        if not group.status.state or _refused(group):  # first sight (or first since it was refused)
            return await self._first_sight(group, now, up)
        if state == "PoweringOn":
            return await self._powering_on(group, obs, now, up)
        if state == "Failed":
            return await self._failed(group, now, up)
        if state == "Draining":
            return await self._drain(group, obs, now)
        if state == "PoweringOff":
            return await self._powering_off(group, obs, now)
        # Off and Ready follow the node
        if state == "Off" and up:
            await self._become(group, now, "Ready", "NodeReady", f"{group.spec.node_name} is up (not by us)")
        elif state == "Ready" and obs.node is None:
            await self._become(group, now, "Off", "NodeGone", f"{group.spec.node_name} left the cluster",
                               idle_since=None)
        return None

    async def _first_sight(self, group: GPUNodeGroup, now: int, up: bool) -> Result | None:
        """Say where a group stands that we had not managed yet: Ready or Off, after its node."""
        if up:
            await self._become(group, now, "Ready", "NodeReady", f"{group.spec.node_name} is up")
        else:
            await self._become(group, now, "Off", "Observed", f"{group.spec.node_name} is not up; it is powered"
                               " on when pending GPU pods need it")
        return None

    async def _request(self, group: GPUNodeGroup, hook: Webhook, tr: PendingTransition, now: int) -> Result | None:
        """Call the transition's webhook unless a failed call's wait is still due; a failure waits again."""
        if (held := self._held(group, tr, now)) is not None:
            return held
        outcome = await self._send(group, hook, tr)
        if not outcome.ok:
            return await self._webhook_failed(group, tr, outcome, now)
        return None  # the status write brings us back

    async def _powering_on(self, group: GPUNodeGroup, obs: Observed, now: int, up: bool) -> Result | None:
        """POST scale-up once, then Ready when the node is up with its GPUs, or Failed past the boot deadline."""
        st = group.status
        tr = st.transition
        if tr is not None and tr.direction == "up" and not tr.sent and not up:
            return await self._request(group, group.spec.scale_up, tr, now)
        if up:
            await self._become(group, now, "Ready", "NodeReady",
                               f"{group.spec.node_name} is Ready with {obs.gpus} GPUs allocatable",
                               transition=None, boot_deadline=None, failures=0, backoff_until=None)
            await self._untaint(obs.node)
            return None
        deadline = _t(st.boot_deadline)
        if deadline is not None and now >= deadline:
            await self._boot_timed_out(group, now)
            return None
        return requeue_at(now, [deadline])

    async def _boot_timed_out(self, group: GPUNodeGroup, now: int) -> None:
        """Failed, backing off (doubling per consecutive timeout) before the machine is offered again."""
        failures = group.status.failures + 1
        pause = min(self.settings.boot_backoff_max, self.settings.boot_backoff_base * 2 ** (failures - 1))
        if await self._become(group, now, "Failed", "BootTimeout",
                              f"{group.spec.node_name} was not Ready with GPUs within "
                              f"{group.spec.boot_timeout_seconds}s of the power-on; another machine may be "
                              f"tried; this one is offered again in {pause:g}s", warning=True,
                              transition=None, failures=failures,
                              backoff_until=format_time(now + round(pause * _SECOND))):
            BOOT_TIMEOUTS.inc()  # once per timeout: a write lost to a conflict is retried, not counted

    async def _failed(self, group: GPUNodeGroup, now: int, up: bool) -> Result | None:
        """Ready if the machine came up after all; Off (offered to the planner again) once the backoff is over."""
        if up:
            await self._become(group, now, "Ready", "NodeReady", f"{group.spec.node_name} came up late",
                               failures=0, backoff_until=None)  # it boots after all: a later timeout starts over
            return None
        until = _t(group.status.backoff_until)
        if until is None or now >= until:
            await self._become(group, now, "Off", "BackoffOver", "offered to the planner again")
            return None
        return requeue_at(now, [until])

    async def _powering_off(self, group: GPUNodeGroup, obs: Observed, now: int) -> Result | None:
        """POST scale-down once, then Off when the node is NotReady or gone."""
        tr = group.status.transition
        if tr is not None and tr.direction == "down" and not tr.sent:
            return await self._request(group, group.spec.scale_down, tr, now)
        if obs.node is None or not obs.ready:
            await self._become(group, now, "Off", "PoweredOff", f"{group.spec.node_name} is down",
                               transition=None, idle_since=None)
            return None
        return Result(requeue_after=self.settings.off_recheck)

    async def _drain(self, group: GPUNodeGroup, obs: Observed, now: int) -> Result | None:
        tr = group.status.transition
        hold = power_off_hold(obs.node)
        if hold is not None:  # marked after the decision: the mark wins, the machine stays on
            await self._untaint(obs.node)
            await self._become(group, now, "Ready", "PowerOffAborted", f"{group.spec.node_name} stays on: {hold[1]}",
                               transition=None)
            return None
        if obs.gpu_pods > 0:  # a GPU pod got there first: keep the node
            await self._untaint(obs.node)
            await self._become(group, now, "Ready", "PowerOffAborted",
                               f"a GPU pod is on {group.spec.node_name}; it stays on", transition=None)
            return None
        node = obs.node
        if node is not None:
            if await self._taint(node):
                # just tainted: a pod the scheduler placed before it saw the taint may still be binding there
                return Result(requeue_after=self.settings.drain_recheck)
            # the cache can lag a binding by seconds under load: a node powered off with a pod bound to it a
            # moment ago strands that pod (chaos/ha_failover.py at full size). A live read decides.
            on_node = await self._pods_on(node.metadata.name)
            if any(uses_gpus(p, group.spec.gpu_resource_name) for p in on_node):
                await self._untaint(node)
                await self._become(group, now, "Ready", "PowerOffAborted",
                                   f"a GPU pod is on {group.spec.node_name}; it stays on", transition=None)
                return None
            left = [p for p in on_node if p.status.phase not in ("Succeeded", "Failed") and not _daemon(p)]
            for p in left:
                if p.metadata.deletion_timestamp:
                    continue
                try:
                    await self.client.evict(p.metadata.name, p.metadata.namespace)
                except NotFound:
                    pass
                except ApiError as e:
                    log.info("eviction refused while draining", pod=f"{p.metadata.namespace}/{p.metadata.name}",
                             error=str(e))
            if left:
                return Result(requeue_after=self.settings.drain_recheck)
        if tr is None or tr.direction != "down":
            return None
        await self._become(group, now, "PoweringOff", "Drained", f"{group.spec.node_name} has no pods left")
        return None

    # ------------------------------------------------------------------------------------------ side effects

    async def _send(self, group: GPUNodeGroup, hook: Webhook, tr: PendingTransition) -> Outcome:
        try:
            endpoint = await self._endpoint(hook)
        except (ValueError, ApiError) as e:  # a bad URL, header or Secret: nothing is sent, the user must fix it
            where = "spec.scaleUp" if tr.direction == "up" else "spec.scaleDown"
            WEBHOOK_REQUESTS.labels(tr.direction, "unsent").inc()  # counted, so that its alert fires for this too
            outcome = Outcome(ok=False, status=None, attempts=0, retryable=isinstance(e, ApiError),
                              error=f"{where}: cannot call the webhook: {e}", finished_at=time.time())
            url = display_url(hook.url)
            log.warning("power webhook not sent", group=group.metadata.name, direction=tr.direction, url=url,
                        error=outcome.error)
        else:
            outcome = await self.power.send(endpoint, Transition(group.spec.node_name, tr.direction, tr.key,
                                                                 first_attempt=tr.attempts + 1))
            url = endpoint.display_url
        done = msgspec.structs.replace(tr, attempts=tr.attempts + outcome.attempts, sent=outcome.ok)
        result = (str(outcome.status) if outcome.status is not None
                  else "unsent" if not outcome.attempts else "no answer")
        last = LastWebhook(direction=tr.direction, url=url, code=outcome.status,
                           time=format_time(round(outcome.finished_at * _SECOND)), attempt=done.attempts,
                           error=outcome.error)
        status = msgspec.structs.replace(group.status, transition=done, last_webhook=last, webhook=result)
        node, up = group.spec.node_name, tr.direction == "up"
        doing = "powering on" if up else "powering off"
        if outcome.ok:
            self._holds.pop(group.metadata.uid, None)
            status = _condition(status, group, "WebhookFailing", "False", "Accepted",
                                f"{tr.direction} request accepted (HTTP {outcome.status})")
            status = _condition(status, group, "Ready", "False", "PowerOnDecided" if up else "PowerOffDecided",
                                f"{doing} {node}: the webhook accepted the request; waiting for the machine")
        else:
            again = "retried" if outcome.retryable else "retried ever more rarely until the spec changes"
            status = _condition(status, group, "WebhookFailing", "True",
                                "Retrying" if outcome.retryable else "Refused", outcome.error)
            status = _condition(status, group, "Ready", "False", "WebhookFailed",
                                f"{doing} {node} is failing: the webhook call did not succeed ({outcome.error});"
                                f" {again}")
        status = _transport_condition(status, group)
        await self._write(group, status)  # one write: what was sent, and how it went
        return outcome

    async def _webhook_failed(self, group: GPUNodeGroup, tr: PendingTransition, outcome: Outcome,
                              now: int) -> Result | None:
        self.recorder.record(group, "Warning", "WebhookFailed", outcome.error, kind=KIND, api_version=API_VERSION)
        identity = (tr.key, group.metadata.generation)
        prev = self._holds.get(group.metadata.uid)
        refusals = prev.refusals + 1 if prev is not None and prev.identity == identity else 1
        s = self.settings
        if not outcome.retryable:  # a configuration problem: said in the condition; retried ever more rarely
            wait = min(s.refused_backoff_max, s.refused_backoff_base * 2 ** (refusals - 1))
        else:  # the client already retried with backoff; try the whole call again after a pause
            wait = max(s.webhook_retry, outcome.retry_after or 0.0)
        until = max(now, self.clock()) + round(wait * _SECOND)
        self._holds[group.metadata.uid] = _Hold(identity, until, refusals)
        return requeue_at(now, [until])

    def _held(self, group: GPUNodeGroup, tr: PendingTransition, now: int) -> Result | None:
        """The wait still due for this transition after a failed call (None: call now)."""
        hold = self._holds.get(group.metadata.uid)
        if hold is None or hold.identity != (tr.key, group.metadata.generation) or now >= hold.until:
            return None
        return requeue_at(now, [hold.until])

    async def _endpoint(self, hook: Webhook) -> Endpoint:
        token: str | None = None
        key: bytes | None = None
        ref = hook.secret_ref
        if ref is not None:
            self.settings.secret_scope.check("secretRef", ref.namespace, KIND)  # never read one out of scope
            if hook.url.lower().startswith("http://") and not hook.insecure_allow_http:
                raise ValueError("the token would go over plain HTTP; use an https URL or set insecureAllowHTTP")
            secret = await self.client.get(SECRETS, ref.name, ref.namespace)
            data = secret.data or {}
            if ref.token_key not in data and ref.hmac_key_key not in data:
                raise ValueError(f"Secret {ref.namespace}/{ref.name} has neither key {ref.token_key!r} nor "
                                 f"{ref.hmac_key_key!r}; add one, or set secretRef.tokenKey/hmacKeyKey")
            try:
                if ref.token_key in data:
                    token = base64.b64decode(data[ref.token_key], validate=True).decode().strip()
                if ref.hmac_key_key in data:
                    key = base64.b64decode(data[ref.hmac_key_key], validate=True)
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"Secret {ref.namespace}/{ref.name}: a value is not valid base64 text: {e}") from None
            SECRET_VALUES.add(*(v for v in (token, key) if v))  # scrubbed from every status, Event, log and metric
        return Endpoint(hook.url, headers=dict(hook.headers or {}), token=token, hmac_key=key,
                        timeout=float(hook.timeout_seconds))

    async def _taint(self, node: Node) -> bool:
        """Add the drain taint; True if it was not there yet."""
        taints = list(node.spec.taints or ())
        if any(t.key == DRAIN_TAINT for t in taints):
            return False
        taints.append(Taint(key=DRAIN_TAINT, value="draining", effect="NoSchedule"))
        await self._set_taints(node, taints)
        return True

    async def _pods_on(self, node: str) -> list[Pod]:
        """The node's pods as the API server has them now (every page)."""
        out: list[Pod] = []
        token: str | None = None
        while True:
            meta, items = await self.client.list(PODS, field_selector=f"spec.nodeName={node}", limit=500,
                                                 continue_=token)
            out.extend(items)
            token = meta.continue_
            if not token:
                return out

    async def _untaint(self, node: Node | None) -> None:
        if node is None or not any(t.key == DRAIN_TAINT for t in node.spec.taints or ()):
            return
        await self._set_taints(node, [t for t in node.spec.taints or () if t.key != DRAIN_TAINT])

    async def _set_taints(self, node: Node, taints: list[Taint]) -> None:
        body = {"metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": msgspec.to_builtins(taints) or None}}
        try:
            await self.client.patch(NODES, node.metadata.name, body)
        except (Conflict, NotFound) as e:
            log.debug("node taint update skipped", node=node.metadata.name, error=str(e))

    async def _become(self, group: GPUNodeGroup, now: int, state: str, reason: str, message: str, *,
                      warning: bool = False, **changes: Any) -> bool:
        """Move the group to `state`; False if the write lost a race (the group's next event brings us back)."""
        stamp = format_time(now)
        status = msgspec.structs.replace(group.status, state=state, since=stamp, **changes)
        status = _condition(status, group, "Ready", "True" if state == "Ready" else "False", reason, message)
        if not await self._write(group, status):
            return False
        self.recorder.record(group, "Warning" if warning else "Normal", reason, message, kind=KIND,
                             api_version=API_VERSION)
        log.info("node group state", group=group.metadata.name, state=state, reason=reason)
        return True

    def _with_condition(self, group: GPUNodeGroup, type: str, status: str, reason: str, message: str) -> GroupStatus:
        return _condition(group.status, group, type, status, reason, message)

    async def _write(self, group: GPUNodeGroup, status: GroupStatus) -> bool:
        """Write the whole status, guarded by resourceVersion; False if the group changed or went (its event
        brings us back)."""
        status = msgspec.structs.replace(status, observed_generation=group.metadata.generation,
                                         state=status.state or "Off", webhook=status.webhook or "none")
        if status == group.status:
            return True
        # PUT, not a merge patch: our types leave defaults out, and a merge patch would keep the old values of
        # every field that went back to its default (a new transition inheriting the last one's `sent`)
        try:
            await self.client.replace(GROUPS, msgspec.structs.replace(group, status=status), subresource="status")
        except (Conflict, NotFound) as e:
            log.debug("group status write skipped", group=group.metadata.name, error=str(e))
            if isinstance(e, Conflict):
                self._conflicts.add(group.metadata.name)
            return False
        return True


_REFUSALS = REFUSALS
"""Ready reasons of a group we do not manage (see `Autoprovisioner._refuse`)."""


def _refused(group: GPUNodeGroup) -> bool:
    ready = cond.get_condition(group.status.conditions, "Ready")
    return ready is not None and ready.status == "False" and ready.reason in _REFUSALS


def _seniority(group: GPUNodeGroup) -> tuple[str, bool, str]:
    """Order of the claims on a node: created first; within a second (timestamps are whole seconds), the group
    already managing it (observed by us, not refused) keeps it; then by name."""
    managing = bool(group.status.state) and not _refused(group)
    return (group.metadata.creation_timestamp or "", not managing, group.metadata.name)


def _transport_condition(status: GroupStatus, group: GPUNodeGroup) -> GroupStatus:
    """InsecureTransport=True while a token goes over plain HTTP (the spec allows it); False once none does."""
    insecure = [where for where, _ in plain_http_credentials(group.spec)]
    if insecure:
        return _condition(status, group, "InsecureTransport", "True", "PlainHTTP",
                          f"the token of {' and '.join(insecure)} goes over plain HTTP (insecureAllowHTTP)")
    current = cond.get_condition(status.conditions, "InsecureTransport")
    if current is not None and current.status != "False":
        return _condition(status, group, "InsecureTransport", "False", "HTTPS", "no token goes over plain HTTP")
    return status


def _condition(status: GroupStatus, group: GPUNodeGroup, type: str, value: str, reason: str,
               message: str) -> GroupStatus:
    items = cond.set_condition(status.conditions, type, value, reason, message, group.metadata.generation,
                               now=format_time(wall_clock() // _SECOND * _SECOND))
    return msgspec.structs.replace(status, conditions=msgspec.convert(items, tuple[Condition, ...]))


def _daemon(pod: Pod) -> bool:
    return any(r.kind == "DaemonSet" and r.controller for r in pod.metadata.owner_references or ())





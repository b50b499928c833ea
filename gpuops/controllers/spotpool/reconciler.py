"""Reconcile a SpotPool: describe what it owns, settle the pending launch, plan, act, write status.

One reconcile, in order:
  1. Deletion: terminate (or retain) every owned instance, then drop the finalizer.
  2. Spec check, the credentials Secret, the provider (cached per pool until the spec or the Secret changes).
  3. Describe by ownership tag; match instances to Nodes; give joined nodes the pool's label and taints.
  4. The pending launch (`status.pendingLaunch`): resolved once describe lists what it bought; until the cloud
     has answered, it is resent with the same client token and parameters, so it is bought once.
  5. Plan (`gpuops.accounting.pool.plan_pool`): instances under a reclaim notice or leaving are not capacity,
     so their replacement is launched in the same reconcile that first sees the notice: the first node agent
     of a wave to report wakes the pool, and where the cloud's describe lists notices (the webhook contract),
     that describe shows the wave's others before their own agents poll. A new launch intent
     (token derived from the pool's UID and `status.launchSequence`) is written to status before the call.
  6. Scale-in retires the chosen instances after cordon and drain (or drainTimeoutSeconds); LAUNCH_FAILED and
     stopped instances are terminated; nodes under a reclaim notice are drained.
  7. Status (size, ready, instances, conditions) in one write; Events for what a user must see.
"""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from fractions import Fraction
from typing import Any

import msgspec
import structlog

from gpuops.accounting.pool import InstanceState, PoolInstance, PoolPlan, plan_pool
from gpuops.accounting.pool import PoolSpec as PlanSpec
from gpuops.controllers.apigroup import API_VERSION
from gpuops.controllers.coexistence import CONDITION, KARPENTER_NODEPOOL, NO_CONFLICT, karpenter_nodepool
from gpuops.controllers.errors import SpecError
from gpuops.controllers.scheduling import (
    INDEX_UNSCHEDULABLE,
    gpu_request,
    is_unschedulable,
    node_admits,
    unschedulable,
    uses_gpus,
)
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result, requeue_at
from gpuops.kube.errors import ApiError, Conflict, NotFound
from gpuops.kube.events import EventRecorder, EventType
from gpuops.kube.informer import INDEX_NODE, Informer
from gpuops.kube.objects import Condition, Node, Pod
from gpuops.kube.redact import SECRET_VALUES
from gpuops.kube.resources import SECRETS
from gpuops.kube.times import format_time, wall_clock
from gpuops.kube.times import parse_time_or_none as _t

from . import nodes as nd
from .api import (
    FINALIZER,
    KIND,
    POOLS,
    CapacityBackoff,
    InstanceStatus,
    PendingLaunch,
    PoolStatus,
    SpotPool,
    check_spec,
    plain_http,
)
from .metrics import LAUNCHES, REPLACEMENT_SECONDS, TERMINATIONS
from .providers import make_provider
from .providers.base import (
    LAUNCH_ID_TAG,
    MANAGED_BY,
    MANAGED_BY_TAG,
    POOL_TAG,
    CloudInstance,
    ErrorKind,
    LaunchSpec,
    NodeTaint,
    Provider,
    ProviderConfig,
    ProviderError,
)
from .settings import Settings

__all__ = ["INDEX_UNSCHEDULABLE", "Settings", "SpotPoolReconciler", "client_token", "owner_tags", "unschedulable"]

log = structlog.get_logger("gpuops.controllers.spotpool")

_SECOND = 1_000_000
LIVE = frozenset({InstanceState.PENDING, InstanceState.STARTING, InstanceState.RUNNING, InstanceState.REBOOTING})
STOPPED = frozenset({InstanceState.STOPPED, InstanceState.SHUTDOWN})
"""Not capacity and still billed for disks: terminated like LAUNCH_FAILED ones."""


_CALL_FAILED = {
    ErrorKind.TRANSIENT: "CloudUnavailable",
    ErrorKind.THROTTLED: "CloudThrottled",
    ErrorKind.INVALID: "CloudRequestInvalid",
    ErrorKind.QUOTA: "QuotaExceeded",
    ErrorKind.CAPACITY: "InsufficientCapacity",
}
"""Ready=False reasons of a failed cloud call, by its kind."""
_BLOCKING = ("CredentialsInvalid", "QuotaExceeded", "CapacityError")
KARPENTER_NODES = "KarpenterManagedNodes"
"""ConflictDetected reason (and Event reason) of a pool some of whose nodes Karpenter manages too."""
"""Conditions that, while True, say why a pool short of instances is not Ready."""


def owner_tags(pool: SpotPool) -> dict[str, str]:
    return {POOL_TAG: pool.metadata.name, MANAGED_BY_TAG: MANAGED_BY}


def client_token(pool: SpotPool, sequence: int) -> str:
    """Deterministic and at most 64 ASCII characters (the limit of CVM and EC2): the pool's UID and the launch
    number, so a recreated pool of the same name never replays an old pool's launch."""
    return f"{pool.metadata.uid or pool.metadata.name}-{sequence}"[-64:]


@dataclass
class View:
    """One described instance with what the cluster says about it."""

    inst: CloudInstance
    node: Node | None
    ready: bool
    gpu_pods: int
    doomed_at: int | None
    """When a reclaim notice or a state outside our control made it stop counting (None: it counts)."""


@dataclass
class Step:
    """What one reconcile decided to write and when to come back."""

    status: PoolStatus
    wake: list[int | None] = field(default_factory=list)
    events: list[tuple[EventType, str, str]] = field(default_factory=list)
    retiring: dict[str, str] = field(default_factory=dict)

    def event(self, type: EventType, reason: str, message: str) -> None:
        self.events.append((type, reason, message))


@dataclass(eq=False, repr=False)
class SpotPoolReconciler:
    """Keeps each SpotPool between its bounds. `controller` is set by `install`, for delayed enqueues."""

    client: Client
    pools: Informer[SpotPool]
    nodes: Informer[Node]
    pods: Informer[Pod]
    recorder: EventRecorder
    _: KW_ONLY
    settings: Settings = field(default_factory=Settings)
    clock: Callable[[], int] = wall_clock
    provider_factory: Callable[[str, ProviderConfig], Provider] = make_provider
    controller: Controller | None = field(default=None, init=False)
    _providers: dict[tuple[Any, ...], Provider] = field(default_factory=dict, init=False)
    """One provider per account (provider, endpoint, region, Secret version), shared by the pools using it, so
    their calls share its rate-limit buckets as they share the cloud's limit."""
    _uses: dict[str, tuple[Any, ...]] = field(default_factory=dict, init=False)
    """Pool -> the account it uses."""
    _owner_of: dict[str, str] = field(default_factory=dict, init=False)
    """Instance id -> pool, for node events before the node is labelled."""
    _doomed: set[str] = field(default_factory=set, init=False)
    """Instances seen under a reclaim notice or leaving."""
    _awaiting: dict[str, float] = field(default_factory=dict, init=False)
    """Of those, the ones not replaced yet -> monotonic time first seen."""
    _bad_keys: dict[str, tuple[tuple[Any, ...], float]] = field(default_factory=dict, init=False)
    """Pool -> (refused fingerprint, when)."""
    _retry_at: dict[str, int] = field(default_factory=dict, init=False)
    """Pool -> when its pending launch may be resent (microseconds)."""
    _failures: dict[str, int] = field(default_factory=dict, init=False)
    """Pool -> cloud calls failed in a row (the retry backs off on it)."""
    _rng: random.Random = field(default_factory=random.Random, init=False)

    # ------------------------------------------------------------------------------------------ event mapping

    def map_pool(self, pool: SpotPool) -> list[Request]:
        return [Request("", pool.metadata.name)]

    def map_node(self, node: Node) -> list[Request]:
        pool = (node.metadata.labels or {}).get(nd.POOL_LABEL)
        if pool is None:
            ids = nd.nodes_by_instance(node)
            pool = self._owner_of.get(ids[0]) if ids else None
        return [Request("", pool)] if pool else []

    def map_pod(self, pod: Pod) -> list[Request]:
        """A pod on a pool's node changes how busy it is; an unschedulable GPU pod is demand for the pools that
        scale on demand and could host it."""
        if pod.spec.node_name:
            node = self.nodes.store.get(pod.spec.node_name)
            pool = (node.metadata.labels or {}).get(nd.POOL_LABEL) if node is not None else None
            return [Request("", pool)] if pool else []
        if not is_unschedulable(pod):
            return []
        return [Request("", p.metadata.name) for p in self.pools.store.list()
                if p.spec.scale_on_demand and self._admits(p, pod)]

    # ------------------------------------------------------------------------------------------ reconcile

    async def reconcile(self, req: Request) -> Result | None:
        pool = self.pools.store.get(req.name)
        if pool is None:
            await self._forget(req.name)
            return None
        if pool.metadata.deletion_timestamp:
            return await self._delete(pool)
        if FINALIZER not in (pool.metadata.finalizers or ()):
            await self._set_finalizer(pool, True)
            return None  # the update brings us back
        refusal = self._refusal(pool)
        if refusal is not None:
            step = Step(pool.status)
            self._not_ready(pool, step, *refusal)  # condition; Event and log line when news
            await self._finish(pool, step)
            return None
        try:
            fingerprint, provider = await self._provider(pool)
        except (ProviderError, ApiError) as e:
            return await self._config_error(pool, e)
        refused = self._bad_keys.get(pool.metadata.name)
        if refused is not None:
            if refused[0] == fingerprint and time.monotonic() - refused[1] < self.settings.config_retry:
                return Result(requeue_after=self.settings.secret_recheck)  # same keys: don't ask the cloud again
            del self._bad_keys[pool.metadata.name]
        try:
            instances = await provider.describe(owner_tags(pool))
        except ProviderError as e:
            return await self._call_failed(pool, Step(pool.status), e, "DescribeInstances")
        self._failures.pop(pool.metadata.name, None)
        return await self._converge(pool, provider, instances)

    def _refusal(self, pool: SpotPool) -> tuple[str, str] | None:
        """(reason, message) when the spec cannot be acted on: invalid, or naming a Secret out of scope."""
        try:
            check_spec(pool.spec)
        except SpecError as e:
            return "InvalidSpec", str(e)
        ref = pool.spec.credentials_secret_ref
        try:
            if ref is not None:
                self.settings.secret_scope.check("spec.credentialsSecretRef", ref.namespace, KIND)
        except SpecError as e:
            return "SecretNotAllowed", str(e)
        if ref is not None and plain_http(pool.spec) and not pool.spec.insecure_allow_http:
            return "InsecureTransport", (f"spec.endpoint: the credentials of spec.credentialsSecretRef would go over "
                                         f"plain HTTP to {pool.spec.endpoint}; use an https endpoint, or set "
                                         "spec.insecureAllowHTTP: true for a loopback or trusted network")
        return None

    def _transport_condition(self, pool: SpotPool, step: Step) -> None:
        """InsecureTransport=True while credentials go over plain HTTP (allowed by the spec); False once not."""
        insecure = pool.spec.credentials_secret_ref is not None and plain_http(pool.spec)
        current = cond.get_condition(step.status.conditions, "InsecureTransport")
        if insecure:
            self._condition(step, pool, "InsecureTransport", "True", "PlainHTTP",
                            f"the credentials go over plain HTTP to {pool.spec.endpoint} (spec.insecureAllowHTTP)")
        elif current is not None and current.status != "False":
            self._condition(step, pool, "InsecureTransport", "False", "HTTPS", "no credentials go over plain HTTP")

    async def _converge(self, pool: SpotPool, provider: Provider, instances: list[CloudInstance]) -> Result | None:
        step = Step(msgspec.structs.replace(pool.status, last_error=None))
        self._transport_condition(pool, step)
        try:
            return await self._converge_step(pool, provider, instances, step)
        except Exception:
            self._flush(pool, step)  # what it saw and did stands even if a later write failed
            raise

    async def _converge_step(self, pool: SpotPool, provider: Provider, instances: list[CloudInstance], step: Step
                             ) -> Result | None:
        """Steps 3 to 7 of the module docstring. The cloud calls keep one order: the launch (the pending one
        again, or a new one), then the scale-in's terminate, then the cleanup's."""
        now = self.clock()
        self._condition(step, pool, "CredentialsInvalid", "False", "Authenticated", "the cloud accepted the keys")
        views = await self._match_nodes(pool, instances, step, now)
        pl, in_flight = self._settle_pending_launch(pool, step, views, now)
        plan = self._plan(pool, views, in_flight)
        step.status = msgspec.structs.replace(step.status, desired=plan.target)
        pool, result = await self._launch_as_planned(pool, provider, step, pl, plan.launch, views, now)
        await self._scale_in(pool, provider, step, views, {i for b in plan.retire for i in b}, now)
        await self._report(pool, step, views, plan, now)
        if result is not None:
            return result
        return requeue_at(self.clock(), step.wake)

    async def _match_nodes(self, pool: SpotPool, instances: list[CloudInstance], step: Step, now: int) -> list[View]:
        """Step 3: each described instance with its Node (joined nodes get the pool's label and taints); a
        Reclaimed Event for each newly doomed one; what the cloud no longer lists is forgotten."""
        known = set(self._doomed)
        views = [self._view(pool, i, now) for i in instances]
        for v in views:  # every Event first: a node write failing below must not lose a later instance's notice
            if v.inst.id in self._doomed and v.inst.id not in known:
                where = f" (node {v.node.metadata.name})" if v.node is not None else ""
                when = f" at {format_time(v.doomed_at)}" if v.doomed_at and v.doomed_at > now else ""
                step.event("Warning", "Reclaimed", f"the cloud is taking {v.inst.id}{where} back{when}; a "
                           "replacement is launched now and the node drained")
            self._owner_of[v.inst.id] = pool.metadata.name
        for v in views:
            if v.node is not None:
                t = pool.spec.template
                await nd.join(self.client, v.node, pool.metadata.name, t.labels or {}, t.taints or ())
        listed = {v.inst.id for v in views}
        for iid in [i for i, p in self._owner_of.items() if p == pool.metadata.name and i not in listed]:
            del self._owner_of[iid]  # gone from the cloud: nothing to remember
            self._doomed.discard(iid)
            self._awaiting.pop(iid, None)
        return views

    def _settle_pending_launch(self, pool: SpotPool, step: Step, views: list[View],
                               now: int) -> tuple[PendingLaunch | None, int]:
        """Step 4: the pending launch still open (None once resolved or lost) and how many of its instances are
        not listed yet (`in_flight` of the plan)."""
        pl = step.status.pending_launch
        in_flight = 0
        if pl is None:
            return pl, in_flight
        s = self.settings
        listed = {v.inst.id for v in views}
        bought = [v for v in views if v.inst.launch_id == pl.client_token]
        missing = [i for i in pl.instance_ids if i not in listed]
        # resolved: everything it bought is listed, or its answer was lost but the cloud did it
        if (pl.instance_ids and not missing) or (not pl.instance_ids and bought):
            if not pl.instance_ids:
                self._replaced(pool.metadata.name, len(bought), views)
            pl = None
        elif pl.instance_ids and now - (_t(pl.since) or now) > s.launch_resolve_seconds * _SECOND:
            step.event("Warning", "LaunchLost", f"instances {', '.join(missing)} of launch {pl.client_token} "
                       f"were never listed within {s.launch_resolve_seconds:g}s; counted as lost")
            pl = None
        else:
            in_flight = len(missing) if pl.instance_ids else pl.count
        step.status = msgspec.structs.replace(step.status, pending_launch=pl)
        return pl, in_flight

    def _plan(self, pool: SpotPool, views: list[View], in_flight: int) -> PoolPlan:
        """Step 5, the decision: doomed instances count as terminating, so they are not capacity."""
        pending = self._demand(pool) if pool.spec.scale_on_demand else None
        plan_instances = [PoolInstance(
            id=v.inst.id,
            state=InstanceState.TERMINATING if v.doomed_at is not None else v.inst.state,
            created_at=v.inst.launched_at or 0,
            node=v.node.metadata.name if v.node is not None else None,
            gpu_pods=v.gpu_pods if v.node is not None else 0,
        ) for v in views]
        return plan_pool(PlanSpec(minimum=pool.spec.minimum, maximum=pool.spec.maximum,
                                  instance_gpus=pool.spec.template.gpus_per_instance),
                         plan_instances, in_flight=in_flight, pending=pending)

    async def _launch_as_planned(self, pool: SpotPool, provider: Provider, step: Step, pl: PendingLaunch | None,
                                 count: int, views: list[View], now: int) -> tuple[SpotPool, Result | None]:
        """Step 5, the launch: the pending one is resent (after its backoff) until the cloud answers, or waited
        for until describe lists it; without one, a new launch of `count` instances when the plan wants more."""
        result: Result | None = None
        retry_at = self._retry_at.get(pool.metadata.name, 0)
        if pl is not None and not pl.instance_ids and now < retry_at:
            step.wake.append(retry_at)  # backing off; node and pod events must not hurry the cloud
        elif pl is not None and not pl.instance_ids:
            pool, result = await self._launch(pool, provider, step, pl, views)
        elif pl is not None:
            step.wake.append(now + round(self.settings.drain_recheck * _SECOND))  # wait for describe to list them
        elif count > 0:
            pool, result = await self._new_launch(pool, provider, step, count, views, now)
        return pool, result

    async def _scale_in(self, pool: SpotPool, provider: Provider, step: Step, views: list[View], chosen: set[str],
                        now: int) -> None:
        """Step 6: retire the chosen instances, terminate failed and stopped ones, drain reclaimed nodes."""
        await self._retire(pool, provider, step, views, chosen, now)
        cleanup = [v.inst.id for v in views if v.inst.state is InstanceState.LAUNCH_FAILED or v.inst.state in STOPPED]
        if cleanup:
            await self._terminate(pool, provider, step, cleanup, "launch-failed")
        for v in views:
            if v.doomed_at is not None and v.node is not None and v.inst.state is not InstanceState.LAUNCH_FAILED:
                await nd.set_retire_taint(self.client, v.node, True)
                await nd.drain(self.client, self.pods, v.node.metadata.name)

    async def _report(self, pool: SpotPool, step: Step, views: list[View], plan: PoolPlan, now: int) -> None:
        """Step 7: status in one write, then the step's Events."""
        self._summarize(pool, step, views, plan.target, plan.unfit)
        step.wake.append(now + round(self.settings.resync_seconds * _SECOND))
        await self._finish(pool, step)

    # ------------------------------------------------------------------------------------------ views

    def _view(self, pool: SpotPool, inst: CloudInstance, now: int) -> View:
        node = nd.match(self.nodes, inst)
        resource = pool.spec.template.gpu_resource_name
        gpu_pods = 0
        if node is not None:
            gpu_pods = sum(1 for p in self.pods.store.by_index(INDEX_NODE, node.metadata.name)
                           if uses_gpus(p, resource))
        doomed: int | None = None
        notice = nd.notice_at(node)
        if notice is not None:
            doomed = notice
        elif inst.interruption_at is not None:
            doomed = inst.interruption_at
        elif inst.state not in LIVE and inst.state is not InstanceState.LAUNCH_FAILED:
            # leaving on its own: from when we first saw it go (kept in status, so resyncs write nothing new)
            seen = next((i.reclaim_at for i in pool.status.instances if i.id == inst.id), None)
            doomed = _t(seen) or now
        if doomed is not None and inst.id not in self._doomed and inst.state in LIVE:
            self._doomed.add(inst.id)
            self._awaiting[inst.id] = time.monotonic()
            log.info("instance reclaimed", pool=pool.metadata.name, instance=inst.id,
                     node=node.metadata.name if node else None, state=inst.state.value)
        return View(inst, node, inst.state is InstanceState.RUNNING and nd.ready(node, resource), gpu_pods, doomed)

    def _admits(self, pool: SpotPool, pod: Pod) -> bool:
        t = pool.spec.template
        if gpu_request(pod, t.gpu_resource_name) <= 0:
            return False
        labels = {nd.POOL_LABEL: pool.metadata.name, **(t.labels or {})}
        return node_admits(pod, "", labels, t.taints or ())

    def _demand(self, pool: SpotPool) -> dict[str, Fraction]:
        resource = pool.spec.template.gpu_resource_name
        return {f"{p.metadata.namespace}/{p.metadata.name}": gpu_request(p, resource)
                for p in self.pods.store.by_index(INDEX_UNSCHEDULABLE, "")
                if is_unschedulable(p) and self._admits(pool, p)}

    # ------------------------------------------------------------------------------------------ launching

    def _choose(self, pool: SpotPool, step: Step, now: int) -> tuple[str, str | None, str] | None:
        """The first (zone, type) pair in preference order not backed off after a capacity error; on-demand
        once the fallback's error count is reached and every spot pair is backed off."""
        t = pool.spec.template
        zones: list[str | None] = list(t.zones) or [None]
        backed = {(b.zone, b.instance_type, b.capacity_type): _t(b.until) or 0 for b in step.status.backoff}
        kinds = ["spot"]
        fb = pool.spec.on_demand_fallback
        if fb is not None and step.status.capacity_errors >= fb.after_capacity_errors:
            kinds.append("on-demand")
        earliest: int | None = None
        for kind in kinds:
            for itype in t.instance_types:
                for zone in zones:
                    until = backed.get((zone or "", itype, kind), 0)
                    if until <= now:
                        return itype, zone, kind
                    earliest = until if earliest is None else min(earliest, until)
        step.wake.append(earliest)
        return None

    async def _new_launch(self, pool: SpotPool, provider: Provider, step: Step, count: int, views: list[View],
                          now: int) -> tuple[SpotPool, Result | None]:
        choice = self._choose(pool, step, now)
        if choice is None:
            self._condition(step, pool, "CapacityError", "True", "AllBackedOff",
                            "every zone and instance type of the template is backed off after capacity errors")
            return pool, None
        itype, zone, kind = choice
        seq = step.status.launch_sequence + 1
        pl = PendingLaunch(client_token=client_token(pool, seq), count=count, since=format_time(now),
                           instance_type=itype, zone=zone, capacity_type=kind)
        step.status = msgspec.structs.replace(step.status, pending_launch=pl, launch_sequence=seq)
        self._condition(step, pool, "ScalingUp", "True", "Launching",
                        f"launching {count} {kind} {itype}" + (f" in {zone}" if zone else ""))
        written = await self._write(pool, step.status)  # the intent is durable before the cloud hears of it
        if written is None:
            return pool, None
        return await self._launch(written, provider, step, pl, views)

    def _launch_spec(self, pool: SpotPool, pl: PendingLaunch) -> LaunchSpec:
        t = pool.spec.template
        tags = {**(t.tags or {}), **owner_tags(pool), LAUNCH_ID_TAG: pl.client_token}
        return LaunchSpec(
            client_token=pl.client_token, count=pl.count, instance_type=pl.instance_type, zone=pl.zone,
            capacity_type="on-demand" if pl.capacity_type == "on-demand" else "spot", image=t.image,
            subnet=t.subnet, vpc=t.vpc, security_groups=tuple(t.security_groups),
            max_price=t.max_price if pl.capacity_type == "spot" else None, user_data=t.user_data, tags=tags,
            node_labels={nd.POOL_LABEL: pool.metadata.name, **(t.labels or {})},
            node_taints=tuple(NodeTaint(key=x.key, value=x.value, effect=x.effect) for x in t.taints or ()),
            name_prefix=f"gpuops-{pool.metadata.name}",
        )

    async def _launch(self, pool: SpotPool, provider: Provider, step: Step, pl: PendingLaunch,
                      views: list[View]) -> tuple[SpotPool, Result | None]:
        name = pool.metadata.name
        now = self.clock()
        try:
            ids = await provider.launch(self._launch_spec(pool, pl))
        except ProviderError as e:
            return pool, self._launch_failed(pool, step, pl, e, now)
        LAUNCHES.labels(name, "ok").inc(len(ids))
        self._replaced(name, len(ids), views)
        where = f" in {pl.zone}" if pl.zone else ""
        step.event("Normal", "Launched", f"launched {len(ids)} of {pl.count} {pl.capacity_type} {pl.instance_type}"
                   f"{where} (client token {pl.client_token}): {', '.join(ids)}")
        log.info("instances launched", pool=name, token=pl.client_token, ids=ids, instance_type=pl.instance_type,
                 capacity_type=pl.capacity_type)
        done = msgspec.structs.replace(pl, attempts=pl.attempts + 1, instance_ids=tuple(ids))
        backoff = tuple(b for b in step.status.backoff
                        if (b.zone, b.instance_type, b.capacity_type) != (pl.zone or "", pl.instance_type,
                                                                           pl.capacity_type))
        step.status = msgspec.structs.replace(step.status, pending_launch=done if ids else None, backoff=backoff,
                                              capacity_errors=0 if pl.capacity_type == "spot" else
                                              step.status.capacity_errors)
        for cname, reason in (("CapacityError", "Launched"), ("QuotaExceeded", "Launched")):
            self._condition(step, pool, cname, "False", reason, f"the last launch succeeded ({pl.client_token})")
        step.wake.append(now + round(self.settings.drain_recheck * _SECOND))
        return pool, None

    def _replaced(self, pool: str, launched: int, views: list[View]) -> None:
        """Instances launched while reclaimed ones waited: the oldest waits end (the latency histogram). After an
        operator restart the wait counts from when this process first saw the reclaim."""
        mine = {v.inst.id for v in views}
        waiting = sorted((t, i) for i, t in self._awaiting.items() if i in mine)
        for t, iid in waiting[:launched]:
            REPLACEMENT_SECONDS.labels(pool).observe(time.monotonic() - t)
            del self._awaiting[iid]

    def _launch_failed(self, pool: SpotPool, step: Step, pl: PendingLaunch, e: ProviderError,
                       now: int) -> Result | None:
        name = pool.metadata.name
        s = self.settings
        LAUNCHES.labels(name, e.kind.value).inc(pl.count)
        msg = f"launch {pl.client_token} ({pl.count} {pl.capacity_type} {pl.instance_type}): {e}"
        step.status = msgspec.structs.replace(step.status, last_error=msg)
        log.warning("launch failed", pool=name, token=pl.client_token, kind=e.kind.value, code=e.code, error=str(e))
        if e.kind in (ErrorKind.THROTTLED, ErrorKind.TRANSIENT):  # same token, same parameters, later
            attempts = pl.attempts + 1
            step.status = msgspec.structs.replace(step.status,
                                                  pending_launch=msgspec.structs.replace(pl, attempts=attempts))
            wait = (e.retry_after or min(s.retry_max, s.retry_base * 2 ** min(attempts - 1, 16))) * \
                (1 + 0.2 * self._rng.random())
            self._retry_at[name] = now + round(wait * _SECOND)
            return Result(requeue_after=wait)
        step.status = msgspec.structs.replace(step.status, pending_launch=None)  # definite: the token is spent
        if e.kind is ErrorKind.CAPACITY:
            key = (pl.zone or "", pl.instance_type, pl.capacity_type)
            old = next((b for b in step.status.backoff if (b.zone, b.instance_type, b.capacity_type) == key), None)
            failures = (old.failures if old else 0) + 1
            pause = min(s.capacity_backoff_max, s.capacity_backoff_base * 2 ** (failures - 1))
            pause *= 1 + 0.1 * self._rng.random()
            entry = CapacityBackoff(zone=key[0], instance_type=key[1], capacity_type=key[2], failures=failures,
                                    until=format_time(now + round(pause * _SECOND)))
            rest = tuple(b for b in step.status.backoff if (b.zone, b.instance_type, b.capacity_type) != key)
            step.status = msgspec.structs.replace(step.status, backoff=(*rest, entry),
                                                  capacity_errors=step.status.capacity_errors + 1)
            self._condition(step, pool, "CapacityError", "True", e.code or "InsufficientCapacity",
                            f"{msg}; this zone and type rest for {pause:.0f}s, the next one is tried")
            step.event("Warning", "CapacityError", msg)
            return Result(requeue_after=0.05)  # the next pair, now
        if e.kind is ErrorKind.QUOTA:
            self._condition(step, pool, "QuotaExceeded", "True", e.code or "QuotaExceeded", msg)
            step.event("Warning", "QuotaExceeded", msg)
        elif e.kind is ErrorKind.CREDENTIALS:
            self._refused(pool)
            self._condition(step, pool, "CredentialsInvalid", "True", e.code or "AuthFailure", msg)
            step.event("Warning", "CredentialsInvalid", msg)
            return Result(requeue_after=s.secret_recheck)
        elif e.kind is ErrorKind.MISMATCH:
            step.event("Warning", "LaunchRenewed", f"{msg}; a new launch intent replaces it")
            return Result(requeue_after=s.retry_base)
        else:
            self._condition(step, pool, "Ready", "False", "LaunchRejected", msg)
            step.event("Warning", "LaunchRejected", msg)
        return Result(requeue_after=s.config_retry)

    # ------------------------------------------------------------------------------------------ scale-in

    async def _retire(self, pool: SpotPool, provider: Provider, step: Step, views: list[View], chosen: set[str],
                      now: int) -> None:
        previous = {i.id: i.retiring_since for i in pool.status.instances if i.retiring_since}
        retiring: dict[str, str] = {}
        done: list[str] = []
        for v in views:
            iid = v.inst.id
            if iid not in chosen:
                if iid in previous and v.node is not None and v.doomed_at is None:
                    await nd.set_retire_taint(self.client, v.node, False)  # needed again: back in service
                continue
            if v.node is None:
                done.append(iid)
                continue
            since = previous.get(iid) or format_time(now)
            retiring[iid] = since
            await nd.set_retire_taint(self.client, v.node, True)
            left = await nd.drain(self.client, self.pods, v.node.metadata.name)
            timeout = (_t(since) or now) + pool.spec.drain_timeout_seconds * _SECOND
            if left == 0 or now >= timeout:
                done.append(iid)
            else:
                step.wake.append(min(timeout, now + round(self.settings.drain_recheck * _SECOND)))
        step.retiring = retiring
        if done:
            step.event("Normal", "ScaleIn", f"terminating {', '.join(done)} (scale-in, drained)")
            await self._terminate(pool, provider, step, done, "scale-in")

    async def _terminate(self, pool: SpotPool, provider: Provider, step: Step, ids: list[str], reason: str) -> bool:
        try:
            await provider.terminate(ids)
        except ProviderError as e:
            TERMINATIONS.labels(pool.metadata.name, reason, e.kind.value).inc(len(ids))
            step.status = msgspec.structs.replace(step.status, last_error=f"terminate {', '.join(ids)}: {e}")
            step.wake.append(self.clock() + round(max(e.retry_after or 0, self.settings.drain_recheck) * _SECOND))
            return False
        TERMINATIONS.labels(pool.metadata.name, reason, "ok").inc(len(ids))
        log.info("instances terminated", pool=pool.metadata.name, ids=ids, reason=reason)
        return True

    # ------------------------------------------------------------------------------------------ status

    def _summarize(self, pool: SpotPool, step: Step, views: list[View], target: int, unfit: Iterable[str]) -> None:
        retiring = step.retiring
        items = []
        for v in sorted(views, key=lambda x: (x.inst.launched_at or 0, x.inst.id)):
            i = v.inst
            items.append(InstanceStatus(
                id=i.id, state=i.state.value, zone=i.zone, type=i.instance_type, capacity_type=i.capacity_type,
                private_ip=i.private_ip, public_ip=i.public_ip,
                node_name=v.node.metadata.name if v.node is not None else None,
                launched_at=format_time(i.launched_at) if i.launched_at else None,
                reclaim_at=format_time(v.doomed_at) if v.doomed_at else None,
                retiring_since=retiring.get(i.id)))
        live = [v for v in views if v.doomed_at is None and v.inst.state in LIVE]
        ready = sum(1 for v in live if v.ready)
        pl = step.status.pending_launch
        step.status = msgspec.structs.replace(step.status, instances=tuple(items), size=len(live), ready=ready,
                                              desired=target)
        if pl is not None or len(live) < target:
            why = f"launch {pl.client_token} in flight" if pl else f"{len(live)} of {target} instances"
            self._condition(step, pool, "ScalingUp", "True", "Launching", why)
        else:
            self._condition(step, pool, "ScalingUp", "False", "AtTarget", f"{len(live)} instances, target {target}")
        if ready >= max(pool.spec.minimum, 1 if target else 0) and ready >= min(target, len(live)):
            self._condition(step, pool, "Ready", "True", "InstancesReady", f"{ready} of {len(live)} instances Ready")
        else:
            reason, message = self._blocked(pool, step, short=len(live) < target) or (
                "InstancesNotReady", f"{ready} of {target} instances Ready (minimum {pool.spec.minimum})")
            self._condition(step, pool, "Ready", "False", reason, message)
        self._karpenter(pool, step, views)
        unfit = list(unfit)
        if unfit:
            log.info("pending pods larger than one instance", pool=pool.metadata.name, pods=unfit[:10])

    def _karpenter(self, pool: SpotPool, step: Step, views: list[View]) -> None:
        """ConflictDetected while some of the pool's nodes carry Karpenter's marks: Karpenter may then consolidate,
        drift or replace them while this pool replaces them too. Said once (Event) per change; nothing is held."""
        managed = sorted((v.node.metadata.name, owner) for v in views if v.node is not None
                         and (owner := karpenter_nodepool(v.node)) is not None)
        current = cond.get_condition(pool.status.conditions, CONDITION)
        if managed:
            shown = ", ".join(f"{n} ({o})" for n, o in managed[:10]) + (
                f" and {len(managed) - 10} more" if len(managed) > 10 else "")
            message = (f"Karpenter manages node(s) {shown} of this pool: both controllers would replace and remove "
                       f"them. Keep the pool's nodes out of Karpenter (no {KARPENTER_NODEPOOL} in "
                       "spec.template.labels, no NodePool matching its instances), or let one of the two own them")
            self._condition(step, pool, CONDITION, "True", KARPENTER_NODES, message)
            if current is None or (current.status, current.message) != ("True", message[:1024]):
                step.event("Warning", KARPENTER_NODES, message)
                log.warning("pool nodes managed by Karpenter too", pool=pool.metadata.name, nodes=len(managed))
        elif current is not None and current.status != "False":
            self._condition(step, pool, CONDITION, "False", NO_CONFLICT, "no node of the pool is managed by Karpenter")

    @staticmethod
    def _blocked(pool: SpotPool, step: Step, *, short: bool) -> tuple[str, str] | None:
        """Why a pool short of Ready instances cannot launch, if something stops it: a condition the cloud's last
        answer set (its type is the reason, as on its Event), or a launch the cloud rejected (kept until a launch
        is made again). None while instances are merely on their way."""
        for c in step.status.conditions or ():
            if c.type in _BLOCKING and c.status == "True":
                return c.type, c.message
        prev = cond.get_condition(pool.status.conditions, "Ready")
        if short and step.status.pending_launch is None and prev is not None and prev.reason == "LaunchRejected":
            return prev.reason, prev.message
        return None

    def _condition(self, step: Step, pool: SpotPool, type: str, value: str, reason: str, message: str) -> None:
        items = cond.set_condition(step.status.conditions, type, value, reason, SECRET_VALUES.clip(message, 1024),
                                   pool.metadata.generation, now=format_time(wall_clock() // _SECOND * _SECOND))
        step.status = msgspec.structs.replace(step.status,
                                              conditions=msgspec.convert(items, tuple[Condition, ...]))

    async def _finish(self, pool: SpotPool, step: Step) -> None:
        await self._write(pool, step.status)
        self._flush(pool, step)

    def _flush(self, pool: SpotPool, step: Step) -> None:
        """Record the step's Events, once. They report what happened (a reclaim notice seen, a launch made), so
        they go out even when the reconcile then fails (a status write refused by the API server): the retry
        does not see a notice as new again (it is remembered in memory), and its Event was lost (chaos/
        apiserver_all.py: a SpotPool without its Reclaimed Event after 500s)."""
        events, step.events = step.events, []
        for type, reason, message in events:
            self.recorder.record(pool, type, reason, SECRET_VALUES.clip(message, 1024), kind=KIND,
                                 api_version=API_VERSION)

    async def _write(self, pool: SpotPool, status: PoolStatus) -> SpotPool | None:
        """The whole status, guarded by resourceVersion; None if the pool changed meanwhile (its event brings us
        back, and the pending launch, if any, is retried with its token from what was persisted)."""
        status = msgspec.structs.replace(status, observed_generation=pool.metadata.generation)
        if status == pool.status:
            return pool
        try:
            return await self.client.replace(POOLS, msgspec.structs.replace(pool, status=status),
                                             subresource="status")
        except (Conflict, NotFound) as e:
            log.debug("pool status write skipped", pool=pool.metadata.name, error=str(e))
            return None

    # ------------------------------------------------------------------------------------------ errors

    async def _config_error(self, pool: SpotPool, e: Exception) -> Result:
        step = Step(pool.status)
        if isinstance(e, NotFound):
            ref = pool.spec.credentials_secret_ref
            msg = f"Secret {ref.namespace}/{ref.name} not found; create it with the provider's keys" if ref else str(e)
            reason = "SecretNotFound"
        elif isinstance(e, ProviderError):
            msg, reason = str(e), e.code
        else:
            msg, reason = f"cannot read the credentials Secret: {e}", "SecretUnreadable"
        kind = e.kind if isinstance(e, ProviderError) else ErrorKind.CREDENTIALS
        if kind is ErrorKind.CREDENTIALS:
            self._condition(step, pool, "CredentialsInvalid", "True", reason, msg)
        self._not_ready(pool, step, reason, msg)
        await self._finish(pool, step)
        wait = self.settings.secret_recheck if kind is ErrorKind.CREDENTIALS else self.settings.config_retry
        return Result(requeue_after=wait)

    def _not_ready(self, pool: SpotPool, step: Step, reason: str, msg: str) -> None:
        """A pool the controller cannot act on: Ready=False naming why, and when that is news (the last error
        changed, or the spec did and still fails the same way) a Warning Event and a log line with the pool's
        name."""
        self._condition(step, pool, "Ready", "False", reason, msg)
        step.status = msgspec.structs.replace(step.status, last_error=msg)
        if pool.status.last_error != msg or pool.status.observed_generation != pool.metadata.generation:
            step.event("Warning", reason, msg)
            log.warning("spot pool not ready", pool=pool.metadata.name, reason=reason, error=msg)

    async def _deletion_blocked(self, pool: SpotPool, step: Step, why: str) -> Result:
        """A deleted pool whose instances cannot be terminated keeps its finalizer: say what blocks it and how to
        let it go, and try again with backoff."""
        name = pool.metadata.name
        msg = (f"{why}; the pool stays (with its finalizer) until its instances are terminated. To let it go and"
               f" leave its instances running: kubectl patch spotpool {name} --type merge"
               """ -p '{"spec":{"deletionPolicy":"Retain"}}'""")
        self._condition(step, pool, "DeletionBlocked", "True", "TerminationFailed", msg)
        self._not_ready(pool, step, "DeletionBlocked", msg)
        await self._finish(pool, step)
        return Result(requeue_after=self._backoff(name))

    def _backoff(self, name: str) -> float:
        """Seconds before the next try after another failure in a row: doubling from retry_base to retry_max,
        with up to as much again of jitter (pools failing together do not retry together)."""
        failures = self._failures[name] = self._failures.get(name, 0) + 1
        s = self.settings
        return float(min(s.retry_max, s.retry_base * 2 ** min(failures - 1, 16)) * (1 + self._rng.random()))

    def _refused(self, pool: SpotPool) -> None:
        fingerprint = self._uses.get(pool.metadata.name)
        if fingerprint is not None:
            self._bad_keys[pool.metadata.name] = (fingerprint, time.monotonic())

    async def _call_failed(self, pool: SpotPool, step: Step, e: ProviderError, op: str) -> Result:
        """The cloud call the pool's state depends on failed: shown (Ready=False with the error kind's reason, an
        Event, a log line; `gpuops_spotpool_provider_calls_total` counts it by kind) and retried with backoff."""
        msg = f"{op}: {e}"
        name = pool.metadata.name
        if e.kind is ErrorKind.CREDENTIALS:
            self._condition(step, pool, "CredentialsInvalid", "True", e.code or "AuthFailure", msg)
            self._not_ready(pool, step, "CredentialsInvalid", msg)
            self._refused(pool)
            await self._finish(pool, step)
            return Result(requeue_after=self.settings.secret_recheck)
        self._not_ready(pool, step, _CALL_FAILED.get(e.kind, "CloudCallFailed"), msg)
        await self._finish(pool, step)
        wait = self._backoff(name)
        return Result(requeue_after=e.retry_after or wait)

    # ------------------------------------------------------------------------------------------ providers

    async def _provider(self, pool: SpotPool) -> tuple[tuple[Any, ...], Provider]:
        spec = pool.spec
        creds: dict[str, str] = {}
        secret_version = ""
        ref = spec.credentials_secret_ref
        if ref is not None:
            try:  # never read a Secret out of scope, whatever path led here
                self.settings.secret_scope.check("spec.credentialsSecretRef", ref.namespace, KIND)
            except SpecError as e:
                raise ProviderError(ErrorKind.CREDENTIALS, "SecretNotAllowed", str(e)) from None
            secret = await self.client.get(SECRETS, ref.name, ref.namespace)
            secret_version = f"{secret.metadata.uid}/{secret.metadata.resource_version}"
            for k, v in (secret.data or {}).items():
                try:
                    creds[k] = base64.b64decode(v, validate=True).decode().strip()
                except (ValueError, UnicodeDecodeError):
                    raise ProviderError(ErrorKind.CREDENTIALS, "SecretUnreadable",
                                        f"Secret {ref.namespace}/{ref.name}: key {k!r} is not valid base64 "
                                        "text") from None
        SECRET_VALUES.add(*creds.values())  # scrubbed from every status, Event, log and metric
        fingerprint = (spec.provider, spec.endpoint, spec.template.region, secret_version)
        provider = self._providers.get(fingerprint)
        if provider is None:
            provider = self.provider_factory(spec.provider, ProviderConfig(
                region=spec.template.region, endpoint=spec.endpoint, credentials=creds,
                timeout_seconds=self.settings.call_timeout))
            self._providers[fingerprint] = provider
        previous = self._uses.get(pool.metadata.name)
        self._uses[pool.metadata.name] = fingerprint
        if previous is not None and previous != fingerprint:
            await self._release(previous)
        return fingerprint, provider

    async def _release(self, fingerprint: tuple[Any, ...]) -> None:
        """Close an account's provider once no pool uses it (keys rotated, pools deleted)."""
        if fingerprint not in self._uses.values():
            provider = self._providers.pop(fingerprint, None)
            if provider is not None:
                await provider.close()

    async def _forget(self, name: str) -> None:
        self._bad_keys.pop(name, None)
        self._failures.pop(name, None)
        self._retry_at.pop(name, None)
        fingerprint = self._uses.pop(name, None)
        if fingerprint is not None:
            await self._release(fingerprint)
        for iid in [i for i, p in self._owner_of.items() if p == name]:
            del self._owner_of[iid]
            self._doomed.discard(iid)
            self._awaiting.pop(iid, None)

    async def close(self) -> None:
        for provider in self._providers.values():
            await provider.close()
        self._providers.clear()
        self._uses.clear()

    # ------------------------------------------------------------------------------------------ deletion

    async def _set_finalizer(self, pool: SpotPool, on: bool) -> None:
        current = list(pool.metadata.finalizers or ())
        want = [*current, FINALIZER] if on and FINALIZER not in current else \
            [f for f in current if f != FINALIZER]
        if want == current:
            return
        body = {"metadata": {"finalizers": want, "resourceVersion": pool.metadata.resource_version}}
        try:
            await self.client.patch(POOLS, pool.metadata.name, body)
        except (Conflict, NotFound) as e:
            log.debug("pool finalizer update skipped", pool=pool.metadata.name, error=str(e))

    async def _delete(self, pool: SpotPool) -> Result | None:
        if FINALIZER not in (pool.metadata.finalizers or ()):
            await self._forget(pool.metadata.name)
            return None
        name = pool.metadata.name
        if pool.spec.deletion_policy == "Retain":
            self.recorder.record(pool, "Normal", "Retained", "the pool's instances are left running (deletionPolicy"
                                 " Retain); their gpuops.io/pool tag stays", kind=KIND, api_version=API_VERSION)
            await self._set_finalizer(pool, False)
            await self._forget(name)
            return None
        try:
            _, provider = await self._provider(pool)
            instances = await provider.describe(owner_tags(pool))
        except (ProviderError, ApiError) as e:
            return await self._deletion_blocked(pool, Step(pool.status), f"cannot list the pool's instances: {e}")
        self._failures.pop(name, None)
        now = self.clock()
        pl = pool.status.pending_launch
        young = pl is not None and now - (_t(pl.since) or now) < 60 * _SECOND and \
            not any(i.launch_id == pl.client_token for i in instances)
        left = [i.id for i in instances if i.state is not InstanceState.TERMINATING]
        if left:
            step = Step(pool.status)
            ok = await self._terminate(pool, provider, step, left, "deletion")
            if not ok:
                return await self._deletion_blocked(pool, step, step.status.last_error or "terminate failed")
            self.recorder.record(pool, "Normal", "Terminating", f"pool deleted: terminating {len(left)} "
                                 f"instances ({', '.join(left[:20])})", kind=KIND, api_version=API_VERSION)
            return Result(requeue_after=self.settings.drain_recheck)
        if young:  # a launch whose answer was lost may still surface: look again before letting go
            return Result(requeue_after=self.settings.drain_recheck)
        log.info("pool deleted; instances terminated", pool=name)
        await self._set_finalizer(pool, False)
        await self._forget(name)
        return None


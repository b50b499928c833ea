"""The spot-instance side of the cloud: launches with client tokens, capacity, state timers, reclaims.

No HTTP here: `server.py` maps requests onto these methods, tests may call them directly. Instances move
pending -> running -> shutting-down -> terminated on event-loop timers; a running instance is a `Machine`
in the fleet, so the kubelets see it boot, and see it vanish when the instance shuts down.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import structlog

from gpuops_sim import gpus
from gpuops_sim.cluster.machines import Fleet, Machine

from .config import CloudOptions, InstanceType
from .errors import CloudError, bad

log = structlog.get_logger("gpuops_sim.cloud")

InstanceState = Literal["pending", "running", "shutting-down", "terminated", "launch-failed"]
STATES: tuple[InstanceState, ...] = ("pending", "running", "shutting-down", "terminated", "launch-failed")
CapacityType = Literal["spot", "on-demand"]
NoticeSubscriber = Callable[["Instance"], None]
MAX_COUNT = 500  # instances per launch call
MAX_IDS = 100  # ids per terminate / reclaim call
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
LAUNCH_OPTIONS: dict[str, type] = {"imageId": str, "subnetId": str, "vpcId": str, "securityGroupIds": list,
                                   "userData": str, "maxPrice": str, "namePrefix": str}
USER_DATA_LIMIT = 16384
USER_SHUTDOWN = {"code": "Client.UserInitiatedShutdown", "message": "User initiated shutdown"}
SPOT_RECLAIM = {"code": "Server.SpotInstanceTermination", "message": "Spot instance termination: capacity reclaimed"}
LAUNCH_FAILED = {"code": "Server.InternalError", "message": "Launch failed: the host could not start the instance"}
FILTERS = ("instanceId", "state", "instanceType", "tag-key", "nodeName", "clientToken", "zone", "capacityType")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def region_of(zone: str) -> str:
    """`us-east-1a` -> `us-east-1`, `sim-zone-a` -> `sim-zone`."""
    return zone[:-1].rstrip("-") if len(zone) > 1 and zone[-1].isalpha() else zone


@dataclass
class Instance:
    id: str
    type: InstanceType
    tags: dict[str, str]
    client_token: str
    launch_time: float
    private_ip: str
    node_name: str
    provider_id: str
    zone: str
    node_labels: dict[str, str]
    node_taints: list[dict[str, Any]]
    capacity_type: CapacityType = "spot"
    launch_options: dict[str, Any] = field(default_factory=dict)  # image, subnet, user data...: recorded
    state: InstanceState = "pending"
    state_reason: dict[str, str] | None = None
    counted: bool = False  # holds a unit of its spot type's capacity
    interruption: dict[str, str] | None = None
    terminated_at: float | None = None
    machine: Machine | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)  # launch, shutdown or purge
    reclaim_timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "instanceId": self.id,
            "instanceType": self.type.name,
            "state": self.state,
            "tags": dict(self.tags),
            "clientToken": self.client_token,
            "launchTime": iso(self.launch_time),
            "privateIp": self.private_ip,
            "nodeName": self.node_name,
            "providerId": self.provider_id,
            "zone": self.zone,
            "lifecycle": self.capacity_type,
            "gpuModel": self.type.gpu_model,
            "gpus": self.type.gpus,
        }
        if self.state_reason is not None:
            out["stateReason"] = dict(self.state_reason)
        if self.interruption is not None:
            out["interruption"] = dict(self.interruption)
        if self.terminated_at is not None:
            out["terminatedTime"] = iso(self.terminated_at)
        out.update(self.launch_options)
        return out

    def cancel_timers(self) -> None:
        for h in (self.timer, self.reclaim_timer):
            if h is not None:
                h.cancel()
        self.timer = self.reclaim_timer = None


@dataclass
class Launch:
    """What a client token bought: the parameters (to detect mismatches) and the instances."""

    params: tuple[Any, ...]
    ids: list[str]


@dataclass
class LaunchRequest:
    client_token: str
    instance_type: str
    count: int
    min_count: int
    tags: dict[str, str]
    node_labels: dict[str, str]
    node_taints: list[dict[str, Any]]
    zone: str | None = None
    capacity_type: CapacityType = "spot"
    options: dict[str, Any] = field(default_factory=dict)  # imageId, subnetId, securityGroupIds, userData, maxPrice

    @property
    def params(self) -> tuple[Any, ...]:
        taints = tuple(sorted((t["key"], t.get("value", ""), t["effect"]) for t in self.node_taints))
        return (self.instance_type, self.count, self.min_count, tuple(sorted(self.tags.items())),
                tuple(sorted(self.node_labels.items())), taints, self.zone, self.capacity_type,
                repr(sorted(self.options.items())))

    @classmethod
    def from_json(cls, body: Any) -> LaunchRequest:
        if not isinstance(body, dict):
            raise bad("request body must be a JSON object", "InvalidRequest")
        known = {"clientToken", "instanceType", "count", "minCount", "tags", "nodeLabels", "nodeTaints", "zone",
                 "capacityType", *LAUNCH_OPTIONS}
        unknown = sorted(set(body) - known)
        if unknown:
            raise bad(f"unknown fields {unknown}; known: {sorted(known)}", "UnknownParameter")
        token = body.get("clientToken")
        if token is None or token == "":
            raise bad("clientToken is required", "MissingParameter")
        if not isinstance(token, str) or len(token) > 64 or not all(32 < ord(c) < 127 for c in token):
            raise bad("clientToken must be 1-64 printable ASCII characters without spaces", "InvalidClientToken")
        itype = body.get("instanceType")
        if not isinstance(itype, str) or not itype:
            raise bad("instanceType is required", "MissingParameter")
        count = body.get("count", 1)
        if not _is_int(count) or not 1 <= count <= MAX_COUNT:
            raise bad(f"count must be an integer from 1 to {MAX_COUNT}")
        min_count: Any = body.get("minCount", count)
        if not _is_int(min_count) or not 1 <= min_count <= count:
            raise bad("minCount must be an integer from 1 to count")
        zone = body.get("zone")
        if zone is not None and (not isinstance(zone, str) or not zone):
            raise bad("zone must be a non-empty string when set")
        capacity_type = body.get("capacityType", "spot")
        if capacity_type not in ("spot", "on-demand"):
            raise bad("capacityType must be 'spot' or 'on-demand'")
        options: dict[str, Any] = {}
        for key, kind in LAUNCH_OPTIONS.items():
            v = body.get(key)
            if v is None:
                continue
            if kind is list:
                if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                    raise bad(f"{key} must be a list of non-empty strings")
                options[key] = list(v)
            else:
                if not isinstance(v, str):
                    raise bad(f"{key} must be a string")
                options[key] = v
        if len(options.get("userData", "")) > USER_DATA_LIMIT:
            raise bad(f"userData is {len(options['userData'])} characters; at most {USER_DATA_LIMIT}")
        return cls(token, itype, count, min_count, _str_map(body.get("tags"), "tags"),
                   _str_map(body.get("nodeLabels"), "nodeLabels"), _taints(body.get("nodeTaints")),
                   zone, capacity_type, options)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str_map(v: Any, what: str) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) and k and isinstance(x, str) for k, x in v.items()):
        raise bad(f"{what} must be an object of non-empty string keys to string values")
    if len(v) > 50:
        raise bad(f"{what}: at most 50 entries")
    return dict(v)


def _taints(v: Any) -> list[dict[str, Any]]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise bad("nodeTaints must be a list")
    out = []
    for t in v:
        if (not isinstance(t, dict) or not isinstance(t.get("key"), str) or not t["key"]
                or t.get("effect") not in TAINT_EFFECTS or not isinstance(t.get("value", ""), str)
                or set(t) - {"key", "value", "effect"}):
            raise bad(f"nodeTaints: each taint needs key, effect in {list(TAINT_EFFECTS)}, optional string value")
        out.append(dict(t))
    return out


class SpotCloud:
    """Instances by id, client tokens, capacity in use per type, and the timers that move them on."""

    def __init__(self, fleet: Fleet, types: Mapping[str, InstanceType], options: CloudOptions, zone: str) -> None:
        self.fleet = fleet
        self.types = dict(types)
        self.options = options
        self.zone = zone
        self.region = region_of(zone)
        self.instances: dict[str, Instance] = {}  # launch order: describe pages over it
        self.tokens: dict[str, Launch] = {}
        self.used: dict[str, int] = dict.fromkeys(self.types, 0)  # non-terminated instances per type
        self.machine_names: set[str] = set()
        self.launched = 0
        self.reclaimed = 0
        self.launch_failure_rate = 0.0  # share of launched instances that end LAUNCH_FAILED instead of running
        self.notice_subscribers: list[NoticeSubscriber] = []  # told of each reclaim notice (the node agent)
        self._rng = random.Random(options.seed)
        self._next_ip = 0

    # ------------------------------------------------------------------------------------ API

    def run(self, req: LaunchRequest) -> tuple[list[Instance], bool]:
        """Launch, or replay the launch of the same client token; True when instances were created."""
        prior = self.tokens.get(req.client_token)
        if prior is not None:
            if prior.params != req.params:
                raise CloudError(400, "IdempotentParameterMismatch",
                                 f"client token {req.client_token!r} was used with different parameters")
            return [self.instances[i] for i in prior.ids if i in self.instances], False
        itype = self.types.get(req.instance_type)
        if itype is None:
            raise bad(f"instance type {req.instance_type!r} is not offered; known: {sorted(self.types)}")
        if req.zone is not None and req.zone != self.zone:
            raise CloudError(400, "InvalidZone", f"zone {req.zone!r} is not offered here; known: [{self.zone!r}]")
        n = req.count
        if itype.capacity is not None and req.capacity_type == "spot":  # on-demand is never short here
            free = max(0, itype.capacity - self.used[itype.name])
            if free < req.min_count:
                raise CloudError(503, "InsufficientInstanceCapacity",
                                 f"insufficient capacity for {itype.name} in {self.zone}: requested minimum "
                                 f"{req.min_count}, available {free}")
            n = min(n, free)
        now = time.time()
        out = [self._create(itype, req, now) for _ in range(n)]
        self.tokens[req.client_token] = Launch(req.params, [i.id for i in out])
        self.launched += n
        log.info("spot launch", token=req.client_token, instance_type=itype.name, count=n,
                 ids=[i.id for i in out])
        for inst in out:
            self._after(inst, self.options.launch_seconds, self._to_running)
        return out, True

    def describe(self, filters: Mapping[str, Sequence[str]]) -> list[Instance]:
        """Instances matching every filter; a filter with several values matches any of them."""
        for key in filters:
            if key not in FILTERS and not (key.startswith("tag:") and len(key) > 4):
                raise bad(f"unknown filter {key!r}; known: {[*FILTERS, 'tag:<key>']}", "InvalidFilter")
        for s in filters.get("state", ()):
            if s not in STATES:
                raise bad(f"unknown state {s!r}; known: {list(STATES)}", "InvalidFilter")
        ids = filters.get("instanceId")
        pool: Iterable[Instance] = (
            [self.instances[i] for i in dict.fromkeys(ids) if i in self.instances] if ids
            else self.instances.values())
        return [inst for inst in pool if self._matches(inst, filters)]

    def terminate(self, ids: Sequence[str]) -> tuple[list[tuple[Instance, InstanceState]], list[str]]:
        """Begin terminating; already shutting-down or terminated instances are reported, not an error."""
        if len(ids) > MAX_IDS:
            raise bad(f"at most {MAX_IDS} instance ids per call")
        done: list[tuple[Instance, InstanceState]] = []
        missing: list[str] = []
        for i in dict.fromkeys(ids):
            inst = self.instances.get(i)
            if inst is None:
                missing.append(i)
                continue
            prev = inst.state
            self._shut_down(inst, USER_SHUTDOWN)
            done.append((inst, prev))
        return done, missing

    def reclaim(self, ids: Sequence[str] | None = None, *, count: int | None = None,
                tags: Mapping[str, str] | None = None,
                notice_seconds: float | None = None) -> tuple[list[str], list[str]]:
        """Give instances an interruption notice; they terminate when it runs out.

        By ids: any pending or running instance (already noticed ones keep their notice). By count: that
        many running, not yet noticed instances carrying all `tags`, picked at random.
        """
        notice = self.options.reclaim_notice_seconds if notice_seconds is None else notice_seconds
        if notice < 0:
            raise bad("noticeSeconds must be >= 0")
        missing: list[str] = []
        if ids is not None:
            if len(ids) > MAX_IDS:
                raise bad(f"at most {MAX_IDS} instance ids per call")
            picked = []
            for i in dict.fromkeys(ids):
                inst = self.instances.get(i)
                if inst is None or inst.state in ("shutting-down", "terminated"):
                    missing.append(i)
                else:
                    picked.append(inst)
        else:
            if count is None or count < 0:
                raise bad("reclaim needs instanceIds or a count >= 0")
            want = dict(tags or {})
            cands = [inst for inst in self.instances.values()
                     if inst.state == "running" and inst.interruption is None and inst.capacity_type == "spot"
                     and all(inst.tags.get(k) == v for k, v in want.items())]
            picked = self._rng.sample(cands, min(count, len(cands)))
        now = time.time()
        for inst in picked:
            if inst.interruption is not None:
                continue
            inst.interruption = {"noticeTime": iso(now), "terminateTime": iso(now + notice)}
            self.reclaimed += 1
            log.info("spot reclaim notice", instance=inst.id, node=inst.node_name, notice_seconds=notice)
            for fn in list(self.notice_subscribers):
                try:
                    fn(inst)
                except Exception:
                    log.exception("reclaim notice subscriber failed", instance=inst.id)
            if notice <= 0:
                self._shut_down(inst, SPOT_RECLAIM)
            else:
                inst.reclaim_timer = asyncio.get_running_loop().call_later(
                    notice, self._reclaim_due, inst)
        return [inst.id for inst in picked], missing

    def set_launch_failure_rate(self, rate: float) -> None:
        """From now on, this share of launched instances ends LAUNCH_FAILED instead of running (a host fault)."""
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise bad("launch failure rate must be a number from 0 to 1")
        self.launch_failure_rate = float(rate)

    def set_capacity(self, instance_type: str, capacity: int | None) -> None:
        """Shrink or grow what is for sale; running instances above a new limit stay (no forced reclaim)."""
        itype = self.types.get(instance_type)
        if itype is None:
            raise bad(f"instance type {instance_type!r} is not offered")
        if capacity is not None and (not _is_int(capacity) or capacity < 0):
            raise bad("capacity must be an integer >= 0 or null")
        itype.capacity = capacity

    def close(self) -> None:
        for inst in self.instances.values():
            inst.cancel_timers()

    # ------------------------------------------------------------------------------------ internals

    def _matches(self, inst: Instance, filters: Mapping[str, Sequence[str]]) -> bool:
        for key, values in filters.items():
            if not values:
                continue
            if key == "instanceId":
                got: str | None = inst.id
            elif key == "state":
                got = inst.state
            elif key == "instanceType":
                got = inst.type.name
            elif key == "nodeName":
                got = inst.node_name
            elif key == "clientToken":
                got = inst.client_token
            elif key == "zone":
                got = inst.zone
            elif key == "capacityType":
                got = inst.capacity_type
            elif key == "tag-key":
                if not any(v in inst.tags for v in values):
                    return False
                continue
            else:
                got = inst.tags.get(key[4:])
            if got is None or got not in values:
                return False
        return True

    def _create(self, itype: InstanceType, req: LaunchRequest, now: float) -> Instance:
        iid = f"i-{self._rng.getrandbits(68):017x}"
        while iid in self.instances:
            iid = f"i-{self._rng.getrandbits(68):017x}"
        ip, node = self._allocate_ip()
        inst = Instance(iid, itype, dict(req.tags), req.client_token, now, ip, node,
                        f"sim:///{self.zone}/{iid}", self.zone, dict(req.node_labels),
                        [dict(t) for t in req.node_taints], req.capacity_type, dict(req.options))
        self.instances[iid] = inst
        if inst.capacity_type == "spot":
            self.used[itype.name] += 1
            inst.counted = True
        return inst

    def _release(self, inst: Instance) -> None:
        """Give the instance's capacity and node name back (once)."""
        if inst.counted:
            self.used[inst.type.name] -= 1
            inst.counted = False
        self.machine_names.discard(inst.node_name)

    def _allocate_ip(self) -> tuple[str, str]:
        """10.a.b.c with c in 4..253, never reused, so a new node never inherits a stale Node object."""
        while True:
            k = self._next_ip
            self._next_ip += 1
            a, b, c = (k // (250 * 256)) % 256, (k // 250) % 256, k % 250 + 4
            name = f"ip-10-{a}-{b}-{c}"
            if name not in self.fleet.machines and name not in self.machine_names:
                self.machine_names.add(name)
                return f"10.{a}.{b}.{c}", name

    def _after(self, inst: Instance, delay: float, fn: Callable[[Instance], None]) -> None:
        if inst.timer is not None:
            inst.timer.cancel()
            inst.timer = None
        if delay <= 0:
            fn(inst)
        else:
            inst.timer = asyncio.get_running_loop().call_later(delay, self._fire, inst, fn)

    def _fire(self, inst: Instance, fn: Callable[[Instance], None]) -> None:
        inst.timer = None
        try:
            fn(inst)
        except Exception:
            log.exception("spot timer failed", instance=inst.id, state=inst.state)

    def _to_running(self, inst: Instance) -> None:
        if inst.state != "pending":
            return
        if self.launch_failure_rate > 0 and self._rng.random() < self.launch_failure_rate:
            inst.state = "launch-failed"
            inst.state_reason = dict(LAUNCH_FAILED)
            self._release(inst)
            log.info("spot launch failed", instance=inst.id)
            return
        inst.state = "running"
        m = self._machine(inst)
        inst.machine = m
        self.fleet.add(m)
        self.fleet.power_on(m.name)
        log.debug("spot instance running", instance=inst.id, node=m.name, group=m.group)

    def _machine(self, inst: Instance) -> Machine:
        t = inst.type
        labels: dict[str, str] = gpus.node_labels(t.gpu_model, t.gpus) if t.gpu_model else {}
        labels.update({
            "node.kubernetes.io/instance-type": t.name,
            "topology.kubernetes.io/zone": inst.zone,
            "topology.kubernetes.io/region": self.region,
            "gpuops.io/capacity-type": inst.capacity_type,
        })
        pool = inst.tags.get("gpuops.io/pool") or inst.tags.get("pool")
        if pool:
            labels["gpuops.io/pool"] = pool
        labels.update(inst.node_labels)
        return Machine(
            name=inst.node_name, gpu_model=t.gpu_model, gpus=t.gpus, cpu=t.cpu, memory=t.memory,
            labels=labels, taints=[dict(x) for x in inst.node_taints], group=pool or t.name,
            provider_id=inst.provider_id, state="off", boot_seconds=self.options.boot_seconds,
            device_plugin_seconds=self.options.device_plugin_seconds, shutdown_seconds=0.0,
        )

    def _reclaim_due(self, inst: Instance) -> None:
        inst.reclaim_timer = None
        self._shut_down(inst, SPOT_RECLAIM)

    def _shut_down(self, inst: Instance, reason: dict[str, str]) -> None:
        if inst.state in ("shutting-down", "terminated"):
            return
        if inst.reclaim_timer is not None:
            inst.reclaim_timer.cancel()
            inst.reclaim_timer = None
        inst.state = "shutting-down"
        inst.state_reason = dict(reason)
        m = inst.machine
        if m is not None and self.fleet.get(m.name) is m:
            self.fleet.power_off(m.name)  # the OS goes down first: the kubelet stops now
        log.debug("spot instance shutting down", instance=inst.id, node=inst.node_name, reason=reason["code"])
        self._after(inst, self.options.terminate_seconds, self._to_terminated)

    def _to_terminated(self, inst: Instance) -> None:
        inst.state = "terminated"
        inst.terminated_at = time.time()
        m = inst.machine
        if m is not None and self.fleet.get(m.name) is m:
            self.fleet.remove(m.name)
        self._release(inst)
        log.debug("spot instance terminated", instance=inst.id, node=inst.node_name)
        self._after(inst, self.options.terminated_visible_seconds, self._purge)

    def _purge(self, inst: Instance) -> None:
        self.instances.pop(inst.id, None)
        launch = self.tokens.get(inst.client_token)
        if launch is not None and not any(i in self.instances for i in launch.ids):
            del self.tokens[inst.client_token]  # the token is forgotten with its last visible instance

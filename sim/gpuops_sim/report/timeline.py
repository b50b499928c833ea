"""Sampling the emulated cluster once a second into a timeline the live view, the plots and the report read.

`sample_from` turns plain objects (what the emulator's store holds, the machines' power states, the cloud's
instances) into one `Sample`; it is a pure function, so tests feed it synthetic objects. `sample_cluster` reads
a running `SimCluster` in-process (its store, its fleet, its cloud) and never anything of the operator's: what
the controllers did shows only through the objects they wrote. `Timeline` keeps the samples and answers the
questions the report asks (series per budget, power states over time, reclaim moments, ...).
The report plots the product's own view (MIG fragmentation as the operator's allocator sees it), so this module
may read `gpuops.accounting`, which the emulating modules never do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from gpuops.accounting import mig
from gpuops.accounting.errors import AccountingError
from gpuops.controllers.migslicer.api import profile_of_resource

if TYPE_CHECKING:
    from ..cluster.cluster import SimCluster

__all__ = ["MIG_PARTS", "POWER_STATES", "WAIT_REASONS", "BudgetPoint", "GroupPoint", "MigPoint", "PoolPoint", "Sample",
           "Timeline", "sample_cluster", "sample_from"]

BUDGETS = ("gpuops.io", "gpuworkloadbudgets")
NODE_GROUPS = ("gpuops.io", "gpunodegroups")
POOLS = ("gpuops.io", "spotpools")
MIG_NODES = ("gpuops.io", "mignodes")
CLAIMS = ("gpuops.io", "allocationclaims")
PODS = ("", "pods")
MIG_GATE = "gpuops.io/mig-slicer"
POOL_TAG = "gpuops.io/pool"
LIVE_INSTANCE_STATES = ("pending", "running", "shutting-down")
POWER_STATES = ("on", "booting", "shutting-down", "off")
"""A machine's power states, in the order the plots stack them."""
MIG_CONDITION = "gpuops.io/MigSlices"
LIVE_CLAIMS = ("Pending", "Created", "Bound")
MIG_PARTS = ("used", "unowned", "fragmented", "free")
"""How `MigPoint` splits the capacity, bottom to top of the plot's stack; the parts add up to the capacity."""

NOT_PLANNED = "gated, not planned yet"
NO_PLACEMENT = "no free placement"
CREATING = "slice being created"
QUEUED = "slice made, queued behind another pod's hand-off"
HANDING_OVER = "slice made, being handed to the kubelet"
CANNOT_PLACE = "cannot be placed (see the pod's condition)"
UNSCHEDULABLE = "ungated, unschedulable"
SCHEDULING = "ungated, being scheduled"
WAIT_REASONS = (NO_PLACEMENT, NOT_PLANNED, CREATING, QUEUED, HANDING_OVER, SCHEDULING, UNSCHEDULABLE, CANNOT_PLACE)
"""Why a MIG pod has no slice yet, in the order the plots stack them."""
_CONDITION_WAITS = {
    "NoCapacity": NO_PLACEMENT, "Planned": CREATING, "CreatingSlices": CREATING, "WaitingForNode": QUEUED,
    "Advertising": HANDING_OVER, "WaitingForKubelet": HANDING_OVER, "DeviceNotAdvertised": HANDING_OVER,
}
"""The MIG allocator's gpuops.io/MigSlices reasons -> wait reason; any other False reason is CANNOT_PLACE (a
request no GPU offers, an agent down, MIG disabled: no freed slice ends those waits)."""


@dataclass(frozen=True, slots=True)
class BudgetPoint:
    """One GPUWorkloadBudget at one moment: what its status says (None before the controller wrote one)."""

    consumed: float | None
    quota: float | None
    action: str
    exceeded: bool
    window_hours: float | None = None
    enforcement: str = ""
    """status.lastEnforcement.result (Alerted, Suspended, Marked, Evicted, ...): "" before the first step."""
    enforced_at: str = ""
    """status.lastEnforcement.time: a new value is a new enforcement step."""


@dataclass(frozen=True, slots=True)
class GroupPoint:
    """One GPUNodeGroup: the state the autoprovision controller wrote ("" before it did) and its machine."""

    state: str
    node: str


@dataclass(frozen=True, slots=True)
class PoolPoint:
    """One SpotPool: its status (desired, ready) and the cloud's live instances carrying its tag."""

    desired: int
    ready: int
    live: int


@dataclass(frozen=True, slots=True)
class MigPoint:
    """The MIG-enabled GPUs at one moment, in compute slices (a 1g slice is 1, 3g is 3, 7g is 7 of a GPU's 7), so
    that a 3g slice weighs three times a 1g one. used + unowned + fragmented + free == capacity."""

    capacity: int = 0
    """Compute slices of every MIG-enabled GPU of a model gpuops has tables for."""
    used: int = 0
    """Held by live AllocationClaims (Pending, Created or Bound): allocated to a pod, made or being made."""
    unowned: int = 0
    """Slices that exist without a live claim (their pod is gone or done): the agent destroys them."""
    fragmented: int = 0
    """Free, but no slice of the waiting pods' profiles fits there (placement rules): free compute a waiting pod
    cannot use. With no pod waiting, measured against every profile of the GPU (compute stranded for all)."""
    free: int = 0
    """Free and usable: slices of the waiting pods' profiles fit there."""
    demand: int = 0
    """Compute asked for by pods waiting for slices that are not placed yet (no live claim)."""
    waiting: Mapping[str, int] = field(default_factory=dict)
    """Wait reason (`WAIT_REASONS`) -> MIG pods with no slice yet, or slices not yet in the pod's hands."""
    gpus: int = 0
    """MIG-enabled GPUs the capacity is made of."""


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    """Seconds since the workload started."""
    budgets: Mapping[str, BudgetPoint] = field(default_factory=dict)
    power: Mapping[str, str] = field(default_factory=dict)
    """The scenario's own machines (not spot instances) -> power state (on, booting, shutting-down, off)."""
    groups: Mapping[str, GroupPoint] = field(default_factory=dict)
    pending_gpu_pods: int = 0
    """Pods asking for whole GPUs that no node has taken yet (what makes the autoprovisioner power on)."""
    pools: Mapping[str, PoolPoint] = field(default_factory=dict)
    launches: int = 0
    """Spot instances the cloud launched so far (cumulative)."""
    reclaims: int = 0
    """Reclaim notices the cloud sent so far (cumulative)."""
    slices: Mapping[str, int] = field(default_factory=dict)
    """MIG profile -> slices that exist on the MigNodes' GPUs."""
    slices_in_use: int = 0
    """Slices made for a claim (a pod's) rather than left over."""
    mig_waiting: int = 0
    """Pods held back by the MIG slicer's scheduling gate."""
    mig: MigPoint = field(default_factory=MigPoint)
    """The MIG GPUs' compute slices: capacity, used, fragmented, free; the waiting pods' demand and reasons."""


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _gpu_request(pod: Mapping[str, Any]) -> bool:
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            if str((res.get(part) or {}).get("nvidia.com/gpu", "0")) not in ("0", ""):
                return True
    return False


def _mig_profiles(pod: Mapping[str, Any]) -> list[str]:
    """One profile per slice the pod asks for (`gpuops.io/mig-*` once the webhook renamed it, `nvidia.com/mig-*`
    before): containers add up, an init container needs its own at most (as the scheduler counts)."""
    spec = pod.get("spec") or {}

    def wants(containers: Iterable[Mapping[str, Any]]) -> list[Counter[str]]:
        out = []
        for c in containers:
            res, got = c.get("resources") or {}, Counter[str]()
            for part in ("limits", "requests"):
                for key, value in (res.get(part) or {}).items():
                    profile, n = profile_of_resource(str(key)), _number(value)
                    if profile is not None and n is not None and n > 0:
                        got[profile] = max(got[profile], int(n))
            out.append(got)
        return out

    total: Counter[str] = Counter()
    for got in wants(spec.get("containers") or []):
        total.update(got)
    for got in wants(spec.get("initContainers") or []):
        total |= got
    return sorted(total.elements())


def _compute(profile: str) -> int:
    """Compute slices of a profile: NVIDIA's names start with them (3g.20gb: 3), on every model."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def _wait_reason(pod: Mapping[str, Any], claim_phases: list[str]) -> str:
    """Why a MIG pod that no node has taken yet still waits: its claims' phases say it best (they are the agent's
    own word), then the MIG allocator's condition, then the scheduler's."""
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    conditions = {str(c.get("type")): c for c in st.get("conditions") or []}
    if any(g.get("name") == MIG_GATE for g in spec.get("schedulingGates") or []):
        mine = conditions.get(MIG_CONDITION) or {}
        said = _CONDITION_WAITS.get(str(mine.get("reason", "")), CANNOT_PLACE)
        if claim_phases:  # the allocator allows one pod per node and profile in hand-off: the others queue
            return CREATING if "Pending" in claim_phases else QUEUED if said == QUEUED else HANDING_OVER
        if not mine:
            return NOT_PLANNED
        return HANDING_OVER if mine.get("status") == "True" else said
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return UNSCHEDULABLE
    return SCHEDULING


Slot = tuple[int, int, str]
"""(start, size, profile) of one slice or claimed placement on a GPU."""


@lru_cache(maxsize=4096)
def _split_gpu(model: str, occupied: frozenset[Slot], owned: frozenset[Slot],
               wanted: frozenset[str]) -> tuple[int, int, int, int, int]:
    """(capacity, used, unowned, fragmented, free) of one GPU in compute slices. Cached: GPUs share few states and
    this runs every second. `wanted` holds the waiting pods' profiles; those the model does not offer are left out
    and, if none is left, every profile counts (free compute none can use is stranded for all)."""
    geom = mig.geometry(model)
    offered = [p for p in sorted(wanted) if _offers(geom, p)]
    used = sum(_compute(p) for _, _, p in occupied & owned)
    unowned = sum(_compute(p) for _, _, p in occupied - owned)
    free = max(0, geom.compute_slices - used - unowned)
    try:
        usable = mig.usable_compute(geom, [mig.Placement(p, st, sz) for st, sz, p in occupied], offered or None)
    except AccountingError:  # slices and claims that overlap for a moment: no fragmentation it could show
        usable = free
    usable = min(usable, free)
    return geom.compute_slices, used, unowned, free - usable, usable


def _offers(geom: mig.Geometry, profile: str) -> bool:
    try:
        mig.parse_profile(geom, profile)
    except AccountingError:
        return False
    return True


def _gpu_slots(mig_nodes: Iterable[Mapping[str, Any]], live: Iterable[Mapping[str, Any]]) -> (
        dict[tuple[str, str], tuple[str, set[Slot], set[Slot]]]):
    """(node, GPU UUID) -> (model, occupied, claimed) of every MIG-enabled GPU with known tables: the slices the
    agent reports plus the live claims' placements (slices still being made occupy their place already)."""
    gpus: dict[tuple[str, str], tuple[str, set[Slot], set[Slot]]] = {}
    for n in mig_nodes:
        node = str((n.get("spec") or {}).get("nodeName") or (n.get("metadata") or {}).get("name", ""))
        for g in (n.get("status") or {}).get("gpus") or []:
            model = str(g.get("model") or "")
            if g.get("migMode") != "Enabled" or not model or not _known(model):
                continue
            slots = {(int(x.get("start", 0)), int(x.get("size", 0)), str(x.get("profile", ""))) for x in
                     g.get("slices") or []}
            gpus[(node, str(g.get("uuid", "")))] = (mig.normalize_model(model), slots, set())
    for c in live:
        spec = c.get("spec") or {}
        gpu = gpus.get((str(spec.get("nodeName", "")), str(spec.get("gpuUUID", ""))))
        if gpu is not None:
            slot = (int(spec.get("start", 0)), int(spec.get("size", 0)), str(spec.get("profile", "")))
            gpu[1].add(slot)
            gpu[2].add(slot)
    return gpus


def _known(model: str) -> bool:
    try:
        mig.geometry(model)
    except AccountingError:
        return False
    return True


def mig_point(mig_nodes: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
              pods: Iterable[Mapping[str, Any]]) -> MigPoint:
    """The MIG GPUs' compute slices and the waiting MIG pods, from MigNodes, AllocationClaims and pods."""
    live = [c for c in claims if ((c.get("status") or {}).get("phase") or "Pending") in LIVE_CLAIMS]
    phases: dict[str, list[str]] = {}
    for c in live:
        uid = str((c.get("spec") or {}).get("podUID", ""))
        phases.setdefault(uid, []).append(str((c.get("status") or {}).get("phase") or "Pending"))
    waiting: Counter[str] = Counter()
    wanted: set[str] = set()
    demand = 0
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("deletionTimestamp") or spec.get("nodeName") or (pod.get("status") or {}).get(
                "phase", "Pending") != "Pending":
            continue
        profiles = _mig_profiles(pod)
        if not profiles:
            continue
        reason = _wait_reason(pod, phases.get(str(meta.get("uid", "")), []))
        waiting[reason] += 1
        if reason not in (CREATING, QUEUED, HANDING_OVER, SCHEDULING, UNSCHEDULABLE):  # not placed yet
            wanted.update(profiles)
            demand += sum(_compute(p) for p in profiles)
    parts = [0, 0, 0, 0, 0]
    gpus = _gpu_slots(mig_nodes, live)
    for model, occupied, claimed in gpus.values():
        for i, v in enumerate(_split_gpu(model, frozenset(occupied), frozenset(claimed), frozenset(wanted))):
            parts[i] += v
    return MigPoint(capacity=parts[0], used=parts[1], unowned=parts[2], fragmented=parts[3], free=parts[4],
                    demand=demand, waiting={r: waiting[r] for r in WAIT_REASONS if waiting[r]}, gpus=len(gpus))


def sample_from(
    t: float,
    *,
    budgets: Iterable[Mapping[str, Any]] = (),
    node_groups: Iterable[Mapping[str, Any]] = (),
    pools: Iterable[Mapping[str, Any]] = (),
    mig_nodes: Iterable[Mapping[str, Any]] = (),
    claims: Iterable[Mapping[str, Any]] = (),
    pods: Iterable[Mapping[str, Any]] = (),
    machines: Iterable[tuple[str, str]] = (),
    instances: Iterable[tuple[str, str]] = (),
    launches: int = 0,
    reclaims: int = 0,
) -> Sample:
    """One sample from Kubernetes objects as dicts, machines as (name, power state) and the cloud's instances as
    (pool tag, state)."""
    mig_nodes, pods = list(mig_nodes), list(pods)
    bp = dict(map(_budget_point, budgets))
    groups = {str((g.get("metadata") or {}).get("name", "")):
              GroupPoint(state=str((g.get("status") or {}).get("state", "")),
                         node=str((g.get("spec") or {}).get("nodeName", "")))
              for g in node_groups}
    live: Counter[str] = Counter(tag for tag, state in instances if state in LIVE_INSTANCE_STATES)
    pp: dict[str, PoolPoint] = {}
    for p in pools:
        name = str((p.get("metadata") or {}).get("name", ""))
        st = p.get("status") or {}
        pp[name] = PoolPoint(desired=int(st.get("desired", 0)), ready=int(st.get("ready", 0)), live=live[name])
    slices: Counter[str] = Counter()
    in_use = 0
    for n in mig_nodes:
        for gpu in (n.get("status") or {}).get("gpus") or []:
            for s in gpu.get("slices") or []:
                slices[str(s.get("profile", "?"))] += 1
                in_use += bool(s.get("claim"))
    waiting = pending = 0
    for pod in pods:
        spec, st = pod.get("spec") or {}, pod.get("status") or {}
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if any(g.get("name") == MIG_GATE for g in spec.get("schedulingGates") or []):
            waiting += 1
        elif not spec.get("nodeName") and (st.get("phase") or "Pending") == "Pending" and _gpu_request(pod):
            pending += 1
    return Sample(t=t, budgets=bp, power=dict(machines), groups=groups, pending_gpu_pods=pending, pools=pp,
                  launches=launches, reclaims=reclaims, slices=dict(sorted(slices.items())), slices_in_use=in_use,
                  mig_waiting=waiting, mig=mig_point(mig_nodes, claims, pods))


def _budget_point(b: Mapping[str, Any]) -> tuple[str, BudgetPoint]:
    meta, spec, st = b.get("metadata") or {}, b.get("spec") or {}, b.get("status") or {}
    quota, last = spec.get("quota") or {}, st.get("lastEnforcement") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}", BudgetPoint(
        consumed=_number(st.get("consumedGpuHours")),
        quota=_number(quota.get("gpuHours")),
        action=str((spec.get("enforcement") or {}).get("action", "AlertOnly")),
        exceeded=any(c.get("type") == "QuotaExceeded" and c.get("status") == "True"
                     for c in st.get("conditions") or []),
        window_hours=_number(quota.get("windowHours")),
        enforcement=str(last.get("result") or ""),
        enforced_at=str(last.get("time") or ""),
    )


def sample_cluster(cluster: SimCluster, t: float) -> Sample:
    """Read a running emulated cluster in-process: its store, its machines and its cloud."""
    own_groups = {g.name for g in cluster.scenario.node_groups}
    registry = cluster.server.registry

    def objects(gr: tuple[str, str], kind: str) -> list[dict[str, Any]]:
        if gr[0] and registry.by_kind(gr[0], kind) is None:
            return []  # the CRD is not installed
        return list(cluster.access.iter(gr))

    spot = cluster.cloud.spot
    return sample_from(
        t,
        budgets=objects(BUDGETS, "GPUWorkloadBudget"),
        node_groups=objects(NODE_GROUPS, "GPUNodeGroup"),
        pools=objects(POOLS, "SpotPool"),
        mig_nodes=objects(MIG_NODES, "MigNode"),
        claims=objects(CLAIMS, "AllocationClaim"),
        pods=cluster.access.iter(PODS),
        machines=sorted((m.name, m.state) for m in cluster.fleet.machines.values() if m.group in own_groups),
        instances=[(i.tags.get(POOL_TAG, ""), i.state) for i in spot.instances.values()],
        launches=spot.launched,
        reclaims=spot.reclaimed,
    )


class Timeline:
    """Samples in time order and the series the plots and the report draw from them."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def add(self, sample: Sample) -> None:
        if self.samples and sample.t < self.samples[-1].t:
            raise ValueError(f"sample at t={sample.t} is older than the last one (t={self.samples[-1].t})")
        self.samples.append(sample)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    @property
    def times(self) -> list[float]:
        return [s.t for s in self.samples]

    # ------------------------------------------------------------------------------------------ budgets

    def budget_names(self) -> list[str]:
        return sorted({n for s in self.samples for n in s.budgets})

    def budget_series(self, name: str) -> list[BudgetPoint | None]:
        return [s.budgets.get(name) for s in self.samples]

    def first_exceeded(self, name: str) -> float | None:
        """When the budget's QuotaExceeded condition first showed True."""
        return next((s.t for s in self.samples if (b := s.budgets.get(name)) is not None and b.exceeded), None)

    def peak_consumed(self, name: str) -> float | None:
        values = [b.consumed for b in self.budget_series(name) if b is not None and b.consumed is not None]
        return max(values) if values else None

    def budget_percent(self, name: str) -> list[float | None]:
        """Consumption as % of the quota at each sample, so budgets of any size read on the same scale."""
        return [100.0 * b.consumed / b.quota if b is not None and b.consumed is not None and b.quota else None
                for b in self.budget_series(name)]

    def enforcement_steps(self, name: str) -> list[tuple[float, str]]:
        """(first sample showing it, result) of each enforcement step the budget's status.lastEnforcement
        recorded (a new time is a new step; steps between two samples show as the last of them)."""
        out: list[tuple[float, str]] = []
        seen = ""
        for s in self.samples:
            b = s.budgets.get(name)
            if b is not None and b.enforced_at and b.enforced_at != seen:
                seen = b.enforced_at
                out.append((s.t, b.enforcement))
        return out

    # ------------------------------------------------------------------------------------------ machines

    def machine_names(self) -> list[str]:
        return sorted({n for s in self.samples for n in s.power})

    def power_counts(self) -> dict[str, list[int]]:
        """Power state -> how many of the scenario's machines were in it at each sample."""
        out: dict[str, list[int]] = {state: [] for state in POWER_STATES}
        for s in self.samples:
            c = Counter(s.power.values())
            for state in POWER_STATES:
                out[state].append(c[state])
        return out

    def power_transitions(self, machine: str) -> tuple[int, int]:
        """(power-ons, power-offs) of one machine seen between samples: into booting, into shutting-down/off."""
        ons = offs = 0
        prev: str | None = None
        for s in self.samples:
            state = s.power.get(machine)
            if prev is not None and state is not None and state != prev:
                if state == "booting" or (state == "on" and prev in ("off", "shutting-down")):
                    ons += 1
                elif state in ("shutting-down", "off") and prev not in ("shutting-down", "off"):
                    offs += 1
            if state is not None:
                prev = state
        return ons, offs

    def seconds_in(self, machine: str, state: str) -> float:
        """Seconds the machine spent in `state`, each sample holding until the next one."""
        total = 0.0
        for a, b in zip(self.samples, self.samples[1:], strict=False):
            if a.power.get(machine) == state:
                total += b.t - a.t
        return total

    def group_names(self) -> list[str]:
        return sorted({n for s in self.samples for n in s.groups})

    # ------------------------------------------------------------------------------------------ spot pools

    def pool_names(self) -> list[str]:
        return sorted({n for s in self.samples for n in s.pools})

    def pool_series(self, name: str) -> list[PoolPoint | None]:
        return [s.pools.get(name) for s in self.samples]

    def reclaim_times(self) -> list[float]:
        """When reclaim notices were sent: the first sample that counts each (repeated for several at once)."""
        return self._increments([s.reclaims for s in self.samples])

    def launch_times(self) -> list[float]:
        """When spot instances were launched, as `reclaim_times`."""
        return self._increments([s.launches for s in self.samples])

    def _increments(self, counts: list[int]) -> list[float]:
        """Counts start at 0: what the first sample already counts happened by its time."""
        out: list[float] = []
        prev = 0
        for s, c in zip(self.samples, counts, strict=True):
            out += [s.t] * max(0, c - prev)
            prev = max(prev, c)
        return out

    # ------------------------------------------------------------------------------------------ MIG

    def profiles(self) -> list[str]:
        return sorted({p for s in self.samples for p in s.slices})

    def slice_series(self) -> dict[str, list[int]]:
        return {p: [s.slices.get(p, 0) for s in self.samples] for p in self.profiles()}

    def mig_series(self) -> dict[str, list[int]]:
        """capacity, the `MIG_PARTS` (which add up to it) and demand, in compute slices, at each sample."""
        keys = ("capacity", *MIG_PARTS, "demand")
        return {k: [int(getattr(s.mig, k)) for s in self.samples] for k in keys}

    def wait_series(self) -> dict[str, list[int]]:
        """Wait reason -> MIG pods waiting for it at each sample, only reasons that occurred, in `WAIT_REASONS`
        order."""
        seen = {r for s in self.samples for r in s.mig.waiting}
        return {r: [s.mig.waiting.get(r, 0) for s in self.samples] for r in WAIT_REASONS if r in seen}

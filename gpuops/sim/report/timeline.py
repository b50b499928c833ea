"""Sampling the emulated cluster once a second into a timeline the live view, the plots and the report read.

`sample_from` turns plain objects (what the emulator's store holds, the machines' power states, the cloud's
instances) into one `Sample`; it is a pure function, so tests feed it synthetic objects. `sample_cluster` reads
a running `SimCluster` in-process (its store, its fleet, its cloud) and never anything of the operator's: what
the controllers did shows only through the objects they wrote. `Timeline` keeps the samples and answers the
questions the report asks (series per budget, power states over time, reclaim moments, ...).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..cluster.cluster import SimCluster

__all__ = ["POWER_STATES", "BudgetPoint", "GroupPoint", "PoolPoint", "Sample", "Timeline", "sample_cluster",
           "sample_from"]

BUDGETS = ("gpuops.io", "gpuworkloadbudgets")
NODE_GROUPS = ("gpuops.io", "gpunodegroups")
POOLS = ("gpuops.io", "spotpools")
MIG_NODES = ("gpuops.io", "mignodes")
PODS = ("", "pods")
MIG_GATE = "gpuops.io/mig-slicer"
POOL_TAG = "gpuops.io/pool"
LIVE_INSTANCE_STATES = ("pending", "running", "shutting-down")
POWER_STATES = ("on", "booting", "shutting-down", "off")
"""A machine's power states, in the order the plots stack them."""


@dataclass(frozen=True, slots=True)
class BudgetPoint:
    """One GPUWorkloadBudget at one moment: what its status says (None before the controller wrote one)."""

    consumed: float | None
    quota: float | None
    action: str
    exceeded: bool


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


def sample_from(
    t: float,
    *,
    budgets: Iterable[Mapping[str, Any]] = (),
    node_groups: Iterable[Mapping[str, Any]] = (),
    pools: Iterable[Mapping[str, Any]] = (),
    mig_nodes: Iterable[Mapping[str, Any]] = (),
    pods: Iterable[Mapping[str, Any]] = (),
    machines: Iterable[tuple[str, str]] = (),
    instances: Iterable[tuple[str, str]] = (),
    launches: int = 0,
    reclaims: int = 0,
) -> Sample:
    """One sample from Kubernetes objects as dicts, machines as (name, power state) and the cloud's instances as
    (pool tag, state)."""
    bp: dict[str, BudgetPoint] = {}
    for b in budgets:
        meta, spec, st = b.get("metadata") or {}, b.get("spec") or {}, b.get("status") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        bp[name] = BudgetPoint(
            consumed=_number(st.get("consumedGpuHours")),
            quota=_number((spec.get("quota") or {}).get("gpuHours")),
            action=str((spec.get("enforcement") or {}).get("action", "AlertOnly")),
            exceeded=any(c.get("type") == "QuotaExceeded" and c.get("status") == "True"
                         for c in st.get("conditions") or []),
        )
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
                  mig_waiting=waiting)


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

"""Which GPU nodes to power on for pending pods, and which idle ones to power off.

A naive autoprovisioner (k8s-gpu-autoprovision, which gpuops replaces) compares cluster-wide GPU sums (a pod cannot
span nodes), ignores nodes that are already booting (re-POSTing power-on every tick) and only ever powers off the
single largest idle node, even when it is already off. This module decides per pod and per node instead:

* Scale-up is a per-pod first-fit-decreasing packing. Each pod, largest first, goes to the best-fitting free
  capacity of a Ready or PoweringOn node; failing that to a node this plan already powers on; failing that
  it powers on the smallest sufficient Off node (least waste on ties). The greedy result is then tightened
  until it is a fixpoint of: move pods back onto online nodes, place leftovers, drop any powered-on node
  whose pods fit elsewhere (exact search within a budget), swap a powered-on node for a smaller unchosen one
  that holds the same pods. The guarantees are listed on `plan_scale_up`.
* Scale-down powers off, largest first, every Ready node that has had no GPU pods for the unneeded time,
  unless that would leave fewer idle-available GPUs than the warm minimum or exceed the number of concurrent
  power-offs. Each call returns as many as the cap allows, so repeated calls reach every idle node.

Instants and durations are integer microseconds; GPU amounts are exact (`Fraction` or `int`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType

import msgspec

from gpuops.accounting.errors import AccountingError, NegativeValueError

__all__ = [
    "DEFAULT_SEARCH_BUDGET",
    "MINUTE",
    "BlockReason",
    "Blocked",
    "CapacityInputError",
    "GpuNode",
    "NodeState",
    "PendingPod",
    "ScaleDownPlan",
    "ScaleDownPolicy",
    "ScaleUpPlan",
    "Unschedulable",
    "UnschedulableReason",
    "find_assignment",
    "plan_scale_down",
    "plan_scale_up",
]

MINUTE = 60_000_000
"""One minute in microseconds (the unit of every instant and duration here)."""

DEFAULT_SEARCH_BUDGET = 20_000
"""Exact-search steps one plan may spend in total (a fraction of a second) before it keeps greedy answers."""

_MAX_EXACT_PODS = 256
"""Above this many placed pods only the greedy re-pack is tried (recursion depth and time stay bounded)."""


class CapacityInputError(AccountingError):
    """Malformed node or pod description: wrong type, duplicate name, impossible combination."""


class NodeState(enum.StrEnum):
    """Power state of a managed GPU node, as the autoprovision controller tracks it."""

    OFF = "Off"
    POWERING_ON = "PoweringOn"
    READY = "Ready"
    DRAINING = "Draining"
    POWERING_OFF = "PoweringOff"


_ONLINE = frozenset({NodeState.READY, NodeState.POWERING_ON})
_LEAVING = frozenset({NodeState.DRAINING, NodeState.POWERING_OFF})


def _gpus(value: object, what: str, *, positive: bool = False) -> Fraction:
    """Exact GPU amount or a typed error; floats are refused because they round quota comparisons."""
    if isinstance(value, bool) or not isinstance(value, Fraction | int):
        raise CapacityInputError(f"{what} must be a Fraction or int GPU amount, got {value!r}")
    amount = Fraction(value)
    if amount < 0:
        raise NegativeValueError(f"{what} must be >= 0 GPUs, got {amount}")
    if positive and amount == 0:
        raise CapacityInputError(f"{what} must be > 0 GPUs; pods without a GPU request are not GPU demand")
    return amount


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CapacityInputError(f"{what} must be an int, got {value!r}")
    if value < 0:
        raise NegativeValueError(f"{what} must be >= 0, got {value}")
    return value


class GpuNode(msgspec.Struct, frozen=True, kw_only=True):
    """One managed GPU node.

    `used` is the GPUs requested by pods bound to the node (Running or still starting), `gpu_pods` their
    number; a node with either non-zero is never powered off. `idle_since` is the instant (microseconds)
    since which the node has had no GPU pods, None when unknown or busy. `priority`: among Off nodes that fit
    equally well (same size, same waste), the higher is powered on first.
    """

    name: str
    capacity: Fraction | int
    state: NodeState
    used: Fraction | int = 0
    gpu_pods: int = 0
    idle_since: int | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise CapacityInputError(f"GpuNode.name must be a non-empty string, got {self.name!r}")
        msgspec.structs.force_setattr(self, "capacity", _gpus(self.capacity, f"GpuNode {self.name!r}.capacity"))
        msgspec.structs.force_setattr(self, "used", _gpus(self.used, f"GpuNode {self.name!r}.used"))
        _count(self.gpu_pods, f"GpuNode {self.name!r}.gpu_pods")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise CapacityInputError(f"GpuNode {self.name!r}.priority must be an int, got {self.priority!r}")
        if not isinstance(self.state, NodeState):
            raise CapacityInputError(
                f"GpuNode {self.name!r}.state must be a NodeState ({', '.join(s.value for s in NodeState)}),"
                f" got {self.state!r}"
            )
        if self.idle_since is not None and (isinstance(self.idle_since, bool) or not isinstance(self.idle_since, int)):
            raise CapacityInputError(
                f"GpuNode {self.name!r}.idle_since must be an int instant in microseconds or None,"
                f" got {self.idle_since!r}"
            )

    @property
    def free(self) -> Fraction:
        """GPUs not requested by bound pods; never negative even if allocatable shrank under running pods."""
        return max(Fraction(0), Fraction(self.capacity) - Fraction(self.used))


class PendingPod(msgspec.Struct, frozen=True, kw_only=True):
    """An unschedulable pod with its effective GPU request and the nodes its selectors/taints allow."""

    name: str
    gpus: Fraction | int
    eligible: frozenset[str]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise CapacityInputError(f"PendingPod.name must be a non-empty string, got {self.name!r}")
        msgspec.structs.force_setattr(self, "gpus", _gpus(self.gpus, f"PendingPod {self.name!r}.gpus", positive=True))
        eligible: object = self.eligible
        if isinstance(eligible, str) or not isinstance(eligible, Iterable):
            raise CapacityInputError(f"PendingPod {self.name!r}.eligible must be a set of node names, got {eligible!r}")
        msgspec.structs.force_setattr(self, "eligible", frozenset(eligible))


class UnschedulableReason(enum.StrEnum):
    """Why a pending pod gets no node in this plan (stable codes for Events and metrics)."""

    NO_ELIGIBLE_NODE = "NoEligibleNode"
    """No managed node matches the pod's selectors/affinity/tolerations."""
    TOO_LARGE = "TooLarge"
    """The request exceeds the capacity of every eligible node: powering anything on would not help."""
    NODES_LEAVING = "NodesPoweringOff"
    """Only eligible nodes big enough are Draining/PoweringOff; retry once they are Off."""
    WAITING_FOR_RUNNING_PODS = "WaitingForRunningPods"
    """Eligible nodes are big enough but their GPUs are held by bound pods."""
    CAPACITY_TAKEN = "CapacityTaken"
    """It would fit an eligible node alone, but that capacity went to other pending pods (larger first)."""


class Unschedulable(msgspec.Struct, frozen=True, kw_only=True):
    pod: str
    reason: UnschedulableReason
    message: str


class ScaleUpPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Nodes to power on (sorted by name), where each placeable pod is expected to land, and the rest."""

    power_on: tuple[str, ...]
    placements: Mapping[str, str]
    unschedulable: tuple[Unschedulable, ...]


def _index_nodes(nodes: Sequence[GpuNode]) -> dict[str, GpuNode]:
    by_name: dict[str, GpuNode] = {}
    for node in nodes:
        if not isinstance(node, GpuNode):
            raise CapacityInputError(f"nodes must hold GpuNode values, got {node!r}")
        if node.name in by_name:
            raise CapacityInputError(f"nodes: duplicate node name {node.name!r}; each node must appear once")
        by_name[node.name] = node
    return by_name


class _Packing:
    """Mutable scratch state of one scale-up computation."""

    def __init__(self, nodes: dict[str, GpuNode], pods: Sequence[PendingPod]) -> None:
        self.nodes = nodes
        # Integers in units of the common denominator of every amount: exact, and much cheaper than Fraction.
        scale = math.lcm(
            *(Fraction(n.free).denominator for n in nodes.values()), *(Fraction(p.gpus).denominator for p in pods)
        )
        self.free = {name: int(node.free * scale) for name, node in nodes.items()}
        self.online = sorted(n for n, node in nodes.items() if node.state in _ONLINE)
        self.off = sorted(n for n, node in nodes.items() if node.state is NodeState.OFF)
        # Largest first; name breaks ties so the result does not depend on input order.
        self.order = sorted(pods, key=lambda p: (-Fraction(p.gpus), p.name))
        self.size = {p.name: int(p.gpus * scale) for p in pods}
        self.eligible = {p.name: p.eligible & nodes.keys() for p in pods}
        self.where: dict[str, str] = {}
        self.chosen: set[str] = set()
        self.budget = _Budget(0)

    def lefts(self) -> dict[str, int]:
        left = dict(self.free)
        for pod, node in self.where.items():
            left[node] -= self.size[pod]
        return left

    def _open_key(self, pod: str, node: str, unplaced_after: list[str]) -> tuple[int, int, int, str]:
        """Smallest sufficient node first; on equal size the one the following pods would fill best, then the
        higher priority."""
        waste = self.free[node] - self.size[pod]
        for other in unplaced_after:
            if node in self.eligible[other] and self.size[other] <= waste:
                waste -= self.size[other]
        return (self.free[node], waste, -self.nodes[node].priority, node)

    def fill(self) -> None:
        """Place every unplaced pod: online capacity, then nodes already powered on by us, then a new one."""
        left = self.lefts()
        online_rank = {NodeState.READY: 0, NodeState.POWERING_ON: 1}
        pending = [p.name for p in self.order if p.name not in self.where]
        for i, pod in enumerate(pending):
            size, elig = self.size[pod], self.eligible[pod]
            for tier in (self.online, sorted(self.chosen)):
                fits = [n for n in tier if n in elig and left[n] >= size]
                if fits:
                    best = min(fits, key=lambda n: (left[n] - size, online_rank.get(self.nodes[n].state, 2), n))
                    break
            else:
                openable = [n for n in self.off if n not in self.chosen and n in elig and self.free[n] >= size]
                if not openable:
                    continue
                smallest = min(self.free[n] for n in openable)
                ties = [n for n in openable if self.free[n] == smallest]
                rest = [p for p in pending[i + 1 :] if p not in self.where] if len(ties) > 1 else []
                best = min(ties, key=lambda n: self._open_key(pod, n, rest))
                self.chosen.add(best)
            self.where[pod] = best
            left[best] -= size

    def pull_online(self) -> None:
        """Move pods from powered-on nodes to online leftovers, so no pod costs a boot it does not need."""
        left = self.lefts()
        for pod in [p.name for p in self.order if self.where.get(p.name) in self.chosen]:
            size = self.size[pod]
            fits = [n for n in self.online if n in self.eligible[pod] and left[n] >= size]
            if fits:
                best = min(fits, key=lambda n: (left[n] - size, n))
                left[self.where[pod]] += size
                left[best] -= size
                self.where[pod] = best
        used = set(self.where.values())
        self.chosen &= used

    def try_remove(self) -> bool:
        """Drop every powered-on node (largest first) whose pods, with all the others, fit on the online
        nodes plus the remaining chosen ones."""
        removed = False
        for node in sorted(self.chosen, key=lambda n: (-self.free[n], n)):
            if node not in self.chosen:
                continue
            bins = {n: self.free[n] for n in (*self.online, *sorted(self.chosen - {node}))}
            pods = [(p, self.size[p], self.eligible[p]) for p in self.where]
            assignment = _assign(pods, bins, self.budget)
            if assignment is not None:
                self.where = assignment
                self.chosen.discard(node)
                self.chosen &= set(self.where.values())
                removed = True
        return removed

    def try_swap(self) -> bool:
        """Replace a powered-on node by a strictly smaller unchosen Off node that holds the same pods."""
        for node in sorted(self.chosen, key=lambda n: (-self.free[n], n)):
            pods = [p for p, n in self.where.items() if n == node]
            load = sum(self.size[p] for p in pods)
            smaller = [
                m
                for m in self.off
                if m not in self.chosen
                and load <= self.free[m] < self.free[node]
                and all(m in self.eligible[p] for p in pods)
            ]
            if smaller:
                target = min(smaller, key=lambda m: (self.free[m], -self.nodes[m].priority, m))
                for p in pods:
                    self.where[p] = target
                self.chosen.discard(node)
                self.chosen.add(target)
                return True
        return False


class _Budget:
    """Exact-search steps left for one plan, shared by all its checks so the worst case stays bounded."""

    def __init__(self, steps: int) -> None:
        self.steps = steps


def find_assignment(
    pods: Sequence[tuple[str, Fraction, frozenset[str]]],
    bins: Mapping[str, Fraction],
    *,
    budget: int = DEFAULT_SEARCH_BUDGET,
) -> dict[str, str] | None:
    """An assignment of every pod (name, GPUs, eligible bins) to a bin with room, or None.

    First-fit-decreasing (best fit) first; if that fails, an exact depth-first search that gives up after
    `budget` steps. None therefore means "infeasible" when the search finished within its budget (always
    for a handful of pods) and "not found" beyond it; callers treat both as infeasible, which only ever
    keeps a node powered on that an exact solver might have dropped.
    """
    checked = [(name, _gpus(size, f"pods[{name!r}] GPUs", positive=True), frozenset(elig)) for name, size, elig in pods]
    room = {name: _gpus(free, f"bins[{name!r}]") for name, free in bins.items()}
    return _assign(checked, room, _Budget(budget))


def _assign(
    pods: Sequence[tuple[str, Fraction | int, frozenset[str]]],
    bins: Mapping[str, Fraction | int],
    budget: _Budget,
) -> dict[str, str] | None:
    if not pods:
        return {}
    # Integers in units of the common denominator: exact, and far cheaper than Fraction in the search.
    scale = math.lcm(*(p[1].denominator for p in pods), *(b.denominator for b in bins.values()))
    names = sorted(bins)
    room = [int(bins[n] * scale) for n in names]
    sizes = [int(p[1] * scale) for p in pods]
    # Cheap refusals first: most removal checks fail on total room or on how many pods could fit at all.
    smallest = min(sizes)
    if sum(sizes) > sum(room) or len(sizes) > sum(r // smallest for r in room):
        return None
    index = {n: i for i, n in enumerate(names)}
    order = sorted(
        (
            (name, size, sorted(index[n] for n in elig if n in index))
            for (name, _, elig), size in zip(pods, sizes, strict=True)
        ),
        key=lambda p: (-p[1], len(p[2]), p[0]),
    )
    left = list(room)
    greedy: dict[str, str] = {}
    for name, size, choices in order:
        best = -1
        for b in choices:
            if left[b] >= size and (best < 0 or left[b] < left[best]):
                best = b
        if best < 0:
            break
        greedy[name] = names[best]
        left[best] -= size
    else:
        return greedy
    if len(order) > _MAX_EXACT_PODS or budget.steps <= 0:
        return None
    placed = _exact(order, room, budget)
    return None if placed is None else {order[i][0]: names[b] for i, b in enumerate(placed)}


class _OutOfBudget(Exception):
    pass


def _exact(order: list[tuple[str, int, list[int]]], room: list[int], budget: _Budget) -> list[int] | None:
    """Depth-first search over pods (largest first) with two incremental bounds (total room, and how many
    of the smallest pod still fit) and symmetry pruning: bins that the same remaining pods may use are
    interchangeable when their room is equal."""
    left = list(room)
    signature = [frozenset(i for i, (_, _, ch) in enumerate(order) if b in ch) for b in range(len(room))]
    smallest = order[-1][1]
    suffix = [0] * (len(order) + 1)
    for i in range(len(order) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + order[i][1]
    total = sum(left)
    slots = sum(r // smallest for r in left)
    placed = [-1] * len(order)

    def go(i: int) -> bool:
        nonlocal total, slots
        if i == len(order):
            return True
        budget.steps -= 1
        if budget.steps < 0:
            raise _OutOfBudget
        if total < suffix[i] or slots < len(order) - i:
            return False
        size = order[i][1]
        tried: set[tuple[frozenset[int], int]] = set()
        for b in order[i][2]:
            before = left[b]
            if before < size or (signature[b], before) in tried:
                continue
            tried.add((signature[b], before))
            left[b] = before - size
            total -= size
            slots -= before // smallest - left[b] // smallest
            placed[i] = b
            if go(i + 1):
                return True
            slots += before // smallest - left[b] // smallest
            total += size
            left[b] = before
        return False

    try:
        return placed if go(0) else None
    except _OutOfBudget:
        return None


def _why(pod: PendingPod, nodes: dict[str, GpuNode]) -> Unschedulable:
    size = Fraction(pod.gpus)
    elig = sorted(pod.eligible & nodes.keys())
    if not elig:
        return Unschedulable(
            pod=pod.name,
            reason=UnschedulableReason.NO_ELIGIBLE_NODE,
            message="no managed node matches the pod's node selectors, affinity and tolerations",
        )
    usable = [n for n in elig if nodes[n].state not in _LEAVING]
    leaving = [n for n in elig if nodes[n].state in _LEAVING]
    if any(nodes[n].free >= size for n in usable):
        return Unschedulable(
            pod=pod.name,
            reason=UnschedulableReason.CAPACITY_TAKEN,
            message=f"needs {size} GPUs; the eligible nodes' free GPUs are planned for other pending pods",
        )
    if any(Fraction(nodes[n].capacity) >= size for n in usable):
        return Unschedulable(
            pod=pod.name,
            reason=UnschedulableReason.WAITING_FOR_RUNNING_PODS,
            message=f"needs {size} GPUs; eligible nodes that large are busy with bound pods",
        )
    if any(Fraction(nodes[n].capacity) >= size for n in leaving):
        return Unschedulable(
            pod=pod.name,
            reason=UnschedulableReason.NODES_LEAVING,
            message=f"needs {size} GPUs; only nodes being powered off are large enough (retry once they are Off)",
        )
    largest = max(Fraction(nodes[n].capacity) for n in elig)
    return Unschedulable(
        pod=pod.name,
        reason=UnschedulableReason.TOO_LARGE,
        message=f"needs {size} GPUs; the largest eligible node has {largest}",
    )


def plan_scale_up(
    nodes: Sequence[GpuNode],
    pods: Sequence[PendingPod],
    *,
    search_budget: int = DEFAULT_SEARCH_BUDGET,
) -> ScaleUpPlan:
    """Which Off nodes to power on so the pending pods fit, with per-pod placements.

    Guarantees of the returned plan (the tests check each one):

    * validity: a pod is placed only on a node it is eligible for that is Ready, PoweringOn or in
      `power_on`; the pods on a node never exceed its free GPUs (capacity - used). Draining and PoweringOff
      nodes are never used and never powered on; nodes already PoweringOn are counted, never re-requested.
    * online first: no pod placed on a powered-on node fits the leftover free GPUs of an eligible Ready or
      PoweringOn node.
    * every powered-on node hosts at least one placed pod, and no pod is left unplaced that fits alone into
      the leftover of an eligible online or powered-on node or into an eligible Off node that stays off.
    * irredundant: for every node in `power_on`, the placed pods cannot all be assigned to the online nodes'
      free GPUs plus the other powered-on nodes. Exact while the plan's searches stay within `search_budget`
      steps in total (always for small inputs); beyond that a node may be kept that an exact solver drops.
    * smallest sufficient: no powered-on node could be swapped for a strictly smaller Off node that stays
      off and is eligible for, and large enough for, all the pods placed on it.
    * number of pods placed: maximal against brute force when every pod may use every node and either at
      most one pending pod fits per node or all pods request the same amount; otherwise first-fit-decreasing
      is a heuristic and may leave a pod unplaced that a cleverer arrangement would place (the "fits alone"
      bullet above still holds).
    """
    if isinstance(search_budget, bool) or not isinstance(search_budget, int) or search_budget < 1:
        raise CapacityInputError(f"search_budget must be a positive int of search steps, got {search_budget!r}")
    by_name = _index_nodes(nodes)
    seen: set[str] = set()
    for pod in pods:
        if not isinstance(pod, PendingPod):
            raise CapacityInputError(f"pods must hold PendingPod values, got {pod!r}")
        if pod.name in seen:
            raise CapacityInputError(f"pods: duplicate pod name {pod.name!r}; each pending pod must appear once")
        seen.add(pod.name)

    packing = _Packing(by_name, pods)
    packing.budget.steps = search_budget
    packing.fill()
    while True:
        packing.pull_online()
        packing.fill()
        if not (packing.try_remove() or packing.try_swap()):
            break

    unschedulable = tuple(_why(p, by_name) for p in sorted(pods, key=lambda p: p.name) if p.name not in packing.where)
    return ScaleUpPlan(
        power_on=tuple(sorted(packing.chosen)),
        placements=MappingProxyType(dict(sorted(packing.where.items()))),
        unschedulable=unschedulable,
    )


class BlockReason(enum.StrEnum):
    """Why a Ready node is not powered off this cycle (stable codes for Events and metrics)."""

    HAS_GPU_PODS = "HasGPUPods"
    NEEDED_BY_PENDING = "NeededByPendingPods"
    NOT_UNNEEDED_LONG_ENOUGH = "NotUnneededLongEnough"
    SCALE_UP_COOLDOWN = "ScaleUpCooldown"
    POWER_OFF_LIMIT = "PowerOffLimit"


class Blocked(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    reason: BlockReason
    message: str


class ScaleDownPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Knobs of scale-down; defaults follow cluster-autoscaler (10 min unneeded, 10 min after a scale-up,
    10 empty nodes at once)."""

    min_warm_gpus: Fraction | int = 0
    max_concurrent_power_offs: int = 10
    unneeded_time: int = 10 * MINUTE
    scale_up_cooldown: int = 10 * MINUTE

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "min_warm_gpus", _gpus(self.min_warm_gpus, "min_warm_gpus"))
        _count(self.max_concurrent_power_offs, "max_concurrent_power_offs")
        _count(self.unneeded_time, "unneeded_time (microseconds)")
        _count(self.scale_up_cooldown, "scale_up_cooldown (microseconds)")


class ScaleDownPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Every Ready node appears in exactly one of the three fields."""

    power_off: tuple[str, ...]
    kept_warm: tuple[str, ...]
    blocked: tuple[Blocked, ...]


def plan_scale_down(
    nodes: Sequence[GpuNode],
    *,
    now: int,
    policy: ScaleDownPolicy | None = None,
    last_scale_up_at: int | None = None,
    needed: Collection[str] = (),
) -> ScaleDownPlan:
    """Ready nodes to power off now, largest first.

    A node qualifies when it has no GPU pods (`used == 0` and `gpu_pods == 0`, so pods still pulling images
    protect it), is not in `needed` (nodes a scale-up plan placed pending pods on), has been idle for at
    least `unneeded_time`, and no scale-up happened within `scale_up_cooldown` of `now`. Qualifying nodes
    are taken largest first while the free GPUs of the Ready and PoweringOn nodes left on stay >=
    `min_warm_gpus` (a node that would break it is kept warm, smaller ones are still tried) and while the
    power-offs in progress (Draining, PoweringOff) plus those chosen stay <= `max_concurrent_power_offs`.
    Off nodes are never chosen again, so repeated calls work through every idle node.
    """
    policy = ScaleDownPolicy() if policy is None else policy
    _check_instants(now, last_scale_up_at)
    by_name = _index_nodes(nodes)
    needed_set = frozenset(needed)
    cooling = last_scale_up_at is not None and now - last_scale_up_at < policy.scale_up_cooldown
    cooling_since = last_scale_up_at if cooling else None

    blocked: list[Blocked] = []
    candidates: list[GpuNode] = []
    for node in sorted(by_name.values(), key=lambda n: n.name):
        if node.state is not NodeState.READY:
            continue
        block = _why_not_idle(node, now=now, policy=policy, needed=needed_set, cooling_since=cooling_since)
        if block is None:
            candidates.append(node)
        else:
            blocked.append(block)

    power_off, kept_warm, limited = _take_largest_first(candidates, by_name.values(), policy)
    return ScaleDownPlan(
        power_off=tuple(power_off),
        kept_warm=tuple(sorted(kept_warm)),
        blocked=tuple(sorted([*blocked, *limited], key=lambda b: b.node)),
    )


def _check_instants(now: object, last_scale_up_at: object) -> None:
    """Instants are int microseconds; a float would make idle-time comparisons round."""
    if isinstance(now, bool) or not isinstance(now, int):
        raise CapacityInputError(f"now must be an int instant in microseconds, got {now!r}")
    if last_scale_up_at is not None and (isinstance(last_scale_up_at, bool) or not isinstance(last_scale_up_at, int)):
        raise CapacityInputError(
            f"last_scale_up_at must be an int instant in microseconds or None, got {last_scale_up_at!r}"
        )


def _why_not_idle(
    node: GpuNode, *, now: int, policy: ScaleDownPolicy, needed: frozenset[str], cooling_since: int | None
) -> Blocked | None:
    """Why a Ready node may not be powered off regardless of the others, or None when it is a candidate.

    `cooling_since` is the last scale-up instant when it is still within the cool-down, else None.
    """
    if node.used > 0 or node.gpu_pods > 0:
        return Blocked(
            node=node.name,
            reason=BlockReason.HAS_GPU_PODS,
            message=f"{node.gpu_pods} GPU pods bound, {node.used} GPUs requested",
        )
    if node.name in needed:
        return Blocked(
            node=node.name,
            reason=BlockReason.NEEDED_BY_PENDING,
            message="pending pods are planned onto this node's free GPUs",
        )
    if node.idle_since is None or now - node.idle_since < policy.unneeded_time:
        idle_for = "unknown time" if node.idle_since is None else f"{max(0, now - node.idle_since)} us"
        return Blocked(
            node=node.name,
            reason=BlockReason.NOT_UNNEEDED_LONG_ENOUGH,
            message=f"idle for {idle_for}, needs {policy.unneeded_time} us",
        )
    if cooling_since is not None:
        return Blocked(
            node=node.name,
            reason=BlockReason.SCALE_UP_COOLDOWN,
            message=f"last scale-up {now - cooling_since} us ago, cool-down {policy.scale_up_cooldown} us",
        )
    return None


def _take_largest_first(
    candidates: list[GpuNode], nodes: Iterable[GpuNode], policy: ScaleDownPolicy
) -> tuple[list[str], list[str], list[Blocked]]:
    """Candidates to power off, to keep warm, and blocked by the power-off limit.

    Largest first, so one power-off frees the most; a node whose power-off would take the online free GPUs
    below the warm minimum is kept and smaller ones are still tried.
    """
    everything = list(nodes)
    in_progress = sum(1 for n in everything if n.state in _LEAVING)
    slots = max(0, policy.max_concurrent_power_offs - in_progress)
    warm = sum((n.free for n in everything if n.state in _ONLINE), Fraction(0))
    min_warm = Fraction(policy.min_warm_gpus)

    power_off: list[str] = []
    kept_warm: list[str] = []
    limited: list[Blocked] = []
    assert all(n.idle_since is not None for n in candidates)
    for node in sorted(candidates, key=lambda n: (-Fraction(n.capacity), n.idle_since, n.name)):
        if warm - node.free < min_warm:
            kept_warm.append(node.name)
        elif len(power_off) >= slots:
            limited.append(
                Blocked(
                    node=node.name,
                    reason=BlockReason.POWER_OFF_LIMIT,
                    message=f"{in_progress + len(power_off)} power-offs in progress,"
                    f" limit {policy.max_concurrent_power_offs}",
                )
            )
        else:
            power_off.append(node.name)
            warm -= node.free
    return power_off, kept_warm, limited

"""Spot pool sizing: how many instances the pool should have, how many to launch, which to retire.

The tutorial's Spotpool reconciler counted every instance in the region, launched `minimum - running`
without regard to launches still in flight (duplicate GPU instances after a slow RunInstances), terminated an
arbitrary prefix of the list (PENDING instances make TerminateInstances fail) and ignored the 100-id batch
limit. Here the caller passes only the pool's own instances (found by ownership tag) and the number of
launches it has asked for that do not show up in the listing yet; the plan never lets live plus in-flight
instances exceed `maximum`, never retires below the target, retires the cheapest-to-lose instances first and
cuts every call into batches the cloud API accepts.

State names are Tencent Cloud CVM's; an EC2 provider maps its own (pending -> PENDING, running -> RUNNING,
stopping -> STOPPING, shutting-down -> TERMINATING, ...).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from fractions import Fraction

import msgspec

from gpuops.accounting.errors import AccountingError, NegativeValueError

__all__ = [
    "API_BATCH_LIMIT",
    "InstanceState",
    "PoolInstance",
    "PoolPlan",
    "PoolSpec",
    "PoolSpecError",
    "instances_needed",
    "plan_pool",
]

API_BATCH_LIMIT = 100
"""Most instance ids TerminateInstances (and DescribeInstances by id) accepts per call."""


class PoolSpecError(AccountingError):
    """Malformed pool spec, instance or demand: wrong type, bounds reversed, duplicate id."""


class InstanceState(enum.StrEnum):
    """Cloud instance states (Tencent CVM names)."""

    PENDING = "PENDING"
    LAUNCH_FAILED = "LAUNCH_FAILED"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    STARTING = "STARTING"
    STOPPING = "STOPPING"
    REBOOTING = "REBOOTING"
    SHUTDOWN = "SHUTDOWN"
    TERMINATING = "TERMINATING"


LIVE_STATES = frozenset({InstanceState.PENDING, InstanceState.STARTING, InstanceState.RUNNING, InstanceState.REBOOTING})
"""Instances that are, or are about to be, capacity: they count against `maximum`."""

RETIRABLE_STATES = frozenset({InstanceState.RUNNING})
"""TerminateInstances refuses PENDING, STARTING and REBOOTING instances (UnsupportedOperation.InstanceState*)."""


def _int(value: object, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PoolSpecError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        if minimum == 0:
            raise NegativeValueError(f"{what} must be >= 0, got {value}")
        raise PoolSpecError(f"{what} must be >= {minimum}, got {value}")
    return value


def _gpus(value: object, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, Fraction | int):
        raise PoolSpecError(f"{what} must be a Fraction or int GPU amount, got {value!r}")
    amount = Fraction(value)
    if amount < 0:
        raise NegativeValueError(f"{what} must be > 0 GPUs, got {amount}")
    if amount == 0:
        raise PoolSpecError(f"{what} must be > 0 GPUs, got 0")
    return amount


class PoolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds and shape of one pool. `batch_limit` caps ids per terminate call and instances per launch."""

    minimum: int
    maximum: int
    instance_gpus: Fraction | int
    batch_limit: int = API_BATCH_LIMIT

    def __post_init__(self) -> None:
        _int(self.minimum, "PoolSpec.minimum")
        _int(self.maximum, "PoolSpec.maximum")
        if self.maximum < self.minimum:
            raise PoolSpecError(
                f"PoolSpec.maximum ({self.maximum}) must be >= PoolSpec.minimum ({self.minimum}); swap or raise it"
            )
        msgspec.structs.force_setattr(self, "instance_gpus", _gpus(self.instance_gpus, "PoolSpec.instance_gpus"))
        _int(self.batch_limit, "PoolSpec.batch_limit", minimum=1)
        if self.batch_limit > API_BATCH_LIMIT:
            raise PoolSpecError(
                f"PoolSpec.batch_limit must be <= {API_BATCH_LIMIT} (ids per TerminateInstances call),"
                f" got {self.batch_limit}"
            )


class PoolInstance(msgspec.Struct, frozen=True, kw_only=True):
    """One instance owned by the pool. `node` is the Kubernetes node it joined as (None: not joined yet);
    `gpu_pods` the GPU pods bound to that node; `created_at` the launch instant in microseconds."""

    id: str
    state: InstanceState
    created_at: int
    node: str | None = None
    gpu_pods: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise PoolSpecError(f"PoolInstance.id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.state, InstanceState):
            raise PoolSpecError(
                f"PoolInstance {self.id!r}.state must be an InstanceState"
                f" ({', '.join(s.value for s in InstanceState)}), got {self.state!r}"
            )
        if isinstance(self.created_at, bool) or not isinstance(self.created_at, int):
            raise PoolSpecError(
                f"PoolInstance {self.id!r}.created_at must be an int instant in microseconds, got {self.created_at!r}"
            )
        _int(self.gpu_pods, f"PoolInstance {self.id!r}.gpu_pods")
        if self.node is not None and (not isinstance(self.node, str) or not self.node):
            raise PoolSpecError(f"PoolInstance {self.id!r}.node must be a node name or None, got {self.node!r}")
        if self.node is None and self.gpu_pods:
            raise PoolSpecError(
                f"PoolInstance {self.id!r} has gpu_pods={self.gpu_pods} but no node: pods run on a joined node"
            )


class PoolPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What to do this reconcile. Never both a launch and a retirement.

    `live` counts PENDING/STARTING/RUNNING/REBOOTING instances; `launch` is how many to request now (the
    rest, if capped by `batch_limit`, next reconcile); `retire` and `cleanup` are id batches of at most
    `batch_limit` ids, one TerminateInstances call each. `cleanup` holds LAUNCH_FAILED instances, which are
    not capacity but still cost a quota slot. `unfit` lists pending pods larger than one instance.
    """

    target: int
    live: int
    launch: int
    retire: tuple[tuple[str, ...], ...]
    cleanup: tuple[tuple[str, ...], ...]
    unfit: tuple[str, ...]


def _batches(ids: Sequence[str], size: int) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(ids[i : i + size]) for i in range(0, len(ids), size))


def instances_needed(
    pending: Mapping[str, Fraction | int], instance_gpus: Fraction | int
) -> tuple[int, tuple[str, ...]]:
    """Fresh instances the pending pods need (first-fit-decreasing onto empty instances), and the pods that
    fit no instance of this shape and so never justify a launch."""
    shape = _gpus(instance_gpus, "instance_gpus")
    sizes: list[tuple[Fraction, str]] = []
    unfit: list[str] = []
    for name, gpus in pending.items():
        size = _gpus(gpus, f"pending[{name!r}]")
        if size > shape:
            unfit.append(name)
        else:
            sizes.append((size, name))
    left: list[Fraction] = []
    for size, _ in sorted(sizes, key=lambda s: (-s[0], s[1])):
        for i, room in enumerate(left):
            if room >= size:
                left[i] -= size
                break
        else:
            left.append(shape - size)
    return len(left), tuple(sorted(unfit))


def plan_pool(
    spec: PoolSpec,
    instances: Sequence[PoolInstance],
    *,
    in_flight: int = 0,
    pending: Mapping[str, Fraction | int] | None = None,
) -> PoolPlan:
    """Launch or retire instances so the pool approaches its target.

    Target: without `pending`, the current live count clamped to [minimum, maximum] (the pool only enforces
    its bounds). With `pending` (name -> GPUs of the unschedulable pods this pool could serve), the live
    instances that host GPU pods plus the fresh instances those pods need, clamped; idle instances beyond
    that are retired, instances still joining absorb pending pods before any new launch.

    Launch: `target - live - in_flight`, never letting live + in-flight exceed `maximum`, at most
    `batch_limit` per call. `in_flight` is the launches requested but not yet listed.

    Retire: the first `live - target` live instances ordered not joined first, then fewest GPU pods, then
    newest, then id; of those only the RUNNING ones now (the API refuses PENDING/STARTING/REBOOTING; they
    are retired on a later reconcile). In-flight launches have no id yet and are judged once listed.
    """
    _check_pool_args(spec, instances, in_flight)
    live = [i for i in instances if i.state in LIVE_STATES]
    target, unfit = _target(spec, live, pending)
    launch, retire = _launch_or_retire(spec, live, target, in_flight)
    failed = sorted(i.id for i in instances if i.state is InstanceState.LAUNCH_FAILED)
    return PoolPlan(
        target=target,
        live=len(live),
        launch=launch,
        retire=_batches(retire, spec.batch_limit),
        cleanup=_batches(failed, spec.batch_limit),
        unfit=unfit,
    )


def _check_pool_args(spec: object, instances: Sequence[object], in_flight: object) -> None:
    """Typed errors for a malformed call; a duplicate id would count one instance twice."""
    if not isinstance(spec, PoolSpec):
        raise PoolSpecError(f"spec must be a PoolSpec, got {spec!r}")
    _int(in_flight, "in_flight")
    seen: set[str] = set()
    for inst in instances:
        if not isinstance(inst, PoolInstance):
            raise PoolSpecError(f"instances must hold PoolInstance values, got {inst!r}")
        if inst.id in seen:
            raise PoolSpecError(f"instances: duplicate instance id {inst.id!r}; list each instance once")
        seen.add(inst.id)


def _target(
    spec: PoolSpec, live: list[PoolInstance], pending: Mapping[str, Fraction | int] | None
) -> tuple[int, tuple[str, ...]]:
    """The instance count to approach, clamped to the pool's bounds, and the pending pods no instance fits."""
    unfit: tuple[str, ...] = ()
    if pending is None:
        wanted = len(live)
    else:
        needed, unfit = instances_needed(pending, spec.instance_gpus)
        wanted = sum(1 for i in live if i.gpu_pods > 0) + needed
    return min(max(wanted, spec.minimum), spec.maximum), unfit


def _launch_or_retire(spec: PoolSpec, live: list[PoolInstance], target: int, in_flight: int) -> tuple[int, list[str]]:
    """How many to launch now, or which instance ids to retire now (never both)."""
    launch = 0
    retire: list[str] = []
    have = len(live) + in_flight
    if have < target:
        launch = min(target - have, spec.maximum - have, spec.batch_limit)
    elif len(live) > target:
        # Choose among all live instances, then skip the ones the API refuses to terminate: a PENDING
        # instance that should go is retired once RUNNING, rather than substituting a joined, busier one.
        ranked = sorted(live, key=lambda i: (i.node is not None, i.gpu_pods, -i.created_at, i.id))
        retire = [i.id for i in ranked[: len(live) - target] if i.state in RETIRABLE_STATES]
    return launch, retire

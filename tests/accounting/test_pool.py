"""Spot pool sizing: bounds, in-flight launches, retire order and API batches; regressions from the
kubebuilder Spotpool tutorial's reconciler (duplicate launches, pending instances terminated, batches over
the API's 100-id limit, LAUNCH_FAILED instances counted, no scaling between the bounds with demand)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.accounting.errors import NegativeValueError
from gpuops.accounting.pool import (
    API_BATCH_LIMIT,
    LIVE_STATES,
    InstanceState,
    PoolInstance,
    PoolPlan,
    PoolSpec,
    PoolSpecError,
    instances_needed,
    plan_pool,
)

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
S = InstanceState


@st.composite
def specs(draw: st.DrawFn) -> PoolSpec:
    lo = draw(st.integers(0, 6))
    hi = draw(st.integers(lo, lo + 8))
    return PoolSpec(
        minimum=lo,
        maximum=hi,
        instance_gpus=draw(st.sampled_from([Fraction(1), Fraction(2), Fraction(4), Fraction(8), Fraction(1, 2)])),
        batch_limit=draw(st.sampled_from([1, 2, 3, 100])),
    )


@st.composite
def fleets(draw: st.DrawFn) -> list[PoolInstance]:
    n = draw(st.integers(0, 14))
    out = []
    for i in range(n):
        joined = draw(st.booleans())
        out.append(
            PoolInstance(
                id=f"ins-{i:02}",
                state=draw(st.sampled_from([S.RUNNING, S.RUNNING, S.RUNNING, *S])),
                created_at=draw(st.integers(0, 50)),
                node=f"node-{i}" if joined else None,
                gpu_pods=draw(st.integers(0, 3)) if joined else 0,
            )
        )
    return out


demand = st.one_of(
    st.none(),
    st.dictionaries(
        st.text("abcdef", min_size=1, max_size=4),
        st.integers(1, 20).map(lambda k: Fraction(k, 2)),
        max_size=8,
    ),
)


def retire_key(i: PoolInstance) -> tuple[bool, int, int, str]:
    return (i.node is not None, i.gpu_pods, -i.created_at, i.id)


@PROPS
@given(specs(), fleets(), st.integers(0, 6), demand)
def test_pool_plan_invariants(
    spec: PoolSpec, fleet: list[PoolInstance], in_flight: int, pending: dict[str, Fraction] | None
) -> None:
    plan = plan_pool(spec, fleet, in_flight=in_flight, pending=pending)
    live = [i for i in fleet if i.state in LIVE_STATES]
    assert plan.live == len(live)
    assert spec.minimum <= plan.target <= spec.maximum
    # Never above maximum counting in-flight launches; a launch only when below target.
    assert plan.launch >= 0
    if plan.launch:
        assert len(live) + in_flight + plan.launch <= min(spec.maximum, plan.target)
        assert plan.launch <= spec.batch_limit
        assert plan.retire == ()
    retired = [x for batch in plan.retire for x in batch]
    by_id = {i.id: i for i in fleet}
    assert len(set(retired)) == len(retired)
    # Never retire PENDING (the API refuses it) or anything but RUNNING; never below target (>= minimum).
    assert all(by_id[x].state is S.RUNNING for x in retired)
    if retired:
        assert len(live) - len(retired) >= plan.target >= spec.minimum
    # Retire order: not joined, then fewest GPU pods, then newest. The first `excess` live instances in
    # that order are the ones to go; of those exactly the RUNNING ones go now.
    excess = sorted(live, key=retire_key)[: max(0, len(live) - plan.target)]
    assert sorted(retired) == sorted(i.id for i in excess if i.state is S.RUNNING)
    # Batches the cloud API accepts.
    for batch in (*plan.retire, *plan.cleanup):
        assert 1 <= len(batch) <= spec.batch_limit <= API_BATCH_LIMIT
    assert sorted(x for b in plan.cleanup for x in b) == sorted(i.id for i in fleet if i.state is S.LAUNCH_FAILED)


@PROPS
@given(specs(), fleets(), demand)
def test_repeated_reconciles_converge_to_target(
    spec: PoolSpec, fleet: list[PoolInstance], pending: dict[str, Fraction] | None
) -> None:
    """Launches become PENDING, then RUNNING, retirements vanish: the pool settles at its target and
    never exceeds its maximum on the way (beyond what it already exceeded)."""
    instances = {i.id: i for i in fleet}
    in_flight = 0
    start_live = sum(1 for i in fleet if i.state in LIVE_STATES)
    seq = 0
    for step in range(30):
        plan = plan_pool(spec, list(instances.values()), in_flight=in_flight, pending=pending)
        live = sum(1 for i in instances.values() if i.state in LIVE_STATES)
        assert live + in_flight <= max(spec.maximum, start_live)
        # The cloud: earlier launches show up PENDING, PENDING/STARTING/REBOOTING become RUNNING.
        for i in list(instances.values()):
            if i.state in (S.PENDING, S.STARTING, S.REBOOTING):
                instances[i.id] = PoolInstance(id=i.id, state=S.RUNNING, created_at=i.created_at)
        for _ in range(in_flight):
            seq += 1
            instances[f"new-{seq:03}"] = PoolInstance(id=f"new-{seq:03}", state=S.PENDING, created_at=100 + step)
        in_flight = plan.launch
        for batch in plan.retire:
            for x in batch:
                del instances[x]
    final = plan_pool(spec, list(instances.values()), in_flight=in_flight, pending=pending)
    assert final.launch == 0 and final.retire == ()
    assert final.live == final.target


@PROPS
@given(st.lists(st.integers(1, 16).map(lambda k: Fraction(k, 2)), max_size=12), st.sampled_from([1, 2, 4, 8]))
def test_instances_needed_bounds(sizes: list[Fraction], shape: int) -> None:
    pending = {f"p{i}": s for i, s in enumerate(sizes)}
    needed, unfit = instances_needed(pending, shape)
    fitting = [s for s in sizes if s <= shape]
    assert sorted(unfit) == sorted(f"p{i}" for i, s in enumerate(sizes) if s > shape)
    assert math.ceil(sum(fitting, Fraction(0)) / shape) <= needed <= len(fitting)
    # First-fit-decreasing leaves at most one instance half empty or emptier.
    assert needed <= math.floor(2 * sum(fitting, Fraction(0)) / shape) + 1


# ---------------------------------------------------------------- regressions


def running(i: int, *, node: bool = True, pods: int = 0, created: int = 0) -> PoolInstance:
    return PoolInstance(
        id=f"ins-{i:03}", state=S.RUNNING, created_at=created, node=f"n{i}" if node else None, gpu_pods=pods
    )


def test_in_flight_launches_prevent_duplicate_instances() -> None:
    """Tutorial: `RunInstances(minimum - running)` each reconcile; a slow launch was requested again."""
    spec = PoolSpec(minimum=3, maximum=5, instance_gpus=8)
    assert plan_pool(spec, [], in_flight=0).launch == 3
    assert plan_pool(spec, [], in_flight=3).launch == 0
    pending = [PoolInstance(id=f"i{i}", state=S.PENDING, created_at=0) for i in range(2)]
    assert plan_pool(spec, pending, in_flight=1).launch == 0


def test_maximum_counts_in_flight_under_demand() -> None:
    spec = PoolSpec(minimum=0, maximum=4, instance_gpus=4)
    demand = {f"p{i}": 4 for i in range(10)}
    plan = plan_pool(spec, [running(0, pods=1)], in_flight=2, pending=demand)
    assert plan.target == 4 and plan.launch == 1


def test_pending_instances_are_never_terminated() -> None:
    """Tutorial: scale-in terminated an arbitrary prefix; PENDING ones fail with
    UnsupportedOperation.InstanceStatePending."""
    spec = PoolSpec(minimum=0, maximum=1, instance_gpus=8)
    fleet = [PoolInstance(id=f"p{i}", state=S.PENDING, created_at=i) for i in range(3)] + [running(9)]
    plan = plan_pool(spec, fleet)
    # The three PENDING ones are the ones to go (not joined); they wait, the joined one is not substituted.
    assert plan.retire == ()
    fleet = [PoolInstance(id=f"p{i}", state=S.PENDING, created_at=i) for i in range(3)] + [running(8), running(9)]
    assert plan_pool(spec, fleet).retire == (("ins-008",),)


def test_retire_order_not_joined_then_fewest_pods_then_newest() -> None:
    spec = PoolSpec(minimum=1, maximum=1, instance_gpus=8)
    fleet = [
        running(1, pods=2, created=10),
        running(2, pods=0, created=5),
        running(3, pods=0, created=7),
        running(4, node=False, created=1),
        running(5, pods=1, created=99),
    ]
    plan = plan_pool(spec, fleet)
    assert plan.retire == (("ins-004", "ins-003", "ins-002", "ins-005"),)


def test_retire_batches_respect_the_100_id_limit() -> None:
    """Tutorial: ignored TerminateInstances' 100-id limit."""
    spec = PoolSpec(minimum=0, maximum=300, instance_gpus=1)
    fleet = [running(i, created=i) for i in range(250)]
    plan = plan_pool(spec, fleet, pending={})
    assert [len(b) for b in plan.retire] == [100, 100, 50]
    spec = PoolSpec(minimum=250, maximum=300, instance_gpus=1)
    assert plan_pool(spec, [], in_flight=0).launch == 100


def test_launch_failed_is_not_capacity_and_is_cleaned_up() -> None:
    spec = PoolSpec(minimum=2, maximum=4, instance_gpus=8)
    fleet = [PoolInstance(id="bad", state=S.LAUNCH_FAILED, created_at=0), running(1)]
    plan = plan_pool(spec, fleet)
    assert plan.live == 1 and plan.launch == 1 and plan.cleanup == (("bad",),)


def test_demand_scales_between_bounds() -> None:
    """Tutorial: never scaled between minimum and maximum by demand."""
    spec = PoolSpec(minimum=1, maximum=10, instance_gpus=8)
    fleet = [running(1, pods=1), running(2, pods=0)]
    # Three 5-GPU pods need three fresh 8-GPU instances; a 16-GPU pod fits none and is reported.
    plan = plan_pool(spec, fleet, pending={"a": 5, "b": 5, "c": 5, "huge": 16})
    assert (plan.target, plan.launch, plan.unfit) == (4, 2, ("huge",))
    # No demand: the idle instance goes, the busy one stays.
    plan = plan_pool(spec, fleet, pending={})
    assert (plan.target, plan.retire) == (1, (("ins-002",),))
    # Without demand input the pool only enforces its bounds.
    assert plan_pool(spec, fleet) == PoolPlan(target=2, live=2, launch=0, retire=(), cleanup=(), unfit=())


def test_joining_instances_absorb_pending_pods() -> None:
    spec = PoolSpec(minimum=0, maximum=10, instance_gpus=4)
    joining = [running(i, node=False) for i in range(2)]
    plan = plan_pool(spec, joining, pending={"a": 4, "b": 4})
    assert (plan.target, plan.launch, plan.retire) == (2, 0, ())


def test_bad_input_raises_typed_errors() -> None:
    with pytest.raises(PoolSpecError, match="maximum"):
        PoolSpec(minimum=3, maximum=2, instance_gpus=1)
    with pytest.raises(NegativeValueError, match="minimum"):
        PoolSpec(minimum=-1, maximum=2, instance_gpus=1)
    with pytest.raises(PoolSpecError, match="batch_limit"):
        PoolSpec(minimum=0, maximum=2, instance_gpus=1, batch_limit=101)
    with pytest.raises(PoolSpecError, match="Fraction or int"):
        PoolSpec(minimum=0, maximum=2, instance_gpus=0.5)  # type: ignore[arg-type]
    with pytest.raises(PoolSpecError, match="> 0"):
        PoolSpec(minimum=0, maximum=2, instance_gpus=0)
    spec = PoolSpec(minimum=0, maximum=2, instance_gpus=1)
    with pytest.raises(PoolSpecError, match="duplicate instance id"):
        plan_pool(spec, [running(1), running(1)])
    with pytest.raises(NegativeValueError, match="in_flight"):
        plan_pool(spec, [], in_flight=-1)
    with pytest.raises(PoolSpecError, match="InstanceState"):
        PoolInstance(id="x", state="RUNNING", created_at=0)  # type: ignore[arg-type]
    with pytest.raises(PoolSpecError, match="no node"):
        PoolInstance(id="x", state=S.RUNNING, created_at=0, gpu_pods=1)
    with pytest.raises(PoolSpecError, match=r"pending\['p'\]"):
        plan_pool(spec, [], pending={"p": 0})
    assert issubclass(PoolSpecError, ValueError)

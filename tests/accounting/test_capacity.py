"""Scale-up/scale-down planning: property tests against brute force, and the seed autoprovisioner's defects.

The seed (dseif0x/k8s-gpu-autoprovision main.go) defects, by the numbers the tests below use:
  1  only the largest idle node is ever powered off, and it is picked again once it is off;
  2  no power state: a booting (or on but empty) node's capacity is ignored and it is POSTed again;
  3  pods bound to a node but not Running yet count as pending demand;
  4  a node whose pods are still starting can be powered off;
  5  no unneeded time and no cooldown after a scale-up;
  7  cluster-wide sums instead of bin-packing, and smallest-first instead of smallest sufficient;
  9  every pending GPU pod counts, even one no node can ever fit or one aimed at unmanaged nodes;
  10 no warm minimum.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.accounting.capacity import (
    MINUTE,
    BlockReason,
    CapacityInputError,
    GpuNode,
    NodeState,
    PendingPod,
    ScaleDownPlan,
    ScaleDownPolicy,
    ScaleUpPlan,
    UnschedulableReason,
    find_assignment,
    plan_scale_down,
    plan_scale_up,
)
from gpuops.accounting.errors import AccountingError, NegativeValueError

OFF, ON, READY, DRAIN, POFF = (
    NodeState.OFF,
    NodeState.POWERING_ON,
    NodeState.READY,
    NodeState.DRAINING,
    NodeState.POWERING_OFF,
)
ONLINE = (READY, ON)
PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Pods = list[tuple[str, Fraction, frozenset[str]]]


# ---------------------------------------------------------------- brute force


def brute_assign(pods: Pods, bins: Mapping[str, Fraction]) -> bool:
    """Is there any assignment of every pod to an eligible bin with room? Plain backtracking, no pruning."""
    left = dict(bins)

    def go(i: int) -> bool:
        if i == len(pods):
            return True
        _, size, elig = pods[i]
        for b in sorted(elig & left.keys()):
            if left[b] >= size:
                left[b] -= size
                if go(i + 1):
                    return True
                left[b] += size
        return False

    return go(0)


def brute_max_placeable(pods: Pods, bins: Mapping[str, Fraction]) -> int:
    best = 0
    for mask in range(1 << len(pods)):
        subset = [p for i, p in enumerate(pods) if mask >> i & 1]
        if len(subset) > best and brute_assign(subset, bins):
            best = len(subset)
    return best


def as_triples(pods: Iterable[PendingPod]) -> Pods:
    return [(p.name, Fraction(p.gpus), p.eligible) for p in pods]


# ---------------------------------------------------------------- strategies

sizes = st.integers(min_value=1, max_value=16).map(lambda k: Fraction(k, 2))


@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 5, max_pods: int = 6) -> tuple[list[GpuNode], list[PendingPod]]:
    n = draw(st.integers(min_value=1, max_value=max_nodes))
    nodes = []
    for i in range(n):
        state = draw(st.sampled_from(list(NodeState)))
        cap = draw(st.integers(min_value=0, max_value=8))
        used = Fraction(draw(st.integers(min_value=0, max_value=2 * cap)), 2) if state in ONLINE else Fraction(0)
        nodes.append(GpuNode(name=f"n{i}", capacity=cap, state=state, used=used, gpu_pods=1 if used else 0))
    names = [node.name for node in nodes] + ["unmanaged"]
    m = draw(st.integers(min_value=0, max_value=max_pods))
    pods = [
        PendingPod(name=f"p{j}", gpus=draw(sizes), eligible=frozenset(draw(st.sets(st.sampled_from(names)))))
        for j in range(m)
    ]
    return nodes, pods


@st.composite
def boot_heavy(draw: st.DrawFn) -> tuple[list[GpuNode], list[PendingPod]]:
    """Mostly Off nodes and pods eligible for several of them: where greedy choices can be redundant."""
    n = draw(st.integers(min_value=2, max_value=5))
    nodes = []
    for i in range(n):
        state = draw(st.sampled_from([OFF, OFF, OFF, READY, ON]))
        cap = draw(st.integers(min_value=1, max_value=8))
        used = draw(st.integers(min_value=0, max_value=cap)) if state in ONLINE else 0
        nodes.append(GpuNode(name=f"n{i}", capacity=cap, state=state, used=used))
    names = [node.name for node in nodes]
    m = draw(st.integers(min_value=2, max_value=6))
    pods = [
        PendingPod(
            name=f"p{j}",
            gpus=draw(st.integers(min_value=1, max_value=6)),
            eligible=frozenset(draw(st.sets(st.sampled_from(names), min_size=1))),
        )
        for j in range(m)
    ]
    return nodes, pods


any_cluster = st.one_of(clusters(), boot_heavy())


def online_free(nodes: Sequence[GpuNode]) -> dict[str, Fraction]:
    return {n.name: n.free for n in nodes if n.state in ONLINE}


def usable_free(nodes: Sequence[GpuNode]) -> dict[str, Fraction]:
    return {n.name: n.free for n in nodes if n.state in (*ONLINE, OFF)}


def leftovers(nodes: Sequence[GpuNode], pods: Sequence[PendingPod], plan: ScaleUpPlan) -> dict[str, Fraction]:
    size = {p.name: Fraction(p.gpus) for p in pods}
    left = {n.name: n.free for n in nodes}
    for pod, node in plan.placements.items():
        left[node] -= size[pod]
    return left


# ---------------------------------------------------------------- scale-up properties


@PROPS
@given(any_cluster)
def test_plan_is_valid(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    """Placements respect eligibility, state and free GPUs; power-ons are Off nodes; each pod is accounted once."""
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    by_name = {n.name: n for n in nodes}
    assert list(plan.power_on) == sorted(set(plan.power_on))
    assert all(by_name[n].state is OFF for n in plan.power_on)
    pod_by_name = {p.name: p for p in pods}
    for pod, node in plan.placements.items():
        assert node in pod_by_name[pod].eligible
        assert by_name[node].state in ONLINE or node in plan.power_on
    assert all(v >= 0 for v in leftovers(nodes, pods, plan).values())
    unsched = [u.pod for u in plan.unschedulable]
    assert sorted([*plan.placements, *unsched]) == sorted(pod_by_name)
    assert not set(plan.placements) & set(unsched)
    # Every powered-on node hosts at least one pod: no node is booted that no pod needs.
    assert set(plan.power_on) <= set(plan.placements.values())


@PROPS
@given(any_cluster)
def test_online_capacity_absorbs_first(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    """A pod that fits a Ready/PoweringOn node's leftover is never the reason for a power-on (defect 2)."""
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    left = leftovers(nodes, pods, plan)
    pod_by_name = {p.name: p for p in pods}
    for pod, node in plan.placements.items():
        if node in plan.power_on:
            p = pod_by_name[pod]
            assert not any(left[n] >= Fraction(p.gpus) for n in online_free(nodes) if n in p.eligible)


@PROPS
@given(any_cluster)
def test_no_unplaced_pod_fits_alone_anywhere_left(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    """General sufficiency: an unschedulable pod fits neither any leftover nor any Off node that stays off."""
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    left = leftovers(nodes, pods, plan)
    room = {n.name: left[n.name] for n in nodes if n.state in ONLINE or n.name in plan.power_on}
    room |= {n.name: n.free for n in nodes if n.state is OFF and n.name not in plan.power_on}
    pod_by_name = {p.name: p for p in pods}
    for u in plan.unschedulable:
        p = pod_by_name[u.pod]
        assert not any(room[n] >= Fraction(p.gpus) for n in room if n in p.eligible), u


@PROPS
@given(any_cluster)
def test_power_on_is_irredundant_against_brute_force(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    """Minimality: without any one chosen node, no assignment at all fits the placed pods."""
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    free = {n.name: n.free for n in nodes}
    placed = as_triples(p for p in pods if p.name in plan.placements)
    for node in plan.power_on:
        bins = online_free(nodes) | {m: free[m] for m in plan.power_on if m != node}
        assert not brute_assign(placed, bins), node


@PROPS
@given(any_cluster)
def test_smallest_sufficient_node_first(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    """No powered-on node could be replaced by a strictly smaller Off node that holds the same pods."""
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    pod_by_name = {p.name: p for p in pods}
    for node in plan.power_on:
        mine = [pod_by_name[p] for p, n in plan.placements.items() if n == node]
        load = sum((Fraction(p.gpus) for p in mine), Fraction(0))
        cap = next(n.free for n in nodes if n.name == node)
        for other in nodes:
            if other.state is OFF and other.name not in plan.power_on:
                smaller_fit = load <= other.free < cap and all(other.name in p.eligible for p in mine)
                assert not smaller_fit, (node, other.name)


@st.composite
def one_pod_per_node(draw: st.DrawFn) -> tuple[list[GpuNode], list[PendingPod]]:
    """Every pod is larger than half of every node's free GPUs, so no node holds two pods; all eligible."""
    n = draw(st.integers(min_value=1, max_value=5))
    nodes = []
    for i in range(n):
        state = draw(st.sampled_from([OFF, READY, ON, DRAIN]))
        cap = draw(st.integers(min_value=1, max_value=8))
        used = draw(st.integers(min_value=0, max_value=cap)) if state in ONLINE else 0
        nodes.append(GpuNode(name=f"n{i}", capacity=cap, state=state, used=used))
    biggest = max(n.free for n in nodes)
    names = frozenset(n.name for n in nodes)
    lo = int(biggest) + 1  # in half-GPUs: > biggest / 2
    m = draw(st.integers(min_value=1, max_value=6))
    pods = [
        PendingPod(name=f"p{j}", gpus=Fraction(draw(st.integers(min_value=lo, max_value=lo + 10)), 2), eligible=names)
        for j in range(m)
    ]
    return nodes, pods


@PROPS
@given(one_pod_per_node())
def test_sufficiency_against_brute_force_one_pod_per_node(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    assert len(plan.placements) == brute_max_placeable(as_triples(pods), usable_free(nodes))


@st.composite
def equal_pods(draw: st.DrawFn) -> tuple[list[GpuNode], list[PendingPod]]:
    nodes, _ = draw(clusters())
    size = draw(sizes)
    names = frozenset(n.name for n in nodes)
    pods = [PendingPod(name=f"p{j}", gpus=size, eligible=names) for j in range(draw(st.integers(1, 6)))]
    return nodes, pods


@PROPS
@given(equal_pods())
def test_sufficiency_against_brute_force_equal_pods(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    assert len(plan.placements) == brute_max_placeable(as_triples(pods), usable_free(nodes))


@PROPS
@given(clusters(max_pods=1))
def test_single_pod_placed_iff_it_fits_some_node(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    for p in pods:
        fits = any(free >= Fraction(p.gpus) for n, free in usable_free(nodes).items() if n in p.eligible)
        assert (p.name in plan.placements) == fits
        # One pod powers on at most one node, and none when online capacity suffices.
        assert len(plan.power_on) <= 1
        if any(free >= Fraction(p.gpus) for n, free in online_free(nodes).items() if n in p.eligible):
            assert plan.power_on == ()


@PROPS
@given(any_cluster, st.randoms(use_true_random=False))
def test_plan_does_not_depend_on_input_order(
    cluster: tuple[list[GpuNode], list[PendingPod]], rnd: random.Random
) -> None:
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    nodes2, pods2 = list(nodes), list(pods)
    rnd.shuffle(nodes2)
    rnd.shuffle(pods2)
    assert plan_scale_up(nodes2, pods2) == plan


@PROPS
@given(any_cluster)
def test_unschedulable_reasons_are_truthful(cluster: tuple[list[GpuNode], list[PendingPod]]) -> None:
    nodes, pods = cluster
    plan = plan_scale_up(nodes, pods)
    by_name = {n.name: n for n in nodes}
    pod_by_name = {p.name: p for p in pods}
    for u in plan.unschedulable:
        p = pod_by_name[u.pod]
        elig = [by_name[n] for n in p.eligible if n in by_name]
        usable = [n for n in elig if n.state in (*ONLINE, OFF)]
        if u.reason is UnschedulableReason.NO_ELIGIBLE_NODE:
            assert not elig
        elif u.reason is UnschedulableReason.TOO_LARGE:
            assert elig and all(Fraction(n.capacity) < Fraction(p.gpus) for n in elig)
        elif u.reason is UnschedulableReason.NODES_LEAVING:
            assert all(Fraction(n.capacity) < Fraction(p.gpus) for n in usable)
        elif u.reason is UnschedulableReason.WAITING_FOR_RUNNING_PODS:
            assert all(n.free < Fraction(p.gpus) for n in usable)
        else:
            assert any(n.free >= Fraction(p.gpus) for n in usable)


@PROPS
@given(clusters(max_nodes=4, max_pods=6), st.data())
def test_find_assignment_matches_brute_force(
    cluster: tuple[list[GpuNode], list[PendingPod]], data: st.DataObject
) -> None:
    nodes, pods = cluster
    bins = {n.name: Fraction(n.capacity) for n in nodes}
    triples = as_triples(pods)
    got = find_assignment(triples, bins, budget=10**6)
    assert (got is not None) == brute_assign(triples, bins)
    if got is not None:
        left = dict(bins)
        for name, size, elig in triples:
            assert got[name] in elig
            left[got[name]] -= size
        assert all(v >= 0 for v in left.values())


def test_search_budget_only_loosens_minimality() -> None:
    """With a budget of one step the exact search gives up; the plan stays valid, just less tight."""
    nodes = [GpuNode(name="r1", capacity=10, state=READY), GpuNode(name="r2", capacity=10, state=READY)]
    nodes.append(GpuNode(name="x", capacity=3, state=OFF))
    everywhere = frozenset({"r1", "r2", "x"})
    pods = [PendingPod(name=f"p{i}", gpus=g, eligible=everywhere) for i, g in enumerate([4, 4, 3, 3, 3, 3])]
    # First-fit-decreasing needs the 3-GPU node (4+4 | 3+3+3 | 3); the exact search finds 4+3+3 | 4+3+3.
    assert plan_scale_up(nodes, pods).power_on == ()
    assert plan_scale_up(nodes, pods, search_budget=1).power_on == ("x",)


# ---------------------------------------------------------------- scale-up regressions (seed defects)


def test_defect7_smallest_sufficient_not_smallest_first() -> None:
    """Seed: 8-GPU pod, 4- and 8-GPU nodes off -> boots the 4 first (ascending until the sum covers)."""
    nodes = [GpuNode(name="small", capacity=4, state=OFF), GpuNode(name="big", capacity=8, state=OFF)]
    plan = plan_scale_up(nodes, [PendingPod(name="p", gpus=8, eligible=frozenset({"small", "big"}))])
    assert plan.power_on == ("big",)
    assert dict(plan.placements) == {"p": "big"}


def test_defect7_cluster_wide_sums_hide_fragmentation() -> None:
    """Seed: two 3-GPU pods, 4 + 2 free GPUs -> 'available 6 >= pending 6', nothing done, one pod stuck."""
    nodes = [
        GpuNode(name="r4", capacity=8, used=4, state=READY, gpu_pods=1),
        GpuNode(name="r2", capacity=4, used=2, state=READY, gpu_pods=1),
        GpuNode(name="off2", capacity=2, state=OFF),
        GpuNode(name="off4", capacity=4, state=OFF),
    ]
    every = frozenset(n.name for n in nodes)
    pods = [PendingPod(name="a", gpus=3, eligible=every), PendingPod(name="b", gpus=3, eligible=every)]
    plan = plan_scale_up(nodes, pods)
    # One pod lands on the 4 free GPUs; the other needs a node, and the 2-GPU one is too small.
    assert plan.power_on == ("off4",)
    assert sorted(plan.placements.values()) == ["off4", "r4"]
    # Without a node to power on, the second pod is reported, not silently counted as satisfiable.
    plan = plan_scale_up(nodes[:2], pods)
    assert plan.power_on == ()
    assert [(u.pod, u.reason) for u in plan.unschedulable] == [("b", UnschedulableReason.CAPACITY_TAKEN)]


def test_defect2_booting_nodes_are_counted_not_reposted() -> None:
    """Seed: a node that was just powered on is 'inactive', so every tick re-POSTs power-on."""
    nodes = [GpuNode(name="booting", capacity=8, state=ON), GpuNode(name="other", capacity=8, state=OFF)]
    every = frozenset({"booting", "other"})
    pods = [PendingPod(name=f"p{i}", gpus=2, eligible=every) for i in range(4)]
    plan = plan_scale_up(nodes, pods)
    assert plan.power_on == ()
    assert set(plan.placements.values()) == {"booting"}
    # A fifth pod overflows the booting node: exactly one more node.
    plan = plan_scale_up(nodes, [*pods, PendingPod(name="p4", gpus=2, eligible=every)])
    assert plan.power_on == ("other",)


def test_defect3_bound_pods_use_capacity_not_demand() -> None:
    """Seed: pods pulling images (bound, phase Pending) were counted as pending demand. Here they are the
    node's `used`, and only unbound pods are passed as pending: a full node makes room for nothing."""
    nodes = [GpuNode(name="pulling", capacity=4, used=4, gpu_pods=2, state=READY)]
    nodes.append(GpuNode(name="spare", capacity=4, state=OFF))
    plan = plan_scale_up(nodes, [])
    assert plan == ScaleUpPlan(power_on=(), placements={}, unschedulable=())
    plan = plan_scale_up(nodes, [PendingPod(name="new", gpus=1, eligible=frozenset({"pulling", "spare"}))])
    assert plan.power_on == ("spare",)


def test_defect9_pod_larger_than_any_node_powers_nothing_on() -> None:
    """Seed: a 16-GPU pod with an 8-GPU maximum node kept the scale-up loop going forever."""
    nodes = [GpuNode(name="a", capacity=8, state=OFF), GpuNode(name="b", capacity=4, state=OFF)]
    plan = plan_scale_up(nodes, [PendingPod(name="huge", gpus=16, eligible=frozenset({"a", "b"}))])
    assert plan.power_on == ()
    [u] = plan.unschedulable
    assert u.reason is UnschedulableReason.TOO_LARGE and "largest eligible node has 8" in u.message


def test_defect9_selectors_for_unmanaged_nodes_power_nothing_on() -> None:
    nodes = [GpuNode(name="a", capacity=8, state=OFF)]
    plan = plan_scale_up(nodes, [PendingPod(name="p", gpus=1, eligible=frozenset({"not-ours"}))])
    assert plan.power_on == ()
    assert plan.unschedulable[0].reason is UnschedulableReason.NO_ELIGIBLE_NODE


def test_leaving_nodes_are_neither_used_nor_powered_on() -> None:
    nodes = [GpuNode(name="d", capacity=8, state=DRAIN), GpuNode(name="o", capacity=2, state=OFF)]
    plan = plan_scale_up(nodes, [PendingPod(name="p", gpus=4, eligible=frozenset({"d", "o"}))])
    assert plan.power_on == () and not plan.placements
    assert plan.unschedulable[0].reason is UnschedulableReason.NODES_LEAVING


def test_least_waste_breaks_ties_between_equal_nodes() -> None:
    """Two equal 4-GPU nodes: the one the other pending pods can also use wins, so one node suffices."""
    nodes = [GpuNode(name="a", capacity=4, state=OFF), GpuNode(name="b", capacity=4, state=OFF)]
    pods = [
        PendingPod(name="big", gpus=2, eligible=frozenset({"a", "b"})),
        PendingPod(name="small", gpus=2, eligible=frozenset({"b"})),
    ]
    plan = plan_scale_up(nodes, pods)
    assert plan.power_on == ("b",)
    assert dict(plan.placements) == {"big": "b", "small": "b"}


def test_greedy_redundancy_is_removed() -> None:
    """Smallest-sufficient alone would boot B for x and A for y; A holds both, so only A is powered on."""
    nodes = [GpuNode(name="A", capacity=5, state=OFF), GpuNode(name="B", capacity=3, state=OFF)]
    pods = [
        PendingPod(name="x", gpus=3, eligible=frozenset({"A", "B"})),
        PendingPod(name="y", gpus=2, eligible=frozenset({"A"})),
    ]
    assert plan_scale_up(nodes, pods).power_on == ("A",)


def test_fractional_requests_pack_exactly() -> None:
    nodes = [GpuNode(name="r", capacity=1, state=READY), GpuNode(name="o", capacity=1, state=OFF)]
    thirds = [PendingPod(name=f"p{i}", gpus=Fraction(1, 3), eligible=frozenset({"r", "o"})) for i in range(3)]
    assert plan_scale_up(nodes, thirds).power_on == ()
    extra = PendingPod(name="p3", gpus=Fraction(1, 3), eligible=frozenset({"r", "o"}))
    assert plan_scale_up(nodes, [*thirds, extra]).power_on == ("o",)


def test_bad_input_raises_typed_errors() -> None:
    with pytest.raises(CapacityInputError, match="Fraction or int"):
        GpuNode(name="n", capacity=1.5, state=READY)  # type: ignore[arg-type]
    with pytest.raises(NegativeValueError, match="used"):
        GpuNode(name="n", capacity=1, used=-1, state=READY)
    with pytest.raises(CapacityInputError, match="NodeState"):
        GpuNode(name="n", capacity=1, state="Ready")  # type: ignore[arg-type]
    with pytest.raises(CapacityInputError, match="> 0 GPUs"):
        PendingPod(name="p", gpus=0, eligible=frozenset())
    with pytest.raises(CapacityInputError, match="set of node names"):
        PendingPod(name="p", gpus=1, eligible="node-a")  # type: ignore[arg-type]
    node = GpuNode(name="n", capacity=1, state=READY)
    with pytest.raises(CapacityInputError, match="duplicate node"):
        plan_scale_up([node, node], [])
    pod = PendingPod(name="p", gpus=1, eligible=frozenset({"n"}))
    with pytest.raises(CapacityInputError, match="duplicate pod"):
        plan_scale_up([node], [pod, pod])
    with pytest.raises(AccountingError):
        plan_scale_down([node], now=1.0)  # type: ignore[arg-type]
    with pytest.raises(NegativeValueError, match="max_concurrent_power_offs"):
        ScaleDownPolicy(max_concurrent_power_offs=-1)
    assert issubclass(CapacityInputError, ValueError)


# ---------------------------------------------------------------- scale-down properties

NOW = 10_000 * MINUTE
DOWN_PROPS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[GpuNode], ScaleDownPolicy, int | None, frozenset[str]]:
    n = draw(st.integers(min_value=1, max_value=8))
    nodes = []
    for i in range(n):
        state = draw(st.sampled_from([READY, READY, READY, OFF, ON, DRAIN, POFF]))
        cap = draw(st.integers(min_value=1, max_value=8))
        busy = state in ONLINE and draw(st.integers(0, 3)) == 0
        used = draw(st.sampled_from([0, 1, cap])) if busy else 0
        pods = draw(st.sampled_from([0, 1, 2]) if used else st.just(1)) if busy else 0
        # Busy nodes may carry a stale idle_since: the GPU-pod check must not rely on it being None.
        idle = draw(st.one_of(st.none(), st.integers(NOW - 30 * MINUTE, NOW)))
        nodes.append(GpuNode(name=f"n{i}", capacity=cap, state=state, used=used, gpu_pods=pods, idle_since=idle))
    policy = ScaleDownPolicy(
        min_warm_gpus=draw(st.sampled_from([0, 0, 1, 2, 4, 8])),
        max_concurrent_power_offs=draw(st.sampled_from([0, 1, 2, 3, 10])),
        unneeded_time=draw(st.sampled_from([0, 10 * MINUTE])),
        scale_up_cooldown=10 * MINUTE,
    )
    last_up = draw(st.one_of(st.none(), st.none(), st.integers(NOW - 20 * MINUTE, NOW)))
    needed = frozenset(draw(st.sets(st.sampled_from([x.name for x in nodes]), max_size=1)))
    return nodes, policy, last_up, needed


def warm_after(nodes: Sequence[GpuNode], off: Iterable[str]) -> Fraction:
    gone = set(off)
    return sum((n.free for n in nodes if n.state in ONLINE and n.name not in gone), Fraction(0))


@DOWN_PROPS
@given(fleets())
def test_power_off_safety(fleet: tuple[list[GpuNode], ScaleDownPolicy, int | None, frozenset[str]]) -> None:
    nodes, policy, last_up, needed = fleet
    plan = plan_scale_down(nodes, now=NOW, policy=policy, last_scale_up_at=last_up, needed=needed)
    by_name = {n.name: n for n in nodes}
    chosen = [by_name[n] for n in plan.power_off]
    for node in chosen:
        assert node.state is READY
        assert node.used == 0 and node.gpu_pods == 0  # never a node with GPU pods (defect 4)
        assert node.name not in needed
        assert node.idle_since is not None and NOW - node.idle_since >= policy.unneeded_time  # defect 5
    if chosen:
        assert last_up is None or NOW - last_up >= policy.scale_up_cooldown
        assert warm_after(nodes, plan.power_off) >= Fraction(policy.min_warm_gpus)
    in_progress = sum(1 for n in nodes if n.state in (DRAIN, POFF))
    assert in_progress + len(chosen) <= max(policy.max_concurrent_power_offs, in_progress)
    # Largest first.
    caps = [Fraction(n.capacity) for n in chosen]
    assert caps == sorted(caps, reverse=True)
    limited = [by_name[b.node] for b in plan.blocked if b.reason is BlockReason.POWER_OFF_LIMIT]
    assert all(Fraction(x.capacity) <= min(caps) for x in limited) if caps else True
    # Every Ready node is accounted for exactly once; nothing else appears.
    listed = [*plan.power_off, *plan.kept_warm, *(b.node for b in plan.blocked)]
    assert sorted(listed) == sorted(n.name for n in nodes if n.state is READY)


@DOWN_PROPS
@given(fleets())
def test_all_idle_surplus_is_eventually_powered_off(
    fleet: tuple[list[GpuNode], ScaleDownPolicy, int | None, frozenset[str]],
) -> None:
    """Repeated calls (chosen -> Draining -> Off) reach a state where no idle node can go without breaking
    the warm minimum (the seed only ever powered off its single largest idle node: defect 1)."""
    nodes, policy, _, _ = fleet
    policy = ScaleDownPolicy(
        min_warm_gpus=policy.min_warm_gpus,
        max_concurrent_power_offs=max(1, policy.max_concurrent_power_offs),
        unneeded_time=policy.unneeded_time,
    )
    state = {n.name: n for n in nodes}
    now = NOW + 60 * MINUTE  # every idle node has been idle long enough
    ever_off_before: set[str] = {n.name for n in nodes if n.state is OFF}
    for _ in range(3 * len(nodes) + 3):
        plan = plan_scale_down(list(state.values()), now=now, policy=policy)
        assert not set(plan.power_off) & ever_off_before
        # Power-offs in flight complete; newly chosen ones start draining.
        for name, node in list(state.items()):
            if node.state in (DRAIN, POFF):
                state[name] = GpuNode(name=name, capacity=node.capacity, state=OFF)
                ever_off_before.add(name)
        for name in plan.power_off:
            state[name] = GpuNode(name=name, capacity=state[name].capacity, state=DRAIN)
        now += MINUTE
    final = list(state.values())
    plan = plan_scale_down(final, now=now, policy=policy)
    assert plan.power_off == ()
    assert not any(b.reason is BlockReason.POWER_OFF_LIMIT for b in plan.blocked)
    warm = warm_after(final, ())
    for name in plan.kept_warm:
        assert warm - state[name].free < Fraction(policy.min_warm_gpus)
    idle_ready = [n for n in final if n.state is READY and not n.used and not n.gpu_pods and n.idle_since is not None]
    assert sorted(plan.kept_warm) == sorted(n.name for n in idle_ready)


# ---------------------------------------------------------------- scale-down regressions


def idle(name: str, cap: int, since: int = NOW - 60 * MINUTE, state: NodeState = READY) -> GpuNode:
    return GpuNode(name=name, capacity=cap, state=state, idle_since=since)


def test_defect1_off_node_is_not_reselected_and_smaller_idle_nodes_go_too() -> None:
    nodes = [idle("big-off", 8, state=OFF), idle("four", 4), idle("two", 2)]
    plan = plan_scale_down(nodes, now=NOW, policy=ScaleDownPolicy(max_concurrent_power_offs=10))
    assert plan.power_off == ("four", "two")
    # With one power-off at a time: the largest now, the next one once the first is no longer in flight.
    one = ScaleDownPolicy(max_concurrent_power_offs=1)
    plan = plan_scale_down(nodes, now=NOW, policy=one)
    assert plan.power_off == ("four",)
    assert [(b.node, b.reason) for b in plan.blocked] == [("two", BlockReason.POWER_OFF_LIMIT)]
    draining = [nodes[0], GpuNode(name="four", capacity=4, state=DRAIN), nodes[2]]
    assert plan_scale_down(draining, now=NOW, policy=one).power_off == ()
    done = [nodes[0], GpuNode(name="four", capacity=4, state=OFF), nodes[2]]
    assert plan_scale_down(done, now=NOW, policy=one).power_off == ("two",)


def test_defect4_node_with_starting_pods_is_never_powered_off() -> None:
    """Seed: only Running pods counted, so a node whose pods were still pulling images could be shut down."""
    pulling = GpuNode(name="pulling", capacity=4, used=2, gpu_pods=1, state=READY, idle_since=None)
    bound_no_gpus = GpuNode(name="bound", capacity=4, used=0, gpu_pods=1, state=READY, idle_since=NOW - 60 * MINUTE)
    plan = plan_scale_down([pulling, bound_no_gpus], now=NOW)
    assert plan.power_off == ()
    assert {b.reason for b in plan.blocked} == {BlockReason.HAS_GPU_PODS}


def test_defect5_unneeded_time_and_scale_up_cooldown() -> None:
    """Seed: powered off within 10 s of the last pod finishing; a job 15 s later paid a full boot."""
    fresh = idle("fresh", 4, since=NOW - 15_000_000)
    plan = plan_scale_down([fresh], now=NOW)
    assert plan.power_off == () and plan.blocked[0].reason is BlockReason.NOT_UNNEEDED_LONG_ENOUGH
    assert plan_scale_down([fresh], now=NOW + 10 * MINUTE).power_off == ("fresh",)
    old = idle("old", 4)
    plan = plan_scale_down([old], now=NOW, last_scale_up_at=NOW - 5 * MINUTE)
    assert plan.power_off == () and plan.blocked[0].reason is BlockReason.SCALE_UP_COOLDOWN
    assert plan_scale_down([old], now=NOW, last_scale_up_at=NOW - 10 * MINUTE).power_off == ("old",)


def test_defect10_warm_minimum_keeps_smallest_sufficient_idle_capacity() -> None:
    nodes = [idle("eight", 8), idle("two", 2), GpuNode(name="busy", capacity=4, used=3, gpu_pods=1, state=READY)]
    plan = plan_scale_down(nodes, now=NOW, policy=ScaleDownPolicy(min_warm_gpus=3))
    # 1 free GPU on 'busy' + 2 on 'two' = 3 stay warm; the 8-GPU node goes.
    assert plan == ScaleDownPlan(
        power_off=("eight",),
        kept_warm=("two",),
        blocked=(plan.blocked[0],),
    )
    assert plan.blocked[0].node == "busy"
    # A PoweringOn node's GPUs count as warm capacity.
    booting = GpuNode(name="booting", capacity=4, state=ON)
    assert plan_scale_down([*nodes, booting], now=NOW, policy=ScaleDownPolicy(min_warm_gpus=3)).power_off == (
        "eight",
        "two",
    )


def test_nodes_needed_by_pending_pods_stay_on() -> None:
    nodes = [idle("a", 4), idle("b", 4)]
    up = plan_scale_up(nodes, [PendingPod(name="p", gpus=1, eligible=frozenset({"a"}))])
    plan = plan_scale_down(nodes, now=NOW, needed=set(up.placements.values()))
    assert plan.power_off == ("b",)
    assert plan.blocked[0].node == "a" and plan.blocked[0].reason is BlockReason.NEEDED_BY_PENDING


def test_priority_breaks_ties_among_equally_good_off_nodes_only() -> None:
    """spec.priority of a GPUNodeGroup: the higher is woken first when machines fit equally well; it never
    overrides smallest-sufficient."""
    pod = PendingPod(name="p", gpus=1, eligible=frozenset({"a", "b", "big"}))
    nodes = [GpuNode(name="a", capacity=2, state=NodeState.OFF),
             GpuNode(name="b", capacity=2, state=NodeState.OFF, priority=5),
             GpuNode(name="big", capacity=8, state=NodeState.OFF, priority=100)]
    assert plan_scale_up(nodes, [pod]).power_on == ("b",)
    assert plan_scale_up([nodes[0], nodes[2]], [pod]).power_on == ("a",)  # smaller beats a higher priority
    with pytest.raises(CapacityInputError, match="priority"):
        GpuNode(name="x", capacity=1, state=NodeState.OFF, priority=1.5)  # type: ignore[arg-type]

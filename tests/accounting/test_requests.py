"""Effective pod requests: the scheduler's formula (component-helpers PodRequests), sidecars, defaulting."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.errors import NegativeValueError, QuantityError
from gpuops.accounting.quantity import NegativeQuantityError
from gpuops.accounting.requests import (
    Container,
    PodSpecRequests,
    RequestsInputError,
    container_requests,
    pod_request,
    pod_requests,
)

GPU = "nvidia.com/gpu"
F = Fraction


def c(name: str, gpu: int | str | None = None, *, sidecar: bool = False, cpu: str | None = None) -> Container:
    requests: dict[str, int | str] = {}
    if gpu is not None:
        requests[GPU] = gpu
    if cpu is not None:
        requests["cpu"] = cpu
    return Container(name, requests, {}, sidecar)


def test_regular_containers_sum() -> None:
    pod = PodSpecRequests(containers=[c("a", 1), c("b", 2)])
    assert pod_request(pod, GPU) == 3


def test_init_container_larger_than_main_sets_the_request() -> None:
    # the seed summed regular containers only and would report 1 here
    pod = PodSpecRequests(init_containers=[c("prep", 4)], containers=[c("main", 1)])
    assert pod_request(pod, GPU) == 4


def test_sidecar_counts_for_the_whole_life_and_alongside_later_init_containers() -> None:
    # init: I1(2) S1(1, sidecar) I2(4) S2(2, sidecar); containers: C1(1)
    #   steady state: C1 + S1 + S2 = 4; init terms: I1 = 2, S1 = 1, I2 = 4 + S1 = 5, S2 = S1 + S2 = 3
    pod = PodSpecRequests(
        init_containers=[c("i1", 2), c("s1", 1, sidecar=True), c("i2", 4), c("s2", 2, sidecar=True)],
        containers=[c("c1", 1)],
    )
    assert pod_request(pod, GPU) == 5
    # a plain max(max init, sum containers) would say 4; a sidecar after I2 does not run alongside it
    later = PodSpecRequests(
        init_containers=[c("i1", 2), c("i2", 4), c("s1", 1, sidecar=True), c("s2", 2, sidecar=True)],
        containers=[c("c1", 1)],
    )
    assert pod_request(later, GPU) == 4


def test_sidecar_only_pod() -> None:
    pod = PodSpecRequests(init_containers=[c("proxy", sidecar=True, cpu="100m")], containers=[c("main", cpu="1")])
    assert pod_request(pod, "cpu") == F(11, 10)


def test_requests_default_to_limits_per_resource() -> None:
    gpu_by_limit = Container("trainer", {"cpu": "500m"}, {GPU: 2, "cpu": "2", "memory": "1Gi"})
    assert dict(container_requests(gpu_by_limit)) == {"cpu": F(1, 2), GPU: 2, "memory": 2**30}
    pod = PodSpecRequests(containers=[gpu_by_limit])
    assert pod_request(pod, GPU) == 2
    assert pod_request(pod, "cpu") == F(1, 2)  # an explicit request is kept, even if below the limit


def test_overhead_is_added_and_can_be_excluded() -> None:
    pod = PodSpecRequests(containers=[c("main", 1, cpu="1")], overhead={"cpu": "250m", "memory": "120Mi"})
    assert pod_request(pod, "cpu") == F(5, 4)
    assert pod_request(pod, "memory") == 120 * 2**20
    assert pod_request(pod, "cpu", include_overhead=False) == 1
    assert pod_request(pod, GPU) == 1


def test_pod_level_requests_override_supported_resources_only() -> None:
    pod = PodSpecRequests(
        containers=[c("a", 1, cpu="1"), c("b", 1, cpu="1")],
        pod_requests={"cpu": "3", GPU: 7, "hugepages-2Mi": "4Mi"},
        overhead={"cpu": "100m"},
    )
    reqs = pod_requests(pod)
    assert reqs["cpu"] == F(31, 10)  # pod-level 3 replaces the sum 2, then overhead
    assert reqs[GPU] == 2  # GPUs are not a pod-level resource: the container sum stands
    assert reqs["hugepages-2Mi"] == 4 * 2**20


def test_absent_resource_is_zero_and_zero_entries_are_kept() -> None:
    pod = PodSpecRequests(containers=[Container("main", {"cpu": "0"})])
    assert pod_request(pod, GPU) == 0
    assert dict(pod_requests(pod)) == {"cpu": 0}
    assert pod_request(PodSpecRequests(), GPU) == 0


def test_exact_fractions_and_json_numbers() -> None:
    pod = PodSpecRequests(containers=[Container("a", {"cpu": F(1, 3)}), Container("b", {"cpu": 0.1})])
    assert pod_request(pod, "cpu") == F(1, 3) + F(1, 10)


def test_bad_input_names_the_container_and_resource() -> None:
    with pytest.raises(NegativeQuantityError, match=r"container 'main' requests\['nvidia.com/gpu'\]") as neg:
        Container("main", {GPU: "-1"})
    assert isinstance(neg.value, NegativeValueError)
    with pytest.raises(NegativeValueError):
        Container("main", {GPU: F(-1)})
    with pytest.raises(QuantityError, match=r"container 'main' limits\['cpu'\]"):
        Container("main", {}, {"cpu": "1x"})
    with pytest.raises(RequestsInputError):
        Container("main", {"": "1"})
    with pytest.raises(RequestsInputError):
        Container("main", {GPU: None})  # type: ignore[dict-item]
    with pytest.raises(RequestsInputError):
        PodSpecRequests(containers=["main"])  # type: ignore[list-item]
    with pytest.raises(RequestsInputError):
        pod_request(PodSpecRequests(), "")


def test_structs_are_frozen_and_inputs_are_not_kept_mutable() -> None:
    requests = {GPU: "1"}
    container = Container("main", requests)
    requests[GPU] = "5"
    assert container_requests(container)[GPU] == 1
    with pytest.raises(AttributeError):
        container.name = "other"  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------------- properties

RESOURCES = st.sampled_from([GPU, "cpu", "memory"])
AMOUNTS = st.builds(Fraction, st.integers(0, 80), st.sampled_from([1, 2, 3, 10, 1000]))
RESOURCE_LISTS = st.dictionaries(RESOURCES, AMOUNTS, max_size=3)
CONTAINERS = st.builds(
    Container, name=st.sampled_from("abcdef"), requests=RESOURCE_LISTS, limits=RESOURCE_LISTS, restartable=st.booleans()
)
PODS = st.builds(
    PodSpecRequests,
    init_containers=st.lists(CONTAINERS, max_size=5),
    containers=st.lists(CONTAINERS, max_size=4),
    overhead=RESOURCE_LISTS,
)


def lifecycle_peak(pod: PodSpecRequests, resource: str) -> Fraction:
    """Independent restatement: the most the pod holds in any phase of its life, plus overhead."""

    def req(container: Container) -> Fraction:
        return F(container.requests.get(resource, container.limits.get(resource, 0)))

    phases: list[Fraction] = []
    running_sidecars = F(0)
    for container in pod.init_containers:
        if container.restartable:
            running_sidecars += req(container)
            phases.append(running_sidecars)
        else:
            phases.append(running_sidecars + req(container))
    phases.append(running_sidecars + sum((req(x) for x in pod.containers), F(0)))
    return max(phases) + F(pod.overhead.get(resource, 0))


@settings(max_examples=200, deadline=None)
@given(pod=PODS, resource=RESOURCES)
def test_matches_the_lifecycle_restatement(pod: PodSpecRequests, resource: str) -> None:
    assert pod_request(pod, resource) == lifecycle_peak(pod, resource)


@settings(max_examples=200, deadline=None)
@given(pod=PODS, extra=CONTAINERS, as_init=st.booleans(), where=st.integers(0, 10))
def test_adding_a_container_never_lowers_any_request(
    pod: PodSpecRequests, extra: Container, as_init: bool, where: int
) -> None:
    before = pod_requests(pod)
    if as_init:
        inits = list(pod.init_containers)
        inits.insert(where % (len(inits) + 1), extra)
        bigger = PodSpecRequests(init_containers=inits, containers=pod.containers, overhead=pod.overhead)
    else:
        mains = list(pod.containers)
        mains.insert(where % (len(mains) + 1), extra)
        bigger = PodSpecRequests(init_containers=pod.init_containers, containers=mains, overhead=pod.overhead)
    after = pod_requests(bigger)
    for name, value in before.items():
        assert after[name] >= value


@settings(max_examples=200, deadline=None)
@given(pod=PODS, resource=RESOURCES, seed=st.randoms(use_true_random=False))
def test_regular_container_order_does_not_matter(pod: PodSpecRequests, resource: str, seed: object) -> None:
    shuffled = list(pod.containers)
    seed.shuffle(shuffled)  # type: ignore[attr-defined]
    other = PodSpecRequests(init_containers=pod.init_containers, containers=shuffled, overhead=pod.overhead)
    assert pod_request(other, resource) == pod_request(pod, resource)


@settings(max_examples=200, deadline=None)
@given(pod=PODS, resource=RESOURCES)
def test_request_bounds(pod: PodSpecRequests, resource: str) -> None:
    """At least every single container alone (with overhead), at most everything at once."""
    total = pod_request(pod, resource)
    overhead = F(pod.overhead.get(resource, 0))
    each = [container_requests(x).get(resource, F(0)) for x in [*pod.init_containers, *pod.containers]]
    assert all(total >= amount + overhead for amount in each)
    assert total <= sum(each, F(0)) + overhead

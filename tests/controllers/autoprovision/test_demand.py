"""What counts as demand and where it may go: the scheduler's rules for nodeSelector, required node affinity,
taints and the effective request (init containers, sidecars, overhead)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import msgspec
import pytest

from gpuops.controllers.autoprovision.demand import NodeView, demand, gpu_request, is_unschedulable, uses_gpus
from gpuops.kube.objects import Node, Pod, Taint

GPU = "nvidia.com/gpu"
UNSCHEDULABLE = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}


def pod(name: str = "p", gpus: str = "1", **spec: Any) -> Pod:
    body: dict[str, Any] = {"metadata": {"name": name, "namespace": "ns"},
                            "spec": {"containers": [{"name": "c", "resources": {"limits": {GPU: gpus}}}], **spec},
                            "status": UNSCHEDULABLE}
    return msgspec.convert(body, Pod)


def view(name: str, labels: dict[str, str] | None = None, taints: list[Taint] | None = None) -> NodeView:
    return NodeView.of(name, name, GPU, None, labels, taints, "gpuops.io/power-off")


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_only_unschedulable_unbound_live_pods_are_demand() -> None:
    assert is_unschedulable(pod())
    assert not is_unschedulable(pod(nodeName="n1"))
    bound = msgspec.structs.replace(pod(), status=msgspec.convert({"phase": "Pending"}, type(pod().status)))
    assert not is_unschedulable(bound)  # not (yet) marked Unschedulable: the scheduler may still place it


def test_effective_request_counts_init_containers_and_overhead() -> None:
    p = pod(gpus="1", initContainers=[{"name": "i", "resources": {"limits": {GPU: "4"}}}], overhead={GPU: "1"})
    assert gpu_request(p, GPU) == Fraction(5)


@pytest.mark.parametrize(("spec", "labels", "admitted"), [
    ({"nodeSelector": {"tier": "a100"}}, {"tier": "a100"}, True),
    ({"nodeSelector": {"tier": "a100"}}, {"tier": "l4"}, False),
    ({"affinity": affinity({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a100", "h100"]}]})},
     {"tier": "h100"}, True),
    ({"affinity": affinity({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["l4"]}]})},
     {"tier": "l4"}, False),
    ({"affinity": affinity({"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]})},
     {"gpus": "8"}, True),
    ({"affinity": affinity({"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["4"]}]})},
     {"gpus": "8"}, False),
    ({"affinity": affinity({"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
                           {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["g1"]}]})},
     {}, True),  # terms are ORed: the second (the node's name) holds
    ({"affinity": affinity({})}, {"tier": "a100"}, False),  # an empty term matches no node
])
def test_selectors_and_required_affinity(spec: dict[str, Any], labels: dict[str, str], admitted: bool) -> None:
    assert view("g1", labels).admits(pod(**spec)) is admitted


def test_taints_must_be_tolerated_and_our_drain_taint_is_ignored_on_joined_nodes() -> None:
    taint = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
    assert not view("g1", taints=[taint]).admits(pod())
    tolerant = pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert view("g1", taints=[taint]).admits(tolerant)
    soft = Taint(key="x", value="y", effect="PreferNoSchedule")
    assert view("g1", taints=[soft]).admits(pod())


def test_demand_lists_eligible_nodes_and_keeps_pods_that_fit_none() -> None:
    views = [view("small", {"tier": "l4"}), view("big", {"tier": "a100"})]
    pending = demand([pod("a", nodeSelector={"tier": "a100"}), pod("b"), pod("c", gpus="0")], views)
    by_name = {p.name: p for p in pending}
    assert set(by_name) == {"ns/a", "ns/b"}  # a pod asking for no GPU is not GPU demand
    assert by_name["ns/a"].eligible == frozenset({"big"})
    assert by_name["ns/b"].eligible == frozenset({"small", "big"})


def test_a_powered_off_node_is_judged_without_the_taints_of_being_down() -> None:
    """A machine powered off keeps its Node, tainted unreachable/shutdown: the machine we would wake will
    not have those taints (the bench found machines never powered on twice because of them)."""
    node = msgspec.convert({"metadata": {"name": "g8", "labels": {"tier": "a100"}}, "spec": {"taints": [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        {"key": "node.cloudprovider.kubernetes.io/shutdown", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}}, Node)
    down = NodeView.of("g8", "g8", GPU, node, None, None, "gpuops.io/power-off", ready=False)
    up = NodeView.of("g8", "g8", GPU, node, None, None, "gpuops.io/power-off", ready=True)
    ml = pod(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}])
    assert down.admits(ml) and not down.admits(pod())  # the user's own taint still counts
    assert not up.admits(ml)  # a Ready node with those taints really is closed


def test_a_pod_bound_and_still_starting_keeps_its_node_busy() -> None:
    """The seed powered off nodes whose pods were still pulling images: a bound pod that has not finished holds
    its GPUs, whatever its phase, so its node is never idle."""
    starting = msgspec.convert({"metadata": {"name": "s", "namespace": "ns"}, "spec": {
        "nodeName": "g1", "containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}]},
        "status": {"phase": "Pending"}}, Pod)
    assert uses_gpus(starting, GPU)
    done = msgspec.structs.replace(starting, status=msgspec.convert({"phase": "Succeeded"}, type(starting.status)))
    assert not uses_gpus(done, GPU)

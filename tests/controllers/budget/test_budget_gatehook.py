"""The Gate webhook's mutation, as a function of the pod and of which budgets are closed: it holds exactly the pods
a closed budget of their namespace selects and that request its resource, is idempotent on reinvocation, and
never raises, whatever JSON it is sent (the emulated API server applies its patches, as the real one would)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.controllers.budget.api import GATE, GATED_BY
from gpuops.controllers.budget.gatehook import Closed, GateBook, gate_names, gating_mutation
from gpuops.kube.objects import LabelSelector
from gpuops.kube.selectors import compile_selector
from gpuops_sim.apiserver.patch import apply_json_patch


def closed(name: str, team: str, resource: str = "nvidia.com/gpu") -> Closed:
    return Closed(name, compile_selector(LabelSelector(match_labels={"team": team})), resource, f"held by {name}")


def pod(labels: dict[str, str], gpus: str | None = "1", *, namespace: str = "ns", **meta: Any) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": gpus}} if gpus is not None else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace, "labels": labels,
                                                            **meta},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}]}}


def test_held_only_where_a_closed_budget_selects_a_pod_that_requests_its_resource() -> None:
    book = GateBook()
    book.close("ns", closed("a", "x"))
    mutate = gating_mutation(book)
    assert mutate(pod({"team": "x"})).patch
    assert not mutate(pod({"team": "y"})).patch  # not selected
    assert not mutate(pod({"team": "x"}, gpus=None)).patch  # requests no GPU
    assert not mutate(pod({"team": "x"}, namespace="other")).patch  # another namespace's budget
    book.open("ns", "a")
    assert not mutate(pod({"team": "x"})).patch


def test_every_closed_budget_selecting_the_pod_is_named_and_the_gate_added_once() -> None:
    book = GateBook()
    book.close("ns", closed("b", "x"))
    book.close("ns", closed("a", "x"))
    mutate = gating_mutation(book)
    original = pod({"team": "x"}, annotations={"keep": "me"})
    original["spec"]["schedulingGates"] = [{"name": "someone-else"}]
    result = mutate(original)
    assert sorted(result.warnings) == ["held by a", "held by b"]
    once = apply_json_patch(original, result.patch)
    assert once["spec"]["schedulingGates"] == [{"name": "someone-else"}, {"name": GATE}]
    assert once["metadata"]["annotations"] == {"keep": "me", GATED_BY: "a,b"}
    twice = apply_json_patch(once, mutate(once).patch)  # reinvocation: same pod
    assert twice == once
    assert gate_names(twice["metadata"]["annotations"]) == ["a", "b"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(labels=st.dictionaries(st.sampled_from(["team", "x"]), st.sampled_from(["x", "y"]), max_size=2),
       junk=st.dictionaries(st.sampled_from(["metadata", "spec", "status"]), JSON, max_size=3),
       gpus=st.sampled_from(["1", "0", "500m", "2Gi", "-1", "x", None]))
def test_any_pod_json_gets_an_answer_never_an_exception(labels: dict[str, str], junk: dict[str, Any],
                                                        gpus: str | None) -> None:
    book = GateBook()
    book.close("ns", closed("a", "x"))
    mutate = gating_mutation(book)
    for body in (pod(labels, gpus), {**pod(labels, gpus), **junk}, junk):
        result = mutate(body)
        if result.patch:  # a patch applies to the pod it was computed for
            apply_json_patch(body, result.patch)

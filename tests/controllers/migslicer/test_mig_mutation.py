"""The webhook's pure mutation: properties over random pod layouts (the patch applied by the emulator's own
RFC 6902 implementation, as the apiserver would), and the pods it must refuse."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.controllers.migslicer.api import GATE, NVIDIA_PREFIX, OUR_PREFIX, profile_of_resource
from gpuops.controllers.migslicer.mutation import escape_pointer, known_profiles, mutate
from gpuops_sim.apiserver.patch import apply_json_patch

PROFILES = sorted(known_profiles())
OTHER_KEYS = ["cpu", "memory", "ephemeral-storage", "example.com/foo", "hugepages-2Mi", "vendor.io/a~b"]
OTHER_GATES = ["example.com/quota", "example.com/z"]


def resource(prefix: str, profile: str) -> str:
    return prefix + profile.replace("+", "-")


@st.composite
def containers(draw: st.DrawFn, *, mig: bool) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    quantity = st.one_of(st.integers(1, 4), st.integers(1, 4).map(str))
    if mig:
        for profile in draw(st.lists(st.sampled_from(PROFILES), max_size=3, unique=True)):
            key = resource(draw(st.sampled_from([NVIDIA_PREFIX, NVIDIA_PREFIX, OUR_PREFIX])), profile)
            limits[key] = q = draw(quantity)
            if draw(st.booleans()):
                requests[key] = q
    for key in draw(st.lists(st.sampled_from(OTHER_KEYS), max_size=3, unique=True)):
        where = draw(st.sampled_from(["requests", "limits", "both"]))
        q = draw(quantity)
        if where != "limits":
            requests[key] = q
        if where != "requests":
            limits[key] = q
    resources: dict[str, Any] = {}
    shape = draw(st.sampled_from(["plain", "null-requests", "absent-when-empty"]))
    if requests or shape == "plain":
        resources["requests"] = requests
    elif shape == "null-requests":
        resources["requests"] = None
    if limits or shape == "plain":
        resources["limits"] = limits
    c: dict[str, Any] = {"name": "c", "image": "cuda"}
    if bool(resources) or draw(st.booleans()):
        c["resources"] = resources
    return c


@st.composite
def pods(draw: st.DrawFn, *, mig: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for kind, lo in (("initContainers", 0), ("containers", 1)):
        items = draw(st.lists(containers(mig=mig), min_size=lo, max_size=3))
        for i, c in enumerate(items):
            c["name"] = f"{kind[0]}{i}"
        if items or kind == "containers":
            spec[kind] = items
    gates = draw(st.sampled_from([None, "absent", [], [OTHER_GATES[0]], OTHER_GATES, [OTHER_GATES[1], GATE]]))
    if gates != "absent":
        spec["schedulingGates"] = None if gates is None else [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"}, "spec": spec}


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def maps(c: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    res = c.get("resources") or {}
    return dict(res.get("requests") or {}), dict(res.get("limits") or {})


def renamed(key: str) -> str:
    if key.startswith(NVIDIA_PREFIX):
        return OUR_PREFIX + key[len(NVIDIA_PREFIX):]
    return key


def gate_names(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def has_mig(pod: dict[str, Any]) -> bool:
    return any(profile_of_resource(k) for c in all_containers(pod) for m in maps(c) for k in m)


# ---------------------------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(pods())
def test_mutation_renames_only_mig_keys_keeps_quantities_and_gates_once(pod: dict[str, Any]) -> None:
    original = copy.deepcopy(pod)
    result = mutate(pod)
    assert pod == original, "mutate must not change its input"
    assert result.denied is None
    out = apply_json_patch(pod, result.patch)
    for before, after in zip(all_containers(pod), all_containers(out), strict=True):
        req_b, lim_b = maps(before)
        req_a, lim_a = maps(after)
        assert not any(k.startswith(NVIDIA_PREFIX) for k in (*req_a, *lim_a))
        assert lim_a == {renamed(k): v for k, v in lim_b.items()}
        expected_requests = {renamed(k): v for k, v in req_b.items()}
        # a MIG limit without a request is mirrored (what Kubernetes' defaulting does before admission)
        expected_requests |= {renamed(k): v for k, v in lim_b.items() if profile_of_resource(k) and k not in req_b}
        assert req_a == expected_requests
        assert {k: v for k, v in after.items() if k != "resources"} == \
            {k: v for k, v in before.items() if k != "resources"}
    gates_before, gates_after = gate_names(pod), gate_names(out)
    if has_mig(pod):
        assert gates_after.count(GATE) == 1
        assert [g for g in gates_after if g != GATE] == [g for g in gates_before if g != GATE]
    else:
        assert result.patch == []
    assert {k: v for k, v in out["spec"].items() if k not in ("containers", "initContainers", "schedulingGates")} \
        == {k: v for k, v in pod["spec"].items() if k not in ("containers", "initContainers", "schedulingGates")}
    assert out["metadata"] == pod["metadata"]
    again = mutate(out)
    assert again.denied is None and again.patch == [], "a mutated pod (reinvocation) must get an empty patch"


@settings(max_examples=100, deadline=None)
@given(pods(mig=False))
def test_pods_without_mig_get_an_empty_patch(pod: dict[str, Any]) -> None:
    result = mutate(pod)
    assert (result.patch, result.denied) == ([], None)


def test_the_patch_is_minimal_and_escapes_pointers() -> None:
    pod = {"spec": {"containers": [{"name": "c", "image": "x", "resources": {
        "limits": {"nvidia.com/mig-1g.10gb-me": "1", "cpu": "2"}, "requests": {"cpu": "1"}}}]}}
    assert mutate(pod).patch == [
        {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1mig-1g.10gb-me"},
        {"op": "add", "path": "/spec/containers/0/resources/limits/gpuops.io~1mig-1g.10gb-me", "value": "1"},
        {"op": "add", "path": "/spec/containers/0/resources/requests/gpuops.io~1mig-1g.10gb-me", "value": "1"},
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]},
    ]
    assert escape_pointer("a~/b~1") == "a~0~1b~01"


def test_existing_gates_are_appended_to() -> None:
    pod = {"spec": {"schedulingGates": [{"name": "x.io/y"}], "containers": [
        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1},
                                                   "requests": {"nvidia.com/mig-3g.40gb": 1}}}]}}
    out = apply_json_patch(pod, mutate(pod).patch)
    assert gate_names(out) == ["x.io/y", GATE]
    assert out["spec"]["containers"][0]["resources"] == {"limits": {"gpuops.io/mig-3g.40gb": 1},
                                                         "requests": {"gpuops.io/mig-3g.40gb": 1}}


def test_a_pod_asking_for_our_resource_directly_is_gated_too() -> None:
    pod = {"spec": {"containers": [{"name": "c", "image": "x",
                                    "resources": {"limits": {"gpuops.io/mig-1g.5gb": "1"}}}]}}
    out = apply_json_patch(pod, mutate(pod).patch)
    assert gate_names(out) == [GATE]
    assert out["spec"]["containers"][0]["resources"]["requests"] == {"gpuops.io/mig-1g.5gb": "1"}


def test_odd_shapes_are_left_to_the_apiserver() -> None:
    for pod in ({}, {"spec": None}, {"spec": {"containers": None}}, {"spec": {"containers": ["x", None]}},
                {"spec": {"containers": [{"name": "c", "resources": None}]}},
                {"spec": {"containers": [{"name": "c", "resources": {"limits": None, "requests": None}}]}}):
        assert mutate(pod).patch == [] and mutate(pod).denied is None


# ---------------------------------------------------------------------------------------------- denials


def one(resources: dict[str, Any], *, kind: str = "containers", **spec: Any) -> dict[str, Any]:
    c = {"name": "train", "image": "cuda", "resources": resources}
    pod_spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x"}], **spec}
    pod_spec[kind] = [*pod_spec.get(kind, []), c] if kind == "containers" else [c]
    return {"metadata": {"name": "p"}, "spec": pod_spec}


@pytest.mark.parametrize(("pod", "needles"), [
    (one({"limits": {"nvidia.com/mig-foo": 1}}),
     ['container "train" (spec.containers[1])', '"nvidia.com/mig-foo"', "nvidia.com/mig-<compute>g.<memory>gb",
      "-me"]),
    (one({"limits": {"nvidia.com/mig-1g.10gb+me": 1}}, kind="initContainers"),
     ['container "train" (spec.initContainers[0])', "cannot contain \"+\"", "write nvidia.com/mig-1g.10gb-me"]),
    (one({"limits": {"nvidia.com/mig-9g.99gb": 1}}),
     ['"nvidia.com/mig-9g.99gb"', "no GPU model gpuops knows", "A100-40GB", "1g.10gb"]),
    (one({"limits": {"gpuops.io/mig-bogus": 1}}), ['"gpuops.io/mig-bogus"', "does not name a MIG profile"]),
    (one({"limits": {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}}),
     ['container "train"', '"nvidia.com/gpu"', '"nvidia.com/mig-1g.10gb"', "not both"]),
    (one({"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": 1}},
         kind="initContainers"), ["spec.initContainers[0]", "not both"]),
    (one({"limits": {"nvidia.com/mig-1g.10gb": 1}}, kind="ephemeralContainers"),
     ['container "train" (spec.ephemeralContainers[0])', "ephemeral containers cannot be given MIG slices"]),
    (one({"requests": {"nvidia.com/mig-1g.10gb": 1}}), ['requests "nvidia.com/mig-1g.10gb" without a limit']),
    (one({"requests": {"nvidia.com/mig-1g.10gb": 2}, "limits": {"nvidia.com/mig-1g.10gb": "1"}}),
     ["requests 2 of", "limits it to 1", "must equal"]),
    (one({"limits": {"nvidia.com/mig-1g.10gb": 1, "gpuops.io/mig-1g.10gb": 1}}),
     ['"nvidia.com/mig-1g.10gb" and "gpuops.io/mig-1g.10gb"']),
    (one({"limits": {"nvidia.com/mig-1g.10gb": 1}}, nodeName="gpu-1"), ['spec.nodeName is set ("gpu-1")']),
])
def test_denials_name_the_container_and_resource(pod: dict[str, Any], needles: list[str]) -> None:
    result = mutate(pod)
    assert result.patch == []
    assert result.denied is not None
    for needle in needles:
        assert needle in result.denied, (needle, result.denied)


def test_whole_gpus_alone_and_equal_quantities_in_other_spellings_pass() -> None:
    assert mutate(one({"limits": {"nvidia.com/gpu": 2}})).patch == []
    ok = mutate(one({"requests": {"nvidia.com/mig-1g.10gb": "1"}, "limits": {"nvidia.com/mig-1g.10gb": 1}}))
    assert ok.denied is None and ok.patch
    # whole GPUs in one container, a slice in another: allowed (the gate waits for the slice)
    pod = one({"limits": {"nvidia.com/mig-1g.10gb": 1}})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    assert mutate(pod).denied is None


def test_two_profiles_in_one_container_are_admitted_with_a_warning() -> None:
    """One profile per device plugin: in legacy NVIDIA_VISIBLE_DEVICES mode the container would see one."""
    two = {"spec": {"containers": [
        {"name": "mixed", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1",
                                                                  "nvidia.com/mig-2g.10gb": "1"}}},
        {"name": "single", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.20gb": "2"}}}]}}
    result = mutate(two)
    assert result.denied is None and gate_names(apply_json_patch(two, result.patch)) == [GATE]
    assert len(result.warnings) == 1
    assert 'container "mixed"' in result.warnings[0] and "1g.5gb, 2g.10gb" in result.warnings[0]
    assert "CDI" in result.warnings[0]
    one = {"spec": {"containers": [two["spec"]["containers"][1]]}}
    assert mutate(one).warnings == []

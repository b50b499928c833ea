"""JSON patch, merge patch and strategic merge patch as the apiserver applies them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.patch import (
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
    builtin_ssa_shape,
    list_strategy,
)

REJECTED = "the server rejected our request due to an error in our request"

# ------------------------------------------------------------------------------------ JSON values

scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=5)
keys = st.text(alphabet="abcxyz/~", min_size=1, max_size=4)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
null_free = st.recursive(
    st.booleans() | st.integers(-1000, 1000) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)


def _pointer(key: str) -> str:
    return "/" + key.replace("~", "~0").replace("/", "~1")


# ----------------------------------------------------------------------------------- RFC 6902 appendix A

RFC6902_OK = [
    (
        "A.1 add object member",
        {"foo": "bar"},
        [{"op": "add", "path": "/baz", "value": "qux"}],
        {"baz": "qux", "foo": "bar"},
    ),
    (
        "A.2 add array element",
        {"foo": ["bar", "baz"]},
        [{"op": "add", "path": "/foo/1", "value": "qux"}],
        {"foo": ["bar", "qux", "baz"]},
    ),
    (
        "A.3 remove object member",
        {"baz": "qux", "foo": "bar"},
        [{"op": "remove", "path": "/baz"}],
        {"foo": "bar"},
    ),
    (
        "A.4 remove array element",
        {"foo": ["bar", "qux", "baz"]},
        [{"op": "remove", "path": "/foo/1"}],
        {"foo": ["bar", "baz"]},
    ),
    (
        "A.5 replace",
        {"baz": "qux", "foo": "bar"},
        [{"op": "replace", "path": "/baz", "value": "boo"}],
        {"baz": "boo", "foo": "bar"},
    ),
    (
        "A.6 move value",
        {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
        [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
        {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
    ),
    (
        "A.7 move array element",
        {"foo": ["all", "grass", "cows", "eat"]},
        [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
        {"foo": ["all", "cows", "eat", "grass"]},
    ),
    (
        "A.8 test success",
        {"baz": "qux", "foo": ["a", 2, "c"]},
        [{"op": "test", "path": "/baz", "value": "qux"}, {"op": "test", "path": "/foo/1", "value": 2}],
        {"baz": "qux", "foo": ["a", 2, "c"]},
    ),
    (
        "A.10 add nested member object",
        {"foo": "bar"},
        [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
        {"foo": "bar", "child": {"grandchild": {}}},
    ),
    (
        "A.11 ignore unrecognized members",
        {"foo": "bar"},
        [{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}],
        {"foo": "bar", "baz": "qux"},
    ),
    (
        "A.14 ~ escape ordering",
        {"/": 9, "~1": 10},
        [{"op": "test", "path": "/~01", "value": 10}],
        {"/": 9, "~1": 10},
    ),
    (
        "A.16 add array value",
        {"foo": ["bar"]},
        [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
        {"foo": ["bar", ["abc", "def"]]},
    ),
]

RFC6902_FAIL = [
    ("A.9 test error", {"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "bar"}]),
    ("A.12 add to nonexistent target", {"foo": "bar"}, [{"op": "add", "path": "/baz/bat", "value": "qux"}]),
    ("A.15 strings are not numbers", {"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": "10"}]),
]


@pytest.mark.parametrize(("name", "doc", "patch", "expected"), RFC6902_OK, ids=[c[0] for c in RFC6902_OK])
def test_rfc6902_appendix_a(name: str, doc: Any, patch: Any, expected: Any) -> None:
    before = copy.deepcopy(doc)
    assert apply_json_patch(doc, patch) == expected
    assert doc == before  # input not mutated


@pytest.mark.parametrize(("name", "doc", "patch"), RFC6902_FAIL, ids=[c[0] for c in RFC6902_FAIL])
def test_rfc6902_appendix_a_failures_are_422(name: str, doc: Any, patch: Any) -> None:
    with pytest.raises(StatusError) as ei:
        apply_json_patch(doc, patch)
    assert (ei.value.code, ei.value.reason, ei.value.message) == (422, "Invalid", REJECTED)
    assert ei.value.__cause__ is not None  # why it failed, kept for debugging only


def test_failed_test_names_the_path_in_the_cause() -> None:
    with pytest.raises(StatusError) as ei:
        apply_json_patch({"spec": {"replicas": 1}}, [{"op": "test", "path": "/spec/replicas", "value": 2}])
    assert str(ei.value.__cause__) == "testing value /spec/replicas failed: test failed"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"op": "add"}, "json: cannot unmarshal object into Go value of type jsonpatch.Patch"),
        ("x", "json: cannot unmarshal string into Go value of type jsonpatch.Patch"),
        ([1], "json: cannot unmarshal number into Go value of type jsonpatch.Operation"),
        ([["add"]], "json: cannot unmarshal array into Go value of type jsonpatch.Operation"),
    ],
)
def test_undecodable_patch_is_400(body: Any, message: str) -> None:
    with pytest.raises(StatusError) as ei:
        apply_json_patch({}, body)
    assert (ei.value.code, ei.value.reason, ei.value.message) == (400, "BadRequest", message)


@pytest.mark.parametrize(
    "op",
    [
        {"op": "frobnicate", "path": "/a"},
        {"path": "/a", "value": 1},
        {"op": "add", "value": 1},
        {"op": "remove", "path": "/missing"},
        {"op": "remove", "path": "/list/5"},
        {"op": "add", "path": "/list/9", "value": 1},
        {"op": "move", "from": "/a", "path": "/a/b"},
        {"op": "replace", "path": "/list/x", "value": 1},
    ],
)
def test_operations_that_do_not_apply_are_422(op: dict[str, Any]) -> None:
    with pytest.raises(StatusError) as ei:
        apply_json_patch({"a": {"b": 1}, "list": [1, 2]}, [op])
    assert (ei.value.code, ei.value.reason) == (422, "Invalid")


def test_more_than_10000_operations_is_413() -> None:
    ops = [{"op": "test", "path": "/a", "value": 1}] * 10001
    with pytest.raises(StatusError) as ei:
        apply_json_patch({"a": 1}, ops)
    assert ei.value.code == 413
    assert ei.value.reason == "RequestEntityTooLarge"
    assert ei.value.message == (
        "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001"
    )
    assert apply_json_patch({"a": 1}, ops[:10000]) == {"a": 1}


def test_upstream_quirks_of_evanphx_json_patch_v4() -> None:
    doc = {"spec": {"list": ["a", "b", "c"]}}
    # Negative indices count from the end; replace of a missing object key sets it.
    assert apply_json_patch(doc, [{"op": "remove", "path": "/spec/list/-1"}]) == {
        "spec": {"list": ["a", "b"]}
    }
    assert apply_json_patch(doc, [{"op": "add", "path": "/spec/list/-1", "value": "z"}]) == {
        "spec": {"list": ["a", "b", "c", "z"]}
    }
    assert apply_json_patch(doc, [{"op": "replace", "path": "/spec/new", "value": 1}])["spec"]["new"] == 1
    # A missing key tests equal to null; the whole document can be replaced.
    assert apply_json_patch(doc, [{"op": "test", "path": "/spec/none", "value": None}]) == doc
    assert apply_json_patch(doc, [{"op": "replace", "path": "", "value": {"x": 1}}]) == {"x": 1}
    assert apply_json_patch(doc, None) == doc


def test_json_patch_on_an_object_leaves_inputs_alone() -> None:
    doc = {"metadata": {"labels": {"a": "1"}}}
    ops = [{"op": "add", "path": "/metadata/labels/b", "value": {"deep": [1]}}]
    out = apply_json_patch(doc, ops)
    out["metadata"]["labels"]["b"]["deep"].append(2)
    assert ops[0]["value"] == {"deep": [1]}
    assert doc == {"metadata": {"labels": {"a": "1"}}}


@given(st.dictionaries(keys, json_values, max_size=5), keys, json_values)
def test_property_add_then_remove_restores(doc: dict[str, Any], key: str, value: Any) -> None:
    doc.pop(key, None)
    ptr = _pointer(key)
    assert (
        apply_json_patch(doc, [{"op": "add", "path": ptr, "value": value}, {"op": "remove", "path": ptr}])
        == doc
    )


@given(st.lists(json_values, max_size=5), st.data(), json_values)
def test_property_array_insert_then_remove_restores(items: list[Any], data: Any, value: Any) -> None:
    idx = data.draw(st.integers(0, len(items)))
    doc = {"items": items}
    ops = [{"op": "add", "path": f"/items/{idx}", "value": value}, {"op": "remove", "path": f"/items/{idx}"}]
    assert apply_json_patch(doc, ops) == doc


# ----------------------------------------------------------------------------------- RFC 7386 appendix A

RFC7386 = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("doc", "patch", "expected"), RFC7386)
def test_rfc7386_appendix_a(doc: Any, patch: Any, expected: Any) -> None:
    before, pbefore = copy.deepcopy(doc), copy.deepcopy(patch)
    assert apply_merge_patch(doc, patch) == expected
    assert (doc, patch) == (before, pbefore)


def _merge_diff(src: Any, dst: Any) -> Any:
    """The merge patch that turns `src` into a null-free `dst`."""
    if not (isinstance(src, dict) and isinstance(dst, dict)):
        return dst
    out: dict[str, Any] = {k: None for k in src if k not in dst}
    for k, v in dst.items():
        if k not in src:
            out[k] = v
        elif src[k] != v or type(src[k]) is not type(v):
            out[k] = _merge_diff(src[k], v)
    return out


@given(st.dictionaries(keys, json_values, max_size=5), st.dictionaries(keys, null_free, max_size=5))
def test_property_patch_of_the_diff_reaches_the_target(
    doc: dict[str, Any], target: dict[str, Any]
) -> None:
    assert apply_merge_patch(doc, _merge_diff(doc, target)) == target


# ---------------------------------------------------------------------------------- strategic merge patch


def _pod(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def _smp_pod(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    return apply_strategic_merge_patch(doc, patch, "", "Pod")


def test_containers_merge_by_name_and_env_by_name() -> None:
    pod = _pod(
        containers=[
            {
                "name": "app",
                "image": "app:1",
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
            },
            {"name": "side", "image": "side:1"},
        ]
    )
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "app:2",
                    "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
                }
            ]
        }
    }
    out = _smp_pod(pod, patch)
    assert out["spec"]["containers"] == [
        {
            "name": "app",
            "image": "app:2",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
        },
        {"name": "side", "image": "side:1"},
    ]
    assert pod["spec"]["containers"][0]["image"] == "app:1"  # input not mutated


def test_new_items_and_server_only_items_follow_upstream_order() -> None:
    pod = _pod(containers=[{"name": "a"}, {"name": "b"}])
    # Without $setElementOrder, upstream puts new patch items before the server-only ones.
    out = _smp_pod(pod, {"spec": {"containers": [{"name": "c", "image": "c"}]}})
    assert [c["name"] for c in out["spec"]["containers"]] == ["c", "a", "b"]


def test_ports_merge_by_container_port_and_volume_mounts_by_mount_path() -> None:
    pod = _pod(
        containers=[
            {
                "name": "a",
                "ports": [{"containerPort": 80, "name": "http"}],
                "volumeMounts": [{"mountPath": "/data", "name": "d"}],
            }
        ]
    )
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "volumeMounts": [{"mountPath": "/cache", "name": "c"}],
                }
            ]
        }
    }
    c = _smp_pod(pod, patch)["spec"]["containers"][0]
    assert c["ports"] == [{"containerPort": 80, "name": "http", "protocol": "TCP"}]
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/data", "/cache"}


def test_lists_without_strategy_are_replaced_wholesale() -> None:
    pod = _pod(tolerations=[{"key": "a"}], containers=[{"name": "a", "args": ["x", "y"], "command": ["sh"]}])
    patch = {"spec": {"tolerations": [{"key": "b"}], "containers": [{"name": "a", "args": ["z"]}]}}
    out = _smp_pod(pod, patch)
    assert out["spec"]["tolerations"] == [{"key": "b"}]
    assert out["spec"]["containers"][0] == {"name": "a", "args": ["z"], "command": ["sh"]}
    node = {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}
    assert apply_strategic_merge_patch(node, {"spec": {"taints": []}}, "", "Node") == {"spec": {"taints": []}}


def test_null_deletes_and_directives_delete_replace() -> None:
    pod = _pod(nodeSelector={"a": "1"}, containers=[{"name": "a", "image": "x"}, {"name": "b", "image": "y"}])
    out = _smp_pod(pod, {"spec": {"nodeSelector": None, "containers": [{"name": "b", "$patch": "delete"}]}})
    assert "nodeSelector" not in out["spec"]
    assert out["spec"]["containers"] == [{"name": "a", "image": "x"}]
    out = _smp_pod(pod, {"spec": {"containers": [{"name": "z", "image": "z"}, {"$patch": "replace"}]}})
    assert out["spec"]["containers"] == [{"name": "z", "image": "z"}]
    out = _smp_pod(pod, {"spec": {"$patch": "replace", "containers": [{"name": "only"}]}})
    assert out["spec"] == {"containers": [{"name": "only"}]}
    out = _smp_pod(pod, {"metadata": {"$patch": "delete"}})
    assert out["metadata"] == {}


def test_finalizers_merge_as_a_set_and_delete_from_primitive_list() -> None:
    obj = {"metadata": {"name": "x", "finalizers": ["a", "b"]}}
    out = apply_strategic_merge_patch(obj, {"metadata": {"finalizers": ["b", "c"]}}, "", "ConfigMap")
    assert out["metadata"]["finalizers"] == ["a", "b", "c"]
    out = apply_strategic_merge_patch(
        obj, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, "", "ConfigMap"
    )
    assert out["metadata"]["finalizers"] == ["b"]


def test_owner_references_merge_by_uid_and_conditions_by_type() -> None:
    obj = {
        "metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Done", "status": "False"}]},
    }
    patch = {
        "metadata": {"ownerReferences": [{"uid": "2", "name": "b"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    out = apply_strategic_merge_patch(obj, patch, "batch", "Job")
    assert [o["uid"] for o in out["metadata"]["ownerReferences"]] == ["2", "1"]
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "Done", "status": "False"},
    ]


def test_retain_keys_clears_other_fields() -> None:
    dep = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}
    patch = {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}
    assert apply_strategic_merge_patch(dep, patch, "apps", "Deployment") == {
        "spec": {"strategy": {"type": "Recreate"}}
    }
    pod = _pod(volumes=[{"name": "v", "emptyDir": {}}])
    patch2: dict[str, Any] = {
        "spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}]}
    }
    assert _smp_pod(pod, patch2)["spec"]["volumes"] == [{"name": "v", "hostPath": {"path": "/x"}}]


def test_replace_strategy_of_pdb_selector() -> None:
    pdb = {"spec": {"selector": {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b"}]}}}
    out = apply_strategic_merge_patch(
        pdb, {"spec": {"selector": {"matchLabels": {"c": "3"}}}}, "policy", "PodDisruptionBudget"
    )
    assert out == {"spec": {"selector": {"matchLabels": {"c": "3"}}}}


def test_kubectl_three_way_patch_with_set_element_order() -> None:
    """What kubectl client-side apply sends after a config drops env B and a container, and reorders."""
    live = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "app:1",
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        },
                        {"name": "old", "image": "old:1"},
                        {"name": "injected", "image": "mesh:1"},  # added by someone else: kubectl leaves it
                        {"name": "side", "image": "side:1"},
                    ]
                }
            }
        },
    }
    patch = {
        "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}\n"}},
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
                    "containers": [
                        {
                            "$setElementOrder/env": [{"name": "A"}],
                            "env": [{"$patch": "delete", "name": "B"}],
                            "image": "app:2",
                            "name": "app",
                        },
                        {"$patch": "delete", "name": "old"},
                    ],
                }
            }
        },
    }
    out = apply_strategic_merge_patch(live, patch, "apps", "Deployment")
    containers = out["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["injected", "side", "app"]
    assert containers[2] == {"name": "app", "image": "app:2", "env": [{"name": "A", "value": "1"}]}
    assert out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] == "{}\n"


def test_set_element_order_only_reorders() -> None:
    obj = {"metadata": {"finalizers": ["a", "b", "c"]}}
    patch = {"metadata": {"$setElementOrder/finalizers": ["c", "a", "b"]}}
    assert apply_strategic_merge_patch(obj, patch, "", "ConfigMap")["metadata"]["finalizers"] == [
        "c",
        "a",
        "b",
    ]


def test_delete_and_add_with_set_element_order_keep_upstream_aliasing_order() -> None:
    """apimachinery's "add map and delete map from merging list": Go slice aliasing decides the order."""
    obj = {"spec": {"containers": [{"name": "1"}, {"name": "2", "other": "b"}, {"name": "4", "other": "c"}]}}
    patch = {
        "spec": {
            "$setElementOrder/containers": [{"name": "2"}, {"name": "3"}],
            "containers": [{"name": "3"}, {"name": "1", "$patch": "delete"}],
        }
    }
    out = _smp_pod(obj, patch)
    assert out["spec"]["containers"] == [
        {"name": "2", "other": "b"},
        {"name": "4", "other": "c"},
        {"name": "3"},
    ]


@pytest.mark.parametrize(
    ("patch", "code", "message"),
    [
        (
            {"spec": {"containers": [{"image": "x"}]}},
            500,
            "map: map[image:x] does not contain declared merge key: name",
        ),
        (
            {"spec": {"containers": [{"name": "a", "$patch": "merge"}]}},
            500,
            "merging lists cannot yet be specified in the patch",
        ),
        ({"spec": {"$patch": "merge"}}, 500, "unknown patch type: merge in map: map[$patch:merge]"),
        ({"spec": {"$setElementOrder": []}}, 400, "invalid patch format of setElementOrder list"),
        ({"metadata": {"$deleteFromPrimitiveList": []}}, 400, "invalid patch format of primitive list"),
        ({"spec": {"$retainKeys": "x"}}, 400, "invalid patch format of retainKeys"),
        ({"spec": {"$retainKeys": ["a"], "containers": []}}, 400, "invalid patch format of retainKeys"),
        (
            {"spec": {"containers": [{"name": "a"}, 3]}},
            500,
            "list element types are not identical: [[map[name:a]] [map[name:a] 3]]",
        ),
        (
            {"spec": {"$setElementOrder/containers": [{"name": "b"}], "containers": [{"name": "a"}]}},
            500,
            "The order in patch list:\n[map[name:a]]\n doesn't match $setElementOrder list:\n[map[name:b]]\n",
        ),
    ],
)
def test_bad_patches_fail_like_upstream(patch: dict[str, Any], code: int, message: str) -> None:
    with pytest.raises(StatusError) as ei:
        _smp_pod(_pod(containers=[{"name": "a"}]), patch)
    assert ei.value.code == code
    assert ei.value.message == message


def test_list_of_lists_is_422_and_non_object_body_is_400() -> None:
    obj = {"metadata": {"finalizers": [["a"]]}}
    with pytest.raises(StatusError) as ei:
        apply_strategic_merge_patch(obj, {"metadata": {"finalizers": [["b"]]}}, "", "ConfigMap")
    assert (ei.value.code, ei.value.reason) == (422, "Invalid")
    with pytest.raises(StatusError) as ei:
        apply_strategic_merge_patch({}, [1], "", "ConfigMap")  # type: ignore[arg-type]
    assert ei.value.code == 400
    assert ei.value.message == "json: cannot unmarshal array into Go value of type map[string]interface {}"


list_free = st.recursive(
    st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: st.dictionaries(st.sampled_from("abcde"), inner | st.none(), max_size=4),
    max_leaves=10,
)


@given(
    st.dictionaries(st.sampled_from("abcde"), list_free, max_size=4),
    st.dictionaries(st.sampled_from("abcde"), list_free | st.none(), max_size=4),
)
def test_property_without_lists_or_directives_smp_equals_merge_patch(
    doc: dict[str, Any], patch: dict[str, Any]
) -> None:
    obj, p = {"data": doc}, {"data": patch}
    assert apply_strategic_merge_patch(obj, p, "", "ConfigMap") == apply_merge_patch(obj, p)


# ------------------------------------------------------------------------------------ patch metadata


@pytest.mark.parametrize(
    ("group", "kind", "path", "expected"),
    [
        ("", "Pod", ("spec", "containers"), ("merge", "name")),
        ("", "Pod", ("spec", "containers", "env"), ("merge", "name")),
        ("", "Pod", ("spec", "containers", "ports"), ("merge", "containerPort")),
        ("", "Pod", ("spec", "initContainers", "volumeMounts"), ("merge", "mountPath")),
        ("", "Pod", ("spec", "volumes"), ("merge,retainKeys", "name")),
        ("", "Pod", ("spec", "topologySpreadConstraints"), ("merge", "topologyKey")),
        ("", "Pod", ("spec", "tolerations"), (None, None)),
        ("", "Pod", ("spec", "containers", "args"), (None, None)),
        ("", "Pod", ("status", "conditions"), ("merge", "type")),
        ("apps", "Deployment", ("spec", "template", "spec", "containers", "env"), ("merge", "name")),
        ("apps", "Deployment", ("spec", "strategy"), ("retainKeys", None)),
        ("batch", "Job", ("spec", "template", "spec", "schedulingGates"), ("merge", "name")),
        ("apps", "DaemonSet", ("status", "conditions"), ("merge", "type")),
        ("", "Node", ("status", "addresses"), ("merge", "type")),
        ("", "Node", ("spec", "taints"), (None, None)),
        ("", "Service", ("spec", "ports"), ("merge", "port")),
        ("", "ConfigMap", ("metadata", "finalizers"), ("merge", None)),
        ("", "ConfigMap", ("metadata", "ownerReferences"), ("merge", "uid")),
        ("policy", "PodDisruptionBudget", ("spec", "selector"), ("replace", None)),
        ("", "Namespace", ("status", "conditions"), ("merge", "type")),
        ("", "Pod", ("spec", "nope", "containers"), (None, None)),
    ],
)
def test_list_strategy(group: str, kind: str, path: tuple[str, ...], expected: Any) -> None:
    assert list_strategy(group, kind, path) == expected


def test_builtin_ssa_shapes_follow_list_type_markers() -> None:
    assert builtin_ssa_shape("", "Pod", ("spec", "containers", "ports")) == (
        "map",
        ("containerPort", "protocol"),
        False,
    )
    assert builtin_ssa_shape("batch", "Job", ("status", "conditions")) == ("atomic", (), False)
    assert builtin_ssa_shape("", "Pod", ("metadata", "ownerReferences")) == ("map", ("uid",), True)
    assert builtin_ssa_shape("", "Pod", ("metadata", "finalizers")) == ("set", (), False)
    assert builtin_ssa_shape("apps", "Deployment", ("spec", "selector")) == ("atomic", (), False)
    assert builtin_ssa_shape("", "Pod", ("spec", "tolerations")) is None

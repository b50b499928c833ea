"""Server-side apply and managedFields: applies, updates and creates, kubectl's writes, custom resources."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops_sim.apiserver.apply import (
    SchemaHints,
    fields_to_set,
    server_side_apply,
    set_to_fields,
    strip_managed_fields,
    update_managed_fields,
)
from gpuops_sim.apiserver.errors import StatusError

T0, T1, T2, T3 = (f"2024-05-01T00:00:0{i}Z" for i in range(4))


def deployment(
    replicas: int = 2, image: str = "nginx:1", env: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "nginx", "image": image}
    if env is not None:
        container["env"] = env
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [container]}},
            **spec,
        },
    }


def apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    manager: str = "kubectl",
    *,
    force: bool = False,
    now: str = T0,
    **kw: Any,
) -> dict[str, Any]:
    return server_side_apply(
        live, config, manager=manager, force=force, api_version=config["apiVersion"], now=now, **kw
    )


def entries(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e for e in obj["metadata"].get("managedFields", [])}


def fields(obj: dict[str, Any], manager: str, operation: str = "Apply") -> dict[str, Any]:
    return entries(obj)[(manager, operation)]["fieldsV1"]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------- create


def test_create_tracks_the_applied_fields() -> None:
    config = deployment(env=[{"name": "A", "value": "1"}])
    config["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    obj = apply(None, config)
    assert strip_managed_fields(obj) == config
    (entry,) = obj["metadata"]["managedFields"]
    assert entry == {
        "manager": "kubectl",
        "operation": "Apply",
        "apiVersion": "apps/v1",
        "time": T0,
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {
                "f:replicas": {},
                "f:selector": {},  # LabelSelector is an atomic struct
                "f:template": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {
                        "f:containers": {
                            'k:{"name":"nginx"}': {
                                ".": {},
                                "f:env": {'k:{"name":"A"}': {".": {}, "f:name": {}, "f:value": {}}},
                                "f:image": {},
                                "f:name": {},
                                # protocol is part of the key and defaults to TCP
                                "f:ports": {
                                    'k:{"containerPort":80,"protocol":"TCP"}': {
                                        ".": {},
                                        "f:containerPort": {},
                                    }
                                },
                            }
                        }
                    },
                },
            },
        },
    }
    assert config["metadata"] == deployment(env=[])["metadata"]  # input not mutated


def test_reapplying_the_same_config_is_a_no_op() -> None:
    obj = apply(None, deployment())
    again = apply(obj, deployment(), now=T1)
    assert again == obj  # same object, same managedFields, time not bumped


def test_apply_changes_bump_the_time_and_keep_unowned_fields() -> None:
    obj = apply(None, deployment())
    obj["spec"]["paused"] = False  # nobody owns it (e.g. written before tracking)
    out = apply(obj, deployment(replicas=4), now=T1)
    assert out["spec"]["replicas"] == 4
    assert out["spec"]["paused"] is False
    assert entries(out)[("kubectl", "Apply")]["time"] == T1


# ------------------------------------------------------------------------------------------ conflicts


def test_conflict_between_two_appliers() -> None:
    obj = apply(None, deployment(replicas=2), "alice")
    with pytest.raises(StatusError) as ei:
        apply(obj, deployment(replicas=3), "bob", now=T1)
    err = ei.value
    assert (err.code, err.reason) == (409, "Conflict")
    assert err.message == 'Apply failed with 1 conflict: conflict with "alice": .spec.replicas'
    assert [c.to_dict() for c in err.causes] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alice"', "field": ".spec.replicas"}
    ]
    assert err.to_status()["details"] == {"causes": [c.to_dict() for c in err.causes]}


def test_conflicts_with_updaters_name_the_api_version_and_list_every_field() -> None:
    obj = apply(None, deployment(image="nginx:1"), "kubectl")
    edited = copy.deepcopy(obj)
    edited["spec"]["replicas"] = 5
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:2"
    obj = update_managed_fields(
        obj, edited, manager="kube-controller", operation="Update", api_version="apps/v1", now=T1
    )
    with pytest.raises(StatusError) as ei:
        apply(obj, deployment(replicas=3, image="nginx:3"), "kubectl", now=T2)
    err = ei.value
    assert err.message == (
        'Apply failed with 2 conflicts: conflicts with "kube-controller" using apps/v1:\n'
        "- .spec.replicas\n"
        '- .spec.template.spec.containers[name="nginx"].image'
    )
    assert [c.field for c in err.causes] == [
        ".spec.replicas",
        '.spec.template.spec.containers[name="nginx"].image',
    ]
    assert {c.message for c in err.causes} == {'conflict with "kube-controller" using apps/v1'}


def test_same_value_is_shared_not_a_conflict() -> None:
    obj = apply(None, deployment(replicas=2), "alice")
    out = apply(obj, deployment(replicas=2), "bob", now=T1)
    assert "f:replicas" in fields(out, "alice")["f:spec"]
    assert "f:replicas" in fields(out, "bob")["f:spec"]


def test_force_takes_ownership() -> None:
    obj = apply(None, deployment(replicas=2), "alice")
    out = apply(obj, deployment(replicas=3), "bob", force=True, now=T1)
    assert out["spec"]["replicas"] == 3
    assert "f:replicas" not in fields(out, "alice")["f:spec"]
    assert "f:replicas" in fields(out, "bob")["f:spec"]
    assert "f:selector" in fields(out, "alice")["f:spec"]  # the rest stays shared


# ------------------------------------------------------------------------------------ dropped fields


def test_fields_dropped_from_the_config_are_removed() -> None:
    obj = apply(
        None, deployment(env=[{"name": "A", "value": "1"}, {"name": "B", "value": "2"}], minReadySeconds=5)
    )
    out = apply(obj, deployment(env=[{"name": "A", "value": "1"}]), now=T1)
    assert "minReadySeconds" not in out["spec"]
    assert out["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert 'k:{"name":"B"}' not in json.dumps(out["metadata"]["managedFields"])


def test_dropped_fields_another_manager_owns_stay() -> None:
    obj = apply(None, deployment(minReadySeconds=5), "alice")
    obj = apply(obj, deployment(minReadySeconds=5), "bob", now=T1)
    out = apply(obj, deployment(), "alice", now=T2)
    assert out["spec"]["minReadySeconds"] == 5
    assert "f:minReadySeconds" not in fields(out, "alice")["f:spec"]


def test_dropping_everything_under_a_map_removes_the_map() -> None:
    config = deployment()
    config["metadata"]["annotations"] = {"a": "1"}
    obj = apply(None, config)
    out = apply(obj, deployment(), now=T1)
    assert "annotations" not in out["metadata"]


# --------------------------------------------------------------------------- updates (non-apply writes)


def test_create_by_update_owns_new_maps_and_items() -> None:
    obj = update_managed_fields(
        None, deployment(), manager="kubectl-create", operation="Update", api_version="apps/v1", now=T0
    )
    (entry,) = obj["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["time"]) == ("kubectl-create", "Update", T0)
    fv = entry["fieldsV1"]
    # A typed object always carries metadata, spec, template (structs) and containers (null): they are
    # not members; labels is a new map, the container a new item, resources a struct left empty.
    assert fv["f:metadata"] == {"f:labels": {".": {}, "f:app": {}}}
    assert "." not in fv["f:spec"]
    assert fv["f:spec"]["f:template"]["f:spec"]["f:containers"] == {
        'k:{"name":"nginx"}': {".": {}, "f:image": {}, "f:name": {}, "f:resources": {}}
    }


def test_update_transfers_ownership_and_removal_drops_it() -> None:
    obj = apply(None, deployment(minReadySeconds=5), "alice")
    edited = copy.deepcopy(obj)
    edited["spec"]["replicas"] = 9
    del edited["spec"]["minReadySeconds"]
    edited["metadata"]["labels"]["extra"] = "x"
    out = update_managed_fields(
        obj, edited, manager="scaler", operation="Update", api_version="apps/v1", now=T1
    )
    alice = fields(out, "alice")["f:spec"]
    assert "f:replicas" not in alice and "f:minReadySeconds" not in alice
    assert fields(out, "scaler", "Update") == {
        "f:metadata": {"f:labels": {"f:extra": {}}},
        "f:spec": {"f:replicas": {}},
    }
    # The next write by the same updater adds to its set; an unchanged write keeps the old time.
    again = copy.deepcopy(out)
    again["spec"]["paused"] = True
    out2 = update_managed_fields(
        out, again, manager="scaler", operation="Update", api_version="apps/v1", now=T2
    )
    assert set(fields(out2, "scaler", "Update")["f:spec"]) == {"f:replicas", "f:paused"}
    out3 = update_managed_fields(
        out2, copy.deepcopy(out2), manager="scaler", operation="Update", api_version="apps/v1", now=T3
    )
    assert entries(out3)[("scaler", "Update")]["time"] == T2


def test_updater_entries_are_per_api_version_and_subresource() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}]},
    }
    obj = update_managed_fields(None, pod, manager="m", operation="Update", api_version="v1", now=T0)
    status = copy.deepcopy(obj)
    status["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    out = update_managed_fields(
        obj, status, manager="m", operation="Update", api_version="v1", now=T1, subresource="status"
    )
    by_sub = {e.get("subresource", ""): e for e in out["metadata"]["managedFields"]}
    assert set(by_sub) == {"", "status"}
    # The conditions list is new, so it is a member ("."), as upstream records a first status write.
    assert by_sub["status"]["fieldsV1"] == {
        "f:status": {
            "f:conditions": {".": {}, 'k:{"type":"Ready"}': {".": {}, "f:status": {}, "f:type": {}}},
            "f:phase": {},
        }
    }


def test_request_managed_fields_reset_and_untracked_objects() -> None:
    obj = apply(None, deployment())
    reset = copy.deepcopy(obj)
    reset["metadata"]["managedFields"] = [{}]
    cleared = update_managed_fields(
        obj, reset, manager="x", operation="Update", api_version="apps/v1", now=T1
    )
    assert "managedFields" not in cleared["metadata"]
    # An existing object without managedFields stays untracked on update ...
    edited = copy.deepcopy(cleared)
    edited["spec"]["replicas"] = 7
    out = update_managed_fields(
        cleared, edited, manager="x", operation="Update", api_version="apps/v1", now=T2
    )
    assert "managedFields" not in out["metadata"]
    # ... an empty list from a client that does not know the field keeps the live entries.
    keep = copy.deepcopy(obj)
    keep["metadata"]["managedFields"] = []
    out = update_managed_fields(obj, keep, manager="x", operation="Update", api_version="apps/v1", now=T1)
    assert out["metadata"]["managedFields"] == obj["metadata"]["managedFields"]


def test_first_apply_to_an_untracked_object_conflicts_with_before_first_apply() -> None:
    live = deployment(replicas=1)
    live["metadata"]["uid"] = "u1"
    with pytest.raises(StatusError) as ei:
        apply(live, deployment(replicas=2), "kubectl")
    assert ei.value.causes[0].message == 'conflict with "before-first-apply" using apps/v1'
    out = apply(live, deployment(replicas=1), "kubectl")
    assert set(entries(out)) == {("kubectl", "Apply"), ("before-first-apply", "Update")}


def test_at_most_ten_update_managers() -> None:
    obj = apply(None, deployment())
    for i in range(12):
        edited = copy.deepcopy(obj)
        edited["metadata"]["labels"][f"l{i}"] = "x"
        obj = update_managed_fields(
            obj,
            edited,
            manager=f"m{i:02d}",
            operation="Update",
            api_version="apps/v1",
            now=f"2024-05-01T00:01:{i:02d}Z",
        )
    managers = [e["manager"] for e in obj["metadata"]["managedFields"]]
    assert managers[0] == "kubectl"
    assert len(managers) == 11 and "ancient-changes" in managers
    assert "m00" not in managers and "m02" not in managers and "m11" in managers
    ancient = next(e for e in obj["metadata"]["managedFields"] if e["manager"] == "ancient-changes")
    assert set(ancient["fieldsV1"]["f:metadata"]["f:labels"]) == {"f:l0", "f:l1", "f:l2"}


# ------------------------------------------------------------------------------------- kubectl and CRs


def test_kubectl_server_side_apply_takes_over_from_client_side_apply() -> None:
    """After `kubectl apply`, `kubectl apply --server-side` may change what the annotation recorded."""
    config = deployment(replicas=2)
    live = copy.deepcopy(config)
    live["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(config) + "\n"
    }
    live = update_managed_fields(
        None, live, manager="kubectl-client-side-apply", operation="Update", api_version="apps/v1", now=T0
    )
    new = deployment(replicas=3)
    out = apply(live, new, "kubectl", now=T1)
    assert out["spec"]["replicas"] == 3
    annotation = out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    assert json.loads(annotation) == new
    with pytest.raises(StatusError):
        apply(live, new, "someone-else", now=T1)


def test_custom_resource_lists_are_atomic_unless_the_schema_says_otherwise() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "pools": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "size": {"type": "integer"}},
                        },
                    },
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "limits": {"type": "object", "x-kubernetes-map-type": "atomic"},
                    "other": {"type": "array", "items": {"type": "string"}},
                },
            }
        },
    }
    cr = {
        "apiVersion": "gpuops.io/v1alpha1",
        "kind": "SpotPool",
        "metadata": {"name": "sp"},
        "spec": {"pools": [{"name": "a", "size": 1}], "tags": ["x"], "limits": {"gpu": 1}, "other": ["o"]},
    }
    hinted = apply(None, cr, "alice", list_keys=SchemaHints(schema))
    assert fields(hinted, "alice")["f:spec"] == {
        "f:limits": {},
        "f:other": {},
        "f:pools": {'k:{"name":"a"}': {".": {}, "f:name": {}, "f:size": {}}},
        "f:tags": {'v:"x"': {}},
    }
    plain = apply(None, cr, "alice")
    assert fields(plain, "alice")["f:spec"] == {
        "f:limits": {"f:gpu": {}},
        "f:other": {},
        "f:pools": {},
        "f:tags": {},
    }
    # With keys, two appliers own different pools; a second pool is merged in, not a replacement.
    bob = copy.deepcopy(cr)
    bob["spec"] = {"pools": [{"name": "b", "size": 2}]}
    out = apply(hinted, bob, "bob", list_keys=SchemaHints(schema), now=T1)
    assert out["spec"]["pools"] == [{"name": "a", "size": 1}, {"name": "b", "size": 2}]


def test_custom_resource_list_map_keys_take_schema_defaults() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "ports": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["port", "protocol"],
                        "items": {
                            "type": "object",
                            "properties": {
                                "port": {"type": "integer"},
                                "protocol": {"type": "string", "default": "TCP"},
                            },
                        },
                    }
                },
            }
        },
    }
    cr = {
        "apiVersion": "x.io/v1",
        "kind": "Thing",
        "metadata": {"name": "t"},
        "spec": {"ports": [{"port": 1}]},
    }
    obj = apply(None, cr, "alice", list_keys=SchemaHints(schema))
    assert fields(obj, "alice")["f:spec"]["f:ports"] == {
        'k:{"port":1,"protocol":"TCP"}': {".": {}, "f:port": {}}
    }


def test_status_subresource_apply_owns_only_status() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}]},
    }
    live = apply(None, pod, "creator")
    cfg = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"x": "y"}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    out = apply(live, cfg, "kubelet", subresource="status", now=T1)
    assert out["status"] == {"phase": "Running"}
    assert "nodeName" not in out["spec"] and "labels" not in out["metadata"]
    entry = next(e for e in out["metadata"]["managedFields"] if e["manager"] == "kubelet")
    assert entry["subresource"] == "status"
    assert entry["fieldsV1"] == {"f:status": {"f:phase": {}}}


@pytest.mark.parametrize(
    ("mutate", "code", "message"),
    [
        (lambda c: c["metadata"].update(managedFields=[]), 400, "metadata.managedFields must be nil"),
        (
            lambda c: c.update(apiVersion="apps/v1beta1"),
            400,
            "invalid object type: apps/v1beta1, Kind=Deployment",
        ),
        (lambda c: c["spec"]["template"]["spec"]["containers"].append({"name": "nginx"}), 500, None),
        (lambda c: c["spec"]["template"]["spec"]["containers"].append({"image": "x"}), 500, None),
    ],
)
def test_bad_apply_configurations(mutate: Any, code: int, message: str | None) -> None:
    config = deployment()
    mutate(config)
    with pytest.raises(StatusError) as ei:
        server_side_apply(None, config, manager="m", force=False, api_version="apps/v1", now=T0)
    assert ei.value.code == code
    if message:
        assert ei.value.message == message
    else:
        assert ei.value.message.startswith(
            "failed to create typed patch object (apps/v1, Kind=Deployment default/web)"
        )


def test_null_in_the_config_removes_the_field_and_is_owned() -> None:
    obj = apply(None, deployment(minReadySeconds=5), "alice")
    config = deployment()
    config["spec"]["minReadySeconds"] = None
    out = apply(obj, config, "alice", now=T1)
    assert "minReadySeconds" not in out["spec"]
    assert "f:minReadySeconds" in fields(out, "alice")["f:spec"]


def test_apply_keeps_the_applied_order_of_list_items() -> None:
    two = deployment()
    two["spec"]["template"]["spec"]["containers"] = [{"name": "a", "image": "a"}, {"name": "b", "image": "b"}]
    obj = apply(None, two)
    flipped = copy.deepcopy(two)
    flipped["spec"]["template"]["spec"]["containers"].reverse()
    out = apply(obj, flipped, now=T1)
    assert [c["name"] for c in out["spec"]["template"]["spec"]["containers"]] == ["b", "a"]


# ------------------------------------------------------------------------------------ FieldsV1 codec


def test_fields_v1_round_trip_of_a_real_entry() -> None:
    fv = {
        "f:metadata": {
            "f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}},
            "f:finalizers": {".": {}, 'v:"example.com/x"': {}},
        },
        "f:spec": {
            "f:ports": {'k:{"port":80,"protocol":"TCP"}': {".": {}, "f:port": {}, "f:targetPort": {}}},
            "f:selector": {},
        },
    }
    assert set_to_fields(fields_to_set(fv)) == fv


path_elements = st.one_of(
    st.tuples(st.just("f"), st.text(alphabet="abc.:/", min_size=1, max_size=4)),
    st.tuples(st.just("v"), st.sampled_from(['"x"', "1", "true", '"<&>"'])),
    st.tuples(st.just("k"), st.sampled_from([(("name", '"a"'),), (("port", "80"), ("protocol", '"TCP"'))])),
    st.tuples(st.just("i"), st.integers(0, 3)),
)


@given(st.sets(st.lists(path_elements, min_size=1, max_size=4).map(tuple), max_size=8))
def test_property_fields_v1_round_trips(paths: set[Any]) -> None:
    assert fields_to_set(set_to_fields(paths)) == paths


@given(st.integers(1, 5), st.sampled_from(["a:1", "a:2"]), st.booleans())
def test_property_applying_twice_is_idempotent(replicas: int, image: str, with_env: bool) -> None:
    config = deployment(
        replicas=replicas, image=image, env=[{"name": "E", "value": "v"}] if with_env else None
    )
    first = apply(apply(None, deployment()), config, now=T1)
    assert apply(first, config, now=T2) == first
    assert strip_managed_fields(first)["spec"] == config["spec"]

"""A new built-in object's managedFields come from its top-level parts compared with nothing one at a time, each
remembered by its encoding: the same paths as comparing the whole object, on the first create and on a repeat."""

from __future__ import annotations

from typing import Any

import pytest

from gpuops_sim.apiserver import apply

_POD_SPEC: dict[str, Any] = {
    "restartPolicy": "Never",
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "containers": [{"name": "main", "image": "cuda", "env": [{"name": "A", "value": "1"}, {"name": "B"}],
                    "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 81}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    "volumes": [{"name": "v", "emptyDir": {}}],
    "schedulingGates": [{"name": "g"}],
}
OBJECTS = [
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"team": "a"}}, "spec": _POD_SPEC,
     "status": {}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "finalizers": ["x/y"]}, "data": {"k": "v"}},
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
     "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
              "template": {"metadata": {"labels": {"a": "b"}}, "spec": _POD_SPEC}}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
     "spec": {"ports": [{"port": 80, "protocol": "TCP"}, {"port": 80, "protocol": "UDP"}], "selector": {"a": "b"}}},
]


@pytest.mark.parametrize("obj", OBJECTS, ids=[o["kind"] for o in OBJECTS])
def test_parts_compared_alone_and_remembered_give_the_whole_comparison(obj: dict[str, Any]) -> None:
    schema = apply._Schema(obj["apiVersion"].rpartition("/")[0], obj["kind"], None)
    assert schema.builtin
    whole = apply._Walker(schema).compare(schema.skeleton({}), schema.skeleton(obj))
    assert whole.added
    first = apply._created(schema, obj)
    again = apply._created(schema, obj)  # from the memo
    assert first == whole and again == whole
    again.added.clear()  # the caller's sets are its own: the memo is not changed through them
    assert apply._created(schema, obj) == whole

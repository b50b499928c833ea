"""Custom resource updates: the parts an update leaves as stored are checked through memos, and their CEL rules
are not evaluated where ratcheting would drop every error they give. Each property here writes the same update
twice, with that shortcut and with every root property walked and checked in full, and wants the same answer:
the same stored object and warnings, or the same refusal with the same causes in the same order.

Stored objects are drawn from our CRDs' schemas (tests/schema_strategies.py) and then, half the time, broken in
one place (as an object stored before a rule tightened is), so ratcheting has errors to drop or keep; a
synthetic schema adds what our CRDs lack: errors kube-openapi reports at the root (anyOf, int32 range), which
ratcheting never drops, a transition rule, and a list-type=map whose repeated keys pair items across positions.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_strategies import for_schema

from gpuops_sim.apiserver import crds, schema
from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.resources import ResourceInfo

ROOT = Path(__file__).resolve().parents[2]
INFOS = [
    info
    for path in sorted((ROOT / "manifests" / "crds").glob("*.yaml"))
    for info in crds.crd_resource_infos(yaml.safe_load(path.read_text()))
    if info.schema is not None
]

_STR = {"type": "string"}
_INT = {"type": "integer"}
SYNTHETIC_SPEC: dict[str, Any] = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "format": "int32", "minimum": 0},
        "alt": {"type": "object", "properties": {"a": _STR, "b": _STR},
                "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
        "pools": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "properties": {"name": _STR, "size": {"type": "integer", "minimum": 1}},
                            "required": ["name"],
                            "x-kubernetes-validations": [{"rule": "self.size < 5", "message": "small"}]}},
        "counter": {"type": "integer", "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "grows"}]},
        "sel": {"type": "object", "additionalProperties": _STR, "maxProperties": 2,
                "x-kubernetes-validations": [{"rule": "size(self) > 0", "message": "not empty"}]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}},
    },
    "required": ["n"],
}
SYNTHETIC = ResourceInfo(
    group="gpuops.io", version="v1alpha1", resource="synthetics", kind="Synthetic", singular="synthetic",
    namespaced=True, crd_name="synthetics.gpuops.io",
    schema={"type": "object", "properties": {
        "spec": SYNTHETIC_SPEC,
        "status": {"type": "object", "properties": {"seen": _INT, "sel": SYNTHETIC_SPEC["properties"]["sel"]}},
    }},
)

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=4),
                     st.sampled_from([0, -1, 3_000_000_000, 5, "x", "z", ""]))
_synthetic_spec = st.fixed_dictionaries({"n": st.sampled_from([0, 1, -1, 3_000_000_000])}, optional={
    "alt": st.sampled_from([{"a": "1"}, {"b": "2"}, {}, {"a": "1", "b": "2"}]),
    "pools": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["a", "b"]), "size": st.integers(0, 6)}),
                      max_size=3),
    "counter": st.integers(0, 3),
    "sel": st.dictionaries(st.sampled_from(["k", "l", "m"]), st.sampled_from(["v", "w"]), max_size=3),
    "tags": st.lists(st.sampled_from(["x", "y", "q"]), max_size=2),
})
_synthetic_status = st.fixed_dictionaries({}, optional={
    "seen": st.integers(0, 3),
    "sel": st.dictionaries(st.sampled_from(["k", "l"]), st.just("v"), max_size=2),
})


def _leaves(x: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(x, dict) and x:
        for k, v in x.items():
            yield from _leaves(v, (*at, k))
    elif isinstance(x, list) and x:
        for i, v in enumerate(x):
            yield from _leaves(v, (*at, i))
    elif at:
        yield at


def _broken(draw: st.DrawFn, part: Any) -> Any:
    """`part` with one leaf replaced by any JSON scalar, half the time (a value stored past today's checks)."""
    paths = list(_leaves(part))
    if not paths or draw(st.booleans()):
        return part
    at = draw(st.sampled_from(paths))
    out = copy.deepcopy(part)
    node = out
    for step in at[:-1]:
        node = node[step]
    node[at[-1]] = draw(_scalars)
    return out


def _stored(info: ResourceInfo, spec: Any, status: Any) -> dict[str, Any]:
    obj = {"apiVersion": info.group_version, "kind": info.kind,
           "metadata": {"name": "x", "namespace": "ns", "uid": "u", "resourceVersion": "7", "generation": 1}}
    if spec is not None:
        obj["spec"] = spec
    if status is not None:
        obj["status"] = status
    return obj


@st.composite
def updates(draw: st.DrawFn) -> tuple[ResourceInfo, dict[str, Any], dict[str, Any]]:
    """(resource, old as stored, new): an update that keeps the spec (a status write), keeps the status, keeps
    both (a no-op), or keeps neither, with the kept parts the stored objects themselves or equal copies."""
    info = draw(st.sampled_from([*INFOS, SYNTHETIC, SYNTHETIC]))
    assert info.schema is not None
    props = info.schema["properties"]
    if info is SYNTHETIC:
        spec, status = (_synthetic_spec, _synthetic_status)
    else:
        spec, status = (for_schema(props[k], k) if k in props else st.none() for k in ("spec", "status"))
    old = _stored(info, _broken(draw, draw(spec)), _broken(draw, draw(status)))
    new = dict(old, metadata=dict(old["metadata"]))
    for k, fresh in (("spec", spec), ("status", status)):
        how = draw(st.sampled_from(["same", "copy", "new", "broken"]))
        if how == "copy" and k in old:
            new[k] = copy.deepcopy(old[k])
        elif how in ("new", "broken"):
            value = draw(fresh)
            new[k] = _broken(draw, value) if how == "broken" else value
            if new[k] is None:
                del new[k]
    return info, old, new


def _answer(info: ResourceInfo, new: dict[str, Any], old: dict[str, Any]) -> tuple[Any, ...]:
    try:
        out, warnings = schema.process_custom_resource(info, dict(new), old=old, field_validation="Warn")
    except StatusError as e:
        return ("refused", e.code, e.message, [c.to_dict() for c in e.causes])
    return ("stored", msgspec.json.encode(out), warnings)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(updates())
def test_an_update_is_answered_alike_with_and_without_the_shortcut(case: tuple[Any, ...]) -> None:
    info, old, new = case
    before = msgspec.json.encode([old, new])
    fast = _answer(info, new, old)
    with mock.patch.object(schema, "_unchanged_roots", lambda *_: {}):
        full = _answer(info, new, old)
    assert fast == full
    assert msgspec.json.encode([old, new]) == before  # neither write changed what it was given


def test_the_shortcut_takes_effect_on_a_status_write() -> None:
    """A status write leaves the spec as stored: its root property is found unchanged and its rules skipped."""
    info = next(i for i in INFOS if i.kind == "GPUWorkloadBudget")
    assert info.schema is not None
    spec = {"selector": {"matchLabels": {"team": "a"}}, "quota": {"gpuHours": "10", "windowHours": 1},
            "enforcement": {"action": "AlertOnly", "delaySeconds": 60}}
    old, _ = schema.process_custom_resource(info, _stored(info, spec, None), old=None, field_validation="Strict")
    new = dict(old, status={"observedGeneration": 1})
    assert "spec" in schema._unchanged_roots(info.schema, new, old)
    assert schema._ratchet_drops_rules(info.schema["properties"]["spec"])
    assert not schema._ratchet_drops_rules(SYNTHETIC_SPEC)  # a transition rule and a list-type=map
    with mock.patch.object(schema.cel, "evaluate_rules", wraps=schema.cel.evaluate_rules) as rules:
        stored, _ = schema.process_custom_resource(info, new, old=old, field_validation="Strict")
    assert stored["spec"] == old["spec"]
    assert all(not str(c.args[3]).startswith("spec") for c in rules.call_args_list)

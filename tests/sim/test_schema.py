"""Structural schemas: unknown fields, pruning, defaulting, validation messages."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops_sim.apiserver import schema
from gpuops_sim.apiserver.errors import Cause, StatusError
from gpuops_sim.apiserver.resources import ResourceInfo

INT = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
NUM = {"type": "number"}


def obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, **extra}


def root(spec_props: dict[str, Any], **spec_extra: Any) -> dict[str, Any]:
    return obj(
        {
            "spec": obj(spec_props, **spec_extra),
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        }
    )


def causes(s: dict[str, Any], value: Any, **kw: Any) -> list[tuple[str, str, str]]:
    return [(c.reason, c.field, c.message) for c in schema.validate(s, value, **kw)]


# -- unknown fields ----------------------------------------------------------------------------------------

NESTED = root(
    {
        "containers": {"type": "array", "items": obj({"name": STR})},
        "labels": {"type": "object", "additionalProperties": STR},
        "free": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"known": obj({"a": INT})},
        },
        "quantity": {"x-kubernetes-int-or-string": True},
        "template": {
            "type": "object",
            "x-kubernetes-embedded-resource": True,
            "properties": {"spec": obj({"replicas": INT})},
        },
        "name": STR,
    }
)


def test_unknown_fields_paths() -> None:
    o = {
        "apiVersion": "gpuops.io/v1",
        "kind": "K",
        "metadata": {"name": "a", "bogus": 1, "ownerReferences": [{"name": "o", "nope": True}]},
        "spec": {
            "foo": 1,
            "containers": [{"name": "a"}, {"name": "b", "bar": 2}],
            "labels": {"any": "thing"},
            "free": {"anything": {"goes": 1}, "known": {"a": 1, "b": 2}},
            "quantity": "5",
            "template": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "t", "x": 1},
                "spec": {"y": 1},
            },
        },
        "extra": True,
    }
    assert schema.unknown_fields(NESTED, o) == [
        "metadata.bogus",
        "metadata.ownerReferences[0].nope",
        "extra",
        "spec.containers[1].bar",
        "spec.foo",
        "spec.free.known.b",
        "spec.template.spec.y",
        "spec.template.metadata.x",
    ]


def test_unknown_fields_skip_root_and_type_mismatch() -> None:
    s = obj({"spec": obj({"name": STR})})
    # a map where a string is declared: its keys are unknown (upstream prunes them, then the type check fails)
    assert schema.unknown_fields(s, {"spec": {"name": {"a": 1}}}) == ["spec.name.a"]
    assert schema.unknown_fields(s, {"kind": "X", "spec": {}}, skip_root=()) == []
    assert schema.unknown_fields(s, {"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}}) == []


def test_check_field_validation_directives() -> None:
    unknown = ["spec.foo", "spec.bar"]
    assert schema.check_field_validation(unknown, "Warn") == [
        'unknown field "spec.foo"',
        'unknown field "spec.bar"',
    ]
    assert schema.check_field_validation(unknown, "") == [
        'unknown field "spec.foo"',
        'unknown field "spec.bar"',
    ]
    assert schema.check_field_validation(unknown, "Ignore") == []
    assert schema.check_field_validation([], "Strict") == []
    with pytest.raises(StatusError) as e:
        schema.check_field_validation(unknown, "Strict")
    assert (e.value.code, e.value.reason) == (400, "BadRequest")
    assert e.value.message == 'strict decoding error: unknown field "spec.foo", unknown field "spec.bar"'
    with pytest.raises(StatusError) as e:
        schema.check_field_validation([], "Loose")
    assert (e.value.code, e.value.reason) == (422, "Invalid")
    assert e.value.message == (
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Loose": '
        'supported values: "", "Ignore", "Strict", "Warn"'
    )


def test_prune_removes_unknown_and_keeps_preserved() -> None:
    o = {
        "apiVersion": "gpuops.io/v1",
        "kind": "K",
        "metadata": {"name": "a", "bogus": 1, "labels": {"x": "y"}},
        "spec": {
            "foo": 1,
            "free": {"anything": 1, "known": {"a": 1, "b": 2}},
            "containers": [{"name": "a", "z": 0}],
        },
        "extra": True,
    }
    before = copy.deepcopy(o)
    assert schema.prune(NESTED, o) == {
        "apiVersion": "gpuops.io/v1",
        "kind": "K",
        "metadata": {"name": "a", "labels": {"x": "y"}},
        "spec": {"free": {"anything": 1, "known": {"a": 1}}, "containers": [{"name": "a"}]},
    }
    assert o == before


def test_prune_nulls() -> None:
    s = obj({"a": INT, "b": {"type": "integer", "nullable": True}, "c": {"type": "integer", "default": 3}})
    assert schema.prune_nulls(s, {"a": None, "b": None, "c": None}) == {"b": None, "c": None}


# -- defaulting --------------------------------------------------------------------------------------------

DEFAULTS = root(
    {
        "action": {"type": "string", "default": "AlertOnly"},
        "quota": obj({"windowHours": {"type": "integer", "default": 24}, "gpuHours": INT}, default={}),
        "notify": obj({"channel": {"type": "string", "default": "email"}}),
        "maybe": {"type": "string", "nullable": True, "default": "x"},
        "items": {"type": "array", "items": obj({"w": {"type": "integer", "default": 1}})},
        "byName": {
            "type": "object",
            "additionalProperties": obj({"on": {"type": "boolean", "default": True}}),
        },
    }
)


def test_defaults_upstream_order() -> None:
    o = {"spec": {"maybe": None, "items": [{}, {"w": 5}], "byName": {"a": {}}}}
    before = copy.deepcopy(o)
    out = schema.apply_defaults(DEFAULTS, o)
    assert out["spec"] == {
        "action": "AlertOnly",
        "quota": {"windowHours": 24},  # default {} of the parent, then the nested default
        "maybe": None,  # nullable: null stays
        "items": [{"w": 1}, {"w": 5}],
        "byName": {"a": {"on": True}},
    }
    assert "notify" not in out["spec"]  # defaults apply below existing parents only
    assert o == before
    assert schema.apply_defaults(DEFAULTS, {}) == {}


def test_non_nullable_null_is_defaulted() -> None:
    assert schema.apply_defaults(DEFAULTS, {"spec": {"action": None}})["spec"]["action"] == "AlertOnly"


# -- validation messages -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prop", "value", "expected"),
    [
        (
            INT,
            "string",
            (
                "FieldValueTypeInvalid",
                'Invalid value: "string": spec.x in body must be of type integer: "string"',
            ),
        ),
        (
            INT,
            True,
            (
                "FieldValueTypeInvalid",
                'Invalid value: "boolean": spec.x in body must be of type integer: "boolean"',
            ),
        ),
        (
            STR,
            5,
            (
                "FieldValueTypeInvalid",
                'Invalid value: "integer": spec.x in body must be of type string: "integer"',
            ),
        ),
        (
            BOOL,
            "true",
            (
                "FieldValueTypeInvalid",
                'Invalid value: "string": spec.x in body must be of type boolean: "string"',
            ),
        ),
        (
            obj({}),
            [],
            (
                "FieldValueTypeInvalid",
                'Invalid value: "array": spec.x in body must be of type object: "array"',
            ),
        ),
        (
            {"type": "array", "items": INT},
            {},
            (
                "FieldValueTypeInvalid",
                'Invalid value: "object": spec.x in body must be of type array: "object"',
            ),
        ),
        (
            INT,
            None,
            (
                "FieldValueTypeInvalid",
                'Invalid value: "null": spec.x in body must be of type integer: "null"',
            ),
        ),
        (
            {"x-kubernetes-int-or-string": True},
            1.5,
            (
                "FieldValueTypeInvalid",
                'Invalid value: "number": spec.x in body must be of type integer,string: "number"',
            ),
        ),
        (
            {"type": "integer", "minimum": 1},
            0,
            ("FieldValueInvalid", "Invalid value: 0: spec.x in body should be greater than or equal to 1"),
        ),
        (
            {"type": "integer", "minimum": 1, "exclusiveMinimum": True},
            1,
            ("FieldValueInvalid", "Invalid value: 1: spec.x in body should be greater than 1"),
        ),
        (
            {"type": "integer", "maximum": 10},
            11,
            ("FieldValueInvalid", "Invalid value: 11: spec.x in body should be less than or equal to 10"),
        ),
        (
            {"type": "number", "maximum": 0.5, "exclusiveMaximum": True},
            0.5,
            ("FieldValueInvalid", "Invalid value: 0.5: spec.x in body should be less than 0.5"),
        ),
        (
            {"type": "integer", "multipleOf": 5},
            7,
            ("FieldValueInvalid", "Invalid value: 7: spec.x in body should be a multiple of 5"),
        ),
        (
            {"type": "number", "multipleOf": 0.5},
            0.7,
            ("FieldValueInvalid", "Invalid value: 0.7: spec.x in body should be a multiple of 0.5"),
        ),
        (
            {"type": "string", "maxLength": 3},
            "abcd",
            ("FieldValueTooLong", "Too long: may not be more than 3 bytes"),
        ),
        (
            {"type": "string", "maxLength": 1},
            "ab",
            ("FieldValueTooLong", "Too long: may not be more than 1 byte"),
        ),
        (
            {"type": "string", "minLength": 3},
            "ab",
            ("FieldValueInvalid", 'Invalid value: "ab": spec.x in body should be at least 3 chars long'),
        ),
        (
            {"type": "string", "pattern": "^[0-9]+$"},
            "1a",
            ("FieldValueInvalid", "Invalid value: \"1a\": spec.x in body should match '^[0-9]+$'"),
        ),
        (
            {"type": "string", "enum": ["Evict", "Pause", "AlertOnly"]},
            "Foo",
            (
                "FieldValueNotSupported",
                'Unsupported value: "Foo": supported values: "Evict", "Pause", "AlertOnly"',
            ),
        ),
        (
            {"type": "integer", "enum": [1, 2]},
            3,
            ("FieldValueNotSupported", 'Unsupported value: 3: supported values: "1", "2"'),
        ),
        (
            {"type": "array", "items": INT, "minItems": 1},
            [],
            ("FieldValueInvalid", "Invalid value: 0: spec.x in body should have at least 1 items"),
        ),
        (
            {"type": "array", "items": INT, "maxItems": 2},
            [1, 2, 3],
            ("FieldValueTooMany", "Too many: 3: must have at most 2 items"),
        ),
        (
            {"type": "array", "items": INT, "uniqueItems": True},
            [1, 1],
            ("FieldValueInvalid", 'Invalid value: "": spec.x in body shouldn\'t contain duplicates'),
        ),
        (
            {"type": "object", "additionalProperties": STR, "minProperties": 1},
            {},
            ("FieldValueInvalid", "Invalid value: 0: spec.x in body should have at least 1 properties"),
        ),
        (
            {"type": "object", "additionalProperties": STR, "maxProperties": 1},
            {"a": "", "b": ""},
            ("FieldValueTooMany", "Too many: 2: must have at most 1 item"),
        ),
        (
            {"type": "string", "format": "date-time"},
            "yesterday",
            (
                "FieldValueTypeInvalid",
                'Invalid value: "yesterday": spec.x in body must be of type date-time: "yesterday"',
            ),
        ),
        (
            {"type": "string", "format": "byte"},
            "!!",
            ("FieldValueTypeInvalid", 'Invalid value: "!!": spec.x in body must be of type byte: "!!"'),
        ),
    ],
)
def test_value_validation_messages(
    prop: dict[str, Any], value: Any, expected: tuple[str, str]
) -> None:
    assert causes(root({"x": prop}), {"spec": {"x": value}}) == [(expected[0], "spec.x", expected[1])]


@pytest.mark.parametrize(
    ("prop", "value"),
    [
        (INT, 3),
        (INT, 3.0),  # an integral float is an integer, as in kube-openapi
        (NUM, 3),
        (NUM, 2.5),
        ({"x-kubernetes-int-or-string": True}, 3),
        ({"x-kubernetes-int-or-string": True}, "30%"),
        ({"type": "string", "nullable": True}, None),
        ({"type": "string", "format": "date-time"}, "2026-01-02T03:04:05Z"),
        ({"type": "string", "format": "date-time"}, "2026-01-02T03:04:05.123+01:00"),
        ({"type": "string", "format": "byte"}, "aGVsbG8="),
        ({"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000"),
        ({"type": "string", "format": "ipv4"}, "10.0.0.1"),
        ({"type": "string", "format": "duration"}, "1h30m"),
        ({"type": "string", "format": "unknown-format"}, "anything"),
        ({"type": "number", "enum": [1, 2.5]}, 1.0),
        ({"type": "integer", "format": "int32"}, 2**31 - 1),
        ({"type": "string", "pattern": "^[0-9]+(Gi|Mi)?$"}, "10Gi"),
    ],
)
def test_valid_values(prop: dict[str, Any], value: Any) -> None:
    assert causes(root({"x": prop}), {"spec": {"x": value}}) == []


def test_fractional_integer_reports_type_and_range() -> None:
    # kube-openapi's type check and its "Checked value" range check both fire, the latter at the root
    assert causes(root({"x": INT}), {"spec": {"x": 1.5}}) == [
        (
            "FieldValueTypeInvalid",
            "spec.x",
            'Invalid value: "number": spec.x in body must be of type integer: "number"',
        ),
        (
            "FieldValueInvalid",
            "<nil>",
            'Invalid value: "": Checked value must be of type integer (default format) in spec.x',
        ),
    ]


def test_int32_range() -> None:
    assert causes(root({"x": {"type": "integer", "format": "int32"}}), {"spec": {"x": 2**31}}) == [
        (
            "FieldValueInvalid",
            "<nil>",
            'Invalid value: "": Checked value must be of type integer with format int32 in spec.x',
        )
    ]


def test_required_and_nested_paths() -> None:
    s = root(
        {
            "quota": obj({"gpuHours": INT}, required=["gpuHours"]),
            "items": {"type": "array", "items": obj({"name": STR}, required=["name"])},
        },
        required=["quota"],
    )
    assert causes(s, {"spec": {"items": [{"name": "a"}, {}, {"name": 3}]}}) == [
        ("FieldValueRequired", "spec.items[1].name", "Required value"),
        (
            "FieldValueTypeInvalid",
            "spec.items[2].name",
            'Invalid value: "integer": spec.items[2].name in body must be of type string: "integer"',
        ),
        ("FieldValueRequired", "spec.quota", "Required value"),
    ]
    assert causes(obj({"spec": INT}, required=["spec"]), {}) == [
        ("FieldValueRequired", "spec", "Required value")
    ]


def test_root_type_error_and_root_path() -> None:
    assert causes(obj({}), []) == [
        ("FieldValueTypeInvalid", "<nil>", 'Invalid value: "array":  in body must be of type object: "array"')
    ]
    s = {"type": "integer", "minimum": 1}
    assert causes(s, 0, root_path="spec.x.default") == [
        (
            "FieldValueInvalid",
            "spec.x.default",
            "Invalid value: 0:  in body should be greater than or equal to 1",
        )
    ]


def test_junctors() -> None:
    any_of = root({"x": {"type": "string", "anyOf": [{"pattern": "^a"}, {"pattern": "^b"}]}})
    assert causes(any_of, {"spec": {"x": "a1"}}) == []
    assert causes(any_of, {"spec": {"x": "c"}}) == [
        (
            "FieldValueInvalid",
            "<nil>",
            'Invalid value: "": "spec.x" must validate at least one schema (anyOf)',
        ),
        ("FieldValueInvalid", "spec.x", "Invalid value: \"c\": spec.x in body should match '^a'"),
    ]
    one_of = root({"x": {"type": "integer", "oneOf": [{"minimum": 1}, {"minimum": 2}]}})
    assert causes(one_of, {"spec": {"x": 1}}) == []
    assert causes(one_of, {"spec": {"x": 5}}) == [
        (
            "FieldValueInvalid",
            "<nil>",
            'Invalid value: "": "spec.x" must validate one and only one schema (oneOf). '
            "Found 2 valid alternatives",
        )
    ]
    all_of = root({"x": {"type": "integer", "allOf": [{"minimum": 1}, {"maximum": 3}]}})
    assert causes(all_of, {"spec": {"x": 9}}) == [
        ("FieldValueInvalid", "spec.x", "Invalid value: 9: spec.x in body should be less than or equal to 3"),
        ("FieldValueInvalid", "<nil>", 'Invalid value: "": "spec.x" must validate all the schemas (allOf)'),
    ]
    not_ = root({"x": {"type": "string", "not": {"enum": ["forbidden"]}}})
    assert causes(not_, {"spec": {"x": "forbidden"}}) == [
        ("FieldValueInvalid", "<nil>", 'Invalid value: "": "spec.x" must not validate the schema (not)')
    ]


def test_list_types() -> None:
    s = root(
        {
            "tags": {"type": "array", "items": STR, "x-kubernetes-list-type": "set"},
            "ports": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": obj({"name": STR, "port": INT}),
            },
        }
    )
    assert causes(
        s,
        {
            "spec": {
                "tags": ["a", "b", "a", "a"],
                "ports": [{"name": "x"}, {"name": "y"}, {"name": "x", "port": 2}],
            }
        },
    ) == [
        ("FieldValueDuplicate", "spec.tags[2]", 'Duplicate value: "a"'),
        ("FieldValueDuplicate", "spec.ports[2]", 'Duplicate value: {"name":"x"}'),
    ]


def test_embedded_resource_needs_type_meta() -> None:
    s = root(
        {
            "template": {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "x-kubernetes-preserve-unknown-fields": True,
            }
        }
    )
    assert causes(s, {"spec": {"template": {"kind": ""}}}) == [
        ("FieldValueRequired", "spec.template.apiVersion", "Required value"),
        ("FieldValueInvalid", "spec.template.kind", 'Invalid value: "": must not be empty'),
    ]


BLOCKED = (
    "FieldValueInvalid",
    "<nil>",
    "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation",
)


def test_cel_is_blocked_by_type_errors_but_not_by_range_errors() -> None:
    s = root(
        {"minimum": {"type": "integer", "minimum": 0}, "maximum": INT},
        **{"x-kubernetes-validations": [{"rule": "self.minimum <= self.maximum"}]},
    )
    assert causes(s, {"spec": {"minimum": "1", "maximum": 0}})[-1] == BLOCKED
    assert causes(s, {"spec": {"minimum": -1, "maximum": -2}}) == [
        (
            "FieldValueInvalid",
            "spec.minimum",
            "Invalid value: -1: spec.minimum in body should be greater than or equal to 0",
        ),
        ("FieldValueInvalid", "spec", "Invalid value: failed rule: self.minimum <= self.maximum"),
    ]


def test_cel_transition_rules_use_old_and_map_list_correlation() -> None:
    item = obj(
        {
            "name": STR,
            "size": {
                "type": "integer",
                "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "may not shrink"}],
            },
        }
    )
    s = root(
        {
            "pools": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": item,
            }
        }
    )
    new = {"spec": {"pools": [{"name": "b", "size": 1}, {"name": "a", "size": 5}]}}
    old = {"spec": {"pools": [{"name": "a", "size": 6}, {"name": "b", "size": 1}]}}
    assert causes(s, new) == []
    assert causes(s, new, old=old) == [
        ("FieldValueInvalid", "spec.pools[1].size", "Invalid value: 5: may not shrink")
    ]


def test_go_formatting() -> None:
    assert schema.go_float(1e6) == "1e+06"
    assert schema.go_float(123456.0) == "123456"
    assert schema.go_float(0.0001) == "0.0001"
    assert schema.go_float(1e-5) == "1e-05"
    assert schema.go_json({"b": 1.0, "a": ["<x>", None, True]}) == '{"a":["\\u003cx\\u003e",null,true],"b":1}'
    assert schema.go_quote('a"b\n') == '"a\\"b\\n"'


# -- the CR write path -------------------------------------------------------------------------------------

GWB_SCHEMA = root(
    {
        "windowHours": {"type": "integer", "minimum": 1},
        "action": {"type": "string", "enum": ["Evict", "Pause", "AlertOnly"], "default": "AlertOnly"},
        "pool": {
            "type": "string",
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "pool is immutable"}],
        },
    },
    required=["windowHours"],
)
INFO = ResourceInfo(
    group="gpuops.io", version="v1alpha1", resource="gpuworkloadbudgets", kind="GPUWorkloadBudget",
    singular="gpuworkloadbudget", namespaced=True, has_generation=True, schema=GWB_SCHEMA,
    crd_name="gpuworkloadbudgets.gpuops.io",
)  # fmt: skip


def cr(name: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpuops.io/v1alpha1",
        "kind": "GPUWorkloadBudget",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": spec,
    }


def test_process_prunes_defaults_and_warns() -> None:
    body = cr(windowHours=24, bogus=1)
    body["metadata"]["finalizers"] = ["cleanup"]
    before = copy.deepcopy(body)
    out, warnings = schema.process_custom_resource(INFO, body, old=None, field_validation="")
    assert out["spec"] == {"windowHours": 24, "action": "AlertOnly"}
    assert warnings == [
        'unknown field "spec.bogus"',
        'metadata.finalizers: "cleanup": prefer a domain-qualified finalizer name to avoid accidental '
        "conflicts "
        "with other finalizer writers",
    ]
    assert body == before


def test_process_strict_and_ignore() -> None:
    with pytest.raises(StatusError) as e:
        schema.process_custom_resource(INFO, cr(windowHours=1, bogus=1), old=None, field_validation="Strict")
    assert e.value.code == 400
    assert e.value.message == 'strict decoding error: unknown field "spec.bogus"'
    out, warnings = schema.process_custom_resource(
        INFO, cr(windowHours=1, bogus=1), old=None, field_validation="Ignore"
    )
    assert warnings == [] and "bogus" not in out["spec"]


def test_process_invalid_is_422_with_causes() -> None:
    with pytest.raises(StatusError) as e:
        schema.process_custom_resource(INFO, cr(windowHours=0, action="Foo"), old=None, field_validation="")
    err = e.value
    assert (err.code, err.reason, err.kind, err.group, err.name) == (
        422,
        "Invalid",
        "GPUWorkloadBudget",
        "gpuops.io",
        "team-a",
    )
    assert err.message == (
        'GPUWorkloadBudget.gpuops.io "team-a" is invalid: [spec.windowHours: Invalid value: 0: '
        "spec.windowHours in "
        'body should be greater than or equal to 1, spec.action: Unsupported value: "Foo": supported values: '
        '"Evict", "Pause", "AlertOnly", <nil>: Invalid value: null: some validation rules were not checked '
        "because "
        "the object was invalid; correct the existing errors to complete validation]"
    )
    assert err.to_status()["details"]["causes"][0] == {
        "reason": "FieldValueInvalid",
        "message": "Invalid value: 0: spec.windowHours in body should be greater than or equal to 1",
        "field": "spec.windowHours",
    }


def test_process_name_and_type_meta() -> None:
    with pytest.raises(StatusError) as e:
        schema.process_custom_resource(INFO, cr("Team_A", windowHours=1), old=None, field_validation="")
    assert e.value.causes[0].field == "metadata.name"
    assert e.value.causes[0].message.startswith(
        'Invalid value: "Team_A": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric '
        "characters"
    )
    with pytest.raises(StatusError) as e:
        schema.process_custom_resource(
            INFO, {**cr(windowHours=1), "kind": "Other"}, old=None, field_validation=""
        )
    assert (
        e.value.message == 'GPUWorkloadBudget.gpuops.io "team-a" is invalid: kind: Invalid value: "Other": '
        "must be GPUWorkloadBudget"
    )
    with pytest.raises(StatusError) as e:
        schema.process_custom_resource(
            INFO, {**cr(windowHours=1), "apiVersion": "gpuops.io/v2"}, old=None, field_validation=""
        )
    assert e.value.code == 400
    assert (
        e.value.message
        == "the API version in the data (gpuops.io/v2) does not match the expected API version "
        "(gpuops.io/v1alpha1)"
    )


def test_process_update_runs_transition_rules() -> None:
    old, _ = schema.process_custom_resource(INFO, cr(windowHours=1, pool="a"), old=None, field_validation="")
    schema.process_custom_resource(INFO, cr(windowHours=2, pool="a"), old=old, field_validation="")
    with pytest.raises(StatusError) as e:
        schema.process_custom_resource(INFO, cr(windowHours=2, pool="b"), old=old, field_validation="")
    assert e.value.causes[0].to_dict() == {
        "reason": "FieldValueInvalid",
        "message": 'Invalid value: "b": pool is immutable',
        "field": "spec.pool",
    }


RATCHET_INFO = dataclasses.replace(INFO, schema=root(
    {
        "windowHours": {"type": "integer", "minimum": 1},
        "action": {"type": "string", "enum": ["Evict", "Pause", "AlertOnly"]},
        "selector": {
            "type": "object",
            "properties": {"matchLabels": {"type": "object", "additionalProperties": STR}},
            "x-kubernetes-validations": [{"rule": "has(self.matchLabels) && size(self.matchLabels) > 0",
                                          "message": "must not be empty"}],
        },
        "pools": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": obj({"name": STR, "size": {"type": "integer", "minimum": 1}}),
        },
        "counter": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > oldSelf", "message": "grows"}]},
    },
    required=["windowHours"],
))


def _ratchet_causes(new: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    try:
        schema.process_custom_resource(RATCHET_INFO, new, old=old, field_validation="")
    except StatusError as e:
        return [c.field for c in e.causes]
    return []


def test_updates_ratchet_errors_on_values_left_as_they_were() -> None:
    """CRD validation ratcheting (on by default since Kubernetes 1.30): an object stored while invalid (before
    a rule tightened, or written past validation) can still be updated in its other parts, its status above all;
    a value changed is checked again, and transition rules are never ratcheted."""
    stored = cr(windowHours=0, action="Kill", selector={}, pools=[{"name": "a", "size": 0}, {"name": "b", "size": 1}])
    stored["status"] = {"seen": 1}
    assert _ratchet_causes(copy.deepcopy(stored), old=None) == [
        "spec.windowHours", "spec.action", "spec.pools[0].size", "<nil>"]  # CEL blocked by the enum error
    status = copy.deepcopy(stored)
    status["status"] = {"seen": 2}
    assert _ratchet_causes(status, stored) == []
    reordered = copy.deepcopy(status)
    reordered["spec"]["pools"].reverse()  # map-list items correlate by key, not by position
    assert _ratchet_causes(reordered, stored) == []
    changed = copy.deepcopy(status)
    changed["spec"]["windowHours"] = -1
    changed["spec"]["pools"][1]["size"] = 0  # item b changed; item a, still invalid, did not
    assert _ratchet_causes(changed, stored) == ["spec.windowHours", "spec.pools[1].size"]
    emptied = copy.deepcopy(status)
    emptied["spec"]["action"] = "Pause"  # the enum error fixed: the CEL rules now run (and ratchet)
    emptied["spec"]["selector"] = {"matchLabels": {}}
    assert _ratchet_causes(emptied, stored) == ["spec.selector"]
    counted = copy.deepcopy(stored)
    counted["spec"]["counter"] = 1
    again = copy.deepcopy(counted)
    again["status"] = {"seen": 2}
    assert _ratchet_causes(again, counted) == ["spec.counter"]  # a transition rule sees the unchanged value


# -- properties --------------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                ["spec", "status", "metadata", "action", "quota", "a", "b", "items", "name", "x"]
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=25,
)

PROP_SCHEMA = root(
    {
        "action": {"type": "string", "enum": ["Evict", "Pause"], "default": "Pause"},
        "quota": obj(
            {
                "a": {"x-kubernetes-int-or-string": True, "pattern": "^[0-9]+h$"},
                "b": {"type": "number", "minimum": 0, "multipleOf": 0.5},
                "x": {"type": "integer", "format": "int32", "default": 3},
            },
            default={},
            **{
                "x-kubernetes-validations": [
                    {"rule": "!has(self.b) || self.b < 100"},
                    {"rule": "self.x == oldSelf.x"},
                ]
            },
        ),
        "items": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": obj({"name": STR, "x": {"type": "boolean", "default": False}}, required=["name"]),
        },
        "name": {"type": "string", "maxLength": 3, "x-kubernetes-validations": [{"rule": "self.size() > 0"}]},
        "b": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": INT, "x-kubernetes-list-type": "set"},
        },
    },
    **{"x-kubernetes-validations": [{"rule": "has(self.action)"}]},
)


def _no_new_keys(pruned: Any, original: Any) -> bool:
    if isinstance(pruned, dict):
        return isinstance(original, dict) and all(
            k in original and _no_new_keys(v, original[k]) for k, v in pruned.items()
        )
    if isinstance(pruned, list):
        return (
            isinstance(original, list)
            and len(pruned) == len(original)
            and all(map(_no_new_keys, pruned, original))
        )
    return bool(pruned == original or pruned != pruned)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_prune_is_idempotent_and_never_adds_keys(value: Any) -> None:
    pruned = schema.prune(PROP_SCHEMA, value)
    assert _no_new_keys(pruned, value)
    assert schema.prune(PROP_SCHEMA, pruned) == pruned
    assert schema.unknown_fields(PROP_SCHEMA, pruned) == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_defaults_are_idempotent(value: Any) -> None:
    once = schema.apply_defaults(PROP_SCHEMA, schema.prune(PROP_SCHEMA, value))
    assert schema.apply_defaults(PROP_SCHEMA, once) == once


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, json_values)
def test_validate_never_raises(value: Any, old: Any) -> None:
    for c in schema.validate(PROP_SCHEMA, value, old=old):
        assert isinstance(c, Cause) and c.reason and c.message
    cleaned = schema.apply_defaults(PROP_SCHEMA, schema.prune(PROP_SCHEMA, value))
    schema.validate(PROP_SCHEMA, cleaned, old=old)


# -- validation caches: the same answers as without them ----------------------------------------------------

ENTRY = obj({"uid": STR, "n": {"type": "integer", "minimum": 0}, "when": {"type": "string", "format": "date-time"}},
            required=["uid"])
LEDGER = obj({"entries": {"type": "array", "items": ENTRY}})


def test_clean_item_cache_never_hides_an_error() -> None:
    """A list item found valid is remembered by its encoding under its items schema: the same value is
    valid again at any index, a different value is still checked, and an invalid one is reported each time."""
    good = {"uid": "a", "n": 1, "when": "2026-11-22T12:00:00Z"}
    bad = {"uid": "b", "n": -1, "when": "yesterday"}
    assert causes(LEDGER, {"entries": [good]}) == []
    assert causes(LEDGER, {"entries": [good, good, {**good, "n": 2}]}) == []
    first = causes(LEDGER, {"entries": [good, bad]})
    again = causes(LEDGER, {"entries": [bad, good, bad]})
    assert [f for _, f, _ in first] == ["entries[1].n", "entries[1].when"]
    assert [f for _, f, _ in again] == ["entries[0].n", "entries[0].when", "entries[2].n", "entries[2].when"]
    # the same value under a stricter schema is checked against that schema, not answered from the cache
    strict = obj({"entries": {"type": "array", "items": obj(ENTRY["properties"], required=["uid", "other"])}})
    assert [f for _, f, _ in causes(strict, {"entries": [good]})] == ["entries[0].other"]
    # a value beyond 64 bits cannot be encoded for the cache: it is checked as it is, every time
    huge = {"entries": [{"uid": "c", "n": 2**70}]}
    assert causes(LEDGER, huge) == causes(LEDGER, huge) != []


def test_post_schema_walks_skip_subtrees_without_their_keywords() -> None:
    """List-type, embedded-resource and CEL walks only enter subtrees that use them; answers are unchanged."""
    s = obj({"plain": {"type": "array", "items": ENTRY},
             "tags": {"type": "array", "items": STR, "x-kubernetes-list-type": "set"}})
    assert schema.has_rules(s) is False
    assert schema.has_rules(obj({"x": obj({}, **{"x-kubernetes-validations": [{"rule": "true"}]})})) is True
    assert [(r, f) for r, f, _ in causes(s, {"plain": [{"uid": "a"}], "tags": ["x", "x"]})] == \
        [("FieldValueDuplicate", "tags[1]")]


# -- decode walks: list items that every walk leaves as they are are walked once per encoding --------------

SETTLE_ITEM = obj({"uid": STR, "gpus": {"type": "string", "default": "0"},
                   "tags": {"type": "array", "items": obj({"k": STR, "v": {"type": "string", "default": "-"}})}})
SETTLE_INFO = ResourceInfo(
    group="example.io", version="v1", resource="ledgers", kind="Ledger", singular="ledger", namespaced=True,
    schema=obj({"spec": obj({"entries": {"type": "array", "items": SETTLE_ITEM}}),
                "status": obj({"entries": {"type": "array", "items": SETTLE_ITEM},
                               "other": {"type": "array", "items": obj({"uid": STR})}})}),
    crd_name="ledgers.example.io",
)  # fmt: skip
settle_items = st.one_of(
    st.just({"uid": "a", "gpus": "1"}),  # settled: nothing to prune, null or default
    st.just({"uid": "a", "gpus": "1", "tags": [{"k": "x", "v": "y"}]}),
    st.just({"uid": "b"}),  # a default to apply
    st.just({"uid": "c", "gpus": None}),  # a null of a non-nullable field with a default: defaulted
    st.just({"uid": "d", "gpus": "2", "bogus": 1}),  # an unknown field: pruned and warned about
    st.just({"uid": "e", "gpus": "1", "tags": [{"k": "x"}, {"k": "x", "v": "y"}]}),  # nested default
    st.just({"uid": 5, "gpus": "1"}),  # a type error: 422 every time
)


def _reference(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The decode walks run outside a write (no memo), as they ran before the memo."""
    s = SETTLE_INFO.schema
    assert s is not None and schema._call_settled is None
    cleaned = schema.apply_defaults(s, schema.prune_nulls(s, schema.prune(s, body)))
    return cleaned, [f"unknown field {schema.go_quote(p)}" for p in schema.unknown_fields(s, body)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(settle_items, max_size=6), min_size=1, max_size=4))
def test_settled_items_memo_gives_the_same_writes(writes: list[list[dict[str, Any]]]) -> None:
    """Writes of lists sharing items (a ledger rewritten to add one entry) store, warn and fail exactly as the
    walks do without the memo: a remembered item is one that every walk leaves as it is, and only that."""
    for entries in writes:
        body = {"apiVersion": "example.io/v1", "kind": "Ledger", "metadata": {"name": "l", "namespace": "ns"},
                "spec": {"entries": copy.deepcopy(entries)},
                "status": {"entries": copy.deepcopy(entries), "other": copy.deepcopy(entries)}}
        before = copy.deepcopy(body)
        want, want_warnings = _reference(copy.deepcopy(body))
        try:
            got, warnings = schema.process_custom_resource(SETTLE_INFO, body, old=None, field_validation="")
        except StatusError as e:
            assert e.code == 422 and any(isinstance(x.get("uid"), int) for x in entries)
            continue
        assert {k: got[k] for k in ("spec", "status")} == {k: want[k] for k in ("spec", "status")}
        assert warnings == [w for w in want_warnings if not w.startswith('unknown field "metadata')]
        assert body == before
    assert schema._call_settled is None

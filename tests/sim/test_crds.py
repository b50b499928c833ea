"""CRD validation, served resources and status, and the full CR write path on a GPUWorkloadBudget-like CRD."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpuops_sim.apiserver import crds, schema
from gpuops_sim.apiserver.errors import StatusError

STR = {"type": "string"}


def gwb_crd() -> dict[str, Any]:
    """A GPUWorkloadBudget CRD like ours: selector with a non-empty rule, int-or-string quota, defaults."""
    selector = {
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "x-kubernetes-validations": [
            {
                "rule": "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
                "(has(self.matchExpressions) && size(self.matchExpressions) > 0)",
                "message": "selector must not be empty",
            }
        ],
        "properties": {
            "matchLabels": {"type": "object", "additionalProperties": STR},
            "matchExpressions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": STR,
                        "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                        "values": {"type": "array", "items": STR},
                    },
                },
            },
        },
    }
    spec = {
        "type": "object",
        "required": ["selector", "quota"],
        "properties": {
            "selector": selector,
            "quota": {
                "type": "object",
                "required": ["gpuHours"],
                "properties": {
                    "gpuHours": {"x-kubernetes-int-or-string": True, "pattern": "^[0-9]+(\\.[0-9]+)?$"},
                    "windowHours": {"type": "integer", "minimum": 1, "default": 24},
                },
            },
            "enforcement": {
                "type": "object",
                "default": {},
                "properties": {
                    "action": {
                        "type": "string",
                        "enum": ["Evict", "Pause", "AlertOnly"],
                        "default": "AlertOnly",
                    },
                    "gracePeriodSeconds": {"type": "integer", "minimum": 0, "default": 30},
                },
            },
            "gpuResourceName": {
                "type": "string",
                "default": "nvidia.com/gpu",
                "x-kubernetes-validations": [
                    {"rule": "self.startsWith('nvidia.com/') || self.startsWith('gpuops.io/')"}
                ],
            },
        },
    }
    status = {
        "type": "object",
        "properties": {
            "observedGeneration": {"type": "integer", "format": "int64"},
            "usedGPUHours": STR,
            "conditions": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": STR,
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": STR,
                        "message": STR,
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                    },
                },
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gpuworkloadbudgets.gpuops.io"},
        "spec": {
            "group": "gpuops.io",
            "scope": "Namespaced",
            "names": {
                "plural": "gpuworkloadbudgets",
                "singular": "gpuworkloadbudget",
                "kind": "GPUWorkloadBudget",
                "shortNames": ["gwb"],
                "categories": ["gpuops"],
            },
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Window", "type": "integer", "jsonPath": ".spec.quota.windowHours"},
                        {"name": "Action", "type": "string", "jsonPath": ".spec.enforcement.action"},
                        {"name": "Used", "type": "string", "jsonPath": ".status.usedGPUHours", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "selectableFields": [{"jsonPath": ".spec.enforcement.action"}],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": STR,
                                "kind": STR,
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def gwb(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpuops.io/v1alpha1",
        "kind": "GPUWorkloadBudget",
        "metadata": {"name": "team-a", "namespace": "ml"},
        "spec": spec,
    }


SELECTOR = {"matchLabels": {"team": "a"}}


# -- the realistic CRD -------------------------------------------------------------------------------------


def test_gwb_crd_is_valid_and_serves_one_resource() -> None:
    crd = gwb_crd()
    before = copy.deepcopy(crd)
    crds.validate_crd(crd)
    [info] = crds.crd_resource_infos(crd)
    assert crd == before
    assert (info.group, info.version, info.resource, info.kind, info.singular) == (
        "gpuops.io",
        "v1alpha1",
        "gpuworkloadbudgets",
        "GPUWorkloadBudget",
        "gpuworkloadbudget",
    )
    assert info.namespaced and info.has_generation and info.status_subresource and info.is_custom
    assert info.short_names == ("gwb",) and info.categories == ("gpuops",)
    assert info.subresources == {"status": ("GPUWorkloadBudget", ("get", "patch", "update"))}
    assert [c["name"] for c in info.printer_columns] == ["Window", "Action", "Used", "Age"]
    assert info.selectable_fields == ("spec.enforcement.action",)
    assert info.crd_name == "gpuworkloadbudgets.gpuops.io"
    assert info.schema == crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_established_status() -> None:
    status = crds.crd_established_status(gwb_crd(), "2026-01-02T03:04:05Z")
    assert status["acceptedNames"] == {
        "plural": "gpuworkloadbudgets",
        "singular": "gpuworkloadbudget",
        "kind": "GPUWorkloadBudget",
        "listKind": "GPUWorkloadBudgetList",
        "shortNames": ["gwb"],
        "categories": ["gpuops"],
    }
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("NamesAccepted", "True", "NoConflicts"),
        ("Established", "True", "InitialNamesAccepted"),
    ]
    assert all(c["lastTransitionTime"] == "2026-01-02T03:04:05Z" for c in status["conditions"])
    assert status["storedVersions"] == ["v1alpha1"]


def test_default_crd_fills_v1_defaults() -> None:
    crd = gwb_crd()
    del crd["spec"]["names"]["singular"]
    out = crds.default_crd(crd)
    assert out["spec"]["names"]["singular"] == "gpuworkloadbudget"
    assert out["spec"]["names"]["listKind"] == "GPUWorkloadBudgetList"
    assert out["spec"]["conversion"] == {"strategy": "None"}
    assert "singular" not in crd["spec"]["names"]


def write(
    body: dict[str, Any], old: dict[str, Any] | None = None, fv: str = ""
) -> tuple[dict[str, Any], list[str]]:
    [info] = crds.crd_resource_infos(gwb_crd())
    return schema.process_custom_resource(info, body, old=old, field_validation=fv)


def test_gwb_write_applies_defaults() -> None:
    out, warnings = write(gwb(selector=SELECTOR, quota={"gpuHours": "100"}))
    assert warnings == []
    assert out["spec"] == {
        "selector": SELECTOR,
        "quota": {"gpuHours": "100", "windowHours": 24},
        "enforcement": {"action": "AlertOnly", "gracePeriodSeconds": 30},
        "gpuResourceName": "nvidia.com/gpu",
    }
    out, _ = write(
        gwb(selector=SELECTOR, quota={"gpuHours": 100, "windowHours": 6}, enforcement={"action": "Evict"})
    )
    assert out["spec"]["enforcement"] == {"action": "Evict", "gracePeriodSeconds": 30}
    assert out["spec"]["quota"] == {"gpuHours": 100, "windowHours": 6}


def invalid_causes(body: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    with pytest.raises(StatusError) as e:
        write(body, old)
    assert (e.value.code, e.value.reason, e.value.kind, e.value.group) == (
        422,
        "Invalid",
        "GPUWorkloadBudget",
        "gpuops.io",
    )
    return [(c.reason, c.field, c.message) for c in e.value.causes]


def test_gwb_field_errors() -> None:
    assert invalid_causes(gwb(selector=SELECTOR, quota={"gpuHours": "lots", "windowHours": 0})) == [
        (
            "FieldValueInvalid",
            "spec.quota.gpuHours",
            "Invalid value: \"lots\": spec.quota.gpuHours in body should match '^[0-9]+(\\.[0-9]+)?$'",
        ),
        (
            "FieldValueInvalid",
            "spec.quota.windowHours",
            "Invalid value: 0: spec.quota.windowHours in body should be greater than or equal to 1",
        ),
    ]
    blocked = invalid_causes(gwb(selector=SELECTOR, quota={"gpuHours": 1}, enforcement={"action": "Kill"}))
    assert blocked[0] == (
        "FieldValueNotSupported",
        "spec.enforcement.action",
        'Unsupported value: "Kill": supported values: "Evict", "Pause", "AlertOnly"',
    )
    assert blocked[1][1] == "<nil>" and "some validation rules were not checked" in blocked[1][2]


def test_gwb_cel_rules() -> None:
    assert invalid_causes(gwb(selector={"matchLabels": {}}, quota={"gpuHours": 1})) == [
        ("FieldValueInvalid", "spec.selector", "Invalid value: selector must not be empty")
    ]
    assert invalid_causes(gwb(selector=SELECTOR, quota={"gpuHours": 1}, gpuResourceName="amd.com/gpu")) == [
        (
            "FieldValueInvalid",
            "spec.gpuResourceName",
            "Invalid value: \"amd.com/gpu\": failed rule: self.startsWith('nvidia.com/') || "
            "self.startsWith('gpuops.io/')",
        )
    ]
    write(gwb(selector={"matchExpressions": [{"key": "team", "operator": "Exists"}]}, quota={"gpuHours": 1}))


def test_gwb_required_fields() -> None:
    assert invalid_causes(gwb(quota={})) == [
        ("FieldValueRequired", "spec.quota.gpuHours", "Required value"),
        ("FieldValueRequired", "spec.selector", "Required value"),
        (
            "FieldValueInvalid",
            "<nil>",
            "Invalid value: null: some validation rules were not checked because the object was invalid; "
            "correct "
            "the existing errors to complete validation",
        ),
    ]


def test_gwb_unknown_fields_and_status() -> None:
    body = gwb(selector=SELECTOR, quota={"gpuHours": 1, "hours": 3}, paused=True)
    body["status"] = {"usedGPUHours": "3", "conditions": [{"type": "Ready", "status": "True", "bogus": 1}]}
    out, warnings = write(body)
    assert warnings == [
        'unknown field "spec.paused"',
        'unknown field "spec.quota.hours"',
        'unknown field "status.conditions[0].bogus"',
    ]
    assert out["status"] == {"usedGPUHours": "3", "conditions": [{"type": "Ready", "status": "True"}]}
    with pytest.raises(StatusError) as e:
        write(body, fv="Strict")
    assert e.value.code == 400 and e.value.message.startswith(
        'strict decoding error: unknown field "spec.paused"'
    )
    dup = gwb(selector=SELECTOR, quota={"gpuHours": 1})
    dup["status"] = {
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}]
    }
    assert invalid_causes(dup) == [
        ("FieldValueDuplicate", "status.conditions[1]", 'Duplicate value: {"type":"Ready"}')
    ]


# -- versions and subresources -----------------------------------------------------------------------------


def test_only_served_versions_and_scale() -> None:
    crd = gwb_crd()
    v1 = copy.deepcopy(crd["spec"]["versions"][0])
    v1.update(name="v1", storage=False, served=False)
    v2 = copy.deepcopy(crd["spec"]["versions"][0])
    v2.update(name="v1beta1", storage=False)
    v2["subresources"] = {
        "status": {},
        "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"},
    }
    crd["spec"]["versions"] += [v1, v2]
    crds.validate_crd(crd)
    infos = crds.crd_resource_infos(crd)
    assert [i.version for i in infos] == ["v1alpha1", "v1beta1"]
    assert infos[1].subresources["scale"] == ("Scale", ("get", "patch", "update"))
    assert crds.crd_established_status(crd, "t")["storedVersions"] == ["v1alpha1"]


# -- invalid CRDs ------------------------------------------------------------------------------------------

Mutator = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutator:
    def f(crd: dict[str, Any]) -> None:
        node: Any = crd
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is KeyError:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value

    return f


SCHEMA = "spec.versions.0.schema.openAPIV3Schema"
SPEC_PROPS = SCHEMA + ".properties.spec.properties"
FIELD = "spec.versions[0].schema.openAPIV3Schema"


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (
            _set("metadata.name", "budgets.gpuops.io"),
            "metadata.name",
            'Invalid value: "budgets.gpuops.io": must be spec.names.plural+"."+spec.group',
        ),
        (
            _set("spec.group", "gpuops"),
            "spec.group",
            'Invalid value: "gpuops": should be a domain with at least one dot',
        ),
        (
            _set("spec.scope", "Global"),
            "spec.scope",
            'Unsupported value: "Global": supported values: "Cluster", "Namespaced"',
        ),
        (_set("spec.scope", KeyError), "spec.scope", "Required value"),
        (_set("spec.names.plural", KeyError), "spec.names.plural", "Required value"),
        (_set("spec.names.kind", KeyError), "spec.names.kind", "Required value"),
        (
            _set("spec.names.plural", "GPUBudgets"),
            "spec.names.plural",
            'Invalid value: "GPUBudgets": a DNS-1035 label must consist of lower case alphanumeric',
        ),
        (
            _set("spec.names.kind", "GPU_Budget"),
            "spec.names.kind",
            'Invalid value: "GPU_Budget": may have mixed case, but should otherwise match: a DNS-1035 label',
        ),
        (
            _set("spec.versions.0.storage", False),
            "spec.versions",
            "must have exactly one version marked as storage version",
        ),
        (
            _set("spec.versions", []),
            "spec.versions",
            "must have exactly one version marked as storage version",
        ),
        (_set("spec.versions.0.schema", {}), FIELD, "Required value"),
        (
            _set(SPEC_PROPS + ".quota.properties.windowHours.type", KeyError),
            FIELD + ".properties[spec].properties[quota].properties[windowHours].type",
            "Required value: must not be empty for specified object fields",
        ),
        (
            _set(SPEC_PROPS + ".selector.properties.matchExpressions.items", KeyError),
            FIELD + ".properties[spec].properties[selector].properties[matchExpressions].items",
            "Required value: must be specified",
        ),
        (
            _set(SCHEMA + ".type", KeyError),
            FIELD + ".type",
            "Required value: must not be empty at the root",
        ),
        (
            _set(
                SCHEMA + ".properties.metadata",
                {"type": "object", "properties": {"labels": {"type": "object"}}},
            ),
            FIELD + ".properties[metadata]",
            "Forbidden: must not specify anything other than name and generateName, but metadata is "
            "implicitly "
            "specified",
        ),
        (
            _set(SPEC_PROPS + ".selector.x-kubernetes-validations", [{"rule": "self.matchLabels >"}]),
            FIELD + ".properties[spec].properties[selector].x-kubernetes-validations[0].rule",
            'Invalid value: {"rule":"self.matchLabels \\u003e"}: compilation failed: '
            "ERROR: <input>:1:18: Syntax error",
        ),
        (
            _set(SPEC_PROPS + ".quota.properties.windowHours.default", 0),
            FIELD + ".properties[spec].properties[quota].properties[windowHours].default",
            "Invalid value: 0:  in body should be greater than or equal to 1",
        ),
        (
            _set(SPEC_PROPS + ".enforcement.default", {"bogus": 1}),
            FIELD + ".properties[spec].properties[enforcement].default",
            'Invalid value: {"bogus":1}: must not have unknown fields',
        ),
        (
            _set(SPEC_PROPS + ".selector.additionalProperties", STR),
            FIELD + ".properties[spec].properties[selector].additionalProperties",
            "Forbidden: additionalProperties and properties are mutual exclusive",
        ),
        (
            _set(SCHEMA + ".x-kubernetes-int-or-string", True),
            FIELD,
            "fields are allowed at the root of the schema if the status subresource is enabled",
        ),
        (
            _set("spec.versions.0.additionalPrinterColumns.0.type", "float"),
            "spec.versions[0].additionalPrinterColumns[0].type",
            'Invalid value: "float": must be one of boolean,date,integer,number,string',
        ),
        (
            _set("spec.versions.0.selectableFields", [{"jsonPath": ".spec.selector"}]),
            "spec.versions[0].selectableFields[0].jsonPath",
            "must point to a field of type string, boolean or integer",
        ),
        (
            _set(SPEC_PROPS + ".quota.properties.gpuHours.anyOf", [{"type": "integer"}, {"minimum": 1}]),
            FIELD + ".properties[spec].properties[quota].properties[gpuHours].anyOf[0].type",
            "Forbidden: must be empty to be structural",
        ),
        (
            _set(SPEC_PROPS + ".quota.properties.gpuHours.anyOf", [{"properties": {"x": {"minimum": 1}}}]),
            FIELD + ".properties[spec].properties[quota].properties[gpuHours].properties[x]",
            "Required value: because it is defined in " + FIELD + ".properties[spec].properties[quota]."
            "properties[gpuHours].anyOf[0].properties[x]",
        ),
        (
            _set(SPEC_PROPS + ".quota.properties.windowHours.type", "int"),
            FIELD + ".properties[spec].properties[quota].properties[windowHours].type",
            'Unsupported value: "int": supported values: "array", "boolean", "integer", "number", "object", '
            '"string"',
        ),
    ],
)
def test_invalid_crds(mutate: Mutator, field: str, message: str) -> None:
    crd = gwb_crd()
    mutate(crd)
    with pytest.raises(StatusError) as e:
        crds.validate_crd(crd)
    err = e.value
    assert (err.code, err.reason, err.kind, err.group) == (
        422,
        "Invalid",
        "CustomResourceDefinition",
        "apiextensions.k8s.io",
    )
    found = [c for c in err.causes if c.field == field and message in c.message]
    assert found, [(c.field, c.message) for c in err.causes]


def test_invalid_crd_message_shape() -> None:
    crd = gwb_crd()
    crd["spec"]["group"] = "gpuops"
    crd["metadata"]["name"] = "gpuworkloadbudgets.gpuops"
    with pytest.raises(StatusError) as e:
        crds.validate_crd(crd)
    assert e.value.message == (
        'CustomResourceDefinition.apiextensions.k8s.io "gpuworkloadbudgets.gpuops" is invalid: '
        'spec.group: Invalid value: "gpuops": should be a domain with at least one dot'
    )


def test_duplicate_versions() -> None:
    crd = gwb_crd()
    extra = copy.deepcopy(crd["spec"]["versions"][0])
    extra["storage"] = False
    crd["spec"]["versions"].append(extra)
    with pytest.raises(StatusError) as e:
        crds.validate_crd(crd)
    assert any(c.message.endswith("must contain unique version names") for c in e.value.causes)


def test_int_or_string_any_of_pattern_is_structural() -> None:
    crd = gwb_crd()
    gpu_hours = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "quota"
    ]
    gpu_hours["properties"]["gpuHours"]["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    crds.validate_crd(crd)

"""CustomResourceDefinitions: static validation, the resources they serve, and their initial status.

Validation follows apiextensions' ValidateCustomResourceDefinition for what a v1 CRD can get wrong in
practice: names, group, scope, versions, structural schemas (with defaults and CEL rules checked the way
the apiserver checks them), printer columns, selectable fields and subresources. Messages and field paths
are upstream's, e.g. `spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: ...`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from . import cel
from . import schema as sch
from .errors import Cause, invalid
from .resources import ResourceInfo

__all__ = ["crd_established_status", "crd_resource_infos", "default_crd", "validate_crd"]

_KIND = "CustomResourceDefinition"
_GROUP = "apiextensions.k8s.io"
_STD_SUB = ("get", "patch", "update")

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_OPENAPI_TYPES = ("array", "boolean", "integer", "number", "object", "string")
_COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")
_COLUMN_FORMATS = ("byte", "date", "date-time", "double", "float", "int32", "int64", "password")
_REASONS = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")
_ROOT_ALLOWED_WITH_STATUS = {
    "description": "Description", "type": "Type", "format": "Format", "title": "Title", "maximum": "Maximum",
    "exclusiveMaximum": "ExclusiveMaximum", "minimum": "Minimum", "exclusiveMinimum": "ExclusiveMinimum",
    "maxLength": "MaxLength", "minLength": "MinLength", "pattern": "Pattern", "maxItems": "MaxItems",
    "minItems": "MinItems", "uniqueItems": "UniqueItems", "multipleOf": "MultipleOf", "required": "Required",
    "items": "Items", "properties": "Properties", "externalDocs": "ExternalDocs", "example": "Example",
    "x-kubernetes-preserve-unknown-fields": "XPreserveUnknownFields",
    "x-kubernetes-validations": "XValidations",
}  # fmt: skip
_JUNCTOR_FORBIDDEN = (
    ("type", "must be empty to be structural"),
    ("additionalProperties", "must be undefined to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-list-map-keys", "must be empty to be structural"),
    ("x-kubernetes-list-type", "must be undefined to be structural"),
    ("x-kubernetes-map-type", "must be undefined to be structural"),
    ("x-kubernetes-validations", "must be empty to be structural"),
)
_INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]


def _dns1035(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _DNS1035.match(value):
        errs.append(_DNS1035_MSG)
    return errs


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def default_crd(crd: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with the v1 defaults the apiserver fills in: names.singular/listKind, conversion strategy."""
    out = copy.deepcopy(dict(crd))
    spec = out.get("spec")
    if isinstance(spec, dict):
        names = spec.get("names")
        if isinstance(names, dict):
            kind = _str(names.get("kind"))
            if not names.get("singular") and kind:
                names["singular"] = kind.lower()
            if not names.get("listKind") and kind:
                names["listKind"] = kind + "List"
        if spec.get("conversion") is None:
            spec["conversion"] = {"strategy": "None"}
    return out


# ------------------------------------------------------------------------------------------------------
# Schema checks: OpenAPI subset, structural invariants, defaults, CEL rules.


class _SchemaCheck:
    def __init__(self, status_enabled: bool) -> None:
        self.status_enabled = status_enabled
        self.schema_errs: list[Cause] = []
        self.structural: list[Cause] = []
        self.cel_errs: list[Cause] = []
        self.default_errs: list[Cause] = []

    def run(self, s: Any, path: str) -> list[Cause]:
        if not isinstance(s, Mapping):
            return [sch.field_invalid(path, s, "must be an object")]
        root_errs: list[Cause] = []
        if self.status_enabled:
            if s.get("type") not in (None, "", "object"):
                root_errs.append(
                    sch.field_invalid(
                        f"{path}.type",
                        s.get("type"),
                        'only "object" is allowed as the type at the root of the schema if the status '
                        "subresource is enabled",
                    )
                )
            elif any(k not in _ROOT_ALLOWED_WITH_STATUS for k in s if not _is_zero(s[k])):
                allowed = "[" + " ".join(_ROOT_ALLOWED_WITH_STATUS.values()) + "]"
                detail = (
                    f"only {allowed} fields are allowed at the root of the schema if the status subresource "
                    "is enabled"
                )
                root_errs.append(sch.field_invalid(path, dict(s), detail))
        if s.get("nullable") is True:
            root_errs.append(sch.field_forbidden(f"{path}.nullable", "nullable cannot be true at the root"))
        self._node(s, path, "root", inside_meta=False)
        if not self.structural:
            self._defaults(s, path, s, in_meta=False)
        self.structural.sort(key=lambda c: f"{c.field}: {c.message}")
        return root_errs + self.structural + self.default_errs + self.schema_errs + self.cel_errs

    # -- OpenAPI and structural checks of one node (level: root, field or item) --

    def _node(self, s: Mapping[str, Any], path: str, level: str, inside_meta: bool) -> None:
        self._openapi_subset(s, path, inside_meta)
        self._structural(s, path, level)
        self._list_type(s, path)
        self._rules(s, path)
        for k, p in _map(s.get("properties")).items():
            if isinstance(p, Mapping):
                child_meta = inside_meta or (level == "root" and k == "metadata")
                self._node(p, f"{path}.properties[{k}]", "field", child_meta)
        addl = s.get("additionalProperties")
        if isinstance(addl, Mapping):
            self._node(addl, f"{path}.additionalProperties", "field", inside_meta)
        items = s.get("items")
        if isinstance(items, Mapping):
            self._node(items, f"{path}.items", "item", inside_meta)

    def _openapi_subset(self, s: Mapping[str, Any], path: str, inside_meta: bool) -> None:
        """The OpenAPI v3 keywords a CRD schema may not use, or not in this combination."""
        errs = self.schema_errs
        t = s.get("type")
        if isinstance(t, str) and t and t not in _OPENAPI_TYPES:
            if t == "null":
                errs.append(
                    sch.field_forbidden(
                        f"{path}.type", "type cannot be set to null, use nullable as an alternative"
                    )
                )
            else:
                errs.append(sch.field_not_supported(f"{path}.type", t, list(_OPENAPI_TYPES)))
        for key, detail in (
            ("id", "id is not supported"),
            ("additionalItems", "additionalItems is not supported"),
            ("patternProperties", "patternProperties is not supported"),
            ("definitions", "definitions is not supported"),
            ("dependencies", "dependencies is not supported"),
            ("$ref", "$ref is not supported"),
        ):
            if s.get(key):
                errs.append(sch.field_forbidden(f"{path}.{key}", detail))
        if isinstance(s.get("items"), list):
            errs.append(
                sch.field_forbidden(f"{path}.items", "items must be a schema object and not an array")
            )
        if s.get("uniqueItems") is True:
            errs.append(
                sch.field_forbidden(
                    f"{path}.uniqueItems",
                    "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
                )
            )
        self._openapi_combinations(s, path, inside_meta)

    def _openapi_combinations(self, s: Mapping[str, Any], path: str, inside_meta: bool) -> None:
        errs = self.schema_errs
        addl = s.get("additionalProperties")
        if addl is not None and _map(s.get("properties")) and (addl is False or isinstance(addl, Mapping)):
            errs.append(
                sch.field_forbidden(
                    f"{path}.additionalProperties", "additionalProperties and properties are mutual exclusive"
                )
            )
        if inside_meta and s.get("x-kubernetes-embedded-resource") is True:
            errs.append(
                sch.field_forbidden(
                    f"{path}.x-kubernetes-embedded-resource", "must not be used inside of resource meta"
                )
            )
        pattern = s.get("pattern")
        if isinstance(pattern, str) and pattern and (why := sch.pattern_error(pattern)) is not None:
            detail = f"must be a valid regular expression, but isn't: {why}"
            errs.append(sch.field_invalid(f"{path}.pattern", pattern, detail))

    def _structural(self, s: Mapping[str, Any], path: str, level: str) -> None:
        self._extension_conflicts(s, path, level)
        self._structural_type(s, path, level)
        self._structural_properties(s, path, level)
        skip_any_of = s.get("anyOf") == _INT_OR_STRING_ANY_OF
        all_of = _list(s.get("allOf"))
        skip_first = (
            bool(all_of)
            and isinstance(all_of[0], Mapping)
            and all_of[0].get("anyOf") == _INT_OR_STRING_ANY_OF
        )
        self._junctors(s, path, skip_any_of, skip_first)
        self._completeness(s, s, path, path)

    def _extension_conflicts(self, s: Mapping[str, Any], path: str, level: str) -> None:
        """Arrays need items, the root no additionalProperties, and the x-kubernetes extensions exclude each other."""
        errs = self.structural
        int_or_string = s.get("x-kubernetes-int-or-string") is True
        preserve = s.get("x-kubernetes-preserve-unknown-fields")
        embedded = s.get("x-kubernetes-embedded-resource") is True
        if _str(s.get("type")) == "array" and not isinstance(s.get("items"), Mapping):
            errs.append(sch.field_required(f"{path}.items", "must be specified"))
        if s.get("additionalProperties") is not None and level == "root":
            errs.append(sch.field_forbidden(f"{path}.additionalProperties", "must not be used at the root"))
        if preserve is False:
            errs.append(
                sch.field_invalid(
                    f"{path}.x-kubernetes-preserve-unknown-fields", False, "must be true or undefined"
                )
            )
        if int_or_string and preserve is True:
            errs.append(
                sch.field_invalid(
                    f"{path}.x-kubernetes-preserve-unknown-fields",
                    True,
                    "must be false if x-kubernetes-int-or-string is true",
                )
            )
        if int_or_string and embedded:
            errs.append(
                sch.field_invalid(
                    f"{path}.x-kubernetes-embedded-resource",
                    True,
                    "must be false if x-kubernetes-int-or-string is true",
                )
            )

    def _structural_type(self, s: Mapping[str, Any], path: str, level: str) -> None:
        """A structural schema states every node's type: object for an embedded resource and at the root."""
        errs = self.structural
        t = _str(s.get("type"))
        int_or_string = s.get("x-kubernetes-int-or-string") is True
        preserve = s.get("x-kubernetes-preserve-unknown-fields")
        embedded = s.get("x-kubernetes-embedded-resource") is True
        if embedded and t != "object":
            if not t:
                errs.append(
                    sch.field_required(
                        f"{path}.type", "must be object if x-kubernetes-embedded-resource is true"
                    )
                )
            else:
                errs.append(
                    sch.field_invalid(
                        f"{path}.type", t, "must be object if x-kubernetes-embedded-resource is true"
                    )
                )
        elif not t and not int_or_string and preserve is not True:
            where = {
                "root": "at the root",
                "item": "for specified array items",
                "field": "for specified object fields",
            }
            errs.append(sch.field_required(f"{path}.type", f"must not be empty {where[level]}"))
        if embedded and s.get("additionalProperties") is not None:
            errs.append(
                sch.field_forbidden(
                    f"{path}.additionalProperties",
                    "must not be used if x-kubernetes-embedded-resource is set",
                )
            )
        if level == "root" and t and t != "object":
            errs.append(sch.field_invalid(f"{path}.type", t, "must be object at the root"))

    def _structural_properties(self, s: Mapping[str, Any], path: str, level: str) -> None:
        """An object that is a resource (the root, an embedded one) has string kind and apiVersion and only the
        metadata upstream allows; an embedded resource that keeps no unknown fields declares its properties."""
        errs = self.structural
        preserve = s.get("x-kubernetes-preserve-unknown-fields")
        embedded = s.get("x-kubernetes-embedded-resource") is True
        props = _map(s.get("properties"))
        if level == "root" or embedded:
            for k in ("kind", "apiVersion"):
                if k in props and _map(props[k]).get("type") != "string":
                    errs.append(
                        sch.field_invalid(
                            f"{path}.properties[{k}].type", _map(props[k]).get("type"), "must be string"
                        )
                    )
        if "metadata" in props:
            self._metadata(
                _map(props["metadata"]), f"{path}.properties[metadata]", level == "root" or embedded, level
            )
        if embedded and preserve is not True and not props:
            errs.append(
                sch.field_required(
                    f"{path}.properties",
                    "must not be empty if x-kubernetes-embedded-resource is true without "
                    "x-kubernetes-preserve-unknown-fields",
                )
            )

    def _metadata(self, m: Mapping[str, Any], path: str, check: bool, level: str) -> None:
        if check and m.get("type") != "object":
            self.structural.append(sch.field_invalid(f"{path}.type", m.get("type"), "must be object"))
        if level != "root":
            return
        props = _map(m.get("properties"))
        extra = {k for k in m if k not in ("type", "properties", "description")}
        if extra or any(k not in ("name", "generateName") for k in props):
            self.structural.append(
                sch.field_forbidden(
                    path,
                    "must not specify anything other than name and generateName, but metadata is implicitly "
                    "specified",
                )
            )

    def _junctors(self, s: Mapping[str, Any], path: str, skip_any_of: bool, skip_first_all_of: bool) -> None:
        for key in ("anyOf", "allOf", "oneOf"):
            if key == "anyOf" and skip_any_of:
                continue
            for i, sub in enumerate(_list(s.get(key))):
                if isinstance(sub, Mapping):
                    skip = (
                        key == "allOf"
                        and i == 0
                        and skip_first_all_of
                        and sub.get("anyOf") == _INT_OR_STRING_ANY_OF
                    )
                    self._nested(sub, f"{path}.{key}[{i}]", skip)
        if isinstance(s.get("not"), Mapping):
            self._nested(s["not"], f"{path}.not", False)

    def _nested(self, v: Mapping[str, Any], path: str, skip_any_of: bool) -> None:
        self._junctors(v, path, skip_any_of, False)
        if isinstance(v.get("items"), Mapping):
            self._nested(v["items"], f"{path}.items", False)
        for k, p in _map(v.get("properties")).items():
            if isinstance(p, Mapping):
                self._nested(p, f"{path}.properties[{k}]", False)
        for key, detail in _JUNCTOR_FORBIDDEN:
            val = v.get(key)
            if val not in (None, False, "", [], {}):
                self.structural.append(sch.field_forbidden(f"{path}.{key}", detail))
        if "metadata" in _map(v.get("properties")):
            self.structural.append(
                sch.field_forbidden(
                    f"{path}.properties[metadata]", "must not be specified in a nested context"
                )
            )

    def _completeness(
        self, v: Mapping[str, Any], s: Mapping[str, Any] | None, s_path: str, v_path: str
    ) -> None:
        """Every property or items named inside a junctor must exist in the structural part too."""
        for key in ("allOf", "anyOf", "oneOf"):
            for i, sub in enumerate(_list(v.get(key))):
                if isinstance(sub, Mapping):
                    self._nested_complete(sub, s, s_path, f"{v_path}.{key}[{i}]")
        if isinstance(v.get("not"), Mapping):
            self._nested_complete(v["not"], s, s_path, f"{v_path}.not")

    def _nested_complete(
        self, v: Mapping[str, Any], s: Mapping[str, Any] | None, s_path: str, v_path: str
    ) -> None:
        if s is None:
            self.structural.append(sch.field_required(s_path, f"because it is defined in {v_path}"))
            return
        self._completeness(v, s, s_path, v_path)
        if isinstance(v.get("items"), Mapping):
            items = s.get("items")
            self._nested_complete(
                v["items"],
                items if isinstance(items, Mapping) else None,
                f"{s_path}.items",
                f"{v_path}.items",
            )
        s_props = _map(s.get("properties"))
        for k, p in _map(v.get("properties")).items():
            if not isinstance(p, Mapping):
                continue
            if k not in s_props:
                self.structural.append(
                    sch.field_required(
                        f"{s_path}.properties[{k}]", f"because it is defined in {v_path}.properties[{k}]"
                    )
                )
            else:
                self._nested_complete(
                    p, _map(s_props[k]), f"{s_path}.properties[{k}]", f"{v_path}.properties[{k}]"
                )

    def _list_type(self, s: Mapping[str, Any], path: str) -> None:
        lt = s.get("x-kubernetes-list-type")
        keys = s.get("x-kubernetes-list-map-keys")
        if lt is not None:
            self._list_type_value(s, path, lt)
        if keys:
            if lt is None:
                self.schema_errs.append(
                    sch.field_required(
                        f"{path}.x-kubernetes-list-type",
                        "must be map if x-kubernetes-list-map-keys is non-empty",
                    )
                )
            elif lt != "map":
                self.schema_errs.append(
                    sch.field_invalid(
                        f"{path}.x-kubernetes-list-type",
                        lt,
                        "must be map if x-kubernetes-list-map-keys is non-empty",
                    )
                )
        if lt == "map":
            self._list_map(s, path, keys)

    def _list_type_value(self, s: Mapping[str, Any], path: str, lt: Any) -> None:
        """x-kubernetes-list-type belongs on an array and is atomic, set or map."""
        errs = self.schema_errs
        if s.get("type") != "array":
            if not s.get("type"):
                errs.append(
                    sch.field_required(
                        f"{path}.type", "must be array if x-kubernetes-list-type is specified"
                    )
                )
            else:
                errs.append(
                    sch.field_invalid(
                        f"{path}.type",
                        s.get("type"),
                        "must be array if x-kubernetes-list-type is specified",
                    )
                )
        if lt not in ("atomic", "set", "map"):
            errs.append(
                sch.field_not_supported(f"{path}.x-kubernetes-list-type", lt, ["atomic", "set", "map"])
            )

    def _list_map(self, s: Mapping[str, Any], path: str, keys: Any) -> None:
        """A map list's items are objects, keyed by distinct properties of theirs."""
        errs = self.schema_errs
        items = s.get("items")
        if not keys:
            errs.append(
                sch.field_required(
                    f"{path}.x-kubernetes-list-map-keys",
                    "must not be empty if x-kubernetes-list-type is map",
                )
            )
        if not isinstance(items, Mapping):
            errs.append(
                sch.field_required(f"{path}.items", "must have a schema if x-kubernetes-list-type is map")
            )
        elif items.get("type") != "object":
            errs.append(
                sch.field_invalid(
                    f"{path}.items.type",
                    items.get("type"),
                    "must be object if parent array's x-kubernetes-list-type is map",
                )
            )
        else:
            item_props = _map(items.get("properties"))
            key_list = [k for k in _list(keys) if isinstance(k, str)]
            if any(k not in item_props for k in key_list):
                errs.append(
                    sch.field_invalid(
                        f"{path}.x-kubernetes-list-map-keys",
                        keys,
                        "entries must all be names of item properties",
                    )
                )
            if len(set(key_list)) != len(key_list):
                errs.append(
                    sch.field_invalid(
                        f"{path}.x-kubernetes-list-map-keys", keys, "must not contain duplicate entries"
                    )
                )

    def _rules(self, s: Mapping[str, Any], path: str) -> None:
        rules = s.get("x-kubernetes-validations")
        if rules is None:
            return
        for i, rule in enumerate(_list(rules)):
            rpath = f"{path}.x-kubernetes-validations[{i}]"
            if not isinstance(rule, Mapping):
                self.schema_errs.append(sch.field_invalid(rpath, rule, "must be an object"))
                continue
            self._rule_texts(rule, rpath)
            self._rule_field_path(rule, rpath, s)
            self._rule_compiles(rule, rpath)

    def _rule_texts(self, rule: Mapping[str, Any], rpath: str) -> None:
        """A rule is required; its message, messageExpression and reason, if given, must be usable."""
        src = rule.get("rule")
        message = rule.get("message")
        if not isinstance(src, str) or not src:
            self.schema_errs.append(sch.field_required(f"{rpath}.rule", "rule is not specified"))
        if message is not None and isinstance(message, str):
            if not message.strip():
                self.schema_errs.append(
                    sch.field_invalid(f"{rpath}.message", message, "must be non-empty if specified")
                )
            elif "\n" in message:
                self.schema_errs.append(
                    sch.field_invalid(f"{rpath}.message", message, "must not contain line breaks")
                )
        elif isinstance(src, str) and "\n" in src and not message:
            self.schema_errs.append(
                sch.field_required(
                    f"{rpath}.message", "message must be specified if rule contains line breaks"
                )
            )
        msg_expr = rule.get("messageExpression")
        if msg_expr is not None and not (isinstance(msg_expr, str) and msg_expr.strip()):
            self.schema_errs.append(
                sch.field_required(
                    f"{rpath}.messageExpression", "messageExpression must be non-empty if specified"
                )
            )
        reason = rule.get("reason")
        if reason is not None and reason not in _REASONS:
            self.schema_errs.append(sch.field_not_supported(f"{rpath}.reason", reason, list(_REASONS)))

    def _rule_field_path(self, rule: Mapping[str, Any], rpath: str, s: Mapping[str, Any]) -> None:
        """A rule's fieldPath, if given, names a field of the schema the rule sits on."""
        field_path = rule.get("fieldPath")
        if field_path is None:
            return
        if not isinstance(field_path, str) or not field_path:
            self.schema_errs.append(
                sch.field_invalid(f"{rpath}.fieldPath", field_path, "must be non-empty if specified")
            )
        elif "\n" in field_path:
            self.schema_errs.append(
                sch.field_invalid(f"{rpath}.fieldPath", field_path, "must not contain line breaks")
            )
        elif not _valid_field_path(field_path, s):
            self.schema_errs.append(
                sch.field_invalid(f"{rpath}.fieldPath", field_path, "must be a valid path")
            )

    def _rule_compiles(self, rule: Mapping[str, Any], rpath: str) -> None:
        """The rule and its messageExpression must compile (the latter is not tried if the rule fails)."""
        src = rule.get("rule")
        msg_expr = rule.get("messageExpression")
        if isinstance(src, str) and src:
            try:
                compiled = cel.compile_rule(src)
            except ValueError as e:
                self.cel_errs.append(
                    sch.field_invalid(f"{rpath}.rule", dict(rule), f"compilation failed: {e}")
                )
                return
            if rule.get("optionalOldSelf") is True and not compiled.uses_old_self:
                self.cel_errs.append(
                    sch.field_invalid(
                        f"{rpath}.optionalOldSelf", True, "may not be set if oldSelf is not used in rule"
                    )
                )
        if isinstance(msg_expr, str) and msg_expr.strip():
            try:
                cel.compile_rule(msg_expr)
            except ValueError as e:
                self.cel_errs.append(
                    sch.field_invalid(
                        f"{rpath}.messageExpression",
                        dict(rule),
                        f"messageExpression compilation failed: {e}",
                    )
                )

    # -- defaults must be pruned and valid against their own schema --

    def _defaults(self, s: Mapping[str, Any], path: str, root: Mapping[str, Any], in_meta: bool) -> None:
        if "default" in s and s.get("default") is not None and not in_meta:
            default = s["default"]
            if sch.prune(s, default, resource_root=False) != default:
                self.default_errs.append(
                    sch.field_invalid(f"{path}.default", default, "must not have unknown fields")
                )
            else:
                # upstream runs transition rules on a default with oldSelf = the default itself
                self.default_errs.extend(sch.validate(s, default, old=default, root_path=f"{path}.default"))
        for k, p in _map(s.get("properties")).items():
            if isinstance(p, Mapping):
                self._defaults(p, f"{path}.properties[{k}]", root, in_meta or (s is root and k == "metadata"))
        items = s.get("items")
        if isinstance(items, Mapping):
            self._defaults(items, f"{path}.items", root, in_meta)


def _is_zero(v: Any) -> bool:
    return v in (None, False, "", 0, [], {})


def _valid_field_path(field_path: str, s: Mapping[str, Any]) -> bool:
    node: Mapping[str, Any] | None = s
    pos = 0
    token = re.compile(r"\.([^.\[\]]+)|\['((?:[^'\\]|\\.)*)'\]")
    while pos < len(field_path):
        m = token.match(field_path, pos)
        if m is None or node is None:
            return False
        name = m.group(1) if m.group(1) is not None else m.group(2)
        props = node.get("properties")
        addl = node.get("additionalProperties")
        if isinstance(props, Mapping):
            if name not in props:
                return False
            node = props[name] if isinstance(props[name], Mapping) else None
        elif isinstance(addl, Mapping):
            node = addl
        else:
            return False
        pos = m.end()
    return True


# ------------------------------------------------------------------------------------------------------
# The whole CRD.


def _names_errors(names: Mapping[str, Any], path: str) -> list[Cause]:
    errs: list[Cause] = []
    for key in ("plural", "singular"):
        v = _str(names.get(key))
        if v and (msgs := _dns1035(v)):
            errs.append(sch.field_invalid(f"{path}.{key}", v, ",".join(msgs)))
    for key in ("kind", "listKind"):
        v = _str(names.get(key))
        if v and (msgs := _dns1035(v.lower())):
            errs.append(
                sch.field_invalid(
                    f"{path}.{key}", v, "may have mixed case, but should otherwise match: " + ",".join(msgs)
                )
            )
    for i, short in enumerate(_list(names.get("shortNames"))):
        if msgs := _dns1035(_str(short)):
            errs.append(sch.field_invalid(f"{path}.shortNames[{i}]", short, ",".join(msgs)))
    kind = _str(names.get("kind"))
    if kind and kind == names.get("listKind"):
        errs.append(sch.field_invalid(f"{path}.listKind", kind, "kind and listKind may not be the same"))
    for i, cat in enumerate(_list(names.get("categories"))):
        if msgs := _dns1035(_str(cat)):
            errs.append(sch.field_invalid(f"{path}.categories[{i}]", cat, ",".join(msgs)))
    return errs


def _column_errors(col: Any, path: str) -> list[Cause]:
    c = _map(col)
    errs: list[Cause] = []
    if not c.get("name"):
        errs.append(sch.field_required(f"{path}.name"))
    t = c.get("type")
    if not t:
        errs.append(sch.field_required(f"{path}.type", "must be one of " + ",".join(_COLUMN_TYPES)))
    elif t not in _COLUMN_TYPES:
        errs.append(sch.field_invalid(f"{path}.type", t, "must be one of " + ",".join(_COLUMN_TYPES)))
    fmt = c.get("format")
    if fmt and fmt not in _COLUMN_FORMATS:
        errs.append(sch.field_invalid(f"{path}.format", fmt, "must be one of " + ",".join(_COLUMN_FORMATS)))
    if not c.get("jsonPath"):
        errs.append(sch.field_required(f"{path}.JSONPath"))
    return errs


def _field_schema(s: Mapping[str, Any] | None, json_path: str) -> Mapping[str, Any] | None:
    node = s
    for part in json_path.lstrip(".").split("."):
        props = _map(node.get("properties")) if node is not None else {}
        nxt = props.get(part)
        node = nxt if isinstance(nxt, Mapping) else None
    return node


def _selectable_errors(fields: list[Any], s: Mapping[str, Any] | None, path: str) -> list[Cause]:
    errs: list[Cause] = []
    seen: set[str] = set()
    for i, f in enumerate(fields):
        jp = _map(f).get("jsonPath")
        ipath = f"{path}[{i}].jsonPath"
        if not isinstance(jp, str) or not jp:
            errs.append(sch.field_required(ipath))
            continue
        target = _field_schema(s, jp)
        if not re.match(r"^(\.[A-Za-z0-9_-]+)+$", jp) or target is None:
            errs.append(sch.field_invalid(ipath, jp, "is an invalid path: does not refer to a valid field"))
        elif jp.startswith(".metadata"):
            errs.append(sch.field_invalid(ipath, jp, "must not point to fields in metadata"))
        elif target.get("type") not in ("string", "boolean", "integer"):
            errs.append(
                sch.field_invalid(
                    ipath,
                    jp,
                    "must point to a field of type string, boolean or integer. Enum string fields and "
                    "strings with formats are allowed.",
                )
            )
        if jp in seen:
            errs.append(sch.field_duplicate(ipath, jp))
        seen.add(jp)
    if len(seen) > 8:
        errs.append(sch.field_too_many(path, len(seen), 8))
    return errs


def _json_path_errors(value: Any, path: str, under: tuple[str, ...]) -> list[Cause]:
    if not isinstance(value, str) or not value:
        return [sch.field_required(path)]
    if not value.startswith(".") or not re.match(r"^(\.[A-Za-z0-9_-]+)+$", value):
        return [sch.field_invalid(path, value, "should be a json path under " + " or ".join(under))]
    if not any(value.startswith(u + ".") for u in under):
        where = under[0] if len(under) == 1 else "either " + " or ".join(under)
        return [sch.field_invalid(path, value, f"should be a json path under {where}")]
    return []


def _subresource_errors(sub: Mapping[str, Any], path: str) -> list[Cause]:
    scale = sub.get("scale")
    if not isinstance(scale, Mapping):
        return []
    errs = _json_path_errors(scale.get("specReplicasPath"), f"{path}.scale.specReplicasPath", (".spec",))
    errs += _json_path_errors(
        scale.get("statusReplicasPath"), f"{path}.scale.statusReplicasPath", (".status",)
    )
    if scale.get("labelSelectorPath") is not None:
        errs += _json_path_errors(
            scale.get("labelSelectorPath"), f"{path}.scale.labelSelectorPath", (".spec", ".status")
        )
    return errs


def _crd_identity_errors(meta: Mapping[str, Any], spec: Mapping[str, Any], names: Mapping[str, Any]) -> list[Cause]:
    """metadata.name is <plural>.<group>, the group a dotted DNS subdomain, the scope Cluster or Namespaced."""
    group, plural = _str(spec.get("group")), _str(names.get("plural"))
    name = _str(meta.get("name"))
    errs: list[Cause] = []
    if not name:
        errs.append(sch.field_required("metadata.name", "name or generateName is required"))
    else:
        msgs = sch.dns1123_subdomain_errors(name)
        if name != f"{plural}.{group}":
            msgs.append('must be spec.names.plural+"."+spec.group')
        errs.extend(sch.field_invalid("metadata.name", name, m) for m in msgs)
    if not group:
        errs.append(sch.field_required("spec.group"))
    elif msgs := sch.dns1123_subdomain_errors(group):
        errs.append(sch.field_invalid("spec.group", group, ",".join(msgs)))
    elif "." not in group:
        errs.append(sch.field_invalid("spec.group", group, "should be a domain with at least one dot"))
    scope = _str(spec.get("scope"))
    if not scope:
        errs.append(sch.field_required("spec.scope"))
    elif scope not in ("Cluster", "Namespaced"):
        errs.append(sch.field_not_supported("spec.scope", scope, ["Cluster", "Namespaced"]))
    return errs


def _version_errors(v: Mapping[str, Any], vpath: str) -> list[Cause]:
    """One version: its name, schema, subresources, printer columns and selectable fields."""
    errs: list[Cause] = []
    vname = _str(v.get("name"))
    if msgs := _dns1035(vname):
        errs.append(sch.field_invalid(f"{vpath}.name", vname, ",".join(msgs)))
    sub = _map(v.get("subresources"))
    openapi = _map(v.get("schema")).get("openAPIV3Schema")
    if openapi is None:
        errs.append(sch.field_required(f"{vpath}.schema.openAPIV3Schema"))
    else:
        errs.extend(_SchemaCheck("status" in sub).run(openapi, f"{vpath}.schema.openAPIV3Schema"))
    errs.extend(_subresource_errors(sub, f"{vpath}.subresources"))
    for j, col in enumerate(_list(v.get("additionalPrinterColumns"))):
        errs.extend(_column_errors(col, f"{vpath}.additionalPrinterColumns[{j}]"))
    if v.get("selectableFields"):
        s = openapi if isinstance(openapi, Mapping) else None
        errs.extend(_selectable_errors(_list(v.get("selectableFields")), s, f"{vpath}.selectableFields"))
    return errs


def _versions_errors(spec: Mapping[str, Any]) -> list[Cause]:
    """Every version's own errors, then: names unique, exactly one storage version."""
    errs: list[Cause] = []
    versions = [v if isinstance(v, Mapping) else {} for v in _list(spec.get("versions"))]
    for i, v in enumerate(versions):
        errs.extend(_version_errors(v, f"spec.versions[{i}]"))
    raw_versions = _list(spec.get("versions"))
    vnames = [_str(v.get("name")) for v in versions]
    if len(set(vnames)) != len(vnames):
        errs.append(sch.field_invalid("spec.versions", raw_versions, "must contain unique version names"))
    if sum(1 for v in versions if v.get("storage") is True) != 1:
        errs.append(
            sch.field_invalid(
                "spec.versions", raw_versions, "must have exactly one version marked as storage version"
            )
        )
    return errs


def _conversion_errors(spec: Mapping[str, Any]) -> list[Cause]:
    errs: list[Cause] = []
    strategy = _map(spec.get("conversion")).get("strategy")
    if strategy not in (None, "None", "Webhook"):
        errs.append(sch.field_not_supported("spec.conversion.strategy", strategy, ["None", "Webhook"]))
    if spec.get("preserveUnknownFields") is True:
        errs.append(
            sch.field_invalid(
                "spec.preserveUnknownFields",
                True,
                "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in "
                "spec.versions[*].schema instead",
            )
        )
    return errs


def validate_crd(crd: dict[str, Any]) -> None:
    """Raise 422 Invalid with upstream's causes if the CRD would be rejected by a kube-apiserver."""
    c = default_crd(crd)
    meta, spec = _map(c.get("metadata")), _map(c.get("spec"))
    names = _map(spec.get("names"))
    errs = _crd_identity_errors(meta, spec, names)
    errs.extend(_versions_errors(spec))
    for key in ("plural", "singular", "kind", "listKind"):
        if not names.get(key):
            errs.append(sch.field_required(f"spec.names.{key}"))
    errs.extend(_names_errors(names, "spec.names"))
    errs.extend(_conversion_errors(spec))
    if errs:
        raise invalid(_KIND, _GROUP, _str(meta.get("name")), errs)


def crd_resource_infos(crd: dict[str, Any]) -> list[ResourceInfo]:
    """One ResourceInfo per served version, in the order the CRD lists them."""
    c = default_crd(crd)
    spec = _map(c.get("spec"))
    names = _map(spec.get("names"))
    kind = _str(names.get("kind"))
    out = []
    for v in _list(spec.get("versions")):
        if not isinstance(v, Mapping) or v.get("served") is not True:
            continue
        sub = _map(v.get("subresources"))
        subresources: dict[str, tuple[str, tuple[str, ...]]] = {}
        if "status" in sub:
            subresources["status"] = (kind, _STD_SUB)
        if "scale" in sub:
            subresources["scale"] = ("Scale", _STD_SUB)
        openapi = _map(v.get("schema")).get("openAPIV3Schema")
        selectable = tuple(
            _str(_map(f).get("jsonPath")).lstrip(".")
            for f in _list(v.get("selectableFields"))
            if _map(f).get("jsonPath")
        )
        out.append(
            ResourceInfo(
                group=_str(spec.get("group")),
                version=_str(v.get("name")),
                resource=_str(names.get("plural")),
                kind=kind,
                singular=_str(names.get("singular")) or kind.lower(),
                namespaced=spec.get("scope") == "Namespaced",
                short_names=tuple(s for s in _list(names.get("shortNames")) if isinstance(s, str)),
                categories=tuple(s for s in _list(names.get("categories")) if isinstance(s, str)),
                subresources=subresources,
                has_generation=True,
                status_subresource="status" in sub,
                schema=copy.deepcopy(dict(openapi)) if isinstance(openapi, Mapping) else None,
                printer_columns=[
                    dict(col) for col in _list(v.get("additionalPrinterColumns")) if isinstance(col, Mapping)
                ],
                selectable_fields=selectable,
                crd_name=_str(_map(c.get("metadata")).get("name")),
            )
        )
    return out


def crd_established_status(crd: dict[str, Any], now: str) -> dict[str, Any]:
    """The status the naming and establishing controllers converge to for a CRD without name conflicts."""
    c = default_crd(crd)
    spec = _map(c.get("spec"))
    names = copy.deepcopy(dict(_map(spec.get("names"))))
    storage = [
        _str(v.get("name"))
        for v in _list(spec.get("versions"))
        if isinstance(v, Mapping) and v.get("storage")
    ]
    return {
        "acceptedNames": names,
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "storedVersions": storage[:1],
    }

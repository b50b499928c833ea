"""Structural schemas on JSON values: unknown fields, pruning, defaulting and validation.

This mirrors the apiextensions-apiserver write path of custom resources: unknown fields are found and
pruned (metadata against ObjectMeta), non-nullable nulls without defaults dropped, `default`s applied,
then the value is validated the way kube-openapi does it, its messages converted to `field.Error`s as
the apiserver converts them, so clients see the same `details.causes` as from a kube-apiserver.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from functools import lru_cache
from typing import Any

import msgspec
import re2  # type: ignore[import-untyped]

from . import cel
from .encodingmemo import EncodingsBySchema
from .errors import Cause, bad_request, invalid
from .gostrings import go_quote
from .resources import ResourceInfo

__all__ = [
    "OBJECT_META_SCHEMA",
    "OMIT",
    "apply_defaults",
    "check_field_validation",
    "dns1123_subdomain_errors",
    "field_duplicate",
    "field_forbidden",
    "field_invalid",
    "field_not_supported",
    "field_required",
    "field_too_long",
    "field_too_many",
    "field_type_invalid",
    "go_json",
    "go_value",
    "has_rules",
    "pattern_error",
    "process_custom_resource",
    "prune",
    "prune_nulls",
    "unknown_fields",
    "validate",
]

JSON = Any
Schema = Mapping[str, Any]

META_FIELDS = ("apiVersion", "kind", "metadata")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# ------------------------------------------------------------------------------------------------------
# ObjectMeta as a structural schema: the fields a kube-apiserver decodes into metav1.ObjectMeta. Anything
# else in `metadata` is an unknown field ("metadata.foo") and dropped, as the strict JSON decoder does.

_STR: dict[str, Any] = {"type": "string"}
_INT: dict[str, Any] = {"type": "integer"}
_BOOL: dict[str, Any] = {"type": "boolean"}
_STR_MAP: dict[str, Any] = {"type": "object", "additionalProperties": _STR}

OBJECT_META_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": _STR,
        "generateName": _STR,
        "namespace": _STR,
        "selfLink": _STR,
        "uid": _STR,
        "resourceVersion": _STR,
        "generation": _INT,
        "creationTimestamp": {"type": "string", "format": "date-time", "nullable": True},
        "deletionTimestamp": {"type": "string", "format": "date-time", "nullable": True},
        "deletionGracePeriodSeconds": _INT,
        "labels": _STR_MAP,
        "annotations": _STR_MAP,
        "ownerReferences": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "apiVersion": _STR,
                    "kind": _STR,
                    "name": _STR,
                    "uid": _STR,
                    "controller": _BOOL,
                    "blockOwnerDeletion": _BOOL,
                },
            },
        },
        "finalizers": {"type": "array", "items": _STR},
        "managedFields": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "manager": _STR,
                    "operation": _STR,
                    "apiVersion": _STR,
                    "time": _STR,
                    "fieldsType": _STR,
                    "fieldsV1": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "subresource": _STR,
                },
            },
        },
    },
}

_ANY_SCHEMA: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}


# ------------------------------------------------------------------------------------------------------
# Rendering values and field errors as apimachinery's field.Error does.


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()
"""A bad value that the message must not show (field.OmitValueType)."""




def _digits(f: float) -> tuple[str, int]:
    """Shortest round-trip decimal digits of |f| and the decimal exponent of the first digit."""
    _sign, digits, exp = Decimal(repr(abs(f))).as_tuple()
    ds = "".join(str(d) for d in digits).rstrip("0") or "0"
    assert isinstance(exp, int)
    point = len(digits) + exp  # position of the decimal point relative to the first digit
    return ds, point - 1


def go_float(f: float) -> str:
    """Go's %v for a float64 (strconv 'g' with the shortest precision)."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    ds, x = _digits(f)
    sign = "-" if f < 0 else ""
    if x < -4 or x >= 6:  # strconv 'g' with the shortest precision switches to %e at exponent 6
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{sign}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    return sign + _fixed(ds, x)


def _fixed(ds: str, x: int) -> str:
    if x < 0:
        return "0." + "0" * (-x - 1) + ds
    if len(ds) <= x + 1:
        return ds + "0" * (x + 1 - len(ds))
    return ds[: x + 1] + "." + ds[x + 1 :]


def _go_json_float(f: float) -> str:
    """encoding/json's float64 form: fixed unless the exponent is < -6 or >= 21."""
    if not math.isfinite(f):
        return "null"
    if f == 0:
        return "0"
    ds, x = _digits(f)
    sign = "-" if f < 0 else ""
    if x < -6 or x >= 21:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{sign}{mant}e{'-' if x < 0 else '+'}{abs(x)}"
    return sign + _fixed(ds, x)


def _go_json_str(s: str) -> str:
    out = json.dumps(s, ensure_ascii=False)
    return (
        out.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def go_json(v: JSON) -> str:
    """json.Marshal of a decoded JSON value as Go writes it (sorted keys, HTML-safe strings, Go floats)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_json_float(v)
    if isinstance(v, str):
        return _go_json_str(v)
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{_go_json_str(str(k))}:{go_json(v[k])}" for k in sorted(v, key=str)) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(go_json(x) for x in v) + "]"
    return _go_json_str(str(v))


def go_value(v: JSON) -> str:
    """A bad value as field.Error.ErrorBody prints it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, str):
        return go_quote(v)
    return go_json(v)


def _body(kind: str, value: Any, detail: str) -> str:
    s = kind if value is OMIT else f"{kind}: {go_value(value)}"
    return f"{s}: {detail}" if detail else s


def field_invalid(field: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueInvalid", _body("Invalid value", value, detail), field)


def field_type_invalid(field: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueTypeInvalid", _body("Invalid value", value, detail), field)


def field_required(field: str, detail: str = "") -> Cause:
    return Cause("FieldValueRequired", _body("Required value", OMIT, detail), field)


def field_forbidden(field: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", _body("Forbidden", OMIT, detail), field)


def field_duplicate(field: str, value: Any) -> Cause:
    return Cause("FieldValueDuplicate", _body("Duplicate value", value, ""), field)


def field_not_supported(field: str, value: Any, valid: Sequence[str]) -> Cause:
    detail = "supported values: " + ", ".join(go_quote(v) for v in valid) if valid else ""
    return Cause("FieldValueNotSupported", _body("Unsupported value", value, detail), field)


def field_too_long(field: str, max_length: int) -> Cause:
    if max_length >= 0:
        detail = f"may not be more than {max_length} {'byte' if max_length == 1 else 'bytes'}"
    else:
        detail = "value is too long"
    return Cause("FieldValueTooLong", _body("Too long", OMIT, detail), field)


def field_too_many(field: str, actual: int, max_quantity: int) -> Cause:
    if max_quantity >= 0:
        detail = f"must have at most {max_quantity} {'item' if max_quantity == 1 else 'items'}"
    else:
        detail = "has too many items"
    return Cause("FieldValueTooMany", _body("Too many", actual if actual >= 0 else OMIT, detail), field)


# Field errors that stop CEL rules from running (hasBlockingErr upstream).
_BLOCKING = frozenset(
    {
        "FieldValueNotSupported",
        "FieldValueRequired",
        "FieldValueTooLong",
        "FieldValueTooMany",
        "FieldValueTypeInvalid",
    }
)
_BLOCKED_MESSAGE = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)


# ------------------------------------------------------------------------------------------------------
# Schema accessors (the structural form: type/properties/items/additionalProperties/x-kubernetes-*).


def _props(s: Schema | None) -> Mapping[str, Any]:
    if s is None:
        return {}
    p = s.get("properties")
    return p if isinstance(p, Mapping) else {}


def _additional(s: Schema | None) -> Schema | None:
    """The schema of map values; `additionalProperties: true` means any value, false means none."""
    if s is None:
        return None
    a = s.get("additionalProperties")
    if isinstance(a, Mapping):
        return a
    if a is True:
        return _ANY_SCHEMA
    return None


def _items(s: Schema | None) -> Schema | None:
    if s is None:
        return None
    i = s.get("items")
    return i if isinstance(i, Mapping) else None


def _preserve(s: Schema | None) -> bool:
    return s is not None and s.get("x-kubernetes-preserve-unknown-fields") is True


def _embedded(s: Schema | None) -> bool:
    return s is not None and s.get("x-kubernetes-embedded-resource") is True


_CLEAN_ITEMS_MAX = 20_000
_clean = EncodingsBySchema(_CLEAN_ITEMS_MAX, 10_000)
_settled = EncodingsBySchema(_CLEAN_ITEMS_MAX, 10_000)
_call_settled: dict[int, tuple[Any, bytes]] | None = None
"""During one `process_custom_resource`: list items (by id, the object held so the id stays its own) known to
pass every decode walk unchanged, with their encodings. None outside a call: the walks behave as they always do."""


def _memo_worthy(items: Schema) -> bool:
    """Only list items that are objects or arrays are worth encoding to look up (not scalars)."""
    return items.get("type") in ("object", "array") or bool(_props(items))


def _clean_items(items: Schema) -> set[bytes] | None:
    """Encoded list items already found valid against `items` (the OpenAPI checks are a pure function of
    schema and value; paths only matter in errors, which are never cached). A status that rewrites a list
    of hundreds of entries to add one is checked for the new entry only. None: not worth it (scalars)."""
    return _clean.of(items) if _memo_worthy(items) else None


def _is_settled(v: JSON, items: Schema, memo: dict[int, tuple[Any, bytes]]) -> bool:
    """Whether list item `v` passes every decode walk unchanged (remembered in `memo` for the call's later
    walks and its validation); decided by running the walks on it once per distinct encoding."""
    if id(v) in memo:
        return True
    if not isinstance(v, dict | list) or not _memo_worthy(items):
        return False
    try:
        key = msgspec.json.encode(v)
    except (OverflowError, TypeError, ValueError):  # ints beyond 64 bits: walk them as they are
        return False
    if key not in _settled.of(items):
        # the walks are pure functions of schema and value: an item they all leave as it is stays so
        un = _Unknown(True)
        if (_prune_value(v, items, "", un.pruned, un) != v or un.paths() or prune_nulls(items, v) != v
                or apply_defaults(items, v) != v):
            return False
        _settled.remember(items, key)
    memo[id(v)] = (v, key)
    return True


_SUBTREE_KEYS = ("x-kubernetes-validations", "x-kubernetes-embedded-resource", "x-kubernetes-list-type")
_subtree_cache: dict[int, tuple[Any, frozenset[str]]] = {}


def _subtree(s: Any) -> frozenset[str]:
    """Which of the post-schema checks' keywords occur anywhere under `s`: their walks skip the subtrees
    that have none (a status ledger of hundreds of plain entries). Cached per schema node; the node is
    kept referenced so its id cannot be reused while cached."""
    if not isinstance(s, Mapping):
        return frozenset()
    hit = _subtree_cache.get(id(s))
    if hit is not None and hit[0] is s:
        return hit[1]
    found = {k for k in _SUBTREE_KEYS if s.get(k)}
    for v in s.values():
        if isinstance(v, Mapping):
            found |= _subtree(v)
        elif isinstance(v, list):
            for item in v:
                found |= _subtree(item)
    out = frozenset(found)
    if len(_subtree_cache) > 50_000:  # schemas of deleted or replaced CRDs
        _subtree_cache.clear()
    _subtree_cache[id(s)] = (s, out)
    return out


def _types(s: Schema) -> list[str]:
    if s.get("x-kubernetes-int-or-string") is True:
        return ["integer", "string"]
    t = s.get("type")
    if isinstance(t, str) and t:
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    return []


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _copy(v: JSON) -> JSON:
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


# ------------------------------------------------------------------------------------------------------
# Unknown fields and pruning (pruning/algorithm.go + objectmeta coercion).


class _Unknown:
    """Unknown field paths in upstream order: root metadata, pruned fields (sorted), embedded metadata."""

    def __init__(self, track: bool) -> None:
        self.track = track
        self.root_meta: list[str] = []
        self.pruned: list[str] = []
        self.embedded_meta: list[str] = []

    def paths(self) -> list[str]:
        return self.root_meta + sorted(self.pruned) + sorted(self.embedded_meta)


def _prune_value(x: JSON, s: Schema | None, path: str, rec: list[str] | None, un: _Unknown) -> JSON:
    if _preserve(s):
        return _skip_prune(x, s, path, un)
    if isinstance(x, dict):
        if s is None:
            if rec is not None:
                rec.extend(_join(path, k) for k in x)
            return {}
        emb = _embedded(s)
        props = _props(s)
        addl = _additional(s)
        settled = _call_settled
        out: dict[str, Any] = {}
        for k, v in x.items():
            if emb and k in META_FIELDS:
                out[k] = _meta_field(k, v, path, un.embedded_meta if un.track else None, un)
            elif k in props:
                out[k] = v if settled and id(v) in settled else _prune_value(v, props[k], _join(path, k), rec, un)
            elif addl is not None:
                out[k] = _prune_value(v, addl, _join(path, k), rec, un)
            elif rec is not None and (k not in META_FIELDS or path):
                rec.append(_join(path, k))
        return out
    if isinstance(x, list):
        items = _items(s)
        memo = _call_settled
        if memo is not None and items is not None:
            return [v if _is_settled(v, items, memo) else _prune_value(v, items, f"{path}[{i}]", rec, un)
                    for i, v in enumerate(x)]
        return [_prune_value(v, items, f"{path}[{i}]", rec, un) for i, v in enumerate(x)]
    return x


def _skip_prune(x: JSON, s: Schema | None, path: str, un: _Unknown) -> JSON:
    """Below x-kubernetes-preserve-unknown-fields: keep unknown keys, but prune inside the known ones."""
    if s is None:
        return _copy(x)
    rec = un.pruned if un.track else None
    if isinstance(x, dict):
        emb = _embedded(s)
        props = _props(s)
        addl = _additional(s)
        out: dict[str, Any] = {}
        for k, v in x.items():
            if emb and k in META_FIELDS:
                out[k] = _meta_field(k, v, path, un.embedded_meta if un.track else None, un)
            elif k in props:
                out[k] = _prune_value(v, props[k], _join(path, k), rec, un)
            elif addl is not None:
                out[k] = _prune_value(v, addl, _join(path, k), rec, un)
            else:
                out[k] = _copy(v)
        return out
    if isinstance(x, list):
        return [_skip_prune(v, _items(s), f"{path}[{i}]", un) for i, v in enumerate(x)]
    return x


def _meta_field(k: str, v: JSON, path: str, rec: list[str] | None, un: _Unknown) -> JSON:
    if k == "metadata" and isinstance(v, dict):
        return _prune_value(v, OBJECT_META_SCHEMA, _join(path, "metadata"), rec, un)
    return _copy(v)


def _walk_root(
    schema: Schema | None, obj: JSON, skip_root: tuple[str, ...], track: bool
) -> tuple[JSON, _Unknown]:
    un = _Unknown(track)
    rec = un.pruned if track else None
    if not isinstance(obj, dict):
        return _prune_value(obj, schema, "", rec, un), un
    if schema is not None and _preserve(schema):
        body = _skip_prune({k: v for k, v in obj.items() if k not in skip_root}, schema, "", un)
    else:
        s = schema if schema is not None else {}
        inner = dict(s)
        inner.pop("x-kubernetes-embedded-resource", None)
        body = _prune_value({k: v for k, v in obj.items() if k not in skip_root}, inner, "", rec, un)
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if k in skip_root:
            if k == "metadata" and isinstance(v, dict):
                out[k] = _prune_value(v, OBJECT_META_SCHEMA, "metadata", un.root_meta if track else None, un)
            else:
                out[k] = _copy(v)
        elif k in body:
            out[k] = body[k]
    return out, un


def unknown_fields(
    schema: Schema, obj: Any, *, skip_root: tuple[str, ...] = ("apiVersion", "kind", "metadata")
) -> list[str]:
    """Dotted paths of fields the schema does not allow, as the strict decoder reports them."""
    return _walk_root(schema, obj, skip_root, True)[1].paths()


def prune(schema: Schema, obj: Any, *, resource_root: bool = True) -> Any:
    """A copy of `obj` without unknown fields; root apiVersion/kind stay, metadata keeps ObjectMeta's keys.
    With resource_root=False the value is a nested one (a default, say) and its root gets no such care."""
    if not resource_root:
        return _prune_value(obj, schema, "", None, _Unknown(False))
    return _walk_root(schema, obj, META_FIELDS, False)[0]


def prune_nulls(schema: Schema, obj: Any) -> Any:
    """Drop nulls of non-nullable fields that have no default (they would fail the type check otherwise)."""

    settled = _call_settled

    def walk(x: JSON, s: Schema | None) -> JSON:
        if isinstance(x, dict):
            out: dict[str, Any] = {}
            for k, v in x.items():
                sub: Schema | None = _props(s).get(k) if k in _props(s) else _additional(s)
                if v is None and sub is not None and not sub.get("nullable") and sub.get("default") is None:
                    continue
                out[k] = v if settled and id(v) in settled else walk(v, sub)
            return out
        if isinstance(x, list):
            memo = _call_settled
            if memo:
                return [v if id(v) in memo else walk(v, _items(s)) for v in x]
            return [walk(v, _items(s)) for v in x]
        return x

    return walk(obj, schema)


def check_field_validation(
    unknown: list[str], directive: str, *, options_kind: str = "CreateOptions"
) -> list[str]:
    """Apply a fieldValidation directive: Strict fails, Warn returns warnings, Ignore drops silently."""
    if directive not in ("", "Ignore", "Warn", "Strict"):
        cause = field_not_supported("fieldValidation", directive, ["", "Ignore", "Strict", "Warn"])
        raise invalid(options_kind, "meta.k8s.io", "", [cause])
    msgs = [f"unknown field {go_quote(p)}" for p in unknown]
    if directive == "Ignore" or not msgs:
        return []
    if directive == "Strict":
        raise bad_request("strict decoding error: " + ", ".join(msgs))
    return msgs


# ------------------------------------------------------------------------------------------------------
# Defaulting (defaulting/algorithm.go).


def _has_default(s: Schema | None) -> bool:
    return s is not None and s.get("default") is not None


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """A copy of `obj` with `default`s applied top-down; a default may itself receive nested defaults."""
    settled = _call_settled

    def walk(x: JSON, s: Schema | None) -> JSON:
        if s is None:
            return _copy(x)
        if isinstance(x, dict):
            out = dict(x)
            props = _props(s)
            for k, p in props.items():
                if _has_default(p) and (k not in out or (out[k] is None and not p.get("nullable"))):
                    out[k] = _copy(p["default"])
            addl = _additional(s)
            for k in list(out):
                if k in props:
                    if not (settled and id(out[k]) in settled):
                        out[k] = walk(out[k], props[k])
                elif addl is not None:
                    if out[k] is None and not addl.get("nullable") and _has_default(addl):
                        out[k] = _copy(addl["default"])
                    out[k] = walk(out[k], addl)
                else:
                    out[k] = _copy(out[k])
            return out
        if isinstance(x, list):
            items = _items(s)
            memo = _call_settled or {}
            res = []
            for v in x:
                if id(v) in memo:
                    res.append(v)
                    continue
                if v is None and items is not None and not items.get("nullable") and _has_default(items):
                    v = items["default"]
                res.append(walk(v, items))
            return res
        return x

    return walk(obj, schema)


# ------------------------------------------------------------------------------------------------------
# Value validation (kube-openapi validate + apiextensions' conversion of its errors to field errors).


def _json_type(x: JSON) -> str:
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, int):
        return "integer" if _INT64_MIN <= x <= _INT64_MAX else "number"
    if isinstance(x, float):
        return "number"
    if isinstance(x, str):
        return "string"
    if isinstance(x, (list, tuple)):
        return "array"
    if isinstance(x, Mapping):
        return "object"
    return ""


def _is_number(x: JSON) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _num(s: Schema, key: str) -> int | float | None:
    """A numeric schema keyword (minimum, maxLength, ...), None when absent or malformed."""
    v = s.get(key)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _strict_eq(a: JSON, b: JSON) -> bool:
    """reflect.DeepEqual on decoded JSON: int64 1 and float64 1.0 differ, and so do true and 1."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_strict_eq(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_strict_eq(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _enum_eq(data: JSON, e: JSON) -> bool:
    if data is None or e is None:
        return False  # upstream never matches null against an enum
    if _is_number(data) and _is_number(e):
        return bool(data == e)
    return _strict_eq(data, e)


_STRING_FORMATS = frozenset(
    {
        "bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr", "mac", "uuid", "uuid3", "uuid4",
        "uuid5", "isbn", "isbn10", "isbn13", "creditcard", "ssn", "hexcolor", "rgbcolor", "byte", "password",
        "date", "duration", "datetime", "k8sshortname", "k8slongname",
    }
)  # fmt: skip


def _norm_format(f: str) -> str:
    return f.replace("-", "").replace("_", "").lower()


def _effective_format(s: Schema) -> str:
    """The format after upstream strips the ones it does not support for the node's type."""
    f = s.get("format")
    if not isinstance(f, str) or not f:
        return ""
    types = _types(s)
    t = types[0] if len(types) == 1 else ""
    if t in ("", "string"):
        return f if _norm_format(f) in _STRING_FORMATS else ""
    if t == "integer":
        return f if f in ("int32", "int64") else ""
    if t == "number":
        return f if f in ("float", "double") else ""
    return ""


_UUID = re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_UUID3 = re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_UUID4 = re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
_UUID5 = re.compile(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
_DATETIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(?:[Zz]|[+-]\d{2}:?\d{2})?$"
)
_GO_DURATION = re.compile(r"^[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+$")
_WORD_DURATION = re.compile(
    r"^\d+\s*(?:ns|us|µs|ms|s|m|h|d|w|nanos?|nanoseconds?|micros?|microseconds?|millis?|milliseconds?"
    r"|secs?|seconds?|mins?|minutes?|hours?|days?|weeks?)$"
)
_HOSTNAME = re.compile(
    r"^[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?)*$"
)
_MAC = re.compile(
    r"^(?:[0-9A-Fa-f]{2}(?:[:-][0-9A-Fa-f]{2}){5}|[0-9A-Fa-f]{2}(?:[:-][0-9A-Fa-f]{2}){7}"
    r"|[0-9A-Fa-f]{2}(?:[:-][0-9A-Fa-f]{2}){19}|[0-9A-Fa-f]{4}(?:\.[0-9A-Fa-f]{4}){2,9})$"
)
_HEXCOLOR = re.compile(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")
_RGBCOLOR = re.compile(r"^rgb\(\s*(\d{1,3})\s*,\s*(\d{1,3})\s*,\s*(\d{1,3})\s*\)$")
_K8S_SHORT = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_K8S_LONG = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _valid_date(y: str, m: str, d: str) -> bool:
    try:
        datetime.date(int(y), int(m), int(d))
    except ValueError:
        return False
    return True


def _is_datetime(v: str) -> bool:
    m = _DATETIME.match(v)
    if not m or not _valid_date(m[1], m[2], m[3]):
        return False
    return int(m[4]) < 24 and int(m[5]) < 60 and (m[6] is None or int(m[6]) < 60)


def _is_ip(v: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(v).version == version
    except ValueError:
        return False


def _is_cidr(v: str) -> bool:
    try:
        ipaddress.ip_network(v, strict=False)
    except ValueError:
        return False
    return "/" in v


def _is_byte(v: str) -> bool:
    try:
        base64.b64decode(v, validate=True)
    except ValueError:
        return False
    return True


def _is_rgb(v: str) -> bool:
    m = _RGBCOLOR.match(v)
    return m is not None and all(int(g) <= 255 for g in m.groups())


def _is_date(v: str) -> bool:
    m = _DATE.match(v)
    return m is not None and _valid_date(m[1], m[2], m[3])


_FORMAT_CHECKS: dict[str, Callable[[str], bool]] = {
    "byte": _is_byte,
    "date": _is_date,
    "datetime": _is_datetime,
    "duration": lambda v: bool(_GO_DURATION.match(v) or _WORD_DURATION.match(v) or v == "0"),
    "uuid": lambda v: bool(_UUID.match(v)),
    "uuid3": lambda v: bool(_UUID3.match(v)),
    "uuid4": lambda v: bool(_UUID4.match(v)),
    "uuid5": lambda v: bool(_UUID5.match(v)),
    "ipv4": lambda v: _is_ip(v, 4),
    "ipv6": lambda v: _is_ip(v, 6),
    "cidr": _is_cidr,
    "mac": lambda v: bool(_MAC.match(v)),
    "hostname": lambda v: len(v) <= 255 and bool(_HOSTNAME.match(v)),
    "email": lambda v: bool(re.match(r"^[^@\s]+@[^@\s]+$", v)),
    "uri": lambda v: bool(re.match(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|/)\S*$", v)),
    "hexcolor": lambda v: bool(_HEXCOLOR.match(v)),
    "rgbcolor": _is_rgb,
    "bsonobjectid": lambda v: bool(re.match(r"^[0-9a-fA-F]{24}$", v)),
    "ssn": lambda v: bool(re.match(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$", v)),
    "isbn10": lambda v: bool(re.match(r"^(?:\d{9}[\dXx])$", re.sub(r"[\s-]", "", v))),
    "isbn13": lambda v: bool(re.match(r"^\d{13}$", re.sub(r"[\s-]", "", v))),
    "isbn": lambda v: bool(re.match(r"^(?:\d{9}[\dXx]|\d{13})$", re.sub(r"[\s-]", "", v))),
    "creditcard": lambda v: bool(re.match(r"^\d{12,19}$", re.sub(r"\D", "", v))),
    "password": lambda v: True,
    "k8sshortname": lambda v: len(v) <= 63 and bool(_K8S_SHORT.match(v)),
    "k8slongname": lambda v: len(v) <= 253 and bool(_K8S_LONG.match(v)),
}


def pattern_error(pattern: str) -> str | None:
    """Why Go's regexp (RE2) would reject a schema `pattern`, None if it compiles."""
    try:
        _regex(pattern)
    except ValueError as e:
        return str(e)
    return None


@lru_cache(maxsize=512)
def _regex(pattern: str) -> Any:
    """RE2 like Go's regexp; raises ValueError for patterns Go would reject."""
    try:
        return re2.compile(pattern)
    except Exception as e:  # re2.error and friends
        raise ValueError(str(e)) from e


def _fewest(results: list[list[Cause]]) -> list[Cause]:
    """The failing alternative to report (kube-openapi: the best-matching one; here: the fewest errors)."""
    return min(results, key=len)


class _Checker:
    """One kube-openapi validation run. `prefix` is the field path its root stands for (nil -> "<nil>")."""

    def __init__(self, prefix: str, unchanged: Mapping[str, bytes] | None = None) -> None:
        self.prefix = prefix
        self.unchanged = unchanged or {}
        """Root properties whose values equal the old object's, with their encodings (see `_remembered`)."""

    def field(self, name: str) -> str:
        name = name[1:] if name.startswith(".") else name
        if not name:
            return self.prefix or "<nil>"
        return f"{self.prefix}.{name}" if self.prefix else name

    def root_invalid(self, detail: str) -> Cause:
        """An error kube-openapi does not attach to a field: upstream reports it at the validator's root."""
        return field_invalid(self.prefix or "<nil>", "", detail)

    def check(self, s: Schema, x: JSON, name: str) -> list[Cause]:
        errs: list[Cause] = []
        types = _types(s)
        fmt = _effective_format(s)
        if x is None:
            if types and not s.get("nullable"):
                errs.append(self._type_err(name, ",".join(types), "null"))
            errs.extend(self._enum(s, x, name))
            return errs
        jt = _json_type(x)
        te = self._type(types, fmt, x, jt, name)
        if te is not None:
            errs.append(te)
        errs.extend(self._junctors(s, x, name))
        if jt == "string":
            errs.extend(self._string(s, x, name))
            if fmt:
                check = _FORMAT_CHECKS.get(_norm_format(fmt))
                if check is not None and not check(x):
                    errs.append(self._type_err(name, fmt, x))
        if jt in ("integer", "number"):
            errs.extend(self._number(s, types, fmt, x, name))
        if jt == "array":
            errs.extend(self._array(s, x, name))
        errs.extend(self._enum(s, x, name))
        if jt == "object":
            errs.extend(self._object(s, x, name))
        return errs

    def _type_err(self, name: str, type_name: str, value: str) -> Cause:
        return field_type_invalid(
            self.field(name), value, f"{name} in body must be of type {type_name}: {go_quote(value)}"
        )

    def _type(self, types: list[str], fmt: str, x: JSON, jt: str, name: str) -> Cause | None:
        if not types and not fmt:
            return None
        data_fmt = {"integer": "int64", "number": "float64"}.get(jt, "")
        is_float_int = (
            jt == "number" and isinstance(x, (int, float)) and float(x).is_integer() and "integer" in types
        )
        is_int_float = jt == "integer" and "number" in types
        if (
            jt not in ("string", "array")
            and fmt
            and not (
                jt in types
                or data_fmt == fmt
                or is_float_int
                or is_int_float
                or (fmt == "int64" and data_fmt == "int32")
                or (fmt == "float64" and data_fmt == "float32")
            )
        ):
            return self._type_err(name, fmt, data_fmt)
        if not ("number" in types or "integer" in types) and fmt and jt in ("string", "array"):
            return None
        if not (jt in types or is_float_int or is_int_float):
            return self._type_err(name, ",".join(types), jt)
        return None

    def _junctors(self, s: Schema, x: JSON, name: str) -> list[Cause]:
        errs: list[Cause] = []
        if not ("anyOf" in s or "oneOf" in s or "allOf" in s or "not" in s):
            return errs  # the common case: quoting the path for messages is most of this function's cost
        quoted = go_quote(name)
        any_of = [a for a in s.get("anyOf") or [] if isinstance(a, Mapping)]
        if any_of:
            results: list[list[Cause]] = [self.check(a, x, name) for a in any_of]
            if not any(not r for r in results):
                errs.append(self.root_invalid(f"{quoted} must validate at least one schema (anyOf)"))
                errs.extend(_fewest(results))
        one_of = [a for a in s.get("oneOf") or [] if isinstance(a, Mapping)]
        if one_of:
            results = [self.check(a, x, name) for a in one_of]
            valid = sum(1 for r in results if not r)
            if valid != 1:
                more = "Found none valid" if valid == 0 else f"Found {valid} valid alternatives"
                errs.append(
                    self.root_invalid(f"{quoted} must validate one and only one schema (oneOf). {more}")
                )
                if valid == 0:
                    errs.extend(_fewest(results))
        all_of = [a for a in s.get("allOf") or [] if isinstance(a, Mapping)]
        if all_of:
            valid = 0
            for a in all_of:
                r = self.check(a, x, name)
                valid += not r
                errs.extend(r)
            if valid != len(all_of):
                more = ". None validated" if valid == 0 else ""
                errs.append(self.root_invalid(f"{quoted} must validate all the schemas (allOf){more}"))
        not_ = s.get("not")
        if isinstance(not_, Mapping) and not self.check(not_, x, name):
            errs.append(self.root_invalid(f"{quoted} must not validate the schema (not)"))
        return errs

    def _string(self, s: Schema, x: str, name: str) -> list[Cause]:
        n = len(x)  # runes, like utf8.RuneCountInString
        max_len, min_len, pattern = _num(s, "maxLength"), _num(s, "minLength"), s.get("pattern")
        if max_len is not None and n > max_len:
            return [field_too_long(self.field(name), int(max_len))]
        if min_len is not None and n < min_len:
            return [
                field_invalid(
                    self.field(name), x, f"{name} in body should be at least {int(min_len)} chars long"
                )
            ]
        if isinstance(pattern, str) and pattern:
            try:
                ok = _regex(pattern).search(x) is not None
                shown = pattern
            except ValueError as e:
                ok, shown = False, f"{pattern}, but pattern is invalid: {e}"
            if not ok:
                return [field_invalid(self.field(name), x, f"{name} in body should match '{shown}'")]
        return []

    def _number(self, s: Schema, types: list[str], fmt: str, x: int | float, name: str) -> list[Cause]:
        errs: list[Cause] = []
        type_name = types[0] if len(types) == 1 and types[0] in ("integer", "number") else ""
        range_err = self._range(x, type_name, fmt, name)
        if range_err:
            errs.append(self.root_invalid(range_err))
        is_int = isinstance(x, int) and _INT64_MIN <= x <= _INT64_MAX
        mult, minimum, maximum = _num(s, "multipleOf"), _num(s, "minimum"), _num(s, "maximum")
        if mult is not None:
            errs.extend(self._multiple_of(x, mult, is_int, name))
        if minimum is not None:
            excl = s.get("exclusiveMinimum") is True
            bound: int | float = math.trunc(minimum) if is_int and abs(minimum) < 2**63 else float(minimum)
            if (x <= bound) if excl else (x < bound):
                shown = str(bound) if isinstance(bound, int) else go_float(bound)
                word = "greater than" if excl else "greater than or equal to"
                errs.append(field_invalid(self.field(name), x, f"{name} in body should be {word} {shown}"))
        if maximum is not None:
            excl = s.get("exclusiveMaximum") is True
            bound = math.trunc(maximum) if is_int and abs(maximum) < 2**63 else float(maximum)
            if (x >= bound) if excl else (x > bound):
                shown = str(bound) if isinstance(bound, int) else go_float(bound)
                word = "less than" if excl else "less than or equal to"
                errs.append(field_invalid(self.field(name), x, f"{name} in body should be {word} {shown}"))
        return errs

    def _range(self, x: int | float, type_name: str, fmt: str, name: str) -> str:
        if type_name == "integer":
            limits = {"int32": (-(2**31), 2**31 - 1)}.get(fmt, (_INT64_MIN, _INT64_MAX))
            ok = (isinstance(x, int) or float(x).is_integer()) and limits[0] <= int(x) <= limits[1]
            if not ok:
                how = f"with format {fmt}" if fmt else "(default format)"
                return f"Checked value must be of type integer {how} in {name}"
        elif fmt == "float" and abs(float(x)) > 3.4028234663852886e38:
            return f"Checked value must be of type {type_name or 'number'} with format float in {name}"
        return ""

    def _multiple_of(self, x: int | float, factor: int | float, is_int: bool, name: str) -> list[Cause]:
        # Integer data is checked against int64(factor), as kube-openapi does (so 0.5 acts as 0 there).
        f: int | float = math.trunc(factor) if is_int else float(factor)
        if f <= 0:
            detail = f"factor MultipleOf declared for {name} must be positive: {go_value(f)}"
            return [field_invalid(self.field(name), f, detail)]
        if isinstance(f, int):
            ok = int(x) % f == 0
        else:
            mult = (1 / f * x) if f < 1 else (x / f)
            ok = float(mult).is_integer()
        if ok:
            return []
        return [field_invalid(self.field(name), x, f"{name} in body should be a multiple of {go_value(f)}")]

    def _remembered(self, s: Schema, x: JSON, name: str, encoding: bytes) -> list[Cause]:
        """A root property the update leaves as it was: checked once per distinct encoding under its schema node
        (the checks are a pure function of both; only a pass is remembered), as list items are."""
        clean = _clean.of(s)
        if encoding in clean:
            return []
        found = self.check(s, x, name)
        if not found:
            _clean.remember(s, encoding)
        return found

    def _array(self, s: Schema, x: list[Any], name: str) -> list[Cause]:
        errs: list[Cause] = []
        items = _items(s)
        if items is not None:
            clean = _clean_items(items)
            for i, v in enumerate(x):
                if clean is None or not isinstance(v, (dict, list)):
                    errs.extend(self.check(items, v, f"{name}[{i}]"))
                    continue
                known = _call_settled.get(id(v)) if _call_settled else None
                try:
                    key = known[1] if known is not None else msgspec.json.encode(v)
                except (OverflowError, TypeError, ValueError):  # ints beyond 64 bits: check them as they are
                    errs.extend(self.check(items, v, f"{name}[{i}]"))
                    continue
                if key in clean:
                    continue
                found = self.check(items, v, f"{name}[{i}]")
                if found:
                    errs.extend(found)
                else:
                    _clean.remember(items, key)
        size = len(x)
        min_items, max_items = _num(s, "minItems"), _num(s, "maxItems")
        if min_items is not None and size < min_items:
            errs.append(
                field_invalid(
                    self.field(name), size, f"{name} in body should have at least {int(min_items)} items"
                )
            )
        if max_items is not None and size > max_items:
            errs.append(field_too_many(self.field(name), size, int(max_items)))
        if s.get("uniqueItems") is True:
            seen: list[Any] = []
            for v in x:
                if any(_strict_eq(v, u) for u in seen):
                    errs.append(
                        field_invalid(self.field(name), "", f"{name} in body shouldn't contain duplicates")
                    )
                    break
                seen.append(v)
        return errs

    def _enum(self, s: Schema, x: JSON, name: str) -> list[Cause]:
        enum = s.get("enum")
        if not isinstance(enum, list) or not enum:
            return []
        if any(_enum_eq(x, e) for e in enum):
            return []
        values = [e if isinstance(e, str) else go_json(e) for e in enum]
        return [field_not_supported(self.field(name), x, values)]

    def _object(self, s: Schema, x: Mapping[str, Any], name: str) -> list[Cause]:
        errs: list[Cause] = []
        n = len(x)
        min_p, max_p = _num(s, "minProperties"), _num(s, "maxProperties")
        if min_p is not None and n < min_p:
            errs.append(
                field_invalid(
                    self.field(name), n, f"{name} in body should have at least {int(min_p)} properties"
                )
            )
        if max_p is not None and n > max_p:
            errs.append(field_too_many(self.field(name), n, int(max_p)))
        props = _props(s)
        if s.get("additionalProperties") is False:
            for k in x:
                if k not in props:
                    errs.append(
                        field_invalid(self.field(name), k, f"{name}.{k} in body is a forbidden property")
                    )
        else:
            addl = s.get("additionalProperties")
            if isinstance(addl, Mapping):
                for k, v in x.items():
                    if k not in props:
                        errs.extend(self.check(addl, v, f"{name}.{k}"))
        for k, p in props.items():
            if k in x and isinstance(p, Mapping):
                if not name and k in self.unchanged:
                    errs.extend(self._remembered(p, x[k], k, self.unchanged[k]))
                else:
                    errs.extend(self.check(p, x[k], _join(name, k)))
        for k in s.get("required") or []:
            if isinstance(k, str) and k not in x:
                errs.append(field_required(self.field(f"{name}.{k}")))
        return errs


# ------------------------------------------------------------------------------------------------------
# Checks after the schema: embedded resources, list-type set/map uniqueness, CEL rules.


def _path_key(path: str, key: str) -> str:
    return f"{path}[{key}]" if path else f"[{key}]"


def _embedded_errors(s: Schema | None, x: JSON, path: str) -> list[Cause]:
    """Embedded resources must carry apiVersion and kind (objectmeta.Validate)."""
    if s is None or "x-kubernetes-embedded-resource" not in _subtree(s):
        return []
    errs: list[Cause] = []
    if isinstance(x, dict):
        if _embedded(s):
            for k in ("apiVersion", "kind"):
                v = x.get(k)
                if k not in x:
                    errs.append(field_required(_join(path, k)))
                elif not isinstance(v, str):
                    errs.append(field_invalid(_join(path, k), v, "must be a string"))
                elif not v:
                    errs.append(field_invalid(_join(path, k), v, "must not be empty"))
        props, addl = _props(s), _additional(s)
        for k, v in x.items():
            if k in props:
                errs.extend(_embedded_errors(props[k], v, _join(path, k)))
            elif addl is not None:
                errs.extend(_embedded_errors(addl, v, _path_key(path, k)))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            errs.extend(_embedded_errors(_items(s), v, f"{path}[{i}]"))
    return errs


def _hashable(x: JSON) -> Any:
    if isinstance(x, (dict, list)):
        return ("json", go_json(x))
    return (type(x).__name__, x)


def _non_unique(values: list[Any]) -> list[int]:
    """Indices of the second occurrence of each repeated value (validateListSet)."""
    counts: dict[Any, int] = {}
    out = []
    for i, v in enumerate(values):
        h = _hashable(v)
        counts[h] = counts.get(h, 0) + 1
        if counts[h] == 2:
            out.append(i)
    return out


def _list_errors(s: Schema | None, x: JSON, path: str) -> list[Cause]:
    if s is None or "x-kubernetes-list-type" not in _subtree(s):
        return []
    errs: list[Cause] = []
    if isinstance(x, dict):
        props, addl = _props(s), _additional(s)
        for k, v in x.items():
            if addl is not None and k not in props:
                errs.extend(_list_errors(addl, v, _path_key(path, k)))
            if k in props:
                errs.extend(_list_errors(props[k], v, _join(path, k)))
    elif isinstance(x, list):
        lt = s.get("x-kubernetes-list-type")
        if lt == "set":
            errs.extend(field_duplicate(f"{path}[{i}]", x[i]) for i in _non_unique(x))
        elif lt == "map":
            errs.extend(_list_map_errors(s, x, path))
        for i, v in enumerate(x):
            errs.extend(_list_errors(_items(s), v, f"{path}[{i}]"))
    return errs


def _list_map_errors(s: Schema, x: list[Any], path: str) -> list[Cause]:
    for i, v in enumerate(x):
        if v is not None and not isinstance(v, dict):
            return [field_invalid(f"{path}[{i}]", v, "must be an object for an array of list-type map")]
    if len(x) <= 1:
        return []
    keys = [k for k in s.get("x-kubernetes-list-map-keys") or [] if isinstance(k, str)]
    key_maps = [{k: v[k] for k in keys if k in v} if isinstance(v, dict) else {} for v in x]
    if len(keys) == 1:
        unspecified = object()
        singles = [km.get(keys[0], unspecified) for km in key_maps]
        tagged = [("unspecified",) if v is unspecified else v for v in singles]
        return [field_duplicate(f"{path}[{i}]", key_maps[i]) for i in _non_unique(tagged)]
    return [field_duplicate(f"{path}[{i}]", key_maps[i]) for i in _non_unique(key_maps)]


def has_rules(s: Any) -> bool:
    """Whether any node carries x-kubernetes-validations (then upstream builds a CEL validator)."""
    if isinstance(s, list):
        return any(has_rules(v) for v in s)
    return "x-kubernetes-validations" in _subtree(s)


def _map_list_old(s: Schema, old: JSON) -> Callable[[JSON], JSON]:
    """Correlates new items of a list-type=map with old ones by their keys; other lists do not correlate."""
    keys = [k for k in s.get("x-kubernetes-list-map-keys") or [] if isinstance(k, str)]
    if s.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
        return lambda _v: None
    index: dict[str, Any] = {}
    for o in old:
        if isinstance(o, dict):
            index.setdefault(go_json({k: o.get(k) for k in keys}), o)

    def get(v: JSON) -> JSON:
        if not isinstance(v, dict):
            return None
        return index.get(go_json({k: v.get(k) for k in keys}))

    return get


def _cel_errors(
    s: Schema | None, x: JSON, old: JSON, path: str, root: bool, skip: frozenset[str] = frozenset()
) -> list[Cause]:
    """CEL rule errors of `x`'s subtree, in upstream order; `skip`: properties of `x` not to descend into."""
    if s is None or x is None or not has_rules(s):
        return []
    errs = cel.evaluate_rules(s, x, old, path, is_resource_root=root)
    if isinstance(x, dict):
        old_map = old if isinstance(old, dict) else {}
        addl, props = _additional(s), _props(s)
        if addl is not None:
            for k, v in x.items():
                errs.extend(_cel_errors(addl, v, old_map.get(k), _path_key(path, k), False))
        for k, v in x.items():
            if k in props and k not in skip:
                errs.extend(_cel_errors(props[k], v, old_map.get(k), _join(path, k), False))
    elif isinstance(x, list):
        items = _items(s)
        if items is not None:
            old_of = _map_list_old(s, old)
            for i, v in enumerate(x):
                errs.extend(_cel_errors(items, v, old_of(v), f"{path}[{i}]", False))
    return errs


def _validate(
    schema: Schema, obj: JSON, old: JSON, root_path: str, prior: list[Cause], *, ratchet: bool = False
) -> list[Cause]:
    """Every check of a write, in upstream order. `ratchet` (a resource's update): root properties equal to the
    old object's are checked through `_Checker._remembered`, and their CEL rules are not evaluated where
    ratcheting would drop every error they can give (`_ratchet_drops_rules`)."""
    unchanged = _unchanged_roots(schema, obj, old) if ratchet and not root_path else {}
    errs = _Checker(root_path, unchanged).check(schema, obj, "")
    errs.extend(_embedded_errors(schema, obj, root_path))
    errs.extend(_list_errors(schema, obj, root_path))
    if has_rules(schema):
        if any(c.reason in _BLOCKING for c in prior + errs):
            errs.append(field_invalid("<nil>", None, _BLOCKED_MESSAGE))
        else:
            props = _props(schema)
            skip = frozenset(k for k in unchanged if _ratchet_drops_rules(props[k]))
            errs.extend(_cel_errors(schema, obj, old, root_path, not root_path, skip))
    return errs


_PLAIN_KEY = re.compile(r"[^.\[\]]+")
"""A property name that is one step of a field path (`_unchanged` reads paths back into steps)."""


def _unchanged_roots(schema: Schema, obj: JSON, old: JSON) -> dict[str, bytes]:
    """Root properties (objects and arrays) of `obj` that encode exactly as the old object's, with their
    encodings: the same JSON, so also the same to `_unchanged`, which compares Go encodings."""
    if not isinstance(obj, dict) or not isinstance(old, dict):
        return {}
    props = _props(schema)
    memo = _call_settled or {}
    out: dict[str, bytes] = {}
    for k, v in obj.items():
        if k not in old or not isinstance(props.get(k), Mapping) or not isinstance(v, dict | list):
            continue
        was = old[k]
        if not _PLAIN_KEY.fullmatch(k) or (was is not v and v != was):  # `!=` first: a changed part fails fast
            continue
        try:
            known = memo.get(id(v))
            encoding = known[1] if known is not None else msgspec.json.encode(v)
            if was is v or encoding == msgspec.json.encode(was):
                out[k] = encoding
        except (OverflowError, TypeError, ValueError):  # ints beyond 64 bits: checked as they are
            continue
    return out


_drops_cache: dict[int, tuple[Any, bool]] = {}


def _ratchet_drops_rules(s: Schema) -> bool:
    """Whether ratcheting drops every CEL error from a subtree under `s` whose value equals the old one: true
    unless a node `_unchanged` can walk to has a transition rule (those see both values and are never dropped)
    or is a list-type=map (whose items correlate by key, so a repeated key can pair an item with another).
    Errors of the other rules name a field inside the subtree, whose value equals its old one."""
    hit = _drops_cache.get(id(s))
    if hit is not None and hit[0] is s:
        return hit[1]
    children = [*_props(s).values(), _additional(s), _items(s)]
    drops = (not _transition_rule(s) and s.get("x-kubernetes-list-type") != "map"
             and all(_ratchet_drops_rules(c) for c in children if isinstance(c, Mapping)))
    if len(_drops_cache) > 50_000:  # schemas of deleted or replaced CRDs
        _drops_cache.clear()
    _drops_cache[id(s)] = (s, drops)
    return drops


_FIELD_TOKEN = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")
"""A field path's steps: `name` (a property) or `[key]` (a map key or a list index)."""


def _transition_rule(s: Schema | None) -> bool:
    for rule in (s or {}).get("x-kubernetes-validations") or ():
        try:
            if isinstance(rule, Mapping) and cel.compile_rule(str(rule.get("rule", ""))).uses_old_self:
                return True
        except ValueError:
            continue
    return False


def _unchanged(schema: Schema, new: JSON, old: JSON, field: str) -> bool:
    """Is the value a cause is about equal to its correlated old value? Values correlate through object fields
    and the keys of list-type=map items (other list items do not); a missing value is judged by its parent.
    A cause on a node with a transition rule is never judged unchanged (those rules see both values)."""
    s: Schema | None = schema
    n, o = new, old
    for name, key in [] if field in ("", "<nil>") else _FIELD_TOKEN.findall(field):
        step = name or key
        if isinstance(n, dict) and isinstance(o, dict):
            if step not in n or step not in o:
                break
            child = _props(s).get(step)
            s, n, o = child if isinstance(child, Mapping) else _additional(s), n[step], o[step]
        elif isinstance(n, list) and step.isdigit() and int(step) < len(n):
            item = n[int(step)]
            paired = _map_list_old(s, o)(item) if s is not None else None
            if paired is None:
                break
            s, n, o = _items(s), item, paired
        else:
            break
    else:
        if _transition_rule(s):
            return False
    return go_json(n) == go_json(o)


def _ratchet(schema: Schema, new: JSON, old: JSON, causes: list[Cause]) -> list[Cause]:
    """Validation ratcheting (CRDValidationRatcheting, on by default since Kubernetes 1.30): on an update, an
    error about a value equal to its old value is dropped, so an object stored before a rule tightened (or
    written past validation) can still be updated in its other parts, its status above all. When the errors
    that kept CEL rules from running are all dropped, the rules run, and are ratcheted the same way."""
    kept = [c for c in causes if _BLOCKED_MESSAGE in c.message or not _unchanged(schema, new, old, c.field)]
    blocked = [c for c in kept if _BLOCKED_MESSAGE in c.message]
    if blocked and not any(c.reason in _BLOCKING for c in kept):
        kept = [c for c in kept if c not in blocked]
        kept.extend(c for c in _cel_errors(schema, new, old, "", True) if not _unchanged(schema, new, old, c.field))
    return kept


def validate(schema: Schema, obj: Any, *, old: Any = None, root_path: str = "") -> list[Cause]:
    """Validation causes for `obj`, never raising for JSON input: OpenAPI value validations, embedded
    resources, list-type uniqueness, then CEL rules unless an earlier error blocks them, in upstream order.
    `root_path` is the field path the schema's root stands for ("" is the resource root)."""
    return _validate(schema, obj, old, root_path, [])


# ------------------------------------------------------------------------------------------------------
# The write path of a custom resource.

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def dns1123_subdomain_errors(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        errs.append(_DNS1123_SUBDOMAIN_MSG)
    return errs


def _name_causes(meta: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    generate = meta.get("generateName")
    if isinstance(generate, str) and generate:
        masked = generate[:-1] + "a" if generate.endswith("-") else generate
        causes.extend(
            field_invalid("metadata.generateName", generate, m) for m in dns1123_subdomain_errors(masked)
        )
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        causes.append(field_required("metadata.name", "name or generateName is required"))
    else:
        causes.extend(field_invalid("metadata.name", name, m) for m in dns1123_subdomain_errors(name))
    return causes


_STANDARD_FINALIZERS = frozenset({"orphan", "foregroundDeletion", "kubernetes"})


def _finalizer_warnings(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    def finalizers(o: Mapping[str, Any] | None) -> set[str]:
        meta = o.get("metadata") if o else None
        fs = meta.get("finalizers") if isinstance(meta, Mapping) else None
        return {f for f in fs if isinstance(f, str)} if isinstance(fs, list) else set()

    out = []
    for f in sorted(finalizers(obj) - finalizers(old)):
        if "/" not in f and f not in _STANDARD_FINALIZERS:
            why = "name including a path (/)" if "." in f else "name"
            out.append(
                f"metadata.finalizers: {go_quote(f)}: prefer a domain-qualified finalizer {why} "
                "to avoid accidental conflicts with other finalizer writers"
            )
    return out


def process_custom_resource(
    info: ResourceInfo, obj: dict[str, Any], *, old: dict[str, Any] | None, field_validation: str
) -> tuple[dict[str, Any], list[str]]:
    """Decode-to-storage path of a CR write: unknown fields per fieldValidation, prune, default, validate.

    Returns the object to store and the warnings for the response; raises 400 (strict decoding, wrong
    apiVersion) or 422 (validation) the way the apiserver does. List items every decode walk leaves as they
    are are walked once per distinct encoding, not once per write (`_is_settled`)."""
    global _call_settled
    outer, _call_settled = _call_settled, {}
    try:
        return _process_custom_resource(info, obj, old=old, field_validation=field_validation)
    finally:
        _call_settled = outer


def _settle_unchanged_roots(schema: Schema, body: dict[str, Any], old: dict[str, Any]) -> None:
    """Root properties an update leaves as stored (the spec of a status write) skip the decode walks when those
    leave them as they are, decided once per distinct encoding (`_is_settled`)."""
    memo = _call_settled
    if memo is None or _preserve(schema):
        return
    props = _props(schema)
    for k in _unchanged_roots(schema, body, old):
        if k not in META_FIELDS:
            _is_settled(body[k], props[k], memo)


def _process_custom_resource(
    info: ResourceInfo, obj: dict[str, Any], *, old: dict[str, Any] | None, field_validation: str
) -> tuple[dict[str, Any], list[str]]:
    options_kind = "CreateOptions" if old is None else "UpdateOptions"
    if field_validation not in ("", "Ignore", "Warn", "Strict"):
        check_field_validation([], field_validation, options_kind=options_kind)
    if not isinstance(obj, dict):
        raise bad_request(
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json, application/yaml, application/vnd.kubernetes.protobuf"
        )
    expected = info.group_version
    api_version = obj.get("apiVersion")
    if api_version is not None and api_version != expected:
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({expected})"
        )
    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise bad_request(
            f"json: cannot unmarshal {_json_type(meta) or 'value'} into Go struct field "
            "Object.metadata of type v1.ObjectMeta"
        )
    body = dict(obj)
    body.setdefault("apiVersion", expected)
    body.setdefault("kind", info.kind)
    schema: Schema = info.schema if info.schema is not None else {"type": "object", **_ANY_SCHEMA}
    if old is not None:
        _settle_unchanged_roots(schema, body, old)

    warnings = check_field_validation(
        unknown_fields(schema, body), field_validation, options_kind=options_kind
    )
    cleaned = apply_defaults(schema, prune_nulls(schema, prune(schema, body)))
    if not isinstance(cleaned.get("metadata"), dict):
        cleaned["metadata"] = {}

    causes: list[Cause] = []
    if cleaned.get("kind") != info.kind:
        causes.append(field_invalid("kind", cleaned.get("kind"), f"must be {info.kind}"))
    name_value = (cleaned.get("metadata") or {}).get("name")
    name = name_value if isinstance(name_value, str) else ""
    if not causes:
        if old is None:
            causes.extend(_name_causes(cleaned.get("metadata") or {}))
        causes.extend(_validate(schema, cleaned, old, "", causes, ratchet=old is not None))
        if causes and old is not None:
            causes = _ratchet(schema, cleaned, old, causes)
    if causes:
        raise invalid(info.kind, info.group, name, causes)
    return cleaned, warnings + _finalizer_warnings(cleaned, old)

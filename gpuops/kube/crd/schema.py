"""A CRD's structural OpenAPI v3 schema, derived from the msgspec Struct that decodes the resource.

What comes from where, as controller-gen does it for Go types:
- the field's JSON name (msgspec's `rename`/`name=`), its type (str, int, float, bool, Literal, lists/tuples,
  dicts, nested Structs, `str | int` as int-or-string; `X | None` is X, since absent and null are the same to
  a structural schema), and whether it has a default (no default: required);
- the description: `crd(description=...)`, else the docstring under the field, else the docstring of the
  field's Struct type; the root's from the resource Struct's docstring;
- everything else from `crd(...)` markers (`gpuops.kube.crd.markers`) and a Struct's `__crd_rules__`.

Kubernetes' structural-schema rules are kept by construction: every node has a type (int-or-string and
preserve-unknown nodes excepted), no `$ref`, `metadata` is a plain object. A type that cannot be expressed
raises `SchemaError` naming the Struct and field, so `make manifests` fails instead of writing a lax schema.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
import typing
from functools import cache
from typing import Any

import msgspec
import msgspec.inspect as mi

from .markers import KEY, USE_DEFAULT, CustomResource, Marker, Rule

__all__ = ["SchemaError", "description_of", "field_docs", "resource_schema", "struct_schema"]


class SchemaError(ValueError):
    """A Python type the generator cannot express as a structural schema."""


_STANDARD = {
    "apiVersion": "APIVersion defines the versioned schema of this representation of an object.",
    "kind": "Kind is a string value representing the REST resource this object represents.",
}


# ---------------------------------------------------------------------------------------------- docstrings


def _prose(doc: str) -> str:
    """A docstring as one description: lines joined into paragraphs, paragraphs kept apart."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines() if line.strip()) for p in paragraphs)


@cache
def _module_tree(module: str) -> ast.Module:
    return ast.parse(inspect.getsource(sys.modules[module]))


def _class_node(cls: type) -> ast.ClassDef:
    body: list[ast.stmt] = _module_tree(cls.__module__).body
    node: ast.ClassDef | None = None
    for part in cls.__qualname__.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            raise SchemaError(f"{cls.__module__}.{cls.__qualname__}: class source not found")
        body = node.body
    assert node is not None
    return node


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string literal right under an annotated field) by Python field name, for `cls`
    and the Structs it inherits from."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, msgspec.Struct)) or klass is msgspec.Struct:
            continue
        body = _class_node(klass).body
        for stmt, nxt in itertools.pairwise(body):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = _prose(nxt.value.value)
    return docs


def description_of(cls: type) -> str | None:
    """The Struct's own docstring as a description (not an inherited one: a base's doc describes the base)."""
    doc = cls.__dict__.get("__doc__")
    return _prose(doc) if isinstance(doc, str) and doc.strip() else None


# ---------------------------------------------------------------------------------------------- types


def _unwrap(t: mi.Type) -> tuple[mi.Type, Marker | None, str | None]:
    """The type under `Annotated[...]` layers, the `crd(...)` marker and a `Meta(description=...)` if any."""
    marker: Marker | None = None
    description: str | None = None
    while isinstance(t, mi.Metadata):
        found = (t.extra or {}).get(KEY)
        if isinstance(found, Marker):
            marker = found
        described = (t.extra_json_schema or {}).get("description")
        if isinstance(described, str):
            description = described
        t = t.type
    return t, marker, description


def _non_null(t: mi.Type, where: str) -> mi.Type:
    if not isinstance(t, mi.UnionType):
        return t
    options = [o for o in t.types if not isinstance(o, mi.NoneType)]
    kinds = {type(_unwrap(o)[0]) for o in options}
    if len(options) == 1:
        return options[0]
    if kinds == {mi.IntType, mi.StrType}:
        return t  # int-or-string, handled by the caller
    raise SchemaError(f"{where}: a union of {', '.join(k.__name__ for k in kinds)} has no structural schema "
                      "(use one type, or str | int for int-or-string)")


def _scalar(t: mi.Type) -> dict[str, Any] | None:
    if isinstance(t, mi.StrType):
        out: dict[str, Any] = {"type": "string"}
        for key, value in (("minLength", t.min_length), ("maxLength", t.max_length), ("pattern", t.pattern)):
            if value is not None:
                out[key] = value
        return out
    if isinstance(t, mi.BoolType):
        return {"type": "boolean"}
    if isinstance(t, mi.IntType | mi.FloatType):
        out = {"type": "integer" if isinstance(t, mi.IntType) else "number"}
        if t.ge is not None:
            out["minimum"] = t.ge
        if t.le is not None:
            out["maximum"] = t.le
        return out
    if isinstance(t, mi.LiteralType):
        values = list(t.values)
        if all(isinstance(v, str) for v in values):
            return {"type": "string", "enum": values}
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return {"type": "integer", "enum": values}
    return None


def type_schema(t: mi.Type, where: str, marker: Marker | None = None) -> dict[str, Any]:
    """The schema of a value of type `t` (`where` names it in errors), with `marker`'s keys applied."""
    t = _non_null(t, where)
    if isinstance(t, mi.UnionType):
        out: dict[str, Any] = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    elif (scalar := _scalar(t)) is not None:
        out = scalar
    elif isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        item, item_marker, item_doc = _unwrap(t.item_type)
        out = {"type": "array", "items": _described(type_schema(item, f"{where}[]", item_marker or _items(marker)),
                                                    item_doc or _type_doc(item))}
    elif isinstance(t, mi.DictType):
        key = _unwrap(t.key_type)[0]
        if not isinstance(key, mi.StrType):
            raise SchemaError(f"{where}: map keys must be strings")
        value, value_marker, value_doc = _unwrap(t.value_type)
        out = {"type": "object", "additionalProperties": _described(
            type_schema(value, f"{where}{{}}", value_marker or _items(marker)), value_doc or _type_doc(value))}
    elif isinstance(t, mi.StructType):
        out = struct_schema(t)
    elif isinstance(t, mi.AnyType):
        out = {"x-kubernetes-preserve-unknown-fields": True}
    else:
        raise SchemaError(f"{where}: {type(t).__name__} has no structural schema")
    if marker is not None:
        extra = marker.openapi()
        rules = [*out.get("x-kubernetes-validations", ()), *extra.pop("x-kubernetes-validations", ())]
        out.update(extra)
        if rules:  # the type's own rules and the field's both hold
            out["x-kubernetes-validations"] = rules
    return out


def _items(marker: Marker | None) -> Marker | None:
    return marker.items if marker is not None else None


def _type_doc(t: mi.Type) -> str | None:
    t = _unwrap(t)[0]
    if isinstance(t, mi.UnionType):
        options = [o for o in t.types if not isinstance(o, mi.NoneType)]
        t = _unwrap(options[0])[0] if len(options) == 1 else t
    return description_of(t.cls) if isinstance(t, mi.StructType) else None


def _described(schema: dict[str, Any], description: str | None) -> dict[str, Any]:
    """`schema` with its description first (the order `kubectl explain` readers scan in)."""
    if not description:
        return schema
    return {"description": description, **{k: v for k, v in schema.items() if k != "description"}}


def _default(field: mi.Field, marker: Marker) -> Any:
    if marker.default is not USE_DEFAULT:
        return marker.default
    if field.default is not msgspec.NODEFAULT:
        value = field.default
    elif field.default_factory is not msgspec.NODEFAULT:
        value = field.default_factory()
    else:
        raise SchemaError(f"{field.name}: crd(default=USE_DEFAULT) on a field without a default")
    return msgspec.to_builtins(value)


def field_schema(owner: type, field: mi.Field) -> tuple[dict[str, Any], bool]:
    """A field's schema and whether the API server requires it."""
    where = f"{owner.__qualname__}.{field.name}"
    t, marker, meta_doc = _unwrap(field.type)
    schema = type_schema(t, where, marker)
    if marker is not None and marker.default is not None:
        schema["default"] = _default(field, marker)
    doc = (marker.description if marker is not None else None) or meta_doc or field_docs(owner).get(field.name)
    required = field.required or (marker is not None and marker.required)
    declared = _literal_order(owner, field.name)
    if declared and sorted(map(str, schema.get("enum") or ())) == sorted(map(str, declared)):
        schema["enum"] = list(declared)  # msgspec sorts a Literal's values; users read them in declared order
    return _described(schema, doc or _type_doc(t)), required


def _literal_order(owner: type, name: str) -> tuple[Any, ...]:
    """The values of the first Literal in a field's annotation, in the order they were written."""
    stack: list[Any] = [typing.get_type_hints(owner, include_extras=True).get(name)]
    while stack:
        hint = stack.pop(0)
        if typing.get_origin(hint) is typing.Literal:
            return typing.get_args(hint)
        stack.extend(typing.get_args(hint))
    return ()


def struct_schema(t: mi.StructType) -> dict[str, Any]:
    """An object schema with one property per field, in declaration order."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in t.fields:
        properties[field.encode_name], needed = field_schema(t.cls, field)
        if needed:
            required.append(field.encode_name)
    out: dict[str, Any] = {"type": "object"}
    if required:
        out["required"] = required
    rules: tuple[Rule, ...] = getattr(t.cls, "__crd_rules__", ())
    if rules:
        out["x-kubernetes-validations"] = [r.to_schema() for r in rules]
    out["properties"] = properties
    return out


def resource_schema(resource: CustomResource) -> dict[str, Any]:
    """The `openAPIV3Schema` of a custom resource: apiVersion, kind, metadata, then the Struct's own fields."""
    struct = resource.resource.struct
    info = mi.type_info(struct)
    if not isinstance(info, mi.StructType):
        raise SchemaError(f"{resource.resource.kind}: not a Struct")
    schema = struct_schema(info)
    own = {k: v for k, v in schema["properties"].items() if k != "metadata"}
    properties: dict[str, Any] = {k: {"description": d, "type": "string"} for k, d in _STANDARD.items()}
    properties["metadata"] = {"type": "object"}
    properties.update(own)
    schema["properties"] = properties
    schema.setdefault("required", [])
    schema["required"] = [r for r in schema["required"] if r != "metadata"] or None
    if schema["required"] is None:
        del schema["required"]
    return _described(schema, description_of(struct))

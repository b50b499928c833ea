"""What a CRD schema needs beyond a field's Python type, written beside the field.

The msgspec Structs of a controller's `api.py` are its API; the CRD's OpenAPI schema is generated from them
(`gpuops.kube.crd.schema`). A field's type gives the schema's `type`, `items`, `properties` and nesting, its
docstring the description; `crd(...)` adds the rest (required, defaults, bounds, patterns, list and map
semantics, CEL rules) the way controller-gen's `+kubebuilder` markers do for Go types.

The markers travel in `msgspec.Meta(extra=...)`, which msgspec keeps for introspection but never checks while
decoding: an object the API server admitted under an older schema still decodes, and a bound the controller
must enforce is checked by its own `check_spec`/`parse_spec` with an error that names the field.

    window_hours: Annotated[int, crd(required=True, minimum=1, maximum=8784)] = 0
    \"\"\"Length of the rolling window in hours.\"\"\"

Rules on a whole object (cross-field CEL) sit on its Struct as `__crd_rules__: ClassVar[tuple[Rule, ...]]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

if TYPE_CHECKING:
    from ..resources import ResourceType

__all__ = ["KEY", "USE_DEFAULT", "Column", "CustomResource", "Marker", "Rule", "crd"]

KEY: Final = "gpuops.io/crd"
"""The key of `msgspec.Meta.extra` that holds a field's `Marker`."""


class _UseDefault:
    def __repr__(self) -> str:
        return "USE_DEFAULT"


USE_DEFAULT: Final = _UseDefault()
"""`crd(default=USE_DEFAULT)`: publish the Struct field's own default as the schema default (one value, one
place), encoded as the API server would store it."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One `x-kubernetes-validations` entry: a CEL expression and the message a refused user reads."""

    rule: str
    message: str = ""
    reason: Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"] | None = (
        None
    )
    field_path: str | None = None
    message_expression: str | None = None

    def to_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule}
        if self.message:
            out["message"] = self.message
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        if self.reason:
            out["reason"] = self.reason
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


@dataclass(frozen=True, slots=True)
class Marker:
    """Schema facts about one field that its Python type cannot carry (see `crd`)."""

    description: str | None = None
    required: bool = False
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    enum: tuple[str, ...] | None = None
    format: str | None = None
    min_items: int | None = None
    max_items: int | None = None
    min_properties: int | None = None
    max_properties: int | None = None
    list_type: Literal["atomic", "set", "map"] | None = None
    list_map_keys: tuple[str, ...] | None = None
    map_type: Literal["atomic", "granular"] | None = None
    rules: tuple[Rule, ...] = ()
    items: Marker | None = None
    """Markers of a list's items or a map's values (e.g. a pattern every element must match)."""

    def openapi(self) -> dict[str, Any]:
        """The plain OpenAPI keys this marker sets (description, default and items are placed by the caller)."""
        out: dict[str, Any] = {}
        for key, value in (
            ("format", self.format),
            ("enum", list(self.enum) if self.enum is not None else None),
            ("minimum", self.minimum),
            ("maximum", self.maximum),
            ("minLength", self.min_length),
            ("maxLength", self.max_length),
            ("pattern", self.pattern),
            ("minItems", self.min_items),
            ("maxItems", self.max_items),
            ("minProperties", self.min_properties),
            ("maxProperties", self.max_properties),
            ("x-kubernetes-list-type", self.list_type),
            ("x-kubernetes-list-map-keys", list(self.list_map_keys) if self.list_map_keys else None),
            ("x-kubernetes-map-type", self.map_type),
        ):
            if value is not None:
                out[key] = value
        if self.rules:
            out["x-kubernetes-validations"] = [r.to_schema() for r in self.rules]
        return out


def crd(
    *,
    description: str | None = None,
    required: bool = False,
    default: Any = None,
    minimum: int | None = None,
    maximum: int | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
    enum: Sequence[str] | None = None,
    format: str | None = None,
    min_items: int | None = None,
    max_items: int | None = None,
    min_properties: int | None = None,
    max_properties: int | None = None,
    list_type: Literal["atomic", "set", "map"] | None = None,
    list_map_keys: Sequence[str] | None = None,
    map_type: Literal["atomic", "granular"] | None = None,
    rules: Sequence[Rule] = (),
    items: Marker | None = None,
) -> msgspec.Meta:
    """Schema markers for one field, for `Annotated[T, crd(...)]`.

    `required` marks a field the API server must refuse to store without (the Struct keeps a default so that
    decoding never fails on an old object); `default` is the value the API server fills in (`USE_DEFAULT`: the
    field's own default); `description` overrides the field's docstring (use it where the field's type is a
    shared Struct whose own docstring would be too general)."""
    return msgspec.Meta(extra={KEY: marker(
        description=description, required=required, default=default, minimum=minimum, maximum=maximum,
        min_length=min_length, max_length=max_length, pattern=pattern, enum=enum, format=format,
        min_items=min_items, max_items=max_items, min_properties=min_properties, max_properties=max_properties,
        list_type=list_type, list_map_keys=list_map_keys, map_type=map_type, rules=rules, items=items,
    )})


def marker(**kwargs: Any) -> Marker:
    """A `Marker` with sequences frozen to tuples (markers are shared between fields and must not change)."""
    for key in ("enum", "list_map_keys", "rules"):
        if kwargs.get(key) is not None:
            kwargs[key] = tuple(kwargs[key])
    return Marker(**kwargs)


@dataclass(frozen=True, slots=True)
class Column:
    """One `additionalPrinterColumns` entry: what `kubectl get` shows."""

    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    description: str = ""
    priority: int = 0
    format: str | None = None

    def to_crd(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.format:
            out["format"] = self.format
        if self.priority:
            out["priority"] = self.priority
        if self.description:
            out["description"] = self.description
        out["jsonPath"] = self.json_path
        return out


@dataclass(frozen=True, slots=True)
class CustomResource:
    """Everything a CRD says besides the schema: the resource (group, version, names, scope, Struct), short names,
    categories, printer columns. The schema comes from `resource.struct`."""

    resource: ResourceType[Any]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = True
    columns: tuple[Column, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.resource.plural}.{self.resource.group}"

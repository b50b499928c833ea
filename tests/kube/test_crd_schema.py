"""The schema generator: each Python type and marker becomes the structural-schema node Kubernetes expects, and
what has no structural form is refused instead of written loosely."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
import msgspec.inspect as mi
import pytest

from gpuops.kube.crd import USE_DEFAULT, Column, CustomResource, Rule, SchemaError, crd, crd_manifest, render
from gpuops.kube.crd.markers import marker
from gpuops.kube.crd.schema import struct_schema
from gpuops.kube.objects import ObjectMeta
from gpuops.kube.resources import ResourceType


class _Api(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """A base whose docstring must not become its subclasses' description."""


class Inner(_Api):
    """What an inner object holds."""

    __crd_rules__: ClassVar[tuple[Rule, ...]] = (Rule("self.low <= self.high", "low must be <= high"),)

    low: int = 0
    high: int = 0


class Sample(_Api):
    """A sample resource.

    Its second paragraph stays a paragraph."""

    name: Annotated[str, crd(required=True, min_length=1, max_length=63, pattern="^[a-z]+$")] = ""
    """The name,
    on two lines."""
    count: Annotated[int, crd(default=USE_DEFAULT, minimum=1, maximum=10)] = 3
    ratio: float = 0.0
    enabled: bool = False
    mode: Literal["Zeta", "Alpha", "Mid"] = "Zeta"
    """Declared order is kept."""
    amount: str | int | None = None
    when: Annotated[str | None, crd(format="date-time")] = None
    tags: Annotated[dict[str, str] | None, crd(max_properties=4, items=marker(max_length=8))] = None
    names: Annotated[tuple[str, ...], crd(list_type="set", items=marker(min_length=1))] = ()
    inner: Inner | None = None
    inners: Annotated[tuple[Inner, ...], crd(list_type="map", list_map_keys=("low",))] = ()
    nested: Annotated[Inner, crd(default=USE_DEFAULT, description="Overrides the type's docstring.",
                                 rules=(Rule("self.high < 100", "high must be below 100"),))] = (
        msgspec.field(default_factory=Inner))
    anything: Any = None
    renamed: str = msgspec.field(default="", name="renamedField")


class Root(_Api):
    """The root."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: Annotated[Sample, crd(required=True)] = msgspec.field(default_factory=Sample)
    status: Inner = msgspec.field(default_factory=Inner)


RESOURCE = CustomResource(ResourceType("example.com", "v1", "roots", "Root", True, Root), short_names=("rt",),
                          columns=(Column("Name", "string", ".spec.name", "The name."),))


def schema() -> dict[str, Any]:
    info = mi.type_info(Sample)
    assert isinstance(info, mi.StructType)
    return struct_schema(info)


def test_scalars_markers_and_descriptions() -> None:
    props = schema()["properties"]
    assert props["name"] == {"description": "The name, on two lines.", "type": "string", "minLength": 1,
                             "maxLength": 63, "pattern": "^[a-z]+$"}
    assert props["count"] == {"type": "integer", "default": 3, "minimum": 1, "maximum": 10}
    assert props["ratio"] == {"type": "number"}
    assert props["enabled"] == {"type": "boolean"}
    assert props["mode"] == {"description": "Declared order is kept.", "type": "string",
                             "enum": ["Zeta", "Alpha", "Mid"]}
    assert props["amount"] == {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    assert props["when"] == {"type": "string", "format": "date-time"}
    assert props["anything"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert "renamedField" in props and "renamed" not in props


def test_collections_objects_and_rules() -> None:
    s = schema()
    props = s["properties"]
    assert s["required"] == ["name"]
    assert props["tags"] == {"type": "object", "additionalProperties": {"type": "string", "maxLength": 8},
                             "maxProperties": 4}
    assert props["names"] == {"type": "array", "items": {"type": "string", "minLength": 1},
                              "x-kubernetes-list-type": "set"}
    inner = props["inner"]
    assert inner["description"] == "What an inner object holds."
    assert inner["x-kubernetes-validations"] == [{"rule": "self.low <= self.high", "message": "low must be <= high"}]
    assert inner["properties"] == {"low": {"type": "integer"}, "high": {"type": "integer"}}
    assert props["inners"]["items"]["description"] == "What an inner object holds."
    assert props["inners"]["x-kubernetes-list-map-keys"] == ["low"]
    assert props["nested"]["description"] == "Overrides the type's docstring."
    assert props["nested"]["default"] == {}
    assert props["nested"]["x-kubernetes-validations"] == [  # the type's rules and the field's
        {"rule": "self.low <= self.high", "message": "low must be <= high"},
        {"rule": "self.high < 100", "message": "high must be below 100"}]


def test_the_manifest_has_names_columns_status_and_a_plain_metadata() -> None:
    crd_doc = crd_manifest(RESOURCE)
    assert crd_doc["metadata"]["name"] == "roots.example.com"
    assert crd_doc["spec"]["names"] == {"plural": "roots", "singular": "root", "kind": "Root", "listKind": "RootList",
                                        "shortNames": ["rt"]}
    version = crd_doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"] == [
        {"name": "Name", "type": "string", "description": "The name.", "jsonPath": ".spec.name"}]
    root = version["schema"]["openAPIV3Schema"]
    assert root["description"] == "The root."
    assert list(root["properties"])[:3] == ["apiVersion", "kind", "metadata"]
    assert root["properties"]["metadata"] == {"type": "object"}
    assert root["required"] == ["spec"]
    text = render(RESOURCE, "tests/kube/test_crd_schema.py")
    assert text.startswith("# Root (example.com/v1). Generated from tests/kube/test_crd_schema.py")
    assert "A base whose docstring" not in text


def test_a_paragraph_break_survives() -> None:
    info = mi.type_info(Root)
    assert isinstance(info, mi.StructType)
    spec = struct_schema(info)["properties"]["spec"]
    assert spec["description"] == "A sample resource.\n\nIts second paragraph stays a paragraph."


class Mixed(_Api):
    value: str | bool = ""


class Floaty(_Api):
    value: str | int | float = ""


@pytest.mark.parametrize("cls", [Mixed, Floaty])
def test_a_union_without_structural_form_is_refused_naming_the_field(cls: type[msgspec.Struct]) -> None:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    with pytest.raises(SchemaError, match=f"{cls.__name__}.value"):
        struct_schema(info)


def test_markers_do_not_validate_while_decoding() -> None:
    """An object stored under an older, looser schema still decodes: bounds are the API server's to enforce."""
    got = msgspec.json.decode(b'{"name": "", "count": 99, "mode": "Zeta"}', type=Sample)
    assert got.count == 99 and got.name == ""

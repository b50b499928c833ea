"""Every field of every CRD in manifests/crds has a description: `kubectl explain` and the README's configuration
reference (tests/readme_sections.py) are generated from them, so a field without one is undocumented.

Checked at every depth of spec and status (and any other top-level property besides apiVersion, kind and
metadata): object properties, the properties of array items and of map values, and the item schema itself when
the items are objects with properties.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

CRDS = Path(__file__).resolve().parents[1] / "manifests" / "crds"
CRD_FILES = sorted(CRDS.glob("*.yaml"))
STANDARD = frozenset({"apiVersion", "kind", "metadata"})
"""Top-level fields every object has (Kubernetes documents them): not required here."""


def _described(schema: Mapping[str, Any]) -> bool:
    text = schema.get("description")
    return isinstance(text, str) and bool(text.strip())


def _children(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The schemas nested in `schema` whose description is required, with their paths (`a.b[].c`, `a.b{}.c`)."""
    for name, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, Mapping):
            yield f"{path}.{name}" if path else name, sub
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        sub = schema.get(key)
        if isinstance(sub, Mapping) and sub.get("properties"):
            yield path + suffix, sub


def undescribed(schema: Mapping[str, Any], path: str = "", *, top: bool = True) -> list[str]:
    """Paths of the fields under `schema` without a non-empty description (the root itself is not checked)."""
    missing: list[str] = []
    for child_path, sub in _children(schema, path):
        if top and child_path in STANDARD:
            continue
        if not _described(sub):
            missing.append(child_path)
        missing.extend(undescribed(sub, child_path, top=False))
    return missing


def field_count(schema: Mapping[str, Any], path: str = "") -> int:
    return sum(1 + field_count(sub, child) for child, sub in _children(schema, path))


def _versions(path: Path) -> list[tuple[str, Mapping[str, Any]]]:
    crd = yaml.safe_load(path.read_text())
    assert crd.get("kind") == "CustomResourceDefinition", f"{path.name} is not a CRD"
    return [(str(v["name"]), v["schema"]["openAPIV3Schema"]) for v in crd["spec"]["versions"]]


def test_there_are_crds() -> None:
    assert len(CRD_FILES) >= 5, f"expected the gpuops CRDs in {CRDS}"


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: p.name)
def test_every_field_has_a_description(path: Path) -> None:
    for version, schema in _versions(path):
        assert field_count(schema) > len(STANDARD), f"{path.name} {version}: the schema has no fields"
        missing = undescribed(schema)
        assert not missing, (f"{path.name} {version}: {len(missing)} field(s) without a description: "
                             + ", ".join(missing))


def test_the_check_finds_missing_descriptions() -> None:
    """The walker reaches nested objects, array items, map values and conditions, and skips only the
    standard top-level fields."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "description": "x", "properties": {
                "a": {"type": "string", "description": "x"},
                "b": {"type": "string", "description": "  "},
                "c": {"type": "object", "description": "x", "properties": {"d": {"type": "integer"}}},
                "m": {"type": "object", "description": "x", "additionalProperties": {
                    "type": "object", "description": "x", "properties": {"v": {"type": "string"}}}},
            }},
            "status": {"type": "object", "properties": {
                "conditions": {"type": "array", "description": "x", "items": {
                    "type": "object", "properties": {"type": {"type": "string"},
                                                     "reason": {"type": "string", "description": "x"}}}},
                "ids": {"type": "array", "description": "x", "items": {"type": "string"}},
            }},
        },
    }
    assert undescribed(schema) == [
        "spec.b", "spec.c.d", "spec.m{}.v", "status", "status.conditions[]", "status.conditions[].type",
    ]
    assert undescribed({"properties": {"spec": {"properties": {"metadata": {"type": "object"}}}}}) == [
        "spec", "spec.metadata",  # only the top-level metadata is exempt
    ]

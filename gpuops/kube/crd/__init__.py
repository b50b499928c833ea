"""CRDs generated from msgspec Structs: markers beside the fields, the schema walk, the manifest writer."""

from .manifest import crd_manifest, render
from .markers import USE_DEFAULT, Column, CustomResource, Marker, Rule, crd
from .schema import SchemaError, resource_schema

__all__ = ["USE_DEFAULT", "Column", "CustomResource", "Marker", "Rule", "SchemaError", "crd", "crd_manifest",
           "render", "resource_schema"]

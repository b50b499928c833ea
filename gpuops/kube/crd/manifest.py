"""A CustomResourceDefinition manifest (dict and YAML text) from a `CustomResource` declaration.

The YAML is the installed artifact (`kubectl apply -k manifests`), so it must be stable byte for byte: keys in
a fixed order, long descriptions folded at one width, a header that says where it comes from.
"""

from __future__ import annotations

from typing import Any

from .markers import CustomResource
from .schema import resource_schema

__all__ = ["crd_manifest", "render"]

WIDTH = 110


def crd_manifest(resource: CustomResource) -> dict[str, Any]:
    rt = resource.resource
    names: dict[str, Any] = {
        "plural": rt.plural, "singular": rt.kind.lower(), "kind": rt.kind, "listKind": rt.list_kind,
    }
    if resource.short_names:
        names["shortNames"] = list(resource.short_names)
    if resource.categories:
        names["categories"] = list(resource.categories)
    version: dict[str, Any] = {"name": rt.version, "served": True, "storage": True}
    if resource.status_subresource:
        version["subresources"] = {"status": {}}
    if resource.columns:
        version["additionalPrinterColumns"] = [c.to_crd() for c in resource.columns]
    version["schema"] = {"openAPIV3Schema": resource_schema(resource)}
    metadata: dict[str, Any] = {"name": resource.name}
    if resource.labels:
        metadata["labels"] = dict(resource.labels)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {
            "group": rt.group,
            "scope": "Namespaced" if rt.namespaced else "Cluster",
            "names": names,
            "versions": [version],
        },
    }


def render(resource: CustomResource, source: str) -> str:
    """The manifest as YAML, headed by a comment naming `source` (the module to edit instead)."""
    import yaml  # a dependency of kubernetes-asyncio; only `make manifests` and tests render

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    body = yaml.dump(crd_manifest(resource), Dumper=_Dumper, sort_keys=False, width=WIDTH, allow_unicode=True,
                     default_flow_style=False)
    rt = resource.resource
    header = (f"# {rt.kind} ({rt.api_version}). Generated from {source} by "
              "`make manifests`:\n# edit the types there, not this file.\n")
    return header + body

"""Resource descriptors: where a kind lives in the API and which model decodes it.

A `ResourceType` is the single value passed around instead of (group, version, plural, kind, struct) tuples,
so a typo in a path cannot slip in at one call site, and `Client.get(PODS, ...)` is typed `Pod`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from . import objects

T = TypeVar("T")
U = TypeVar("U")

__all__ = [
    "CONFIGMAPS",
    "EVENTS",
    "JOBS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PDBS",
    "PODS",
    "SECRETS",
    "ResourceType",
]


def _segment(value: str) -> str:
    # Names are DNS-ish but RBAC names carry ':' and user input may carry anything; never let it add a '/'.
    return quote(value, safe=":@")


@dataclass(frozen=True)
class ResourceType(Generic[T]):
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    struct: type[T]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The URL path; `namespace` None on a namespaced type means all namespaces (lists and watches only).

        A namespace given for a cluster-scoped type is ignored, as client-go's typed clients do.
        """
        if subresource and not name:
            raise ValueError(f"{self.plural}: a subresource ({subresource}) needs an object name")
        if self.namespaced and name and not namespace:
            raise ValueError(f"{self.plural} are namespaced: {name!r} needs a namespace")
        parts = ["/api/" + self.version if not self.group else f"/apis/{self.group}/{self.version}"]
        if self.namespaced and namespace:
            parts.append("namespaces/" + _segment(namespace))
        parts.append(self.plural)
        if name:
            parts.append(_segment(name))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    def key(self, obj: Any) -> str:
        """"namespace/name" or "name" (client-go's MetaNamespaceKeyFunc) of a model or a JSON-shaped object."""
        if isinstance(obj, Mapping):
            meta = obj.get("metadata") or {}
            name, namespace = meta.get("name", ""), meta.get("namespace", "")
        else:
            meta = obj.metadata
            name, namespace = meta.name, meta.namespace
        return f"{namespace}/{name}" if namespace else str(name)

    def typed(self, struct: type[U]) -> ResourceType[U]:
        """The same resource decoded into another model (e.g. `objects.PartialObjectMetadata`, a custom one)."""
        return dataclasses.replace(self, struct=struct)  # type: ignore[arg-type,return-value]


PODS = ResourceType("", "v1", "pods", "Pod", True, objects.Pod)
NODES = ResourceType("", "v1", "nodes", "Node", False, objects.Node)
EVENTS = ResourceType("", "v1", "events", "Event", True, objects.Event)
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", False, objects.Namespace)
CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True, objects.ConfigMap)
SECRETS = ResourceType("", "v1", "secrets", "Secret", True, objects.Secret)
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, objects.Lease)
PDBS = ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, objects.PodDisruptionBudget)
JOBS = ResourceType("batch", "v1", "jobs", "Job", True, objects.Job)

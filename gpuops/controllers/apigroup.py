"""The gpuops.io API group, to which every controller's custom resources belong, and what their declarations share.

Each controller's api.py states the facts of its own kinds: their fields, plural, kind, scope, short names and
printer columns. What is the same for every kind is stated here once, so that no kind can drift from the others:
the group and version; the JSON conventions of the types; the top-level object's metadata; the CRD defaults (the
category `gpuops`, so `kubectl get gpuops` lists them all, the part-of label, and the Age column last, as kubectl
shows it for kinds without printer columns); the GPU resource a kind counts unless its spec names another.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import msgspec

from gpuops.kube.crd import Column, CustomResource
from gpuops.kube.objects import ObjectMeta
from gpuops.kube.resources import ResourceType

__all__ = [
    "API_VERSION", "DEFAULT_RESOURCE", "GROUP", "MIG_RESOURCE_PREFIXES", "NVIDIA_MIG_PREFIX", "OUR_MIG_PREFIX",
    "VERSION", "ApiStruct", "CustomObject", "custom_resource", "resource_type",
]

T = TypeVar("T")

GROUP: Final = "gpuops.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
DEFAULT_RESOURCE: Final = "nvidia.com/gpu"
"""The extended resource pods request whole GPUs as: a kind's spec.gpuResourceName (or its template's) when unset."""
NVIDIA_MIG_PREFIX: Final = "nvidia.com/mig-"
"""What workloads ask MIG slices as (NVIDIA's mixed strategy names, e.g. nvidia.com/mig-1g.10gb)."""
OUR_MIG_PREFIX: Final = "gpuops.io/mig-"
"""What the MIG slicer's webhook renames such a request to, so only slices this operator made can satisfy it."""
MIG_RESOURCE_PREFIXES: Final = (NVIDIA_MIG_PREFIX, OUR_MIG_PREFIX)

CATEGORIES: Final = ("gpuops",)
LABELS: Final = {"app.kubernetes.io/part-of": "gpuops"}
AGE: Final = Column("Age", "date", ".metadata.creationTimestamp")


class ApiStruct(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Base of the CRD types: camelCase JSON, defaults left out, every field optional when decoding."""


class CustomObject(ApiStruct):
    """Base of a top-level custom object: the API server's metadata (the CRD schema leaves it a plain object);
    each kind adds its spec and status."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


def resource_type(plural: str, kind: str, namespaced: bool, struct: type[T]) -> ResourceType[T]:
    """The kind `kind` of this group and version, served as `plural`, decoded into `struct`."""
    return ResourceType(GROUP, VERSION, plural, kind, namespaced, struct)


def custom_resource(resource: ResourceType[Any], *columns: Column, short_names: tuple[str, ...] = ()) -> CustomResource:
    """The CRD of `resource`, showing `columns` and then Age, with the group's category and labels."""
    return CustomResource(resource, short_names=short_names, categories=CATEGORIES, labels=dict(LABELS),
                          columns=(*columns, AGE))

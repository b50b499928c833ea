"""Structural OpenAPI v3 schemas of built-in kinds, derived from the kubernetes_asyncio model classes.

The generated models already carry every field name and type of the upstream API, so deriving the schema
at run time keeps us in step with the client library instead of hand-maintaining a copy of the spec.
The schemas serve OpenAPI publishing (kubectl validation, explain, strategic-merge-patch metadata) and
field validation of built-in objects.

Fields that the models can only describe loosely get upstream-like refinements:

* IntOrString (models say ``object``): ``ServicePort.targetPort``, ``HTTPGetAction.port``,
  ``TCPSocketAction.port``, ``PodDisruptionBudgetSpec.minAvailable/maxUnavailable``,
  ``RollingUpdateDeployment.maxSurge/maxUnavailable``, ``RollingUpdateDaemonSet.maxSurge/maxUnavailable``,
  ``RollingUpdateStatefulSetStrategy.maxUnavailable``, ``NetworkPolicyPort.port``
  -> ``x-kubernetes-int-or-string``.
* Quantity (models say ``str``): resource limits/requests, node capacity/allocatable, pod overhead,
  allocated resources, ``emptyDir.sizeLimit``, ``resourceFieldRef.divisor`` -> upstream's
  ``oneOf: [string, number]`` plus ``x-kubernetes-preserve-unknown-fields`` so that validators that only
  understand ``type`` accept ``nvidia.com/gpu: 1`` and ``cpu: 0.5`` as the real apiserver does.
* Base64 byte fields (``Secret.data``, ``ConfigMap.binaryData``, ``caBundle``) -> ``format: byte``.
* Other ``object`` fields (RawExtension, FieldsV1, JSON) -> ``x-kubernetes-preserve-unknown-fields``.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from typing import Any

from gpuops_sim.apiserver.resources import ResourceInfo

ListStrategy = Callable[[str, str, tuple[str, ...]], tuple[str | None, str | None]]

# (model class, python attribute); "*" matches any class.
_INT_OR_STRING = frozenset(
    {
        ("V1ServicePort", "target_port"),
        ("V1HTTPGetAction", "port"),
        ("V1TCPSocketAction", "port"),
        ("V1PodDisruptionBudgetSpec", "min_available"),
        ("V1PodDisruptionBudgetSpec", "max_unavailable"),
        ("V1RollingUpdateDeployment", "max_surge"),
        ("V1RollingUpdateDeployment", "max_unavailable"),
        ("V1RollingUpdateDaemonSet", "max_surge"),
        ("V1RollingUpdateDaemonSet", "max_unavailable"),
        ("V1RollingUpdateStatefulSetStrategy", "max_unavailable"),
        ("V1NetworkPolicyPort", "port"),
    }
)
_QUANTITY = frozenset(
    {
        ("V1ResourceRequirements", "limits"),
        ("V1ResourceRequirements", "requests"),
        ("V1VolumeResourceRequirements", "limits"),
        ("V1VolumeResourceRequirements", "requests"),
        ("V1PodSpec", "overhead"),
        ("V1PodStatus", "allocated_resources"),
        ("V1ContainerStatus", "allocated_resources"),
        ("V1NodeStatus", "allocatable"),
        ("V1NodeStatus", "capacity"),
        ("V1NodeAllocatableResourceClaimStatus", "resources"),
        ("V1PersistentVolumeClaimStatus", "capacity"),
        ("V1PersistentVolumeClaimStatus", "allocated_resources"),
        ("V1ResourceQuotaSpec", "hard"),
        ("V1ResourceQuotaStatus", "hard"),
        ("V1ResourceQuotaStatus", "used"),
        ("V1EmptyDirVolumeSource", "size_limit"),
        ("V1ResourceFieldSelector", "divisor"),
    }
)
_BYTES = frozenset({("V1Secret", "data"), ("V1ConfigMap", "binary_data"), ("*", "ca_bundle")})

_PRIMITIVES: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer", "format": "int64"},
    "float": {"type": "number", "format": "double"},
    "bool": {"type": "boolean"},
    "datetime": {"type": "string", "format": "date-time"},
    "date": {"type": "string", "format": "date"},
    "object": {"x-kubernetes-preserve-unknown-fields": True},
}
_INT_OR_STRING_SCHEMA: dict[str, Any] = {"x-kubernetes-int-or-string": True, "format": "int-or-string"}

_LIST_RE = re.compile(r"^list\[(.*)\]$")
_DICT_RE = re.compile(r"^dict\(str, (.*)\)$")


def _models() -> Any:
    import kubernetes_asyncio.client.models as models

    return models


def model_name(group: str, version: str, kind: str) -> str | None:
    """The kubernetes_asyncio class of a kind: group-qualified names win (``CoreV1Event``), else ``V1Pod``."""
    models = _models()
    ver = version[:1].upper() + version[1:]
    prefix = "Core" if not group else group.split(".")[0].capitalize()
    for name in (f"{prefix}{ver}{kind}", f"{ver}{kind}"):
        if isinstance(getattr(models, name, None), type) and hasattr(getattr(models, name), "openapi_types"):
            return name
    return None


class _Builder:
    """One walk over a kind's model tree; the stack breaks the recursion of JSONSchemaProps."""

    def __init__(self, group: str, kind: str, list_strategy: ListStrategy | None) -> None:
        self.group = group
        self.kind = kind
        self.list_strategy = list_strategy
        self.models = _models()
        self.stack: list[str] = []

    def model(self, name: str, path: tuple[str, ...]) -> dict[str, Any]:
        if name in self.stack:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        cls = getattr(self.models, name)
        self.stack.append(name)
        props: dict[str, Any] = {}
        for attr, type_str in cls.openapi_types.items():
            json_name = cls.attribute_map[attr]
            props[json_name] = self.field(name, attr, type_str, (*path, json_name))
        self.stack.pop()
        return {"type": "object", "properties": props}

    def field(self, cls: str, attr: str, type_str: str, path: tuple[str, ...]) -> dict[str, Any]:
        if type_str == "object" and (cls, attr) in _INT_OR_STRING:
            return dict(_INT_OR_STRING_SCHEMA)
        quantity = (cls, attr) in _QUANTITY
        byte = (cls, attr) in _BYTES or ("*", attr) in _BYTES
        schema = self.type(type_str, path, quantity=quantity, byte=byte)
        if schema.get("type") == "array" and self.list_strategy is not None:
            strategy, merge_key = self.list_strategy(self.group, self.kind, path)
            if strategy:
                schema["x-kubernetes-patch-strategy"] = strategy
            if merge_key:
                schema["x-kubernetes-patch-merge-key"] = merge_key
        return schema

    def type(self, type_str: str, path: tuple[str, ...], *, quantity: bool, byte: bool) -> dict[str, Any]:
        if m := _LIST_RE.match(type_str):
            return {"type": "array", "items": self.type(m.group(1), path, quantity=quantity, byte=byte)}
        if m := _DICT_RE.match(type_str):
            return {
                "type": "object",
                "additionalProperties": self.type(m.group(1), path, quantity=quantity, byte=byte),
            }
        if type_str == "str" and quantity:
            return {
                "oneOf": [{"type": "string"}, {"type": "number"}],
                "x-kubernetes-preserve-unknown-fields": True,
            }
        if type_str == "str" and byte:
            return {"type": "string", "format": "byte"}
        if type_str in _PRIMITIVES:
            return dict(_PRIMITIVES[type_str])
        if hasattr(self.models, type_str):
            return self.model(type_str, path)
        # An unknown model name (newer client than this code): accept anything rather than fail.
        return {"x-kubernetes-preserve-unknown-fields": True}


def _default_list_strategy() -> ListStrategy | None:
    """patch.py's list_strategy when it exists; the schema simply lacks patch metadata otherwise."""
    name = "gpuops_sim.apiserver.patch"
    try:
        patch = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return None
    fn = getattr(patch, "list_strategy", None)
    return fn if callable(fn) else None


def _build(group: str, version: str, kind: str, list_strategy: ListStrategy | None) -> dict[str, Any] | None:
    name = model_name(group, version, kind)
    if name is None:
        return None
    return _Builder(group, kind, list_strategy).model(name, ())


@functools.cache
def _cached(group: str, version: str, kind: str) -> dict[str, Any] | None:
    return _build(group, version, kind, _default_list_strategy())


def kind_schema(
    group: str, version: str, kind: str, *, list_strategy: ListStrategy | None = None
) -> dict[str, Any] | None:
    """The structural schema of a built-in kind by name (also subresource bodies such as policy/v1 Eviction).

    None when no model describes the kind. The result is cached per kind and SHARED: treat it as read-only
    (copy before changing it). Built once per process, so the write path can consult it on every request.
    ``list_strategy`` overrides patch.py's ``list_strategy(group, kind, path)``; the result is then a fresh,
    uncached build (meant for tests).
    """
    if list_strategy is not None:
        return _build(group, version, kind, list_strategy)
    return _cached(group, version, kind)


def builtin_schema(info: ResourceInfo, *, list_strategy: ListStrategy | None = None) -> dict[str, Any] | None:
    """The structural schema of ``info``'s kind (shared, read-only); None for custom resources and kinds no
    model describes."""
    if info.is_custom:
        return None
    return kind_schema(info.group, info.version, info.kind, list_strategy=list_strategy)


@functools.cache
def meta_schema(name: str) -> dict[str, Any]:
    """Schema of a meta.k8s.io/v1 type ("ObjectMeta", "ListMeta", "Status", ...); shared, read-only.

    ObjectMeta is built as if it sat at ``.metadata`` of an unnamed kind, so it gets the patch metadata that
    every kind shares (ownerReferences by uid, ...) when patch.py provides it.
    """
    path = ("metadata",) if name == "ObjectMeta" else ()
    return _Builder("", "", _default_list_strategy()).model(f"V1{name}", path)

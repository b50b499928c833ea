"""A pod's effective request per resource: what the scheduler reserves on a node and the kubelet admits.

Written from the Kubernetes documentation ("Resource Management for Pods and Containers", "Init Containers",
"Sidecar Containers", "Pod Overhead", "Assign Pod-level CPU and memory resources"), independently of the
operator's accounting package, so that a test comparing the two catches a misreading in either:

* a container's request for a resource defaults to its limit when only the limit is given;
* app containers and sidecars (init containers with `restartPolicy: Always`) run together for the pod's life,
  so their requests add up;
* regular init containers run one at a time, each next to the sidecars listed before it, so initialisation
  needs, at its peak, the largest of (an init container's request + the sidecars started before it);
* the pod needs the larger of those two phases, per resource;
* pod-level requests (`spec.resources.requests`) take precedence over the containers' for the resources they
  may name (cpu, memory, hugepages-<size>);
* `spec.overhead` (set from the RuntimeClass) is added on top.

The input is the pod spec as the API serves it (quantities as strings or JSON numbers); amounts are exact.
Every resource the pod names is in the answer, zero amounts included.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from ..apiserver.quantity import parse_quantity

__all__ = ["container_requests", "effective_requests"]

_POD_LEVEL = ("cpu", "memory")
_HUGEPAGES = "hugepages-"


def _amounts(raw: Any, where: str) -> dict[str, Fraction]:
    """A resource list (name -> quantity); ValueError for a malformed one."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: a resource list is a mapping, not {type(raw).__name__}")
    out: dict[str, Fraction] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: resource names are non-empty strings, not {name!r}")
        out[name] = parse_quantity(value)
    return out


def container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    """One container's requests, each resource that has only a limit requesting its limit."""
    if not isinstance(container, Mapping):
        raise ValueError(f"a container is a mapping, not {type(container).__name__}")
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ValueError("container resources must be a mapping")
    merged = _amounts(resources.get("limits"), "limits")
    merged.update(_amounts(resources.get("requests"), "requests"))
    return merged


def _containers(spec: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
    raw = spec.get(field) or []
    if not isinstance(raw, list):
        raise ValueError(f"spec.{field} must be a list")
    return raw


def _add(into: dict[str, Fraction], extra: Mapping[str, Fraction]) -> None:
    for name, value in extra.items():
        into[name] = into.get(name, Fraction(0)) + value


def _init_peak(init_containers: list[Mapping[str, Any]]) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    """(the sidecars' summed requests, the peak per resource while init containers run)."""
    sidecars: dict[str, Fraction] = {}
    peak: dict[str, Fraction] = {}
    for c in init_containers:
        during = dict(sidecars)  # each init container starts next to the sidecars listed before it
        _add(during, container_requests(c))
        for name, value in during.items():
            peak[name] = max(peak.get(name, value), value)
        if c.get("restartPolicy") == "Always":
            sidecars = during  # ... and a sidecar keeps running
    return sidecars, peak


def _pod_level(name: str) -> bool:
    return name in _POD_LEVEL or name.startswith(_HUGEPAGES)


def effective_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """The pod's effective request for every resource it names (ValueError/TypeError for a malformed spec)."""
    running: dict[str, Fraction] = {}
    for c in _containers(spec, "containers"):
        _add(running, container_requests(c))
    sidecars, peak = _init_peak(_containers(spec, "initContainers"))
    _add(running, sidecars)
    total = {name: max(running.get(name, Fraction(0)), peak.get(name, Fraction(0)))
             for name in (*running, *peak)}
    pod_resources = spec.get("resources") or {}
    if not isinstance(pod_resources, Mapping):
        raise ValueError("spec.resources must be a mapping")
    for name, value in _amounts(pod_resources.get("requests"), "spec.resources.requests").items():
        if _pod_level(name):
            total[name] = value
    _add(total, _amounts(spec.get("overhead"), "spec.overhead"))
    return total

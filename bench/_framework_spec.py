"""What bench/framework_vs_kopf.py's controller computes, in plain Python with no framework imported: the custom
resource it writes (its CRD, which the bench installs in the emulator, never in manifests/) and which pods it
counts. The kopf operators import this module too, so it must stay free of gpuops imports (they would add to
kopf's memory)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "bench.gpuops.io"
VERSION = "v1"
PLURAL = "gpupodcounts"
KIND = "GPUPodCount"
CR_NAME = "gpu-pods"
"""The one GPUPodCount of each namespace."""
GPU = "nvidia.com/gpu"

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "gpupodcount", "kind": KIND, "listKind": f"{KIND}List"},
        "versions": [{
            "name": VERSION,
            "served": True,
            "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "properties": {"resource": {"type": "string"}}},
                    "status": {"type": "object", "properties": {
                        "running": {"type": "integer", "minimum": 0,
                                    "description": "Running pods of the namespace that request the resource"},
                    }},
                },
            }},
        }],
    },
}


def count_object(namespace: str) -> dict[str, Any]:
    """The namespace's GPUPodCount as the bench creates it: no status, so every framework must write one."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": CR_NAME, "namespace": namespace}, "spec": {"resource": GPU}}


def requests_gpu(spec: Mapping[str, Any]) -> bool:
    """A pod spec (JSON-shaped) asks for a GPU in any container's requests or limits."""
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        if GPU in (resources.get("requests") or {}) or GPU in (resources.get("limits") or {}):
            return True
    return False


def counted(pod: Mapping[str, Any]) -> bool:
    """The pod counts: Running and asking for a GPU."""
    return (pod.get("status") or {}).get("phase") == "Running" and requests_gpu(pod.get("spec") or {})

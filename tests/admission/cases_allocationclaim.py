"""AllocationClaim admission (the MIG allocator writes them, a node agent updates their status): every object
below is refused with a message that names the field and says what would be accepted."""

from __future__ import annotations

from typing import Any

from admission_kit import DELETE

VALID: dict[str, Any] = {
    "apiVersion": "gpuops.io/v1alpha1", "kind": "AllocationClaim",
    "metadata": {"name": "trainer-0f4a4e8b-0", "namespace": "default"},
    "spec": {"podName": "trainer", "podUID": "0f4a4e8b-9c3d-2a1b-0c9d-8e7f5b1c7d2e", "nodeName": "gpu-node-1",
             "gpuUUID": "GPU-5b1c7d2e-0f4a-4e8b-9c3d-2a1b0c9d8e7f", "profile": "3g.40gb", "start": 4, "size": 4},
    "status": {"phase": "Pending"},
}

CASES: list[tuple[str, str, Any, str, str]] = [
    # id, field path, value, the field the message names, words of the fix
    ("pod name missing", "spec.podName", DELETE, "spec.podName", "Required value"),
    ("pod name syntax", "spec.podName", "Trainer_0", "spec.podName", "DNS subdomain"),
    ("pod uid syntax", "spec.podUID", "not a uid!", "spec.podUID", "pod's UID"),
    ("node name syntax", "spec.nodeName", "GPU Node", "spec.nodeName", "DNS subdomain"),
    ("gpu uuid syntax", "spec.gpuUUID", "GPU-nope", "spec.gpuUUID", "GPU UUID"),
    ("gpu uuid missing", "spec.gpuUUID", DELETE, "spec.gpuUUID", "Required value"),
    ("profile syntax", "spec.profile", "3g-40gb", "spec.profile", "MIG profile"),
    ("profile compute too big", "spec.profile", "9g.80gb", "spec.profile", "MIG profile"),
    ("profile missing", "spec.profile", DELETE, "spec.profile", "Required value"),
    ("start negative", "spec.start", -1, "spec.start", "greater than or equal to 0"),
    ("start beyond the GPU", "spec.start", 8, "spec.start", "less than or equal to 7"),
    ("size zero", "spec.size", 0, "spec.size", "greater than or equal to 1"),
    ("size beyond the GPU", "spec.size", 9, "spec.size", "less than or equal to 8"),
    ("placement past the end", "spec.start", 6, "spec", "start + size must be at most 8"),
    ("start missing", "spec.start", DELETE, "spec.start", "Required value"),
    ("unknown field", "spec.memory", "40gb", "spec.memory", "unknown field"),
]

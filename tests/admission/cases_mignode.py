"""MigNode admission (a node agent writes them): every object below is refused with a message that names the
field and says what would be accepted, so a confused or forged agent report cannot mislead the allocator."""

from __future__ import annotations

from typing import Any

from admission_kit import DELETE

VALID: dict[str, Any] = {
    "apiVersion": "gpuops.io/v1alpha1", "kind": "MigNode", "metadata": {"name": "gpu-node-1"},
    "spec": {"nodeName": "gpu-node-1"},
    "status": {
        "backend": "nvml", "agentVersion": "0.1.0", "heartbeat": "2026-01-02T03:04:05Z",
        "gpus": [
            {"index": 0, "uuid": "GPU-5b1c7d2e-0f4a-4e8b-9c3d-2a1b0c9d8e7f", "model": "A100-40GB",
             "migMode": "Enabled", "slices": [
                 {"profile": "3g.20gb", "start": 4, "size": 4,
                  "deviceUUID": "MIG-0c9d8e7f-2a1b-4e8b-9c3d-5b1c7d2e0f4a", "claim": "default/trainer-0f4a4e8b-0"},
                 {"profile": "1g.5gb", "start": 0, "size": 1}]},
            {"index": 1, "uuid": "GPU-6c2d8e3f-1a5b-4f9c-8d4e-3b2c1d0e9f8a", "model": "A100-40GB"},
        ],
    },
}

CASES: list[tuple[str, str, Any, str, str]] = [
    # id, field path, value, the field the message names, words of the fix
    ("node name syntax", "spec.nodeName", "GPU Node 1", "spec.nodeName", "DNS subdomain"),
    ("backend unknown", "status.backend", "cuda", "status.backend", "supported values"),
    ("heartbeat not a time", "status.heartbeat", "yesterday", "status.heartbeat", "date-time"),
    ("duplicate gpu uuid", "status.gpus.1.uuid", "GPU-5b1c7d2e-0f4a-4e8b-9c3d-2a1b0c9d8e7f", "status.gpus[1]",
     "Duplicate value"),
    ("duplicate gpu index", "status.gpus.1.index", 0, "status.gpus", "every GPU index must appear once"),
    ("gpu uuid syntax", "status.gpus.0.uuid", "GPU-nope", "status.gpus[0].uuid", "GPU UUID"),
    ("gpu index negative", "status.gpus.0.index", -1, "status.gpus[0].index", "greater than or equal to 0"),
    ("gpu uuid missing", "status.gpus.0.uuid", DELETE, "status.gpus[0].uuid", "Required value"),
    ("mig mode unknown", "status.gpus.0.migMode", "On", "status.gpus[0].migMode", "supported values"),
    ("slice profile syntax", "status.gpus.0.slices.1.profile", "1g", "status.gpus[0].slices[1].profile",
     "MIG profile"),
    ("slice past the end", "status.gpus.0.slices.0.start", 6, "status.gpus[0].slices[0]",
     "start + size must be at most 8"),
    ("slices overlap", "status.gpus.0.slices.1.start", 5, "status.gpus[0].slices", "must not overlap"),
    ("slice size zero", "status.gpus.0.slices.1.size", 0, "status.gpus[0].slices[1].size",
     "greater than or equal to 1"),
    ("slice device uuid syntax", "status.gpus.0.slices.0.deviceUUID", "GPU-x", "status.gpus[0].slices[0].deviceUUID",
     "MIG device UUID"),
    ("slice claim syntax", "status.gpus.0.slices.0.claim", "trainer", "status.gpus[0].slices[0].claim",
     "<namespace>/<name>"),
    ("too many slices", "status.gpus.0.slices", [{"profile": "1g.5gb", "start": i, "size": 1} for i in range(9)],
     "status.gpus[0].slices", "must have at most 8 items"),
    ("unknown field", "status.gpus.0.temperature", 60, "status.gpus[0].temperature", "unknown field"),
]

"""GPUNodeGroup admission: every object below is refused by the API server with a message that names the field
and says what would be accepted; the valid object it was made from is admitted."""

from __future__ import annotations

from typing import Any

from admission_kit import DELETE

VALID: dict[str, Any] = {
    "apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": "gpu-1"},
    "spec": {
        "nodeName": "gpu-node-1", "gpuCount": 8,
        "scaleUp": {"url": "https://bmc.example.com/on", "secretRef": {"name": "bmc", "namespace": "gpuops-system"},
                    "headers": {"X-Site": "fra1"}},
        "scaleDown": {"url": "http://bmc.example.com:8080/off"},
        "template": {"labels": {"example.com/gpu": "h100"},
                     "taints": [{"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}]},
    },
}

CASES: list[tuple[str, str, Any, str, str]] = [
    # id, field path, value, the field the message names, words of the fix
    ("node name missing", "spec.nodeName", DELETE, "spec.nodeName", "Required value"),
    ("node name not DNS", "spec.nodeName", "GPU_Node 1", "spec.nodeName", "DNS subdomain"),
    ("gpu count zero", "spec.gpuCount", 0, "spec.gpuCount", "greater than or equal to 1"),
    ("gpu count absurd", "spec.gpuCount", 100000, "spec.gpuCount", "less than or equal to 1024"),
    ("resource name syntax", "spec.gpuResourceName", "nvidia.com/gpu/x", "spec.gpuResourceName", "resource name"),
    ("url not http", "spec.scaleUp.url", "ftp://bmc.example.com/on", "spec.scaleUp.url", "http:// or https://"),
    ("url with credentials", "spec.scaleDown.url", "https://admin:pw@bmc.example.com/off", "spec.scaleDown.url",
     "without user:password@"),
    ("url missing", "spec.scaleUp.url", DELETE, "spec.scaleUp.url", "Required value"),
    ("timeout zero", "spec.scaleUp.timeoutSeconds", 0, "spec.scaleUp.timeoutSeconds", "greater than or equal to 1"),
    ("timeout too long", "spec.scaleUp.timeoutSeconds", 3600, "spec.scaleUp.timeoutSeconds",
     "less than or equal to 300"),
    ("secret namespace missing", "spec.scaleUp.secretRef.namespace", DELETE, "spec.scaleUp.secretRef.namespace",
     "Required value"),
    ("secret name not DNS", "spec.scaleUp.secretRef.name", "Bmc Secret", "spec.scaleUp.secretRef.name",
     "DNS subdomain"),
    ("secret key syntax", "spec.scaleUp.secretRef.tokenKey", "a/b", "spec.scaleUp.secretRef.tokenKey",
     "Secret data key"),
    ("header sets Authorization", "spec.scaleUp.headers", {"authorization": "Bearer x"}, "spec.scaleUp.headers",
     "must not set Authorization"),
    ("header name not a token", "spec.scaleUp.headers", {"X Site": "a"}, "spec.scaleUp.headers", "HTTP token"),
    ("header value two lines", "spec.scaleUp.headers", {"X-Site": "a\r\nX-Evil: 1"}, "spec.scaleUp.headers",
     "one line"),
    ("label key syntax", "spec.template.labels", {"bad key!": "x"}, "spec.template.labels", "label key"),
    ("label value syntax", "spec.template.labels", {"example.com/gpu": "-h100-"}, "spec.template.labels",
     "label value"),
    ("taint effect", "spec.template.taints.0.effect", "NoRun", "spec.template.taints[0].effect",
     "NoSchedule"),
    ("taint key syntax", "spec.template.taints.0.key", "nvidia.com/gpu/x", "spec.template.taints[0].key",
     "label key"),
    ("boot timeout overflow", "spec.bootTimeoutSeconds", 3600000000000, "spec.bootTimeoutSeconds",
     "less than or equal to 86400"),
    ("unneeded negative", "spec.scaleDownUnneededSeconds", -1, "spec.scaleDownUnneededSeconds",
     "greater than or equal to 0"),
    ("priority huge", "spec.priority", 2**40, "spec.priority", "less than or equal to 1000000"),
    ("unknown field", "spec.scaleUp.retries", 3, "spec.scaleUp.retries", "unknown field"),
]

"""SpotPool admission: every object below is refused by the API server with a message that names the field and
says what would be accepted; the valid object it was made from is admitted."""

from __future__ import annotations

from typing import Any

from admission_kit import DELETE

VALID: dict[str, Any] = {
    "apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": "pool"},
    "spec": {
        "provider": "tencent", "minimum": 1, "maximum": 4,
        "credentialsSecretRef": {"name": "cloud-keys", "namespace": "gpuops-system"},
        "template": {"region": "ap-guangzhou", "zones": ["ap-guangzhou-3"], "instanceTypes": ["GN10Xp.2XLARGE40"],
                     "image": "img-abc123", "maxPrice": "1.25", "tags": {"team": "ml"},
                     "labels": {"example.com/pool": "spot"},
                     "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
    },
}

CASES: list[tuple[str, str, Any, str, str]] = [
    # id, field path, value, the field the message names, words of the fix
    ("provider unknown", "spec.provider", "gcp", "spec.provider", "supported values"),
    ("maximum missing", "spec.maximum", DELETE, "spec.maximum", "Required value"),
    ("minimum above maximum", "spec.minimum", 9, "spec", "raise maximum or lower minimum"),
    ("maximum absurd", "spec.maximum", 10**9, "spec.maximum", "less than or equal to 10000"),
    ("tencent without region", "spec.template.region", DELETE, "spec", "need spec.template.region"),
    ("tencent without zones", "spec.template.zones", DELETE, "spec", "needs spec.template.zones"),
    ("tencent without credentials", "spec.credentialsSecretRef", DELETE, "spec", "need spec.credentialsSecretRef"),
    ("region syntax", "spec.template.region", "AP Guangzhou", "spec.template.region", "region name"),
    ("zone syntax", "spec.template.zones", ["ap guangzhou 3"], "spec.template.zones", "zone name"),
    ("no instance types", "spec.template.instanceTypes", [], "spec.template.instanceTypes",
     "should have at least 1 items"),
    ("instance type syntax", "spec.template.instanceTypes", ["GN10Xp 2XLARGE40"], "spec.template.instanceTypes",
     "type name"),
    ("image syntax", "spec.template.image", "img abc", "spec.template.image", "image ID"),
    ("price syntax", "spec.template.maxPrice", "$1.25", "spec.template.maxPrice", "decimal price"),
    ("reserved tag", "spec.template.tags", {"gpuops.io/pool": "x"}, "spec.template.tags", "reserved"),
    ("label key syntax", "spec.template.labels", {"bad key!": "x"}, "spec.template.labels", "label key"),
    ("taint key syntax", "spec.template.taints.0.key", "bad key", "spec.template.taints[0].key", "label key"),
    ("taint effect", "spec.template.taints.0.effect", "Never", "spec.template.taints[0].effect", "supported values"),
    ("gpus per instance zero", "spec.template.gpusPerInstance", 0, "spec.template.gpusPerInstance",
     "greater than or equal to 1"),
    ("endpoint with credentials", "spec.endpoint", "https://user:pw@cvm.example.com", "spec.endpoint",
     "without user:password@"),
    ("secret namespace syntax", "spec.credentialsSecretRef.namespace", "Gpuops System",
     "spec.credentialsSecretRef.namespace", "DNS label"),
    ("deletion policy", "spec.deletionPolicy", "Orphan", "spec.deletionPolicy", "supported values"),
    ("drain timeout absurd", "spec.drainTimeoutSeconds", 10**10, "spec.drainTimeoutSeconds",
     "less than or equal to 604800"),
    ("unknown field", "spec.template.spotPrice", "1", "spec.template.spotPrice", "unknown field"),
]

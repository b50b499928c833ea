"""GPUWorkloadBudget admission: every object below is refused by the API server with a message that names the
field and says what would be accepted; the valid object it was made from is admitted."""

from __future__ import annotations

from typing import Any

from admission_kit import DELETE

VALID: dict[str, Any] = {
    "apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
    "metadata": {"name": "team-a", "namespace": "default"},
    "spec": {
        "selector": {"matchLabels": {"team": "a"},
                     "matchExpressions": [{"key": "example.com/tier", "operator": "In", "values": ["gold"]}]},
        "quota": {"gpuHours": "100", "windowHours": 24},
        "enforcement": {"action": "Evict", "delaySeconds": 60, "evictionGracePeriodSeconds": 30},
    },
}

CASES: list[tuple[str, str, Any, str, str]] = [
    # id, field path, value, the field the message names, words of the fix
    ("selector missing", "spec.selector", DELETE, "spec.selector", "Required value"),
    ("selector empty", "spec.selector", {}, "spec.selector", "must not be empty"),
    ("label key syntax", "spec.selector.matchLabels", {"bad key!": "a"}, "spec.selector.matchLabels", "label key"),
    ("label value syntax", "spec.selector.matchLabels", {"team": "a b"}, "spec.selector.matchLabels",
     "label value"),
    ("expression key syntax", "spec.selector.matchExpressions.0.key", "a/b/c", "spec.selector.matchExpressions[0].key",
     "label key"),
    ("expression operator", "spec.selector.matchExpressions.0.operator", "Gt",
     "spec.selector.matchExpressions[0].operator", "supported values"),
    ("In without values", "spec.selector.matchExpressions.0.values", [], "spec.selector.matchExpressions[0]",
     "need values"),
    ("expression value syntax", "spec.selector.matchExpressions.0.values", ["gold!"],
     "spec.selector.matchExpressions[0].values", "label value"),
    ("quota missing", "spec.quota.gpuHours", DELETE, "spec.quota.gpuHours", "Required value"),
    ("quota zero", "spec.quota.gpuHours", "0", "spec.quota.gpuHours", "greater than 0"),
    ("quota negative int", "spec.quota.gpuHours", -5, "spec.quota.gpuHours", "greater than 0"),
    ("quota not a quantity", "spec.quota.gpuHours", "ten", "spec.quota.gpuHours", "should match"),
    ("quota overflowing", "spec.quota.gpuHours", "1e999", "spec.quota.gpuHours", "a quantity greater than 0"),
    ("window zero", "spec.quota.windowHours", 0, "spec.quota.windowHours", "greater than or equal to 1"),
    ("window beyond a year", "spec.quota.windowHours", 10000, "spec.quota.windowHours", "less than or equal to 8784"),
    ("action unknown", "spec.enforcement.action", "Kill", "spec.enforcement.action", "supported values"),
    ("delay negative", "spec.enforcement.delaySeconds", -1, "spec.enforcement.delaySeconds",
     "greater than or equal to 0"),
    ("delay absurd", "spec.enforcement.delaySeconds", 10**12, "spec.enforcement.delaySeconds",
     "less than or equal to 2592000"),
    ("grace negative", "spec.enforcement.evictionGracePeriodSeconds", -1,
     "spec.enforcement.evictionGracePeriodSeconds", "greater than or equal to 0"),
    ("resource name syntax", "spec.gpuResourceName", "nvidia.com/gpu x", "spec.gpuResourceName", "resource name"),
    ("unknown field", "spec.quota.gpuMinutes", 5, "spec.quota.gpuMinutes", "unknown field"),
]

"""What a node's labels say about the GPUs it offers and how they are bought.

The GPU model is GPU feature discovery's `nvidia.com/gpu.product` (with the MIG "single" strategy it carries a
`-MIG-<profile>` suffix, which names the same GPU). Whether the node is spot capacity, each provisioner says in
its own label: Karpenter, EKS managed node groups, GKE (spot and the older preemptible VMs), AKS, and gpuops'
own spot pools. The first of those labels a node carries decides; a node with none of them is on-demand. Budgets
charge a pod by what its node showed while it ran.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, NamedTuple

from gpuops.accounting.pricing import Attribution

__all__ = ["MODEL_LABEL", "SPOT_POOL_LABEL", "SPOT_RULES", "SpotRule", "attribution", "gpu_model"]

MODEL_LABEL: Final = "nvidia.com/gpu.product"
SPOT_POOL_LABEL: Final = "gpuops.io/spotpool"
"""On the nodes of a gpuops SpotPool (its value names the pool): they are spot instances."""


class SpotRule(NamedTuple):
    label: str
    spot: frozenset[str] | None
    """The label's values that mean spot capacity; None: any value does."""


SPOT_RULES: Final = (
    SpotRule("karpenter.sh/capacity-type", frozenset({"spot"})),  # or on-demand, reserved
    SpotRule("eks.amazonaws.com/capacityType", frozenset({"SPOT"})),  # or ON_DEMAND
    SpotRule("cloud.google.com/gke-spot", frozenset({"true"})),
    SpotRule("cloud.google.com/gke-preemptible", frozenset({"true"})),
    SpotRule("kubernetes.azure.com/scalesetpriority", frozenset({"spot"})),  # or regular
    SpotRule(SPOT_POOL_LABEL, None),
)

_MIG_SUFFIX: Final = re.compile(r"-MIG-.*$")


def gpu_model(labels: Mapping[str, str], label: str = MODEL_LABEL) -> str:
    """The node's GPU model as its label names it, without a MIG profile suffix; "" if the node has no label."""
    return _MIG_SUFFIX.sub("", labels.get(label, ""))


def attribution(labels: Mapping[str, str], *, model_label: str = MODEL_LABEL,
                rules: tuple[SpotRule, ...] = SPOT_RULES) -> Attribution:
    """The GPU model and capacity type a node's labels show."""
    model = gpu_model(labels, model_label)
    for rule in rules:
        value = labels.get(rule.label)
        if value is not None:
            return Attribution(model, "Spot" if rule.spot is None or value in rule.spot else "OnDemand")
    return Attribution(model, "OnDemand")

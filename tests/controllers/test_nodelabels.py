"""A node's GPU model and capacity type from its labels, as the provisioners document them: Karpenter
(karpenter.sh/capacity-type: spot, on-demand, reserved), EKS managed node groups (eks.amazonaws.com/capacityType:
SPOT, ON_DEMAND), GKE (cloud.google.com/gke-spot, cloud.google.com/gke-preemptible: "true"), AKS
(kubernetes.azure.com/scalesetpriority: spot, regular), and gpuops' spot pools; the model from GPU feature
discovery's nvidia.com/gpu.product."""

from __future__ import annotations

import pytest

from gpuops.accounting.pricing import Attribution
from gpuops.controllers.nodelabels import attribution, gpu_model
from gpuops.controllers.spotpool.nodes import POOL_LABEL

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.mark.parametrize(("labels", "capacity"), [
    ({"karpenter.sh/capacity-type": "spot"}, "Spot"),
    ({"karpenter.sh/capacity-type": "on-demand"}, "OnDemand"),
    ({"karpenter.sh/capacity-type": "reserved"}, "OnDemand"),
    ({"eks.amazonaws.com/capacityType": "SPOT"}, "Spot"),
    ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, "OnDemand"),
    ({"cloud.google.com/gke-spot": "true"}, "Spot"),
    ({"cloud.google.com/gke-preemptible": "true"}, "Spot"),
    ({"kubernetes.azure.com/scalesetpriority": "spot"}, "Spot"),
    ({"kubernetes.azure.com/scalesetpriority": "regular"}, "OnDemand"),
    ({POOL_LABEL: "gpus"}, "Spot"),
    ({}, "OnDemand"),
    ({"karpenter.sh/capacity-type": "on-demand", "cloud.google.com/gke-spot": "true"}, "OnDemand"),  # first decides
])
def test_the_capacity_type_is_what_the_provisioner_labelled(labels: dict[str, str], capacity: str) -> None:
    assert attribution({**H100, **labels}) == Attribution("NVIDIA-H100-80GB-HBM3", capacity)  # type: ignore[arg-type]


def test_the_model_is_the_product_label_without_a_mig_suffix() -> None:
    assert gpu_model({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}) == "NVIDIA-A100-SXM4-40GB"
    assert gpu_model({"nvidia.com/gpu.product": "NVIDIA-L4"}) == "NVIDIA-L4"
    assert gpu_model({}) == ""
    assert attribution({"example.com/gpu": "L4"}, model_label="example.com/gpu").model == "L4"

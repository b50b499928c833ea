"""The rules by which gpuops decides that another controller owns something (gpuops.controllers.coexistence), case by
case: what counts as a conflict, and the inert marks that must not (the emulated demo's nodes carry
nvidia.com/mig.config=all-disabled, the GPU Operator's default)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpuops.controllers.coexistence import (
    kueue_owner,
    mig_manager_conflict,
    power_off_hold,
)
from gpuops.kube.objects import Job, Node


def job(labels: dict[str, str] | None = None, managed_by: str | None = None) -> Job:
    spec: dict[str, Any] = {"managedBy": managed_by} if managed_by is not None else {}
    return msgspec.convert({"metadata": {"name": "j", "labels": labels or {}}, "spec": spec}, Job)


def node(**meta: Any) -> Node:
    taints = meta.pop("taints", None)
    return msgspec.convert({"metadata": {"name": "n", **meta}, "spec": {"taints": taints}}, Node)


def test_kueue_and_other_controllers_own_a_jobs_suspend() -> None:
    assert kueue_owner(job()) is None
    assert kueue_owner(job(managed_by="kubernetes.io/job-controller")) is None
    assert kueue_owner(job({"team": "a"})) is None
    assert "kueue.x-k8s.io/queue-name=q" in (kueue_owner(job({"kueue.x-k8s.io/queue-name": "q"})) or "")
    assert "kueue.x-k8s.io/multikueue" in (kueue_owner(job(managed_by="kueue.x-k8s.io/multikueue")) or "")


@pytest.mark.parametrize(("labels", "reason"), [
    ({}, None),
    ({"nvidia.com/mig.config": "all-disabled"}, None),  # the GPU Operator's default, inert without a MIG manager
    ({"nvidia.com/mig.strategy": "none"}, None),
    ({"nvidia.com/mig.capable": "true", "nvidia.com/gpu.deploy.mig-manager": "true"}, None),
    ({"nvidia.com/mig.config": "all-disabled", "nvidia.com/mig.config.state": "success"}, "MigManagerOnNode"),
    ({"nvidia.com/mig.config": "all-1g.10gb"}, "MigManagerOnNode"),
    ({"nvidia.com/mig.config.state": "pending"}, "MigManagerOnNode"),
    ({"nvidia.com/mig.strategy": "mixed"}, "DevicePluginMigStrategy"),
    ({"nvidia.com/mig.strategy": "single"}, "DevicePluginMigStrategy"),
])
def test_mig_manager_conflict_is_precise(labels: dict[str, str], reason: str | None) -> None:
    found = mig_manager_conflict(labels)
    assert (found[0] if found else None) == reason


@pytest.mark.parametrize(("n", "reason"), [
    (node(), None),
    (node(annotations={"karpenter.sh/do-not-disrupt": "false"}), None),
    (node(labels={"karpenter.sh/nodepool": "gpu"}), "KarpenterManagedNode"),
    (node(ownerReferences=[{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "c", "uid": "u"}]),
     "KarpenterManagedNode"),
    (node(taints=[{"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}]),
     "ClusterAutoscalerScaleDown"),
    (node(annotations={"karpenter.sh/do-not-disrupt": "true"}), "NodeProtected"),
    (node(annotations={"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}), "NodeProtected"),
])
def test_power_off_holds(n: Node, reason: str | None) -> None:
    found = power_off_hold(n)
    assert (found[0] if found else None) == reason

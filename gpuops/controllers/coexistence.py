"""What other cluster controllers mark on the objects gpuops would act on, and when gpuops holds back for them.

gpuops shares clusters with Kueue (Job queueing), NVIDIA's GPU Operator (MIG manager, device plugin, GPU feature
discovery), cluster-autoscaler and Karpenter. Two controllers writing the same field fight: each undoes the
other's write on its next turn. So where gpuops can see that another controller owns something, it leaves it
alone and says so (the condition `ConflictDetected` on its own object, and one Warning Event), instead of acting.
These are pure functions over labels, annotations, taints and owner references: the controllers decide what to
skip with them, and docs/coexistence.md lists the same rules for the people who set those marks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, NamedTuple

from gpuops.kube.conditions import get_condition
from gpuops.kube.objects import Condition, Job, Node

__all__ = [
    "CA_TAINTS",
    "CONDITION",
    "DO_NOT_DISRUPT",
    "JOB_CONTROLLER",
    "KARPENTER_NODEPOOL",
    "KUEUE_QUEUE_NAME",
    "MIG_CONFIG",
    "MIG_CONFIG_STATE",
    "MIG_DISABLED_CONFIG",
    "MIG_STRATEGY",
    "NO_CONFLICT",
    "SCALE_DOWN_DISABLED",
    "ConflictCondition",
    "conflict_condition",
    "conflict_to_write",
    "karpenter_nodepool",
    "kueue_owner",
    "mig_manager_conflict",
    "power_off_hold",
]

CONDITION: Final = "ConflictDetected"
"""Condition type, on GPUWorkloadBudget, MigNode, GPUNodeGroup and SpotPool: True while gpuops leaves something
alone because another controller manages it (the reason says which), False once that is over."""
NO_CONFLICT: Final = "NoConflict"

KUEUE_QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
"""Kueue manages (queues, admits, suspends) the Jobs that carry this label (its default labelPolicy)."""
JOB_CONTROLLER: Final = "kubernetes.io/job-controller"
"""The reserved spec.managedBy of the built-in Job controller; any other value hands the Job to another one."""

MIG_CONFIG: Final = "nvidia.com/mig.config"
"""The node label NVIDIA's MIG manager applies (a named mig-parted configuration)."""
MIG_CONFIG_STATE: Final = "nvidia.com/mig.config.state"
"""Written back by the MIG manager (pending, rebooting, success, failed): proof it acts on the node."""
MIG_STRATEGY: Final = "nvidia.com/mig.strategy"
"""Written by GPU feature discovery from the device plugin's MIG strategy (none, single or mixed)."""
MIG_DISABLED_CONFIG: Final = "all-disabled"
"""The GPU Operator's default value of nvidia.com/mig.config; with no MIG manager running it changes nothing."""
_STRATEGIES_ADVERTISING_MIG: Final = ("single", "mixed")

KARPENTER_NODEPOOL: Final = "karpenter.sh/nodepool"
"""Karpenter labels every node it launches with its NodePool."""
DO_NOT_DISRUPT: Final = "karpenter.sh/do-not-disrupt"
SCALE_DOWN_DISABLED: Final = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
CA_TAINTS: Final = ("ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler")
"""Taints cluster-autoscaler puts on a node it is about to remove, or considers removing."""


class ConflictCondition(NamedTuple):
    """A ConflictDetected condition to write."""

    status: str
    reason: str
    message: str


def conflict_condition(current: tuple[str, str | None, str | None] | None, found: tuple[str, str] | None,
                       cleared: str) -> ConflictCondition | None:
    """The ConflictDetected condition to write, or None when the object's current one (status, reason, message)
    already says it: True with the conflict `found`, else False with `cleared` once it had been True (an object
    that never had a conflict never gets the condition)."""
    if found is None:
        if current is None or current[0] == "False":
            return None
        want = ConflictCondition("False", NO_CONFLICT, cleared)
    else:
        want = ConflictCondition("True", *found)
    return None if current == want else want


def conflict_to_write(conditions: Iterable[Condition] | None, found: tuple[str, str] | None,
                      cleared: str) -> ConflictCondition | None:
    """`conflict_condition` for an object whose status holds `conditions`: what each controller that reports
    ConflictDetected asks before it writes (the condition, or None when the object already says it)."""
    current = get_condition(conditions, CONDITION)
    return conflict_condition(None if current is None else (current.status, current.reason, current.message),
                              found, cleared)


def kueue_owner(job: Job) -> str | None:
    """Why another controller owns this Job's spec.suspend (so Pause must not write it), or None.

    Kueue creates the Jobs it manages suspended and unsuspends them on admission: a suspend written by anyone else
    is undone at Kueue's next turn, or holds a Job Kueue counts as admitted. A Job whose spec.managedBy names
    another controller (MultiKueue's kueue.x-k8s.io/multikueue, say) is not run by the built-in Job controller at
    all, so suspending it here stops nothing."""
    queue = (job.metadata.labels or {}).get(KUEUE_QUEUE_NAME)
    if queue:
        return f"it carries {KUEUE_QUEUE_NAME}={queue} (Kueue owns its spec.suspend)"
    managed_by = job.spec.managed_by
    if managed_by and managed_by != JOB_CONTROLLER:
        return f"its spec.managedBy is {managed_by} (that controller, not the Job controller, runs it)"
    return None


def mig_manager_conflict(labels: Mapping[str, str] | None) -> tuple[str, str] | None:
    """(reason, message) when another component manages or advertises the MIG geometry of a node gpuops slices.

    The rule, precise so that inert labels do not count:
      * nvidia.com/mig.config.state present: NVIDIA's MIG manager has acted on this node (only it writes that).
      * nvidia.com/mig.config with a value other than all-disabled: someone asks the MIG manager for a geometry.
        all-disabled alone is the GPU Operator's default marking and changes nothing without a MIG manager.
      * nvidia.com/mig.strategy single or mixed: NVIDIA's device plugin advertises the MIG devices (as
        nvidia.com/gpu or nvidia.com/mig-<profile>), so a slice gpuops made could be handed to another pod.
    gpuops never writes these labels."""
    labels = labels or {}
    state = labels.get(MIG_CONFIG_STATE)
    config = labels.get(MIG_CONFIG)
    if state is not None or (config and config != MIG_DISABLED_CONFIG):
        seen = ", ".join(f"{k}={labels[k]}" for k in (MIG_CONFIG, MIG_CONFIG_STATE) if k in labels)
        return "MigManagerOnNode", (
            f"NVIDIA's MIG manager manages this node's MIG geometry ({seen}); gpuops makes and destroys no slice "
            f"here while it does. Choose one owner: label the node nvidia.com/gpu.deploy.mig-manager=false and "
            f"remove {MIG_CONFIG} and {MIG_CONFIG_STATE}, or stop the gpuops agent on it")
    strategy = labels.get(MIG_STRATEGY)
    if strategy in _STRATEGIES_ADVERTISING_MIG:
        return "DevicePluginMigStrategy", (
            f"NVIDIA's device plugin advertises this node's MIG devices ({MIG_STRATEGY}={strategy}), so slices "
            f"gpuops makes could be given to other pods; gpuops makes and destroys no slice here while it does. "
            f"Label the node nvidia.com/gpu.deploy.device-plugin=false (GPU Operator) or run the device plugin "
            f"with MIG strategy none on it")
    return None


def karpenter_nodepool(node: Node | None) -> str | None:
    """The Karpenter NodePool (or "NodeClaim <name>") managing this node, or None."""
    if node is None:
        return None
    pool = (node.metadata.labels or {}).get(KARPENTER_NODEPOOL)
    if pool:
        return pool
    for ref in node.metadata.owner_references or ():
        if ref.kind == "NodeClaim" and ref.api_version.startswith("karpenter.sh/"):
            return f"NodeClaim {ref.name}"
    return None


def power_off_hold(node: Node | None) -> tuple[str, str] | None:
    """(reason, message) when gpuops must not power this node off, or None.

    Another autoscaler managing the node (Karpenter's NodePool label or NodeClaim owner, cluster-autoscaler's
    removal taints) decides its life: powering it off behind that controller's back strands its bookkeeping. The
    node annotations both autoscalers define for "do not remove this node" are honoured as a user's wish."""
    if node is None:
        return None
    pool = karpenter_nodepool(node)
    if pool is not None:
        return "KarpenterManagedNode", (
            f"Karpenter manages this node ({pool}); gpuops does not power it off. Let one controller own it: "
            f"remove the node from this GPUNodeGroup, or keep it out of Karpenter's NodePools")
    for taint in node.spec.taints or ():
        if taint.key in CA_TAINTS:
            return "ClusterAutoscalerScaleDown", (
                f"cluster-autoscaler is removing or considering this node (taint {taint.key}); gpuops does not "
                f"power it off. Exclude the node from cluster-autoscaler's node groups, or annotate it "
                f"{SCALE_DOWN_DISABLED}=true")
    ann = node.metadata.annotations or {}
    for key in (DO_NOT_DISRUPT, SCALE_DOWN_DISABLED):
        if ann.get(key) == "true":
            return "NodeProtected", (
                f"the node is annotated {key}=true (do not remove it); gpuops keeps it powered on until the "
                f"annotation is removed")
    return None

"""The MIG slicer's API (gpuops.io/v1alpha1): MigNode (cluster-scoped, one per node, written by the node agent)
and AllocationClaim (in the pod's namespace, owned by the pod, so it is garbage-collected with it).

A pod asks for `nvidia.com/mig-<profile>`; the admission webhook renames it to `gpuops.io/mig-<profile>` and adds
the scheduling gate `gpuops.io/mig-slicer`. The allocator writes one claim per slice (spec: where), the agent
creates the slice and reports it (status: Created, device UUID), the allocator pins the pod to the node and lifts
the gate, the kubelet's Allocate (served by the agent's device plugin) hands the slice to the container (Bound).
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

from gpuops.kube.objects import Condition, ObjectMeta
from gpuops.kube.resources import ResourceType

__all__ = [
    "ADVERTISE",
    "API_VERSION",
    "CLAIMS",
    "CLAIM_KIND",
    "GATE",
    "MIG_NODES",
    "MIG_NODE_KIND",
    "NODE_LABEL",
    "NVIDIA_PREFIX",
    "OUR_PREFIX",
    "PHASES",
    "POD_UID_LABEL",
    "AllocationClaim",
    "ClaimSpec",
    "ClaimStatus",
    "MigGPU",
    "MigNode",
    "MigNodeSpec",
    "MigNodeStatus",
    "MigSlice",
    "Phase",
    "claim_name",
    "profile_of_resource",
    "resource_of_profile",
]

GROUP: Final = "gpuops.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
MIG_NODE_KIND: Final = "MigNode"
CLAIM_KIND: Final = "AllocationClaim"
GATE: Final = "gpuops.io/mig-slicer"
ADVERTISE: Final = "gpuops.io/advertise"
"""Claim annotation by which the allocator asks the agent to offer a Created slice to the kubelet."""
NODE_LABEL: Final = "gpuops.io/node"
"""Claim label: the agent of that node watches only its claims."""
POD_UID_LABEL: Final = "gpuops.io/pod-uid"
NVIDIA_PREFIX: Final = "nvidia.com/mig-"
"""What workloads ask for (NVIDIA's mixed strategy names, e.g. nvidia.com/mig-1g.10gb)."""
OUR_PREFIX: Final = "gpuops.io/mig-"
"""What the webhook renames it to, so only slices this operator created can satisfy it."""

Phase = Literal["Pending", "Created", "Bound", "Released", "Failed"]
PHASES: Final[tuple[Phase, ...]] = ("Pending", "Created", "Bound", "Released", "Failed")

_PROFILE = re.compile(r"\d+g\.\d+gb(\+me|\+gfx)?")
_SUFFIX = re.compile(r"-(me|gfx)$")


class _Api(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Base of the CRD types: camelCase JSON, defaults left out, every field optional when decoding."""


# ---------------------------------------------------------------------------------------------- MigNode


class MigSlice(_Api, kw_only=True):
    """One GPU instance (plus its compute instance) on a GPU."""

    # required (never left out as a default): the CRD needs them, and start 0 is a real placement
    profile: str
    start: int
    size: int
    device_uuid: str = msgspec.field(default="", name="deviceUUID")
    """MIG-<uuid>: what NVIDIA_VISIBLE_DEVICES names."""
    claim: str = ""
    """`<namespace>/<name>` of the AllocationClaim it was made for ("" for a slice no claim owns)."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class MigGPU(_Api, kw_only=True):
    index: int
    uuid: str
    model: str
    """Our model key (A100-40GB, H100-80GB, ...), which `gpuops.accounting.mig` knows the geometry of."""
    product: str = ""
    memory_mib: int = msgspec.field(default=0, name="memoryMiB")
    mig_mode: Literal["Enabled", "Disabled", "Pending"] = "Disabled"
    """Pending: enabled, but the GPU must be reset before it takes effect."""
    slices: tuple[MigSlice, ...] = ()


class MigNodeSpec(_Api):
    node_name: str = ""


class MigNodeStatus(_Api):
    backend: str = ""
    """nvml or emulated."""
    agent_version: str = ""
    heartbeat: str | None = None
    gpus: tuple[MigGPU, ...] = ()
    conditions: tuple[Condition, ...] | None = None


class MigNode(_Api):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: MigNodeSpec = msgspec.field(default_factory=MigNodeSpec)
    status: MigNodeStatus = msgspec.field(default_factory=MigNodeStatus)


MIG_NODES: Final = ResourceType(GROUP, VERSION, "mignodes", MIG_NODE_KIND, False, MigNode)


# ---------------------------------------------------------------------------------------------- AllocationClaim


class ClaimSpec(_Api, kw_only=True):
    """Where one slice of one pod goes; immutable once written (a new decision is a new claim)."""

    pod_name: str = ""
    pod_uid: str = msgspec.field(default="", name="podUID")
    node_name: str = ""
    gpu_uuid: str = msgspec.field(default="", name="gpuUUID")
    profile: str = ""
    start: int
    size: int = 0


class ClaimStatus(_Api):
    phase: Phase = "Pending"
    device_uuid: str = msgspec.field(default="", name="deviceUUID")
    advertised: bool = False
    """The agent offers the slice to the kubelet (its device plugin lists it): set once the allocator asked for
    it with the ADVERTISE annotation, so the node's allocatable grows just before the pod is ungated."""
    message: str = ""
    created_at: str | None = None
    bound_at: str | None = None
    observed_generation: int = 0


class AllocationClaim(_Api):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ClaimSpec = msgspec.field(default_factory=lambda: ClaimSpec(start=0))
    status: ClaimStatus = msgspec.field(default_factory=ClaimStatus)


CLAIMS: Final = ResourceType(GROUP, VERSION, "allocationclaims", CLAIM_KIND, True, AllocationClaim)


def profile_of_resource(resource: str) -> str | None:
    """`nvidia.com/mig-1g.10gb` or `gpuops.io/mig-1g.10gb` -> `1g.10gb`; None for anything else.

    A resource name cannot hold `+`, so the media-extension profiles travel as `-me` / `-gfx`
    (`gpuops.io/mig-1g.10gb-me` is profile `1g.10gb+me`)."""
    for prefix in (NVIDIA_PREFIX, OUR_PREFIX):
        if resource.startswith(prefix):
            profile = _SUFFIX.sub(r"+\1", resource[len(prefix):])
            return profile if _PROFILE.fullmatch(profile) else None
    return None


def resource_of_profile(profile: str) -> str:
    """The extended resource a slice of `profile` is advertised and requested as."""
    return OUR_PREFIX + profile.replace("+", "-")


def claim_name(pod_name: str, pod_uid: str, index: int) -> str:
    """One claim per slice of a pod: the pod's name, a UID prefix (a recreated pod of the same name gets new
    claims) and the slice's index, within the 253 characters of an object name."""
    return f"{pod_name[:230]}-{pod_uid[:8]}-{index}"

"""The MIG slicer's API (gpuops.io/v1alpha1): MigNode (cluster-scoped, one per node, written by the node agent)
and AllocationClaim (in the pod's namespace, owned by the pod, so it is garbage-collected with it).

A pod asks for `nvidia.com/mig-<profile>`; the admission webhook renames it to `gpuops.io/mig-<profile>` and adds
the scheduling gate `gpuops.io/mig-slicer`. The allocator writes one claim per slice (spec: where), the agent
creates the slice and reports it (status: Created, device UUID), the allocator pins the pod to the node and lifts
the gate, the kubelet's Allocate (served by the agent's device plugin) hands the slice to the container (Bound).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Final, Literal

import msgspec

from gpuops.controllers.apigroup import (
    NVIDIA_MIG_PREFIX,
    OUR_MIG_PREFIX,
    ApiStruct,
    CustomObject,
    custom_resource,
    resource_type,
)
from gpuops.kube.crd import Column, Rule, crd
from gpuops.kube.crd.patterns import dns_subdomain, syntax
from gpuops.kube.objects import Condition

__all__ = [
    "ADVERTISE",
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

MIG_NODE_KIND: Final = "MigNode"
CLAIM_KIND: Final = "AllocationClaim"
GATE: Final = "gpuops.io/mig-slicer"
ADVERTISE: Final = "gpuops.io/advertise"
"""Claim annotation by which the allocator asks the agent to offer a Created slice to the kubelet."""
NODE_LABEL: Final = "gpuops.io/node"
"""Claim label: the agent of that node watches only its claims."""
POD_UID_LABEL: Final = "gpuops.io/pod-uid"
NVIDIA_PREFIX: Final = NVIDIA_MIG_PREFIX
OUR_PREFIX: Final = OUR_MIG_PREFIX

Phase = Literal["Pending", "Created", "Bound", "Released", "Failed"]
PHASES: Final[tuple[Phase, ...]] = ("Pending", "Created", "Bound", "Released", "Failed")

_PROFILE = re.compile(r"\d+g\.\d+gb(\+me|\+gfx)?")
_SUFFIX = re.compile(r"-(me|gfx)$")


MIG_UUID: Final = r"^(MIG-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})?$"
PLACEMENT_RULE: Final = Rule("self.start + self.size <= 8",
                             "start + size must be at most 8: a GPU has 8 memory slices (placements 0 to 7)")


def profile_syntax(**more: Any) -> msgspec.Meta:
    return syntax(r"^[1-8]g\.[0-9]{1,4}gb(\+me|\+gfx)?$", "must be a MIG profile: <compute>g.<memory>gb, optionally "
                  "+me or +gfx (e.g. 1g.10gb, 3g.40gb, 1g.10gb+me)", max_length=16, **more)


def gpu_uuid(**more: Any) -> msgspec.Meta:
    return syntax(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$", "must be a GPU UUID as NVML reports "
                  "it (GPU-<uuid>, e.g. GPU-5b1c7d2e-0f4a-4e8b-9c3d-2a1b0c9d8e7f)", max_length=40, **more)


# ---------------------------------------------------------------------------------------------- MigNode


class MigSlice(ApiStruct, kw_only=True):
    """One GPU instance (plus its compute instance) on a GPU."""

    __crd_rules__: ClassVar[tuple[Rule, ...]] = (PLACEMENT_RULE,)

    # required (never left out as a default): the CRD needs them, and start 0 is a real placement
    profile: Annotated[str, profile_syntax()]
    """The MIG profile (e.g. 1g.10gb, 1g.10gb+me)."""
    start: Annotated[int, crd(minimum=0, maximum=7)]
    """First memory slice of its placement."""
    size: Annotated[int, crd(minimum=1, maximum=8)]
    """Memory slices it covers."""
    device_uuid: Annotated[str, syntax(MIG_UUID, "must be empty or a MIG device UUID (MIG-<uuid>)", min_length=0,
                                       max_length=64)] = msgspec.field(default="", name="deviceUUID")
    """MIG device UUID (MIG-...) of its compute instance. Empty while no compute instance spans the whole GPU
    instance."""
    claim: Annotated[str, syntax(r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)?$",
                                 "must be empty or <namespace>/<name> of an AllocationClaim", min_length=0,
                                 max_length=317)] = ""
    """namespace/name of the live (Pending, Created or Bound) AllocationClaim it was made for. Empty if no live
    claim owns it; the agent destroys such a slice at once if its claim was Released or Failed, and after
    --orphan-grace seconds (default 30) otherwise."""
    gpu_instance_id: int | None = None
    """NVML GPU instance ID."""
    compute_instance_id: int | None = None
    """NVML ID of the compute instance that spans the whole GPU instance. Absent when there is none (only half
    made, or split into smaller compute instances)."""


# written whole, defaults included: a GPU with MIG disabled says migMode: Disabled
class MigGPU(ApiStruct, kw_only=True, omit_defaults=False):
    """One physical GPU."""

    index: Annotated[int, crd(minimum=0, maximum=63)]
    """The NVML device index."""
    uuid: Annotated[str, gpu_uuid()]
    """The GPU UUID (GPU-...). AllocationClaims name the GPU by it (spec.gpuUUID)."""
    model: Annotated[str, crd(max_length=64)]
    """The gpuops model key that selects the MIG geometry (e.g. A100-40GB, H100-80GB). It is empty when gpuops
    knows no geometry for the GPU, and then no slices can be made on it."""
    product: Annotated[str, crd(max_length=128)] = ""
    """The NVML product name with dashes for spaces, as GPU feature discovery writes it (e.g.
    NVIDIA-A100-SXM4-40GB)."""
    memory_mib: Annotated[int, crd(minimum=0, maximum=16777216)] = msgspec.field(default=0, name="memoryMiB")
    """Total GPU memory in MiB."""
    mig_mode: Literal["Enabled", "Disabled", "Pending"] = "Disabled"
    """Enabled or Disabled (the current MIG mode), or Pending (a mode change takes effect at the next GPU reset).
    The allocator plans slices only on Enabled GPUs."""
    slices: Annotated[tuple[MigSlice, ...], crd(max_items=8, rules=(
        Rule("self.all(a, self.all(b, a == b || a.start + a.size <= b.start || b.start + b.size <= a.start))",
             "slices must not overlap: each covers [start, start+size) of the GPU's memory slices"),
    ))] = ()
    """The GPU instances on the GPU, ordered by start, each with the claim it was made for. The allocator counts
    every one as occupied, including those it did not plan."""


class MigNodeSpec(ApiStruct):
    node_name: Annotated[str, dns_subdomain()] = ""
    """The Node this report describes (the agent's --node-name; the MigNode gets the same name). If it is empty,
    the allocator uses metadata.name."""


class MigNodeStatus(ApiStruct):
    backend: Annotated[str, crd(enum=("nvml", "emulated"))] = ""
    """nvml (the real GPUs, through NVML) or emulated (an NVML-shaped fake: the agent runs with --backend
    emulated)."""
    agent_version: Annotated[str, crd(max_length=64)] = ""
    """The gpuops version of the agent that wrote this report."""
    heartbeat: Annotated[str | None, crd(format="date-time")] = None
    """When the agent last wrote this report. If it is more than 120 s old, the allocator treats the agent as down
    and places no slices on the node."""
    gpus: Annotated[tuple[MigGPU, ...], crd(max_items=64, list_type="map", list_map_keys=("uuid",), rules=(
        Rule("self.all(g, self.exists_one(h, h.index == g.index))", "every GPU index must appear once"),
    ))] = ()
    """Every GPU on the node, in NVML index order, as read from the driver."""
    conditions: Annotated[tuple[Condition, ...] | None, crd(list_type="map", list_map_keys=("type",))] = None
    """metav1.Conditions, written by the operator (the agent writes none; use heartbeat to tell whether the agent
    is alive). ConflictDetected is True (reason MigManagerOnNode or DevicePluginMigStrategy) while another
    component manages or advertises the node's MIG geometry: no slice is planned there, and the agent makes and
    destroys none; False once that is over."""


class MigNode(CustomObject):
    """MigNode is the node agent's report of one node's MIG-capable GPUs and their slices. The MIG allocator reads
    it; nobody else writes it."""

    spec: MigNodeSpec = msgspec.field(default_factory=MigNodeSpec)
    """Which node this is, set by the node agent when it creates the MigNode."""
    status: MigNodeStatus = msgspec.field(default_factory=MigNodeStatus)
    """Written by the node agent when what it reports changes, and at least every --heartbeat seconds (default 15)."""


MIG_NODES: Final = resource_type("mignodes", MIG_NODE_KIND, False, MigNode)
MIG_NODE_CRD: Final = custom_resource(
    MIG_NODES,
    Column("Node", "string", ".spec.nodeName"),
    Column("GPUs", "integer", ".status.gpus[*].index", "GPUs the agent found (the last index; see .status.gpus).",
           priority=1),
    Column("Backend", "string", ".status.backend"),
    Column("Heartbeat", "date", ".status.heartbeat"),
)


# ---------------------------------------------------------------------------------------------- AllocationClaim


class ClaimSpec(ApiStruct, kw_only=True):
    """Where one slice of one pod goes; immutable once written (a new decision is a new claim)."""

    __crd_rules__: ClassVar[tuple[Rule, ...]] = (
        Rule("self == oldSelf", "an AllocationClaim's spec is immutable; create a new claim for a new placement"),
        PLACEMENT_RULE,
    )

    pod_name: Annotated[str, dns_subdomain(required=True)] = ""
    """The pod the slice is for, in the claim's namespace. The pod owns the claim, so deleting the pod
    garbage-collects it."""
    pod_uid: Annotated[str, syntax(r"^[-0-9A-Za-z]{1,64}$", "must be the pod's UID (letters, digits and '-')",
                                   max_length=64, required=True)] = msgspec.field(default="", name="podUID")
    """The pod's UID (also the label gpuops.io/pod-uid), so a new pod with the same name never takes over an old
    pod's claims."""
    node_name: Annotated[str, dns_subdomain(required=True)] = ""
    """The node whose agent makes the slice (the claim has the label gpuops.io/node with this value). The pod is
    pinned to this node when its gate is removed."""
    gpu_uuid: Annotated[str, gpu_uuid(required=True)] = msgspec.field(default="", name="gpuUUID")
    """The GPU on that node that holds the slice (its uuid in the node's MigNode)."""
    profile: Annotated[str, profile_syntax(required=True)] = ""
    """MIG profile, named for the GPU's model (e.g. 1g.10gb, 1g.10gb+me). The pod requests it as
    gpuops.io/mig-<profile>, with + written as -."""
    start: Annotated[int, crd(minimum=0, maximum=7)]
    """First memory slice of the GPU instance (its NVML placement start). The agent makes the slice at exactly this
    placement."""
    size: Annotated[int, crd(required=True, minimum=1, maximum=8)] = 0
    """Memory slices the GPU instance covers (its NVML placement size), starting at start."""


class ClaimStatus(ApiStruct):
    phase: Phase = "Pending"
    """Pending (the slice is not made yet; written by the allocator as it creates the claim; after 60 s the
    allocator deletes the claim and places the pod again), Created (the slice exists), Bound (the kubelet gave it
    to a container), Released (the pod finished; the agent destroys the slice) or Failed (the slice could not be
    made, or was lost after Bound; see message). For a Failed claim, the allocator places a pod that is still
    gated again, and deletes a running pod that lost its slice. Once its pod finished or is gone, the placement
    of a Released or Failed claim is free for new claims: the agent destroys the old slice before it makes
    theirs."""
    device_uuid: str = msgspec.field(default="", name="deviceUUID")
    """The MIG device UUID (MIG-...) of the slice, the value NVIDIA_VISIBLE_DEVICES names. Set together with
    Created."""
    advertised: bool = False
    """True once the agent's device plugin, registered with the kubelet, offers the slice to it as
    gpuops.io/mig-<profile>. The agent does this after the allocator annotates the claim gpuops.io/advertise, and
    the allocator ungates the pod only after that (and once the Node's allocatable lists the slice)."""
    message: str = ""
    """Why the claim is in its phase, for humans: written with every phase (whom a Pending claim waits for, the
    device made, the NVML error behind a Failed creation)."""
    created_at: Annotated[str | None, crd(format="date-time")] = None
    """When the agent last reported the slice made. It is written again when the slice is made again, e.g. after a
    reboot."""
    bound_at: Annotated[str | None, crd(format="date-time")] = None
    """When the kubelet's Allocate call gave the slice to a container (phase Bound)."""
    observed_generation: int = 0
    """Not written by gpuops (neither the agent nor the allocator sets it). The spec is immutable, so a claim only
    ever has one generation."""


class AllocationClaim(CustomObject):
    """AllocationClaim is one MIG slice for one pod at a fixed place (node, GPU, start). Its spec never changes: a
    new decision is a new claim."""

    spec: Annotated[ClaimSpec, crd(required=True)] = msgspec.field(default_factory=lambda: ClaimSpec(start=0))
    """Where the slice goes, written by the MIG allocator when it plans the pod. Never changed: to place the pod
    again the allocator deletes its claims and writes new ones."""
    status: ClaimStatus = msgspec.field(default_factory=ClaimStatus)
    """Written by the node agent (Created, Bound, Failed, deviceUUID, advertised) and by the MIG allocator
    (Released)."""


CLAIMS: Final = resource_type("allocationclaims", CLAIM_KIND, True, AllocationClaim)
CLAIM_CRD: Final = custom_resource(
    CLAIMS,
    Column("Pod", "string", ".spec.podName"),
    Column("Node", "string", ".spec.nodeName"),
    Column("Profile", "string", ".spec.profile"),
    Column("Start", "integer", ".spec.start"),
    Column("Phase", "string", ".status.phase", "Pending, Created, Bound, Released or Failed."),
    Column("GPU", "string", ".spec.gpuUUID", priority=1),
    Column("Message", "string", ".status.message", "Why the claim is in its phase; the device UUID once the "
           "slice is made (.status.deviceUUID).", priority=1),
    short_names=("ac",),
)


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

"""The MIG slicer's settings (the allocator and its admission webhook), and how `gpuops run` knows it.

The flags (`--mig-*`) are the fields marked `flag(...)`; the others are allocator timings that tests tune."""

from __future__ import annotations

from typing import Annotated

import msgspec

from gpuops.kube.registry import ControllerDefinition
from gpuops.kube.settings import flag

__all__ = ["CONTROLLER", "DEFAULT_NAMESPACE", "DEFAULT_PORT", "DEFAULT_SERVICE", "Settings"]

DEFAULT_PORT = 9443
DEFAULT_SERVICE = "gpuops-webhook"
DEFAULT_NAMESPACE = "gpuops-system"
"""The webhook Service's namespace when the operator runs outside a pod and none is given."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    pending_timeout: float = 60.0
    """A claim still Pending after this (its agent is gone or stuck) is deleted and the pod planned again."""
    agent_stale: float = 120.0
    """A MigNode whose heartbeat is older than this is not planned on (its agent is down)."""
    retry: float = 30.0
    """How often a pod that fits nowhere is looked at again even without a capacity change."""
    failed_backoff: float = 2.0
    advertise_timeout: Annotated[float, flag(
        "a MIG pod whose slices exist but are not offered to the kubelet this long after the allocator asked (the "
        "agent's device plugin not registered, the kubelet not listing them) is marked DeviceNotAdvertised with a "
        "Warning Event", metavar="SECONDS", ge=0)] = 60.0
    """Slices offered this long ago that the agent has not advertised, or the kubelet has not listed in the node's
    allocatable, make the pod DeviceNotAdvertised (a Warning): the agent's device plugin is not registered with
    the kubelet, or the kubelet does not take its devices. The pod keeps waiting; either may recover."""
    webhook_port: Annotated[int, flag("port of the MIG slicer's admission webhook (HTTPS, own CA; 0: no webhook)",
                                      metavar="PORT", ge=0, le=65535)] = DEFAULT_PORT
    webhook_host: Annotated[str, flag("address the webhook listens on (default: all)", metavar="ADDR")] = ""
    webhook_service: Annotated[str, flag("the webhook's Service, which its certificate names",
                                         metavar="NAME")] = DEFAULT_SERVICE
    webhook_namespace: Annotated[str | None, flag(
        f"the Service's namespace (default: the operator's, else {DEFAULT_NAMESPACE})", metavar="NS")] = None
    webhook_cert_dir: Annotated[str | None, flag(
        "keep the webhook's CA here across restarts (a writable volume; default: memory)", metavar="DIR")] = None


CONTROLLER = ControllerDefinition(
    "migslicer", Settings, "gpuops.controllers.migslicer.setup:setup", flag_prefix="mig",
    crds=("gpuops.controllers.migslicer.api:MIG_NODE_CRD", "gpuops.controllers.migslicer.api:CLAIM_CRD"))

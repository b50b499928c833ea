"""SpotPool (gpuops.io/v1alpha1, cluster-scoped, short name sp): a pool of spot GPU instances on a cloud API.

The tutorial's Spotpool kept cloud keys in the custom resource; here the spec only names a Secret. Everything a
launch needs to be repeated exactly (the client token and the parameters that went with it) is in
`status.pendingLaunch`, written before the call.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

from gpuops.controllers.errors import SpecError
from gpuops.kube.objects import Condition, ObjectMeta, Taint
from gpuops.kube.resources import ResourceType

__all__ = [
    "API_VERSION",
    "FINALIZER",
    "KIND",
    "POOLS",
    "CapacityBackoff",
    "CredentialsRef",
    "InstanceStatus",
    "OnDemandFallback",
    "PendingLaunch",
    "PoolSpec",
    "PoolStatus",
    "PoolTemplate",
    "SpecError",
    "SpotPool",
    "check_spec",
]

GROUP: Final = "gpuops.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "spotpools"
KIND: Final = "SpotPool"
API_VERSION: Final = f"{GROUP}/{VERSION}"
FINALIZER: Final = "gpuops.io/spotpool-instances"
"""Held while the pool may own instances: deletion terminates (or retains) them before the object goes."""
PROVIDERS: Final = ("tencent", "aws", "webhook", "sim")


class _Api(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Base of the CRD types: camelCase JSON, defaults left out, every field optional when decoding."""


class CredentialsRef(_Api):
    name: str = ""
    namespace: str = ""


class OnDemandFallback(_Api):
    """Launch on-demand instances of the same template after this many capacity errors in a row (every spot
    (zone, type) pair backed off); back to spot once a spot launch succeeds."""

    after_capacity_errors: int = 3


class PoolTemplate(_Api):
    region: str = ""
    zones: tuple[str, ...] = ()
    instance_types: tuple[str, ...] = ()
    """In preference order: the first (zone, type) pair not backed off after a capacity error is launched."""
    image: str | None = None
    subnet: str | None = None
    vpc: str | None = None
    security_groups: tuple[str, ...] = ()
    max_price: str | None = None
    user_data: str | None = None
    tags: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    taints: tuple[Taint, ...] | None = None
    gpus_per_instance: int = 1
    """GPUs one instance brings (for scaleOnDemand: how many instances the pending pods need)."""
    gpu_resource_name: str = "nvidia.com/gpu"


class PoolSpec(_Api):
    provider: str = ""
    minimum: int = 0
    maximum: int = 0
    scale_on_demand: bool = False
    template: PoolTemplate = msgspec.field(default_factory=PoolTemplate)
    endpoint: str | None = None
    """The cloud API endpoint, when not the provider's public one (private regions, the webhook and sim URLs)."""
    credentials_secret_ref: CredentialsRef | None = None
    on_demand_fallback: OnDemandFallback | None = None
    drain_timeout_seconds: int = 600
    deletion_policy: Literal["Terminate", "Retain"] = "Terminate"


class InstanceStatus(_Api):
    id: str = ""
    state: str = ""
    zone: str = ""
    type: str = ""
    capacity_type: str = "spot"
    private_ip: str | None = msgspec.field(default=None, name="privateIP")
    public_ip: str | None = msgspec.field(default=None, name="publicIP")
    node_name: str | None = None
    launched_at: str | None = None
    reclaim_at: str | None = None
    """When the cloud will take the instance back (a spot termination notice was seen)."""
    retiring_since: str | None = None
    """Scale-in chose it: cordoned and drained since then, terminated once empty or after drainTimeoutSeconds."""


class PendingLaunch(_Api):
    """A launch decided and persisted before the cloud is called: every retry, from this operator or its
    successor, sends the same client token with the same parameters, so the cloud sells the instances once."""

    client_token: str = ""
    count: int = 0
    since: str = ""
    instance_type: str = ""
    zone: str | None = None
    capacity_type: str = "spot"
    attempts: int = 0
    instance_ids: tuple[str, ...] = ()
    """What the cloud answered; the launch is resolved once describe lists them (or times out)."""


class CapacityBackoff(_Api):
    zone: str = ""
    instance_type: str = ""
    capacity_type: str = "spot"
    failures: int = 0
    until: str = ""


class PoolStatus(_Api):
    observed_generation: int = 0
    desired: int = 0
    size: int = 0
    ready: int = 0
    instances: tuple[InstanceStatus, ...] = ()
    pending_launch: PendingLaunch | None = None
    launch_sequence: int = 0
    """Launch intents created so far: the client token of the next one is derived from it."""
    capacity_errors: int = 0
    """Capacity errors since the last successful launch (the on-demand fallback counts these)."""
    backoff: tuple[CapacityBackoff, ...] = ()
    last_error: str | None = None
    conditions: tuple[Condition, ...] | None = None


class SpotPool(_Api):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PoolSpec = msgspec.field(default_factory=PoolSpec)
    status: PoolStatus = msgspec.field(default_factory=PoolStatus)


POOLS: Final = ResourceType(GROUP, VERSION, PLURAL, KIND, False, SpotPool)

_PRICE = re.compile(r"\d+(\.\d+)?")


def check_spec(spec: PoolSpec) -> None:
    """What the CRD's schema and CEL rules refuse at admission, checked again for objects that predate them."""
    if spec.provider not in PROVIDERS:
        raise SpecError("spec.provider", f"must be one of {', '.join(PROVIDERS)}, got {spec.provider!r}")
    for field, value in (("spec.minimum", spec.minimum), ("spec.maximum", spec.maximum)):
        if isinstance(value, bool) or value < 0:
            raise SpecError(field, f"must be an integer >= 0, got {value!r}")
    if spec.minimum > spec.maximum:
        raise SpecError("spec.maximum", f"must be >= spec.minimum ({spec.minimum}), got {spec.maximum}; raise it "
                        "or lower the minimum")
    t = spec.template
    if not t.instance_types:
        raise SpecError("spec.template.instanceTypes", "list at least one instance type, in order of preference")
    if spec.provider in ("tencent", "aws") and not t.region:
        raise SpecError("spec.template.region", f"required for the {spec.provider} provider (e.g. "
                        f"{'ap-guangzhou' if spec.provider == 'tencent' else 'us-east-1'})")
    if spec.provider == "tencent" and not t.zones:
        raise SpecError("spec.template.zones", "required for the tencent provider (CVM launches into a named zone, "
                        "e.g. ap-guangzhou-3)")
    if spec.provider in ("webhook", "sim") and not spec.endpoint:
        raise SpecError("spec.endpoint", f"required for the {spec.provider} provider: the base URL of its "
                        "instance API")
    if spec.provider in ("tencent", "aws") and spec.credentials_secret_ref is None:
        raise SpecError("spec.credentialsSecretRef", "name the Secret holding the cloud keys (name, namespace)")
    ref = spec.credentials_secret_ref
    if ref is not None and not (ref.name and ref.namespace):
        raise SpecError("spec.credentialsSecretRef", "needs both name and namespace (the pool is cluster-scoped)")
    if t.max_price is not None and not _PRICE.fullmatch(t.max_price):
        raise SpecError("spec.template.maxPrice", f"must be a decimal price per hour such as '1.25', got "
                        f"{t.max_price!r}")
    if t.gpus_per_instance < 1:
        raise SpecError("spec.template.gpusPerInstance", f"must be >= 1, got {t.gpus_per_instance}")
    if spec.drain_timeout_seconds < 0:
        raise SpecError("spec.drainTimeoutSeconds", f"must be >= 0, got {spec.drain_timeout_seconds}")
    fb = spec.on_demand_fallback
    if fb is not None and fb.after_capacity_errors < 1:
        raise SpecError("spec.onDemandFallback.afterCapacityErrors", f"must be >= 1, got "
                        f"{fb.after_capacity_errors}")
    if t.user_data is not None and len(t.user_data.encode()) > 12 * 1024:
        raise SpecError("spec.template.userData", "must be at most 12 KiB (it is base64-encoded into the cloud's "
                        "16 KB limit)")

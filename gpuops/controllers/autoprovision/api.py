"""GPUNodeGroup (gpuops.io/v1alpha1, cluster-scoped, short name gng): one power-managed GPU machine.

The seed configured each machine with environment variables (GPU_NODE_<n>_NAME, _GPU_COUNT,
_SCALE_UP_ENDPOINT, _SCALE_DOWN_ENDPOINT); `groups_from_env` turns those into the same specs, so its users
switch without rewriting their deployment. Secrets (a bearer token, an HMAC key) are only ever referenced.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from gpuops.controllers.errors import SpecError
from gpuops.kube.objects import Condition, ObjectMeta, Taint
from gpuops.kube.resources import ResourceType

__all__ = [
    "API_VERSION",
    "DEFAULT_RESOURCE",
    "GROUP",
    "GROUPS",
    "KIND",
    "PLURAL",
    "STATES",
    "VERSION",
    "EnvGroup",
    "GPUNodeGroup",
    "GroupSpec",
    "GroupStatus",
    "LastWebhook",
    "NodeTemplate",
    "PendingTransition",
    "SecretRef",
    "SpecError",
    "State",
    "Webhook",
    "check_spec",
    "groups_from_env",
]

GROUP: Final = "gpuops.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "gpunodegroups"
KIND: Final = "GPUNodeGroup"
API_VERSION: Final = f"{GROUP}/{VERSION}"
DEFAULT_RESOURCE: Final = "nvidia.com/gpu"

State = Literal["Off", "PoweringOn", "Ready", "Draining", "PoweringOff", "Failed"]
STATES: Final[tuple[State, ...]] = ("Off", "PoweringOn", "Ready", "Draining", "PoweringOff", "Failed")


class _Api(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Base of the CRD types: camelCase JSON, defaults left out, every field optional when decoding."""


# ---------------------------------------------------------------------------------------------- spec


class SecretRef(_Api):
    """A Secret holding the webhook's credentials; the operator reads it, the spec never holds them."""

    name: str = ""
    namespace: str = ""
    token_key: str = "token"
    hmac_key_key: str = "hmacKey"


class Webhook(_Api):
    url: str = ""
    headers: dict[str, str] | None = None
    secret_ref: SecretRef | None = None
    timeout_seconds: int = 10


class NodeTemplate(_Api):
    """What the node will look like once it joins (fit checks before it ever has)."""

    labels: dict[str, str] | None = None
    taints: tuple[Taint, ...] | None = None


class GroupSpec(_Api):
    node_name: str = ""
    gpu_count: int = 0
    gpu_resource_name: str = DEFAULT_RESOURCE
    scale_up: Webhook = msgspec.field(default_factory=Webhook)
    scale_down: Webhook = msgspec.field(default_factory=Webhook)
    template: NodeTemplate = msgspec.field(default_factory=NodeTemplate)
    priority: int = 0
    boot_timeout_seconds: int = 900
    scale_down_unneeded_seconds: int = 600
    scale_down_delay_after_scale_up_seconds: int = 600


# ---------------------------------------------------------------------------------------------- status


class PendingTransition(_Api):
    """A power transition decided and persisted before its webhook is called: a retry or a restarted operator
    sends the same Idempotency-Key, and never a second transition for the same decision."""

    direction: Literal["up", "down"] = "up"
    key: str = ""
    decided_at: str = ""
    attempts: int = 0
    sent: bool = False
    """True once the webhook answered 2xx."""


class LastWebhook(_Api):
    direction: str = ""
    url: str = ""
    code: int | None = None
    time: str = ""
    attempt: int = 0
    error: str = ""


class GroupStatus(_Api):
    observed_generation: int = 0
    state: str = ""
    """Empty until the controller has seen the group (then always written, so `kubectl get gng` shows Off)."""
    since: str | None = None
    boot_deadline: str | None = None
    idle_since: str | None = None
    transition: PendingTransition | None = None
    last_webhook: LastWebhook | None = None
    failures: int = 0
    backoff_until: str | None = None
    last_scale_up: str | None = None
    conditions: tuple[Condition, ...] | None = None


class GPUNodeGroup(_Api):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: GroupSpec = msgspec.field(default_factory=GroupSpec)
    status: GroupStatus = msgspec.field(default_factory=GroupStatus)


GROUPS: Final = ResourceType(GROUP, VERSION, PLURAL, KIND, False, GPUNodeGroup)


# ---------------------------------------------------------------------------------------------- checks


_URL = re.compile(r"https?://[^\s/$.?#][^\s]*", re.IGNORECASE)


def check_spec(spec: GroupSpec) -> None:
    """What the CRD's schema and CEL rules refuse at admission, checked again for objects that predate them
    (and for groups built from environment variables, which no API server validated)."""
    if not spec.node_name:
        raise SpecError("spec.nodeName", "required: the name the machine's Node object has once it joins")
    if isinstance(spec.gpu_count, bool) or spec.gpu_count < 1:
        raise SpecError("spec.gpuCount", f"must be an integer >= 1 (GPUs the node offers), got {spec.gpu_count!r}")
    for where, hook in (("spec.scaleUp", spec.scale_up), ("spec.scaleDown", spec.scale_down)):
        if not _URL.fullmatch(hook.url or ""):
            raise SpecError(f"{where}.url", f"must be an http(s) URL to POST the power request to, got {hook.url!r}")
        if hook.timeout_seconds < 1:
            raise SpecError(f"{where}.timeoutSeconds", f"must be >= 1, got {hook.timeout_seconds}")
        ref = hook.secret_ref
        if ref is not None and not (ref.name and ref.namespace):
            raise SpecError(f"{where}.secretRef", "needs both name and namespace (the group is cluster-scoped)")
    for field, value in (("spec.bootTimeoutSeconds", spec.boot_timeout_seconds),
                         ("spec.scaleDownUnneededSeconds", spec.scale_down_unneeded_seconds),
                         ("spec.scaleDownDelayAfterScaleUpSeconds", spec.scale_down_delay_after_scale_up_seconds)):
        if value < 0:
            raise SpecError(field, f"must be >= 0 seconds, got {value}")
    if spec.boot_timeout_seconds < 1:
        raise SpecError("spec.bootTimeoutSeconds", "must be >= 1: a boot that can never time out is never retried")


# ---------------------------------------------------------------------------------------------- the seed's env


_ENV_NAME = re.compile(r"(?P<prefix>.+)_NAME")


@dataclass(frozen=True, slots=True)
class EnvGroup:
    """A group defined by the seed's environment variables, keyed by its prefix (e.g. GPU_NODE_1)."""

    prefix: str
    spec: GroupSpec


def groups_from_env(env: Mapping[str, str]) -> list[EnvGroup]:
    """Every `<P>_NAME` with `<P>_GPU_COUNT`, `<P>_SCALE_UP_ENDPOINT` and `<P>_SCALE_DOWN_ENDPOINT` set defines a
    group, as in the seed. A prefix with some but not all four is an error naming the missing variables."""
    out: list[EnvGroup] = []
    for key in sorted(env):
        m = _ENV_NAME.fullmatch(key)
        if m is None:
            continue
        p = m["prefix"]
        wanted = {f"{p}_GPU_COUNT", f"{p}_SCALE_UP_ENDPOINT", f"{p}_SCALE_DOWN_ENDPOINT"}
        present = {k for k in wanted if env.get(k)}
        if not present:
            continue  # some other *_NAME variable (e.g. POD_NAME): not a group
        if present != wanted:
            missing = ", ".join(sorted(wanted - present))
            raise SpecError(key, f"node group {p} is incomplete: set {missing} as well")
        try:
            count = int(env[f"{p}_GPU_COUNT"])
        except ValueError:
            raise SpecError(f"{p}_GPU_COUNT", f"must be an integer, got {env[f'{p}_GPU_COUNT']!r}") from None
        spec = GroupSpec(node_name=env[key], gpu_count=count,
                         scale_up=Webhook(url=env[f"{p}_SCALE_UP_ENDPOINT"]),
                         scale_down=Webhook(url=env[f"{p}_SCALE_DOWN_ENDPOINT"]))
        check_spec(spec)
        out.append(EnvGroup(p, spec))
    return out

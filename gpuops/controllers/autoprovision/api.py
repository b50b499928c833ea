"""GPUNodeGroup (gpuops.io/v1alpha1, cluster-scoped, short name gng): one power-managed GPU machine.

k8s-gpu-autoprovision, the autoprovisioner gpuops replaces, configures each machine with environment variables
(GPU_NODE_<n>_NAME, _GPU_COUNT, _SCALE_UP_ENDPOINT, _SCALE_DOWN_ENDPOINT); `groups_from_env` turns those into the
same specs, so its users switch without rewriting their deployment. Secrets (a bearer token, an HMAC key) are only
ever referenced.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import msgspec

from gpuops.controllers.apigroup import DEFAULT_RESOURCE, ApiStruct, CustomObject, custom_resource, resource_type
from gpuops.controllers.errors import SpecError
from gpuops.kube.crd import USE_DEFAULT, Column, Rule, crd
from gpuops.kube.crd.markers import marker
from gpuops.kube.crd.patterns import dns_label, dns_subdomain, http_url, label_map, resource_name, secret_key
from gpuops.kube.objects import Condition, Taint

__all__ = [
    "DEFAULT_RESOURCE",
    "GROUPS",
    "KIND",
    "PLURAL",
    "STATES",
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
    "plain_http_credentials",
    "secret_refs",
]

PLURAL: Final = "gpunodegroups"
KIND: Final = "GPUNodeGroup"

State = Literal["Off", "PoweringOn", "Ready", "Draining", "PoweringOff", "Failed"]
STATES: Final[tuple[State, ...]] = ("Off", "PoweringOn", "Ready", "Draining", "PoweringOff", "Failed")


HEADER_RULES: Final = (
    Rule(r"self.all(k, size(k) <= 256 && k.matches(r'^[-!#$%&\x27*+.^_`|~0-9A-Za-z]+$'))",
         "every header name must be an HTTP token (letters, digits and !#$%&'*+-.^_`|~), e.g. X-Site"),
    Rule("!self.exists(k, k.lowerAscii() in ['authorization', 'idempotency-key', 'content-type', 'content-length', "
         "'host', 'x-gpuops-signature', 'x-gpuops-timestamp'])",
         "headers must not set Authorization, Idempotency-Key, Content-Type, Content-Length, Host or X-Gpuops-*: "
         "gpuops sets them (put a token in the Secret named by secretRef)"),
    Rule("self.all(k, !self[k].contains('\\n') && !self[k].contains('\\r'))",
         "header values must be one line (no CR or LF)"),
)


# ---------------------------------------------------------------------------------------------- spec


class SecretRef(ApiStruct):
    """A Secret holding the webhook's credentials; the operator reads it, the spec never holds them."""

    name: Annotated[str, dns_subdomain(required=True)] = ""
    """Name of the Secret."""
    namespace: Annotated[str, dns_label(required=True)] = ""
    """Namespace of the Secret (required, as the group is cluster-scoped)."""
    token_key: Annotated[str, secret_key(default=USE_DEFAULT)] = "token"
    """Key in the Secret whose value is sent as Authorization: Bearer <value>. The Secret must have this key,
    hmacKeyKey or both; it is read again for every call."""
    hmac_key_key: Annotated[str, secret_key(default=USE_DEFAULT)] = "hmacKey"
    """Key in the Secret holding the HMAC key. When it is present, every attempt carries X-Gpuops-Timestamp and
    X-Gpuops-Signature: sha256= and the hex HMAC-SHA256 of "<timestamp>." followed by the body."""


class Webhook(ApiStruct):
    url: Annotated[str, http_url(required=True)] = ""
    """Receives POST {"node", "action", "idempotencyKey"} with an Idempotency-Key header that stays the same across
    retries of one transition, and X-Gpuops-Signature when an HMAC key is set."""
    headers: Annotated[dict[str, str] | None, crd(max_properties=32, items=marker(max_length=4096),
                                                  rules=HEADER_RULES)] = None
    """Extra static headers (never put credentials here; use secretRef)."""
    secret_ref: SecretRef | None = None
    """A Secret with a bearer token (sent as Authorization) and/or an HMAC key (signs the body)."""
    timeout_seconds: Annotated[int, crd(default=USE_DEFAULT, minimum=1, maximum=300)] = 10
    """Per attempt; failed attempts are retried with exponential backoff and jitter."""
    insecure_allow_http: Annotated[bool, crd(default=USE_DEFAULT)] = msgspec.field(default=False,
                                                                                   name="insecureAllowHTTP")
    """Send the Secret's bearer token over a plain http:// URL. Off by default: such a group is refused
    (Ready=False, InsecureTransport) until the URL is https or this is set; while it is set and used, the
    condition InsecureTransport=True says so. For a loopback or trusted network only."""


class NodeTemplate(ApiStruct):
    """What the node will look like once it joins (fit checks before it ever has)."""

    labels: Annotated[dict[str, str] | None, label_map("spec.template.labels")] = None
    """Labels the node will have (kubernetes.io/hostname=nodeName is implied), checked against pending pods'
    nodeSelector and required node affinity while no Node object exists. gpuops does not put them on the node."""
    taints: Annotated[tuple[Taint, ...] | None, crd(max_items=64)] = None
    """Taints the node will have. While no Node object exists, a pending pod only counts as demand for this machine
    if it tolerates the NoSchedule and NoExecute ones. gpuops does not put them on the node."""


class GroupSpec(ApiStruct):
    node_name: Annotated[str, dns_subdomain(required=True)] = ""
    """The name of the machine's Node object once it has joined the cluster."""
    gpu_count: Annotated[int, crd(required=True, minimum=1, maximum=1024)] = 0
    """GPUs the node offers (its allocatable gpuResourceName once the device plugin is up)."""
    gpu_resource_name: Annotated[str, resource_name(default=USE_DEFAULT)] = DEFAULT_RESOURCE
    """The extended resource pods request, e.g. nvidia.com/gpu."""
    scale_up: Annotated[Webhook, crd(required=True)] = msgspec.field(default_factory=Webhook)
    """An HTTP endpoint that receives a POST for this power transition (only 2xx counts)."""
    scale_down: Annotated[Webhook, crd(required=True)] = msgspec.field(default_factory=Webhook)
    """An HTTP endpoint that receives a POST for this power transition (only 2xx counts)."""
    template: NodeTemplate = msgspec.field(default_factory=NodeTemplate)
    """The labels and taints the node will have once it joins, so pods are matched against a machine that has never
    been up (a pod that cannot run on it is not demand for it)."""
    priority: Annotated[int, crd(default=USE_DEFAULT, minimum=-1000000, maximum=1000000)] = 0
    """Among machines that fit equally well, the higher priority is powered on first."""
    boot_timeout_seconds: Annotated[int, crd(default=USE_DEFAULT, minimum=1, maximum=86400)] = 900
    """Seconds from the power-on request until the node must be Ready with its GPUs allocatable; past it the group
    is Failed and backs off (5 min doubling to 30 min) while another is tried."""
    scale_down_unneeded_seconds: Annotated[int, crd(default=USE_DEFAULT, minimum=0, maximum=604800)] = 600
    """Seconds the node must have had no GPU pods before it is powered off."""
    scale_down_delay_after_scale_up_seconds: Annotated[int, crd(default=USE_DEFAULT, minimum=0,
                                                                maximum=604800)] = 600
    """No power-off within this many seconds of any scale-up."""


# ---------------------------------------------------------------------------------------------- status


class PendingTransition(ApiStruct):
    """A power transition decided and persisted before its webhook is called: a retry or a restarted operator
    sends the same Idempotency-Key, and never a second transition for the same decision."""

    direction: Literal["up", "down"] = "up"
    """up (power on, sent to scaleUp) or down (power off, sent to scaleDown)."""
    key: str = ""
    """The Idempotency-Key that every attempt of this transition carries: gpuops-<direction>- followed by a hash of
    the node, the direction, the generation and decidedAt."""
    decided_at: Annotated[str, crd(format="date-time")] = ""
    """When the transition was decided."""
    attempts: int = 0
    """HTTP requests sent for this transition so far, counted across reconciles and operator restarts."""
    sent: bool = False
    """True once the webhook answered 2xx."""


class LastWebhook(ApiStruct):
    direction: str = ""
    """up or down."""
    url: str = ""
    """Query values redacted."""
    code: int | None = None
    """HTTP status of the last answer; absent when no answer came (connection failed or timed out)."""
    time: Annotated[str, crd(format="date-time")] = ""
    """When the call's last attempt ended."""
    attempt: int = 0
    """The transition's attempt count when the call ended (its transition.attempts)."""
    error: str = ""
    """Why the call failed, with secrets redacted; empty on success."""


class GroupStatus(ApiStruct):
    observed_generation: int = 0
    """The spec generation this status was written for (set on every status write)."""
    state: Annotated[str, crd(enum=("Off", "PoweringOn", "Ready", "Draining", "PoweringOff", "Failed"))] = ""
    """Off (available to power on), PoweringOn (requested; until Ready with GPUs or bootDeadline), Ready, Draining
    (tainted, pods being evicted), PoweringOff (requested), Failed (did not boot in time; offered again after
    backoffUntil)."""
    since: Annotated[str | None, crd(format="date-time")] = None
    """When the group entered its state."""
    boot_deadline: Annotated[str | None, crd(format="date-time")] = None
    """When the current power-on times out: the time it was decided plus bootTimeoutSeconds. If the node is not
    Ready with its GPUs allocatable by then, the group becomes Failed."""
    idle_since: Annotated[str | None, crd(format="date-time")] = None
    """Since when the Ready node has had no GPU pods."""
    transition: PendingTransition | None = None
    """The power transition decided and persisted before its webhook is called: retries and a restarted operator
    send the same Idempotency-Key, never a second transition for one decision."""
    last_webhook: LastWebhook | None = None
    """The most recent power webhook call and how it ended."""
    webhook: str = ""
    """What the WEBHOOK column shows: the last call's HTTP code, "unsent" (nothing was sent: a bad URL, header or
    Secret), "no answer" (the connection failed or timed out), or "none" before the first call."""
    failures: int = 0
    """Consecutive boot timeouts (the backoff doubles with each, 5 min to 30 min)."""
    backoff_until: Annotated[str | None, crd(format="date-time")] = None
    """When a Failed group goes back to Off and the planner may power it on again."""
    last_scale_up: Annotated[str | None, crd(format="date-time")] = None
    """When a power-on of this group was last decided. No group is powered off within its
    scaleDownDelayAfterScaleUpSeconds of the latest lastScaleUp of any group."""
    conditions: Annotated[tuple[Condition, ...] | None, crd(list_type="map", list_map_keys=("type",))] = None
    """Ready (True while state is Ready; when False, the reason says why, e.g. Observed, BootTimeout, PoweredOff,
    InvalidSpec, SecretNotAllowed or InsecureTransport), WebhookFailing (True with reason Retrying or Refused while
    a power webhook call fails; False with reason Accepted once one succeeds), InsecureTransport (True while a
    token goes over plain HTTP, as insecureAllowHTTP allows) and ConflictDetected (True while the node must not be
    powered off because another autoscaler manages it or an annotation protects it: reason KarpenterManagedNode,
    ClusterAutoscalerScaleDown or NodeProtected; False once that is over). metav1.Condition."""


class GPUNodeGroup(CustomObject):
    """GPUNodeGroup is one power-managed GPU machine (a "node group" of dseif0x/k8s-gpu-autoprovision, the
    autoprovisioner gpuops replaces). gpuops powers it on when pending GPU pods need it (smallest sufficient machine
    first) and off once it has had no GPU pods for scaleDownUnneededSeconds (largest idle machine first), by POSTing
    to the webhooks below."""

    spec: Annotated[GroupSpec, crd(required=True)] = msgspec.field(default_factory=GroupSpec)
    """The machine, its webhooks and its timing."""
    status: GroupStatus = msgspec.field(default_factory=GroupStatus)
    """Written by the autoprovision controller."""


GROUPS: Final = resource_type(PLURAL, KIND, False, GPUNodeGroup)
CRD: Final = custom_resource(
    GROUPS,
    Column("Node", "string", ".spec.nodeName"),
    Column("GPUs", "integer", ".spec.gpuCount"),
    Column("State", "string", ".status.state", "Off, PoweringOn, Ready, Draining, PoweringOff or Failed."),
    Column("Since", "date", ".status.since"),
    Column("Webhook", "string", ".status.webhook", "The last power webhook call: its HTTP code, unsent or no answer."),
    Column("Priority", "integer", ".spec.priority", priority=1),
    short_names=("gng",),
)


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


def plain_http_credentials(spec: GroupSpec) -> list[tuple[str, Webhook]]:
    """(field, webhook) of each webhook that would send a Secret's token over plain http://."""
    return [(where, hook) for where, hook in (("spec.scaleUp", spec.scale_up), ("spec.scaleDown", spec.scale_down))
            if hook.secret_ref is not None and hook.url.lower().startswith("http://")]


def secret_refs(spec: GroupSpec) -> list[tuple[str, str]]:
    """(field, namespace) of each Secret the spec names: the operator reads only those its scope allows."""
    return [(f"{where}.secretRef", hook.secret_ref.namespace)
            for where, hook in (("spec.scaleUp", spec.scale_up), ("spec.scaleDown", spec.scale_down))
            if hook.secret_ref is not None]


# ----------------------------------------------------------------------------- k8s-gpu-autoprovision's env


_ENV_NAME = re.compile(r"(?P<prefix>.+)_NAME")


@dataclass(frozen=True, slots=True)
class EnvGroup:
    """A group defined by k8s-gpu-autoprovision's environment variables, keyed by its prefix (e.g. GPU_NODE_1)."""

    prefix: str
    spec: GroupSpec


def groups_from_env(env: Mapping[str, str]) -> list[EnvGroup]:
    """Every `<P>_NAME` with `<P>_GPU_COUNT`, `<P>_SCALE_UP_ENDPOINT` and `<P>_SCALE_DOWN_ENDPOINT` set defines a
    group, as in k8s-gpu-autoprovision. A prefix with some but not all four is an error naming the missing variables."""
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

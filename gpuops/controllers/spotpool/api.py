"""SpotPool (gpuops.io/v1alpha1, cluster-scoped, short name sp): a pool of spot GPU instances on a cloud API.

The tutorial's Spotpool kept cloud keys in the custom resource; here the spec only names a Secret. Everything a
launch needs to be repeated exactly (the client token and the parameters that went with it) is in
`status.pendingLaunch`, written before the call.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, ClassVar, Final, Literal
from urllib.parse import urlsplit

import msgspec

from gpuops.controllers.apigroup import DEFAULT_RESOURCE, ApiStruct, CustomObject, custom_resource, resource_type
from gpuops.controllers.errors import SpecError
from gpuops.kube.crd import USE_DEFAULT, Column, Rule, crd
from gpuops.kube.crd.markers import marker
from gpuops.kube.crd.patterns import dns_label, dns_subdomain, label_map, resource_name, syntax
from gpuops.kube.objects import Condition, Taint

__all__ = [
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
    "is_loopback",
    "plain_http",
]

PLURAL: Final = "spotpools"
KIND: Final = "SpotPool"
FINALIZER: Final = "gpuops.io/spotpool-instances"
"""Held while the pool may own instances: deletion terminates (or retains) them before the object goes."""
PROVIDERS: Final = ("tencent", "aws", "webhook", "sim")


CLOUD_NAME: Final = r"^[a-z0-9]([-a-z0-9]{0,62}[a-z0-9])?$"
"""Region and zone names as the clouds spell them."""
CLOUD_ID: Final = r"^[A-Za-z0-9]([-A-Za-z0-9._]{0,126}[A-Za-z0-9])?$"
"""Instance types and resource IDs (images, subnets, VPCs, security groups)."""
ENDPOINT: Final = r"^(https?://[^\s/?#@]+(/[^\s]*)?|[^\s/?#@:]+(:[0-9]{1,5})?)$"
"""An http(s) URL without user information, or host[:port]."""


def cloud_id(example: str) -> msgspec.Meta:
    return syntax(CLOUD_ID, f"must be {example}: letters, digits, '.', '_' and '-'", max_length=128)


class CredentialsRef(ApiStruct):
    name: Annotated[str, dns_subdomain(required=True)] = ""
    """Name of the Secret."""
    namespace: Annotated[str, dns_label(required=True)] = ""
    """Namespace of the Secret (required, as the pool is cluster-scoped)."""


class OnDemandFallback(ApiStruct):
    """Launch on-demand instances of the same template after this many capacity errors in a row (every spot
    (zone, type) pair backed off); back to spot once a spot launch succeeds."""

    after_capacity_errors: Annotated[int, crd(default=USE_DEFAULT, minimum=1, maximum=1000)] = 3
    """How many capacity errors since the last successful spot launch (status.capacityErrors) allow on-demand
    launches. On-demand is used only while every spot zone and type is backed off."""


class PoolTemplate(ApiStruct):
    region: Annotated[str, syntax(CLOUD_NAME, "must be a region name: lowercase letters, digits and '-' (e.g. "
                                  "ap-guangzhou, us-east-1)", max_length=64)] = ""
    """Cloud region, e.g. ap-guangzhou or us-east-1. Required for tencent and aws; the webhook and sim providers
    ignore it."""
    zones: Annotated[tuple[str, ...], crd(max_items=16, list_type="set", items=marker(max_length=64), rules=(
        Rule(f"self.all(z, z.matches(r'{CLOUD_NAME}'))",
             "every zone must be a zone name: lowercase letters, digits and '-' (e.g. ap-guangzhou-3, us-east-1a)"),
    ))] = ()
    """Zones to launch in, in order of preference; a zone whose capacity runs out is backed off and the next one
    tried. Required for tencent (CVM launches into a named zone); empty for aws lets EC2 choose (the subnet's
    zone when a subnet is set)."""
    instance_types: Annotated[tuple[str, ...], crd(
        required=True, min_items=1, max_items=16, list_type="set", items=marker(max_length=64), rules=(
            Rule(f"self.all(t, t.matches(r'{CLOUD_ID}'))",
                 "every instance type must be a type name: letters, digits, '.', '_' and '-' (e.g. GN10Xp.2XLARGE40, "
                 "p5.48xlarge)"),
        ))] = ()
    """Instance types in order of preference; after a capacity error a (zone, type) pair is backed off (30 s
    doubling to 10 min) and the next one is tried."""
    image: Annotated[str | None, cloud_id("an image ID (e.g. img-xxxxxxxx, ami-0123456789abcdef0)")] = None
    """Image to boot: the CVM ImageId (tencent), the AMI ID (aws), imageId (webhook, sim). Sent only when set."""
    subnet: Annotated[str | None, cloud_id("a subnet ID (e.g. subnet-xxxxxxxx)")] = None
    """Subnet ID to launch into: SubnetId for tencent (with vpc) and aws, subnetId for webhook and sim. Sent only
    when set."""
    vpc: Annotated[str | None, cloud_id("a VPC ID (e.g. vpc-xxxxxxxx)")] = None
    """VPC ID, sent with the subnet to tencent (VirtualPrivateCloud) and as vpcId to webhook and sim. The aws
    provider ignores it (EC2 takes the VPC from the subnet)."""
    security_groups: Annotated[tuple[str, ...], crd(max_items=16, list_type="set", items=marker(max_length=128), rules=(
        Rule(f"self.all(g, g.matches(r'{CLOUD_ID}'))",
             "every security group must be an ID: letters, digits, '.', '_' and '-' (e.g. sg-xxxxxxxx)"),
    ))] = ()
    """Security group IDs the instances get. Sent only when set."""
    max_price: Annotated[str | None, syntax(r"^[0-9]{1,6}(\.[0-9]{1,6})?$", "must be a decimal price per hour "
                                            "such as 1.25 (no currency, no sign)", max_length=13)] = None
    """Highest spot price per hour; leave unset to pay the current spot price (AWS advice)."""
    user_data: Annotated[str | None, crd(max_length=12288)] = None
    """Boot script (plain text; base64-encoded for the cloud), e.g. the kubelet join."""
    tags: Annotated[dict[str, str] | None, crd(max_properties=40, items=marker(max_length=255), rules=(
        Rule("!self.exists(k, k.startsWith('gpuops.io/'))",
             "tag keys starting with gpuops.io/ are reserved for ownership tags"),
        Rule("self.all(k, size(k) >= 1 && size(k) <= 127)", "tag keys must be 1 to 127 characters long"),
    ))] = None
    """Extra tags for every instance, added to the ownership tags gpuops.io/pool, gpuops.io/managed-by and
    gpuops.io/launch-id."""
    labels: Annotated[dict[str, str] | None, label_map("spec.template.labels")] = None
    """Labels the pool's nodes get (the controller sets them when a node joins)."""
    taints: Annotated[tuple[Taint, ...] | None, crd(max_items=64)] = None
    """Taints the pool's nodes get (the controller sets them when a node joins)."""
    gpus_per_instance: Annotated[int, crd(default=USE_DEFAULT, minimum=1, maximum=64)] = 1
    """GPUs one instance brings. With scaleOnDemand it sets how many instances the pending pods need; a pod that
    asks for more GPUs than this never counts as demand."""
    gpu_resource_name: Annotated[str, resource_name(default=USE_DEFAULT)] = DEFAULT_RESOURCE
    """The extended resource the instances' GPUs are advertised as. A node counts as ready once some of it is
    allocatable, and pods that request it make a node busy or, with scaleOnDemand, are demand."""


class PoolSpec(ApiStruct):
    __crd_rules__: ClassVar[tuple[Rule, ...]] = (
        Rule("self.minimum <= self.maximum", "spec.minimum must be <= spec.maximum: raise maximum or lower minimum"),
        Rule("!(self.provider in ['webhook', 'sim']) || has(self.endpoint)",
             "the webhook and sim providers need spec.endpoint (the base URL of the instance API)"),
        Rule("!(self.provider in ['tencent', 'aws']) || has(self.credentialsSecretRef)",
             "the tencent and aws providers need spec.credentialsSecretRef (the Secret with the keys)"),
        Rule("!(self.provider in ['tencent', 'aws']) || (has(self.template.region) && self.template.region != '')",
             "the tencent and aws providers need spec.template.region"),
        Rule("self.provider != 'tencent' || (has(self.template.zones) && size(self.template.zones) > 0)",
             "the tencent provider needs spec.template.zones (CVM launches into a named zone)"),
    )

    provider: Annotated[str, crd(required=True, enum=("tencent", "aws", "webhook", "sim"))] = ""
    """Which cloud API the pool's instances live on."""
    minimum: Annotated[int, crd(default=USE_DEFAULT, minimum=0, maximum=10000)] = 0
    """Instances the pool always keeps (reclaimed ones are replaced at once)."""
    maximum: Annotated[int, crd(required=True, minimum=0, maximum=10000)] = 0
    """Instances the pool never exceeds, counting launches still in flight."""
    scale_on_demand: Annotated[bool, crd(default=USE_DEFAULT)] = False
    """Grow within [minimum, maximum] for unschedulable GPU pods that fit the pool's nodes (template labels and
    taints, gpusPerInstance); idle instances above minimum are retired."""
    template: Annotated[PoolTemplate, crd(required=True)] = msgspec.field(default_factory=PoolTemplate)
    """What every instance is launched with, and the labels and taints its node gets. Launch settings only affect
    later launches (running instances are not replaced); labels and taints added later are also put on the
    pool's existing nodes."""
    endpoint: Annotated[str | None, syntax(ENDPOINT, "must be host[:port] or an http(s) URL without "
                                           "user:password@ (credentials go in the Secret), e.g. "
                                           "https://spot.example.com/api", max_length=512)] = None
    """API endpoint when not the provider's public one: host:port or URL for tencent (HttpProfile), the endpoint
    URL for aws, the base URL of the instance API for webhook and sim."""
    credentials_secret_ref: CredentialsRef | None = None
    """Secret with the cloud keys. tencent - secretId, secretKey (token optional); aws - accessKeyId,
    secretAccessKey (sessionToken optional); webhook and sim - token (optional bearer token)."""
    insecure_allow_http: Annotated[bool, crd(default=USE_DEFAULT)] = msgspec.field(default=False,
                                                                                   name="insecureAllowHTTP")
    """Use the credentials over plain http:// (an http endpoint, or a loopback host for tencent). Off by default:
    such a pool is refused (Ready=False, InsecureTransport) until the endpoint is https or this is set; while
    it is set and used, the condition InsecureTransport=True says so. For a loopback or trusted network only."""
    on_demand_fallback: OnDemandFallback | None = None
    """Launch on-demand instances after this many capacity errors in a row (every spot zone and type backed off);
    spot again after the next successful spot launch. Absent - spot only."""
    drain_timeout_seconds: Annotated[int, crd(default=USE_DEFAULT, minimum=0, maximum=604800)] = 600
    """On scale-in, how long to wait for the node's pods to be evicted before terminating."""
    deletion_policy: Annotated[Literal["Terminate", "Retain"], crd(default=USE_DEFAULT)] = "Terminate"
    """On deletion of the pool, Terminate every instance it owns, or Retain them (the tags stay; a new pool of the
    same name adopts them)."""


class InstanceStatus(ApiStruct):
    """One instance as the cloud describes it, and its Node."""

    id: str = ""
    """The cloud's instance ID."""
    state: str = ""
    """Cloud state under CVM names (other providers' states are mapped to them): PENDING, LAUNCH_FAILED, RUNNING,
    STOPPED, STARTING, STOPPING, REBOOTING, SHUTDOWN or TERMINATING. LAUNCH_FAILED, STOPPED and SHUTDOWN
    instances are terminated."""
    zone: str = ""
    """Availability zone."""
    type: str = ""
    """Instance type."""
    capacity_type: str = "spot"
    """spot or on-demand."""
    private_ip: str | None = msgspec.field(default=None, name="privateIP")
    """Private IP address, if it has one."""
    public_ip: str | None = msgspec.field(default=None, name="publicIP")
    """Public IP address, if it has one."""
    node_name: str | None = None
    """The Node the instance became, matched by providerID or else by name. Absent until it joins."""
    launched_at: Annotated[str | None, crd(format="date-time")] = None
    """When the cloud launched the instance."""
    reclaim_at: Annotated[str | None, crd(format="date-time")] = None
    """When the cloud takes the instance back (a spot reclaim notice on its Node or from the cloud), or for an
    instance leaving on its own (STOPPING, STOPPED, SHUTDOWN, TERMINATING) the last time it was seen so. From
    then on it is not capacity: a replacement is launched and its node drained."""
    retiring_since: Annotated[str | None, crd(format="date-time")] = None
    """Since when scale-in has been draining it (tainted gpuops.io/spot-retire). It is terminated once its node has
    no workload pods, or after drainTimeoutSeconds."""


class PendingLaunch(ApiStruct):
    """A launch decided and persisted before the cloud is called: every retry, from this operator or its
    successor, sends the same client token with the same parameters, so the cloud sells the instances once."""

    client_token: str = ""
    """The launch's client token (the pool's UID, a dash and the launch sequence, at most 64 characters). Its
    instances are also tagged with it as gpuops.io/launch-id."""
    count: int = 0
    """Instances requested."""
    since: Annotated[str, crd(format="date-time")] = ""
    """When the launch was decided."""
    instance_type: str = ""
    """The instance type launched."""
    zone: str | None = None
    """The zone launched in; absent means the provider's default."""
    capacity_type: str = "spot"
    """spot or on-demand."""
    attempts: int = 0
    """Launch calls made so far, counting retries after throttling or transient errors."""
    instance_ids: tuple[str, ...] = ()
    """The instance IDs the cloud returned. The launch is settled once the instance listing shows all of them."""


class CapacityBackoff(ApiStruct):
    """One backed-off combination."""

    zone: str = ""
    """The zone (empty means the provider's default)."""
    instance_type: str = ""
    """The instance type."""
    capacity_type: str = "spot"
    """spot or on-demand."""
    failures: int = 0
    """Capacity errors of this combination in a row. The pause doubles with each one (30 s up to 10 min); the entry
    is dropped once the combination launches successfully."""
    until: Annotated[str, crd(format="date-time")] = ""
    """When the combination may be tried again."""


# written whole, zeros included: a pool at size 0 shows SIZE 0, not an empty column
class PoolStatus(ApiStruct, omit_defaults=False):
    observed_generation: int = 0
    """The spec generation this status was written for (set on every status write)."""
    desired: int = 0
    """The instance count the controller aims for, within [minimum, maximum]: the live count, or with scaleOnDemand
    the instances running GPU pods plus those the pending pods need."""
    size: int = 0
    """Live instances (PENDING, STARTING, RUNNING or REBOOTING) that are not under a reclaim notice."""
    ready: int = 0
    """Of those, the RUNNING instances whose Node is Ready with its GPUs allocatable."""
    instances: tuple[InstanceStatus, ...] = ()
    """The instances the cloud lists with the pool's ownership tags, oldest first. Terminated ones are no longer
    listed."""
    pending_launch: PendingLaunch | None = None
    """A launch written here before the cloud is called. Every retry sends the same client token and parameters, so
    the instances are bought once. Cleared once the instances it bought are listed, when it fails for good, or
    when the instances the cloud returned are still not listed 300 s after it was decided."""
    launch_sequence: int = 0
    """Launch intents created so far. The next launch's client token is the pool's UID, a dash and launchSequence +
    1."""
    capacity_errors: int = 0
    """Capacity errors since the last successful spot launch (the number onDemandFallback compares with
    afterCapacityErrors)."""
    backoff: tuple[CapacityBackoff, ...] = ()
    """(zone, instance type, capacity type) combinations that are paused after capacity errors. Launches meanwhile
    use the next combination in preference order."""
    last_error: str | None = None
    """The latest failure (spec, Secret or cloud call), for humans. Cleared when a reconcile gets as far as listing
    the instances again."""
    conditions: Annotated[tuple[Condition, ...] | None, crd(list_type="map", list_map_keys=("type",))] = None
    """Ready (True when enough instances are Ready; False also for spec, SDK or launch problems, e.g. reason
    InvalidSpec, SecretNotAllowed, InsecureTransport or LaunchRejected), ScalingUp (True while a launch is in
    flight or size is below desired), CapacityError, QuotaExceeded, CredentialsInvalid, InsecureTransport
    (True while the credentials go over plain HTTP, as insecureAllowHTTP allows) and ConflictDetected (True with
    reason KarpenterManagedNodes while some of the pool's nodes carry Karpenter's NodePool label; False once none
    does). metav1.Condition."""


class SpotPool(CustomObject):
    """SpotPool keeps between minimum and maximum spot instances of a template on a cloud API. Instances are owned
    through tags (gpuops.io/pool, gpuops.io/managed-by, gpuops.io/launch-id); a launch's client token is written
    to status before the call, so no retry, crash or failover ever buys twice."""

    spec: Annotated[PoolSpec, crd(required=True)] = msgspec.field(default_factory=PoolSpec)
    """The pool's bounds, its cloud, and what its instances are launched with."""
    status: PoolStatus = msgspec.field(default_factory=PoolStatus)
    """Written by the spot pool controller."""


POOLS: Final = resource_type(PLURAL, KIND, False, SpotPool)
CRD: Final = custom_resource(
    POOLS,
    Column("Min", "integer", ".spec.minimum"),
    Column("Max", "integer", ".spec.maximum"),
    Column("Size", "integer", ".status.size",
           "Live instances (pending, starting, running or rebooting; not counting those under a reclaim notice)."),
    Column("Ready", "integer", ".status.ready", "Instances whose Node is Ready."),
    Column("Provider", "string", ".spec.provider"),
    Column("Desired", "integer", ".status.desired", priority=1),
    short_names=("sp",),
)

_PRICE = re.compile(r"\d+(\.\d+)?")


def plain_http(spec: PoolSpec) -> bool:
    """Whether the pool's calls, credentials included, go over plain HTTP: an http:// endpoint, or a bare
    loopback host for tencent (whose SDK speaks http to loopback)."""
    endpoint = (spec.endpoint or "").strip()
    if not endpoint:
        return False  # the providers' public endpoints are https
    if "://" in endpoint:
        return endpoint.lower().startswith("http://")
    host = urlsplit(f"//{endpoint}").hostname or ""
    return spec.provider == "tencent" and is_loopback(host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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

"""The `aws` provider: EC2 spot (or on-demand) instances through boto3's RunInstances, DescribeInstances and
TerminateInstances.

Design points the reconciler relies on:

* No SDK retries (`total_max_attempts=1`): the reconciler owns retries, backoff and client tokens; an SDK retry
  of RunInstances after a read timeout would hide an ambiguous launch from it.
* Every call runs in a worker thread under `run_blocking` (the SDK is synchronous) and through a `CallGate`
  with EC2's documented request buckets, so the cloud rarely has to throttle us.
* Node names: EC2 reports an IP-based `PrivateDnsName` (`ip-10-0-0-4.ec2.internal`); `node_name` is its
  first label (`ip-10-0-0-4`), which is what a kubelet started with `--hostname-override` from the EC2 hostname
  and the emulated cluster both register. EKS's default (the full DNS name) differs: match Nodes on
  `provider_id` (`aws:///<zone>/<instance-id>`, exactly what the AWS cloud provider sets) first.
* Spot interruption notices are not in the EC2 API (only in IMDS and EventBridge): `interruption_at` is None.
* `node_labels` and `node_taints` of a LaunchSpec cannot travel through RunInstances: put them in user data
  (kubelet flags); this provider ignores them.
* A loopback `endpoint` (tests, emulators) never goes through HTTP(S)_PROXY: botocore would otherwise honour
  proxy environment variables for it (it only consults NO_PROXY, which rarely lists 127.0.0.1).
"""

from __future__ import annotations

import calendar
import functools
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import boto3
import botocore.config
import botocore.exceptions
import botocore.parsers

from ..api import is_loopback
from .base import (
    LAUNCH_ID_TAG,
    POOL_TAG,
    CallGate,
    CapacityType,
    CloudInstance,
    ErrorKind,
    InstanceState,
    LaunchSpec,
    ProviderConfig,
    ProviderError,
    batches,
    owned,
    run_blocking,
)
from .ratelimit import TokenBucket

__all__ = ["AwsProvider"]

T = TypeVar("T")

# EC2 request buckets ("Request throttling for the Amazon EC2 API",
# https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html): mutating actions hold 50 tokens
# refilled at 5/s, non-mutating (Describe*) 100 refilled at 20/s.
MUTATE_RATE, MUTATE_BURST = 5.0, 50
DESCRIBE_RATE, DESCRIBE_BURST = 20.0, 100
PAGE_SIZE = 1000  # DescribeInstances MaxResults: 5..1000
MAX_PAGES = 1000  # a cloud that keeps handing out tokens is a bug, not a reason to loop forever
THREADS = 8  # SDK calls in flight at once (abandoned calls hold a thread until their socket timeout)

# Every state we still own; `terminated` is left out server-side (it is neither capacity nor work).
LIVE_EC2_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
STATES: dict[str, InstanceState] = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED,
    "shutting-down": InstanceState.TERMINATING,
}

CAPACITY = frozenset({"InsufficientInstanceCapacity", "InsufficientCapacity", "Unsupported", "SpotMaxPriceTooLow",
                      "InsufficientHostCapacity"})
QUOTA = frozenset({"InstanceLimitExceeded", "MaxSpotInstanceCountExceeded", "VcpuLimitExceeded"})
CREDENTIALS = frozenset({"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
                         "OptInRequired", "MissingAuthenticationToken", "ExpiredToken", "RequestExpired",
                         "Blocked"})
THROTTLED = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled"})
SERVER = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"})
GONE = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})


_SESSION_LOCK = threading.Lock()
_SESSION: list[Any] = []


def _session() -> Any:
    """One boto3 session per process: it caches the parsed EC2 service model, which makes a client 15 ms
    instead of 200 ms (a provider is built per pool and per credentials change). Call under _SESSION_LOCK."""
    if not _SESSION:
        _SESSION.append(boto3.session.Session())
    return _SESSION[0]


def _loopback(endpoint: str | None) -> bool:
    return bool(endpoint) and is_loopback(urlsplit(endpoint or "").hostname or "")


class AwsProvider:
    """EC2 through boto3. `page_size` is DescribeInstances' MaxResults (tests use a small one to page)."""

    name = "aws"

    def __init__(self, config: ProviderConfig, *, page_size: int = PAGE_SIZE) -> None:
        if not 5 <= page_size <= 1000:
            raise ValueError("page_size: DescribeInstances takes MaxResults from 5 to 1000")
        access_key = config.credential("accessKeyId", "aws")
        secret_key = config.credential("secretAccessKey", "aws")
        session_token = config.credential("sessionToken", "aws", optional=True)
        self.config = config
        self.page_size = page_size
        sdk_config = botocore.config.Config(
            region_name=config.region,
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=config.timeout_seconds,
            read_timeout=config.timeout_seconds,
            proxies={} if _loopback(config.endpoint) else None,  # {}: no proxy at all; None: the environment's
            max_pool_connections=THREADS,
            user_agent_extra="gpuops-spotpool",
        )
        try:
            with _SESSION_LOCK:  # keys on the client, not the session: they never fall back to the environment's
                self.client: Any = _session().client(
                    "ec2", region_name=config.region, endpoint_url=config.endpoint, config=sdk_config,
                    aws_access_key_id=access_key, aws_secret_access_key=secret_key, aws_session_token=session_token)
        except ValueError as e:  # a malformed endpoint URL
            raise ProviderError(ErrorKind.INVALID, "InvalidEndpoint", str(e)) from None
        self.gate = CallGate(self.name, {"mutate": TokenBucket(MUTATE_RATE, MUTATE_BURST),
                                         "describe": TokenBucket(DESCRIBE_RATE, DESCRIBE_BURST)})
        self._limiter: anyio.CapacityLimiter | None = None

    # ------------------------------------------------------------------------------------ Provider

    async def describe(self, owner: Mapping[str, str]) -> list[CloudInstance]:
        if not owner:
            raise ProviderError(ErrorKind.INVALID, "NoOwner", "describe needs at least one ownership tag")
        key = POOL_TAG if POOL_TAG in owner else next(iter(owner))
        filters = [{"Name": f"tag:{key}", "Values": [owner[key]]},
                   {"Name": "instance-state-name", "Values": list(LIVE_EC2_STATES)}]
        out: list[CloudInstance] = []
        token: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            kwargs: dict[str, Any] = {"Filters": filters, "MaxResults": self.page_size}
            if token:
                kwargs["NextToken"] = token
            page = await self._call("DescribeInstances", "describe",
                                    functools.partial(self.client.describe_instances, **kwargs))
            for reservation in page.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    inst = _instance(raw)
                    if inst is not None and inst.id not in seen and owned(inst.tags, owner):
                        seen.add(inst.id)
                        out.append(inst)
            token = page.get("NextToken") or None
            if token is None:
                return out
        raise ProviderError(ErrorKind.TRANSIENT, "TooManyPages",
                            f"DescribeInstances still had a NextToken after {MAX_PAGES} pages")

    async def launch(self, spec: LaunchSpec) -> list[str]:
        tags = dict(spec.tags)
        tags.setdefault(LAUNCH_ID_TAG, spec.client_token)  # a launch is found by its token after a crash
        if spec.name_prefix:
            tags.setdefault("Name", spec.name_prefix)
        kwargs: dict[str, Any] = {
            "InstanceType": spec.instance_type,
            "MinCount": 1,  # take what there is: the reconciler tops up with a new token
            "MaxCount": spec.count,
            "ClientToken": spec.client_token,
            "TagSpecifications": [{"ResourceType": "instance",
                                   "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        }
        if spec.image:
            kwargs["ImageId"] = spec.image
        if spec.capacity_type == "spot":
            spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if spec.max_price:  # AWS advises against a max price: unset means up to the on-demand price
                spot["MaxPrice"] = spec.max_price
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        if spec.zone:
            kwargs["Placement"] = {"AvailabilityZone": spec.zone}
        if spec.subnet:
            kwargs["SubnetId"] = spec.subnet
        if spec.security_groups:
            kwargs["SecurityGroupIds"] = list(spec.security_groups)
        if spec.user_data:
            kwargs["UserData"] = spec.user_data  # plain: botocore base64-encodes RunInstances' UserData itself
        out = await self._call("RunInstances", "mutate", functools.partial(self.client.run_instances, **kwargs))
        return [i["InstanceId"] for i in out.get("Instances", [])]

    async def terminate(self, ids: Sequence[str]) -> None:
        for batch in batches(ids):
            remaining = list(batch)
            while remaining:
                try:
                    await self._call("TerminateInstances", "mutate",
                                     functools.partial(self.client.terminate_instances, InstanceIds=remaining))
                    break
                except ProviderError as e:
                    # EC2 fails the whole call on one unknown id and names it: those are gone, retry the rest
                    gone = {i for i in remaining if e.code in GONE and _names(e.message, i)}
                    if not gone:
                        raise
                    remaining = [i for i in remaining if i not in gone]

    async def close(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------------------------ calls

    async def _call(self, action: str, bucket: str, fn: Callable[[], T]) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(THREADS)
        limiter = self._limiter

        def invoke() -> T:
            try:
                return fn()
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
                raise _error(e, action) from e
            except botocore.parsers.ResponseParserError:
                # the parser's text quotes the raw answer, which may echo our request headers: never shown
                raise ProviderError(
                    ErrorKind.TRANSIENT, "MalformedResponse",
                    f"{action}: the endpoint's answer is not an EC2 API response; check spec.endpoint",
                    ambiguous=action == "RunInstances") from None

        return await self.gate.around(
            action, bucket, lambda: run_blocking(invoke, seconds=self.config.timeout_seconds, limiter=limiter))


def _names(message: str, instance_id: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(instance_id)}(?![\w-])", message) is not None


def _error(e: Exception, action: str) -> ProviderError:
    """Map an SDK exception to the kind the reconciler acts on. A launch that may have reached the cloud is
    ambiguous: retry it with the same client token."""
    launch = action == "RunInstances"
    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code") or "Unknown")
        message = str(err.get("Message") or e)
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in CAPACITY:
            return ProviderError(ErrorKind.CAPACITY, code, message)
        if code in QUOTA:
            return ProviderError(ErrorKind.QUOTA, code, message)
        if code in CREDENTIALS:
            return ProviderError(ErrorKind.CREDENTIALS, code, message)
        if code in THROTTLED:
            return ProviderError(ErrorKind.THROTTLED, code, message, retry_after=1.0)
        if code == "IdempotentParameterMismatch":
            return ProviderError(ErrorKind.MISMATCH, code, message)
        if code in SERVER or status >= 500:
            return ProviderError(ErrorKind.TRANSIENT, code, message, ambiguous=launch)
        return ProviderError(ErrorKind.INVALID, code, message)
    if isinstance(e, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return ProviderError(ErrorKind.CREDENTIALS, type(e).__name__, str(e))
    if isinstance(e, botocore.exceptions.ParamValidationError):
        return ProviderError(ErrorKind.INVALID, "ParamValidation", str(e))
    if isinstance(e, botocore.exceptions.ReadTimeoutError | botocore.exceptions.ConnectionClosedError):
        return ProviderError(ErrorKind.TRANSIENT, type(e).__name__, str(e), ambiguous=launch)
    if isinstance(e, botocore.exceptions.EndpointConnectionError | botocore.exceptions.ConnectionError):
        return ProviderError(ErrorKind.TRANSIENT, type(e).__name__, str(e))  # nothing was sent
    return ProviderError(ErrorKind.TRANSIENT, type(e).__name__, str(e), ambiguous=launch)


def _instance(raw: Mapping[str, Any]) -> CloudInstance | None:
    """One EC2 instance as a CloudInstance; None for terminated (or unknown-state) instances."""
    state = STATES.get(str((raw.get("State") or {}).get("Name", "")))
    if state is None:
        return None
    iid = str(raw["InstanceId"])
    zone = str((raw.get("Placement") or {}).get("AvailabilityZone") or "")
    tags = {str(t["Key"]): str(t.get("Value", "")) for t in raw.get("Tags") or []}
    dns = str(raw.get("PrivateDnsName") or "")
    launched = raw.get("LaunchTime")
    capacity: CapacityType = "spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand"
    reason = raw.get("StateReason") or {}
    return CloudInstance(
        id=iid,
        state=state,
        tags=tags,
        zone=zone,
        instance_type=str(raw.get("InstanceType") or ""),
        capacity_type=capacity,
        private_ip=raw.get("PrivateIpAddress") or None,
        public_ip=raw.get("PublicIpAddress") or None,
        launched_at=_micros(launched) if isinstance(launched, datetime) else None,
        node_name=dns.split(".", 1)[0] or None,
        provider_id=f"aws:///{zone}/{iid}" if zone else None,
        state_reason=reason.get("Code") or reason.get("Message") or None,
    )


def _micros(ts: datetime) -> int:
    return calendar.timegm(ts.utctimetuple()) * 1_000_000 + ts.microsecond

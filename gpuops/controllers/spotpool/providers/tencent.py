"""The `tencent` provider: Tencent Cloud CVM through the official `tencentcloud-sdk-python` client.

The SDK is synchronous (requests), so each call runs in a worker thread (`run_blocking`), behind a token
bucket and `CallGate`. The SDK's retryer stays off: the reconciler decides about retries, and RunInstances
is only ever retried with the same ClientToken.

Proxies: for a loopback endpoint (our emulator) the provider turns the SDK session's `trust_env` off and
drops the proxy the SDK read from the environment, on this client's own session only; the process
environment is never changed. Other endpoints keep the SDK's behaviour (`HTTPS_PROXY`, `NO_PROXY`).

Node names: CVM does not know Kubernetes. A kubelet bootstrapped by user data registers under its host
name, lowercased, so `node_name` is the instance's `HostName` lowercased (None when the API has none).
Node labels and taints of a launch reach the kubelet through the user data: when the spec has any and the
user data is a shell script (or empty), an `export GPUOPS_KUBELET_EXTRA_ARGS='--node-labels=... ...'` line
goes right after the shebang for the bootstrap script to pass on; other user data is sent unchanged.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import structlog
from tencentcloud.common import credential
from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
from tencentcloud.common.profile.client_profile import ClientProfile
from tencentcloud.common.profile.http_profile import HttpProfile
from tencentcloud.cvm.v20170312 import cvm_client, models

from gpuops.kube.redact import SECRET_VALUES

from ..api import is_loopback
from .base import (
    POOL_TAG,
    CallGate,
    CloudInstance,
    ErrorKind,
    InstanceState,
    LaunchSpec,
    NodeTaint,
    ProviderConfig,
    ProviderError,
    batches,
    owned,
    run_blocking,
)
from .ratelimit import TokenBucket

__all__ = ["DESCRIBE_LIMIT", "MUTATE_LIMIT", "TencentProvider", "classify"]

log = structlog.get_logger("gpuops.spotpool.tencent")
T = TypeVar("T")

MUTATE_LIMIT = 10
"""Documented requests per second of RunInstances and of TerminateInstances."""
DESCRIBE_LIMIT = 40
"""Documented requests per second of DescribeInstances."""
PAGE = 100  # DescribeInstances' largest Limit
THREADS = 8  # SDK calls in flight per provider
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INSTANCE_ID = re.compile(r"ins-[0-9a-z]{8}")
_GONE_STATES = frozenset({"TERMINATING", "SHUTDOWN"})
_BUSY_STATES = frozenset({"PENDING", "STARTING", "STOPPING", "REBOOTING"})

# Codes by what the reconciler does about them (the codes documented for RunInstances and TerminateInstances);
# prefixes end with a dot.
_CAPACITY = ("ResourceInsufficient.", "ResourcesSoldOut.", "ResourceUnavailable.InstanceType",
             "InvalidParameterValue.InsufficientOffering", "InvalidParameterValue.InsufficientPrice",
             "FailedOperation.NoAvailableIpAddressCountInSubnet")
_QUOTA = ("LimitExceeded.", "InstancesQuotaLimitExceeded", "InvalidAccount.InsufficientBalance",
          "InvalidAccount.UnpaidBill", "ResourceInsufficient.InsufficientGroupQuota")
_CREDENTIALS = ("AuthFailure", "UnauthorizedOperation", "InvalidCredential", "MissingCredentials")
_THROTTLED = ("RequestLimitExceeded",)
_TRANSIENT = ("InternalError", "InternalServerError", "ClientNetworkError", "ServerNetworkError",
              "ServiceUnavailable", "MutexOperation.TaskRunning", "OperationDenied.InstanceOperationInProgress",
              "UnsupportedOperation.InstanceStatePending", "UnsupportedOperation.InstanceStateStarting",
              "UnsupportedOperation.InstanceStateStopping", "UnsupportedOperation.InstanceStateRebooting",
              "Timeout")
_NETWORK = ("ClientNetworkError", "ServerNetworkError", "InternalError", "InternalServerError", "Timeout")
_MISMATCH = ("InvalidClientToken.ParameterMismatch", "IdempotentParameterMismatch")


def _has(code: str, patterns: Sequence[str]) -> bool:
    """`code` is one of `patterns` or below one (`AuthFailure` covers `AuthFailure.SignatureFailure`)."""
    return any(code == p or code.startswith(p if p.endswith(".") else p + ".") for p in patterns)


def classify(code: str, action: str = "") -> tuple[ErrorKind, bool]:
    """The error kind of a CVM or SDK error code, and whether the call may have taken effect anyway."""
    if _has(code, _MISMATCH):
        return ErrorKind.MISMATCH, False
    if _has(code, _CAPACITY):
        return ErrorKind.CAPACITY, False
    if _has(code, _QUOTA):
        return ErrorKind.QUOTA, False
    if _has(code, _CREDENTIALS):
        return ErrorKind.CREDENTIALS, False
    if _has(code, _THROTTLED):
        return ErrorKind.THROTTLED, False
    if _has(code, _TRANSIENT):
        return ErrorKind.TRANSIENT, action == "RunInstances" and _has(code, _NETWORK)
    return ErrorKind.INVALID, False


def _provider_error(action: str, e: TencentCloudSDKException) -> ProviderError:
    code = str(e.code or "ClientError")
    message = e.message
    if isinstance(message, bytes):  # ServerNetworkError carries the raw HTTP body
        message = SECRET_VALUES.clip(message[:65536].decode("utf-8", "replace"), 500, "…")
    text = f"{action}: {message or code}"
    if e.requestId:
        text += f" (RequestId {e.requestId})"
    kind, ambiguous = classify(code, action)
    return ProviderError(kind, code, text, retry_after=1.0 if kind is ErrorKind.THROTTLED else None,
                         ambiguous=ambiguous)


def _endpoint(raw: str | None) -> tuple[str | None, str]:
    """(HttpProfile endpoint, protocol): `http://h:p`, `https://h`, or a bare host; loopback means http."""
    if raw is None or not raw.strip():
        return None, "https"
    raw = raw.strip()
    parts = urlsplit(raw if "://" in raw else f"//{raw}")
    host = parts.netloc or parts.path
    if parts.scheme not in ("", "http", "https") or not host:
        raise ProviderError(ErrorKind.INVALID, "InvalidEndpoint",
                            f"endpoint {raw!r} must be host[:port] or http(s)://host[:port]")
    scheme = parts.scheme or ("http" if is_loopback(parts.hostname or "") else "https")
    return host, scheme


def _micros(created: str | None) -> int | None:
    if not created:
        return None
    try:
        dt = datetime.fromisoformat(created)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // timedelta(microseconds=1)


def _kubelet_args(labels: Mapping[str, str], taints: Sequence[NodeTaint]) -> str:
    args = []
    if labels:
        args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
    if taints:
        args.append("--register-with-taints=" + ",".join(
            f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in taints))
    return " ".join(args)


def _user_data(spec: LaunchSpec) -> str | None:
    """The base64 user data: the spec's text, with the kubelet label/taint flags exported for shell scripts."""
    text = spec.user_data
    args = _kubelet_args(spec.node_labels, spec.node_taints)
    if args and (not text or text.startswith("#!")):
        line = f"export GPUOPS_KUBELET_EXTRA_ARGS='{args}'\n"
        if not text:
            text = "#!/bin/sh\n" + line
        else:
            head, _, rest = text.partition("\n")
            text = f"{head}\n{line}{rest}"
    if not text:
        return None
    return base64.b64encode(text.encode()).decode()


class TencentProvider:
    """Describe, launch and terminate CVM instances for one account and region."""

    name = "tencent"

    def __init__(self, config: ProviderConfig) -> None:
        secret_id = config.credential("secretId", "tencent")
        secret_key = config.credential("secretKey", "tencent")
        token = config.credential("token", "tencent", optional=True)
        endpoint, protocol = _endpoint(config.endpoint)
        self.region = config.region
        self.timeout = config.timeout_seconds
        try:
            cred = credential.Credential(secret_id, secret_key, token)
        except TencentCloudSDKException as e:
            raise _provider_error("Credential", e) from None
        http = HttpProfile(protocol=protocol, endpoint=endpoint, reqTimeout=config.timeout_seconds)
        # retryer=None: the SDK's NoopRetryer; the region breaker stays off (its default)
        profile = ClientProfile(httpProfile=http, retryer=None)
        self._client = cvm_client.CvmClient(cred, config.region, profile)
        self._loopback = endpoint is not None and is_loopback(urlsplit(f"//{endpoint}").hostname or "")
        if self._loopback:
            self._bypass_proxies()
        # Headroom below the documented limits: the cloud counts a sliding second, and a bucket lets its burst
        # plus one second of refill through in one second, so burst + rate stays under the limit.
        self._gate = CallGate(self.name, {
            "mutate": TokenBucket(MUTATE_LIMIT * 0.8, burst=max(1, MUTATE_LIMIT // 10)),
            "describe": TokenBucket(DESCRIBE_LIMIT * 0.8, burst=max(1, DESCRIBE_LIMIT // 10)),
        })
        self._limiter = anyio.CapacityLimiter(THREADS)

    def _bypass_proxies(self) -> None:
        """Loopback traffic never goes through a proxy from the environment (this client's session only)."""
        conn = getattr(self._client.request, "conn", None)
        if conn is None:
            return
        conn.proxy = None
        session = getattr(conn, "_session", None)
        if session is not None:
            session.trust_env = False

    @property
    def calls(self) -> int:
        return self._gate.calls

    async def _call(self, action: str, bucket: str, fn: Callable[[], T]) -> T:
        async def run() -> T:
            try:
                return await run_blocking(fn, seconds=self.timeout, limiter=self._limiter)
            except TencentCloudSDKException as e:
                raise _provider_error(action, e) from None

        return await self._gate.around(action, bucket, run)

    # ------------------------------------------------------------------------------------ describe

    async def describe(self, owner: Mapping[str, str]) -> list[CloudInstance]:
        if not owner:
            raise ProviderError(ErrorKind.INVALID, "NoOwnerTags", "describe needs ownership tags to filter on")
        key = POOL_TAG if POOL_TAG in owner else next(iter(owner))
        out: dict[str, CloudInstance] = {}
        offset = 0
        while True:
            req = models.DescribeInstancesRequest()
            f = models.Filter()
            f.Name = f"tag:{key}"
            f.Values = [owner[key]]
            req.Filters = [f]
            req.Limit = PAGE
            req.Offset = offset
            resp = await self._call("DescribeInstances", "describe",
                                    partial(self._client.DescribeInstances, req))
            page = list(resp.InstanceSet or [])
            for inst in page:
                ci = self._instance(inst)
                if ci is not None and owned(ci.tags, owner):
                    out.setdefault(ci.id, ci)  # offsets shift when instances go: a repeat is dropped
            offset += len(page)
            if not page or offset >= int(resp.TotalCount or 0):
                break
        return list(out.values())

    def _instance(self, inst: Any) -> CloudInstance | None:
        try:
            state = InstanceState(inst.InstanceState)
        except ValueError:
            return None  # a state this code does not know (e.g. TERMINATED in a future API): not capacity
        zone = inst.Placement.Zone if inst.Placement is not None else ""
        private = list(inst.PrivateIpAddresses or [])
        public = list(inst.PublicIpAddresses or [])
        host = inst.HostName
        return CloudInstance(
            id=inst.InstanceId,
            state=state,
            tags={t.Key: t.Value or "" for t in inst.Tags or []},
            zone=zone or "",
            instance_type=inst.InstanceType or "",
            capacity_type="spot" if inst.InstanceChargeType == "SPOTPAID" else "on-demand",
            private_ip=private[0] if private else None,
            public_ip=public[0] if public else None,
            launched_at=_micros(inst.CreatedTime),
            node_name=host.lower() if host else None,
            provider_id=f"qcloud:///{zone}/{inst.InstanceId}" if zone else None,
            state_reason=inst.LatestOperationErrorMsg or None,
        )

    async def _by_ids(self, ids: Sequence[str]) -> dict[str, str]:
        """InstanceState by id for these ids (at most 100), unfiltered by tags: for terminate's bookkeeping."""
        req = models.DescribeInstancesRequest()
        req.InstanceIds = list(ids)
        req.Limit = PAGE
        resp = await self._call("DescribeInstances", "describe", lambda: self._client.DescribeInstances(req))
        return {i.InstanceId: i.InstanceState for i in resp.InstanceSet or []}

    # ------------------------------------------------------------------------------------ launch

    async def launch(self, spec: LaunchSpec) -> list[str]:
        if not spec.zone:
            raise ProviderError(ErrorKind.INVALID, "MissingParameter",
                                "CVM RunInstances needs a zone (Placement.Zone); set one in the pool's spec")
        req = models.RunInstancesRequest()
        req.ClientToken = spec.client_token
        req.InstanceCount = spec.count
        req.InstanceType = spec.instance_type
        placement = models.Placement()
        placement.Zone = spec.zone
        req.Placement = placement
        if spec.capacity_type == "spot":
            req.InstanceChargeType = "SPOTPAID"
            market = models.InstanceMarketOptionsRequest()
            market.MarketType = "spot"
            options = models.SpotMarketOptions()
            options.SpotInstanceType = "one-time"
            if spec.max_price:
                options.MaxPrice = spec.max_price
            market.SpotOptions = options
            req.InstanceMarketOptions = market
        else:
            req.InstanceChargeType = "POSTPAID_BY_HOUR"
        if spec.image:
            req.ImageId = spec.image
        if spec.vpc or spec.subnet:
            vpc = models.VirtualPrivateCloud()
            vpc.VpcId = spec.vpc
            vpc.SubnetId = spec.subnet
            req.VirtualPrivateCloud = vpc
        if spec.security_groups:
            req.SecurityGroupIds = list(spec.security_groups)
        req.UserData = _user_data(spec)
        if spec.name_prefix:
            req.InstanceName = spec.name_prefix
        if spec.tags:
            tags = []
            for k, v in spec.tags.items():
                t = models.Tag()
                t.Key, t.Value = k, v
                tags.append(t)
            ts = models.TagSpecification()
            ts.ResourceType = "instance"
            ts.Tags = tags
            req.TagSpecification = [ts]
        resp = await self._call("RunInstances", "mutate", lambda: self._client.RunInstances(req))
        ids = list(resp.InstanceIdSet or [])
        log.info("tencent launch", token=spec.client_token, instance_type=spec.instance_type, zone=spec.zone,
                 capacity_type=spec.capacity_type, requested=spec.count, granted=len(ids))
        return ids

    # ------------------------------------------------------------------------------------ terminate

    async def terminate(self, ids: Sequence[str]) -> None:
        busy: list[str] = []
        for batch in batches(ids):
            busy += await self._terminate_batch(batch)
        if busy:
            raise ProviderError(ErrorKind.TRANSIENT, "UnsupportedOperation.InstanceStatePending",
                                f"TerminateInstances: {len(busy)} instances are not ready to terminate yet "
                                f"(PENDING or in an operation); retry later: {', '.join(busy[:10])}")

    async def _terminate_batch(self, batch: list[str]) -> list[str]:
        """Terminate one batch; the API fails a whole call for one gone or busy id, so those are taken out
        (gone ones are done, busy ones are returned) and the rest is sent again."""
        busy: list[str] = []
        todo = list(batch)
        while todo:
            req = models.TerminateInstancesRequest()
            req.InstanceIds = list(todo)
            try:
                await self._call("TerminateInstances", "mutate", partial(self._client.TerminateInstances, req))
                return busy
            except ProviderError as e:
                gone = e.code in ("InvalidInstanceId.NotFound", "UnsupportedOperation.InstanceStateTerminating",
                                  "UnsupportedOperation.InstanceStateTerminated",
                                  "UnsupportedOperation.InstanceStateShutdown")
                pending = e.kind is ErrorKind.TRANSIENT and e.code.startswith("UnsupportedOperation.InstanceState")
                if not (gone or pending):
                    raise
                drop = set(_INSTANCE_ID.findall(e.message)) & set(todo) if e.code.startswith("Invalid") else set()
                if not drop:
                    states = await self._by_ids(todo)
                    gone_ids = {i for i in todo if i not in states or states[i] in _GONE_STATES}
                    busy_ids = {i for i in todo if states.get(i) in _BUSY_STATES}
                    busy += [i for i in todo if i in busy_ids]
                    drop = gone_ids | busy_ids
                if not drop:
                    raise  # the API and DescribeInstances disagree: let the caller retry later
                log.info("tencent terminate: retrying without gone or busy ids", dropped=sorted(drop),
                         code=e.code)
                todo = [i for i in todo if i not in drop]
        return busy

    async def close(self) -> None:
        conn = getattr(self._client.request, "conn", None)
        session = getattr(conn, "_session", None)
        if session is not None:
            session.close()

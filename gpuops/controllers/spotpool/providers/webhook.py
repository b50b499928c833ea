"""The `webhook` provider: a small JSON-over-HTTP contract a private cloud can implement in an afternoon.
The emulated cluster's cloud serves exactly this contract under `/spot/v1`, which is the `sim` provider.

Contract (all bodies JSON, `Content-Type: application/json`; `Authorization: Bearer <token>` when the pool's
Secret has a `token` key; `<endpoint>` is `spec.endpoint`)::

    POST <endpoint>/instances            launch
      {"clientToken": "...", "instanceType": "...", "count": n, "minCount": 1, "capacityType": "spot"|"on-demand",
       "zone"?, "imageId"?, "subnetId"?, "vpcId"?, "securityGroupIds"?: [...], "userData"?, "maxPrice"?,
       "namePrefix"?, "tags": {...}, "nodeLabels": {...}, "nodeTaints": [{"key","value","effect"}]}
      -> 200 {"instances": [<instance>, ...]}
      The same clientToken with the same body must answer the first call's instances and create nothing;
      with a different body, 409 IdempotentParameterMismatch.
    GET <endpoint>/instances?tag:<key>=<value>&maxResults=<n>&nextToken=<t>     describe
      -> 200 {"instances": [...], "nextToken"?: "..."}
    POST <endpoint>/instances/terminate  {"instanceIds": [... at most 100]}
      -> 200 {"terminatingInstances": [...], "notFound": [ids]}    (unknown ids are not an error)

    <instance>: {"instanceId", "state": pending|running|stopping|stopped|shutting-down|terminated|launch-failed,
                 "instanceType", "zone", "lifecycle": spot|on-demand, "tags": {...}, "launchTime" (RFC 3339),
                 "privateIp"?, "publicIp"?, "nodeName"?, "providerId"?,
                 "interruption"?: {"noticeTime", "terminateTime"}}

    Errors: {"error": {"code": "...", "message": "..."}} with 400 (invalid request), 401/403 (credentials),
    409 (IdempotentParameterMismatch), 429 (RequestLimitExceeded, with Retry-After), 503 with code
    InsufficientInstanceCapacity (no stock: try another type or zone), any status with code
    InstanceLimitExceeded / QuotaExceeded (account quota), other 5xx (transient).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import aiohttp
import msgspec
from yarl import URL

from gpuops import __version__
from gpuops.accounting.pool import InstanceState
from gpuops.kube.redact import SECRET_VALUES

from .base import (
    POOL_TAG,
    CallGate,
    CloudInstance,
    ErrorKind,
    LaunchSpec,
    ProviderConfig,
    ProviderError,
    batches,
    owned,
)
from .ratelimit import TokenBucket

__all__ = ["STATES", "WebhookProvider"]

STATES: Mapping[str, InstanceState | None] = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED,
    "shutting-down": InstanceState.TERMINATING,
    "launch-failed": InstanceState.LAUNCH_FAILED,
    "terminated": None,
}
PAGE = 500
CAPACITY_CODES = frozenset({"InsufficientInstanceCapacity", "InsufficientCapacity", "InvalidZone"})
QUOTA_CODES = frozenset({"InstanceLimitExceeded", "QuotaExceeded", "MaxSpotInstanceCountExceeded"})


def _us(stamp: Any) -> int | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        dt = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return round(dt.timestamp() * 1_000_000)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())


class WebhookProvider:
    """The contract above over aiohttp, with rate limits (10 mutating and 40 describe calls per second by
    default, CVM's figures) and one session per provider."""

    def __init__(self, config: ProviderConfig, *, name: str = "webhook", mutate_rate: float = 10.0,
                 describe_rate: float = 40.0) -> None:
        if not config.endpoint:
            raise ProviderError(ErrorKind.INVALID, "MissingEndpoint",
                                f"the {name} provider needs spec.endpoint (the base URL of the instance API)")
        url = URL(config.endpoint if "://" in config.endpoint else f"http://{config.endpoint}")
        if url.scheme not in ("http", "https") or not url.host:
            raise ProviderError(ErrorKind.INVALID, "BadEndpoint",
                                f"spec.endpoint {config.endpoint!r} must be an http(s) URL")
        self.name = name
        self.base = str(url).rstrip("/")
        self.token = config.credential("token", name, optional=True)
        self.timeout = config.timeout_seconds
        self.gate = CallGate(name, {"mutate": TokenBucket(mutate_rate, int(mutate_rate)),
                                    "describe": TokenBucket(describe_rate, int(describe_rate))})
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"User-Agent": f"gpuops/{__version__}", "Accept": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            # trust_env off: a loopback or in-VPC endpoint must not go through an egress proxy
            self._session = aiohttp.ClientSession(headers=headers, trust_env=False)
        return self._session

    async def _call(self, method: str, path: str, *, body: Any = None,
                    params: Mapping[str, str] | None = None, ambiguous: bool = False) -> Any:
        """One HTTP exchange; errors become ProviderErrors (`ambiguous`: a lost answer may hide a done call)."""
        try:
            async with self._http().request(
                method, self.base + path, params=params,
                data=None if body is None else msgspec.json.encode(body),
                headers={"Content-Type": "application/json"} if body is not None else None,
                timeout=aiohttp.ClientTimeout(total=self.timeout), allow_redirects=False,
            ) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = _retry_after(resp.headers.get("Retry-After"))
        except TimeoutError:
            raise ProviderError(ErrorKind.TRANSIENT, "Timeout", f"{method} {path}: no answer within "
                                f"{self.timeout:g}s", ambiguous=ambiguous) from None
        except aiohttp.ClientError as e:
            raise ProviderError(ErrorKind.TRANSIENT, "ConnectionError", f"{method} {path}: {e}",
                                ambiguous=ambiguous) from None
        try:
            doc = msgspec.json.decode(raw) if raw.strip() else {}
        except msgspec.DecodeError:
            doc = None
        if 200 <= status < 300:
            if not isinstance(doc, dict):
                raise ProviderError(ErrorKind.TRANSIENT, "BadResponse", f"{method} {path}: HTTP {status} with a "
                                    "body that is not a JSON object", ambiguous=ambiguous)
            return doc
        err = doc.get("error") if isinstance(doc, dict) else None
        code = str(err.get("code") or "") if isinstance(err, dict) else ""
        message = (str(err.get("message") or "") if isinstance(err, dict)
                   else SECRET_VALUES.clip(raw[:65536].decode(errors="replace"), 200, "…"))
        raise ProviderError(_kind(status, code), code or f"HTTP{status}", message or f"HTTP {status}",
                            retry_after=retry_after, ambiguous=ambiguous and status >= 500)

    async def describe(self, owner: Mapping[str, str]) -> list[CloudInstance]:
        pool = owner.get(POOL_TAG)
        if not pool:
            raise ProviderError(ErrorKind.INVALID, "MissingOwner", f"describe needs the {POOL_TAG} tag")
        out: list[CloudInstance] = []
        token: str | None = None
        while True:
            params = {f"tag:{POOL_TAG}": pool, "maxResults": str(PAGE)}
            if token:
                params["nextToken"] = token
            doc = await self.gate.around("DescribeInstances", "describe",
                                         lambda p=params: self._call("GET", "/instances", params=p))  # type: ignore[misc]
            for raw in doc.get("instances") or ():
                inst = _instance(raw)
                if inst is not None and owned(inst.tags, owner):
                    out.append(inst)
            token = doc.get("nextToken")
            if not token:
                return out

    async def launch(self, spec: LaunchSpec) -> list[str]:
        body: dict[str, Any] = {
            "clientToken": spec.client_token, "instanceType": spec.instance_type, "count": spec.count,
            "minCount": 1, "capacityType": spec.capacity_type, "tags": dict(spec.tags),
            "nodeLabels": dict(spec.node_labels),
            "nodeTaints": [msgspec.to_builtins(t) for t in spec.node_taints],
        }
        optional = {"zone": spec.zone, "imageId": spec.image, "subnetId": spec.subnet, "vpcId": spec.vpc,
                    "securityGroupIds": list(spec.security_groups) or None, "userData": spec.user_data,
                    "maxPrice": spec.max_price, "namePrefix": spec.name_prefix}
        body.update({k: v for k, v in optional.items() if v is not None})
        doc = await self.gate.around("RunInstances", "mutate",
                                     lambda: self._call("POST", "/instances", body=body, ambiguous=True))
        ids = [str(i.get("instanceId")) for i in doc.get("instances") or () if isinstance(i, dict)]
        return [i for i in ids if i and i != "None"]

    async def terminate(self, ids: Sequence[str]) -> None:
        for chunk in batches(ids):
            await self.gate.around("TerminateInstances", "mutate",
                                   lambda c=chunk: self._call("POST", "/instances/terminate",  # type: ignore[misc]
                                                              body={"instanceIds": c}))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _kind(status: int, code: str) -> ErrorKind:
    if code in QUOTA_CODES:
        return ErrorKind.QUOTA
    if code in CAPACITY_CODES:
        return ErrorKind.CAPACITY
    if code == "IdempotentParameterMismatch":
        return ErrorKind.MISMATCH
    if status in (401, 403):
        return ErrorKind.CREDENTIALS
    if status == 429 or code in ("RequestLimitExceeded", "Throttling"):
        return ErrorKind.THROTTLED
    if status >= 500 or status in (408, 425):
        return ErrorKind.TRANSIENT
    return ErrorKind.INVALID


def _instance(raw: Any) -> CloudInstance | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("instanceId"), str):
        return None
    state = STATES.get(str(raw.get("state")), InstanceState.PENDING)
    if state is None:
        return None
    tags = raw.get("tags") or {}
    interruption = raw.get("interruption") or {}
    return CloudInstance(
        id=raw["instanceId"], state=state,
        tags={str(k): str(v) for k, v in tags.items()} if isinstance(tags, dict) else {},
        zone=str(raw.get("zone") or ""), instance_type=str(raw.get("instanceType") or ""),
        capacity_type="on-demand" if raw.get("lifecycle") == "on-demand" else "spot",
        private_ip=raw.get("privateIp") or None, public_ip=raw.get("publicIp") or None,
        launched_at=_us(raw.get("launchTime")), node_name=raw.get("nodeName") or None,
        provider_id=raw.get("providerId") or None,
        interruption_at=_us(interruption.get("terminateTime")) if isinstance(interruption, dict) else None,
        state_reason=(raw.get("stateReason") or {}).get("code") if isinstance(raw.get("stateReason"), dict) else None,
    )

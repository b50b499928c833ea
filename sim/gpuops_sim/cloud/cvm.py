"""A Tencent Cloud CVM API (version 2017-03-12) front end over the emulated cloud's spot instances.

The `tencent` spot pool provider runs the real `tencentcloud-sdk-python` client against this server, so the
signing, the error parsing and the request shapes are the SDK's own. Instances bought here live in the same
`SpotCloud` as those of `/spot/v1`: they boot, join the emulated cluster as Nodes, can be reclaimed, and are
counted against the same capacity.

Instance ids. SpotCloud names instances `i-<17 hex>`; CVM names them `ins-<8 of [0-9a-z]>`. Each SpotCloud id
gets a CVM id derived from a hash of it (so a second `CvmServer` over the same cloud shows the same ids),
with a counter mixed in on the rare collision; the table is kept both ways for the server's lifetime.
`cvm_id()` and `spot_id()` translate for tests.

Differences from the real API, on purpose: one zone (the cloud's), one region (the constructor's); errors
are the documented codes but the messages are ours; `TerminateInstances` does not refuse mixed charge
types; a kubelet started by the user data is emulated by reading `--node-labels=` and
`--register-with-taints=` flags out of the decoded user data and giving them to the Node.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import hashlib
import hmac
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
from aiohttp import web

from .errors import STATUS_CODE, CloudError, json_response
from .faults import FaultRule
from .loopback import LoopbackServer
from .server import CloudServer
from .spot import CapacityType, Instance, InstanceState, LaunchRequest

log = structlog.get_logger("gpuops_sim.cloud.cvm")

API = "cvm"
VERSION = "2017-03-12"
SERVICE = "cvm"
ALGORITHM = "TC3-HMAC-SHA256"
ACTIONS = ("RunInstances", "DescribeInstances", "TerminateInstances")
RATE_LIMITS: dict[str, int] = {"RunInstances": 10, "DescribeInstances": 40, "TerminateInstances": 10}
"""Documented requests per second per action; the server counts them in a sliding one-second window."""
SIGNATURE_WINDOW = 300.0  # seconds a request's X-TC-Timestamp may be off
MAX_RUN_COUNT = 500
MAX_IDS = 100
MAX_FILTERS = 10
MAX_FILTER_VALUES = 5
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_TAGS = 50
USER_DATA_LIMIT = 16384  # bytes of base64 text
STATE: dict[InstanceState, str] = {"pending": "PENDING", "running": "RUNNING", "shutting-down": "TERMINATING",
                                   "launch-failed": "LAUNCH_FAILED", "terminated": "TERMINATED"}
CHARGE = {"spot": "SPOTPAID", "on-demand": "POSTPAID_BY_HOUR"}
INSTANCE_ID = re.compile(r"ins-[0-9a-z]{8}")
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
# Every field the SDK's RunInstancesRequest may send; the ones not listed in `_run` are accepted and ignored.
RUN_FIELDS = frozenset({
    "ActionTimer", "CamRoleName", "ChcIds", "ClientToken", "CpuTopology", "DataDisks", "DedicatedClusterId",
    "DisableApiTermination", "DisasterRecoverGroupIds", "DryRun", "EnableJumboFrame", "EnhancedService",
    "HostName", "HpcClusterId", "ImageId", "InstanceChargePrepaid", "InstanceChargeType", "InstanceCount",
    "InstanceMarketOptions", "InstanceName", "InstanceType", "InternetAccessible", "LaunchTemplate",
    "LoginSettings", "Metadata", "MinCount", "NetworkInterfaces", "PartitionNumber", "Placement",
    "SecurityGroupIds", "SystemDisk", "TagSpecification", "UserData", "VirtualPrivateCloud"})
DESCRIBE_FIELDS = frozenset({"InstanceIds", "Filters", "Offset", "Limit"})
TERMINATE_FIELDS = frozenset({"InstanceIds", "ReleaseAddress", "ReleasePrepaidDataDisks"})
FILTER_NAMES = ("zone", "instance-id", "instance-state", "instance-charge-type", "instance-type", "instance-name",
                "private-ip-address", "vpc-id", "subnet-id", "image-id", "tag-key", "tag-value", "tag:<key>")
# SpotCloud error codes -> CVM codes.
SPOT_CODES = {
    "InsufficientInstanceCapacity": "ResourceInsufficient.SpecifiedInstanceType",
    "IdempotentParameterMismatch": "InvalidClientToken.ParameterMismatch",
    "InvalidZone": "InvalidZone.MismatchRegion",
    "InvalidFilter": "InvalidFilter",
    "InvalidParameterValue": "InvalidParameterValue",
    "MissingParameter": "MissingParameter",
}
# Injected faults that name only an HTTP status below 500: the CVM code the answer carries (with HTTP 200).
FAULT_CODES = {400: "InvalidParameter", 401: "AuthFailure", 403: "UnauthorizedOperation",
               404: "ResourceNotFound", 409: "ResourceInUse", 429: "RequestLimitExceeded"}
MISMATCH_CODE = "InvalidClientToken.ParameterMismatch"
"""Not a documented CVM code (the documents do not say what a reused token with other parameters gets)."""

_LABEL_FLAG = re.compile(r"--node-labels[= ]['\"]?([^\s'\"]+)")
_TAINT_FLAG = re.compile(r"--register-with-taints[= ]['\"]?([^\s'\"]+)")


class CvmError(Exception):
    """A CVM API error: HTTP 200 with an `Error` object, unless `http_status` says the gateway itself failed."""

    def __init__(self, code: str, message: str, *, http_status: int = 200) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.http_status = http_status


def _invalid(message: str, code: str = "InvalidParameterValue") -> CvmError:
    return CvmError(code, message)


# ---------------------------------------------------------------------------------------- TC3 signing


def tc3_signature(secret_key: str, *, timestamp: int, method: str, uri: str, query: str,
                  headers: Sequence[tuple[str, str]], payload_hash: str, service: str = SERVICE) -> str:
    """The TC3-HMAC-SHA256 signature of one request; `headers` are the signed ones, in signing order."""
    canonical_headers = "".join(f"{k.lower()}:{v.strip()}\n" for k, v in headers)
    signed = ";".join(k.lower() for k, _ in headers)
    canonical = "\n".join((method, uri, query, canonical_headers, signed, payload_hash))
    date = datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d")
    scope = f"{date}/{service}/tc3_request"
    to_sign = "\n".join((ALGORITHM, str(timestamp), scope, hashlib.sha256(canonical.encode()).hexdigest()))
    key = _hmac(f"TC3{secret_key}".encode(), date)
    key = _hmac(key, service)
    key = _hmac(key, "tc3_request")
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signed_headers(secret_id: str, secret_key: str, *, action: str, body: bytes, host: str,
                   region: str | None = None, timestamp: int | None = None, version: str = VERSION,
                   token: str | None = None) -> dict[str, str]:
    """Headers of a signed JSON POST to `/`, the way the SDK builds them: for raw HTTP tests and tools."""
    ts = int(time.time()) if timestamp is None else timestamp
    ctype = "application/json"
    sig = tc3_signature(secret_key, timestamp=ts, method="POST", uri="/", query="",
                        headers=[("content-type", ctype), ("host", host)],
                        payload_hash=hashlib.sha256(body).hexdigest())
    date = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")
    out = {
        "Content-Type": ctype,
        "Host": host,
        "X-TC-Action": action,
        "X-TC-Version": version,
        "X-TC-Timestamp": str(ts),
        "Authorization": f"{ALGORITHM} Credential={secret_id}/{date}/{SERVICE}/tc3_request, "
                         f"SignedHeaders=content-type;host, Signature={sig}",
    }
    if region is not None:
        out["X-TC-Region"] = region
    if token is not None:
        out["X-TC-Token"] = token
    return out


_AUTH = re.compile(r"^TC3-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{4}-\d{2}-\d{2})/([^/,\s]+)/tc3_request,\s*"
                   r"SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$")


# ---------------------------------------------------------------------------------------- ids


class CvmIds:
    """Both ways between SpotCloud ids and CVM-style `ins-xxxxxxxx` ids: a hash of the SpotCloud id, so the
    same instance gets the same CVM id from any server over the same cloud, with a counter on collision."""

    def __init__(self) -> None:
        self.to_cvm: dict[str, str] = {}
        self.to_spot: dict[str, str] = {}

    def cvm(self, spot_id: str) -> str:
        got = self.to_cvm.get(spot_id)
        if got is not None:
            return got
        n = 0
        while True:
            digest = hashlib.sha256(f"{spot_id}#{n}".encode()).digest()
            k = int.from_bytes(digest[:8], "big") % 36 ** 8
            cid = "ins-" + "".join(_B36[(k // 36 ** i) % 36] for i in range(7, -1, -1))
            if cid not in self.to_spot:
                break
            n += 1
        self.to_cvm[spot_id] = cid
        self.to_spot[cid] = spot_id
        return cid


# ---------------------------------------------------------------------------------------- server


class CvmServer(LoopbackServer):
    """An aiohttp server on loopback speaking CVM `RunInstances`/`DescribeInstances`/`TerminateInstances`
    with TC3 signatures, per-action rate limits and the cloud's injected faults (api `cvm`)."""

    def __init__(self, cloud: CloudServer, *, secret_id: str, secret_key: str, region: str = "ap-guangzhou",
                 host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        super().__init__(host, port)
        self.cloud = cloud
        self.secret_id = secret_id
        self.secret_key = secret_key
        self.token = token  # when set, requests must carry it as X-TC-Token (temporary credentials)
        self.region = region
        self.ids = CvmIds()
        self.rate_limits: dict[str, int] = dict(RATE_LIMITS)  # tests may raise them for bulk setup
        self.spot_quota: int | None = None  # non-terminated SPOTPAID instances allowed: LimitExceeded.SpotQuota
        self.requests: collections.Counter[str] = collections.Counter()  # accepted requests per action
        self._windows: dict[tuple[str, str], collections.deque[float]] = {}

    @property
    def endpoint(self) -> str:
        """What `HttpProfile(endpoint=...)` takes (with `protocol="http"`)."""
        return f"{self.host}:{self.port}"

    def cvm_id(self, spot_id: str) -> str:
        return self.ids.cvm(spot_id)

    def spot_id(self, cvm_id: str) -> str | None:
        self._sync_ids()
        return self.ids.to_spot.get(cvm_id)

    def instance(self, cvm_id: str) -> Instance | None:
        sid = self.spot_id(cvm_id)
        return None if sid is None else self.cloud.spot.instances.get(sid)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/", self._handle)
        return app

    def started(self) -> None:
        log.info("cvm api listening", url=self.url, region=self.region, zone=self.cloud.spot.zone)

    # ------------------------------------------------------------------------------------ the gate

    async def _handle(self, request: web.Request) -> web.Response:
        action = request.headers.get("X-TC-Action", "")
        request_id = str(uuid.uuid4())
        status = 0
        try:
            resp = await self._serve(request, action, request_id)
            status = resp.status
            return resp
        except CvmError as e:
            status = e.http_status
            self.cloud.errors[(API, action, e.code)] += 1
            return _error_response(e, request_id)
        except Exception:
            log.exception("cvm call failed", action=action)
            status = 200
            self.cloud.errors[(API, action, "InternalError")] += 1
            return _error_response(CvmError("InternalError", "internal error of the emulated CVM API"), request_id)
        finally:
            self.cloud.calls[(API, action, status)] += 1

    async def _serve(self, request: web.Request, action: str, request_id: str) -> web.Response:
        raw = await request.read()
        self._authenticate(request, raw)
        if not action:
            raise CvmError("MissingParameter", "the X-TC-Action header is required")
        if action not in ACTIONS:
            raise CvmError("InvalidAction", f"action {action!r} does not exist; this emulator serves {list(ACTIONS)}")
        version = request.headers.get("X-TC-Version", "")
        if version != VERSION:
            raise CvmError("NoSuchVersion", f"version {version!r} of cvm does not exist; use {VERSION}")
        region = request.headers.get("X-TC-Region")
        if not region:
            raise CvmError("MissingParameter", "the X-TC-Region header is required")
        if region != self.region:
            raise CvmError("UnsupportedRegion", f"region {region!r} is not served here; use {self.region!r}")
        self._throttle(action)
        try:
            params = msgspec.json.decode(raw) if raw.strip() else {}
        except msgspec.DecodeError as e:
            raise CvmError("InvalidParameter", f"request body is not valid JSON: {e}") from None
        if not isinstance(params, dict):
            raise CvmError("InvalidParameter", "request body must be a JSON object")
        await self._inject(action, after=False)
        handler: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] = {
            "RunInstances": self._run, "DescribeInstances": self._describe,
            "TerminateInstances": self._terminate}[action]
        try:
            body = await handler(params)
        except CloudError as e:
            raise CvmError(SPOT_CODES.get(e.code, "InternalError"), e.message) from None
        await self._inject(action, after=True)
        body["RequestId"] = request_id
        return json_response({"Response": body})

    def _authenticate(self, request: web.Request, raw: bytes) -> None:
        """Recompute the TC3 signature with the secret key; the checks and codes of the real gateway."""
        auth = request.headers.get("Authorization", "")
        if not auth:
            raise CvmError("AuthFailure.SignatureFailure", "the Authorization header is missing")
        m = _AUTH.match(auth.strip())
        if m is None:
            raise CvmError("AuthFailure.InvalidAuthorization",
                           "Authorization must be 'TC3-HMAC-SHA256 Credential=<SecretId>/<date>/cvm/tc3_request, "
                           "SignedHeaders=..., Signature=<hex>'")
        secret_id, date, service, signed, signature = m.groups()
        if not hmac.compare_digest(secret_id.encode(), self.secret_id.encode()):
            raise CvmError("AuthFailure.SecretIdNotFound", f"SecretId {secret_id!r} does not exist")
        raw_ts = request.headers.get("X-TC-Timestamp", "")
        if not raw_ts.isdigit():
            raise CvmError("AuthFailure.SignatureFailure", "X-TC-Timestamp must be a Unix time in seconds")
        ts = int(raw_ts)
        if abs(time.time() - ts) > SIGNATURE_WINDOW:
            raise CvmError("AuthFailure.SignatureExpire",
                           f"the signature expired: X-TC-Timestamp {ts} is more than {SIGNATURE_WINDOW:g}s from "
                           f"the server time {int(time.time())}")
        if service != SERVICE or date != datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d"):
            raise CvmError("AuthFailure.SignatureFailure",
                           "the credential scope must be <X-TC-Timestamp's UTC date>/cvm/tc3_request")
        names = signed.split(";")
        if "content-type" not in names or "host" not in names:
            raise CvmError("AuthFailure.SignatureFailure", "SignedHeaders must include content-type and host")
        headers = [(n, request.headers.get(n, "")) for n in names]
        if request.headers.get("X-TC-Content-SHA256") == "UNSIGNED-PAYLOAD":
            payload_hash = hashlib.sha256(b"UNSIGNED-PAYLOAD").hexdigest()
        else:
            payload_hash = hashlib.sha256(raw).hexdigest()
        want = tc3_signature(self.secret_key, timestamp=ts, method=request.method, uri=request.path,
                             query=request.query_string, headers=headers, payload_hash=payload_hash)
        if not hmac.compare_digest(want, signature):
            raise CvmError("AuthFailure.SignatureFailure", "the request signature does not match")
        if self.token is not None and request.headers.get("X-TC-Token") != self.token:
            raise CvmError("AuthFailure.TokenFailure", "the X-TC-Token is missing or invalid")

    def _throttle(self, action: str) -> None:
        """A sliding one-second window per (SecretId, action); refused requests do not count."""
        limit = self.rate_limits.get(action)
        if limit is None:
            return
        now = time.monotonic()
        window = self._windows.setdefault((self.secret_id, action), collections.deque())
        while window and now - window[0] >= 1.0:
            window.popleft()
        if len(window) >= limit:
            raise CvmError("RequestLimitExceeded",
                           f"{action} is limited to {limit} requests per second; retry later")
        window.append(now)
        self.requests[action] += 1

    async def _inject(self, action: str, *, after: bool) -> None:
        out = self.cloud.faults.roll(API, action, after=after)
        if out.delay > 0:
            await self._wait(out.delay)
        rule = out.rule
        if rule is None:
            return
        if rule.hang:
            log.info("fault: hang", api=API, op=action, seconds=rule.hang_seconds, after=after)
            await self._wait(rule.hang_seconds)
            raise CvmError("GatewayTimeout", "injected hang ended", http_status=504)
        err = _fault_error(rule)
        log.info("fault: error", api=API, op=action, code=err.code, status=err.http_status, after=after)
        raise err

    async def _wait(self, seconds: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    def _sync_ids(self) -> None:
        for sid in self.cloud.spot.instances:
            if sid not in self.ids.to_cvm:
                self.ids.cvm(sid)

    # ------------------------------------------------------------------------------------ RunInstances

    async def _run(self, p: dict[str, Any]) -> dict[str, Any]:
        _known(p, RUN_FIELDS)
        spot = self.cloud.spot
        charge, capacity_type, options = _run_charge(p)
        zone = self._run_zone(p)
        itype = _opt_str(p, "InstanceType")
        if not itype:
            raise CvmError("MissingParameter", "InstanceType is required")
        if itype not in spot.types:
            raise CvmError("InvalidParameterValue.InstanceTypeNotFound",
                           f"instance type {itype!r} does not exist; known: {sorted(spot.types)}")
        count, min_count = _run_counts(p)
        _run_image_and_network(p, options)
        labels, taints = _run_user_data(p, options)
        for key, opt in (("InstanceName", "instanceName"), ("HostName", "hostName")):
            v = _opt_str(p, key)
            if v is not None:
                options[opt] = v
        tags = _tags(p.get("TagSpecification"))
        token = _client_token(p)
        req = LaunchRequest(token, itype, count, min_count, tags, labels, taints, zone, capacity_type, options)
        dry_run = p.get("DryRun") is True
        if token not in spot.tokens or dry_run:
            self._check_quota(capacity_type, min_count)
        if dry_run:
            self._check_stock(req)
            raise CvmError("DryRunOperation", "the request would have succeeded (DryRun)")
        instances, created = spot.run(req)
        ids = [self.ids.cvm(i.id) for i in instances]
        if created:
            log.info("cvm RunInstances", token=token, instance_type=itype, count=len(ids), charge=charge)
        return {"InstanceIdSet": ids}

    def _run_zone(self, p: dict[str, Any]) -> str:
        """Placement.Zone, which must be the one zone this region emulates."""
        placement = p.get("Placement")
        if not isinstance(placement, dict) or not isinstance(placement.get("Zone"), str) or not placement["Zone"]:
            raise CvmError("MissingParameter", "Placement.Zone is required")
        zone: str = placement["Zone"]
        if zone != self.cloud.spot.zone:
            raise CvmError("InvalidZone.MismatchRegion",
                           f"zone {zone!r} does not exist in region {self.region!r}; known: [{self.cloud.spot.zone!r}]")
        return zone

    def _check_quota(self, capacity_type: str, want: int) -> None:
        if self.spot_quota is None or capacity_type != "spot":
            return
        used = sum(1 for i in self.cloud.spot.instances.values()
                   if i.capacity_type == "spot" and i.state != "terminated")
        if used + want > self.spot_quota:
            raise CvmError("LimitExceeded.SpotQuota",
                           f"the spot instance quota is {self.spot_quota}; {used} in use, {want} requested")

    def _check_stock(self, req: LaunchRequest) -> None:
        itype = self.cloud.spot.types[req.instance_type]
        if itype.capacity is not None and req.capacity_type == "spot":
            free = max(0, itype.capacity - self.cloud.spot.used[itype.name])
            if free < req.min_count:
                raise CvmError("ResourceInsufficient.SpecifiedInstanceType",
                               f"insufficient stock of {itype.name}: {free} available")

    # ------------------------------------------------------------------------------------ DescribeInstances

    async def _describe(self, p: dict[str, Any]) -> dict[str, Any]:
        _known(p, DESCRIBE_FIELDS)
        ids = p.get("InstanceIds")
        filters = p.get("Filters")
        if ids is not None and filters is not None:
            raise CvmError("InvalidParameterCombination", "InstanceIds and Filters cannot be used together")
        offset = p.get("Offset", 0)
        limit = p.get("Limit", DEFAULT_LIMIT)
        if not _is_int(offset) or offset < 0:
            raise _invalid("Offset must be an integer >= 0", "InvalidParameterValue.Range")
        if not _is_int(limit) or not 1 <= limit <= MAX_LIMIT:
            raise _invalid(f"Limit must be an integer from 1 to {MAX_LIMIT}", "InvalidParameterValue.Range")
        self._sync_ids()
        spot = self.cloud.spot
        if ids is not None:
            wanted = _id_list(ids, "InstanceIds")
            pool = [spot.instances[s] for s in (self.ids.to_spot.get(c) for c in wanted)
                    if s is not None and s in spot.instances]
        else:
            pool = list(spot.instances.values())
        checks = _filters(filters)
        found = [i for i in pool if i.state != "terminated" and all(self._match(i, n, v) for n, v in checks)]
        page = found[offset:offset + limit]
        return {"TotalCount": len(found), "InstanceSet": [self._instance_json(i) for i in page]}

    def _match(self, inst: Instance, name: str, values: list[str]) -> bool:
        if name == "tag-key":
            return any(v in inst.tags for v in values)
        if name == "tag-value":
            return any(v in values for v in inst.tags.values())
        if name.startswith("tag:"):
            got: str | None = inst.tags.get(name[4:])
        else:
            got = {
                "zone": inst.zone,
                "instance-id": self.ids.cvm(inst.id),
                "instance-state": STATE[inst.state],
                "instance-charge-type": CHARGE[inst.capacity_type],
                "instance-type": inst.type.name,
                "instance-name": inst.launch_options.get("instanceName"),
                "private-ip-address": inst.private_ip,
                "vpc-id": inst.launch_options.get("vpcId"),
                "subnet-id": inst.launch_options.get("subnetId"),
                "image-id": inst.launch_options.get("imageId"),
            }[name]
        return got is not None and got in values

    def _instance_json(self, inst: Instance) -> dict[str, Any]:
        t = inst.type
        opts = inst.launch_options
        state = STATE[inst.state]
        op_state = "OPERATING" if inst.state in ("pending", "shutting-down") else "SUCCESS"
        if inst.state == "launch-failed":
            op_state = "FAILED"
        error_msg = (inst.state_reason or {}).get("message") if inst.state == "launch-failed" else None
        return {
            "InstanceId": self.ids.cvm(inst.id),
            "InstanceName": opts.get("instanceName", "未命名"),
            "InstanceState": state,
            "InstanceType": t.name,
            "InstanceChargeType": CHARGE[inst.capacity_type],
            "Placement": {"Zone": inst.zone, "ProjectId": 0},
            "CPU": _int_of(t.cpu),
            "Memory": _gib(t.memory),
            "GPUInfo": {"GPUCount": float(t.gpus), "GPUType": t.gpu_model, "GPUId": []} if t.gpu_model else None,
            "PrivateIpAddresses": [inst.private_ip],
            "PublicIpAddresses": None,
            "HostName": inst.node_name,
            "ImageId": opts.get("imageId"),
            "VirtualPrivateCloud": ({"VpcId": opts.get("vpcId"), "SubnetId": opts.get("subnetId"),
                                     "AsVpcGateway": False} if "vpcId" in opts or "subnetId" in opts else None),
            "SecurityGroupIds": list(opts.get("securityGroupIds", [])),
            "CreatedTime": datetime.fromtimestamp(inst.launch_time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ExpiredTime": None,
            "Tags": [{"Key": k, "Value": v} for k, v in inst.tags.items()],
            "Uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"sim-cloud:{inst.id}")),
            "LatestOperation": "TerminateInstances" if inst.state == "shutting-down" else "RunInstances",
            "LatestOperationState": op_state,
            "LatestOperationErrorMsg": error_msg,
            "RestrictState": "NORMAL",
            "IsolatedSource": "NOTISOLATED",
            "StopChargingMode": "NOT_APPLICABLE",
            "DisableApiTermination": False,
            "DefaultLoginUser": "root",
            "DefaultLoginPort": 22,
            "RenewFlag": None,
            "OsName": "emulated",
        }

    # ------------------------------------------------------------------------------------ TerminateInstances

    async def _terminate(self, p: dict[str, Any]) -> dict[str, Any]:
        """All or nothing: one unknown id fails the call (`InvalidInstanceId.NotFound` naming the ids), one
        pending instance too; instances already terminating are fine."""
        _known(p, TERMINATE_FIELDS)
        if p.get("InstanceIds") is None:
            raise CvmError("MissingParameter", "InstanceIds is required")
        ids = list(dict.fromkeys(_id_list(p["InstanceIds"], "InstanceIds")))
        if not ids:
            raise CvmError("MissingParameter", "InstanceIds must name at least one instance")
        self._sync_ids()
        spot = self.cloud.spot
        found: list[Instance] = []
        missing: list[str] = []
        for cid in ids:
            sid = self.ids.to_spot.get(cid)
            inst = spot.instances.get(sid) if sid is not None else None
            if inst is None or inst.state == "terminated":
                missing.append(cid)
            else:
                found.append(inst)
        if missing:
            raise CvmError("InvalidInstanceId.NotFound", f"instances not found: {', '.join(missing)}")
        pending = [self.ids.cvm(i.id) for i in found if i.state == "pending"]
        if pending:
            raise CvmError("UnsupportedOperation.InstanceStatePending",
                           f"instances still PENDING cannot be terminated yet: {', '.join(pending)}")
        spot.terminate([i.id for i in found])
        return {}


# ---------------------------------------------------------------------------------------- helpers


def _run_charge(p: dict[str, Any]) -> tuple[str, CapacityType, dict[str, Any]]:
    """InstanceChargeType (spot or on-demand) and the spot market options, which only spot may carry."""
    charge = _opt_str(p, "InstanceChargeType") or "POSTPAID_BY_HOUR"
    if charge not in ("SPOTPAID", "POSTPAID_BY_HOUR"):
        raise _invalid(f"InstanceChargeType {charge!r} is not sold here; use SPOTPAID or POSTPAID_BY_HOUR")
    capacity_type: CapacityType = "spot" if charge == "SPOTPAID" else "on-demand"
    options: dict[str, Any] = {}
    market = p.get("InstanceMarketOptions")
    if market is not None:
        if charge != "SPOTPAID":
            raise CvmError("InvalidParameterCombination",
                           "InstanceMarketOptions is only allowed with InstanceChargeType SPOTPAID")
        options.update(_market(market))
    return charge, capacity_type, options


def _run_counts(p: dict[str, Any]) -> tuple[int, int]:
    """InstanceCount (1 to MAX_RUN_COUNT) and MinCount (1 to InstanceCount), the all-or-nothing floor."""
    count = p.get("InstanceCount", 1)
    if not _is_int(count) or not 1 <= count <= MAX_RUN_COUNT:
        raise _invalid(f"InstanceCount must be an integer from 1 to {MAX_RUN_COUNT}", "InvalidParameterValue.Range")
    min_count = p.get("MinCount", count)
    if not _is_int(min_count) or not 1 <= min_count <= count:
        raise _invalid("MinCount must be an integer from 1 to InstanceCount", "InvalidParameterValue.Range")
    return count, min_count


def _run_image_and_network(p: dict[str, Any], options: dict[str, Any]) -> None:
    """ImageId, VPC, subnet and security groups: checked for shape and recorded on the instance."""
    image = _opt_str(p, "ImageId")
    if image is not None:
        if not image.startswith("img-"):
            raise CvmError("InvalidImageId.Malformed", f"ImageId {image!r} must look like img-xxxxxxxx")
        options["imageId"] = image
    vpc = p.get("VirtualPrivateCloud")
    if vpc is not None:
        if not isinstance(vpc, dict):
            raise CvmError("InvalidParameter", "VirtualPrivateCloud must be an object")
        for key, opt, prefix in (("VpcId", "vpcId", "vpc-"), ("SubnetId", "subnetId", "subnet-")):
            v = vpc.get(key)
            if v is None:
                continue
            if not isinstance(v, str) or not v.startswith(prefix):
                raise CvmError(f"InvalidParameterValue.{key}Malformed", f"{key} must look like {prefix}xxxxxxxx")
            options[opt] = v
    groups = p.get("SecurityGroupIds")
    if groups is not None:
        if not isinstance(groups, list) or not all(isinstance(g, str) and g.startswith("sg-") for g in groups):
            raise CvmError("InvalidSgId.Malformed", "SecurityGroupIds must be ids like sg-xxxxxxxx")
        options["securityGroupIds"] = list(groups)


def _run_user_data(p: dict[str, Any], options: dict[str, Any]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """UserData (base64, bounded); the node labels and taints its kubelet flags give the node."""
    user_data = _opt_str(p, "UserData")
    if user_data is None:
        return {}, []
    if len(user_data) > USER_DATA_LIMIT:
        raise _invalid(f"UserData is {len(user_data)} bytes of base64; at most {USER_DATA_LIMIT}",
                       "InvalidParameterValue.Range")
    try:
        text = base64.b64decode(user_data, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        raise CvmError("InvalidParameterValue.InvalidUserDataFormat",
                       "UserData must be base64 encoded") from None
    options["userData"] = user_data
    return _kubelet_flags(text)


def _client_token(p: dict[str, Any]) -> str:
    """ClientToken (at most 64 printable ASCII bytes) makes a launch idempotent; without one, a fresh token."""
    token = p.get("ClientToken")
    if token is None or token == "":
        return f"cvm-auto-{uuid.uuid4()}"  # no token: no idempotency, as documented
    if not isinstance(token, str):
        raise CvmError("InvalidParameter", "ClientToken must be a string")
    if len(token.encode()) > 64:
        raise CvmError("InvalidClientToken.TooLong", f"ClientToken is {len(token.encode())} bytes; at most 64")
    if not all(32 < ord(c) < 127 for c in token):
        raise _invalid("ClientToken must be printable ASCII without spaces")
    return token


def _error_response(e: CvmError, request_id: str) -> web.Response:
    body = {"Response": {"Error": {"Code": e.code, "Message": e.message}, "RequestId": request_id}}
    return json_response(body, status=e.http_status)


def _fault_error(rule: FaultRule) -> CvmError:
    """An injected fault as the client sees it: a real HTTP 5xx (or 408) only when the rule names one."""
    status = rule.status
    message = rule.message or "injected fault"
    if status is not None and (status >= 500 or status == 408):
        return CvmError(rule.error or STATUS_CODE.get(status, "InternalError"), message, http_status=status)
    code = rule.error or FAULT_CODES.get(status or 0, "InternalError")
    return CvmError(code, rule.message or f"injected fault ({code})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _known(p: Mapping[str, Any], fields: frozenset[str]) -> None:
    unknown = sorted(set(p) - fields)
    if unknown:
        raise CvmError("UnknownParameter", f"unknown parameters {unknown}")


def _opt_str(p: Mapping[str, Any], key: str) -> str | None:
    v = p.get(key)
    if v is not None and not isinstance(v, str):
        raise CvmError("InvalidParameter", f"{key} must be a string")
    return v


def _id_list(v: Any, what: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise CvmError("InvalidParameter", f"{what} must be a list of instance ids")
    if len(v) > MAX_IDS:
        raise _invalid(f"{what}: at most {MAX_IDS} ids per call, got {len(v)}", "InvalidParameterValue.LimitExceeded")
    bad = [x for x in v if not INSTANCE_ID.fullmatch(x)]
    if bad:
        raise CvmError("InvalidInstanceId.Malformed", f"malformed instance ids {bad}; ids look like ins-xxxxxxxx")
    return list(v)


def _filters(v: Any) -> list[tuple[str, list[str]]]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise CvmError("InvalidParameter", "Filters must be a list of {Name, Values}")
    if len(v) > MAX_FILTERS:
        raise CvmError("InvalidFilterValue.LimitExceeded", f"at most {MAX_FILTERS} filters, got {len(v)}")
    out: list[tuple[str, list[str]]] = []
    for f in v:
        if not isinstance(f, dict) or not isinstance(f.get("Name"), str) or not isinstance(f.get("Values"), list):
            raise CvmError("InvalidFilter", "each filter needs a Name and a list of Values")
        name, values = f["Name"], f["Values"]
        if name not in FILTER_NAMES and not (name.startswith("tag:") and len(name) > 4):
            raise CvmError("InvalidFilter", f"unknown filter {name!r}; this emulator knows {list(FILTER_NAMES)}")
        if not values or not all(isinstance(x, str) for x in values):
            raise CvmError("InvalidFilter", f"filter {name!r}: Values must be a non-empty list of strings")
        if len(values) > MAX_FILTER_VALUES:
            raise CvmError("InvalidFilterValue.LimitExceeded",
                           f"filter {name!r}: at most {MAX_FILTER_VALUES} values, got {len(values)}")
        out.append((name, list(values)))
    return out


def _market(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise CvmError("InvalidParameter", "InstanceMarketOptions must be an object")
    if v.get("MarketType", "spot") != "spot":
        raise _invalid("InstanceMarketOptions.MarketType must be 'spot'")
    spot = v.get("SpotOptions") or {}
    if not isinstance(spot, dict):
        raise CvmError("InvalidParameter", "InstanceMarketOptions.SpotOptions must be an object")
    if spot.get("SpotInstanceType", "one-time") != "one-time":
        raise _invalid("SpotOptions.SpotInstanceType must be 'one-time'")
    price = spot.get("MaxPrice")
    if price is None:
        return {}
    try:
        ok = isinstance(price, str) and float(price) > 0
    except ValueError:
        ok = False
    if not ok:
        raise _invalid("SpotOptions.MaxPrice must be a positive decimal string")
    return {"maxPrice": price}


def _tags(v: Any) -> dict[str, str]:
    """Instance tags out of TagSpecification; specifications of other resource types are accepted and unused."""
    if v is None:
        return {}
    if not isinstance(v, list):
        raise CvmError("InvalidParameter", "TagSpecification must be a list")
    out: dict[str, str] = {}
    for spec in v:
        if not isinstance(spec, dict) or not isinstance(spec.get("ResourceType"), str):
            raise CvmError("InvalidParameter", "each TagSpecification needs a ResourceType")
        tags = spec.get("Tags") or []
        if not isinstance(tags, list):
            raise CvmError("InvalidParameter", "TagSpecification.Tags must be a list")
        if spec["ResourceType"] != "instance":
            continue
        for t in tags:
            if not isinstance(t, dict) or not isinstance(t.get("Key"), str) or not t["Key"]:
                raise CvmError("FailedOperation.IllegalTagKey", "each tag needs a non-empty Key")
            key, value = t["Key"], t.get("Value", "")
            if not isinstance(value, str):
                raise CvmError("FailedOperation.IllegalTagValue", f"tag {key!r}: Value must be a string")
            if key.lower().startswith(("qcloud:", "tencent:")):
                raise CvmError("FailedOperation.TagKeyReserved", f"tag key {key!r} uses a reserved prefix")
            if key in out:
                raise CvmError("InvalidParameterValue.DuplicateTags", f"tag key {key!r} appears twice")
            out[key] = value
    if len(out) > MAX_TAGS:
        raise CvmError("InvalidParameterValue.TagQuotaLimitExceeded", f"at most {MAX_TAGS} tags per instance")
    return out


def _kubelet_flags(text: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The node labels and taints a kubelet started by this user data would register with."""
    labels: dict[str, str] = {}
    taints: list[dict[str, Any]] = []
    for m in _LABEL_FLAG.finditer(text):
        for item in m.group(1).split(","):
            k, sep, v = item.partition("=")
            if k and sep:
                labels[k] = v
    for m in _TAINT_FLAG.finditer(text):
        for item in m.group(1).split(","):
            kv, sep, effect = item.rpartition(":")
            if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                continue
            k, _, v = kv.partition("=")
            if k:
                taints.append({"key": k, "value": v, "effect": effect})
    return labels, taints


def _int_of(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        return 0


def _gib(v: str) -> int:
    m = re.fullmatch(r"(\d+)(Gi|G|Ti|T|Mi|M)?", v)
    if m is None:
        return 0
    n, unit = int(m.group(1)), m.group(2) or "Gi"
    return {"Gi": n, "G": n, "Ti": n * 1024, "T": n * 1000, "Mi": n // 1024, "M": n // 1000}[unit]

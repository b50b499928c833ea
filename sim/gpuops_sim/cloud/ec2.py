"""An AWS EC2 front end of the emulated cloud: the EC2 Query API (form-encoded POST, XML answers) over the same
spot instances as `CloudServer`, so the real `boto3` client can be pointed at it.

moto covers request shapes but not what a spot controller must survive: ClientToken dedupe, pending and
shutting-down states, capacity errors, throttling, faults after an operation took effect. This server adds
those on top of `SpotCloud`, which already has them; instances launched here join the emulated cluster as
Nodes (with `spec.providerID` `aws:///<zone>/<instance-id>`, like EKS nodes).

What it emulates, and where it deliberately differs from EC2:

* SigV4 is verified for every request (header auth only, no presigned URLs); one access key pair.
* RunInstances, DescribeInstances and TerminateInstances only; other actions answer `InvalidAction`.
* Node names: `SpotCloud` names machines `ip-10-a-b-c`; `PrivateDnsName` is that name plus `.ec2.internal`
  (us-east-1) or `.<region>.compute.internal`, as EC2 does; the first DNS label is the sim's node name.
* A launch-failed instance is reported `terminated` with StateReason `Server.InternalError`.
* Reservation ids derive from the client token, so a replayed launch shows the same reservation.
* Spot interruption notices are not visible here (EC2 has them only in IMDS and EventBridge).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import re
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

import structlog
from aiohttp import web

from .errors import CloudError
from .loopback import LoopbackServer
from .server import CloudServer
from .spot import MAX_COUNT, MAX_IDS, USER_DATA_LIMIT, CapacityType, Instance, LaunchRequest, iso

log = structlog.get_logger("gpuops_sim.cloud.ec2")

API_VERSION = "2016-11-15"
NAMESPACE = f"http://ec2.amazonaws.com/doc/{API_VERSION}/"
OWNER_ID = "123456789012"
STATE_CODES = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}
MAX_SKEW_SECONDS = 300.0
"""SigV4 requests must arrive within 5 minutes of their X-Amz-Date (the AWS signing docs; the common-errors page
speaks of 15 minutes for `RequestExpired`, we take the stricter figure)."""
TERMINATE_LIMIT = 1000  # TerminateInstances: "Constraints: Up to 1000 instance IDs" (EC2 API reference)
TAG_LIMIT = 50
TAG_RESOURCE_TYPES = ("instance", "volume", "network-interface", "spot-instances-request")

# Request-rate token buckets, (burst, refill per second), from "Request throttling for the Amazon EC2 API"
# (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html): mutating actions 50 tokens
# refilled at 5/s, non-mutating (Describe*) 100 tokens refilled at 20/s; one bucket per action.
MUTATING = (50, 5.0)
NON_MUTATING = (100, 20.0)
DEFAULT_THROTTLE: dict[str, tuple[int, float]] = {
    "RunInstances": MUTATING,
    "TerminateInstances": MUTATING,
    "DescribeInstances": NON_MUTATING,
}

# HTTP status EC2 answers each error code with (anything else: 400).
EC2_STATUS: dict[str, int] = {
    "AuthFailure": 401,
    "MissingAuthenticationToken": 401,
    "SignatureDoesNotMatch": 403,
    "UnauthorizedOperation": 403,
    "OptInRequired": 403,
    "InsufficientInstanceCapacity": 500,
    "InsufficientCapacity": 500,
    "InternalError": 500,
    "RequestLimitExceeded": 503,
    "ServiceUnavailable": 503,
    "Unavailable": 503,
    "GatewayTimeout": 504,
}

_ID = re.compile(r"i-[0-9a-f]{8,17}")


def ec2_error(code: str, message: str) -> CloudError:
    return CloudError(EC2_STATUS.get(code, 400), code, message)


class _Bucket:
    """A non-blocking token bucket: the server refuses instead of waiting, as EC2 does."""

    def __init__(self, burst: int, rate: float) -> None:
        self.burst, self.rate = burst, rate
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class Ec2Server(LoopbackServer):
    """The EC2 Query API on its own loopback port, over `cloud.spot`; faults and counters are the cloud's."""

    def __init__(self, cloud: CloudServer, *, access_key_id: str, secret_access_key: str,
                 session_token: str | None = None, region: str = "us-east-1", host: str = "127.0.0.1",
                 port: int = 0, throttle: Mapping[str, tuple[int, float]] | None = None) -> None:
        super().__init__(host, port)
        self.cloud = cloud
        self.spot = cloud.spot
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.session_token = session_token
        self.region = region
        self.max_skew_seconds = MAX_SKEW_SECONDS
        self.clock: Callable[[], float] = time.time  # tests shift it to provoke RequestExpired
        self.buckets: dict[str, _Bucket] = {}
        for action, (burst, rate) in {**DEFAULT_THROTTLE, **(throttle or {})}.items():
            self.set_throttle(action, burst, rate)
        self._handlers: dict[str, Callable[[Mapping[str, str]], ET.Element]] = {
            "RunInstances": self._run_instances,
            "DescribeInstances": self._describe_instances,
            "TerminateInstances": self._terminate_instances,
        }

    # ------------------------------------------------------------------------------------ lifecycle

    def set_throttle(self, action: str, burst: int, rate: float) -> None:
        """Replace one action's request bucket (full again); tests shrink it to provoke RequestLimitExceeded."""
        if burst < 1 or rate <= 0:
            raise ValueError("throttle: burst must be >= 1 and rate > 0")
        self.buckets[action] = _Bucket(burst, rate)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/", self._handle)
        return app

    def started(self) -> None:
        log.info("ec2 listening", url=self.url, region=self.region, zone=self.spot.zone)

    # ------------------------------------------------------------------------------------ the gate

    async def _handle(self, request: web.Request) -> web.Response:
        action = "Unknown"
        status = 0
        request_id = str(uuid.uuid4())
        try:
            body = await request.read()
            params = dict(parse_qsl(request.query_string, keep_blank_values=True))
            if request.method == "POST" and body:
                try:
                    params.update(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True))
                except (UnicodeDecodeError, ValueError):
                    raise ec2_error("InvalidParameterValue", "the request body is not form-encoded") from None
            action = params.get("Action") or "Unknown"
            self._authenticate(request, body)
            handler = self._handlers.get(action)
            if handler is None:
                raise ec2_error("InvalidAction", f"The action {action} is not valid for this web service.")
            bucket = self.buckets.get(action)
            if bucket is not None and not bucket.take():
                raise ec2_error("RequestLimitExceeded", "Request limit exceeded.")
            await self._inject(action, after=False)
            root = handler(params)
            await self._inject(action, after=True)
            rid = ET.Element("requestId")
            rid.text = request_id
            root.insert(0, rid)  # first, as EC2 writes it
            status = 200
            return _xml(root, 200)
        except CloudError as e:
            status = e.status
            self.cloud.errors[("ec2", action, e.code)] += 1
            return _error_xml(e, request_id)
        except Exception:
            log.exception("ec2 call failed", action=action)
            status = 500
            self.cloud.errors[("ec2", action, "InternalError")] += 1
            return _error_xml(ec2_error("InternalError", "An internal error has occurred"), request_id)
        finally:
            self.cloud.calls[("ec2", action, status)] += 1

    async def _inject(self, action: str, *, after: bool) -> None:
        if action not in ("RunInstances", "DescribeInstances", "TerminateInstances"):
            return
        out = self.cloud.faults.roll("ec2", action, after=after)
        if out.delay > 0:
            await self._wait(out.delay)
        rule = out.rule
        if rule is None:
            return
        if rule.hang:
            log.info("fault: hang", api="ec2", op=action, seconds=rule.hang_seconds, after=after)
            await self._wait(rule.hang_seconds)
            raise ec2_error("GatewayTimeout", "injected hang ended")
        err = rule.to_error()
        if rule.status is None:  # a named error gets EC2's status for it, not the JSON APIs'
            err = CloudError(EC2_STATUS.get(err.code, err.status), err.code, err.message)
        log.info("fault: error", api="ec2", op=action, status=err.status, code=err.code, after=after)
        raise err

    async def _wait(self, seconds: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    # ------------------------------------------------------------------------------------ SigV4

    def _authenticate(self, request: web.Request, body: bytes) -> None:
        """Recompute the AWS Signature Version 4 of the request and compare (header form only)."""
        auth = request.headers.get("Authorization")
        if not auth:
            raise ec2_error("MissingAuthenticationToken",
                            "The request must contain either a valid (registered) AWS access key ID or X.509 "
                            "certificate.")
        algorithm, _, rest = auth.partition(" ")
        fields = dict(p.strip().partition("=")[::2] for p in rest.split(","))
        if algorithm != "AWS4-HMAC-SHA256" or not {"Credential", "SignedHeaders", "Signature"} <= set(fields):
            raise ec2_error("IncompleteSignature", "Authorization header requires AWS4-HMAC-SHA256 with "
                                                   "Credential, SignedHeaders and Signature")
        scope = fields["Credential"].split("/")
        if len(scope) != 5:
            raise ec2_error("IncompleteSignature", f"malformed Credential {fields['Credential']!r}")
        key_id, day, region, service, terminator = scope
        if key_id != self.access_key_id:
            raise ec2_error("AuthFailure", "AWS was not able to validate the provided access credentials")
        token = request.headers.get("X-Amz-Security-Token")
        if token != self.session_token:
            raise ec2_error("AuthFailure", "The security token included in the request is invalid")
        amz_date = request.headers.get("X-Amz-Date", "")
        try:
            signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise ec2_error("IncompleteSignature", "the request needs an X-Amz-Date header (YYYYMMDDTHHMMSSZ)") \
                from None
        if abs(self.clock() - signed_at) > self.max_skew_seconds:
            raise ec2_error("RequestExpired", f"Request has expired: signed at {amz_date}, the server's time is "
                                              f"{datetime.fromtimestamp(self.clock(), UTC):%Y%m%dT%H%M%SZ}")
        if day != amz_date[:8] or region != self.region or service != "ec2" or terminator != "aws4_request":
            raise ec2_error("SignatureDoesNotMatch",
                            f"Credential should be scoped to {amz_date[:8]}/{self.region}/ec2/aws4_request, "
                            f"not {day}/{region}/{service}/{terminator}")
        signed = fields["SignedHeaders"].split(";")
        if "host" not in signed or "x-amz-date" not in signed:
            raise ec2_error("SignatureDoesNotMatch", "SignedHeaders must include host and x-amz-date")
        path, _, _query = request.raw_path.partition("?")
        canonical_query = "&".join(
            f"{_uri(k)}={_uri(v)}" for k, v in sorted(parse_qsl(request.query_string, keep_blank_values=True)))
        canonical_headers = "".join(
            f"{h}:{','.join(' '.join(v.split()) for v in request.headers.getall(h, []))}\n" for h in signed)
        payload = request.headers.get("X-Amz-Content-SHA256") or hashlib.sha256(body).hexdigest()
        canonical = "\n".join([request.method, quote(unquote(path) or "/", safe="/~"), canonical_query,
                               canonical_headers, ";".join(signed), payload])
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, "/".join(scope[1:]),
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = f"AWS4{self.secret_access_key}".encode()
        for part in (day, region, service, terminator):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, fields["Signature"]):
            raise ec2_error("SignatureDoesNotMatch",
                            "The request signature we calculated does not match the signature you provided. "
                            "Check your AWS Secret Access Key and signing method.")

    # ------------------------------------------------------------------------------------ RunInstances

    def _run_instances(self, p: Mapping[str, str]) -> ET.Element:
        image = p.get("ImageId")
        if not image:
            raise ec2_error("MissingParameter", "The request must contain the parameter ImageId")
        if not re.fullmatch(r"ami-[0-9a-zA-Z]+", image):
            raise ec2_error("InvalidAMIID.Malformed", f'Invalid id: "{image}" (expecting "ami-...")')
        itype = p.get("InstanceType")
        if not itype:
            raise ec2_error("MissingParameter", "The request must contain the parameter InstanceType")
        if itype not in self.spot.types:
            raise ec2_error("InvalidParameterValue", f"Invalid value '{itype}' for InstanceType.")
        min_count, max_count = _count(p, "MinCount"), _count(p, "MaxCount")
        if min_count > max_count:
            raise ec2_error("InvalidParameterValue", "MinCount must be less than or equal to MaxCount")
        if min_count > MAX_COUNT:
            raise ec2_error("InstanceLimitExceeded",
                            f"Your quota allows for {MAX_COUNT} more running instance(s). You requested at least "
                            f"{min_count}.")
        zone = p.get("Placement.AvailabilityZone") or None
        if zone is not None and zone != self.spot.zone:
            raise ec2_error("InvalidParameterValue", f"Invalid availability zone: [{zone}]")
        token = p.get("ClientToken") or str(uuid.uuid4())  # no token: every call is a new launch
        if len(token) > 64 or not all(32 < ord(c) < 127 for c in token):
            raise ec2_error("InvalidParameterValue", "ClientToken must be at most 64 printable ASCII characters")
        options = _launch_options(p, image)
        capacity_type: CapacityType = "on-demand"
        market = p.get("InstanceMarketOptions.MarketType")
        if market is not None:
            if market != "spot":
                raise ec2_error("InvalidParameterValue", f"Invalid value '{market}' for MarketType")
            capacity_type = "spot"
            self._spot_options(p, options)
        req = LaunchRequest(token, itype, min(max_count, MAX_COUNT), min_count, self._tags(p), {}, [], zone,
                            capacity_type, options)
        try:
            instances, created = self.spot.run(req)
        except CloudError as e:  # SpotCloud speaks the JSON APIs' statuses
            raise ec2_error(e.code, e.message) from None
        if created:
            for inst in instances:  # nodes join with EKS-style provider ids
                inst.provider_id = f"aws:///{inst.zone}/{inst.id}"
                if inst.machine is not None:
                    inst.machine.provider_id = inst.provider_id
        root = ET.Element("RunInstancesResponse", xmlns=NAMESPACE)
        self._reservation_fields(root, token)
        items = ET.SubElement(root, "instancesSet")
        for n, inst in enumerate(instances):
            self._instance_xml(ET.SubElement(items, "item"), inst, n)
        return root

    def _spot_options(self, p: Mapping[str, str], options: dict[str, Any]) -> None:
        prefix = "InstanceMarketOptions.SpotOptions."
        kind = p.get(prefix + "SpotInstanceType", "one-time")
        behavior = p.get(prefix + "InstanceInterruptionBehavior", "terminate")
        if kind not in ("one-time", "persistent"):
            raise ec2_error("InvalidParameterValue", f"Invalid value '{kind}' for SpotInstanceType")
        if behavior not in ("terminate", "stop", "hibernate"):
            raise ec2_error("InvalidParameterValue", f"Invalid value '{behavior}' for InstanceInterruptionBehavior")
        if kind == "persistent" and behavior == "terminate":
            raise ec2_error("InvalidParameterCombination",
                            "A persistent spot request needs InstanceInterruptionBehavior stop or hibernate")
        price = p.get(prefix + "MaxPrice")
        if price is not None:
            try:
                ok = Decimal(price) > 0
            except InvalidOperation:
                ok = False
            if not ok:
                raise ec2_error("InvalidParameterValue", f"Invalid value '{price}' for MaxPrice")
            options["maxPrice"] = price

    def _tags(self, p: Mapping[str, str]) -> dict[str, str]:
        tags: dict[str, str] = {}
        n = 1
        while f"TagSpecification.{n}.ResourceType" in p:
            kind = p[f"TagSpecification.{n}.ResourceType"]
            if kind not in TAG_RESOURCE_TYPES:
                raise ec2_error("InvalidParameterValue", f"'{kind}' is not a valid taggable resource type for "
                                                         "this operation.")
            m = 1
            while f"TagSpecification.{n}.Tag.{m}.Key" in p:
                key = p[f"TagSpecification.{n}.Tag.{m}.Key"]
                value = p.get(f"TagSpecification.{n}.Tag.{m}.Value", "")
                if not key or len(key) > 128 or len(value) > 256 or key.lower().startswith("aws:"):
                    raise ec2_error("InvalidParameterValue", f"Tag key {key!r} or its value is not allowed "
                                                             "(1-128 characters, no 'aws:' prefix; values <= 256)")
                if kind == "instance":
                    tags[key] = value
                m += 1
            n += 1
        if len(tags) > TAG_LIMIT:
            raise ec2_error("TagLimitExceeded", f"at most {TAG_LIMIT} tags per resource")
        return tags

    # ------------------------------------------------------------------------------------ DescribeInstances

    def _describe_instances(self, p: Mapping[str, str]) -> ET.Element:
        ids = _list(p, "InstanceId")
        raw_max = p.get("MaxResults")
        if ids and raw_max is not None:
            raise ec2_error("InvalidParameterCombination",
                            "The parameter instancesSet cannot be used with the parameter maxResults")
        filters = self._filters(p)
        if ids:
            self._check_ids(ids)
            pool = [self.spot.instances[i] for i in dict.fromkeys(ids)]
        else:
            pool = list(self.spot.instances.values())
        found = [inst for inst in pool if all(self._match(inst, name, vals) for name, vals in filters)]
        query = hashlib.sha256(repr((sorted(filters), raw_max)).encode()).hexdigest()[:12]
        start = 0
        if p.get("NextToken"):
            start = _decode_token(p["NextToken"], query, len(found))
        end = len(found)
        if raw_max is not None:
            if not raw_max.isdigit() or not 5 <= int(raw_max) <= 1000:
                raise ec2_error("InvalidParameterValue", f"Value ( {raw_max} ) for parameter maxResults is invalid. "
                                                         "Expecting a value between 5 and 1000.")
            end = min(end, start + int(raw_max))
        page = found[start:end]
        root = ET.Element("DescribeInstancesResponse", xmlns=NAMESPACE)
        reservations = ET.SubElement(root, "reservationSet")
        by_token: dict[str, list[Instance]] = {}
        for inst in page:
            by_token.setdefault(inst.client_token, []).append(inst)
        for token, members in by_token.items():
            item = ET.SubElement(reservations, "item")
            self._reservation_fields(item, token)
            items = ET.SubElement(item, "instancesSet")
            for inst in members:
                self._instance_xml(ET.SubElement(items, "item"), inst, 0)
        if end < len(found):
            ET.SubElement(root, "nextToken").text = _encode_token(end, query)
        return root

    def _filters(self, p: Mapping[str, str]) -> list[tuple[str, tuple[str, ...]]]:
        out: list[tuple[str, tuple[str, ...]]] = []
        n = 1
        while f"Filter.{n}.Name" in p:
            name = p[f"Filter.{n}.Name"]
            if name not in _FILTERS and not (name.startswith("tag:") and len(name) > 4):
                raise ec2_error("InvalidParameterValue", f"The filter '{name}' is invalid")
            out.append((name, tuple(_list(p, f"Filter.{n}.Value"))))
            n += 1
        return out

    def _match(self, inst: Instance, name: str, values: Sequence[str]) -> bool:
        if not values:
            return True
        if name == "tag-key":
            got: list[str] = list(inst.tags)
        elif name == "tag-value":
            got = list(inst.tags.values())
        elif name.startswith("tag:"):
            v = inst.tags.get(name[4:])
            got = [] if v is None else [v]
        else:
            got = [x for x in [self._field(inst, name)] if x is not None]
        return any(_wildcard(pat).fullmatch(g) for pat in values for g in got)

    def _field(self, inst: Instance, name: str) -> str | None:
        state = _state(inst)
        return {
            "instance-id": inst.id,
            "instance-state-name": state,
            "instance-state-code": str(STATE_CODES[state]),
            "instance-type": inst.type.name,
            "availability-zone": inst.zone,
            "instance-lifecycle": "spot" if inst.capacity_type == "spot" else None,
            "client-token": inst.client_token,
            "private-ip-address": inst.private_ip,
            "private-dns-name": self.dns_name(inst),
            "image-id": inst.launch_options.get("imageId"),
            "subnet-id": inst.launch_options.get("subnetId"),
            "reservation-id": _reservation_id(inst.client_token),
        }[name]

    # ------------------------------------------------------------------------------------ TerminateInstances

    def _terminate_instances(self, p: Mapping[str, str]) -> ET.Element:
        ids = list(dict.fromkeys(_list(p, "InstanceId")))
        if not ids:
            raise ec2_error("MissingParameter", "The request must contain the parameter InstanceId")
        if len(ids) > TERMINATE_LIMIT:
            raise ec2_error("InvalidParameterValue", f"at most {TERMINATE_LIMIT} instance IDs per request")
        self._check_ids(ids)  # one unknown id fails the whole call, nothing is terminated
        states: dict[str, tuple[str, str]] = {}
        live: list[str] = []
        for i in ids:
            inst = self.spot.instances[i]
            if inst.state == "launch-failed":  # already gone, as EC2 sees it
                states[i] = ("terminated", "terminated")
            else:
                live.append(i)
        for k in range(0, len(live), MAX_IDS):
            done, _missing = self.spot.terminate(live[k:k + MAX_IDS])
            for inst, before in done:
                states[inst.id] = ("terminated" if before == "launch-failed" else before, _state(inst))
        root = ET.Element("TerminateInstancesResponse", xmlns=NAMESPACE)
        items = ET.SubElement(root, "instancesSet")
        for i in ids:
            previous, current = states[i]
            item = ET.SubElement(items, "item")
            ET.SubElement(item, "instanceId").text = i
            for tag, name in (("currentState", current), ("previousState", previous)):
                s = ET.SubElement(item, tag)
                ET.SubElement(s, "code").text = str(STATE_CODES[name])
                ET.SubElement(s, "name").text = name
        return root

    # ------------------------------------------------------------------------------------ XML helpers

    def dns_name(self, inst: Instance) -> str:
        """EC2's IP-based private DNS name: `<node name>.ec2.internal` in us-east-1, else `.<region>.compute...`."""
        suffix = "ec2.internal" if self.region == "us-east-1" else f"{self.region}.compute.internal"
        return f"{inst.node_name}.{suffix}"

    def _check_ids(self, ids: Sequence[str]) -> None:
        bad_ids = [i for i in ids if not _ID.fullmatch(i)]
        if bad_ids:
            raise ec2_error("InvalidInstanceID.Malformed", f'Invalid id: "{bad_ids[0]}"')
        missing = [i for i in dict.fromkeys(ids) if i not in self.spot.instances]
        if len(missing) == 1:
            raise ec2_error("InvalidInstanceID.NotFound", f"The instance ID '{missing[0]}' does not exist")
        if missing:
            raise ec2_error("InvalidInstanceID.NotFound", f"The instance IDs '{', '.join(missing)}' do not exist")

    def _reservation_fields(self, parent: ET.Element, token: str) -> None:
        ET.SubElement(parent, "reservationId").text = _reservation_id(token)
        ET.SubElement(parent, "ownerId").text = OWNER_ID
        ET.SubElement(parent, "groupSet")

    def _instance_xml(self, item: ET.Element, inst: Instance, index: int) -> None:
        opts = inst.launch_options
        state = _state(inst)

        def add(tag: str, text: str | None, parent: ET.Element = item) -> ET.Element:
            el = ET.SubElement(parent, tag)
            if text is not None:
                el.text = text
            return el

        add("instanceId", inst.id)
        add("imageId", opts.get("imageId"))
        s = add("instanceState", None)
        add("code", str(STATE_CODES[state]), s)
        add("name", state, s)
        add("privateDnsName", self.dns_name(inst))
        add("dnsName", None)
        reason = inst.state_reason or {}
        add("reason", f"{reason['message']} ({iso(inst.launch_time)})" if reason else None)
        add("amiLaunchIndex", str(index))
        add("instanceType", inst.type.name)
        add("launchTime", iso(inst.launch_time))
        placement = add("placement", None)
        add("availabilityZone", inst.zone, placement)
        add("groupName", None, placement)
        add("tenancy", "default", placement)
        mon = add("monitoring", None)
        add("state", "disabled", mon)
        if "subnetId" in opts:
            add("subnetId", opts["subnetId"])
        add("privateIpAddress", inst.private_ip)
        groups = add("groupSet", None)
        for g in opts.get("securityGroupIds", []):
            add("groupId", g, add("item", None, groups))
        if inst.state_reason is not None:
            sr = add("stateReason", None)
            add("code", inst.state_reason["code"], sr)
            add("message", inst.state_reason["message"], sr)
        add("architecture", "x86_64")
        add("rootDeviceType", "ebs")
        add("rootDeviceName", "/dev/xvda")
        if inst.capacity_type == "spot":
            add("instanceLifecycle", "spot")
        add("clientToken", inst.client_token)
        tags = add("tagSet", None)
        for k, v in inst.tags.items():
            t = add("item", None, tags)
            add("key", k, t)
            add("value", v, t)
        add("hypervisor", "xen")
        add("virtualizationType", "hvm")
        add("ebsOptimized", "false")


# ------------------------------------------------------------------------------------ module helpers

_FILTERS = ("tag-key", "tag-value", "instance-id", "instance-state-name", "instance-state-code", "instance-type",
            "availability-zone", "instance-lifecycle", "client-token", "private-ip-address", "private-dns-name",
            "image-id", "subnet-id", "reservation-id")


def _state(inst: Instance) -> str:
    return "terminated" if inst.state == "launch-failed" else inst.state


def _reservation_id(token: str) -> str:
    return "r-" + hashlib.sha256(token.encode()).hexdigest()[:17]


def _uri(s: str) -> str:
    return quote(s, safe="-_.~")


def _list(p: Mapping[str, str], prefix: str) -> list[str]:
    """`Prefix.1`, `Prefix.2`, ... until the first gap, as the Query protocol numbers list members."""
    out = []
    n = 1
    while f"{prefix}.{n}" in p:
        out.append(p[f"{prefix}.{n}"])
        n += 1
    return out


def _count(p: Mapping[str, str], name: str) -> int:
    raw = p.get(name)
    if raw is None:
        raise ec2_error("MissingParameter", f"The request must contain the parameter {name}")
    if not raw.isdigit() or int(raw) < 1:
        raise ec2_error("InvalidParameterValue", f"Value ({raw}) for parameter {name} is invalid. "
                                                 "Expecting a positive integer.")
    return int(raw)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _launch_options(p: Mapping[str, str], image: str) -> dict[str, Any]:
    """What the instances record of the launch: image, subnet, security groups and (decoded) user data."""
    options: dict[str, Any] = {"imageId": image}
    if p.get("SubnetId"):
        options["subnetId"] = p["SubnetId"]
    groups = _list(p, "SecurityGroupId")
    if groups:
        options["securityGroupIds"] = groups
    if "UserData" in p:
        try:
            raw = base64.b64decode(p["UserData"], validate=True)
        except (binascii.Error, ValueError):
            raise ec2_error("InvalidParameterValue", "Invalid BASE64 encoding of user data.") from None
        if len(raw) > USER_DATA_LIMIT:
            raise ec2_error("InvalidParameterValue", f"User data is limited to {USER_DATA_LIMIT} bytes")
        options["userData"] = raw.decode("utf-8", "replace")
    return options


def _wildcard(pattern: str) -> re.Pattern[str]:
    """EC2 filter values: `*` any run, `?` one character, case-sensitive, everything else literal."""
    rx = _PATTERNS.get(pattern)
    if rx is None:
        rx = re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.S)
        if len(_PATTERNS) < 1024:
            _PATTERNS[pattern] = rx
    return rx


def _encode_token(offset: int, query: str) -> str:
    return base64.urlsafe_b64encode(f"{offset}:{query}".encode()).decode()


def _decode_token(token: str, query: str, size: int) -> int:
    """The offset a NextToken stands for; a token of another query, or garbage, is refused as EC2 does."""
    try:
        offset, _, q = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        if q == query and offset.isdigit() and int(offset) <= size:
            return int(offset)
    except (binascii.Error, ValueError):
        pass
    raise ec2_error("InvalidParameterValue", f"Invalid value '{token}' for NextToken")


def _xml(root: ET.Element, status: int) -> web.Response:
    body = b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8", xml_declaration=False)
    return web.Response(body=body, status=status, content_type="text/xml", charset="UTF-8")


def _error_xml(e: CloudError, request_id: str) -> web.Response:
    root = ET.Element("Response")
    err = ET.SubElement(ET.SubElement(root, "Errors"), "Error")
    ET.SubElement(err, "Code").text = e.code
    ET.SubElement(err, "Message").text = e.message
    ET.SubElement(root, "RequestID").text = request_id
    return _xml(root, e.status)


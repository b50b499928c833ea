"""The Tencent Cloud CVM emulator over real HTTP: through the official SDK and through raw signed requests."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from tencentcloud.common import credential
from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
from tencentcloud.common.profile.client_profile import ClientProfile
from tencentcloud.common.profile.http_profile import HttpProfile
from tencentcloud.cvm.v20170312 import cvm_client, models
from waiting import NotYet, until, until_holds

from gpuops_sim.cloud import CloudOptions, CloudServer, InstanceType
from gpuops_sim.cloud.cvm import CvmServer, signed_headers
from gpuops_sim.cluster.machines import Fleet

SID, SKEY = "AKIDsimcvm0000000001", "sim-cvm-secret-key"
REGION, ZONE = "ap-guangzhou", "ap-guangzhou-3"
FAST = CloudOptions(launch_seconds=0.2, boot_seconds=0.05, device_plugin_seconds=0.01, terminate_seconds=0.05,
                    reclaim_notice_seconds=0.1, terminated_visible_seconds=0.3, seed=11)
TYPES = [InstanceType("GN7.LARGE20", "T4-16GB", 1, capacity=3), InstanceType("GT4.4XLARGE96", "A100-40GB", 1),
         InstanceType("S5.LARGE8", None, 0, "2", "8Gi")]
CVM_ID = re.compile(r"^ins-[0-9a-z]{8}$")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Env:
    cloud: CloudServer
    cvm: CvmServer
    fleet: Fleet
    session: aiohttp.ClientSession

    def client(self, secret_id: str = SID, secret_key: str = SKEY, timeout: float = 5) -> Any:
        http = HttpProfile(protocol="http", endpoint=self.cvm.endpoint, reqTimeout=timeout)
        return cvm_client.CvmClient(credential.Credential(secret_id, secret_key), REGION,
                                    ClientProfile(httpProfile=http))

    async def raw(self, action: str, params: Any, *, secret_id: str = SID, secret_key: str = SKEY,
                  timestamp: int | None = None, region: str = REGION, version: str = "2017-03-12",
                  body: bytes | None = None, headers: dict[str, str] | None = None,
                  limit: float = 5.0) -> tuple[int, Any, str]:
        """A signed POST; `body` replaces the signed body afterwards (a tampered request)."""
        signed = json.dumps(params).encode()
        h = signed_headers(secret_id, secret_key, action=action, body=signed, host=self.cvm.endpoint,
                           region=region, timestamp=timestamp, version=version)
        h.update(headers or {})
        async with self.session.post(self.cvm.url + "/", data=signed if body is None else body, headers=h,
                                     timeout=aiohttp.ClientTimeout(total=limit)) as r:
            return r.status, json.loads(await r.read()), r.headers["Content-Type"]


async def sdk(fn: Callable[[Any], Any], req: Any) -> Any:
    """A blocking SDK call off the event loop the server runs on."""
    return await asyncio.to_thread(fn, req)


async def sdk_error(fn: Callable[[Any], Any], req: Any) -> TencentCloudSDKException:
    with pytest.raises(TencentCloudSDKException) as ei:
        await sdk(fn, req)
    return ei.value


def run_req(token: str | None = None, *, count: int = 1, itype: str = "GT4.4XLARGE96", charge: str = "SPOTPAID",
            tags: dict[str, str] | None = None, zone: str = ZONE, **extra: Any) -> Any:
    params: dict[str, Any] = {"InstanceChargeType": charge, "InstanceCount": count, "InstanceType": itype,
                              "Placement": {"Zone": zone}, "ImageId": "img-gpu00001", **extra}
    if charge == "SPOTPAID":
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
    if token is not None:
        params["ClientToken"] = token
    if tags:
        params["TagSpecification"] = [{"ResourceType": "instance",
                                       "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    req = models.RunInstancesRequest()
    req.from_json_string(json.dumps(params))
    return req


def describe_req(**params: Any) -> Any:
    req = models.DescribeInstancesRequest()
    req.from_json_string(json.dumps(params))
    return req


def terminate_req(ids: list[str]) -> Any:
    req = models.TerminateInstancesRequest()
    req.InstanceIds = ids
    return req


@pytest.fixture
async def env(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    fleet = Fleet()
    async with CloudServer(fleet, instance_types=[InstanceType(**vars(t)) for t in TYPES], options=FAST,
                           zone=ZONE) as cloud, \
            CvmServer(cloud, secret_id=SID, secret_key=SKEY, region=REGION) as cvm, \
            aiohttp.ClientSession() as session:
        yield Env(cloud, cvm, fleet, session)
    fleet.close()


# ------------------------------------------------------------------------------------ RunInstances


@pytest.mark.anyio
async def test_sdk_launch_goes_pending_then_running_and_joins_the_fleet(env: Env) -> None:
    c = env.client()
    resp = await sdk(c.RunInstances, run_req("tok-run-1", count=2, tags={"gpuops.io/pool": "a", "team": "ml"}))
    ids = list(resp.InstanceIdSet)
    assert len(ids) == 2 and all(CVM_ID.match(i) for i in ids) and resp.RequestId
    first = await sdk(c.DescribeInstances, describe_req(InstanceIds=ids))
    assert first.TotalCount == 2
    inst = first.InstanceSet[0]
    assert (inst.InstanceState, inst.InstanceChargeType, inst.Placement.Zone, inst.InstanceType) == (
        "PENDING", "SPOTPAID", ZONE, "GT4.4XLARGE96")
    assert {t.Key: t.Value for t in inst.Tags} == {"gpuops.io/pool": "a", "team": "ml"}
    assert inst.PublicIpAddresses is None and re.match(r"^10\.\d+\.\d+\.\d+$", inst.PrivateIpAddresses[0])
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", inst.CreatedTime) and inst.ImageId == "img-gpu00001"
    assert inst.GPUInfo.GPUCount == 1.0 and inst.LatestOperationState == "OPERATING"
    # the same instances, in the emulated cloud under their own ids, with a stable mapping both ways
    spot = [env.cvm.instance(i) for i in ids]
    assert all(s is not None and s.capacity_type == "spot" for s in spot)
    assert [env.cvm.cvm_id(s.id) for s in spot if s is not None] == ids
    assert CvmServer(env.cloud, secret_id=SID, secret_key=SKEY).cvm_id(spot[0].id) == ids[0]  # type: ignore[union-attr]

    async def states() -> set[str]:
        r = await sdk(c.DescribeInstances, describe_req(InstanceIds=ids))
        return {i.InstanceState for i in r.InstanceSet}

    async def running() -> bool | NotYet:
        seen = await states()
        return seen == {"RUNNING"} or NotYet(seen)

    await until("both instances RUNNING", running, 3, every=0.02)
    await until_holds("every spot instance's node in the fleet",
                      lambda: all(s is not None and s.node_name in env.fleet.machines for s in spot), 3.0)
    assert inst.HostName == spot[0].node_name  # type: ignore[union-attr]

    resp = await sdk(c.RunInstances, run_req("tok-od-1", charge="POSTPAID_BY_HOUR", itype="S5.LARGE8"))
    od = await sdk(c.DescribeInstances, describe_req(InstanceIds=list(resp.InstanceIdSet)))
    assert od.InstanceSet[0].InstanceChargeType == "POSTPAID_BY_HOUR" and od.InstanceSet[0].GPUInfo is None
    assert env.cvm.instance(resp.InstanceIdSet[0]).capacity_type == "on-demand"  # type: ignore[union-attr]
    assert env.cloud.calls[("cvm", "RunInstances", 200)] == 2


@pytest.mark.anyio
async def test_client_token_replays_the_first_launch_and_refuses_other_parameters(env: Env) -> None:
    c = env.client()
    first = await sdk(c.RunInstances, run_req("tok-same", count=2, tags={"k": "v"}))
    again = await sdk(c.RunInstances, run_req("tok-same", count=2, tags={"k": "v"}))
    assert list(again.InstanceIdSet) == list(first.InstanceIdSet) and env.cloud.spot.launched == 2
    e = await sdk_error(c.RunInstances, run_req("tok-same", count=3, tags={"k": "v"}))
    assert e.code == "InvalidClientToken.ParameterMismatch" and "tok-same" in e.message
    e = await sdk_error(c.RunInstances, run_req("tok-same", count=2, tags={"k": "other"}))
    assert e.code == "InvalidClientToken.ParameterMismatch"
    e = await sdk_error(c.RunInstances, run_req("x" * 65))
    assert e.code == "InvalidClientToken.TooLong"
    await sdk(c.RunInstances, run_req("x" * 64))
    # no token at all: no idempotency, as documented
    a = await sdk(c.RunInstances, run_req(None))
    b = await sdk(c.RunInstances, run_req(None))
    assert a.InstanceIdSet != b.InstanceIdSet and env.cloud.spot.launched == 5


@pytest.mark.anyio
async def test_launch_errors_use_the_documented_codes(env: Env) -> None:
    env.cvm.rate_limits["RunInstances"] = 1000  # many calls in a row; the limits have their own test
    c = env.client()
    cases: list[tuple[Any, str]] = [
        (run_req("e1", itype="GN7.LARGE20", count=4), "ResourceInsufficient.SpecifiedInstanceType"),
        (run_req("e2", zone="ap-guangzhou-9"), "InvalidZone.MismatchRegion"),
        (run_req("e3", itype="NOPE.LARGE"), "InvalidParameterValue.InstanceTypeNotFound"),
        (run_req("e4", count=501), "InvalidParameterValue.Range"),
        (run_req("e5", UserData="not base64!"), "InvalidParameterValue.InvalidUserDataFormat"),
        (run_req("e6", UserData=base64.b64encode(b"x" * 12289).decode()), "InvalidParameterValue.Range"),
        (run_req("e7", charge="POSTPAID_BY_HOUR", InstanceMarketOptions={"MarketType": "spot"}),
         "InvalidParameterCombination"),
        (run_req("e8", charge="PREPAID"), "InvalidParameterValue"),
        (run_req("e9", ImageId="ubuntu"), "InvalidImageId.Malformed"),
        (run_req("e10", tags={"qcloud:owner": "x"}), "FailedOperation.TagKeyReserved"),
        (run_req("e11", DryRun=True), "DryRunOperation"),
    ]
    for req, code in cases:
        e = await sdk_error(c.RunInstances, req)
        assert e.code == code, (code, e.code, e.message)
    assert env.cloud.spot.launched == 0
    # the stock that is left is sold; then a minimum the stock cannot meet fails, a smaller one is granted
    got = await sdk(c.RunInstances, run_req("cap-1", itype="GN7.LARGE20", count=2))
    assert len(got.InstanceIdSet) == 2
    got = await sdk(c.RunInstances, run_req("cap-2", itype="GN7.LARGE20", count=2, MinCount=1))
    assert len(got.InstanceIdSet) == 1
    env.cvm.spot_quota = 4
    e = await sdk_error(c.RunInstances, run_req("q-1", count=2))
    assert e.code == "LimitExceeded.SpotQuota"
    await sdk(c.RunInstances, run_req("q-2", count=1, charge="POSTPAID_BY_HOUR"))  # on-demand: not spot quota
    _, body, _ = await env.raw("RunInstances", {"InstanceType": "S5.LARGE8", "Placement": {"Zone": ZONE},
                                                "Bogus": 1})
    assert body["Response"]["Error"]["Code"] == "UnknownParameter"
    # user data is recorded as sent, and a kubelet's --node-labels / --register-with-taints reach the Node
    script = "#!/bin/sh\nkubelet --node-labels=gpuops.io/pool=a,tier=gpu --register-with-taints=gpu=yes:NoSchedule\n"
    ud = base64.b64encode(script.encode()).decode()
    got = await sdk(c.RunInstances, run_req("ud-1", charge="POSTPAID_BY_HOUR", itype="S5.LARGE8", UserData=ud,
                                            VirtualPrivateCloud={"VpcId": "vpc-1", "SubnetId": "subnet-1"},
                                            SecurityGroupIds=["sg-1"], InstanceName="pool-a"))
    inst = env.cvm.instance(got.InstanceIdSet[0])
    assert inst is not None and inst.launch_options["userData"] == ud
    assert (inst.node_labels, inst.node_taints) == ({"gpuops.io/pool": "a", "tier": "gpu"},
                                                    [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])
    assert inst.launch_options["subnetId"] == "subnet-1" and inst.launch_options["instanceName"] == "pool-a"
    await until_holds("the instance's node in the fleet", lambda: inst.node_name in env.fleet.machines, 3.0)
    m = env.fleet.machines[inst.node_name]
    assert m.labels["tier"] == "gpu" and m.taints == [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]


# ------------------------------------------------------------------------------------ auth and protocol


@pytest.mark.anyio
async def test_signature_checks(env: Env) -> None:
    q = {"Limit": 1}
    status, body, ctype = await env.raw("DescribeInstances", q)
    assert (status, ctype, body["Response"]["TotalCount"]) == (200, "application/json", 0)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"secret_id": "AKIDunknown"}, "AuthFailure.SecretIdNotFound"),
        ({"secret_key": "wrong-key"}, "AuthFailure.SignatureFailure"),
        ({"timestamp": int(time.time()) - 301}, "AuthFailure.SignatureExpire"),
        ({"timestamp": int(time.time()) + 400}, "AuthFailure.SignatureExpire"),
        ({"body": b'{"Limit": 2}'}, "AuthFailure.SignatureFailure"),  # tampered after signing
        ({"headers": {"Authorization": "Bearer x"}}, "AuthFailure.InvalidAuthorization"),
        ({"headers": {"Host": "evil.example:80"}}, "AuthFailure.SignatureFailure"),
    ]
    for kw, code in cases:
        status, body, ctype = await env.raw("DescribeInstances", q, **kw)
        assert (status, ctype) == (200, "application/json")
        err = body["Response"]["Error"]
        assert err["Code"] == code, (kw, err)
        assert err["Message"] and body["Response"]["RequestId"]
    status, body, _ = await env.raw("DescribeInstances", q, timestamp=int(time.time()) - 250)
    assert "Error" not in body["Response"]
    # the SDK parses these errors (only because the Content-Type is exactly application/json)
    e = await sdk_error(env.client(secret_key="wrong-key").DescribeInstances, describe_req())
    assert e.code == "AuthFailure.SignatureFailure" and e.requestId
    e = await sdk_error(env.client(secret_id="AKIDother").DescribeInstances, describe_req())
    assert e.code == "AuthFailure.SecretIdNotFound"
    assert env.cloud.errors[("cvm", "DescribeInstances", "AuthFailure.SignatureFailure")] == 4


@pytest.mark.anyio
async def test_protocol_errors(env: Env) -> None:
    _, body, _ = await env.raw("DescribeInstances", {}, region="ap-beijing")
    assert body["Response"]["Error"]["Code"] == "UnsupportedRegion"
    _, body, _ = await env.raw("DescribeInstances", {}, version="2018-01-01")
    assert body["Response"]["Error"]["Code"] == "NoSuchVersion"
    _, body, _ = await env.raw("StartInstances", {})
    assert body["Response"]["Error"]["Code"] == "InvalidAction"
    _, body, _ = await env.raw("DescribeInstances", {}, body=b"", headers={})  # unsigned empty body
    assert body["Response"]["Error"]["Code"] == "AuthFailure.SignatureFailure"


@pytest.mark.anyio
async def test_rate_limits_are_a_sliding_second_per_action(env: Env) -> None:
    results = await asyncio.gather(*(env.raw("DescribeInstances", {}) for _ in range(45)))
    codes = [b["Response"].get("Error", {}).get("Code") for _, b, _ in results]
    assert codes.count(None) == 40 and codes.count("RequestLimitExceeded") == 5
    assert all(s == 200 for s, _, _ in results)
    # another action has its own window
    _, body, _ = await env.raw("TerminateInstances", {"InstanceIds": ["ins-00000000"]})
    assert body["Response"]["Error"]["Code"] == "InvalidInstanceId.NotFound"
    _, body, _ = await env.raw("DescribeInstances", {})
    assert body["Response"]["Error"]["Code"] == "RequestLimitExceeded"

    async def accepted() -> bool | NotYet:
        _, body, _ = await env.raw("DescribeInstances", {})
        return "Error" not in body["Response"] or NotYet(body)

    # refused calls do not count: the window frees up a second after the first accepted call
    await until("DescribeInstances accepted again", accepted, 2.0, every=0.02)
    runs = await asyncio.gather(*(env.raw("RunInstances", {"InstanceType": "S5.LARGE8", "ClientToken": f"r{i}",
                                                           "Placement": {"Zone": ZONE}}) for i in range(12)))
    codes = [b["Response"].get("Error", {}).get("Code") for _, b, _ in runs]
    assert codes.count(None) == 10 and codes.count("RequestLimitExceeded") == 2
    assert env.cloud.spot.launched == 10
    assert env.cloud.errors[("cvm", "RunInstances", "RequestLimitExceeded")] == 2


# ------------------------------------------------------------------------------------ DescribeInstances


@pytest.mark.anyio
async def test_describe_pages_with_total_count_and_filters(env: Env) -> None:
    c = env.client()
    a = list((await sdk(c.RunInstances, run_req("pa", count=45, tags={"pool": "a"}))).InstanceIdSet)
    b = list((await sdk(c.RunInstances, run_req("pb", count=5, tags={"pool": "b", "x": "1"}))).InstanceIdSet)
    await sdk(c.RunInstances, run_req("pu", count=3, charge="POSTPAID_BY_HOUR"))
    flt = [{"Name": "tag:pool", "Values": ["a"]}]
    seen: list[str] = []
    for offset, size in ((0, 20), (20, 20), (40, 5), (60, 0)):
        page = await sdk(c.DescribeInstances, describe_req(Filters=flt, Offset=offset, Limit=20))
        assert page.TotalCount == 45 and len(page.InstanceSet) == size
        seen += [i.InstanceId for i in page.InstanceSet]
    assert seen == a
    everything = await sdk(c.DescribeInstances, describe_req())
    assert everything.TotalCount == 53 and len(everything.InstanceSet) == 20  # default Limit 20
    big = await sdk(c.DescribeInstances, describe_req(Limit=100))
    assert len(big.InstanceSet) == 53

    async def ids(*filters: dict[str, Any]) -> list[str]:
        r = await sdk(c.DescribeInstances, describe_req(Filters=list(filters), Limit=100))
        return [i.InstanceId for i in r.InstanceSet]

    assert await ids({"Name": "tag:pool", "Values": ["a", "b"]}) == a + b
    assert await ids({"Name": "tag-key", "Values": ["x"]}) == b
    assert len(await ids({"Name": "instance-charge-type", "Values": ["POSTPAID_BY_HOUR"]})) == 3
    assert await ids({"Name": "instance-id", "Values": b[:2]}, {"Name": "zone", "Values": [ZONE]}) == b[:2]
    assert len(await ids({"Name": "instance-state", "Values": ["PENDING"]})) == 53
    assert await ids({"Name": "tag:pool", "Values": ["a"]}, {"Name": "tag-key", "Values": ["x"]}) == []
    errors = [
        (describe_req(Limit=101), "InvalidParameterValue.Range"),
        (describe_req(InstanceIds=a[:1], Filters=flt), "InvalidParameterCombination"),
        (describe_req(Filters=[{"Name": "zone", "Values": [ZONE]}] * 11), "InvalidFilterValue.LimitExceeded"),
        (describe_req(Filters=[{"Name": "tag:pool", "Values": list("abcdef")}]), "InvalidFilterValue.LimitExceeded"),
        (describe_req(Filters=[{"Name": "color", "Values": ["red"]}]), "InvalidFilter"),
        (describe_req(InstanceIds=["i-123"]), "InvalidInstanceId.Malformed"),
        (describe_req(InstanceIds=a + a + a), "InvalidParameterValue.LimitExceeded"),
    ]
    for req, code in errors:
        assert (await sdk_error(c.DescribeInstances, req)).code == code
    # terminated instances are not listed; terminating ones are, as TERMINATING
    await until_holds("every instance running",
                      lambda: all(i.state == "running" for i in env.cloud.spot.instances.values()), 3.0)
    await sdk(c.TerminateInstances, terminate_req(b))
    assert set(await ids({"Name": "instance-state", "Values": ["TERMINATING"]})) == set(b)
    await until_holds("every instance of b terminated or gone",
                      lambda: all(env.cvm.instance(i) is None
                                  or env.cvm.instance(i).state == "terminated"  # type: ignore[union-attr]
                                  for i in b), 3.0)
    assert await ids({"Name": "tag:pool", "Values": ["b"]}) == []


# ------------------------------------------------------------------------------------ TerminateInstances


@pytest.mark.anyio
async def test_terminate_is_all_or_nothing(env: Env) -> None:
    c = env.client()
    running = list((await sdk(c.RunInstances, run_req("t-run", count=3))).InstanceIdSet)
    await until_holds("every running instance RUNNING",
                      lambda: all(env.cvm.instance(i).state == "running" for i in running), 3.0)  # type: ignore[union-attr]
    pending = list((await sdk(c.RunInstances, run_req("t-pend"))).InstanceIdSet)
    e = await sdk_error(c.TerminateInstances, terminate_req(running[:1] + pending))
    assert e.code == "UnsupportedOperation.InstanceStatePending" and pending[0] in e.message
    e = await sdk_error(c.TerminateInstances, terminate_req([*running[:2], "ins-zzzzzzzz"]))
    assert e.code == "InvalidInstanceId.NotFound" and "ins-zzzzzzzz" in e.message and running[0] not in e.message
    assert all(env.cvm.instance(i).state == "running" for i in running)  # type: ignore[union-attr]
    await sdk(c.TerminateInstances, terminate_req(running[:2]))
    assert [env.cvm.instance(i).state for i in running] == ["shutting-down", "shutting-down", "running"]  # type: ignore[union-attr]
    await sdk(c.TerminateInstances, terminate_req(running))  # already terminating: fine
    e = await sdk_error(c.TerminateInstances, terminate_req(["ins-zzzzzzzz"] * 101))
    assert e.code == "InvalidParameterValue.LimitExceeded"
    e = await sdk_error(c.TerminateInstances, terminate_req(["i-0123456789abcdef0"]))
    assert e.code == "InvalidInstanceId.Malformed"
    await until_holds("the first running instance terminated",
                      lambda: env.cvm.instance(running[0]).state == "terminated", 3.0)  # type: ignore[union-attr]
    e = await sdk_error(c.TerminateInstances, terminate_req(running[:1]))
    assert e.code == "InvalidInstanceId.NotFound"


# ------------------------------------------------------------------------------------ faults


@pytest.mark.anyio
async def test_faults_before_and_after_the_operation(env: Env) -> None:
    c = env.client(timeout=5)
    f = env.cloud.faults
    f.add(api="cvm", op="RunInstances", error="InternalError", count=1)
    e = await sdk_error(c.RunInstances, run_req("f-1"))
    assert e.code == "InternalError" and env.cloud.spot.launched == 0
    assert env.cloud.calls[("cvm", "RunInstances", 200)] == 1
    f.add(api="cvm", op="RunInstances", status=503, count=1)
    e = await sdk_error(c.RunInstances, run_req("f-1"))
    assert e.code == "ServerNetworkError" and env.cloud.calls[("cvm", "RunInstances", 503)] == 1
    f.add(api="cvm", op="RunInstances", status=429, count=1)
    assert (await sdk_error(c.RunInstances, run_req("f-1"))).code == "RequestLimitExceeded"
    # the launch happens, the answer is lost: a retry with the same token buys nothing more
    f.add(api="cvm", op="RunInstances", error="InternalError", after=True, count=1)
    e = await sdk_error(c.RunInstances, run_req("f-1", count=2))
    assert e.code == "InternalError" and env.cloud.spot.launched == 2
    made = list(env.cloud.spot.tokens["f-1"].ids)
    got = await sdk(c.RunInstances, run_req("f-1", count=2))
    assert [env.cvm.spot_id(i) for i in got.InstanceIdSet] == made and env.cloud.spot.launched == 2
    # a hang: no answer until the rule's seconds, then a gateway timeout
    f.add(api="cvm", op="DescribeInstances", hang=True, hang_seconds=0.4, count=2)
    with pytest.raises(asyncio.TimeoutError):
        await env.raw("DescribeInstances", {}, limit=0.1)
    start = time.monotonic()
    status, body, ctype = await env.raw("DescribeInstances", {}, limit=3)
    assert status == 504 and ctype == "application/json" and time.monotonic() - start >= 0.35
    _, body, _ = await env.raw("DescribeInstances", {})
    assert body["Response"]["TotalCount"] == 2
    assert env.cloud.faults.injected[("cvm", "DescribeInstances", "hang")] == 2
    assert env.cloud.calls[("cvm", "DescribeInstances", 504)] >= 1
    assert env.cloud.errors[("cvm", "RunInstances", "InternalError")] == 2
    assert env.cloud.errors[("cvm", "RunInstances", "ServiceUnavailable")] == 1

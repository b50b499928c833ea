"""The EC2 front end of the emulated cloud through the real boto3 client: SigV4, client tokens, capacity, states,
pagination, filters, throttling, faults and TerminateInstances' all-or-nothing unknown ids."""

from __future__ import annotations

import datetime
import functools
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import anyio.to_thread
import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError
from waiting import until_holds

from gpuops_sim.cloud import CloudOptions, CloudServer, InstanceType
from gpuops_sim.cloud.ec2 import Ec2Server
from gpuops_sim.cluster.machines import Fleet

FAST = CloudOptions(launch_seconds=0.1, boot_seconds=0.05, device_plugin_seconds=0.01, terminate_seconds=0.1,
                    reclaim_notice_seconds=0.1, terminated_visible_seconds=30.0, seed=11)
ZONE = "us-east-1a"
KEY, SECRET = "AKIDEXAMPLE000000001", "example-secret-key-for-the-emulator"
AMI = "ami-0123456789abcdef0"
SESSION = boto3.session.Session()  # shared: it caches the parsed service model


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Env:
    def __init__(self, cloud: CloudServer, ec2: Ec2Server, fleet: Fleet) -> None:
        self.cloud, self.ec2, self.fleet = cloud, ec2, fleet
        self.ec2_client = self.client()

    def client(self, key: str = KEY, secret: str = SECRET, region: str = "us-east-1") -> Any:
        return SESSION.client(
            "ec2", region_name=region, endpoint_url=self.ec2.url, aws_access_key_id=key,
            aws_secret_access_key=secret,
            config=botocore.config.Config(retries={"total_max_attempts": 1}, proxies={}, read_timeout=5))

    async def call(self, op: str, client: Any = None, **kwargs: Any) -> Any:
        fn = getattr(client or self.ec2_client, op)
        return await anyio.to_thread.run_sync(functools.partial(fn, **kwargs))

    async def error(self, op: str, client: Any = None, **kwargs: Any) -> tuple[str, int, str]:
        with pytest.raises(ClientError) as e:
            await self.call(op, client, **kwargs)
        r = e.value.response
        return r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Message"]

    async def run(self, token: str, itype: str = "gpu.a100.8x", count: int = 1, min_count: int = 1,
                  **extra: Any) -> Any:
        return await self.call("run_instances", ImageId=AMI, InstanceType=itype, MinCount=min_count,
                               MaxCount=count, ClientToken=token, **extra)

    async def states(self, ids: list[str]) -> dict[str, str]:
        out = await self.call("describe_instances", InstanceIds=ids)
        return {i["InstanceId"]: i["State"]["Name"] for r in out["Reservations"] for i in r["Instances"]}


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    fleet = Fleet()
    types = [InstanceType("gpu.a100.8x", "A100-80GB", 8), InstanceType("gpu.l4.1x", "L4-24GB", 1, capacity=3),
             InstanceType("cpu.16x", None, 0, "16", "64Gi")]
    async with CloudServer(fleet, instance_types=types, options=FAST, zone=ZONE) as cloud, \
            Ec2Server(cloud, access_key_id=KEY, secret_access_key=SECRET) as ec2:
        yield Env(cloud, ec2, fleet)
    fleet.close()


SPOT: dict[str, Any] = {"InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {"MaxPrice": "2.5"}}}


# ------------------------------------------------------------------------------------ authentication


@pytest.mark.anyio
async def test_signature_failures_are_refused_before_anything_happens(env: Env) -> None:
    code, status, _ = await env.error("describe_instances", env.client(key="AKIDUNKNOWN000000000"))
    assert (code, status) == ("AuthFailure", 401)
    code, status, msg = await env.error("run_instances", env.client(secret="wrong"), ImageId=AMI,
                                        InstanceType="cpu.16x", MinCount=1, MaxCount=1)
    assert (code, status) == ("SignatureDoesNotMatch", 403) and "signature" in msg
    code, status, msg = await env.error("describe_instances", env.client(region="eu-west-1"))
    assert (code, status) == ("SignatureDoesNotMatch", 403) and "us-east-1" in msg
    skewed = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=6)
    with mock.patch("botocore.auth.get_current_datetime", return_value=skewed.replace(tzinfo=None)):
        code, status, _ = await env.error("describe_instances")
    assert (code, status) == ("RequestExpired", 400)
    assert env.cloud.spot.launched == 0
    assert env.cloud.errors[("ec2", "RunInstances", "SignatureDoesNotMatch")] == 1
    assert env.cloud.calls[("ec2", "DescribeInstances", 401)] == 1
    out = await env.call("describe_instances")  # a correctly signed call passes
    assert out["Reservations"] == []


# ------------------------------------------------------------------------------------ RunInstances


@pytest.mark.anyio
async def test_run_records_request_and_replays_the_client_token(env: Env) -> None:
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "gpuops.io/pool", "Value": "p1"}, {"Key": "k", "Value": ""}]}]
    out = await env.run("tok-1", count=2, Placement={"AvailabilityZone": ZONE}, SubnetId="subnet-1",
                        SecurityGroupIds=["sg-1", "sg-2"], UserData="#!/bin/sh\necho hi\n", TagSpecifications=tags,
                        **SPOT)
    insts = out["Instances"]
    assert len(insts) == 2 and all(i["State"]["Name"] == "pending" for i in insts)
    assert out["ReservationId"].startswith("r-") and out["OwnerId"]
    first = insts[0]
    assert first["InstanceLifecycle"] == "spot" and first["Placement"]["AvailabilityZone"] == ZONE
    assert first["PrivateDnsName"].endswith(".ec2.internal") and first["PrivateIpAddress"].startswith("10.")
    assert {t["Key"]: t["Value"] for t in first["Tags"]} == {"gpuops.io/pool": "p1", "k": ""}
    assert [g["GroupId"] for g in first["SecurityGroups"]] == ["sg-1", "sg-2"] and first["SubnetId"] == "subnet-1"
    inst = env.cloud.spot.instances[first["InstanceId"]]
    assert inst.capacity_type == "spot" and inst.provider_id == f"aws:///{ZONE}/{inst.id}"
    assert inst.launch_options["userData"] == "#!/bin/sh\necho hi\n"  # botocore's base64, decoded
    assert inst.launch_options["maxPrice"] == "2.5" and inst.launch_options["imageId"] == AMI

    again = await env.run("tok-1", count=2, Placement={"AvailabilityZone": ZONE}, SubnetId="subnet-1",
                          SecurityGroupIds=["sg-1", "sg-2"], UserData="#!/bin/sh\necho hi\n",
                          TagSpecifications=tags, **SPOT)
    assert [i["InstanceId"] for i in again["Instances"]] == [i["InstanceId"] for i in insts]
    assert again["ReservationId"] == out["ReservationId"] and env.cloud.spot.launched == 2

    code, status, _ = await env.error("run_instances", ImageId=AMI, InstanceType="gpu.a100.8x", MinCount=1,
                                      MaxCount=3, ClientToken="tok-1")
    assert (code, status) == ("IdempotentParameterMismatch", 400)
    ondemand = await env.run("tok-2", itype="cpu.16x")
    assert "InstanceLifecycle" not in ondemand["Instances"][0]
    assert env.cloud.spot.instances[ondemand["Instances"][0]["InstanceId"]].capacity_type == "on-demand"
    code, _, msg = await env.error("run_instances", ImageId=AMI, InstanceType="cpu.16x", MinCount=1, MaxCount=1,
                                   Placement={"AvailabilityZone": "us-east-1z"})
    assert code == "InvalidParameterValue" and "us-east-1z" in msg
    code, _, _ = await env.error("run_instances", ImageId=AMI, InstanceType="m9.huge", MinCount=1, MaxCount=1)
    assert code == "InvalidParameterValue"
    code, _, _ = await env.error("run_instances", InstanceType="cpu.16x", MinCount=1, MaxCount=1)
    assert code == "MissingParameter"


@pytest.mark.anyio
async def test_min_and_max_count_against_spot_capacity(env: Env) -> None:
    out = await env.run("cap-1", itype="gpu.l4.1x", count=5, min_count=1, **SPOT)
    assert len(out["Instances"]) == 3  # capacity 3: grant up to MaxCount
    code, status, _ = await env.error("run_instances", ImageId=AMI, InstanceType="gpu.l4.1x", MinCount=1,
                                      MaxCount=1, ClientToken="cap-2", **SPOT)
    assert (code, status) == ("InsufficientInstanceCapacity", 500)
    await env.call("terminate_instances", InstanceIds=[out["Instances"][0]["InstanceId"]])
    await until_holds("two gpu.l4.1x in use", lambda: env.cloud.spot.used["gpu.l4.1x"] == 2)
    code, _, _ = await env.error("run_instances", ImageId=AMI, InstanceType="gpu.l4.1x", MinCount=2,
                                 MaxCount=2, ClientToken="cap-3", **SPOT)
    assert code == "InsufficientInstanceCapacity"  # fewer than MinCount free: nothing is launched
    assert len((await env.run("cap-4", itype="gpu.l4.1x", count=4, min_count=1, **SPOT))["Instances"]) == 1
    assert len((await env.run("cap-5", itype="gpu.l4.1x", count=2, min_count=2))["Instances"]) == 2  # on-demand


@pytest.mark.anyio
async def test_pending_running_shutting_down_terminated_and_the_node(env: Env) -> None:
    out = await env.run("life", **SPOT)
    iid = out["Instances"][0]["InstanceId"]
    node = out["Instances"][0]["PrivateDnsName"].split(".")[0]
    assert (await env.states([iid]))[iid] == "pending"
    await until_holds("the instance running", lambda: env.cloud.spot.instances[iid].state == "running")
    assert (await env.states([iid]))[iid] == "running"
    machine = env.fleet.machines[node]
    assert machine.provider_id == f"aws:///{ZONE}/{iid}"
    out = await env.call("terminate_instances", InstanceIds=[iid])
    t = out["TerminatingInstances"][0]
    assert (t["PreviousState"]["Name"], t["CurrentState"]["Name"]) == ("running", "shutting-down")
    assert t["CurrentState"]["Code"] == 32
    await until_holds("the instance terminated", lambda: env.cloud.spot.instances[iid].state == "terminated")
    desc = await env.call("describe_instances", InstanceIds=[iid])
    inst = desc["Reservations"][0]["Instances"][0]
    assert inst["State"]["Name"] == "terminated" and inst["StateReason"]["Code"] == "Client.UserInitiatedShutdown"
    assert node not in env.fleet.machines
    again = await env.call("terminate_instances", InstanceIds=[iid])  # idempotent
    assert again["TerminatingInstances"][0]["CurrentState"]["Name"] == "terminated"


@pytest.mark.anyio
async def test_launch_failed_reads_as_terminated_with_server_internal_error(env: Env) -> None:
    env.cloud.spot.set_launch_failure_rate(1.0)
    iid = (await env.run("fails"))["Instances"][0]["InstanceId"]
    await until_holds("the instance launch-failed", lambda: env.cloud.spot.instances[iid].state == "launch-failed")
    inst = (await env.call("describe_instances", InstanceIds=[iid]))["Reservations"][0]["Instances"][0]
    assert inst["State"] == {"Code": 48, "Name": "terminated"}
    assert inst["StateReason"]["Code"] == "Server.InternalError"
    out = await env.call("describe_instances", Filters=[{"Name": "instance-state-name", "Values": ["terminated"]}])
    assert [i["InstanceId"] for r in out["Reservations"] for i in r["Instances"]] == [iid]


# ------------------------------------------------------------------------------------ DescribeInstances


@pytest.mark.anyio
async def test_pagination_over_max_results(env: Env) -> None:
    ids = []
    for n in range(4):
        ids += [i["InstanceId"] for i in (await env.run(f"page-{n}", itype="cpu.16x", count=3))["Instances"]]
    seen: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        kwargs: dict[str, Any] = {"MaxResults": 5}
        if token:
            kwargs["NextToken"] = token
        out = await env.call("describe_instances", **kwargs)
        pages += 1
        seen += [i["InstanceId"] for r in out["Reservations"] for i in r["Instances"]]
        token = out.get("NextToken")
        if not token:
            break
    assert pages == 3 and seen == ids
    code, _, _ = await env.error("describe_instances", MaxResults=4)
    assert code == "InvalidParameterValue"
    code, _, _ = await env.error("describe_instances", MaxResults=5, InstanceIds=ids[:1])
    assert code == "InvalidParameterCombination"
    code, _, _ = await env.error("describe_instances", MaxResults=5, NextToken="garbage")
    assert code == "InvalidParameterValue"
    code, _, msg = await env.error("describe_instances", InstanceIds=[ids[0], "i-00000000000000000"])
    assert code == "InvalidInstanceID.NotFound" and "i-00000000000000000" in msg


@pytest.mark.anyio
async def test_filters(env: Env) -> None:
    def tags(pool: str) -> list[dict[str, Any]]:
        return [{"ResourceType": "instance", "Tags": [{"Key": "gpuops.io/pool", "Value": pool}]}]

    a = (await env.run("f-a", TagSpecifications=tags("alpha"), **SPOT))["Instances"][0]["InstanceId"]
    b = (await env.run("f-b", itype="cpu.16x", TagSpecifications=tags("beta")))["Instances"][0]["InstanceId"]
    c = (await env.run("f-c", itype="cpu.16x"))["Instances"][0]["InstanceId"]

    async def ids(*filters: tuple[str, list[str]]) -> set[str]:
        out = await env.call("describe_instances", Filters=[{"Name": n, "Values": v} for n, v in filters])
        return {i["InstanceId"] for r in out["Reservations"] for i in r["Instances"]}

    assert await ids(("tag:gpuops.io/pool", ["alpha"])) == {a}
    assert await ids(("tag:gpuops.io/pool", ["alpha", "beta"])) == {a, b}
    assert await ids(("tag:gpuops.io/pool", ["*ta"])) == {b}
    assert await ids(("tag-key", ["gpuops.io/pool"])) == {a, b}
    assert await ids(("instance-lifecycle", ["spot"])) == {a}
    assert await ids(("instance-type", ["cpu.16x"])) == {b, c}
    assert await ids(("instance-id", [c])) == {c}
    assert await ids(("availability-zone", [ZONE]), ("instance-state-name", ["pending", "running"])) == {a, b, c}
    assert await ids(("availability-zone", ["us-east-1b"])) == set()
    await env.call("terminate_instances", InstanceIds=[b])
    assert await ids(("instance-state-name", ["pending", "running"])) == {a, c}
    code, _, _ = await env.error("describe_instances", Filters=[{"Name": "no-such-filter", "Values": ["x"]}])
    assert code == "InvalidParameterValue"


# ------------------------------------------------------------------------------------ throttling and faults


@pytest.mark.anyio
async def test_throttling_per_action(env: Env) -> None:
    env.ec2.set_throttle("DescribeInstances", burst=3, rate=0.5)
    for _ in range(3):
        await env.call("describe_instances")
    code, status, _ = await env.error("describe_instances")
    assert (code, status) == ("RequestLimitExceeded", 503)
    await env.run("not-throttled", itype="cpu.16x")  # another action's bucket
    assert env.cloud.calls[("ec2", "DescribeInstances", 503)] == 1


@pytest.mark.anyio
async def test_fault_after_run_took_effect_then_the_same_token_buys_nothing(env: Env) -> None:
    env.cloud.faults.add(api="ec2", op="RunInstances", error="InternalError", after=True, count=1)
    code, status, _ = await env.error("run_instances", ImageId=AMI, InstanceType="gpu.a100.8x", MinCount=2,
                                      MaxCount=2, ClientToken="retry-me", **SPOT)
    assert (code, status) == ("InternalError", 500)
    assert env.cloud.spot.launched == 2  # it did happen
    out = await env.run("retry-me", count=2, min_count=2, **SPOT)
    assert {i["InstanceId"] for i in out["Instances"]} == set(env.cloud.spot.instances)
    assert env.cloud.spot.launched == 2
    assert env.cloud.faults.injected[("ec2", "RunInstances", "InternalError")] == 1
    env.cloud.faults.add(api="ec2", op="DescribeInstances", error="RequestLimitExceeded", count=1)
    code, status, _ = await env.error("describe_instances")
    assert (code, status) == ("RequestLimitExceeded", 503)  # EC2's status, not the JSON APIs' 429


# ------------------------------------------------------------------------------------ TerminateInstances


@pytest.mark.anyio
async def test_terminate_with_an_unknown_id_fails_whole(env: Env) -> None:
    iid = (await env.run("t-1", itype="cpu.16x"))["Instances"][0]["InstanceId"]
    code, status, msg = await env.error("terminate_instances", InstanceIds=[iid, "i-0123456789abcdef0"])
    assert (code, status) == ("InvalidInstanceID.NotFound", 400) and "i-0123456789abcdef0" in msg
    assert env.cloud.spot.instances[iid].state == "pending"  # nothing happened
    code, _, _ = await env.error("terminate_instances", InstanceIds=["not-an-id"])
    assert code == "InvalidInstanceID.Malformed"
    out = await env.call("terminate_instances", InstanceIds=[iid])
    assert out["TerminatingInstances"][0]["PreviousState"]["Name"] == "pending"
    code, _, _ = await env.error("reboot_instances", InstanceIds=[iid])
    assert code == "InvalidAction"

"""The `aws` provider: request shapes, tags and filters against moto's EC2 server; client tokens, pending states,
error kinds and TerminateInstances' unknown ids against the emulated cloud's EC2 front end (moto has none of
those). Nothing here reaches real AWS: every endpoint is loopback, every key a dummy."""

from __future__ import annotations

import base64
import functools
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio.to_thread
import boto3
import botocore.config
import pytest
from moto.server import ThreadedMotoServer
from waiting import until_holds

from gpuops.controllers.spotpool.providers import make_provider
from gpuops.controllers.spotpool.providers.aws import AwsProvider
from gpuops.controllers.spotpool.providers.base import (
    LAUNCH_ID_TAG,
    MANAGED_BY,
    MANAGED_BY_TAG,
    POOL_TAG,
    ErrorKind,
    Guarded,
    InstanceState,
    LaunchSpec,
    ProviderConfig,
    ProviderError,
)
from gpuops_sim.cloud import CloudOptions, CloudServer, InstanceType
from gpuops_sim.cloud.ec2 import Ec2Server
from gpuops_sim.cluster.machines import Fleet

AMI = "ami-0123456789abcdef0"
ZONE = "us-east-1a"
OWNER = {POOL_TAG: "pool-a", MANAGED_BY_TAG: MANAGED_BY}
DUMMY = {"accessKeyId": "testing", "secretAccessKey": "testing"}
SESSION = boto3.session.Session()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def tag_spec(tags: dict[str, str]) -> list[dict[str, Any]]:
    return [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]


def record(provider: AwsProvider, action: str) -> list[dict[str, Any]]:
    """The parameters of every `action` call the provider makes (botocore's own event hook)."""
    calls: list[dict[str, Any]] = []

    def hook(params: dict[str, Any], **_: Any) -> None:
        calls.append(dict(params))

    provider.client.meta.events.register(f"provide-client-params.ec2.{action}", hook)
    return calls


# ------------------------------------------------------------------------------------ moto


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class Moto:
    def __init__(self, url: str) -> None:
        self.url = url
        self.raw = SESSION.client(
            "ec2", region_name="us-east-1", endpoint_url=url, aws_access_key_id="testing",
            aws_secret_access_key="testing", config=botocore.config.Config(proxies={}))
        self.providers: list[AwsProvider] = []

    def provider(self, **kwargs: Any) -> AwsProvider:
        p = AwsProvider(ProviderConfig(region="us-east-1", endpoint=self.url, credentials=DUMMY), **kwargs)
        self.providers.append(p)
        return p

    async def call(self, op: str, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(functools.partial(getattr(self.raw, op), **kwargs))

    async def run(self, count: int, tags: dict[str, str] | None = None) -> list[str]:
        extra = {"TagSpecifications": tag_spec(tags)} if tags else {}
        out = await self.call("run_instances", ImageId=AMI, InstanceType="g5.xlarge", MinCount=count,
                              MaxCount=count, **extra)
        return [i["InstanceId"] for i in out["Instances"]]

    async def instances(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        out = await self.call("describe_instances", InstanceIds=ids)
        return {i["InstanceId"]: i for r in out["Reservations"] for i in r["Instances"]}


@pytest.fixture
async def moto(moto_url: str) -> AsyncIterator[Moto]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    opener.open(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST"), timeout=10).close()
    m = Moto(moto_url)
    yield m
    for p in m.providers:
        await p.close()


@pytest.mark.anyio
async def test_spot_launch_request_shape_tags_and_describe(moto: Moto) -> None:
    vpc = (await moto.call("create_vpc", CidrBlock="10.0.0.0/16"))["Vpc"]["VpcId"]
    subnet = (await moto.call("create_subnet", VpcId=vpc, CidrBlock="10.0.1.0/24",
                              AvailabilityZone=ZONE))["Subnet"]["SubnetId"]
    sg = (await moto.call("create_security_group", GroupName="nodes", Description="nodes",
                          VpcId=vpc))["GroupId"]
    p = moto.provider()
    sent = record(p, "RunInstances")
    spec = LaunchSpec(client_token="launch-1", count=1, instance_type="g5.xlarge", zone=ZONE, image=AMI,
                      subnet=subnet, security_groups=(sg,), max_price="1.25", user_data="#!/bin/sh\necho hi\n",
                      tags=dict(OWNER), name_prefix="pool-a")
    t0 = time.time()
    ids = await p.launch(spec)
    assert len(ids) == 1
    assert sent[0]["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "1.25"}}
    assert (sent[0]["MinCount"], sent[0]["MaxCount"], sent[0]["ClientToken"]) == (1, 1, "launch-1")
    assert sent[0]["UserData"] == spec.user_data  # plain: botocore encodes it once
    raw = (await moto.instances(ids))[ids[0]]
    assert raw["InstanceLifecycle"] == "spot" and raw["SubnetId"] == subnet
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == [sg]
    assert {t["Key"]: t["Value"] for t in raw["Tags"]} == {**OWNER, LAUNCH_ID_TAG: "launch-1", "Name": "pool-a"}
    attr = await moto.call("describe_instance_attribute", InstanceId=ids[0], Attribute="userData")
    assert base64.b64decode(attr["UserData"]["Value"]).decode() == spec.user_data

    [inst] = await p.describe(OWNER)
    assert inst.id == ids[0] and inst.state is InstanceState.RUNNING and inst.capacity_type == "spot"
    assert inst.zone == ZONE and inst.provider_id == f"aws:///{ZONE}/{ids[0]}"
    assert inst.node_name == raw["PrivateDnsName"].split(".")[0] and inst.node_name is not None
    assert inst.node_name.startswith("ip-")
    assert inst.private_ip == raw["PrivateIpAddress"] and inst.instance_type == "g5.xlarge"
    assert inst.launched_at is not None and abs(inst.launched_at / 1e6 - t0) < 120
    assert inst.launch_id == "launch-1"


@pytest.mark.anyio
async def test_on_demand_launch_has_no_market_options(moto: Moto) -> None:
    p = moto.provider()
    sent = record(p, "RunInstances")
    ids = await p.launch(LaunchSpec(client_token="od-1", count=1, instance_type="g5.xlarge", image=AMI,
                                    capacity_type="on-demand", tags=dict(OWNER)))
    assert "InstanceMarketOptions" not in sent[0] and "Placement" not in sent[0]
    [inst] = await p.describe(OWNER)
    assert inst.id == ids[0] and inst.capacity_type == "on-demand"


@pytest.mark.anyio
async def test_describe_pages_by_tag_and_ignores_other_instances(moto: Moto) -> None:
    mine = [i for _ in range(12) for i in await moto.run(1, OWNER)]  # moto pages over reservations
    await moto.run(2)  # untagged
    await moto.run(2, {POOL_TAG: "pool-b", MANAGED_BY_TAG: MANAGED_BY})  # another pool
    await moto.run(2, {POOL_TAG: "pool-a"})  # half-tagged: never ours
    gone = await moto.run(1, OWNER)
    await moto.call("terminate_instances", InstanceIds=gone)
    p = moto.provider(page_size=5)
    sent = record(p, "DescribeInstances")
    found = await p.describe(OWNER)
    assert sorted(i.id for i in found) == sorted(mine)
    assert len(sent) == 3 and all(c["MaxResults"] == 5 for c in sent)
    assert "NextToken" not in sent[0] and all(c.get("NextToken") for c in sent[1:])
    assert sent[0]["Filters"][0] == {"Name": f"tag:{POOL_TAG}", "Values": ["pool-a"]}
    assert sent[0]["Filters"][1]["Name"] == "instance-state-name"
    assert "terminated" not in sent[0]["Filters"][1]["Values"]


@pytest.mark.anyio
async def test_terminate_in_batches_of_100(moto: Moto) -> None:
    ids = await moto.run(205, OWNER)
    p = moto.provider()
    sent = record(p, "TerminateInstances")
    await p.terminate([*ids, ids[0]])  # a duplicate is sent once
    assert [len(c["InstanceIds"]) for c in sent] == [100, 100, 5]
    states = {i["State"]["Name"] for i in (await moto.instances(ids)).values()}
    assert states == {"terminated"}
    assert await p.describe(OWNER) == []


# ------------------------------------------------------------------------------------ the emulated cloud

FAST = CloudOptions(launch_seconds=0.2, boot_seconds=0.05, device_plugin_seconds=0.01, terminate_seconds=0.2,
                    terminated_visible_seconds=30.0, seed=5)
KEY, SECRET = "AKIDSPOTPOOLTEST0001", "spotpool-test-secret"


class Fake:
    def __init__(self, cloud: CloudServer, ec2: Ec2Server, fleet: Fleet) -> None:
        self.cloud, self.ec2, self.fleet = cloud, ec2, fleet
        self.providers: list[AwsProvider] = []

    def config(self, **kwargs: Any) -> ProviderConfig:
        base: dict[str, Any] = {"region": "us-east-1", "endpoint": self.ec2.url,
                                "credentials": {"accessKeyId": KEY, "secretAccessKey": SECRET},
                                "timeout_seconds": 5.0}
        return ProviderConfig(**{**base, **kwargs})

    def provider(self, **kwargs: Any) -> AwsProvider:
        p = AwsProvider(self.config(**kwargs))
        self.providers.append(p)
        return p


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    fleet = Fleet()
    types = [InstanceType("gpu.a100.8x", "A100-80GB", 8), InstanceType("gpu.l4.1x", "L4-24GB", 1, capacity=2)]
    async with CloudServer(fleet, instance_types=types, options=FAST, zone=ZONE) as cloud, \
            Ec2Server(cloud, access_key_id=KEY, secret_access_key=SECRET) as ec2:
        f = Fake(cloud, ec2, fleet)
        yield f
        for p in f.providers:
            await p.close()
    fleet.close()


def spec(token: str, count: int = 1, itype: str = "gpu.a100.8x", **kwargs: Any) -> LaunchSpec:
    return LaunchSpec(client_token=token, count=count, instance_type=itype, zone=ZONE, image=AMI,
                      tags=dict(OWNER), **kwargs)


@pytest.mark.anyio
async def test_states_nodes_and_provider_ids_through_the_fake(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    # a proxy in the environment must not capture loopback calls
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    p = make_provider("aws", fake.config())
    assert isinstance(p, Guarded) and isinstance(p.inner, AwsProvider)  # every failure a ProviderError
    fake.providers.append(p)
    ids = await p.launch(spec("states-1", count=2))
    found = {i.id: i for i in await p.describe(OWNER)}
    assert set(found) == set(ids) and {i.state for i in found.values()} == {InstanceState.PENDING}
    await until_holds("every instance running",
                      lambda: all(fake.cloud.spot.instances[i].state == "running" for i in ids))
    found = {i.id: i for i in await p.describe(OWNER)}
    for iid, inst in found.items():
        assert inst.state is InstanceState.RUNNING and inst.capacity_type == "spot"
        machine = fake.fleet.machines[inst.node_name or ""]
        assert machine.provider_id == inst.provider_id == f"aws:///{ZONE}/{iid}"
    await p.terminate(ids[:1])
    found = {i.id: i for i in await p.describe(OWNER)}
    assert found[ids[0]].state is InstanceState.TERMINATING
    assert found[ids[0]].state_reason == "Client.UserInitiatedShutdown"
    await until_holds("the first instance terminated", lambda: fake.cloud.spot.instances[ids[0]].state == "terminated")
    assert [i.id for i in await p.describe(OWNER)] == ids[1:]


@pytest.mark.anyio
async def test_same_token_after_a_timeout_buys_nothing(fake: Fake) -> None:
    p = fake.provider(timeout_seconds=0.5)
    fake.cloud.faults.add(api="ec2", op="RunInstances", hang=True, hang_seconds=3.0, after=True, count=1)
    with pytest.raises(ProviderError) as e:
        await p.launch(spec("hung", count=2))
    assert e.value.kind is ErrorKind.TRANSIENT and e.value.ambiguous
    assert fake.cloud.spot.launched == 2  # the launch happened; the answer was lost
    retry = fake.provider()  # the retry (as after an operator restart) gets the normal timeout: 0.5 s is tight on
    ids = await retry.launch(spec("hung", count=2))  # a loaded 2-core machine, and only the first call must hang
    assert sorted(ids) == sorted(fake.cloud.spot.instances) and fake.cloud.spot.launched == 2
    with pytest.raises(ProviderError) as e:
        await retry.launch(spec("hung", count=3))
    assert e.value.kind is ErrorKind.MISMATCH


@pytest.mark.anyio
async def test_capacity_and_invalid_kinds(fake: Fake) -> None:
    p = fake.provider()
    assert len(await p.launch(spec("cap-1", count=5, itype="gpu.l4.1x"))) == 2  # MinCount 1: what there is
    with pytest.raises(ProviderError) as e:
        await p.launch(spec("cap-2", itype="gpu.l4.1x"))
    assert e.value.kind is ErrorKind.CAPACITY and e.value.code == "InsufficientInstanceCapacity"
    assert not e.value.ambiguous
    with pytest.raises(ProviderError) as e:
        await p.launch(LaunchSpec(client_token="bad-zone", count=1, instance_type="gpu.a100.8x", zone="us-east-1z",
                                  image=AMI))
    assert e.value.kind is ErrorKind.INVALID and e.value.code == "InvalidParameterValue"


@pytest.mark.anyio
async def test_credentials_kind(fake: Fake) -> None:
    for creds in ({"accessKeyId": KEY, "secretAccessKey": "wrong"},
                  {"accessKeyId": "AKIDUNKNOWN000000000", "secretAccessKey": SECRET}):
        with pytest.raises(ProviderError) as e:
            await fake.provider(credentials=creds).describe(OWNER)
        assert e.value.kind is ErrorKind.CREDENTIALS
    with pytest.raises(ProviderError) as e:
        AwsProvider(fake.config(credentials={"accessKeyId": KEY}))
    assert e.value.kind is ErrorKind.CREDENTIALS and "secretAccessKey" in e.value.message
    assert fake.cloud.spot.launched == 0


@pytest.mark.anyio
async def test_throttled_kind(fake: Fake) -> None:
    fake.ec2.set_throttle("DescribeInstances", burst=1, rate=0.1)
    p = fake.provider()
    assert await p.describe(OWNER) == []
    with pytest.raises(ProviderError) as e:
        await p.describe(OWNER)
    assert e.value.kind is ErrorKind.THROTTLED and e.value.retry_after == 1.0
    fake.cloud.faults.add(api="ec2", op="RunInstances", error="RequestLimitExceeded", count=1)
    with pytest.raises(ProviderError) as e:
        await p.launch(spec("throttled"))
    assert e.value.kind is ErrorKind.THROTTLED and fake.cloud.spot.launched == 0


@pytest.mark.anyio
async def test_terminate_with_missing_ids_succeeds(fake: Fake) -> None:
    p = fake.provider()
    ids = await p.launch(spec("term", count=2))
    sent = record(p, "TerminateInstances")
    await p.terminate(["i-0000000000000dead", ids[0], "i-00000000000beef0", ids[1]])
    assert len(sent) == 2 and sent[1]["InstanceIds"] == ids  # one refusal naming the unknown ids, one retry
    assert {fake.cloud.spot.instances[i].state for i in ids} == {"shutting-down"}
    await p.terminate(["i-0000000000000dead"])  # nothing left: still success
    await p.terminate(ids)  # already terminating: success

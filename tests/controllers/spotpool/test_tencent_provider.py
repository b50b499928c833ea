"""The `tencent` spot provider (the real tencentcloud SDK) against the CVM emulator over loopback HTTP."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from waiting import until_holds

from gpuops.controllers.spotpool.providers import make_provider
from gpuops.controllers.spotpool.providers.base import (
    LAUNCH_ID_TAG,
    MANAGED_BY,
    MANAGED_BY_TAG,
    POOL_TAG,
    ErrorKind,
    Guarded,
    InstanceState,
    LaunchSpec,
    NodeTaint,
    ProviderConfig,
    ProviderError,
)
from gpuops.controllers.spotpool.providers.tencent import TencentProvider, _endpoint, classify
from gpuops_sim.cloud import CloudOptions, CloudServer, InstanceType
from gpuops_sim.cloud.cvm import CvmServer
from gpuops_sim.cluster.machines import Fleet

SID, SKEY = "AKIDsimprovider00001", "sim-provider-secret"
REGION, ZONE = "ap-guangzhou", "ap-guangzhou-4"
FAST = CloudOptions(launch_seconds=0.4, boot_seconds=0.05, device_plugin_seconds=0.01, terminate_seconds=0.05,
                    reclaim_notice_seconds=0.1, terminated_visible_seconds=0.2, seed=5)
TYPES = [InstanceType("GN7.2XLARGE32", "T4-16GB", 1, capacity=2), InstanceType("GT4.8XLARGE192", "A100-40GB", 2),
         InstanceType("S5.MEDIUM4", None, 0, "2", "4Gi")]
OWNER = {POOL_TAG: "gpu-a", MANAGED_BY_TAG: MANAGED_BY}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Env:
    cloud: CloudServer
    cvm: CvmServer
    fleet: Fleet
    provider: TencentProvider

    def config(self, **kw: object) -> ProviderConfig:
        base: dict[str, object] = {"region": REGION, "endpoint": self.cvm.url,
                                   "credentials": {"secretId": SID, "secretKey": SKEY}, "timeout_seconds": 5.0}
        base.update(kw)
        return ProviderConfig(**base)  # type: ignore[arg-type]

    def states(self, ids: list[str]) -> list[str]:
        return [i.state if (i := self.cvm.instance(c)) is not None else "gone" for c in ids]


def spec(token: str, count: int = 1, *, tags: dict[str, str] | None = None, **kw: object) -> LaunchSpec:
    t = dict(OWNER, **{LAUNCH_ID_TAG: token}) if tags is None else tags
    fields: dict[str, object] = {"client_token": token, "count": count, "instance_type": "GT4.8XLARGE192",
                                 "zone": ZONE, "image": "img-gpu00001", "tags": t}
    fields.update(kw)
    return LaunchSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def env(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    # a dead proxy in the environment: the provider must not send loopback traffic through it
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    fleet = Fleet()
    async with CloudServer(fleet, instance_types=[InstanceType(**vars(t)) for t in TYPES], options=FAST,
                           zone=ZONE) as cloud, \
            CvmServer(cloud, secret_id=SID, secret_key=SKEY, region=REGION) as cvm:
        e = Env(cloud, cvm, fleet, None)  # type: ignore[arg-type]
        provider = make_provider("tencent", e.config())
        assert isinstance(provider, Guarded) and isinstance(provider.inner, TencentProvider)
        e.provider = provider
        yield e
        await provider.close()
    fleet.close()


# ------------------------------------------------------------------------------------ describe


@pytest.mark.anyio
async def test_describe_pages_through_all_owned_instances_and_nothing_else(env: Env) -> None:
    p = env.provider
    env.cvm.rate_limits["RunInstances"] = 1000
    ids = await p.launch(spec("own-1", 150))
    assert len(ids) == 150
    await p.launch(spec("other-pool", 4, tags={POOL_TAG: "gpu-b", MANAGED_BY_TAG: MANAGED_BY}))
    await p.launch(spec("half-tagged", 2, tags={POOL_TAG: "gpu-a"}))  # not managed by us: never ours
    await p.launch(spec("untagged", 3, tags={}))
    before = env.cloud.calls[("cvm", "DescribeInstances", 200)]
    found = await p.describe(OWNER)
    # the cloud's own state once describe has answered: still pending then means pending when described (a
    # loaded machine may have let the launch finish first, and then either answer is the cloud's)
    pending_after = env.states(ids[:1]) == ["pending"]
    assert sorted(i.id for i in found) == sorted(ids)
    assert env.cloud.calls[("cvm", "DescribeInstances", 200)] - before == 2  # pages of 100 until TotalCount
    now = time.time() * 1e6
    inst = next(i for i in found if i.id == ids[0])
    spot = env.cvm.instance(ids[0])
    assert spot is not None
    assert inst.state is InstanceState.PENDING if pending_after else inst.state in (InstanceState.PENDING,
                                                                                     InstanceState.RUNNING)
    assert (inst.zone, inst.instance_type, inst.capacity_type) == (ZONE, "GT4.8XLARGE192", "spot")
    assert inst.provider_id == f"qcloud:///{ZONE}/{ids[0]}" and inst.node_name == spot.node_name
    assert inst.private_ip == spot.private_ip and inst.public_ip is None
    assert inst.launched_at is not None and now - 3e6 < inst.launched_at <= now
    assert inst.tags[LAUNCH_ID_TAG] == "own-1" and inst.launch_id == "own-1"
    await until_holds("every instance running", lambda: all(s == "running" for s in env.states(ids)))
    found = await p.describe(OWNER)
    assert {i.state for i in found} == {InstanceState.RUNNING}
    assert [i.id for i in await p.describe({POOL_TAG: "gpu-b", MANAGED_BY_TAG: MANAGED_BY})] != []
    assert await p.describe({POOL_TAG: "nobody", MANAGED_BY_TAG: MANAGED_BY}) == []
    with pytest.raises(ProviderError) as ei:
        await p.describe({})
    assert ei.value.kind is ErrorKind.INVALID


# ------------------------------------------------------------------------------------ launch


@pytest.mark.anyio
async def test_launch_is_idempotent_per_token_even_after_a_timeout(env: Env) -> None:
    p = env.provider
    first = await p.launch(spec("tok-a", 2))
    assert await p.launch(spec("tok-a", 2)) == first and env.cloud.spot.launched == 2
    with pytest.raises(ProviderError) as ei:
        await p.launch(spec("tok-a", 3))
    assert ei.value.kind is ErrorKind.MISMATCH
    # the launch takes effect, then the answer never comes: the caller sees an ambiguous timeout ...
    env.cloud.faults.add(api="cvm", op="RunInstances", hang=True, hang_seconds=10, after=True, count=1)
    quick = TencentProvider(env.config(timeout_seconds=0.5))
    start = time.monotonic()
    with pytest.raises(ProviderError) as ei:
        await quick.launch(spec("tok-b", 2))
    assert time.monotonic() - start < 2
    assert (ei.value.kind, ei.value.ambiguous) == (ErrorKind.TRANSIENT, True)
    assert env.cloud.spot.launched == 4
    # ... and a retry with the same token (normal timeout: only the first call must hang) gets the instances the
    # lost call bought, buying none
    again = await p.launch(spec("tok-b", 2))
    assert sorted(env.cvm.spot_id(i) or "" for i in again) == sorted(env.cloud.spot.tokens["tok-b"].ids)
    assert env.cloud.spot.launched == 4
    await quick.close()


@pytest.mark.anyio
async def test_spot_and_on_demand_launches(env: Env) -> None:
    p = env.provider
    [s] = await p.launch(spec("spot-1", max_price="1.25", vpc="vpc-a1", subnet="subnet-a1",
                              security_groups=("sg-a1",), name_prefix="gpu-a-", user_data="#!/bin/sh\necho hi\n",
                              node_labels={"gpuops.io/pool": "gpu-a"},
                              node_taints=(NodeTaint(key="gpu", value="true", effect="NoSchedule"),)))
    [o] = await p.launch(spec("od-1", capacity_type="on-demand", instance_type="S5.MEDIUM4"))
    si, oi = env.cvm.instance(s), env.cvm.instance(o)
    assert si is not None and oi is not None
    assert (si.capacity_type, oi.capacity_type) == ("spot", "on-demand")
    opts = si.launch_options
    assert (opts["maxPrice"], opts["vpcId"], opts["subnetId"], opts["securityGroupIds"], opts["instanceName"]) == (
        "1.25", "vpc-a1", "subnet-a1", ["sg-a1"], "gpu-a-")
    script = base64.b64decode(opts["userData"]).decode()
    assert script.startswith("#!/bin/sh\nexport GPUOPS_KUBELET_EXTRA_ARGS='--node-labels=gpuops.io/pool=gpu-a "
                             "--register-with-taints=gpu=true:NoSchedule'\n") and script.endswith("echo hi\n")
    assert "maxPrice" not in oi.launch_options and "userData" not in oi.launch_options
    found = {i.id: i for i in await p.describe(OWNER)}
    assert (found[s].capacity_type, found[o].capacity_type) == ("spot", "on-demand")
    await until_holds("the instance's node in the fleet", lambda: si.node_name in env.fleet.machines)
    m = env.fleet.machines[si.node_name]
    assert m.labels["gpuops.io/pool"] == "gpu-a" and m.taints == [{"key": "gpu", "value": "true",
                                                                   "effect": "NoSchedule"}]


# ------------------------------------------------------------------------------------ terminate


@pytest.mark.anyio
async def test_terminate_in_batches_of_100_skipping_missing_and_pending(env: Env) -> None:
    p = env.provider
    ids = await p.launch(spec("many", 150))
    await until_holds("every instance running", lambda: all(s == "running" for s in env.states(ids)))
    missing = ["ins-zzzzzzz1", "ins-zzzzzzz2"]
    before = env.cloud.calls[("cvm", "TerminateInstances", 200)]
    await p.terminate(ids[:60] + missing[:1] + ids[60:] + missing[1:] + ids[:5])
    assert set(env.states(ids)) <= {"shutting-down", "terminated", "gone"}
    # two batches (100 + 51 ids), each refused once for its missing id, then sent again without it
    assert env.cloud.calls[("cvm", "TerminateInstances", 200)] - before == 4
    assert env.cloud.errors[("cvm", "TerminateInstances", "InvalidInstanceId.NotFound")] == 2
    await p.terminate(ids[:10])  # terminating or gone: success
    assert await p.describe(OWNER) == [] or all(i.state == InstanceState.TERMINATING
                                                for i in await p.describe(OWNER))
    # a PENDING instance cannot go yet: the others in the batch do, the caller gets a TRANSIENT to retry
    [running] = await p.launch(spec("r-1"))
    await until_holds("the running instance RUNNING", lambda: env.states([running]) == ["running"])
    [pending] = await p.launch(spec("p-1"))
    with pytest.raises(ProviderError) as ei:
        await p.terminate([pending, running])
    assert ei.value.kind is ErrorKind.TRANSIENT and pending in ei.value.message
    assert env.states([pending, running]) == ["pending", "shutting-down"]
    await until_holds("the pending instance RUNNING", lambda: env.states([pending]) == ["running"])
    await p.terminate([pending])
    assert env.states([pending]) == ["shutting-down"]


# ------------------------------------------------------------------------------------ errors


@pytest.mark.anyio
async def test_error_kinds(env: Env) -> None:
    p = env.provider
    env.cloud.set_capacity("GN7.2XLARGE32", 0)
    with pytest.raises(ProviderError) as ei:
        await p.launch(spec("cap", instance_type="GN7.2XLARGE32"))
    assert (ei.value.kind, ei.value.code) == (ErrorKind.CAPACITY, "ResourceInsufficient.SpecifiedInstanceType")
    env.cvm.spot_quota = 0
    with pytest.raises(ProviderError) as ei:
        await p.launch(spec("quota"))
    assert (ei.value.kind, ei.value.code) == (ErrorKind.QUOTA, "LimitExceeded.SpotQuota")
    env.cvm.spot_quota = None
    with pytest.raises(ProviderError) as ei:
        await p.launch(spec("zone", zone="ap-guangzhou-9"))
    assert ei.value.kind is ErrorKind.INVALID
    with pytest.raises(ProviderError) as ei:
        await p.launch(spec("nozone", zone=None))
    assert ei.value.kind is ErrorKind.INVALID
    for creds, code in (({"secretId": SID, "secretKey": "wrong"}, "AuthFailure.SignatureFailure"),
                        ({"secretId": "AKIDnobody", "secretKey": SKEY}, "AuthFailure.SecretIdNotFound")):
        bad = TencentProvider(env.config(credentials=creds))
        with pytest.raises(ProviderError) as ei:
            await bad.describe(OWNER)
        assert (ei.value.kind, ei.value.code) == (ErrorKind.CREDENTIALS, code)
        await bad.close()
    with pytest.raises(ProviderError) as ei:
        TencentProvider(env.config(credentials={"secretId": SID}))
    assert ei.value.kind is ErrorKind.CREDENTIALS and "secretKey" in ei.value.message
    env.cloud.faults.add(api="cvm", op="RunInstances", status=502, count=1)
    with pytest.raises(ProviderError) as ei:
        await p.launch(spec("net"))
    assert (ei.value.kind, ei.value.code, ei.value.ambiguous) == (ErrorKind.TRANSIENT, "ServerNetworkError", True)
    env.cloud.faults.add(api="cvm", op="DescribeInstances", error="InternalError", count=1)
    with pytest.raises(ProviderError) as ei:
        await p.describe(OWNER)
    assert (ei.value.kind, ei.value.ambiguous) == (ErrorKind.TRANSIENT, False)
    env.cloud.faults.add(api="cvm", op="DescribeInstances", error="RequestLimitExceeded", count=1)
    with pytest.raises(ProviderError) as ei:
        await p.describe(OWNER)
    assert (ei.value.kind, ei.value.retry_after) == (ErrorKind.THROTTLED, 1.0)
    table = {
        "ResourcesSoldOut.SpecifiedInstanceType": ErrorKind.CAPACITY,
        "InvalidParameterValue.InsufficientOffering": ErrorKind.CAPACITY,
        "ResourceUnavailable.InstanceType": ErrorKind.CAPACITY,
        "LimitExceeded.UserSpotQuota": ErrorKind.QUOTA,
        "InstancesQuotaLimitExceeded": ErrorKind.QUOTA,
        "InvalidAccount.InsufficientBalance": ErrorKind.QUOTA,
        "UnauthorizedOperation.CamNoAuth": ErrorKind.CREDENTIALS,
        "RequestLimitExceeded.UinLimitExceeded": ErrorKind.THROTTLED,
        "InternalError.TradeUnknownError": ErrorKind.TRANSIENT,
        "ClientNetworkError": ErrorKind.TRANSIENT,
        "InvalidImageId.NotFound": ErrorKind.INVALID,
        "UnsupportedOperation.NoInstanceTypeSupportSpot": ErrorKind.INVALID,
        "InvalidClientToken.TooLong": ErrorKind.INVALID,
        "InvalidClientToken.ParameterMismatch": ErrorKind.MISMATCH,
    }
    assert {code: classify(code, "RunInstances")[0] for code in table} == table
    assert classify("ClientNetworkError", "RunInstances")[1] and not classify("ClientNetworkError", "X")[1]


# ------------------------------------------------------------------------------------ rate limits, endpoints


@pytest.mark.anyio
async def test_rate_limiter_keeps_calls_under_the_emulators_limits(env: Env) -> None:
    p = env.provider
    start = time.monotonic()
    await asyncio.gather(*(p.launch(spec(f"burst-{i}", tags={})) for i in range(14)),
                         *(p.describe(OWNER) for _ in range(50)))
    elapsed = time.monotonic() - start
    assert env.cvm.requests["RunInstances"] == 14 and env.cvm.requests["DescribeInstances"] == 50
    assert not [k for k in env.cloud.errors if k[2] == "RequestLimitExceeded"]
    assert elapsed > 1.0  # 14 launches at 8/s cannot all go in the first second


def test_endpoint_forms() -> None:
    assert _endpoint("http://127.0.0.1:8080") == ("127.0.0.1:8080", "http")
    assert _endpoint("127.0.0.1:8080") == ("127.0.0.1:8080", "http")
    assert _endpoint("localhost:9") == ("localhost:9", "http")
    assert _endpoint("https://cvm.internal.example:8443/") == ("cvm.internal.example:8443", "https")
    assert _endpoint("cvm.ap-shanghai.tencentcloudapi.com") == ("cvm.ap-shanghai.tencentcloudapi.com", "https")
    assert _endpoint(None) == (None, "https")
    with pytest.raises(ProviderError):
        _endpoint("ftp://cvm")
    p = TencentProvider(ProviderConfig(region=REGION, endpoint="http://127.0.0.1:1",
                                       credentials={"secretId": SID, "secretKey": SKEY}))
    assert p._client.request.conn._session.trust_env is False and p._client.request.conn.proxy is None
    assert p.name == "tencent"

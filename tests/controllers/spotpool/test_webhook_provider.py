"""The webhook provider against the emulated cloud's `/spot/v1` API, which serves the webhook contract: owned
instances only, pagination, idempotent launches, terminate with unknown ids, and the error kinds the reconciler
acts on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from waiting import NotYet, until

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
from gpuops.controllers.spotpool.providers.webhook import WebhookProvider
from gpuops_sim.cloud import CloudOptions, CloudServer, InstanceType
from gpuops_sim.cluster.machines import Fleet

pytestmark = pytest.mark.anyio
FAST = CloudOptions(launch_seconds=0.05, boot_seconds=0.05, device_plugin_seconds=0.01, terminate_seconds=0.05,
                    reclaim_notice_seconds=0.5, terminated_visible_seconds=5.0, seed=3)
OWNER = {POOL_TAG: "p1", MANAGED_BY_TAG: MANAGED_BY}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def cloud() -> AsyncIterator[CloudServer]:
    fleet = Fleet()
    types = [InstanceType("gpu.l4.1x", "L4-24GB", 1, capacity=300), InstanceType("gpu.t4.1x", "T4-16GB", 1,
                                                                                 capacity=0)]
    async with CloudServer(fleet, instance_types=types, options=FAST) as c:
        yield c
    fleet.close()


def provider(cloud: CloudServer, **creds: str) -> WebhookProvider:
    p = make_provider("sim", ProviderConfig(region="", endpoint=f"{cloud.url}/spot/v1", credentials=creds,
                                            timeout_seconds=1.0))
    assert isinstance(p, Guarded) and isinstance(p.inner, WebhookProvider)  # every failure a ProviderError
    return p


def spec(token: str, count: int = 1, itype: str = "gpu.l4.1x", **tags: str) -> LaunchSpec:
    return LaunchSpec(client_token=token, count=count, instance_type=itype,
                      tags={**OWNER, LAUNCH_ID_TAG: token, **tags}, node_labels={"team": "ml"},
                      node_taints=(NodeTaint(key="spot", value="true", effect="NoSchedule"),),
                      user_data="#!/bin/sh\necho join\n")


async def test_describe_pages_and_sees_only_owned_instances(cloud: CloudServer) -> None:
    p = provider(cloud)
    try:
        ids = await p.launch(spec("t-1", 260))
        await p.launch(LaunchSpec(client_token="other", count=3, instance_type="gpu.l4.1x",
                                  tags={POOL_TAG: "p2", MANAGED_BY_TAG: MANAGED_BY}))
        await p.launch(LaunchSpec(client_token="half", count=2, instance_type="gpu.l4.1x",
                                  tags={POOL_TAG: "p1"}))  # someone else's, tagged half-way: never ours
        got = await p.describe(OWNER)
        assert sorted(i.id for i in got) == sorted(ids)
        assert cloud.calls[("spot", "describe", 200)] == 1  # one page of 500
        inst = got[0]
        assert inst.launch_id == "t-1" and inst.capacity_type == "spot" and inst.instance_type == "gpu.l4.1x"
        assert inst.provider_id and inst.provider_id.endswith(inst.id) and inst.launched_at
        assert cloud.spot.instances[inst.id].launch_options["userData"].startswith("#!/bin/sh")
    finally:
        await p.close()


async def test_same_token_buys_once_and_mismatch_is_its_own_kind(cloud: CloudServer) -> None:
    p = provider(cloud)
    try:
        first = await p.launch(spec("t-2", 3))
        again = await p.launch(spec("t-2", 3))
        assert first == again and cloud.spot.launched == 3
        with pytest.raises(ProviderError) as e:
            await p.launch(spec("t-2", 4))
        assert e.value.kind is ErrorKind.MISMATCH
    finally:
        await p.close()


async def test_states_terminate_unknown_ids_and_launch_failures(cloud: CloudServer) -> None:
    p = provider(cloud)

    async def all_running() -> bool | NotYet:
        seen = {i.state for i in await p.describe(OWNER)}
        return seen == {InstanceState.RUNNING} or NotYet(seen)

    async def one_failed() -> bool | NotYet:
        seen = {i.state for i in await p.describe(OWNER)}
        return InstanceState.LAUNCH_FAILED in seen or NotYet(seen)

    try:
        ids = await p.launch(spec("t-3", 2))
        await until("both instances running", all_running, 3, every=0.02)
        await p.terminate([*ids, "i-doesnotexist"])  # unknown ids are not an error
        states = {i.state for i in await p.describe(OWNER)}
        assert states <= {InstanceState.TERMINATING}
        cloud.spot.set_launch_failure_rate(1.0)
        await p.launch(spec("t-4", 1))
        await until("a launch failed", one_failed, 3, every=0.02)
    finally:
        await p.close()


async def test_error_kinds(cloud: CloudServer) -> None:
    p = provider(cloud)
    try:
        with pytest.raises(ProviderError) as e:
            await p.launch(spec("t-5", 1, "gpu.t4.1x"))
        assert e.value.kind is ErrorKind.CAPACITY
        cloud.faults.add(api="spot", op="run", error="InstanceLimitExceeded", count=1)
        with pytest.raises(ProviderError) as e:
            await p.launch(spec("t-6"))
        assert e.value.kind is ErrorKind.QUOTA
        cloud.faults.add(api="spot", op="describe", status=429, retry_after=2, count=1)
        with pytest.raises(ProviderError) as e:
            await p.describe(OWNER)
        assert e.value.kind is ErrorKind.THROTTLED and e.value.retry_after == 2
        cloud.faults.add(api="spot", op="run", status=503, after=True, count=1)
        with pytest.raises(ProviderError) as e:
            await p.launch(spec("t-7"))
        assert e.value.kind is ErrorKind.TRANSIENT and e.value.ambiguous  # it happened: retry the same token
        assert await p.launch(spec("t-7")) and cloud.spot.launched == 1
        cloud.faults.add(api="spot", op="run", hang=True, hang_seconds=5, count=1)
        with pytest.raises(ProviderError) as e:
            await p.launch(spec("t-8"))
        assert e.value.kind is ErrorKind.TRANSIENT and e.value.ambiguous and e.value.code == "Timeout"
        cloud.options.token = "right"
        with pytest.raises(ProviderError) as e:
            await p.describe(OWNER)
        assert e.value.kind is ErrorKind.CREDENTIALS
    finally:
        await p.close()
    good = provider(cloud, token="right")
    try:
        assert len(await good.describe(OWNER)) >= 1
    finally:
        await good.close()


async def test_bad_configuration_is_a_clear_error() -> None:
    with pytest.raises(ProviderError) as e:
        make_provider("webhook", ProviderConfig(region=""))
    assert e.value.kind is ErrorKind.INVALID and "spec.endpoint" in e.value.message
    with pytest.raises(ProviderError) as e:
        make_provider("gcp", ProviderConfig(region="", endpoint="http://x"))
    assert "spec.provider" in e.value.message
    with pytest.raises(ProviderError) as e:
        make_provider("tencent", ProviderConfig(region="ap-guangzhou", credentials={"secretId": "a"}))
    assert e.value.kind is ErrorKind.CREDENTIALS and "secretKey" in e.value.message

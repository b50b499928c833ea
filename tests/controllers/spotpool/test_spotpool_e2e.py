"""The spot pool controller on the emulated cluster with the emulated cloud (the `sim` provider, which speaks the
webhook contract): reaching the minimum, replacing a reclaimed instance at once, never buying twice when an
answer is lost, falling back along instance types and to on-demand, scale-in with drain, credentials errors
as a condition, and deletion terminating everything the pool owns."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client import REGISTRY
from waiting import install_crds, until, until_holds

from gpuops.controllers.spotpool.api import POOLS, SpotPool
from gpuops.controllers.spotpool.nodes import NOTICE_ANNOTATION
from gpuops.controllers.spotpool.settings import Settings
from gpuops.controllers.spotpool.setup import CONTROLLER_NAME, install
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import RESULTS
from gpuops.kube.errors import NotFound
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import EVENTS, NODES, PODS, SECRETS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import parse

NS = "work"

pytestmark = pytest.mark.anyio

SCENARIO = {
    "name": "spotpool-tests",
    "namespaces": [NS, "gpuops-system"],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeLifecycle": {"nodeMonitorGraceSeconds": 1.0, "podGcOrphanSeconds": 2.0},
    "cloud": {"launchSeconds": 0.1, "bootSeconds": 0.2, "devicePluginSeconds": 0.05, "terminateSeconds": 0.1,
              "reclaimNoticeSeconds": 2.0, "noticePollSeconds": 0.05,
              "instanceTypes": [{"name": "gpu.l4.1x", "gpuModel": "L4-24GB", "gpus": 1},
                                {"name": "gpu.a100.1x", "gpuModel": "A100-40GB", "gpus": 1},
                                {"name": "gpu.t4.1x", "gpuModel": "T4-16GB", "gpus": 1, "capacity": 0}]},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"



def pool_body(cluster: SimCluster, name: str = "gpus", *, minimum: int = 2, maximum: int = 4,
              types: tuple[str, ...] = ("gpu.l4.1x",), **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": name},
            "spec": {"provider": "sim", "endpoint": f"{cluster.cloud.url}/spot/v1", "minimum": minimum,
                     "maximum": maximum, "drainTimeoutSeconds": 5,
                     "template": {"instanceTypes": list(types), "labels": {"team": "ml"},
                                  "taints": [{"key": "spot", "value": "true", "effect": "NoSchedule"}]},
                     **spec}}


@asynccontextmanager
async def running(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[SimCluster, Client]]:
    async with SimCluster(parse(SCENARIO), workload=False) as cluster:
        cluster.write_kubeconfig(tmp_path / "k")
        client = await Client.from_kubeconfig(str(tmp_path / "k"))
        await install_crds(client, ["spotpools"], [POOLS])
        mgr = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        install(mgr, settings=Settings(**{"drain_recheck": 0.2, "resync_seconds": 2.0, "retry_base": 0.1,
                                         "capacity_backoff_base": 30.0, "secret_recheck": 0.3,
                                         **settings}))
        task = asyncio.create_task(mgr.run())
        try:
            yield cluster, client
        finally:
            mgr.request_stop()
            await asyncio.wait_for(task, 15)
            await client.close()


def live(cluster: SimCluster, pool: str = "gpus") -> list[Any]:
    return [i for i in cluster.cloud.spot.instances.values()
            if i.tags.get("gpuops.io/pool") == pool and i.state in ("pending", "running") and i.interruption is None]


async def ready_pool(client: Client, name: str, n: int) -> SpotPool | None:
    p: SpotPool = await client.get(POOLS, name)
    return p if p.status.ready == n and p.status.size == n and cond.is_true(p.status.conditions, "Ready") else None


async def test_minimum_reached_reclaim_replaced_scale_in_and_deletion(tmp_path: Path) -> None:
    async with running(tmp_path) as (cluster, client):
        await client.create(POOLS, pool_body(cluster))
        pool = await until("2 Ready instances", lambda: ready_pool(client, "gpus", 2))
        assert cluster.cloud.spot.launched == 2  # one launch of 2, never more
        assert pool.metadata.finalizers == ("gpuops.io/spotpool-instances",)
        assert pool.status.pending_launch is None and pool.status.launch_sequence == 1
        for inst in pool.status.instances:
            node = await client.get(NODES, inst.node_name or "")
            assert (node.metadata.labels or {}).get("gpuops.io/spotpool") == "gpus"
            assert (node.metadata.labels or {}).get("team") == "ml"
            assert any(t.key == "spot" for t in node.spec.taints or ())
            tags = cluster.cloud.spot.instances[inst.id].tags
            assert tags["gpuops.io/managed-by"] == "gpuops" and tags["gpuops.io/launch-id"].endswith("-1")

        # a reclaim notice: the replacement is launched at once, long before the 2 s notice runs out
        victim = pool.status.instances[0].id
        noticed = time.monotonic()
        cluster.cloud.reclaim([victim], notice_seconds=2.0)
        await until("a replacement launch", lambda: _true(cluster.cloud.spot.launched == 3), 5)
        assert time.monotonic() - noticed < 1.5
        await until("back to 2 Ready", lambda: ready_pool(client, "gpus", 2))
        assert len(live(cluster)) == 2

        # scale-in to 1: one instance is drained and terminated
        await client.patch(POOLS, "gpus", {"spec": {"minimum": 1, "maximum": 1}})
        await until("1 instance left", lambda: ready_pool(client, "gpus", 1))
        assert len(live(cluster)) == 1

        # deletion terminates what the pool owns, then lets the object go
        await client.delete(POOLS, "gpus")

        async def gone() -> bool:
            try:
                await client.get(POOLS, "gpus")
            except NotFound:
                return True
            return False

        await until("the pool is gone", gone)
        assert live(cluster) == []
        assert cluster.cloud.spot.launched == 3


async def test_a_wave_is_replaced_at_the_first_node_report_not_at_each_nodes_own(tmp_path: Path) -> None:
    """A reclaim wave takes two instances; only one node agent has reported (agents poll the metadata service
    every few seconds, each on its own phase). The webhook contract lists every notice in describe, so the
    describe that the first report triggers shows both, and one launch replaces both: the second notice is
    observable to the controller from that answer on, not from its own node's report, which never comes here.
    The resync (60 s) is far beyond the wait, so only that describe can have brought the second replacement."""
    async with running(tmp_path, resync_seconds=60.0) as (cluster, client):
        spot = cluster.cloud.spot
        spot.notice_subscribers.remove(cluster.spot_agent.on_notice)  # this test reports as the agent would
        await client.create(POOLS, pool_body(cluster))
        pool = await until("2 Ready instances", lambda: ready_pool(client, "gpus", 2))
        first, second = pool.status.instances
        cluster.cloud.reclaim([first.id, second.id], notice_seconds=30.0)
        terminate_at = spot.instances[first.id].interruption["terminateTime"]
        await client.patch(NODES, first.node_name or "",
                           {"metadata": {"annotations": {NOTICE_ANNOTATION: terminate_at}}})
        await until("both replacements launched", lambda: _true(spot.launched == 4), 10)
        pool = await client.get(POOLS, "gpus")
        assert pool.status.launch_sequence == 2  # one launch for the wave
        node = await client.get(NODES, second.node_name or "")
        assert NOTICE_ANNOTATION not in (node.metadata.annotations or {})


async def test_lost_answers_never_buy_twice(tmp_path: Path) -> None:
    async with running(tmp_path) as (cluster, client):
        # the launch happens, then the answer is lost, three times in a row
        cluster.cloud.faults.add(api="spot", op="run", status=503, after=True, count=3)
        await client.create(POOLS, pool_body(cluster, minimum=3, maximum=3))
        await until("3 Ready instances", lambda: ready_pool(client, "gpus", 3))
        assert cluster.cloud.spot.launched == 3
        assert len(cluster.cloud.spot.tokens) == 1  # one client token for the whole launch


async def test_launch_intent_is_in_status_before_the_cloud_hears_of_it(tmp_path: Path) -> None:
    async with running(tmp_path, call_timeout=1.0) as (cluster, client):
        cluster.cloud.faults.add(api="spot", op="run", hang=True, hang_seconds=5, count=1)
        await client.create(POOLS, pool_body(cluster, minimum=2, maximum=2))

        async def intent() -> SpotPool | None:
            p: SpotPool = await client.get(POOLS, "gpus")
            return p if p.status.pending_launch is not None else None

        pool = await until("a persisted launch intent", intent)
        pl = pool.status.pending_launch
        assert pl is not None and pl.count == 2 and pl.client_token.endswith("-1")
        assert cluster.cloud.spot.launched == 0  # the call hangs: nothing bought yet, the intent is already durable
        done = await until("2 Ready instances", lambda: ready_pool(client, "gpus", 2))
        assert done.status.launch_sequence == 1 and cluster.cloud.spot.launched == 2
        assert {i.client_token for i in cluster.cloud.spot.instances.values()} == {pl.client_token}


async def test_capacity_error_falls_back_along_types_then_on_demand(tmp_path: Path) -> None:
    async with running(tmp_path) as (cluster, client):
        cluster.cloud.set_capacity("gpu.l4.1x", 0)
        await client.create(POOLS, pool_body(cluster, minimum=1, maximum=2, types=("gpu.l4.1x", "gpu.a100.1x")))
        pool = await until("1 Ready instance", lambda: ready_pool(client, "gpus", 1))
        assert pool.status.instances[0].type == "gpu.a100.1x"
        assert any(b.instance_type == "gpu.l4.1x" for b in pool.status.backoff)

        cluster.cloud.set_capacity("gpu.t4.1x", 0)
        await client.create(POOLS, pool_body(cluster, "od", minimum=1, maximum=1, types=("gpu.t4.1x",),
                                             onDemandFallback={"afterCapacityErrors": 1}))
        od = await until("an on-demand instance", lambda: ready_pool(client, "od", 1))
        assert od.status.instances[0].capacity_type == "on-demand"
        assert cond.is_true(od.status.conditions, "CapacityError") is False or od.status.capacity_errors >= 1


async def not_ready(reason: str, value: float) -> bool:
    return REGISTRY.get_sample_value("gpuops_spotpool_not_ready", {"pool": "gpus", "reason": reason}) == value


def reconciles() -> float:
    """How many reconciles the spotpool controller has finished, whatever their result."""
    return sum(REGISTRY.get_sample_value("controller_runtime_reconcile_total",
                                         {"controller": CONTROLLER_NAME, "result": r}) or 0.0 for r in RESULTS)


async def test_credentials_secret_missing_then_fixed(tmp_path: Path) -> None:
    async with running(tmp_path) as (cluster, client):
        cluster.cloud.options.token = "s3cret"
        body = pool_body(cluster, minimum=1, maximum=1,
                         credentialsSecretRef={"name": "cloud", "namespace": "gpuops-system"}, insecureAllowHTTP=True)
        await client.create(POOLS, body)

        async def invalid(reason: str) -> SpotPool | None:
            p: SpotPool = await client.get(POOLS, "gpus")
            c = cond.get_condition(p.status.conditions, "CredentialsInvalid")
            return p if c is not None and c.status == "True" and c.reason == reason else None

        await until("CredentialsInvalid: no Secret", lambda: invalid("SecretNotFound"))
        # the SpotPoolNotReady alert's series (from the controller's cache): the pool is down, and says why
        await until("gpuops_spotpool_not_ready{reason=SecretNotFound} 1", lambda: not_ready("SecretNotFound", 1))
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cloud", "namespace": "gpuops-system"},
                  "data": {"token": base64.b64encode(b"wrong").decode()}}
        await client.create(SECRETS, secret, "gpuops-system")
        await until("CredentialsInvalid: refused", lambda: invalid("AuthFailure"))
        calls_before = sum(n for (api, _, _), n in cluster.cloud.calls.items() if api == "spot")
        looks = reconciles()
        await asyncio.sleep(1.0)  # no hot loop while the keys are wrong: a rate over one second is under test
        await until_holds("a spotpool reconcile in that second", lambda: reconciles() > looks)
        calls_after = sum(n for (api, _, _), n in cluster.cloud.calls.items() if api == "spot")
        assert calls_after - calls_before <= 2
        await client.patch(SECRETS, "cloud", {"data": {"token": base64.b64encode(b"s3cret").decode()}},
                           namespace="gpuops-system")
        p = await until("1 Ready instance", lambda: ready_pool(client, "gpus", 1))
        assert not cond.is_true(p.status.conditions, "CredentialsInvalid")
        await until("gpuops_spotpool_not_ready 0 once Ready", lambda: not_ready("", 0))


async def test_scale_on_demand_for_pending_gpu_pods(tmp_path: Path) -> None:
    async with running(tmp_path) as (cluster, client):
        await client.create(POOLS, pool_body(cluster, minimum=0, maximum=3, scaleOnDemand=True))
        for i in range(2):
            await client.create(PODS, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"train-{i}"},
                "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                         "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "main", "image": "cuda",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, NS)

        async def running_pods() -> bool:
            pods = [await client.get(PODS, f"train-{i}", NS) for i in range(2)]
            return all(p.status.phase == "Running" for p in pods)

        await until("both pods running on pool nodes", running_pods, 30)
        assert cluster.cloud.spot.launched == 2


async def _true(value: bool) -> bool:
    return value


async def test_tencent_provider_end_to_end_through_the_real_sdk(tmp_path: Path) -> None:
    """The same controller with the tencent provider: the real tencentcloud SDK signs TC3 requests to the CVM
    emulator, which sells instances from the same emulated cloud, so they join as Nodes."""
    from gpuops_sim.cloud.cvm import CvmServer

    async with running(tmp_path) as (cluster, client), \
            CvmServer(cluster.cloud, secret_id="AKIDtest", secret_key="k3y") as cvm:
        keys = {"secretId": base64.b64encode(b"AKIDtest").decode(), "secretKey": base64.b64encode(b"k3y").decode()}
        await client.create(SECRETS, {"apiVersion": "v1", "kind": "Secret",
                                      "metadata": {"name": "tc", "namespace": "gpuops-system"}, "data": keys},
                            "gpuops-system")
        body = pool_body(cluster, "tc", minimum=2, maximum=3, provider="tencent", endpoint=cvm.url,
                         credentialsSecretRef={"name": "tc", "namespace": "gpuops-system"}, insecureAllowHTTP=True)
        body["spec"]["template"].update(region="ap-guangzhou", zones=[cluster.cloud.zone])
        await client.create(POOLS, body)
        pool = await until("2 Ready instances through CVM", lambda: ready_pool(client, "tc", 2), 30)
        assert all(i.id.startswith("ins-") and i.node_name for i in pool.status.instances)
        assert cluster.cloud.spot.launched == 2
        # a reclaim (CVM has no notice in its API: the node agent's annotation is the signal) is replaced
        victim = cvm.spot_id(pool.status.instances[0].id)
        cluster.cloud.reclaim([victim], notice_seconds=2.0)
        await until("a replacement launch", lambda: _true(cluster.cloud.spot.launched == 3), 10)
        await until("back to 2 Ready", lambda: ready_pool(client, "tc", 2), 30)


async def test_a_pool_naming_a_secret_in_another_namespace_is_refused_unread(tmp_path: Path) -> None:
    """Cloud keys from kube-system (or any namespace the operator was not started with) are never read: the pool
    is Ready=False SecretNotAllowed with a Warning Event, nothing is launched and the Secret is never read."""
    async with running(tmp_path) as (cluster, client):
        reads: list[str] = []
        cluster.server.audit_hooks.append(
            lambda d: reads.append(d.attrs.name) if d.attrs.resource == "secrets" and d.attrs.verb == "get" else None)
        keys = {"accessKeyId": base64.b64encode(b"AKIAROOT").decode()}
        await client.create(SECRETS, {"apiVersion": "v1", "kind": "Secret",
                                      "metadata": {"name": "root", "namespace": "kube-system"}, "data": keys},
                            "kube-system")
        body = pool_body(cluster, "stolen", minimum=1,
                         credentialsSecretRef={"name": "root", "namespace": "kube-system"})
        await client.create(POOLS, body)

        async def refused() -> SpotPool | None:
            p: SpotPool = await client.get(POOLS, "stolen")
            c = cond.get_condition(p.status.conditions, "Ready")
            return p if c is not None and c.reason == "SecretNotAllowed" else None

        pool = await until("the pool refused for its Secret's namespace", refused)
        ready = cond.get_condition(pool.status.conditions, "Ready")
        assert ready is not None and ready.status == "False"
        assert ready.message.startswith("spec.credentialsSecretRef.namespace: a SpotPool may name a Secret only in "
                                        "gpuops-system"), ready.message
        events = json.loads(await client.request("GET", "/api/v1/events"))["items"]
        assert any(e.get("reason") == "SecretNotAllowed" and e["type"] == "Warning" for e in events)
        assert reads == [] and cluster.cloud.spot.launched == 0


async def test_aws_provider_end_to_end_through_boto3(tmp_path: Path) -> None:
    """The same controller with the aws provider: boto3 signs SigV4 requests to the EC2 fake, which sells
    instances from the same emulated cloud; nodes are matched by their aws:/// providerID."""
    from gpuops_sim.cloud.ec2 import Ec2Server

    async with running(tmp_path) as (cluster, client), \
            Ec2Server(cluster.cloud, access_key_id="AKIATEST", secret_access_key="s3cret") as ec2:
        keys = {"accessKeyId": base64.b64encode(b"AKIATEST").decode(),
                "secretAccessKey": base64.b64encode(b"s3cret").decode()}
        await client.create(SECRETS, {"apiVersion": "v1", "kind": "Secret",
                                      "metadata": {"name": "aws", "namespace": "gpuops-system"}, "data": keys},
                            "gpuops-system")
        body = pool_body(cluster, "ec2", minimum=2, maximum=3, provider="aws", endpoint=ec2.url,
                         credentialsSecretRef={"name": "aws", "namespace": "gpuops-system"}, insecureAllowHTTP=True)
        body["spec"]["template"].update(region="us-east-1", image="ami-12345678")
        await client.create(POOLS, body)
        pool = await until("2 Ready instances through EC2", lambda: ready_pool(client, "ec2", 2), 30)
        assert all(i.id.startswith("i-") and i.node_name for i in pool.status.instances)
        for i in pool.status.instances:
            node = await client.get(NODES, i.node_name or "")
            assert node.spec.provider_id.startswith("aws:///") and node.spec.provider_id.endswith(i.id)
        assert cluster.cloud.spot.launched == 2
        cluster.cloud.reclaim([pool.status.instances[0].id], notice_seconds=2.0)
        await until("a replacement launch", lambda: _true(cluster.cloud.spot.launched == 3), 10)
        await until("back to 2 Ready", lambda: ready_pool(client, "ec2", 2), 30)
        await client.delete(POOLS, "ec2")
        await until("everything terminated", lambda: _true(live(cluster, "ec2") == []), 20)


async def test_reclaimed_event_survives_a_failed_status_write(tmp_path: Path) -> None:
    """The API server refuses the status write of the reconcile that first sees a reclaim notice (chaos/
    apiserver_all.py: 5 % 500s): the Reclaimed Event still goes out. It used to be dropped with the failed step,
    and the retry no longer took the notice for new."""
    async with running(tmp_path) as (cluster, client):
        await client.create(POOLS, pool_body(cluster, minimum=1, maximum=2))
        pool = await until("1 Ready instance", lambda: ready_pool(client, "gpus", 1))
        cluster.server.faults.add_error(500, verbs=["update"], resources=["spotpools"], count=1)
        cluster.cloud.reclaim([pool.status.instances[0].id], notice_seconds=2.0)

        async def reclaimed_event() -> bool:
            _, events = await client.list(EVENTS)
            return any(e.reason == "Reclaimed" and e.involved_object.name == "gpus" for e in events)

        await until("a replacement launch", lambda: _true(cluster.cloud.spot.launched == 2), 5)
        assert cluster.server.faults.injected == 1
        await until("the Reclaimed Event", reclaimed_event, 5)


async def test_every_reclaimed_event_goes_out_while_node_writes_fail(tmp_path: Path) -> None:
    """Both instances get their notice in one reconcile while every node write fails (their nodes lost a
    template label, so the reconcile re-labels them first): each still gets its Reclaimed Event. A failing
    node write used to end the step before a later instance's Event, and the retry no longer took that
    notice for new."""
    async with running(tmp_path) as (cluster, client):
        await client.create(POOLS, pool_body(cluster, minimum=2, maximum=3))
        pool = await until("2 Ready instances", lambda: ready_pool(client, "gpus", 2))
        rule = cluster.server.faults.add_error(500, verbs=["patch"], resources=["nodes"])
        for inst in pool.status.instances:
            node = await client.get(NODES, inst.node_name or "")
            labels = {k: v for k, v in (node.metadata.labels or {}).items() if k != "team"}
            # a PUT (verb update): only patches fail
            await client.replace(NODES, msgspec.structs.replace(
                node, metadata=msgspec.structs.replace(node.metadata, labels=labels)))
        await until("the re-labelling refused twice", lambda: _true(cluster.server.faults.injected >= 2), 10)
        ids = sorted(i.id for i in pool.status.instances)
        cluster.cloud.reclaim(ids, notice_seconds=5.0)

        async def both_events() -> bool:
            _, events = await client.list(EVENTS)
            told = {i for e in events if e.reason == "Reclaimed" for i in ids if i in (e.message or "")}
            return told == set(ids)

        await until("a Reclaimed Event for each instance", both_events, 10)
        cluster.server.faults.rules.remove(rule)
        await until("back to 2 Ready", lambda: ready_pool(client, "gpus", 2), 30)


async def test_a_deletion_the_cloud_blocks_says_so_and_how_to_let_the_pool_go(tmp_path: Path) -> None:
    """The cloud refuses the keys once the pool runs: deleting it cannot terminate its instance, so the pool
    stays; it says so (DeletionBlocked, Ready=False, a Warning Event naming the way out), and setting
    deletionPolicy Retain, as that message says, lets it go with its instance left running."""
    async with running(tmp_path) as (cluster, client):
        await client.create(POOLS, pool_body(cluster, minimum=1, maximum=1))
        await until("1 Ready instance", lambda: ready_pool(client, "gpus", 1))
        cluster.cloud.options.token = "now-required"
        await client.delete(POOLS, "gpus")

        async def blocked() -> SpotPool | None:
            p: SpotPool = await client.get(POOLS, "gpus")
            c = cond.get_condition(p.status.conditions, "DeletionBlocked")
            return p if c is not None and c.status == "True" else None

        pool = await until("DeletionBlocked", blocked)
        c = cond.get_condition(pool.status.conditions, "DeletionBlocked")
        assert c is not None and "deletionPolicy" in c.message and "kubectl patch spotpool gpus" in c.message
        ready = cond.get_condition(pool.status.conditions, "Ready")
        assert ready is not None and (ready.status, ready.reason) == ("False", "DeletionBlocked")

        async def warned() -> bool:
            _, events = await client.list(EVENTS, namespace="default")
            return any(e.reason == "DeletionBlocked" and "deletionPolicy" in e.message for e in events)

        await until("a DeletionBlocked Event", warned)
        await client.patch(POOLS, "gpus", {"spec": {"deletionPolicy": "Retain"}})

        async def gone() -> bool:
            try:
                await client.get(POOLS, "gpus")
            except NotFound:
                return True
            return False

        await until("the pool released", gone)
        assert len(live(cluster)) == 1  # its instance left running, as Retain says

"""The emulated cloud over real HTTP: power API, spot API with client tokens and reclaims, faults, auth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from waiting import until_holds

from gpuops_sim.cloud import CloudOptions, CloudServer, InstanceType
from gpuops_sim.cluster.machines import Fleet, Machine

FAST = CloudOptions(launch_seconds=0.05, boot_seconds=0.05, device_plugin_seconds=0.01, terminate_seconds=0.05,
                    reclaim_notice_seconds=0.1, terminated_visible_seconds=0.3, seed=7)
TYPES = [InstanceType("gpu.a100.8x", "A100-80GB", 8), InstanceType("gpu.l4.1x", "L4-24GB", 1, capacity=2),
         InstanceType("cpu.16x", None, 0, "16", "64Gi")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Client:
    """A thin JSON client: returns (status, body, headers)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str | None = None) -> None:
        self.s, self.url, self.token = session, url, token

    async def call(self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
                   limit: float = 5.0) -> tuple[int, Any, Any]:
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        async with self.s.request(method, self.url + path, json=body, headers=h,
                                  timeout=aiohttp.ClientTimeout(total=limit)) as r:
            assert r.headers["Content-Type"] == "application/json"
            return r.status, await r.json(), r.headers

    async def run(self, token: str, itype: str = "gpu.a100.8x", count: int = 1, **extra: Any) -> tuple[int, Any]:
        st, body, _ = await self.call("POST", "/spot/v1/instances",
                                      {"clientToken": token, "instanceType": itype, "count": count, **extra})
        return st, body


@pytest.fixture
async def env() -> AsyncIterator[tuple[CloudServer, Client, Fleet]]:
    fleet = Fleet()
    fleet.add(Machine("gpu-0", "A100-80GB", 8, group="a100", state="off", boot_seconds=0.05,
                      shutdown_seconds=0.05))
    fleet.add(Machine("gpu-1", "L4-24GB", 4, group="l4", state="on"))
    async with CloudServer(fleet, instance_types=[InstanceType(**vars(t)) for t in TYPES], options=FAST) as cloud, \
            aiohttp.ClientSession() as session:
        yield cloud, Client(session, cloud.url), fleet
    fleet.close()


# ------------------------------------------------------------------------------------ power API


@pytest.mark.anyio
async def test_power_on_boots_then_on_and_start_stop_are_idempotent(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, fleet = env
    # the seed's exact call: POST {} with Content-Type application/json
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/start", {})
    assert st == 202 and body["state"] == "booting" and body["powerCycles"] == 1 and body["name"] == "gpu-0"
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/start", {})
    assert st == 200 and body["state"] == "booting" and body["powerCycles"] == 1
    await until_holds("machine gpu-0 on", lambda: fleet.machines["gpu-0"].state == "on", 3.0)
    st, body, _ = await c.call("GET", "/power/v1/machines/gpu-0")
    assert (st, body["state"], body["group"], body["gpus"], body["gpuModel"]) == (200, "on", "a100", 8, "A100-80GB")
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/start")  # no body at all
    assert (st, body["state"]) == (200, "on")
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/stop", {})
    assert (st, body["state"]) == (202, "shutting-down")
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/stop", {})
    assert st == 200
    await until_holds("machine gpu-0 off", lambda: fleet.machines["gpu-0"].state == "off", 3.0)
    st, body, _ = await c.call("GET", "/power/v1/machines")
    assert {m["name"]: m["state"] for m in body["machines"]} == {"gpu-0": "off", "gpu-1": "on"}
    st, body, _ = await c.call("GET", "/power/v1/machines?group=l4")
    assert [m["name"] for m in body["machines"]] == ["gpu-1"]
    assert cloud.calls[("power", "start", 202)] == 1 and cloud.calls[("power", "start", 200)] == 2


@pytest.mark.anyio
async def test_unknown_machine_is_404_naming_it(env: tuple[CloudServer, Client, Fleet]) -> None:
    _, c, _ = env
    for method, path in (("POST", "/power/v1/machines/nope/start"), ("POST", "/power/v1/machines/nope/stop"),
                         ("GET", "/power/v1/machines/nope")):
        st, body, _ = await c.call(method, path, {} if method == "POST" else None)
        assert st == 404
        assert body["error"]["code"] == "MachineNotFound" and body["error"]["name"] == "nope"
        assert "nope" in body["error"]["message"]
    st, body, _ = await c.call("GET", "/no/such/path")
    assert st == 404 and body["error"]["code"] == "NotFound"
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/start", None, headers={})
    assert st == 202
    async with c.s.post(c.url + "/power/v1/machines/gpu-0/stop", data=b"{not json",
                        headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == "InvalidRequest"


@pytest.mark.anyio
async def test_idempotency_key_replays_the_first_answer(env: tuple[CloudServer, Client, Fleet]) -> None:
    _, c, fleet = env
    key = {"Idempotency-Key": "wake-gpu-0-1"}
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/start", {}, headers=key)
    assert (st, body["state"]) == (202, "booting")
    await c.call("POST", "/power/v1/machines/gpu-0/stop", {})
    # a late retry of the first start must not power the machine on again
    st, body, h = await c.call("POST", "/power/v1/machines/gpu-0/start", {}, headers=key)
    assert (st, body["state"], h.get("Idempotent-Replayed")) == (202, "booting", "true")
    assert fleet.machines["gpu-0"].state in ("shutting-down", "off")
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/stop", {}, headers=key)
    assert st == 422 and body["error"]["code"] == "IdempotencyKeyMismatch"


@pytest.mark.anyio
async def test_spot_machines_are_not_power_managed(env: tuple[CloudServer, Client, Fleet]) -> None:
    _, c, fleet = env
    _, body = await c.run("t-pm")
    node = body["instances"][0]["nodeName"]
    await until_holds("the node in the fleet", lambda: node in fleet.machines, 3.0)
    st, _, _ = await c.call("POST", f"/power/v1/machines/{node}/stop", {})
    assert st == 404


# ------------------------------------------------------------------------------------ spot API


@pytest.mark.anyio
async def test_same_client_token_launches_once(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, _ = env
    st, first = await c.run("tok-1", count=2, tags={"pool": "p1"})
    assert st == 200 and len(first["instances"]) == 2
    inst = first["instances"][0]
    assert inst["state"] == "pending" and inst["clientToken"] == "tok-1" and inst["tags"] == {"pool": "p1"}
    assert inst["instanceId"].startswith("i-") and len(inst["instanceId"]) == 19
    assert inst["providerId"] == f"sim:///sim-zone-a/{inst['instanceId']}"
    assert inst["nodeName"] == "ip-" + inst["privateIp"].replace(".", "-")
    st, again = await c.run("tok-1", count=2, tags={"pool": "p1"})
    assert st == 200
    assert [i["instanceId"] for i in again["instances"]] == [i["instanceId"] for i in first["instances"]]
    assert len(cloud.spot.instances) == 2
    st, body = await c.run("tok-1", count=3, tags={"pool": "p1"})
    assert st == 400 and body["error"]["code"] == "IdempotentParameterMismatch"
    st, body = await c.run("tok-1", count=2, tags={"pool": "other"})
    assert st == 400 and body["error"]["code"] == "IdempotentParameterMismatch"
    assert len(cloud.spot.instances) == 2


@pytest.mark.anyio
async def test_launch_validation(env: tuple[CloudServer, Client, Fleet]) -> None:
    _, c, _ = env
    st, body = await c.run("t-x", itype="gpu.z9000")
    assert st == 400 and body["error"]["code"] == "InvalidParameterValue"
    st, body, _ = await c.call("POST", "/spot/v1/instances", {"instanceType": "gpu.a100.8x"})
    assert st == 400 and body["error"]["code"] == "MissingParameter"
    st, body = await c.run("x" * 65)
    assert st == 400 and body["error"]["code"] == "InvalidClientToken"
    st, body = await c.run("t-y", count=0)
    assert st == 400
    st, body = await c.run("t-z", nodeTaints=[{"key": "k", "effect": "Sometimes"}])
    assert st == 400


@pytest.mark.anyio
async def test_describe_filters_and_pages(env: tuple[CloudServer, Client, Fleet]) -> None:
    _, c, _ = env
    _, a = await c.run("ta", count=2, tags={"pool": "a", "team": "x"})
    _, b = await c.run("tb", itype="cpu.16x", tags={"pool": "b"})
    ids_a = [i["instanceId"] for i in a["instances"]]
    id_b = b["instances"][0]["instanceId"]

    async def ids(query: str) -> list[str]:
        st, body, _ = await c.call("GET", "/spot/v1/instances" + query)
        assert st == 200, body
        return [i["instanceId"] for i in body["instances"]]

    assert await ids("?tag:pool=a") == ids_a
    assert await ids("?tag:pool=a&tag:pool=b") == [*ids_a, id_b]  # repeated key: OR
    assert await ids("?tag:pool=a&instanceType=cpu.16x") == []  # different keys: AND
    assert await ids(f"?instanceId={id_b}&instanceId={ids_a[1]}") == [id_b, ids_a[1]]
    assert await ids("?tag-key=team") == ids_a
    assert await ids("?state=pending") == [*ids_a, id_b]
    assert await ids("?state=running") == []
    st, page, _ = await c.call("GET", "/spot/v1/instances?maxResults=2")
    assert len(page["instances"]) == 2 and page["nextToken"] == "2"
    assert await ids(f"?maxResults=2&nextToken={page['nextToken']}") == [id_b]
    st, body, _ = await c.call("GET", "/spot/v1/instances?color=red")
    assert st == 400 and body["error"]["code"] == "InvalidFilter"


@pytest.mark.anyio
async def test_instance_lifecycle_joins_and_leaves_the_fleet(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, fleet = env
    _, body = await c.run("life", tags={"pool": "inference"}, nodeLabels={"team": "ml"},
                          nodeTaints=[{"key": "gpuops.io/spot", "value": "true", "effect": "NoSchedule"}])
    inst = body["instances"][0]
    iid, node = inst["instanceId"], inst["nodeName"]
    assert node not in fleet.machines
    await until_holds("the instance running", lambda: cloud.spot.instances[iid].state == "running", 3.0)
    m = fleet.machines[node]
    assert m.provider_id == f"sim:///sim-zone-a/{iid}" and m.group == "inference"
    assert m.gpu_model == "A100-80GB" and m.gpus == 8
    assert m.labels["node.kubernetes.io/instance-type"] == "gpu.a100.8x"
    assert m.labels["gpuops.io/capacity-type"] == "spot"
    assert m.labels["topology.kubernetes.io/zone"] == "sim-zone-a"
    assert m.labels["team"] == "ml" and m.labels["nvidia.com/gpu.count"] == "8"
    assert m.taints == [{"key": "gpuops.io/spot", "value": "true", "effect": "NoSchedule"}]
    assert m.boot_seconds == FAST.boot_seconds and m.device_plugin_seconds == FAST.device_plugin_seconds
    await until_holds("the machine on", lambda: m.state == "on", 3.0)

    st, out, _ = await c.call("POST", "/spot/v1/instances/terminate", {"instanceIds": [iid, "i-00000000000000000"]})
    assert st == 200
    assert out["terminatingInstances"] == [{"instanceId": iid, "previousState": "running",
                                            "currentState": "shutting-down"}]
    assert out["notFound"] == ["i-00000000000000000"]
    assert m.state == "off"  # the OS went down: no kubelet any more
    await until_holds("the node gone from the fleet", lambda: node not in fleet.machines, 3.0)
    st, out, _ = await c.call("POST", "/spot/v1/instances/terminate", {"instanceIds": [iid]})
    assert st == 200 and out["terminatingInstances"][0]["previousState"] == "terminated"
    st, desc, _ = await c.call("GET", f"/spot/v1/instances?instanceId={iid}")
    d = desc["instances"][0]
    assert d["state"] == "terminated" and d["stateReason"]["code"] == "Client.UserInitiatedShutdown"
    # terminated records vanish after terminated_visible_seconds, and the token with them
    await until_holds("the instance gone", lambda: iid not in cloud.spot.instances, 3.0)
    assert "life" not in cloud.spot.tokens


@pytest.mark.anyio
async def test_terminating_a_pending_instance_never_adds_a_machine(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, fleet = env
    _, body = await c.run("early")
    iid, node = body["instances"][0]["instanceId"], body["instances"][0]["nodeName"]
    _, out, _ = await c.call("POST", "/spot/v1/instances/terminate", {"instanceIds": [iid]})
    assert out["terminatingInstances"][0]["previousState"] == "pending"
    await until_holds("the instance terminated", lambda: cloud.spot.instances[iid].state == "terminated", 3.0)
    # proof that its launch time has passed: a later launch has run (launch timers fire in the order they were set)
    _, body = await c.run("later")
    later = body["instances"][0]["instanceId"]
    await until_holds("a later launch running", lambda: cloud.spot.instances[later].state == "running", 3.0)
    assert node not in fleet.machines


@pytest.mark.anyio
async def test_reclaim_notice_then_termination(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, fleet = env
    _, body = await c.run("rc", count=3, tags={"pool": "r"})
    ids = [i["instanceId"] for i in body["instances"]]
    await until_holds("every instance running",
                      lambda: all(cloud.spot.instances[i].state == "running" for i in ids), 3.0)
    nodes = {i: cloud.spot.instances[i].node_name for i in ids}
    st, out, _ = await c.call("POST", "/sim/cloud/reclaim", {"instanceIds": [ids[0], "i-nope"], "noticeSeconds": 0.2})
    assert st == 200 and out == {"instanceIds": [ids[0]], "notFound": ["i-nope"]}
    st, desc, _ = await c.call("GET", f"/spot/v1/instances?instanceId={ids[0]}")
    d = desc["instances"][0]
    assert d["state"] == "running" and set(d["interruption"]) == {"noticeTime", "terminateTime"}
    assert d["interruption"]["terminateTime"] > d["interruption"]["noticeTime"]
    assert nodes[ids[0]] in fleet.machines  # still there during the notice
    await until_holds("the first node gone from the fleet", lambda: nodes[ids[0]] not in fleet.machines, 3.0)
    assert cloud.spot.instances[ids[0]].state_reason == {"code": "Server.SpotInstanceTermination",
                                                          "message": "Spot instance termination: capacity reclaimed"}
    # by count and tag, through the Python API, with the default (short) notice
    got = cloud.reclaim(count=5, tags={"pool": "r"})
    assert sorted(got) == sorted(ids[1:])
    assert cloud.reclaim(count=1, tags={"pool": "r"}) == []  # already noticed ones are not picked again
    await until_holds("the other nodes gone from the fleet",
                      lambda: all(nodes[i] not in fleet.machines for i in ids[1:]), 3.0)
    assert cloud.spot.reclaimed == 3


@pytest.mark.anyio
async def test_capacity_min_count_and_release(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, _ = env
    st, body = await c.run("cap-1", itype="gpu.l4.1x", count=3)
    assert st == 503 and body["error"]["code"] == "InsufficientInstanceCapacity"
    assert not cloud.spot.instances and "cap-1" not in cloud.spot.tokens  # failures are not remembered
    st, body = await c.run("cap-1", itype="gpu.l4.1x", count=3, minCount=1)
    assert st == 200 and len(body["instances"]) == 2  # partial fill: MaxCount semantics
    first = body["instances"][0]["instanceId"]
    st, body = await c.run("cap-2", itype="gpu.l4.1x")
    assert st == 503
    await c.call("POST", "/spot/v1/instances/terminate", {"instanceIds": [first]})
    await until_holds("one gpu.l4.1x in use", lambda: cloud.spot.used["gpu.l4.1x"] == 1, 3.0)
    st, body = await c.run("cap-2", itype="gpu.l4.1x")
    assert st == 200
    st, types, _ = await c.call("POST", "/sim/cloud/capacity", {"instanceType": "gpu.l4.1x", "capacity": None})
    assert {t["name"]: (t["capacity"], t["inUse"]) for t in types["instanceTypes"]}["gpu.l4.1x"] == (None, 2)
    st, body = await c.run("cap-3", itype="gpu.l4.1x", count=10)
    assert st == 200 and len(body["instances"]) == 10


# ------------------------------------------------------------------------------------ faults and auth


@pytest.mark.anyio
async def test_injected_errors_with_retry_after(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, _ = env
    cloud.faults.add(api="spot", op="run", status=503, count=1)
    st, body = await c.run("f1")
    assert st == 503 and body["error"]["code"] == "ServiceUnavailable"
    st, body = await c.run("f1")
    assert st == 200
    st, rule, _ = await c.call("POST", "/sim/cloud/faults", {"api": "spot", "op": "describe", "status": 429,
                                                             "retryAfter": 2, "count": 1})
    assert st == 201 and rule["id"] > 0
    st, body, h = await c.call("GET", "/spot/v1/instances")
    assert st == 429 and h["Retry-After"] == "2" and body["error"]["code"] == "RequestLimitExceeded"
    cloud.faults.add(api="power", error="InsufficientInstanceCapacity", count=1)
    st, body, _ = await c.call("POST", "/power/v1/machines/gpu-0/start", {})
    assert st == 503 and body["error"]["code"] == "InsufficientInstanceCapacity"
    st, desc, _ = await c.call("GET", "/sim/cloud/faults")
    assert {(f["api"], f["op"], f["fault"]) for f in desc["injected"]} == {
        ("spot", "run", "ServiceUnavailable"), ("spot", "describe", "RequestLimitExceeded"),
        ("power", "start", "InsufficientInstanceCapacity")}
    st, _, _ = await c.call("POST", "/sim/cloud/faults", {"api": "spot", "op": "fly", "status": 500})
    assert st == 400
    cloud.faults.add(api="spot", status=500)
    st, _, _ = await c.call("DELETE", "/sim/cloud/faults")
    assert st == 200 and not cloud.faults.rules
    assert cloud.calls[("spot", "run", 503)] == 1 and cloud.errors[("spot", "describe", "RequestLimitExceeded")] == 1


@pytest.mark.anyio
async def test_hang_and_delay(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, _ = env
    cloud.faults.add(api="spot", op="describe", hang=True, count=1)
    with pytest.raises(TimeoutError):
        await c.call("GET", "/spot/v1/instances", limit=0.2)
    st, _, _ = await c.call("GET", "/spot/v1/instances")
    assert st == 200
    cloud.faults.add(api="power", op="list", delay=0.2, count=1)
    t0 = time.monotonic()
    st, _, _ = await c.call("GET", "/power/v1/machines")
    assert st == 200 and time.monotonic() - t0 >= 0.2
    cloud.faults.add(api="power", op="get", hang=True)  # released by stop(), which must not wait for it
    pending = asyncio.ensure_future(c.call("GET", "/power/v1/machines/gpu-0", limit=10))
    await until_holds("the hanging power get injected once",
                      lambda: cloud.faults.injected[("power", "get", "hang")] == 1, 3.0)
    t0 = time.monotonic()
    await cloud.stop()
    assert time.monotonic() - t0 < 2.0
    outcome: Any = (await asyncio.gather(pending, return_exceptions=True))[0]
    assert isinstance(outcome, aiohttp.ClientError) or outcome[0] == 504, outcome


@pytest.mark.anyio
async def test_lost_answer_retried_with_the_same_token_creates_nothing(env: tuple[CloudServer, Client, Fleet]) -> None:
    cloud, c, _ = env
    cloud.faults.add(api="spot", op="run", status=500, after=True, count=1)
    st, _ = await c.run("lost", count=2)
    assert st == 500 and len(cloud.spot.instances) == 2  # it happened, the client does not know
    st, body = await c.run("lost", count=2)
    assert st == 200 and len(body["instances"]) == 2 and len(cloud.spot.instances) == 2


@pytest.mark.anyio
async def test_bearer_token_is_enforced_when_set() -> None:
    fleet = Fleet()
    fleet.add(Machine("n0", state="off"))
    opts = CloudOptions(launch_seconds=0.01, token="s3cret")
    async with CloudServer(fleet, options=opts) as cloud, aiohttp.ClientSession() as session:
        for token in (None, "wrong"):
            st, body, h = await Client(session, cloud.url, token).call("GET", "/power/v1/machines")
            assert st == 401 and body["error"]["code"] == "AuthFailure" and "Bearer" in h["WWW-Authenticate"]
            st, _, _ = await Client(session, cloud.url, token).call("POST", "/spot/v1/instances", {})
            assert st == 401
        good = Client(session, cloud.url, "s3cret")
        st, _, _ = await good.call("GET", "/power/v1/machines")
        assert st == 200
        st, _ = await good.run("ok", itype="cpu.16x")
        assert st == 200
        st, _, _ = await Client(session, cloud.url).call("GET", "/sim/cloud/stats")
        assert st == 200  # the control plane of the sim is the harness's, not the tenant's
    fleet.close()


# ------------------------------------------------------------------------------------ full chain (optional)


@pytest.mark.anyio
async def test_spot_instance_becomes_a_ready_node() -> None:
    kubelet = pytest.importorskip("gpuops_sim.cluster.kubelet")
    from gpuops_sim.apiserver import APIServer
    from gpuops_sim.cluster.access import NODES, ClusterAccess

    fleet = Fleet()
    async with APIServer() as server:
        kubelets = kubelet.Kubelets(server, fleet, kubelet.KubeletOptions())
        kubelets.start()
        try:
            async with CloudServer(fleet, options=FAST) as cloud, aiohttp.ClientSession() as session:
                c = Client(session, cloud.url)
                _, body = await c.run("chain", itype="gpu.l4.1x", tags={"pool": "chain"})
                node = body["instances"][0]["nodeName"]
                access = ClusterAccess(server, "test", component="test")

                def ready() -> bool:
                    n = access.get(NODES, "", node)
                    return n is not None and any(
                        x["type"] == "Ready" and x["status"] == "True" for x in n["status"].get("conditions", []))

                await until_holds("the machine ready", ready, 5)
                n = access.get(NODES, "", node)
                assert n is not None and n["spec"].get("providerID", "").startswith("sim:///sim-zone-a/i-")
                cloud.reclaim([body["instances"][0]["instanceId"]], notice_seconds=0)
                await until_holds("the node gone from the fleet", lambda: node not in fleet.machines, 3.0)
        finally:
            await kubelets.stop()
            fleet.close()

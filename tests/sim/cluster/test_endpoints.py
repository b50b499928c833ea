"""Service endpoints in the emulated cluster: a Service's EndpointSlice and Endpoints follow the pods its
selector picks (ready or not, named target ports resolved per pod), `kubectl describe svc` shows them, and a
Service without a selector is left to its user."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from waiting import until_holds

from gpuops_sim.cluster.access import PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.cluster.endpoints import ENDPOINTS, SERVICE_NAME_LABEL, SERVICES, SLICES, slice_content
from gpuops_sim.scenario import parse

NS = "default"
SCENARIO = {
    "name": "endpoints",
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.5, "nodeStatusSeconds": 5},
    "nodeGroups": [{"name": "cpu", "count": 1, "bootSeconds": 0.05, "devicePluginSeconds": 0}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    async with SimCluster(parse(SCENARIO), workload=False) as cluster:
        await until_holds("the node", lambda: cluster.access.get(("", "nodes"), "", "cpu-0"), 10)
        yield cluster


def _pod(name: str, app: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "nginx",
                                     "ports": [{"name": "http", "containerPort": 8080}]}]}}


def _slices(sim: SimCluster, service: str) -> list[dict[str, Any]]:
    return [s for s in sim.access.iter(SLICES, NS) if (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL)
            == service]


def _addresses(sim: SimCluster, service: str) -> list[str]:
    slices = _slices(sim, service)
    return sorted(a for s in slices for e in s.get("endpoints") or [] if e["conditions"]["ready"]
                  for a in e["addresses"])


@pytest.mark.anyio
async def test_slices_and_endpoints_follow_the_selected_pods(sim: SimCluster) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
               "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}
    await sim.access.create_object(service)
    for name in ("web-a", "web-b"):
        await sim.access.create_object(_pod(name, "web"))
    await sim.access.create_object(_pod("other", "db"))
    ips = await until_holds("two endpoints", lambda: len(_addresses(sim, "web")) == 2 and _addresses(sim, "web"), 10)
    pod_ips = sorted(p["status"]["podIP"] for p in sim.access.iter(PODS, NS) if p["metadata"]["name"] != "other")
    assert ips == pod_ips
    (slice_,) = _slices(sim, "web")
    assert slice_["addressType"] == "IPv4" and slice_["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert slice_["metadata"]["ownerReferences"][0]["kind"] == "Service"
    endpoints = sim.access.get(ENDPOINTS, NS, "web")
    assert endpoints is not None
    assert sorted(a["ip"] for a in endpoints["subsets"][0]["addresses"]) == pod_ips
    await sim.access.delete(PODS, NS, "web-a", grace_seconds=0)
    await until_holds("the deleted pod's endpoint gone", lambda: len(_addresses(sim, "web")) == 1, 10)
    await sim.access.delete(SERVICES, NS, "web")
    await until_holds("slices and endpoints removed with the Service",
                      lambda: not _slices(sim, "web") and sim.access.get(ENDPOINTS, NS, "web") is None, 10)


@pytest.mark.anyio
async def test_a_service_without_selector_is_left_alone(sim: SimCluster) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "manual", "namespace": NS},
               "spec": {"ports": [{"port": 80}]}}
    await sim.access.create_object(service)
    await sim.access.create_object(_pod("probe", "web"))  # a pod change makes the controller look at the namespace
    steps = sim.endpoints.steps
    await until_holds("the controller's pass",
                      lambda: sim.endpoints.steps > steps and not sim.endpoints._namespaces, 10)
    assert not _slices(sim, "manual") and sim.access.get(ENDPOINTS, NS, "manual") is None


def test_not_ready_pods_are_endpoints_that_are_not_ready() -> None:
    service = {"spec": {"ports": [{"port": 80, "targetPort": 9000, "protocol": "TCP"}]}}
    pod = {"metadata": {"name": "p", "namespace": NS, "uid": "u"}, "spec": {"nodeName": "n"},
           "status": {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "False"}]}}
    content = slice_content(service, [pod])
    assert content["endpoints"][0]["conditions"] == {"ready": False, "serving": False, "terminating": False}
    assert content["ports"] == [{"name": "", "protocol": "TCP", "port": 9000}]

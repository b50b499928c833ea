"""The whole emulated cluster from a scenario: power API -> Node Ready -> pod scheduled; spot launch -> Node;
reclaim -> Node gone; and kubectl sees all of it."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from waiting import until_holds

from gpuops_sim.cluster.access import NODES, PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import parse

KUBECTL = str(Path(sys.executable).parent / "kubectl")

SCENARIO = {
    "name": "t",
    "namespaces": ["team-a"],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.5, "nodeStatusSeconds": 5, "events": True},
    "nodeLifecycle": {"nodeMonitorGraceSeconds": 2, "podGcOrphanSeconds": 0.5},
    "nodeGroups": [
        {"name": "a100", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": 2, "poweredOff": 1,
         "bootSeconds": 0.3, "devicePluginSeconds": 0.1, "shutdownSeconds": 0.05},
        {"name": "cpu", "count": 1},
    ],
    "cloud": {"launchSeconds": 0.1, "bootSeconds": 0.1, "devicePluginSeconds": 0.05, "terminateSeconds": 0.1,
              "reclaimNoticeSeconds": 0.2,
              "instanceTypes": [{"name": "sim.l4.4x", "gpuModel": "L4-24GB", "gpus": 4}]},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def ready(node: dict[str, Any] | None) -> bool:
    return node is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                    for c in node["status"].get("conditions", []))


def gpu_pod(name: str, gpus: int, runtime: float | None = None) -> dict[str, Any]:
    ann = {"sim.gpuops.io/runtime-seconds": str(runtime)} if runtime is not None else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann},
            "spec": {"restartPolicy": "Never",
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


@pytest.mark.anyio
async def test_power_on_through_the_api_makes_a_pending_pod_run() -> None:
    async with SimCluster(parse(SCENARIO), workload=False) as c:
        assert await c.wait_ready(10)
        assert c.access.get(NODES, "", "a100-1") is None  # powered off: never registered
        await c.access.create(PODS, "team-a", gpu_pod("big-1", 8, runtime=60))
        await c.access.create(PODS, "team-a", gpu_pod("big-2", 8, runtime=60))
        await until_holds("one pod Unschedulable", lambda: any(
            cond.get("reason") == "Unschedulable"
            for p in c.access.iter(PODS, "team-a") for cond in p["status"].get("conditions", [])), 10.0)
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            async with s.post(f"{c.cloud.url}/power/v1/machines/a100-1/start", json={}) as r:
                assert r.status == 202
                assert (await r.json())["state"] == "booting"
        node = await until_holds("a100-1 Ready",
                                 lambda: (n := c.access.get(NODES, "", "a100-1")) and ready(n) and n, 10.0)
        assert time.monotonic() - t0 >= 0.3  # not before its boot delay
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        await until_holds("both pods Running", lambda: sorted(
            p["spec"].get("nodeName", "") for p in c.access.iter(PODS, "team-a")
            if p["status"].get("phase") == "Running") == ["a100-0", "a100-1"], 10.0)


@pytest.mark.anyio
async def test_spot_instance_joins_and_its_reclaim_removes_the_node() -> None:
    async with SimCluster(parse(SCENARIO), workload=False) as c, aiohttp.ClientSession() as s:
        body = {"clientToken": "pool-a-1", "instanceType": "sim.l4.4x", "count": 1, "tags": {"pool": "a"}}
        ids = []
        for _ in range(2):  # a retry with the same client token launches nothing new
            async with s.post(f"{c.cloud.url}/spot/v1/instances", json=body) as r:
                assert r.status == 200, await r.text()
                ids.append([i["instanceId"] for i in (await r.json())["instances"]])
        assert ids[0] == ids[1] and len(ids[0]) == 1
        async with s.get(f"{c.cloud.url}/spot/v1/instances", params={"tag:pool": "a"}) as r:
            described = (await r.json())["instances"]
        assert [i["instanceId"] for i in described] == ids[0]
        name = described[0]["nodeName"]
        node = await until_holds("spot node Ready with GPUs",
                                 lambda: (n := c.access.get(NODES, "", name)) and ready(n)
                                 and n["status"]["allocatable"].get("nvidia.com/gpu") == "4" and n, 10.0)
        assert node["spec"]["providerID"].endswith(ids[0][0])
        assert node["metadata"]["labels"]["gpuops.io/capacity-type"] == "spot"
        await c.access.create(PODS, "team-a", {**gpu_pod("on-spot", 4), "spec": {
            **gpu_pod("x", 4)["spec"], "nodeSelector": {"gpuops.io/capacity-type": "spot"}}})
        await until_holds("pod running on the spot node",
                          lambda: (p := c.access.get(PODS, "team-a", "on-spot"))
                          and p["status"].get("phase") == "Running" and p["spec"]["nodeName"] == name, 10.0)
        assert c.cloud.reclaim(ids[0]) == ids[0]
        await until_holds("the reclaimed node's Node deleted", lambda: c.access.get(NODES, "", name) is None, 15)
        await until_holds("its pod gone", lambda: c.access.get(PODS, "team-a", "on-spot") is None, 15)


async def kubectl(kubeconfig: Path, *args: str) -> str:
    cache = str(kubeconfig.parent / "kubectl-cache")  # discovery is cached per host:port; ports get reused
    proc = await asyncio.create_subprocess_exec(KUBECTL, "--kubeconfig", str(kubeconfig), "--cache-dir", cache, *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.mark.anyio
async def test_kubectl_sees_nodes_pods_jobs_and_events(tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    async with SimCluster(parse(SCENARIO), workload=False) as c:
        c.write_kubeconfig(kc)
        assert await c.wait_ready(10)
        await c.access.create(("batch", "jobs"), "team-a", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
            "spec": {"completions": 2, "parallelism": 2, "template": {
                "metadata": {"annotations": {"sim.gpuops.io/runtime-seconds": "0.2"}},
                "spec": gpu_pod("x", 1)["spec"]}}})
        await until_holds("job complete", lambda: any(cond["type"] == "Complete" for cond in (
            c.access.get(("batch", "jobs"), "team-a", "train") or {}).get("status", {}).get("conditions", [])), 10.0)
        nodes = await kubectl(kc, "get", "nodes", "-L", "nvidia.com/gpu.product")
        assert "a100-0" in nodes and "Ready" in nodes and "NVIDIA-A100-SXM4-80GB" in nodes
        jobs = await kubectl(kc, "get", "jobs", "-n", "team-a")
        assert "Complete" in jobs and "2/2" in jobs
        pods = json.loads(await kubectl(kc, "get", "pods", "-n", "team-a", "-o", "json"))["items"]
        assert [p["status"]["phase"] for p in pods] == ["Succeeded", "Succeeded"]
        events = await kubectl(kc, "get", "events", "-n", "team-a")
        assert "Scheduled" in events and "SuccessfulCreate" in events and "Completed" in events

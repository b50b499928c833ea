"""The agent farm (sim/gpuops_sim/migfarm.py) plays the MIG node agent for bench/scale.py's hundreds of MIG nodes:
its MigNodes, claim answers and node allocatable must be what the allocator expects from `gpuops agent`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from waiting import until

from gpuops_sim.cluster.access import NODES
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.migfarm import ADVERTISE, CLAIMS, MIG_NODES, MigAgentFarm, gpu_uuids
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio

NS = "work"
ROOT = Path(__file__).resolve().parents[2]
CRDS = [ROOT / "manifests" / "crds" / f"{n}.gpuops.io.yaml" for n in ("mignodes", "allocationclaims")]
SCENARIO = {
    "name": "migfarm-tests",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 1, "nodeStatusSeconds": 60, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "mig", "gpuModel": "A100-80GB", "gpusPerNode": 2, "count": 2}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def farm_on(cluster_heartbeat: float = 30.0) -> AsyncIterator[tuple[SimCluster, MigAgentFarm]]:
    async with SimCluster(parse(SCENARIO), workload=False, manifests=CRDS) as cluster:
        assert await cluster.wait_ready(30)
        farm = MigAgentFarm(cluster.access, [("mig-0", "A100-80GB", 2), ("mig-1", "A100-80GB", 2)],
                            heartbeat_seconds=cluster_heartbeat)
        await farm.start()
        try:
            yield cluster, farm
        finally:
            await farm.stop()


def claim(name: str, node: str, gpu: str, start: int) -> dict[str, Any]:
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "AllocationClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"podName": "p", "podUID": "uid-p", "nodeName": node, "gpuUUID": gpu, "profile": "1g.10gb",
                     "start": start, "size": 1}}


async def test_the_farm_answers_claims_like_the_agent() -> None:
    async with farm_on() as (cluster, _farm):
        acc = cluster.access
        mn = acc.get(MIG_NODES, "", "mig-0")
        assert mn is not None and mn["status"]["backend"] == "emulated" and mn["status"]["heartbeat"]
        assert [g["uuid"] for g in mn["status"]["gpus"]] == gpu_uuids("mig-0", 2)
        assert all(g["migMode"] == "Enabled" and g["slices"] == [] for g in mn["status"]["gpus"])
        gpu = gpu_uuids("mig-0", 2)[1]
        await acc.create(CLAIMS, NS, claim("c1", "mig-0", gpu, 3))

        async def created() -> dict[str, Any] | None:
            c = acc.get(CLAIMS, NS, "c1")
            return c if (c or {}).get("status", {}).get("phase") == "Created" else None

        c = await until("the claim Created", created, 10)
        assert c["status"]["deviceUUID"]
        slices = acc.get(MIG_NODES, "", "mig-0")["status"]["gpus"][1]["slices"]  # type: ignore[index]
        assert [(s["profile"], s["start"], s["size"], s["claim"]) for s in slices] == [("1g.10gb", 3, 1, f"{NS}/c1")]
        # the allocator's ADVERTISE annotation: the slice is offered to the kubelet and the claim says so
        await acc.patch(CLAIMS, NS, "c1", {"metadata": {"annotations": {ADVERTISE: "true"}}})

        async def offered() -> bool:
            node = acc.get(NODES, "", "mig-0") or {}
            c = acc.get(CLAIMS, NS, "c1") or {}
            return (node.get("status", {}).get("allocatable", {}).get("gpuops.io/mig-1g.10gb") == "1"
                    and bool(c.get("status", {}).get("advertised")))

        await until("the slice offered", offered, 10)
        # released: the slice is destroyed and no longer offered
        await acc.patch(CLAIMS, NS, "c1", {"status": {"phase": "Released"}}, "status")

        async def destroyed() -> bool:
            gpus = (acc.get(MIG_NODES, "", "mig-0") or {})["status"]["gpus"]
            node = acc.get(NODES, "", "mig-0") or {}
            return all(not g["slices"] for g in gpus) and \
                node["status"]["allocatable"].get("gpuops.io/mig-1g.10gb") == "0"

        await until("the slice destroyed", destroyed, 10)
        assert (acc.get(MIG_NODES, "", "mig-1") or {})["status"]["gpus"][0]["slices"] == []  # the other node


async def test_heartbeats_are_refreshed() -> None:
    async with farm_on(cluster_heartbeat=0.2) as (cluster, _farm):
        first = cluster.access.get(MIG_NODES, "", "mig-1")["metadata"]["resourceVersion"]  # type: ignore[index]

        async def beaten() -> bool:
            mn = cluster.access.get(MIG_NODES, "", "mig-1") or {}
            return bool(mn["metadata"]["resourceVersion"] != first)

        await until("a heartbeat write", beaten, 10)

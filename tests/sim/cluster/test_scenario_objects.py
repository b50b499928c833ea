"""Scenario objects are created at start, with "${SIM_CLOUD_URL}" replaced by the emulated cloud's URL (its port
is only known once it listens), so GPUNodeGroups can point their webhooks at its power API."""

from __future__ import annotations

import pytest

from gpuops_sim.cluster.access import GroupResource
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio

CONFIGMAPS: GroupResource = ("", "configmaps")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_objects_name_the_cloud_url() -> None:
    scenario = parse({
        "name": "objects", "namespaces": ["demo"],
        "objects": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "power", "namespace": "demo"},
                     "data": {"on": "${SIM_CLOUD_URL}/power/v1/machines/m-0/start", "plain": "as is"}}],
    })
    async with SimCluster(scenario, workload=False, faults=False) as cluster:
        cm = cluster.access.get(CONFIGMAPS, "demo", "power")
        assert cm is not None
        assert cm["data"] == {"on": f"{cluster.cloud.url}/power/v1/machines/m-0/start", "plain": "as is"}
        assert cluster.cloud.url.startswith("http://127.0.0.1:")

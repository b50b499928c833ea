"""gpuops_autoprovision_boot_timeouts_total (behind the GPUNodeBootTimeout alert): exported at 0 before any
timeout, so increase() sees the first one, and counted once per boot timeout, when the group goes Failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from waiting import install_crds, until

from gpuops.controllers.autoprovision.api import GROUPS, GPUNodeGroup
from gpuops.controllers.autoprovision.settings import Settings
from gpuops.controllers.autoprovision.setup import install
from gpuops.kube.client import Client
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio

NS = "work"
METRIC = "gpuops_autoprovision_boot_timeouts_total"
SCENARIO = {
    "name": "boot-timeout-metric",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "big", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": 1, "poweredOff": 1,
                    "bootSeconds": 0.4, "devicePluginSeconds": 0.2, "shutdownSeconds": 0.2}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def timeouts() -> float:
    value = REGISTRY.get_sample_value(METRIC)
    assert value is not None, f"{METRIC} is not exported"
    return value


def ghost_group(cluster: SimCluster) -> dict[str, Any]:
    """Answers its power-on (the sim's stop URL: 2xx, powers nothing on) but its node never joins."""
    url = f"{cluster.cloud.url}/power/v1/machines/big-0/stop"
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": "ghost"},
            "spec": {"nodeName": "ghost", "gpuCount": 1, "scaleUp": {"url": url}, "scaleDown": {"url": url},
                     "bootTimeoutSeconds": 1, "scaleDownUnneededSeconds": 60}}


def gpu_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job"},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def test_a_boot_timeout_is_counted_once(tmp_path: Path) -> None:
    before = timeouts()  # exported (at 0 in a fresh process) before any timeout
    async with SimCluster(parse(SCENARIO), workload=False) as cluster:
        cluster.write_kubeconfig(tmp_path / "k")
        client = await Client.from_kubeconfig(str(tmp_path / "k"))
        await install_crds(client, ["gpunodegroups"], [GROUPS])
        mgr = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        # a long backoff: the group stays Failed for the rest of the test
        install(mgr, settings=Settings(boot_backoff_base=60.0), env={})
        task = asyncio.create_task(mgr.run())
        try:
            await client.create(GROUPS, ghost_group(cluster))
            await client.create(PODS, gpu_pod(), NS)

            async def failed() -> GPUNodeGroup | None:
                g: GPUNodeGroup = await client.get(GROUPS, "ghost")
                return g if g.status.state == "Failed" else None

            g = await until("ghost Failed after its boot timeout", failed)
            assert g.status.failures == 1
            assert timeouts() == before + 1  # the status write that made it Failed is the one counted

        finally:
            mgr.request_stop()
            await asyncio.wait_for(task, 15)
            await client.close()

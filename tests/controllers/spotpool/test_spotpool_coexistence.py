"""A spot pool whose nodes Karpenter manages too (here: its template puts Karpenter's NodePool label on them) says
so on the emulated cluster: ConflictDetected with the nodes named and one Warning Event, kept over resyncs;
dropping the label from the nodes clears it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_spotpool_e2e import pool_body, ready_pool, running
from waiting import until

from gpuops.controllers.coexistence import CONDITION, KARPENTER_NODEPOOL
from gpuops.controllers.spotpool.api import POOLS, SpotPool
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.resources import EVENTS, NODES

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def conflict(client: Client) -> Any:
    p: SpotPool = await client.get(POOLS, "gpus")
    return cond.get_condition(p.status.conditions, CONDITION)


async def test_a_pool_whose_nodes_karpenter_manages_says_so_once(tmp_path: Path) -> None:
    async with running(tmp_path) as (cluster, client):
        body = pool_body(cluster, minimum=2, maximum=2)
        body["spec"]["template"]["labels"][KARPENTER_NODEPOOL] = "gpu"
        await client.create(POOLS, body)
        pool = await until("2 Ready instances", lambda: ready_pool(client, "gpus", 2))

        async def flagged() -> Any:
            found = await conflict(client)
            return found if found is not None and found.status == "True" and found.message.count("(gpu)") == 2 \
                else None

        found = await until("ConflictDetected naming both nodes", flagged)
        assert found.reason == "KarpenterManagedNodes"
        nodes = sorted(i.node_name or "" for i in pool.status.instances)
        assert all(n in found.message for n in nodes)

        # a spec change with no effect: its observedGeneration proves a later reconcile saw the same conflict
        changed: SpotPool = await client.patch(POOLS, "gpus", {"spec": {"drainTimeoutSeconds": 6}})

        async def reconciled() -> bool:
            p: SpotPool = await client.get(POOLS, "gpus")
            return p.status.observed_generation == changed.metadata.generation

        await until("a reconcile of the changed spec", reconciled)
        _, events = await client.list(EVENTS, namespace="default")
        warned = [e for e in events if e.reason == "KarpenterManagedNodes"]
        assert len(warned) == 1 and warned[0].type == "Warning" and warned[0].count == 1
        assert len(cluster.cloud.spot.instances) == 2  # nothing launched or replaced for it

        # the label goes from the template and the nodes: the condition clears
        await client.patch(POOLS, "gpus", {"spec": {"template": {"labels": {KARPENTER_NODEPOOL: None}}}})
        for n in nodes:
            await client.patch(NODES, n, {"metadata": {"labels": {KARPENTER_NODEPOOL: None}}})

        async def cleared() -> bool:
            found = await conflict(client)
            return found is not None and found.status == "False"

        await until("ConflictDetected False", cleared)

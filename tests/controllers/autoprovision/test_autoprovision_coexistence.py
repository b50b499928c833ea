"""Node autoprovision beside Karpenter and cluster-autoscaler on the emulated cluster: an idle machine whose Node
carries Karpenter's NodePool label, or the node annotation cluster-autoscaler defines for "do not remove", is not
powered off after the planner has provably looked at it past its idle threshold; the group says why in
ConflictDetected with one Warning Event; once the mark goes, the idle machine is powered off as usual."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from test_autoprovision_e2e import NS, SCENARIO, gpu_pod, group, state_of
from waiting import install_crds, until

from gpuops.controllers.autoprovision.api import GROUPS, GPUNodeGroup
from gpuops.controllers.autoprovision.reconciler import PLAN
from gpuops.controllers.autoprovision.settings import Settings
from gpuops.controllers.autoprovision.setup import install
from gpuops.controllers.coexistence import CONDITION, KARPENTER_NODEPOOL, SCALE_DOWN_DISABLED
from gpuops.controllers.secretscope import SecretScope
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Request, Result
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import EVENTS, NODES, PODS
from gpuops.kube.times import parse_time_or_none
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio
MACHINE = "small-0"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[tuple[SimCluster, Client, list[float]]]:
    """The cluster and the controller; the list gets the wall-clock start of every finished plan."""
    async with SimCluster(parse(SCENARIO), workload=False) as cluster:
        cluster.write_kubeconfig(tmp_path / "k")
        client = await Client.from_kubeconfig(str(tmp_path / "k"))
        await install_crds(client, ["gpunodegroups"], [GROUPS])
        mgr = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        handle = install(mgr, settings=Settings(drain_recheck=0.2, off_recheck=0.2, secret_scope=SecretScope(NS)),
                         env={})
        plans: list[float] = []
        inner = handle.controller.reconcile

        async def observed(req: Request) -> Result | None:
            started = time.time()
            result = await inner(req)
            if req == PLAN:
                plans.append(started)
            return result

        handle.controller.reconcile = observed
        task = asyncio.create_task(mgr.run())
        try:
            yield cluster, client, plans
        finally:
            mgr.request_stop()
            await asyncio.wait_for(task, 15)
            await client.close()


async def conflict(client: Client) -> Any:
    g: GPUNodeGroup = await client.get(GROUPS, MACHINE)
    return cond.get_condition(g.status.conditions, CONDITION)


@pytest.mark.parametrize(("mark", "reason"), [
    ({"metadata": {"labels": {KARPENTER_NODEPOOL: "gpu"}}}, "KarpenterManagedNode"),
    ({"metadata": {"annotations": {SCALE_DOWN_DISABLED: "true"}}}, "NodeProtected"),
])
async def test_an_idle_machine_another_autoscaler_manages_stays_on(tmp_path: Path, mark: dict[str, Any],
                                                                   reason: str) -> None:
    async with running(tmp_path) as (cluster, client, plans):
        await client.create(GROUPS, group(cluster, MACHINE, 2))
        await client.create(PODS, gpu_pod("job", 1, 600.0), NS)

        async def busy() -> bool:
            return (await client.get(PODS, "job", NS)).status.phase == "Running"

        await until("the machine powered on and the pod running", busy)
        await client.patch(NODES, MACHINE, mark)

        async def held() -> Any:
            found = await conflict(client)
            return found if found is not None and found.status == "True" else None

        found = await until("ConflictDetected on the group", held)
        assert found.reason == reason
        await client.delete(PODS, "job", NS)

        async def idle_since() -> float | None:
            g: GPUNodeGroup = await client.get(GROUPS, MACHINE)
            at = parse_time_or_none(g.status.idle_since)
            return at / 1e6 if at is not None else None

        since = await until("the planner saw the machine idle", idle_since)
        due = since + 1 + 1  # scaleDownUnneededSeconds, plus the idle instant's whole-second rounding

        async def planned_after_due() -> bool:
            return any(t > due for t in plans)

        await until("a plan after the machine was due to go", planned_after_due)
        assert await state_of(client, MACHINE) == "Ready"
        machine = cluster.fleet.machines[MACHINE]
        assert machine.powered and machine.power_cycles == 1
        _, events = await client.list(EVENTS, namespace="default")
        warned = [e for e in events if e.reason == reason and e.involved_object.name == MACHINE]
        assert len(warned) == 1 and warned[0].type == "Warning" and warned[0].count == 1

        # the mark goes: nothing holds the idle machine any more
        key, = [k for part in mark["metadata"].values() for k in part]
        where = next(iter(mark["metadata"]))
        await client.patch(NODES, MACHINE, {"metadata": {where: {key: None}}})

        async def off() -> bool:
            found = await conflict(client)
            return found is not None and found.status == "False" and await state_of(client, MACHINE) == "Off"

        await until("ConflictDetected False and the idle machine powered off", off, within=30)

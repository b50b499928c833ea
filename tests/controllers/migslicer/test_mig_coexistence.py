"""The MIG slicer beside NVIDIA's MIG manager on the emulated cluster: a node whose labels say the MIG manager acts on
it is held (MigNode ConflictDetected, one Warning Event on the Node), the allocator plans no slice there and its
agent destroys no slice it did not make, past its orphan grace; a node carrying only the GPU Operator's inert
default (nvidia.com/mig.config=all-disabled) is sliced as before; removing the labels hands the node back."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from waiting import install_crds, until

from gpuops.controllers.coexistence import CONDITION, MIG_CONFIG, MIG_CONFIG_STATE
from gpuops.controllers.migslicer.agent import agent as mig_agent
from gpuops.controllers.migslicer.agent.gpus import MigBackend
from gpuops.controllers.migslicer.allocator import CONDITION as MIG_SLICES
from gpuops.controllers.migslicer.api import CLAIMS, GATE, MIG_NODES, MigNode
from gpuops.controllers.migslicer.settings import Settings
from gpuops.controllers.migslicer.setup import install as install_allocator
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import EVENTS, NODES, PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.fakenvml import FakeNVML
from gpuops_sim.scenario import parse

NS = "work"
HELD, FREE = "mig-0", "mig-1"
GRACE = 2.0

pytestmark = pytest.mark.anyio

SCENARIO = {
    "name": "mig-coexistence",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "mig", "gpuModel": "A100-40GB", "gpusPerNode": 2, "count": 2}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Cluster:
    client: Client
    agents: dict[str, mig_agent.NodeAgent]
    state: Path


@asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Cluster]:
    """The allocator (with its conflicts controller) and one emulated agent per node, each on its own driver state
    file, which a test can also open as another tool on the node (NVIDIA's MIG manager) would."""
    plugins = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # unix socket paths must stay short
    state = tmp_path / "gpus"
    state.mkdir()
    stack = contextlib.AsyncExitStack()
    managers: list[tuple[Manager, asyncio.Task[None]]] = []
    try:
        cluster = await stack.enter_async_context(
            SimCluster(parse(SCENARIO), workload=False, device_plugin_root=plugins))
        cluster.write_kubeconfig(tmp_path / "k")
        client = await Client.from_kubeconfig(str(tmp_path / "k"))
        stack.push_async_callback(client.close)
        await install_crds(client, ["mignodes", "allocationclaims"], [CLAIMS, MIG_NODES])
        operator = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        install_allocator(operator, settings=Settings(retry=1.0))
        agents = {}
        for node in (HELD, FREE):
            m = Manager(client, ManagerOptions(namespace=None, metrics_bind_address="0", health_probe_bind_address="0"))
            backend = MigBackend(FakeNVML.from_spec("A100-40GB:2", node, state_file=state / f"{node}.json"))
            settings = mig_agent.AgentSettings(grace=GRACE, heartbeat=0.5, backend_name="emulated")
            agents[node] = mig_agent.install(m, node, backend, plugin_dir=plugins / node, settings=settings)
            managers.append((m, asyncio.create_task(m.run())))
        managers.append((operator, asyncio.create_task(operator.run())))
        yield Cluster(client, agents, state)
    finally:
        for m, task in reversed(managers):
            m.request_stop()
            await asyncio.wait_for(task, 15)
        await stack.aclose()
        shutil.rmtree(plugins, ignore_errors=True)


def gated_pod(name: str, profile: str) -> dict[str, Any]:
    """A pod as our webhook leaves it: asking for gpuops.io/mig-<profile>, gated for the allocator."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"sim.gpuops.io/runtime-seconds": "600"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "schedulingGates": [{"name": GATE}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {f"gpuops.io/mig-{profile}": "1"}}}]}}


async def label(client: Client, node: str, labels: dict[str, str | None]) -> None:
    await client.patch(NODES, node, {"metadata": {"labels": labels}})


async def conflict_of(client: Client, node: str) -> Any:
    mn: MigNode = await client.get(MIG_NODES, node)
    return cond.get_condition(mn.status.conditions, CONDITION)


async def test_a_node_the_mig_manager_acts_on_is_left_alone_and_handed_back(tmp_path: Path) -> None:
    async with running(tmp_path) as c:
        client = c.client

        async def reported() -> bool:
            _, nodes = await client.list(MIG_NODES)
            return len(nodes) == 2 and all(len(n.status.gpus) == 2 for n in nodes)

        await until("both agents report their GPUs", reported)
        await label(client, HELD, {MIG_CONFIG: "all-1g.5gb", MIG_CONFIG_STATE: "success"})
        await label(client, FREE, {MIG_CONFIG: "all-disabled"})  # the GPU Operator's default alone: inert

        async def held() -> Any:
            found = await conflict_of(client, HELD)
            return found if found is not None and found.status == "True" else None

        found = await until("ConflictDetected on the held node's MigNode", held)
        assert found.reason == "MigManagerOnNode" and "nvidia.com/gpu.deploy.mig-manager=false" in found.message

        # NVIDIA's MIG manager makes a slice there; our agent, once it holds, must leave it past its orphan grace
        gpu = (await client.get(MIG_NODES, HELD)).status.gpus[0].uuid
        other_tool = MigBackend(FakeNVML.from_spec("A100-40GB:2", HELD, state_file=c.state / f"{HELD}.json"))
        with other_tool:
            made = other_tool.create(gpu, "1g.5gb", 0)
            since = time.monotonic()
            agent = c.agents[HELD]

            async def held_past_grace() -> bool:
                return agent.held is not None and agent.held_at is not None and agent.held_at > since + GRACE + 0.5

            await until("the agent held its hands past the orphan grace", held_past_grace)
            assert [(s.gpu_uuid, s.start, s.profile) for s in other_tool.slices()] == [(gpu, 0, "1g.5gb")]

            # a pod asking for a slice is planned on the other node only
            await client.create(PODS, gated_pod("infer", "3g.20gb"), NS)

            async def planned() -> list[Any]:
                _, claims = await client.list(CLAIMS, namespace=NS)
                return claims

            claims = await until("the pod's slice planned", planned)
            assert [cl.spec.node_name for cl in claims] == [FREE]
            assert await conflict_of(client, FREE) is None  # all-disabled alone is no conflict

            _, events = await client.list(EVENTS, namespace="default")
            warned = [e for e in events if e.reason == "MigManagerOnNode"]
            assert len(warned) == 1 and warned[0].involved_object.kind == "Node"
            assert warned[0].involved_object.name == HELD and warned[0].type == "Warning"

            # the labels go (one owner chosen): the node is gpuops' again, and the slice nobody claims is freed
            await label(client, HELD, {MIG_CONFIG: None, MIG_CONFIG_STATE: None})

            async def released() -> bool:
                found = await conflict_of(client, HELD)
                return found is not None and found.status == "False" and agent.held is None

            await until("ConflictDetected False and the agent no longer held", released)

            async def freed() -> bool:
                return not [s for s in other_tool.slices() if s.gpu_instance_id == made.gpu_instance_id]

            await until("the unclaimed slice destroyed after its grace", freed, within=GRACE + 10)


async def test_a_pod_that_fits_only_on_held_nodes_says_why(tmp_path: Path) -> None:
    async with running(tmp_path) as c:
        client = c.client

        async def reported() -> bool:
            _, nodes = await client.list(MIG_NODES)
            return len(nodes) == 2

        await until("both agents report", reported)
        for node in (HELD, FREE):  # a device plugin with the mixed strategy on both
            await label(client, node, {"nvidia.com/mig.strategy": "mixed"})

        async def both_held() -> bool:
            return all([(f := await conflict_of(client, n)) is not None and f.reason == "DevicePluginMigStrategy"
                        for n in (HELD, FREE)])

        await until("both MigNodes held", both_held)
        await client.create(PODS, gated_pod("waits", "1g.5gb"), NS)

        async def why() -> Any:
            p = await client.get(PODS, "waits", NS)
            found = cond.get_condition(p.status.conditions, MIG_SLICES)
            return found if found is not None and found.reason == "MigManagerConflict" else None

        await until("the pod says why it waits", why)
        _, claims = await client.list(CLAIMS, namespace=NS)
        assert claims == []

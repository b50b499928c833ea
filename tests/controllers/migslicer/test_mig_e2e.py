"""The whole MIG path on the emulated cluster: a pod asking for `nvidia.com/mig-3g.20gb` is renamed and gated by our
webhook (over HTTPS, CA patched in by the operator), planned by the allocator, its slice made by the node agent on
an NVML-shaped fake, offered to the simulated kubelet through the agent's device plugin (gRPC over a unix socket),
then the pod is ungated, bound by the scheduler, and started with `NVIDIA_VISIBLE_DEVICES=MIG-<uuid>` from the
plugin's Allocate. When it finishes, the slice is destroyed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import install_crds, until

from gpuops.controllers.migslicer import webhook
from gpuops.controllers.migslicer.agent import agent as mig_agent
from gpuops.controllers.migslicer.agent.gpus import MigBackend
from gpuops.controllers.migslicer.allocator import Settings
from gpuops.controllers.migslicer.api import CLAIMS, GATE, MIG_NODES, AllocationClaim, MigNode
from gpuops.controllers.migslicer.setup import install as install_allocator
from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError
from gpuops.kube.manager import Manager
from gpuops.kube.resources import PODS
from gpuops.sim.cluster.cluster import SimCluster
from gpuops.sim.scenario import parse

ROOT = Path(__file__).resolve().parents[3]
WEBHOOK = ROOT / "manifests" / "webhook" / "mutatingwebhookconfiguration.yaml"
NS = "work"
NODES = ("mig-0", "mig-1")

pytestmark = pytest.mark.anyio

SCENARIO = {
    "name": "mig-e2e",
    "namespaces": [NS, "gpuops-system"],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "mig", "gpuModel": "A100-40GB", "gpusPerNode": 2, "count": 2}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def running(tmp_path: Path, *, kubelet_dir_missing: bool = False,
                  ) -> AsyncIterator[tuple[SimCluster, Client, Path]]:
    """The cluster, our webhook and allocator, and one agent per node. `kubelet_dir_missing`: the agents are
    pointed at a directory where no kubelet listens (a DaemonSet whose device-plugins mount is wrong)."""
    plugins = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # unix socket paths must stay short
    state = tmp_path / "gpus"
    state.mkdir()
    port = free_port()
    stack = contextlib.AsyncExitStack()
    try:
        cluster = await stack.enter_async_context(
            SimCluster(parse(SCENARIO), workload=False, device_plugin_root=plugins))
        cluster.write_kubeconfig(tmp_path / "k")
        cluster.server.service_endpoints[("gpuops-system", "gpuops-webhook")] = f"127.0.0.1:{port}"
        client = await Client.from_kubeconfig(str(tmp_path / "k"))
        stack.push_async_callback(client.close)
        await client.request("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                             body=json.dumps(yaml.safe_load(WEBHOOK.read_text())).encode(),
                             content_type="application/json")
        await install_crds(client, ["mignodes", "allocationclaims"], [CLAIMS, MIG_NODES])
        managers: list[tuple[Manager, asyncio.Task[None]]] = []
        operator = Manager(client, metrics_bind_address="0", health_probe_bind_address="0")
        install_allocator(operator, settings=Settings(retry=1.0, advertise_timeout=1.0))
        webhook.install(operator, host="127.0.0.1", port=port, ca_check_interval=0.5)
        for node in NODES:  # one agent per node, each with its own client as a DaemonSet pod would have
            agent_client = await Client.from_kubeconfig(str(tmp_path / "k"))
            stack.push_async_callback(agent_client.close)
            m = Manager(agent_client, namespace=None, metrics_bind_address="0", health_probe_bind_address="0")
            backend = MigBackend.emulated("A100-40GB:2", node, state_file=state / f"{node}.json")
            plugin_dir = plugins / ("nowhere" if kubelet_dir_missing else "") / node
            mig_agent.install(m, node, backend, plugin_dir=plugin_dir,
                              settings=mig_agent.AgentSettings(grace=2.0, heartbeat=2.0, backend_name="emulated"))
            managers.append((m, asyncio.create_task(m.run())))
        managers.append((operator, asyncio.create_task(operator.run())))
        try:
            yield cluster, client, plugins
        finally:
            for m, task in reversed(managers):
                m.request_stop()
                await asyncio.wait_for(task, 15)
    finally:
        await stack.aclose()
        shutil.rmtree(plugins, ignore_errors=True)


async def create_once_admitted(client: Client, body: dict[str, Any]) -> None:
    """Create the pod, retrying until our webhook admits it (its CA is patched in asynchronously at start)."""
    async def admitted() -> bool:
        try:
            await client.create(PODS, body, NS)
        except ApiError:
            return False
        return True

    await until("the webhook admits the pod", admitted)


async def claim_table(client: Client) -> list[dict[str, Any]]:
    """The claims as `kubectl get allocationclaims -o wide` gets them (the server's Table), one dict per row by
    column name."""
    raw = await client.request("GET", f"/apis/gpuops.io/v1alpha1/namespaces/{NS}/allocationclaims",
                               accept="application/json;as=Table;v=v1;g=meta.k8s.io")
    table = json.loads(raw)
    names = [c["name"] for c in table["columnDefinitions"]]
    return [dict(zip(names, row["cells"], strict=True)) for row in table["rows"]]


def blank(rows: list[dict[str, Any]]) -> list[str]:
    return [f"{r['Name']}: {column}" for r in rows for column, cell in r.items() if cell in (None, "")]


def nvidia_pod(name: str, profile: str, runtime: float = 1.0) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"sim.gpuops.io/runtime-seconds": str(runtime)}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]}}


async def test_mig_pod_end_to_end(tmp_path: Path) -> None:
    async with running(tmp_path) as (cluster, client, _plugins):
        async def reported() -> bool:
            _, nodes = await client.list(MIG_NODES)
            return len(nodes) == 2 and all(len(n.status.gpus) == 2 for n in nodes)

        await until("both agents report their GPUs", reported)

        await create_once_admitted(client, nvidia_pod("infer", "3g.20gb"))
        pod = await client.get(PODS, "infer", NS)
        limits = pod.spec.containers[0].resources.limits if pod.spec.containers[0].resources else None
        assert limits == {"gpuops.io/mig-3g.20gb": "1"}

        async def ran() -> bool:
            p = await client.get(PODS, "infer", NS)
            return p.status.phase in ("Running", "Succeeded")

        await until("the pod runs", ran)
        pod = await client.get(PODS, "infer", NS)
        assert not pod.spec.scheduling_gates or all(g.name != GATE for g in pod.spec.scheduling_gates)
        _, claims = await client.list(CLAIMS, namespace=NS)
        (claim,) = claims
        assert isinstance(claim, AllocationClaim) and claim.spec.node_name == pod.spec.node_name
        env = cluster.kubelets.allocations[(NS, "infer")]
        assert env["NVIDIA_VISIBLE_DEVICES"] == claim.status.device_uuid
        assert claim.status.device_uuid.startswith("MIG-")

        async def bound_or_released() -> bool:
            _, cs = await client.list(CLAIMS, namespace=NS)
            return bool(cs) and cs[0].status.phase in ("Bound", "Released")

        await until("the claim is Bound (the kubelet's Allocate reached the agent)", bound_or_released)
        rows = await claim_table(client)
        assert rows and not blank(rows), rows
        assert rows[0]["Phase"] in ("Bound", "Released") and rows[0]["Message"], rows

        async def slice_gone() -> bool:
            p = await client.get(PODS, "infer", NS)
            mn: MigNode = await client.get(MIG_NODES, claim.spec.node_name)
            return p.status.phase == "Succeeded" and not any(g.slices for g in mn.status.gpus)

        await until("the pod finished and its slice is destroyed", slice_gone)


async def test_a_slice_no_kubelet_was_offered_is_not_advertised_and_the_pod_says_so(tmp_path: Path) -> None:
    """The agents' device plugins cannot register (no kubelet at their path): the slice is made, the claim never
    says `advertised`, and the pod's condition names the cause instead of waiting in silence."""
    async with running(tmp_path, kubelet_dir_missing=True) as (_cluster, client, _plugins):
        await create_once_admitted(client, nvidia_pod("stuck", "3g.20gb"))

        async def flagged() -> str | None:
            p = await client.get(PODS, "stuck", NS)
            mine = [c for c in p.status.conditions or () if c.type == "gpuops.io/MigSlices"]
            return mine[0].message if mine and mine[0].reason == "DeviceNotAdvertised" else None

        message = await until("the pod is DeviceNotAdvertised", flagged)
        assert "offer the slice(s) to the kubelet" in message and "device plugin is not registered" in message
        _, claims = await client.list(CLAIMS, namespace=NS)
        (claim,) = claims
        assert claim.status.phase == "Created" and claim.status.device_uuid.startswith("MIG-")
        assert not claim.status.advertised
        assert claim.status.message == f"slice {claim.status.device_uuid} made on {claim.spec.node_name}"
        rows = await claim_table(client)
        assert not blank(rows) and rows[0]["Message"] == claim.status.message, rows
        pod = await client.get(PODS, "stuck", NS)
        assert any(g.name == GATE for g in pod.spec.scheduling_gates or ())

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
from gpuops.controllers.migslicer.api import CLAIMS, GATE, MIG_NODES, AllocationClaim, MigNode
from gpuops.controllers.migslicer.settings import Settings
from gpuops.controllers.migslicer.setup import install as install_allocator
from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, Forbidden
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.fakenvml import FakeNVML
from gpuops_sim.scenario import parse

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


AGENT_POLICY = ROOT / "manifests" / "agent" / "node-confinement.yaml"


async def confine_agents(client: Client, tmp_path: Path) -> None:
    """Install the shipped node-confinement policy, and for each node a kubeconfig `agent-<node>.kubeconfig`
    whose token (the agent's ServiceAccount's) is bound to that node, as the kubelet's would be."""
    for doc in yaml.safe_load_all(AGENT_POLICY.read_text()):
        plural = "validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy" else \
            "validatingadmissionpolicybindings"
        await client.request("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}",
                             body=json.dumps(doc).encode(), content_type="application/json")
    await client.request("POST", "/api/v1/namespaces", body=json.dumps({"metadata": {"name": "gpuops-node"}}).encode(),
                         content_type="application/json")
    await client.request("POST", "/api/v1/namespaces/gpuops-node/serviceaccounts",
                         body=json.dumps({"metadata": {"name": "gpuops-mig-agent"}}).encode(),
                         content_type="application/json")
    admin = yaml.safe_load((tmp_path / "k").read_text())
    for node in NODES:
        answer = await client.request(
            "POST", "/api/v1/namespaces/gpuops-node/serviceaccounts/gpuops-mig-agent/token",
            body=json.dumps({"spec": {"boundObjectRef": {"kind": "Node", "apiVersion": "v1", "name": node}}}).encode(),
            content_type="application/json")
        config = dict(admin, users=[{"name": u["name"], "user": {"token": json.loads(answer)["status"]["token"]}}
                                    for u in admin["users"]])
        (tmp_path / f"agent-{node}.kubeconfig").write_text(yaml.safe_dump(config))


@asynccontextmanager
async def running(tmp_path: Path, *, kubelet_dir_missing: bool = False, confined: bool = False,
                  ) -> AsyncIterator[tuple[SimCluster, Client, Path]]:
    """The cluster, our webhook and allocator, and one agent per node. `kubelet_dir_missing`: the agents are
    pointed at a directory where no kubelet listens (a DaemonSet whose device-plugins mount is wrong).
    `confined`: each agent runs with its node-bound token under the shipped node-confinement policy."""
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
        if confined:
            await confine_agents(client, tmp_path)
        managers: list[tuple[Manager, asyncio.Task[None]]] = []
        operator = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        install_allocator(operator, settings=Settings(retry=1.0, advertise_timeout=1.0))
        webhook.install(operator, host="127.0.0.1", port=port, ca_check_interval=0.5)
        for node in NODES:  # one agent per node, each with its own client as a DaemonSet pod would have
            agent_client = await Client.from_kubeconfig(
                str(tmp_path / (f"agent-{node}.kubeconfig" if confined else "k")))
            stack.push_async_callback(agent_client.close)
            m = Manager(agent_client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
            backend = MigBackend(FakeNVML.from_spec("A100-40GB:2", node, state_file=state / f"{node}.json"))
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


async def test_an_agent_cannot_touch_another_nodes_claims_and_the_pod_there_keeps_running(tmp_path: Path) -> None:
    """Every agent runs under the shipped node-confinement policy with a token bound to its node (and the MIG
    path works through it). mig-0's token then tries to fail mig-1's claim and to rewrite mig-1's MigNode: both
    are refused 403 with the policy's words, and the pod on mig-1 keeps running while mig-1's agent goes on
    reporting (its heartbeats, which wake the allocator, are the proof that it looked)."""
    async with running(tmp_path, confined=True) as (_cluster, client, _plugins):
        async def reported() -> bool:
            _, nodes = await client.list(MIG_NODES)
            return len(nodes) == 2 and all(len(n.status.gpus) == 2 for n in nodes)

        await until("both confined agents report their GPUs", reported)
        body = nvidia_pod("victim", "3g.20gb", runtime=120.0)
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "mig-1"}
        await create_once_admitted(client, body)

        async def bound() -> AllocationClaim | None:
            p = await client.get(PODS, "victim", NS)
            _, cs = await client.list(CLAIMS, namespace=NS)
            return cs[0] if p.status.phase == "Running" and cs and cs[0].status.phase == "Bound" else None

        claim = await until("the pod running on mig-1 with its claim Bound", bound, 30)
        assert claim.spec.node_name == "mig-1"
        intruder = await Client.from_kubeconfig(str(tmp_path / "agent-mig-0.kubeconfig"))
        try:
            with pytest.raises(Forbidden) as refused:
                await intruder.patch(CLAIMS, claim.metadata.name, {"status": {"phase": "Failed", "message": "forged"}},
                                     namespace=NS, subresource="status")
            assert ("ValidatingAdmissionPolicy 'gpuops-mig-agent-own-node' with binding 'gpuops-mig-agent-own-node' "
                    "denied request: the MIG agent of node mig-0 may write only claims placed on that node, not "
                    f"{NS}/{claim.metadata.name}") in str(refused.value), refused.value
            with pytest.raises(Forbidden) as refused:
                await intruder.patch(MIG_NODES, "mig-1", {"status": {"gpus": []}}, subresource="status")
            assert "may write only MigNode mig-0, not mig-1" in str(refused.value), refused.value
        finally:
            await intruder.close()
        seen: MigNode = await client.get(MIG_NODES, "mig-1")

        async def beat_again() -> bool:
            mn: MigNode = await client.get(MIG_NODES, "mig-1")
            return (mn.status.heartbeat or "") > (seen.status.heartbeat or "") and \
                (await client.get(MIG_NODES, "mig-1")).metadata.resource_version != seen.metadata.resource_version

        await until("mig-1's agent reporting again after the attempts", beat_again, 10)
        p = await client.get(PODS, "victim", NS)
        _, cs = await client.list(CLAIMS, namespace=NS)
        assert p.status.phase == "Running" and p.metadata.deletion_timestamp is None
        assert [c.status.phase for c in cs] == ["Bound"]

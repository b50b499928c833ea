"""The node agent against the emulated API server and the NVML-shaped fake (no kubelet): it makes the slices its
node's claims ask for, adopts a slice an earlier agent made, re-makes slices a reboot took (and fails claims whose
pods held them), destroys released and orphaned slices, and reports all of it in the node's MigNode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from waiting import install_crds, until

from gpuops.controllers.migslicer.agent import agent as mig_agent
from gpuops.controllers.migslicer.agent.gpus import MigBackend
from gpuops.controllers.migslicer.api import (
    ADVERTISE,
    CLAIMS,
    MIG_NODES,
    NODE_LABEL,
    AllocationClaim,
    MigGPU,
    MigNode,
    resource_of_profile,
)
from gpuops.kube.client import Client
from gpuops.kube.deviceplugin.server import preferred_allocation
from gpuops.kube.errors import NotFound
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops_sim.apiserver import APIServer
from gpuops_sim.fakenvml import FakeNVML, gpu_uuid

NODE = "n1"
NS = "default"
G0 = gpu_uuid(NODE, 0)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"



@asynccontextmanager
async def agent_running(tmp_path: Path, grace: float = 0.5) -> AsyncIterator[tuple[Client, mig_agent.NodeAgent]]:
    async with APIServer() as server:
        server.write_kubeconfig(tmp_path / "k")
        client = await Client.from_kubeconfig(str(tmp_path / "k"))
        await install_crds(client, ["mignodes", "allocationclaims"], [CLAIMS, MIG_NODES])
        mgr = Manager(client, ManagerOptions(namespace=None, metrics_bind_address="0", health_probe_bind_address="0"))
        backend = MigBackend(FakeNVML.from_spec("A100-40GB:2", NODE, state_file=tmp_path / "gpus.json"))
        agent = mig_agent.install(mgr, NODE, backend, settings=mig_agent.AgentSettings(
            grace=grace, heartbeat=0.3, backend_name="emulated"))
        task = asyncio.create_task(mgr.run())
        try:
            yield client, agent
        finally:
            mgr.request_stop()
            await asyncio.wait_for(task, 10)
            await client.close()


async def claim(client: Client, name: str, profile: str, start: int, size: int, gpu: str = G0) -> AllocationClaim:
    body: dict[str, Any] = {
        "apiVersion": "gpuops.io/v1alpha1", "kind": "AllocationClaim",
        "metadata": {"name": name, "namespace": NS, "labels": {NODE_LABEL: NODE}},
        "spec": {"podName": f"pod-{name}", "podUID": f"uid-{name}", "nodeName": NODE, "gpuUUID": gpu,
                 "profile": profile, "start": start, "size": size},
    }
    made: AllocationClaim = await client.create(CLAIMS, body, namespace=NS)
    return made


async def phase(client: Client, name: str, want: str) -> AllocationClaim | None:
    c: AllocationClaim = await client.get(CLAIMS, name, NS)
    return c if c.status.phase == want else None


def driver(tmp_path: Path) -> FakeNVML:
    """Another handle on the same emulated driver (the state file), as a second process would have."""
    return FakeNVML.from_spec("A100-40GB:2", NODE, state_file=tmp_path / "gpus.json")


async def test_claims_become_slices_and_the_node_is_reported(tmp_path: Path) -> None:
    async with agent_running(tmp_path) as (client, _):
        await claim(client, "a", "3g.20gb", 4, 4)
        await claim(client, "b", "4g.20gb", 0, 4)
        a = await until("a Created", lambda: phase(client, "a", "Created"))
        b = await until("b Created", lambda: phase(client, "b", "Created"))
        assert a.status.device_uuid.startswith("MIG-") and a.status.device_uuid != b.status.device_uuid

        async def reported() -> MigNode | None:
            try:
                mn: MigNode = await client.get(MIG_NODES, NODE)
            except NotFound:
                return None
            slices = [s for g in mn.status.gpus for s in g.slices]
            return mn if len(slices) == 2 else None

        mn = await until("MigNode lists both slices", reported)
        assert mn.status.backend == "emulated" and len(mn.status.gpus) == 2
        assert {s.claim for g in mn.status.gpus for s in g.slices} == {f"{NS}/a", f"{NS}/b"}
        assert all(g.mig_mode == "Enabled" and g.model == "A100-40GB" for g in mn.status.gpus)


async def test_adopts_a_slice_made_before_a_crash(tmp_path: Path) -> None:
    with MigBackend(driver(tmp_path)) as other:  # an earlier agent made it, then died before writing Created
        made = other.create(G0, "2g.10gb", 0)
    async with agent_running(tmp_path) as (client, _):
        await claim(client, "c", "2g.10gb", 0, 2)
        c = await until("c Created", lambda: phase(client, "c", "Created"))
        assert c.status.device_uuid == made.device_uuid  # adopted, not made twice
        with MigBackend(driver(tmp_path)) as other:
            assert len([s for s in other.slices() if s.gpu_uuid == G0]) == 1


async def test_reboot_remakes_created_slices_and_fails_bound_ones(tmp_path: Path) -> None:
    async with agent_running(tmp_path) as (client, _):
        await claim(client, "made", "1g.5gb", 0, 1)
        await claim(client, "used", "1g.5gb", 1, 1)
        await until("made Created", lambda: phase(client, "made", "Created"))
        await until("used Created", lambda: phase(client, "used", "Created"))
        await client.patch(CLAIMS, "used", {"status": {"phase": "Bound"}}, namespace=NS, subresource="status")
        driver(tmp_path).reboot()  # MIG instances do not survive a reboot
        failed = await until("used Failed", lambda: phase(client, "used", "Failed"))
        assert "lost its MIG device" in failed.status.message

        async def remade() -> bool:
            with MigBackend(driver(tmp_path)) as other:
                return any(s.start == 0 and s.profile == "1g.5gb" for s in other.slices())

        await until("the Created claim's slice made again", remade)
        assert (await client.get(CLAIMS, "made", NS)).status.phase == "Created"


async def test_released_and_orphaned_slices_are_destroyed(tmp_path: Path) -> None:
    with MigBackend(driver(tmp_path)) as other:
        other.create(G0, "1g.5gb", 6)  # no claim will ever name it
    async with agent_running(tmp_path, grace=0.5) as (client, _):
        await claim(client, "r", "3g.20gb", 0, 4)
        await until("r Created", lambda: phase(client, "r", "Created"))
        await client.patch(CLAIMS, "r", {"status": {"phase": "Released"}}, namespace=NS, subresource="status")

        async def empty() -> bool:
            with MigBackend(driver(tmp_path)) as other:
                return not other.slices()

        await until("the released and the orphaned slice are gone", empty)


async def test_a_claim_planned_over_a_released_slice_is_made_in_the_same_pass(tmp_path: Path) -> None:
    """The allocator plans on a Released claim's placement before the agent destroys its slice. An agent that
    finds both at once (here: the release and the new claim made while it was down) destroys the released
    slice first and makes the new one in that pass, not after a failed attempt and its retry delay."""
    async with APIServer() as server:
        server.write_kubeconfig(tmp_path / "k")
        client = await Client.from_kubeconfig(str(tmp_path / "k"))
        await install_crds(client, ["mignodes", "allocationclaims"], [CLAIMS, MIG_NODES])

        async def agent_for(check: Any) -> None:
            mgr = Manager(client, ManagerOptions(namespace=None, metrics_bind_address="0",
                                                 health_probe_bind_address="0"))
            backend = MigBackend(FakeNVML.from_spec("A100-40GB:2", NODE, state_file=tmp_path / "gpus.json"))
            mig_agent.install(mgr, NODE, backend, settings=mig_agent.AgentSettings(
                grace=60.0, heartbeat=30.0, retry=60.0, backend_name="emulated"))
            task = asyncio.create_task(mgr.run())
            try:
                await check()
            finally:
                mgr.request_stop()
                await asyncio.wait_for(task, 10)

        await claim(client, "old", "7g.40gb", 0, 8)
        await agent_for(lambda: until("old Created", lambda: phase(client, "old", "Created")))
        # while the agent is down: the pod finished (Released) and the next one was planned over its slice
        await client.patch(CLAIMS, "old", {"status": {"phase": "Released"}}, namespace=NS, subresource="status")
        await claim(client, "next", "3g.20gb", 4, 4)
        await agent_for(lambda: until("next Created before any retry", lambda: phase(client, "next", "Created"),
                                      within=15))
        with MigBackend(driver(tmp_path)) as other:
            assert [(s.start, s.profile) for s in other.slices() if s.gpu_uuid == G0] == [(4, "3g.20gb")]
        await client.close()


@pytest.mark.parametrize(("profile", "start", "size"), [("7g.40gb", 0, 8), ("3g.20gb", 4, 4)])
async def test_a_released_slice_still_in_use_is_neither_taken_over_nor_fatal(
        tmp_path: Path, profile: str, start: int, size: int) -> None:
    """A force-deleted pod's processes may still hold its slice when a new claim is planned there. The new claim
    must not take that slice over (same profile and start), and a slice in the way that cannot be destroyed yet
    must not fail the agent's pass (other claims, the offer and the report go on): it is made once it is free."""
    async with agent_running(tmp_path) as (client, _):
        await claim(client, "old", "7g.40gb", 0, 8)
        old = await until("old Created", lambda: phase(client, "old", "Created"))
        nvml = driver(tmp_path)
        with MigBackend(driver(tmp_path)) as other:
            gi = next(x.gpu_instance_id for x in other.slices() if x.device_uuid == old.status.device_uuid)
        assert gi is not None
        nvml.set_busy(0, gi)  # a process of the old pod still runs on it
        await client.patch(CLAIMS, "old", {"status": {"phase": "Released"}}, namespace=NS, subresource="status")
        await claim(client, "new", profile, start, size)
        await claim(client, "elsewhere", "1g.5gb", 0, 1, gpu=gpu_uuid(NODE, 1))
        await until("a claim on the other GPU is made meanwhile", lambda: phase(client, "elsewhere", "Created"))
        beat = (await client.get(MIG_NODES, NODE)).status.heartbeat
        await until("the agent reports on", lambda: _reported_after(client, beat))
        new = await client.get(CLAIMS, "new", NS)
        assert new.status.phase in ("", "Pending"), new.status  # not Created on the busy slice, not Failed
        nvml.set_busy(0, gi, busy=False)  # the old pod's process exits
        made = await until("new made once the old slice is free", lambda: phase(client, "new", "Created"))
        assert made.status.message.endswith(f"made on {NODE}"), made.status.message  # made anew, not taken over


async def _reported_after(client: Client, beat: str | None) -> bool:
    mn: MigNode = await client.get(MIG_NODES, NODE)
    return mn.status.heartbeat != beat


async def test_an_orphan_in_the_way_is_cleared_for_a_claim(tmp_path: Path) -> None:
    with MigBackend(driver(tmp_path)) as other:
        other.create(G0, "1g.5gb", 0)  # left behind by a deleted claim
    async with agent_running(tmp_path, grace=60.0) as (client, _):
        await claim(client, "big", "7g.40gb", 0, 8)
        big = await until("big Created", lambda: phase(client, "big", "Created"))
        assert big.status.device_uuid


async def test_slices_made_for_the_next_pod_are_preferred_over_a_freed_bound_one(tmp_path: Path) -> None:
    """A pod ends and the kubelet frees its Bound slice before the allocator withdraws it, while the same
    profile's slice made for the next pod is offered: the kubelet asks GetPreferredAllocation, and the agent
    proposes the slice made for the pod being admitted, not the one that just came free."""
    async with agent_running(tmp_path) as (client, agent):
        for name, start in (("old", 0), ("new", 1)):
            await claim(client, name, "1g.5gb", start, 1)
            await client.patch(CLAIMS, name, {"metadata": {"annotations": {ADVERTISE: "1"}}}, namespace=NS)
        old = await until("old offered", lambda: advertised(client, "old"))
        new = await until("new offered", lambda: advertised(client, "new"))
        await client.patch(CLAIMS, "old", {"status": {"phase": "Bound"}}, namespace=NS, subresource="status")
        resource = resource_of_profile("1g.5gb")

        async def bound_seen() -> bool:
            c = agent.claims.store.get(f"{NS}/old")
            return c is not None and c.status.phase == "Bound"

        await until("the agent's cache sees old Bound", bound_seen)
        devices = agent._devices(resource)
        available = sorted(d.id for d in devices)  # both free in the kubelet's view
        assert preferred_allocation(devices, available, [], 1) == [new.status.device_uuid]
        assert {d.id for d in devices} == {old.status.device_uuid, new.status.device_uuid}


async def advertised(client: Client, name: str) -> AllocationClaim | None:
    c: AllocationClaim = await client.get(CLAIMS, name, NS)
    return c if c.status.phase == "Created" and c.status.advertised else None


def test_a_gpu_report_names_every_field_also_at_its_default() -> None:
    """A GPU with MIG disabled (as GPUs ship) says so: `migMode: Disabled` and its zero counts are on the wire,
    not left out as equal to their defaults (kubectl and the allocator's readers would see nothing)."""
    gpu = MigGPU(index=0, uuid="GPU-00000000-0000-0000-0000-000000000000", model="H200-141GB")
    wire = msgspec.to_builtins(gpu)
    assert wire["migMode"] == "Disabled" and wire["index"] == 0 and wire["slices"] == () and wire["memoryMiB"] == 0

"""The kubelet device-plugin API end to end over unix sockets: the agent's DevicePluginServer against our
kubelet-side KubeletDeviceManager, plus one raw client that uses only the generated stubs (wire compatibility
without kubelet.py). Every wait is a condition with a deadline."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuops.controllers.migslicer.agent.plugins import mig_allocation
from gpuops.controllers.migslicer.api import resource_of_profile
from gpuops.kube.deviceplugin import api_pb2 as pb
from gpuops.kube.deviceplugin import api_pb2_grpc as pb_grpc
from gpuops.kube.deviceplugin.server import (
    AllocationResult,
    Device,
    DevicePluginServer,
    preferred_allocation,
    socket_name,
)
from gpuops_sim.cluster.devicemanager import KubeletDeviceManager, is_extended_resource_name

pytestmark = pytest.mark.anyio

R1 = resource_of_profile("1g.10gb")
R2 = resource_of_profile("1g.10gb+me")
U = [f"MIG-{i}0000000-aaaa-bbbb-cccc-dddddddddddd" for i in range(6)]
DEADLINE = 5.0
POLL = 0.05


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sockdir(tmp_path: Path) -> Iterator[Path]:
    """tmp_path if a plugin socket fits in the 107 usable bytes of a unix socket path, else a short dir in /tmp."""
    if len(str(tmp_path / socket_name(R2))) <= 100:
        yield tmp_path
        return
    short = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


class Slices:
    """The agent's view of its slices: a mutable list the plugin reads on update()."""

    def __init__(self, *ids: str) -> None:
        self.items = [Device(i) for i in ids]

    def __call__(self) -> list[Device]:
        return list(self.items)


async def until(kubelet: KubeletDeviceManager, predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE):
        await kubelet.wait_until(predicate)


@pytest.fixture
async def kubelet(sockdir: Path) -> AsyncIterator[KubeletDeviceManager]:
    k = KubeletDeviceManager(sockdir)
    await k.start()
    try:
        yield k
    finally:
        await k.stop()


async def plugin(sockdir: Path, resource: str, slices: Slices, **kw: Any) -> DevicePluginServer:
    kw.setdefault("allocate", mig_allocation)
    p = DevicePluginServer(resource, sockdir, slices, poll_interval=POLL, **kw)
    await p.start()
    await p.register()
    return p


async def test_registration_handshake_and_version_check(sockdir: Path, kubelet: KubeletDeviceManager) -> None:
    p = await plugin(sockdir, R1, Slices(U[0], U[1]))
    try:
        assert p.endpoint == socket_name(R1) == "gpuops-gpuops.io_mig-1g.10gb.sock"
        assert kubelet.registered() == [R1]
        opts = kubelet.options(R1)
        assert opts is not None and opts.get_preferred_allocation_available and not opts.pre_start_required
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 2})

        async with grpc.aio.insecure_channel(f"unix:{kubelet.socket_path}") as ch:
            reg = pb_grpc.RegistrationStub(ch)
            for version, resource, word in (("v1alpha1", R1, "v1alpha1"), ("v1beta1", "mig-1g.10gb", "resource")):
                req = pb.RegisterRequest(version=version, endpoint=p.endpoint, resource_name=resource)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await reg.Register(req, timeout=DEADLINE)
                assert err.value.code() == grpc.StatusCode.UNKNOWN
                assert word in (err.value.details() or "")
            # A plugin that does not listen where it says is refused too.
            req = pb.RegisterRequest(version="v1beta1", endpoint="nobody.sock", resource_name="gpuops.io/x")
            with pytest.raises(grpc.aio.AioRpcError):
                await reg.Register(req, timeout=DEADLINE)
        assert kubelet.registered() == [R1]
    finally:
        await p.stop()
    assert is_extended_resource_name("gpuops.io/mig-1g.10gb-me")
    assert not is_extended_resource_name("kubernetes.io/mig") and not is_extended_resource_name("cpu")


async def test_list_and_watch_follows_device_changes(sockdir: Path) -> None:
    seen: list[str] = []
    kubelet = KubeletDeviceManager(sockdir, on_change=seen.append)
    await kubelet.start()
    slices = Slices(U[0], U[1])
    p = await plugin(sockdir, R1, slices)
    try:
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 2})
        slices.items.append(Device(U[2], numa_node=1))
        assert p.update() and not p.update()
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 3})
        assert kubelet.device_list(R1)[2] == Device(U[2], True, 1)

        slices.items[0] = Device(U[0], healthy=False)
        p.update()
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 2})
        assert kubelet.capacity() == {R1: 3}
        assert kubelet.devices[R1] == {U[0]: False, U[1]: True, U[2]: True}

        del slices.items[1:]
        p.update()
        await until(kubelet, lambda: kubelet.capacity() == {R1: 1})
        assert kubelet.allocatable() == {R1: 0}
        assert seen and set(seen) == {R1}
    finally:
        await p.stop()
        await kubelet.stop()


async def test_allocate_env_cdi_and_invalid_ids(sockdir: Path, kubelet: KubeletDeviceManager) -> None:
    slices = Slices(U[0], U[1], U[2])
    slices.items.append(Device(U[3], healthy=False))
    p = await plugin(sockdir, R1, slices)
    try:
        await until(kubelet, lambda: kubelet.capacity() == {R1: 4})
        got = await kubelet.allocate(R1, [U[1], U[0]])
        assert got.envs == {"NVIDIA_VISIBLE_DEVICES": f"{U[1]},{U[0]}"}
        assert got.cdi_devices == [f"nvidia.com/gpu={U[1]}", f"nvidia.com/gpu={U[0]}"]
        assert got.mounts == [] and got.devices == [] and got.annotations == {}

        for bad, word in (("MIG-nope", "unknown"), (U[3], "unhealthy")):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.allocate(R1, [U[0], bad])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert bad in (err.value.details() or "") and word in (err.value.details() or "")
        with pytest.raises(LookupError):
            await kubelet.allocate(R2, [U[0]])
        await kubelet.pre_start(R1, [U[0]])  # not required by the plugin: no call, no error
    finally:
        await p.stop()


async def test_async_allocate_callback_and_its_failure(sockdir: Path, kubelet: KubeletDeviceManager) -> None:
    async def allocate(ids: list[str]) -> AllocationResult:
        if ids == [U[1]]:
            raise RuntimeError("slice is being destroyed")
        base = mig_allocation(ids, cdi_kind="gpuops.io/mig")
        return AllocationResult(base.envs, base.cdi_devices, {"gpuops.io/claim": "ns/c-0"})

    p = await plugin(sockdir, R1, Slices(U[0], U[1]), allocate=allocate)
    try:
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 2})
        got = await kubelet.allocate(R1, [U[0]])
        assert got.cdi_devices == [f"gpuops.io/mig={U[0]}"] and got.annotations == {"gpuops.io/claim": "ns/c-0"}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.allocate(R1, [U[1]])
        assert err.value.code() == grpc.StatusCode.INTERNAL and "being destroyed" in (err.value.details() or "")
    finally:
        await p.stop()


async def test_preferred_allocation_honours_must_include(sockdir: Path, kubelet: KubeletDeviceManager) -> None:
    slices = Slices(*U[:4])
    p = await plugin(sockdir, R1, slices)
    try:
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 4})
        available = list(reversed(U[:4]))
        assert await kubelet.preferred(R1, available, [U[2]], 2) == [U[2], U[0]]
        assert await kubelet.preferred(R1, available, [U[3], U[1]], 3) == [U[3], U[1], U[0]]
        assert await kubelet.preferred(R1, available, [], 1) == [U[0]]
        assert await kubelet.preferred(R1, [U[1], U[3]], [], 4) == [U[1], U[3]]
    finally:
        await p.stop()
    devices = [Device("a"), Device("b", healthy=False), Device("c")]
    assert preferred_allocation(devices, ["c", "b", "a", "zz"], [], 3) == ["a", "c"]
    assert preferred_allocation(devices, ["a", "c"], ["b", "b"], 1) == ["b"]


async def test_kubelet_restart_plugin_reregisters_by_itself(sockdir: Path) -> None:
    first = KubeletDeviceManager(sockdir)
    await first.start()
    p = await plugin(sockdir, R1, Slices(U[0], U[1]))
    try:
        await until(first, lambda: first.allocatable() == {R1: 2})
        await first.stop()
        second = KubeletDeviceManager(sockdir)  # wipes the plugin's socket, like a starting kubelet
        await second.start()
        try:
            await until(second, lambda: second.allocatable() == {R1: 2})
            assert p.registrations == 2 and p.socket_path.is_socket()
            got = await second.allocate(R1, [U[1]])
            assert got.envs["NVIDIA_VISIBLE_DEVICES"] == U[1]
        finally:
            await second.stop()
    finally:
        await p.stop()


async def test_plugin_started_before_the_kubelet_registers_when_it_comes(sockdir: Path) -> None:
    p = DevicePluginServer(R1, sockdir, Slices(U[0]), mig_allocation, poll_interval=POLL)
    await p.start()
    try:
        with pytest.raises(grpc.aio.AioRpcError):
            await p.register()  # no kubelet.sock yet: fails now, keeps watching
        kubelet = KubeletDeviceManager(sockdir)
        await kubelet.start()
        try:
            await until(kubelet, lambda: kubelet.allocatable() == {R1: 1})
            assert p.registrations == 1
        finally:
            await kubelet.stop()
    finally:
        await p.stop()


async def test_plugin_stop_drops_resource_until_it_registers_again(
    sockdir: Path, kubelet: KubeletDeviceManager
) -> None:
    slices = Slices(U[0], U[1])
    p = await plugin(sockdir, R1, slices)
    await until(kubelet, lambda: kubelet.allocatable() == {R1: 2})
    await p.stop()
    await until(kubelet, lambda: kubelet.capacity() == {R1: 0})
    assert kubelet.allocatable() == {R1: 0} and kubelet.registered() == []
    assert not p.socket_path.exists()

    again = await plugin(sockdir, R1, slices)
    try:
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 2})
    finally:
        await again.stop()


async def test_plugin_dying_abruptly_drops_resource(sockdir: Path, kubelet: KubeletDeviceManager) -> None:
    p = await plugin(sockdir, R1, Slices(U[0]))
    try:
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 1})
        await p._server.stop(None)  # no graceful end of ListAndWatch: the stream breaks
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 0})
    finally:
        await p.stop()


async def test_two_plugins_at_once(sockdir: Path, kubelet: KubeletDeviceManager) -> None:
    a = await plugin(sockdir, R1, Slices(U[0], U[1]))
    b = await plugin(sockdir, R2, Slices(U[2]))
    try:
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 2, R2: 1})
        assert R2 == "gpuops.io/mig-1g.10gb-me" and kubelet.registered() == sorted([R1, R2])
        assert (await kubelet.allocate(R2, [U[2]])).cdi_devices == [f"nvidia.com/gpu={U[2]}"]
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.allocate(R2, [U[0]])  # R1's slice is not R2's
        await b.stop()
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 2, R2: 0})
    finally:
        await a.stop()
        await b.stop()


async def test_stale_socket_replaced_and_long_paths_refused(sockdir: Path, kubelet: KubeletDeviceManager) -> None:
    path = sockdir / socket_name(R1)
    path.write_text("left behind by a crashed agent")
    p = await plugin(sockdir, R1, Slices(U[0]))
    try:
        assert path.is_socket()
        await until(kubelet, lambda: kubelet.allocatable() == {R1: 1})
    finally:
        await p.stop()
    with pytest.raises(ValueError, match="107"):
        DevicePluginServer(R1, sockdir / ("d" * 100), Slices(), mig_allocation)


async def test_raw_grpc_client_wire_compatibility(sockdir: Path) -> None:
    """Talk to the plugin as any kubelet would, through the generated stubs only."""
    slices = Slices(U[0], U[1])
    p = DevicePluginServer(R1, sockdir, slices, mig_allocation)
    await p.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{p.socket_path}") as ch:
            stub = pb_grpc.DevicePluginStub(ch)
            opts = await stub.GetDevicePluginOptions(pb.Empty(), timeout=DEADLINE)
            assert opts.get_preferred_allocation_available and not opts.pre_start_required

            stream = stub.ListAndWatch(pb.Empty())
            async with asyncio.timeout(DEADLINE):
                first = await stream.read()
                assert [(d.ID, d.health, d.HasField("topology")) for d in first.devices] == [
                    (U[0], "Healthy", False),
                    (U[1], "Healthy", False),
                ]
                slices.items[1] = Device(U[1], healthy=False, numa_node=0)
                p.update()
                second = await stream.read()
            assert [(d.ID, d.health) for d in second.devices] == [(U[0], "Healthy"), (U[1], "Unhealthy")]
            assert [n.ID for n in second.devices[1].topology.nodes] == [0]
            stream.cancel()

            pref = await stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[U[0], U[1]], must_include_deviceIDs=[U[1]], allocation_size=2
                        ),
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=[U[0]], allocation_size=1),
                    ]
                ),
                timeout=DEADLINE,
            )
            assert [list(r.deviceIDs) for r in pref.container_responses] == [[U[1], U[0]], [U[0]]]

            alloc = await stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[U[0]])]),
                timeout=DEADLINE,
            )
            (resp,) = alloc.container_responses
            assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": U[0]}
            assert [c.name for c in resp.cdi_devices] == [f"nvidia.com/gpu={U[0]}"]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Allocate(
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["MIG-x"])]),
                    timeout=DEADLINE,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "MIG-x" in (err.value.details() or "")
            await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=[U[0]]), timeout=DEADLINE)
    finally:
        await p.stop()

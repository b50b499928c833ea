"""The kubelet's side of the device-plugin API (its "device manager"), for the simulated kubelet and the tests.

It behaves like the real one where plugins can tell: it serves `v1beta1.Registration` on `kubelet.sock`, refuses
other API versions and non-extended resource names, wipes stale sockets from its directory when it starts, dials
each registered plugin back, asks for its options and follows its ListAndWatch stream. A plugin whose stream ends
has its resource dropped to 0 until it registers again (the real kubelet first keeps the capacity for a grace
period, but allocatable drops at once, which is what scheduling sees). Unlike the real kubelet it does not choose
devices itself: callers pass the ids to `allocate`, optionally after asking `preferred`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
import structlog

from gpuops.kube.deviceplugin.server import (
    HEALTHY,
    KUBELET_SOCKET,
    VERSION,
    Device,
    absolute,
    check_socket_path,
    file_id,
    pb,
    pb_grpc,
    remove_stale,
)

__all__ = [
    "SUPPORTED_VERSIONS",
    "ContainerAllocation",
    "DeviceSpec",
    "KubeletDeviceManager",
    "Mount",
    "PluginOptions",
    "is_extended_resource_name",
]

log = structlog.get_logger("gpuops.controllers.migslicer.kubelet")

SUPPORTED_VERSIONS: Final = (VERSION,)
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """Like the kubelet's check: `domain/name`, a valid qualified name, outside `kubernetes.io`, not `requests.*`."""
    prefix, slash, rest = name.partition("/")
    if not slash or name.startswith("requests."):
        return False
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return False
    return (
        len(prefix) <= 253
        and _PREFIX.fullmatch(prefix) is not None
        and len(rest) <= 63
        and _NAME.fullmatch(rest) is not None
    )


@dataclass(frozen=True, slots=True)
class PluginOptions:
    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = ""


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """A ContainerAllocateResponse as plain data: what the runtime would add to the container."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[DeviceSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)


@dataclass(eq=False)
class _Plugin:
    resource: str
    endpoint: str
    channel: Any
    stub: Any
    options: PluginOptions
    task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.channel.close()


class KubeletDeviceManager:
    """Registration server plus one client per registered plugin, keyed by resource name.

    `on_change(resource)` (sync or async) runs after every change of a resource's devices, including the drop to 0
    when its plugin goes, so the simulated kubelet can patch the Node's capacity and allocatable.
    """

    def __init__(
        self,
        socket_dir: str | os.PathLike[str],
        on_change: Callable[[str], object] | None = None,
        *,
        clean_socket_dir: bool = True,
        dial_timeout: float = 10.0,
        rpc_timeout: float = 10.0,
        stop_grace: float = 1.0,
    ) -> None:
        self.socket_dir = absolute(socket_dir)
        self.socket_path = self.socket_dir / KUBELET_SOCKET
        check_socket_path(self.socket_path)
        self.on_change = on_change
        self._clean = clean_socket_dir
        self._dial_timeout = dial_timeout
        self._rpc_timeout = rpc_timeout
        self._stop_grace = stop_grace
        self._server: Any = None
        self._plugins: dict[str, _Plugin] = {}
        self._devices: dict[str, dict[str, Device]] = {}
        self._cond = asyncio.Condition()

    # ------------------------------------------------------------------------------------------ state

    @property
    def devices(self) -> dict[str, dict[str, bool]]:
        """resource -> {device id: healthy}."""
        return {r: {i: d.healthy for i, d in devs.items()} for r, devs in self._devices.items()}

    def device_list(self, resource: str) -> list[Device]:
        """The devices of `resource` as last streamed, with their NUMA node."""
        return list(self._devices.get(resource, {}).values())

    def capacity(self) -> dict[str, int]:
        """Every resource ever registered, counting healthy and unhealthy devices (0 while its plugin is gone)."""
        return {r: len(devs) for r, devs in self._devices.items()}

    def allocatable(self) -> dict[str, int]:
        """Healthy devices per resource."""
        return {r: sum(d.healthy for d in devs.values()) for r, devs in self._devices.items()}

    def registered(self) -> list[str]:
        """Resources with a connected plugin."""
        return sorted(self._plugins)

    def options(self, resource: str) -> PluginOptions | None:
        plugin = self._plugins.get(resource)
        return plugin.options if plugin else None

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds, re-checked after each change (bound it with a deadline, e.g.
        `asyncio.timeout`), so callers never sleep and hope."""
        async with self._cond:
            await self._cond.wait_for(predicate)

    # ------------------------------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Clear stale sockets (plugins must notice and come back) and serve Registration on kubelet.sock."""
        if self._server is not None:
            return
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self._clean:
            for entry in self.socket_dir.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISSOCK(entry.lstat().st_mode):
                        entry.unlink()
        remove_stale(self.socket_path)
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError as exc:
            await server.stop(None)
            raise OSError(f"kubelet device manager: cannot listen on {self.socket_path}: {exc}") from exc
        await server.start()
        self._server = server
        log.info("kubelet device manager serving", socket=str(self.socket_path))

    async def stop(self) -> None:
        """Stop accepting registrations and hang up on every plugin (their ListAndWatch streams get cancelled)."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(self._stop_grace)
        plugins = list(self._plugins.values())
        self._plugins.clear()
        self._devices.clear()
        for plugin in plugins:
            await plugin.close()

    # ------------------------------------------------------------------------------------------ registration

    async def register(self, request: Any) -> str:
        """Handle one RegisterRequest; returns "" on success, else why it was refused."""
        version, resource, endpoint = str(request.version), str(request.resource_name), str(request.endpoint)
        if version not in SUPPORTED_VERSIONS:
            supported = ", ".join(SUPPORTED_VERSIONS)
            return f"requested API version {version!r} is not supported by kubelet (supported: {supported})"
        if not is_extended_resource_name(resource):
            return f"invalid extended resource name {resource!r}"
        path = self.socket_dir / endpoint
        if file_id(path) is None:
            return f"device plugin {resource}: no socket at {path}"
        channel = grpc.aio.insecure_channel(f"unix:{path}")
        try:
            await asyncio.wait_for(channel.channel_ready(), self._dial_timeout)
            stub = pb_grpc.DevicePluginStub(channel)
            opts = await stub.GetDevicePluginOptions(pb.Empty(), timeout=self._rpc_timeout)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            await channel.close()
            return f"cannot dial device plugin {resource} at {path}: {exc}"
        plugin = _Plugin(
            resource,
            endpoint,
            channel,
            stub,
            PluginOptions(bool(opts.pre_start_required), bool(opts.get_preferred_allocation_available)),
        )
        old = self._plugins.pop(resource, None)
        if old is not None:
            await old.close()
        self._plugins[resource] = plugin
        self._devices.setdefault(resource, {})
        plugin.task = asyncio.create_task(self._follow(plugin), name=f"kubelet-listandwatch {resource}")
        log.info("device plugin registered", resource=resource, endpoint=endpoint)
        await self._changed(resource)
        return ""

    async def _follow(self, plugin: _Plugin) -> None:
        """Consume the plugin's ListAndWatch; when it ends (plugin stopped or died) its resource drops to 0."""
        try:
            async for response in plugin.stub.ListAndWatch(pb.Empty()):
                if self._plugins.get(plugin.resource) is not plugin:
                    return
                devices: dict[str, Device] = {}
                for d in response.devices:
                    numa = [int(n.ID) for n in d.topology.nodes] if d.HasField("topology") else []
                    devices[str(d.ID)] = Device(str(d.ID), d.health == HEALTHY, numa[0] if numa else None)
                self._devices[plugin.resource] = devices
                await self._changed(plugin.resource)
        except grpc.aio.AioRpcError as exc:
            log.info("device plugin stream broke", resource=plugin.resource, code=str(exc.code()))
        except Exception as exc:
            log.warning("device plugin stream failed", resource=plugin.resource, error=repr(exc))
        if self._plugins.get(plugin.resource) is plugin:
            del self._plugins[plugin.resource]
            self._devices[plugin.resource] = {}
            await plugin.close()
            await self._changed(plugin.resource)

    async def _changed(self, resource: str) -> None:
        async with self._cond:
            self._cond.notify_all()
        if self.on_change is not None:
            try:
                result = self.on_change(resource)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                log.warning("on_change failed", resource=resource, error=str(exc))

    # ------------------------------------------------------------------------------------------ device calls

    def _plugin(self, resource: str) -> _Plugin:
        plugin = self._plugins.get(resource)
        if plugin is None:
            raise LookupError(f"no device plugin registered for {resource}")
        return plugin

    async def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        """Allocate for one container, as the kubelet does when it creates it. The plugin's refusal surfaces as
        grpc.aio.AioRpcError (INVALID_ARGUMENT for an unknown or unhealthy id); LookupError if none registered."""
        plugin = self._plugin(resource)
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))])
        response = await plugin.stub.Allocate(request, timeout=self._rpc_timeout)
        if len(response.container_responses) != 1:
            raise ValueError(f"{resource}: plugin answered {len(response.container_responses)} containers, not 1")
        r = response.container_responses[0]
        return ContainerAllocation(
            envs={str(k): str(v) for k, v in r.envs.items()},
            mounts=[Mount(str(m.container_path), str(m.host_path), bool(m.read_only)) for m in r.mounts],
            devices=[DeviceSpec(str(d.container_path), str(d.host_path), str(d.permissions)) for d in r.devices],
            annotations={str(k): str(v) for k, v in r.annotations.items()},
            cdi_devices=[str(c.name) for c in r.cdi_devices],
        )

    async def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """The plugin's preferred devices for one container. Without the option (the kubelet would not ask), the
        answer is `must_include` then `available` in order, up to `size`."""
        plugin = self._plugin(resource)
        if not plugin.options.get_preferred_allocation_available:
            return list(dict.fromkeys([*must_include, *available]))[: max(size, len(set(must_include)))]
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available), must_include_deviceIDs=list(must_include), allocation_size=size
                )
            ]
        )
        response = await plugin.stub.GetPreferredAllocation(request, timeout=self._rpc_timeout)
        return [str(i) for r in response.container_responses for i in r.deviceIDs]

    async def pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        """PreStartContainer, only if the plugin asked for it at registration (as the kubelet does)."""
        plugin = self._plugin(resource)
        if plugin.options.pre_start_required:
            await plugin.stub.PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=list(device_ids)), timeout=self._rpc_timeout
            )


class _Registration:
    """The v1beta1.Registration service. Refusals use gRPC's UNKNOWN code, as the real kubelet's plain errors do."""

    def __init__(self, manager: KubeletDeviceManager) -> None:
        self.manager = manager

    async def Register(self, request: Any, context: Any) -> Any:
        problem = await self.manager.register(request)
        if problem:
            log.info("device plugin registration refused", resource=str(request.resource_name), reason=problem)
            await context.abort(grpc.StatusCode.UNKNOWN, problem)
        return pb.Empty()

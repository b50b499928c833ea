"""A kubelet device plugin (API v1beta1) for one extended resource, e.g. `gpuops.io/mig-1g.10gb`.

The owner (the MIG agent runs one per profile resource) tells the plugin which devices exist (`devices` callable +
`update()`); the plugin streams the full list to the kubelet on every change (ListAndWatch) and answers Allocate
through the owner's `allocate` callback. The plugin follows the kubelet's life cycle by itself: a restarted kubelet
recreates `kubelet.sock` (and wipes the plugin sockets beside it), so a poller re-binds our socket and registers
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

import grpc
import structlog

from . import api_pb2 as _api_pb2
from . import api_pb2_grpc as _api_pb2_grpc

__all__ = [
    "DEVICE_PLUGIN_DIR",
    "HEALTHY",
    "KUBELET_SOCKET",
    "UNHEALTHY",
    "VERSION",
    "AllocateFn",
    "AllocationResult",
    "Device",
    "DevicePluginServer",
    "DeviceSource",
    "preferred_allocation",
    "socket_name",
]

log = structlog.get_logger("gpuops.kube.deviceplugin")

# The generated modules build their classes at import time, so mypy cannot see their attributes: use them as Any.
pb: Any = _api_pb2
pb_grpc: Any = _api_pb2_grpc

VERSION: Final = "v1beta1"
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET: Final = "kubelet.sock"
MAX_SOCKET_PATH: Final = 107
"""sun_path holds 108 bytes including the NUL; gRPC refuses longer paths with an opaque bind error."""

FileId: TypeAlias = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Device:
    """One advertised device (its id at most 63 characters, per the API)."""

    id: str
    healthy: bool = True
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """What one container gets for its devices (the plugin adds no mounts or device nodes: CDI does that)."""

    envs: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: Sequence[str] = ()
    """Fully qualified CDI names, `vendor.com/class=name`."""
    annotations: Mapping[str, str] = field(default_factory=dict)


DeviceSource: TypeAlias = Callable[[], Iterable[Device]]
AllocateFn: TypeAlias = Callable[[list[str]], "AllocationResult | Awaitable[AllocationResult]"]


def socket_name(resource: str) -> str:
    """`gpuops-<resource>.sock`, with characters other than letters, digits, `.`, `_`, `-` replaced by `_`."""
    return "gpuops-" + re.sub(r"[^A-Za-z0-9._-]", "_", resource) + ".sock"


def absolute(path: str | os.PathLike[str]) -> Path:
    """`path` made absolute against the working directory (the kubelet joins its directory with our endpoint)."""
    return Path(path).absolute()


def check_socket_path(path: Path) -> None:
    """Fail early and clearly on a unix socket path the kernel cannot hold."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"unix socket path longer than {MAX_SOCKET_PATH} bytes: {path}")


def file_id(path: Path) -> FileId | None:
    """Identity of the file at `path` (None if absent). The change time is part of it because file systems (ext4
    and tmpfs alike) hand a just-freed inode number to the next file: a recreated socket often keeps its inode."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def remove_stale(path: Path) -> None:
    """Unlink whatever non-directory sits at `path`: gRPC itself only replaces an old socket, not other files."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(path.lstat().st_mode):
            path.unlink()


def preferred_allocation(
    devices: Sequence[Device], available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """The plugin's preference: every `must_include` id first (in the given order), then available healthy
    devices in the order the agent lists them, up to `size`. The agent lists slices in a stable order (GPU, then
    placement start), so the kubelet keeps picking the same slices for the same state. Ids we do not advertise or
    that are unhealthy are never proposed: Allocate would refuse them; the kubelet fills any shortfall itself."""
    chosen = list(dict.fromkeys(must_include))
    if len(chosen) >= size:
        return chosen
    offered = set(available) - set(chosen)
    for d in devices:
        if len(chosen) >= size:
            break
        if d.healthy and d.id in offered:
            chosen.append(d.id)
    return chosen


class _Servicer:
    """The DevicePlugin service of one gRPC server instance; `closed` ends its ListAndWatch streams gracefully."""

    def __init__(self, owner: DevicePluginServer) -> None:
        self.owner = owner
        self.closed = False

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return self.owner.options()

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Full list now, then after every change, until this server closes (then end the stream cleanly, so
        the kubelet sees the plugin go) or the kubelet hangs up (gRPC cancels us)."""
        while not self.closed:
            changed = self.owner.changed
            yield self.owner.list_response()
            await changed.wait()

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        devices = self.owner.devices()
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred_allocation(
                        devices, list(r.available_deviceIDs), list(r.must_include_deviceIDs), int(r.allocation_size)
                    )
                )
                for r in request.container_requests
            ]
        )

    async def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for creq in request.container_requests:
            ids = [str(i) for i in creq.devices_ids]
            problem = self.owner.check_ids(ids)
            if problem:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            result: AllocationResult | None = None
            try:
                result = await self.owner.run_allocate(ids)
            except Exception as exc:
                log.warning("allocate failed", resource=self.owner.resource, devices=ids, error=str(exc))
                problem = f"{self.owner.resource}: allocating {','.join(ids)}: {exc}"
            if result is None:
                # abort() raises; it must not run inside the try above, which would swallow that.
                await context.abort(grpc.StatusCode.INTERNAL, problem)
                return None
            responses.append(
                pb.ContainerAllocateResponse(
                    envs=dict(result.envs),
                    annotations=dict(result.annotations),
                    cdi_devices=[pb.CDIDevice(name=n) for n in result.cdi_devices],
                )
            )
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


class DevicePluginServer:
    """The device plugin of one resource, served with grpc.aio on `<socket_dir>/gpuops-<resource>.sock`.

    `devices` is read at `start()` and at every `update()`; the agent calls `update()` (on the event loop) after
    creating, destroying or health-checking slices. `allocate` gets the (known, healthy) ids of one container.
    """

    def __init__(
        self,
        resource: str,
        socket_dir: str | os.PathLike[str],
        devices: DeviceSource,
        allocate: AllocateFn,
        *,
        poll_interval: float = 1.0,
        register_timeout: float = 5.0,
        stop_grace: float = 1.0,
    ) -> None:
        self.resource = resource
        self.socket_dir = absolute(socket_dir)
        self.socket_path = self.socket_dir / socket_name(resource)
        check_socket_path(self.socket_path)
        self._source = devices
        self._allocate = allocate
        self._poll_interval = poll_interval
        self._register_timeout = register_timeout
        self._stop_grace = stop_grace
        self._devices: tuple[Device, ...] = ()
        self.changed = asyncio.Event()
        """Set (and replaced) whenever the device list changes."""
        self._server: Any = None
        self._servicer: _Servicer | None = None
        self._socket_id: FileId | None = None
        self._kubelet_socket: Path | None = None
        self._kubelet_id: FileId | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.registrations = 0
        """Successful Register calls so far (first one and every re-registration)."""
        self.registered = False
        """Registered with the kubelet now: a kubelet restart (new socket) or our socket vanishing makes it False
        until the next successful Register."""

    # ------------------------------------------------------------------------------------------ devices

    def devices(self) -> list[Device]:
        """The advertised devices, as of the last `update()`."""
        return list(self._devices)

    def update(self) -> bool:
        """Re-read the device source; if the list changed, stream it to the kubelet. True if it changed."""
        seen: dict[str, Device] = {}
        for d in self._source():
            seen.setdefault(d.id, d)
        new = tuple(seen.values())
        if new == self._devices:
            return False
        self._devices = new
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
        return True

    def options(self) -> Any:
        """DevicePluginOptions: preferred allocation served, no PreStartContainer needed."""
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def list_response(self) -> Any:
        """The current list as a ListAndWatchResponse."""
        return pb.ListAndWatchResponse(
            devices=[
                pb.Device(
                    ID=d.id,
                    health=HEALTHY if d.healthy else UNHEALTHY,
                    topology=None if d.numa_node is None else pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)]),
                )
                for d in self._devices
            ]
        )

    def check_ids(self, ids: Sequence[str]) -> str:
        """Why `ids` cannot be allocated ("" if they can)."""
        if not ids:
            return f"{self.resource}: no device ids in the container request"
        known = {d.id: d for d in self._devices}
        for i in ids:
            d = known.get(i)
            if d is None:
                return f"{self.resource}: unknown device {i!r}"
            if not d.healthy:
                return f"{self.resource}: device {i!r} is unhealthy"
        return ""

    async def run_allocate(self, ids: list[str]) -> AllocationResult:
        """The agent's callback, sync or async."""
        result = self._allocate(ids)
        if inspect.isawaitable(result):
            return await result
        return result

    # ------------------------------------------------------------------------------------------ life cycle

    @property
    def endpoint(self) -> str:
        """Our socket relative to the kubelet's directory (the kubelet joins the two)."""
        kubelet_dir = self._kubelet_socket.parent if self._kubelet_socket else self.socket_dir
        return os.path.relpath(self.socket_path, kubelet_dir)

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Read the devices and serve; a stale socket file at our path is replaced."""
        async with self._lock:
            if self._server is not None:
                return
            self.update()
            await self._serve()

    async def stop(self) -> None:
        """Stop re-registering, end the kubelet's ListAndWatch stream, stop serving and remove our socket."""
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        async with self._lock:
            await self._shutdown()

    async def register(self, kubelet_socket: str | os.PathLike[str] | None = None) -> None:
        """Register with the kubelet at `kubelet_socket` (default `<socket_dir>/kubelet.sock`), raising on failure,
        and from now on re-register by ourselves whenever that socket is recreated (a kubelet restart), even if this
        first attempt failed. Call after `start()`."""
        if self._server is None:
            raise RuntimeError(f"device plugin {self.resource} is not started")
        self._kubelet_socket = absolute(kubelet_socket) if kubelet_socket else self.socket_dir / KUBELET_SOCKET
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.create_task(self._watch(), name=f"deviceplugin-watch {self.resource}")
        async with self._lock:
            await self._register(self._kubelet_socket)

    async def _serve(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        remove_stale(self.socket_path)
        server = grpc.aio.server()
        servicer = _Servicer(self)
        pb_grpc.add_DevicePluginServicer_to_server(servicer, server)
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError as exc:
            await server.stop(None)
            raise OSError(f"device plugin {self.resource}: cannot listen on {self.socket_path}: {exc}") from exc
        await server.start()
        self._server, self._servicer = server, servicer
        self._socket_id = file_id(self.socket_path)
        log.info("device plugin serving", resource=self.resource, socket=str(self.socket_path))

    async def _shutdown(self) -> None:
        server, servicer = self._server, self._servicer
        if server is None or servicer is None:
            return
        self._server = self._servicer = None
        servicer.closed = True
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
        await server.stop(self._stop_grace)
        # gRPC unlinks the socket at stop too, but only if the path still names the socket it bound.
        if self._socket_id is not None and file_id(self.socket_path) == self._socket_id:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._socket_id = None

    async def _register(self, kubelet_socket: Path) -> None:
        kid = file_id(kubelet_socket)
        request = pb.RegisterRequest(
            version=VERSION, endpoint=self.endpoint, resource_name=self.resource, options=self.options()
        )
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(request, timeout=self._register_timeout)
        self._kubelet_id = kid
        self.registrations += 1
        self.registered = True
        log.info("device plugin registered", resource=self.resource, kubelet=str(kubelet_socket))

    async def _watch(self) -> None:
        """Poll (no inotify needed, one stat per second) for a new kubelet.sock or a vanished socket of ours."""
        while True:
            await asyncio.sleep(self._poll_interval)
            try:
                await self._reconcile()
            except Exception as exc:
                log.warning("device plugin re-registration failed", resource=self.resource, error=str(exc))

    async def _reconcile(self) -> None:
        async with self._lock:
            if self._server is None or self._kubelet_socket is None:
                return
            if file_id(self.socket_path) != self._socket_id:
                # A starting kubelet deletes the sockets in its directory: listen again before registering.
                log.info("device plugin socket gone, serving again", resource=self.resource)
                await self._shutdown()
                await self._serve()
                self._kubelet_id = None
                self.registered = False
            kid = file_id(self._kubelet_socket)
            if kid is not None and kid != self._kubelet_id:
                self.registered = False
                await self._register(self._kubelet_socket)

"""The node agent's view of its GPUs and MIG slices, and the one backend that reads and changes them.

Why one backend: emulated mode must exercise the same code as a GPU node, so `MigBackend` only ever talks to
an object shaped like the `pynvml` module: the real module on hardware, a contributed one (`backends`) when
emulated.
It uses NVML the way the driver expects: an explicit placement for every GPU instance (the driver's default
placement depends on creation order), the NVML profile *index* to look a profile up and the
profile *ID* it returns to create/list instances, and pynvml's ctypes conventions (output arrays plus
`byref(count)`, `byref(placement)`).

A slice is a GPU instance (GI) plus one compute instance (CI) spanning it, named by its MIG device UUID.
`create` never leaves half a slice behind (a failed CI destroys the GI); `destroy` is idempotent; `slices`
reads the layout from the device, including GIs without a CI (a crash between the two steps, or someone
else's), so a restarted agent can finish or destroy them.

NVML is synchronous and so is this class; call it from a worker thread (e.g. `anyio.to_thread.run_sync`).
Calls are serialised by a lock, so a create's rollback never interleaves with another change.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal

from gpuops.accounting import mig
from gpuops.accounting.errors import AccountingError

__all__ = ["GpuInfo", "MigBackend", "MigBackendError", "MigMode", "SliceInfo", "load_pynvml"]

MigMode = Literal["Enabled", "Disabled", "Pending"]

# NVML error codes (identical in every pynvml release; the backend still reads them off the module it drives).
_UNINITIALIZED: Final = 1
_INVALID_ARGUMENT: Final = 2
_NOT_SUPPORTED: Final = 3
_NOT_FOUND: Final = 6
_INSUFFICIENT_SIZE: Final = 7
_LIBRARY_NOT_FOUND: Final = 12
_FUNCTION_NOT_FOUND: Final = 13
_IN_USE: Final = 19
_INSUFFICIENT_RESOURCES: Final = 23
_UNKNOWN: Final = 999

_RETRYABLE: Final = frozenset({
    10,  # TIMEOUT
    11,  # IRQ_ISSUE
    _IN_USE,  # a process (or a CI) still holds the instance; it may go away
    20,  # MEMORY
    27,  # NOT_READY
    _UNKNOWN,
})
"""Codes worth retrying as is. INSUFFICIENT_RESOURCES is not: the placement is taken, so re-plan instead."""

_SETTLE_READS: Final = 5
"""Reads of one GPU's slices before a listing that keeps meeting stale handles is raised."""

_CI_INDEX_OF_SLICES: Final = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
"""NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE index of the CI profile with n compute slices (the full-GI CI)."""


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as the agent reports it."""

    index: int
    uuid: str
    model: str
    """Our model key ("A100-40GB"), from the NVML product name; "" if we have no MIG geometry for it."""
    product: str
    """GPU feature discovery's spelling of the NVML name ("NVIDIA-A100-SXM4-40GB")."""
    memory_mib: int
    mig_mode: MigMode
    """Pending: the mode changes at the next GPU reset (current and pending differ)."""
    mig_capable: bool = True


@dataclass(frozen=True)
class SliceInfo:
    """One GPU instance on a GPU and its compute instance, as found on the device."""

    gpu_uuid: str
    profile: str
    """Our profile name for the GPU's model ("1g.10gb", "1g.10gb+me")."""
    start: int
    size: int
    gpu_instance_id: int
    compute_instance_id: int | None
    """The CI spanning the whole GI; None if the GI has none (half-made) or is split into smaller CIs."""
    device_uuid: str
    """MIG-<uuid> of that CI ("" without one): what NVIDIA_VISIBLE_DEVICES names."""
    compute_instance_ids: tuple[int, ...] = ()
    """Every CI on the GI."""

    @property
    def complete(self) -> bool:
        """A usable slice: one full-GI compute instance with a MIG device."""
        return self.compute_instance_id is not None and bool(self.device_uuid)


class MigBackendError(Exception):
    """A MIG operation failed. `code` is the NVML error code (NVML_ERROR_*), also for our own checks
    (unknown profile or start: INVALID_ARGUMENT; MIG disabled: NOT_SUPPORTED; no such GPU: NOT_FOUND);
    `retryable` says whether trying the same call again later can succeed."""

    def __init__(self, message: str, *, code: int, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = code in _RETRYABLE if retryable is None else retryable


def load_pynvml() -> Any:
    """The real `pynvml` module (nvidia-ml-py), or MigBackendError if it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as e:
        raise MigBackendError(f"nvidia-ml-py is not installed ({e}); install gpuops[mig]",
                              code=_LIBRARY_NOT_FOUND, retryable=False) from e


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class MigBackend:
    """MIG slices through an NVML module object: `MigBackend(load_pynvml())` on a GPU node,
    any NVML-shaped module a distribution contributes (`backends.load_nvml`) when emulated."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._lock = threading.RLock()
        self._open = False
        self._code_names = {int(getattr(nvml, n)): n for n in dir(nvml) if n.startswith("NVML_ERROR_")}

    # ---------------------------------------------------------------------------------------- lifecycle

    def open(self) -> None:
        with self._lock:
            if not self._open:
                self._nv("initialise NVML", self.nvml.nvmlInit)
                self._open = True

    def close(self) -> None:
        with self._lock:
            if self._open:
                self._open = False
                with contextlib.suppress(self.nvml.NVMLError):  # shutting down anyway
                    self.nvml.nvmlShutdown()

    def __enter__(self) -> MigBackend:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- reading

    def gpus(self) -> list[GpuInfo]:
        """Every GPU of the node, in NVML index order."""
        with self._lock:
            self._require_open()
            n = int(self._nv("count GPUs", self.nvml.nvmlDeviceGetCount))
            return [self._gpu_info(i, self._nv(f"open GPU {i}", self.nvml.nvmlDeviceGetHandleByIndex, i))
                    for i in range(n)]

    def slices(self, gpu_uuid: str | None = None) -> list[SliceInfo]:
        """Every GPU instance on the node (or on one GPU), sorted by GPU index then start."""
        with self._lock:
            self._require_open()
            out: list[SliceInfo] = []
            if gpu_uuid is not None:
                dev, info = self._device(gpu_uuid)
                targets = [(dev, info)]
            else:
                targets = []
                for i in range(int(self._nv("count GPUs", self.nvml.nvmlDeviceGetCount))):
                    dev = self._nv(f"open GPU {i}", self.nvml.nvmlDeviceGetHandleByIndex, i)
                    targets.append((dev, self._gpu_info(i, dev)))
            for dev, info in targets:
                if info.mig_capable and self._mig_current(dev, info.uuid):
                    out.extend(self._gpu_slices_settled(dev, info))
            return out

    # ---------------------------------------------------------------------------------------- changing

    def create(self, gpu_uuid: str, profile: str, start: int) -> SliceInfo:
        """Create `profile` at memory slice `start` (GI with that exact placement, then one CI spanning it).

        The placement must be free; the driver's refusal (INSUFFICIENT_RESOURCES: overlap or profile at its
        limit) is raised as is, not worked around, because only the allocator may move slices. If anything
        after the GI fails, the GI (and a CI already made) is destroyed before the error is raised.
        """
        with self._lock:
            self._require_open()
            dev, info = self._device(gpu_uuid)
            geom = self._geometry(info)
            if not self._mig_current(dev, gpu_uuid):
                raise MigBackendError(
                    f"MIG mode is disabled on GPU {info.index} ({gpu_uuid}, {info.product}): enable it "
                    f"(nvidia-smi -i {info.index} -mig 1) and reset the GPU before slices can be created",
                    code=_NOT_SUPPORTED, retryable=False)
            try:
                prof = mig.parse_profile(geom, profile)
            except AccountingError as e:
                raise MigBackendError(str(e), code=_INVALID_ARGUMENT, retryable=False) from e
            what = f"create {prof.name}@{start} on GPU {gpu_uuid}"
            pinfo = self._gi_profile_info(dev, prof.nvml_index, what)
            if pinfo.id != prof.profile_id:
                raise MigBackendError(
                    f"{what}: NVML profile index {prof.nvml_index} has profile ID {pinfo.id}, our {geom.model} "
                    f"table says {prof.profile_id}; refusing to guess", code=_NOT_SUPPORTED, retryable=False)
            possible = self._possible_placements(dev, pinfo.id, what)
            size = next((sz for st, sz in possible if st == start), None)
            if size is None:
                raise MigBackendError(
                    f"{what}: NVML offers {prof.name} only at starts {[st for st, _ in possible]}",
                    code=_INVALID_ARGUMENT, retryable=False)
            if size != prof.size:
                raise MigBackendError(
                    f"{what}: NVML places it over {size} memory slices, our {geom.model} table says {prof.size}",
                    code=_NOT_SUPPORTED, retryable=False)
            placement = self.nvml.c_nvmlGpuInstancePlacement_t()
            placement.start = start
            placement.size = size
            gi = self._nv(what, self.nvml.nvmlDeviceCreateGpuInstanceWithPlacement, dev, pinfo.id,
                          ctypes.byref(placement))
            try:
                gi_id = int(self._nv(what, self.nvml.nvmlGpuInstanceGetInfo, gi).id)
                ci_id = self._create_full_ci(gi, int(pinfo.sliceCount), what)
                device_uuid = self._mig_uuids(dev, what).get((gi_id, ci_id), "")
                if not device_uuid:
                    raise MigBackendError(f"{what}: no MIG device appeared for GI {gi_id} / CI {ci_id}",
                                          code=_UNKNOWN, retryable=True)
            except BaseException as e:
                self._rollback(gi, what, e)
                raise
            return SliceInfo(gpu_uuid, prof.name, start, size, gi_id, ci_id, device_uuid, (ci_id,))

    def finish(self, gpu_uuid: str, gpu_instance_id: int) -> SliceInfo:
        """Give a GI without compute instances (e.g. left by a crash mid-create) its full-GI CI."""
        with self._lock:
            self._require_open()
            dev, info = self._device(gpu_uuid)
            what = f"finish GI {gpu_instance_id} on GPU {gpu_uuid}"
            found = next((s for s in self._gpu_slices(dev, info) if s.gpu_instance_id == gpu_instance_id), None)
            if found is None:
                raise MigBackendError(f"{what}: no such GPU instance", code=_NOT_FOUND, retryable=False)
            if found.complete:
                return found
            if found.compute_instance_ids:
                raise MigBackendError(f"{what}: it is split into compute instances {found.compute_instance_ids}",
                                      code=_IN_USE, retryable=False)
            gi = self._nv(what, self.nvml.nvmlDeviceGetGpuInstanceById, dev, gpu_instance_id)
            pinfo = self._gi_profile_info_by_id(dev, int(self._nv(what, self.nvml.nvmlGpuInstanceGetInfo,
                                                                  gi).profileId), what)
            ci_id = self._create_full_ci(gi, int(pinfo.sliceCount), what)
            device_uuid = self._mig_uuids(dev, what).get((gpu_instance_id, ci_id), "")
            return SliceInfo(gpu_uuid, found.profile, found.start, found.size, gpu_instance_id, ci_id, device_uuid,
                             (ci_id,))

    def destroy(self, gpu_uuid: str, gpu_instance_id: int) -> bool:
        """Destroy a GI and its CIs; True if it existed. A GI already gone is success (False), so the agent
        can repeat a destroy after a crash. IN_USE (a process still on it) is raised, retryable."""
        with self._lock:
            self._require_open()
            dev, info = self._device(gpu_uuid)
            if not info.mig_capable or not self._mig_current(dev, gpu_uuid):
                return False  # no MIG, no instances
            what = f"destroy GI {gpu_instance_id} on GPU {gpu_uuid}"
            try:
                gi = self.nvml.nvmlDeviceGetGpuInstanceById(dev, gpu_instance_id)
            except self.nvml.NVMLError as e:
                if self._code(e) in (_NOT_FOUND, _INVALID_ARGUMENT):
                    return False
                raise self._error(e, what) from e
            self._destroy_gi(gi, what)
            return True

    # ---------------------------------------------------------------------------------------- internals

    def _require_open(self) -> None:
        if not self._open:
            raise MigBackendError("MigBackend is not open (call open() first)", code=_UNINITIALIZED,
                                  retryable=False)

    def _code(self, e: BaseException) -> int:
        return int(getattr(e, "value", _UNKNOWN))

    def _error(self, e: BaseException, what: str) -> MigBackendError:
        code = self._code(e)
        name = self._code_names.get(code, f"NVML error {code}")
        hint = {
            _INSUFFICIENT_RESOURCES: ": the memory slices are taken or the profile is at its instance limit",
            _NOT_SUPPORTED: ": MIG is not enabled on this GPU, or the profile is not supported",
            _IN_USE: ": a process or compute instance still uses it",
            _INVALID_ARGUMENT: ": NVML rejected the profile, placement or handle",
        }.get(code, "")
        return MigBackendError(f"{what}: {name}{hint}", code=code)

    def _nv(self, what: str, fn: Any, *args: Any) -> Any:
        """Call an NVML function, turning NVMLError into MigBackendError."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as e:
            raise self._error(e, what) from e

    def _gpu_info(self, index: int, dev: Any) -> GpuInfo:
        what = f"read GPU {index}"
        uuid = _text(self._nv(what, self.nvml.nvmlDeviceGetUUID, dev))
        name = _text(self._nv(what, self.nvml.nvmlDeviceGetName, dev))
        memory_mib = int(self._nv(what, self.nvml.nvmlDeviceGetMemoryInfo, dev).total) >> 20
        try:
            model = mig.normalize_model(name)
        except AccountingError:
            model = ""
        try:
            current, pending = self.nvml.nvmlDeviceGetMigMode(dev)
        except self.nvml.NVMLError as e:
            if self._code(e) != _NOT_SUPPORTED:
                raise self._error(e, what) from e
            return GpuInfo(index, uuid, model, name.replace(" ", "-"), memory_mib, "Disabled", mig_capable=False)
        enabled = int(self.nvml.NVML_DEVICE_MIG_ENABLE)
        mode: MigMode = "Pending" if current != pending else "Enabled" if current == enabled else "Disabled"
        return GpuInfo(index, uuid, model, name.replace(" ", "-"), memory_mib, mode, mig_capable=bool(model))

    def _device(self, gpu_uuid: str) -> tuple[Any, GpuInfo]:
        try:
            dev = self.nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except self.nvml.NVMLError as e:
            if self._code(e) in (_NOT_FOUND, _INVALID_ARGUMENT):
                raise MigBackendError(f"no GPU with UUID {gpu_uuid} on this node", code=_NOT_FOUND,
                                      retryable=False) from e
            raise self._error(e, f"open GPU {gpu_uuid}") from e
        index = -1  # NVML has no "index of this handle" call that works everywhere; match the UUID
        for i in range(int(self._nv("count GPUs", self.nvml.nvmlDeviceGetCount))):
            other = self._nv(f"open GPU {i}", self.nvml.nvmlDeviceGetHandleByIndex, i)
            if _text(self._nv(f"read GPU {i}", self.nvml.nvmlDeviceGetUUID, other)) == gpu_uuid:
                index = i
                break
        return dev, self._gpu_info(index, dev)

    def _geometry(self, info: GpuInfo) -> mig.Geometry:
        if not info.mig_capable or not info.model:
            raise MigBackendError(f"GPU {info.uuid} ({info.product}) has no MIG geometry we know",
                                  code=_NOT_SUPPORTED, retryable=False)
        return mig.geometry(info.model)

    def _mig_current(self, dev: Any, gpu_uuid: str) -> bool:
        """Whether MIG is on now (a pending change only counts after a GPU reset)."""
        try:
            current, _ = self.nvml.nvmlDeviceGetMigMode(dev)
        except self.nvml.NVMLError as e:
            if self._code(e) == _NOT_SUPPORTED:
                return False
            raise self._error(e, f"read MIG mode of GPU {gpu_uuid}") from e
        return bool(current == self.nvml.NVML_DEVICE_MIG_ENABLE)

    def _gi_profile_info(self, dev: Any, index: int, what: str) -> Any:
        """GetGpuInstanceProfileInfo(V) for an NVML profile index; v1 on drivers without the V call."""
        try:
            return self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, index)
        except self.nvml.NVMLError as e:
            if self._code(e) != _FUNCTION_NOT_FOUND:
                raise self._error(e, f"{what}: profile index {index}") from e
        return self._nv(what, self.nvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, index, 1)

    def _gi_profiles(self, dev: Any) -> Iterator[Any]:
        """The profile infos of every GI profile the device supports (unsupported indexes are skipped)."""
        for index in range(int(self.nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                yield self._gi_profile_info(dev, index, "list GPU instance profiles")
            except MigBackendError as e:
                if e.code not in (_NOT_SUPPORTED, _INVALID_ARGUMENT):
                    raise

    def _gi_profile_info_by_id(self, dev: Any, profile_id: int, what: str) -> Any:
        for pinfo in self._gi_profiles(dev):
            if int(pinfo.id) == profile_id:
                return pinfo
        raise MigBackendError(f"{what}: NVML lists no GI profile with ID {profile_id}", code=_NOT_FOUND,
                              retryable=False)

    def _possible_placements(self, dev: Any, profile_id: int, what: str) -> list[tuple[int, int]]:
        """nvmlDeviceGetGpuInstancePossiblePlacements(_v2): every placement of the profile, free or not."""
        count = ctypes.c_uint(0)
        fn = self.nvml.nvmlDeviceGetGpuInstancePossiblePlacements
        self._nv(what, fn, dev, profile_id, None, ctypes.byref(count))
        arr = (self.nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        count.value = len(arr)
        self._nv(what, fn, dev, profile_id, arr, ctypes.byref(count))
        return [(int(arr[i].start), int(arr[i].size)) for i in range(count.value)]

    def _listed(self, what: str, fn: Any, owner: Any, profile_id: int, capacity: int, item: Any) -> list[Any]:
        """Handles from a GetGpuInstances/GetComputeInstances-style call (array + count), growing the array
        if the driver says it is too small."""
        size = max(capacity, 1)
        for _ in range(3):
            arr = (item * size)()
            count = ctypes.c_uint(size)
            try:
                fn(owner, profile_id, arr, ctypes.byref(count))
            except self.nvml.NVMLError as e:
                if self._code(e) == _INSUFFICIENT_SIZE and count.value > size:
                    size = count.value
                    continue
                raise self._error(e, what) from e
            return [arr[i] for i in range(count.value)]
        raise MigBackendError(f"{what}: the instance list keeps growing", code=_INSUFFICIENT_SIZE, retryable=True)

    def _compute_instances(self, gi: Any, what: str) -> list[tuple[Any, int, int]]:
        """(handle, CI id, compute slices) of every compute instance of a GI."""
        out: list[tuple[Any, int, int]] = []
        seen: set[int] = set()
        shared = self.nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        for index in range(int(self.nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                cinfo = self.nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, shared)
            except self.nvml.NVMLError as e:
                if self._code(e) in (_NOT_SUPPORTED, _INVALID_ARGUMENT):
                    continue
                raise self._error(e, what) from e
            for ci in self._listed(what, self.nvml.nvmlGpuInstanceGetComputeInstances, gi, int(cinfo.id),
                                   int(cinfo.instanceCount), self.nvml.c_nvmlComputeInstance_t):
                ci_id = int(self._nv(what, self.nvml.nvmlComputeInstanceGetInfo, ci).id)
                if ci_id not in seen:
                    seen.add(ci_id)
                    out.append((ci, ci_id, int(cinfo.sliceCount)))
        return out

    def _mig_uuids(self, dev: Any, what: str) -> dict[tuple[int, int], str]:
        """(GI id, CI id) -> MIG device UUID, from the GPU's MIG device handles."""
        out: dict[tuple[int, int], str] = {}
        for i in range(int(self._nv(what, self.nvml.nvmlDeviceGetMaxMigDeviceCount, dev))):
            try:
                m = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev, i)
            except self.nvml.NVMLError as e:
                if self._code(e) in (_NOT_FOUND, _INVALID_ARGUMENT):
                    continue  # no MIG device at this index
                raise self._error(e, what) from e
            key = (int(self._nv(what, self.nvml.nvmlDeviceGetGpuInstanceId, m)),
                   int(self._nv(what, self.nvml.nvmlDeviceGetComputeInstanceId, m)))
            out[key] = _text(self._nv(what, self.nvml.nvmlDeviceGetUUID, m))
        return out

    def _gpu_slices_settled(self, dev: Any, info: GpuInfo) -> list[SliceInfo]:
        """The GPU's slices read in one piece. A listing takes many NVML calls, and another process (a second
        agent, `nvidia-smi mig`, an admin) may destroy a GI between them: its handle then turns stale
        (INVALID_ARGUMENT, NOT_FOUND). That is a changed GPU, not a failure, so the whole GPU is read again."""
        for attempt in range(_SETTLE_READS):
            try:
                return self._gpu_slices(dev, info)
            except MigBackendError as e:
                if e.code not in (_INVALID_ARGUMENT, _NOT_FOUND) or attempt == _SETTLE_READS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _gpu_slices(self, dev: Any, info: GpuInfo) -> list[SliceInfo]:
        what = f"read slices of GPU {info.uuid}"
        geom = mig.geometry(info.model) if info.model else None
        by_id = {p.profile_id: p for p in geom.profiles} if geom is not None else {}
        uuids = self._mig_uuids(dev, what)
        out: list[SliceInfo] = []
        for pinfo in self._gi_profiles(dev):
            gis = self._listed(what, self.nvml.nvmlDeviceGetGpuInstances, dev, int(pinfo.id),
                               int(pinfo.instanceCount), self.nvml.c_nvmlGpuInstance_t)
            for gi in gis:
                gi_info = self._nv(what, self.nvml.nvmlGpuInstanceGetInfo, gi)
                start, size = int(gi_info.placement.start), int(gi_info.placement.size)
                known = by_id.get(int(gi_info.profileId))
                if known is not None and known.size == size:
                    name = known.name
                else:  # a profile our tables lack (newer driver): NVML's own name
                    raw = _text(getattr(pinfo, "name", b"")).removeprefix("MIG ").strip()
                    name = raw or f"profile-{int(gi_info.profileId)}"
                cis = self._compute_instances(gi, what)
                full = [ci_id for _, ci_id, slices in cis if slices == int(pinfo.sliceCount)]
                ci_id = full[0] if len(cis) == 1 and full else None
                gi_id = int(gi_info.id)
                out.append(SliceInfo(info.uuid, name, start, size, gi_id, ci_id,
                                     uuids.get((gi_id, ci_id), "") if ci_id is not None else "",
                                     tuple(sorted(c for _, c, _ in cis))))
        out.sort(key=lambda s: (s.start, s.gpu_instance_id))
        return out

    def _create_full_ci(self, gi: Any, gi_slices: int, what: str) -> int:
        index = _CI_INDEX_OF_SLICES.get(gi_slices)
        if index is None:
            raise MigBackendError(f"{what}: no compute instance profile spans {gi_slices} slices",
                                  code=_NOT_SUPPORTED, retryable=False)
        cinfo = self._nv(what, self.nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, index,
                         self.nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        if int(cinfo.sliceCount) != gi_slices:
            raise MigBackendError(f"{what}: CI profile index {index} has {cinfo.sliceCount} slices, the GI "
                                  f"{gi_slices}", code=_NOT_SUPPORTED, retryable=False)
        ci = self._nv(what, self.nvml.nvmlGpuInstanceCreateComputeInstance, gi, int(cinfo.id))
        return int(self._nv(what, self.nvml.nvmlComputeInstanceGetInfo, ci).id)

    def _destroy_gi(self, gi: Any, what: str) -> None:
        """CIs first (the driver refuses to destroy a GI that has any), then the GI; gone counts as done."""
        for ci, _, _ in self._compute_instances(gi, what):
            try:
                self.nvml.nvmlComputeInstanceDestroy(ci)
            except self.nvml.NVMLError as e:
                if self._code(e) not in (_NOT_FOUND, _INVALID_ARGUMENT):
                    raise self._error(e, what) from e
        try:
            self.nvml.nvmlGpuInstanceDestroy(gi)
        except self.nvml.NVMLError as e:
            if self._code(e) not in (_NOT_FOUND, _INVALID_ARGUMENT):
                raise self._error(e, what) from e

    def _rollback(self, gi: Any, what: str, cause: BaseException) -> None:
        """Undo a half-made slice; if even that fails, say so on the original error (the GI then shows up
        in `slices()` without a CI, for the agent to destroy later)."""
        try:
            self._destroy_gi(gi, f"{what} (rollback)")
        except Exception as e:
            cause.add_note(f"rollback failed, the GPU instance is left behind: {e}")

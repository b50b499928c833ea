"""An NVML-shaped fake: the object `MigBackend` talks to in emulated mode instead of the `pynvml` module.

Why: the agent's MIG code must be the code that runs on a GPU, so the emulated node does not get its own
backend; it gets a stand-in for the driver. `FakeNVML` exposes the pynvml names the backend uses (functions,
`NVML_*` constants, `NVMLError` and its per-code subclasses, and ctypes structures with pynvml's field
layout, e.g. `c_nvmlGpuInstancePlacement_t.start/.size`), follows the C calling conventions pynvml passes
through (output arrays plus `byref(count)`, `byref(placement)`, NULL to ask for a count), and rejects what the
driver rejects, with the driver's codes:

* a placement whose start/size NVML does not list for the profile, or an unknown profile: INVALID_ARGUMENT;
* a placement that overlaps an existing GPU instance, or a profile already at its instance limit (the
  `+me` singleton; on A30 one `+me` of either size): INSUFFICIENT_RESOURCES;
* any GI call on a GPU whose current MIG mode is disabled, or on a GPU without MIG: NOT_SUPPORTED;
* destroying a GI that still has compute instances, or an instance marked busy (a process on it): IN_USE;
* a stale handle (its instance was destroyed): INVALID_ARGUMENT; a missing GI id: NOT_FOUND.

Geometry (profile ids, placements, instance counts) and the creation rules come from the emulator's own
`migtables`, written from NVIDIA's MIG user guide; tests compare them with the operator's accounting, so a
misreading on either side shows up as a disagreement instead of being shared. State (the GIs/CIs of each
GPU, and MIG modes) can live in a JSON file: the driver outlives an agent restart, so a new fake on the same
file sees the same slices; `reboot()` (or deleting the file) loses them, as MIG instances do not survive a
node reboot (MIG mode does, and a pending mode applies).
The file is re-read on every call under an exclusive lock, so several processes share one "driver".

Chaos hooks: `fail_next(name, code, times)` makes the next calls of an NVML function fail with that code
before doing anything; `set_delay(seconds, name=None)` slows calls down. `calls` counts calls per function.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from ctypes import POINTER, Structure, c_char, c_uint, c_ulonglong
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from gpuops.controllers.migslicer.agent.backends import BackendOptions

from . import gpus, migtables
from .migtables import MigModel, MigProfile, Placement

__all__ = ["FakeNVML", "NVMLError", "gpu_uuid", "mig_device_uuid", "nvml_name", "parse_gpu_spec"]

# ------------------------------------------------------------------------------------------ constants (pynvml's)

NVML_SUCCESS: Final = 0
NVML_ERROR_UNINITIALIZED: Final = 1
NVML_ERROR_INVALID_ARGUMENT: Final = 2
NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_NO_PERMISSION: Final = 4
NVML_ERROR_ALREADY_INITIALIZED: Final = 5
NVML_ERROR_NOT_FOUND: Final = 6
NVML_ERROR_INSUFFICIENT_SIZE: Final = 7
NVML_ERROR_INSUFFICIENT_POWER: Final = 8
NVML_ERROR_DRIVER_NOT_LOADED: Final = 9
NVML_ERROR_TIMEOUT: Final = 10
NVML_ERROR_IRQ_ISSUE: Final = 11
NVML_ERROR_LIBRARY_NOT_FOUND: Final = 12
NVML_ERROR_FUNCTION_NOT_FOUND: Final = 13
NVML_ERROR_CORRUPTED_INFOROM: Final = 14
NVML_ERROR_GPU_IS_LOST: Final = 15
NVML_ERROR_RESET_REQUIRED: Final = 16
NVML_ERROR_OPERATING_SYSTEM: Final = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH: Final = 18
NVML_ERROR_IN_USE: Final = 19
NVML_ERROR_MEMORY: Final = 20
NVML_ERROR_NO_DATA: Final = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: Final = 22
NVML_ERROR_INSUFFICIENT_RESOURCES: Final = 23
NVML_ERROR_FREQ_NOT_SUPPORTED: Final = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH: Final = 25
NVML_ERROR_DEPRECATED: Final = 26
NVML_ERROR_NOT_READY: Final = 27
NVML_ERROR_GPU_NOT_FOUND: Final = 28
NVML_ERROR_INVALID_STATE: Final = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: Final = 30
NVML_ERROR_UNKNOWN: Final = 999

NVML_DEVICE_MIG_DISABLE: Final = 0
NVML_DEVICE_MIG_ENABLE: Final = 1

NVML_GPU_INSTANCE_PROFILE_1_SLICE: Final = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE: Final = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE: Final = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE: Final = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE: Final = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE: Final = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE: Final = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: Final = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1: Final = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: Final = 0x9
NVML_GPU_INSTANCE_PROFILE_COUNT: Final = 0x12

NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: Final = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: Final = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: Final = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: Final = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: Final = 0x4
NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE: Final = 0x5
NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE: Final = 0x6
NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1: Final = 0x7
NVML_COMPUTE_INSTANCE_PROFILE_COUNT: Final = 0x9
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: Final = 0x0
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT: Final = 0x1

NVML_DEVICE_NAME_V2_BUFFER_SIZE: Final = 96
nvmlGpuInstanceProfileInfo_v2: Final = 0x02000098
nvmlComputeInstanceProfileInfo_v2: Final = 0x02000088

_CI_INDEX_OF_SLICES: Final = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
"""NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE index per compute-slice count."""

# ------------------------------------------------------------------------------------------ errors (pynvml's shape)


class NVMLError(Exception):
    """pynvml's error: `NVMLError(code)` builds the per-code subclass (NVMLError_InsufficientResources, ...)
    and the code is in `.value`, so `except nvml.NVMLError` and `e.value == nvml.NVML_ERROR_*` work alike."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        target = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


_ERROR_TEXT: Final = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_MEMORY: "Insufficient Memory",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}
_ERROR_CLASSES: dict[str, type[NVMLError]] = {}


def _make_error_classes() -> None:
    for name, value in list(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        cls_name = "NVMLError_" + "".join(part.capitalize() for part in name[len("NVML_ERROR_"):].split("_"))
        cls = type(cls_name, (NVMLError,), {"__module__": __name__})
        NVMLError._valClassMapping[value] = cls
        _ERROR_CLASSES[cls_name] = cls
        globals()[cls_name] = cls


_make_error_classes()

# ------------------------------------------------------------------------------------------ structures (pynvml's)
# Public structures copy pynvml's field layout exactly (a test compares them); the opaque handle structures
# carry the fake's own identity fields, which the backend never reads.


class struct_c_nvmlDevice_t(Structure):
    _fields_ = [("gpu", c_uint), ("gi", c_uint), ("ci", c_uint), ("is_mig", c_uint), ("serial", c_uint)]


class struct_c_nvmlGpuInstance_t(Structure):
    _fields_ = [("gpu", c_uint), ("id", c_uint), ("serial", c_uint)]


class struct_c_nvmlComputeInstance_t(Structure):
    _fields_ = [("gpu", c_uint), ("gi", c_uint), ("id", c_uint), ("serial", c_uint)]


c_nvmlDevice_t = POINTER(struct_c_nvmlDevice_t)
c_nvmlGpuInstance_t = POINTER(struct_c_nvmlGpuInstance_t)
c_nvmlComputeInstance_t = POINTER(struct_c_nvmlComputeInstance_t)


class c_nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlGpuInstancePlacement_t(Structure):
    _fields_ = [("start", c_uint), ("size", c_uint)]


class c_nvmlGpuInstanceProfileInfo_t(Structure):
    _fields_ = [
        ("id", c_uint), ("isP2pSupported", c_uint), ("sliceCount", c_uint), ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint), ("copyEngineCount", c_uint), ("decoderCount", c_uint),
        ("encoderCount", c_uint), ("jpegCount", c_uint), ("ofaCount", c_uint), ("memorySizeMB", c_ulonglong),
    ]


class c_nvmlGpuInstanceProfileInfo_v2_t(Structure):
    _fields_ = [
        ("version", c_uint), ("id", c_uint), ("isP2pSupported", c_uint), ("sliceCount", c_uint),
        ("instanceCount", c_uint), ("multiprocessorCount", c_uint), ("copyEngineCount", c_uint),
        ("decoderCount", c_uint), ("encoderCount", c_uint), ("jpegCount", c_uint), ("ofaCount", c_uint),
        ("memorySizeMB", c_ulonglong), ("name", c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuInstanceProfileInfo_v2)


class c_nvmlGpuInstanceInfo_t(Structure):
    _fields_ = [("device", c_nvmlDevice_t), ("id", c_uint), ("profileId", c_uint),
                ("placement", c_nvmlGpuInstancePlacement_t)]


class c_nvmlComputeInstancePlacement_t(Structure):
    _fields_ = [("start", c_uint), ("size", c_uint)]


class c_nvmlComputeInstanceProfileInfo_t(Structure):
    _fields_ = [
        ("id", c_uint), ("sliceCount", c_uint), ("instanceCount", c_uint), ("multiprocessorCount", c_uint),
        ("sharedCopyEngineCount", c_uint), ("sharedDecoderCount", c_uint), ("sharedEncoderCount", c_uint),
        ("sharedJpegCount", c_uint), ("sharedOfaCount", c_uint),
    ]


class c_nvmlComputeInstanceProfileInfo_v2_t(Structure):
    _fields_ = [
        ("version", c_uint), ("id", c_uint), ("sliceCount", c_uint), ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint), ("sharedCopyEngineCount", c_uint), ("sharedDecoderCount", c_uint),
        ("sharedEncoderCount", c_uint), ("sharedJpegCount", c_uint), ("sharedOfaCount", c_uint),
        ("name", c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlComputeInstanceProfileInfo_v2)


class c_nvmlComputeInstanceInfo_t(Structure):
    _fields_ = [("device", c_nvmlDevice_t), ("gpuInstance", c_nvmlGpuInstance_t), ("id", c_uint),
                ("profileId", c_uint), ("placement", c_nvmlComputeInstancePlacement_t)]


# ------------------------------------------------------------------------------------------ identities

_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "https://gpuops.io/fakenvml")

_NVML_NAMES: Final = {
    # What nvmlDeviceGetName returns; GPU feature discovery's product label is this with spaces as dashes
    # (gpuops_sim.gpus keeps those labels, a test checks they agree).
    "A100-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-80GB": "NVIDIA A100-SXM4-80GB",
    "H100-80GB": "NVIDIA H100 80GB HBM3",
    "H100-94GB": "NVIDIA H100 NVL",
    "H100-96GB": "NVIDIA H100 96GB HBM3",
    "H200-141GB": "NVIDIA H200",
    "B200-180GB": "NVIDIA B200",
    "A30-24GB": "NVIDIA A30",
    "L4-24GB": "NVIDIA L4",
    "T4-16GB": "Tesla T4",
    "L40S-48GB": "NVIDIA L40S",
}
_MEMORY_MIB: Final = {"L4-24GB": 23034, "T4-16GB": 15360, "L40S-48GB": 46068}
_SM_PER_SLICE: Final = 14  # order of magnitude only (A100: 14 SMs per compute slice); nothing reads it


def gpu_uuid(node: str, index: int) -> str:
    """The fake GPU's UUID: stable per (node, index), so restarts and reboots keep the node's identity."""
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}"


def mig_device_uuid(gpu: str, gi_id: int, ci_id: int) -> str:
    """The fake MIG device UUID of (GPU, GI id, CI id)."""
    return f"MIG-{uuid.uuid5(_NAMESPACE, f'{gpu}/{gi_id}/{ci_id}')}"


def nvml_name(model: str) -> str:
    """What nvmlDeviceGetName says for one of our model keys."""
    return _NVML_NAMES[model]


def parse_gpu_spec(spec: str) -> list[str]:
    """`A100-40GB:2,H100-80GB:1` -> one model key per GPU, in index order (`:N` defaults to 1)."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, _, count = part.partition(":")
        key = name.strip()
        if key not in _NVML_NAMES:
            try:
                key = gpus.model(key).key
            except ValueError:
                raise ValueError(f"--gpus {spec!r}: unknown GPU model {name!r}; known: {', '.join(_NVML_NAMES)}")\
                    from None
        try:
            n = int(count) if count.strip() else 1
        except ValueError:
            raise ValueError(f"--gpus {spec!r}: count of {name!r} must be an integer, got {count!r}") from None
        if n < 0:
            raise ValueError(f"--gpus {spec!r}: count of {name!r} must not be negative")
        out.extend([key] * n)
    return out


# ------------------------------------------------------------------------------------------ state


@dataclass
class _CI:
    id: int
    profile_id: int
    slices: int
    serial: int


@dataclass
class _GI:
    id: int
    profile_id: int
    start: int
    size: int
    serial: int
    busy: bool = False
    cis: dict[int, _CI] = field(default_factory=dict)


@dataclass
class _Gpu:
    model: str
    mig_current: int = NVML_DEVICE_MIG_ENABLE
    mig_pending: int = NVML_DEVICE_MIG_ENABLE
    gis: dict[int, _GI] = field(default_factory=dict)


@dataclass
class _State:
    gpus: list[_Gpu]
    serial: int = 0

    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def dump(self, node: str) -> dict[str, Any]:
        return {
            "version": 1, "node": node, "serial": self.serial,
            "gpus": [{
                "model": g.model, "mig": [g.mig_current, g.mig_pending],
                "gis": [{"id": gi.id, "profileId": gi.profile_id, "start": gi.start, "size": gi.size,
                         "serial": gi.serial, "busy": gi.busy,
                         "cis": [{"id": ci.id, "profileId": ci.profile_id, "slices": ci.slices, "serial": ci.serial}
                                 for ci in gi.cis.values()]}
                        for gi in g.gis.values()],
            } for g in self.gpus],
        }

    @classmethod
    def load(cls, raw: dict[str, Any]) -> _State:
        gpus = []
        for g in raw["gpus"]:
            gpu = _Gpu(str(g["model"]), int(g["mig"][0]), int(g["mig"][1]))
            for gi in g["gis"]:
                obj = _GI(int(gi["id"]), int(gi["profileId"]), int(gi["start"]), int(gi["size"]), int(gi["serial"]),
                          bool(gi.get("busy", False)))
                for ci in gi["cis"]:
                    obj.cis[int(ci["id"])] = _CI(int(ci["id"]), int(ci["profileId"]), int(ci["slices"]),
                                                 int(ci["serial"]))
                gpu.gis[obj.id] = obj
            gpus.append(gpu)
        return cls(gpus, int(raw.get("serial", 0)))


def _deref(ref: Any) -> Any:
    """The object behind what pynvml passes to C for a pointer argument: byref(x), pointer(x), or x itself."""
    if ref is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    obj = getattr(ref, "_obj", None)  # ctypes.byref(x)
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer):
        try:
            return ref.contents
        except ValueError:  # NULL
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT) from None
    return ref


def _handle(ref: Any, kind: type[Structure]) -> Any:
    """The identity struct behind a handle of ours, or INVALID_ARGUMENT (NULL, or someone else's handle)."""
    if not isinstance(ref, ctypes._Pointer) or not isinstance(ref, POINTER(kind)):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    try:
        return ref.contents
    except ValueError:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT) from None


# ------------------------------------------------------------------------------------------ the fake


class FakeNVML:
    """An emulated node's NVML: pass it where `pynvml` would go (`MigBackend(FakeNVML(...))`).

    `models` are our model keys (or any name `gpus.model` accepts, or a non-MIG key such as
    "L4-24GB"), one per GPU in index order; `node` seeds the GPU UUIDs; `state_file` keeps the driver state
    across agent restarts; `mig_enabled` is the initial MIG mode of every MIG-capable GPU.
    """

    NVMLError = NVMLError

    def __init__(self, models: Sequence[str], node: str = "node", *, state_file: str | os.PathLike[str] | None = None,
                 mig_enabled: bool = True) -> None:
        keys = []
        for m in models:
            key = m if m in _NVML_NAMES else gpus.model(m).key
            keys.append(key)
        self.models: tuple[str, ...] = tuple(keys)
        self.node = node
        self.state_file = Path(state_file) if state_file is not None else None
        self._mig_default = NVML_DEVICE_MIG_ENABLE if mig_enabled else NVML_DEVICE_MIG_DISABLE
        self._lock = threading.RLock()
        self._state = self._fresh()
        self._init_count = 0
        self._failures: dict[str, list[int]] = {}
        self._delays: dict[str | None, float] = {}
        self._keep: dict[tuple[Any, ...], Structure] = {}
        self.calls: Counter[str] = Counter()
        if self.state_file is not None:
            with self._txn(write=True):
                pass  # adopt the file's state, or write a fresh one

    @classmethod
    def from_spec(cls, spec: str, node: str = "node", *, state_file: str | os.PathLike[str] | None = None,
                  mig_enabled: bool = True) -> FakeNVML:
        """The emulated node of `gpuops agent --emulated --gpus A100-40GB:2,H100-80GB:1`."""
        return cls(parse_gpu_spec(spec), node, state_file=state_file, mig_enabled=mig_enabled)

    @classmethod
    def from_options(cls, options: BackendOptions) -> FakeNVML:
        """The `gpuops.nvml_backends` entry point "emulated": what `gpuops agent --emulated` loads."""
        return cls.from_spec(options.gpus, options.node, state_file=options.state_file)

    # -------------------------------------------------------------------------------- test and chaos hooks

    def fail_next(self, function: str, code: int, times: int = 1) -> None:
        """Make the next `times` calls of NVML function `function` raise NVMLError(code), changing nothing."""
        if not hasattr(self, function):
            raise AttributeError(f"FakeNVML has no NVML function {function!r}")
        with self._lock:
            self._failures.setdefault(function, []).extend([code] * times)

    def set_delay(self, seconds: float, function: str | None = None) -> None:
        """Sleep `seconds` in every call (function=None) or in calls of one function; 0 clears it."""
        with self._lock:
            if seconds > 0:
                self._delays[function] = seconds
            else:
                self._delays.pop(function, None)

    def set_mig_mode(self, index: int, current: bool, pending: bool | None = None) -> None:
        """Set a GPU's MIG mode as `nvidia-smi -mig` plus a GPU reset would (pending: before the reset).
        Disabling drops its instances, as the driver refuses the switch while any exist."""
        with self._txn(write=True) as st:
            g = st.gpus[index]
            g.mig_current = NVML_DEVICE_MIG_ENABLE if current else NVML_DEVICE_MIG_DISABLE
            g.mig_pending = g.mig_current if pending is None else (
                NVML_DEVICE_MIG_ENABLE if pending else NVML_DEVICE_MIG_DISABLE)
            if not current:
                g.gis.clear()

    def set_busy(self, index: int, gi_id: int, busy: bool = True) -> None:
        """Mark a GPU instance as running a process: destroying it (or its CIs) fails with IN_USE."""
        with self._txn(write=True) as st:
            gi = st.gpus[index].gis.get(gi_id)
            if gi is None:
                raise KeyError(f"GPU {index} has no GPU instance {gi_id}")
            gi.busy = busy

    def reboot(self) -> None:
        """A node reboot: every GPU/compute instance is gone; MIG mode persists and a pending mode applies."""
        with self._txn(write=True) as st:
            for g in st.gpus:
                g.gis.clear()
                g.mig_current = g.mig_pending

    def gpu_uuid(self, index: int) -> str:
        return gpu_uuid(self.node, index)

    def layout(self, index: int) -> list[Placement]:
        """The GPU's GIs as placements (profile names of its model), sorted by start."""
        with self._txn() as st:
            g = st.gpus[index]
            return sorted(self._placements(migtables.MODELS[g.model], g),
                          key=lambda p: p.start)

    def instances(self, index: int) -> dict[int, tuple[int, ...]]:
        """GI id -> its CI ids, for assertions."""
        with self._txn() as st:
            return {gi.id: tuple(sorted(gi.cis)) for gi in st.gpus[index].gis.values()}

    # -------------------------------------------------------------------------------- plumbing

    def _fresh(self) -> _State:
        gpus = []
        for m in self.models:
            mode = self._mig_default if m in migtables.MODELS else NVML_DEVICE_MIG_DISABLE
            gpus.append(_Gpu(m, mode, mode))
        return _State(gpus)

    @contextmanager
    def _txn(self, write: bool = False) -> Iterator[_State]:
        """The driver state for one call; with a state file, re-read (and written back) under a file lock so
        restarts and other processes see one driver."""
        with self._lock:
            if self.state_file is None:
                yield self._state
                return
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            with open(f"{self.state_file}.lock", "a") as lockf:
                fcntl.flock(lockf, fcntl.LOCK_EX)
                try:
                    self._state = self._read()
                    yield self._state
                    if write:
                        tmp = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}.tmp")
                        tmp.write_text(json.dumps(self._state.dump(self.node), indent=1))
                        os.replace(tmp, self.state_file)
                finally:
                    fcntl.flock(lockf, fcntl.LOCK_UN)

    def _read(self) -> _State:
        assert self.state_file is not None
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return self._fresh()  # no driver state: the node (re)booted
        if raw.get("node") != self.node or [g["model"] for g in raw.get("gpus", [])] != list(self.models):
            return self._fresh()  # other hardware: the GPUs changed, which takes a reboot
        return _State.load(raw)

    def _enter(self, name: str, *, needs_init: bool = True) -> None:
        with self._lock:
            self.calls[name] += 1
            delay = self._delays.get(name, 0.0) + self._delays.get(None, 0.0)
            queue = self._failures.get(name)
            code = queue.pop(0) if queue else None
            uninit = needs_init and self._init_count == 0
        if delay:
            time.sleep(delay)
        if code is not None:
            raise NVMLError(code)
        if uninit:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _keepalive(self, key: tuple[Any, ...], make: Any) -> Any:
        obj = self._keep.get(key)
        if obj is None:
            obj = self._keep[key] = make()
        return ctypes.pointer(obj)

    def _device(self, index: int) -> Any:
        return self._keepalive(("dev", index), lambda: struct_c_nvmlDevice_t(index, 0, 0, 0, 0))

    def _gpu(self, st: _State, device: Any) -> tuple[int, _Gpu]:
        h = _handle(device, struct_c_nvmlDevice_t)
        if h.is_mig or h.gpu >= len(st.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(h.gpu), st.gpus[h.gpu]

    def _mig_gpu(self, st: _State, device: Any, *, need_enabled: bool = True) -> tuple[int, _Gpu, MigModel]:
        index, g = self._gpu(st, device)
        if g.model not in migtables.MODELS:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if need_enabled and g.mig_current != NVML_DEVICE_MIG_ENABLE:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return index, g, migtables.MODELS[g.model]

    def _gi_handle(self, index: int, gi: _GI) -> Any:
        return self._keepalive(("gi", index, gi.id, gi.serial),
                               lambda: struct_c_nvmlGpuInstance_t(index, gi.id, gi.serial))

    def _ci_handle(self, index: int, gi: _GI, ci: _CI) -> Any:
        return self._keepalive(("ci", index, gi.id, ci.id, ci.serial),
                               lambda: struct_c_nvmlComputeInstance_t(index, gi.id, ci.id, ci.serial))

    def _gi(self, st: _State, ref: Any) -> tuple[int, _Gpu, _GI]:
        h = _handle(ref, struct_c_nvmlGpuInstance_t)
        if h.gpu >= len(st.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g = st.gpus[h.gpu]
        gi = g.gis.get(h.id)
        if gi is None or gi.serial != h.serial:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # destroyed: the handle is stale
        return int(h.gpu), g, gi

    @staticmethod
    def _profile_by_id(geom: MigModel, profile_id: int) -> MigProfile:
        p = geom.by_id(profile_id)
        if p is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return p

    @classmethod
    def _placements(cls, geom: MigModel, g: _Gpu) -> list[Placement]:
        """The GPU's GIs as placements (profile names of its model)."""
        return [Placement(cls._profile_by_id(geom, gi.profile_id).name, gi.start, gi.size) for gi in g.gis.values()]

    @staticmethod
    def _ci_profiles(gi_slices: int) -> dict[int, int]:
        """CI profile index -> compute slices, for a GI with `gi_slices` compute slices."""
        return {_CI_INDEX_OF_SLICES[s]: s for s in (1, 2, 3, 4, 7) if s <= gi_slices}

    # -------------------------------------------------------------------------------- NVML: library and devices

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", needs_init=False)
        with self._lock:
            self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        with self._lock:
            self._init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.models)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.models):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._device(index)

    def nvmlDeviceGetHandleByUUID(self, uuid_: str | bytes) -> Any:
        self._enter("nvmlDeviceGetHandleByUUID")
        text = uuid_.decode() if isinstance(uuid_, bytes) else uuid_
        for i in range(len(self.models)):
            if gpu_uuid(self.node, i) == text:
                return self._device(i)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, device: Any) -> str:
        self._enter("nvmlDeviceGetUUID")
        h = _handle(device, struct_c_nvmlDevice_t)
        if not h.is_mig:
            with self._txn() as st:
                self._gpu(st, device)
            return gpu_uuid(self.node, h.gpu)
        with self._txn() as st:
            gi = st.gpus[h.gpu].gis.get(h.gi) if h.gpu < len(st.gpus) else None
            ci = gi.cis.get(h.ci) if gi is not None else None
            if ci is None or ci.serial != h.serial:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return mig_device_uuid(gpu_uuid(self.node, h.gpu), h.gi, h.ci)

    def nvmlDeviceGetName(self, device: Any) -> str:
        self._enter("nvmlDeviceGetName")
        with self._txn() as st:
            _, g = self._gpu(st, device)
        return _NVML_NAMES[g.model]

    def nvmlDeviceGetMemoryInfo(self, device: Any, version: int | None = None) -> c_nvmlMemory_t:
        self._enter("nvmlDeviceGetMemoryInfo")
        if version:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)  # only the v1 struct is emulated
        with self._txn() as st:
            _, g = self._gpu(st, device)
        mib = _MEMORY_MIB.get(g.model) or migtables.MODELS[g.model].memory_gb * 1024
        total = mib << 20
        return c_nvmlMemory_t(total, total, 0)

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        with self._txn() as st:
            _, g, _ = self._mig_gpu(st, device, need_enabled=False)
            return [g.mig_current, g.mig_pending]

    # -------------------------------------------------------------------------------- NVML: GPU instances

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo")
        with self._txn() as st:
            _, _, geom = self._mig_gpu(st, device)
        if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        p = next((p for p in geom.profiles if p.nvml_index == profile), None)
        if p is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info: Any
        if version == 2:
            info = c_nvmlGpuInstanceProfileInfo_v2_t()
            info.name = f"MIG {p.name}".encode()
        elif version == 1:
            info = c_nvmlGpuInstanceProfileInfo_t()
        else:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        info.id = p.profile_id
        info.isP2pSupported = 0
        info.sliceCount = p.compute
        info.instanceCount = p.instances
        info.multiprocessorCount = p.compute * _SM_PER_SLICE
        info.copyEngineCount = p.compute
        info.decoderCount = p.compute // 2 + (1 if p.media else 0)
        info.encoderCount = 0
        info.jpegCount = 1 if p.ofa else 0
        info.ofaCount = 1 if p.ofa else 0
        info.memorySizeMB = geom.memory_gb * 1024 * p.size // geom.memory_slices
        return info

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device: Any, profileId: int, placementsRef: Any,
                                                   countRef: Any) -> int:
        """All placements of a profile, whether or not they are free (NVML's _v2 semantics); with
        placementsRef=None only the count is returned."""
        self._enter("nvmlDeviceGetGpuInstancePossiblePlacements")
        with self._txn() as st:
            _, _, geom = self._mig_gpu(st, device, need_enabled=False)
        p = self._profile_by_id(geom, profileId)
        count = _deref(countRef)
        if placementsRef is None:
            count.value = len(p.starts)
            return NVML_SUCCESS
        if len(placementsRef) < len(p.starts):
            count.value = len(p.starts)
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, s in enumerate(p.starts):
            placementsRef[i].start = s
            placementsRef[i].size = p.size
        count.value = len(p.starts)
        return NVML_SUCCESS

    nvmlDeviceGetGpuInstancePossiblePlacements_v2 = nvmlDeviceGetGpuInstancePossiblePlacements

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        self._enter("nvmlDeviceGetGpuInstanceRemainingCapacity")
        with self._txn() as st:
            _, g, geom = self._mig_gpu(st, device)
            p = self._profile_by_id(geom, profileId)
            return migtables.free_capacity(geom, self._placements(geom, g), p)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> Any:
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement")
        with self._txn(write=True) as st:
            index, g, geom = self._mig_gpu(st, device)
            p = self._profile_by_id(geom, profileId)
            pl = _deref(placement)
            start, size = int(pl.start), int(pl.size)
            why = migtables.refusal(geom, self._placements(geom, g), p, start)
            if why == "placement" or size != p.size:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if why is not None:  # memory slices in use, instance count reached, or the OFA held
                raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi = _GI(min(set(range(1, len(g.gis) + 2)) - set(g.gis)), p.profile_id, start, size, st.next_serial())
            g.gis[gi.id] = gi
            return self._gi_handle(index, gi)

    def nvmlDeviceGetGpuInstances(self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstances")
        with self._txn() as st:
            index, g, geom = self._mig_gpu(st, device)
            self._profile_by_id(geom, profileId)
            found = sorted((gi for gi in g.gis.values() if gi.profile_id == profileId), key=lambda gi: gi.id)
            count = _deref(countRef)
            if gpuInstancesRef is None or len(gpuInstancesRef) < len(found):
                count.value = len(found)
                raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
            for i, gi in enumerate(found):
                gpuInstancesRef[i] = self._gi_handle(index, gi)
            count.value = len(found)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        self._enter("nvmlDeviceGetGpuInstanceById")
        with self._txn() as st:
            index, g, _ = self._mig_gpu(st, device)
            gi = g.gis.get(gpuInstanceId)
            if gi is None:
                raise NVMLError(NVML_ERROR_NOT_FOUND)
            return self._gi_handle(index, gi)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> c_nvmlGpuInstanceInfo_t:
        self._enter("nvmlGpuInstanceGetInfo")
        with self._txn() as st:
            index, _, gi = self._gi(st, gpuInstance)
            info = c_nvmlGpuInstanceInfo_t()
            info.device = self._device(index)
            info.id = gi.id
            info.profileId = gi.profile_id
            info.placement.start = gi.start
            info.placement.size = gi.size
            return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        self._enter("nvmlGpuInstanceDestroy")
        with self._txn(write=True) as st:
            _, g, gi = self._gi(st, gpuInstance)
            if gi.cis or gi.busy:
                raise NVMLError(NVML_ERROR_IN_USE)
            del g.gis[gi.id]
        return NVML_SUCCESS

    # -------------------------------------------------------------------------------- NVML: compute instances

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpuInstance: Any, profile: int, engProfile: int,
                                                     version: int = 2) -> Any:
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
        with self._txn() as st:
            _, g, gi = self._gi(st, gpuInstance)
            geom = migtables.MODELS[g.model]
            gi_slices = self._profile_by_id(geom, gi.profile_id).compute
        if engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED or not 0 <= profile < \
                NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        slices = self._ci_profiles(gi_slices).get(profile)
        if slices is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info: Any
        if version == 2:
            info = c_nvmlComputeInstanceProfileInfo_v2_t()
            gi_name = self._profile_by_id(geom, gi.profile_id).name
            info.name = (f"MIG {gi_name}" if slices == gi_slices else f"MIG {slices}c.{gi_name}").encode()
        elif version == 1:
            info = c_nvmlComputeInstanceProfileInfo_t()
        else:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = gi_slices // slices
        info.multiprocessorCount = slices * _SM_PER_SLICE
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        self._enter("nvmlGpuInstanceCreateComputeInstance")
        with self._txn(write=True) as st:
            index, g, gi = self._gi(st, gpuInstance)
            gi_slices = self._profile_by_id(migtables.MODELS[g.model], gi.profile_id).compute
            slices = self._ci_profiles(gi_slices).get(profileId)
            if slices is None:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if sum(ci.slices for ci in gi.cis.values()) + slices > gi_slices:
                raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
            ci = _CI(min(set(range(len(gi.cis) + 1)) - set(gi.cis)), profileId, slices, st.next_serial())
            gi.cis[ci.id] = ci
            return self._ci_handle(index, gi, ci)

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance: Any, profileId: int, computeInstancesRef: Any,
                                           countRef: Any) -> int:
        self._enter("nvmlGpuInstanceGetComputeInstances")
        with self._txn() as st:
            index, _, gi = self._gi(st, gpuInstance)
            found = sorted((ci for ci in gi.cis.values() if ci.profile_id == profileId), key=lambda ci: ci.id)
            count = _deref(countRef)
            if computeInstancesRef is None or len(computeInstancesRef) < len(found):
                count.value = len(found)
                raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
            for i, ci in enumerate(found):
                computeInstancesRef[i] = self._ci_handle(index, gi, ci)
            count.value = len(found)
        return NVML_SUCCESS

    def _ci(self, st: _State, ref: Any) -> tuple[int, _Gpu, _GI, _CI]:
        h = _handle(ref, struct_c_nvmlComputeInstance_t)
        if h.gpu >= len(st.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g = st.gpus[h.gpu]
        gi = g.gis.get(h.gi)
        ci = gi.cis.get(h.id) if gi is not None else None
        if gi is None or ci is None or ci.serial != h.serial:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(h.gpu), g, gi, ci

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> c_nvmlComputeInstanceInfo_t:
        self._enter("nvmlComputeInstanceGetInfo")
        with self._txn() as st:
            index, _, gi, ci = self._ci(st, computeInstance)
            info = c_nvmlComputeInstanceInfo_t()
            info.device = self._device(index)
            info.gpuInstance = self._gi_handle(index, gi)
            info.id = ci.id
            info.profileId = ci.profile_id
            info.placement.start = sum(o.slices for o in gi.cis.values() if o.id < ci.id)
            info.placement.size = ci.slices
            return info

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        self._enter("nvmlComputeInstanceDestroy")
        with self._txn(write=True) as st:
            _, _, gi, ci = self._ci(st, computeInstance)
            if gi.busy:
                raise NVMLError(NVML_ERROR_IN_USE)
            del gi.cis[ci.id]
        return NVML_SUCCESS

    # -------------------------------------------------------------------------------- NVML: MIG devices

    def _mig_devices(self, g: _Gpu) -> list[tuple[_GI, _CI]]:
        return [(gi, ci) for gi in sorted(g.gis.values(), key=lambda x: x.id)
                for ci in sorted(gi.cis.values(), key=lambda x: x.id)]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        with self._txn() as st:
            _, _, geom = self._mig_gpu(st, device, need_enabled=False)
        return geom.compute_slices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        with self._txn() as st:
            gpu, g, geom = self._mig_gpu(st, device)
            if not 0 <= index < geom.compute_slices:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            devices = self._mig_devices(g)
            if index >= len(devices):
                raise NVMLError(NVML_ERROR_NOT_FOUND)
            gi, ci = devices[index]
        return self._keepalive(("mig", gpu, gi.id, ci.id, ci.serial),
                               lambda: struct_c_nvmlDevice_t(gpu, gi.id, ci.id, 1, ci.serial))

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> int:
        self._enter("nvmlDeviceIsMigDeviceHandle")
        return int(_handle(device, struct_c_nvmlDevice_t).is_mig)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        h = _handle(device, struct_c_nvmlDevice_t)
        if not h.is_mig:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(h.gi)

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        h = _handle(device, struct_c_nvmlDevice_t)
        if not h.is_mig:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(h.ci)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        h = _handle(migDevice, struct_c_nvmlDevice_t)
        if not h.is_mig:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._device(int(h.gpu))


# The module-level names pynvml users reach through the module object: constants, error classes, structures.
for _name, _value in list(globals().items()):
    if ((_name.startswith(("NVML_", "nvml")) and isinstance(_value, int)) or _name in _ERROR_CLASSES
            or _name.startswith(("c_nvml", "struct_c_nvml"))):
        setattr(FakeNVML, _name, _value)
del _name, _value

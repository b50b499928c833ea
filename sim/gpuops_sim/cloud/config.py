"""What the emulated cloud sells and how fast it moves: instance types and timing options."""

from __future__ import annotations

from dataclasses import dataclass

from gpuops_sim import gpus


@dataclass
class InstanceType:
    """A machine shape. `capacity` caps concurrent non-terminated instances (None: unlimited)."""

    name: str
    gpu_model: str | None
    gpus: int
    cpu: str = "64"
    memory: str = "512Gi"
    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.gpu_model is not None:
            gpus.model(self.gpu_model)  # fail at construction, not at the first launch
        if self.gpus < 0 or (self.gpu_model is None and self.gpus):
            raise ValueError(f"instance type {self.name!r}: gpus needs a gpu_model and must be >= 0")
        if self.capacity is not None and self.capacity < 0:
            raise ValueError(f"instance type {self.name!r}: capacity must be >= 0")


@dataclass
class CloudOptions:
    launch_seconds: float = 5.0  # pending -> running; then the machine boots (Machine.boot_seconds)
    boot_seconds: float = 10.0  # spot machine: running -> Node Ready
    device_plugin_seconds: float = 2.0
    terminate_seconds: float = 2.0  # shutting-down -> terminated
    reclaim_notice_seconds: float = 120.0
    terminated_visible_seconds: float = 3600.0
    token: str | None = None  # bearer token required on /power and /spot calls when set
    idempotency_seconds: float = 86400.0  # how long a power API Idempotency-Key replays its answer
    seed: int | None = None  # instance ids; None: random


def default_instance_types() -> list[InstanceType]:
    """A small catalogue covering the GPU models the sim knows, plus a CPU-only shape."""
    return [
        InstanceType("gpu.h100.8x", "H100-80GB", 8, "192", "2048Gi"),
        InstanceType("gpu.a100.8x", "A100-80GB", 8, "96", "1152Gi"),
        InstanceType("gpu.a100.1x", "A100-40GB", 1, "12", "85Gi"),
        InstanceType("gpu.l4.4x", "L4-24GB", 4, "48", "192Gi"),
        InstanceType("gpu.l4.1x", "L4-24GB", 1, "16", "64Gi"),
        InstanceType("gpu.t4.1x", "T4-16GB", 1, "8", "32Gi"),
        InstanceType("cpu.16x", None, 0, "16", "64Gi"),
    ]

"""Emulated NVIDIA GPUs: the models a simulated node can carry and the labels NVIDIA's stack puts on it.

MIG-capable models are those of the emulator's own MIG tables (`migtables`); a few common non-MIG models are
added so clusters can mix them. Labels follow GPU feature discovery (`nvidia.com/gpu.product`, `.count`,
`.memory` in MiB, `nvidia.com/mig.capable`), which is what node selectors and our controllers match on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import migtables

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class GPUModel:
    key: str  # our short name, e.g. "A100-40GB"
    product: str  # the gpu.product label GPU feature discovery writes
    memory_mib: int
    mig_capable: bool
    family: str


_PRODUCTS: dict[str, tuple[str, str]] = {
    "A100-40GB": ("NVIDIA-A100-SXM4-40GB", "ampere"),
    "A100-80GB": ("NVIDIA-A100-SXM4-80GB", "ampere"),
    "H100-80GB": ("NVIDIA-H100-80GB-HBM3", "hopper"),
    "H100-94GB": ("NVIDIA-H100-NVL", "hopper"),
    "H100-96GB": ("NVIDIA-H100-96GB-HBM3", "hopper"),
    "H200-141GB": ("NVIDIA-H200", "hopper"),
    "B200-180GB": ("NVIDIA-B200", "blackwell"),
    "A30-24GB": ("NVIDIA-A30", "ampere"),
}
_NON_MIG: tuple[GPUModel, ...] = (
    GPUModel("L4-24GB", "NVIDIA-L4", 23034, False, "ada-lovelace"),
    GPUModel("T4-16GB", "Tesla-T4", 15360, False, "turing"),
    GPUModel("L40S-48GB", "NVIDIA-L40S", 46068, False, "ada-lovelace"),
)


def _mig_models() -> tuple[GPUModel, ...]:
    out = []
    for key, tables in migtables.MODELS.items():
        product, family = _PRODUCTS[key]
        out.append(GPUModel(key, product, tables.memory_gb * 1024, True, family))
    return tuple(out)


MODELS: dict[str, GPUModel] = {m.key: m for m in (*_mig_models(), *_NON_MIG)}


def _spelling(name: str) -> str:
    """Case, spaces, dashes and underscores aside: NVML's "NVIDIA A100-SXM4-40GB" is GFD's "NVIDIA-A100-SXM4-40GB"."""
    return re.sub(r"[\s_-]+", "-", name.strip()).upper()


_BY_SPELLING: dict[str, GPUModel] = {_spelling(n): m for m in MODELS.values() for n in (m.key, m.product)}


def model(name: str) -> GPUModel:
    """Look a model up by our key, its GPU feature discovery product label, or the name NVML gives it (the
    label with spaces), in any case."""
    got = None
    if isinstance(name, str):
        got = MODELS.get(name) or _BY_SPELLING.get(_spelling(name))
    if got is None:
        raise ValueError(f"unknown GPU model {name!r}; known: {', '.join(MODELS)}")
    return got


def node_labels(model_name: str, count: int) -> dict[str, str]:
    """The labels GPU feature discovery would put on a node with `count` GPUs of this model."""
    m = model(model_name)
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": m.product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(m.memory_mib),
        "nvidia.com/gpu.family": m.family,
        "nvidia.com/mig.capable": "true" if m.mig_capable else "false",
        "gpuops.io/gpu-model": m.key,
    }

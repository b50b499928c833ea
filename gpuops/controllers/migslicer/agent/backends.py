"""Where the agent's NVML comes from: the real `pynvml` module on a GPU node, or an NVML-shaped module that
another installed distribution contributes (the emulator's fake driver, a vendor's shim).

Why an entry-point group rather than an import: the operator image carries no emulator code, yet the same
`gpuops agent --backend NAME` line must run on an emulated node once the emulator is installed. A distribution
adds a backend by declaring, in its `pyproject.toml`,

    [project.entry-points."gpuops.nvml_backends"]
    emulated = "its_package.module:factory"

where `factory(options: BackendOptions)` returns an object with the pynvml names `MigBackend` calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from .gpus import MigBackendError, load_pynvml

__all__ = ["ENTRY_POINT_GROUP", "BackendOptions", "backend_names", "load_nvml"]

ENTRY_POINT_GROUP = "gpuops.nvml_backends"
BUILTIN = "nvml"
_LIBRARY_NOT_FOUND = 12  # NVML_ERROR_LIBRARY_NOT_FOUND


@dataclass(frozen=True)
class BackendOptions:
    """What `gpuops agent` tells a backend: the node it serves and the flags meant for emulated drivers
    (`--gpus`, `--state-file`), which a real driver ignores."""

    node: str
    gpus: str = ""
    state_file: str | None = None


def backend_names() -> list[str]:
    """The backends `--backend` accepts here: the real driver and every installed contribution."""
    return [BUILTIN, *sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - {BUILTIN})]


def load_nvml(name: str, options: BackendOptions) -> Any:
    """The NVML-shaped module of backend `name`, or MigBackendError saying which backends exist."""
    if name == BUILTIN:
        return load_pynvml()
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            factory = ep.load()
        except ImportError as e:
            raise MigBackendError(f"NVML backend {name!r} ({ep.value}) cannot be imported: {e}",
                                  code=_LIBRARY_NOT_FOUND, retryable=False) from e
        return factory(options)
    hint = " (the emulated driver comes with the emulator: pip install gpuops-sim)" if name == "emulated" else ""
    raise MigBackendError(f"--backend {name!r}: no such NVML backend is installed; known: "
                          f"{', '.join(backend_names())}{hint}", code=_LIBRARY_NOT_FOUND, retryable=False)

"""What the agent's device plugins hand a container: the MIG slices it got, by UUID.

CDI naming: each slice is `nvidia.com/gpu=MIG-<uuid>`, the name NVIDIA's own CDI spec gives a MIG device under
`nvidia-ctk cdi generate --device-name-strategy=uuid`. Reusing NVIDIA's kind means the agent writes no CDI spec of
its own; that spec just has to be regenerated after slices are created or destroyed (MIG UUIDs are new with every
slice). `NVIDIA_VISIBLE_DEVICES` carries the same UUIDs for runtimes in legacy (non-CDI) mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gpuops.kube.deviceplugin.server import AllocationResult

__all__ = ["CDI_KIND", "mig_allocation"]

CDI_KIND: Final = "nvidia.com/gpu"
"""CDI vendor/class of MIG devices in NVIDIA's generated CDI spec."""


def mig_allocation(device_ids: Sequence[str], cdi_kind: str = CDI_KIND) -> AllocationResult:
    """The slices' UUIDs in `NVIDIA_VISIBLE_DEVICES` and as CDI devices of `cdi_kind`."""
    return AllocationResult(
        envs={"NVIDIA_VISIBLE_DEVICES": ",".join(device_ids)},
        cdi_devices=[f"{cdi_kind}={d}" for d in device_ids],
    )

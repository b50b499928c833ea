"""The autoprovision controller's settings, and how `gpuops run` knows the controller.

The flags (`--autoprovision-*`, `--secret-namespaces`) are the fields marked `flag(...)`; the others are
timings that tests and embedders tune and operators have not needed to."""

from __future__ import annotations

from typing import Annotated

import msgspec

from gpuops.controllers.secretscope import SecretNamespaces, SecretScope
from gpuops.kube.registry import ControllerDefinition
from gpuops.kube.settings import flag

__all__ = ["CONTROLLER", "Settings"]


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Cluster-wide knobs of the autoprovisioner."""

    min_warm_gpus: Annotated[int, flag("GPUs of powered-on, idle GPUNodeGroup machines kept warm for the next pods",
                                       metavar="N", ge=0)] = 0
    max_concurrent_power_offs: Annotated[int, flag("machines draining or powering off at once, at most",
                                                   metavar="N", ge=0)] = 10
    boot_backoff_base: float = 300.0
    boot_backoff_max: float = 1800.0
    drain_recheck: float = 2.0
    off_recheck: float = 5.0
    webhook_retry: float = 10.0
    refused_backoff_base: float = 10.0
    """After a webhook refuses a transition (4xx, bad URL or Secret): the first wait, doubling per refusal."""
    refused_backoff_max: float = 300.0
    secret_namespaces: SecretNamespaces = ()
    secret_scope: SecretScope = msgspec.field(default_factory=SecretScope)
    """Namespaces whose Secrets a group's secretRef may name; `setup` makes it the operator's own namespace plus
    `secret_namespaces`."""


CONTROLLER = ControllerDefinition("autoprovision", Settings, "gpuops.controllers.autoprovision.setup:setup",
                                crds=("gpuops.controllers.autoprovision.api:CRD",))

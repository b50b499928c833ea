"""The spot pool controller's settings, and how `gpuops run` knows the controller.

The flags (`--spotpool-*`, `--secret-namespaces`) are the fields marked `flag(...)`; the others are back-off
timings that tests and embedders tune."""

from __future__ import annotations

from typing import Annotated

import msgspec

from gpuops.controllers.secretscope import SecretNamespaces, SecretScope
from gpuops.kube.registry import ControllerDefinition
from gpuops.kube.settings import flag

__all__ = ["CONTROLLER", "MIN_RESYNC", "Settings"]

MIN_RESYNC = 1.0
"""Seconds: a shorter `--spotpool-resync` is raised to this (describing every pool more often only costs API
quota)."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Knobs of the spot pool reconciler."""

    resync_seconds: Annotated[float, flag(
        "describe every SpotPool's instances at least this often, to notice reclaims no node agent reported (node "
        f"events and pool changes describe at once; below {MIN_RESYNC:g} counts as {MIN_RESYNC:g})",
        metavar="SECONDS", name="resync", ge=0)] = 30.0
    launch_resolve_seconds: float = 300.0
    """Instances the cloud answered but describe never lists within this are taken as lost."""
    retry_base: float = 1.0
    retry_max: float = 60.0
    capacity_backoff_base: float = 30.0
    capacity_backoff_max: float = 600.0
    config_retry: float = 300.0
    """Credentials, quota and invalid-request errors: retried this rarely (a fix of the Secret or spec, which
    changes the pool or is seen on this timer, is what helps)."""
    drain_recheck: float = 2.0
    call_timeout: Annotated[float, flag(
        "how long one cloud API call of a SpotPool may take before it counts as failed (a launch that timed out is "
        "retried with the same client token)", metavar="SECONDS", gt=0)] = 15.0
    secret_recheck: float = 5.0
    """While the cloud refuses the keys (or the Secret is missing), the Secret is read again this often (a GET
    on the API server); the cloud is called again only once the Secret changed, or after config_retry."""
    secret_namespaces: SecretNamespaces = ()
    secret_scope: SecretScope = msgspec.field(default_factory=SecretScope)
    """Namespaces whose Secrets credentialsSecretRef may name; `setup` makes it the operator's own namespace
    plus `secret_namespaces`."""


CONTROLLER = ControllerDefinition("spotpool", Settings, "gpuops.controllers.spotpool.setup:setup",
                                crds=("gpuops.controllers.spotpool.api:CRD",))

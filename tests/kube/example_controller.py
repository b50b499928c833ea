"""An example controller written only against gpuops.kube's public API: a ConfigMap replicator.

For every ConfigMap labelled `copy=yes` it keeps a ConfigMap "<name>-copy" in the same namespace with the
same data (annotated with its source), and records on the source, as a status-like annotation, the hash of
the data last copied. Removing the label or deleting the source deletes the copy; deleting or editing the
copy restores it. Both directions come from one informer: sources map to themselves, copies map to their
source (a mapper), with predicates telling the two apart.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections import defaultdict
from typing import Annotated, Any

import msgspec

from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result, TerminalError, predicate_funcs
from gpuops.kube.errors import NotFound
from gpuops.kube.informer import Informer
from gpuops.kube.manager import Manager
from gpuops.kube.objects import ConfigMap
from gpuops.kube.registry import ControllerDefinition
from gpuops.kube.resources import CONFIGMAPS
from gpuops.kube.settings import flag

SOURCE_LABEL = "copy"
SOURCE_ANNOTATION = "replicator.example.com/source"
STATUS_ANNOTATION = "replicator.example.com/synced"


def is_copy(cm: ConfigMap) -> bool:
    return SOURCE_ANNOTATION in (cm.metadata.annotations or {})


def digest(data: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class Replicator:
    def __init__(self, client: Client, configmaps: Informer[ConfigMap], **controller_options: Any) -> None:
        self.client = client
        self.configmaps = configmaps
        self.attempts: dict[str, list[float]] = defaultdict(list)
        """Start times of every reconcile per key (for tests of backoff)."""
        self.controller = Controller("replicator", self.reconcile, client=client, **controller_options)
        self.controller.watch(configmaps, predicates=[predicate_funcs(lambda cm: not is_copy(cm))])
        self.controller.watch(configmaps, self.source_of, predicates=[predicate_funcs(is_copy)])

    @staticmethod
    def source_of(copy: ConfigMap) -> list[Request]:
        source = (copy.metadata.annotations or {}).get(SOURCE_ANNOTATION, "")
        return [Request(copy.metadata.namespace, source)] if source else []

    async def reconcile(self, req: Request) -> Result | None:
        self.attempts[req.key].append(time.monotonic())
        source = self.configmaps.store.get(req.key)
        copy_name = f"{req.name}-copy"
        copy = self.configmaps.store.get(f"{req.namespace}/{copy_name}")
        if source is not None and is_copy(source):
            return None
        wanted = (
            source is not None
            and (source.metadata.labels or {}).get(SOURCE_LABEL) == "yes"
            and source.metadata.deletion_timestamp is None
        )
        if not wanted:
            if copy is not None and (copy.metadata.annotations or {}).get(SOURCE_ANNOTATION) == req.name:
                with contextlib.suppress(NotFound):  # already gone
                    await self.client.delete(
                        CONFIGMAPS, copy_name, req.namespace, preconditions={"uid": copy.metadata.uid}
                    )
            if source is not None and STATUS_ANNOTATION in (source.metadata.annotations or {}):
                await self.client.patch(
                    CONFIGMAPS, req.name, {"metadata": {"annotations": {STATUS_ANNOTATION: None}}},
                    namespace=req.namespace,
                )
            return None

        assert source is not None
        data = dict(source.data or {})
        if copy is None:
            body = {
                "metadata": {
                    "name": copy_name,
                    "namespace": req.namespace,
                    "annotations": {SOURCE_ANNOTATION: req.name},
                },
                "data": data,
            }
            await self.client.create(CONFIGMAPS, body, req.namespace)
        elif (copy.metadata.annotations or {}).get(SOURCE_ANNOTATION) != req.name:
            raise TerminalError(f"{copy_name} exists and is not a copy of {req.name}")
        elif (copy.data or {}) != data:
            patch: dict[str, Any] = {k: None for k in (copy.data or {}) if k not in data}
            patch.update(data)
            await self.client.patch(CONFIGMAPS, copy_name, {"data": patch}, namespace=req.namespace)

        synced = digest(data)
        if (source.metadata.annotations or {}).get(STATUS_ANNOTATION) != synced:
            await self.client.patch(
                CONFIGMAPS, req.name, {"metadata": {"annotations": {STATUS_ANNOTATION: synced}}},
                namespace=req.namespace,
            )
        return None


class ReplicatorSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The controller's settings, defaults included; each `flag(...)` field is also a `gpuops run` flag
    (`--replicator-max-concurrent-reconciles`), added when the controller is registered."""

    max_concurrent_reconciles: Annotated[int, flag("ConfigMaps copied at once", metavar="N", ge=1)] = 2


CONTROLLER = ControllerDefinition("replicator", ReplicatorSettings, "example_controller:setup")
"""What a registry lists: the name (`--controllers replicator`), the settings and the lazily imported setup."""


def install(manager: Manager, **controller_options: Any) -> Replicator:
    """Informers from the manager, a controller added to it; returns the parts (tests look inside)."""
    replicator = Replicator(manager.client, manager.informer(CONFIGMAPS), **controller_options)
    manager.add(replicator.controller)
    return replicator


def setup(manager: Manager, settings: ReplicatorSettings) -> None:
    """The registry's entry: `gpuops run` calls it with the settings its flags gave."""
    install(manager, max_concurrent_reconciles=settings.max_concurrent_reconciles)

"""Trust without cert-manager: our CA kept in the caBundle of a MutatingWebhookConfiguration.

Each replica has a CA of its own (`certs.py`; in memory unless a directory is given). `CABundlePatcher` adds it
(never replaces) to every webhook of the configuration, so replicas with CAs of their own coexist in one bundle;
expired CAs are dropped and the bundle is capped (oldest other CAs first), so restarts without a persistent
directory do not grow it forever. It checks at start and then periodically, so a caBundle reset by a re-applied
manifest is repaired within one interval, and writes nothing while the bundle already holds our CA.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, Conflict, Invalid, NotFound
from gpuops.kube.resources import ResourceType

__all__ = ["MAX_CAS", "MUTATING_WEBHOOK_CONFIGURATIONS", "CABundlePatcher", "merge_ca_bundle"]

log = structlog.get_logger("gpuops.kube.admission.cabundle")

MAX_CAS: Final = 8
MISSING_RECHECK: Final = 5.0
"""Seconds between checks while the configuration does not exist (yet: it may be applied after the operator)."""

MUTATING_WEBHOOK_CONFIGURATIONS: Final[ResourceType[dict[str, Any]]] = ResourceType(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
    False, dict,
)


def _certs_of(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _pem(certs: Sequence[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def merge_ca_bundle(current: bytes, ours: bytes, *, now: datetime.datetime | None = None,
                    max_cas: int = MAX_CAS) -> bytes:
    """`current` (PEM) with our CA(s) in it: existing order kept, ours appended when missing, expired ones
    dropped, then the oldest other CAs dropped beyond `max_cas`. A bundle that does not parse is replaced.

    Order-stable on purpose: replicas that each put themselves first would rewrite the bundle forever."""
    t = now or datetime.datetime.now(datetime.UTC)
    mine = _certs_of(ours)
    if not mine:
        raise ValueError("our CA bundle holds no certificate")
    kept: list[x509.Certificate] = []
    for cert in _certs_of(current):
        if cert.not_valid_after_utc > t and cert not in kept:
            kept.append(cert)
    kept += [c for c in mine if c not in kept]
    while len(kept) > max(max_cas, len(mine)):
        oldest = min((c for c in kept if c not in mine), key=lambda c: c.not_valid_before_utc)
        kept.remove(oldest)
    return _pem(kept)


def _decoded(ca_bundle: Any) -> bytes:
    if not isinstance(ca_bundle, str) or not ca_bundle:
        return b""
    try:
        return base64.b64decode(ca_bundle, validate=True)
    except (ValueError, binascii.Error):
        return b""


@dataclass
class CABundlePatcher:
    """Keeps our CA in `webhooks[*].clientConfig.caBundle` of the MutatingWebhookConfiguration `config_name`."""

    client: Client
    config_name: str
    ca_pem: Callable[[], bytes]
    field_manager: str
    """The field manager of our writes (one per configuration, so `kubectl` shows who keeps which caBundle)."""
    interval: float = 60.0
    max_cas: int = MAX_CAS
    writes: int = 0
    trusted: bool = False
    """Our CA was seen in (or written to) every webhook's caBundle by the last successful check, or there is no
    configuration to call us. Readiness waits for it: the API server calls any ready replica."""
    _wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _missing_logged: bool = field(default=False, repr=False)

    def poke(self) -> None:
        """Check now rather than at the next interval."""
        self._wake.set()

    async def sync(self) -> bool:
        """One check; True if it wrote. A concurrent writer (another replica) makes it re-read and retry."""
        for attempt in range(3):
            try:
                return await self._sync_once()
            except (Conflict, Invalid):  # the resourceVersion test failed: someone wrote in between
                if attempt == 2:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
        return False

    async def _sync_once(self) -> bool:
        config = await self.client.get(MUTATING_WEBHOOK_CONFIGURATIONS, self.config_name)
        meta = config.get("metadata") or {}
        ours = self.ca_pem()
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion", "")},
        ]
        for i, hook in enumerate(config.get("webhooks") or []):
            client_config = hook.get("clientConfig") if isinstance(hook, Mapping) else None
            if not isinstance(client_config, Mapping):
                continue
            current = _decoded(client_config.get("caBundle"))
            merged = merge_ca_bundle(current, ours, max_cas=self.max_cas)
            if merged != current:
                ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                            "value": base64.b64encode(merged).decode()})
        if len(ops) == 1:
            return False
        await self.client.patch(MUTATING_WEBHOOK_CONFIGURATIONS, self.config_name, ops, patch_type="json",
                                field_manager=self.field_manager)
        self.writes += 1
        log.info("webhook caBundle patched", configuration=self.config_name, webhooks=len(ops) - 1)
        return True

    async def run(self) -> None:
        """Check at start, then every `interval` (sooner after a failure, or when poked); never raises."""
        failures = 0
        while True:
            self._wake.clear()
            delay = self.interval
            try:
                await self.sync()
                failures, self._missing_logged = 0, False
                self.trusted = True
            except NotFound:
                self.trusted = True  # nothing calls the webhook until the configuration exists
                delay = min(self.interval, MISSING_RECHECK)  # once it does, it needs our CA soon
                if not self._missing_logged:
                    log.warning("MutatingWebhookConfiguration not found; the webhook is not called until it "
                                "exists", configuration=self.config_name)
                    self._missing_logged = True
            except (ApiError, ValueError) as e:
                failures += 1
                delay = min(self.interval, 0.5 * 2 ** min(failures, 7))
                log.warning("patching the webhook caBundle failed", configuration=self.config_name, error=str(e),
                            retry_in=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

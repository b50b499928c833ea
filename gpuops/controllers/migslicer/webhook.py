"""The MIG slicer's mutating admission webhook: an HTTPS endpoint the apiserver calls on every pod CREATE
(`manifests/webhook/`), plus what keeps the apiserver able to trust it.

Served on every replica, leader or not: the Service load-balances the apiserver's calls over all operator pods,
and with `failurePolicy: Fail` a replica that does not answer fails pod creations.

Trust without cert-manager: each replica has a CA (`certs.py`; in memory unless a directory is given) and
`CABundlePatcher` keeps that CA in the caBundle of every webhook of the MutatingWebhookConfiguration. It adds
(never replaces) its CA, so replicas with CAs of their own coexist in one bundle; expired CAs are dropped and the
bundle is capped (oldest other CAs first), so restarts without a persistent directory do not grow it forever.
It checks at start and then periodically, so a caBundle reset by a re-applied manifest is repaired within
one interval, and writes nothing while the bundle already holds our CA.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import datetime
import functools
import multiprocessing
import pickle
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import Counter, Histogram

from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, Conflict, Invalid, NotFound
from gpuops.kube.manager import Manager
from gpuops.kube.resources import ResourceType

from .certs import (
    ROTATION_MARGIN,
    ServingCerts,
    load_into,
    load_or_create,
    renew,
    server_ssl_context,
    service_dns_names,
)
from .mutation import MutationResult, mutate
from .settings import DEFAULT_NAMESPACE, DEFAULT_PORT, DEFAULT_SERVICE
from .webhook_http import Answer, HttpServer, Limits

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "DEFAULT_NAMESPACE",
    "DEFAULT_PORT",
    "DEFAULT_SERVICE",
    "MUTATE_PATH",
    "MUTATING_WEBHOOK_CONFIGURATIONS",
    "REQUESTS",
    "REQUEST_SECONDS",
    "CABundlePatcher",
    "CertKeeper",
    "MigWebhook",
    "WebhookServer",
    "install",
    "merge_ca_bundle",
]

log = structlog.get_logger("gpuops.controllers.migslicer.webhook")

MUTATE_PATH: Final = "/mutate-pods"
HEALTH_PATH: Final = "/healthz"
DEFAULT_CONFIG_NAME: Final = "gpuops-mig-slicer"
FIELD_MANAGER: Final = "gpuops-mig-slicer-cabundle"
ADMISSION_V1: Final = "admission.k8s.io/v1"
MAX_BODY: Final = 3 * 1024 * 1024 + 64 * 1024
"""The apiserver's own request limit (3 MiB) plus the AdmissionReview around the pod."""
MAX_CAS: Final = 8

MUTATING_WEBHOOK_CONFIGURATIONS: Final[ResourceType[dict[str, Any]]] = ResourceType(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
    False, dict,
)

REQUESTS: Final = Counter(
    "gpuops_migslicer_webhook_requests_total",
    "AdmissionReviews answered by the MIG slicer webhook, by result (mutated, unchanged, denied, error).",
    ["result"],
)
REQUEST_SECONDS: Final = Histogram(
    "gpuops_migslicer_webhook_request_duration_seconds",
    "Time to answer one AdmissionReview, reading the body included (the apiserver's timeout is 5 s).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


# ---------------------------------------------------------------------------------------------- certificates


class CertKeeper:
    """The replica's current certificates, renewed in place before they expire.

    `before_new_ca` hooks run (awaited) after a CA rotation and before the server presents a certificate of the
    new CA, so the caBundle already trusts it when the first handshake uses it."""

    def __init__(self, names: Sequence[str], directory: str | None = None, *,
                 margin: datetime.timedelta = ROTATION_MARGIN) -> None:
        self.names = list(names)
        self.directory = directory
        self.margin = margin
        self.current: ServingCerts = load_or_create(self.names, directory, margin=margin)
        self.before_new_ca: list[Callable[[], Awaitable[object]]] = []
        self._ca_pending = False

    def ca_pem(self) -> bytes:
        return self.current.ca_bundle_pem

    @property
    def ca_pending(self) -> bool:
        """A new CA whose `before_new_ca` hooks have not all succeeded yet: keep presenting the old certificate."""
        return self._ca_pending

    async def refresh(self, now: datetime.datetime | None = None) -> bool:
        """Renew what is due (True if anything was), then run the new-CA hooks until they have succeeded."""
        fresh = renew(self.current, self.names, self.directory, now=now, margin=self.margin)
        if fresh is not None:
            self._ca_pending = self._ca_pending or fresh.ca.cert_pem != self.current.ca.cert_pem
            self.current = fresh
        if self._ca_pending:
            for hook in self.before_new_ca:
                await hook()
            self._ca_pending = False
        return fresh is not None


# ---------------------------------------------------------------------------------------------- the server


class _BadReview(ValueError):
    pass


def _parse_review(body: Any) -> tuple[str, Mapping[str, Any]]:
    """(uid, request) of an admission.k8s.io/v1 AdmissionReview; anything else is the caller's error (400)."""
    if not isinstance(body, Mapping):
        raise _BadReview("the body is not a JSON object")
    if body.get("apiVersion") != ADMISSION_V1 or body.get("kind") != "AdmissionReview":
        raise _BadReview(f"expected an AdmissionReview of {ADMISSION_V1}, got apiVersion={body.get('apiVersion')!r} "
                         f"kind={body.get('kind')!r}")
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise _BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise _BadReview("the AdmissionReview request has no uid")
    obj = request.get("object")
    if obj is not None and not isinstance(obj, Mapping):
        raise _BadReview("request.object is not an object")
    return uid, request


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind") or {}
    return (
        request.get("operation") == "CREATE"
        and isinstance(kind, Mapping)
        and (kind.get("group"), kind.get("kind")) == ("", "Pod")
        and not request.get("subResource")
        and isinstance(request.get("object"), Mapping)
    )


def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": ADMISSION_V1, "kind": "AdmissionReview", "response": response}


def _pod_ref(request: Mapping[str, Any]) -> str:
    meta = (request.get("object") or {}).get("metadata") or {}
    name = meta.get("name") or request.get("name") or (f"{meta.get('generateName')}*" if meta.get("generateName")
                                                        else "?")
    return f"{request.get('namespace') or meta.get('namespace') or ''}/{name}"


class WebhookServer:
    """HTTPS on a thread and event loop of its own (webhook_http.py): POST /mutate-pods (AdmissionReview in,
    AdmissionReview out), GET /healthz."""

    def __init__(
        self,
        certs: CertKeeper | ServingCerts,
        *,
        host: str | None = None,
        port: int = DEFAULT_PORT,
        mutate_pod: Callable[[Mapping[str, Any]], MutationResult] = mutate,
        cert_check_interval: float = 3600.0,
        limits: Limits | None = None,
    ) -> None:
        self.keeper = certs if isinstance(certs, CertKeeper) else None
        initial = certs.current if isinstance(certs, CertKeeper) else certs
        self.host = host
        self.port = port
        self.cert_check_interval = cert_check_interval
        self._mutate = mutate_pod
        self._ssl = server_ssl_context(initial.serving)
        self._loaded = initial.serving
        self._limits = limits or Limits(max_body_bytes=MAX_BODY)
        self._http: HttpServer | None = None
        self._pool: concurrent.futures.Executor | None = None
        self._started = asyncio.Event()

    @property
    def url(self) -> str:
        return f"https://{self.host or '127.0.0.1'}:{self.port}{MUTATE_PATH}"

    async def start(self) -> None:
        http = HttpServer(self._answer, self._ssl, self.host, self.port, self._limits)
        await http.start()
        self._http = http
        self.port = http.port
        self._started.set()
        log.info("MIG slicer webhook serving", address=f"{self.host or '*'}:{self.port}", path=MUTATE_PATH)

    async def stop(self) -> None:
        self._started.clear()
        http, self._http = self._http, None
        if http is not None:
            await http.stop()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def wait_started(self) -> None:
        await self._started.wait()

    @property
    def listening(self) -> bool:
        return self._started.is_set()

    async def __aenter__(self) -> WebhookServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run(self) -> None:
        """Serve until cancelled, renewing the serving certificate in place when it comes due."""
        await self.start()
        try:
            while True:
                await asyncio.sleep(self.cert_check_interval)
                await self.refresh_certificates()
        finally:
            await asyncio.shield(self.stop())

    async def refresh_certificates(self, now: datetime.datetime | None = None) -> bool:
        """Renew when due and present the new certificate (once the caBundle trusts its CA); True if swapped."""
        if self.keeper is None:
            return False
        try:
            await self.keeper.refresh(now)
        except Exception:  # keep serving the old certificate; the next check tries again
            log.exception("renewing the webhook certificate failed")
        serving = self.keeper.current.serving
        if self.keeper.ca_pending or serving == self._loaded:
            return False
        swap = functools.partial(load_into, self._ssl, serving)
        if self._http is not None:  # between handshakes, on the server's own loop
            await asyncio.wrap_future(self._http.call(swap))
        else:
            swap()
        self._loaded = serving
        log.info("webhook serving certificate swapped", expires=serving.cert.not_valid_after_utc.isoformat())
        return True

    # ------------------------------------------------------------------------------------------ handlers
    # These run on the webhook's own thread (webhook_http.py), never on the controllers' event loop.

    async def _answer(self, method: str, path: str, body: bytes) -> Answer:
        if path == HEALTH_PATH:
            return Answer(200, b"ok", "text/plain") if method in ("GET", "HEAD") else _text(405, "use GET")
        if path != MUTATE_PATH:
            return _text(404, f"no such path: {path[:100]}; the webhook serves {MUTATE_PATH}")
        if method != "POST":
            return _text(405, "POST an AdmissionReview")
        start = time.perf_counter()
        result = "error"
        try:
            reviewed = await self._reviewed(body)
            for level, event, fields in reviewed.notes:
                getattr(log, level)(event, **fields)
            result = reviewed.result
            return reviewed.answer
        finally:
            REQUESTS.labels(result).inc()
            REQUEST_SECONDS.observe(time.perf_counter() - start)

    async def _reviewed(self, body: bytes) -> Reviewed:
        """Small reviews here; large ones in the worker process, whose CPU (decoding, mutating a pod of
        thousands of containers) then holds no lock this process's threads wait on."""
        if len(body) <= INLINE_BODY:
            return review(body, self._mutate)
        if self._pool is None:
            self._pool = _worker_pool(self._mutate)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, review, body, self._mutate)
        except concurrent.futures.BrokenExecutor:  # the worker died (killed, out of memory): a new one next time
            pool, self._pool = self._pool, None
            pool.shutdown(wait=False, cancel_futures=True)
            return Reviewed(_text(500, "the review worker failed; retry"), "error",
                            (("error", "webhook review worker died", {}),))


INLINE_BODY: Final = 64 * 1024
"""Reviews up to this size are answered on the server's thread; larger ones in the worker process."""


def _worker_pool(mutate_pod: Callable[[Mapping[str, Any]], MutationResult]) -> concurrent.futures.Executor:
    """One worker process (started the spawn way: the operator has threads, which fork would copy mid-flight),
    or a thread when the mutation cannot be sent to a process (a closure in tests)."""
    try:
        pickle.dumps(mutate_pod)
    except (pickle.PicklingError, AttributeError, TypeError):
        return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gpuops-webhook-review")
    return concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))


@dataclass(frozen=True, slots=True)
class Reviewed:
    answer: Answer
    result: str
    """The requests metric's label: mutated, unchanged, denied or error."""
    notes: tuple[tuple[str, str, dict[str, Any]], ...] = ()
    """Log lines (level, event, fields) for the server to write: a worker process has no log of its own."""


def review(body: bytes, mutate_pod: Callable[[Mapping[str, Any]], MutationResult]) -> Reviewed:
    """The answer to one AdmissionReview body; pure, so that it can run in a worker process."""
    try:
        uid, req = _parse_review(_decode(body))
    except _BadReview as e:
        return Reviewed(_text(400, f"bad AdmissionReview: {e}"), "error")
    if not _is_pod_create(req):  # a misconfigured rule: never block what we do not handle
        return Reviewed(_json({"uid": uid, "allowed": True}), "unchanged")
    try:
        outcome = mutate_pod(req["object"])
    except Exception:
        return Reviewed(_text(500, "internal error while mutating the pod"), "error",
                        (("error", "mutating a pod failed", {"pod": _pod_ref(req), "error": traceback.format_exc()}),))
    response: dict[str, Any] = {"uid": uid, "allowed": outcome.denied is None}
    result = "unchanged"
    notes: list[tuple[str, str, dict[str, Any]]] = []
    if outcome.denied is not None:
        result = "denied"
        response["status"] = {"status": "Failure", "code": 403, "reason": "Forbidden", "message": outcome.denied}
        notes.append(("info", "pod denied", {"pod": _pod_ref(req), "reason": outcome.denied}))
    elif outcome.patch:
        result = "mutated"
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(msgspec.json.encode(outcome.patch)).decode()
        notes.append(("debug", "pod mutated", {"pod": _pod_ref(req), "operations": len(outcome.patch)}))
    if outcome.warnings:
        response["warnings"] = list(outcome.warnings)
    return Reviewed(_json(response), result, tuple(notes))


MAX_DEPTH: Final = 64
"""Nesting a review may have: a pod nests about 15 levels (managedFields about 20); deeper is refused (400)."""


def _decode(body: bytes) -> Any:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise _BadReview(f"not JSON: {e}") from None
    except RecursionError:
        raise _BadReview(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if _deeper_than(doc, MAX_DEPTH):
        raise _BadReview(f"JSON nested deeper than {MAX_DEPTH} levels")
    return doc


def _deeper_than(doc: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        if children and depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _text(status: int, text: str) -> Answer:
    return Answer(status, f"{text}\n".encode(), "text/plain")


def _json(response: dict[str, Any]) -> Answer:
    return Answer(200, msgspec.json.encode(_review(response)))


# ---------------------------------------------------------------------------------------------- caBundle


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
                                field_manager=FIELD_MANAGER)
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


# ---------------------------------------------------------------------------------------------- wiring


@dataclass(frozen=True, slots=True)
class MigWebhook:
    certs: CertKeeper
    server: WebhookServer
    patcher: CABundlePatcher | None


def install(
    manager: Manager,
    *,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    port: int = DEFAULT_PORT,
    config_name: str = DEFAULT_CONFIG_NAME,
    host: str | None = None,
    cert_dir: str | None = None,
    extra_names: Sequence[str] = (),
    patch_ca_bundle: bool = True,
    ca_check_interval: float = 60.0,
    cert_check_interval: float = 3600.0,
) -> MigWebhook:
    """Add the webhook server and the caBundle patcher to `manager`, both on every replica (no leadership).

    `service`/`namespace` name the Service the configuration points at (the certificate covers
    `<service>.<namespace>.svc[.cluster.local]` plus `extra_names`, DNS names or IPs); `port` is the pod port
    the Service targets; `cert_dir` keeps the CA across restarts when it is a writable volume. Set
    `patch_ca_bundle=False` when something else (cert-manager's cainjector) owns the caBundle."""
    keeper = CertKeeper([*service_dns_names(service, namespace), *extra_names], cert_dir)
    server = WebhookServer(keeper, host=host, port=port, cert_check_interval=cert_check_interval)
    patcher: CABundlePatcher | None = None
    if patch_ca_bundle:
        patcher = CABundlePatcher(manager.client, config_name, keeper.ca_pem, interval=ca_check_interval)
        keeper.before_new_ca.append(patcher.sync)
        manager.add_runnable("migslicer-webhook-cabundle", patcher.run, need_leader_election=False)
    manager.add_runnable("migslicer-webhook", server.run, need_leader_election=False)

    def ready() -> str | None:
        """With `failurePolicy: Fail`, a replica the Service routes to before it serves, or before the API server
        trusts its CA, refuses MIG pods: keep it out of the endpoints until both hold."""
        if not server.listening:
            return "the webhook server is not listening yet"
        if patcher is not None and not patcher.trusted:
            return f"our CA is not yet in the caBundle of {config_name}"
        return None

    manager.readyz.add("mig-webhook", ready)
    return MigWebhook(keeper, server, patcher)

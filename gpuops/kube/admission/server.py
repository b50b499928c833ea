"""An HTTPS admission webhook server: AdmissionReviews of pod CREATEs in, answers out, one route per path.

Served on every replica, leader or not: the Service load-balances the apiserver's calls over all operator pods.
Each route brings its own mutation and its own request metrics (so a controller's dashboards keep their
names); the server brings what every route needs: the TLS certificate (renewed in place, presented only once
the caBundle trusts its CA), the connection limits of http.py, and a worker process for large reviews.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import multiprocessing
import pickle
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog
from prometheus_client import Counter, Histogram

from .certs import CertKeeper, ServingCerts, load_into, server_ssl_context
from .http import Answer, HttpServer, Limits
from .review import MutationResult, Reviewed, review, text_answer

__all__ = ["HEALTH_PATH", "MAX_BODY", "Route", "WebhookServer"]

log = structlog.get_logger("gpuops.kube.admission")

HEALTH_PATH: Final = "/healthz"
MAX_BODY: Final = 3 * 1024 * 1024 + 64 * 1024
"""The apiserver's own request limit (3 MiB) plus the AdmissionReview around the pod."""


@dataclass(frozen=True, slots=True)
class Route:
    """What the server does with a review POSTed to one path."""

    name: str
    """The webhook's name in logs."""
    mutate: Callable[[Mapping[str, Any]], MutationResult]
    """The pod in, the patch (or the denial) out; a plain function: it may run on the server's thread or in a
    worker process, never on the controllers' event loop."""
    requests: Counter
    """Reviews answered, by result (mutated, unchanged, denied, error)."""
    seconds: Histogram
    """Time to answer one review, reading the body included."""
    offload: bool = True
    """Send reviews larger than INLINE_BODY to a worker process (when the mutation can be sent there)."""


class WebhookServer:
    """HTTPS on a thread and event loop of its own (http.py): POST an AdmissionReview to a route's path, get
    one back; GET /healthz."""

    def __init__(
        self,
        certs: CertKeeper | ServingCerts,
        *,
        host: str | None = None,
        port: int,
        routes: Mapping[str, Route],
        cert_check_interval: float = 3600.0,
        limits: Limits | None = None,
    ) -> None:
        self.keeper = certs if isinstance(certs, CertKeeper) else None
        initial = certs.current if isinstance(certs, CertKeeper) else certs
        self.host = host
        self.port = port
        self.cert_check_interval = cert_check_interval
        self.routes = dict(routes)
        self._ssl = server_ssl_context(initial.serving)
        self._loaded = initial.serving
        self._limits = limits or Limits(max_body_bytes=MAX_BODY)
        self._http: HttpServer | None = None
        self._pools: dict[str, concurrent.futures.Executor] = {}
        self._started = asyncio.Event()

    def url(self, path: str) -> str:
        return f"https://{self.host or '127.0.0.1'}:{self.port}{path}"

    async def start(self) -> None:
        http = HttpServer(self._answer, self._ssl, self.host, self.port, self._limits)
        await http.start()
        self._http = http
        self.port = http.port
        self._started.set()
        log.info("admission webhook serving", address=f"{self.host or '*'}:{self.port}", paths=sorted(self.routes))

    async def stop(self) -> None:
        self._started.clear()
        http, self._http = self._http, None
        if http is not None:
            await http.stop()
        pools, self._pools = self._pools, {}
        for pool in pools.values():
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
            return Answer(200, b"ok", "text/plain") if method in ("GET", "HEAD") else text_answer(405, "use GET")
        route = self.routes.get(path)
        if route is None:
            return text_answer(404, f"no such path: {path[:100]}; the webhook serves {', '.join(sorted(self.routes))}")
        if method != "POST":
            return text_answer(405, "POST an AdmissionReview")
        start = time.perf_counter()
        result = "error"
        try:
            reviewed = await self._reviewed(path, route, body)
            for level, event, fields in reviewed.notes:
                getattr(log, level)(event, webhook=route.name, **fields)
            result = reviewed.result
            return reviewed.answer
        finally:
            route.requests.labels(result).inc()
            route.seconds.observe(time.perf_counter() - start)

    async def _reviewed(self, path: str, route: Route, body: bytes) -> Reviewed:
        """Small reviews here; large ones in the route's worker process, whose CPU (decoding, mutating a pod of
        thousands of containers) then holds no lock this process's threads wait on."""
        if len(body) <= INLINE_BODY or not route.offload:
            return review(body, route.mutate)
        pool = self._pools.get(path)
        if pool is None:
            pool = self._pools[path] = _worker_pool(route.mutate)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, review, body, route.mutate)
        except concurrent.futures.BrokenExecutor:  # the worker died (killed, out of memory): a new one next time
            self._pools.pop(path, None)
            pool.shutdown(wait=False, cancel_futures=True)
            return Reviewed(text_answer(500, "the review worker failed; retry"), "error",
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

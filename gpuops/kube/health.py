"""The manager's HTTP side: /metrics, and /healthz and /readyz probes with named checks.

Probes follow the Kubernetes healthz conventions (k8s.io/apiserver healthz, controller-runtime's
pkg/healthz): `/healthz` runs every check and answers 200 "ok"; `?verbose` lists each check
("[+]ping ok"); `?exclude=<name>` (repeatable) skips one; a failure answers 500 with the verbose list
whatever was asked; `/healthz/<name>` runs one check. Unlike upstream, a failed check's reason is
shown ("[-]informers failed: pods not synced") instead of "reason withheld": our reasons carry no secrets,
and they save a trip to the logs.

A check is a plain or async callable returning None/True (pass), or False / a string / raising (fail,
the string or exception being the reason).
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs

import structlog
from aiohttp import web
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from . import metrics
from .redact import SECRET_VALUES

__all__ = [
    "Check",
    "CheckResult",
    "Checks",
    "Guard",
    "HTTPServer",
    "LoopLagMonitor",
    "informers_check",
    "metrics_app",
    "parse_bind_address",
    "ping",
    "probes_app",
]

log = structlog.get_logger("gpuops.kube.health")

CheckOutcome = bool | str | None
Check = Callable[[], CheckOutcome | Awaitable[CheckOutcome]]

CHECK_TIMEOUT = 5.0
"""A check slower than this fails (a probe must answer before the kubelet's timeout)."""


def ping() -> None:
    """The trivial check: the server answers."""


# ---------------------------------------------------------------------------------------------- checks


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    reason: str = ""
    excluded: bool = False


class Checks:
    """An ordered set of named checks behind one probe path (`healthz` or `readyz`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._checks: dict[str, Check] = {"ping": ping}

    def add(self, name: str, check: Check) -> None:
        if not name or "/" in name:
            raise ValueError(f"check name {name!r}: must be non-empty without '/'")
        if name in self._checks:
            raise ValueError(f"{self.name} check {name!r} already exists")
        self._checks[name] = check

    def names(self) -> list[str]:
        return list(self._checks)

    async def run_one(self, name: str) -> CheckResult:
        check = self._checks[name]
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                outcome = check()
                if inspect.isawaitable(outcome):
                    outcome = await outcome
        except TimeoutError:
            return CheckResult(name, False, f"no answer within {CHECK_TIMEOUT:g}s")
        except Exception as e:
            return CheckResult(name, False, str(e) or type(e).__name__)
        if outcome is None or outcome is True:
            return CheckResult(name, True)
        return CheckResult(name, False, outcome if isinstance(outcome, str) and outcome else "failed")

    async def run(self, exclude: Iterable[str] = ()) -> list[CheckResult]:
        skip = set(exclude)
        results = []
        for name in self._checks:
            if name in skip:
                results.append(CheckResult(name, True, excluded=True))
            else:
                results.append(await self.run_one(name))
        return results

    async def ok(self) -> bool:
        return all(r.ok for r in await self.run())

    # ------------------------------------------------------------------------------------------ HTTP

    async def handle(self, request: web.Request) -> web.Response:
        query = parse_qs(request.query_string, keep_blank_values=True)
        verbose = "verbose" in query
        exclude = [v for value in query.get("exclude", ()) for v in value.split(",") if v]
        results = await self.run(exclude)
        unknown = sorted(set(exclude) - set(self._checks))
        lines = []
        for r in results:
            if r.excluded:
                lines.append(f"[+]{r.name} excluded: ok")
            elif r.ok:
                lines.append(f"[+]{r.name} ok")
            else:
                lines.append(f"[-]{r.name} failed: {r.reason}")
        if unknown:
            quoted = ", ".join(f'"{n}"' for n in unknown)
            lines.append(f"warn: some health checks cannot be excluded: no matches for {quoted}")
        failed = [r for r in results if not r.ok]
        if failed:
            log.info(f"{self.name} check failed", failed={r.name: r.reason for r in failed})
            return _text("\n".join(lines) + f"\n{self.name} check failed\n", 500)
        if not verbose:
            return _text("ok")
        return _text("\n".join(lines) + f"\n{self.name} check passed\n")

    async def handle_one(self, request: web.Request) -> web.Response:
        name = request.match_info["check"]
        if name not in self._checks:
            return _text(f"no {self.name} check named {name!r}\n", 404)
        result = await self.run_one(name)
        if result.ok:
            return _text("ok")
        return _text(f"internal server error: {result.reason}\n", 500)


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body,
        status=status,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


# ---------------------------------------------------------------------------------------------- standard checks


class FreshInformer(Protocol):
    name: str

    def synced(self) -> bool: ...

    def last_event_age(self) -> float: ...


def informers_check(informers: Callable[[], Iterable[FreshInformer]], max_silence: float) -> Check:
    """Ready when every informer has synced and heard from the API server (event, bookmark or list) within
    `max_silence` seconds: a silent watch serves an ever staler cache."""

    def check() -> str | None:
        problems = []
        for inf in informers():
            if not inf.synced():
                problems.append(f"{inf.name} not synced")
            else:
                age = inf.last_event_age()
                if age > max_silence:
                    problems.append(f"{inf.name} silent for {age:.0f}s (> {max_silence:g}s)")
        return "; ".join(problems) or None

    return check


class LoopLagMonitor:
    """Measures how late a periodic timer fires; a loop that is blocked or overloaded shows as lag.

    The check fails when the worst lag within the last `window` seconds exceeded `threshold`, or when the
    monitor itself stopped ticking. (A loop blocked right now cannot answer the probe at all: the kubelet's
    probe timeout covers that case.)
    """

    def __init__(self, interval: float = 0.5, threshold: float = 5.0, window: float = 30.0) -> None:
        self.interval = interval
        self.threshold = threshold
        self.window = window
        self.lag = 0.0
        self.last_tick = time.monotonic()
        self._history: deque[tuple[float, float]] = deque()  # (when, lag) above threshold

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.tick(max(0.0, loop.time() - due))

    def tick(self, lag: float) -> None:
        now = time.monotonic()
        self.lag = lag
        self.last_tick = now
        metrics.EVENT_LOOP_LAG.set(lag)
        if lag > self.threshold:
            self._history.append((now, lag))
        while self._history and now - self._history[0][0] > self.window:
            self._history.popleft()

    def check(self) -> str | None:
        now = time.monotonic()
        silent = now - self.last_tick
        if silent > self.interval + self.threshold:
            return f"event loop probe has not run for {silent:.1f}s"
        recent = [lag for when, lag in self._history if now - when <= self.window]
        if recent:
            return f"event loop lagged {max(recent):.2f}s (> {self.threshold:g}s) within the last {self.window:g}s"
        return None


# ---------------------------------------------------------------------------------------------- HTTP servers


def parse_bind_address(address: str) -> tuple[str | None, int] | None:
    """controller-runtime's bind addresses: "0" (or "") disables; ":8080" is every interface; "host:port";
    "[::1]:8080". Port 0 picks a free port."""
    if address in ("", "0"):
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bind address {address!r}: expected [host]:port, or 0 to disable")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or None, int(port))


Guard = Callable[[web.Request], Awaitable[web.StreamResponse | None]]
"""Runs before every handler of an app: None lets the request through, a response answers it instead."""


def metrics_app(registry: CollectorRegistry = REGISTRY, *, guard: Guard | None = None) -> web.Application:
    """/metrics in the Prometheus text format (OpenMetrics when the scraper asks for it); `guard` (e.g.
    `MetricsAuth.check`) vets every request first, unknown paths included."""

    async def handle(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = SECRET_VALUES.scrub_bytes(encoder(registry))  # a label value is no place for a secret either
        return web.Response(body=body, headers={"Content-Type": content_type})

    middlewares = []
    if guard is not None:
        check = guard

        @web.middleware
        async def guarded(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            refused = await check(request)
            if refused is not None:
                return refused
            return await handler(request)

        middlewares.append(guarded)
    app = web.Application(middlewares=middlewares)
    app.router.add_get("/metrics", handle)
    return app


def probes_app(healthz: Checks, readyz: Checks) -> web.Application:
    app = web.Application()
    for checks in (healthz, readyz):
        app.router.add_get(f"/{checks.name}", checks.handle)
        app.router.add_get(f"/{checks.name}/{{check}}", checks.handle_one)
    return app


class HTTPServer:
    """One aiohttp site on a bind address; `port` is the bound port (useful with port 0). With `ssl_context` it
    serves HTTPS (a context reloaded in place, as `tls.CertWatcher` does, takes effect at the next handshake)."""

    def __init__(
        self,
        name: str,
        address: str,
        app: web.Application,
        *,
        shutdown_timeout: float = 2.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parsed = parse_bind_address(address)
        if parsed is None:
            raise ValueError(f"{name}: bind address {address!r} disables the server")
        self.name = name
        self.host, self.port = parsed
        self.ssl_context = ssl_context
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        self._started = False

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            raise OSError(e.errno, f"{self.name} server cannot listen on {self.host or ''}:{self.port}: {e}") from e
        self._started = True
        for addr in self._runner.addresses:
            if isinstance(addr, tuple) and len(addr) >= 2:
                self.port = int(addr[1])
                break
        log.info(f"{self.name} server listening", address=f"{self.host or ''}:{self.port}",
                 tls=self.ssl_context is not None)

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        host = self.host or "127.0.0.1"
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{self.port}"

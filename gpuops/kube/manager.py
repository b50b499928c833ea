"""The manager: shared informers, controllers, leader election and the HTTP endpoints of one process.

Start order (controller-runtime's): HTTP servers (/metrics, probes) -> informers, on every
replica (a standby keeps its caches warm, so a failover costs the lease expiry, not a relist) -> runnables
that need no leader -> with leader election, once the Lease is ours: the elected runnables (controllers).

Shutdown (`request_stop()`, SIGTERM through `handle_signals()`, or cancelling `run()`), bounded by
`graceful_shutdown_timeout` (30 s): controllers stop taking keys and their in-flight reconciles finish
(cancelled at the deadline) -> informers -> HTTP servers -> the Lease is released (when
`release_on_cancel`), so a standby takes over at its next retry.

Lease loss: every controller is stopped at once (no grace: another replica may already be acting) and
`run()` raises `LeaderElectionLost`; the process must exit non-zero. A runnable that fails stops the
manager the same way (gracefully) and `run()` raises its exception.

Secure metrics (`metrics_secure`, controller-runtime's SecureServing with its authn/authz filter): /metrics is
served over HTTPS and every request must carry a bearer token that a TokenReview accepts and whose user a
SubjectAccessReview allows to `get` the path (`metricsauth.py`). The certificate is tls.crt/tls.key from
`metrics_cert_dir`, reloaded as the files change (a mounted Secret rotating), else a self-signed one made at
start. Without `metrics_secure`, /metrics is plain HTTP without authentication, as before.

Probes: /healthz = ping, eventloop (timer lag), leaderElection (a leader whose renewals stalled beyond
lease duration + tolerance is unhealthy; standbys always pass). /readyz = ping, informers (every informer
synced and heard from within `informer_max_silence`).

`ControllerRegistry` maps controller names to setup functions (`setup(manager)` creates informers and
controllers and `add`s them); the CLI selects among them with `--controllers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, Protocol, TypeVar

import anyio
import structlog

from .client import Client
from .controller import Controller
from .health import (
    Checks,
    HTTPServer,
    LoopLagMonitor,
    informers_check,
    metrics_app,
    parse_bind_address,
    probes_app,
)
from .informer import Informer, InformerFactory
from .leaderelection import LeaderElectionLost, LeaderElector
from .metricsauth import MetricsAuth
from .reflector import ReflectorOptions
from .resources import ResourceType
from .tls import CertWatcher, self_signed, server_context

__all__ = [
    "ControllerRegistry",
    "LeaderElectionLost",
    "Manager",
    "Runnable",
    "Setup",
    "UnknownControllers",
]

T = TypeVar("T")

log = structlog.get_logger("gpuops.kube.manager")

_UNSET: Any = object()


class Runnable(Protocol):
    """Something the manager starts and stops: controllers, or `add_runnable` functions."""

    name: str
    need_leader_election: bool

    async def run(self) -> None: ...

    def request_stop(self, grace: float | None = None) -> None: ...


class _FuncRunnable:
    """An async function run until the manager stops (then cancelled)."""

    def __init__(self, name: str, fn: Callable[[], Awaitable[None]], need_leader_election: bool) -> None:
        self.name = name
        self.need_leader_election = need_leader_election
        self._fn = fn
        self._stop = asyncio.Event()

    async def run(self) -> None:
        task = asyncio.ensure_future(self._fn())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (task, stop):
                fut.cancel()
            await asyncio.wait((task, stop))
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            raise exc

    def request_stop(self, grace: float | None = None) -> None:
        self._stop.set()


# ---------------------------------------------------------------------------------------------- registry

Setup = Callable[["Manager"], "Awaitable[None] | None"]


class UnknownControllers(ValueError):
    """`--controllers` named a controller nobody registered."""

    def __init__(self, unknown: list[str], known: list[str]) -> None:
        self.unknown = unknown
        self.known = known
        names = ", ".join(known) if known else "(none: no controller is registered yet)"
        super().__init__(f"unknown controller(s) {', '.join(repr(n) for n in unknown)}; known controllers: {names}")


class ControllerRegistry:
    """Named controller setups. A setup is `setup(manager)` (plain or async) or a lazy "module:function"
    reference, imported only when selected (so `--help` stays fast and unused controllers cost nothing)."""

    def __init__(self) -> None:
        self._setups: dict[str, Setup | str] = {}

    def register(self, name: str, setup: Setup | str) -> None:
        if not name or "," in name or name.startswith("-") or name == "*":
            raise ValueError(f"controller name {name!r}: must be non-empty, without ',' and not '*' or '-...'")
        if name in self._setups:
            raise ValueError(f"controller {name!r} is already registered")
        self._setups[name] = setup

    def names(self) -> list[str]:
        return list(self._setups)

    def select(self, spec: str | None) -> list[str]:
        """kube-controller-manager's syntax: "a,b" selects, "*" is every registered controller, "-a" removes
        one; None or "" means "*". Unknown names raise `UnknownControllers`."""
        items = [s.strip() for s in (spec or "*").split(",") if s.strip()]
        unknown = [i.lstrip("-") for i in items if i != "*" and i.lstrip("-") not in self._setups]
        if unknown:
            raise UnknownControllers(unknown, self.names())
        chosen: dict[str, None] = {}
        for item in items:
            if item == "*":
                chosen.update(dict.fromkeys(self._setups))
        for item in items:
            if item.startswith("-"):
                chosen.pop(item[1:], None)
            elif item != "*":
                chosen[item] = None
        return [n for n in self._setups if n in chosen]

    def resolve(self, name: str) -> Setup:
        setup = self._setups[name]
        if isinstance(setup, str):
            module, _, attr = setup.partition(":")
            resolved: Setup = getattr(importlib.import_module(module), attr)
            self._setups[name] = resolved
            return resolved
        return setup

    async def setup(self, manager: Manager, names: Iterable[str]) -> None:
        for name in names:
            result = self.resolve(name)(manager)
            if inspect.isawaitable(result):
                await result


# ---------------------------------------------------------------------------------------------- manager


class Manager:
    """Runs informers and controllers for one process; see the module docstring."""

    def __init__(
        self,
        client: Client,
        *,
        namespace: str | None = None,
        leader_election: bool = False,
        leader_election_id: str = "gpuops-controller-manager",
        leader_election_namespace: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_cancel: bool = True,
        identity: str | None = None,
        metrics_bind_address: str = ":8080",
        metrics_secure: bool = False,
        metrics_cert_dir: str | None = None,
        metrics_cert_poll_interval: float = 10.0,
        metrics_auth: MetricsAuth | None = None,
        health_probe_bind_address: str = ":8081",
        graceful_shutdown_timeout: float = 30.0,
        informer_max_silence: float = 150.0,
        leader_healthz_tolerance: float = 20.0,
        loop_lag_threshold: float = 5.0,
        loop_lag_interval: float = 0.5,
        loop_lag_window: float = 30.0,
        reflector_options: ReflectorOptions | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace or None
        """The namespace informers watch by default (None: all namespaces)."""
        self.settings: Mapping[str, Any] = dict(settings or {})
        """Controller settings from the command line (e.g. "budget_status_refresh"); setups read what is theirs."""
        self.graceful_shutdown_timeout = graceful_shutdown_timeout
        self.factory = InformerFactory(client, options=reflector_options)
        self.elector: LeaderElector | None = None
        if leader_election:
            self.elector = LeaderElector(
                client,
                name=leader_election_id,
                namespace=leader_election_namespace or client.namespace,
                identity=identity,
                lease_duration=lease_duration,
                renew_deadline=renew_deadline,
                retry_period=retry_period,
                release_on_cancel=release_on_cancel,
            )
        self.lag = LoopLagMonitor(loop_lag_interval, loop_lag_threshold, loop_lag_window)
        self.healthz = Checks("healthz")
        self.readyz = Checks("readyz")
        self.healthz.add("eventloop", self.lag.check)
        if self.elector is not None:
            elector, tolerance = self.elector, leader_healthz_tolerance

            def lease_check() -> str | None:
                if elector.healthy(tolerance):
                    return None
                return f"leader has not renewed the lease for more than {elector.lease_duration + tolerance:g}s"

            self.healthz.add("leaderElection", lease_check)
        self.readyz.add("informers", informers_check(self.factory.informers, informer_max_silence))
        self.metrics_auth: MetricsAuth | None = None
        self.metrics_certs: CertWatcher | None = None
        """The watched certificate directory of the secure metrics server (None: self-signed, or plain HTTP)."""
        self.metrics_server: HTTPServer | None = None
        if metrics_cert_dir and not metrics_secure:
            raise ValueError("a metrics certificate directory needs secure metrics serving (--metrics-secure)")
        if metrics_bind_address not in ("", "0"):
            if metrics_secure:
                self.metrics_auth = metrics_auth or MetricsAuth(client)
                self.metrics_server = HTTPServer(
                    "metrics", metrics_bind_address, metrics_app(guard=self.metrics_auth.check),
                    ssl_context=self._metrics_tls(metrics_bind_address, metrics_cert_dir, metrics_cert_poll_interval),
                )
            else:
                self.metrics_server = HTTPServer("metrics", metrics_bind_address, metrics_app())
        self.probe_server = (
            HTTPServer("health probe", health_probe_bind_address, probes_app(self.healthz, self.readyz))
            if health_probe_bind_address not in ("", "0")
            else None
        )
        self.elected = asyncio.Event()
        """Set once this replica runs its elected runnables (at once without leader election)."""
        self._runnables: list[Runnable] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._stop_requested = False
        self._stopping = False
        self._ran = False
        self._release_ok = asyncio.Event()
        self._elected_task: asyncio.Task[None] | None = None
        self._signals = 0

    def _metrics_tls(self, address: str, cert_dir: str | None, poll_interval: float) -> ssl.SSLContext:
        """The serving context: tls.crt/tls.key from `cert_dir` (watched), else a self-signed certificate.

        A directory without a usable pair raises `tls.CertError` (a ValueError): a configuration error."""
        if cert_dir:
            self.metrics_certs = CertWatcher(cert_dir, name="metrics", interval=poll_interval)
            self.metrics_certs.load()
            return self.metrics_certs.context
        names = [socket.gethostname(), "localhost", "127.0.0.1", "::1"]
        bound = parse_bind_address(address)
        if bound is not None and bound[0] and bound[0] not in names:
            names.insert(0, bound[0])
        log.info("serving metrics with a self-signed certificate", names=names)
        return server_context(self_signed(names, common_name="gpuops-metrics"))

    # ------------------------------------------------------------------------------------------ setup

    def informer(
        self,
        rt: ResourceType[T],
        *,
        namespace: str | None = _UNSET,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Informer[T]:
        """The shared informer (in the manager's namespace unless told otherwise; None: all namespaces)."""
        ns = self.namespace if namespace is _UNSET else namespace
        return self.factory.informer(
            rt, namespace=ns if rt.namespaced else None, label_selector=label_selector, field_selector=field_selector
        )

    def add(self, runnable: Runnable) -> None:
        """Add a controller (or any Runnable). Controllers without a client get the manager's, so their
        writes are gated for read-your-own-writes."""
        if self._ran:
            raise RuntimeError("runnables must be added before run()")
        if any(r.name == runnable.name for r in self._runnables):
            raise ValueError(f"a runnable named {runnable.name!r} already exists (names label metrics and logs)")
        if isinstance(runnable, Controller) and runnable.client is None:
            runnable.client = self.client
        self._runnables.append(runnable)

    def add_runnable(
        self, name: str, fn: Callable[[], Awaitable[None]], *, need_leader_election: bool = True
    ) -> None:
        """Run `fn()` with the controllers (cancelled at shutdown)."""
        self.add(_FuncRunnable(name, fn, need_leader_election))

    def runnables(self) -> list[Runnable]:
        return list(self._runnables)

    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader if self.elector is not None else self.elected.is_set()

    # ------------------------------------------------------------------------------------------ running

    def request_stop(self) -> None:
        """Begin a graceful shutdown; `run()` returns once it is complete."""
        self._stop_requested = True
        self._wake.set()

    def handle_signals(self) -> None:
        """SIGTERM/SIGINT: graceful shutdown; a second signal exits at once (status 1)."""
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            self._signals += 1
            if self._signals > 1:
                log.warning("second signal, exiting immediately", signal=signal.Signals(signum).name)
                os._exit(1)
            log.info("shutting down", signal=signal.Signals(signum).name)
            self.request_stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, on_signal, sig)

    async def run(self) -> None:
        """Run until stopped; raises `LeaderElectionLost` on lease loss, or the exception a runnable failed with."""
        if self._ran:
            raise RuntimeError("a Manager runs only once")
        self._ran = True
        loop = asyncio.get_running_loop()
        servers = [s for s in (self.metrics_server, self.probe_server) if s is not None]
        started: list[HTTPServer] = []
        try:
            for server in servers:
                await server.start()
                started.append(server)
        except BaseException:
            for server in started:
                await server.stop()
            raise
        background = [loop.create_task(self.lag.run(), name="event-loop-lag")]
        if self.metrics_certs is not None:
            background.append(loop.create_task(self.metrics_certs.run(), name="metrics-cert-watcher"))
        failure: BaseException | None = None
        cancelled = False
        try:
            self.factory.start()
            for r in self._runnables:
                if not r.need_leader_election:
                    self._start(r)
            if self.elector is None:
                self._start_elected()
            else:
                self._elected_task = loop.create_task(self._lead(), name="leader-election")
                self._elected_task.add_done_callback(lambda _t: self._wake.set())
            failure = await self._wait()
        except asyncio.CancelledError:
            cancelled = True
        except Exception as e:
            failure = e
        lost = isinstance(failure, LeaderElectionLost)
        if failure is not None:
            log.error("manager stopping", reason=str(failure) or type(failure).__name__, lease_lost=lost)
        try:
            await _shielded(self._shutdown(0.0 if lost else self.graceful_shutdown_timeout, servers, background))
        except asyncio.CancelledError:
            cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        if failure is not None:
            raise failure

    def _start(self, runnable: Runnable) -> None:
        if self._stopping or runnable.name in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(runnable.run(), name=f"runnable-{runnable.name}")
        task.add_done_callback(lambda _t: self._wake.set())
        self._tasks[runnable.name] = task

    def _start_elected(self) -> None:
        if self._stopping:
            return
        for r in self._runnables:
            if r.need_leader_election:
                self._start(r)
        self.elected.set()

    async def _lead(self) -> None:
        assert self.elector is not None
        async with self.elector.leading():
            try:
                log.info("elected leader", identity=self.elector.identity)
                self._start_elected()
                await self._release_ok.wait()
            except asyncio.CancelledError:
                # Lease lost (or shutdown raced the acquisition): no controller may act one moment longer.
                await self._abort([r for r in self._runnables if r.need_leader_election])
                raise

    async def _wait(self) -> BaseException | None:
        """Until a stop is requested (None), leadership ends, or a runnable fails (the exception)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._stop_requested:
                return None
            et = self._elected_task
            if et is not None and et.done():
                if et.cancelled():
                    return RuntimeError("leader election stopped unexpectedly")
                return et.exception() or RuntimeError("leader election ended unexpectedly")
            for name, task in self._tasks.items():
                if task.done() and not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    assert exc is not None
                    log.error("runnable failed", runnable=name, error=str(exc) or type(exc).__name__)
                    return exc

    async def _abort(self, runnables: list[Runnable]) -> None:
        tasks = [self._tasks[r.name] for r in runnables if r.name in self._tasks]
        for r in runnables:
            r.request_stop(0.0)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _shutdown(
        self, grace: float, servers: list[HTTPServer], background: list[asyncio.Task[None]]
    ) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = True
        deadline = loop.time() + max(0.0, grace)
        et = self._elected_task
        if et is not None and not et.done() and not self.elected.is_set():
            et.cancel()  # still a standby: stop campaigning (nothing to release)
        # 1. controllers: stop taking keys, let in-flight reconciles finish until the deadline
        running = [(r, self._tasks[r.name]) for r in self._runnables if r.name in self._tasks]
        for r, _ in running:
            r.request_stop(max(0.0, deadline - loop.time()))
        tasks = [t for _, t in running if not t.done()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
            if late:
                log.warning("graceful shutdown timed out; cancelling", runnables=[t.get_name() for t in late])
                for t in late:
                    t.cancel()
                await asyncio.wait(late)
        for _, t in running:
            if not t.cancelled() and t.exception() is not None:
                log.debug("runnable ended with an error", runnable=t.get_name(), error=str(t.exception()))
        # 2. informers, 3. HTTP
        await self.factory.stop()
        for task in background:
            task.cancel()
        await asyncio.wait(background)
        for server in servers:
            await server.stop()
        # 4. the lease (released by leaving leading(), bounded by the elector's renew deadline)
        self._release_ok.set()
        if et is not None:
            await asyncio.wait([et])
            if not et.cancelled():
                et.exception()  # retrieved (already reported by _wait when it mattered)
        log.info("manager stopped")


async def _shielded(coro: Coroutine[Any, Any, None]) -> None:
    """Run cleanup to completion through cancellation (edge- or level-triggered), then re-raise it."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled():
                    break
                cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    task.result()

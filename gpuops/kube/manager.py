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

`ManagerOptions` holds every option in one typed Struct; the fields marked `flag(...)` are `gpuops run`'s
own flags (the controllers' flags come from their settings, `registry.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, Protocol, TypeVar

import anyio
import msgspec
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
from .settings import flag
from .tls import CertWatcher, self_signed, server_context

__all__ = [
    "LeaderElectionLost",
    "Manager",
    "ManagerOptions",
    "Runnable",
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


# ---------------------------------------------------------------------------------------------- manager


def _bind_address(address: str) -> None:
    parse_bind_address(address)


class ManagerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How one process runs its informers, controllers, leader election and HTTP endpoints."""

    namespace: Annotated[str | None, flag("watch only this namespace (default: all namespaces)", metavar="NS")] = None
    """The namespace informers watch by default (None: all namespaces)."""
    leader_election: Annotated[bool, flag(
        "run the controllers only while holding a coordination.k8s.io Lease (for several replicas)",
        name="leader-elect")] = False
    leader_election_id: Annotated[str, flag("name of the Lease", metavar="NAME",
                                            name="leader-elect-lease-name")] = "gpuops-controller-manager"
    leader_election_namespace: Annotated[str | None, flag(
        "namespace of the Lease (default: the pod's namespace, or the kubeconfig context's)", metavar="NS",
        name="leader-elect-namespace")] = None
    lease_duration: Annotated[float, flag("how long standbys wait before taking over an unrenewed Lease",
                                          metavar="SECONDS", name="leader-elect-lease-duration", gt=0)] = 15.0
    renew_deadline: Annotated[float, flag("the leader steps down if it cannot renew within this", metavar="SECONDS",
                                          name="leader-elect-renew-deadline", gt=0)] = 10.0
    retry_period: Annotated[float, flag("interval between acquire/renew attempts", metavar="SECONDS",
                                        name="leader-elect-retry-period", gt=0)] = 2.0
    release_on_cancel: bool = True
    """Release the Lease at a clean shutdown, so a standby takes over at its next retry."""
    identity: str | None = None
    """This replica's holder identity in the Lease (default: host name and a random suffix)."""
    metrics_bind_address: Annotated[str, flag('serve /metrics here; "0" disables', metavar="ADDR",
                                              check=_bind_address)] = ":8080"
    metrics_secure: Annotated[bool, flag(
        "serve /metrics over HTTPS, only to bearer tokens the API server authenticates (TokenReview) whose user "
        "may get the path (SubjectAccessReview; e.g. the gpuops-metrics-reader ClusterRole); the operator needs "
        "create on tokenreviews and subjectaccessreviews (gpuops-metrics-auth)")] = False
    metrics_cert_dir: Annotated[str | None, flag(
        "with --metrics-secure: serve DIR/tls.crt and DIR/tls.key (e.g. a mounted Secret), reloaded when they "
        "change (default: a self-signed certificate made at start)", metavar="DIR")] = None
    metrics_cert_poll_interval: float = 10.0
    metrics_auth: MetricsAuth | None = None
    """The secure metrics server's authenticator (default: TokenReview and SubjectAccessReview via the client)."""
    health_probe_bind_address: Annotated[str, flag('serve /healthz and /readyz here; "0" disables', metavar="ADDR",
                                                   check=_bind_address)] = ":8081"
    graceful_shutdown_timeout: Annotated[float, flag("how long in-flight reconciles get after SIGTERM",
                                                     metavar="SECONDS", ge=0)] = 30.0
    informer_max_silence: float = 150.0
    leader_healthz_tolerance: float = 20.0
    loop_lag_threshold: float = 5.0
    loop_lag_interval: float = 0.5
    loop_lag_window: float = 30.0
    reflector_options: ReflectorOptions | None = None


class Manager:
    """Runs informers and controllers for one process; see the module docstring."""

    def __init__(self, client: Client, options: ManagerOptions | None = None) -> None:
        o = self.options = options or ManagerOptions()
        self.client = client
        self.namespace = o.namespace or None
        """The namespace informers watch by default (None: all namespaces)."""
        self.graceful_shutdown_timeout = o.graceful_shutdown_timeout
        self.factory = InformerFactory(client, options=o.reflector_options)
        self.elector = self._elector(o)
        self.lag = LoopLagMonitor(o.loop_lag_interval, o.loop_lag_threshold, o.loop_lag_window)
        self.healthz = Checks("healthz")
        self.readyz = Checks("readyz")
        self._add_checks(o)
        self.metrics_auth: MetricsAuth | None = None
        self.metrics_certs: CertWatcher | None = None
        """The watched certificate directory of the secure metrics server (None: self-signed, or plain HTTP)."""
        self.metrics_server = self._metrics_server(o)
        self.probe_server = (
            HTTPServer("health probe", o.health_probe_bind_address, probes_app(self.healthz, self.readyz))
            if o.health_probe_bind_address not in ("", "0")
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

    def _elector(self, o: ManagerOptions) -> LeaderElector | None:
        if not o.leader_election:
            return None
        return LeaderElector(
            self.client,
            name=o.leader_election_id,
            namespace=o.leader_election_namespace or self.client.namespace,
            identity=o.identity,
            lease_duration=o.lease_duration,
            renew_deadline=o.renew_deadline,
            retry_period=o.retry_period,
            release_on_cancel=o.release_on_cancel,
        )

    def _add_checks(self, o: ManagerOptions) -> None:
        self.healthz.add("eventloop", self.lag.check)
        if self.elector is not None:
            elector, tolerance = self.elector, o.leader_healthz_tolerance

            def lease_check() -> str | None:
                if elector.healthy(tolerance):
                    return None
                return f"leader has not renewed the lease for more than {elector.lease_duration + tolerance:g}s"

            self.healthz.add("leaderElection", lease_check)
        self.readyz.add("informers", informers_check(self.factory.informers, o.informer_max_silence))

    def _metrics_server(self, o: ManagerOptions) -> HTTPServer | None:
        if o.metrics_cert_dir and not o.metrics_secure:
            raise ValueError("a metrics certificate directory needs secure metrics serving (--metrics-secure)")
        if o.metrics_bind_address in ("", "0"):
            return None
        if not o.metrics_secure:
            return HTTPServer("metrics", o.metrics_bind_address, metrics_app())
        self.metrics_auth = o.metrics_auth or MetricsAuth(self.client)
        return HTTPServer(
            "metrics", o.metrics_bind_address, metrics_app(guard=self.metrics_auth.check),
            ssl_context=self._metrics_tls(o.metrics_bind_address, o.metrics_cert_dir, o.metrics_cert_poll_interval),
        )

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

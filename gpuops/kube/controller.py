"""The controller loop: informer events -> mapped keys -> a work queue -> N async reconcile workers.

What it adds to controller-runtime's semantics:

* `watch(informer, mapper, predicates=...)`: an event on an object enqueues the keys its mapper returns
  (default: the object's own key). Objects of the informer's initial list, and resyncs (an update with an
  unchanged resourceVersion), are queued at LOW priority so fresh changes go first.
* Outcomes as `reconcileHandler`: an exception is retried after the queue's rate limiter's delay
  (`add_rate_limited`; by default the max of a per-key backoff and a 10 qps, burst 100 token bucket);
  `TerminalError` is counted and not retried; `Result(requeue_after=s)` forgets the backoff and re-adds
  after `s`; `Result(requeue=True)` backs off; anything else forgets. A reconcile can be bounded by
  `reconcile_timeout`. Exceptions that signal a bug (TypeError, KeyError, ...) are also counted as
  "panics", Python's analogue of a recovered Go panic, and retried like any error.
* Read-your-own-writes: every successful write the reconciler makes through the controller's `Client`
  (seen through `Client.on_write`, attributed to the running reconcile by a context variable) to a
  resource this controller watches is remembered with the resourceVersion it returned. When the reconcile
  ends, the key is held in the queue (`WorkQueue.hold`) until each watching informer has seen those
  versions (`Informer.seen`), or `read_your_writes_timeout` passes (counted in
  `gpuops_read_your_writes_timeouts_total`). So the next reconcile of a key never reads the cache from
  before its own last write. Gates are re-checked on every event of the informers involved, and every
  `read_your_writes_recheck` seconds while any is pending (a write the informer gets no event for, e.g.
  one outside its label selector, is seen through bookmarks only).
* Own-write events (`skip_own_write_events=True`, with read-your-own-writes on): the update event of an
  object at exactly the resourceVersion a reconcile's write returned is that write coming back; the
  reconcile already knew its result, so its key is not queued again for it (other keys the event maps to
  are). Any other change reaches the watch as an event of its own version and queues as usual; an
  own-write event that arrives before the write's response is handled (or after another event of the
  object) is queued as before. For reconcilers that compute everything from the caches in one pass (write
  a status and be done); off by default, since a reconciler that takes one step per run (add a
  finalizer, return, continue when its event comes back) relies on its own writes to run again.
* Each reconcile runs with structlog context variables: controller, key, reconcile_id (uuid4), trigger
  (what queued the key: "update ConfigMap ns/a", "retry", "requeue_after", ...).

One worker handles a key at a time (the queue guarantees it); workers of one controller run concurrently
on the event loop, so `max_concurrent_reconciles` defaults to 4 rather than controller-runtime's 1.
A `Controller` runs once: `run()` until `request_stop(grace)` (in-flight reconciles finish within `grace`)
or cancellation (in-flight reconciles are cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import structlog

from . import metrics
from . import rv as rvmod
from .client import Client
from .informer import Handler, Informer
from .ratelimit import RateLimiter
from .resources import ResourceType
from .workqueue import LOW, NORMAL, ShutDown, WorkQueue

__all__ = [
    "CacheSyncTimeout",
    "Controller",
    "Mapper",
    "Predicate",
    "Reconciler",
    "Request",
    "Result",
    "TerminalError",
    "and_",
    "annotations_changed",
    "generation_changed",
    "labels_changed",
    "not_",
    "or_",
    "owner_mapper",
    "predicate_funcs",
    "resource_version_changed",
]

T = TypeVar("T")

log = structlog.get_logger("gpuops.kube.controller")

RESULTS = ("success", "error", "requeue", "requeue_after")
"""The `result` label values of controller_runtime_reconcile_total, all pre-initialised to 0."""

_PANICS: tuple[type[BaseException], ...] = (
    ArithmeticError,
    AssertionError,
    AttributeError,
    LookupError,
    NameError,
    NotImplementedError,
    RecursionError,
    TypeError,
)
"""Exceptions that mean a bug in the reconciler rather than trouble outside it: counted as panics."""


# ---------------------------------------------------------------------------------------------- requests/results


class Request(NamedTuple):
    """What a reconcile is asked to look at: an object's namespace ("" if cluster-scoped) and name."""

    namespace: str
    name: str

    @property
    def key(self) -> str:
        """The informer store key: "namespace/name", or "name"."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def __str__(self) -> str:
        return self.key

    @classmethod
    def from_key(cls, key: str) -> Request:
        namespace, _, name = key.rpartition("/")
        return cls(namespace, name)

    @classmethod
    def for_object(cls, obj: Any) -> Request:
        meta = _meta(obj)
        return cls(_field(meta, "namespace") or "", _field(meta, "name") or "")


@dataclass(frozen=True, slots=True)
class Result:
    """`requeue_after`: reconcile again after that many seconds (backoff forgotten). `requeue`: again with
    backoff (controller-runtime's deprecated Requeue; prefer raising)."""

    requeue_after: float | None = None
    requeue: bool = False


class TerminalError(Exception):
    """A failure retrying cannot fix (invalid spec, ...): counted and logged, never requeued."""


class CacheSyncTimeout(Exception):
    """A controller's informers did not complete their first list within `cache_sync_timeout`."""


Reconciler = Callable[[Request], Awaitable["Result | None"]]
Mapper = Callable[[T], Iterable[Request]]


def _is_terminal(exc: BaseException) -> bool:
    if isinstance(exc, TerminalError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_terminal(e) for e in exc.exceptions)
    return False


def _is_panic(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_panic(e) for e in exc.exceptions)
    return isinstance(exc, _PANICS)


# ---------------------------------------------------------------------------------------------- object access


def _meta(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return obj.get("metadata") or {}
    return obj.metadata


def _field(meta: Any, name: str) -> Any:
    if isinstance(meta, Mapping):
        camel = {"resource_version": "resourceVersion", "owner_references": "ownerReferences"}.get(name, name)
        return meta.get(camel)
    return getattr(meta, name, None)


def _rv(obj: Any) -> str:
    return str(_field(_meta(obj), "resource_version") or "")


def _describe(rt: ResourceType[Any], obj: Any) -> str:
    try:
        return f"{rt.kind} {rt.key(obj)}"
    except Exception:  # a mapper got a strange object; the trigger is only for logs
        return rt.kind


# ---------------------------------------------------------------------------------------------- predicates


_Create = Callable[[Any], bool]
_Update = Callable[[Any, Any], bool]


class Predicate:
    """Filters events before mapping (controller-runtime's predicate.Funcs). Combine with `&`, `|`, `~`."""

    def __init__(
        self,
        create: _Create | None = None,
        update: _Update | None = None,
        delete: _Create | None = None,
    ) -> None:
        self._create = create
        self._update = update
        self._delete = delete

    def create(self, obj: Any) -> bool:
        return self._create(obj) if self._create is not None else True

    def update(self, old: Any, new: Any) -> bool:
        return self._update(old, new) if self._update is not None else True

    def delete(self, obj: Any) -> bool:
        return self._delete(obj) if self._delete is not None else True

    def __and__(self, other: Predicate) -> Predicate:
        return and_(self, other)

    def __or__(self, other: Predicate) -> Predicate:
        return or_(self, other)

    def __invert__(self) -> Predicate:
        return not_(self)


def predicate_funcs(keep: Callable[[Any], bool]) -> Predicate:
    """NewPredicateFuncs: keep events whose object passes `keep` (the new object of an update)."""
    return Predicate(keep, lambda _old, new: keep(new), keep)


def _changed(get: Callable[[Any], Any]) -> Predicate:
    return Predicate(update=lambda old, new: get(old) != get(new))


def generation_changed() -> Predicate:
    """Drop updates that leave metadata.generation alone (status and metadata-only writes). Caveat as
    upstream: a status-only change made by someone else is then never corrected until the next event."""
    return _changed(lambda o: _field(_meta(o), "generation"))


def resource_version_changed() -> Predicate:
    """Drop resyncs (updates with an unchanged resourceVersion)."""
    return _changed(_rv)


def labels_changed() -> Predicate:
    return _changed(lambda o: _field(_meta(o), "labels") or {})


def annotations_changed() -> Predicate:
    return _changed(lambda o: _field(_meta(o), "annotations") or {})


def and_(*predicates: Predicate) -> Predicate:
    return Predicate(
        lambda o: all(p.create(o) for p in predicates),
        lambda a, b: all(p.update(a, b) for p in predicates),
        lambda o: all(p.delete(o) for p in predicates),
    )


def or_(*predicates: Predicate) -> Predicate:
    return Predicate(
        lambda o: any(p.create(o) for p in predicates),
        lambda a, b: any(p.update(a, b) for p in predicates),
        lambda o: any(p.delete(o) for p in predicates),
    )


def not_(predicate: Predicate) -> Predicate:
    return Predicate(
        lambda o: not predicate.create(o),
        lambda a, b: not predicate.update(a, b),
        lambda o: not predicate.delete(o),
    )


# ---------------------------------------------------------------------------------------------- mappers


def _identity(obj: Any) -> Iterable[Request]:
    return (Request.for_object(obj),)


def owner_mapper(owner: ResourceType[Any], *, only_controller: bool = True) -> Mapper[Any]:
    """EnqueueRequestForOwner: map an object to its owner(s) of `owner`'s kind and group (by default only
    the controlling owner, as `Owns()` does). Owners of a namespaced kind share the object's namespace."""

    def mapper(obj: Any) -> Iterable[Request]:
        meta = _meta(obj)
        namespace = (_field(meta, "namespace") or "") if owner.namespaced else ""
        out = []
        for ref in _field(meta, "owner_references") or ():
            get = ref.get if isinstance(ref, Mapping) else lambda k, _r=ref: getattr(_r, _snake(k), None)
            if get("kind") != owner.kind or _group(str(get("apiVersion") or "")) != owner.group:
                continue
            if only_controller and not get("controller"):
                continue
            out.append(Request(namespace, str(get("name") or "")))
        return out

    return mapper


def _snake(camel: str) -> str:
    return {"apiVersion": "api_version"}.get(camel, camel)


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


# ---------------------------------------------------------------------------------------------- internals


@dataclass(slots=True)
class _Watch:
    informer: Informer[Any]
    mapper: Callable[[Any], Iterable[Request]]
    predicates: tuple[Predicate, ...]


class _Write(NamedTuple):
    informer: Informer[Any]
    key: str
    resource_version: str


@dataclass(slots=True)
class _Run:
    """The reconcile running in the current context; `writes` collects what the gate must wait for."""

    controller: Controller
    request: Request
    writes: dict[tuple[int, str], _Write] = field(default_factory=dict)


@dataclass(slots=True)
class _Gate:
    pending: list[_Write]
    since: float
    timer: asyncio.TimerHandle


_CURRENT: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("gpuops_reconcile", default=None)


class _Metrics:
    def __init__(self, name: str) -> None:
        self.total = {r: metrics.RECONCILE_TOTAL.labels(name, r) for r in RESULTS}
        self.errors = metrics.RECONCILE_ERRORS.labels(name)
        self.terminal = metrics.TERMINAL_RECONCILE_ERRORS.labels(name)
        self.panics = metrics.RECONCILE_PANICS.labels(name)
        self.time = metrics.RECONCILE_TIME.labels(name)
        self.max_concurrent = metrics.MAX_CONCURRENT_RECONCILES.labels(name)
        self.active = metrics.ACTIVE_WORKERS.labels(name)
        self.timeouts = metrics.RECONCILE_TIMEOUTS.labels(name)
        self.ryw_timeouts = metrics.READ_YOUR_WRITES_TIMEOUTS.labels(name)
        self.ryw_wait = metrics.READ_YOUR_WRITES_WAIT.labels(name)


# ---------------------------------------------------------------------------------------------- controller


class Controller:
    """Reconciles keys produced by watches; see the module docstring."""

    def __init__(
        self,
        name: str,
        reconcile: Reconciler,
        *,
        client: Client | None = None,
        max_concurrent_reconciles: int = 4,
        reconcile_timeout: float | None = None,
        cache_sync_timeout: float = 120.0,
        read_your_writes: bool = True,
        read_your_writes_timeout: float = 10.0,
        read_your_writes_recheck: float = 0.25,
        need_leader_election: bool = True,
        base_delay: float | None = None,
        max_delay: float | None = None,
        rate_limiter: RateLimiter[Request] | None = None,
        handler_buffer: int = 10_000,
        skip_own_write_events: bool = False,
    ) -> None:
        """`rate_limiter` delays the retries of this controller's keys (one limiter per controller); without
        one its queue uses `default_controller_limiter`, whose per-key backoff `base_delay`/`max_delay` shape."""
        if not name:
            raise ValueError("name: a controller needs a name (it labels its metrics and logs)")
        if max_concurrent_reconciles < 1:
            raise ValueError("max_concurrent_reconciles: must be at least 1")
        if reconcile_timeout is not None and reconcile_timeout <= 0:
            raise ValueError("reconcile_timeout: must be positive (or None for no timeout)")
        self.name = name
        self.reconcile = reconcile
        self.client = client
        """Writes through this client are gated (read-your-own-writes); a Manager fills it in when None."""
        self.max_concurrent_reconciles = max_concurrent_reconciles
        self.reconcile_timeout = reconcile_timeout
        self.cache_sync_timeout = cache_sync_timeout
        self.read_your_writes = read_your_writes
        self.read_your_writes_timeout = read_your_writes_timeout
        self.read_your_writes_recheck = read_your_writes_recheck
        self.need_leader_election = need_leader_election
        self.handler_buffer = handler_buffer
        self.skip_own_write_events = skip_own_write_events
        self.queue: WorkQueue[Request] = WorkQueue(
            name, controller=name, rate_limiter=rate_limiter, base_delay=base_delay, max_delay=max_delay
        )
        self._watches: list[_Watch] = []
        self._handlers: list[Handler[Any]] = []
        self._triggers: dict[Request, str] = {}
        self._gates: dict[Request, _Gate] = {}
        self._own: dict[tuple[int, str], tuple[str, Request]] = {}
        """(informer id, object key) -> (resourceVersion a reconcile's write returned, that reconcile's key)."""
        self._gate_pending = asyncio.Event()
        self._stop = asyncio.Event()
        self._grace: float | None = None
        self._stopping = False
        self._started = False
        self._workers: list[asyncio.Task[None]] = []
        self._busy: set[asyncio.Task[Any]] = set()
        self._m = _Metrics(name)

    def __repr__(self) -> str:
        return f"Controller({self.name!r}, queue={len(self.queue)}, gated={len(self._gates)})"

    # ------------------------------------------------------------------------------------------ setup

    def watch(
        self,
        informer: Informer[T],
        mapper: Mapper[T] | None = None,
        *,
        predicates: Sequence[Predicate] = (),
    ) -> Controller:
        """Enqueue `mapper(obj)` (default: the object's own key) for events that pass all `predicates`.
        On an update both the old and the new object are mapped."""
        if self._started:
            raise RuntimeError(f"controller {self.name}: watches must be added before run()")
        self._watches.append(_Watch(informer, mapper or _identity, tuple(predicates)))
        return self

    def owns(
        self, informer: Informer[T], owner: ResourceType[Any], *, predicates: Sequence[Predicate] = ()
    ) -> Controller:
        """Watch objects controlled by `owner`'s kind and reconcile the owner."""
        return self.watch(informer, owner_mapper(owner), predicates=predicates)

    def informers(self) -> list[Informer[Any]]:
        seen: dict[int, Informer[Any]] = {}
        for w in self._watches:
            seen.setdefault(id(w.informer), w.informer)
        return list(seen.values())

    # ------------------------------------------------------------------------------------------ queueing

    def enqueue(self, request: Request, *, after: float = 0.0, priority: int = NORMAL, trigger: str = "manual") -> None:
        """Queue a key from outside the watches (timers, other sources); ignored once stopped."""
        if self.queue.shutting_down:
            return
        self._triggers.setdefault(request, trigger)
        if after > 0:
            self.queue.add_after(request, after, priority=priority)
        else:
            self.queue.add(request, priority=priority)

    def gated(self) -> list[Request]:
        """Keys held until the cache has seen their reconcile's writes."""
        return list(self._gates)

    def _handler(self, informer: Informer[Any]) -> Handler[Any]:
        watches = [w for w in self._watches if w.informer is informer]
        kind_of = informer.rt

        def enqueue(reqs: Iterable[Request], priority: int, trigger: str) -> None:
            for req in reqs:
                self.enqueue(req, priority=priority, trigger=trigger)

        def on_add(obj: Any, initial: bool) -> None:
            self._check_gates(informer)
            what = ("initial " if initial else "add ") + _describe(kind_of, obj)
            for w in watches:
                if all(p.create(obj) for p in w.predicates):
                    enqueue(w.mapper(obj), LOW if initial else NORMAL, what)

        def on_update(old: Any, new: Any) -> None:
            self._check_gates(informer)
            new_rv = _rv(new)
            resync = _rv(old) == new_rv
            writer = self._own_write(informer, new, new_rv) if self._own and not resync else None
            what = ("resync " if resync else "update ") + _describe(kind_of, new)
            for w in watches:
                if all(p.update(old, new) for p in w.predicates):
                    reqs = dict.fromkeys([*w.mapper(old), *w.mapper(new)])
                    if writer is not None:
                        reqs.pop(writer, None)
                    enqueue(reqs, LOW if resync else NORMAL, what)

        def on_delete(obj: Any) -> None:
            self._check_gates(informer)
            if self._own:  # a write of an object now gone has no event left to come back as
                self._own.pop((id(informer), informer.rt.key(obj)), None)
            what = "delete " + _describe(kind_of, obj)
            for w in watches:
                if all(p.delete(obj) for p in w.predicates):
                    enqueue(w.mapper(obj), NORMAL, what)

        return informer.add_handler(on_add, on_update, on_delete, buffer=self.handler_buffer)

    # ------------------------------------------------------------------------------------------ running

    def request_stop(self, grace: float | None = None) -> None:
        """Stop taking keys; in-flight reconciles get `grace` seconds (None: as long as they need)."""
        self._grace = grace
        self._stop.set()

    async def run(self) -> None:
        """Wait for the informers' first list, then reconcile until `request_stop` or cancellation."""
        if self._started:
            raise RuntimeError(f"controller {self.name} runs only once")
        self._started = True
        self._init_metrics()
        loop = asyncio.get_running_loop()
        for inf in self.informers():
            self._handlers.append(self._handler(inf))
        if self.client is not None and self.read_your_writes:
            self.client.on_write.append(self._on_write)
        helpers: list[asyncio.Task[None]] = []
        try:
            if not await self._wait_synced():
                return
            log.info("starting workers", controller=self.name, workers=self.max_concurrent_reconciles)
            self._workers = [
                loop.create_task(self._worker(), name=f"{self.name}-worker-{i}")
                for i in range(self.max_concurrent_reconciles)
            ]
            helpers.append(loop.create_task(self._recheck_gates(), name=f"{self.name}-ryw-recheck"))
            await self._stop.wait()
            await self._drain(self._grace)
        finally:
            self._stopping = True
            for task in (*self._workers, *helpers):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*self._workers, *helpers, return_exceptions=True)
            self._teardown()
            log.info("controller stopped", controller=self.name)

    async def _wait_synced(self) -> bool:
        """True once every informer synced; False if stopped first; CacheSyncTimeout if too slow."""
        pending = [inf for inf in self.informers() if not inf.synced()]
        if not pending:
            return True
        synced = asyncio.ensure_future(
            asyncio.gather(*(inf.wait_synced(self.cache_sync_timeout) for inf in pending))
        )
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((synced, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (synced, stopped):
                fut.cancel()
            await asyncio.wait((synced, stopped))
        if not synced.cancelled() and synced.exception() is None:
            late = [inf.name for inf, ok in zip(pending, synced.result(), strict=True) if not ok]
            if late:
                raise CacheSyncTimeout(
                    f"controller {self.name}: informers {', '.join(late)} not synced within "
                    f"{self.cache_sync_timeout:g}s"
                )
            return True
        return False

    async def _drain(self, grace: float | None) -> None:
        """Idle workers stop now; busy ones finish their reconcile (within `grace`) and stop."""
        self._stopping = True
        for task in self._workers:
            if task not in self._busy:
                task.cancel()
        busy = [t for t in self._workers if not t.done()]
        if busy:
            await asyncio.wait(busy, timeout=grace)

    def _teardown(self) -> None:
        for h in self._handlers:
            h.remove()
        self._handlers.clear()
        if self.client is not None and self._on_write in self.client.on_write:
            self.client.on_write.remove(self._on_write)
        for req in list(self._gates):
            self._release(req, timed_out=False, observe=False)
        self._own.clear()
        self.queue.shutdown()
        self._triggers.clear()

    def _init_metrics(self) -> None:
        m = self._m
        for child in m.total.values():
            child.inc(0)
        for counter in (m.errors, m.terminal, m.panics, m.timeouts, m.ryw_timeouts):
            counter.inc(0)
        m.max_concurrent.set(self.max_concurrent_reconciles)

    async def _worker(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        queue = self.queue
        while not self._stopping:
            try:
                req = await queue.get()
            except ShutDown:
                return
            self._busy.add(me)
            try:
                await self._process(req)
            finally:
                self._busy.discard(me)
                queue.done(req)

    async def _process(self, req: Request) -> None:
        m = self._m
        trigger = self._triggers.pop(req, "unknown")
        run = _Run(self, req)
        token = _CURRENT.set(run)
        m.active.inc()
        start = time.perf_counter()
        try:
            with structlog.contextvars.bound_contextvars(
                controller=self.name, key=req.key, reconcile_id=str(uuid.uuid4()), trigger=trigger
            ):
                await self._reconcile_and_handle(req)
        finally:
            m.time.observe(time.perf_counter() - start)
            m.active.dec()
            _CURRENT.reset(token)
            if run.writes:
                self._gate(req, run)

    async def _reconcile_and_handle(self, req: Request) -> None:
        m = self._m
        queue = self.queue
        try:
            if self.reconcile_timeout is None:
                result = await self.reconcile(req)
            else:
                scope = asyncio.timeout(self.reconcile_timeout)
                try:
                    async with scope:
                        result = await self.reconcile(req)
                except TimeoutError:
                    if scope.expired():
                        m.timeouts.inc()
                    raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            m.errors.inc()
            m.total["error"].inc()
            if _is_terminal(exc):
                m.terminal.inc()
                queue.forget(req)
                log.error("reconcile failed with a terminal error, not retrying", error=str(exc), exc_info=exc)
                return
            panic = _is_panic(exc)
            if panic:
                m.panics.inc()
            delay = queue.add_rate_limited(req)
            self._triggers.setdefault(req, "retry")
            log.error(
                "reconcile panicked, retrying" if panic else "reconcile failed, retrying",
                error=str(exc) or type(exc).__name__,
                error_type=type(exc).__name__,
                retry_in=round(delay, 3),
                attempt=queue.num_requeues(req),
                exc_info=exc if panic else None,
            )
            return
        if result is not None and result.requeue_after is not None and result.requeue_after > 0:
            queue.forget(req)
            queue.add_after(req, result.requeue_after)
            self._triggers.setdefault(req, "requeue_after")
            m.total["requeue_after"].inc()
        elif result is not None and result.requeue:
            queue.add_rate_limited(req)
            self._triggers.setdefault(req, "requeue")
            m.total["requeue"].inc()
        else:
            queue.forget(req)
            m.total["success"].inc()

    # ------------------------------------------------------------------------------------------ read-your-own-writes

    def _on_write(self, rt: ResourceType[Any], namespace: str, name: str, resource_version: str) -> None:
        run = _CURRENT.get()
        if run is None or run.controller is not self:
            return
        key = f"{namespace}/{name}" if namespace else name
        for inf in self.informers():
            if inf.rt.group != rt.group or inf.rt.plural != rt.plural:
                continue
            if inf.namespace and rt.namespaced and inf.namespace != namespace:
                continue
            slot = (id(inf), key)
            prev = run.writes.get(slot)
            if prev is not None:
                with contextlib.suppress(rvmod.NotComparable):
                    if rvmod.is_newer_or_equal(prev.resource_version, resource_version):
                        continue  # concurrent writes inside one reconcile may report out of order
            run.writes[slot] = _Write(inf, key, resource_version)
            if self.skip_own_write_events:
                self._own[slot] = (resource_version, run.request)

    def _own_write(self, informer: Informer[Any], obj: Any, resource_version: str) -> Request | None:
        """The key whose reconcile wrote `obj` at exactly `resource_version`, if that write is what this event
        brings; the record is dropped once an event at or past its version arrives."""
        slot = (id(informer), informer.rt.key(obj))
        own = self._own.get(slot)
        if own is None:
            return None
        written, writer = own
        if written == resource_version:
            del self._own[slot]
            return writer
        try:
            if rvmod.is_newer_or_equal(written, resource_version):
                return None  # an older event (someone else's, or an earlier write of ours): keep waiting
        except rvmod.NotComparable:
            pass
        del self._own[slot]  # a newer version came first: our write's event has passed or never comes
        return None

    def _gate(self, req: Request, run: _Run) -> None:
        if self._stopping or not self.read_your_writes:
            return
        pending = [w for w in run.writes.values() if not w.informer.seen(w.key, w.resource_version)]
        if not pending:
            return
        loop = asyncio.get_running_loop()
        self.queue.hold(req)
        timer = loop.call_later(self.read_your_writes_timeout, self._release, req, True, True)
        self._gates[req] = _Gate(pending, loop.time(), timer)
        self._gate_pending.set()

    def _check_gates(self, informer: Informer[Any] | None = None) -> None:
        if not self._gates:
            return
        for req, gate in list(self._gates.items()):
            if informer is not None and all(w.informer is not informer for w in gate.pending):
                continue
            gate.pending = [w for w in gate.pending if not w.informer.seen(w.key, w.resource_version)]
            if not gate.pending:
                self._release(req, False, True)

    def _release(self, req: Request, timed_out: bool, observe: bool = True) -> None:
        gate = self._gates.pop(req, None)
        if gate is None:
            return
        gate.timer.cancel()
        self.queue.release(req)
        if observe:
            self._m.ryw_wait.observe(asyncio.get_running_loop().time() - gate.since)
        if timed_out:
            self._m.ryw_timeouts.inc()
            log.warning(
                "cache did not catch up with this controller's writes in time; reconciling anyway",
                controller=self.name,
                key=req.key,
                waiting_for=[f"{w.informer.name}:{w.key}@{w.resource_version}" for w in gate.pending],
                timeout=self.read_your_writes_timeout,
            )

    async def _recheck_gates(self) -> None:
        """Writes the informers get no event for (outside a selector) are seen through bookmarks only."""
        while True:
            await self._gate_pending.wait()
            await asyncio.sleep(self.read_your_writes_recheck)
            self._check_gates()
            if not self._gates:
                self._gate_pending.clear()


def requeue_at(now: int, instants: Iterable[int | None]) -> Result | None:
    """A Result that brings the key back at the earliest of `instants` (microseconds; None entries ignored).

    1 ms late on purpose: at the instant itself the answer has changed, not a microsecond before.
    """
    due = [t for t in instants if t is not None]
    if not due:
        return None
    return Result(requeue_after=max(0.0, (min(due) - now) / 1_000_000) + 0.001)

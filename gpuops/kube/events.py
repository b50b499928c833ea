"""Kubernetes core/v1 Events with client-go's correlation, written off the caller's path.

Two layers. `EventCorrelator` is pure and clock-injected (``now`` is an argument): it decides,
per occurrence, whether to create a new Event, patch the count of an existing one, or suppress
it, exactly as client-go's ``tools/record`` EventCorrelator does:

* identical occurrences (same source, involvedObject, type, reason, message) seen again within
  ``window`` (10 min, sliding) bump ``count``/``lastTimestamp`` of one Event instead of creating
  more objects;
* once ``max_similar`` (10) distinct messages for the same source+object+type+reason were seen
  within ``window``, further ones go to one aggregate Event whose message is prefixed
  ``"(combined from similar events): "`` (the 10th distinct message is the first aggregated, as
  in client-go);
* a token bucket per source+object (burst 25, one token per 5 min) suppresses event storms.
  Suppressed occurrences still advance the local count, so the next write that gets a token
  carries the true total (client-go does the same).

`EventRecorder` is the thin I/O layer: ``record()`` is synchronous and never blocks or raises on
runtime trouble; writes go through a bounded queue (pending writes for the same Event coalesce,
so a burst costs one request) to a background task that POSTs / strategic-merge PATCHes with
bounded, jittered retries. Everything that is not written is counted in
``gpuops_events_dropped_total{reason}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

import msgspec
import structlog

from . import metrics
from .errors import ApiError

__all__ = [
    "AGGREGATE_PREFIX",
    "Clock",
    "EventCorrelator",
    "EventRecorder",
    "EventSink",
    "EventType",
    "WallClock",
    "Write",
    "event_name",
    "make_event",
    "object_reference",
]

log = structlog.get_logger("gpuops.kube.events")

EventType = Literal["Normal", "Warning"]
AGGREGATE_PREFIX = "(combined from similar events): "

_STRATEGIC = "application/strategic-merge-patch+json"
_NAME_LIMIT = 253
_SUFFIX_LEN = 17  # "." + 16 hex digits
_REF_FIELDS = ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")


class Clock(Protocol):
    """Time source. ``now()`` must be Unix time in seconds: Event timestamps and names come from it."""

    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.time()

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - time.time()))


class EventSink(Protocol):
    """What the recorder needs of `gpuops.kube.client.Client` (raw requests, ApiError on failure)."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the Client signature
        accept: str = "application/json",
    ) -> bytes: ...


# ------------------------------------------------------------------------------------ pure helpers


def format_timestamp(now: float) -> str:
    """metav1.Time: RFC 3339, second precision, UTC."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(object_name: str, nanos: int) -> str:
    """``<object name>.<16 hex digits of Unix nanoseconds>`` as client-go names Events; long names are
    cut so the result stays a valid (<= 253 character) object name."""
    base = object_name[: _NAME_LIMIT - _SUFFIX_LEN].rstrip(".-") or "event"
    return f"{base}.{nanos & 0xFFFF_FFFF_FFFF_FFFF:016x}"


_KINDS: dict[type, tuple[str, str]] = {}


def _kind_of_struct(cls: type) -> tuple[str, str]:
    """(kind, apiVersion) of a typed object that does not carry them (list items never do)."""
    found = _KINDS.get(cls)
    if found is None:
        from . import resources  # the descriptors name the Struct of each built-in type

        found = next(
            ((v.kind, v.api_version) for v in vars(resources).values()
             if isinstance(v, resources.ResourceType) and v.struct is cls),
            ("", ""),
        )
        _KINDS[cls] = found
    return found


def object_reference(obj: Any, *, kind: str | None = None, api_version: str | None = None) -> dict[str, Any]:
    """An ObjectReference (JSON shape) for an object Struct/dict with metadata, or for a reference.

    Our Structs do not keep kind/apiVersion (list items lack them): explicit ``kind``/``api_version``
    win, then the object's own fields, then the built-in `ResourceType` whose Struct it is.
    Raises ValueError when kind or name cannot be determined: that is a programming error that a
    unit test should catch, not something to discover from a missing Event in production.
    """
    if isinstance(obj, Mapping):
        doc: Any = obj
    elif isinstance(obj, msgspec.Struct):
        doc = msgspec.to_builtins(obj)
    else:
        raise ValueError(f"regarding: expected an object or an ObjectReference, got {type(obj).__name__}")
    if not isinstance(doc, Mapping):
        raise ValueError("regarding: not an object")
    meta = doc.get("metadata")
    if isinstance(meta, Mapping):
        kind, api_version = kind or doc.get("kind") or "", api_version or doc.get("apiVersion") or ""
        if not kind or not api_version:
            k, v = _kind_of_struct(type(obj))
            kind, api_version = kind or k, api_version or v
        ref: dict[str, Any] = {"kind": kind, "apiVersion": api_version}
        for key in ("namespace", "name", "uid", "resourceVersion"):
            if meta.get(key):
                ref[key] = meta[key]
    else:
        ref = {key: doc[key] for key in _REF_FIELDS if doc.get(key)}
        if kind:
            ref["kind"] = kind
        if api_version:
            ref["apiVersion"] = api_version
    if not ref.get("kind"):
        raise ValueError("regarding: kind unknown; set kind/apiVersion or pass an ObjectReference")
    if not ref.get("name"):
        raise ValueError("regarding: metadata.name is empty")
    return ref


def make_event(
    component: str,
    instance: str | None,
    regarding: Mapping[str, Any],
    type: str,
    reason: str,
    message: str,
    *,
    action: str | None = None,
    related: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A core/v1 Event before correlation: no name, count or timestamps yet.

    Cluster-scoped objects get their Events in "default", as client-go does (legacy validation
    accepts only "" or "default" there).
    """
    source: dict[str, str] = {"component": component}
    if instance:
        source["host"] = instance
    ev: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": regarding.get("namespace") or "default"},
        "involvedObject": dict(regarding),
        "reason": reason,
        "message": message,
        "type": type,
        "source": source,
        "reportingComponent": component,
        "reportingInstance": instance or "",
    }
    if action:
        ev["action"] = action
    if related:
        ev["related"] = dict(related)
    return ev


@dataclass
class Write:
    """One API write decided by the correlator; ``event`` is the full Event as it should end up."""

    verb: Literal["create", "patch"]
    event: dict[str, Any]

    @property
    def namespace(self) -> str:
        ns: str = self.event["metadata"]["namespace"]
        return ns

    @property
    def name(self) -> str:
        name: str = self.event["metadata"]["name"]
        return name

    def patch_body(self) -> dict[str, Any]:
        """What changes between occurrences (client-go's two-way merge patch has exactly these)."""
        return {
            "count": self.event["count"],
            "lastTimestamp": self.event["lastTimestamp"],
            "message": self.event["message"],
        }


@dataclass
class _Observation:
    name: str
    first_timestamp: str
    count: int
    last_seen: float
    written: bool  # a write was emitted for this Event (else the next allowed one must create it)


@dataclass
class _Similar:
    messages: OrderedDict[str, None] = field(default_factory=OrderedDict)
    last_seen: float = float("-inf")


@dataclass
class _Bucket:
    tokens: float
    last: float


K = TypeVar("K")
V = TypeVar("V")


def _lru_put(cache: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)


class EventCorrelator:
    """client-go's EventCorrelator (aggregate -> observe -> spam filter) as a pure state machine."""

    def __init__(
        self,
        *,
        max_similar: int = 10,
        window: float = 600.0,
        spam_burst: int = 25,
        spam_interval: float = 300.0,
        cache_size: int = 4096,
    ) -> None:
        if max_similar < 1 or spam_burst < 1 or window <= 0 or spam_interval <= 0 or cache_size < 1:
            raise ValueError("EventCorrelator: max_similar, spam_burst, window, spam_interval, cache_size must be > 0")
        self.max_similar = max_similar
        self.window = window
        self.spam_burst = spam_burst
        self.spam_interval = spam_interval
        self.cache_size = cache_size
        self._similar: OrderedDict[tuple[str, ...], _Similar] = OrderedDict()
        self._seen: OrderedDict[tuple[str, ...], _Observation] = OrderedDict()
        self._buckets: OrderedDict[tuple[str, ...], _Bucket] = OrderedDict()
        self._last_nanos = 0

    @staticmethod
    def _keys(ev: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        src, obj = ev.get("source") or {}, ev.get("involvedObject") or {}
        spam = (
            src.get("component", ""),
            src.get("host", ""),
            obj.get("kind", ""),
            obj.get("namespace", ""),
            obj.get("name", ""),
            obj.get("uid", ""),
            obj.get("apiVersion", ""),
        )
        similar = (*spam, ev.get("type", ""), ev.get("reason", ""), ev.get("reportingComponent", ""),
                   ev.get("reportingInstance", ""))
        identical = (*spam, obj.get("fieldPath", ""), ev.get("type", ""), ev.get("reason", ""), ev.get("message", ""))
        return spam, similar, identical

    def _take_token(self, key: tuple[str, ...], now: float) -> bool:
        bucket = self._buckets.get(key) or _Bucket(float(self.spam_burst), now)
        elapsed = max(0.0, now - bucket.last)  # a clock step backwards refills nothing
        bucket.tokens = min(float(self.spam_burst), bucket.tokens + elapsed / self.spam_interval)
        bucket.last = max(bucket.last, now)
        allowed = bucket.tokens >= 1.0
        if allowed:
            bucket.tokens -= 1.0
        _lru_put(self._buckets, key, bucket, self.cache_size)
        return allowed

    def _new_name(self, object_name: str, now: float) -> str:
        # Strictly increasing per correlator, so two Events created in the same nanosecond (or under
        # a frozen test clock) never collide into AlreadyExists.
        self._last_nanos = max(int(now * 1e9), self._last_nanos + 1)
        return event_name(object_name, self._last_nanos)

    def correlate(self, event: Mapping[str, Any], now: float) -> Write | None:
        """The write for one occurrence of ``event`` (from `make_event`) at ``now``; None if suppressed."""
        spam_key, similar_key, identical_key = self._keys(event)
        message = str(event.get("message", ""))

        similar = self._similar.get(similar_key)
        if similar is None or now - similar.last_seen > self.window:
            similar = _Similar()
        similar.messages.pop(message, None)
        similar.messages[message] = None
        similar.last_seen = now
        _lru_put(self._similar, similar_key, similar, self.cache_size)
        if len(similar.messages) < self.max_similar:
            key: tuple[str, ...] = ("event", *identical_key)
        else:
            similar.messages.popitem(last=False)  # keep the set at max_similar - 1, as client-go does
            key = ("aggregate", *similar_key)
            message = AGGREGATE_PREFIX + message

        stamp = format_timestamp(now)
        seen = self._seen.get(key)
        if seen is not None and now - seen.last_seen <= self.window:
            seen = _Observation(seen.name, seen.first_timestamp, seen.count + 1, now, seen.written)
        else:
            obj_name = str((event.get("involvedObject") or {}).get("name", ""))
            seen = _Observation(self._new_name(obj_name, now), stamp, 1, now, False)

        allowed = self._take_token(spam_key, now)
        verb: Literal["create", "patch"] = "patch" if seen.written else "create"
        if allowed:
            seen.written = True
        _lru_put(self._seen, key, seen, self.cache_size)
        if not allowed:
            return None
        out = dict(event)
        out["metadata"] = {**(event.get("metadata") or {}), "name": seen.name}
        out["message"] = message
        out.update(count=seen.count, firstTimestamp=seen.first_timestamp, lastTimestamp=stamp)
        return Write(verb, out)


# -------------------------------------------------------------------------------------- I/O layer


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, ApiError):
        return exc.status == 0 or exc.status == 429 or exc.status >= 500
    return True  # anything the client did not classify (OSError, timeouts): assume transient


class EventRecorder:
    """Records Events about objects without ever blocking or failing the caller.

    ``record()`` correlates at once (so suppressed occurrences never occupy the queue) and queues
    the resulting write; `run()` (or `start()`/`stop()`) writes them. A write is attempted up to
    ``max_attempts`` times on 5xx/429/transport errors with jittered exponential backoff (at least
    the server's Retry-After), then dropped and counted; other 4xx are dropped at once.
    """

    def __init__(
        self,
        client: EventSink,
        component: str,
        *,
        instance: str | None = None,
        clock: Clock | None = None,
        correlator: EventCorrelator | None = None,
        queue_size: int = 1000,
        max_attempts: int = 12,  # client-go's recorder tries an Event 12 times: it outlives an API outage
        retry_base: float = 0.5,
        retry_cap: float = 30.0,
        request_timeout: float = 10.0,
        rng: random.Random | None = None,
    ) -> None:
        if not component:
            raise ValueError("component: required (it becomes source.component / reportingComponent)")
        if queue_size < 1 or max_attempts < 1:
            raise ValueError("queue_size and max_attempts must be >= 1")
        self.client = client
        self.component = component
        self.instance = instance
        self.clock: Clock = clock or WallClock()
        self.correlator = correlator or EventCorrelator()
        self.queue_size = queue_size
        self.max_attempts = max_attempts
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.request_timeout = request_timeout
        self._rng = rng or random.Random()
        self._queue: deque[Write] = deque()
        self._pending: dict[tuple[str, str], Write] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False
        self._busy = False
        self._task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------------------------- recording

    def record(
        self,
        regarding: Any,
        type: EventType,
        reason: str,
        message: str,
        *,
        action: str | None = None,
        related: Any = None,
        kind: str | None = None,
        api_version: str | None = None,
    ) -> None:
        """Queue an Event about ``regarding``; returns at once.

        ``regarding``/``related``: an object (Struct or dict with metadata) or an ObjectReference;
        ``kind``/``api_version`` name the type of ``regarding`` when it cannot say (see `object_reference`).

        ValueError for a bad ``type``/``reason`` or an object without kind/name (caller bugs);
        everything at run time (full queue, spam, API failures) is counted, never raised.
        """
        if type not in ("Normal", "Warning"):
            raise ValueError(f"type: {type!r} must be 'Normal' or 'Warning'")
        if not reason:
            raise ValueError("reason: required (CamelCase, e.g. 'BudgetExceeded')")
        ref = object_reference(regarding, kind=kind, api_version=api_version)
        rel = object_reference(related) if related is not None else None
        metrics.EVENTS_TOTAL.labels(type=type, reason=reason).inc()
        proposed = make_event(self.component, self.instance, ref, type, reason, message, action=action, related=rel)
        write = self.correlator.correlate(proposed, self.clock.now())
        if write is None:
            metrics.EVENTS_DROPPED.labels(reason="spam").inc()
            return
        self._enqueue(write)

    def _enqueue(self, write: Write) -> None:
        key = (write.namespace, write.name)
        queued = self._pending.get(key)
        if queued is not None:
            queued.event = write.event  # later state of the same Event: one request carries both
            return
        if len(self._queue) >= self.queue_size:
            metrics.EVENTS_DROPPED.labels(reason="queue_full").inc()
            log.warning("event dropped: queue full", event_reason=write.event.get("reason"), queue=self.queue_size)
            return
        self._queue.append(write)
        self._pending[key] = write
        self._idle.clear()
        self._wake.set()

    @property
    def pending(self) -> int:
        """Writes queued or in flight."""
        return len(self._queue) + (1 if self._busy else 0)

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> asyncio.Task[None]:
        """Run the writer as a task of the running loop (`stop()` ends it)."""
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"events:{self.component}")
        return self._task

    async def stop(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Write what is queued (for up to ``timeout`` seconds), then end the writer."""
        self._stopping = True
        self._wake.set()
        task, self._task = self._task, None
        if task is None:  # run() is driven by someone else's task group: give it the time to drain
            await self.flush(timeout)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), timeout)
        if not task.done():
            abandoned = self.pending
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if abandoned:
                metrics.EVENTS_DROPPED.labels(reason="shutdown").inc(abandoned)
                log.warning("events dropped at shutdown", count=abandoned)
            self._queue.clear()
            self._pending.clear()
            self._idle.set()

    async def flush(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until every queued write has been attempted; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        """The writer loop; returns once `stop()` was called and the queue is empty."""
        while True:
            while not self._queue:
                self._idle.set()
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
            write = self._queue.popleft()
            self._pending.pop((write.namespace, write.name), None)
            self._busy = True
            try:
                await self._write(write)
            except Exception:  # never let one bad write end the writer
                metrics.EVENTS_DROPPED.labels(reason="error").inc()
                log.exception("event write crashed", event_name=write.name)
            finally:
                self._busy = False

    # ---------------------------------------------------------------------------------- writing

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        ceiling = min(self.retry_cap, self.retry_base * 2.0**attempt)
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.retry_cap))
        return delay

    async def _send(self, verb: Literal["create", "patch"], write: Write) -> None:
        base = f"/api/v1/namespaces/{write.namespace}/events"
        if verb == "create":
            await self.client.request(
                "POST", base, body=msgspec.json.encode(write.event), content_type="application/json",
                timeout=self.request_timeout,
            )
        else:
            await self.client.request(
                "PATCH", f"{base}/{write.name}", body=msgspec.json.encode(write.patch_body()),
                content_type=_STRATEGIC, timeout=self.request_timeout,
            )

    async def _write(self, write: Write) -> None:
        verb = write.verb
        for attempt in range(self.max_attempts):
            try:
                await self._send(verb, write)
                return
            except Exception as exc:
                if isinstance(exc, ApiError) and exc.status == 404 and verb == "patch":
                    verb = "create"  # expired (event TTL) or its create was dropped: recreate with the count
                    continue
                if isinstance(exc, ApiError) and exc.status == 409 and exc.reason == "AlreadyExists":
                    verb = "patch"  # an earlier attempt landed after all
                    continue
                if not _retryable(exc):
                    metrics.EVENTS_DROPPED.labels(reason="rejected").inc()
                    log.warning("event rejected", event_name=write.name, error=str(exc))
                    return
                if attempt + 1 >= self.max_attempts:
                    break
                retry_after = exc.retry_after if isinstance(exc, ApiError) else None
                delay = self._backoff(attempt, retry_after)
                log.debug("event write failed, retrying", event_name=write.name, error=str(exc), delay=delay)
                await self.clock.sleep_until(self.clock.now() + delay)
        metrics.EVENTS_DROPPED.labels(reason="write_failed").inc()
        log.warning("event dropped after retries", event_name=write.name, attempts=self.max_attempts)

"""The list/watch state machine that keeps an informer's store in step with the API server.

What it does:

* **Initial list.** A streaming list (watch with `sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`,
  `allowWatchBookmarks=true`) where the server supports it: items are stamped into the store as they arrive,
  the `k8s.io/initial-events-end` bookmark ends the set (sweep, synced), and the same stream carries on as the
  watch. A server that refuses it (a 4xx other than 408/410/429) gets a paginated list instead (page 500,
  configurable), remembered per (host, resource) for the life of the process.
* **resourceVersion of a relist.** Paginated: "0" on the first list, the last synced RV (NotOlderThan) after
  a 410, a consistent read ("") once a list at that RV failed as Expired/Gone or "Too large resource
  version". Streaming: the last synced RV, else "". A continue token that expired mid-list restarts the
  list unpaginated (client-go's FullListIfExpired), in a fresh epoch.
* **Watch.** From the last synced RV, bookmarks on, `timeoutSeconds` random in [min, 2 x min] (5-10 min).
  A normal close re-watches at once; a very short watch (under 1 s, no frames), 429 (at least Retry-After),
  5xx and connection errors back off and re-watch without a relist; 410 relists; other errors back off and
  relist.
* **Backoff**: 0.8 s doubling to 30 s, full jitter (uniform in [0, d]), reset after 2 minutes without one.
* **Watchdog**: a watch that yields no frame (event or bookmark) for `watchdog` seconds (default 70, above
  the ~60 s bookmark cadence) is restarted, including one whose response headers never arrive. Time spent
  waiting on full handler buffers does not count as silence.

Frames are decoded by msgspec straight into the resource's Struct (a BOOKMARK frame also into a small model
of its own, so a resource's model need not keep annotations); an ERROR frame becomes the matching `ApiError`.
The reflector writes only through its `Sink` (the informer), which owns the store, the handlers and
backpressure: after each item, if `sink.full`, the reflector awaits `sink.drain()` and stops reading.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import operator
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Literal, Protocol, TypeVar

import msgspec
import structlog

from . import metrics
from .client import Client
from .errors import ApiError, Gone, NotFound, ServerError, TooManyRequests, TransportError
from .resources import ResourceType

__all__ = ["INITIAL_EVENTS_END", "Backoff", "Reflector", "ReflectorOptions", "Sink"]

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

log = structlog.get_logger("gpuops.kube.reflector")

INITIAL_EVENTS_END = "k8s.io/initial-events-end"

_STREAMING_REFUSED: set[tuple[str, str, str, str]] = set()
"""(host, group, version, plural) whose server refused a streaming list: lists are paginated from then on."""


@dataclass(frozen=True)
class ReflectorOptions:
    """Tunables; the defaults are client-go's (watchdog: kopf's 70 s inactivity reconnect)."""

    initial_list: Literal["auto", "paginated"] = "auto"
    """"auto": streaming list, falling back to pages if the server refuses; "paginated": pages only."""
    page_size: int = 500
    min_watch_timeout: float = 300.0
    """timeoutSeconds of each watch is uniform in [min, 2 x min]."""
    watchdog: float = 70.0
    """Restart a watch silent (no event, no bookmark) for this long; keep above the bookmark cadence."""
    backoff_initial: float = 0.8
    backoff_cap: float = 30.0
    backoff_reset: float = 120.0
    very_short_watch: float = 1.0
    missing_end_warning: float = 10.0
    """Warn every this many seconds while a streaming list has not sent its initial-events-end bookmark."""


class Sink(Protocol[T_contra]):
    """Where the reflector puts what it reads (implemented by the informer)."""

    @property
    def full(self) -> bool:
        """A consumer's buffer is at capacity: `drain()` before the next item."""
        ...

    async def drain(self) -> None: ...

    def begin_relist(self) -> None:
        """Start a new epoch: items stamped from now on survive the sweep of `end_relist`."""
        ...

    def upsert(self, obj: T_contra) -> None: ...

    def delete(self, obj: T_contra) -> None: ...

    async def end_relist(self, resource_version: str) -> None:
        """The list is complete at `resource_version`: sweep unstamped keys (synthetic deletes), mark synced."""
        ...

    def advance(self, resource_version: str) -> None:
        """The store is current up to `resource_version` (a watch event or bookmark)."""
        ...


class Backoff:
    """Exponential backoff with full jitter, reset after `reset_after` seconds without a backoff.

    client-go jitters upward ([d, 2d]); full jitter ([0, d]) spreads a thundering herd of reflectors better
    and keeps the same cap.
    """

    def __init__(
        self,
        initial: float = 0.8,
        cap: float = 30.0,
        factor: float = 2.0,
        reset_after: float = 120.0,
        *,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.reset_after = reset_after
        self._rng = rng
        self._clock = clock
        self._step = 0
        self._last: float | None = None
        self._max_step = max(1, math.ceil(math.log(max(cap / initial, 1.0), factor)) + 1) if initial > 0 else 1

    @property
    def step(self) -> int:
        return self._step

    def ceiling(self) -> float:
        """The upper bound of the next delay (before reset)."""
        return min(self.cap, self.initial * self.factor**self._step)

    def next(self) -> float:
        now = self._clock()
        if self._last is not None and now - self._last >= self.reset_after:
            self._step = 0
        bound = self.ceiling()
        self._step = min(self._step + 1, self._max_step)
        self._last = now
        return self._rng() * bound

    def reset(self) -> None:
        self._step = 0
        self._last = None


class _End(Enum):
    """How one watch connection ended."""

    CLOSED = "closed"  # the server ended it (timeoutSeconds) or the stream broke after frames: re-watch now
    VERY_SHORT = "very_short"
    TRANSPORT = "transport"
    THROTTLED = "throttled"
    SERVER_ERROR = "server_error"
    WATCHDOG = "watchdog"
    EXPIRED = "expired"  # 410: relist
    REFUSED = "refused"  # a streaming list the server does not support
    ERROR = "error"  # anything else: back off, relist


_REWATCH_BACKOFF = {_End.VERY_SHORT, _End.TRANSPORT, _End.THROTTLED, _End.SERVER_ERROR, _End.WATCHDOG}


@dataclass
class _Outcome:
    end: _End
    error: BaseException | None = None
    frames: int = 0
    synced: bool = False  # a streaming list reached its initial-events-end bookmark
    opened: bool = False  # the server answered 200 and the stream was being read


class _Frame(msgspec.Struct, Generic[T], gc=False):
    type: str = ""
    object: T | None = None


class _RawFrame(msgspec.Struct, gc=False):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw(b"null")


class _StatusCode(msgspec.Struct, gc=False):
    code: int = 0


class _BookmarkMeta(msgspec.Struct, rename="camel", gc=False):
    resource_version: str = ""
    annotations: dict[str, str] | None = None


class _BookmarkObject(msgspec.Struct, gc=False):
    metadata: _BookmarkMeta = msgspec.field(default_factory=_BookmarkMeta)


class _BookmarkFrame(msgspec.Struct, gc=False):
    """A BOOKMARK frame's own reading: bookmarks are rare, so decoding them twice costs nothing, and the
    resource's model need not keep annotations (or a resourceVersion) for the reflector's sake."""

    object: _BookmarkObject = msgspec.field(default_factory=_BookmarkObject)


_raw_frame = msgspec.json.Decoder(_RawFrame)
_status_code = msgspec.json.Decoder(_StatusCode)
_bookmark_frame = msgspec.json.Decoder(_BookmarkFrame)


def _frame_error(line: bytes) -> ApiError:
    """The ApiError an ERROR frame carries (its object is a metav1.Status)."""
    try:
        raw = bytes(_raw_frame.decode(line).object)
        code = _status_code.decode(raw).code
    except msgspec.DecodeError:
        return ServerError(500, "InternalError", f"undecodable watch frame: {line[:200]!r}")
    return ApiError.from_response(code or 500, raw, {})


def _too_large_rv(e: ApiError) -> bool:
    return any(c.reason == "ResourceVersionTooLarge" for c in e.causes) or (
        "too large resource version" in e.message.lower()
    )


def _refusal(e: ApiError) -> bool:
    """A server without streaming lists answers 400/422 (unknown or forbidden parameters); auth failures and
    throttling are not refusals of the feature."""
    return 400 <= e.status < 500 and e.status not in (401, 403, 408, 410, 429)


class _Tally:
    """Per-event metrics summed in plain ints by the hot loop and handed to prometheus_client in one go.

    A Counter.inc or Histogram.observe takes a lock and a few Python calls each; at tens of thousands of
    events per second that is a tenth of the cost of an event. The sums are flushed by a callback scheduled
    on the first event after a flush, so they reach the metrics as soon as the reflector yields to the event
    loop (after the frames of one network read), and when a watch ends.
    """

    def __init__(self, events: Mapping[str, Any], latency: Any) -> None:
        self.events = events
        self.counts = dict.fromkeys(events, 0)
        self.latency = latency
        bounds = getattr(latency, "_upper_bounds", None)
        buckets = getattr(latency, "_buckets", None)
        total = getattr(latency, "_sum", None)
        # prometheus_client's Histogram keeps one non-cumulative count per bound and a sum; add to them in
        # bulk. Should that layout ever change, fall back to observing each value.
        self.direct = bounds is not None and buckets is not None and total is not None and len(bounds) == len(
            buckets
        )
        self.bounds: list[float] = list(bounds) if self.direct and bounds is not None else [math.inf]
        self.hist = [0] * len(self.bounds)
        self.sum = 0.0
        self.values: list[float] = []
        self.scheduled = False

    def observe(self, seconds: float) -> None:
        if self.direct:
            self.hist[bisect.bisect_left(self.bounds, seconds)] += 1
            self.sum += seconds
        else:
            self.values.append(seconds)

    def flush(self) -> None:
        self.scheduled = False
        counts = self.counts
        for typ, n in counts.items():
            if n:
                self.events[typ].inc(n)
                counts[typ] = 0
        if self.direct:
            hist = self.hist
            if any(hist):
                buckets = self.latency._buckets
                for i, n in enumerate(hist):
                    if n:
                        buckets[i].inc(n)
                        hist[i] = 0
                self.latency._sum.inc(self.sum)
                self.sum = 0.0
        elif self.values:
            values, self.values = self.values, []
            for v in values:
                self.latency.observe(v)


class _Watchdog:
    """Cancels its scope once `last` is older than `threshold` (unless paused); one timer per threshold."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold: float) -> None:
        self.loop = loop
        self.threshold = threshold
        self.last = loop.time()
        self.paused = False
        self.fired = False
        self._scope: asyncio.Timeout | None = None
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, scope: asyncio.Timeout) -> None:
        self._scope = scope
        self.last = self.loop.time()
        self._handle = self.loop.call_at(self.last + self.threshold, self._check)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._scope = None

    def _check(self) -> None:
        if self._scope is None:
            return
        now = self.loop.time()
        if self.paused:
            self._handle = self.loop.call_at(now + self.threshold, self._check)
        elif now - self.last >= self.threshold:
            self.fired = True
            self._handle = None
            self._scope.reschedule(now)
        else:
            self._handle = self.loop.call_at(self.last + self.threshold, self._check)


class Reflector(Generic[T]):
    """Lists and watches one resource (optionally one namespace and selectors) into a `Sink`."""

    def __init__(
        self,
        client: Client,
        rt: ResourceType[T],
        sink: Sink[T],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        options: ReflectorOptions | None = None,
        name: str | None = None,
        transform: Callable[[T], T] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.rt = rt
        self.sink = sink
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.options = options or ReflectorOptions()
        self.name = name or rt.plural
        self.transform = transform
        self._rng = rng or random.Random()
        self.backoff = Backoff(
            self.options.backoff_initial,
            self.options.backoff_cap,
            reset_after=self.options.backoff_reset,
            rng=self._rng.random,
        )
        self.last_sync_resource_version = ""
        """The RV the store is known to be current at (list RV, then each event's and bookmark's)."""
        self.last_frame = time.monotonic()
        self.synced = False
        self._started = self.last_frame
        self.watching_since: float | None = None
        """Monotonic time since which a watch has been open on a synced store (None while none is)."""
        self.current_until = self.last_frame
        """Monotonic time the store was last known current: when the previous watch ended."""
        self.relists = 0
        self.watch_restarts = 0
        self.streaming_lists = 0
        self.paginated_lists = 0
        self.last_error: BaseException | None = None
        self._rv_unavailable = False
        self._listed_once = False
        self._path = rt.path(namespace)
        self._decode: Callable[[bytes], _Frame[T]] = msgspec.json.Decoder(_Frame[rt.struct]).decode  # type: ignore[name-defined]
        self._rv_of = _rv_getter(rt)
        self._streaming_key = (client.host, rt.group, rt.version, rt.plural)
        labels = (self.name, rt.group, rt.version, rt.plural)
        self._labels = labels
        self._m_latency = metrics.INFORMER_PROCESSING_LATENCY.labels(*labels)
        self._m_events = {
            t: metrics.INFORMER_EVENTS.labels(*labels, t) for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")
        }
        self._tally = _Tally(self._m_events, self._m_latency)
        self._m_list_duration = metrics.INFORMER_LIST_DURATION.labels(*labels)

    # ------------------------------------------------------------------------------------------ policy

    @property
    def streaming(self) -> bool:
        """Whether the next list will be a streaming list."""
        return self.options.initial_list == "auto" and self._streaming_key not in _STREAMING_REFUSED

    def _list_rv(self) -> tuple[str, str | None]:
        """(resourceVersion, resourceVersionMatch) of the next paginated list."""
        if not self._listed_once:
            return "0", None
        if self._rv_unavailable or not self.last_sync_resource_version:
            return "", None
        return self.last_sync_resource_version, "NotOlderThan"

    def _watch_timeout(self) -> float:
        low = self.options.min_watch_timeout
        return low + self._rng.random() * low

    # ------------------------------------------------------------------------------------------ main loop

    async def run(self) -> None:
        """List, then watch, forever (until cancelled)."""
        self._started = time.monotonic()
        need_list = True
        reason = "initial"
        while True:
            if need_list:
                self.relists += 1
                metrics.INFORMER_RELISTS.labels(*self._labels, reason).inc()
                if not self.streaming:
                    try:
                        await self._paginated_list()
                    except (ApiError, msgspec.DecodeError) as e:
                        reason = self._list_failed(e)
                        await self._sleep(self._delay(e), e)
                        continue
                    except Exception as e:  # a bug (a transform, a model): keep the informer alive, loudly
                        log.exception("list failed unexpectedly", informer=self.name)
                        reason = "error"
                        await self._sleep(self._delay(e), e)
                        continue
                    need_list = False
            outcome = await self._watch(initial_events=need_list)
            if need_list:
                if outcome.end is _End.REFUSED:
                    _STREAMING_REFUSED.add(self._streaming_key)
                    log.info(
                        "streaming list refused, falling back to paginated lists",
                        informer=self.name,
                        error=str(outcome.error),
                    )
                    reason = "fallback"
                    continue
                if not outcome.synced:
                    if outcome.end is _End.EXPIRED:
                        self._rv_unavailable = True
                    reason = "expired" if outcome.end is _End.EXPIRED else "error"
                    await self._sleep(self._delay(outcome.error), outcome.error)
                    continue
                need_list = False
            if outcome.end in (_End.EXPIRED, _End.ERROR, _End.REFUSED):
                need_list = True
                reason = "expired" if outcome.end is _End.EXPIRED else "error"
                log.info("relisting", informer=self.name, reason=reason, error=str(outcome.error))
                await self._sleep(self._delay(outcome.error), outcome.error)
                continue
            self.watch_restarts += 1
            metrics.INFORMER_WATCH_RESTARTS.labels(*self._labels, outcome.end.value).inc()
            if outcome.end in _REWATCH_BACKOFF:
                delay = self._delay(outcome.error)
                log.debug("re-watching after backoff", informer=self.name, reason=outcome.end.value, delay=delay)
                await self._sleep(delay, outcome.error)

    def _note_synced(self) -> None:
        if not self.synced:
            self.synced = True
            duration = time.monotonic() - self._started
            metrics.INFORMER_INITIAL_SYNC_DURATION.labels(*self._labels).set(duration)
            log.debug("synced", informer=self.name, seconds=round(duration, 3))

    def _list_failed(self, e: BaseException) -> str:
        if isinstance(e, Gone) or (isinstance(e, ApiError) and _too_large_rv(e)):
            self._rv_unavailable = True
            return "expired"
        if isinstance(e, NotFound):
            # The usual cause is a CustomResourceDefinition that is not installed (yet): say so, once per
            # backoff step, at a level operators see; the reflector keeps retrying and syncs once it appears.
            log.warning("list failed: the API server does not serve this resource; if it is a custom resource, "
                        "install its CRD (kubectl apply -k manifests)", informer=self.name, path=self._path)
            return "error"
        log.info("list failed", informer=self.name, error=str(e))
        return "error"

    def _delay(self, error: BaseException | None) -> float:
        """The next backoff, but never shorter than a 429's Retry-After."""
        delay = self.backoff.next()
        if isinstance(error, TooManyRequests) and error.retry_after:
            delay = max(delay, error.retry_after)
        return delay

    async def _sleep(self, delay: float, error: BaseException | None) -> None:
        self.last_error = error
        if delay > 0:
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------------------------------ list

    async def _paginated_list(self) -> None:
        rv, match = self._list_rv()
        start = time.monotonic()
        sink = self.sink
        transform = self.transform
        limit: int | None = self.options.page_size or None
        cont: str | None = None
        sink.begin_relist()
        while True:
            try:
                meta, items = await self.client.list(
                    self.rt,
                    self.namespace,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                    limit=limit,
                    continue_=cont,
                    resource_version=None if cont else rv,
                    resource_version_match=None if cont else match,
                )
            except Gone:
                if cont is None:
                    raise
                # The continue token expired: the rest of this snapshot is gone. Start over in one unpaginated
                # request (client-go's FullListIfExpired) in a new epoch, so keys stamped from the old
                # snapshot but deleted since are swept.
                log.info("continue token expired, listing without pagination", informer=self.name)
                metrics.INFORMER_RELISTS.labels(*self._labels, "continue_expired").inc()
                sink.begin_relist()
                cont, limit = None, None
                continue
            for obj in items:
                sink.upsert(transform(obj) if transform is not None else obj)
                if sink.full:
                    await sink.drain()
            del items
            if meta.continue_:
                cont = meta.continue_
                continue
            break
        list_rv = meta.resource_version
        await sink.end_relist(list_rv)
        self.paginated_lists += 1
        self._listed_once = True
        self._rv_unavailable = False
        self.last_sync_resource_version = list_rv
        self.last_frame = time.monotonic()
        self._m_list_duration.observe(time.monotonic() - start)
        self._note_synced()

    # ------------------------------------------------------------------------------------------ watch

    def _watch_query(self, initial_events: bool) -> dict[str, str]:
        timeout = self._watch_timeout()
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(math.ceil(timeout)) if timeout >= 1 else f"{timeout:.3f}",
        }
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        if initial_events:
            query["sendInitialEvents"] = "true"
            query["resourceVersionMatch"] = "NotOlderThan"
            rv = "" if self._rv_unavailable else self.last_sync_resource_version
        else:
            rv = self.last_sync_resource_version
        if rv:  # unset on a streaming list means a consistent read
            query["resourceVersion"] = rv
        return query

    async def _watch(self, initial_events: bool) -> _Outcome:
        """One watch connection, start to end; a streaming list when `initial_events`."""
        loop = asyncio.get_running_loop()
        query = self._watch_query(initial_events)
        server_timeout = float(query["timeoutSeconds"])
        wd = _Watchdog(loop, self.options.watchdog)
        outcome = _Outcome(_End.CLOSED)
        started = loop.time()
        if initial_events:
            self.sink.begin_relist()
        try:
            async with asyncio.timeout(None) as scope:
                wd.arm(scope)
                try:
                    await self._stream(query, server_timeout, wd, outcome, initial_events, started)
                finally:
                    wd.disarm()
        except TimeoutError:
            if not wd.fired:
                raise
            log.info("watch silent, restarting", informer=self.name, silent_for=self.options.watchdog)
            outcome.end = _End.WATCHDOG
        except Gone as e:
            outcome.end, outcome.error = _End.EXPIRED, e
        except TooManyRequests as e:
            outcome.end, outcome.error = _End.THROTTLED, e
        except TransportError as e:
            outcome.end, outcome.error = _End.TRANSPORT, e
        except ServerError as e:
            outcome.end, outcome.error = (_End.ERROR if _too_large_rv(e) else _End.SERVER_ERROR), e
            if _too_large_rv(e):
                self._rv_unavailable = True
        except ApiError as e:
            refused = initial_events and not outcome.synced and _refusal(e)
            outcome.end, outcome.error = (_End.REFUSED if refused else _End.ERROR), e
        except msgspec.DecodeError as e:
            log.warning("undecodable watch frame", informer=self.name, error=str(e))
            outcome.end, outcome.error = _End.TRANSPORT, e
        except Exception as e:  # a bug (a transform, a model): relist after backoff rather than die silently
            log.exception("watch failed unexpectedly", informer=self.name)
            outcome.end, outcome.error = _End.ERROR, e
        lasted = loop.time() - started
        if outcome.end is _End.TRANSPORT and (
            outcome.frames or (outcome.opened and lasted >= self.options.very_short_watch)
        ):
            # The stream broke after progress, or after an open, quiet stretch (a proxy or apiserver restart
            # cutting idle watches): re-watch at once from the last RV, as client-go does for any watch that
            # lasted a second. Backing off here left informers blind for tens of seconds under repeated drops.
            outcome.end = _End.CLOSED
        if (
            outcome.end is _End.CLOSED
            and outcome.frames == 0
            and lasted < self.options.very_short_watch
        ):
            outcome.end = _End.VERY_SHORT
        return outcome

    async def _stream(
        self,
        query: Mapping[str, str],
        server_timeout: float,
        wd: _Watchdog,
        outcome: _Outcome,
        initial_events: bool,
        started: float,
    ) -> None:
        tally = self._tally
        try:
            async with self.client.stream_batches(
                self._path,
                query,
                timeout=server_timeout + 60.0,
                # No socket read timeout: the watchdog already ends a silent stream, and aiohttp's would
                # cancel and re-arm a timer on every chunk the stream delivers.
                read_timeout=0,
            ) as batches:
                outcome.opened = True
                if not initial_events:
                    self._watching()  # from the list's resourceVersion: every change since is on its way
                await self._read_stream(batches, wd, outcome, initial_events, started, tally)
        finally:
            tally.flush()
            if self.watching_since is not None:
                self.watching_since = None
                self.current_until = time.monotonic()

    def current_through(self) -> float:
        """The monotonic instant up to which the store is known to hold the server's state: now while a watch is
        open on a synced store (its events arrive as they happen), else when the last such watch ended. A
        reader that counts time against the store (GPU-seconds of running pods) counts no further than this:
        while the watch is down a pod may already have stopped."""
        return time.monotonic() if self.watching_since is not None else self.current_until

    def _watching(self) -> None:
        if self.watching_since is None:
            self.watching_since = time.monotonic()

    async def _read_stream(
        self,
        batches: AsyncIterator[list[bytes]],
        wd: _Watchdog,
        outcome: _Outcome,
        initial_events: bool,
        started: float,
        tally: _Tally,
    ) -> None:
        """Apply every frame of an open watch to the sink. The hot loop reads locals only and observes its
        metrics inline; bookmarks, a full sink and a late initial-events-end bookmark leave it."""
        loop, now, monotonic, bucket = wd.loop, wd.loop.time, time.monotonic, bisect.bisect_left
        sink, upsert, advance = self.sink, self.sink.upsert, self.sink.advance
        decode, rv_of, transform = self._decode, self._rv_of, self.transform
        counts, observe, direct, hist, bounds = tally.counts, tally.observe, tally.direct, tally.hist, tally.bounds
        in_initial = initial_events
        next_warning = started + self.options.missing_end_warning
        async for batch in batches:  # one network read: an await per batch, not per frame
            for line in batch:
                wd.last = t0 = now()
                try:
                    frame = decode(line)
                except msgspec.ValidationError:
                    raise _frame_error(line) from None
                typ, obj = frame.type, frame.object
                if typ == "ERROR" or obj is None:
                    raise _frame_error(line)
                outcome.frames += 1
                if not tally.scheduled:
                    tally.scheduled = True
                    loop.call_soon(tally.flush)
                if typ == "BOOKMARK":
                    in_initial = await self._bookmark(line, in_initial, outcome, started)
                    continue
                if transform is not None:
                    obj = transform(obj)
                if typ == "ADDED" or typ == "MODIFIED":
                    upsert(obj)
                elif typ == "DELETED":
                    sink.delete(obj)
                else:
                    log.warning("unknown watch event type", informer=self.name, type=typ)
                    continue
                counts[typ] += 1
                if not in_initial:
                    rv = rv_of(obj)
                    self.last_sync_resource_version = rv
                    advance(rv)
                elif t0 >= next_warning:
                    next_warning = self._warn_no_initial_end(t0, started)
                if sink.full:
                    await self._drain_paused(wd)
                self.last_frame = monotonic()
                elapsed = now() - t0
                if direct:  # _Tally.observe, inline
                    hist[bucket(bounds, elapsed)] += 1
                    tally.sum += elapsed
                else:
                    observe(elapsed)

    async def _bookmark(self, line: bytes, in_initial: bool, outcome: _Outcome, started: float) -> bool:
        """Take a bookmark's resourceVersion; during a streaming list, its initial-events-end bookmark ends the
        relist (the store is synced). Returns whether the initial events are still coming."""
        self._tally.counts["BOOKMARK"] += 1
        meta = _bookmark_frame.decode(line).object.metadata
        rv = meta.resource_version
        if in_initial:
            if (meta.annotations or {}).get(INITIAL_EVENTS_END) != "true":
                # A server that supports streaming lists ends the initial set before any other
                # bookmark; one that ignored sendInitialEvents never will.
                raise ApiError(400, "BadRequest", "bookmark before the initial-events-end bookmark")
            await self.sink.end_relist(rv)
            in_initial = False
            outcome.synced = True
            self.streaming_lists += 1
            self._listed_once = True
            self._rv_unavailable = False
            self.last_sync_resource_version = rv
            self._m_list_duration.observe(asyncio.get_running_loop().time() - started)
            self._note_synced()
            self._watching()
        elif rv:
            self.last_sync_resource_version = rv
            self.sink.advance(rv)
        self.last_frame = time.monotonic()
        return in_initial

    def _warn_no_initial_end(self, at: float, started: float) -> float:
        """Say that a streaming list is still missing its end bookmark; returns when to say it again."""
        log.warning(
            "streaming list has not sent its initial-events-end bookmark yet",
            informer=self.name,
            seconds=round(at - started, 1),
        )
        return at + self.options.missing_end_warning

    async def _drain_paused(self, wd: _Watchdog) -> None:
        """Let the sink's consumers catch up; the watchdog does not count the wait as a silent stream."""
        wd.paused = True
        try:
            await self.sink.drain()
        finally:
            wd.paused = False
            wd.last = wd.loop.time()


def _rv_getter(rt: ResourceType[Any]) -> Callable[[Any], str]:
    if isinstance(rt.struct, type) and issubclass(rt.struct, Mapping):
        return lambda o: str((o.get("metadata") or {}).get("resourceVersion") or "")
    return operator.attrgetter("metadata.resource_version")

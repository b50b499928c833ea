"""The controller work queue: client-go semantics, priority lanes, delayed adds and fair per-key backoff.

Rules (client-go `util/workqueue` + controller-runtime's priority queue, with two fixes of ours):

* A key is pending at most once (dedup) and handed to at most one worker at a time: an add while the key
  is being processed only marks it dirty, and it becomes available again at `done()`.
* Delayed adds keep the earliest ready time; an immediate add of a waiting key makes it ready now.
* Ready keys are served by priority (higher first), FIFO within a priority in the order they became
  ready; a re-add raises the priority to the max of the two and keeps the FIFO position.
* `add_rate_limited` delays a key by its rate limiter (`gpuops.kube.ratelimit`), by default client-go's
  controller limiter: the max of a jittered per-key exponential backoff, whose exponent advances only when
  the previous retry fired on schedule (spurious event-triggered runs that fail do not escalate the
  backoff), and a token bucket shared by all keys (10 qps, burst 100) that keeps a systemic failure from
  retrying every key at once; `forget` resets the key's history. A queue builds its own unless given one.
* `hold(key)` keeps a key pending but never hands it out until `release(key)` (read-your-own-writes).

Delays are served by one timer task that sleeps until the earliest ready time and is re-armed when an
earlier delay arrives; there is no polling. The queue belongs to one event loop and is not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gpuops.kube import metrics as _metrics
from gpuops.kube.ratelimit import (
    BASE_DELAY,
    JITTER,
    MAX_DELAY,
    ItemBackoff,
    ItemExponentialLimiter,
    RateLimiter,
    RunAware,
    default_controller_limiter,
    exponential_part,
)

__all__ = [
    "LOW",
    "NORMAL",
    "Clock",
    "FakeClock",
    "ItemBackoff",
    "MonotonicClock",
    "RateLimiter",
    "ShutDown",
    "WorkQueue",
]

K = TypeVar("K", bound=Hashable)

LOW = -100
"""Priority of keys from the initial list and resyncs: fresh changes go first."""
NORMAL = 0

_MAX_PRIORITY_LABELS = 25  # distinct priority label values per queue, as controller-runtime caps them


class ShutDown(Exception):
    """`get()` after `shutdown()` once nothing is ready to hand out."""


# --------------------------------------------------------------------------------------------- clocks


class Clock(Protocol):
    """Time source of a queue; `sleep_until` returns at or after `t`, never before."""

    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None: ...


class MonotonicClock:
    """The real clock: `time.monotonic`, the same clock the asyncio loop uses."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, t: float) -> None:
        # The loop may fire a timer up to its clock resolution early; sleep the rest rather than return early
        # (not polling: the second sleep, if any, is about a nanosecond).
        while (delay := t - time.monotonic()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(delay)


class FakeClock:
    """A manual clock for tests: time moves only through `advance(_to)`, which wakes due sleepers in order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, t: float) -> None:
        if t <= self._now:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (t, next(self._seq), fut))
        if len(self._sleepers) > 64 and self.sleepers * 2 < len(self._sleepers):
            self._sleepers = [s for s in self._sleepers if not s[2].done()]
            heapq.heapify(self._sleepers)
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward; sleepers due by then are resolved now and resume on the next loop iterations."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self.advance_to(self._now + seconds)

    def advance_to(self, t: float) -> None:
        """Move time forward to exactly `t` (no float rounding of a difference); earlier `t` is refused."""
        if t < self._now:
            raise ValueError("a clock cannot go backwards")
        self._now = t
        while self._sleepers and self._sleepers[0][0] <= self._now:
            fut = heapq.heappop(self._sleepers)[2]
            if not fut.done():
                fut.set_result(None)

    @property
    def next_wake(self) -> float | None:
        """The earliest time a sleeper waits for (cancelled sleeps excluded), None without sleepers."""
        live = [s[0] for s in self._sleepers if not s[2].done()]
        return min(live) if live else None

    @property
    def sleepers(self) -> int:
        """How many coroutines are sleeping on this clock (cancelled sleeps excluded)."""
        return sum(1 for s in self._sleepers if not s[2].done())


# --------------------------------------------------------------------------------------------- metrics


class _QueueMetrics:
    """The label children of one queue, and the bounded priority label of the depth gauge."""

    def __init__(self, name: str, controller: str) -> None:
        self.labels = (name, controller)
        self.adds = _metrics.WORKQUEUE_ADDS.labels(name, controller)
        self.retries = _metrics.WORKQUEUE_RETRIES.labels(name, controller)
        self.queue_duration = _metrics.WORKQUEUE_QUEUE_DURATION.labels(name, controller)
        self.work_duration = _metrics.WORKQUEUE_WORK_DURATION.labels(name, controller)
        self._priority_labels: dict[int, str] = {}

    def depth(self, priority: int, delta: int) -> None:
        label = self._priority_labels.get(priority)
        if label is None:
            full = len(self._priority_labels) >= _MAX_PRIORITY_LABELS
            label = "exceeded_cardinality_limit" if full else str(priority)
            self._priority_labels[priority] = label
        _metrics.WORKQUEUE_DEPTH.labels(*self.labels, label).inc(delta)


# --------------------------------------------------------------------------------------------- queue


@dataclass(slots=True, eq=False)
class _Item(Generic[K]):
    """A pending key: waiting (ready_at set) or ready (ready_at None; entry None while held/processing)."""

    key: K
    priority: int
    ready_at: float | None = None
    token: int = 0  # identifies the item's live entry in the delay heap
    seq: int = 0  # FIFO position, assigned when the item became ready
    since: float = 0.0  # when it became ready, for workqueue_queue_duration_seconds
    entry: tuple[int, int, K] | None = None  # its live ready-heap entry


class WorkQueue(Generic[K]):
    """An asyncio work queue of hashable keys; see the module docstring for the rules."""

    def __init__(
        self,
        name: str,
        *,
        controller: str | None = None,
        clock: Clock | None = None,
        rate_limiter: RateLimiter[K] | None = None,
        base_delay: float | None = None,
        max_delay: float | None = None,
        jitter: float | None = None,
        metrics: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        """`rate_limiter` delays `add_rate_limited`; without one the queue builds `default_controller_limiter`
        on its clock, shaped by `base_delay`, `max_delay`, `jitter` and `rng` (refused with a limiter)."""
        self.name = name
        self.controller = controller if controller is not None else name
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        if rate_limiter is None:
            rate_limiter = default_controller_limiter(
                base_delay=BASE_DELAY if base_delay is None else base_delay,
                max_delay=MAX_DELAY if max_delay is None else max_delay,
                jitter=JITTER if jitter is None else jitter,
                rng=rng,
                now=self._clock.now,
            )
        elif (base_delay, max_delay, jitter, rng) != (None, None, None, None):
            raise ValueError("base_delay, max_delay, jitter and rng shape the default limiter: not with rate_limiter")
        self.rate_limiter: RateLimiter[K] = rate_limiter
        self._run_aware = rate_limiter if isinstance(rate_limiter, RunAware) else None
        self._items: dict[K, _Item[K]] = {}
        self._n_ready = 0
        self._ready: list[tuple[int, int, K]] = []  # (-priority, seq, key); stale entries skipped lazily
        self._waiting: list[tuple[float, int, K]] = []  # (ready_at, token, key); stale entries skipped lazily
        self._processing: dict[K, tuple[float, int]] = {}  # key -> (start, priority)
        self._held: set[K] = set()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._drainers: list[asyncio.Future[None]] = []
        self._timer: asyncio.Task[None] | None = None
        self._timer_at = math.inf
        self._seq = itertools.count()
        self._tokens = itertools.count(1)
        self._shutting_down = False
        self._metrics = _QueueMetrics(name, self.controller) if metrics else None
        if metrics:
            _metrics.WORKQUEUE_INFLIGHT.track(self)

    # ----------------------------------------------------------------------------------------- adding

    def add(self, key: K, *, priority: int = NORMAL) -> None:
        """Make `key` ready now (ignored after shutdown)."""
        self._add(key, priority, 0.0)

    def add_after(self, key: K, delay: float, *, priority: int = NORMAL) -> None:
        """Make `key` ready after `delay` seconds, unless it is pending with an earlier ready time."""
        if self._shutting_down:
            return
        if delay > 0 and self._metrics is not None:
            self._metrics.retries.inc()
        self._add(key, priority, delay)

    def add_rate_limited(self, key: K, *, priority: int | None = None) -> float:
        """Retry `key` after its backoff delay, which is returned (0.0 after shutdown, nothing recorded).

        The priority defaults to the one `key` was handed out with if it is being processed, else NORMAL.
        """
        if self._shutting_down:
            return 0.0
        delay = self.rate_limiter.when(key)
        if priority is None:
            running = self._processing.get(key)
            priority = running[1] if running is not None else NORMAL
        self.add_after(key, delay, priority=priority)
        return delay

    def forget(self, key: K) -> None:
        """The key succeeded: clear its failure history (it must still be `done`)."""
        self.rate_limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self.rate_limiter.num_requeues(key)

    @property
    def backoff(self) -> ItemExponentialLimiter[K] | None:
        """The per-key exponential part of the rate limiter, for introspection (None if it has none)."""
        return exponential_part(self.rate_limiter)

    def _add(self, key: K, priority: int, delay: float) -> None:
        if self._shutting_down:
            return
        now = self._clock.now()
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = _Item(key, priority)
            if delay > 0:
                self._schedule(item, now + delay)
            else:
                self._make_ready(item, now)
            return
        if priority > item.priority:
            if item.ready_at is None:
                if self._metrics is not None:
                    self._metrics.depth(item.priority, -1)
                    self._metrics.depth(priority, 1)
                item.priority = priority
                if item.entry is not None:
                    self._push(item, wake=False)  # same seq, higher lane; the old entry goes stale
            else:
                item.priority = priority
        if item.ready_at is not None:
            if delay <= 0:
                self._make_ready(item, now)
                self._arm()  # the timer may have been sleeping for this item
            elif now + delay < item.ready_at:
                self._schedule(item, now + delay)

    def _schedule(self, item: _Item[K], ready_at: float) -> None:
        item.ready_at = ready_at
        item.token = next(self._tokens)
        heapq.heappush(self._waiting, (ready_at, item.token, item.key))
        if len(self._waiting) > 64 and len(self._waiting) > 2 * (len(self._items) - self._n_ready):
            self._waiting = [
                (i.ready_at, i.token, i.key) for i in self._items.values() if i.ready_at is not None
            ]
            heapq.heapify(self._waiting)
        self._arm()

    def _make_ready(self, item: _Item[K], since: float) -> None:
        item.ready_at = None
        item.seq = next(self._seq)
        item.since = since
        self._n_ready += 1
        if self._metrics is not None:
            self._metrics.adds.inc()
            self._metrics.depth(item.priority, 1)
        if item.key not in self._processing and item.key not in self._held:
            self._push(item)

    def _push(self, item: _Item[K], *, wake: bool = True) -> None:
        item.entry = (-item.priority, item.seq, item.key)
        heapq.heappush(self._ready, item.entry)
        if len(self._ready) > 64 and len(self._ready) > 2 * self._n_ready:
            self._ready = [i.entry for i in self._items.values() if i.entry is not None]
            heapq.heapify(self._ready)
        if wake:
            self._wake_one()

    # ----------------------------------------------------------------------------------------- delays

    def _promote_due(self) -> bool:
        """Make due delayed items ready, in ready-time order; True if the heap head changed."""
        now = self._clock.now()
        popped = False
        while self._waiting and self._waiting[0][0] <= now:
            ready_at, token, key = heapq.heappop(self._waiting)
            popped = True
            item = self._items.get(key)
            if item is not None and item.ready_at is not None and item.token == token:
                self._make_ready(item, ready_at)
        return popped

    def _arm(self) -> None:
        """Make sure one timer task sleeps until the earliest ready time (needs a running loop)."""
        if self._shutting_down:
            return
        while self._waiting:
            _, token, key = self._waiting[0]
            item = self._items.get(key)
            if item is not None and item.ready_at is not None and item.token == token:
                break
            heapq.heappop(self._waiting)
        timer = self._timer
        if not self._waiting:
            if timer is not None:
                timer.cancel()
                self._timer = None
            return
        at = self._waiting[0][0]
        if timer is not None and not timer.done():
            if self._timer_at == at:
                return
            timer.cancel()  # too late for a new earlier item, or early for one that is gone
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # armed by the next get()
            self._timer = None
            return
        self._timer_at = at
        self._timer = loop.create_task(self._wake_at(at), name=f"workqueue {self.name} timer")

    async def _wake_at(self, at: float) -> None:
        await self._clock.sleep_until(at)
        if self._timer is asyncio.current_task():
            self._timer = None
        self._promote_due()
        self._arm()

    # ----------------------------------------------------------------------------------------- serving

    async def get(self) -> K:
        """Wait for the next ready key and mark it processing; ShutDown once shut down and none is ready."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._shutting_down and self._promote_due():
                self._arm()  # the timer task has not run yet; point it at the next item
            item = self._pop_ready()
            if item is not None:
                return self._start(item)
            if self._shutting_down:
                raise ShutDown(self.name)
            self._arm()
            fut: asyncio.Future[None] = loop.create_future()
            self._getters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._wake_one()  # we were woken for an item we will not take: pass it on
                else:
                    with contextlib.suppress(ValueError):
                        self._getters.remove(fut)
                raise

    def _pop_ready(self) -> _Item[K] | None:
        while self._ready:
            entry = heapq.heappop(self._ready)
            item = self._items.get(entry[2])
            if item is not None and item.entry is entry:
                return item
        return None

    def _start(self, item: _Item[K]) -> K:
        now = self._clock.now()
        key = item.key
        item.entry = None
        del self._items[key]
        self._n_ready -= 1
        self._processing[key] = (now, item.priority)
        if self._metrics is not None:
            self._metrics.depth(item.priority, -1)
            self._metrics.queue_duration.observe(max(0.0, now - item.since))
        if self._run_aware is not None:
            self._run_aware.started(key)
        return key

    def _wake_one(self) -> None:
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def done(self, key: K) -> None:
        """The worker finished `key`; if it was re-added meanwhile it becomes available again."""
        running = self._processing.pop(key, None)
        if running is None:
            return
        if self._metrics is not None:
            self._metrics.work_duration.observe(max(0.0, self._clock.now() - running[0]))
        item = self._items.get(key)
        if item is not None and item.ready_at is None and key not in self._held:
            self._push(item)
        if not self._processing:
            for fut in self._drainers:
                if not fut.done():
                    fut.set_result(None)
            self._drainers.clear()

    # ----------------------------------------------------------------------------------------- holds

    def hold(self, key: K) -> None:
        """Keep `key` from being handed out until `release(key)`; adds still queue it. Holds do not nest."""
        self._held.add(key)
        item = self._items.get(key)
        if item is not None:
            item.entry = None  # its heap entry goes stale

    def release(self, key: K) -> None:
        if key not in self._held:
            return
        self._held.discard(key)
        item = self._items.get(key)
        if item is not None and item.ready_at is None and item.entry is None and key not in self._processing:
            self._push(item)

    # ----------------------------------------------------------------------------------------- shutdown

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def shutdown(self) -> None:
        """Stop accepting adds and drop delayed ones; `get` hands out what is ready, then raises ShutDown."""
        if self._shutting_down:
            return
        self._shutting_down = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def shutdown_with_drain(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Shut down, then wait until no key is being processed, or until `timeout` seconds (of the clock)."""
        self.shutdown()
        if not self._processing:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._drainers.append(fut)
        try:
            if timeout is None:
                await fut
            else:
                sleeper = loop.create_task(self._clock.sleep_until(self._clock.now() + timeout))
                try:
                    await asyncio.wait((fut, sleeper), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    sleeper.cancel()
        finally:
            if not fut.done():
                fut.cancel()
                self._drainers.remove(fut)

    # ----------------------------------------------------------------------------------------- introspection

    def __len__(self) -> int:
        """Keys that are due (as workqueue_depth): ready, held or dirty while processing; not delayed ones."""
        return self._n_ready

    def is_processing(self, key: K) -> bool:
        return key in self._processing

    @property
    def metric_labels(self) -> tuple[str, str]:
        return (self.name, self.controller)

    def inflight(self) -> tuple[float, float]:
        """(sum of the ages of in-flight keys, age of the oldest), for the scrape-time gauges."""
        starts = tuple(start for start, _ in tuple(self._processing.values()))
        if not starts:
            return (0.0, 0.0)
        now = self._clock.now()
        return (sum(now - s for s in starts), now - min(starts))

"""Retry rate limiters of the work queue: how long a failed key waits before it is handed out again.

A limiter answers three questions about a key, as client-go's `workqueue.TypedRateLimiter` does:
`when(key)` records a failure and returns the delay in seconds before the retry, `forget(key)` drops the
key's failure history (it succeeded, or gave up), and `num_requeues(key)` counts its failures since.

The default, `default_controller_limiter()`, is client-go's `DefaultTypedControllerRateLimiter`: the
maximum of two limiters that guard against different failures.

* `ItemExponentialLimiter`, per key: 5 ms doubling to 1000 s, with up to 10 % jitter that only shortens a
  delay. It keeps one persistently failing key from spinning, and it only escalates when a retry ran on
  schedule (a failing run that an event started early reuses the current delay), so event storms do not
  push a key into a long backoff.
* `TokenBucketLimiter`, across all keys: 10 retries a second with a burst of 100. A per-key backoff alone
  lets a systemic failure (the API server refusing writes, a webhook down) retry every key on its own
  schedule: 1,000 failing keys would all retry 5 ms later, again 10 ms later, and so on, a thundering herd
  against a component that is already failing. The bucket spaces retries out beyond the burst so that over
  any interval of `w` seconds at most `burst + qps * w` retries are scheduled, however many keys fail.

`MaxOfLimiter` combines limiters: every part records the failure and the longest delay wins, so the bucket
only adds delay once the burst is spent and the exponential part dominates once keys have failed long
enough. As in client-go, a key whose own backoff outlasts the bucket's wait keeps the token it reserved,
so a retry scheduled by the exponential part can land beside retries the bucket granted later; the bucket's
bound is exact whenever the bucket sets the delays, which is the case of a systemic failure.

Limiters read time from an injectable monotonic clock (`now`), so they can be tested without sleeping;
a queue builds its default limiter on its own clock. A limiter that also has `started(key)` (`RunAware`)
is told when the queue hands a key out, which is how the exponential part knows whether a retry ran on
schedule. Limiters belong to one event loop and are not thread-safe.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

__all__ = [
    "ItemBackoff",
    "ItemExponentialLimiter",
    "MaxOfLimiter",
    "RateLimiter",
    "RunAware",
    "TokenBucketLimiter",
    "default_controller_limiter",
    "exponential_part",
]

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)

Now = Callable[[], float]
"""A monotonic clock reading in seconds."""

BASE_DELAY = 0.005
MAX_DELAY = 1000.0
JITTER = 0.1
QPS = 10.0
BURST = 100


class RateLimiter(Protocol[K_contra]):
    """Decides how long a failed key waits before its retry."""

    def when(self, key: K_contra) -> float:
        """Record a failure of `key` and return the delay in seconds before its retry."""
        ...

    def forget(self, key: K_contra) -> None:
        """Drop the failure history of `key`."""
        ...

    def num_requeues(self, key: K_contra) -> int:
        """How many failures of `key` were recorded since it was last forgotten."""
        ...


@runtime_checkable
class RunAware(Protocol[K_contra]):
    """A limiter that is told when the queue hands a key out to a worker."""

    def started(self, key: K_contra) -> None: ...


# --------------------------------------------------------------------------------------------- per key


@dataclass(slots=True)
class _Retry:
    step: int = 0
    requeues: int = 0
    retry_at: float | None = None  # when the pending retry is due; cleared when the key is handed out
    on_schedule: bool = False  # the last hand-out happened at or after the retry's due time


class ItemBackoff(Generic[K]):
    """Per-key jittered exponential backoff: delay = min(base * 2**step, max) * (1 - jitter * U[0, 1)).

    The step advances only if the last run of the key started at or after its scheduled retry time, so a
    failure of an early run (triggered by an event inside the backoff window) reuses the current step.
    Jitter only shortens delays, so `max_delay` is a hard cap. The step stops at the first one that reaches
    the cap (19th on-schedule failure with the 5 ms / 1000 s defaults). Time is an argument here; the
    limiter below binds it to a clock.
    """

    def __init__(
        self,
        base_delay: float = BASE_DELAY,
        max_delay: float = MAX_DELAY,
        jitter: float = JITTER,
        *,
        rng: random.Random | None = None,
    ) -> None:
        if not base_delay > 0 or not max_delay >= base_delay:
            raise ValueError("need 0 < base_delay <= max_delay")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._max_step = max(0, math.ceil(math.log2(max_delay / base_delay)))
        self._state: dict[K, _Retry] = {}

    def nominal(self, step: int) -> float:
        """The delay of a step before jitter."""
        return min(self.max_delay, self.base_delay * 2.0 ** min(step, self._max_step))

    def when(self, key: K, now: float) -> float:
        """Record a failure of `key` at `now` and return the delay before its retry."""
        st = self._state.get(key)
        if st is None:
            st = self._state[key] = _Retry()
        elif st.on_schedule:
            st.step = min(st.step + 1, self._max_step)
        st.on_schedule = False
        st.requeues += 1
        delay = self.nominal(st.step)
        if self.jitter:
            delay *= 1.0 - self.jitter * self._rng.random()
        due = now + delay
        st.retry_at = due if st.retry_at is None else min(st.retry_at, due)
        return delay

    def handed_out(self, key: K, now: float) -> None:
        """Note that `key` starts a run at `now`: on schedule if a retry was due by then."""
        st = self._state.get(key)
        if st is not None:
            st.on_schedule = st.retry_at is not None and now >= st.retry_at
            st.retry_at = None

    def forget(self, key: K) -> None:
        self._state.pop(key, None)

    def num_requeues(self, key: K) -> int:
        st = self._state.get(key)
        return st.requeues if st is not None else 0

    def step(self, key: K) -> int | None:
        """The current exponent of `key`, or None without failure history."""
        st = self._state.get(key)
        return st.step if st is not None else None


class ItemExponentialLimiter(Generic[K]):
    """`ItemBackoff` on a clock: the per-key part of the default limiter (RunAware)."""

    def __init__(
        self,
        base_delay: float = BASE_DELAY,
        max_delay: float = MAX_DELAY,
        jitter: float = JITTER,
        *,
        rng: random.Random | None = None,
        now: Now = time.monotonic,
    ) -> None:
        self.backoff: ItemBackoff[K] = ItemBackoff(base_delay, max_delay, jitter, rng=rng)
        self._now = now

    def when(self, key: K) -> float:
        return self.backoff.when(key, self._now())

    def started(self, key: K) -> None:
        self.backoff.handed_out(key, self._now())

    def forget(self, key: K) -> None:
        self.backoff.forget(key)

    def num_requeues(self, key: K) -> int:
        return self.backoff.num_requeues(key)

    def step(self, key: K) -> int | None:
        """The current exponent of `key`, or None without failure history."""
        return self.backoff.step(key)


# --------------------------------------------------------------------------------------------- overall


class TokenBucketLimiter(Generic[K]):
    """A token bucket shared by all keys: `qps` tokens a second, at most `burst` saved, full at the start.

    Every `when` reserves the next token, going into debt if none is left, and returns how long until that
    token exists; it never refuses. So the retries it schedules never exceed `burst + qps * w` in any
    interval of `w` seconds, and no retry waits longer than the debt ahead of it requires. Keys are not
    tracked: `forget` does nothing and `num_requeues` is 0.
    """

    def __init__(self, qps: float = QPS, burst: int = BURST, *, now: Now = time.monotonic) -> None:
        if not (qps > 0 and math.isfinite(qps)):
            raise ValueError("qps must be positive and finite")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        self.qps = qps
        self.burst = burst
        self._now = now
        self._tokens = float(burst)  # negative while reservations are in debt
        self._last: float | None = None

    def when(self, key: K) -> float:
        self._tokens = self.tokens()
        self._last = self._now()
        self._tokens -= 1.0
        return -self._tokens / self.qps if self._tokens < 0 else 0.0

    def tokens(self) -> float:
        """The tokens available now (negative: the debt of reservations not yet due)."""
        now = self._now()
        if self._last is None or now <= self._last:
            return self._tokens
        return min(float(self.burst), self._tokens + (now - self._last) * self.qps)

    def forget(self, key: K) -> None:
        return None

    def num_requeues(self, key: K) -> int:
        return 0


# --------------------------------------------------------------------------------------------- combined


class MaxOfLimiter(Generic[K]):
    """Asks every part and returns the longest delay; forgets in all parts; counts the most requeues."""

    def __init__(self, *parts: RateLimiter[K]) -> None:
        if not parts:
            raise ValueError("MaxOfLimiter needs at least one limiter")
        self.parts: tuple[RateLimiter[K], ...] = parts
        # Checked once: isinstance against a runtime Protocol inspects its members on every call, and
        # `started` runs for every key a worker takes.
        self._run_aware: tuple[RunAware[K], ...] = tuple(p for p in parts if isinstance(p, RunAware))

    def when(self, key: K) -> float:
        delays = [p.when(key) for p in self.parts]  # every part records the failure
        return max(delays)

    def started(self, key: K) -> None:
        for p in self._run_aware:
            p.started(key)

    def forget(self, key: K) -> None:
        for p in self.parts:
            p.forget(key)

    def num_requeues(self, key: K) -> int:
        return max(p.num_requeues(key) for p in self.parts)


def default_controller_limiter(
    *,
    base_delay: float = BASE_DELAY,
    max_delay: float = MAX_DELAY,
    jitter: float = JITTER,
    qps: float = QPS,
    burst: int = BURST,
    rng: random.Random | None = None,
    now: Now = time.monotonic,
) -> MaxOfLimiter[K]:
    """max(per-key exponential 5 ms..1000 s with 10 % jitter, bucket of 10 qps and burst 100), on `now`."""
    return MaxOfLimiter(
        ItemExponentialLimiter(base_delay, max_delay, jitter, rng=rng, now=now),
        TokenBucketLimiter(qps, burst, now=now),
    )


def exponential_part(limiter: RateLimiter[K]) -> ItemExponentialLimiter[K] | None:
    """The first per-key exponential limiter in `limiter` (itself or inside max-of combinations)."""
    if isinstance(limiter, ItemExponentialLimiter):
        return limiter
    if isinstance(limiter, MaxOfLimiter):
        for p in limiter.parts:
            found = exponential_part(p)
            if found is not None:
                return found
    return None

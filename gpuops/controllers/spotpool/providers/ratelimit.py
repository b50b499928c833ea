"""Token buckets for cloud API rate limits (CVM: 10 requests/s for Run/Terminate, 40 for Describe).

Waiting here, before the call, costs nothing; a `RequestLimitExceeded` costs a round trip and a backoff.
"""

from __future__ import annotations

import time

import anyio


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up; `acquire` waits for one (FIFO under a lock)."""

    def __init__(self, rate: float, burst: int | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.rate = rate
        self.burst = burst if burst is not None else max(1, int(rate))
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")
        self._tokens = float(self.burst)
        self._stamp = time.monotonic()
        self._lock = anyio.Lock()

    def _refill(self, now: float) -> None:
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def acquire(self) -> None:
        async with self._lock:
            self._refill(time.monotonic())
            if self._tokens < 1.0:
                await anyio.sleep((1.0 - self._tokens) / self.rate)
                self._refill(time.monotonic())
            self._tokens -= 1.0

    def penalize(self, seconds: float) -> None:
        """After the cloud said slow down (`Retry-After`, throttling): spend the next `seconds` of tokens."""
        self._refill(time.monotonic())
        self._tokens = min(self._tokens, 0.0) - seconds * self.rate

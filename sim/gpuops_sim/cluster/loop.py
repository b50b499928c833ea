"""The run loop every cluster component shares: wake on a store change or on the earliest due timer.

Store listeners only record work and call `wake()`; the component's `step()` then does the writes. Timers
(a heap of monotonic deadlines per key) carry the time-driven parts: a container that starts after a
latency, a pod that finishes after its runtime, a heartbeat. One task per component keeps 100,000 pods
cheap (no task or handle per pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable

import structlog

log = structlog.get_logger("gpuops_sim.cluster")


class Loop(ABC):
    """Base of a component: `step()` runs after every wake-up; it must be safe to call at any time."""

    name = "component"

    def __init__(self) -> None:
        self._wake = asyncio.Event()
        self._timers: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self.errors = 0

    # ------------------------------------------------------------------------------------ timers

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    def wake(self) -> None:
        self._wake.set()

    def at(self, key: Hashable, when: float) -> None:
        """Make `key` due at monotonic time `when` (a key may be due several times; callers dedupe)."""
        heapq.heappush(self._timers, (when, next(self._seq), key))
        if self._timers[0][2] is key or self._timers[0][0] >= when:
            self._wake.set()

    def after(self, key: Hashable, delay: float) -> None:
        self.at(key, self.clock() + max(0.0, delay))

    def due(self, now: float | None = None) -> list[Hashable]:
        """Pop every key whose time has come, in deadline order."""
        now = self.clock() if now is None else now
        out: list[Hashable] = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            out.append(heapq.heappop(timers)[2])
        return out

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"sim-{self.name}")
            self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @abstractmethod
    async def step(self) -> None:
        """One pass over recorded work and due timers; each component defines its own."""

    async def _run(self) -> None:
        while True:
            deadline = self.next_deadline()
            if not self._wake.is_set():
                timeout = None if deadline is None else max(0.0, deadline - self.clock())
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that arrives
                # as the event is set, and stop() would then wait for ever
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
            self._wake.clear()
            try:
                await self.step()
                self.steps += 1
            except Exception:  # one bad object must not stop the cluster, as in kube-controller-manager
                self.errors += 1
                log.exception("sim component step failed", component=self.name)
            await asyncio.sleep(0)

"""Model-based test of WorkQueue: random operations against a small, obviously-correct model.

The model predicts exactly which key each blocked getter receives (highest priority, then the order in which
keys became ready), when delayed keys become ready, and every backoff delay. On top of that exact check
the machine asserts the contract's safety and liveness rules directly:

* never two workers on one key;
* no lost adds: every key is handed out after its last accepted add (checked by draining at teardown);
* a delayed key never comes out before its ready time, and comes out once the clock passes it;
* the backoff exponent advances only after a run that started at/after its scheduled retry time;
* one timer at most sleeps on the clock (no polling, no stale timers).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpuops.kube.workqueue import LOW, NORMAL, FakeClock, ShutDown, WorkQueue

KEYS = st.sampled_from(["a", "b", "c", "d"])
PRIORITIES = st.sampled_from([LOW, NORMAL, 5])
DELAYS = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 5.0])
STEPS = st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0, 20.0])
SHUT = "<shutdown>"
SETTLE = 8  # loop iterations after each operation: timer wake, getter wake, cancelled-getter hand-over
BASE, CAP, MAX_STEP = 1.0, 16.0, 4  # backoff delays 1, 2, 4, 8, 16


@dataclass
class MItem:
    priority: int
    ready_at: float | None  # None: ready
    seq: int = 0  # order of becoming ready
    tok: int = 0  # order of (re)scheduling, breaks ready_at ties
    ready_since: float = 0.0


@dataclass
class MBackoff:
    step: int = 0
    requeues: int = 0
    retry_at: float | None = None
    on_schedule: bool = False


@dataclass
class Model:
    pending: dict[str, MItem] = field(default_factory=dict)
    processing: dict[str, int] = field(default_factory=dict)  # key -> priority it was handed out with
    held: set[str] = field(default_factory=set)
    backoff: dict[str, MBackoff] = field(default_factory=dict)
    blocked: int = 0  # getters waiting
    shut: bool = False
    needs: set[str] = field(default_factory=set)  # accepted adds not yet followed by a hand-out
    seq: itertools.count[int] = field(default_factory=itertools.count)
    tok: itertools.count[int] = field(default_factory=itertools.count)

    def add(self, key: str, priority: int, delay: float, now: float) -> None:
        if self.shut:
            return
        self.needs.add(key)
        it = self.pending.get(key)
        if it is None:
            if delay > 0:
                self.pending[key] = MItem(priority, now + delay, tok=next(self.tok))
            else:
                self.pending[key] = MItem(priority, None, seq=next(self.seq), ready_since=now)
            return
        it.priority = max(it.priority, priority)
        if it.ready_at is not None:
            if delay <= 0:
                it.ready_at, it.seq, it.ready_since = None, next(self.seq), now
            elif now + delay < it.ready_at:
                it.ready_at, it.tok = now + delay, next(self.tok)

    def promote(self, now: float) -> None:
        if self.shut:
            return
        due = sorted(
            (it.ready_at, it.tok, k)
            for k, it in self.pending.items()
            if it.ready_at is not None and it.ready_at <= now
        )
        for ready_at, _, k in due:
            it = self.pending[k]
            it.ready_at, it.seq, it.ready_since = None, next(self.seq), ready_at

    def when(self, key: str, now: float) -> float:
        b = self.backoff.get(key)
        if b is None:
            b = self.backoff[key] = MBackoff()
        elif b.on_schedule:
            b.step = min(b.step + 1, MAX_STEP)
        b.on_schedule = False
        b.requeues += 1
        delay = min(CAP, BASE * 2.0**b.step)
        b.retry_at = now + delay if b.retry_at is None else min(b.retry_at, now + delay)
        return delay

    def hand_out(self, now: float) -> list[str]:
        """What the blocked getters receive now, in order."""
        out: list[str] = []
        while self.blocked:
            eligible = [
                (-it.priority, it.seq, k)
                for k, it in self.pending.items()
                if it.ready_at is None and k not in self.processing and k not in self.held
            ]
            if not eligible:
                if not self.shut:
                    break
                out.append(SHUT)
            else:
                _, _, k = min(eligible)
                it = self.pending.pop(k)
                assert it.ready_since <= now
                self.processing[k] = it.priority
                self.needs.discard(k)
                b = self.backoff.get(k)
                if b is not None:
                    b.on_schedule = b.retry_at is not None and now >= b.retry_at
                    b.retry_at = None
                out.append(k)
            self.blocked -= 1
        return out

    def ready_count(self) -> int:
        return sum(1 for it in self.pending.values() if it.ready_at is None)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.q: WorkQueue[str] = WorkQueue(
            "stateful", clock=self.clock, base_delay=BASE, max_delay=CAP, jitter=0.0, metrics=False
        )
        self.m = Model()
        self.getters: list[asyncio.Task[None]] = []
        self.handed: list[str] = []
        self.working: set[str] = set()  # keys handed out and not done, from the real queue's answers

    # ------------------------------------------------------------------ plumbing

    async def _worker(self) -> None:
        try:
            key = await self.q.get()
        except ShutDown:
            self.handed.append(SHUT)
            return
        assert key not in self.working, f"{key} handed to two workers"
        self.working.add(key)
        self.handed.append(key)

    def step(self, op: Callable[[], object], model: Callable[[], None]) -> object:
        """Run `op` inside the loop and let it settle; apply `model`; compare hand-outs and state."""
        self.handed.clear()

        async def run() -> object:
            result = op()
            for _ in range(SETTLE):
                await asyncio.sleep(0)
            return result

        result = self.loop.run_until_complete(run())
        model()
        now = self.clock.now()
        expected = self.m.hand_out(now)
        assert self.handed == expected, (self.handed, expected)
        self.getters = [t for t in self.getters if not t.done()]
        assert len(self.getters) == self.m.blocked
        return result

    # ------------------------------------------------------------------ rules

    @rule(key=KEYS, priority=PRIORITIES)
    def add(self, key: str, priority: int) -> None:
        now = self.clock.now()
        self.step(lambda: self.q.add(key, priority=priority), lambda: self.m.add(key, priority, 0.0, now))

    @rule(key=KEYS, delay=DELAYS, priority=PRIORITIES)
    def add_after(self, key: str, delay: float, priority: int) -> None:
        now = self.clock.now()
        self.step(
            lambda: self.q.add_after(key, delay, priority=priority),
            lambda: self.m.add(key, priority, delay, now),
        )

    @rule(key=KEYS)
    def add_rate_limited(self, key: str) -> None:
        now = self.clock.now()
        expected: list[float] = []

        def model() -> None:
            if self.m.shut:
                expected.append(0.0)
                return
            delay = self.m.when(key, now)
            expected.append(delay)
            self.m.add(key, self.m.processing.get(key, NORMAL), delay, now)

        got = self.step(lambda: self.q.add_rate_limited(key), model)
        assert got == expected[0]

    @rule(key=KEYS)
    def forget(self, key: str) -> None:
        def model() -> None:
            self.m.backoff.pop(key, None)

        self.step(lambda: self.q.forget(key), model)

    @precondition(lambda self: len(self.getters) < 3)
    @rule()
    def start_getter(self) -> None:
        def op() -> None:
            self.getters.append(self.loop.create_task(self._worker()))

        def model() -> None:
            self.m.blocked += 1

        self.step(op, model)

    @precondition(lambda self: bool(self.getters))
    @rule(index=st.integers(0, 2))
    def cancel_getter(self, index: int) -> None:
        victim = self.getters[index % len(self.getters)]

        def model() -> None:
            self.m.blocked -= 1

        self.step(victim.cancel, model)

    @precondition(lambda self: len(self.getters) >= 2)
    @rule(key=KEYS, index=st.integers(0, 2))
    def add_and_cancel_a_woken_getter(self, key: str, index: int) -> None:
        """The key's push wakes a getter; one getter is cancelled before it runs: the wake must not be lost."""
        victim = self.getters[index % len(self.getters)]
        now = self.clock.now()

        def op() -> None:
            self.q.add(key)
            victim.cancel()

        def model() -> None:
            self.m.blocked -= 1
            self.m.add(key, NORMAL, 0.0, now)

        self.step(op, model)

    @precondition(lambda self: bool(self.working))
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        self._done(data.draw(st.sampled_from(sorted(self.working))))

    def _done(self, key: str) -> None:
        def op() -> None:
            self.working.discard(key)
            self.q.done(key)

        def model() -> None:
            del self.m.processing[key]

        self.step(op, model)

    @rule(key=KEYS)
    def hold(self, key: str) -> None:
        self.step(lambda: self.q.hold(key), lambda: self.m.held.add(key))

    @rule(key=KEYS)
    def release(self, key: str) -> None:
        self.step(lambda: self.q.release(key), lambda: self.m.held.discard(key))

    @rule(seconds=STEPS)
    def advance(self, seconds: float) -> None:
        self.step(lambda: self.clock.advance(seconds), lambda: self.m.promote(self.clock.now()))

    @precondition(lambda self: not self.m.shut)
    @rule()
    def shutdown(self) -> None:
        self.step(self.q.shutdown, lambda: setattr(self.m, "shut", True))

    # ------------------------------------------------------------------ invariants

    @invariant()
    def state_matches(self) -> None:
        assert len(self.q) == self.m.ready_count()
        assert self.working == set(self.m.processing)
        for k in "abcd":
            b = self.m.backoff.get(k)
            assert self.q.num_requeues(k) == (b.requeues if b else 0)
            assert self.q.backoff.step(k) == (b.step if b else None)
        # blocked getters only while nothing can be handed out
        if self.m.blocked:
            assert all(
                it.ready_at is not None or k in self.m.processing or k in self.m.held
                for k, it in self.m.pending.items()
            )

    @invariant()
    def at_most_one_timer(self) -> None:
        assert self.clock.sleepers <= 1
        waiting = any(it.ready_at is not None for it in self.m.pending.values())
        if self.m.shut or not waiting:
            assert self.clock.sleepers == 0
        else:
            assert self.clock.sleepers == 1

    @invariant()
    def delayed_keys_come_out_once_due(self) -> None:
        if self.m.shut:
            return  # shutdown drops delayed keys
        now = self.clock.now()
        assert all(it.ready_at is None or it.ready_at > now for it in self.m.pending.values())

    # ------------------------------------------------------------------ liveness

    def teardown(self) -> None:
        try:
            if not self.m.shut:
                self._drain_everything()
                assert not self.m.needs, f"lost adds: {self.m.needs}"
                assert len(self.q) == 0
        finally:
            for t in self.getters:
                t.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            pending = asyncio.all_tasks(self.loop)
            for t in pending:
                t.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    def _drain_everything(self) -> None:
        for k in sorted(self.m.held):
            self.release(k)
        for _ in range(100):
            for k in sorted(self.working):
                self._done(k)
            if not self.m.pending:
                return
            self.advance(CAP + 1)
            if not self.getters:
                self.start_getter()
        raise AssertionError("queue did not drain")


TestWorkQueueModel = QueueMachine.TestCase
TestWorkQueueModel.settings = settings(max_examples=250, stateful_step_count=40, deadline=None)

"""gpuops.kube.ratelimit: properties of each limiter against independent models, the default limiter as a
state machine, a systemic failure of 1,000 keys paced by the bucket through the real queue, and a controller
that retries with the limiter it was given. Time is a FakeClock; waits are conditions with bounds."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable, Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from waiting import NotYet, until_holds

from gpuops.kube.controller import Controller, Request
from gpuops.kube.ratelimit import (
    ItemExponentialLimiter,
    MaxOfLimiter,
    RateLimiter,
    TokenBucketLimiter,
    default_controller_limiter,
    exponential_part,
)
from gpuops.kube.workqueue import FakeClock, WorkQueue

_names = itertools.count()
EPS = 1e-9  # float rounding of sums of delays; counts are integers, so the bounds stay exact


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def greedy_grants(calls: list[float], qps: float, burst: int) -> list[float]:
    """The earliest grant times a token bucket allows for calls at `calls`, in order: the k-th grant is the
    first time at or after its call when no interval ending there would hold more than burst + qps * length."""
    grants: list[float] = []
    for k, t in enumerate(calls):
        g = t
        for i in range(k):
            g = max(g, grants[i] + (k - i + 1 - burst) / qps)
        grants.append(g)
    return grants


def worst_excess(times: list[float], qps: float) -> float:
    """max over i <= j of (j - i + 1) - qps * (t_j - t_i) for sorted `times`: the most events any closed
    interval holds beyond qps * its length. A bucket's grants keep this at most its burst."""
    worst, low = -float("inf"), float("inf")
    for j, t in enumerate(times):
        low = min(low, j - qps * t)
        worst = max(worst, j - qps * t - low + 1)
    return worst


# ---------------------------------------------------------------------------------------------- exponential


@given(
    base=st.floats(1e-4, 10.0),
    cap_factor=st.floats(1.0, 1e6),
    failures=st.integers(1, 45),
    jitter=st.sampled_from([0.0, 0.1, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_exponential_doubles_to_the_cap_and_forget_resets(
    base: float, cap_factor: float, failures: int, jitter: float, seed: int
) -> None:
    clock = FakeClock()
    lim: ItemExponentialLimiter[str] = ItemExponentialLimiter(
        base, base * cap_factor, jitter, rng=random.Random(seed), now=clock.now
    )
    cap = base * cap_factor
    for n in range(failures):
        delay = lim.when("k")
        nominal = min(cap, base * 2.0**n)
        assert (1 - jitter) * nominal <= delay <= nominal <= cap
        if jitter == 0:
            assert delay == nominal
        assert lim.num_requeues("k") == n + 1
        clock.advance(delay)
        lim.started("k")  # the retry runs on schedule
    assert lim.num_requeues("other") == 0 and lim.step("other") is None
    lim.forget("k")
    assert lim.num_requeues("k") == 0 and lim.step("k") is None
    assert (1 - jitter) * base <= lim.when("k") <= base


@given(starts=st.lists(st.booleans(), min_size=1, max_size=30))
def test_exponential_escalates_only_after_on_schedule_runs(starts: list[bool]) -> None:
    """A run that an event starts before the retry is due and that fails again keeps the current delay."""
    clock = FakeClock()
    lim: ItemExponentialLimiter[str] = ItemExponentialLimiter(1.0, 2.0**40, 0.0, now=clock.now)
    step = 0
    delay = lim.when("k")
    for on_schedule in starts:
        clock.advance(delay if on_schedule else delay / 2)
        lim.started("k")
        step += on_schedule
        delay = lim.when("k")
        assert delay == 2.0**step
        assert lim.step("k") == step


def test_limiters_reject_bad_parameters() -> None:
    for qps in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            TokenBucketLimiter[str](qps, 10)
    with pytest.raises(ValueError):
        TokenBucketLimiter[str](10.0, 0)
    with pytest.raises(ValueError):
        ItemExponentialLimiter[str](0.0)
    with pytest.raises(ValueError):
        MaxOfLimiter[str]()


# ---------------------------------------------------------------------------------------------- token bucket


@given(
    qps=st.sampled_from([0.5, 1.0, 3.0, 10.0, 250.0]),
    burst=st.integers(1, 20),
    gaps=st.lists(st.one_of(st.just(0.0), st.floats(0.0, 5.0)), min_size=1, max_size=80),
)
def test_bucket_never_grants_more_than_burst_plus_qps_times_elapsed(
    qps: float, burst: int, gaps: list[float]
) -> None:
    """Over any interval [a, b] at most burst + qps * (b - a) retries are granted, and the bucket grants each
    as early as that allows (the earliest conforming schedule): it paces, it does not starve."""
    clock = FakeClock()
    bucket: TokenBucketLimiter[str] = TokenBucketLimiter(qps, burst, now=clock.now)
    calls: list[float] = []
    grants: list[float] = []
    for i, gap in enumerate(gaps):
        clock.advance(gap / qps)
        calls.append(clock.now())
        grants.append(clock.now() + bucket.when(f"k{i % 3}"))
    assert all(g >= t for g, t in zip(grants, calls, strict=True))
    assert grants == sorted(grants)
    assert worst_excess(grants, qps) <= burst + EPS
    assert grants == pytest.approx(greedy_grants(calls, qps, burst), abs=EPS * 1e3)
    assert bucket.num_requeues("k0") == 0
    bucket.forget("k0")  # keys are not tracked: nothing to reset


def test_bucket_starts_full_and_refills_to_the_burst_only() -> None:
    clock = FakeClock()
    bucket: TokenBucketLimiter[int] = TokenBucketLimiter(10.0, 3, now=clock.now)
    assert [bucket.when(i) for i in range(5)] == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2])
    clock.advance(3600)
    assert bucket.tokens() == 3
    assert [bucket.when(i) for i in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.1])


# ---------------------------------------------------------------------------------------------- max-of


class Scripted:
    """A limiter answering from a script of delays, recording every call."""

    def __init__(self, delays: list[float], requeues: int, run_aware: bool) -> None:
        self.delays = list(delays)
        self.requeues = requeues
        self.calls: list[tuple[str, Hashable]] = []
        if run_aware:
            self.started = lambda key: self.calls.append(("started", key))

    def when(self, key: Hashable) -> float:
        self.calls.append(("when", key))
        return self.delays.pop(0)

    def forget(self, key: Hashable) -> None:
        self.calls.append(("forget", key))

    def num_requeues(self, key: Hashable) -> int:
        return self.requeues


@given(
    script=st.lists(
        st.tuples(st.lists(st.floats(0.0, 1e4), min_size=3, max_size=3), st.integers(0, 50), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_max_of_is_the_max_and_every_part_hears_everything(
    script: list[tuple[list[float], int, bool]],
) -> None:
    parts = [Scripted(delays, requeues, aware) for delays, requeues, aware in script]
    lim: MaxOfLimiter[str] = MaxOfLimiter(*parts)
    for i in range(3):
        assert lim.when("k") == max(delays[i] for delays, _, _ in script)
    lim.started("k")
    lim.forget("k")
    assert lim.num_requeues("k") == max(requeues for _, requeues, _ in script)
    for part, (_, _, aware) in zip(parts, script, strict=True):
        expected = [("when", "k")] * 3 + ([("started", "k")] if aware else []) + [("forget", "k")]
        assert part.calls == expected


@settings(max_examples=60)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["when", "started", "forget", "advance"]), st.sampled_from("abc"),
                  st.floats(0.0, 2.0)),
        max_size=150,
    )
)
def test_default_limiter_is_the_max_of_exponential_and_bucket(ops: list[tuple[str, str, float]]) -> None:
    """default_controller_limiter() answers max(per-key 5 ms..1000 s, bucket 10 qps burst 100), part for
    part equal to separately driven limiters with client-go's parameters."""
    clock = FakeClock()
    default: MaxOfLimiter[str] = default_controller_limiter(jitter=0.0, now=clock.now)
    expo: ItemExponentialLimiter[str] = ItemExponentialLimiter(0.005, 1000.0, 0.0, now=clock.now)
    bucket: TokenBucketLimiter[str] = TokenBucketLimiter(10.0, 100, now=clock.now)
    for op, key, seconds in ops:
        if op == "when":
            for _ in range(int(seconds * 40)):  # bursts large enough to spend the bucket
                assert default.when(key) == max(expo.when(key), bucket.when(key))
        elif op == "started":
            default.started(key)
            expo.started(key)
        elif op == "forget":
            default.forget(key)
            expo.forget(key)
        else:
            clock.advance(seconds)
        assert default.num_requeues(key) == expo.num_requeues(key)
    assert exponential_part(default) is default.parts[0]


# ---------------------------------------------------------------------------------------------- stateful


class DefaultLimiterMachine(RuleBasedStateMachine):
    """The default limiter against a model written from client-go's rules plus the on-schedule rule: every
    delay is max(per-key exponential, the earliest time the bucket's bound allows), with runs, forgets and
    time interleaved; requeues count failures and the exponent moves only after on-schedule runs."""

    QPS, BURST, BASE, CAP = 2.0, 3, 0.5, 8.0

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.lim: MaxOfLimiter[str] = default_controller_limiter(
            base_delay=self.BASE, max_delay=self.CAP, jitter=0.0, qps=self.QPS, burst=self.BURST, now=self.clock.now
        )
        self.calls: list[float] = []  # every `when`, for the bucket model
        self.fires: dict[str, float] = {}  # key -> when its pending retry is due (exponential part)
        self.steps: dict[str, int] = {}
        self.on_schedule: dict[str, bool] = {}
        self.requeues: Counter[str] = Counter()

    @rule(key=st.sampled_from("xyz"))
    def fail(self, key: str) -> None:
        now = self.clock.now()
        if key in self.steps and self.on_schedule.pop(key, False):
            self.steps[key] = min(self.steps[key] + 1, 4)
        self.steps.setdefault(key, 0)
        self.on_schedule[key] = False
        expo = min(self.CAP, self.BASE * 2.0 ** self.steps[key])
        self.fires[key] = min(self.fires.get(key, now + expo), now + expo)
        self.calls.append(now)
        grant = greedy_grants(self.calls, self.QPS, self.BURST)[-1]
        self.requeues[key] += 1
        assert self.lim.when(key) == pytest.approx(max(expo, grant - now), abs=1e-6)

    @rule(key=st.sampled_from("xyz"))
    def start(self, key: str) -> None:
        due = self.fires.pop(key, None)
        if key in self.steps:
            self.on_schedule[key] = due is not None and self.clock.now() >= due
        self.lim.started(key)

    @rule(key=st.sampled_from("xyz"))
    def forget(self, key: str) -> None:
        for state in (self.fires, self.steps, self.on_schedule, self.requeues):
            state.pop(key, None)
        self.lim.forget(key)

    @rule(seconds=st.sampled_from([0.0, 0.1, 0.5, 1.0, 4.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def requeues_and_exponents_match(self) -> None:
        expo = exponential_part(self.lim)
        assert expo is not None
        for key in "xyz":
            assert self.lim.num_requeues(key) == self.requeues[key]
            assert expo.step(key) == self.steps.get(key)


TestDefaultLimiterModel = DefaultLimiterMachine.TestCase
TestDefaultLimiterModel.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------------------------------------- systemic failure


async def until(cond: Callable[[], bool], what: str, rounds: int = 10_000) -> None:
    """Run the loop until `cond` holds (no time passes on the fake clock meanwhile), at most `rounds` turns."""
    for _ in range(rounds):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not reached after {rounds} loop turns: {what}")


async def fail_everything(q: WorkQueue[str], clock: FakeClock, keys: int, retries: int) -> list[float]:
    """`keys` keys whose every run fails, served by one worker on the fake clock moved from one due time to
    the next; returns the times of the first `retries` retries (hand-outs after a failure)."""
    seen: set[str] = set()
    times: list[float] = []

    async def worker() -> None:
        while True:
            key = await q.get()
            if key in seen:
                times.append(clock.now())
            seen.add(key)
            q.add_rate_limited(key)
            q.done(key)

    task = asyncio.create_task(worker())
    try:
        for i in range(keys):
            q.add(f"key-{i}")
        while len(times) < retries:
            # every due key handed out and failed, and the queue's timer asleep until the next due time
            await until(lambda: len(q) == 0 and clock.next_wake is not None, "the worker catching up")
            wake = clock.next_wake
            assert wake is not None
            clock.advance_to(wake)
    finally:
        task.cancel()
        q.shutdown()
    return times[:retries]


@pytest.mark.anyio
async def test_systemic_failure_of_1000_keys_retries_within_the_buckets_rate() -> None:
    """1,000 keys failing together through the real queue with its default limiter (10 qps, burst 100).

    After the burst, retries run at the bucket's rate exactly: at most 1 + 10 * w in any window of w seconds.
    Over the whole run at most 100 + 10 * (w + 0.005): the burst's tokens are taken when the keys fail but
    its retries wait for their 5 ms per-key backoff, the max-of caveat client-go documents, so a window
    ending at the first paced retry holds 101 in under 0.1 s. Without the bucket all 1,000 retry at 5 ms.
    """
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(f"rl-test-{next(_names)}", clock=clock, rng=random.Random(5), metrics=False)
    start = time.monotonic()
    times = await fail_everything(q, clock, keys=1000, retries=3000)
    assert worst_excess(times, 10.0) <= 100 + 10.0 * 0.005 + EPS, "more retries than burst + qps * (w + 5 ms)"
    assert worst_excess(times[100:], 10.0) <= 1 + EPS, "retries after the burst outran the bucket's rate"
    assert times[-1] <= (len(times) - 100) / 10.0 + 1.0  # paced at the bucket's rate, not slower
    assert time.monotonic() - start < 10.0


# ---------------------------------------------------------------------------------------------- injection


class Recording:
    """A limiter that retries at once and records what the controller asked of it."""

    def __init__(self) -> None:
        self.failures: Counter[Request] = Counter()
        self.forgotten: list[Request] = []

    def when(self, key: Request) -> float:
        self.failures[key] += 1
        return 0.0

    def forget(self, key: Request) -> None:
        self.failures.pop(key, None)
        self.forgotten.append(key)

    def num_requeues(self, key: Request) -> int:
        return self.failures[key]


@pytest.mark.anyio
async def test_a_controller_given_its_own_limiter_retries_with_it() -> None:
    runs: Counter[Request] = Counter()
    retried_with: list[int] = []

    def controller(name: str, limiter: RateLimiter[Request] | None) -> Controller:
        async def reconcile(req: Request) -> None:
            runs[req] += 1
            if name == "own":
                retried_with.append(ctrl.queue.num_requeues(req))
            if runs[req] <= 3:
                raise RuntimeError("failing")

        ctrl = Controller(f"rl-{name}-{next(_names)}", reconcile, rate_limiter=limiter, need_leader_election=False)
        return ctrl

    mine = Recording()
    own, default = controller("own", mine), controller("default", None)
    assert own.queue.rate_limiter is mine
    assert isinstance(default.queue.rate_limiter, MaxOfLimiter)
    assert any(isinstance(p, TokenBucketLimiter) and (p.qps, p.burst) == (10.0, 100)
               for p in default.queue.rate_limiter.parts)
    tasks = [asyncio.create_task(c.run()) for c in (own, default)]
    try:
        a, b = Request("ns", "a"), Request("ns", "b")
        own.enqueue(a)
        default.enqueue(b)
        await until_holds("a and b reconciled four times, a forgotten",
                          lambda: (runs[a] == 4 and runs[b] == 4 and bool(mine.forgotten)) or NotYet(dict(runs)),
                          10.0)
        assert retried_with == [0, 1, 2, 3]  # each retry followed a failure recorded by the given limiter
        assert mine.forgotten == [a]  # the success forgot it there, and only b's queue saw b
        assert own.queue.num_requeues(a) == 0 and default.queue.num_requeues(b) == 0
    finally:
        for c in (own, default):
            c.request_stop(1.0)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)


def test_queue_refuses_default_shaping_with_a_given_limiter() -> None:
    with pytest.raises(ValueError):
        WorkQueue(f"rl-test-{next(_names)}", rate_limiter=Recording(), base_delay=1.0, metrics=False)
    q: WorkQueue[Request] = WorkQueue(f"rl-test-{next(_names)}", rate_limiter=Recording(), metrics=False)
    assert q.backoff is None  # no exponential part to introspect

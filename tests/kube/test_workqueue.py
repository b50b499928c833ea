"""Unit tests of gpuops.kube.workqueue: one test (or a few) per rule of the queue contract."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import REGISTRY

from gpuops.kube.workqueue import LOW, NORMAL, FakeClock, ItemBackoff, MonotonicClock, ShutDown, WorkQueue

pytestmark = pytest.mark.anyio

_names = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def queue(clock: FakeClock | None = None, **kwargs: object) -> WorkQueue[str]:
    """A queue with a unique metric name, a fake clock and no jitter unless told otherwise."""
    kwargs.setdefault("jitter", 0.0)
    return WorkQueue(f"wq-test-{next(_names)}", clock=clock or FakeClock(), **kwargs)  # type: ignore[arg-type]


async def settle(rounds: int = 20) -> None:
    """Let every runnable task run to its next real wait."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def getter(q: WorkQueue[str]) -> asyncio.Task[str]:
    task = asyncio.ensure_future(q.get())
    await settle()
    return task


async def drain(q: WorkQueue[str]) -> list[str]:
    """Take and finish everything ready now, in hand-out order."""
    out: list[str] = []
    while True:
        t = await getter(q)
        if not t.done():
            t.cancel()
            await settle()
            return out
        out.append(t.result())
        q.done(t.result())


def sample(metric: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(metric, labels)
    return 0.0 if value is None else value


# ------------------------------------------------------------------------------------------ dirty/processing


async def test_dedup_of_queued_keys() -> None:
    q = queue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert await drain(q) == ["a", "b"]
    assert len(q) == 0


async def test_fifo_within_a_lane() -> None:
    q = queue()
    for k in "cabd":
        q.add(k)
    assert await drain(q) == list("cabd")


async def test_add_during_processing_is_requeued_at_done_not_before() -> None:
    q = queue()
    q.add("a")
    assert await q.get() == "a"
    q.add("a")
    assert len(q) == 1  # dirty
    second = await getter(q)
    assert not second.done()  # never two workers on one key
    q.done("a")
    await settle()
    assert second.done() and second.result() == "a"
    q.done("a")
    assert await drain(q) == []


async def test_done_without_readd_does_not_requeue_and_unknown_done_is_ignored() -> None:
    q = queue()
    q.add("a")
    assert await q.get() == "a"
    q.done("a")
    q.done("a")
    q.done("never")
    assert len(q) == 0
    assert await drain(q) == []


async def test_other_keys_flow_while_one_is_processing() -> None:
    q = queue()
    q.add("a")
    q.add("b")
    assert await q.get() == "a"
    q.add("a")
    assert await q.get() == "b"
    assert q.is_processing("a") and q.is_processing("b")


async def test_each_push_wakes_one_blocked_getter() -> None:
    q = queue()
    g1, g2, g3 = await getter(q), await getter(q), await getter(q)
    q.add("a")
    q.add("b")
    await settle()
    assert [g.done() for g in (g1, g2, g3)] == [True, True, False]
    assert {g1.result(), g2.result()} == {"a", "b"}
    g3.cancel()


async def test_cancelled_woken_getter_passes_the_wakeup_on() -> None:
    q = queue()
    g1, g2 = await getter(q), await getter(q)
    q.add("a")  # wakes g1 ...
    g1.cancel()  # ... which is cancelled before it runs
    await settle()
    assert g1.cancelled()
    assert g2.done() and g2.result() == "a"


async def test_cancelled_blocked_getter_leaves_no_trace() -> None:
    q = queue()
    g = await getter(q)
    g.cancel()
    await settle()
    q.add("a")
    assert await q.get() == "a"


# ------------------------------------------------------------------------------------------ priorities


async def test_higher_priority_first_fifo_within() -> None:
    q = queue()
    q.add("low1", priority=LOW)
    q.add("n1")
    q.add("hi", priority=10)
    q.add("low2", priority=LOW)
    q.add("n2", priority=NORMAL)
    assert await drain(q) == ["hi", "n1", "n2", "low1", "low2"]


async def test_readd_keeps_max_priority_and_fifo_position() -> None:
    q = queue()
    q.add("a", priority=LOW)
    q.add("b")
    q.add("a")  # raised to NORMAL; it became ready before b
    q.add("b", priority=LOW)  # never lowered
    assert await drain(q) == ["a", "b"]


async def test_priority_raise_of_a_delayed_key() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add("x")
    q.add_after("a", 1.0, priority=LOW)
    q.add_after("a", 5.0, priority=5)  # later time ignored, higher priority kept
    clock.advance(1.0)
    await settle()
    assert await drain(q) == ["a", "x"]


async def test_retry_keeps_the_priority_of_the_run() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add("a", priority=LOW)
    assert await q.get() == "a"
    q.add_rate_limited("a")
    q.done("a")
    q.add("b", priority=-50)
    clock.advance(1.0)
    await settle()
    assert await drain(q) == ["b", "a"]


# ------------------------------------------------------------------------------------------ delays


async def test_delayed_item_is_not_ready_before_its_time_and_is_exactly_at_it() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add_after("a", 2.0)
    g = await getter(q)
    assert len(q) == 0
    clock.advance(1.999)
    await settle()
    assert not g.done()
    clock.advance(0.001)
    await settle()
    assert g.done() and g.result() == "a"


async def test_add_after_keeps_the_earliest_ready_time() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add_after("a", 10.0)
    q.add_after("a", 5.0)
    q.add_after("b", 5.0)
    q.add_after("b", 10.0)
    clock.advance(5.0)
    await settle()
    assert await drain(q) == ["a", "b"]
    clock.advance(10.0)
    await settle()
    assert await drain(q) == []  # the later duplicates were merged, not kept


async def test_add_of_a_waiting_key_makes_it_ready_now() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add_after("a", 10.0)
    q.add("a")
    assert await drain(q) == ["a"]
    clock.advance(10.0)
    await settle()
    assert await drain(q) == []


async def test_add_after_with_non_positive_delay_is_add() -> None:
    q = queue()
    q.add_after("a", 0.0)
    q.add_after("b", -1.0)
    assert await drain(q) == ["a", "b"]


async def test_add_after_on_a_ready_key_is_a_noop() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add("a")
    q.add_after("a", 5.0)
    assert await drain(q) == ["a"]
    clock.advance(5.0)
    await settle()
    assert await drain(q) == []


async def test_delayed_items_become_ready_in_time_order_then_fifo() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add_after("c", 3.0)
    q.add_after("a", 1.0)
    q.add_after("b", 2.0)
    clock.advance(5.0)
    await settle()
    assert await drain(q) == ["a", "b", "c"]


async def test_one_timer_sleeps_until_the_earliest_and_rearms_on_earlier_adds() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add_after("a", 10.0)
    q.add_after("b", 20.0)
    await settle()
    assert clock.sleepers == 1
    q.add_after("c", 1.0)  # earlier: the timer is replaced
    await settle()
    assert clock.sleepers == 1
    g = await getter(q)
    clock.advance(1.0)
    await settle()
    assert g.result() == "c"
    assert clock.sleepers == 1  # now sleeping until 10
    q.add("a")
    q.add("b")
    await drain(q)
    q.done("c")
    clock.advance(10.0)
    await settle()
    assert clock.sleepers == 0  # nothing left to wait for


async def test_no_busy_loop_while_idle() -> None:
    clock = FakeClock()
    q = queue(clock)
    calls = 0
    original = q._promote_due

    def counting() -> bool:
        nonlocal calls
        calls += 1
        return original()

    q._promote_due = counting  # type: ignore[method-assign]
    q.add_after("a", 100.0)
    getters = [await getter(q) for _ in range(3)]
    before = calls
    await settle(500)
    assert calls == before
    clock.advance(100.0)
    await settle()
    assert sum(g.done() for g in getters) == 1
    for g in getters:
        g.cancel()


async def test_delays_added_outside_a_loop_are_served_by_get() -> None:
    clock = FakeClock()
    q = queue(clock)

    async def main() -> str:
        return await q.get()

    q.add_after("a", 1.0)  # no running loop here: no timer yet
    clock.advance(0.5)

    async def run() -> str:
        task = asyncio.ensure_future(main())
        await settle()
        assert not task.done()
        clock.advance(0.5)
        await settle()
        return await task

    assert await run() == "a"


async def test_real_clock_delay() -> None:
    clock = MonotonicClock()
    q: WorkQueue[str] = WorkQueue(f"wq-test-{next(_names)}", clock=clock)
    start = clock.now()
    q.add_after("a", 0.02)
    assert await asyncio.wait_for(q.get(), 5.0) == "a"
    assert clock.now() - start >= 0.02


async def test_real_clock_sleep_until_never_returns_early() -> None:
    clock = MonotonicClock()
    target = clock.now() + 0.01
    await clock.sleep_until(target)
    assert clock.now() >= target
    await clock.sleep_until(target - 1.0)  # in the past: returns at once


def test_fake_clock_refuses_to_go_back() -> None:
    with pytest.raises(ValueError):
        FakeClock().advance(-1)


# ------------------------------------------------------------------------------------------ backoff


async def run_and_fail(q: WorkQueue[str], clock: FakeClock, key: str, wait: float = 0.0) -> float:
    """Hand `key` out exactly `wait` seconds from now (when its retry is due), fail it, finish it.

    Returns the new delay; with wait 0 the key must be ready already.
    """
    g = await getter(q)
    if wait:
        assert not g.done()
        clock.advance(wait)
        await settle()
    assert g.done() and g.result() == key
    delay = q.add_rate_limited(key)
    q.done(key)
    return delay


async def fail_repeatedly(q: WorkQueue[str], clock: FakeClock, key: str, times: int) -> list[float]:
    """Each retry fires on schedule and fails again."""
    delays: list[float] = []
    for _ in range(times):
        delays.append(await run_and_fail(q, clock, key, delays[-1] if delays else 0.0))
    return delays


async def test_backoff_doubles_on_scheduled_retries() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add("a")
    delays = await fail_repeatedly(q, clock, "a", 4)
    assert delays == pytest.approx([0.005, 0.010, 0.020, 0.040])
    assert q.num_requeues("a") == 4


async def test_early_event_triggered_failure_reuses_the_step() -> None:
    """kubernetes#132805: events inside the backoff window must not escalate the backoff."""
    clock = FakeClock()
    q = queue(clock, base_delay=1.0)
    q.add("a")
    assert await fail_repeatedly(q, clock, "a", 2) == [1.0, 2.0]  # the 2nd run was on schedule: step advances
    # Three spurious events each start an early run that fails: the step stays.
    for _ in range(3):
        clock.advance(0.1)
        q.add("a")
        assert await q.get() == "a"
        assert q.add_rate_limited("a") == 2.0
        q.done("a")
    assert q.backoff.step("a") == 1
    # The retry then fires on schedule and fails again: now it advances.
    assert await run_and_fail(q, clock, "a", 2.0) == 4.0
    assert q.num_requeues("a") == 6


async def test_event_add_during_processing_does_not_escalate() -> None:
    clock = FakeClock()
    q = queue(clock, base_delay=1.0)
    q.add("a")
    assert await run_and_fail(q, clock, "a") == 1.0
    g = await getter(q)
    clock.advance(1.0)
    await settle()
    assert g.result() == "a"  # on schedule
    q.add("a")  # an event while processing: the key is dirty
    assert q.add_rate_limited("a") == 2.0
    q.done("a")
    assert await q.get() == "a"  # early (dirty), before the 2 s retry
    assert q.add_rate_limited("a") == 2.0
    q.done("a")


async def test_repeated_rate_limited_adds_without_a_run_do_not_escalate() -> None:
    clock = FakeClock()
    q = queue(clock, base_delay=1.0)
    assert [q.add_rate_limited("a") for _ in range(5)] == [1.0] * 5


async def test_forget_resets_the_backoff() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add("a")
    await fail_repeatedly(q, clock, "a", 3)
    q.forget("a")
    assert q.num_requeues("a") == 0
    assert q.backoff.step("a") is None
    q.add("a")
    assert await run_and_fail(q, clock, "a") == pytest.approx(0.005)


async def test_backoff_cap_reached_at_the_19th_scheduled_failure() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add("a")
    delays = await fail_repeatedly(q, clock, "a", 20)
    assert delays[17] == pytest.approx(655.36)
    assert delays[18] == 1000.0
    assert delays[19] == 1000.0
    assert q.backoff.step("a") == 18


def test_backoff_jitter_only_shortens_and_respects_the_cap() -> None:
    b: ItemBackoff[str] = ItemBackoff(0.005, 1000.0, 0.1, rng=random.Random(7))
    for step in range(25):
        b.forget("k")
        st_delay = None
        for _ in range(step + 1):
            b.handed_out("k", 1e9)  # every run on schedule
            st_delay = b.when("k", 0.0)
        nominal = b.nominal(min(step, 18))
        assert st_delay is not None
        assert 0.9 * nominal <= st_delay <= nominal <= 1000.0
    delays = {ItemBackoff[str](jitter=0.5).when("k", 0.0) for _ in range(20)}
    assert len(delays) > 1  # jittered


def test_backoff_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        ItemBackoff[str](base_delay=0.0)
    with pytest.raises(ValueError):
        ItemBackoff[str](base_delay=2.0, max_delay=1.0)
    with pytest.raises(ValueError):
        ItemBackoff[str](jitter=1.0)


# ------------------------------------------------------------------------------------------ hold / release


async def test_held_key_stays_queued_but_is_not_handed_out() -> None:
    q = queue()
    q.add("a")
    q.hold("a")
    q.add("b")
    assert await drain(q) == ["b"]
    assert len(q) == 1
    g = await getter(q)
    assert not g.done()
    q.release("a")
    await settle()
    assert g.result() == "a"


async def test_hold_during_processing_blocks_the_requeue_until_release() -> None:
    q = queue()
    q.add("a")
    assert await q.get() == "a"
    q.hold("a")  # the reconciler wrote; wait for the cache
    q.add("a")  # the watch event of our own write
    q.done("a")
    assert await drain(q) == []
    q.release("a")
    assert await drain(q) == ["a"]


async def test_hold_before_add_and_release_of_unknown_keys() -> None:
    q = queue()
    q.hold("a")
    q.hold("a")  # holds do not nest
    q.add("a")
    assert await drain(q) == []
    q.release("a")
    q.release("a")
    q.release("zzz")
    assert await drain(q) == ["a"]


async def test_release_while_processing_waits_for_done() -> None:
    q = queue()
    q.add("a")
    assert await q.get() == "a"
    q.hold("a")
    q.add("a")
    q.release("a")
    assert await drain(q) == []
    q.done("a")
    assert await drain(q) == ["a"]


async def test_held_delayed_key_becomes_due_but_waits() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.hold("a")
    q.add_after("a", 1.0)
    clock.advance(1.0)
    await settle()
    assert len(q) == 1
    assert await drain(q) == []
    q.release("a")
    assert await drain(q) == ["a"]


# ------------------------------------------------------------------------------------------ shutdown


async def test_shutdown_wakes_blocked_getters_with_shutdown() -> None:
    q = queue()
    g = await getter(q)
    q.shutdown()
    await settle()
    with pytest.raises(ShutDown):
        g.result()
    with pytest.raises(ShutDown):
        await q.get()
    assert q.shutting_down


async def test_shutdown_ignores_adds_drops_delays_and_hands_out_what_is_ready() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add("a")
    q.add_after("b", 1.0)
    q.shutdown()
    q.shutdown()
    q.add("c")
    q.add_after("d", 1.0)
    assert q.add_rate_limited("e") == 0.0
    assert q.num_requeues("e") == 0
    clock.advance(2.0)
    await settle()
    assert await q.get() == "a"
    with pytest.raises(ShutDown):
        await q.get()


async def test_shutdown_with_drain_waits_for_processing() -> None:
    q = queue()
    q.add("a")
    q.add("b")
    assert await q.get() == "a"
    drainer = asyncio.ensure_future(q.shutdown_with_drain())
    await settle()
    assert not drainer.done()
    assert await q.get() == "b"  # still-ready keys are handed out while draining
    q.done("a")
    await settle()
    assert not drainer.done()
    q.done("b")
    await settle()
    assert drainer.done()
    await drainer


async def test_shutdown_with_drain_returns_at_once_when_idle() -> None:
    q = queue()
    await q.shutdown_with_drain(timeout=1.0)
    assert q.shutting_down


async def test_shutdown_with_drain_timeout_on_the_queue_clock() -> None:
    clock = FakeClock()
    q = queue(clock)
    q.add("a")
    assert await q.get() == "a"
    drainer = asyncio.ensure_future(q.shutdown_with_drain(timeout=30.0))
    await settle()
    clock.advance(29.0)
    await settle()
    assert not drainer.done()
    clock.advance(1.0)
    await settle()
    assert drainer.done()
    await drainer
    assert q.is_processing("a")
    q.done("a")  # late done is harmless


# ------------------------------------------------------------------------------------------ metrics


async def test_metrics_adds_depth_retries_durations() -> None:
    clock = FakeClock()
    q = queue(clock)
    lab = {"name": q.name, "controller": q.name}
    q.add("a")
    q.add("a")  # deduped: not counted
    q.add("b", priority=LOW)
    q.add_after("c", 2.0)
    q.add_after("c", 1.0)
    q.add_after("d", 0.0)  # zero delay: not a retry
    assert sample("workqueue_adds_total", **lab) == 3
    assert sample("workqueue_retries_total", **lab) == 2
    assert sample("workqueue_depth", **lab, priority="0") == 2
    assert sample("workqueue_depth", **lab, priority="-100") == 1
    q.add("b")  # raised to NORMAL: depth moves lanes
    assert sample("workqueue_depth", **lab, priority="0") == 3
    assert sample("workqueue_depth", **lab, priority="-100") == 0

    clock.advance(0.5)
    assert await q.get() == "a"
    assert sample("workqueue_queue_duration_seconds_count", **lab) == 1
    assert sample("workqueue_queue_duration_seconds_sum", **lab) == pytest.approx(0.5)
    assert sample("workqueue_queue_duration_seconds_bucket", **lab, le="1.0") == 1
    assert sample("workqueue_queue_duration_seconds_bucket", **lab, le="0.1") == 0
    clock.advance(0.25)
    q.done("a")
    assert sample("workqueue_work_duration_seconds_count", **lab) == 1
    assert sample("workqueue_work_duration_seconds_sum", **lab) == pytest.approx(0.25)

    clock.advance(0.25)  # t=1.0: c becomes ready
    await settle()
    assert sample("workqueue_adds_total", **lab) == 4
    assert sample("workqueue_depth", **lab, priority="0") == 3
    assert await drain(q) == ["b", "d", "c"]
    assert sample("workqueue_depth", **lab, priority="0") == 0
    # c waited from its ready time (1.0), not from its add_after call
    assert sample("workqueue_queue_duration_seconds_sum", **lab) == pytest.approx(0.5 + 1.0 + 1.0 + 0.0)


async def test_metric_buckets_are_10ns_to_1000s() -> None:
    q = queue()
    q.add("a")
    await q.get()
    lab = {"name": q.name, "controller": q.name}
    for le in ("1e-08", "1000.0", "+Inf"):
        assert REGISTRY.get_sample_value("workqueue_queue_duration_seconds_bucket", {**lab, "le": le}) == 1
    assert REGISTRY.get_sample_value("workqueue_queue_duration_seconds_bucket", {**lab, "le": "1e-09"}) is None


async def test_inflight_gauges_are_computed_on_scrape() -> None:
    clock = FakeClock()
    q = queue(clock, controller="ctl")
    lab = {"name": q.name, "controller": "ctl"}
    assert sample("workqueue_unfinished_work_seconds", **lab) == 0
    q.add("a")
    q.add("b")
    assert await q.get() == "a"
    clock.advance(3.0)
    assert await q.get() == "b"
    clock.advance(1.0)
    assert sample("workqueue_unfinished_work_seconds", **lab) == pytest.approx(4.0 + 1.0)
    assert sample("workqueue_longest_running_processor_seconds", **lab) == pytest.approx(4.0)
    q.done("a")
    assert sample("workqueue_longest_running_processor_seconds", **lab) == pytest.approx(1.0)
    q.done("b")
    assert sample("workqueue_unfinished_work_seconds", **lab) == 0
    assert sample("workqueue_longest_running_processor_seconds", **lab) == 0


async def test_priority_label_cardinality_is_capped() -> None:
    q = queue()
    lab = {"name": q.name, "controller": q.name}
    for p in range(30):
        q.add(f"k{p}", priority=p)
    assert sample("workqueue_depth", **lab, priority="24") == 1
    assert sample("workqueue_depth", **lab, priority="exceeded_cardinality_limit") == 5
    await drain(q)
    assert sample("workqueue_depth", **lab, priority="exceeded_cardinality_limit") == 0
    assert sample("workqueue_depth", **lab, priority="0") == 0


async def test_metrics_disabled() -> None:
    q = queue(metrics=False)
    q.add("a")
    await q.get()
    assert REGISTRY.get_sample_value("workqueue_adds_total", {"name": q.name, "controller": q.name}) is None
    families = {m.name for m in REGISTRY.collect()}
    assert {"workqueue_unfinished_work_seconds", "workqueue_longest_running_processor_seconds"} <= families


# ------------------------------------------------------------------------------------------ workers


async def test_concurrent_workers_never_share_a_key_and_lose_no_adds() -> None:
    """A small randomized soak on the fake clock: adds from a producer, N workers, retries, holds."""
    clock = FakeClock()
    q = queue(clock, base_delay=0.01)
    rng = random.Random(1)
    active: set[str] = set()
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}
    tick = itertools.count()

    async def worker() -> None:
        while True:
            try:
                k = await q.get()
            except ShutDown:
                return
            assert k not in active
            active.add(k)
            last_start[k] = next(tick)
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
            active.discard(k)
            if rng.random() < 0.3:
                q.add_rate_limited(k)
            else:
                q.forget(k)
            q.done(k)

    workers = [asyncio.ensure_future(worker()) for _ in range(4)]
    keys = [f"k{i}" for i in range(6)]
    for _ in range(400):
        k = rng.choice(keys)
        op = rng.random()
        if op < 0.5:
            q.add(k, priority=rng.choice([LOW, NORMAL]))
            last_add[k] = next(tick)
        elif op < 0.7:
            q.add_after(k, rng.choice([0.01, 0.05]))
            last_add[k] = next(tick)
        elif op < 0.8:
            clock.advance(0.02)
        elif op < 0.9:
            q.hold(k)
        else:
            q.release(k)
        await settle(rng.randrange(4))
    for k in keys:
        q.release(k)
    for _ in range(200):
        clock.advance(1.0)
        await settle(5)
    for k, t in last_add.items():
        assert last_start.get(k, -1) > t, k
    await q.shutdown_with_drain()
    await settle()
    assert all(w.done() for w in workers)


async def test_worker_loop_helper_shape() -> None:
    """The documented worker pattern: get, work, forget or add_rate_limited, always done."""
    q = queue()
    seen: list[str] = []

    async def reconcile(key: str) -> None:
        seen.append(key)

    async def worker(fn: Callable[[str], Awaitable[None]]) -> None:
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            try:
                await fn(key)
                q.forget(key)
            except Exception:
                q.add_rate_limited(key)
            finally:
                q.done(key)

    w = asyncio.ensure_future(worker(reconcile))
    q.add("a")
    q.add("b")
    await settle()
    await q.shutdown_with_drain()
    await settle()
    assert w.done() and seen == ["a", "b"]

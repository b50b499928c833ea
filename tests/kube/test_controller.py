"""gpuops.kube.controller: predicates, mappers, reconcile outcomes and metrics, log context, priorities of
the initial list, draining, and the read-your-own-writes gate against the emulated API server over HTTP.
Waits are conditions with deadlines; nothing sleeps and hopes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest
import structlog
from prometheus_client import REGISTRY
from waiting import until_holds

from gpuops.kube import rv as rvmod
from gpuops.kube.client import Client
from gpuops.kube.controller import (
    CacheSyncTimeout,
    Controller,
    Predicate,
    Request,
    Result,
    TerminalError,
    and_,
    annotations_changed,
    generation_changed,
    labels_changed,
    not_,
    or_,
    owner_mapper,
    predicate_funcs,
    resource_version_changed,
)
from gpuops.kube.informer import Informer
from gpuops.kube.objects import ConfigMap, ObjectMeta, OwnerReference
from gpuops.kube.resources import CONFIGMAPS, JOBS
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

NS = "default"


def sample(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric, labels) or 0.0


def cm(name: str, *, gen: int = 1, rv: str = "1", labels: dict[str, str] | None = None,
       annotations: dict[str, str] | None = None) -> ConfigMap:
    return ConfigMap(metadata=ObjectMeta(name=name, namespace=NS, generation=gen, resource_version=rv,
                                         labels=labels, annotations=annotations))


# ---------------------------------------------------------------------------------------------- pure parts


def test_predicates_on_models_and_dicts() -> None:
    a, b = cm("a", gen=1, rv="1", labels={"x": "1"}), cm("a", gen=2, rv="2", labels={"x": "1"})
    assert generation_changed().update(a, b)
    assert not generation_changed().update(a, cm("a", gen=1, rv="3"))
    assert generation_changed().create(a) and generation_changed().delete(a)
    assert resource_version_changed().update(a, b)
    assert not resource_version_changed().update(a, a)
    assert not labels_changed().update(a, b)
    assert labels_changed().update(a, cm("a", labels={"x": "2"}))
    assert labels_changed().update(cm("a"), cm("a", labels={"x": "1"}))
    assert not labels_changed().update(cm("a"), cm("a", labels={}))  # none and empty are the same
    assert annotations_changed().update(a, cm("a", annotations={"k": "v"}))
    d_old = {"metadata": {"name": "a", "generation": 1, "resourceVersion": "1", "labels": {"x": "1"}}}
    d_new = {"metadata": {"name": "a", "generation": 1, "resourceVersion": "2", "labels": {"x": "2"}}}
    assert labels_changed().update(d_old, d_new)
    assert not generation_changed().update(d_old, d_new)
    assert resource_version_changed().update(d_old, d_new)

    gen, labels = generation_changed(), labels_changed()
    assert or_(gen, labels).update(d_old, d_new) and (gen | labels).update(d_old, d_new)
    assert not and_(gen, labels).update(d_old, d_new) and not (gen & labels).update(d_old, d_new)
    assert not_(gen).update(d_old, d_new) and (~gen).update(d_old, d_new)
    assert not (~gen).create(d_old)

    only_x = predicate_funcs(lambda o: (o.metadata.labels or {}).get("x") == "1")
    assert only_x.create(a) and not only_x.create(cm("b"))
    assert only_x.update(cm("b"), a) and not only_x.update(a, cm("b"))  # the new object decides
    assert isinstance(only_x, Predicate) and only_x.delete(a)


def test_request_keys_and_owner_mapper() -> None:
    r = Request("ns", "n")
    assert r.key == str(r) == "ns/n" and Request.from_key("ns/n") == r
    assert Request("", "node-1").key == "node-1" and Request.from_key("node-1") == Request("", "node-1")
    assert Request.for_object(cm("x")) == Request(NS, "x")
    assert Request.for_object({"metadata": {"name": "x"}}) == Request("", "x")

    owned = ConfigMap(metadata=ObjectMeta(name="c", namespace=NS, owner_references=(
        OwnerReference(api_version="batch/v1", kind="Job", name="j1", uid="u1", controller=True),
        OwnerReference(api_version="batch/v1", kind="Job", name="j2", uid="u2"),
        OwnerReference(api_version="v1", kind="Pod", name="p", uid="u3", controller=True),
        OwnerReference(api_version="other.io/v1", kind="Job", name="j3", uid="u4", controller=True),
    )))
    assert list(owner_mapper(JOBS)(owned)) == [Request(NS, "j1")]
    assert list(owner_mapper(JOBS, only_controller=False)(owned)) == [Request(NS, "j1"), Request(NS, "j2")]
    as_dict = {"metadata": {"namespace": NS, "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j1", "uid": "u1", "controller": True}]}}
    assert list(owner_mapper(JOBS)(as_dict)) == [Request(NS, "j1")]


# ---------------------------------------------------------------------------------------------- outcomes


async def test_outcomes_metrics_and_backoff() -> None:
    """As controller-runtime's reconcileHandler: errors back off, terminal errors stop, requeue_after forgets,
    timeouts count."""
    name = "outcomes"
    runs: Counter[str] = Counter()

    async def reconcile(req: Request) -> Result | None:
        runs[req.name] += 1
        n = runs[req.name]
        match req.name:
            case "after":
                return Result(requeue_after=0.02) if n == 1 else None
            case "requeue":
                return Result(requeue=True) if n == 1 else None
            case "terminal":
                raise TerminalError("spec is invalid")
            case "flaky" if n <= 3:
                raise RuntimeError(f"transient failure {n}")
            case "panic" if n == 1:
                return {"present": None}["missing"]  # a bug: KeyError
            case "slow" if n == 1:
                await asyncio.sleep(30)
        return None

    ctrl = Controller(name, reconcile, max_concurrent_reconciles=3, reconcile_timeout=0.1)
    metric = "controller_runtime_reconcile_total"
    before = {r: sample(metric, controller=name, result=r) for r in ("success", "error", "requeue", "requeue_after")}
    errors0 = sample("controller_runtime_reconcile_errors_total", controller=name)
    task = asyncio.create_task(ctrl.run())
    for key in ("ok", "after", "requeue", "terminal", "flaky", "panic", "slow"):
        ctrl.enqueue(Request(NS, key))
    want = {"ok": 1, "after": 2, "requeue": 2, "terminal": 1, "flaky": 4, "panic": 2, "slow": 2}
    await until_holds(f"runs {want}, have {dict(runs)}", lambda: all(runs[k] >= v for k, v in want.items()), 10.0)
    # the terminal key had a 5 ms backoff's worth of time many times over while "flaky" retried 3 times
    assert runs["terminal"] == 1
    assert sample("controller_runtime_max_concurrent_reconciles", controller=name) == 3
    assert sample("controller_runtime_terminal_reconcile_errors_total", controller=name) >= 1
    assert sample("controller_runtime_reconcile_panics_total", controller=name) >= 1
    assert sample("controller_runtime_reconcile_timeouts_total", controller=name) >= 1
    # errors: terminal 1 + flaky 3 + panic 1 + slow (timeout) 1
    assert sample("controller_runtime_reconcile_errors_total", controller=name) - errors0 == 6
    delta = {r: sample(metric, controller=name, result=r) - v for r, v in before.items()}
    assert delta == {"success": 6, "error": 6, "requeue": 1, "requeue_after": 1}
    assert ctrl.queue.num_requeues(Request(NS, "flaky")) == 0  # forgotten after the success
    assert sample("controller_runtime_reconcile_time_seconds_count", controller=name) >= sum(want.values())
    assert sample("controller_runtime_active_workers", controller=name) == 0
    ctrl.request_stop(1.0)
    await asyncio.wait_for(task, 5)


async def test_metrics_are_initialised_and_log_context_is_bound() -> None:
    name = "log-context"
    contexts: list[dict[str, Any]] = []

    async def reconcile(req: Request) -> None:
        contexts.append(structlog.contextvars.get_contextvars())
        if len(contexts) == 1:
            raise RuntimeError("once")

    ctrl = Controller(name, reconcile)
    task = asyncio.create_task(ctrl.run())
    await until_holds("metrics initialised", lambda: REGISTRY.get_sample_value(
        "controller_runtime_reconcile_total", {"controller": name, "result": "requeue_after"}) is not None, 10.0)
    for result in ("success", "error", "requeue", "requeue_after"):
        assert REGISTRY.get_sample_value(
            "controller_runtime_reconcile_total", {"controller": name, "result": result}) == 0.0
    for metric in ("reconcile_errors", "terminal_reconcile_errors", "reconcile_panics", "reconcile_timeouts"):
        assert REGISTRY.get_sample_value(f"controller_runtime_{metric}_total", {"controller": name}) == 0.0
    assert REGISTRY.get_sample_value("gpuops_read_your_writes_timeouts_total", {"controller": name}) == 0.0

    ctrl.enqueue(Request(NS, "x"), trigger="timer")
    await until_holds("the retry", lambda: len(contexts) == 2, 10.0)
    first, second = contexts
    assert first["controller"] == second["controller"] == name
    assert first["key"] == second["key"] == f"{NS}/x"
    assert first["trigger"] == "timer" and second["trigger"] == "retry"
    assert uuid.UUID(first["reconcile_id"]).version == 4
    assert first["reconcile_id"] != second["reconcile_id"]
    assert "controller" not in structlog.contextvars.get_contextvars()  # nothing leaks out of the worker
    ctrl.request_stop(1.0)
    await asyncio.wait_for(task, 5)


async def test_stop_drains_in_flight_reconciles_and_cancel_aborts_them() -> None:
    outcomes: dict[str, str] = {}
    started: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
    finish = asyncio.Event()

    async def reconcile(req: Request) -> None:
        started[req.name].set()
        try:
            await finish.wait()
            outcomes[req.name] = "done"
        except asyncio.CancelledError:
            outcomes[req.name] = "cancelled"
            raise

    # request_stop: the in-flight reconcile finishes, however long it takes within the grace period
    drained = Controller("drain-graceful", reconcile)
    task = asyncio.create_task(drained.run())
    drained.enqueue(Request(NS, "graceful"))
    await started["graceful"].wait()
    drained.request_stop(grace=30)
    await asyncio.sleep(0)
    finish.set()
    await asyncio.wait_for(task, 5)
    assert outcomes == {"graceful": "done"}
    assert drained.queue.shutting_down
    finish.clear()

    # the grace period runs out: the reconcile is cancelled
    late = Controller("drain-late", reconcile)
    task = asyncio.create_task(late.run())
    late.enqueue(Request(NS, "late"))
    await started["late"].wait()
    t0 = time.monotonic()
    late.request_stop(grace=0.2)
    await asyncio.wait_for(task, 5)
    assert 0.15 < time.monotonic() - t0 < 2 and outcomes["late"] == "cancelled"

    # cancelling run(): no grace at all
    aborted = Controller("drain-cancel", reconcile)
    task = asyncio.create_task(aborted.run())
    aborted.enqueue(Request(NS, "cancel"))
    await started["cancel"].wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcomes["cancel"] == "cancelled"


async def test_cache_sync_timeout(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator

    async def reconcile(req: Request) -> None:
        return None

    never_started = Informer(client, CONFIGMAPS, namespace=NS)
    ctrl = Controller("sync-timeout", reconcile, cache_sync_timeout=0.2).watch(never_started)
    with pytest.raises(CacheSyncTimeout, match=r"not synced within 0\.2s"):
        await asyncio.wait_for(ctrl.run(), 5)


# ---------------------------------------------------------------------------------------------- watches


async def test_initial_list_is_queued_at_low_priority(emulator: tuple[APIServer, Client]) -> None:
    """Objects of the initial list go behind fresh changes."""
    _, client = emulator
    for i in range(10):
        await client.create(CONFIGMAPS, {"metadata": {"name": f"old-{i}"}}, NS)
    inf = Informer(client, CONFIGMAPS, namespace=NS)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        order: list[str] = []
        release_first = asyncio.Event()

        async def reconcile(req: Request) -> None:
            order.append(req.name)
            if len(order) == 1:
                await release_first.wait()

        name = "low-priority"
        ctrl = Controller(name, reconcile, max_concurrent_reconciles=1).watch(inf)
        task = asyncio.create_task(ctrl.run())
        await until_holds("the first reconcile", lambda: len(order) == 1, 10.0)
        assert order[0].startswith("old-")
        await client.create(CONFIGMAPS, {"metadata": {"name": "fresh"}}, NS)
        await until_holds("the fresh object queued at priority 0",
                          lambda: sample("workqueue_depth", name=name, controller=name, priority="0") == 1, 10.0)
        assert sample("workqueue_depth", name=name, controller=name, priority="-100") == 9
        release_first.set()
        await until_holds("everything reconciled", lambda: len(order) == 11, 10.0)
        assert order[1] == "fresh", order
        ctrl.request_stop(1.0)
        await asyncio.wait_for(task, 5)
    finally:
        await inf.stop()


async def test_mapped_watch_enqueues_other_keys_with_predicates(emulator: tuple[APIServer, Client]) -> None:
    """An event on object A enqueues key B; an update maps both the old and the new object."""
    _, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace=NS)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        seen: list[tuple[str, str]] = []

        async def reconcile(req: Request) -> None:
            seen.append((req.name, structlog.contextvars.get_contextvars()["trigger"]))

        def group_of(obj: ConfigMap) -> list[Request]:
            group = (obj.metadata.labels or {}).get("group")
            return [Request(NS, f"group-{group}")] if group else []

        ctrl = Controller("mapped", reconcile, max_concurrent_reconciles=1)
        ctrl.watch(inf, group_of, predicates=[labels_changed()])
        task = asyncio.create_task(ctrl.run())
        await client.create(CONFIGMAPS, {"metadata": {"name": "m1", "labels": {"group": "alpha"}}}, NS)
        await until_holds("the mapped add", lambda: len(seen) == 1, 10.0)
        assert seen[0] == ("group-alpha", f"add ConfigMap {NS}/m1")

        # filtered by the predicate: an annotation-only update; then a label move maps old and new
        await client.patch(CONFIGMAPS, "m1", {"metadata": {"annotations": {"a": "b"}}}, namespace=NS)
        await client.patch(CONFIGMAPS, "m1", {"metadata": {"labels": {"group": "beta"}}}, namespace=NS)
        await until_holds("both groups of the label move", lambda: len(seen) == 3, 10.0)
        assert sorted(n for n, _ in seen[1:]) == ["group-alpha", "group-beta"]
        assert all(t == f"update ConfigMap {NS}/m1" for _, t in seen[1:])

        await client.delete(CONFIGMAPS, "m1", NS)
        await until_holds("the mapped delete", lambda: len(seen) == 4, 10.0)
        assert seen[3] == ("group-beta", f"delete ConfigMap {NS}/m1")
        ctrl.request_stop(1.0)
        await asyncio.wait_for(task, 5)
    finally:
        await inf.stop()


# ---------------------------------------------------------------------------------------------- read-your-own-writes


class Counting:
    """A reconciler that increments an annotation counter read from the cache, up to `target`, and counts
    reconciles that read a resourceVersion older than the one it last wrote for that key."""

    def __init__(self, client: Client, inf: Informer[ConfigMap], target: int, requeue_after: float) -> None:
        self.client, self.inf, self.target, self.requeue_after = client, inf, target, requeue_after
        self.last_written: dict[str, str] = {}
        self.stale = 0
        self.runs: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()

    async def __call__(self, req: Request) -> Result | None:
        self.runs[req.key] += 1
        obj = self.inf.store.get(req.key)
        assert obj is not None
        rv = obj.metadata.resource_version
        written = self.last_written.get(req.key)
        if written is not None and not rvmod.is_newer_or_equal(rv, written):
            self.stale += 1
        n = int((obj.metadata.annotations or {}).get("n", "0"))
        if n >= self.target:
            return None
        out = await self.client.patch(
            CONFIGMAPS, req.name, {"metadata": {"annotations": {"n": str(n + 1)}}}, namespace=req.namespace
        )
        self.writes[req.key] += 1
        self.last_written[req.key] = out.metadata.resource_version
        return Result(requeue_after=self.requeue_after)


async def _stalled_informer_run(client: Client, gate: bool) -> tuple[Counting, Controller]:
    """A watch consumer that blocks (buffer 1) stalls the store at a known point: the controller's periodic
    requeues then find their key's cache entry older than their last write unless the gate holds them."""
    name = f"ryw-stalled-{str(gate).lower()}"
    await client.create(CONFIGMAPS, {"metadata": {"name": name, "annotations": {"n": "0"}}}, NS)
    inf = Informer(client, CONFIGMAPS, namespace=NS, field_selector=f"metadata.name={name}")
    unblock = asyncio.Event()

    async def slow_consumer(old: ConfigMap, new: ConfigMap) -> None:
        await unblock.wait()

    inf.add_handler(None, slow_consumer, None, buffer=1)
    inf.start()
    counting = Counting(client, inf, target=6, requeue_after=0.01)
    ctrl = Controller(name, counting, client=client, read_your_writes=gate, read_your_writes_timeout=30)
    ctrl.watch(inf)
    task = asyncio.create_task(ctrl.run())
    key = f"{NS}/{name}"
    try:
        if gate:
            # The third write cannot reach the stalled store: the key stays held, however often it is due.
            await until_holds("the key held behind the stalled store",
                              lambda: counting.writes[key] == 3 and ctrl.gated() == [Request(NS, name)], 10.0)
            assert counting.stale == 0
            unblock.set()
            await until_holds("the counter done", lambda: counting.writes[key] == 6 and not ctrl.gated(), 10.0)
            obj = inf.store.get(key)
            assert obj is not None and (obj.metadata.annotations or {})["n"] == "6"
        else:
            await until_holds("a stale read without the gate", lambda: counting.stale > 0, 10.0)
            unblock.set()
        return counting, ctrl
    finally:
        unblock.set()
        ctrl.request_stop(1.0)
        await asyncio.wait_for(task, 5)
        await inf.stop()


async def test_read_your_writes_gate_vs_no_gate_with_a_stalled_cache(emulator: tuple[APIServer, Client]) -> None:
    """With the gate, no reconcile ever reads its key older than its own last write; without it the
    same setup reads stale data deterministically."""
    _, client = emulator
    timeouts0 = sample("gpuops_read_your_writes_timeouts_total", controller="ryw-stalled-true")
    gated, _ = await _stalled_informer_run(client, gate=True)
    assert gated.stale == 0
    assert sample("gpuops_read_your_writes_timeouts_total", controller="ryw-stalled-true") == timeouts0
    assert sample("gpuops_read_your_writes_wait_seconds_count", controller="ryw-stalled-true") >= 1
    ungated, _ = await _stalled_informer_run(client, gate=False)
    assert ungated.stale > 0


async def test_read_your_writes_under_load(emulator: tuple[APIServer, Client]) -> None:
    """Many keys, concurrent workers, immediate requeues: never a stale read, never a lost increment."""
    _, client = emulator
    keys, target = 24, 5
    for i in range(keys):
        await client.create(CONFIGMAPS, {"metadata": {"name": f"load-{i}", "annotations": {"n": "0"}}}, NS)
    inf = Informer(client, CONFIGMAPS, namespace=NS)
    inf.start()
    name = "ryw-load"
    timeouts0 = sample("gpuops_read_your_writes_timeouts_total", controller=name)
    counting = Counting(client, inf, target=target, requeue_after=0.001)
    ctrl = Controller(name, counting, client=client, max_concurrent_reconciles=8).watch(inf)
    task = asyncio.create_task(ctrl.run())
    try:
        def done() -> bool:
            objs = inf.store.list()
            return len(objs) == keys and all((o.metadata.annotations or {}).get("n") == str(target) for o in objs)

        await until_holds("every counter at the target", done, 30)
        await until_holds("no key held", lambda: not ctrl.gated(), 10.0)
        assert counting.stale == 0
        assert set(counting.writes.values()) == {target}  # exactly one write per increment: none lost
        assert sample("gpuops_read_your_writes_timeouts_total", controller=name) == timeouts0
    finally:
        ctrl.request_stop(1.0)
        await asyncio.wait_for(task, 5)
        await inf.stop()


async def test_writes_outside_the_watch_are_not_gated(emulator: tuple[APIServer, Client]) -> None:
    """Writes to resources the controller does not watch (or from other contexts) never hold keys."""
    _, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace=NS, label_selector="watched=yes")
    inf.start()
    assert await inf.wait_synced(10)
    done = asyncio.Event()

    async def reconcile(req: Request) -> None:
        # a write the informer will never see an event for (outside its label selector)
        await client.create(CONFIGMAPS, {"metadata": {"name": f"{req.name}-side"}}, NS)
        done.set()

    ctrl = Controller("ryw-outside", reconcile, client=client, read_your_writes_recheck=0.05).watch(inf)
    task = asyncio.create_task(ctrl.run())
    try:
        ctrl.enqueue(Request(NS, "w"))
        await done.wait()
        # bookmarks (every 0.5 s) move the store past the write: the gate opens without a timeout
        await until_holds("the gate opened by bookmarks", lambda: not ctrl.gated(), 5)
        other = await client.create(CONFIGMAPS, {"metadata": {"name": "not-from-a-reconcile"}}, NS)
        assert other.metadata.resource_version and not ctrl.gated()
        assert sample("gpuops_read_your_writes_timeouts_total", controller="ryw-outside") == 0
    finally:
        ctrl.request_stop(1.0)
        await asyncio.wait_for(task, 5)
        await inf.stop()


# ---------------------------------------------------------------------------------------------- own writes


async def _own_write_runs(client: Client, name: str, skip: bool) -> int:
    """Reconciles of a key whose reconcile writes its own object once, counted once the write's event has
    been handled, the key is neither queued, running nor held, and every notification was delivered."""
    await client.create(CONFIGMAPS, {"metadata": {"name": name}}, NS)
    inf = Informer(client, CONFIGMAPS, namespace=NS, field_selector=f"metadata.name={name}")
    inf.start()
    runs = [0]
    written: list[str] = []

    async def reconcile(req: Request) -> None:
        runs[0] += 1
        obj = inf.store.get(req.key)
        if obj is not None and not (obj.metadata.annotations or {}).get("done"):
            out = await client.patch(CONFIGMAPS, req.name, {"metadata": {"annotations": {"done": "1"}}}, namespace=NS)
            written.append(out.metadata.resource_version)

    ctrl = Controller(f"own-{name}", reconcile, client=client, skip_own_write_events=skip).watch(inf)
    task = asyncio.create_task(ctrl.run())
    req = Request(NS, name)

    def settled() -> bool:
        return (bool(written) and inf.seen(req.key, written[0]) and inf.queued() == 0 and len(ctrl.queue) == 0
                and not ctrl.queue.is_processing(req) and not ctrl.gated())

    try:
        await until_holds("the write's event handled and the queue idle", settled, 10.0)
        first = runs[0]
        # Someone else's change still queues the key.
        await client.patch(CONFIGMAPS, name, {"metadata": {"labels": {"x": "y"}}}, namespace=NS)
        await until_holds("the outside change reconciled", lambda: runs[0] == first + 1 and settled(), 10.0)
        return first
    finally:
        ctrl.request_stop(1.0)
        await asyncio.wait_for(task, 5)
        await inf.stop()


async def test_own_write_events_do_not_wake_their_writer(emulator: tuple[APIServer, Client]) -> None:
    """The event a reconcile's own write comes back as queues nothing for that key (one run in all); with
    the skip turned off the same write wakes the key once more."""
    _, client = emulator
    assert await _own_write_runs(client, "own-skip", skip=True) == 1
    assert await _own_write_runs(client, "own-noskip", skip=False) == 2

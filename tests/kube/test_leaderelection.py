"""gpuops.kube.leaderelection against the emulated API server over HTTP.

Durations are shortened (lease 2 s, renew deadline 1 s, retry 0.2 s) and every wait is a condition with a
deadline. Leases are coordination.k8s.io/v1 with MicroTime timestamps (six fraction digits); updates are
PUTs guarded by resourceVersion, so races end in 409 Conflict.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY
from waiting import until_holds

from gpuops.kube import leaderelection
from gpuops.kube.client import Client
from gpuops.kube.leaderelection import LeaderElectionLost, LeaderElector
from gpuops.kube.objects import Lease
from gpuops.kube.resources import LEASES
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

LD, RD, RP = 2.0, 1.0, 0.2
NS = "default"
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
MAX_RETRY_WAIT = RP * (1 + leaderelection.JITTER_FACTOR)  # one jittered acquire interval at most


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def server() -> AsyncIterator[APIServer]:
    async with APIServer() as s:
        yield s


@pytest.fixture
async def clients(server: APIServer, tmp_path: Path) -> AsyncIterator[Callable[[], Awaitable[Client]]]:
    """A factory of independent clients (one per elector, as separate processes would have)."""
    made: list[Client] = []
    path = tmp_path / "kubeconfig"
    server.write_kubeconfig(path)

    async def make() -> Client:
        c = await Client.from_kubeconfig(str(path))
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            await c.close()


class Timeline:
    """(t, identity, leading) as each elector's body starts and ends, to prove leadership never overlaps."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, bool]] = []

    def mark(self, identity: str, leading: bool) -> None:
        self.events.append((time.monotonic(), identity, leading))

    def intervals(self) -> list[tuple[float, float, str]]:
        open_: dict[str, float] = {}
        out: list[tuple[float, float, str]] = []
        for t, who, leading in self.events:
            if leading:
                assert who not in open_, f"{who} started leading twice"
                open_[who] = t
            else:
                out.append((open_.pop(who), t, who))
        out.extend((start, float("inf"), who) for who, start in open_.items())
        return sorted(out)

    def start_of(self, identity: str) -> float:
        return next(t for t, who, leading in self.events if who == identity and leading)

    def end_of(self, identity: str) -> float:
        return next(t for t, who, leading in self.events if who == identity and not leading)

    def assert_no_overlap(self) -> None:
        spans = self.intervals()
        for (_, end, who), (start, _, other) in itertools.pairwise(spans):
            assert end <= start, f"{who} still led until {end} when {other} started at {start}"


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task[None]]]:
    running: list[asyncio.Task[None]] = []
    try:
        yield running
    finally:
        for t in running:
            t.cancel()
        if running:
            await asyncio.wait(running, timeout=10)


async def hold(elector: LeaderElector, timeline: Timeline) -> None:
    """A manager's body: lead until cancelled (or until the elector cancels us on loss)."""
    async with elector.leading():
        timeline.mark(elector.identity, True)
        try:
            await asyncio.Event().wait()
        finally:
            timeline.mark(elector.identity, False)


async def make_elector(clients: Callable[[], Awaitable[Client]], identity: str, **kw: Any) -> LeaderElector:
    params: dict[str, Any] = {"name": "gpuops-test", "lease_duration": LD, "renew_deadline": RD, "retry_period": RP}
    params.update(kw)
    return LeaderElector(await clients(), namespace=NS, identity=identity, **params)


async def lease(client: Client, name: str = "gpuops-test") -> Lease:
    return await client.get(LEASES, name, NS)


def metric(name: str, lease_name: str) -> float:
    return REGISTRY.get_sample_value(name, {"name": lease_name}) or 0.0


async def finish(task: asyncio.Task[None]) -> None:
    """Cancel an elector's task (SIGTERM for a manager) and wait for its cleanup."""
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5.0)
    assert done, "the elector did not stop"


# ---------------------------------------------------------------------------------------------- validation


async def test_validation_names_the_field(clients: Callable[[], Awaitable[Client]]) -> None:
    c = await clients()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"lease_duration": 10.0, "renew_deadline": 10.0}, "lease_duration"),
        ({"lease_duration": 5.0, "renew_deadline": 8.0}, "lease_duration"),
        ({"renew_deadline": 2.4, "retry_period": 2.0}, "renew_deadline"),  # must exceed 1.2 x 2.0
        ({"retry_period": 0.0}, "retry_period"),
        ({"name": ""}, "name"),
        ({"namespace": ""}, "namespace"),
        ({"identity": ""}, "identity"),
    ]
    for overrides, field in cases:
        kw: dict[str, Any] = {"name": "x", "namespace": NS, **overrides}
        with pytest.raises(ValueError, match=rf"^{field}:"):
            LeaderElector(c, **kw)
    ok = LeaderElector(c, name="x", namespace=NS)  # the defaults 15/10/2 are valid
    assert re.fullmatch(r".+_[0-9a-f-]{36}", ok.identity), "identity defaults to hostname_uuid"
    assert ok.request_timeout == 5.0  # max(1 s, RenewDeadline / 2)
    assert (
        LeaderElector(c, name="x", namespace=NS, lease_duration=3, renew_deadline=1.5, retry_period=1).request_timeout
        == 1.0
    )


# ---------------------------------------------------------------------------------------------- acquire / release


async def test_acquire_creates_lease_and_release_empties_it(
    clients: Callable[[], Awaitable[Client]], tasks: list[asyncio.Task[None]]
) -> None:
    """acquireTime/renewTime are MicroTime; release writes holderIdentity "" and leaseDurationSeconds 1."""
    a = await make_elector(clients, "a", name="gpuops-acquire")
    reader = await clients()
    timeline = Timeline()
    tasks.append(task := asyncio.create_task(hold(a, timeline)))
    await until_holds("a to lead", lambda: a.is_leader, 2.0)
    assert metric("leader_election_master_status", "gpuops-acquire") == 1.0

    held = await lease(reader, "gpuops-acquire")
    assert held.spec.holder_identity == "a"
    assert held.spec.lease_duration_seconds == 2
    assert held.spec.lease_transitions == 0
    assert MICRO_TIME.match(held.spec.acquire_time or ""), held.spec.acquire_time
    assert MICRO_TIME.match(held.spec.renew_time or ""), held.spec.renew_time

    # renewals advance renewTime but keep acquireTime
    first_renew = held.spec.renew_time
    await until_holds("a renewal",
                      lambda: a.leader == "a" and a._observed is not None and a._observed.renew_time != first_renew,
                      2.0)
    renewed = await lease(reader, "gpuops-acquire")
    assert renewed.spec.acquire_time == held.spec.acquire_time
    assert renewed.spec.renew_time != first_renew

    await finish(task)
    assert task.cancelled()
    assert not a.is_leader
    assert metric("leader_election_master_status", "gpuops-acquire") == 0.0
    released = await lease(reader, "gpuops-acquire")
    assert released.spec.holder_identity == ""
    assert released.spec.lease_duration_seconds == 1
    assert released.spec.lease_transitions == 0
    assert MICRO_TIME.match(released.spec.renew_time or "")


async def test_leading_is_not_reentrant(clients: Callable[[], Awaitable[Client]]) -> None:
    a = await make_elector(clients, "a", name="gpuops-reentrant")
    async with a.leading() as lost:
        assert not lost.is_set()
        with pytest.raises(RuntimeError, match="already active"):
            async with a.leading():
                pass
    assert not a.is_leader


async def test_empty_holder_is_free_at_once(clients: Callable[[], Awaitable[Client]], server: APIServer) -> None:
    """A released lease (empty holder) is taken on the first attempt, whatever its duration; transitions + 1."""
    c = await clients()
    await c.create(
        LEASES,
        {
            "metadata": {"name": "gpuops-free"},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 3600, "leaseTransitions": 5},
        },
        NS,
    )
    a = await make_elector(clients, "a", name="gpuops-free")
    start = time.monotonic()
    async with a.leading():
        assert time.monotonic() - start < 0.5
        got = await lease(c, "gpuops-free")
        assert got.spec.holder_identity == "a"
        assert got.spec.lease_transitions == 6
        assert got.spec.lease_duration_seconds == 2


async def test_remote_timestamps_are_not_trusted(clients: Callable[[], Awaitable[Client]]) -> None:
    """A lease whose renewTime is decades old is still held until *we* have seen it unchanged for its duration."""
    c = await clients()
    old = "2000-01-01T00:00:00.000000Z"
    await c.create(
        LEASES,
        {
            "metadata": {"name": "gpuops-skew"},
            "spec": {
                "holderIdentity": "ghost",
                "leaseDurationSeconds": 2,
                "acquireTime": old,
                "renewTime": old,
                "leaseTransitions": 0,
            },
        },
        NS,
    )
    a = await make_elector(clients, "a", name="gpuops-skew")
    start = time.monotonic()
    async with a.leading():
        waited = time.monotonic() - start
        got = await lease(c, "gpuops-skew")
    assert 2.0 <= waited <= 2.0 + MAX_RETRY_WAIT + 0.5, waited
    assert got.spec.holder_identity == "a" and got.spec.lease_transitions == 1
    assert got.spec.acquire_time != old


# ---------------------------------------------------------------------------------------------- failover


async def test_standby_waits_then_takes_over_quickly_after_release(
    clients: Callable[[], Awaitable[Client]], tasks: list[asyncio.Task[None]]
) -> None:
    a = await make_elector(clients, "a")
    b = await make_elector(clients, "b")
    reader = await clients()
    timeline = Timeline()
    tasks.append(ta := asyncio.create_task(hold(a, timeline)))
    await until_holds("a to lead", lambda: a.is_leader, 2.0)
    tasks.append(tb := asyncio.create_task(hold(b, timeline)))
    await until_holds("b to see a's lease", lambda: b.leader == "a", 2.0)

    # b keeps waiting for longer than the lease duration: a's renewals keep the lease alive
    with pytest.raises(AssertionError, match="timed out"):
        await until_holds("b to lead (must not happen)", lambda: b.is_leader, LD + 0.5)
    assert a.is_leader

    released_at = time.monotonic()
    await finish(ta)  # release_on_cancel: the lease is emptied
    await until_holds("b to take over", lambda: b.is_leader, 3.0)
    took_over = time.monotonic()
    assert took_over - released_at < MAX_RETRY_WAIT + 0.5, "failover after release must skip the lease wait"

    got = await lease(reader)
    assert got.spec.holder_identity == "b"
    assert got.spec.lease_transitions == 1
    await finish(tb)
    timeline.assert_no_overlap()


async def test_killed_leader_is_replaced_after_lease_duration_not_before(
    clients: Callable[[], Awaitable[Client]], tasks: list[asyncio.Task[None]]
) -> None:
    a = await make_elector(clients, "a", release_on_cancel=False)
    b = await make_elector(clients, "b")
    reader = await clients()
    timeline = Timeline()
    tasks.append(ta := asyncio.create_task(hold(a, timeline)))
    await until_holds("a to lead", lambda: a.is_leader, 2.0)
    tasks.append(asyncio.create_task(hold(b, timeline)))
    await until_holds("b to see a's lease", lambda: b.leader == "a", 2.0)

    killed_at = time.monotonic()
    await finish(ta)  # no release: the lease still names a
    assert (await lease(reader)).spec.holder_identity == "a"

    await until_holds("b to take over", lambda: b.is_leader, LD + 2.0)

    took_over = time.monotonic()
    waited = took_over - killed_at
    # a's last renewal was at most one retry period before the kill; b counts from when it saw it
    assert LD - RP - 0.1 <= waited <= LD + 2 * MAX_RETRY_WAIT + 0.5, waited
    got = await lease(reader)
    assert got.spec.holder_identity == "b" and got.spec.lease_transitions == 1
    timeline.assert_no_overlap()


async def test_renewal_failures_step_down_before_the_lease_expires_for_others(
    server: APIServer, clients: Callable[[], Awaitable[Client]], tasks: list[asyncio.Task[None]]
) -> None:
    a = await make_elector(clients, "a")
    b = await make_elector(clients, "b")
    reader = await clients()
    timeline = Timeline()
    tasks.append(ta := asyncio.create_task(hold(a, timeline)))
    await until_holds("a to lead", lambda: a.is_leader, 2.0)
    tasks.append(tb := asyncio.create_task(hold(b, timeline)))
    await until_holds("b to see a's lease", lambda: b.leader == "a", 2.0)

    server.faults.add_error(500, rate=1.0, verbs=["update"], resources=["leases"])
    fault_at = time.monotonic()
    await asyncio.wait([ta], timeout=RD + 2.0)
    assert ta.done() and isinstance(ta.exception(), LeaderElectionLost)
    stepped_down = timeline.end_of("a")
    # a's last success started before the fault, so the deadline fell within RD of it
    assert stepped_down - fault_at <= RD + 0.2, stepped_down - fault_at
    assert not a.is_leader
    assert (await lease(reader)).spec.holder_identity == "a", "the release failed too (updates fail)"

    server.faults.clear()
    await until_holds("b to take over", lambda: b.is_leader, LD + 2.0)
    # b could only take over once a's lease expired from its own observation: well after a stepped down
    assert timeline.start_of("b") - stepped_down >= (LD - RD) - 0.3
    timeline.assert_no_overlap()
    await finish(tb)


async def test_hung_renewals_cannot_hold_leadership(
    server: APIServer, clients: Callable[[], Awaitable[Client]], tasks: list[asyncio.Task[None]]
) -> None:
    """Each request is bounded by max(1 s, RD/2) and the whole renewal by the deadline."""
    a = await make_elector(clients, "a", name="gpuops-hung")
    timeline = Timeline()
    tasks.append(ta := asyncio.create_task(hold(a, timeline)))
    await until_holds("a to lead", lambda: a.is_leader, 2.0)
    server.faults.latency = 2.0
    hung_at = time.monotonic()
    await until_holds("a to step down", lambda: not a.is_leader, RD + 1.0)
    lost_at = time.monotonic()
    assert lost_at - hung_at <= RD + 0.2
    server.faults.clear()
    await asyncio.wait([ta], timeout=RD + 2.0)
    assert isinstance(ta.exception(), LeaderElectionLost)


async def test_conflicting_write_takes_the_slow_path_and_keeps_leading(
    clients: Callable[[], Awaitable[Client]], tasks: list[asyncio.Task[None]]
) -> None:
    a = await make_elector(clients, "a", name="gpuops-slow")
    other = await clients()
    timeline = Timeline()
    tasks.append(asyncio.create_task(hold(a, timeline)))
    await until_holds("a to lead", lambda: a.is_leader, 2.0)
    before = metric("leader_election_slowpath_total", "gpuops-slow")

    # someone else writes the Lease: a's cached resourceVersion is stale, its optimistic PUT gets a 409
    await other.patch(LEASES, "gpuops-slow", {"metadata": {"annotations": {"touched": "yes"}}}, namespace=NS)
    await until_holds("a slow path", lambda: metric("leader_election_slowpath_total", "gpuops-slow") > before, 2.0)
    assert a.is_leader
    got = await lease(other, "gpuops-slow")
    assert got.spec.holder_identity == "a" and got.spec.lease_transitions == 0
    assert got.metadata.annotations == {"touched": "yes"}, "the renewal kept fields it does not manage"


@pytest.mark.parametrize("group", ["asyncio", "anyio"])
async def test_loss_stops_every_controller_in_the_body(
    group: str, server: APIServer, clients: Callable[[], Awaitable[Client]]
) -> None:
    """A manager's shape: controllers in a task group inside `leading()`; loss cancels them all, then raises."""
    a = await make_elector(clients, "a", name=f"gpuops-tg-{group}")
    running: set[str] = set()
    stopped: list[str] = []

    async def controller(cname: str) -> None:
        running.add(cname)
        try:
            await asyncio.Event().wait()
        finally:
            stopped.append(cname)

    async def manager() -> None:
        async with a.leading() as lost:
            if group == "asyncio":
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(controller("pods"))
                    tg.create_task(controller("nodes"))
            else:
                async with anyio.create_task_group() as atg:
                    atg.start_soon(controller, "pods")
                    atg.start_soon(controller, "nodes")
        raise AssertionError(f"the body returned (lost={lost.is_set()})")

    task = asyncio.create_task(manager())
    await until_holds("the controllers to start", lambda: len(running) == 2, 2.0)
    server.faults.add_error(500, rate=1.0, verbs=["update"], resources=["leases"])
    with pytest.raises(LeaderElectionLost):
        await asyncio.wait_for(task, RD + 2.0)
    assert sorted(stopped) == ["nodes", "pods"]
    assert not task.cancelled(), "the loss surfaces as LeaderElectionLost, not as a cancellation"


# ---------------------------------------------------------------------------------------------- run()


async def test_run_calls_callbacks_and_raises_on_loss(
    server: APIServer, clients: Callable[[], Awaitable[Client]]
) -> None:
    a = await make_elector(clients, "a", name="gpuops-run")
    started = asyncio.Event()
    stopped: list[bool] = []

    async def on_started() -> None:
        started.set()

    task = asyncio.create_task(a.run(on_started, lambda: stopped.append(True)))
    await asyncio.wait_for(started.wait(), 2.0)
    assert a.is_leader and not stopped
    server.faults.add_error(500, rate=1.0, verbs=["update"], resources=["leases"])
    with pytest.raises(LeaderElectionLost):
        await asyncio.wait_for(task, RD + 2.0)
    assert stopped == [True]


async def test_standby_polls_a_held_lease_on_the_retry_period_and_tries_at_its_expiry(
    clients: Callable[[], Awaitable[Client]], tasks: list[asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill -9 (no release) is taken over at the lease's expiry by the standby's clock, not at its next
    jittered poll: polls of a held lease are RetryPeriod apart even with the largest jitter drawn."""
    monkeypatch.setattr(leaderelection.random, "random", lambda: 0.999)  # client-go's jitter at its longest
    a = await make_elector(clients, "a", release_on_cancel=False)
    b = await make_elector(clients, "b")
    attempts: list[tuple[float, bool, float]] = []  # (start, ok, b's expiry instant of the lease it saw)
    inner = b._attempt

    async def traced() -> bool:
        start = time.monotonic()
        ok = await inner()
        seen = b._observed
        attempts.append((start, ok, b._observed_time + ((seen.lease_duration_seconds or 0) if seen else 0)))
        return ok

    b._attempt = traced  # type: ignore[method-assign]
    timeline = Timeline()
    tasks.append(ta := asyncio.create_task(hold(a, timeline)))
    await until_holds("a to lead", lambda: a.is_leader, 2.0)
    tasks.append(asyncio.create_task(hold(b, timeline)))
    await until_holds("b to poll a's lease", lambda: len(attempts) >= 4, 3.0)
    await finish(ta)  # killed: the lease still names a
    await until_holds("b to take over", lambda: b.is_leader, LD + 2.0)

    gaps = [t1 - t0 for (t0, _, _), (t1, _, _) in itertools.pairwise(attempts)]
    assert max(gaps[:3]) < RP + 0.1, gaps  # jittered polls would be RP x 2.2 apart
    start, ok, _ = attempts[-1]
    assert ok and 0 <= start - attempts[-2][2] < 0.1, (start, attempts[-2])  # at the expiry, not on the grid
    timeline.assert_no_overlap()


async def test_standby_watches_the_lease_and_counts_its_expiry_from_the_last_renewal(
    clients: Callable[[], Awaitable[Client]], tasks: list[asyncio.Task[None]]
) -> None:
    """A standby polling every 1.5 s sees each renewal of a leader renewing every 0.2 s as it is written (the
    Lease watch), so a kill -9 is taken over one lease duration after the last renewal, not up to a poll later."""
    a = await make_elector(clients, "a", release_on_cancel=False)
    b = await make_elector(clients, "b", retry_period=1.5, renew_deadline=1.9)
    timeline = Timeline()
    tasks.append(ta := asyncio.create_task(hold(a, timeline)))
    await until_holds("a to lead", lambda: a.is_leader, 2.0)
    tasks.append(asyncio.create_task(hold(b, timeline)))
    await until_holds("b to see a's lease", lambda: b.leader == "a", 2.0)
    for _ in range(4):  # four renewals in a row, 0.2 s apart: polls 1.5 s apart could see at most one in time
        before = a._observed
        await until_holds("a to renew", lambda before=before: a._observed is not before, 1.0)
        renewed = a._observed
        await until_holds("b to see the renewal through its watch",
                          lambda renewed=renewed: b._observed == renewed, 0.15)

    await finish(ta)  # killed: no release, the lease still names a
    last_write = a._observed_time
    await until_holds("b to take over", lambda: b.is_leader, LD + 2.0)
    took_over = time.monotonic()
    assert LD - 0.1 <= took_over - last_write <= LD + 0.3, took_over - last_write
    timeline.assert_no_overlap()

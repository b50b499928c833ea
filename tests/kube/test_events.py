"""EventRecorder: client-go EventCorrelator semantics (pure, clock-injected) and the write path.

Documented numbers (client-go defaults): 100 identical events at once -> one Event, count 25 on the
server (spam filter burst 25); the suppressed 75 still count locally, so the next write after a
token refills (5 min) carries count 101. 15 events with the same reason and distinct messages ->
9 Events of their own, then one aggregate "(combined from similar events): ..." with count 6.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from waiting import until_holds

from gpuops.kube import objects
from gpuops.kube.client import Client
from gpuops.kube.errors import AlreadyExists, ApiError, BadRequest, NotFound, ServerError, TooManyRequests
from gpuops.kube.events import (
    AGGREGATE_PREFIX,
    EventCorrelator,
    EventRecorder,
    Write,
    event_name,
    make_event,
    object_reference,
)
from gpuops_sim.apiserver import APIServer

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
POD = {"kind": "Pod", "apiVersion": "v1", "namespace": "ns1", "name": "p1", "uid": "u-1"}
NODE = {"kind": "Node", "apiVersion": "v1", "name": "n1", "uid": "u-n"}


def ev(ref: Mapping[str, Any] = POD, msg: str = "m", reason: str = "Failed", type_: str = "Warning",
       component: str = "gpuops") -> dict[str, Any]:
    return make_event(component, None, ref, type_, reason, msg)


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("gpuops_events_dropped_total", {"reason": reason}) or 0.0


def recorded(type_: str, reason: str) -> float:
    return REGISTRY.get_sample_value("gpuops_events_total", {"type": type_, "reason": reason}) or 0.0


# ------------------------------------------------------------------------------------ correlator


def test_identical_events_patch_one_event_until_spam_filter() -> None:
    c = EventCorrelator()
    writes = [c.correlate(ev(), T0) for _ in range(100)]
    emitted = [w for w in writes if w is not None]
    assert len(emitted) == 25 and all(w is None for w in writes[25:])
    assert emitted[0].verb == "create" and {w.verb for w in emitted[1:]} == {"patch"}
    assert {w.name for w in emitted} == {emitted[0].name}
    assert [w.event["count"] for w in emitted] == list(range(1, 26))
    # one token refills after 5 minutes; the count includes the 75 suppressed occurrences
    assert c.correlate(ev(), T0 + 299) is None
    w = c.correlate(ev(), T0 + 600)
    assert w is not None and w.verb == "patch" and w.name == emitted[0].name
    assert w.event["count"] == 102
    assert w.patch_body() == {"count": 102, "lastTimestamp": "2027-01-15T08:10:00Z", "message": "m"}
    assert w.event["firstTimestamp"] == "2027-01-15T08:00:00Z"


def test_similar_events_aggregate_from_the_tenth_distinct_message() -> None:
    c = EventCorrelator()
    writes = [c.correlate(ev(msg=f"gpu {i} failed"), T0 + i) for i in range(15)]
    assert all(w is not None for w in writes)
    ws = [w for w in writes if w is not None]
    individual, aggregate = ws[:9], ws[9:]
    assert len({w.name for w in individual}) == 9 and {w.verb for w in individual} == {"create"}
    assert len({w.name for w in aggregate}) == 1
    assert [w.verb for w in aggregate] == ["create"] + ["patch"] * 5
    assert aggregate[-1].event["count"] == 6
    assert aggregate[-1].event["message"] == AGGREGATE_PREFIX + "gpu 14 failed"
    assert aggregate[0].event["message"] == AGGREGATE_PREFIX + "gpu 9 failed"


def test_different_reason_or_type_or_object_is_not_similar() -> None:
    c = EventCorrelator()
    for i in range(9):
        assert c.correlate(ev(msg=f"x{i}"), T0) is not None
    w = c.correlate(ev(msg="x9", reason="Other"), T0)
    assert w is not None and not w.event["message"].startswith(AGGREGATE_PREFIX)
    w = c.correlate(ev(msg="x9", type_="Normal"), T0)
    assert w is not None and not w.event["message"].startswith(AGGREGATE_PREFIX)
    w = c.correlate(ev(POD | {"name": "p2", "uid": "u-2"}, msg="x9"), T0)
    assert w is not None and not w.event["message"].startswith(AGGREGATE_PREFIX)
    w = c.correlate(ev(msg="x9"), T0)
    assert w is not None and w.event["message"] == AGGREGATE_PREFIX + "x9"


def test_window_expiry_starts_a_new_event() -> None:
    c = EventCorrelator()
    a = c.correlate(ev(), T0)
    b = c.correlate(ev(), T0 + 600)  # within 10 minutes of the last occurrence: same Event
    d = c.correlate(ev(), T0 + 1200.5)  # more than 10 minutes later: a new Event
    assert a and b and d
    assert b.name == a.name and b.event["count"] == 2
    assert d.verb == "create" and d.name != a.name and d.event["count"] == 1


def test_suppressed_first_occurrence_is_created_later_with_its_count() -> None:
    c = EventCorrelator(spam_burst=1)
    assert c.correlate(ev(msg="a"), T0) is not None  # uses the only token
    assert c.correlate(ev(msg="b"), T0) is None  # suppressed before it was ever written
    w = c.correlate(ev(msg="b"), T0 + 300)
    assert w is not None and w.verb == "create" and w.event["count"] == 2


def test_cluster_scoped_objects_report_into_default() -> None:
    w = EventCorrelator().correlate(ev(NODE), T0)
    assert w is not None and w.namespace == "default" and "namespace" not in w.event["involvedObject"]


def test_names_are_object_name_dot_16_hex_and_unique_under_a_frozen_clock() -> None:
    c = EventCorrelator()
    names = set()
    for i in range(30):
        w = c.correlate(ev(POD | {"name": "p1", "uid": f"u{i}"}), T0)
        assert w is not None
        assert re.fullmatch(r"p1\.[0-9a-f]{16}", w.name)
        names.add(w.name)
    assert len(names) == 30
    assert event_name("x" * 300, 1) == "x" * 236 + ".0000000000000001"


def test_make_event_shape() -> None:
    e = make_event("gpuops-budget", "pod-7", POD, "Normal", "Scaled", "hi", action="Scale", related=NODE)
    assert e["source"] == {"component": "gpuops-budget", "host": "pod-7"}
    assert (e["reportingComponent"], e["reportingInstance"]) == ("gpuops-budget", "pod-7")
    assert e["metadata"] == {"namespace": "ns1"} and e["involvedObject"] == POD
    assert (e["action"], e["related"]) == ("Scale", NODE)


def test_object_reference_forms() -> None:
    pod = objects.Pod(metadata=objects.ObjectMeta(name="p", namespace="ns", uid="u", resource_version="5"))
    assert object_reference(pod) == {"kind": "Pod", "apiVersion": "v1", "namespace": "ns", "name": "p", "uid": "u",
                                     "resourceVersion": "5"}
    node = objects.Node(metadata=objects.ObjectMeta(name="n"))
    assert object_reference(node) == {"kind": "Node", "apiVersion": "v1", "name": "n"}
    ref = objects.ObjectReference(kind="GPUWorkloadBudget", api_version="gpuops.io/v1alpha1", namespace="a", name="b")
    assert object_reference(ref) == {"kind": "GPUWorkloadBudget", "apiVersion": "gpuops.io/v1alpha1",
                                     "namespace": "a", "name": "b"}
    cr = {"metadata": {"name": "b", "namespace": "a"}}
    assert object_reference(cr, kind="GPUWorkloadBudget", api_version="gpuops.io/v1alpha1")["kind"] == (
        "GPUWorkloadBudget"
    )
    with pytest.raises(ValueError, match=r"^regarding: kind"):
        object_reference(cr)
    with pytest.raises(ValueError, match=r"^regarding: metadata.name"):
        object_reference({"kind": "Pod", "metadata": {}})
    with pytest.raises(ValueError, match=r"^regarding:"):
        object_reference(42)


# ------------------------------------------------------------------------------ correlator properties

objs = st.sampled_from([POD, POD | {"name": "p2", "uid": "u-2"}, NODE])
occurrence = st.tuples(
    objs,
    st.sampled_from(["Normal", "Warning"]),
    st.sampled_from(["Failed", "Scaled"]),
    st.sampled_from([f"msg {i}" for i in range(14)]),
    st.floats(min_value=0, max_value=400, allow_nan=False),  # gap to the previous occurrence
)


def _run(c: EventCorrelator, occ: list[Any]) -> tuple[list[Write], int]:
    now, out = T0, []
    for ref, type_, reason, msg, gap in occ:
        now += gap
        w = c.correlate(ev(ref, msg, reason, type_), now)
        if w is not None:
            out.append(w)
    return out, len(occ)


@settings(max_examples=150, deadline=None)
@given(st.lists(occurrence, max_size=80))
def test_writes_are_consistent(occ: list[Any]) -> None:
    writes, _ = _run(EventCorrelator(), occ)
    created: dict[str, Write] = {}
    last: dict[str, Write] = {}
    for w in writes:
        assert re.fullmatch(r"[a-z0-9-]+\.[0-9a-f]{16}", w.name)
        if w.verb == "create":
            assert w.name not in created  # a name is created once
            created[w.name] = w
        else:
            assert w.name in created  # a patch targets an Event we created
            prev = last[w.name]
            assert w.event["count"] > prev.event["count"]
            assert w.event["firstTimestamp"] == created[w.name].event["firstTimestamp"]
            assert w.event["lastTimestamp"] >= prev.event["lastTimestamp"]
        last[w.name] = w


@settings(max_examples=150, deadline=None)
@given(st.lists(occurrence, max_size=80))
def test_every_occurrence_counted_once_without_spam_filter(occ: list[Any]) -> None:
    writes, n = _run(EventCorrelator(spam_burst=10_000), occ)
    final: dict[str, int] = {}
    for w in writes:
        final[w.name] = w.event["count"]
    assert sum(final.values()) == n


@settings(max_examples=150, deadline=None)
@given(st.lists(occurrence, max_size=80), st.integers(min_value=1, max_value=10))
def test_spam_filter_bounds_writes_per_object(occ: list[Any], burst: int) -> None:
    c = EventCorrelator(spam_burst=burst, spam_interval=300.0)
    writes, _ = _run(c, occ)
    elapsed = sum(o[4] for o in occ)
    per_object: dict[str, int] = {}
    for w in writes:
        key = w.event["involvedObject"]["name"]
        per_object[key] = per_object.get(key, 0) + 1
    for count in per_object.values():
        assert count <= burst + elapsed / 300.0 + 1e-9
    final: dict[str, int] = {}
    for w in writes:
        final[w.name] = w.event["count"]
    assert sum(final.values()) <= len(occ)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([f"msg {i}" for i in range(20)]), max_size=60))
def test_new_messages_aggregate_once_nine_distinct_were_seen(msgs: list[str]) -> None:
    """client-go: the first 9 distinct messages get Events of their own, every later new message is
    aggregated (a message already tracked keeps its own Event, counted)."""
    c = EventCorrelator(spam_burst=10_000)
    seen: set[str] = set()
    for i, m in enumerate(msgs):
        w = c.correlate(ev(msg=m), T0 + i)
        assert w is not None
        aggregated = w.event["message"].startswith(AGGREGATE_PREFIX)
        if m not in seen:
            assert aggregated == (len(seen) >= 9)
        seen.add(m)


# ------------------------------------------------------------------------------------ recorder (fake sink)


class FakeClock:
    def __init__(self, t: float = T0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float) -> None:
        self.sleeps.append(t - self.t)
        self.t = max(self.t, t)
        await asyncio.sleep(0)


class FakeSink:
    """Records requests; ``fail`` is a list of exceptions raised by the next requests, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, str | None]] = []
        self.fail: list[Exception] = []
        self.hang = False

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
        accept: str = "application/json",
    ) -> bytes:
        self.calls.append((method, path, json.loads(body or b"null"), content_type))
        await asyncio.sleep(0)
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise self.fail.pop(0)
        return b"{}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sink() -> FakeSink:
    return FakeSink()


@pytest.fixture
async def rec(sink: FakeSink) -> AsyncIterator[EventRecorder]:
    r = EventRecorder(sink, "gpuops-test", clock=FakeClock(), retry_base=0.01)
    r.start()
    yield r
    await r.stop()


@pytest.mark.anyio
async def test_burst_coalesces_into_one_create(rec: EventRecorder, sink: FakeSink) -> None:
    for _ in range(100):
        rec.record(POD, "Warning", "Burst", "same")  # never awaits: the writer has not run yet
    assert await rec.flush(5)
    assert len(sink.calls) == 1
    method, path, body, ctype = sink.calls[0]
    assert (method, path, ctype) == ("POST", "/api/v1/namespaces/ns1/events", "application/json")
    assert body["count"] == 25 and body["reason"] == "Burst" and body["type"] == "Warning"
    assert body["involvedObject"] == POD and body["source"] == {"component": "gpuops-test"}


@pytest.mark.anyio
async def test_patch_is_strategic_merge_with_count(rec: EventRecorder, sink: FakeSink) -> None:
    rec.record(POD, "Normal", "Patched", "x")
    assert await rec.flush(5)
    rec.record(POD, "Normal", "Patched", "x")
    assert await rec.flush(5)
    method, path, body, ctype = sink.calls[1]
    assert method == "PATCH" and ctype == "application/strategic-merge-patch+json"
    assert path == f"/api/v1/namespaces/ns1/events/{sink.calls[0][2]['metadata']['name']}"
    assert body["count"] == 2 and set(body) == {"count", "lastTimestamp", "message"}


@pytest.mark.anyio
async def test_metrics_count_recorded_and_spam(rec: EventRecorder) -> None:
    before, spam = recorded("Normal", "Counted"), dropped("spam")
    for _ in range(30):
        rec.record(NODE | {"name": "metrics-node"}, "Normal", "Counted", "m")
    assert recorded("Normal", "Counted") - before == 30
    assert dropped("spam") - spam == 5


@pytest.mark.anyio
async def test_full_queue_drops_and_counts(sink: FakeSink) -> None:
    r = EventRecorder(sink, "gpuops-test", clock=FakeClock(), queue_size=2)
    before = dropped("queue_full")
    for i in range(5):
        r.record(POD | {"name": f"q{i}"}, "Normal", "Queued", "m")
    assert r.pending == 2 and dropped("queue_full") - before == 3
    r.start()
    await r.stop()
    assert [c[2]["involvedObject"]["name"] for c in sink.calls] == ["q0", "q1"]


@pytest.mark.anyio
async def test_server_errors_are_retried_with_backoff(rec: EventRecorder, sink: FakeSink) -> None:
    sink.fail = [ServerError(500, "InternalError", "x"), TooManyRequests(429, "TooManyRequests", "y", retry_after=3)]
    rec.record(POD, "Warning", "Retried", "m")
    assert await rec.flush(5)
    assert [c[0] for c in sink.calls] == ["POST"] * 3
    clock = rec.clock
    assert isinstance(clock, FakeClock)
    assert 0.005 <= clock.sleeps[0] <= 0.01 and clock.sleeps[1] >= 3  # jittered 2^n backoff, Retry-After honoured


@pytest.mark.anyio
async def test_retries_are_bounded_then_dropped(rec: EventRecorder, sink: FakeSink) -> None:
    before = dropped("write_failed")
    sink.fail = [ServerError(503, "ServiceUnavailable", "down")] * 14
    rec.record(POD, "Warning", "Doomed", "m")
    rec.record(POD | {"name": "other"}, "Warning", "Doomed", "m")
    assert await rec.flush(5)
    assert len(sink.calls) == 15  # 12 attempts, dropped; the next event succeeds after 2 more failures
    assert dropped("write_failed") - before == 1


@pytest.mark.anyio
async def test_client_errors_are_not_retried(rec: EventRecorder, sink: FakeSink) -> None:
    before = dropped("rejected")
    sink.fail = [BadRequest(400, "BadRequest", "no")]
    rec.record(POD, "Normal", "Bad", "m")
    assert await rec.flush(5)
    assert len(sink.calls) == 1 and dropped("rejected") - before == 1


@pytest.mark.anyio
async def test_patch_of_vanished_event_recreates_it(rec: EventRecorder, sink: FakeSink) -> None:
    rec.record(POD, "Normal", "Gone", "m")
    assert await rec.flush(5)
    sink.fail = [NotFound(404, "NotFound", "ttl")]
    rec.record(POD, "Normal", "Gone", "m")
    assert await rec.flush(5)
    assert [c[0] for c in sink.calls] == ["POST", "PATCH", "POST"]
    assert sink.calls[2][2]["count"] == 2


@pytest.mark.anyio
async def test_create_that_already_landed_becomes_a_patch(rec: EventRecorder, sink: FakeSink) -> None:
    sink.fail = [AlreadyExists(409, "AlreadyExists", "dup")]
    rec.record(POD, "Normal", "Dup", "m")
    assert await rec.flush(5)
    assert [c[0] for c in sink.calls] == ["POST", "PATCH"]


@pytest.mark.anyio
async def test_unexpected_exceptions_do_not_kill_the_writer(rec: EventRecorder, sink: FakeSink) -> None:
    sink.fail = [OSError("reset"), ApiError(0, "TransportError", "refused")]
    rec.record(POD, "Normal", "Flaky", "m")
    assert await rec.flush(5)
    assert len(sink.calls) == 3


def test_record_rejects_caller_bugs(sink: FakeSink) -> None:
    r = EventRecorder(sink, "gpuops-test")
    with pytest.raises(ValueError, match=r"^type:"):
        r.record(POD, "Error", "R", "m")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^reason:"):
        r.record(POD, "Normal", "", "m")
    with pytest.raises(ValueError, match=r"^regarding:"):
        r.record({"metadata": {"name": "x"}}, "Normal", "R", "m")


@pytest.mark.anyio
async def test_stop_drains_and_run_can_be_driven_externally(sink: FakeSink) -> None:
    r = EventRecorder(sink, "gpuops-test", clock=FakeClock())
    task = asyncio.get_running_loop().create_task(r.run())
    r.record(POD, "Normal", "External", "m")
    await r.stop(5)
    await asyncio.wait_for(task, 5)
    assert len(sink.calls) == 1


@pytest.mark.anyio
async def test_stop_gives_up_after_timeout_and_counts_abandoned(sink: FakeSink) -> None:
    sink.hang = True
    r = EventRecorder(sink, "gpuops-test", clock=FakeClock())
    r.start()
    before = dropped("shutdown")
    for i in range(3):
        r.record(POD | {"name": f"h{i}"}, "Normal", "Hang", "m")
    await until_holds("the first write sent (it hangs)", lambda: sink.calls)
    assert r.pending == 3 and len(sink.calls) == 1
    await r.stop(0.05)
    assert dropped("shutdown") - before == 3 and r.pending == 0


# ------------------------------------------------------------------------------- against the emulator


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "kubeconfig"


async def _events(client: Any, namespace: str) -> list[dict[str, Any]]:
    raw = await client.request("GET", f"/api/v1/namespaces/{namespace}/events")
    items: list[dict[str, Any]] = msgspec.json.decode(raw)["items"]
    return items


@pytest.fixture
async def emulator(kubeconfig: Path) -> AsyncIterator[tuple[APIServer, Client]]:
    async with APIServer() as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        try:
            yield s, client
        finally:
            await client.close()


def _recorder(client: Client, clock: FakeClock) -> EventRecorder:
    rec = EventRecorder(client, "gpuops-budget", instance="replica-0", clock=clock, retry_base=0.01)
    rec.start()
    return rec


@pytest.mark.anyio
async def test_emulator_identical_events_count_within_spam_limit(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    clock = FakeClock(T0)
    rec = _recorder(client, clock)
    pod = objects.Pod(metadata=objects.ObjectMeta(name="train-0", namespace="default", uid="uid-train-0"))
    # 100 identical -> one Event, count 25 (spam filter burst); a refilled token later -> count 101
    for _ in range(100):
        rec.record(pod, "Warning", "OverBudget", "budget exceeded")
    assert await rec.flush(10)
    evs = [e for e in await _events(client, "default") if e["reason"] == "OverBudget"]
    assert len(evs) == 1
    e = evs[0]
    assert e["count"] == 25 and e["type"] == "Warning" and e["message"] == "budget exceeded"
    assert e["involvedObject"] == {"kind": "Pod", "apiVersion": "v1", "namespace": "default",
                                   "name": "train-0", "uid": "uid-train-0"}
    assert e["source"] == {"component": "gpuops-budget", "host": "replica-0"}
    assert e["reportingComponent"] == "gpuops-budget" and e["reportingInstance"] == "replica-0"
    assert re.fullmatch(r"train-0\.[0-9a-f]{16}", e["metadata"]["name"])
    clock.t += 300
    rec.record(pod, "Warning", "OverBudget", "budget exceeded")
    assert await rec.flush(10)
    evs = [e for e in await _events(client, "default") if e["reason"] == "OverBudget"]
    assert len(evs) == 1 and evs[0]["count"] == 101
    assert evs[0]["lastTimestamp"] > evs[0]["firstTimestamp"] == "2027-01-15T08:00:00Z"
    await rec.stop()


@pytest.mark.anyio
async def test_emulator_similar_events_aggregate(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    rec = _recorder(client, FakeClock(T0))
    job = {"kind": "Job", "apiVersion": "batch/v1", "namespace": "default", "name": "etl", "uid": "uid-etl"}
    for i in range(15):
        rec.record(job, "Normal", "GPUAssigned", f"assigned gpu {i}")
    # cluster-scoped -> "default"; Warning and Normal side by side
    node = objects.Node(metadata=objects.ObjectMeta(name="gpu-node-1", uid="uid-node"))
    rec.record(node, "Normal", "Cordoned", "node cordoned", action="Cordon")
    rec.record(node, "Warning", "XidError", "Xid 79 on GPU 3")
    assert await rec.flush(10)
    items = await _events(client, "default")
    evs = [e for e in items if e["reason"] == "GPUAssigned"]
    assert len(evs) == 10
    agg = [e for e in evs if e["message"].startswith("(combined from similar events): ")]
    assert len(agg) == 1 and agg[0]["count"] == 6
    assert agg[0]["message"] == "(combined from similar events): assigned gpu 14"
    assert {e["type"] for e in evs} == {"Normal"}
    by_reason = {e["reason"]: e for e in items if e["involvedObject"]["kind"] == "Node"}
    assert by_reason["Cordoned"]["type"] == "Normal" and by_reason["Cordoned"]["action"] == "Cordon"
    assert by_reason["XidError"]["type"] == "Warning"
    assert "namespace" not in by_reason["XidError"]["involvedObject"]
    await rec.stop()


@pytest.mark.anyio
async def test_emulator_write_failures_retried_then_dropped(emulator: tuple[APIServer, Client]) -> None:
    s, client = emulator
    rec = _recorder(client, FakeClock(T0))
    # two 500s then success: retried; the Event lands
    s.faults.add_error(500, verbs=["create"], resources=["events"], count=2)
    rec.record(POD | {"namespace": "default"}, "Normal", "Recovered", "after faults")
    assert await rec.flush(10)
    assert s.faults.injected == 2
    assert [e["count"] for e in await _events(client, "default") if e["reason"] == "Recovered"] == [1]
    # the server keeps failing: 12 attempts, then dropped and counted; the caller never noticed
    before = dropped("write_failed")
    s.faults.add_error(500, verbs=["create"], resources=["events"])
    rec.record(NODE, "Warning", "Lost", "never written")
    assert await rec.flush(10)
    assert s.faults.injected == 2 + 12
    assert dropped("write_failed") - before == 1
    s.faults.clear()
    assert not [e for e in await _events(client, "default") if e["reason"] == "Lost"]
    await rec.stop()

"""Informers against the emulated API server over real HTTP: sync (streaming and paginated), handlers,
indexes, the shared factory, read-your-own-writes, backpressure, metrics, and the reflector's pure parts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from waiting import until_holds

from gpuops.kube import errors, objects
from gpuops.kube.client import Client
from gpuops.kube.informer import (
    INDEX_NAMESPACE,
    INDEX_NODE,
    Informer,
    InformerFactory,
    Store,
    by_label,
    by_namespace,
    pods_by_node,
)
from gpuops.kube.reflector import Backoff, ReflectorOptions, _frame_error, _Tally
from gpuops.kube.resources import CONFIGMAPS, PODS, ResourceType
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

FAST = ReflectorOptions(backoff_initial=0.02, backoff_cap=0.2)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "kubeconfig"


@pytest.fixture
async def emulator(kubeconfig: Path) -> AsyncIterator[tuple[APIServer, Client]]:
    # These tests count the ConfigMaps of a namespace: no kube-root-ca.crt publisher.
    async with APIServer(bookmark_interval=0.2, root_ca_publisher=False) as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        try:
            yield s, client
        finally:
            await client.close()


def server_rvs(s: APIServer, plural: str, namespace: str) -> dict[str, str]:
    return {f"{namespace}/{st.obj['metadata']['name']}": str(st.rv) for st in s.store.iter(("", plural), namespace)}


def store_rvs(inf: Informer[Any]) -> dict[str, str]:
    return {k: inf.store.resource_version(k) or "" for k in inf.store.keys()}  # noqa: SIM118


def cm(name: str, ns: str = "default", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "data": {"v": "0"}}


def pod(name: str, node: str = "", ns: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def sample(name: str, labels: Mapping[str, str]) -> float:
    return REGISTRY.get_sample_value(name, dict(labels)) or 0.0


class Recorder:
    """A handler that mirrors what it was told, and checks the order of what it was told."""

    def __init__(self) -> None:
        self.live: dict[str, str] = {}
        self.log: list[tuple[str, str, bool | None]] = []
        self.deleted: list[str] = []

    def on_add(self, obj: Any, initial: bool) -> None:
        key = CONFIGMAPS.key(obj)
        assert key not in self.live, f"add of a key already live: {key}"
        self.live[key] = obj.metadata.resource_version
        self.log.append(("add", key, initial))

    def on_update(self, old: Any, new: Any) -> None:
        key = CONFIGMAPS.key(new)
        assert self.live.get(key) == old.metadata.resource_version, f"update with a stale old: {key}"
        assert int(new.metadata.resource_version) > int(old.metadata.resource_version)
        self.live[key] = new.metadata.resource_version
        self.log.append(("update", key, None))

    def on_delete(self, obj: Any) -> None:
        key = CONFIGMAPS.key(obj)
        assert key in self.live, f"delete of an unknown key: {key}"
        del self.live[key]
        self.deleted.append(key)
        self.log.append(("delete", key, None))


def register(inf: Informer[Any], rec: Recorder, buffer: int = 10_000) -> Any:
    return inf.add_handler(rec.on_add, rec.on_update, rec.on_delete, buffer=buffer)


# ------------------------------------------------------------------------------------------------ sync


@pytest.mark.parametrize("mode", ["auto", "paginated"])
async def test_initial_sync_matches_server_and_handlers_see_initial_adds(
    emulator: tuple[APIServer, Client], mode: Literal["auto", "paginated"]
) -> None:
    s, client = emulator
    for i in range(30):
        await client.create(CONFIGMAPS, cm(f"c{i:02d}"))
    inf = Informer(client, CONFIGMAPS, namespace="default", options=ReflectorOptions(initial_list=mode, page_size=7))
    rec = Recorder()
    handler = register(inf, rec)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        assert store_rvs(inf) == server_rvs(s, "configmaps", "default")
        assert inf.store.last_resource_version == str(s.store.rv)
        assert inf.reflector.streaming is (mode == "auto")
        assert (inf.reflector.streaming_lists, inf.reflector.paginated_lists) == ((1, 0) if mode == "auto" else (0, 1))
        await until_holds("handler synced", handler.synced, 10.0)
        assert rec.live == store_rvs(inf)
        assert all(initial for kind, _, initial in rec.log if kind == "add")
        # live changes after the sync: not initial
        await client.create(CONFIGMAPS, cm("late"))
        await until_holds("late add", lambda: "default/late" in rec.live, 10.0)
        assert rec.log[-1] == ("add", "default/late", False)
        # one paginated list of 31 items in pages of 7 = 5 requests; streaming needs no list at all
        labels = {"name": inf.name, "group": "", "version": "v1", "resource": "configmaps", "reason": "initial"}
        assert sample("gpuops_informer_relists_total", labels) >= 1
    finally:
        await inf.stop()


async def test_add_update_delete_reach_handlers_in_order(emulator: tuple[APIServer, Client]) -> None:
    s, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace="default", options=FAST)
    rec = Recorder()
    register(inf, rec)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        created = await client.create(CONFIGMAPS, cm("x"))
        updated = await client.patch(CONFIGMAPS, "x", {"data": {"v": "1"}}, namespace="default")
        await client.delete(CONFIGMAPS, "x", "default")
        await until_holds("delete", lambda: rec.deleted == ["default/x"], 10.0)
        assert [e[:2] for e in rec.log if e[1] == "default/x"] == [
            ("add", "default/x"),
            ("update", "default/x"),
            ("delete", "default/x"),
        ]
        assert created.metadata.resource_version < updated.metadata.resource_version
        assert inf.store.get("default/x") is None
        assert store_rvs(inf) == server_rvs(s, "configmaps", "default")
    finally:
        await inf.stop()


async def test_label_selector_transitions_are_adds_and_deletes(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace="default", label_selector="team=a", options=FAST)
    rec = Recorder()
    register(inf, rec)
    inf.start()
    try:
        await client.create(CONFIGMAPS, cm("in", team="a"))
        await client.create(CONFIGMAPS, cm("out", team="b"))
        assert await inf.wait_synced(10)
        await until_holds("only matching objects", lambda: set(rec.live) == {"default/in"}, 10.0)
        await client.patch(CONFIGMAPS, "in", {"metadata": {"labels": {"team": "b"}}}, namespace="default")
        await client.patch(CONFIGMAPS, "out", {"metadata": {"labels": {"team": "a"}}}, namespace="default")
        await until_holds("selector transitions", lambda: set(rec.live) == {"default/out"}, 10.0)
        assert ("delete", "default/in", None) in rec.log
    finally:
        await inf.stop()


# ------------------------------------------------------------------------------------------------ indexes


async def test_indexes_follow_updates(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    await client.create(PODS, pod("a", "n1"))
    await client.create(PODS, pod("b", "n1"))
    await client.create(PODS, pod("c"))
    await client.create(PODS, pod("d", "n2", ns="kube-system"))
    inf = Informer(client, PODS, options=FAST)
    inf.add_index(INDEX_NODE, pods_by_node)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        inf.add_index(INDEX_NAMESPACE, by_namespace)  # added after the sync: built over the contents
        inf.add_index(INDEX_NAMESPACE, by_namespace)  # the same function again is a no-op
        with pytest.raises(ValueError, match="already exists"):
            inf.add_index(INDEX_NAMESPACE, pods_by_node)
        assert sorted(p.metadata.name for p in inf.store.by_index(INDEX_NODE, "n1")) == ["a", "b"]
        assert sorted(inf.store.index_values(INDEX_NODE)) == ["n1", "n2"]
        assert sorted(inf.store.index_keys(INDEX_NAMESPACE, "default")) == ["default/a", "default/b", "default/c"]
        # binding "c" moves it into the node index; deleting "a" takes it out
        await client.request(
            "POST",
            PODS.path("default", "c", "binding"),
            body=b'{"apiVersion":"v1","kind":"Binding","metadata":{"name":"c"},"target":{"kind":"Node","name":"n2"}}',
        )
        await client.delete(PODS, "a", "default", grace_period_seconds=0)
        await until_holds("node index after bind and delete",
                          lambda: sorted(inf.store.index_keys(INDEX_NODE, "n2")) == ["default/c", "kube-system/d"]
                          and inf.store.index_keys(INDEX_NODE, "n1") == ["default/b"], 10.0)
        with pytest.raises(KeyError, match="no index"):
            inf.store.by_index("nope", "x")
    finally:
        await inf.stop()


def test_store_custom_index_and_label_index() -> None:
    store: Store[objects.ConfigMap] = Store(CONFIGMAPS.key, lambda o: o.metadata.resource_version)
    store.add_index("team", by_label("team"))

    def mk(name: str, rv: str, team: str | None) -> objects.ConfigMap:
        labels = {"team": team} if team else None
        meta = objects.ObjectMeta(name=name, namespace="ns", resource_version=rv, labels=labels)
        return objects.ConfigMap(metadata=meta)

    store.upsert(mk("a", "2", "x"))
    store.upsert(mk("b", "3", "x"))
    store.upsert(mk("a", "4", "y"))
    store.upsert(mk("c", "5", None))
    assert store.index_keys("team", "x") == ["ns/b"]
    assert store.index_keys("team", "y") == ["ns/a"]
    store.delete(mk("b", "6", "x"))
    assert store.index_values("team") == ["y"]


def test_store_relist_sweeps_unlisted_keys_and_keeps_no_marks_outside_a_relist() -> None:
    """A relist of a non-empty store removes what it did not list (synthetic deletes); a relist of an empty
    store, and the store between relists, keep no per-key marks."""
    deleted: list[str] = []

    def notify(kind: int, old: Any, new: Any) -> None:
        if kind == 2:
            deleted.append(CONFIGMAPS.key(old))

    store: Store[objects.ConfigMap] = Store(CONFIGMAPS.key, lambda o: o.metadata.resource_version, notify)

    def mk(name: str, rv: str) -> objects.ConfigMap:
        return objects.ConfigMap(metadata=objects.ObjectMeta(name=name, namespace="ns", resource_version=rv))

    store.begin_relist()
    assert store._marked is None  # empty: nothing could need sweeping
    for name in ("a", "b", "c"):
        store.upsert(mk(name, "1"))
    assert list(store.sweep()) == [] and sorted(store.keys()) == ["ns/a", "ns/b", "ns/c"]
    store.begin_relist()
    store.upsert(mk("a", "1"))  # unchanged, still listed
    store.upsert(mk("c", "2"))
    store.upsert(mk("d", "2"))
    store.delete(mk("d", "3"))  # listed, then gone: not swept twice
    assert list(store.sweep()) == ["ns/b"]
    assert deleted == ["ns/d", "ns/b"] and sorted(store.keys()) == ["ns/a", "ns/c"]
    assert store._marked is None and not store.relisting


class _BareMeta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = ""
    resource_version: str = ""


class _Bare(msgspec.Struct):
    """A projection without annotations: the streaming list's end bookmark must still be recognised."""

    metadata: _BareMeta = msgspec.field(default_factory=_BareMeta)


async def test_streaming_list_syncs_a_projection_without_annotations(emulator: tuple[APIServer, Client]) -> None:
    s, client = emulator
    for i in range(5):
        await client.create(CONFIGMAPS, cm(f"bare{i}"))
    inf = Informer(client, CONFIGMAPS.typed(_Bare), namespace="default")
    inf.start()
    try:
        assert await inf.wait_synced(10)
        assert (inf.reflector.streaming_lists, inf.reflector.paginated_lists) == (1, 0)
        assert inf.store.last_resource_version == str(s.store.rv)
        listed = inf.store.keys()
        assert {k for k in listed if k.startswith("default/bare")} == {f"default/bare{i}" for i in range(5)}
        await client.create(CONFIGMAPS, cm("bare-late"))
        await until_holds("a live add after the sync", lambda: "default/bare-late" in inf.store, 10.0)
    finally:
        await inf.stop()


# ------------------------------------------------------------------------------------------------ factory


async def test_factory_shares_one_watch_between_consumers(emulator: tuple[APIServer, Client]) -> None:
    s, client = emulator
    factory = InformerFactory(client, options=FAST)
    first = factory.informer(PODS)
    second = factory.informer(PODS)
    other_ns = factory.informer(PODS, namespace="kube-system")
    assert first is second and first is not other_ns
    recs = [Recorder(), Recorder()]
    for rec in recs:
        register(first, rec)
    factory.start()
    try:
        assert await factory.wait_synced(10)
        late = factory.informer(CONFIGMAPS, namespace="default")  # created after start: started at once
        assert await late.wait_synced(10)
        pod_watchers = [w for w in s.store.all_watchers() if w.gr == ("", "pods")]
        assert len(pod_watchers) == 2  # all namespaces + kube-system, not one per consumer
        await client.create(PODS, pod("shared"))
        await until_holds("both consumers", lambda: all("default/shared" in r.live for r in recs), 10.0)
        assert factory.synced() and len(factory.informers()) == 3
    finally:
        await factory.stop()
    await until_holds("watches closed on stop", lambda: not s.store.all_watchers(), 10.0)


async def test_handler_added_after_sync_replays_store_as_initial(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    for i in range(5):
        await client.create(CONFIGMAPS, cm(f"r{i}"))
    inf = Informer(client, CONFIGMAPS, namespace="default", options=FAST)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        rec = Recorder()
        handler = register(inf, rec)
        await until_holds("late handler synced", handler.synced, 10.0)
        assert set(rec.live) == {f"default/r{i}" for i in range(5)}
        assert all(initial for _, _, initial in rec.log)
        handler.remove()
        await client.create(CONFIGMAPS, cm("after-remove"))
        await until_holds("store update", lambda: inf.store.get("default/after-remove") is not None, 10.0)
        assert "default/after-remove" not in rec.live
    finally:
        await inf.stop()


# ------------------------------------------------------------------------------------------------ handlers


async def test_slow_handler_backpressures_the_reflector_without_loss(emulator: tuple[APIServer, Client]) -> None:
    s, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace="default", options=FAST)
    gate = asyncio.Event()
    got: list[str] = []
    max_queued = 0

    async def slow_add(obj: Any, initial: bool) -> None:
        nonlocal max_queued
        max_queued = max(max_queued, inf.queued())
        await gate.wait()
        got.append(obj.metadata.name)

    fast = Recorder()
    slow = inf.add_handler(slow_add, None, None, buffer=3)
    register(inf, fast)
    inf.start()
    labels = {"name": inf.name, "group": "", "version": "v1", "resource": "configmaps"}
    blocked_before = sample("gpuops_informer_handler_blocked_seconds_total", labels)
    try:
        assert await inf.wait_synced(10)
        for i in range(20):
            await client.create(CONFIGMAPS, cm(f"bp{i:02d}"))
        # the reflector stops at a full buffer: the store lags behind the server while the handler is stuck
        await until_holds("backpressure", lambda: inf.full, 10.0)
        await asyncio.sleep(0.2)  # give a buggy reflector time to run ahead (it must not)
        assert len(inf.store) < 20
        assert len(slow) <= 3 + 1  # its capacity, plus at most the one item that filled it
        gate.set()
        await until_holds("all adds delivered", lambda: len(got) == 20, 10.0)
        assert got == [f"bp{i:02d}" for i in range(20)]
        assert store_rvs(inf) == server_rvs(s, "configmaps", "default") == fast.live
        assert sample("gpuops_informer_handler_blocked_seconds_total", labels) > blocked_before
        assert max_queued <= 3 + 1 + 3 + 1  # both buffers stay bounded
    finally:
        await inf.stop()


async def test_handler_exceptions_are_counted_and_delivery_continues(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace="default", options=FAST)
    seen: list[str] = []

    def flaky(obj: Any, initial: bool) -> None:
        seen.append(obj.metadata.name)
        if obj.metadata.name == "boom":
            raise RuntimeError("handler bug")

    handler = inf.add_handler(flaky)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        await client.create(CONFIGMAPS, cm("boom"))
        await client.create(CONFIGMAPS, cm("fine"))
        await until_holds("delivery after an exception", lambda: seen[-1:] == ["fine"], 10.0)
        assert handler.errors == 1
    finally:
        await inf.stop()


# ------------------------------------------------------------------------------------------------ read-your-own-writes


async def test_seen_gates_on_own_writes(emulator: tuple[APIServer, Client]) -> None:
    s, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace="default", options=FAST)
    writes: list[tuple[str, str]] = []
    client.on_write.append(lambda rt, ns, name, rv: writes.append((f"{ns}/{name}", rv)))
    inf.start()
    try:
        assert await inf.wait_synced(10)
        gate = asyncio.Event()
        inf.add_handler(lambda o, i: gate.wait(), buffer=1)  # holds the store back
        await client.create(CONFIGMAPS, cm("w0"))
        await client.create(CONFIGMAPS, cm("w1"))
        await client.create(CONFIGMAPS, cm("w2"))
        key, rv = writes[-1]
        assert not inf.seen(key, rv)  # the store has not caught up with our own write yet
        gate.set()
        await until_holds("own write seen", lambda: inf.seen(key, rv), 10.0)
        assert inf.store.resource_version(key) == rv
        await client.delete(CONFIGMAPS, "w2", "default")
        del_key, del_rv = writes[-1]
        await until_holds("delete seen", lambda: inf.seen(del_key, del_rv) and inf.store.get(del_key) is None, 10.0)
        # an unrelated write moves the store's RV past rv: a key that was never there counts as seen
        assert inf.seen("default/never-existed", rv)
        assert inf.seen(key, "not-a-number")
        assert not inf.seen("default/future", str(s.store.rv + 100))
    finally:
        await inf.stop()


# ------------------------------------------------------------------------------------------------ fallback & frames


class RefusingStreams:
    """A stream_batches that answers a streaming list the way a server without WatchList does (422)."""

    def __init__(self, client: Client) -> None:
        self.inner = client.stream_batches
        self.refused = 0

    def __call__(self, path: str, query: Mapping[str, str], **kw: Any) -> AbstractAsyncContextManager[Any]:
        if "sendInitialEvents" in query:
            self.refused += 1
            raise errors.Invalid(422, "Invalid", "sendInitialEvents: Forbidden: not supported")
        return self.inner(path, query, **kw)


async def test_streaming_refused_falls_back_to_pages_and_remembers(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    refusing = RefusingStreams(client)
    client.stream_batches = refusing  # type: ignore[method-assign]
    # a resource no other test of this process streams, so the remembered refusal affects no one else
    leases: ResourceType[Any] = ResourceType(
        "coordination.k8s.io", "v1", "leases", "Lease", True, objects.PartialObjectMetadata
    )
    await client.create(leases, {"metadata": {"name": "l1", "namespace": "default"}, "spec": {}})
    inf = Informer(client, leases, namespace="default", options=FAST)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        assert refusing.refused == 1 and not inf.reflector.streaming and inf.reflector.paginated_lists == 1
        assert list(inf.store.keys()) == ["default/l1"]
        labels = {"name": inf.name, "group": "coordination.k8s.io", "version": "v1", "resource": "leases"}
        assert sample("gpuops_informer_relists_total", {**labels, "reason": "fallback"}) >= 1
        # a second informer of the same resource does not try again
        again = Informer(client, leases, namespace="default", options=FAST)
        again.start()
        assert await again.wait_synced(10)
        assert refusing.refused == 1
        await again.stop()
    finally:
        await inf.stop()


def test_error_frame_becomes_the_matching_api_error() -> None:
    line = (
        b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        b'"message":"too old resource version: 5 (9)","reason":"Expired","code":410}}'
    )
    err = _frame_error(line)
    assert isinstance(err, errors.Gone) and "too old" in err.message
    assert isinstance(_frame_error(b"not json"), errors.ServerError)


# ------------------------------------------------------------------------------------------------ metrics


async def test_metrics_describe_the_informer(emulator: tuple[APIServer, Client]) -> None:
    s, client = emulator
    await client.create(CONFIGMAPS, cm("m0"))
    inf = Informer(client, CONFIGMAPS, namespace="default", name="metrics-test", options=FAST)
    gate = asyncio.Event()
    inf.add_handler(None, lambda a, b: gate.wait(), None, buffer=100)
    inf.start()
    labels = {"name": "metrics-test", "group": "", "version": "v1", "resource": "configmaps"}
    try:
        assert await inf.wait_synced(10)
        await client.patch(CONFIGMAPS, "m0", {"data": {"v": "1"}}, namespace="default")
        await client.patch(CONFIGMAPS, "m0", {"data": {"v": "2"}}, namespace="default")
        await until_holds("one queued behind the stuck one",
                          lambda: sample("gpuops_informer_queued_items", labels) == 1, 10.0)
        assert sample("gpuops_informer_objects", labels) == 1
        assert sample("gpuops_informer_synced", labels) == 1
        assert sample("gpuops_informer_store_resource_version", labels) == float(s.store.rv)
        assert sample("gpuops_informer_last_event_age_seconds", labels) < 5
        assert sample("gpuops_informer_processing_latency_seconds_count", labels) >= 2
        assert sample("gpuops_informer_events_total", {**labels, "type": "MODIFIED"}) == 2
        assert sample("gpuops_informer_initial_sync_duration_seconds", labels) > 0
        assert sample("gpuops_informer_list_duration_seconds_count", labels) >= 1
        gate.set()
    finally:
        await inf.stop()


@pytest.mark.parametrize("direct", [True, False])
def test_tally_adds_up_to_what_per_event_metrics_would(direct: bool) -> None:
    """The reflector sums event counts and latencies in plain ints and flushes them in bulk; the exposed
    samples must equal one inc/observe per event (bucket edges included), whether it adds to prometheus_client's
    buckets directly or falls back to observing each value."""
    values = [0.0, 0.0005, 0.001, 0.0011, 0.003, 0.5, 2.0, 99.0]
    reg = CollectorRegistry()
    buckets = (0.001, 0.0025, 0.01, 1.0)
    h_bulk = Histogram("bulk", "x", ["l"], buckets=buckets, registry=reg).labels("a")
    h_each = Histogram("each", "x", ["l"], buckets=buckets, registry=reg).labels("a")
    c_bulk = Counter("tallied", "x", ["t"], registry=reg)
    tally = _Tally({t: c_bulk.labels(t) for t in ("ADDED", "DELETED")}, h_bulk)
    if not direct:
        tally.direct = False
    for v in values:
        tally.counts["ADDED"] += 1
        tally.observe(v)
        h_each.observe(v)
    tally.counts["DELETED"] += 2
    tally.flush()
    tally.flush()  # nothing pending: no change

    def samples(prefix: str) -> dict[str, float]:
        return {
            s.name.removeprefix(prefix) + str(s.labels.get("le", "")): s.value
            for m in reg.collect()
            for s in m.samples
            if s.name.startswith(prefix + "_") and not s.name.endswith("_created")
        }

    assert samples("bulk") == samples("each")
    assert reg.get_sample_value("tallied_total", {"t": "ADDED"}) == len(values)
    assert reg.get_sample_value("tallied_total", {"t": "DELETED"}) == 2


# ------------------------------------------------------------------------------------------------ backoff


def test_backoff_defaults_double_to_the_cap_with_full_jitter_and_reset() -> None:
    now = [0.0]
    b = Backoff(rng=lambda: 1.0, clock=lambda: now[0])
    delays = []
    for _ in range(8):
        delays.append(b.next())
        now[0] += 1.0
    assert delays == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    now[0] += 118.0
    assert b.next() == 30.0  # 119 s since the last backoff: not yet 2 minutes
    now[0] += 120.0
    assert b.next() == 0.8  # two minutes without a backoff: reset
    low = Backoff(rng=lambda: 0.0)
    assert low.next() == 0.0  # full jitter: anywhere in [0, d]


async def test_run_twice_is_refused(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace="default", options=FAST)
    task = inf.start()
    assert inf.start() is task
    await inf.wait_synced(10)
    with pytest.raises(RuntimeError, match="already running"):
        await inf.run()
    await inf.stop()



async def test_current_through_follows_the_watch_and_holds_while_it_is_down(
    emulator: tuple[APIServer, Client],
) -> None:
    """While a watch is open on a synced store, the store is current now; while the server is gone, it is current
    only up to when the watch ended, and it is current now again once a new watch is open."""
    s, client = emulator
    inf = Informer(client, CONFIGMAPS, namespace="default", options=FAST)
    inf.start()
    try:
        assert await inf.wait_synced(10)
        await until_holds("a watch open", lambda: inf.reflector.watching_since is not None, 10.0)
        assert time.monotonic() - inf.current_through() < 0.05
        down = asyncio.create_task(s.outage(2.0))
        await until_holds("the watch ended", lambda: inf.reflector.watching_since is None, 10.0)
        held = inf.current_through()
        await asyncio.sleep(0.5)  # the outage lasts 2 s: the hold must not move meanwhile
        assert inf.current_through() == held
        assert time.monotonic() - held >= 0.5
        await down
        await until_holds("current again", lambda: time.monotonic() - inf.current_through() < 0.05, 15)
    finally:
        await inf.stop()

"""The reflector under the emulator's faults: 410 storms, dropped watches, 5% 500s and 429s,
restarts, expired continue tokens, and a silent server (watchdog).

Each chaos run: a writer creates, updates and deletes a few hundred ConfigMaps while the fault plays; then
the faults stop and we wait (with a deadline) until the informer's store equals the emulator's own store
exactly (key -> resourceVersion) and a handler's mirror, built only from add/update/delete notifications,
equals it too (so every final state and every delete reached the handler, in order).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from waiting import until, until_holds

from gpuops.kube import errors
from gpuops.kube.client import Client
from gpuops.kube.informer import Informer
from gpuops.kube.reflector import ReflectorOptions
from gpuops.kube.resources import CONFIGMAPS, NAMESPACES
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

NS = "chaos"
RETRYABLE = (errors.ServerError, errors.TooManyRequests, errors.TransportError)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "kubeconfig"


def restarts(inf: Informer[Any], reason: str) -> float:
    labels = dict(zip(("name", "group", "version", "resource"), inf.metric_labels, strict=True))
    return REGISTRY.get_sample_value("gpuops_informer_watch_restarts_total", {**labels, "reason": reason}) or 0.0


def relists(inf: Informer[Any], reason: str) -> float:
    labels = dict(zip(("name", "group", "version", "resource"), inf.metric_labels, strict=True))
    return REGISTRY.get_sample_value("gpuops_informer_relists_total", {**labels, "reason": reason}) or 0.0


@dataclass
class Mirror:
    """What a handler was told, checked for order as it goes."""

    live: dict[str, str] = field(default_factory=dict)
    deletes: int = 0
    problems: list[str] = field(default_factory=list)

    def on_add(self, obj: Any, initial: bool) -> None:
        key = CONFIGMAPS.key(obj)
        if key in self.live:
            self.problems.append(f"add of live key {key}")
        self.live[key] = obj.metadata.resource_version

    def on_update(self, old: Any, new: Any) -> None:
        key = CONFIGMAPS.key(new)
        if self.live.get(key) != old.metadata.resource_version:
            self.problems.append(f"update of {key}: old {old.metadata.resource_version} != {self.live.get(key)}")
        if int(new.metadata.resource_version) <= int(old.metadata.resource_version):
            self.problems.append(f"update of {key} went backwards")
        self.live[key] = new.metadata.resource_version

    def on_delete(self, obj: Any) -> None:
        key = CONFIGMAPS.key(obj)
        if self.live.pop(key, None) is None:
            self.problems.append(f"delete of unknown key {key}")
        self.deletes += 1


async def retry(op: Callable[[], Awaitable[Any]]) -> None:
    """Retry a write through faults; a create or delete that landed before the connection broke is fine."""
    async def landed() -> bool:
        with contextlib.suppress(errors.AlreadyExists, errors.NotFound):
            await op()
        return True

    await until("a write through the faults", landed, 10.0, every=0.01, ignoring=RETRYABLE)


async def writer(client: Client, ops: int, seed: int, pace: float) -> int:
    """Random creates/updates/deletes over a small name space (so names are reused after deletes)."""
    rng = random.Random(seed)
    deleted = 0
    for i in range(ops):
        name = f"cm-{rng.randrange(120):03d}"
        roll = rng.random()
        data = {"i": str(i)}
        if roll < 0.45:
            body = {"metadata": {"name": name, "namespace": NS}, "data": data}
            await retry(lambda body=body: client.create(CONFIGMAPS, body))  # type: ignore[misc]
        elif roll < 0.8:
            await retry(lambda n=name, d=data: client.patch(CONFIGMAPS, n, {"data": d}, namespace=NS))  # type: ignore[misc]
        else:
            await retry(lambda n=name: client.delete(CONFIGMAPS, n, NS))  # type: ignore[misc]
            deleted += 1
        await asyncio.sleep(pace)
    return deleted


def server_state(s: APIServer) -> dict[str, str]:
    return {f"{NS}/{st.obj['metadata']['name']}": str(st.rv) for st in s.store.iter(("", "configmaps"), NS)}


def store_state(inf: Informer[Any]) -> dict[str, str]:
    return {k: inf.store.resource_version(k) or "" for k in inf.store.keys()}  # noqa: SIM118


Chaos = Callable[[APIServer, asyncio.Event], Coroutine[Any, Any, None]]


async def chaos_run(
    kubeconfig: Path,
    chaos: Chaos,
    *,
    server_kw: dict[str, Any] | None = None,
    options: ReflectorOptions | None = None,
    ops: int = 300,
    pace: float = 0.006,
    handler_delay: float = 0.0,
    buffer: int = 10_000,
    seed: int = 1,
    name: str,
    latency: float = 0.0,
) -> Informer[Any]:
    async with APIServer(**(server_kw or {})) as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        writer_client = await Client.from_kubeconfig(str(kubeconfig))
        try:
            await client.create(NAMESPACES, {"metadata": {"name": NS}})
            for i in range(60):
                await client.create(CONFIGMAPS, {"metadata": {"name": f"cm-{i * 2:03d}", "namespace": NS}})
            opts = options or ReflectorOptions()
            # a name of its own per test: the metrics of the shared registry then count this run only
            inf = Informer(client, CONFIGMAPS, namespace=NS, options=opts, name=name)
            mirror = Mirror()
            if handler_delay:

                async def slow_add(obj: Any, initial: bool) -> None:
                    await asyncio.sleep(handler_delay)
                    mirror.on_add(obj, initial)

                inf.add_handler(slow_add, mirror.on_update, mirror.on_delete, buffer=buffer)
            else:
                inf.add_handler(mirror.on_add, mirror.on_update, mirror.on_delete, buffer=buffer)
            inf.start()
            try:
                assert await inf.wait_synced(20)
                stop = asyncio.Event()
                s.faults.latency = latency
                chaos_task = asyncio.create_task(chaos(s, stop))
                try:
                    deleted = await writer(writer_client, ops, seed, pace)
                finally:
                    stop.set()
                    await chaos_task
                    s.faults.clear()
                assert deleted > 20
                expected = server_state(s)
                await until_holds("store and handler to equal the server",
                                  lambda: store_state(inf) == expected and mirror.live == expected, 30)
                assert not mirror.problems, mirror.problems[:5]
                assert mirror.deletes > 0
                assert inf.store.last_resource_version == str(s.store.rv) or int(
                    inf.store.last_resource_version
                ) >= max(int(v) for v in expected.values())
            finally:
                await inf.stop()
            r = inf.reflector
            print(
                f"{name}: relists={r.relists} (streaming {r.streaming_lists}, paginated {r.paginated_lists}) "
                f"watch_restarts={r.watch_restarts} injected={s.faults.injected} objects={len(inf.store)} "
                f"deletes={mirror.deletes} rv={inf.store.last_resource_version}"
            )
            return inf
        finally:
            await client.close()
            await writer_client.close()


async def every(period: float, stop: asyncio.Event, action: Callable[[], Any]) -> None:
    while not stop.is_set():
        result = action()
        if asyncio.iscoroutine(result):
            await result
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)




def fast(**kw: Any) -> ReflectorOptions:
    """Options with a short backoff, so a run converges in seconds."""
    return ReflectorOptions(backoff_initial=0.05, backoff_cap=0.5, **kw)

_noise = iter(range(1_000_000))


def force_410(s: APIServer) -> None:
    """Cut every watch, write elsewhere and compact past it, with no await in between: the re-watch from the
    last RV the reflector saw is guaranteed to be too old."""
    s.drop_watches()
    s.store.put(("", "configmaps"), {"metadata": {"name": f"noise-{next(_noise)}", "namespace": "default"}})
    s.compact()


# ------------------------------------------------------------------------------------------------ chaos


async def test_410_storm_compaction_while_writing(kubeconfig: Path) -> None:
    """Compaction every 30 ms while writing, and every 0.3 s a forced 410: watches are cut, an unrelated write
    lands and history is compacted past it in the same step, so the re-watch from the last RV must fail."""

    async def chaos(s: APIServer, stop: asyncio.Event) -> None:
        storm = asyncio.create_task(every(0.3, stop, lambda: force_410(s)))
        await every(0.03, stop, s.compact)
        await storm

    inf = await chaos_run(
        kubeconfig, chaos, options=fast(min_watch_timeout=1.0), name="storm-410"
    )
    assert relists(inf, "expired") >= 3
    assert inf.reflector.relists >= 4


async def test_all_watches_dropped_every_half_second(kubeconfig: Path) -> None:
    async def chaos(s: APIServer, stop: asyncio.Event) -> None:
        await every(0.5, stop, s.drop_watches)

    inf = await chaos_run(kubeconfig, chaos, options=fast(), name="dropped")
    assert inf.reflector.watch_restarts >= 3
    assert relists(inf, "expired") == 0  # history covers the gaps: re-watch, never relist


async def test_five_percent_500s_and_429s(kubeconfig: Path) -> None:
    async def chaos(s: APIServer, stop: asyncio.Event) -> None:
        s.faults.add_error(500, 0.05)
        s.faults.add_error(429, 0.05, retry_after=1)
        # rotate watches so that re-watches (and their faults) happen during the run
        await every(0.3, stop, s.drop_watches)

    inf = await chaos_run(kubeconfig, chaos, options=fast(), name="errors")
    assert inf.reflector.watch_restarts >= 3


async def test_emulator_restarts(kubeconfig: Path) -> None:
    async def chaos(s: APIServer, stop: asyncio.Event) -> None:
        await every(0.6, stop, s.restart)

    inf = await chaos_run(kubeconfig, chaos, options=fast(), name="restarts")
    assert inf.reflector.watch_restarts >= 2


async def test_expired_continue_tokens_on_the_paginated_path(kubeconfig: Path) -> None:
    """Pages of 10, a continue TTL of 10 ms, 15 ms of server latency per request (so every continue comes
    too late), and compaction so the emulator cannot rebuild an expired snapshot: lists restart
    unpaginated (FullListIfExpired)."""

    async def chaos(s: APIServer, stop: asyncio.Event) -> None:
        async def compact() -> None:
            await every(0.02, stop, s.compact)

        compactor = asyncio.create_task(compact())
        await every(0.5, stop, lambda: force_410(s))  # relist, paginated again
        await compactor

    inf = await chaos_run(
        kubeconfig,
        chaos,
        server_kw={"continue_ttl": 0.01},
        options=fast(initial_list="paginated", page_size=10),
        latency=0.015,
        ops=150,
        pace=0.0,
        handler_delay=0.001,
        buffer=4,
        name="continue",
    )
    assert relists(inf, "continue_expired") >= 1
    assert inf.reflector.paginated_lists >= 2 and inf.reflector.streaming_lists == 0


# ------------------------------------------------------------------------------------------------ watchdog


async def test_watchdog_restarts_a_silent_watch(kubeconfig: Path) -> None:
    """No bookmarks (60 s cadence) and no changes: the watch is restarted after the 0.4 s silence threshold."""
    async with APIServer(bookmark_interval=60.0) as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        inf = Informer(
            client, CONFIGMAPS, namespace="default", options=fast(watchdog=0.4), name="wd1"
        )
        inf.start()
        try:
            assert await inf.wait_synced(10)
            await until_holds("watchdog restarts", lambda: restarts(inf, "watchdog") >= 2, 10)
            await client.create(CONFIGMAPS, {"metadata": {"name": "after", "namespace": "default"}})
            await until_holds("informer still works", lambda: "default/after" in inf.store, 10)
        finally:
            await inf.stop()
            await client.close()


async def test_bookmarks_keep_the_watchdog_quiet(kubeconfig: Path) -> None:
    async with APIServer(bookmark_interval=0.1) as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        inf = Informer(
            client, CONFIGMAPS, namespace="default", options=fast(watchdog=0.5), name="wd2"
        )
        inf.start()
        try:
            assert await inf.wait_synced(10)
            start_rv = inf.store.last_resource_version
            await client.create(CONFIGMAPS, {"metadata": {"name": "x", "namespace": "default"}})
            await until_holds("event", lambda: inf.store.last_resource_version != start_rv, 5)
            before = inf.reflector.watch_restarts
            t0 = time.monotonic()
            await until_holds("1.5 s of bookmarks", lambda: time.monotonic() - t0 > 1.5, 5)
            assert restarts(inf, "watchdog") == 0 and inf.reflector.watch_restarts == before
            assert inf.last_event_age() < 0.5
        finally:
            await inf.stop()
            await client.close()


async def test_hung_server_is_detected_and_survived(kubeconfig: Path) -> None:
    """outage(mode="hang"): connections accepted, nothing answered. Watches are cut, the re-watch hangs
    waiting for headers, the watchdog restarts it; after the outage the informer catches up."""
    async with APIServer(bookmark_interval=0.1) as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        inf = Informer(
            client, CONFIGMAPS, namespace="default", options=fast(watchdog=0.4), name="wd3"
        )
        inf.start()
        try:
            assert await inf.wait_synced(10)
            outage = asyncio.create_task(s.outage(1.5, mode="hang"))
            await until_holds("watchdog during hang", lambda: restarts(inf, "watchdog") >= 1, 10)
            await outage
            await client.create(CONFIGMAPS, {"metadata": {"name": "after-hang", "namespace": "default"}})
            await until_holds("catch-up after the hang", lambda: "default/after-hang" in inf.store, 10)
        finally:
            await inf.stop()
            await client.close()


async def test_connection_refused_backs_off_and_rewatches(kubeconfig: Path) -> None:
    """A refusing outage: re-watches fail with transport errors and back off; no relist is needed after."""
    async with APIServer(bookmark_interval=0.2) as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        inf = Informer(client, CONFIGMAPS, namespace="default", options=fast(), name="refused")
        inf.start()
        try:
            assert await inf.wait_synced(10)
            await s.outage(0.8)
            await client.create(CONFIGMAPS, {"metadata": {"name": "after-refused", "namespace": "default"}})
            await until_holds("catch-up", lambda: "default/after-refused" in inf.store, 10)
            assert restarts(inf, "transport") + restarts(inf, "very_short") >= 1
            assert inf.reflector.relists == 1
        finally:
            await inf.stop()
            await client.close()



# ------------------------------------------------------------------------------------------------ request policy


class Recording:
    """Wraps a client's list and stream_batches to record what the reflector asked for (and fail on demand)."""

    def __init__(self, client: Client) -> None:
        self.lists: list[tuple[str | None, str | None, int | None, bool]] = []
        self.watches: list[dict[str, str]] = []
        self.fail_lists: list[BaseException] = []
        inner_list, inner_stream = client.list, client.stream_batches

        async def list_(rt: Any, namespace: str | None = None, **kw: Any) -> Any:
            rv, match = kw.get("resource_version"), kw.get("resource_version_match")
            self.lists.append((rv, match, kw.get("limit"), bool(kw.get("continue_"))))
            if self.fail_lists:
                raise self.fail_lists.pop(0)
            return await inner_list(rt, namespace, **kw)

        def stream(path: str, query: Any, **kw: Any) -> Any:
            self.watches.append(dict(query))
            return inner_stream(path, query, **kw)

        client.list = list_  # type: ignore[method-assign]
        client.stream_batches = stream  # type: ignore[method-assign]


async def test_paginated_relist_resource_versions(kubeconfig: Path) -> None:
    """Relist resourceVersions as client-go's reflector picks them: the first list at "0"; after a 410 at the
    last synced RV (NotOlderThan); once that failed as Gone, a consistent read (""). Continue pages carry no
    RV. Watches start at the list's RV, with bookmarks and a timeout in [5, 10] minutes."""
    async with APIServer(bookmark_interval=0.2) as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        rec = Recording(client)
        for i in range(5):
            await client.create(CONFIGMAPS, {"metadata": {"name": f"p{i}", "namespace": "default"}})
        inf = Informer(client, CONFIGMAPS, namespace="default", options=fast(initial_list="paginated", page_size=2))
        inf.start()
        try:
            assert await inf.wait_synced(10)
            assert rec.lists == [("0", None, 2, False), (None, None, 2, True), (None, None, 2, True)]
            list_rv = inf.store.last_resource_version
            await until_holds("watch", lambda: len(rec.watches) == 1, 5)
            w = rec.watches[0]
            assert w["resourceVersion"] == list_rv and w["allowWatchBookmarks"] == "true"
            assert 300 <= int(w["timeoutSeconds"]) <= 600 and "sendInitialEvents" not in w
            await until_holds("bookmark", lambda: inf.store.last_resource_version == str(s.store.rv), 5)
            last = inf.store.last_resource_version
            rec.lists.clear()
            rec.fail_lists.append(errors.Gone(410, "Expired", "too old resource version"))
            force_410(s)
            await until_holds("relists", lambda: len(rec.lists) >= 2 and not rec.fail_lists, 10)
            assert rec.lists[0] == (last, "NotOlderThan", 2, False)
            assert rec.lists[1] == ("", None, 2, False)
        finally:
            await inf.stop()
            await client.close()


async def test_streaming_list_request_and_relist(kubeconfig: Path) -> None:
    async with APIServer(bookmark_interval=0.2) as s:
        s.write_kubeconfig(kubeconfig)
        client = await Client.from_kubeconfig(str(kubeconfig))
        rec = Recording(client)
        inf = Informer(client, CONFIGMAPS, namespace="default", options=fast())
        inf.start()
        try:
            assert await inf.wait_synced(10)
            first = rec.watches[0]
            assert first["sendInitialEvents"] == "true" and first["resourceVersionMatch"] == "NotOlderThan"
            assert first["allowWatchBookmarks"] == "true" and "resourceVersion" not in first  # consistent read
            await until_holds("bookmark", lambda: inf.store.last_resource_version == str(s.store.rv), 5)
            last = inf.store.last_resource_version
            force_410(s)
            await until_holds("streaming relist", lambda: inf.reflector.streaming_lists == 2, 10)
            # the re-watch after the drop got 410; the relist streams again from the last RV it had synced
            plain, relist = rec.watches[1], rec.watches[2]
            assert plain["resourceVersion"] == last and "sendInitialEvents" not in plain
            assert relist["sendInitialEvents"] == "true" and relist["resourceVersion"] == last
            assert not rec.lists  # streaming needs no list requests
        finally:
            await inf.stop()
            await client.close()


def _repoint(kubeconfig: Path, old: str, new: str) -> None:
    kubeconfig.write_text(kubeconfig.read_text().replace(old, new))


class CuttingProxy:
    """A TCP relay in front of the emulator whose `cut()` closes every connection mid-response (as a load
    balancer dropping idle streams does): the client sees a chunked body end without its last chunk, a broken
    stream rather than the clean end of a watch."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.transports: list[asyncio.Transport] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> CuttingProxy:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self.server is not None
        self.server.close()

    def cut(self) -> int:
        cut = [t for t in self.transports if not t.is_closing()]
        for t in cut:
            t.close()
        self.transports.clear()
        return len(cut)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self.transports += [writer.transport, up_writer.transport]  # type: ignore[list-item]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_a_quiet_watch_cut_after_a_second_is_reopened_at_once(kubeconfig: Path) -> None:
    """client-go's rule: a watch that lasted a second is re-opened immediately, frames or not. Treating the
    reset of an idle stream as a failed request climbed the backoff towards its 30 s cap under repeated cuts:
    chaos/budget_apiserver_faults.py saw the operator's pods informer blind for 37 s of a 45 s run."""
    async with APIServer(bookmark_interval=60.0) as s, CuttingProxy(s.url) as proxy:
        s.write_kubeconfig(kubeconfig)
        writer = await Client.from_kubeconfig(str(kubeconfig))  # straight to the server, never cut
        _repoint(kubeconfig, s.url, proxy.url)
        client = await Client.from_kubeconfig(str(kubeconfig))
        await writer.create(NAMESPACES, {"metadata": {"name": "quiet"}})
        inf = Informer(client, CONFIGMAPS, namespace="quiet", name="quiet-cut")  # default (client-go) backoff
        inf.start()
        try:
            assert await inf.wait_synced(10)
            for i in range(4):
                opened = inf.reflector.watch_restarts
                for _ in range(2):  # the first cut ends a watch that delivered after-(i-1); the second, a quiet one
                    await asyncio.sleep(1.2)  # let the watch outlive the 1 s "very short" threshold
                    assert proxy.cut() >= 1
                await writer.create(CONFIGMAPS, {"metadata": {"name": f"after-{i}", "namespace": "quiet"}})
                # well inside the 0.8 s initial backoff that a failure would cost (growing each time)
                await until_holds(f"after-{i}", lambda i=i: f"quiet/after-{i}" in inf.store, 0.6)
                assert inf.reflector.watch_restarts == opened + 2
            assert restarts(inf, "transport") == 0 and restarts(inf, "very_short") == 0
        finally:
            await inf.stop()
            await client.close()
            await writer.close()

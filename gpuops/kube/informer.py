"""Informers: a store with indexes kept current by a `Reflector`, event handlers, and a shared factory.

Store
    A dict keyed `namespace/name` (or `name`), plus optional secondary indexes. A relist is a mark-and-sweep
    in place: each relist starts an epoch, every listed or streamed item overwrites its key and is marked
    in the epoch, and when the list completes every unmarked key is removed with a synthetic delete. The
    marks are a set of keys that lives only while a relist runs, and only if the store held anything when
    it began (an empty store has nothing to sweep: the first list, the largest, keeps no marks at all).
    There is never a second copy of the store; readers always see a complete (at worst slightly stale)
    store. An item listed at the resourceVersion the store already holds changes nothing and notifies
    nobody.

Handlers
    `add_handler(on_add, on_update, on_delete)` registers callbacks (plain or async) that run on their own
    task, fed through a bounded buffer. `on_add(obj, initial)` says whether the object came with the
    informer's initial list (so controllers can queue those at low priority); `on_delete(obj)` gets the
    object's final state (for a synthetic delete: the last state the store held).

Backpressure
    When any handler's buffer is full, the reflector stops: it awaits room before it applies the next item,
    so it stops reading the watch stream. Nothing is dropped and memory stays bounded (buffer size x
    handlers). The price: the store stops advancing for every reader of this informer while the slowest
    handler catches up, and if it stays stuck long enough the API server gives up on the stalled watch
    (the emulator and the apiserver close a watcher whose buffer overflows), after which the reflector
    re-watches from its last resourceVersion or relists on 410. Time spent waiting is
    `gpuops_informer_handler_blocked_seconds_total`; pending notifications are `gpuops_informer_queued_items`.

Read-your-own-writes
    `seen(key, rv)`: the store holds `key` at a resourceVersion >= `rv` (KEP-5504 ordering), or the store
    as a whole is current at or past `rv` (then whatever it holds for `key`, including nothing, is at least
    as new as that write).

Sharing
    `InformerFactory.informer(rt, namespace=, label_selector=, field_selector=)` returns one informer per
    (resource, model, namespace, selectors), so a process holds one watch per such tuple however many
    controllers ask for it.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import operator
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import structlog

from . import metrics
from . import rv as rvmod
from .client import Client
from .reflector import Reflector, ReflectorOptions
from .resources import ResourceType

__all__ = [
    "ADD",
    "DELETE",
    "INDEX_NAMESPACE",
    "INDEX_NODE",
    "UPDATE",
    "Handler",
    "IndexFunc",
    "Informer",
    "InformerFactory",
    "Store",
    "by_label",
    "by_namespace",
    "by_owner_uid",
    "pods_by_node",
]

T = TypeVar("T")

log = structlog.get_logger("gpuops.kube.informer")

ADD, UPDATE, DELETE = 0, 1, 2

IndexFunc = Callable[[T], Iterable[str]]
Notify = Callable[[int, Any, Any], None]
"""(kind, old, new): ADD (None, new); UPDATE (old, new); DELETE (stored, final state)."""

INDEX_NAMESPACE = "namespace"
INDEX_NODE = "node"


# ---------------------------------------------------------------------------------------------- index functions


def _meta(obj: Any) -> Any:
    return obj.get("metadata") or {} if isinstance(obj, Mapping) else obj.metadata


def by_namespace(obj: Any) -> tuple[str, ...]:
    meta = _meta(obj)
    ns = meta.get("namespace") if isinstance(meta, Mapping) else meta.namespace
    return (ns,) if ns else ()


def pods_by_node(pod: Any) -> tuple[str, ...]:
    """spec.nodeName; unscheduled pods are not indexed."""
    node = (pod.get("spec") or {}).get("nodeName") if isinstance(pod, Mapping) else pod.spec.node_name
    return (node,) if node else ()


def by_label(label: str) -> Callable[[Any], tuple[str, ...]]:
    """Index by the value of one label (objects without it are not indexed)."""

    def index(obj: Any) -> tuple[str, ...]:
        meta = _meta(obj)
        labels = meta.get("labels") if isinstance(meta, Mapping) else meta.labels
        value = labels.get(label) if labels else None
        return (value,) if value is not None else ()

    return index


def by_owner_uid(obj: Any) -> tuple[str, ...]:
    meta = _meta(obj)
    if isinstance(meta, Mapping):
        return tuple(str(o.get("uid", "")) for o in meta.get("ownerReferences") or ())
    return tuple(o.uid for o in meta.owner_references or ())


def _key_getter(rt: ResourceType[Any]) -> Callable[[Any], str]:
    if isinstance(rt.struct, type) and issubclass(rt.struct, Mapping):
        return rt.key

    def key(obj: Any) -> str:
        meta = obj.metadata
        ns: str = meta.namespace
        return ns + "/" + meta.name if ns else str(meta.name)

    return key


def _rv_getter(rt: ResourceType[Any]) -> Callable[[Any], str]:
    if isinstance(rt.struct, type) and issubclass(rt.struct, Mapping):
        return lambda o: str((o.get("metadata") or {}).get("resourceVersion") or "")
    rv: Callable[[Any], str] = operator.attrgetter("metadata.resource_version")  # a str on every model
    return rv


# ---------------------------------------------------------------------------------------------- store


class Store(Generic[T]):
    """The informer's cache. Readers use get/list/keys/by_index; only the informer writes.

    Not thread-safe: it belongs to one event loop, and its writer never awaits between changing the dict
    and its indexes, so readers on the same loop always see them consistent.
    """

    def __init__(
        self,
        key: Callable[[T], str],
        resource_version: Callable[[T], str],
        notify: Notify | None = None,
    ) -> None:
        self._key = key
        self._rv = resource_version
        self.notify = notify
        self._items: dict[str, T] = {}
        self._marked: set[str] | None = None
        """Keys listed in the running relist (None: no relist running, or nothing to sweep after it)."""
        self._indexers: dict[str, Callable[[T], Iterable[str]]] = {}
        self._indices: dict[str, dict[str, set[str]]] = {}
        self.last_resource_version = ""
        """The resourceVersion the whole store is current at: the last list's, then each event's/bookmark's."""
        self.relisting = False

    # ------------------------------------------------------------------------------------------ reads

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def list(self) -> builtins.list[T]:
        return list(self._items.values())

    def keys(self) -> builtins.list[str]:
        return list(self._items)

    def items(self) -> builtins.list[tuple[str, T]]:
        return list(self._items.items())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def resource_version(self, key: str) -> str | None:
        obj = self._items.get(key)
        return None if obj is None else self._rv(obj)

    def add_index(self, name: str, fn: Callable[[T], Iterable[str]]) -> None:
        """Add a secondary index (built over the current contents). Re-adding the same function is a no-op."""
        existing = self._indexers.get(name)
        if existing is not None:
            if existing is fn:
                return
            raise ValueError(f"index {name!r} already exists with another function")
        index: dict[str, set[str]] = {}
        for key, obj in self._items.items():
            for value in fn(obj):
                index.setdefault(value, set()).add(key)
        self._indexers[name] = fn
        self._indices[name] = index

    def indexes(self) -> builtins.list[str]:
        return list(self._indexers)

    def by_index(self, name: str, value: str) -> builtins.list[T]:
        items = self._items
        return [items[k] for k in self._index(name).get(value, ())]

    def index_keys(self, name: str, value: str) -> builtins.list[str]:
        return list(self._index(name).get(value, ()))

    def index_values(self, name: str) -> builtins.list[str]:
        return list(self._index(name))

    def _index(self, name: str) -> dict[str, set[str]]:
        try:
            return self._indices[name]
        except KeyError:
            raise KeyError(f"no index named {name!r}; add it with add_index") from None

    # ------------------------------------------------------------------------------------------ writes

    def begin_relist(self) -> None:
        self.relisting = True
        self._marked = set() if self._items else None

    def upsert(self, obj: T) -> None:
        key = self._key(obj)
        items = self._items
        old = items.get(key)
        if self._marked is not None:
            self._marked.add(key)
        if old is not None and self._rv(old) == self._rv(obj):
            return
        items[key] = obj
        if self._indexers:
            self._reindex(key, old, obj)
        if self.notify is not None:
            self.notify(ADD if old is None else UPDATE, old, obj)

    def delete(self, obj: T) -> None:
        """Remove `obj`'s key; `obj` is the final state handlers get. Unknown keys are ignored."""
        key = self._key(obj)
        old = self._items.pop(key, None)
        if old is None:
            return
        if self._marked is not None:
            self._marked.discard(key)
        if self._indexers:
            self._reindex(key, old, None)
        if self.notify is not None:
            self.notify(DELETE, old, obj)

    def sweep(self) -> Iterator[str]:
        """Remove every key not marked in the current relist (synthetic deletes), yielding after each."""
        marked, self._marked = self._marked, None
        stale = [k for k in self._items if k not in marked] if marked is not None else []
        del marked
        try:
            for key in stale:
                old = self._items.pop(key, None)
                if old is None:
                    continue
                if self._indexers:
                    self._reindex(key, old, None)
                if self.notify is not None:
                    self.notify(DELETE, old, old)
                yield key
        finally:
            self.relisting = False

    def advance(self, resource_version: str) -> None:
        self.last_resource_version = resource_version

    def _reindex(self, key: str, old: T | None, new: T | None) -> None:
        for name, fn in self._indexers.items():
            before = set(fn(old)) if old is not None else set()
            after = set(fn(new)) if new is not None else set()
            if before == after:
                continue
            index = self._indices[name]
            for value in before - after:
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]
            for value in after - before:
                index.setdefault(value, set()).add(key)


# ---------------------------------------------------------------------------------------------- handlers

# Handlers may be plain or async: a returned awaitable is awaited, anything else is ignored.
OnAdd = Callable[[T, bool], object]
OnUpdate = Callable[[T, T], object]
OnDelete = Callable[[T], object]

_YIELD_EVERY = 64


class Handler(Generic[T]):
    """One registered set of callbacks, its bounded buffer and its delivery task."""

    def __init__(
        self,
        informer: Informer[T],
        on_add: OnAdd[T] | None,
        on_update: OnUpdate[T] | None,
        on_delete: OnDelete[T] | None,
        capacity: int,
        replay: list[T],
        replay_synced: bool,
    ) -> None:
        if capacity < 1:
            raise ValueError("buffer: must be at least 1")
        self.informer = informer
        self.on_add = on_add
        self.on_update = on_update
        self.on_delete = on_delete
        self.capacity = capacity
        self.buffer: deque[tuple[int, Any, Any]] = deque()
        self._replay: deque[T] = deque(replay)
        self.pushed = len(replay)
        self.delivered = 0
        self.errors = 0
        self._sync_target: int | None = len(replay) if replay_synced else None
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._removed = False

    def __len__(self) -> int:
        return len(self.buffer) + len(self._replay)

    @property
    def full(self) -> bool:
        return len(self.buffer) >= self.capacity

    def synced(self) -> bool:
        """The informer has synced and this handler has processed every notification of the initial list."""
        return self._sync_target is not None and self.delivered >= self._sync_target

    def remove(self) -> None:
        self.informer._remove_handler(self)

    # ------------------------------------------------------------------------------------------ informer side

    def push(self, item: tuple[int, Any, Any]) -> None:
        self.buffer.append(item)
        self.pushed += 1
        if len(self.buffer) == 1:
            self._wakeup.set()

    def mark_sync(self) -> None:
        if self._sync_target is None:
            self._sync_target = self.pushed

    async def wait_room(self) -> None:
        while len(self.buffer) >= self.capacity and not self._removed:
            self._room.clear()
            await self._room.wait()

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"informer-handler-{id(self)}")

    async def stop(self) -> None:
        self._room.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    # ------------------------------------------------------------------------------------------ delivery

    async def _run(self) -> None:
        # Plain handlers are called inline (no coroutine per notification); only a returned awaitable is
        # awaited. The loop yields every _YIELD_EVERY notifications so a long backlog cannot starve the loop.
        buffer = self.buffer
        replay = self._replay
        capacity = self.capacity
        room = self._room
        call = self._call
        batch = 0
        while True:
            if replay:
                obj = replay.popleft()
                result = call(ADD, None, obj, True)
            elif buffer:
                kind, old, new = buffer.popleft()
                if len(buffer) < capacity:
                    room.set()
                result = call(kind, old, new, False)
            else:
                self._wakeup.clear()
                await self._wakeup.wait()
                batch = 0
                continue
            if result is not None:
                await self._finish(result)
            batch += 1
            if batch >= _YIELD_EVERY:
                batch = 0
                await asyncio.sleep(0)

    def _call(self, kind: int, old: Any, new: Any, replayed: bool) -> Awaitable[object] | None:
        """Call the callback; an awaitable it returns is given back (and counted delivered once awaited)."""
        try:
            if kind == ADD:  # `old` carries the initial-list flag of an add
                result = self.on_add(new, replayed or old is True) if self.on_add else None
            elif kind == UPDATE:
                result = self.on_update(old, new) if self.on_update else None
            else:
                result = self.on_delete(new) if self.on_delete else None
            if result is not None and inspect.isawaitable(result):
                return result
        except Exception:
            self._failed()
        self.delivered += 1
        return None

    async def _finish(self, result: Awaitable[object]) -> None:
        try:
            await result
        except asyncio.CancelledError:
            raise
        except Exception:
            self._failed()
        finally:
            self.delivered += 1

    def _failed(self) -> None:
        self.errors += 1
        metrics.INFORMER_HANDLER_ERRORS.labels(*self.informer.metric_labels).inc()
        log.exception("informer handler failed", informer=self.informer.name)


# ---------------------------------------------------------------------------------------------- informer


class Informer(Generic[T]):
    """A store kept current by a reflector, with handlers. Run it with `run()` (or `start()`/`stop()`)."""

    def __init__(
        self,
        client: Client,
        rt: ResourceType[T],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        name: str | None = None,
        options: ReflectorOptions | None = None,
        transform: Callable[[T], T] | None = None,
    ) -> None:
        self.rt = rt
        self.client = client
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.name = name or _default_name(rt, namespace, label_selector, field_selector)
        self.metric_labels = (self.name, rt.group, rt.version, rt.plural)
        self.store: Store[T] = Store(_key_getter(rt), _rv_getter(rt), self._notify)
        self.reflector: Reflector[T] = Reflector(
            client,
            rt,
            self,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            options=options,
            name=self.name,
            transform=transform,
        )
        self._handlers: list[Handler[T]] = []
        self._full: list[Handler[T]] = []
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running = False
        self._m_blocked = metrics.INFORMER_HANDLER_BLOCKED.labels(*self.metric_labels)
        metrics.INFORMER_COLLECTOR.track(self)

    def __repr__(self) -> str:
        return f"Informer({self.name!r}, objects={len(self.store)}, synced={self.synced()})"

    # ------------------------------------------------------------------------------------------ public

    def add_handler(
        self,
        on_add: OnAdd[T] | None = None,
        on_update: OnUpdate[T] | None = None,
        on_delete: OnDelete[T] | None = None,
        *,
        buffer: int = 10_000,
    ) -> Handler[T]:
        """Register callbacks. Added to a running informer, the handler first gets an add for every object
        already in the store (`initial=True`), then live changes."""
        replay = self.store.list()
        handler = Handler(self, on_add, on_update, on_delete, buffer, replay, self.synced())
        self._handlers.append(handler)
        if self._running:
            handler.start()
        return handler

    def add_index(self, name: str, fn: Callable[[T], Iterable[str]]) -> None:
        self.store.add_index(name, fn)

    def synced(self) -> bool:
        """The first complete list is in the store (it stays true across later relists)."""
        return self._synced.is_set()

    async def wait_synced(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - returns False on timeout
        if self._synced.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError:
            return False
        return True

    def seen(self, key: str, resource_version: str) -> bool:
        """Has the store caught up with a write of `key` that returned `resource_version`?

        Non-comparable resourceVersions (not KEP-5504 integers) cannot be ordered: the answer is then True,
        so a caller gating on it never stalls.
        """
        try:
            last = self.store.last_resource_version
            if last and rvmod.is_newer_or_equal(last, resource_version):
                return True
            have = self.store.resource_version(key)
            return have is not None and rvmod.is_newer_or_equal(have, resource_version)
        except rvmod.NotComparable:
            return True

    def current_through(self) -> float:
        """The monotonic instant up to which the store is known current (`Reflector.current_through`)."""
        return self.reflector.current_through()

    def last_event_age(self) -> float:
        """Seconds since the last frame (event, bookmark) or completed list."""
        return time.monotonic() - self.reflector.last_frame

    def queued(self) -> int:
        """Notifications waiting in handler buffers."""
        return sum(len(h) for h in self._handlers)

    def objects(self) -> int:
        return len(self.store)

    def store_resource_version(self) -> str:
        return self.store.last_resource_version

    async def run(self) -> None:
        """List and watch until cancelled; handlers run on their own tasks and stop with it."""
        if self._running:
            raise RuntimeError(f"informer {self.name} is already running")
        self._running = True
        try:
            for h in self._handlers:
                h.start()
            await self.reflector.run()
        finally:
            self._running = False
            for h in list(self._handlers):
                await h.stop()

    def start(self) -> asyncio.Task[None]:
        """Run in a background task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"informer-{self.name}")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait([task])

    # ------------------------------------------------------------------------------------------ sink

    @property
    def full(self) -> bool:
        return bool(self._full)

    async def drain(self) -> None:
        start = time.monotonic()
        for h in list(self._full):
            await h.wait_room()
        self._full.clear()
        self._m_blocked.inc(time.monotonic() - start)

    def begin_relist(self) -> None:
        self.store.begin_relist()

    def upsert(self, obj: T) -> None:
        self.store.upsert(obj)

    def delete(self, obj: T) -> None:
        self.store.delete(obj)

    async def end_relist(self, resource_version: str) -> None:
        for _ in self.store.sweep():
            if self._full:
                await self.drain()
        self.store.advance(resource_version)
        if not self._synced.is_set():
            for h in self._handlers:
                h.mark_sync()
            self._synced.set()

    def advance(self, resource_version: str) -> None:
        self.store.last_resource_version = resource_version

    def _notify(self, kind: int, old: Any, new: Any) -> None:
        handlers = self._handlers
        if not handlers:
            return
        if kind == ADD:
            item: tuple[int, Any, Any] = (ADD, not self._synced.is_set(), new)
        else:
            item = (kind, old, new)
        for h in handlers:
            h.push(item)
            if len(h.buffer) >= h.capacity and h not in self._full:
                self._full.append(h)

    def _remove_handler(self, handler: Handler[T]) -> None:
        if handler in self._handlers:
            self._handlers.remove(handler)
        if handler in self._full:
            self._full.remove(handler)
        handler._removed = True
        handler._room.set()
        if handler._task is not None:
            handler._task.cancel()


def _default_name(rt: ResourceType[Any], namespace: str | None, labels: str | None, fields: str | None) -> str:
    name = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    scope = [p for p in (namespace and f"ns={namespace}", labels and f"l={labels}", fields and f"f={fields}") if p]
    return f"{name}[{','.join(scope)}]" if scope else name


# ---------------------------------------------------------------------------------------------- factory


class InformerFactory:
    """One informer per (resource, model, namespace, label selector, field selector) for a whole process."""

    def __init__(self, client: Client, *, options: ReflectorOptions | None = None) -> None:
        self.client = client
        self.options = options
        self._informers: dict[tuple[Any, ...], Informer[Any]] = {}
        self._started = False

    def informer(
        self,
        rt: ResourceType[T],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Informer[T]:
        """The shared informer; created on first request, started at once if the factory is running."""
        key = (rt.group, rt.version, rt.plural, rt.struct, namespace or None, label_selector or None,
               field_selector or None)
        inf = self._informers.get(key)
        if inf is None:
            inf = Informer(
                self.client,
                rt,
                namespace=namespace or None,
                label_selector=label_selector or None,
                field_selector=field_selector or None,
                options=self.options,
            )
            self._informers[key] = inf
            if self._started:
                inf.start()
        return inf

    def informers(self) -> list[Informer[Any]]:
        return list(self._informers.values())

    def start(self) -> None:
        """Start every informer (and any created later) in background tasks."""
        self._started = True
        for inf in self._informers.values():
            inf.start()

    async def stop(self) -> None:
        self._started = False
        for inf in list(self._informers.values()):
            await inf.stop()

    async def run(self) -> None:
        """Start, then wait until cancelled; stops every informer on the way out."""
        self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    def synced(self) -> bool:
        return all(inf.synced() for inf in self._informers.values())

    async def wait_synced(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - returns False on timeout
        try:
            async with asyncio.timeout(timeout):
                for inf in list(self._informers.values()):
                    await inf._synced.wait()
        except TimeoutError:
            return False
        return True

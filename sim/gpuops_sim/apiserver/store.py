"""The emulator's storage: one global resourceVersion, a bounded event history and watch fan-out.

Like etcd behind a kube-apiserver, the store knows nothing of API semantics (validation, generation,
finalizers live in the handlers). Stored objects are treated as immutable: writers hand in a new dict,
readers may share it. Each object's JSON encoding is cached so lists and watch streams encode once.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import msgspec

GroupResource = tuple[str, str]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects

_encode = msgspec.json.encode
_decode = msgspec.json.decode


J = TypeVar("J")


def clone(obj: J) -> J:
    """A deep copy that is faster than copy.deepcopy for JSON-shaped values."""
    out: J = _decode(_encode(obj))
    return out


class Stored:
    """One version of one object with its cached JSON encoding."""

    __slots__ = ("_raw", "obj", "rv")

    def __init__(self, obj: dict[str, Any], rv: int) -> None:
        self.obj = obj
        self.rv = rv
        self._raw: bytes | None = None

    @property
    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = _encode(self.obj)
        return self._raw


class WatchEvent:
    """A change at one resourceVersion; `prev` is the object before it (None for ADDED)."""

    __slots__ = ("gr", "key", "new", "prev", "rv", "time", "type")

    def __init__(
        self, rv: int, type_: str, gr: GroupResource, key: Key, new: Stored, prev: Stored | None
    ) -> None:
        self.rv = rv
        self.type = type_
        self.gr = gr
        self.key = key
        self.new = new
        self.prev = prev
        self.time = time.monotonic()

    def line(self, type_: str | None = None) -> bytes:
        """The newline-terminated watch frame; a filtered watch may need another type for the same object.

        Built per send, not cached: the history holds up to 100,000 events and a cached frame would double
        what each one weighs, while the concatenation costs well under a microsecond."""
        return b'{"type":"' + (type_ or self.type).encode() + b'","object":' + self.new.raw + b"}\n"


class Watcher:
    """A subscriber's buffer. The store appends; the HTTP stream drains. Overflow closes the watch."""

    __slots__ = ("closed", "events", "gr", "limit", "namespace", "overflowed", "wakeup")

    def __init__(self, gr: GroupResource, namespace: str | None, limit: int) -> None:
        self.gr = gr
        self.namespace = namespace
        self.events: deque[WatchEvent] = deque()
        self.wakeup = asyncio.Event()
        self.limit = limit
        self.closed = False
        self.overflowed = False

    def push(self, ev: WatchEvent) -> None:
        if self.closed:
            return
        if len(self.events) >= self.limit:
            # A watcher that cannot keep up is terminated, as the apiserver's cacher does.
            self.overflowed = True
            self.close()
            return
        self.events.append(ev)
        self.wakeup.set()

    def close(self) -> None:
        self.closed = True
        self.wakeup.set()


Listener = Callable[[WatchEvent], None]


class Store:
    """MVCC-ish object store keyed by group/resource, then namespace, then name."""

    def __init__(
        self, history_size: int = 100_000, history_age: float = 300.0, watcher_buffer: int = 200_000
    ):
        self.rv = 1
        self.history_size = history_size
        self.history_age = history_age
        self.watcher_buffer = watcher_buffer
        self._data: dict[GroupResource, dict[str, dict[str, Stored]]] = {}
        self._sorted: dict[GroupResource, list[Key]] = {}
        self._counts: dict[GroupResource, int] = {}
        self._hist: list[WatchEvent] = []
        self._hist_rvs: list[int] = []
        self._hist_start = 0
        # Watches from a resourceVersion older than this get 410 Gone: their events are no longer retained.
        self.compacted_rv = 0
        self._watchers: dict[GroupResource, set[Watcher]] = {}
        self._listeners: list[Listener] = []
        self._rv_waiters: list[tuple[int, asyncio.Future[None]]] = []
        # Secondary indexes maintained for the emulator's controllers.
        self.by_uid: dict[str, tuple[GroupResource, Key]] = {}

    # ---------------------------------------------------------------- reads

    def get(self, gr: GroupResource, namespace: str, name: str) -> Stored | None:
        ns = self._data.get(gr)
        if ns is None:
            return None
        names = ns.get(namespace)
        return names.get(name) if names else None

    def count(self, gr: GroupResource) -> int:
        return self._counts.get(gr, 0)

    def iter(self, gr: GroupResource, namespace: str | None = None) -> Iterator[Stored]:
        """Objects in (namespace, name) order; namespace None means all namespaces."""
        data = self._data.get(gr)
        if not data:
            return
        if namespace is not None:
            names = data.get(namespace)
            if names:
                for n in sorted(names):
                    yield names[n]
            return
        for ns, name in self.sorted_keys(gr):
            yield data[ns][name]

    def sorted_keys(self, gr: GroupResource) -> list[Key]:
        keys = self._sorted.get(gr)
        if keys is None:
            data = self._data.get(gr, {})
            keys = sorted((ns, n) for ns, names in data.items() for n in names)
            self._sorted[gr] = keys
        return keys

    def namespaces_of(self, gr: GroupResource) -> list[str]:
        return [ns for ns, names in self._data.get(gr, {}).items() if names]

    def resources(self) -> list[GroupResource]:
        return [gr for gr, n in self._counts.items() if n]

    # ---------------------------------------------------------------- writes

    def put(self, gr: GroupResource, obj: dict[str, Any]) -> Stored:
        """Create or replace; assigns the next resourceVersion and emits ADDED or MODIFIED."""
        meta = obj["metadata"]
        ns = meta.get("namespace", "") or ""
        name = meta["name"]
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        data = self._data.setdefault(gr, {})
        names = data.setdefault(ns, {})
        prev = names.get(name)
        new = Stored(obj, self.rv)
        names[name] = new
        if prev is None:
            self._counts[gr] = self._counts.get(gr, 0) + 1
            keys = self._sorted.get(gr)
            if keys is not None:
                bisect.insort(keys, (ns, name))
        else:
            old_uid = prev.obj["metadata"].get("uid")
            if old_uid and old_uid != meta.get("uid"):
                self.by_uid.pop(old_uid, None)
        uid = meta.get("uid")
        if uid:
            self.by_uid[uid] = (gr, (ns, name))
        self._emit(WatchEvent(self.rv, "MODIFIED" if prev else "ADDED", gr, (ns, name), new, prev))
        return new

    def remove(self, gr: GroupResource, namespace: str, name: str) -> Stored | None:
        """Delete; the DELETED event carries the last state stamped with the deletion's resourceVersion."""
        names = self._data.get(gr, {}).get(namespace)
        prev = names.pop(name, None) if names is not None else None
        if prev is None:
            return None
        self._counts[gr] -= 1
        keys = self._sorted.get(gr)
        if keys is not None:
            i = bisect.bisect_left(keys, (namespace, name))
            if i < len(keys) and keys[i] == (namespace, name):
                del keys[i]
        self.rv += 1
        last = dict(prev.obj)
        last["metadata"] = dict(last["metadata"], resourceVersion=str(self.rv))
        gone = Stored(last, self.rv)
        uid = last["metadata"].get("uid")
        if uid and self.by_uid.get(uid, (None,))[0] == gr:
            self.by_uid.pop(uid, None)
        self._emit(WatchEvent(self.rv, "DELETED", gr, (namespace, name), gone, prev))
        return gone

    def _emit(self, ev: WatchEvent) -> None:
        self._hist.append(ev)
        self._hist_rvs.append(ev.rv)
        self._trim_history()
        for w in self._watchers.get(ev.gr, ()):
            if w.namespace is None or w.namespace == ev.key[0]:
                w.push(ev)
        for listener in self._listeners:
            listener(ev)
        if self._rv_waiters:
            ready = [f for rv, f in self._rv_waiters if rv <= self.rv]
            self._rv_waiters = [(rv, f) for rv, f in self._rv_waiters if rv > self.rv]
            for f in ready:
                if not f.done():
                    f.set_result(None)

    # ---------------------------------------------------------------- history

    def _trim_history(self) -> None:
        live = len(self._hist) - self._hist_start
        if live > self.history_size:
            drop_to = self._hist_start + (live - self.history_size)
            self.compacted_rv = self._hist[drop_to - 1].rv
            self._hist_start = drop_to
        if self._hist_start > 4096 and self._hist_start * 2 > len(self._hist):
            del self._hist[: self._hist_start]
            del self._hist_rvs[: self._hist_start]
            self._hist_start = 0

    def expire_history(self, now: float | None = None) -> None:
        """Drop events older than history_age (the apiserver's watch cache keeps ~minutes)."""
        cutoff = (now if now is not None else time.monotonic()) - self.history_age
        i = self._hist_start
        while i < len(self._hist) and self._hist[i].time < cutoff:
            i += 1
        if i > self._hist_start:
            self.compacted_rv = self._hist[i - 1].rv
            self._hist_start = i
            self._trim_history()

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to rv (default: everything so far); returns the new compaction point."""
        target = self.rv if rv is None else min(rv, self.rv)
        i = bisect.bisect_right(self._hist_rvs, target, lo=self._hist_start)
        self._hist_start = i
        self.compacted_rv = max(self.compacted_rv, target)
        self._trim_history()
        return self.compacted_rv

    def events_since(self, gr: GroupResource, rv: int, namespace: str | None = None) -> list[WatchEvent]:
        """Events of gr strictly after rv. Caller checks rv >= compacted_rv first."""
        i = bisect.bisect_right(self._hist_rvs, rv, lo=self._hist_start)
        return [e for e in self._hist[i:] if e.gr == gr and (namespace is None or e.key[0] == namespace)]

    def snapshot_at(self, gr: GroupResource, rv: int, namespace: str | None = None) -> list[Stored]:
        """The objects of gr as they were at rv, rebuilt by undoing retained history (for Exact lists)."""
        current: dict[Key, Stored] = {}
        for s in self.iter(gr, namespace):
            m = s.obj["metadata"]
            current[(m.get("namespace", "") or "", m["name"])] = s
        for ev in reversed(self.events_since(gr, rv, namespace)):
            if ev.prev is None:
                current.pop(ev.key, None)
            else:
                current[ev.key] = ev.prev
        return [current[k] for k in sorted(current)]

    # ---------------------------------------------------------------- subscriptions

    def watch(self, gr: GroupResource, namespace: str | None) -> Watcher:
        w = Watcher(gr, namespace, self.watcher_buffer)
        self._watchers.setdefault(gr, set()).add(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        self._watchers.get(w.gr, set()).discard(w)
        w.close()

    def all_watchers(self) -> list[Watcher]:
        return [w for ws in self._watchers.values() for w in ws]

    def add_listener(self, listener: Listener) -> None:
        """Synchronous hook run after every change (the emulator's own controllers use it)."""
        self._listeners.append(listener)

    async def wait_for_rv(self, rv: int, wait_s: float) -> bool:
        if self.rv >= rv:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rv_waiters.append((rv, fut))
        try:
            await asyncio.wait_for(fut, wait_s)
            return True
        except TimeoutError:
            return False

    # ---------------------------------------------------------------- persistence

    def dump(self) -> bytes:
        objs = {f"{g}/{r}": [s.obj for s in self.iter((g, r))] for (g, r) in self.resources()}
        return _encode({"rv": self.rv, "objects": objs})

    def load(self, raw: bytes) -> None:
        """Restore a dump. History starts empty, so watches from older RVs get 410, as after an etcd restore."""
        doc = _decode(raw)
        self._data.clear()
        self._sorted.clear()
        self._counts.clear()
        self.by_uid.clear()
        for grs, items in doc["objects"].items():
            g, _, r = grs.rpartition("/")
            gr = (g, r)
            data = self._data.setdefault(gr, {})
            for obj in items:
                meta = obj["metadata"]
                ns = meta.get("namespace", "") or ""
                data.setdefault(ns, {})[meta["name"]] = Stored(obj, int(meta["resourceVersion"]))
                self._counts[gr] = self._counts.get(gr, 0) + 1
                if meta.get("uid"):
                    self.by_uid[meta["uid"]] = (gr, (ns, meta["name"]))
        self.rv = int(doc["rv"])
        self._hist.clear()
        self._hist_rvs.clear()
        self._hist_start = 0
        self.compacted_rv = self.rv

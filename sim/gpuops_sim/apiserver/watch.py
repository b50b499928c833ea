"""Watch streams: initial events, history replay, selector transitions, bookmarks, timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
from aiohttp import web

from .errors import Cause, StatusError, bad_request, invalid
from .lists import TOO_LARGE_WAIT, parse_rv, selectors
from .protobuf import encode_watch_frame
from .resources import ResourceInfo
from .store import Store, Stored, Watcher, WatchEvent

Frame = Callable[[str, dict[str, Any]], bytes]

_encode = msgspec.json.encode
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def _json_frame(ev_type: str, obj: dict[str, Any]) -> bytes:
    return _encode({"type": ev_type, "object": obj}) + b"\n"


def _status_event(code: int, reason: str, message: str, encode: Frame = _json_frame) -> bytes:
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
              "reason": reason, "code": code}
    return encode("ERROR", status)


def validate_watch_params(params: Mapping[str, str], *, watch_list: bool = True) -> None:
    """ListOptions validation of a watch, as kube-apiserver's (all errors of the request in one 422).

    `watch_list=False` answers like a kube-apiserver with the WatchList feature gate disabled: a watch that
    asks for `sendInitialEvents` (streaming list) is refused with 422 Invalid, cause FieldValueForbidden on
    `sendInitialEvents`, so clients fall back to a paginated list then a plain watch.
    """
    send_initial = params.get("sendInitialEvents")
    rvm = params.get("resourceVersionMatch") or ""
    causes: list[Cause] = []
    if send_initial is not None and send_initial != "":
        if rvm != "NotOlderThan":
            causes.append(Cause(
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                "resourceVersionMatch",  # upstream validation.go reports it on this field
            ))
        if not watch_list:
            causes.append(Cause(
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                "sendInitialEvents",
            ))
    elif rvm:
        causes.append(Cause(
            "FieldValueForbidden",
            "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            "resourceVersionMatch",
        ))
    if causes:
        raise invalid("ListOptions", "meta.k8s.io", "", causes)


class WatchSettings:
    def __init__(self, bookmark_interval: float = 60.0, default_timeout: float = 1800.0,
                 watch_list: bool = True) -> None:
        self.bookmark_interval = bookmark_interval
        self.default_timeout = default_timeout
        self.watch_list = watch_list
        """Streaming lists (`sendInitialEvents`) are served: kube-apiserver's WatchList feature gate. Read on
        every request, so it may be switched while the server runs."""


def _watch_timeout(params: Mapping[str, str], settings: WatchSettings) -> float:
    """timeoutSeconds, or the server's default spread over [1x, 2x) as kube-apiserver spreads it."""
    timeout_s = params.get("timeoutSeconds")
    try:
        timeout = float(timeout_s) if timeout_s else settings.default_timeout * (1 + random.random())
        if timeout != timeout or timeout == float("inf"):
            raise ValueError
    except ValueError:
        raise bad_request(f'timeoutSeconds: Invalid value: "{timeout_s}": must be an integer') from None
    return max(0.0, timeout)


async def _start_rv(store: Store, params: Mapping[str, str]) -> int | None:
    """The resourceVersion the watch starts after (None: now, with the current objects first); one from
    the future is waited for briefly, then refused as too large."""
    rv_s = params.get("resourceVersion") or ""
    if rv_s in ("", "0"):
        return None
    start_rv = parse_rv(rv_s)
    if start_rv > store.rv and not await store.wait_for_rv(start_rv, TOO_LARGE_WAIT):
        raise StatusError(
            504,
            "Timeout",
            f"Too large resource version: {start_rv}, current: {store.rv}",
            causes=[Cause("ResourceVersionTooLarge", "Too large resource version")],
            retry_after=1,
        )
    return start_rv


class _WatchStream:
    """One watch request: which events it sees (its selectors, as transitions) and how they are framed."""

    def __init__(
        self,
        store: Store,
        info: ResourceInfo,
        namespace: str | None,
        params: Mapping[str, str],
        table_row: Callable[[dict[str, Any]], dict[str, Any]] | None,
        protobuf: bool,
    ) -> None:
        self.store = store
        self.info = info
        self.ns = namespace if info.namespaced else None
        self.label_sel, self.field_sel = selectors(info, params)
        self.filtered = not (self.label_sel.empty and self.field_sel.empty)
        self.table_row = table_row
        self.protobuf = protobuf
        self.encode: Frame = encode_watch_frame if protobuf else _json_frame
        # Query booleans decode like upstream's parameter codec (Python clients send "True").
        self.bookmarks = params.get("allowWatchBookmarks", "0").lower() not in ("0", "false")

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        return self.label_sel.matches(obj["metadata"].get("labels")) and self.field_sel.matches(obj)

    def frame(self, ev_type: str, obj: dict[str, Any], ev: WatchEvent | None = None) -> bytes:
        if self.table_row is not None:
            return _json_frame(ev_type, self.table_row(obj))
        if ev is not None and not self.protobuf:
            return ev.line(ev_type)
        return self.encode(ev_type, obj)

    def translate(self, ev: WatchEvent) -> bytes | None:
        """The event as this watch sees it: an object entering the selection is ADDED, one leaving it
        DELETED; None if the watch does not see it at all."""
        if not self.filtered:
            return self.frame(ev.type, ev.new.obj, ev)
        new_m = ev.type != "DELETED" and self.matches(ev.new.obj)
        old_m = ev.prev is not None and self.matches(ev.prev.obj)
        if ev.type == "ADDED":
            return self.frame("ADDED", ev.new.obj, ev) if new_m else None
        if ev.type == "DELETED":
            return self.frame("DELETED", ev.new.obj, ev) if old_m else None
        if new_m and old_m:
            return self.frame("MODIFIED", ev.new.obj, ev)
        if new_m:
            return self.frame("ADDED", ev.new.obj, ev)
        if old_m:
            return self.frame("DELETED", ev.new.obj, ev)
        return None

    def backlog(self, start_rv: int | None, send_initial: bool) -> Iterator[bytes] | None:
        """What the watch sends first: the current objects as ADDED (with no resourceVersion, or a streaming
        list, which ends with a bookmark), else the history since start_rv. None: that history is compacted.

        The current objects are taken here, in the same synchronous step as the subscription, but framed as
        the stream goes: a list of 100,000 pods starts flowing at once instead of after every frame is built,
        as kube-apiserver streams from its watch cache."""
        store, gr = self.store, self.info.storage_key
        if start_rv is None or send_initial:
            items = list(store.iter(gr, self.ns))
            end = (_bookmark(self.info, store.rv, initial_end=True, encode=self.encode)
                   if send_initial and self.bookmarks else None)
            return self._initial(items, end)
        if start_rv < store.compacted_rv:
            return None
        history: list[bytes] = []
        for ev in store.events_since(gr, start_rv, self.ns):
            line = self.translate(ev)
            if line is not None:
                history.append(line)
        return iter(history)

    def _initial(self, items: list[Stored], end: bytes | None) -> Iterator[bytes]:
        """ADDED frames of stored versions (which never change once stored), then the end bookmark if any."""
        framed = self.table_row is not None or self.protobuf
        for s in items:
            if not self.filtered or self.matches(s.obj):
                # Reuse the object's cached encoding: a streaming list of 100k pods must not re-encode them.
                yield self.frame("ADDED", s.obj) if framed else b'{"type":"ADDED","object":' + s.raw + b"}\n"
        if end is not None:
            yield end

    async def follow(
        self, request: web.Request, resp: web.StreamResponse, watcher: Watcher, deadline: float, interval: float
    ) -> bool:
        """Stream the watcher's events until `deadline` (monotonic), with a bookmark every `interval` the
        stream is idle (if asked for). False: the stream was cut, as fault injection drops a watcher."""
        last_bookmark = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= deadline:
                return True
            wait = deadline - now
            if self.bookmarks:
                wait = min(wait, max(0.0, last_bookmark + interval - now))
            if not watcher.events and not watcher.closed:
                watcher.wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watcher.wakeup.wait(), timeout=wait)
            if watcher.events:
                await self._write_pending(resp, watcher)
                continue
            if watcher.closed:
                if watcher.overflowed:
                    return True
                # Dropped by fault injection: cut the connection the way a network failure would.
                if request.transport is not None:
                    request.transport.abort()
                return False
            if self.bookmarks and time.monotonic() - last_bookmark >= interval:
                # Buffer empty: every change up to store.rv has been delivered or filtered out.
                await resp.write(_bookmark(self.info, self.store.rv, encode=self.encode))
                last_bookmark = time.monotonic()

    async def _write_pending(self, resp: web.StreamResponse, watcher: Watcher) -> None:
        """Up to 1024 buffered events in one write."""
        out: list[bytes] = []
        while watcher.events and len(out) < 1024:
            line = self.translate(watcher.events.popleft())
            if line is not None:
                out.append(line)
        if out:
            await resp.write(b"".join(out))


async def serve_watch(
    request: web.Request,
    store: Store,
    info: ResourceInfo,
    namespace: str | None,
    params: Mapping[str, str],
    settings: WatchSettings,
    *,
    table_row: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    content_type: str = "application/json",
    open_streams: set[web.StreamResponse] | None = None,
    protobuf: bool = False,
) -> web.StreamResponse:
    """A watch stream: newline-separated JSON events, or length-prefixed protobuf WatchEvents (`protobuf`)."""
    validate_watch_params(params, watch_list=settings.watch_list)
    stream = _WatchStream(store, info, namespace, params, table_row, protobuf)
    send_initial = params.get("sendInitialEvents", "0").lower() not in ("0", "false")
    timeout = _watch_timeout(params, settings)
    start_rv = await _start_rv(store, params)
    # Subscribe and take the backlog in one synchronous step: nothing can slip between the two.
    watcher: Watcher = store.watch(info.storage_key, stream.ns)
    initial = stream.backlog(start_rv, send_initial)
    resp = web.StreamResponse(status=200, headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
    resp.enable_chunked_encoding()
    try:
        await resp.prepare(request)
        if open_streams is not None:
            open_streams.add(resp)
        if initial is None:
            # As kube-apiserver does: HTTP 200, then one ERROR event carrying a 410 Status.
            message = f"too old resource version: {start_rv} ({store.compacted_rv + 1})"
            await resp.write(_status_event(410, "Expired", message, stream.encode))
            await resp.write_eof()
            return resp
        chunk: list[bytes] = []
        for line in initial:
            chunk.append(line)
            if len(chunk) == 512:
                await resp.write(b"".join(chunk))
                chunk.clear()
        if chunk:
            await resp.write(b"".join(chunk))
        if not await stream.follow(request, resp, watcher, time.monotonic() + timeout, settings.bookmark_interval):
            return resp
        await resp.write_eof()
    except ConnectionError:
        return resp  # the client went away; nothing to tell it
    finally:
        store.unwatch(watcher)
        if open_streams is not None:
            open_streams.discard(resp)
    return resp


def _bookmark(info: ResourceInfo, rv: int, initial_end: bool = False, encode: Frame = _json_frame) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return encode("BOOKMARK", {"kind": info.kind, "apiVersion": info.api_version, "metadata": meta})

"""List semantics: the resourceVersion matrix, snapshots for paging, label and field selectors."""

from __future__ import annotations

import base64
import itertools
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from .errors import Cause, StatusError, bad_request, expired, invalid
from .resources import ResourceInfo
from .selectors import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector
from .store import Store, Stored

TOO_LARGE_WAIT = 3.0


def _list_options_invalid(causes: list[Cause]) -> StatusError:
    return invalid("ListOptions", "meta.k8s.io", "", causes)


def parse_rv(value: str, what: str = "resourceVersion") -> int:
    try:
        rv = int(value)
        if rv < 0:
            raise ValueError
        return rv
    except ValueError:
        raise bad_request(f'{what}: Invalid value: "{value}": invalid resource version') from None


def too_large(rv: int, current: int) -> StatusError:
    return StatusError(
        504,
        "Timeout",
        f"Too large resource version: {rv}, current: {current}",
        causes=[Cause("ResourceVersionTooLarge", "Too large resource version")],
        retry_after=1,
    )


def selectors(info: ResourceInfo, params: Mapping[str, str]) -> tuple[LabelSelector, FieldSelector]:
    return (
        parse_label_selector(params.get("labelSelector", "")),
        parse_field_selector(params.get("fieldSelector", ""), info),
    )


def _list_limit(params: Mapping[str, str]) -> int:
    limit_s = params.get("limit") or "0"
    try:
        return int(limit_s)
    except ValueError:
        raise bad_request(f'limit: Invalid value: "{limit_s}": must be an integer') from None


def _forbidden_match(detail: str) -> StatusError:
    return _list_options_invalid([Cause("FieldValueForbidden", f"Forbidden: {detail}", "resourceVersionMatch")])


def _check_list_options(rv_s: str | None, rvm: str, cont: str) -> None:
    """The combinations of resourceVersion, resourceVersionMatch and continue upstream refuses."""
    if rvm and rvm not in ("Exact", "NotOlderThan"):
        raise _list_options_invalid(
            [
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{rvm}": supported values: "Exact", "NotOlderThan", ""',
                    "resourceVersionMatch",
                )
            ]
        )
    if rvm and not rv_s:
        raise _forbidden_match("resourceVersionMatch is forbidden unless resourceVersion is provided")
    if rvm == "Exact" and rv_s == "0":
        raise _forbidden_match('resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
    if cont and rv_s not in (None, "", "0"):
        raise bad_request("specifying resource version is not allowed when using continue")
    if cont and rvm:
        raise _forbidden_match("resourceVersionMatch is forbidden when continue is provided")


@dataclass
class Page:
    items: list[Stored]
    resource_version: int
    continue_token: str
    remaining: int | None


class _Snapshot:
    __slots__ = ("created", "items", "rv")

    def __init__(self, rv: int, items: list[Stored]) -> None:
        self.rv = rv
        self.items = items
        self.created = time.monotonic()


class Lister:
    """Serves lists; keeps the remainder of paged lists so every page comes from one snapshot."""

    def __init__(self, store: Store, continue_ttl: float = 300.0, max_snapshots: int = 256) -> None:
        self.store = store
        self.continue_ttl = continue_ttl
        self.max_snapshots = max_snapshots
        self._snapshots: OrderedDict[int, _Snapshot] = OrderedDict()
        self._ids = itertools.count(1)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._snapshots:
            sid, snap = next(iter(self._snapshots.items()))
            if now - snap.created > self.continue_ttl or len(self._snapshots) > self.max_snapshots:
                del self._snapshots[sid]
            else:
                break

    async def page(self, info: ResourceInfo, namespace: str | None, params: Mapping[str, str]) -> Page:
        rv_s = params.get("resourceVersion")
        rvm = params.get("resourceVersionMatch") or ""
        limit = _list_limit(params)
        cont = params.get("continue") or ""
        _check_list_options(rv_s, rvm, cont)
        label_sel, field_sel = selectors(info, params)
        unfiltered = label_sel.empty and field_sel.empty
        ns = namespace if info.namespaced else None
        if cont:
            return self._continue(info, ns, cont, limit, label_sel, field_sel, unfiltered)
        at_rv, source = await self._source(info, ns, rv_s, rvm, limit)
        items = self._filter(info, source, label_sel, field_sel)
        return self._page(info, items, at_rv, limit, unfiltered)

    async def _source(
        self, info: ResourceInfo, ns: str | None, rv_s: str | None, rvm: str, limit: int
    ) -> tuple[int, list[Stored]]:
        """The objects the list reads and the resourceVersion they are at: the latest, or (Exact, or a first
        page at a resourceVersion) the store as it was then. A resourceVersion from the future is waited for."""
        store = self.store
        at_rv = store.rv
        exact = False
        if rv_s not in (None, "", "0"):
            assert rv_s is not None
            n = parse_rv(rv_s)
            if n > store.rv and not await store.wait_for_rv(n, TOO_LARGE_WAIT):
                raise too_large(n, store.rv)
            if rvm == "Exact" or (not rvm and limit > 0):
                exact = n < store.rv
                at_rv = n
        if exact:
            if at_rv < store.compacted_rv:
                raise expired("The resourceVersion for the provided list is too old.")
            return at_rv, store.snapshot_at(info.storage_key, at_rv, ns)
        return at_rv, list(store.iter(info.storage_key, ns))

    def _filter(
        self, info: ResourceInfo, source: list[Stored], label_sel: LabelSelector, field_sel: FieldSelector
    ) -> list[Stored]:
        if label_sel.empty and field_sel.empty:
            return source
        out = []
        for s in source:
            meta = s.obj["metadata"]
            if label_sel.matches(meta.get("labels")) and field_sel.matches(s.obj):
                out.append(s)
        return out

    def _page(self, info: ResourceInfo, items: list[Stored], rv: int, limit: int, unfiltered: bool) -> Page:
        if limit <= 0 or len(items) <= limit:
            return Page(items, rv, "", None)
        self._expire()
        sid = next(self._ids)
        rest = items[limit:]
        self._snapshots[sid] = _Snapshot(rv, rest)
        last = items[limit - 1].obj["metadata"]
        token = _encode_token(rv, last.get("namespace", "") or "", last["name"], sid)
        return Page(items[:limit], rv, token, len(rest) if unfiltered else None)

    def _continue(
        self,
        info: ResourceInfo,
        ns: str | None,
        token: str,
        limit: int,
        label_sel: LabelSelector,
        field_sel: FieldSelector,
        unfiltered: bool,
    ) -> Page:
        rv, start_ns, start_name, sid = _decode_token(token)
        self._expire()
        snap = self._snapshots.pop(sid, None)
        if snap is None or snap.rv != rv:
            # The paging snapshot is gone; rebuild from retained history if possible, else 410.
            if rv < self.store.compacted_rv:
                current = self.store.rv
                raise StatusError(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. You can start "
                    "a new list without the continue parameter, or use the continue token in this response to "
                    "retrieve the remainder of the results. Continuing with the provided token results in an "
                    "inconsistent list - objects that were created, modified, or deleted between the time the first "
                    "chunk was returned and now may show up in the list.",
                    headers={"X-Continue": _encode_token(current, start_ns, start_name, 0)},
                )
            source = self.store.snapshot_at(info.storage_key, rv, ns)
            items = [
                s
                for s in self._filter(info, source, label_sel, field_sel)
                if (s.obj["metadata"].get("namespace", "") or "", s.obj["metadata"]["name"])
                > (start_ns, start_name)
            ]
        else:
            items = snap.items
        return self._page(info, items, rv, limit, unfiltered)


def _encode_token(rv: int, ns: str, name: str, sid: int) -> str:
    raw = msgspec.json.encode({"v": "meta.k8s.io/v1", "rv": rv, "start": [ns, name], "sid": sid})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_token(token: str) -> tuple[int, str, str, int]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        doc = msgspec.json.decode(raw)
        return int(doc["rv"]), str(doc["start"][0]), str(doc["start"][1]), int(doc.get("sid", 0))
    except (ValueError, KeyError, TypeError, IndexError, msgspec.DecodeError):
        raise bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        ) from None

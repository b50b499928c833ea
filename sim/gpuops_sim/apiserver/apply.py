"""Server-side apply and managedFields, after sigs.k8s.io/structured-merge-diff and the
apiserver's fieldmanager wrappers.

Field sets are Python sets of paths (see fieldsv1.py); an update edits the stored FieldsV1 of the managers
it touches in place of decoding and re-encoding them (fieldsv1.without / fieldsv1.with_paths).

What the fieldmanager wrappers add is reproduced: managedFields of the request/live object
(a request `managedFields: [{}]` resets them), the "before-first-apply" manager for objects that had no
managedFields, timestamps only when a manager's write changed the object, at most 10 Update managers
(older ones merge into "ancient-changes"), metadata fields nobody owns, and kubectl's client-side to
server-side apply hand-over through the last-applied annotation.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from . import fieldsv1
from . import schema as structural
from .builtin_schemas import kind_schema
from .errors import Cause, StatusError, bad_request
from .fieldsv1 import DecodeError as _DecodeError
from .fieldsv1 import (
    Path,
    PathElement,
    _canon,
    _go_json,
    _iterate,
    _pe_str,
    _trie,
    fields_to_set,
    path_string,
    set_to_fields,
)
from .patch import builtin_always_present, builtin_ssa_shape, is_builtin_kind, json_equal
from .store import clone

LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
BEFORE_FIRST_APPLY = "before-first-apply"
ANCIENT_CHANGES = "ancient-changes"
MAX_UPDATE_MANAGERS = 10

ListKeys = Callable[[tuple[str, ...]], tuple[str, str | tuple[str, ...] | None]]

_M: Any = object()  # a value that is absent (not JSON null)

# Fields no manager ever owns (fieldmanager's stripMetaManager).
_STRIP: frozenset[Path] = frozenset(
    [(("f", "apiVersion"),), (("f", "kind"),), (("f", "metadata"),)]
    + [
        (("f", "metadata"), ("f", name))
        for name in (
            "name",
            "namespace",
            "creationTimestamp",
            "selfLink",
            "uid",
            "clusterName",
            "generation",
            "managedFields",
            "resourceVersion",
        )
    ]
)

# Defaults of list-map key fields (SMD uses schema defaults when an item omits a key).
_BUILTIN_KEY_DEFAULTS = {"protocol": "TCP"}


class ApplyResult(NamedTuple):
    obj: dict[str, Any]  # the new object, metadata.managedFields updated


class _TypedError(Exception):
    """The applied configuration does not fit its schema (duplicate or keyless list-map items)."""


# --------------------------------------------------------------------------------------- schema


class SchemaHints:
    """`list_keys` for a custom resource, read from its structural schema: x-kubernetes-list-type and
    -list-map-keys for lists, x-kubernetes-map-type for maps and list items."""

    def __init__(self, schema: dict[str, Any] | None) -> None:
        self.schema = schema or {}

    def _at(self, path: tuple[str, ...]) -> dict[str, Any] | None:
        node: Any = self.schema
        for name in path:
            while isinstance(node, dict) and isinstance(node.get("items"), dict):
                node = node["items"]
            if not isinstance(node, dict):
                return None
            props = node.get("properties")
            if isinstance(props, dict) and isinstance(props.get(name), dict):
                node = props[name]
            elif isinstance(node.get("additionalProperties"), dict):
                node = node["additionalProperties"]
            else:
                return None
        return node if isinstance(node, dict) else None

    def __call__(self, path: tuple[str, ...]) -> tuple[str, tuple[str, ...] | None]:
        node = self._at(path) or {}
        kind = node.get("x-kubernetes-list-type")
        if kind == "map":
            keys = node.get("x-kubernetes-list-map-keys")
            return "map", tuple(k for k in keys if isinstance(k, str)) if isinstance(keys, list) else None
        if kind == "set":
            return "set", None
        return "atomic", None

    def map_atomic(self, path: tuple[str, ...]) -> bool:
        node = self._at(path) or {}
        return node.get("x-kubernetes-map-type") == "atomic"

    def item_atomic(self, path: tuple[str, ...]) -> bool:
        items = (self._at(path) or {}).get("items")
        return isinstance(items, dict) and items.get("x-kubernetes-map-type") == "atomic"

    def named_field(self, path: tuple[str, ...], name: str) -> bool:
        """Whether `name` is a declared property of the object at `path`. A field set lists a declared property
        only when its value is empty, but a key of a map (additionalProperties, a free-form object) always, so
        that the key is pruned, kept or conflicted on as one item. Without a schema every field counts as
        declared."""
        if not self.schema:
            return True
        node = self._at(path) if path else self.schema
        while isinstance(node, dict) and isinstance(node.get("items"), dict):
            node = node["items"]
        props = node.get("properties") if isinstance(node, dict) else None
        return isinstance(props, dict) and name in props

    def key_defaults(self, path: tuple[str, ...]) -> dict[str, Any]:
        """Schema defaults of list-map key fields: an item that omits a key gets its default."""
        items = (self._at(path) or {}).get("items")
        props = items.get("properties") if isinstance(items, dict) else None
        if not isinstance(props, dict):
            return {}
        return {k: p["default"] for k, p in props.items() if isinstance(p, dict) and "default" in p}


class _Shape(NamedTuple):
    rel: str  # "map" | "set" | "atomic"
    keys: tuple[str, ...]
    item_atomic: bool
    key_defaults: dict[str, Any]


_ATOMIC = _Shape("atomic", (), False, {})


class _Schema:
    """What SMD would read from the type: list types, atomic maps, and non-pointer structs."""

    def __init__(self, group: str, kind: str, list_keys: ListKeys | None) -> None:
        self.group = group
        self.kind = kind
        self.list_keys = list_keys
        self.builtin = list_keys is None and is_builtin_kind(group, kind)

    def list_shape(self, names: tuple[str, ...]) -> _Shape:
        if self.builtin:
            s = builtin_ssa_shape(self.group, self.kind, names)
            if s is None or s[0] not in ("map", "set"):
                return _ATOMIC
            return _Shape(*s, _BUILTIN_KEY_DEFAULTS)
        if self.list_keys is None:
            return _ATOMIC
        rel, key = self.list_keys(names)
        keys = (key,) if isinstance(key, str) else tuple(key or ())
        if rel == "map" and keys:
            item_atomic = getattr(self.list_keys, "item_atomic", None)
            defaults = getattr(self.list_keys, "key_defaults", None)
            return _Shape(
                "map",
                keys,
                bool(item_atomic(names)) if callable(item_atomic) else False,
                dict(defaults(names)) if callable(defaults) else {},
            )
        if rel == "set":
            return _Shape("set", (), False, {})
        return _ATOMIC

    def map_atomic(self, names: tuple[str, ...]) -> bool:
        if not names:
            return False
        if self.builtin:
            s = builtin_ssa_shape(self.group, self.kind, names)
            return s is not None and s[0] == "atomic"
        fn = getattr(self.list_keys, "map_atomic", None)
        return bool(fn(names)) if callable(fn) else False

    def named_field(self, names: tuple[str, ...], name: str) -> bool:
        """Whether `name` under `names` is a declared field rather than a map key. The object's own top-level
        fields and ObjectMeta's are declared whatever a CRD schema spells out; built-in maps hold scalars,
        whose keys are members either way."""
        if self.builtin or (not names and name in ("apiVersion", "kind", "metadata")) or names[:1] == ("metadata",):
            return True
        fn = getattr(self.list_keys, "named_field", None)
        return bool(fn(names, name)) if callable(fn) else True

    def skeleton(self, v: Any, names: tuple[str, ...] = ()) -> Any:
        """`v` with the empty structs a typed built-in object always carries (comparison only)."""
        if not self.builtin or not isinstance(v, dict):
            return v
        out = dict(v)
        for name, zero in builtin_always_present(self.group, self.kind, names):
            if name not in out:
                out[name] = copy.copy(zero)
        for k, cv in out.items():
            if isinstance(cv, dict):
                out[k] = self.skeleton(cv, (*names, k))
            elif isinstance(cv, list):
                out[k] = [self.skeleton(x, (*names, k)) for x in cv]
        return out


# ---------------------------------------------------------------------------------------- walks


class _Compare(NamedTuple):
    added: set[Path]
    modified: set[Path]
    removed: set[Path]


class _Walker:
    """ToFieldSet, Compare, Merge and RemoveItems of structured-merge-diff over plain JSON."""

    def __init__(self, schema: _Schema) -> None:
        self.schema = schema

    # -- list items ---------------------------------------------------------------------------

    def item_pes(self, items: list[Any], shape: _Shape, path: Path, strict: bool) -> list[PathElement]:
        pes: list[PathElement] = []
        for i, item in enumerate(items):
            if shape.rel == "set":
                pes.append(("v", _canon(item)))
                continue
            if not isinstance(item, dict):
                if strict:
                    raise _TypedError(f"{path_string(path)}: element {i}: expected map, got {_canon(item)}")
                pes.append(("i", i))
                continue
            key: list[tuple[str, str]] = []
            for name in shape.keys:
                if name in item:
                    key.append((name, _canon(item[name])))
                elif name in shape.key_defaults:
                    key.append((name, _canon(shape.key_defaults[name])))
                elif strict:
                    raise _TypedError(
                        f"{path_string(path)}: element {i}: associative list with keys has an element that "
                        f'omits key field "{name}" (and doesn\'t have default value)'
                    )
            pes.append(("k", tuple(sorted(key))) if key else ("i", i))
        if strict:
            seen: set[PathElement] = set()
            for pe in pes:
                if pe in seen:
                    raise _TypedError(f"{path_string(path)}: duplicate entries for key {_pe_str(pe)}")
                seen.add(pe)
        return pes

    # -- ToFieldSet ---------------------------------------------------------------------------

    def field_set(self, v: Any, strict: bool) -> set[Path]:
        out: set[Path] = set()
        self._fs(v, (), (), False, out, strict)
        return out

    def _fs(
        self, v: Any, path: Path, names: tuple[str, ...], item: bool, out: set[Path], strict: bool
    ) -> None:
        if isinstance(v, dict):
            if path and not item and self.schema.map_atomic(names):
                out.add(path)
                return
            for k, cv in v.items():
                cp = (*path, ("f", k))
                self._fs(cv, cp, (*names, k), False, out, strict)
                if cv is None or (isinstance(cv, dict) and not cv) or not self.schema.named_field(names, k):
                    out.add(cp)
        elif isinstance(v, list):
            shape = self.schema.list_shape(names)
            if shape.rel == "atomic":
                out.add(path)
                return
            pes = self.item_pes(v, shape, path, strict)
            counts: dict[PathElement, int] = {}
            for pe in pes:
                counts[pe] = counts.get(pe, 0) + 1
            for child, pe in zip(v, pes, strict=True):
                ip = (*path, pe)
                granular = shape.rel == "map" and not shape.item_atomic
                if counts[pe] == 1 and isinstance(child, dict) and granular:
                    self._fs(child, ip, names, True, out, strict)
                out.add(ip)
        elif path:
            out.add(path)

    # -- Compare ------------------------------------------------------------------------------

    def compare(self, lhs: Any, rhs: Any) -> _Compare:
        c = _Compare(set(), set(), set())
        self._cmp(lhs, rhs, (), (), False, c)
        return c

    @staticmethod
    def _leaf(lhs: Any, rhs: Any, path: Path, c: _Compare) -> None:
        if not path:
            return
        if lhs is _M:
            c.added.add(path)
        elif rhs is _M:
            c.removed.add(path)
        elif not json_equal(lhs, rhs):
            c.modified.add(path)

    def _cmp(self, lhs: Any, rhs: Any, path: Path, names: tuple[str, ...], item: bool, c: _Compare) -> None:
        if _same(lhs, rhs):
            return  # equal values compare to nothing: a write's unchanged parts are not walked
        lk, rk = _kind(lhs), _kind(rhs)
        orig_l, orig_r = lhs, rhs
        if lk != rk and "missing" not in (lk, rk):
            if lhs is None and rk != "scalar":
                lhs, lk = ({} if rk == "map" else []), rk
            elif rhs is None and lk != "scalar":
                rhs, rk = ({} if lk == "map" else []), lk
            else:
                if path:
                    c.modified.add(path)
                if lk != "scalar":
                    self._cmp(lhs, _M, path, names, item, _Compare(set(), set(), c.removed))
                if rk != "scalar":
                    self._cmp(_M, rhs, path, names, item, _Compare(c.added, set(), set()))
                c.added.discard(path)
                c.removed.discard(path)
                return
        kind = rk if lk == "missing" else lk
        if kind == "scalar":
            self._leaf(lhs, rhs, path, c)
            return
        # Both sides empty or null: a leaf, so that {} and null stay distinct.
        empty = (orig_l is _M or not orig_l) and (orig_r is _M or not orig_r)
        if kind == "map":
            if empty or (path and not item and self.schema.map_atomic(names)):
                self._leaf(orig_l, orig_r, path, c)
                return
            lm = lhs if lhs is not _M else {}
            rm = rhs if rhs is not _M else {}
            for k in [*lm, *(k for k in rm if k not in lm)]:
                self._cmp(lm.get(k, _M), rm.get(k, _M), (*path, ("f", k)), (*names, k), False, c)
        else:
            shape = self.schema.list_shape(names)
            if empty or shape.rel == "atomic":
                self._leaf(orig_l, orig_r, path, c)
                return
            self._cmp_items(lhs if lhs is not _M else [], rhs if rhs is not _M else [], path, names, shape, c)
        if path:
            if lhs is _M:
                c.added.add(path)
            elif rhs is _M:
                c.removed.add(path)

    def _cmp_items(
        self, lhs: list[Any], rhs: list[Any], path: Path, names: tuple[str, ...], shape: _Shape, c: _Compare
    ) -> None:
        lv: dict[PathElement, list[Any]] = {}
        rv: dict[PathElement, list[Any]] = {}
        order: list[PathElement] = []
        for item, pe in zip(lhs, self.item_pes(lhs, shape, path, False), strict=True):
            if pe not in lv:
                order.append(pe)
            lv.setdefault(pe, []).append(item)
        for item, pe in zip(rhs, self.item_pes(rhs, shape, path, False), strict=True):
            if pe not in rv and pe not in lv:
                order.append(pe)
            rv.setdefault(pe, []).append(item)
        atomic = shape.rel == "set" or shape.item_atomic
        for pe in order:
            ll, rl = lv.get(pe, []), rv.get(pe, [])
            ip = (*path, pe)

            def one(a: Any, b: Any, ip: Path = ip) -> None:
                if atomic:
                    self._leaf(a, b, ip, c)
                else:
                    self._cmp(a, b, ip, names, True, c)

            if len(ll) <= 1 and len(rl) <= 1:
                one(ll[0] if ll else _M, rl[0] if rl else _M)
            elif len(ll) >= 2 and len(rl) >= 2:
                if not json_equal(ll, rl):
                    c.modified.add(ip)
            elif len(ll) >= 2:
                if rl:
                    one(_M, rl[0])
                c.removed.add(ip)
            else:
                if ll:
                    one(ll[0], _M)
                c.added.add(ip)

    # -- Merge --------------------------------------------------------------------------------

    def merge(self, lhs: Any, rhs: Any) -> Any:
        return self._merge(lhs, rhs, (), False)

    def _merge(self, lhs: Any, rhs: Any, names: tuple[str, ...], item: bool) -> Any:
        if rhs is _M:
            return lhs
        if lhs is _M:
            return clone(rhs)
        if isinstance(lhs, dict) and isinstance(rhs, dict):
            if (not lhs and not rhs) or (names and not item and self.schema.map_atomic(names)):
                return clone(rhs)
            out = {k: self._merge(v, rhs.get(k, _M), (*names, k), False) for k, v in lhs.items()}
            for k, v in rhs.items():
                if k not in lhs:
                    out[k] = clone(v)
            return out
        if isinstance(lhs, list) and isinstance(rhs, list):
            shape = self.schema.list_shape(names)
            if (not lhs and not rhs) or shape.rel == "atomic":
                return clone(rhs)
            return self._merge_items(lhs, rhs, names, shape)
        return clone(rhs)

    def _merge_items(
        self, lhs: list[Any], rhs: list[Any], names: tuple[str, ...], shape: _Shape
    ) -> list[Any]:
        """SMD's list merge: the applied order for shared items, live-only items kept in place."""
        atomic = shape.rel == "set" or shape.item_atomic

        def one(a: Any, b: Any) -> Any:
            if atomic:
                return clone(b) if b is not _M else a
            return self._merge(a, b, names, True)

        r_pes = self.item_pes(rhs, shape, (), False)
        l_pes = self.item_pes(lhs, shape, (), False)
        seen_r: dict[PathElement, Any] = dict(zip(r_pes, rhs, strict=True))
        seen_l: dict[PathElement, Any] = {}
        for pe, v in zip(l_pes, lhs, strict=True):
            seen_l[pe] = _M if pe in seen_l else v  # duplicated live items do not merge
        shared = [pe for pe in r_pes if pe in seen_l]
        next_shared = shared.pop(0) if shared else None
        merged_r: set[PathElement] = set()
        out: list[Any] = []
        li = ri = 0
        while li < len(l_pes) or ri < len(r_pes):
            if li < len(l_pes) and ri < len(r_pes):
                pe = l_pes[li]
                if pe == r_pes[ri]:
                    merged_r.add(pe)
                    out.append(one(seen_l[pe], seen_r[pe]))
                    li += 1
                    ri += 1
                    next_shared = shared.pop(0) if shared else None
                    continue
                if pe in seen_r and next_shared is not None and next_shared != pe:
                    li += 1
                    continue
            if li < len(l_pes):
                pe = l_pes[li]
                if pe not in seen_r:
                    out.append(lhs[li])
                    li += 1
                    continue
                if pe in merged_r:
                    li += 1
            if ri < len(r_pes):
                pe = r_pes[ri]
                merged_r.add(pe)
                out.append(one(seen_l.get(pe, _M), seen_r[pe]))
                ri += 1
                if next_shared is not None and next_shared == pe:
                    next_shared = shared.pop(0) if shared else None
        return out

    # -- RemoveItems --------------------------------------------------------------------------

    def remove(self, v: Any, paths: set[Path], owned: set[Path] | frozenset[Path] = frozenset()) -> Any:
        """`v` without the members of `paths`. A map or list the removal empties goes too, as upstream's null
        does once the object is stored, unless it is itself a member of `owned`: then it stays, empty, for
        its owner (upstream keeps it as null, which this emulator never stores)."""
        if not paths:
            return v
        out = self._remove(v, _trie(paths), (), (), False, owned)
        return {} if out is _M else out

    def _remove(
        self,
        v: Any,
        node: dict[PathElement, list[Any]],
        path: Path,
        names: tuple[str, ...],
        item: bool,
        owned: set[Path] | frozenset[Path],
    ) -> Any:
        """`v` without the members of `node`; _M when removal emptied a map or list nobody owns."""
        if isinstance(v, dict):
            if names and not item and self.schema.map_atomic(names):
                return v
            out: dict[str, Any] = {}
            for k, cv in v.items():
                entry = node.get(("f", k))
                if entry is None:
                    out[k] = cv
                elif not entry[0]:
                    nv = self._remove(cv, entry[1], (*path, ("f", k)), (*names, k), False, owned)
                    if nv is not _M:
                        out[k] = nv
            return out if out or not v or path in owned else _M
        if isinstance(v, list):
            shape = self.schema.list_shape(names)
            if shape.rel == "atomic":
                return v
            items: list[Any] = []
            for child, pe in zip(v, self.item_pes(v, shape, (), False), strict=True):
                entry = node.get(pe)
                if entry is None:
                    items.append(child)
                elif not entry[0]:
                    nv = self._remove(child, entry[1], (*path, pe), names, True, owned)
                    items.append({} if nv is _M else nv)
            return items if items or not v or path in owned else _M
        return v


def _same(a: Any, b: Any) -> bool:
    """Certainly equal JSON values (False may still be equal): the same object, or maps or lists that are equal
    and encode alike (Python's == alone takes True for 1)."""
    if a is b:
        return a is not _M
    if type(a) is not type(b) or type(a) not in (dict, list) or a != b:
        return False
    try:
        return msgspec.json.encode(a) == msgspec.json.encode(b)
    except (TypeError, msgspec.EncodeError):
        return False


def _kind(v: Any) -> str:
    if v is _M:
        return "missing"
    if isinstance(v, dict):
        return "map"
    if isinstance(v, list):
        return "list"
    return "scalar"


# ------------------------------------------------------------------------------- managed fields

Identity = tuple[str, str, str, str]  # manager, operation, apiVersion (Update only), subresource


class _Entry:
    """One manager's field set. `raw` is the stored FieldsV1 the entry came from, or its edit, while it still
    says what the set does: re-encoding an unchanged entry (every other manager's, on each write) would cost as
    much as the rest of the write. The set itself is decoded from `raw` only when asked for."""

    __slots__ = ("_fields", "api_version", "raw", "time")

    def __init__(self, fields: set[Path] | None, api_version: str, time: str | None, raw: Any = None) -> None:
        self._fields = fields
        self.api_version = api_version
        self.time = time
        self.raw = raw

    @property
    def fields(self) -> set[Path]:
        if self._fields is None:
            self._fields = fields_to_set(self.raw or {})
        return self._fields

    @fields.setter
    def fields(self, value: set[Path]) -> None:
        self._fields = value

    def empty(self) -> bool:
        return not self._fields if self._fields is not None else not self.raw


def _identity(manager: str, operation: str, api_version: str, subresource: str) -> Identity:
    return (manager, operation, "" if operation == "Apply" else api_version, subresource)


def _decode(managed: Any, keep_raw: bool = False, lazy: bool = False) -> dict[Identity, _Entry]:
    """`keep_raw` only for stored managedFields, which we encoded ourselves (canonical); `lazy` leaves their
    field sets undecoded (see _Entry)."""
    out: dict[Identity, _Entry] = {}
    if managed is None:
        return out
    if not isinstance(managed, list):
        raise _DecodeError("managedFields must be a list")
    for e in managed:
        if not isinstance(e, dict):
            raise _DecodeError("managedFields entries must be objects")
        raw = e.get("fieldsV1") or {}
        if lazy and not isinstance(raw, dict):
            raise _DecodeError("FieldsV1 nodes must be objects")
        fields = None if lazy else fields_to_set(raw)
        op = str(e.get("operation") or "")
        av = str(e.get("apiVersion") or "")
        ident = _identity(str(e.get("manager") or ""), op, av, str(e.get("subresource") or ""))
        t = e.get("time")
        out[ident] = _Entry(fields, av, t if isinstance(t, str) else None, raw if lazy else
                            e.get("fieldsV1") if keep_raw else None)
    return out


def _seconds(t: str | None) -> float:
    if not t:
        return 0.0
    try:
        return int(datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0.0


def _encode(managers: dict[Identity, _Entry]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for (manager, op, _, sub), e in managers.items():
        d: dict[str, Any] = {"manager": manager, "operation": op, "apiVersion": e.api_version}
        if e.time is not None:
            d["time"] = e.time
        d["fieldsType"] = "FieldsV1"
        d["fieldsV1"] = e.raw if e.raw is not None else set_to_fields(e.fields)
        if sub:
            d["subresource"] = sub
        entries.append(d)
    entries.sort(
        key=lambda d: (
            d["operation"],
            _seconds(d.get("time")),
            d["manager"],
            d["apiVersion"],
            d.get("subresource", ""),
        )
    )
    return entries


def _finish(obj: dict[str, Any], managers: dict[Identity, _Entry]) -> dict[str, Any]:
    for ident in [i for i, e in managers.items() if e.empty()]:
        del managers[ident]
    meta = obj.setdefault("metadata", {})
    if managers:
        meta["managedFields"] = _encode(managers)
    else:
        meta.pop("managedFields", None)
    return obj


def _cap_updaters(managers: dict[Identity, _Entry]) -> None:
    """At most MAX_UPDATE_MANAGERS Update entries; the oldest merge into "ancient-changes" per version."""
    updaters = [i for i in managers if i[1] != "Apply"]
    if len(updaters) <= MAX_UPDATE_MANAGERS:
        return
    updaters.sort(key=lambda i: (_seconds(managers[i].time), json.dumps(list(i))))
    first: dict[str, Identity] = {}
    length = len(updaters)
    for ident in updaters:
        if length <= MAX_UPDATE_MANAGERS:
            break
        e = managers[ident]
        bucket = _identity(ANCIENT_CHANGES, "Update", e.api_version, "")
        if e.api_version in first:
            if bucket not in managers:
                managers[bucket] = managers.pop(first[e.api_version])
            managers[bucket] = _Entry(e.fields | managers[bucket].fields, e.api_version, e.time)
            del managers[ident]
            length -= 1
        else:
            first[e.api_version] = ident


def strip_managed_fields(obj: Any) -> Any:
    """A deep copy of `obj` without metadata.managedFields."""
    out = clone(obj)
    if isinstance(out, dict) and isinstance(out.get("metadata"), dict):
        out["metadata"].pop("managedFields", None)
    return out


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _drop_nulls(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_nulls(x) for x in v]
    return v


# ---------------------------------------------------------------------------------------- update


def _changed_parts(old: dict[str, Any] | None, new: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The top-level parts that differ (managedFields aside): parts equal on both sides add nothing to the
    comparison, and a status write would otherwise walk the whole spec every time. Read-only views."""
    if old is None:
        return {}, {k: v for k, v in new.items() if k != "metadata"} | {"metadata": _sans_mf(new.get("metadata"))}
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    for k in {*old, *new}:
        if k == "metadata":
            mo, mn = _sans_mf(old.get(k)), _sans_mf(new.get(k))
            if mo != mn:
                before[k], after[k] = mo, mn
            continue
        if k not in new:
            before[k] = old[k]
        elif k not in old:
            after[k] = new[k]
        elif old[k] != new[k] or type(old[k]) is not type(new[k]):
            before[k], after[k] = old[k], new[k]
    return before, after


_CREATED_PARTS_MAX = 5_000
_created_parts: dict[tuple[str, str, str, bytes], _Compare] = {}
"""What a top-level part of a new built-in object adds, by group, kind, part and the part's encoding."""


def _created(schema: _Schema, after: dict[str, Any]) -> _Compare:
    """The comparison of a new object with nothing, one top-level part at a time (a part's paths do not depend
    on the others); a built-in part's is remembered by its encoding, so the pods of one template walk their
    shared spec once. Custom resources (whose shapes come from a CRD that may change) are walked whole."""
    if not schema.builtin:
        return _Walker(schema).compare(schema.skeleton({}), schema.skeleton(after))
    c = _Compare(set(), set(), set())
    empty = schema.skeleton({})
    for k, v in after.items():
        try:
            key: tuple[str, str, str, bytes] | None = (schema.group, schema.kind, k, msgspec.json.encode(v))
        except (OverflowError, TypeError, ValueError):
            key = None
        part = _created_parts.get(key) if key is not None else None
        if part is None:
            part = _Walker(schema).compare(empty, schema.skeleton({k: v}))
            if key is not None:
                if len(_created_parts) >= _CREATED_PARTS_MAX:
                    _created_parts.clear()
                _created_parts[key] = part
        c.added.update(part.added)
        c.modified.update(part.modified)
        c.removed.update(part.removed)
    return c


def _sans_mf(meta: Any) -> Any:
    if isinstance(meta, dict) and "managedFields" in meta:
        return {k: v for k, v in meta.items() if k != "managedFields"}
    return meta


def _stored_managers(requested: Any, live: Any, subresource: str) -> dict[Identity, _Entry] | None:
    """The live object's managers, undecoded, when the write keeps them as they are stored: a subresource
    write, or a request that sends none or the live ones back (a read-modify-write). None otherwise."""
    if not (subresource or requested is None or requested == [] or requested == live):
        return None
    try:
        return _decode(live, keep_raw=True, lazy=True)
    except _DecodeError:
        return None


def _edit_stored(
    managers: dict[Identity, _Entry], c: _Compare, ident: Identity, api_version: str, now: str
) -> dict[Identity, _Entry]:
    """The managers after a write that changed `c`, the stored FieldsV1 edited: everyone loses what the write
    changed or removed and its manager gains what it changed. Fresh entries: the given ones are left as they were."""
    changed = c.added | c.modified
    gone = fieldsv1.trie(changed | c.removed)
    out: dict[Identity, _Entry] = {}
    for i, e in managers.items():
        raw = fieldsv1.without(e.raw, gone)
        if raw:
            out[i] = _Entry(None, e.api_version, e.time, raw)
    mine = changed - _STRIP
    if mine:
        prev = out.get(ident)
        raw = fieldsv1.with_paths(prev.raw, fieldsv1.trie(mine)) if prev else set_to_fields(mine)
        out[ident] = _Entry(None, api_version, now, raw)
    return out


def _recompute(
    managers: dict[Identity, _Entry], c: _Compare, ident: Identity, api_version: str, now: str
) -> dict[Identity, _Entry]:
    """_edit_stored on decoded field sets (managers the request sent)."""
    changed = c.added | c.modified
    for e in managers.values():
        had = len(e.fields)
        e.fields -= changed
        e.fields -= c.removed
        if len(e.fields) != had:
            e.raw = None
    mine = changed - _STRIP
    if mine:
        prev = managers.get(ident)
        managers[ident] = _Entry(mine | (prev.fields if prev else set()), api_version, now)
    for i in [i for i, e in managers.items() if not e.fields]:
        del managers[i]
    return managers


def _requested_managers(requested: Any, live: Any, subresource: str) -> dict[Identity, _Entry]:
    """The managers a request sent (`managedFields: [{}]` resets them), else the live ones; a subresource
    write keeps the live ones whatever it sends."""
    try:
        if subresource:
            return _decode(live, keep_raw=True)
        if isinstance(requested, list) and len(requested) == 1 and requested[0] == {}:
            return {}
        try:
            managers = _decode(requested)
        except _DecodeError:
            managers = {}
        return managers or _decode(live, keep_raw=True)
    except _DecodeError:
        return {}


def update_managed_fields(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    *,
    manager: str,
    operation: str,
    api_version: str,
    now: str,
    subresource: str = "",
    list_keys: ListKeys | None = None,
) -> dict[str, Any]:
    """managedFields after a create/update/patch by `manager` (old None = create): it gets the fields it
    set or changed, which other managers lose, and everyone loses the fields it removed."""
    obj = dict(new)  # only the metadata changes: the rest is shared with `new`
    meta = obj["metadata"] = dict(obj.get("metadata") or {})
    requested = meta.pop("managedFields", None)
    live = (old or {}).get("metadata", {}).get("managedFields") if isinstance(old, dict) else None
    stored = _stored_managers(requested, live, subresource)
    managers = stored if stored is not None else _requested_managers(requested, live, subresource)
    if not managers and old is not None:
        return obj  # objects without managedFields stay untracked until an apply
    schema = _Schema(_group(api_version), str(obj.get("kind") or (old or {}).get("kind") or ""), list_keys)
    before_obj, after_obj = _changed_parts(old, obj)
    if old is None:
        c = _created(schema, after_obj)
    else:
        c = _Walker(schema).compare(schema.skeleton(before_obj), schema.skeleton(after_obj))
    ident = _identity(manager, operation, api_version, subresource)
    try:
        if stored is None:
            raise _DecodeError("the request's own managedFields")
        managers = _edit_stored(stored, c, ident, api_version, now)
    except _DecodeError:
        if stored is not None:  # stored FieldsV1 the emulator did not write: decoded as a request's
            managers = _requested_managers(requested, live, subresource)
            if not managers and old is not None:
                return obj
        managers = _recompute(managers, c, ident, api_version, now)
    _cap_updaters(managers)
    return _finish(obj, managers)


# ----------------------------------------------------------------------------------------- apply


def _gvk_string(api_version: Any, kind: Any) -> str:
    av = str(api_version or "")
    group, _, version = av.rpartition("/")
    return f"{group}/{version}, Kind={kind or ''}"


def _print_manager(ident: Identity) -> str:
    manager, op, api_version, sub = ident
    out = json.dumps(manager, ensure_ascii=False)
    if sub:
        out += f" with subresource {json.dumps(sub, ensure_ascii=False)}"
    if op == "Update":
        out += f" using {api_version}"
    return out


def _conflict_error(conflicts: dict[Identity, set[Path]]) -> StatusError:
    ordered = sorted(conflicts)
    pairs = [(ident, p) for ident in ordered for p in _iterate(conflicts[ident])]
    causes = [
        Cause("FieldManagerConflict", f"conflict with {_print_manager(i)}", path_string(p)) for i, p in pairs
    ]
    if len(pairs) == 1:
        ident, p = pairs[0]
        msg = f"Apply failed with 1 conflict: conflict with {_print_manager(ident)}: {path_string(p)}"
    else:
        lines = []
        for ident in ordered:
            lines.append(f"conflicts with {_print_manager(ident)}:")
            lines.extend(f"- {path_string(p)}" for p in _iterate(conflicts[ident]))
        msg = f"Apply failed with {len(pairs)} conflicts: " + "\n".join(lines)
    return StatusError(409, "Conflict", msg, causes=causes)


def _allowed_by_last_applied(walker: _Walker, live: dict[str, Any], api_version: str) -> set[Path]:
    """Fields kubectl's client-side apply last set to their current values: `kubectl apply
    --server-side` may take them over from kubectl-client-side-apply without a conflict."""
    raw = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED_ANNOTATION)
    if not isinstance(raw, str) or not raw:
        return set()
    try:
        last = json.loads(raw)
    except ValueError:
        return set()
    if not isinstance(last, dict) or last.get("apiVersion") != api_version:
        return set()
    try:
        fields = walker.field_set(last, True)
    except _TypedError:
        return set()
    c = walker.compare(walker.schema.skeleton(last), walker.schema.skeleton(live))
    return fields - c.modified - c.added - c.removed


def _set_last_applied(obj: dict[str, Any], config: dict[str, Any]) -> None:
    annotations = (obj.get("metadata") or {}).get("annotations")
    if not isinstance(annotations, dict) or not annotations.get(LAST_APPLIED_ANNOTATION):
        return
    cfg = clone(config)
    cann = (cfg.get("metadata") or {}).get("annotations")
    if isinstance(cann, dict):
        cann.pop(LAST_APPLIED_ANNOTATION, None)
    annotations[LAST_APPLIED_ANNOTATION] = _go_json(cfg) + "\n"


def _drop_paths(obj: dict[str, Any], paths: Iterable[tuple[str, ...]]) -> dict[str, Any]:
    out = clone(obj)
    for names in paths:
        node: Any = out
        for name in names[:-1]:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict) and names:
            node.pop(names[-1], None)
    return out


def _with_named_ancestors(schema: _Schema, paths: set[Path]) -> set[Path]:
    """`paths` and the declared fields above them: whoever owns a field inside a struct owns the struct too
    when pruning is decided (upstream's EnsureNamedFieldsAreMembers). So an applier that once applied a struct
    empty (`spec: {}`) and now leaves it out does not prune what others, or its own new configuration, set
    inside; and a struct the applier leaves that nobody else holds goes as a whole, unowned fields in it
    too. A map key or a list item is not held this way: an item goes with its last owner, whatever others
    own inside it."""
    out = set(paths)
    for p in paths:
        for i in range(1, len(p)):
            kind, name = p[i - 1]
            names = tuple(v for k, v in p[: i - 1] if k == "f")
            if kind == "f" and schema.named_field(names, name):
                out.add(p[:i])
    return out


def _structural_schema(schema: _Schema, api_version: str, list_keys: ListKeys | None) -> dict[str, Any] | None:
    """The structural schema an applied configuration is typed against: the built-in kind's, or the CRD's
    that SchemaHints carries; None when neither is known."""
    if schema.builtin:
        group, _, version = api_version.rpartition("/")
        return kind_schema(group, version, schema.kind)
    found = getattr(list_keys, "schema", None)
    return found if isinstance(found, dict) and found else None


def _undeclared(walker: _Walker, applied: dict[str, Any], schema: dict[str, Any]) -> list[Path]:
    """Fields of the configuration the schema does not declare, the outermost of each, one per map (upstream's
    typed conversion stops at a map's first undeclared key). Pruning would drop their values after the
    applier had been recorded as their owner, so upstream refuses the whole apply instead."""
    gone = walker.compare(structural.prune(schema, applied), applied).added
    first: dict[Path, Path] = {}
    for p in _iterate(gone):
        if not any(p[:i] in gone for i in range(1, len(p))):
            first.setdefault(p[:-1], p)
    return list(first.values())


def _undeclared_error(where: str, paths: list[Path]) -> StatusError:
    """Upstream's message for an applied configuration that does not fit the schema. Upstream sends it with
    a 500, as its typed conversion error is no Status (a change to 400 is pending there); this answers 400,
    as for any other mistake in a request."""
    errs = [f"{path_string(p)}: field not declared in schema" for p in paths]
    detail = errs[0] if len(errs) == 1 else "\n".join(["errors:", *("  " + e for e in errs)])
    return StatusError(400, "BadRequest", f"failed to create typed patch object ({where}): {detail}")


def _checked_metadata(live: dict[str, Any] | None, config: Any, api_version: str) -> dict[str, Any]:
    """Refuse a configuration upstream cannot decode as this object; returns its metadata (empty if none)."""
    if not isinstance(config, dict):
        raise bad_request("error decoding patch: the applied configuration must be an object")
    cmeta = config.get("metadata")
    if isinstance(cmeta, dict) and cmeta.get("managedFields") is not None:
        raise bad_request("metadata.managedFields must be nil")
    kind = config.get("kind")
    if config.get("apiVersion") != api_version or (live is not None and live.get("kind") not in (None, kind)):
        raise bad_request(f"invalid object type: {_gvk_string(config.get('apiVersion'), kind)}")
    return cmeta if isinstance(cmeta, dict) else {}


def _live_managers(live: dict[str, Any] | None) -> dict[Identity, _Entry]:
    """The live object's managedFields; an undecodable entry is the server's fault, hence 500."""
    try:
        return _decode((live or {}).get("metadata", {}).get("managedFields"))
    except _DecodeError as err:
        raise StatusError(500, "", f"failed to decode managed fields: {err}") from err


def _config_fields(
    walker: _Walker, applied: dict[str, Any], api_version: str, list_keys: ListKeys | None, where: str
) -> set[Path]:
    """The field set the configuration claims; a value of the wrong shape (500, as upstream) or a field the
    schema does not declare (400) refuses the apply."""
    try:
        config_set = walker.field_set(applied, True)
    except _TypedError as err:
        raise StatusError(500, "", f"failed to create typed patch object ({where}): {err}") from err
    typed_against = _structural_schema(walker.schema, api_version, list_keys)
    undeclared = _undeclared(walker, applied, typed_against) if typed_against is not None else []
    if undeclared:
        raise _undeclared_error(where, undeclared)
    return config_set


def _adopt_unmanaged(
    walker: _Walker, schema: _Schema, base: dict[str, Any], managers: dict[Identity, _Entry], api_version: str, now: str
) -> None:
    """An object no manager has recorded yet: its fields become owned by before-first-apply, so the first
    apply that changes them meets a conflict instead of silently taking them."""
    c = walker.compare(schema.skeleton({}), schema.skeleton(base))
    owned = (c.added | c.modified) - _STRIP
    if owned:
        first = _identity(BEFORE_FIRST_APPLY, "Update", api_version, "")
        managers[first] = _Entry(owned, api_version, now)


def _merge_dropping_forgotten(
    walker: _Walker,
    schema: _Schema,
    base: dict[str, Any],
    applied: dict[str, Any],
    config_set: set[Path],
    managers: dict[Identity, _Entry],
    me: Identity,
) -> Any:
    """Merge the configuration onto the live object, removing the fields this applier set last time and
    left out now, unless another manager (or this configuration) still holds them."""
    last = managers.get(me)
    merged = walker.merge(base, applied)
    if last is not None and last.fields:
        # The configuration's metadata.name holds metadata here: it is stripped from the sets only afterwards.
        owned_now = set(config_set)
        for ident, e in managers.items():
            if ident != me:
                owned_now |= e.fields
        held = _with_named_ancestors(schema, owned_now)
        merged = walker.remove(merged, _with_named_ancestors(schema, last.fields) - held, held)
    return merged


def _take_changed_fields(
    walker: _Walker,
    schema: _Schema,
    base: dict[str, Any],
    merged: Any,
    managers: dict[Identity, _Entry],
    me: Identity,
    *,
    force: bool,
    kubectl: bool,
    api_version: str,
) -> None:
    """Fields the apply changes that other managers own are conflicts (409) unless forced (or allowed by
    kubectl's last-applied annotation); otherwise the other managers lose them, and any field it removed."""
    c = walker.compare(schema.skeleton(base), schema.skeleton(merged))
    changed = c.added | c.modified
    conflicts = {i: e.fields & changed for i, e in managers.items() if i != me and e.fields & changed}
    if conflicts and not force:
        allowed = _allowed_by_last_applied(walker, base, api_version) if kubectl else set()
        remaining = {i: s - allowed for i, s in conflicts.items() if s - allowed}
        if remaining:
            raise _conflict_error(remaining)
    for ident, e in managers.items():
        if ident != me:
            e.fields -= conflicts.get(ident, set())
            e.fields -= c.removed


def server_side_apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    *,
    manager: str,
    force: bool,
    api_version: str,
    now: str,
    list_keys: ListKeys | None = None,
    subresource: str = "",
    reset_fields: Iterable[tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """Apply `config` for `manager` onto `live` (None = create); returns the new object with managedFields.

    Conflicts (a field the config changes that another manager owns) raise 409 unless `force`; a field the
    kind's schema does not declare raises 400. Built-in kinds use their list types; other kinds use
    `list_keys(path) -> (list type, map key(s))`, which may also offer map_atomic(path), item_atomic(path),
    key_defaults(path) and named_field(path, name) (SchemaHints reads all five from a CRD schema, and
    carries it); without it lists are atomic, maps granular and every field declared. `reset_fields` are
    field paths the endpoint ignores (upstream's reset fields: ("status",) on a main resource with a status
    subresource); by default the status subresource ignores everything but status.
    """
    meta = _checked_metadata(live, config, api_version)
    kind = config.get("kind")
    if reset_fields is None:
        kept = ("status", "apiVersion", "kind")
        reset_fields = [(k,) for k in config if k not in kept] if subresource == "status" else []
    applied = _drop_paths(config, reset_fields)
    schema = _Schema(_group(api_version), str(kind or ""), list_keys)
    walker = _Walker(schema)
    base = strip_managed_fields(live) if live is not None else {}
    managers = _live_managers(live)
    where = f"{_gvk_string(api_version, kind)} {meta.get('namespace', '')}/{meta.get('name', '')}"
    config_set = _config_fields(walker, applied, api_version, list_keys, where)
    if live is not None and not managers:
        _adopt_unmanaged(walker, schema, base, managers, api_version, now)
    me = _identity(manager, "Apply", api_version, subresource)
    last = managers.get(me)
    merged = _merge_dropping_forgotten(walker, schema, base, applied, config_set, managers, me)
    kubectl = manager == "kubectl"
    _take_changed_fields(
        walker, schema, base, merged, managers, me, force=force, kubectl=kubectl, api_version=api_version
    )
    unchanged = json_equal(base, merged)
    managers[me] = _Entry(config_set - _STRIP, api_version, (last.time if last else None) if unchanged else now)
    result = _drop_nulls(base if unchanged else merged)
    if manager == "kubectl":
        _set_last_applied(result, config)
    return _finish(result, managers)

"""Server-side apply against a reference model, over HTTP.

Random sequences of applies (several field managers, with and without force, some with a field the schema
does not declare), updates (a PUT by an Update manager), creates, and PUTs that drop a manager's managedFields
entry are sent to the emulated API server; after every step the stored object and its metadata.managedFields
(FieldsV1 decoded into sets of paths) must equal what a small model of the documented semantics predicts, and
no manager may own a field the object does not hold (but for the one case upstream makes itself: an owned map
that a typed object leaves out when empty, such as a ConfigMap's data).

The model is written from the Kubernetes documentation ("Server-Side Apply": field management, conflicts,
merge strategy) and structured-merge-diff's definitions of field sets, comparison, merge and pruning, for the
few shapes used here: a ConfigMap's data map, and a custom resource with a scalar, an atomic list, a set list,
a list-map keyed by name, a granular map of structs and an atomic map. It does not model list order, nulls,
defaults, metadata (labels, annotations), duplicate list items, subresources, several API versions, the cap of
ten Update managers, or kubectl's client-side apply hand-over; tests/sim/test_apply.py covers those one at a
time.
"""

from __future__ import annotations

import copy
import http.client
import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

NS = "default"
CMS = f"/api/v1/namespaces/{NS}/configmaps"
GROUP = "apply.example.com"
RACKS = f"/apis/{GROUP}/v1/namespaces/{NS}/racks"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
APPLY = "application/apply-patch+yaml"
BEFORE_FIRST_APPLY = "before-first-apply"

Path = tuple[str, ...]  # FieldsV1 path elements: "f:name", 'k:{"name":"a"}', 'v:"x"'
Identity = tuple[str, str]  # (manager, operation)


# ------------------------------------------------------------------------------------------ the model's schema


class Type:
    """What structured-merge-diff reads from a schema node for apply."""


@dataclass(frozen=True)
class Leaf(Type):
    """A scalar, an atomic list or an atomic map: owned, compared and replaced as one value."""


@dataclass(frozen=True)
class Struct(Type):
    """An object with declared properties: its fields are "named fields", not members of a field set on their
    own unless their value is empty or null."""

    fields: dict[str, Type]


@dataclass(frozen=True)
class Map(Type):
    """A granular map (additionalProperties): every key is a member, whatever its value."""

    values: Type


@dataclass(frozen=True)
class ListMap(Type):
    """x-kubernetes-list-type: map, one key field: items are members, merged field by field."""

    key: str
    item: Struct


@dataclass(frozen=True)
class ListSet(Type):
    """x-kubernetes-list-type: set of scalars: each value is a member."""


LEAF = Leaf()
CONFIGMAP = Struct({"data": Map(LEAF)})
RACK = Struct(
    {
        "spec": Struct(
            {
                "owner": LEAF,
                "pins": LEAF,  # an array without x-kubernetes-list-type: atomic
                "tags": ListSet(),
                "slots": ListMap("name", Struct({"name": LEAF, "model": LEAF, "count": LEAF})),
                "zones": Map(Struct({"cap": LEAF, "note": LEAF})),
                "limits": LEAF,  # x-kubernetes-map-type: atomic
            }
        )
    }
)


def rack_crd() -> dict[str, Any]:
    string = {"type": "string"}
    spec = {
        "type": "object",
        "properties": {
            "owner": string,
            "pins": {"type": "array", "items": string},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": string},
            "slots": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": string, "model": string, "count": {"type": "integer"}},
                },
            },
            "zones": {
                "type": "object",
                "additionalProperties": {"type": "object", "properties": {"cap": string, "note": string}},
            },
            "limits": {"type": "object", "x-kubernetes-map-type": "atomic", "additionalProperties": string},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"racks.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": "Rack", "plural": "racks", "singular": "rack"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}},
                }
            ],
        },
    }


# -------------------------------------------------------------------------------- field sets over the schema


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Absent()


def _json(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def children(value: Any, t: Type) -> list[tuple[str, Any, Type, bool]]:
    """(path element, child value, child type, is a named field) for each child of a granular value."""
    if isinstance(t, Struct):
        return [("f:" + name, v, t.fields[name], True) for name, v in value.items()]
    if isinstance(t, Map):
        return [("f:" + name, v, t.values, False) for name, v in value.items()]
    if isinstance(t, ListMap):
        return [("k:" + _json({t.key: item[t.key]}), item, t.item, False) for item in value]
    if isinstance(t, ListSet):
        return [("v:" + _json(v), v, LEAF, False) for v in value]
    return []


def rebuild(t: Type, kept: list[tuple[str, Any]]) -> Any:
    if isinstance(t, Struct | Map):
        return {pe.removeprefix("f:"): v for pe, v in kept}
    return [v for _, v in kept]


def field_set(value: Any, t: Type, path: Path = ()) -> set[Path]:
    """The fields an applied configuration owns (ToFieldSet): leaves, list items, set values and map keys;
    a named field only when its value is empty."""
    if isinstance(t, Leaf):
        return {path}
    out: set[Path] = set()
    for pe, child, ct, named in children(value, t):
        p = (*path, pe)
        out |= field_set(child, ct, p)
        if not named or child in ({}, None):
            out.add(p)
    return out


def subtree(value: Any, t: Type, path: Path) -> set[Path]:
    """Every node of a value that appears or disappears as a whole (a comparison lists each of them)."""
    out = {path} if path else set()
    if not isinstance(t, Leaf):
        for pe, child, ct, _ in children(value, t):
            out |= subtree(child, ct, (*path, pe))
    return out


@dataclass
class Diff:
    added: set[Path] = field(default_factory=set)
    modified: set[Path] = field(default_factory=set)
    removed: set[Path] = field(default_factory=set)

    def __ior__(self, other: Diff) -> Diff:
        self.added |= other.added
        self.modified |= other.modified
        self.removed |= other.removed
        return self


def compare(old: Any, new: Any, t: Type, path: Path = ()) -> Diff:
    if old is ABSENT and new is ABSENT:
        return Diff()
    if old is ABSENT:
        return Diff(added=subtree(new, t, path))
    if new is ABSENT:
        return Diff(removed=subtree(old, t, path))
    if isinstance(t, Leaf) or (not old and not new):
        return Diff(modified={path} if old != new else set())
    before = {pe: (v, ct) for pe, v, ct, _ in children(old, t)}
    after = {pe: (v, ct) for pe, v, ct, _ in children(new, t)}
    out = Diff()
    for pe in before.keys() | after.keys():
        ct = (before.get(pe) or after[pe])[1]
        out |= compare(before.get(pe, (ABSENT,))[0], after.get(pe, (ABSENT,))[0], ct, (*path, pe))
    return out


def merge(live: Any, config: Any, t: Type) -> Any:
    """The applied configuration over the live value: granular parts merge key by key, the rest is replaced."""
    if live is ABSENT or isinstance(t, Leaf):
        return copy.deepcopy(config)
    by_pe = {pe: (v, ct) for pe, v, ct, _ in children(live, t)}
    kept = [(pe, v) for pe, v, _, _ in children(live, t)]
    for pe, v, ct, _ in children(config, t):
        if pe in by_pe:
            kept = [(p, merge(by_pe[pe][0], v, ct) if p == pe else x) for p, x in kept]
        else:
            kept.append((pe, copy.deepcopy(v)))
    return rebuild(t, kept)


def remove(value: Any, t: Type, paths: set[Path], owned: set[Path], path: Path = ()) -> Any:
    """`value` without the members in `paths` (each with everything under it). A map or list that loses its last
    entry this way goes too (ABSENT), unless some manager owns it: it stays, empty (upstream leaves null there,
    which the emulator never stores)."""
    if not paths or isinstance(t, Leaf):
        return value
    kept: list[tuple[str, Any]] = []
    for pe, child, ct, _ in children(value, t):
        p = (*path, pe)
        if p in paths:
            continue
        nv = remove(child, ct, {q for q in paths if q[: len(p)] == p}, owned, p)
        if nv is not ABSENT:
            kept.append((pe, nv))
    emptied = not kept and children(value, t)
    return ABSENT if emptied and path not in owned else rebuild(t, kept)


def held(paths: set[Path], t: Type) -> set[Path]:
    """`paths` and the struct fields above them: whoever owns a field inside a struct holds on to the struct
    (structured-merge-diff counts named fields as members when it decides what to prune), while a map key or
    list item above an owned field is not held."""
    out = set(paths)
    for path in paths:
        node = t
        for i, pe in enumerate(path[:-1], 1):
            if isinstance(node, Struct):
                out.add(path[:i])
                node = node.fields[pe.removeprefix("f:")]
            elif isinstance(node, Map):
                node = node.values
            elif isinstance(node, ListMap):
                node = node.item
            else:
                break
    return out


def canonical(value: Any, t: Type) -> Any:
    """A comparable form: list-maps and sets as dicts by path element (list order is not modelled)."""
    if isinstance(t, Leaf):
        return value
    if isinstance(t, Struct | Map):
        return {k: canonical(v, ct) for pe, v, ct, _ in children(value, t) for k in [pe.removeprefix("f:")]}
    return {pe: canonical(v, ct) for pe, v, ct, _ in children(value, t)}


# ---------------------------------------------------------------------------------------------- the model


class Rejected(Exception):
    def __init__(self, fields: set[str]) -> None:
        super().__init__(sorted(fields))
        self.fields = fields  # path strings


def undeclared(value: Any, t: Type, path: Path = ()) -> set[Path]:
    """Fields of a configuration the schema does not declare (the outermost of each)."""
    if isinstance(t, Struct):
        out: set[Path] = set()
        for name, v in value.items():
            p = (*path, "f:" + name)
            out |= undeclared(v, t.fields[name], p) if name in t.fields else {p}
        return out
    return {q for pe, v, ct, _ in children(value, t) for q in undeclared(v, ct, (*path, pe))}


class Conflict(Exception):
    def __init__(self, fields: set[tuple[str, str, str]]) -> None:
        super().__init__(sorted(fields))
        self.fields = fields  # (manager, operation, path string)


@dataclass
class Model:
    """One object: its value (the parts the schema covers) and each manager's field set."""

    schema: Struct
    # Top-level maps the kind's Go type leaves out when empty (`omitempty`): the stored object has no empty
    # ConfigMap data, though an owner of the map itself keeps it, as upstream does.
    omit_empty: frozenset[str] = frozenset()
    value: dict[str, Any] | None = None  # None: not created yet
    managers: dict[Identity, set[Path]] = field(default_factory=dict)

    def apply(self, manager: str, config: dict[str, Any], force: bool) -> None:
        """The manager's owned set becomes exactly its configuration's fields; what it applied last time and
        no longer applies is removed unless another manager owns it; changing a field another manager owns
        is a conflict unless forced, and forcing moves the field to the applier. A struct counts as owned by
        whoever owns a field inside it: it stays while anyone does, and a struct the applier leaves that
        nobody else holds goes as a whole. A configuration with a field the schema does not declare is
        refused as a whole: its value could not be stored."""
        bad = undeclared(config, self.schema)
        if bad:
            raise Rejected({path_string(p) for p in bad})
        live = self.value if self.value is not None else {}
        managers = {i: set(s) for i, s in self.managers.items()}
        if self.value is not None and not managers:
            # Ownership of an untracked object starts with a manager for everything already there.
            managers[(BEFORE_FIRST_APPLY, "Update")] = compare({}, live, self.schema).added
        me = (manager, "Apply")
        applied = field_set(config, self.schema)
        others = set().union(*(s for i, s in managers.items() if i != me))
        merged = merge(live, config, self.schema)
        keep = held(applied | others, self.schema)
        merged = remove(merged, self.schema, held(managers.get(me, set()), self.schema) - keep, keep)
        merged = {} if merged is ABSENT else merged
        diff = compare(live, merged, self.schema)
        changed = diff.added | diff.modified
        conflicts = {i: s & changed for i, s in managers.items() if i != me and s & changed}
        if conflicts and not force:
            raise Conflict({(i[0], i[1], path_string(p)) for i, s in conflicts.items() for p in s})
        for i, s in managers.items():
            if i != me:
                s -= changed | diff.removed
        managers[me] = applied
        self._store(merged, managers)

    def update(self, manager: str, new: dict[str, Any]) -> None:
        """A write that is not an apply owns what it added or changed; everyone loses what it changed or
        removed. An object nobody owns anything of stays untracked until an apply."""
        assert self.value is not None
        new = self._typed(new)
        if not self.managers:
            self.value = new
            return
        diff = compare(self.value, new, self.schema)
        me = (manager, "Update")
        managers = {i: s - diff.added - diff.modified - diff.removed for i, s in self.managers.items() if i != me}
        managers[me] = (self.managers.get(me, set()) - diff.removed) | diff.added | diff.modified
        self._store(new, managers)

    def forget(self, ident: Identity) -> None:
        """A client wrote managedFields without this manager's entry: its fields are nobody's now."""
        del self.managers[ident]

    def create(self, manager: str, new: dict[str, Any]) -> None:
        self.value = {}
        self.managers = {(manager, "Update"): set()}  # tracked from creation
        self.update(manager, new)

    def _store(self, value: dict[str, Any], managers: dict[Identity, set[Path]]) -> None:
        self.value = self._typed(value)
        self.managers = {i: s for i, s in managers.items() if s}

    def _typed(self, value: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in value.items() if v or k not in self.omit_empty}

    def dangling(self) -> dict[Identity, list[Path]]:
        """Owned paths without a value: only an owned map the Go type left out because it was empty."""
        assert self.value is not None
        out = {i: sorted(p for p in s if not resolves(self.value, p)) for i, s in self.managers.items()}
        out = {i: d for i, d in out.items() if d}
        assert all(p[0].removeprefix("f:") in self.omit_empty and len(p) == 1 for d in out.values() for p in d)
        return out


def path_string(path: Path) -> str:
    """A path as conflict causes print it: .spec.slots[name="a"].model, .spec.tags[="x"]."""
    out = ""
    for pe in path:
        kind, rest = pe[0], pe[2:]
        if kind == "f":
            out += "." + rest
        elif kind == "k":
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(rest).items()) + "]"
        else:
            out += f"[={json.dumps(json.loads(rest))}]"
    return out


# ------------------------------------------------------------------------------------------ reading the server


def decode_fields_v1(node: dict[str, Any], prefix: Path = ()) -> set[Path]:
    """FieldsV1 as a set of member paths: a leaf `{}` is a member, and so is a node marked with "."."""
    out: set[Path] = set()
    for key, child in node.items():
        if key == ".":
            continue
        if key[0] in "kv":  # re-spell the JSON so that key order and spacing do not matter
            key = key[:2] + _json(json.loads(key[2:]))
        p = (*prefix, key)
        if not child or "." in child:
            out.add(p)
        out |= decode_fields_v1(child, p)
    return out


def managed_sets(obj: dict[str, Any]) -> dict[Identity, set[Path]]:
    out: dict[Identity, set[Path]] = {}
    for e in obj["metadata"].get("managedFields") or []:
        ident = (e["manager"], e["operation"])
        assert ident not in out, f"two managedFields entries for {ident}"
        out[ident] = decode_fields_v1(e.get("fieldsV1") or {})
    return out


def resolves(value: Any, path: Path) -> bool:
    """Whether the stored object holds a value at `path`."""
    for pe in path:
        kind, rest = pe[0], pe[2:]
        if kind == "f" and isinstance(value, dict) and rest in value:
            value = value[rest]
        elif kind == "k" and isinstance(value, list):
            key = json.loads(rest)
            found = [x for x in value if isinstance(x, dict) and all(x.get(k) == v for k, v in key.items())]
            if not found:
                return False
            value = found[0]
        elif kind == "v" and isinstance(value, list) and json.loads(rest) in value:
            value = json.loads(rest)
        else:
            return False
    return True


class Client:
    """One keep-alive HTTP connection to the emulated API server."""

    def __init__(self, rs: Any) -> None:
        host, port = rs.url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=10)
        self.token = rs.token

    def call(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json", query: str = ""
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = ctype
        self.conn.request(method, path + (f"?{query}" if query else ""), body=data, headers=headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None


# -------------------------------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class Apply:
    manager: str
    config: dict[str, Any]  # the modelled part: {"data": ...} or {"spec": ...}
    force: bool = False

    def __str__(self) -> str:
        return f"apply by {self.manager!r}{' (force)' if self.force else ''}: {_json(self.config)}"


@dataclass(frozen=True)
class Update:
    manager: str
    edit: tuple[Any, ...]  # what the manager changes, see edit_configmap / edit_rack

    def __str__(self) -> str:
        return f"update by {self.manager!r}: {self.edit}"


@dataclass(frozen=True)
class Create:
    manager: str
    value: dict[str, Any]

    def __str__(self) -> str:
        return f"create by {self.manager!r}: {_json(self.value)}"


@dataclass(frozen=True)
class Forget:
    manager: str
    operation: str

    def __str__(self) -> str:
        return f"a PUT drops the managedFields entry of {self.manager!r} ({self.operation})"


Step = Apply | Update | Create | Forget


def edit_configmap(value: dict[str, Any], edit: tuple[Any, ...]) -> dict[str, Any] | None:
    """("set", key, value) or ("delete", key); None when the edit does not apply."""
    data = dict(value.get("data") or {})
    op, key, *rest = edit
    if op == "set":
        data[key] = rest[0]
    elif key in data:
        del data[key]
    else:
        return None
    return {**value, "data": data}


def edit_rack(value: dict[str, Any], edit: tuple[Any, ...]) -> dict[str, Any] | None:
    """One change to spec, as a client that reads, edits and PUTs the object makes it; None when the edit
    does not apply (it would change nothing)."""
    out = copy.deepcopy(value)
    spec = out.setdefault("spec", {})
    what, *args = edit
    if what in ("owner", "pins", "limits"):
        (v,) = args
        if v is None:
            if what not in spec:
                return None
            del spec[what]
        else:
            spec[what] = v
    elif what == "tag":
        tag, present = args
        tags = spec.setdefault("tags", [])
        if (tag in tags) == present:
            return None
        if present:
            tags.append(tag)
        else:
            tags.remove(tag)
    elif what in ("slot", "zone"):
        name, key, v = args
        if what == "slot":
            items = spec.setdefault("slots", [])
            item = next((x for x in items if x["name"] == name), None)
            if item is None:
                if key is None or v is None:
                    return None
                item = {"name": name}
                items.append(item)
        else:
            zones = spec.setdefault("zones", {})
            if name not in zones and (key is None or v is None):
                return None
            item = zones.setdefault(name, {})
        if key is None:  # the whole item goes
            if what == "slot":
                spec["slots"] = [x for x in spec["slots"] if x["name"] != name]
            else:
                del spec["zones"][name]
        elif v is None:
            if key not in item:
                return None
            del item[key]
        else:
            item[key] = v
    return out


@dataclass
class Kind:
    schema: Struct
    collection: str
    api_version: str
    kind: str
    root: str  # the one top-level field the model covers
    edit: Callable[[dict[str, Any], tuple[Any, ...]], dict[str, Any] | None]
    omit_empty: frozenset[str] = frozenset()

    def body(self, name: str, value: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": {"name": name}, **value}


CONFIGMAP_KIND = Kind(CONFIGMAP, CMS, "v1", "ConfigMap", "data", edit_configmap, frozenset({"data"}))
RACK_KIND = Kind(RACK, RACKS, f"{GROUP}/v1", "Rack", "spec", edit_rack)

_names = itertools.count()


def run(client: Client, kind: Kind, steps: list[Step]) -> None:
    """Send each step to the server and hold the result against the model's after each one."""
    name = f"obj-{next(_names)}"
    url = f"{kind.collection}/{name}"
    model = Model(kind.schema, kind.omit_empty)
    live: dict[str, Any] | None = None
    log: list[str] = []
    for n, step in enumerate(steps, 1):
        where = f"step {n} ({step}), after:\n  " + "\n  ".join(log or ["(nothing)"])
        if isinstance(step, Create):
            if live is not None:
                continue
            status, body = client.call("POST", kind.collection, kind.body(name, step.value), query=_fm(step))
            assert status == 201, f"{where}\ncreate answered {status}: {body}"
            model.create(step.manager, copy.deepcopy(step.value))
        elif isinstance(step, Forget):
            if live is None:
                continue
            entries = live["metadata"].get("managedFields") or []
            kept = [e for e in entries if (e["manager"], e["operation"]) != (step.manager, step.operation)]
            if not kept or len(kept) == len(entries):  # an empty list would not reset ownership
                continue
            put = {**live, "metadata": {**live["metadata"], "managedFields": kept}}
            status, body = client.call("PUT", url, put, query="fieldManager=dave")
            assert status == 200, f"{where}\nthe PUT answered {status}: {body}"
            model.forget((step.manager, step.operation))
        elif isinstance(step, Update):
            if live is None or model.value is None:
                continue
            new = kind.edit(model.value, step.edit)
            if new is None:
                continue
            put = {k: v for k, v in live.items() if k != kind.root}
            put["metadata"] = {k: v for k, v in live["metadata"].items() if k != "managedFields"}
            put.update(new)
            status, body = client.call("PUT", url, put, query=_fm(step))
            assert status == 200, f"{where}\nupdate answered {status}: {body}"
            model.update(step.manager, new)
        else:
            query = _fm(step) + ("&force=true" if step.force else "")
            status, body = client.call("PATCH", url, kind.body(name, step.config), ctype=APPLY, query=query)
            before = {i: set(x) for i, x in model.managers.items()}
            if model.value is not None and compare({}, model.value, model.schema).added - held(
                set().union(*before.values()), model.schema
            ):
                event("applied over unowned fields")
            try:
                model.apply(step.manager, copy.deepcopy(step.config), step.force)
                event_for_apply(before, model, step)
            except Rejected as r:
                event("undeclared field")
                assert status == 400, f"{where}\nexpected a refusal of {sorted(r.fields)}, got {status}: {body}"
                got = set(re.findall(r"(\S+): field not declared in schema", body["message"]))
                assert got == r.fields, f"{where}\nundeclared fields: expected {sorted(r.fields)}, got {sorted(got)}"
            except Conflict as c:
                event("conflict")
                assert status == 409, f"{where}\nexpected a conflict on {sorted(c.fields)}, got {status}: {body}"
                assert conflict_fields(body) == c.fields, (
                    f"{where}\nconflicting fields: expected {sorted(c.fields)}, got {sorted(conflict_fields(body))}"
                )
            else:
                assert status in (200, 201), f"{where}\nexpected success, got {status}: {body}"
        status, got = client.call("GET", url)
        if model.value is None:
            assert status == 404, f"{where}\nthe refused create left an object: {got}"
        else:
            assert status == 200, f"{where}\nthe object is gone: {got}"
            live = got
            check(live, model, kind, where)
        log.append(str(step))


def event_for_apply(before: dict[Identity, set[Path]], model: Model, step: Apply) -> None:
    """Count what an apply did, so that a run's statistics show every rule was exercised."""
    me = (step.manager, "Apply")
    others_before = set().union(*(s for i, s in before.items() if i != me))
    others_after = set().union(*(s for i, s in model.managers.items() if i != me))
    if others_before - others_after:
        event("forced: others lost fields" if step.force else "others lost fields")
    if before.get(me, set()) - model.managers.get(me, set()):
        event("applier dropped fields")
    if model.managers.get(me, set()) & others_after:
        event("shared ownership")
    if (BEFORE_FIRST_APPLY, "Update") in model.managers:
        event("before-first-apply")


def _fm(step: Step) -> str:
    return f"fieldManager={step.manager}"


def conflict_fields(status: dict[str, Any]) -> set[tuple[str, str, str]]:
    out = set()
    for cause in (status.get("details") or {}).get("causes") or []:
        m = re.fullmatch(r'conflict with "([^"]*)"( using \S+)?', cause["message"])
        assert m, cause
        out.add((m[1], "Update" if m[2] else "Apply", cause["field"]))
    return out


def check(live: dict[str, Any], model: Model, kind: Kind, where: str) -> None:
    """The invariant first (every owned field holds a value, but for the one case upstream makes: an owned map
    a typed object leaves out when empty), then the value and every manager's set."""
    got_sets = managed_sets(live)
    dangling = {i: sorted(p for p in s if not resolves(live, p)) for i, s in got_sets.items()}
    dangling = {i: d for i, d in dangling.items() if d}
    assert dangling == model.dangling(), (
        f"{where}\nfields owned without a value in the object: {dangling}\nobject: {_json(live)}"
    )
    assert model.value is not None
    want = canonical(model.value.get(kind.root, {}), kind.schema.fields[kind.root])
    got = canonical(live.get(kind.root, {}), kind.schema.fields[kind.root])
    assert got == want, f"{where}\n{kind.root}: expected {_json(want)}\n{' ' * len(kind.root)}       got {_json(got)}"
    problems = []
    for ident in sorted(got_sets.keys() | model.managers.keys()):
        want_set, got_set = model.managers.get(ident, set()), got_sets.get(ident, set())
        if want_set != got_set:
            problems.append(
                f"manager {ident[0]!r} ({ident[1]}): missing {sorted(map(path_string, want_set - got_set))}, "
                f"unexpected {sorted(map(path_string, got_set - want_set))}"
            )
    assert not problems, f"{where}\nmanagedFields differ from the model:\n  " + "\n  ".join(problems)


# --------------------------------------------------------------------------------------------- strategies

APPLIERS = st.sampled_from(["alice", "bob", "carol"])
UPDATERS = st.sampled_from(["dave", "alice"])  # "alice" also writes with Update: a separate managedFields entry


rarely = st.integers(0, 7).map(lambda n: n == 0)
configmap_values = st.dictionaries(st.sampled_from("abcd"), st.sampled_from(["1", "2"]), max_size=4).map(
    lambda data: {"data": data} if data else {}
)
configmap_configs = st.tuples(configmap_values, rarely).map(
    lambda t: {**t[0], "bogus": {"x": "1"}} if t[1] else t[0]  # a field ConfigMap does not have
)
configmap_edits = st.one_of(
    st.tuples(st.just("set"), st.sampled_from("abcd"), st.sampled_from(["1", "2", "3"])),
    st.tuples(st.just("delete"), st.sampled_from("abcd")),
)

SLOT_NAMES = st.sampled_from(["s1", "s2", "s3"])
ZONE_NAMES = st.sampled_from(["z1", "z2"])
slot_fields = st.fixed_dictionaries(
    {}, optional={"model": st.sampled_from(["m1", "m2"]), "count": st.sampled_from([1, 2])}
)
zone_values = st.fixed_dictionaries({}, optional={"cap": st.sampled_from(["c1", "c2"]), "note": st.just("n")})
spec_fields: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {},
    optional={
        "owner": st.sampled_from(["x", "y"]),
        "pins": st.lists(st.sampled_from(["p1", "p2"]), min_size=1, max_size=2),
        "tags": st.lists(st.sampled_from(["t1", "t2", "t3"]), min_size=1, max_size=3, unique=True),
        "slots": st.lists(
            st.tuples(SLOT_NAMES, slot_fields).map(lambda t: {"name": t[0], **t[1]}),
            min_size=0,  # an empty list owns nothing and changes nothing
            max_size=3,
            unique_by=lambda item: item["name"],
        ),
        "zones": st.dictionaries(ZONE_NAMES, zone_values, max_size=2),  # an empty map is a member
        "limits": st.dictionaries(st.sampled_from(["cpu", "mem"]), st.sampled_from(["1", "2"]), min_size=1),
    },
)
rack_specs = st.tuples(spec_fields, st.booleans()).map(
    lambda t: {"spec": t[0]} if t[0] or t[1] else {}  # `spec: {}` is a member of the applier's set
)


def _with_undeclared(value: dict[str, Any], top: bool, nested: bool) -> dict[str, Any]:
    """`value` with a field the CRD schema does not declare: in spec, or in a slot or zone."""
    out = copy.deepcopy(value)
    spec: dict[str, Any] = out.get("spec", {})
    if top:
        out["spec"] = {**spec, "bogus": "1"}
    if nested and (spec.get("slots") or spec.get("zones")):
        inner = spec["slots"][0] if spec.get("slots") else next(iter(spec["zones"].values()))
        inner["junk"] = "1"
    return out


rack_configs = st.tuples(rack_specs, rarely, rarely).map(lambda t: _with_undeclared(*t))
rack_edits = st.one_of(
    st.tuples(st.just("owner"), st.sampled_from(["x", "y", "z", None])),
    st.tuples(st.just("pins"), st.sampled_from([["p1"], ["p2", "p1"], None])),
    st.tuples(st.just("limits"), st.sampled_from([{"cpu": "1"}, {"cpu": "3"}, None])),
    st.tuples(st.just("tag"), st.sampled_from(["t1", "t2", "t4"]), st.booleans()),
    st.tuples(
        st.just("slot"), SLOT_NAMES, st.sampled_from(["model", "count", None]), st.sampled_from(["m3", None])
    ).map(lambda e: e if e[2] != "count" or e[3] is None else (*e[:3], 3)),
    st.tuples(st.just("zone"), ZONE_NAMES, st.sampled_from(["cap", "note", None]), st.sampled_from(["c3", None])),
)


def step_lists(
    configs: st.SearchStrategy[dict[str, Any]],
    values: st.SearchStrategy[dict[str, Any]],
    edits: st.SearchStrategy[tuple[Any, ...]],
) -> Any:
    """A create (by apply, or by a POST whose manager then owns everything) and then applies and updates."""
    applies = st.builds(Apply, APPLIERS, configs, st.booleans())
    first = st.one_of(applies, st.builds(Create, UPDATERS, values))
    managers = st.sampled_from(["alice", "bob", "carol", "dave"])
    forgets = st.builds(Forget, managers, st.sampled_from(["Apply", "Update"]))
    rest = st.lists(st.one_of(applies, applies, st.builds(Update, UPDATERS, edits), forgets), max_size=14)
    return st.tuples(first, rest).map(lambda t: [t[0], *t[1]])


@pytest.fixture
def client(apiserver: Any) -> Iterator[Client]:
    c = Client(apiserver)
    status, body = c.call("POST", CRDS, rack_crd())
    assert status == 201, body
    yield c
    c.conn.close()


SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(step_lists(configmap_configs, configmap_values, configmap_edits))
# Applying the value another manager set shares the field, though the object does not change.
@example(steps=[Create("dave", {"data": {"a": "1"}}), Apply("alice", {"data": {"a": "1"}})])
# The creator keeps owning the data map it created, now empty and left out of the stored ConfigMap.
@example(steps=[Create("dave", {"data": {"a": "1"}}), Apply("alice", {"data": {"a": "2"}}, True), Apply("alice", {})])
# A field ConfigMap does not have refuses the apply.
@example(steps=[Apply("alice", {"data": {"a": "1"}, "bogus": {"x": "1"}})])
def test_configmap_apply_sequences_match_the_model(client: Client, steps: list[Step]) -> None:
    run(client, CONFIGMAP_KIND, steps)


@SETTINGS
@given(step_lists(rack_configs, rack_specs, rack_edits))
# A key of a map of structs is a member of the applier's set.
@example(steps=[Apply("alice", {"spec": {"zones": {"z1": {"cap": "c1"}}}})])
# Pruning a map's last key keeps the map its applier still applies, empty.
@example(
    steps=[Apply("alice", {"spec": {"zones": {"z1": {"cap": "c1"}}}}), Apply("alice", {"spec": {"zones": {"z1": {}}}})]
)
# Undeclared fields, in spec and inside a list-map item, refuse the apply.
@example(steps=[Apply("alice", {"spec": {"owner": "x", "bogus": "1", "slots": [{"name": "s1", "junk": "1"}]}})])
# A struct applied empty is not pruned while anyone (the applier's new configuration too) owns a field inside.
@example(
    steps=[
        Apply("alice", {"spec": {}}),
        Apply("bob", {"spec": {"owner": "x"}}),
        Apply("alice", {"spec": {"tags": ["t1"]}}),
    ]
)
# A struct its applier leaves and nobody else holds goes as a whole, with the unowned `slots: []` in it.
@example(steps=[Apply("alice", {"spec": {"owner": "x", "slots": []}}), Apply("alice", {})])
# An apply that creates the object but owns nothing records no manager.
@example(steps=[Apply("alice", {"spec": {"slots": []}})])
def test_custom_resource_apply_sequences_match_the_model(client: Client, steps: list[Step]) -> None:
    run(client, RACK_KIND, steps)

"""FieldsV1, the wire form of managedFields' field sets, and the path sets server-side apply computes with.

A path is a tuple of path elements, each one of ("f", field name), ("k", ((key field, canonical JSON), ...)),
("v", canonical JSON) or ("i", index), the same elements FieldsV1 spells "f:name", 'k:{"name":"x"}', 'v:"x"'
and "i:0". A set holds members only, as upstream's does; FieldsV1 "." marks a node that is a member and also
has children. Keys of a FieldsV1 object are in upstream's order (structured-merge-diff's PathElement.Less).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from .gostrings import go_json_escape

PathElement = tuple[str, Any]
Path = tuple[PathElement, ...]
PathTrie = dict[PathElement, list[Any]]  # {element: [is_member, children]}


class DecodeError(Exception):
    """managedFields that cannot be read."""


_DecodeError = DecodeError


# ------------------------------------------------------------------------------ path elements


def _norm(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v


def _canon(v: Any) -> str:
    return json.dumps(_norm(v), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _go_json(v: Any) -> str:
    """Go's encoding/json: sorted keys, compact, HTML-safe escapes."""
    return go_json_escape(json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def _pe_to_fields(pe: PathElement) -> str:
    kind, val = pe
    if kind == "f":
        return "f:" + str(val)
    if kind == "k":
        return "k:" + _go_json({name: json.loads(c) for name, c in val})
    if kind == "v":
        return "v:" + _go_json(json.loads(val))
    return f"i:{val}"


def _pe_from_fields(s: str) -> PathElement | None:
    kind, sep, rest = s.partition(":")
    if not sep or len(kind) != 1:
        raise _DecodeError(f"missing colon: {s}")
    try:
        if kind == "f":
            return ("f", rest)
        if kind == "v":
            return ("v", _canon(json.loads(rest)))
        if kind == "k":
            obj = json.loads(rest)
            if not isinstance(obj, dict):
                raise _DecodeError(f"bad key: {s}")
            return ("k", tuple(sorted((k, _canon(v)) for k, v in obj.items())))
        if kind == "i":
            return ("i", int(rest))
    except ValueError as e:
        raise _DecodeError(str(e)) from e
    return None  # an element type a newer server knows: ignored, as upstream does


def _value_rank(v: Any) -> tuple[Any, ...]:
    if isinstance(v, bool):
        return (2, v)
    if isinstance(v, int | float):
        return (0, v)
    if isinstance(v, str):
        return (1, v)
    if isinstance(v, list):
        return (3, [_value_rank(x) for x in v])
    if isinstance(v, dict):
        return (4, sorted((k, _value_rank(x)) for k, x in v.items()))
    return (5,)


def _pe_order(pe: PathElement) -> tuple[Any, ...]:
    kind, val = pe
    if kind == "f":
        return (0, val)
    if kind == "i":
        return (3, val)
    got = _PE_ORDERS.get(pe)
    if got is None:
        if kind == "k":
            got = (1, [(name, _value_rank(json.loads(c))) for name, c in val])
        else:
            got = (2, _value_rank(json.loads(val)))
        if len(_PE_ORDERS) >= 32_768:
            _PE_ORDERS.clear()
        _PE_ORDERS[pe] = got
    return got


_PE_ORDERS: dict[PathElement, tuple[Any, ...]] = {}  # key and value elements: their order decodes JSON


def _to_string(v: Any) -> str:
    """SMD value.ToString, used in conflict paths."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ",".join(_to_string(x) for x in v) + "]"
    if isinstance(v, dict):
        return "".join(f"{k}={_to_string(x)}" for k, x in v.items())
    return str(v)


def _pe_str(pe: PathElement) -> str:
    kind, val = pe
    if kind == "f":
        return "." + str(val)
    if kind == "k":
        return "[" + ",".join(f"{name}={_to_string(json.loads(c))}" for name, c in val) + "]"
    if kind == "v":
        return f"[={_to_string(json.loads(val))}]"
    return f"[{val}]"


def path_string(path: Path) -> str:
    """A field path as conflict messages print it: `.spec.containers[name="app"].image`."""
    return "".join(_pe_str(pe) for pe in path)


# ----------------------------------------------------------------------------------- field sets


def _trie(paths: Iterable[Path]) -> dict[PathElement, list[Any]]:
    """Nested {element: [is_member, children]}."""
    root: dict[PathElement, list[Any]] = {}
    for p in paths:
        node = root
        for i, pe in enumerate(p):
            entry = node.setdefault(pe, [False, {}])
            if i == len(p) - 1:
                entry[0] = True
            node = entry[1]
    return root


# Objects of one kind written by one manager carry the same field sets over and over (every pod's kubelet
# entry, every Lease's): converting FieldsV1 to sets and back dominates a status write, so both directions
# are memoized on the content. Bounded; cleared when full.
_MEMO_MAX = 4096
_to_set_memo: dict[bytes, frozenset[Path]] = {}
_to_fields_memo: dict[frozenset[Path], bytes] = {}


def fields_to_set(fields: Any) -> set[Path]:
    """FieldsV1 JSON -> set of paths (a fresh set: callers change it)."""
    try:
        key = msgspec.json.encode(fields)
    except (TypeError, msgspec.EncodeError):
        return _fields_to_set(fields)
    got = _to_set_memo.get(key)
    if got is None:
        got = frozenset(_fields_to_set(fields))
        if len(_to_set_memo) >= _MEMO_MAX:
            _to_set_memo.clear()
        _to_set_memo[key] = got
    return set(got)


def _fields_to_set(fields: Any) -> set[Path]:
    out: set[Path] = set()

    def walk(node: Any, prefix: Path) -> None:
        if not isinstance(node, dict):
            raise _DecodeError("FieldsV1 nodes must be objects")
        for key, child in node.items():
            if key == ".":
                continue
            pe = _pe_from_fields(key)
            if pe is None:
                continue
            p = (*prefix, pe)
            if not isinstance(child, dict):
                raise _DecodeError("FieldsV1 nodes must be objects")
            if "." in child or not child:
                out.add(p)
            walk(child, p)

    walk(fields, ())
    return out


def set_to_fields(paths: Iterable[Path]) -> dict[str, Any]:
    """Set of paths -> FieldsV1 JSON, keys in upstream's order (a fresh object each call)."""
    key = frozenset(paths)
    raw = _to_fields_memo.get(key)
    if raw is None:
        fresh = _set_to_fields(key)
        if len(_to_fields_memo) >= _MEMO_MAX:
            _to_fields_memo.clear()
        _to_fields_memo[key] = msgspec.json.encode(fresh)
        return fresh
    out: dict[str, Any] = msgspec.json.decode(raw)
    return out


def _set_to_fields(paths: Iterable[Path]) -> dict[str, Any]:
    return _emit(_trie(p for p in paths if p))


def _emit(node: dict[PathElement, list[Any]]) -> dict[str, Any]:
    """A trie's FieldsV1 object, keys in upstream's order."""
    out: dict[str, Any] = {}
    for pe in sorted(node, key=_pe_order):
        member, children = node[pe]
        out[_key(pe)] = _emit_node(member, children)
    return out


def _emit_node(member: bool, children: dict[PathElement, list[Any]]) -> dict[str, Any]:
    if not children:
        return {}
    sub: dict[str, Any] = {".": {}} if member else {}
    sub.update(_emit(children))
    return sub


# ------------------------------------------------------------------------------ FieldsV1 edited in place of sets
#
# An update takes the fields it changed from every other manager and gives them to its own: decoding each
# manager's FieldsV1 into a set and encoding it back costs as much as the whole object, while the edit touches
# only the changed paths. Both edits below give exactly what set_to_fields would for the resulting set, given a
# FieldsV1 object in the form set_to_fields makes (the form the emulator stores). They copy on write: the object
# edited may be a stored object's, and parts left alone are shared with it.

_GONE: Any = object()  # a node with nothing left to say
_KEYS: dict[PathElement, str] = {}  # bounded memos: elements recur across objects
_ORDERS: dict[str, tuple[Any, ...]] = {}


def _key(pe: PathElement) -> str:
    got = _KEYS.get(pe)
    if got is None:
        if len(_KEYS) >= 8 * _MEMO_MAX:
            _KEYS.clear()
        got = _KEYS[pe] = _pe_to_fields(pe)
    return got


def _key_order(key: str) -> tuple[Any, ...]:
    got = _ORDERS.get(key)
    if got is None:
        pe = _pe_from_fields(key)
        if pe is None:
            raise _DecodeError(f"unknown path element: {key}")
        if len(_ORDERS) >= 8 * _MEMO_MAX:
            _ORDERS.clear()
        got = _ORDERS[key] = _pe_order(pe)
    return got


def trie(paths: Iterable[Path]) -> PathTrie:
    """The paths (the empty one aside) as without() and with_paths() take them."""
    return _trie(p for p in paths if p)


def without(fields: dict[str, Any], paths: PathTrie) -> dict[str, Any]:
    """FieldsV1 `fields` less the members `paths` (the same object when none of them is in it)."""
    out = _without(fields, paths)
    result: dict[str, Any] = {} if out is _GONE else out
    return result


def _without(node: dict[str, Any], trie: dict[PathElement, list[Any]]) -> Any:
    """`node` less the members under it; _GONE when no member is left in or under it and it is none itself."""
    if not isinstance(node, dict):
        raise _DecodeError("FieldsV1 nodes must be objects")
    out: dict[str, Any] | None = None
    for pe, (member, children) in trie.items():
        key = _key(pe)
        child = node.get(key)
        if child is None:
            continue
        new = _without(child, children) if children else child
        if member and new is not _GONE:
            new = _unmember(new)
        if new is child:
            continue
        if out is None:
            out = dict(node)
        if new is _GONE:
            del out[key]
        else:
            out[key] = new
    if out is None:
        return node
    if len(out) > ("." in out):
        return out
    return {} if "." in out else _GONE


def _unmember(node: dict[str, Any]) -> Any:
    if not isinstance(node, dict):
        raise _DecodeError("FieldsV1 nodes must be objects")
    if len(node) <= ("." in node):
        return _GONE
    if "." not in node:
        return node
    return {k: v for k, v in node.items() if k != "."}


def with_paths(fields: dict[str, Any], paths: PathTrie) -> dict[str, Any]:
    """FieldsV1 `fields` plus the members `paths`, keys in upstream's order."""
    return _with(fields, False, False, paths)


def _with(node: dict[str, Any], member: bool, add_member: bool, trie: dict[PathElement, list[Any]]) -> dict[str, Any]:
    """`node` (a member or not) with the trie's members added under it, and itself made one if `add_member`."""
    if not isinstance(node, dict):
        raise _DecodeError("FieldsV1 nodes must be objects")
    children = {k: v for k, v in node.items() if k != "."}
    fresh = changed = False
    for pe, (child_member, grandchildren) in trie.items():
        key = _key(pe)
        child = children.get(key)
        if child is None:
            children[key] = _emit_node(child_member, grandchildren)
            fresh = True
            continue
        new = _with(child, not child or "." in child, child_member, grandchildren)
        if new is not child:
            children[key] = new
            changed = True
    becomes = member or add_member
    if not fresh and not changed and becomes == member:
        return node
    if not children:
        return {}
    out: dict[str, Any] = {".": {}} if becomes else {}
    for key in sorted(children, key=_key_order) if fresh else children:
        out[key] = children[key]
    return out


def _iterate(paths: Iterable[Path]) -> Iterator[Path]:
    """Members in upstream Set.Iterate order: a level's members, then its children's subtrees."""

    def walk(node: dict[PathElement, list[Any]], prefix: Path) -> Iterator[Path]:
        order = sorted(node, key=_pe_order)
        for pe in order:
            if node[pe][0]:
                yield (*prefix, pe)
        for pe in order:
            if node[pe][1]:
                yield from walk(node[pe][1], (*prefix, pe))

    yield from walk(_trie(paths), ())

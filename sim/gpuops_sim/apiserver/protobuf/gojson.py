"""The JSON form Go gives a built-in object: what kube-apiserver answers after decoding a request into its
Go struct and printing it back, computed straight from the JSON with the wire-format table.

Why it matters: the apiserver never stores the JSON a client sent. A field the client left out that has no
`omitempty` prints as its zero value (a ReplicaSet's `status.replicas: 0`, a condition's
`lastProbeTime: null`), a zero `omitempty` field disappears, unknown fields are gone, and times print in
UTC at whole seconds. Storing this form makes the JSON and protobuf paths store identical objects, and
makes create answers carry what the real server's do. Values are otherwise kept as given: their types were
checked against the schema before this runs.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

import msgspec

from .. import quantity
from .special import APIEXT, META, QUANTITY, SCHEMA
from .table import Field, Message, table

_ABSENT: Any = object()
_TIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_MICRO_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
_ZERO = {"string": "", "bool": False, "int32": 0, "int64": 0, "double": 0}
_ZERO_SPECIAL: dict[str, Any] = {QUANTITY: "0", f"{QUANTITY}Value": "0",
                                 "k8s.io.apimachinery.pkg.util.intstr.IntOrString": 0}
_UNIONS = (f"{APIEXT}.JSONSchemaPropsOrBool", f"{APIEXT}.JSONSchemaPropsOrArray",
           f"{APIEXT}.JSONSchemaPropsOrStringArray")


def canonical(api_version: str, kind: str, obj: dict[str, Any], only: Collection[str] | None = None) -> dict[str, Any]:
    """`obj` as Go prints it; with `only`, just those top-level fields are recomputed (an update pays for
    what it changed). Kinds the table does not know come back unchanged."""
    message = table().message_for(api_version, kind)
    if message is None:
        return obj
    if only is None:
        return {"kind": kind, "apiVersion": api_version, **_message(message, obj)}
    out = dict(obj)
    for field in message.fields:
        if field.json_name in only and not field.inline:
            _put(out, field, obj.get(field.json_name, _ABSENT))
    return out


def _message(message: Message, obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        obj = {}
    out: dict[str, Any] = {}
    for field in message.fields:
        if field.inline:
            out.update(_message(table().message(field.type), obj))
        elif field.json_name != "-":
            _put(out, field, obj.get(field.json_name, _ABSENT))
    return out


def _put(out: dict[str, Any], field: Field, given: Any) -> None:
    value = _field(field, given)
    if value is _ABSENT:
        if field.omitempty or field.omitzero:
            out.pop(field.json_name, None)
        else:
            out[field.json_name] = None
    elif _omitted(field, value):
        out.pop(field.json_name, None)
    else:
        out[field.json_name] = value


def _field(field: Field, given: Any) -> Any:
    """The canonical value, `_ABSENT` for a nil pointer, slice or map."""
    if field.label == "r":
        if given is _ABSENT or given is None or not isinstance(given, list):
            return _ABSENT
        if field.is_message:
            return [_value(field.type, v) for v in given]
        return list(given)
    if field.label == "m":
        if given is _ABSENT or given is None or not isinstance(given, dict):
            return _ABSENT
        if field.is_message:
            return {k: _value(field.type, given[k]) for k in sorted(given)}
        return {k: given[k] for k in sorted(given)}
    if given is _ABSENT or (given is None and field.label == "o"):
        if field.pointer or (not field.is_message and field.type == "bytes"):
            return _ABSENT
        if field.is_message:
            return _zero(field.type)
        return _ZERO[field.type]
    return _value(field.type, given) if field.is_message else given


def _omitted(field: Field, value: Any) -> bool:
    if field.label != "o":
        return (field.omitempty or field.omitzero) and not value  # an empty slice or map
    if field.pointer:
        return False
    if field.is_message:
        return field.omitzero and value == _zero(field.type)
    return (field.omitempty or field.omitzero) and value in ("", 0, False)


def _zero(name: str) -> Any:
    if name in _ZERO_SPECIAL:
        return _ZERO_SPECIAL[name]
    if name in table().custom:
        return None
    return _message(table().message(name), {})


def _value(name: str, value: Any) -> Any:
    if name == f"{META}.Time":
        return _time(value, micro=False)
    if name == f"{META}.MicroTime":
        return _time(value, micro=True)
    if name in (QUANTITY, f"{QUANTITY}Value"):
        return _quantity(value)
    if name in _UNIONS:
        return _union(value)
    if name == SCHEMA:
        return _message(table().message(name), value) if isinstance(value, dict) else value
    if name in table().custom or name in _ZERO_SPECIAL:
        return value
    return _memo_message(name, value)


# Objects of a kind repeat their parts (every pod of a template has its containers, tolerations, conditions):
# each message's Go form is memoized on its JSON encoding, and handed out as a fresh copy. Bounded.
_MEMO_MAX = 8192
_memo: dict[tuple[str, bytes], bytes] = {}


def _memo_message(name: str, value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        return _message(table().message(name), value)
    try:
        key = (name, msgspec.json.encode(value))
    except (TypeError, msgspec.EncodeError):
        return _message(table().message(name), value)
    got = _memo.get(key)
    if got is not None:
        return msgspec.json.decode(got)
    out = _message(table().message(name), value)
    if len(_memo) >= _MEMO_MAX:
        _memo.clear()
    _memo[key] = msgspec.json.encode(out)
    return out


def _quantity(value: Any) -> Any:
    """Quantities print in canonical form; a number (JSON allows one) is read as its decimal text. Text that
    is no quantity is left for validation to refuse."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return value
    text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    try:
        return quantity.canonical(text)
    except ValueError:
        return value


def _union(value: Any) -> Any:
    """JSONSchemaPropsOr{Bool,Array,StringArray}: a schema object is canonicalized as a schema."""
    if isinstance(value, dict):
        return _value(SCHEMA, value)
    if isinstance(value, list):
        return [_value(SCHEMA, v) if isinstance(v, dict) else v for v in value]
    return value


def _time(value: Any, *, micro: bool) -> Any:
    """Go prints Time in UTC at whole seconds, MicroTime with six fraction digits."""
    if not isinstance(value, str) or (_MICRO_RE if micro else _TIME_RE).fullmatch(value):
        return value
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return value
    moment = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")

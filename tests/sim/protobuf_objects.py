"""Hypothesis strategies for objects in the canonical JSON form Go prints for a protobuf message.

Generated from the wire-format table alone, so any message of any served kind can be drawn: non-pointer
scalars print unless `omitempty` and zero, nil pointers, slices and maps are omitted under `omitempty` and
null otherwise, non-pointer structs always print, inline embeddings flatten into their parent.
"""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import strategies as st

from gpuops_sim.apiserver.protobuf.special import APIEXT, INT_OR_STRING, META, QUANTITY, RAW_EXTENSION
from gpuops_sim.apiserver.protobuf.table import Field, table

_ABSENT: Any = object()
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
_KEYS = st.text("abcdefghij-._/", min_size=1, max_size=6)
_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**31), 2**31), _TEXT)
_JSON = st.recursive(_JSON_LEAF, lambda c: st.lists(c, max_size=2) | st.dictionaries(_KEYS, c, max_size=2),
                     max_leaves=4)
_TIME = st.integers(0, 4102444800).map(lambda s: _iso(s, None))
_MICRO = st.tuples(st.integers(0, 4102444800), st.integers(0, 999999)).map(lambda t: _iso(*t))


def _iso(seconds: int, micros: int | None) -> str:
    from datetime import UTC, datetime, timedelta

    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds, microseconds=micros or 0)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ" if micros is None else "%Y-%m-%dT%H:%M:%S.%fZ")


def _double() -> st.SearchStrategy[Any]:
    return st.floats(allow_nan=False, allow_infinity=False, width=64).map(
        lambda f: int(f) if f.is_integer() and abs(f) < 1e21 else f)


_SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "string": _TEXT,
    "bool": st.booleans(),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "double": _double(),
    "bytes": st.binary(max_size=6).map(lambda b: base64.b64encode(b).decode()),
}
_ZEROS = ("", 0, False)


def _special(name: str, depth: int) -> st.SearchStrategy[Any] | None:
    strategies: dict[str, st.SearchStrategy[Any]] = {
        f"{META}.Time": st.none() | _TIME,
        f"{META}.MicroTime": st.none() | _MICRO,
        f"{META}.Duration": st.sampled_from(["0s", "1h0m0s", "1.5s", "300ms", "-2m3s"]),
        f"{META}.FieldsV1": st.none() | st.dictionaries(_KEYS, st.just({}), max_size=2),
        f"{META}.Verbs": st.none() | st.lists(_TEXT, min_size=1, max_size=2),
        QUANTITY: st.sampled_from(["0", "1", "500m", "2Gi", "1.5"]),
        INT_OR_STRING: st.integers(-(2**31), 2**31 - 1) | _TEXT,
        RAW_EXTENSION: st.none() | st.dictionaries(_KEYS, _JSON, max_size=2),
        f"{APIEXT}.JSON": st.none() | _JSON.filter(lambda v: v is not None),
        f"{APIEXT}.JSONSchemaPropsOrBool": st.booleans(),
        f"{APIEXT}.JSONSchemaPropsOrArray": st.none(),
        f"{APIEXT}.JSONSchemaPropsOrStringArray": st.none() | st.lists(_TEXT, min_size=1, max_size=2),
    }
    strategies[f"{QUANTITY}Value"] = strategies[QUANTITY]
    strategies[f"{META}.GroupVersion"] = st.sampled_from(["v1", "apps/v1", "example.com/v2"])
    if name.endswith((".ExtraValue", ".AttestationValue")):
        return st.none() | st.lists(_TEXT, min_size=1, max_size=2)
    return strategies.get(name)


def message(name: str, depth: int = 0, max_depth: int = 4) -> st.SearchStrategy[dict[str, Any]]:
    """A canonical JSON object of message `name`; beyond `max_depth` optional parts stay nil."""
    return st.composite(lambda draw: _draw_message(draw, name, depth, max_depth))()


def value(name: str, depth: int, max_depth: int) -> st.SearchStrategy[Any]:
    special = _special(name, depth)
    return special if special is not None else message(name, depth, max_depth)


def _draw_message(draw: st.DrawFn, name: str, depth: int, max_depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in table().message(name).fields:
        if field.inline:
            out.update(draw(message(field.type, depth + 1, max_depth)))
        elif field.json_name != "-":
            drawn = _draw_field(draw, field, depth, max_depth)
            if drawn is not _ABSENT:
                out[field.json_name] = drawn
    return out


def _draw_field(draw: st.DrawFn, field: Field, depth: int, max_depth: int) -> Any:
    deep = depth >= max_depth
    nil = _ABSENT if field.omitempty or field.omitzero else None
    element = value(field.type, depth + 1, max_depth) if field.is_message else _SCALARS[field.type]
    if field.label == "r":
        items = [] if deep else draw(st.lists(element, max_size=2))
        return items or nil
    if field.label == "m":
        entries = {} if deep else draw(st.dictionaries(_KEYS, element, max_size=2))
        return {k: entries[k] for k in sorted(entries)} or nil
    if field.pointer and (deep or draw(st.booleans())):
        return nil
    drawn = draw(element)
    if field.is_message:
        if drawn is None and field.pointer:  # JSON null reads as a nil pointer
            return nil
        if not field.pointer and field.omitzero and drawn == _zero_json(field.type):
            return _ABSENT
        return drawn
    if not field.pointer and (field.omitempty or field.omitzero) and drawn in _ZEROS:
        return _ABSENT
    return drawn


def _zero_json(name: str) -> Any:
    from gpuops_sim.apiserver.protobuf.codec import decode_message_named

    return decode_message_named(name, b"")

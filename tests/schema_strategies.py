"""Hypothesis strategies for the objects a CRD's schema admits, derived from the schema itself.

The schema is the one the API server checks (generated from our API types), so the strategies follow every
change to it: types, required properties, enums, bounds, lengths, formats, list and map limits, and the syntax
our CEL rules check with `matches` (a string's pattern, a map's key and value patterns, a list's item pattern),
which becomes `st.from_regex`. Rules relating several fields (`minimum <= maximum`, placements inside a GPU) are
not solved here: a drawn object that breaks one is refused by the API server, and the caller rejects that draw.

Values lean to the edges (bounds, empty and longest strings, one past the usual), where a controller's
arithmetic and formatting break, and collections stay small (a reconcile's cost, not its size, is the point).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

MAX_ITEMS = 3
"""Most list items and map entries drawn, whatever the schema allows."""

_MATCHES = re.compile(r"^self\.matches\(r'(?P<re>.*)'\)$")
_KEYS = re.compile(r"^self\.all\((?P<v>\w+), (?:size\((?P=v)\) <= \d+ && )?(?P=v)\.matches\(r'(?P<re>.*)'\)\)$")
_VALUES = re.compile(r"^self\.all\((?P<v>\w+), self\[(?P=v)\]\.matches\(r'(?P<re>.*)'\)\)$")
_QUANTITY = "isQuantity("


def _rules(schema: Mapping[str, Any]) -> list[str]:
    return [str(r["rule"]) for r in schema.get("x-kubernetes-validations") or ()]


def _pattern(rules: list[str], form: re.Pattern[str]) -> str | None:
    for rule in rules:
        m = form.match(rule)
        if m is not None:
            return m.group("re")
    return None


def _edgy_int(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({low, high, min(high, low + 1), max(low, high - 1), min(max(0, low), high)})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _quantity() -> st.SearchStrategy[str]:
    """Kubernetes quantities, plain and suffixed, from the tiniest to the largest a rule might bound."""
    return st.one_of(
        st.integers(1, 10**6).map(str),
        st.decimals(min_value=0, max_value=10**4, places=6, allow_nan=False).map(lambda d: f"{d:f}"),
        st.sampled_from(["500m", "1Ki", "2e3", "0.000001", "1u", "999999999", "1E", "123456789012345678901234567890"]),
    )


def _nonempty_first(low: int) -> st.SearchStrategy[int]:
    """A collection's size: three times in four at least one (an empty one is often refused or means nothing)."""
    if low >= MAX_ITEMS:
        return st.just(low)
    return st.integers(0, 3).flatmap(lambda r: st.just(low) if r == 0 else st.integers(max(low, 1), MAX_ITEMS))


def _string(schema: Mapping[str, Any], pattern: str | None) -> st.SearchStrategy[str]:
    low, high = int(schema.get("minLength", 0)), int(schema.get("maxLength", 64))
    if "enum" in schema:
        return st.sampled_from([str(v) for v in schema["enum"]])
    if schema.get("format") == "date-time":
        moments = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))
        return moments.map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ"))
    if _QUANTITY in " ".join(_rules(schema)):
        return _quantity()
    if pattern is not None:
        return st.from_regex(pattern, fullmatch=True).filter(lambda s: low <= len(s) <= high)
    alphabet = st.characters(codec="utf-8", exclude_categories=("Cs",))
    return st.one_of(
        st.text(alphabet, min_size=low, max_size=min(high, 24)),
        st.just("x" * high) if high < 4096 else st.just("x" * low),
    )


Overrides = Mapping[str, st.SearchStrategy[Any]]


def _object(schema: Mapping[str, Any], path: str, over: Overrides) -> st.SearchStrategy[dict[str, Any]]:
    props: Mapping[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    if not props:
        extra = schema.get("additionalProperties")
        if not isinstance(extra, Mapping):
            return st.just({})
        rules = _rules(schema)
        key_re = _pattern(rules, _KEYS)
        keys = st.from_regex(key_re, fullmatch=True) if key_re else st.text(
            st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)
        value_re = _pattern(rules, _VALUES)
        values = _string(extra, value_re) if value_re else for_schema(extra, f"{path}{{}}", over)
        cap = min(MAX_ITEMS, int(schema.get("maxProperties", MAX_ITEMS)))
        low = int(schema.get("minProperties", 0))
        return _nonempty_first(low).flatmap(
            lambda n: st.dictionaries(keys, values, min_size=min(n, cap), max_size=max(min(n, cap), low)))

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or draw(st.integers(0, 3)) > 0:  # optional ones: three times in four
                out[name] = draw(for_schema(sub, f"{path}.{name}", over))
        return out

    return build()


def for_schema(schema: Mapping[str, Any], path: str = "", overrides: Overrides | None = None) -> st.SearchStrategy[Any]:
    """Values the structural `schema` admits by type, bounds and syntax (see the module docstring).

    `overrides` maps a field's path (as "spec.scaleUp.url", list items as "spec.items[]") to the strategy to
    use there instead: for values that reach outside the test (a URL whose host might resolve) or must name
    objects of the test's cluster (a node) to be meaningful.
    """
    over = overrides or {}
    if path in over:
        return over[path]
    if schema.get("x-kubernetes-int-or-string"):
        if _QUANTITY in " ".join(_rules(schema)):
            return st.one_of(_quantity(), st.integers(1, 10**6))
        return st.one_of(_edgy_int(0, 2**31 - 1), st.sampled_from(["0", "1", "25%", "100%"]))
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return st.just({})
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, path, over)
    if kind == "array":
        item = schema.get("items") or {"type": "string"}
        item_re = _pattern(_rules(schema), _KEYS)
        items = _string(item, item_re) if item_re else for_schema(item, f"{path}[]", over)
        low = int(schema.get("minItems", 0))
        high = max(low, min(MAX_ITEMS, int(schema.get("maxItems", MAX_ITEMS))))
        unique = schema.get("x-kubernetes-list-type") == "set"
        keys = schema.get("x-kubernetes-list-map-keys")
        sizes = _nonempty_first(low).map(lambda n: min(n, high))
        if keys:
            return sizes.flatmap(lambda n: st.lists(
                items, min_size=n, max_size=n, unique_by=lambda v: tuple(repr(v.get(k)) for k in keys)))
        return sizes.flatmap(lambda n: st.lists(items, min_size=n, max_size=n, unique=unique))
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return _edgy_int(int(schema.get("minimum", -(2**53))), int(schema.get("maximum", 2**53)))
    if kind == "number":
        low, high = float(schema.get("minimum", -1e12)), float(schema.get("maximum", 1e12))
        return st.one_of(st.sampled_from([low, high]), st.floats(low, high, allow_nan=False))
    if kind == "string":
        return _string(schema, _pattern(_rules(schema), _MATCHES))
    raise ValueError(f"{path or '/'}: no strategy for a schema of type {kind!r}")

"""Compiled label selectors, and the anchors that let an index find the selectors a label set may satisfy.

Matching a pod against every selector of a namespace costs O(selectors) per event; with 1,000 budgets in one
namespace that scan was most of the operator's CPU. Every requirement of a selector must hold, so one of them
suffices to find candidates: a matchLabels pair, or an `In` requirement (one anchor per value). Only selectors
made of NotIn/Exists/DoesNotExist alone fall back to the wildcard anchor, which every label set reaches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .objects import LabelSelector

__all__ = ["ANY", "Selector", "SelectorError", "anchors_of", "compile_selector"]

ANY = "*"
"""The anchor of selectors with no equality requirement; `anchors_of` always includes it."""

_SET_OPS = ("In", "NotIn")
_EXIST_OPS = ("Exists", "DoesNotExist")


class SelectorError(ValueError):
    """A selector we refuse: `field` is its JSON path, the message says how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled metav1.LabelSelector: every requirement must hold."""

    labels: tuple[tuple[str, str], ...]
    expressions: tuple[tuple[str, str, frozenset[str]], ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        have = labels or {}
        for key, value in self.labels:
            if have.get(key) != value:
                return False
        for key, op, values in self.expressions:
            present = key in have
            if op == "In":
                if not present or have[key] not in values:
                    return False
            elif op == "NotIn":
                if present and have[key] in values:
                    return False
            elif op == "Exists":
                if not present:
                    return False
            elif present:  # DoesNotExist
                return False
        return True

    def anchor(self) -> tuple[str, tuple[str, ...]] | None:
        """One requirement every match satisfies, as (key, accepted values); None when there is none."""
        if self.labels:
            key, value = self.labels[0]
            return key, (value,)
        ins = [(key, values) for key, op, values in self.expressions if op == "In"]
        if ins:
            key, values = min(ins, key=lambda kv: len(kv[1]))
            return key, tuple(sorted(values))
        return None

    def anchors(self) -> tuple[str, ...]:
        """Index values under which to file this selector ("key=value" pairs, or ANY)."""
        hit = self.anchor()
        if hit is None:
            return (ANY,)
        key, values = hit
        return tuple(f"{key}={v}" for v in values)


def anchors_of(labels: Mapping[str, str] | None) -> list[str]:
    """The index values to look up for a label set: each of its pairs, and ANY."""
    out = [f"{k}={v}" for k, v in (labels or {}).items()]
    out.append(ANY)
    return out


def compile_selector(selector: LabelSelector | None, field: str = "spec.selector", *,
                     allow_empty: bool = False) -> Selector:
    """Check and compile. An empty selector matches everything in Kubernetes; refused unless `allow_empty`."""
    if selector is None:
        if allow_empty:
            return Selector((), ())
        raise SelectorError(field, "required: set matchLabels or matchExpressions to choose the objects")
    labels = tuple(sorted((selector.match_labels or {}).items()))
    expressions: list[tuple[str, str, frozenset[str]]] = []
    for i, req in enumerate(selector.match_expressions or ()):
        where = f"{field}.matchExpressions[{i}]"
        if not req.key:
            raise SelectorError(f"{where}.key", "required: the label key to test")
        values = tuple(req.values or ())
        if req.operator in _SET_OPS:
            if not values:
                raise SelectorError(f"{where}.values", f"operator {req.operator} needs at least one value")
        elif req.operator in _EXIST_OPS:
            if values:
                raise SelectorError(f"{where}.values", f"operator {req.operator} takes no values; remove them")
        else:
            raise SelectorError(
                f"{where}.operator", f"unsupported value {req.operator!r}: use In, NotIn, Exists or DoesNotExist"
            )
        expressions.append((req.key, req.operator, frozenset(values)))
    if not labels and not expressions and not allow_empty:
        raise SelectorError(field, "must not be empty: an empty selector would match every object; set matchLabels")
    return Selector(labels, tuple(expressions))

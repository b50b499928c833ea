"""gpuops.kube.selectors: matching semantics, errors that name the field, and anchors that never miss a match."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops.kube.objects import LabelSelector
from gpuops.kube.selectors import ANY, SelectorError, anchors_of, compile_selector

KEYS = st.sampled_from(["team", "app", "tier", "gpu"])
VALUES = st.sampled_from(["a", "b", "c"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=4)


@st.composite
def selectors(draw: st.DrawFn) -> LabelSelector:
    match_labels = draw(st.dictionaries(KEYS, VALUES, max_size=2))
    exprs = []
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        values = draw(st.lists(VALUES, min_size=1, max_size=3, unique=True)) if op in ("In", "NotIn") else []
        exprs.append({"key": draw(KEYS), "operator": op, "values": values})
    return msgspec.convert({"matchLabels": match_labels, "matchExpressions": exprs}, LabelSelector)


@given(selectors(), LABELS)
def test_a_match_always_shares_an_anchor(selector: LabelSelector, labels: dict[str, str]) -> None:
    """The index is sound: a selector filed under its anchors is found from any label set it matches."""
    sel = compile_selector(selector, allow_empty=True)
    if sel.matches(labels):
        assert set(sel.anchors()) & set(anchors_of(labels))


@given(selectors())
def test_only_selectors_without_equality_fall_back_to_the_wildcard(selector: LabelSelector) -> None:
    sel = compile_selector(selector, allow_empty=True)
    has_equality = bool(sel.labels) or any(op == "In" for _, op, _ in sel.expressions)
    assert (sel.anchors() == (ANY,)) is not has_equality


def test_in_anchors_on_its_smallest_value_set() -> None:
    sel = compile_selector(msgspec.convert({"matchExpressions": [
        {"key": "team", "operator": "In", "values": ["a", "b", "c"]},
        {"key": "app", "operator": "In", "values": ["x"]}]}, LabelSelector))
    assert sel.anchors() == ("app=x",)


def test_semantics_of_each_operator() -> None:
    sel = compile_selector(msgspec.convert({"matchLabels": {"a": "1"}, "matchExpressions": [
        {"key": "b", "operator": "In", "values": ["x", "y"]},
        {"key": "c", "operator": "NotIn", "values": ["z"]},
        {"key": "d", "operator": "Exists"},
        {"key": "e", "operator": "DoesNotExist"}]}, LabelSelector))
    assert sel.matches({"a": "1", "b": "x", "d": ""})  # NotIn holds when the key is absent
    assert not sel.matches({"a": "1", "b": "x", "c": "z", "d": ""})
    assert not sel.matches({"a": "1", "b": "q", "d": ""})
    assert not sel.matches({"a": "1", "b": "x", "d": "", "e": "1"})
    assert not sel.matches(None)


@pytest.mark.parametrize(("doc", "field", "fix"), [
    ({}, "spec.selector", "must not be empty"),
    ({"matchExpressions": [{"key": "", "operator": "Exists"}]}, "spec.selector.matchExpressions[0].key", "required"),
    ({"matchExpressions": [{"key": "k", "operator": "In"}]}, "spec.selector.matchExpressions[0].values",
     "at least one value"),
    ({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]},
     "spec.selector.matchExpressions[0].values", "remove them"),
    ({"matchExpressions": [{"key": "k", "operator": "Near"}]}, "spec.selector.matchExpressions[0].operator",
     "use In, NotIn, Exists or DoesNotExist"),
])
def test_errors_name_the_field_and_the_fix(doc: dict[str, object], field: str, fix: str) -> None:
    with pytest.raises(SelectorError, match=fix) as err:
        compile_selector(msgspec.convert(doc, LabelSelector))
    assert err.value.field == field


def test_empty_is_allowed_when_asked_and_matches_everything() -> None:
    assert compile_selector(None, allow_empty=True).matches({"any": "thing"})
    assert compile_selector(LabelSelector(), allow_empty=True).matches(None)

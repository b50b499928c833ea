"""`merge_patch` against RFC 7386's own apply algorithm: the patch computed from two JSON objects turns the first
into the second, for generated JSON trees where members are null, absent, or of kinds Python's == confuses."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from gpuops.kube.mergepatch import merge_patch

NAMES = ("a", "b", "c", "dé")
"""A few names only, so that old and new often share members (and one is null where the other is absent)."""
names = st.sampled_from(NAMES)
strings = st.sampled_from(["", "1", "é"])
scalars = st.none() | st.booleans() | st.integers(-2, 2) | st.floats(-2, 2, allow_nan=False) | strings


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3)


trees = scalars | st.recursive(scalars, containers, max_leaves=12)
objects = st.dictionaries(names, trees, max_size=4)


def twins(value: Any) -> list[Any]:
    """Values of another JSON kind that Python's == takes for `value` (true and 1, 1 and 1.0)."""
    if isinstance(value, bool | int | float) and value == int(value):
        return [v for v in (bool(value), int(value), float(value)) if v == value and type(v) is not type(value)]
    return []


@st.composite
def variant(draw: st.DrawFn, tree: Any) -> Any:
    """`tree` with a few changes of the kinds a differ gets wrong: members dropped, nulled or added, scalars
    swapped for their twins, and the same at any depth."""
    if isinstance(tree, dict):
        out = {}
        for name, value in tree.items():
            change = draw(st.sampled_from(["keep", "change", "change", "drop", "null"]))
            if change == "change":
                out[name] = draw(variant(value))
            elif change != "drop":
                out[name] = value if change == "keep" else None
        unused = [n for n in NAMES if n not in tree]
        return {**out, **(draw(st.dictionaries(st.sampled_from(unused), trees, max_size=1)) if unused else {})}
    if isinstance(tree, list):
        if not draw(st.booleans()):
            return draw(trees)
        return [draw(variant(item)) if draw(st.booleans()) else item for item in tree]
    alike = twins(tree)
    swap: bool = bool(alike) and draw(st.booleans())
    return draw(st.sampled_from(alike)) if swap else draw(trees)


@st.composite
def twin_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """An object, and the same object with one scalar in it, in a member or an array's item at some depth,
    swapped for a twin."""
    value: Any = draw(st.sampled_from([0, 1, -1, True, False, 0.0, 1.0, -1.0]))
    old, new = value, draw(st.sampled_from(twins(value)))
    for in_array in [*draw(st.lists(st.booleans(), max_size=2)), False]:  # the outermost is an object
        if in_array:
            before, after = draw(st.lists(trees, max_size=2)), draw(st.lists(trees, max_size=2))
            old, new = [*before, old, *after], [*before, new, *after]
        else:
            others, name = draw(objects), draw(names)
            old, new = {**others, name: old}, {**others, name: new}
    return old, new


@st.composite
def before_after(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two objects: unrelated, or the second a near variant of the first."""
    old = draw(objects)
    return old, draw(objects | variant(old))


def apply(target: Any, patch: Any) -> Any:
    """RFC 7386 section 2, MergePatch(Target, Patch): an object patch sets or (null) removes members of the
    target, recursively, on an empty object when the target is not one; any other patch replaces the target."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = apply(out.get(name), value)
    return out


def without_nulls(value: Any) -> Any:
    """The document a merge patch can produce: no member is null (items of arrays, replaced whole, may be)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


def kinds(value: Any) -> Any:
    """`value` with each scalar tagged by its JSON kind, so that == tells true from 1 and 1 from 1.0."""
    if isinstance(value, dict):
        return ("object", sorted((k, kinds(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", [kinds(v) for v in value])
    return (type(value).__name__, value)


@given(before_after())
def test_the_patch_turns_old_into_new(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Applied to the stored object (which holds no null member), the patch gives exactly `new` less its nulls;
    applied to `old` with its null members, the same up to those; and it changes neither argument."""
    old, new = pair
    before_old, before_new = copy.deepcopy(old), copy.deepcopy(new)
    patch = merge_patch(old, new)
    assert (kinds(old), kinds(new)) == (kinds(before_old), kinds(before_new))
    assert kinds(apply(without_nulls(old), patch)) == kinds(without_nulls(new))
    assert kinds(without_nulls(apply(old, patch))) == kinds(without_nulls(new))


@given(twin_pairs())
def test_a_scalar_of_another_kind_is_a_change(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """1, 1.0 and true are three JSON values though Python's == takes them for one: swapping one for another, in a
    member or in an array, is a change the patch makes."""
    old, new = pair
    patch = merge_patch(old, new)
    assert patch != {}
    assert kinds(apply(without_nulls(old), patch)) == kinds(without_nulls(new))


@given(before_after())
def test_the_patch_is_empty_exactly_when_nothing_changes(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """No write for an object that did not change (null and absent being one), and always one when it did."""
    old, new = pair
    same = kinds(without_nulls(old)) == kinds(without_nulls(new))
    assert (merge_patch(old, new) == {}) == same
    assert merge_patch(new, new) == {}
    assert merge_patch(new, copy.deepcopy(new)) == {}


@given(objects)
def test_from_no_object_the_patch_is_the_new_one(new: dict[str, Any]) -> None:
    assert kinds(apply(None, merge_patch(None, new))) == kinds(without_nulls(new))


class Item(msgspec.Struct, rename="camel", omit_defaults=True):
    pod_name: str = ""
    count: int = 0


class Inner(msgspec.Struct, rename="camel", omit_defaults=True):
    label: str = ""
    since: str | None = None
    items: tuple[Item, ...] | None = None


class Status(msgspec.Struct, rename="camel", omit_defaults=True):
    observed: int = 0
    note: str | None = None
    ready: bool | None = None
    inner: Inner | None = None
    tags: tuple[str, ...] | None = None


items = st.builds(Item, pod_name=st.sampled_from(["", "p", "q"]), count=st.integers(0, 2))
inners = st.builds(Inner, label=st.sampled_from(["", "x"]), since=st.none() | st.just("t"),
                   items=st.none() | st.lists(items, max_size=3).map(tuple))
statuses = st.builds(Status, observed=st.integers(0, 2), note=st.none() | st.sampled_from(["", "n"]),
                     ready=st.none() | st.booleans(), inner=st.none() | inners,
                     tags=st.none() | st.lists(st.sampled_from(["a", "b"]), max_size=2).map(tuple))


@given(statuses, statuses)
def test_structs_are_objects_of_their_fields(old: Status, new: Status) -> None:
    """Our API types as they are: the stored form of `old` patched decodes to `new` (a field that went back to its
    default is sent as that value; None deletes it), under the fields' JSON names, nested Structs member by member.
    """
    patch = merge_patch(old, new)
    stored = msgspec.to_builtins(old)
    assert msgspec.convert(apply(stored, patch), Status) == new
    assert (patch == {}) == (old == new)
    assert set(patch) <= {"observed", "note", "ready", "inner", "tags"}

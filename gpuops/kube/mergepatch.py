"""RFC 7386 JSON merge patches between the object a controller read and the one it wants stored.

Why here: a controller that writes a status it computed sends only what changed, as a merge patch guarded by the
resourceVersion it read. The write stays small (a budget's ledger holds hundreds of entries that rarely change),
a field the controller did not change is not rewritten, and an unchanged object costs no write at all. Computing
that patch is generic JSON work in which a mistake silently keeps a stale field or drops a live one, so it is done
once, here, and checked against the RFC's own apply algorithm (tests/kube/test_mergepatch.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import msgspec

__all__ = ["JSONObject", "merge_patch"]

JSONObject: TypeAlias = Mapping[str, Any] | msgspec.Struct
"""A JSON object as decoded (a dict) or as one of our API types: a Struct is the object of all its fields, under
their JSON names."""

_ARRAYS = (list, tuple)
_NESTED = (Mapping, list, tuple)


def merge_patch(old: JSONObject | None, new: JSONObject) -> dict[str, Any]:
    """The merge patch that turns `old` into `new`; empty when there is nothing to write.

    A merge patch deletes a member by setting it to null and cannot store a null, so a member whose value is null
    (a Struct field that is None) is the same as an absent one, on either side: applying the patch to `old` gives
    `new` without its null members. Objects are diffed member by member at every depth; any other value that
    differs, arrays included (a merge patch replaces them whole), is sent as `new` has it. Values compare as JSON
    values do: true, 1 and 1.0 differ. `old` None is an absent object.
    """
    before = dict(_members(old)) if old is not None else {}
    patch: dict[str, Any] = {}
    for name, value in _members(new):
        prior = before.pop(name, None)
        if value is None:
            if prior is not None:
                patch[name] = None
        elif _is_object(value) and _is_object(prior):
            if nested := merge_patch(prior, value):
                patch[name] = nested
        elif not _same(prior, value):
            patch[name] = msgspec.to_builtins(value)
    patch.update((name, None) for name, prior in before.items() if prior is not None)
    return patch


def _is_object(value: Any) -> bool:
    return isinstance(value, Mapping | msgspec.Struct)


def _members(obj: JSONObject) -> Iterable[tuple[str, Any]]:
    if isinstance(obj, msgspec.Struct):
        cls = type(obj)  # the class attributes, not msgspec.structs.fields (which re-resolves annotations)
        return zip(cls.__struct_encode_fields__, (getattr(obj, name) for name in cls.__struct_fields__), strict=True)
    return obj.items()


def _same(a: Any, b: Any) -> bool:
    """JSON equality: Python's == alone takes True for 1 and 1 for 1.0."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(value, b[name]) for name, value in a.items())
    if isinstance(a, _ARRAYS) and isinstance(b, _ARRAYS):
        return len(a) == len(b) and _same_items(a, b)
    return type(a) is type(b) and a == b


def _same_items(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Two arrays of one length, item by item. When the items pair up by type and none is an array or a dict,
    one == compares them all at C speed (a ledger holds hundreds of entries): exact for scalars of one type, and
    for Structs of one class wherever a field's declared type admits a single JSON kind, as in our API types."""
    kinds = list(map(type, a))
    if type(a) is type(b) and kinds == list(map(type, b)) and not any(issubclass(k, _NESTED) for k in set(kinds)):
        return a == b
    return all(map(_same, a, b))

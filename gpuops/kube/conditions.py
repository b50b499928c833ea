"""metav1.Condition semantics as pure functions over the JSON shape of ``status.conditions``.

Mirrors ``k8s.io/apimachinery/pkg/api/meta.SetStatusCondition``: ``lastTransitionTime`` moves only
when ``status`` changes, so dashboards and ``kubectl wait`` can tell "since when" from "last
reconciled". There is no clock here: ``now`` is an argument, which keeps every function pure and
property-testable. Inputs are never mutated; results are fresh lists of fresh dicts, ready for a
status patch. Items may be plain dicts or msgspec Structs (``objects.Condition``): both are read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import msgspec

__all__ = [
    "MAX_MESSAGE_LENGTH",
    "MAX_REASON_LENGTH",
    "MAX_TYPE_LENGTH",
    "ConditionStatus",
    "format_time",
    "get_condition",
    "is_false",
    "is_true",
    "is_unknown",
    "remove_condition",
    "set_condition",
    "validate_condition",
]

ConditionStatus = Literal["True", "False", "Unknown"]

MAX_TYPE_LENGTH = 316  # 253 (DNS subdomain prefix) + "/" + 63 (name)
MAX_REASON_LENGTH = 1024
MAX_MESSAGE_LENGTH = 32768

_STATUSES = ("True", "False", "Unknown")
# The OpenAPI patterns of metav1.Condition (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
_REASON_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_TYPE_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_MAX_NAME_PART = 63
_MAX_PREFIX = 253

Item = TypeVar("Item")


def format_time(now: datetime | str) -> str:
    """RFC 3339 at second precision in UTC, as metav1.Time serializes; strings pass through checked."""
    if isinstance(now, str):
        try:
            datetime.fromisoformat(now.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"now: {now!r} is not an RFC 3339 timestamp") from None
        return now
    if now.tzinfo is None:
        raise ValueError("now: a naive datetime is ambiguous; pass an aware datetime (UTC)")
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def validate_condition(
    type: str,
    status: str,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
) -> None:
    """Raise ValueError naming the offending field, with the rules the API server enforces."""
    if not isinstance(type, str) or not type:
        raise ValueError("type: required")
    if len(type) > MAX_TYPE_LENGTH or not _TYPE_RE.match(type):
        raise ValueError(
            f"type: {type!r} must be a qualified name ([prefix/]name, name matching "
            f"'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]', at most {MAX_TYPE_LENGTH} characters)"
        )
    prefix, _, name = type.rpartition("/")
    if len(name) > _MAX_NAME_PART or len(prefix) > _MAX_PREFIX:
        raise ValueError(
            f"type: {type!r}: the name part may have {_MAX_NAME_PART} characters, the prefix {_MAX_PREFIX}"
        )
    if status not in _STATUSES:
        raise ValueError(f"status: {status!r} must be one of True, False, Unknown")
    if not isinstance(reason, str) or not reason:
        raise ValueError("reason: required (CamelCase, e.g. 'QuotaExceeded')")
    if len(reason) > MAX_REASON_LENGTH or not _REASON_RE.match(reason):
        raise ValueError(
            f"reason: {reason!r} must match '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$' "
            f"and be at most {MAX_REASON_LENGTH} characters"
        )
    if not isinstance(message, str):
        raise ValueError("message: must be a string")
    if len(message) > MAX_MESSAGE_LENGTH:
        raise ValueError(f"message: {len(message)} characters; at most {MAX_MESSAGE_LENGTH} allowed")
    if observed_generation is not None and (
        isinstance(observed_generation, bool) or not isinstance(observed_generation, int) or observed_generation < 0
    ):
        raise ValueError(f"observedGeneration: {observed_generation!r} must be a non-negative integer")


def _field(item: Any, json_name: str, attr: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(json_name)
    return getattr(item, attr, None)


def _type_of(item: Any) -> Any:
    return _field(item, "type", "type")


def _as_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return dict(item)
    if isinstance(item, msgspec.Struct):
        out = msgspec.to_builtins(item)
        if isinstance(out, dict):
            return out
    raise TypeError(f"conditions: items must be mappings or msgspec Structs, got {item.__class__.__name__}")


def set_condition(
    conditions: Iterable[Any] | None,
    type: str,
    status: ConditionStatus | str,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    *,
    now: datetime | str,
) -> list[dict[str, Any]]:
    """Return ``conditions`` with ``type`` set; ``result == list(conditions)`` exactly when nothing changed.

    lastTransitionTime becomes ``now`` for a new type or a status change and is kept otherwise
    (a missing one is filled in). reason, message and observedGeneration are updated in place,
    order is stable, a new type is appended, and later duplicates of ``type`` are dropped so a
    type is never listed twice. ``observed_generation=None`` leaves the stored value alone.
    """
    validate_condition(type, status, reason, message, observed_generation)
    stamp = format_time(now)
    out: list[dict[str, Any]] = []
    found = False
    for item in conditions or ():
        if _type_of(item) != type:
            out.append(_as_dict(item))
            continue
        if found:
            continue  # a duplicate of the type we set: the API server would reject the list (listMapKey)
        found = True
        cond = _as_dict(item)
        if cond.get("status") != status or not cond.get("lastTransitionTime"):
            cond["lastTransitionTime"] = stamp
        cond["status"] = status
        cond["reason"] = reason
        cond["message"] = message
        if observed_generation is not None:
            cond["observedGeneration"] = observed_generation
        out.append(cond)
    if not found:
        new: dict[str, Any] = {"type": type, "status": status}
        if observed_generation is not None:
            new["observedGeneration"] = observed_generation
        new.update(lastTransitionTime=stamp, reason=reason, message=message)
        out.append(new)
    return out


def get_condition(conditions: Iterable[Item] | None, type: str) -> Item | None:
    """The first condition of ``type`` (dict or Struct, as stored), or None."""
    for item in conditions or ():
        if _type_of(item) == type:
            return item
    return None


def _status_is(conditions: Iterable[Any] | None, type: str, want: str) -> bool:
    cond = get_condition(conditions, type)
    return cond is not None and _field(cond, "status", "status") == want


def is_true(conditions: Iterable[Any] | None, type: str) -> bool:
    return _status_is(conditions, type, "True")


def is_false(conditions: Iterable[Any] | None, type: str) -> bool:
    return _status_is(conditions, type, "False")


def is_unknown(conditions: Iterable[Any] | None, type: str) -> bool:
    """True when the condition is Unknown *or absent*, as meta.IsStatusConditionPresentAndEqual would not:
    an absent condition carries no knowledge, which is what Unknown means."""
    cond = get_condition(conditions, type)
    return cond is None or _field(cond, "status", "status") == "Unknown"


def remove_condition(conditions: Iterable[Any] | None, type: str) -> list[dict[str, Any]]:
    """All conditions but those of ``type``, order kept."""
    return [_as_dict(item) for item in conditions or () if _type_of(item) != type]

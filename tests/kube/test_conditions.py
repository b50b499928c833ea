"""metav1.Condition helpers: meta.SetStatusCondition semantics, validation, and their invariants."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops.kube import objects
from gpuops.kube.conditions import (
    format_time,
    get_condition,
    is_false,
    is_true,
    is_unknown,
    remove_condition,
    set_condition,
    validate_condition,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T1 = T0 + timedelta(minutes=1)
S0, S1 = "2026-01-02T03:04:05Z", "2026-01-02T03:05:05Z"


def test_new_condition_is_appended_with_now() -> None:
    out = set_condition([], "Ready", "True", "AllGood", "fine", 3, now=T0)
    assert out == [
        {"type": "Ready", "status": "True", "observedGeneration": 3, "lastTransitionTime": S0,
         "reason": "AllGood", "message": "fine"}
    ]
    assert set_condition(None, "Ready", "False", "No", now=T0)[0]["message"] == ""


def test_transition_time_moves_only_on_status_change() -> None:
    c = set_condition([], "Ready", "True", "A", "m", 1, now=T0)
    same = set_condition(c, "Ready", "True", "B", "other", 2, now=T1)
    assert same[0]["lastTransitionTime"] == S0
    assert (same[0]["reason"], same[0]["message"], same[0]["observedGeneration"]) == ("B", "other", 2)
    flipped = set_condition(same, "Ready", "False", "B", "other", 2, now=T1)
    assert flipped[0]["lastTransitionTime"] == S1


def test_unchanged_set_returns_equal_list_and_does_not_mutate() -> None:
    c = set_condition([], "Ready", "True", "A", "m", 1, now=T0)
    frozen = copy.deepcopy(c)
    again = set_condition(c, "Ready", "True", "A", "m", 1, now=T1)
    assert again == c and again is not c and again[0] is not c[0]
    assert c == frozen


def test_order_stable_and_observed_generation_none_keeps_value() -> None:
    c = set_condition([], "A", "True", "R", now=T0)
    c = set_condition(c, "B", "True", "R", observed_generation=7, now=T0)
    c = set_condition(c, "C", "True", "R", now=T0)
    c2 = set_condition(c, "B", "False", "R2", now=T1)
    assert [x["type"] for x in c2] == ["A", "B", "C"]
    assert c2[1]["observedGeneration"] == 7


def test_missing_transition_time_is_filled() -> None:
    out = set_condition([{"type": "Ready", "status": "True", "reason": "X", "message": ""}], "Ready", "True", "X",
                        now=T0)
    assert out[0]["lastTransitionTime"] == S0


def test_duplicates_of_the_set_type_are_collapsed() -> None:
    dup = [{"type": "Ready", "status": "True"}, {"type": "X", "status": "True"}, {"type": "Ready", "status": "False"}]
    out = set_condition(dup, "Ready", "True", "R", now=T0)
    assert [c["type"] for c in out] == ["Ready", "X"]


def test_accepts_condition_structs_and_returns_dicts() -> None:
    structs = [objects.Condition(type="Ready", status="True", last_transition_time=S0, reason="A", message="m",
                                 observed_generation=1)]
    out = set_condition(structs, "Ready", "True", "B", "m", now=T1)
    assert out == [{"type": "Ready", "status": "True", "observedGeneration": 1, "lastTransitionTime": S0,
                    "reason": "B", "message": "m"}]
    assert get_condition(structs, "Ready") is structs[0]
    assert is_true(structs, "Ready") and not is_false(structs, "Ready") and not is_unknown(structs, "Ready")
    # the result decodes back into the Struct
    assert msgspec.convert(out[0], objects.Condition).reason == "B"


def test_get_and_predicates() -> None:
    c = set_condition([], "Ready", "False", "R", now=T0)
    c = set_condition(c, "Degraded", "Unknown", "R", now=T0)
    assert get_condition(c, "Ready") == c[0] and get_condition(c, "Nope") is None
    assert is_false(c, "Ready") and not is_true(c, "Ready")
    assert is_unknown(c, "Degraded") and is_unknown(c, "Absent")
    assert not is_true(None, "Ready") and not is_false(None, "Ready")


def test_remove_condition() -> None:
    c = set_condition([], "A", "True", "R", now=T0)
    c = set_condition(c, "B", "True", "R", now=T0)
    assert [x["type"] for x in remove_condition(c, "A")] == ["B"]
    assert remove_condition(c, "Z") == c
    assert remove_condition(None, "A") == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"type": ""}, "type"),
        ({"type": "has space"}, "type"),
        ({"type": "Bad/Prefix/Name"}, "type"),
        ({"type": "x" * 64}, "type"),
        ({"status": "true"}, "status"),
        ({"reason": ""}, "reason"),
        ({"reason": "1Starts"}, "reason"),
        ({"reason": "Ends,"}, "reason"),
        ({"reason": "Has Space"}, "reason"),
        ({"reason": "R" * 1025}, "reason"),
        ({"message": "m" * 32769}, "message"),
        ({"observed_generation": -1}, "observedGeneration"),
    ],
)
def test_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"type": "Ready", "status": "True", "reason": "Ok", "message": "", "observed_generation": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=rf"^{field}:"):
        validate_condition(**args)
    with pytest.raises(ValueError, match=rf"^{field}:"):
        set_condition([], now=T0, **args)


@pytest.mark.parametrize("good", ["Ready", "example.com/Ready", "gpuops.io/budget-ok", "A", "a_b.c-d"])
def test_valid_types(good: str) -> None:
    validate_condition(good, "True", "Some_Reason:x,y")


def test_now_forms() -> None:
    assert format_time(S0) == S0
    with pytest.raises(ValueError, match=r"^now:"):
        format_time("yesterday")
    with pytest.raises(ValueError, match=r"^now:"):
        format_time(datetime(2026, 1, 1))  # naive: ambiguous
    cet = timezone(timedelta(hours=1))
    assert format_time(datetime(2026, 1, 2, 5, 4, 5, tzinfo=cet)) == "2026-01-02T04:04:05Z"


# ------------------------------------------------------------------------------------- properties

types_ = st.sampled_from(["Ready", "Degraded", "Progressing", "gpuops.io/Budget", "Available"])
statuses = st.sampled_from(["True", "False", "Unknown"])
reasons = st.from_regex(r"\A[A-Za-z]([A-Za-z0-9_,:]{0,6}[A-Za-z0-9_])?\Z")
messages = st.text(max_size=20)
gens = st.none() | st.integers(min_value=0, max_value=100)
times = st.integers(min_value=0, max_value=10_000).map(lambda s: T0 + timedelta(seconds=s))
ops = st.tuples(types_, statuses, reasons, messages, gens, times)


def _apply(ops_: list[tuple[str, str, str, str, int | None, datetime]]) -> list[dict[str, Any]]:
    c: list[dict[str, Any]] = []
    for t, s, r, m, g, now in ops_:
        c = set_condition(c, t, s, r, m, g, now=now)
    return c


@given(st.lists(ops, max_size=12), ops, times)
def test_set_is_idempotent(history: list[Any], op: Any, later: datetime) -> None:
    c = set_condition(_apply(history), *op[:5], now=op[5])
    assert set_condition(c, *op[:5], now=later) == c


@given(st.lists(ops, max_size=12), ops)
def test_transition_time_rule(history: list[Any], op: Any) -> None:
    before = _apply(history)
    t, s, r, m, g, now = op
    after = set_condition(before, t, s, r, m, g, now=now)
    old, new = get_condition(before, t), get_condition(after, t)
    assert new is not None
    assert (new["status"], new["reason"], new["message"]) == (s, r, m)
    if old is None or old["status"] != s:
        assert new["lastTransitionTime"] == format_time(now)
    else:
        assert new["lastTransitionTime"] == old["lastTransitionTime"]
    if g is not None:
        assert new["observedGeneration"] == g
    elif old is not None:
        assert new.get("observedGeneration") == old.get("observedGeneration")


@given(st.lists(ops, max_size=20))
def test_never_duplicates_a_type_and_keeps_first_seen_order(history: list[Any]) -> None:
    c = _apply(history)
    kinds = [x["type"] for x in c]
    assert len(kinds) == len(set(kinds))
    first_seen = list(dict.fromkeys(op[0] for op in history))
    assert kinds == first_seen


@given(st.lists(ops, max_size=12), ops)
def test_other_conditions_untouched_and_input_not_mutated(history: list[Any], op: Any) -> None:
    before = _apply(history)
    snapshot = copy.deepcopy(before)
    after = set_condition(before, *op[:5], now=op[5])
    assert before == snapshot
    assert [x for x in after if x["type"] != op[0]] == [x for x in before if x["type"] != op[0]]


@given(st.lists(ops, max_size=12), types_)
def test_exactly_one_status_predicate_holds(history: list[Any], t: str) -> None:
    c = _apply(history)
    assert [is_true(c, t), is_false(c, t), is_unknown(c, t)].count(True) == 1
    assert get_condition(remove_condition(c, t), t) is None

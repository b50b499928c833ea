"""CEL x-kubernetes-validations rules: compilation, evaluation, causes."""

from __future__ import annotations

from typing import Any

import pytest

from gpuops_sim.apiserver import cel
from gpuops_sim.apiserver.errors import Cause


def obj_schema(props: dict[str, Any], *rules: dict[str, Any] | str, **extra: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if rules:
        s["x-kubernetes-validations"] = [{"rule": r} if isinstance(r, str) else r for r in rules]
    return s


INT = {"type": "integer"}
STR = {"type": "string"}
STR_MAP = {"type": "object", "additionalProperties": STR}


def run(schema: dict[str, Any], value: Any, old: Any = None, path: str = "spec", **kw: Any) -> list[Cause]:
    return cel.evaluate_rules(schema, value, old, path, **kw)


def messages(causes: list[Cause]) -> list[tuple[str, str, str]]:
    return [(c.reason, c.field, c.message) for c in causes]


# -- compilation -----------------------------------------------------------------------------------------


def test_compile_rule_is_cached() -> None:
    assert cel.compile_rule("self.a > 1") is cel.compile_rule("self.a > 1")


@pytest.mark.parametrize("rule", ["self.x >", "self..x", "'abc", "self.x +* 2"])
def test_compile_syntax_error_is_value_error(rule: str) -> None:
    with pytest.raises(ValueError, match=r"ERROR: <input>:1:\d+: Syntax error"):
        cel.compile_rule(rule)


def test_compile_rejects_undeclared_reference() -> None:
    with pytest.raises(ValueError, match="undeclared reference to 'foo'"):
        cel.compile_rule("foo.bar > 1")
    # macro variables and type names are declared
    cel.compile_rule("self.all(x, x > 0) && self.exists(y, y == 2) && type(self) == list")


def test_uses_old_self_only_for_the_variable() -> None:
    assert cel.compile_rule("self == oldSelf").uses_old_self
    assert not cel.compile_rule("self.oldSelf == 1 && 'oldSelf' != ''").uses_old_self


# -- the rule forms our CRDs use -------------------------------------------------------------------------

RANGE = obj_schema({"minimum": INT, "maximum": INT}, "self.minimum <= self.maximum")
SELECTOR = obj_schema(
    {"matchLabels": STR_MAP, "matchExpressions": {"type": "array", "items": {"type": "object"}}},
    "has(self.matchLabels) || has(self.matchExpressions)",
)
NON_EMPTY = obj_schema(
    {"matchLabels": STR_MAP, "matchExpressions": {"type": "array", "items": {"type": "object"}}},
    "size(self.matchLabels) > 0 || size(self.matchExpressions) > 0",
)


@pytest.mark.parametrize(
    ("schema", "value", "ok"),
    [
        (RANGE, {"minimum": 1, "maximum": 2}, True),
        (RANGE, {"minimum": 2, "maximum": 2}, True),
        (RANGE, {"minimum": 3, "maximum": 2}, False),
        (SELECTOR, {"matchLabels": {}}, True),
        (SELECTOR, {"matchExpressions": []}, True),
        (SELECTOR, {}, False),
        (NON_EMPTY, {"matchLabels": {"a": "b"}}, True),
        (NON_EMPTY, {"matchLabels": {}, "matchExpressions": [{}]}, True),
        (NON_EMPTY, {"matchLabels": {}, "matchExpressions": []}, False),
        (
            {
                "type": "array",
                "items": STR,
                "x-kubernetes-validations": [{"rule": "self.all(x, x.size() > 0)"}],
            },
            ["a", "b"],
            True,
        ),
        (
            {
                "type": "array",
                "items": STR,
                "x-kubernetes-validations": [{"rule": "self.all(x, x.size() > 0)"}],
            },
            ["a", ""],
            False,
        ),
        (obj_schema({"x": INT}, "!has(self.x) || self.x >= 1"), {}, True),
        (obj_schema({"x": INT}, "!has(self.x) || self.x >= 1"), {"x": 1}, True),
        (obj_schema({"x": INT}, "!has(self.x) || self.x >= 1"), {"x": 0}, False),
        (
            {"type": "string", "x-kubernetes-validations": [{"rule": "self.startsWith('nvidia.com/')"}]},
            "nvidia.com/gpu",
            True,
        ),
        (
            {"type": "string", "x-kubernetes-validations": [{"rule": "self.startsWith('nvidia.com/')"}]},
            "amd.com/gpu",
            False,
        ),
        (
            {
                "type": "string",
                "x-kubernetes-validations": [{"rule": "self.endsWith('gb') && self.contains('g.')"}],
            },
            "1g.10gb",
            True,
        ),
        (
            {
                "type": "string",
                "x-kubernetes-validations": [{"rule": "self.matches('^[0-9]+g\\\\.[0-9]+gb$')"}],
            },
            "1g.10gb",
            True,
        ),
        (
            {"type": "array", "items": INT, "x-kubernetes-validations": [{"rule": "self.exists(x, x == 2)"}]},
            [1, 3],
            False,
        ),
        (
            {
                "type": "array",
                "items": INT,
                "x-kubernetes-validations": [{"rule": "self.filter(x, x > 1).map(x, x * 2) == [4, 6]"}],
            },
            [1, 2, 3],
            True,
        ),
    ],
)
def test_concrete_rules(schema: dict[str, Any], value: Any, ok: bool) -> None:
    causes = run(schema, value)
    assert (causes == []) is ok, messages(causes)
    if not ok:
        assert causes[0].reason == "FieldValueInvalid"
        assert "failed rule: " in causes[0].message


def test_missing_key_is_an_evaluation_error_not_a_crash() -> None:
    # `false || <error>` is an error in CEL, as upstream reports it
    causes = run(NON_EMPTY, {"matchLabels": {}})
    assert messages(causes) == [
        (
            "FieldValueInvalid",
            "spec",
            'Invalid value: "object": no such key: matchExpressions evaluating rule: '
            "size(self.matchLabels) > 0 || size(self.matchExpressions) > 0",
        )
    ]


def test_other_evaluation_errors_become_causes() -> None:
    div = obj_schema({"x": INT}, "10 / self.x > 1")
    assert messages(run(div, {"x": 0})) == [
        (
            "FieldValueInvalid",
            "spec",
            'Invalid value: "object": division by zero evaluating rule: 10 / self.x > 1',
        )
    ]
    overload = obj_schema({"x": STR}, "self.x + 1 > 0")
    [cause] = run(overload, {"x": "a"})
    assert cause.message.startswith(
        "Invalid value: \"object\": 'no such overload': call arguments did not match"
    )
    assert cause.message.endswith("for rule: self.x + 1 > 0")


# -- causes ----------------------------------------------------------------------------------------------


def test_default_message_omits_object_value() -> None:
    assert messages(run(RANGE, {"minimum": 3, "maximum": 2}, path="spec.quota")) == [
        ("FieldValueInvalid", "spec.quota", "Invalid value: failed rule: self.minimum <= self.maximum")
    ]


def test_scalar_failure_shows_the_value() -> None:
    s = {"type": "integer", "x-kubernetes-validations": [{"rule": "self % 2 == 0"}]}
    assert messages(run(s, 3, path="spec.n")) == [
        ("FieldValueInvalid", "spec.n", "Invalid value: 3: failed rule: self % 2 == 0")
    ]
    s = {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'x'", "message": " no x "}]}
    assert messages(run(s, "x", path="spec.s")) == [
        ("FieldValueInvalid", "spec.s", 'Invalid value: "x": no x')
    ]


def test_root_rule_field_is_nil() -> None:
    s = obj_schema({"spec": {"type": "object"}}, "has(self.spec)")
    assert run(s, {"apiVersion": "a/v1", "kind": "K"}, path="", is_resource_root=True)[0].field == "<nil>"


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("FieldValueForbidden", ("FieldValueForbidden", "Forbidden: nope")),
        ("FieldValueRequired", ("FieldValueRequired", "Required value: nope")),
        ("FieldValueInvalid", ("FieldValueInvalid", "Invalid value: nope")),
        ("FieldValueDuplicate", ("FieldValueDuplicate", "Duplicate value")),
    ],
)
def test_reason(reason: str, expected: tuple[str, str]) -> None:
    s = obj_schema({"x": INT}, {"rule": "false", "message": "nope", "reason": reason})
    [cause] = run(s, {"x": 1})
    assert (cause.reason, cause.message) == expected


def test_field_path_is_appended() -> None:
    s = obj_schema(
        {"minimum": INT, "maximum": INT, "labels": {"type": "object", "additionalProperties": STR}},
        {"rule": "self.minimum <= self.maximum", "fieldPath": ".maximum"},
        {"rule": "false", "fieldPath": ".labels['a.b']", "message": "bad label"},
    )
    assert [c.field for c in run(s, {"minimum": 3, "maximum": 1, "labels": {}}, path="spec.quota")] == [
        "spec.quota.maximum",
        "spec.quota.labels[a.b]",
    ]


def test_message_expression() -> None:
    s = obj_schema(
        {"x": INT},
        {"rule": "self.x < 10", "messageExpression": "'x is ' + string(self.x) + ', want < 10'"},
    )
    assert run(s, {"x": 12})[0].message == "Invalid value: x is 12, want < 10"
    # a failing or non-string messageExpression falls back to message, then to the default
    bad = obj_schema(
        {"x": INT}, {"rule": "self.x < 10", "messageExpression": "self.nope", "message": "too big"}
    )
    assert run(bad, {"x": 12})[0].message == "Invalid value: too big"
    bad2 = obj_schema({"x": INT}, {"rule": "self.x < 10", "messageExpression": "1"})
    assert run(bad2, {"x": 12})[0].message == "Invalid value: failed rule: self.x < 10"


# -- transition rules ------------------------------------------------------------------------------------


def test_transition_rule_needs_old_value() -> None:
    s = {
        "type": "string",
        "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "is immutable"}],
    }
    assert run(s, "a", None) == []
    assert run(s, "a", "a") == []
    assert messages(run(s, "b", "a", path="spec.pool")) == [
        ("FieldValueInvalid", "spec.pool", 'Invalid value: "b": is immutable')
    ]


def test_object_immutability() -> None:
    s = obj_schema({"a": {"type": "array", "items": INT}}, "self == oldSelf")
    assert run(s, {"a": [1, 2]}, {"a": [1, 2]}) == []
    assert len(run(s, {"a": [1, 2, 3]}, {"a": [1, 2]})) == 1


def test_optional_old_self() -> None:
    s = {
        "type": "integer",
        "x-kubernetes-validations": [
            {"rule": "!oldSelf.hasValue() || self >= oldSelf.value()", "optionalOldSelf": True},
            {"rule": "self >= oldSelf.orValue(0)", "optionalOldSelf": True},
        ],
    }
    assert run(s, 5, None) == []
    assert run(s, 5, 3) == []
    assert len(run(s, 2, 3)) == 2


# -- typing of self --------------------------------------------------------------------------------------


def test_number_fields_are_doubles_with_numeric_equality() -> None:
    s = obj_schema({"ratio": {"type": "number"}}, "self.ratio == 1 && self.ratio > 0.5 && self.ratio != 2")
    assert run(s, {"ratio": 1}) == []
    assert run(s, {"ratio": 1.0}) == []


def test_int_or_string_is_dynamic() -> None:
    s = obj_schema(
        {"q": {"x-kubernetes-int-or-string": True}},
        "type(self.q) == int ? self.q > 0 : self.q.endsWith('h')",
    )
    assert run(s, {"q": 3}) == []
    assert run(s, {"q": "3h"}) == []
    assert len(run(s, {"q": "3"})) == 1


def test_property_names_are_escaped() -> None:
    s = obj_schema(
        {"foo-bar": INT, "a.b": INT, "x/y": INT, "in": INT, "__u": INT},
        "self.foo__dash__bar == 1 && self.a__dot__b == 2 && self.x__slash__y == 3 && self.__in__ == 4"
        " && self.__underscores__u == 5",
    )
    assert run(s, {"foo-bar": 1, "a.b": 2, "x/y": 3, "in": 4, "__u": 5}) == []
    assert cel.escape_property("1abc") is None


def test_root_sees_only_name_and_generate_name_of_metadata() -> None:
    s = obj_schema(
        {"spec": {"type": "object"}},
        "self.metadata.name.startsWith('gwb-') && self.kind == 'GPUWorkloadBudget'"
        " && !has(self.metadata.labels)",
    )
    obj = {
        "apiVersion": "gpuops.io/v1alpha1",
        "kind": "GPUWorkloadBudget",
        "spec": {},
        "metadata": {"name": "gwb-a", "labels": {"a": "b"}, "namespace": "ns"},
    }
    assert run(s, obj, path="", is_resource_root=True) == []


def test_formats_become_cel_types() -> None:
    s = obj_schema(
        {"at": {"type": "string", "format": "date-time"}, "every": {"type": "string", "format": "duration"}},
        "self.at < timestamp('2030-01-01T00:00:00Z') && self.every > duration('1m')",
    )
    assert run(s, {"at": "2026-01-02T03:04:05Z", "every": "5m"}) == []


# -- extension functions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule",
    [
        "'ABC'.lowerAscii() == 'abc' && 'abc'.upperAscii() == 'ABC'",
        "'  x '.trim() == 'x'",
        "'a,b,c'.split(',') == ['a', 'b', 'c'] && ['a', 'b'].join('-') == 'a-b'",
        "'hello'.indexOf('l') == 2 && 'hello'.lastIndexOf('l') == 3 && 'hello'.substring(1, 3) == 'el'",
        "'hello'.replace('l', 'L') == 'heLLo' && 'hello'.charAt(1) == 'e'",
        "[1, 2, 3].isSorted() && [3, 1, 2].sum() == 6 && [3, 1, 2].min() == 1 && [3, 1, 2].max() == 3",
        "[1, 2, 3].indexOf(2) == 1 && [1, 2, 2].lastIndexOf(2) == 2",
        "'abc123'.find('[0-9]+') == '123' && 'a1b22'.findAll('[0-9]+') == ['1', '22']",
        "quantity('1Gi').isGreaterThan(quantity('1G')) && quantity('500m').isLessThan(quantity('1'))",
        "quantity('2').asInteger() == 2 && quantity('1500m').compareTo(quantity('1.5')) == 0",
        "isQuantity('10Mi') && !isQuantity('ten') && quantity('1k').add(quantity('1')).isInteger()",
        "quantity('1') == quantity('1000m') && quantity('2').sub(1).asInteger() == 1",
    ],
)
def test_extension_functions(rule: str) -> None:
    s = {"type": "object", "x-kubernetes-validations": [{"rule": rule}]}
    assert run(s, {}) == []


def test_parse_quantity() -> None:
    from fractions import Fraction

    assert cel.parse_quantity("1Ki") == 1024
    assert cel.parse_quantity("250m") == Fraction(1, 4)
    assert cel.parse_quantity("1e3") == 1000
    assert cel.parse_quantity("1.5G") == 1_500_000_000
    assert cel.parse_quantity("abc") is None


def test_rule_compile_error_at_runtime_is_a_cause() -> None:
    s = obj_schema({"x": INT}, "self.x >")
    [cause] = run(s, {"x": 1})
    assert cause.message.startswith('Invalid value: "object": rule compile error: compilation failed: ERROR:')


def test_null_values_are_not_validated() -> None:
    s = {"type": "string", "nullable": True, "x-kubernetes-validations": [{"rule": "self.size() > 3"}]}
    assert run(s, None) == []


def test_rule_results_are_remembered_only_for_pure_rules_that_passed() -> None:
    """A value that passed a node's rules (none reading oldSelf) is not evaluated again; a failing value is
    reported every time; a transition rule always runs against its old value."""
    from gpuops_sim.apiserver import cel

    node = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "x-kubernetes-validations": [{"rule": "self.a <= self.b", "message": "a must not exceed b"}]}
    assert cel.evaluate_rules(node, {"a": 1, "b": 2}, None, "spec") == []
    assert cel.evaluate_rules(node, {"a": 1, "b": 2}, None, "spec") == []
    for _ in range(2):
        [cause] = cel.evaluate_rules(node, {"a": 3, "b": 2}, None, "spec")
        assert (cause.field, cause.message) == ("spec", 'Invalid value: a must not exceed b')
    frozen = {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "immutable"}]}
    assert cel.evaluate_rules(frozen, "x", "x", "spec.k") == []
    assert [c.field for c in cel.evaluate_rules(frozen, "x", "y", "spec.k")] == ["spec.k"]

"""Label and field selectors: labelSelector grammar and matching, fieldSelector, filtering of watches."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.resources import ResourceInfo, builtin_resources
from gpuops_sim.apiserver.selectors import (
    FieldSelector,
    LabelSelector,
    field_value,
    label_selector_from_object,
    match_none,
    matches_all,
    parse_field_selector,
    parse_label_selector,
)

RES = {r.kind: r for r in builtin_resources()}
POD, NODE, EVENT, NS, CM, JOB = (
    RES["Pod"],
    RES["Node"],
    RES["Event"],
    RES["Namespace"],
    RES["ConfigMap"],
    RES["Job"],
)
WIDGET = ResourceInfo(
    group="example.com",
    version="v1",
    resource="widgets",
    kind="Widget",
    singular="widget",
    namespaced=True,
    crd_name="widgets.example.com",
    selectable_fields=("spec.color", ".spec.size", "spec.enabled"),
)
CLUSTER_WIDGET = ResourceInfo(
    group="example.com",
    version="v1",
    resource="gizmos",
    kind="Gizmo",
    singular="gizmo",
    namespaced=False,
    crd_name="gizmos.example.com",
)


def bad(fn: object, *args: object) -> str:
    with pytest.raises(StatusError) as ei:
        fn(*args)  # type: ignore[operator]
    assert ei.value.code == 400 and ei.value.reason == "BadRequest"
    return ei.value.message


# ---------------------------------------------------------------------------------------------------------
# label selector grammar and matching


def test_equality_set_and_existence_terms() -> None:
    sel = parse_label_selector("team=a,tier in (x,y),!gone")
    assert sel.matches({"team": "a", "tier": "y"})
    assert not sel.matches({"team": "a", "tier": "z"})
    assert not sel.matches({"team": "a", "tier": "x", "gone": ""})
    assert not sel.matches({"tier": "x"})
    assert parse_label_selector("a==b").matches({"a": "b"})
    assert parse_label_selector("a").matches({"a": ""})
    assert not parse_label_selector("a").matches({})
    assert str(sel) == "!gone,team=a,tier in (x,y)"  # sorted by key, upstream spelling


def test_negative_operators_match_objects_without_the_key() -> None:
    for text in ("a!=b", "a notin (b,c)"):
        sel = parse_label_selector(text)
        assert sel.matches({}) and sel.matches(None) and sel.matches({"a": "z"})
        assert not sel.matches({"a": "b"})


def test_empty_selector_matches_everything() -> None:
    sel = parse_label_selector("")
    assert sel.empty and sel.matches(None) and sel.matches({"x": "y"})
    assert parse_label_selector("   ").empty


def test_whitespace_and_keywords_as_values() -> None:
    sel = parse_label_selector("  tier   in ( x , y ) ,  team = a  ")
    assert sel.matches({"tier": "x", "team": "a"})
    # What `tier+in+%28x%2Cy%29` decodes to, and `in`/`notin` used as a key and a value.
    assert parse_label_selector("tier in (x,y)").matches({"tier": "y"})
    assert parse_label_selector("in in (notin)").matches({"in": "notin"})


def test_empty_values() -> None:
    assert parse_label_selector("a=").matches({"a": ""})
    assert parse_label_selector("a in ()").matches({"a": ""})
    sel = parse_label_selector("a in (x,,y)")
    assert sel.matches({"a": ""}) and sel.matches({"a": "y"})
    assert str(sel) == "a in (,x,y)"


def test_upstream_quirk_two_trailing_empty_values() -> None:
    # labels.Parse consumes the second comma of ",," and then rejects ")" -- so do we.
    assert (
        bad(parse_label_selector, "a in (,,)")
        == "unable to parse requirement: found ')', expected: ',', or identifier"
    )
    assert (
        bad(parse_label_selector, "a in (x,,)")
        == "unable to parse requirement: found ')', expected: ',', or identifier"
    )
    assert parse_label_selector("a in (,,x)").matches({"a": ""})


def test_greater_and_less_than() -> None:
    assert parse_label_selector("n>5").matches({"n": "6"})
    assert not parse_label_selector("n>5").matches({"n": "5"})
    assert not parse_label_selector("n<5").matches({"n": "x"})
    assert not parse_label_selector("n<5").matches({})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
        ("a,", "found '', expected: identifier after ','"),
        (",a", "found ',', expected: !, identifier, or 'end of string'"),
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        ("!a=b", "found '=', expected: ',' or 'end of string'"),
        ("a in b", "unable to parse requirement: found 'b' expected: '('"),
        ("a in (x", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("a in (b c)", "unable to parse requirement: found 'c', expected: ',' or ')'"),
        ("a===b", "unable to parse requirement: found '=', expected: identifier"),
        (
            "a>x",
            'unable to parse requirement: values[0]: Invalid value: "x": '
            "for 'Gt', 'Lt' operators, the value must be an integer",
        ),
        ("/a", 'unable to parse requirement: <nil>: Invalid value: "/a": prefix part must be non-empty'),
    ],
)
def test_parse_errors_are_400_with_upstream_messages(text: str, message: str) -> None:
    assert bad(parse_label_selector, text) == message


def test_key_and_value_validation_messages() -> None:
    assert bad(parse_label_selector, "-a") == (
        'unable to parse requirement: <nil>: Invalid value: "-a": name part must consist of alphanumeric '
        "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  "
        "or 'my.name',  or '123-abc', regex used for validation is "
        "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    )
    msg = bad(parse_label_selector, "a=-b")
    assert msg.startswith(
        'unable to parse requirement: values[0][a]: Invalid value: "-b": a valid label must be'
    )
    assert "must be no more than 63 bytes" in bad(parse_label_selector, "k=" + "v" * 64)
    assert "name part must be no more than 63 bytes" in bad(parse_label_selector, "k" * 64)
    assert "prefix part a lowercase RFC 1123 subdomain" in bad(parse_label_selector, "Ex.com/a")
    assert parse_label_selector("example.com/a-b_c.d=x").matches({"example.com/a-b_c.d": "x"})


def test_exact_for_index_lookups() -> None:
    assert parse_label_selector("app=web,tier!=db").exact("app") == "web"
    assert parse_label_selector("app in (web)").exact("app") == "web"
    assert parse_label_selector("app in (web,api)").exact("app") is None
    assert parse_label_selector("app!=web").exact("app") is None
    assert parse_label_selector("tier=x").exact("app") is None


def test_label_selector_from_object_semantics() -> None:
    assert not label_selector_from_object(None).matches({})
    assert not match_none().matches({"a": "b"}) and not match_none().empty
    assert label_selector_from_object({}).empty
    assert label_selector_from_object({"matchLabels": {}, "matchExpressions": []}).matches({})
    sel = label_selector_from_object(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["z1"]},
                {"key": "gpu", "operator": "Exists"},
            ],
        }
    )
    assert sel.matches({"app": "web", "tier": "a", "gpu": "1"})
    assert not sel.matches({"app": "web", "tier": "a", "gpu": "1", "canary": "y"})
    assert not sel.matches({"app": "web", "tier": "a", "gpu": "1", "zone": "z1"})
    assert str(sel) == "app=web,!canary,gpu,tier in (a,b),zone notin (z1)"
    assert sel.exact("app") == "web"


@pytest.mark.parametrize(
    ("sel", "message"),
    [
        (
            {"matchExpressions": [{"key": "a", "operator": "Foo"}]},
            '"Foo" is not a valid label selector operator',
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
            "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            'values: Invalid value: []string{"x"}: values set must be empty for exists and does not exist',
        ),
    ],
)
def test_label_selector_from_object_rejects_invalid(sel: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as ei:
        label_selector_from_object(sel)
    assert str(ei.value) == message


def test_label_selector_from_object_rejects_bad_shapes() -> None:
    for sel in ({"matchLabels": {"a": 1}}, {"matchLabels": {"-a": "b"}}, {"matchExpressions": "x"}, "x"):
        with pytest.raises(ValueError):
            label_selector_from_object(sel)  # type: ignore[arg-type]


# --- property tests ------------------------------------------------------------------------------------

_name = st.from_regex(r"[a-z0-9]([-a-z0-9_.]{0,10}[a-z0-9])?", fullmatch=True)
_key = st.one_of(
    _name, st.builds(lambda p, n: f"{p}/{n}", st.from_regex(r"[a-z]{1,5}\.[a-z]{2,3}", fullmatch=True), _name)
)
_value = st.one_of(st.just(""), _name)
_requirement = st.one_of(
    st.builds(lambda k, op, v: f"{k}{op}{v}", _key, st.sampled_from(["=", "==", "!="]), _value),
    st.builds(
        lambda k, op, vs: f"{k} {op} ({','.join(vs)})",
        _key,
        st.sampled_from(["in", "notin"]),
        st.lists(_value, min_size=1, max_size=3, unique=True),
    ),
    _key,
    st.builds(lambda k: "!" + k, _key),
)
_labels = st.dictionaries(_key, _value, max_size=5)


def _model(req: str, labels: dict[str, str]) -> bool:
    """An independent reading of one generated requirement."""
    if req.startswith("!"):
        return req[1:] not in labels
    for op in (" notin (", " in ("):
        if op in req:
            key, rest = req.split(op)
            values = set(rest[:-1].split(","))
            hit = key in labels and labels[key] in values
            return (not hit) if "notin" in op else hit
    for op in ("!=", "==", "="):
        if op in req:
            key, value = req.split(op, 1)
            return (labels.get(key) != value) if op == "!=" else (key in labels and labels[key] == value)
    return req in labels


@settings(max_examples=300, deadline=None)
@given(st.lists(_requirement, max_size=4), _labels)
def test_property_round_trip_and_matching(reqs: list[str], labels: dict[str, str]) -> None:
    text = ",".join(reqs)
    sel = parse_label_selector(text)
    again = parse_label_selector(str(sel))
    assert again == sel and str(again) == str(sel)
    assert sel.matches(labels) == all(_model(r, labels) for r in reqs)
    assert again.matches(labels) == sel.matches(labels)


@settings(max_examples=200, deadline=None)
@given(_key, st.lists(_value, min_size=1, max_size=3, unique=True), _labels)
def test_property_negations_match_missing_keys(
    key: str, values: list[str], labels: dict[str, str]
) -> None:
    labels.pop(key, None)
    assert parse_label_selector(f"{key}!={values[0]}").matches(labels)
    assert parse_label_selector(f"{key} notin ({','.join(values)})").matches(labels)
    assert not parse_label_selector(f"{key} in ({','.join(values)})").matches(labels)
    assert parse_label_selector(f"!{key}").matches(labels)


_grammar_text = st.text(alphabet=st.sampled_from(list("ab/.-_=!(), \tin<>0\\x")), max_size=30)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=40), _grammar_text))
def test_label_selector_parsing_never_crashes(text: str) -> None:
    try:
        sel = parse_label_selector(text)
    except StatusError as e:
        assert e.code == 400 and e.reason == "BadRequest" and e.message
        return
    assert isinstance(sel, LabelSelector)
    sel.matches({"a": "b"})
    assert parse_label_selector(str(sel)) == sel


# ---------------------------------------------------------------------------------------------------------
# field selectors


def _pod(**over: object) -> dict[str, object]:
    pod: dict[str, object] = {
        "metadata": {"name": "p1", "namespace": "ns", "labels": {"app": "web"}},
        "spec": {
            "nodeName": "n1",
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
        },
        "status": {
            "phase": "Running",
            "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}],
            "podIP": "10.0.0.1",
        },
    }
    pod.update(over)
    return pod


def test_operators_and_and() -> None:
    sel = parse_field_selector("status.phase=Running,spec.nodeName==n1", POD)
    assert sel.matches(_pod())
    assert not sel.matches(_pod(spec={"nodeName": "n2"}))
    assert parse_field_selector("status.phase!=Pending", POD).matches(_pod())
    assert not parse_field_selector("status.phase!=Running", POD).matches(_pod())
    assert sel.requirements == [("spec.nodeName", "=", "n1"), ("status.phase", "=", "Running")]
    assert sel.exact("spec.nodeName") == "n1" and sel.exact("metadata.name") is None
    assert parse_field_selector("", POD).empty and parse_field_selector(",,", POD).empty


def test_missing_fields_read_as_empty() -> None:
    pending = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}, "status": {}}
    assert parse_field_selector("spec.nodeName=", POD).matches(pending)
    assert parse_field_selector("spec.nodeName!=", POD).matches(_pod())
    assert field_value(pending, POD, "spec.hostNetwork") == "false"
    assert field_value({"spec": {"hostNetwork": True}}, POD, "spec.hostNetwork") == "true"


def test_pod_ip_fields() -> None:
    assert field_value(_pod(), POD, "status.podIP") == "10.0.0.1"
    assert field_value({"status": {"podIP": "10.0.0.9"}}, POD, "status.podIP") == "10.0.0.9"
    # Accepted by the conversion but not in upstream's pod field set: always "".
    assert field_value(_pod(), POD, "status.podIPs") == ""


def test_backslash_escapes() -> None:
    sel = parse_field_selector(r"metadata.name=a\,b\=c\\d", CM)
    assert sel.requirements == [("metadata.name", "=", "a,b=c\\d")]
    assert sel.matches({"metadata": {"name": "a,b=c\\d"}})
    assert str(sel) == r"metadata.name=a\,b\=c\\d"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("status.phase", "invalid selector: 'status.phase'; can't understand 'status.phase'"),
        ("a!b,metadata.name=x", "invalid selector: 'a!b,metadata.name=x'; can't understand 'a!b'"),
        ("metadata.name=a=b", "invalid field selector: unescaped character in value: 61"),
        (r"metadata.name=a\x", "invalid field selector: invalid escape sequence: \\x"),
        ("metadata.name=a\\", "invalid field selector: invalid escape sequence: \\"),
        ("spec.foo=x", "field label not supported: spec.foo"),
    ],
)
def test_pod_errors(text: str, message: str) -> None:
    assert bad(parse_field_selector, text, POD) == message


def test_unsupported_field_messages_by_kind() -> None:
    # Kinds without a registered conversion use the default one's message.
    assert bad(parse_field_selector, "foo.bar=baz", CM) == (
        '"foo.bar" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )
    assert bad(parse_field_selector, "spec.x=1", RES["Lease"]).startswith(
        '"spec.x" is not a known field selector'
    )
    # Custom resources answer like upstream's CR converter does.
    assert bad(parse_field_selector, "foo.bar=baz", WIDGET) == "field label not supported: foo.bar"
    assert bad(parse_field_selector, "metadata.namespace=a", CLUSTER_WIDGET) == (
        "field label not supported: metadata.namespace"
    )
    assert (
        bad(parse_field_selector, "metadata.namespace=a", NODE)
        == "field label not supported: metadata.namespace"
    )
    assert (
        bad(parse_field_selector, "metadata.namespace=a", NS)
        == "field label not supported: metadata.namespace"
    )


def test_supported_fields_per_kind() -> None:
    for text in (
        "spec.nodeName=a",
        "spec.restartPolicy=a",
        "spec.schedulerName=a",
        "spec.serviceAccountName=a",
        "spec.hostNetwork=true",
        "status.phase=a",
        "status.podIP=a",
        "status.podIPs=a",
        "status.nominatedNodeName=a",
        "metadata.name=a",
        "metadata.namespace=a",
    ):
        parse_field_selector(text, POD)
    for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"):
        parse_field_selector(f"involvedObject.{f}=x", EVENT)
    for f in ("reason", "reportingComponent", "source", "type"):
        parse_field_selector(f"{f}=x", EVENT)
    parse_field_selector("status.phase=Active", NS)
    parse_field_selector("spec.unschedulable=true", NODE)
    parse_field_selector("type=Opaque", RES["Secret"])
    parse_field_selector("status.successful=1", JOB)
    parse_field_selector("metadata.name=a,metadata.namespace=b", CM)


def test_spec_host_alias() -> None:
    assert parse_field_selector("spec.host=n1", POD).requirements == [("spec.nodeName", "=", "n1")]


def test_field_values_of_other_kinds() -> None:
    ev = {
        "metadata": {"name": "e", "namespace": "ns"},
        "involvedObject": {"kind": "Pod", "name": "p1"},
        "reason": "Evicted",
        "type": "Warning",
        "reportingComponent": "gpuops",
        "source": {},
    }
    assert parse_field_selector("involvedObject.kind=Pod,involvedObject.name=p1,type=Warning", EVENT).matches(
        ev
    )
    assert field_value(ev, EVENT, "source") == "gpuops"  # falls back to reportingComponent
    assert field_value({**ev, "source": {"component": "kubelet"}}, EVENT, "source") == "kubelet"
    assert field_value({"spec": {"unschedulable": True}}, NODE, "spec.unschedulable") == "true"
    assert field_value({"spec": {}}, NODE, "spec.unschedulable") == "false"
    assert field_value({"status": {}}, JOB, "status.successful") == "0"
    assert field_value({"status": {"succeeded": 3}}, JOB, "status.successful") == "3"
    assert field_value({"type": "Opaque"}, RES["Secret"], "type") == "Opaque"
    assert field_value({"metadata": {"name": "n", "namespace": "x"}}, NODE, "metadata.namespace") == ""


def test_custom_resource_selectable_fields() -> None:
    obj = {
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"color": "red", "size": 3, "enabled": False},
    }
    assert parse_field_selector("spec.color=red,spec.size=3,spec.enabled=false", WIDGET).matches(obj)
    assert not parse_field_selector("spec.color=blue", WIDGET).matches(obj)
    assert parse_field_selector("metadata.namespace=ns", WIDGET).matches(obj)
    assert field_value({"spec": {}}, WIDGET, "spec.color") == ""


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.text(alphabet=st.sampled_from(list("ab.=!,\\ ")), max_size=20)))
def test_field_selector_parsing_never_crashes(text: str) -> None:
    try:
        sel = parse_field_selector(text, POD)
    except StatusError as e:
        assert e.code == 400 and e.reason == "BadRequest"
        return
    assert isinstance(sel, FieldSelector)
    sel.matches(_pod())


# ---------------------------------------------------------------------------------------------------------
# watch filtering helper


def test_matches_all() -> None:
    labels = parse_label_selector("app=web")
    fields = parse_field_selector("spec.nodeName=n1", POD)
    pod = _pod()
    before = copy.deepcopy(pod)
    assert matches_all(pod, labels, fields)
    assert not matches_all(None, labels, fields)
    assert not matches_all(_pod(metadata={"name": "p", "labels": {"app": "db"}}), labels, fields)
    assert matches_all({"metadata": {}}, LabelSelector(), FieldSelector())
    assert pod == before  # inputs untouched

"""Bad input over raw HTTP: malformed bodies, unknown fields, bad selectors, invalid CRs, oversized bodies, wrong
patch types, and a hypothesis fuzzer over methods, paths, query strings and bodies.

The invariants: the server never answers 5xx for bad input (504 for a too-new resourceVersion excepted, which
is upstream's answer), every error is a well-formed Status whose `code` is the HTTP status, and a rejected
request leaves the store exactly as it was (same resourceVersion, same objects).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops_sim.apiserver import lists, watch

NS = "default"
CMS = f"/api/v1/namespaces/{NS}/configmaps"
PODS = f"/api/v1/namespaces/{NS}/pods"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
GROUP = "example.com"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/{NS}/widgets"
MAX_BODY = 3 * 1024 * 1024


class Resp:
    def __init__(self, status: int, headers: http.client.HTTPMessage, raw: bytes) -> None:
        self.status = status
        self.headers = headers
        self.raw = raw
        try:
            self.body: Any = json.loads(raw) if raw else None
        except ValueError:
            self.body = None


class Client:
    """Plain http.client, so any method, path, header and byte string goes out exactly as written."""

    def __init__(self, rs: Any) -> None:
        self.rs = rs
        self.host, port = rs.url.removeprefix("http://").split(":")
        self.port = int(port)

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        ctype: str | None = "application/json",
        query: str = "",
        headers: dict[str, str] | None = None,
    ) -> Resp:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            hdrs = {"Authorization": f"Bearer {self.rs.token}", **(headers or {})}
            if body is not None and ctype is not None:
                hdrs["Content-Type"] = ctype
            conn.request(method, path + (f"?{query}" if query else ""), body=body, headers=hdrs)
            resp = conn.getresponse()
            return Resp(resp.status, resp.headers, resp.read())
        finally:
            conn.close()

    def json(self, method: str, path: str, obj: Any, **kw: Any) -> Resp:
        return self.call(method, path, json.dumps(obj).encode(), **kw)

    def state(self) -> tuple[int, bytes]:
        s = self.rs.server
        out: tuple[int, bytes] = self.rs.run(lambda: (s.store.rv, s.store.dump()))
        return out


def assert_status(r: Resp, code: int, reason: str | None = None) -> dict[str, Any]:
    assert r.status == code, (r.status, r.raw[:500])
    b = r.body
    assert isinstance(b, dict) and b.get("kind") == "Status" and b.get("apiVersion") == "v1", r.raw[:500]
    assert b["status"] == "Failure" and b["code"] == code and isinstance(b.get("message"), str)
    if reason is not None:
        assert b["reason"] == reason, b
    return b


def widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {
                                        "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                        "color": {"type": "string", "enum": ["red", "blue"]},
                                        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                                        "ref": {"type": "string", "pattern": "^[a-z]+$"},
                                    },
                                },
                                "status": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture
def client(apiserver: Any) -> Iterator[Client]:
    c = Client(apiserver)
    r = c.json("POST", CRDS, widget_crd())
    assert r.status == 201, r.raw
    r = c.json("POST", CMS, {"metadata": {"name": "base"}, "data": {"k": "v"}})
    assert r.status == 201
    r = c.json("POST", PODS, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert r.status == 201
    r = c.json("POST", WIDGETS, {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "w"},
                                 "spec": {"size": 1}})
    assert r.status == 201, r.raw
    yield c


def rejected_cleanly(c: Client, code: int, method: str, path: str, body: bytes | None, **kw: Any) -> dict[str, Any]:
    """The request fails with `code` and leaves the store untouched."""
    before = c.state()
    r = c.call(method, path, body, **kw)
    b = assert_status(r, code)
    assert c.state() == before, f"{method} {path} changed the store although it was rejected"
    return b


# ----------------------------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    "raw",
    [b"{", b'{"metadata": {"name": "x"}', b"not json", b"\xff\xfe\x00", b'{"a": 1,}', b"[1, 2", b""],
)
@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_malformed_json_400(client: Client, raw: bytes, method: str) -> None:
    path = CMS if method == "POST" else f"{CMS}/base"
    b = rejected_cleanly(client, 400, method, path, raw)
    assert b["reason"] == "BadRequest" and b["message"]


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"a string"', b"42", b"null", b'{"metadata": "x"}', b"true"])
def test_json_that_is_not_an_object_400(client: Client, raw: bytes) -> None:
    rejected_cleanly(client, 400, "POST", CMS, raw)
    rejected_cleanly(client, 400, "PUT", f"{CMS}/base", raw)


@pytest.mark.parametrize(
    "raw",
    [b"metadata: [unclosed", b"a: b: c", b"\t- x\n  y: [", b"key: 'unterminated", b"- a\n- b\n"],
)
def test_malformed_yaml_400(client: Client, raw: bytes) -> None:
    b = rejected_cleanly(client, 400, "POST", CMS, raw, ctype="application/yaml")
    assert b["reason"] == "BadRequest"
    rejected_cleanly(
        client, 400, "PATCH", f"{CMS}/base", raw, ctype="application/apply-patch+yaml", query="fieldManager=m"
    )


def test_yaml_body_accepted(client: Client) -> None:
    r = client.call(
        "POST", CMS, b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n  a: b\n", ctype="application/yaml"
    )
    assert r.status == 201 and r.body["data"] == {"a": "b"}


def test_kind_or_api_version_mismatch_400(client: Client) -> None:
    for api_version, kind in (("v1", "Secret"), ("apps/v1", "ConfigMap")):
        body = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
        rejected_cleanly(client, 400, "POST", CMS, json.dumps(body).encode())


# ----------------------------------------------------------------------------------------------- fieldValidation


def test_unknown_fields_strict_lists_them(client: Client) -> None:
    body = json.dumps({"metadata": {"name": "s"}, "data": {}, "bogus": 1, "spec": {"x": 1}}).encode()
    b = rejected_cleanly(client, 400, "POST", CMS, body, query="fieldValidation=Strict")
    assert b["reason"] == "BadRequest"
    assert b["message"].startswith("strict decoding error: ")
    assert 'unknown field "bogus"' in b["message"] and 'unknown field "spec"' in b["message"]
    wb = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "s"}, "spec": {"size": 1, "extra": 2}}
    b = rejected_cleanly(client, 400, "POST", WIDGETS, json.dumps(wb).encode(), query="fieldValidation=Strict")
    assert 'unknown field "spec.extra"' in b["message"]
    # Strict on update and on patch too.
    rejected_cleanly(client, 400, "PUT", f"{CMS}/base", body.replace(b'"s"', b'"base"'), query="fieldValidation=Strict")
    rejected_cleanly(
        client, 400, "PATCH", f"{WIDGETS}/w", b'{"spec": {"extra": 1}}', ctype="application/merge-patch+json",
        query="fieldValidation=Strict",
    )


@pytest.mark.apiserver_warnings('unknown field "bogus"', 'unknown field "other"', 'unknown field "spec.extra"')
def test_unknown_fields_warn_and_ignore(client: Client) -> None:
    body = {"metadata": {"name": "warned"}, "data": {}, "bogus": 1, "other": {"x": 1}}
    r = client.json("POST", CMS, body, query="fieldValidation=Warn")
    assert r.status == 201 and "bogus" not in r.body
    warnings = r.headers.get_all("Warning") or []
    assert sorted(warnings) == ['299 - "unknown field \\"bogus\\""', '299 - "unknown field \\"other\\""']
    # Warn is the default.
    r = client.json("POST", CMS, dict(body, metadata={"name": "default-warn"}))
    assert r.status == 201 and len(r.headers.get_all("Warning") or []) == 2
    r = client.json("POST", CMS, dict(body, metadata={"name": "ignored"}), query="fieldValidation=Ignore")
    assert r.status == 201 and not r.headers.get_all("Warning") and "bogus" not in r.body
    wb = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "ww"}, "spec": {"size": 1, "extra": 2}}
    r = client.json("POST", WIDGETS, wb, query="fieldValidation=Warn")
    assert r.status == 201 and "extra" not in r.body["spec"]
    assert r.headers.get_all("Warning") == ['299 - "unknown field \\"spec.extra\\""']
    rejected_cleanly(client, 400, "POST", CMS, json.dumps(body).encode(), query="fieldValidation=Loose")


# ----------------------------------------------------------------------------------------------- selectors


@pytest.mark.parametrize(
    "query",
    [
        "labelSelector=" + quote("a in (b"),
        "labelSelector=" + quote("a=b=c"),
        "labelSelector=" + quote("!"),
        "labelSelector=" + quote("a notin b"),
        "labelSelector=" + quote("-bad-key-=x"),
        "labelSelector=" + quote("a=" + "x" * 70),
        "fieldSelector=" + quote("metadata.name"),
        "fieldSelector=" + quote("spec.nope=x"),
        "fieldSelector=" + quote("metadata.name=a,=b"),
        "fieldSelector=" + quote("metadata.name~a"),
    ],
)
@pytest.mark.parametrize("path", [CMS, PODS, WIDGETS, "/api/v1/pods"])
def test_invalid_selectors_400(client: Client, query: str, path: str) -> None:
    b = assert_status(client.call("GET", path, query=query), 400, "BadRequest")
    assert b["message"]
    assert_status(client.call("GET", path, query=query + "&watch=true&timeoutSeconds=1"), 400, "BadRequest")
    if "/namespaces/" in path:  # deletecollection is not served on the all-namespaces path
        rejected_cleanly(client, 400, "DELETE", path, None, query=query)


# ----------------------------------------------------------------------------------------------- custom resources


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, {("spec.size", "FieldValueRequired")}),
        ({"size": 0}, {("spec.size", "FieldValueInvalid")}),
        ({"size": 11}, {("spec.size", "FieldValueInvalid")}),
        ({"size": "one"}, {("spec.size", "FieldValueTypeInvalid")}),
        ({"size": 1, "color": "green"}, {("spec.color", "FieldValueNotSupported")}),
        ({"size": 1, "tags": ["a", "b", "c"]}, {("spec.tags", "FieldValueTooMany")}),
        ({"size": 1, "ref": "UP"}, {("spec.ref", "FieldValueInvalid")}),
        ({"size": 0, "color": "green"}, {("spec.size", "FieldValueInvalid"), ("spec.color", "FieldValueNotSupported")}),
    ],
)
def test_invalid_custom_resource_422(client: Client, spec: dict[str, Any], expected: set[tuple[str, str]]) -> None:
    body = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "bad"}, "spec": spec}
    b = rejected_cleanly(client, 422, "POST", WIDGETS, json.dumps(body).encode())
    assert b["reason"] == "Invalid" and b["message"].startswith(f'Widget.{GROUP} "bad" is invalid: ')
    got = {(c["field"], c["reason"]) for c in b["details"]["causes"]}
    assert got == expected, b["details"]["causes"]
    assert b["details"] == dict(b["details"], name="bad", group=GROUP, kind="Widget")
    # The same through a patch of an existing object: nothing is half-applied.
    if spec:
        rejected_cleanly(
            client, 422, "PATCH", f"{WIDGETS}/w", json.dumps({"spec": spec}).encode(),
            ctype="application/merge-patch+json",
        )


def test_invalid_metadata_422(client: Client) -> None:
    for meta in ({"name": "Bad_Name"}, {"name": "ok", "labels": {"bad key!": "v"}}, {"name": "x" * 300}):
        rejected_cleanly(client, 422, "POST", CMS, json.dumps({"metadata": meta, "data": {}}).encode())


# ----------------------------------------------------------------------------------------------- sizes and types


def test_oversized_bodies_413(client: Client) -> None:
    big = json.dumps({"metadata": {"name": "big"}, "data": {"k": "x" * (MAX_BODY + 10)}}).encode()
    b = rejected_cleanly(client, 413, "POST", CMS, big)
    assert b["reason"] == "RequestEntityTooLarge"
    much_bigger = b'{"metadata": {"name": "big"}, "data": {"k": "' + b"y" * (MAX_BODY + 200_000) + b'"}}'
    rejected_cleanly(client, 413, "POST", CMS, much_bigger)
    rejected_cleanly(client, 413, "PATCH", f"{CMS}/base", big, ctype="application/merge-patch+json")
    # Just under the limit is fine.
    ok = json.dumps({"metadata": {"name": "fits"}, "data": {"k": "x" * (MAX_BODY // 2)}}).encode()
    assert client.call("POST", CMS, ok).status == 201


@pytest.mark.parametrize(
    "ctype", ["application/json", "text/plain", "application/x-www-form-urlencoded", "application/xml", None]
)
def test_patch_wrong_content_type_415(client: Client, ctype: str | None) -> None:
    b = rejected_cleanly(client, 415, "PATCH", f"{CMS}/base", b'{"data": {"k": "x"}}', ctype=ctype)
    assert b["reason"] == "UnsupportedMediaType"
    assert "application/strategic-merge-patch+json" in b["message"]
    b = rejected_cleanly(client, 415, "PATCH", f"{WIDGETS}/w", b'{"spec": {"size": 2}}', ctype=ctype)
    assert "strategic" not in b["message"]


def test_bad_patch_bodies(client: Client) -> None:
    base = f"{CMS}/base"
    rejected_cleanly(client, 400, "PATCH", base, b"[1, 2]", ctype="application/merge-patch+json")
    rejected_cleanly(client, 400, "PATCH", base, b'"x"', ctype="application/strategic-merge-patch+json")
    rejected_cleanly(client, 400, "PATCH", base, b'{"op": "add"}', ctype="application/json-patch+json")
    # An empty operation decodes (upstream's Operation is a map) and fails to apply: 422.
    rejected_cleanly(client, 422, "PATCH", base, b"[{}]", ctype="application/json-patch+json")
    for ops in (
        [{"op": "add", "path": "no-slash", "value": 1}],
        [{"op": "move", "from": "/data/missing", "path": "/data/x"}],
        [{"op": "replace", "path": "/metadata", "value": 5}],
        [{"op": "add", "path": "/data/x", "value": {"not": "a string"}}],
    ):
        r = client.call("PATCH", base, json.dumps(ops).encode(), ctype="application/json-patch+json")
        assert r.status in (400, 422), (ops, r.status, r.raw)
        assert_status(r, r.status)
    # Patched objects are decoded into the kind's type: a wrong type is 422 on field "patch" (upstream jsonPatcher).
    b = rejected_cleanly(
        client, 422, "PATCH", base, b'[{"op": "add", "path": "/data/x", "value": {"a": 1}}]',
        ctype="application/json-patch+json",
    )
    assert b["details"]["causes"][0]["field"] == "patch"
    rejected_cleanly(client, 422, "PATCH", base, b'{"data": {"x": 1}}', ctype="application/merge-patch+json")
    rejected_cleanly(client, 422, "PATCH", base, b'{"metadata": 7}', ctype="application/merge-patch+json")
    # A patch cannot rename or unname the object (checkName: 400).
    for raw in (b'{"metadata": null}', b'{"metadata": {"name": "other"}}', b'{"metadata": {"name": null}}'):
        rejected_cleanly(client, 400, "PATCH", base, raw, ctype="application/merge-patch+json")
    rejected_cleanly(
        client, 400, "PATCH", base, b'[{"op": "remove", "path": "/metadata/name"}]', ctype="application/json-patch+json"
    )


@pytest.mark.parametrize(
    "body",
    [
        {"metadata": {"name": "t"}, "data": {"x": 1}},
        {"metadata": {"name": "t"}, "data": "str"},
        {"metadata": {"name": "t"}, "data": {"x": {"y": "z"}}},
        {"metadata": {"name": "t"}, "binaryData": ["a"]},
        {"metadata": {"name": "t"}, "immutable": "yes"},
    ],
)
def test_built_in_type_mismatch_400(client: Client, body: dict[str, Any]) -> None:
    """Built-ins decode into Go types: a wrongly typed field is a 400, never a stored (or mangled) value."""
    b = rejected_cleanly(client, 400, "POST", CMS, json.dumps(body).encode())
    assert b["message"].startswith('ConfigMap in version "v1" cannot be handled as a ConfigMap: json: cannot unmarshal')
    body = dict(body, metadata={"name": "base"})
    rejected_cleanly(client, 400, "PUT", f"{CMS}/base", json.dumps(body).encode())
    p = {"metadata": {"name": "t"}, "spec": {"containers": [{"name": "c", "image": "i", "ports": "x"}]}}
    rejected_cleanly(client, 400, "POST", PODS, json.dumps(p).encode())


def test_lone_surrogates_are_replaced(client: Client) -> None:
    """Go's decoder turns lone surrogates into U+FFFD; they must never reach the store as unencodable text."""
    # JSON: refused by the decoder (a 400, where Go would substitute U+FFFD).
    rejected_cleanly(client, 400, "POST", CMS, b'{"metadata": {"name": "sur"}, "data": {"k": "x\\ud800y"}}')
    rejected_cleanly(client, 400, "POST", CMS, b'{"metadata": {"name": "sur"}, "data": {"k": "\\udc00"}}')
    # YAML: substituted.
    raw = b'{"metadata": {"name": "sur", "annotations": {"a": "x\\ud800y"}}, "data": {"k": "\\udc00"}}'
    r = client.call("POST", CMS, raw, ctype="application/yaml")
    assert r.status == 201, r.raw
    assert r.body["metadata"]["annotations"]["a"] == "x\ufffdy" and r.body["data"]["k"] == "\ufffd"
    r = client.call("POST", CMS, b'{"metadata": {"name": "x\\ud800"}}', ctype="application/yaml")
    assert_status(r, 422, "Invalid")
    r = client.call(
        "PATCH", f"{CMS}/sur", b'{"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "\\ud800"}}',
        ctype="application/apply-patch+yaml",
        query="fieldManager=m",
    )
    assert r.status == 200 and r.body["data"]["k"] == "\ufffd"
    # Odd bytes in paths and query strings are answered with a Status too.
    for path in (f"{CMS}/%ED%A0%80", f"{CMS}/%FF", "/api/v1/namespaces/%00/configmaps"):
        r = client.call("GET", path)
        assert r.status < 500, (path, r.raw)
        if r.status >= 400:
            assert_status(r, r.status)
    for query in ("labelSelector=%ED%A0%80", "fieldSelector=metadata.name%3D%FF", "limit=%00"):
        r = client.call("GET", CMS, query=query)
        assert r.status < 500, (query, r.raw)


def test_bad_query_parameters(client: Client) -> None:
    for query in (
        "limit=abc",
        "resourceVersion=abc",
        "resourceVersion=-1",
        "continue=%%%",
        "watch=true&timeoutSeconds=abc",
        "watch=true&timeoutSeconds=nan",
        "watch=true&resourceVersion=xyz&timeoutSeconds=1",
    ):
        r = client.call("GET", CMS, query=query)
        assert 400 <= r.status < 500, (query, r.status, r.raw)
        assert_status(r, r.status)
    for query in ("dryRun=Maybe", "fieldValidation=Lax", "gracePeriodSeconds=soon"):
        rejected_cleanly(client, 400, "DELETE", f"{CMS}/base", None, query=query)


def test_unknown_paths_and_methods(client: Client) -> None:
    for method, path in (
        ("GET", "/api/v1/nonsense"),
        ("GET", "/apis/nope.io/v1/things"),
        ("GET", f"{CMS}/base/nosuchsub"),
        ("GET", "/api/v1/namespaces/default/configmaps/a/b/c/d"),
        ("GET", "/nonsense"),
        ("POST", "/version"),
        ("POST", f"{CMS}/base"),
        ("PUT", CMS),
        ("PATCH", CMS),
        ("GET", "/api/v1/nodes/x/eviction"),
    ):
        r = client.call(method, path, b"{}" if method != "GET" else None)
        assert r.status in (404, 405), (method, path, r.status)
        assert_status(r, r.status)


def test_subresources_serve_only_their_verbs(client: Client) -> None:
    """A verb a subresource does not serve is 405 and never reaches the main resource (DELETE .../status must
    not delete the pod, PUT .../eviction must not update it)."""
    pod = client.call("GET", f"{PODS}/p").body
    pod["metadata"]["labels"] = {"changed": "yes"}
    raw = json.dumps(pod).encode()
    for method, sub, body, ctype in (
        ("DELETE", "status", None, None),
        ("DELETE", "eviction", None, None),
        ("PUT", "eviction", raw, "application/json"),
        ("PATCH", "binding", b'{"metadata": {"labels": {"a": "b"}}}', "application/merge-patch+json"),
        ("GET", "eviction", None, None),
        ("GET", "binding", None, None),
        ("POST", "status", raw, "application/json"),
    ):
        b = rejected_cleanly(client, 405, method, f"{PODS}/p/{sub}", body, ctype=ctype)
        assert b["reason"] == "MethodNotAllowed"
    rejected_cleanly(client, 405, "DELETE", f"{WIDGETS}/w/status", None)
    # Namespaces have no deletecollection upstream.
    rejected_cleanly(client, 405, "DELETE", "/api/v1/namespaces", None)
    assert client.call("GET", f"{PODS}/p").status == 200


# ----------------------------------------------------------------------------------------------- fuzzing

FUZZ_PATHS = [
    CMS,
    f"{CMS}/base",
    f"{CMS}/fz",
    "/api/v1/configmaps",
    PODS,
    f"{PODS}/p",
    f"{PODS}/p/status",
    f"{PODS}/p/eviction",
    f"{PODS}/p/binding",
    WIDGETS,
    f"{WIDGETS}/w",
    f"{WIDGETS}/w/status",
    "/api/v1/namespaces",
    "/api/v1/namespaces/fz",
    "/api/v1/nodes",
    f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
    f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
    f"/apis/apps/v1/namespaces/{NS}/deployments",
    "/api/v1/watch/namespaces/default/configmaps",
    "/apis/authorization.k8s.io/v1/subjectaccessreviews",
    "/apis/authentication.k8s.io/v1/tokenreviews",
    "/api",
    "/apis",
    "/version",
    "/openapi/v3",
    "/api/v1",
]
QUERY_KEYS = [
    "labelSelector",
    "fieldSelector",
    "resourceVersion",
    "resourceVersionMatch",
    "limit",
    "continue",
    "watch",
    "allowWatchBookmarks",
    "sendInitialEvents",
    "timeoutSeconds",
    "dryRun",
    "fieldManager",
    "fieldValidation",
    "force",
    "propagationPolicy",
    "gracePeriodSeconds",
    "includeObject",
]
INTERESTING = [
    "",
    "0",
    "1",
    "-1",
    "true",
    "false",
    "All",
    "Strict",
    "Warn",
    "Exact",
    "NotOlderThan",
    "99999999999999999999",
    "a=b",
    "a in (b,c)",
    "!a",
    "metadata.name=base",
    "status.phase!=Running",
    "Foreground",
    "Orphan",
    "eyJydiI6MX0",
]
CTYPES = [
    "application/json",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/yaml",
    "text/plain",
    None,
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
object_like = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": st.sampled_from(["fz", "base", "p", "w", "", "BAD"])},
                                       optional={"labels": json_values, "resourceVersion": json_values,
                                                 "finalizers": json_values, "ownerReferences": json_values})},
    optional={
        "apiVersion": st.sampled_from(["v1", f"{GROUP}/v1", "apps/v1", "bogus"]),
        "kind": st.sampled_from(["ConfigMap", "Pod", "Widget", "Nope"]),
        "data": json_values,
        "spec": json_values,
        "status": json_values,
    },
)
json_patch_ops = st.lists(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "bogus"]),
         "path": st.sampled_from(["/data/k", "/metadata/labels", "/spec", "/metadata", "", "/x/-", "bad"])},
        optional={"value": json_values, "from": st.sampled_from(["/data", "/metadata/name", "/nope"])},
    ),
    max_size=3,
)
bodies = st.one_of(
    st.none(),
    st.binary(max_size=64),
    json_values.map(lambda v: json.dumps(v).encode()),
    object_like.map(lambda v: json.dumps(v).encode()),
    json_patch_ops.map(lambda v: json.dumps(v).encode()),
)
queries = st.dictionaries(
    st.sampled_from(QUERY_KEYS) | st.text(min_size=1, max_size=8),
    st.sampled_from(INTERESTING) | st.text(max_size=16),
    max_size=4,
)


def _is_watch(path: str, query: dict[str, str]) -> bool:
    return "/watch/" in path or ("watch" in query and query["watch"].lower() not in ("0", "false"))


@pytest.fixture
def fuzz_client(client: Client, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    # Nothing runs behind the requests' backs: controller work is stepped explicitly after accepted writes.
    s = client.rs.server
    client.rs.call(s.controllers.stop())
    monkeypatch.setattr(lists, "TOO_LARGE_WAIT", 0.05)
    monkeypatch.setattr(watch, "TOO_LARGE_WAIT", 0.05)
    yield client


@pytest.mark.apiserver_warnings("unknown field")  # random writes: some carry fields the schema does not know
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
    path=st.sampled_from(FUZZ_PATHS),
    query=queries,
    body=bodies,
    ctype=st.sampled_from(CTYPES),
)
def test_fuzz_requests(
    fuzz_client: Client, method: str, path: str, query: dict[str, str], body: bytes | None, ctype: str | None
) -> None:
    c = fuzz_client
    s = c.rs.server
    if method == "GET" or "timeoutSeconds" in query:
        # Streams must end quickly; other timeoutSeconds values are covered by test_bad_query_parameters.
        query["timeoutSeconds"] = "0"
    before = c.state()
    r = c.call(method, path, body, ctype=ctype, query=urlencode(query))
    after = c.state()
    if r.status == 504:
        b = assert_status(r, 504, "Timeout")
        assert b["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
    else:
        assert r.status < 500, (method, path, query, body, r.status, r.raw[:800])
    if r.status >= 400:
        assert_status(r, r.status)
        assert after == before, f"rejected {method} {path}?{query} changed the store"
    elif r.status < 300:
        c.rs.call(s.controllers.step())
        if r.headers.get("Content-Type", "").startswith("application/json") and not _is_watch(path, query):
            assert r.body is not None, r.raw[:200]


@pytest.mark.apiserver_warnings("unknown field")  # random writes: some carry fields the schema does not know
def test_fuzz_leaves_a_consistent_store(fuzz_client: Client) -> None:
    """Runs the fuzzer's kind of traffic, then checks the store's invariants end to end."""
    c = fuzz_client
    s = c.rs.server

    @settings(max_examples=120, deadline=None)
    @given(
        method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE"]),
        path=st.sampled_from([CMS, f"{CMS}/fz", f"{CMS}/base", PODS, f"{PODS}/p", WIDGETS, f"{WIDGETS}/w",
                              f"{WIDGETS}/w/status", "/api/v1/namespaces", "/api/v1/namespaces/fz"]),
        body=object_like.map(lambda v: json.dumps(v).encode()) | json_patch_ops.map(lambda v: json.dumps(v).encode()),
        ctype=st.sampled_from(CTYPES[:5]),
        manager=st.sampled_from(["", "a", "b"]),
    )
    def traffic(method: str, path: str, body: bytes, ctype: str, manager: str) -> None:
        q = urlencode({"fieldManager": manager} if manager else {})
        before = c.state()
        r = c.call(method, path, body, ctype=ctype, query=q)
        assert r.status < 500, (method, path, body, r.status, r.raw[:800])
        if r.status >= 400:
            assert_status(r, r.status)
            assert c.state() == before
        else:
            c.rs.call(s.controllers.step())

    traffic()
    check_store_consistency(c)


def check_store_consistency(c: Client) -> None:
    s = c.rs.server

    def snapshot() -> tuple[int, list[tuple[str, str, dict[str, Any]]]]:
        objs = []
        for gr in s.store.resources():
            for stored in s.store.iter(gr):
                objs.append((gr[0], gr[1], stored.obj))
        return s.store.rv, objs

    rv, objs = c.rs.run(snapshot)
    uids = [o["metadata"].get("uid") for _, _, o in objs]
    assert len(uids) == len(set(uids)), "duplicate uids"
    for _, _, o in objs:
        assert int(o["metadata"]["resourceVersion"]) <= rv
    by_gr: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    for g, r, o in objs:
        by_gr.setdefault((g, r), {})[(o["metadata"].get("namespace", "") or "", o["metadata"]["name"])] = o
    infos = [i for i in s.registry.all() if not i.create_only]
    for info in infos:
        prefix = f"/apis/{info.group}/{info.version}" if info.group else f"/api/{info.version}"
        listed = c.call("GET", f"{prefix}/{info.resource}")
        assert listed.status == 200, (info.resource, listed.raw[:300])
        assert int(listed.body["metadata"]["resourceVersion"]) == rv
        items = {(i["metadata"].get("namespace", "") or "", i["metadata"]["name"]): i for i in listed.body["items"]}
        stored = by_gr.get(info.storage_key, {})
        assert items.keys() == stored.keys(), info.resource
        for (ns, name), item in items.items():
            path = f"{prefix}/namespaces/{ns}/{info.resource}/{name}" if ns else f"{prefix}/{info.resource}/{name}"
            got = c.call("GET", path)
            assert got.status == 200 and got.body == item == json.loads(json.dumps(stored[(ns, name)])), path

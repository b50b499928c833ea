"""The Kubernetes API server's wire semantics, checked against the emulator over raw HTTP.

One behaviour per test, named in the test's name: discovery and content negotiation, gets, lists
(resourceVersion rules, paging, selectors), watches, writes and patches, deletion and the controller-manager
loops, faults and RBAC. Requests go through aiohttp to an in-process APIServer, so what is checked is the wire:
status codes, headers, Status bodies, chunked watch frames.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy
from waiting import refuses_connections, until

from gpuops_sim.apiserver import APIServer, lists, watch

pytestmark = pytest.mark.anyio

NS = "default"
CMS = f"/api/v1/namespaces/{NS}/configmaps"
PODS = f"/api/v1/namespaces/{NS}/pods"
PDBS = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
GROUP = "example.com"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/{NS}/widgets"
GADGETS = f"/apis/{GROUP}/v1/namespaces/{NS}/gadgets"
TABLE_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)
AGG_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGG_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
RFC3339_SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ----------------------------------------------------------------------------------------------- HTTP helpers


@dataclass
class R:
    status: int
    headers: CIMultiDictProxy[str]
    body: Any
    raw: bytes

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.body.get("metadata") or {})

    @property
    def rv(self) -> int:
        return int(self.body["metadata"]["resourceVersion"])


class Stream:
    """One open watch: newline-delimited JSON frames off a chunked response."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self, wait: float = 3.0) -> dict[str, Any] | None:
        """The next frame, or None at end of stream."""
        line = await asyncio.wait_for(self.resp.content.readline(), wait)
        if not line:
            return None
        ev: dict[str, Any] = json.loads(line)
        return ev

    async def take(self, n: int, wait: float = 3.0, skip_bookmarks: bool = True) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < n:
            ev = await self.next(wait)
            assert ev is not None, f"stream ended after {out}"
            if skip_bookmarks and ev["type"] == "BOOKMARK":
                continue
            out.append(ev)
        return out

    async def rest(self, wait: float = 5.0) -> list[dict[str, Any]]:
        """Every frame until the server ends the stream."""
        out: list[dict[str, Any]] = []
        while True:
            ev = await self.next(wait)
            if ev is None:
                return out
            out.append(ev)


class Api:
    def __init__(self, server: APIServer, session: aiohttp.ClientSession) -> None:
        self.s = server
        self.session = session

    async def req(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        ctype: str | None = None,
        data: bytes | None = None,
    ) -> R:
        hdrs = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            hdrs.setdefault("Content-Type", ctype or "application/json")
        async with self.session.request(
            method, self.s.url + path, params=params, data=data, headers=hdrs
        ) as resp:
            raw = await resp.read()
            try:
                decoded = json.loads(raw) if raw else None
            except ValueError:
                decoded = None
            return R(resp.status, resp.headers, decoded, raw)

    async def get(self, path: str, **kw: Any) -> R:
        return await self.req("GET", path, **kw)

    async def post(self, path: str, body: Any, **kw: Any) -> R:
        return await self.req("POST", path, body, **kw)

    async def put(self, path: str, body: Any, **kw: Any) -> R:
        return await self.req("PUT", path, body, **kw)

    async def patch(self, path: str, body: Any, ctype: str = "application/merge-patch+json", **kw: Any) -> R:
        return await self.req("PATCH", path, body, ctype=ctype, **kw)

    async def delete(self, path: str, body: Any = None, **kw: Any) -> R:
        return await self.req("DELETE", path, body, **kw)

    @asynccontextmanager
    async def watch(
        self, path: str, params: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> AsyncIterator[Stream]:
        p = {"watch": "true", **(params or {})}
        async with self.session.get(self.s.url + path, params=p, headers=headers or {}) as resp:
            assert resp.status == 200, await resp.text()
            yield Stream(resp)

    async def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        if method == "PATCH":
            kw.setdefault("ctype", "application/merge-patch+json")
        r = await self.req(method, path, body, **kw)
        assert 200 <= r.status < 300, (r.status, r.body)
        out: dict[str, Any] = r.body
        return out


@asynccontextmanager
async def serve(**kwargs: Any) -> AsyncIterator[Api]:
    kwargs.setdefault("bookmark_interval", 0.5)
    kwargs.setdefault("root_ca_publisher", False)  # these tests count the ConfigMaps of a namespace
    async with APIServer(**kwargs) as s:
        headers = {"Authorization": f"Bearer {s.admin_token}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            yield Api(s, session)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serve() as a:
        yield a


async def gone(api: Api, path: str) -> bool:
    return (await api.get(path)).status == 404


def assert_status(r: R, code: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    """A well-formed Status failure whose code matches the HTTP status."""
    assert r.status == code, (r.status, r.body)
    b = r.body
    assert isinstance(b, dict), r.raw
    assert b["kind"] == "Status" and b["apiVersion"] == "v1" and b["status"] == "Failure", b
    assert b["code"] == code
    if reason is not None:
        assert b["reason"] == reason, b
    if message is not None:
        assert b["message"] == message, b
    return b


def causes(r: R) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = (r.body.get("details") or {}).get("causes") or []
    return out


# ----------------------------------------------------------------------------------------------- objects


def cm(name: str, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    meta.update(extra.pop("meta", {}))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": extra.pop("data", {"k": "v"})}


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }


def widget(name: str, size: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size, **spec},
    }


def crd(kind: str, plural: str, *, status_subresource: bool) -> dict[str, Any]:
    spec_schema = {
        "type": "object",
        "required": ["size"],
        "properties": {
            "size": {"type": "integer", "minimum": 1},
            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
            "label": {"type": "string", "pattern": "^[a-z]+$"},
            "items": {"type": "array", "items": {"type": "string"}},
        },
    }
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": spec_schema,
                    "status": {
                        "type": "object",
                        "properties": {"ready": {"type": "boolean"}, "observedGeneration": {"type": "integer"}},
                    },
                },
            }
        },
        "additionalPrinterColumns": [
            {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
            {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
        ],
        "selectableFields": [{"jsonPath": ".spec.color"}],
    }
    if status_subresource:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "shortNames": [kind.lower()[:2]]},
            "versions": [version],
        },
    }


async def install_crds(api: Api) -> None:
    await api.ok("POST", CRDS, crd("Widget", "widgets", status_subresource=True))
    await api.ok("POST", CRDS, crd("Gadget", "gadgets", status_subresource=False))


async def ready_pod(api: Api, name: str, labels: dict[str, str], node: str = "n1", ready: bool = True) -> None:
    """A bound, Running pod, Ready or not, the way the simulated scheduler and kubelet leave it."""
    await api.ok("POST", PODS, pod(name, labels, nodeName=node))
    p = await api.ok("GET", f"{PODS}/{name}")
    p["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    await api.ok("PUT", f"{PODS}/{name}/status", p)


# =============================================================================================== 3.A discovery


async def test_version(api: Api) -> None:
    r = await api.get("/version")
    assert r.status == 200
    for k in ("major", "minor", "gitVersion", "platform"):
        assert k in r.body


async def test_legacy_discovery(api: Api) -> None:
    r = await api.get("/api")
    assert r.status == 200 and r.body["kind"] == "APIVersions"
    assert r.body["versions"] == ["v1"] and "serverAddressByClientCIDRs" in r.body
    r = await api.get("/apis")
    assert r.body["kind"] == "APIGroupList"
    groups = {g["name"]: g for g in r.body["groups"]}
    assert groups["apps"]["preferredVersion"]["groupVersion"] == "apps/v1"
    assert {"groupVersion": "policy/v1", "version": "v1"} in groups["policy"]["versions"]
    r = await api.get("/api/v1")
    assert r.body["kind"] == "APIResourceList" and r.body["groupVersion"] == "v1"
    names = {x["name"]: x for x in r.body["resources"]}
    assert {"pods", "pods/status", "pods/eviction", "pods/binding"} <= set(names)
    assert names["pods"]["namespaced"] is True and names["pods"]["kind"] == "Pod"
    assert "po" in names["pods"]["shortNames"] and "all" in names["pods"]["categories"]


@pytest.mark.parametrize(
    ("accept", "ctype"),
    [
        (f"{AGG_V2},{AGG_V2BETA1},application/json", AGG_V2),
        (f"{AGG_V2BETA1},application/json", AGG_V2BETA1),
    ],
)
async def test_aggregated_discovery_exact_content_type(api: Api, accept: str, ctype: str) -> None:
    r = await api.get("/api", headers={"Accept": accept})
    assert r.status == 200
    assert r.headers["Content-Type"] == ctype
    assert r.body["kind"] == "APIGroupDiscoveryList"
    (core,) = r.body["items"]
    assert core["metadata"].get("name", "") == ""
    v1 = core["versions"][0]
    assert v1["version"] == "v1" and v1["freshness"] == "Current"
    pods = next(x for x in v1["resources"] if x["resource"] == "pods")
    assert pods["responseKind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert pods["scope"] == "Namespaced" and pods["singularResource"] == "pod"
    assert "watch" in pods["verbs"] and pods["shortNames"] == ["po"] and pods["categories"] == ["all"]
    subs = {s["subresource"]: s for s in pods["subresources"]}
    assert subs["eviction"]["responseKind"]["kind"] == "Eviction" and subs["eviction"]["verbs"] == ["create"]
    assert "status" in subs
    r = await api.get("/apis", headers={"Accept": accept})
    assert r.headers["Content-Type"] == ctype
    names = {g["metadata"]["name"] for g in r.body["items"]}
    assert {"apps", "policy", "coordination.k8s.io", "apiextensions.k8s.io"} <= names
    nodes = await api.get("/api", headers={"Accept": accept})
    node = next(x for x in nodes.body["items"][0]["versions"][0]["resources"] if x["resource"] == "nodes")
    assert node["scope"] == "Cluster"


async def test_plain_json_fallback(api: Api) -> None:
    r = await api.get("/apis", headers={"Accept": "application/json"})
    assert r.body["kind"] == "APIGroupList"
    assert r.headers["Content-Type"].startswith("application/json")


# =============================================================================================== tables


async def test_table_list_get_and_watch(api: Api) -> None:
    await install_crds(api)
    await api.ok("POST", CMS, cm("a"))
    r = await api.get(CMS, headers={"Accept": TABLE_ACCEPT}, params={"limit": "500"})
    assert r.status == 200
    assert r.headers["Content-Type"] == "application/json;as=Table;v=v1;g=meta.k8s.io"
    t = r.body
    assert t["kind"] == "Table" and t["apiVersion"] == "meta.k8s.io/v1"
    assert int(t["metadata"]["resourceVersion"]) == api.s.store.rv
    assert t["columnDefinitions"][0]["name"] == "Name"
    for c in t["columnDefinitions"]:
        assert {"name", "type", "format", "description", "priority"} <= set(c)
    (row,) = t["rows"]
    assert row["cells"][0] == "a"
    assert row["object"]["kind"] == "PartialObjectMetadata" and row["object"]["metadata"]["name"] == "a"
    # CRDs use additionalPrinterColumns.
    await api.ok("POST", WIDGETS, widget("w1", size=3, color="blue"))
    r = await api.get(WIDGETS, headers={"Accept": TABLE_ACCEPT})
    cols = [c["name"] for c in r.body["columnDefinitions"]]
    assert cols[:3] == ["Name", "Size", "Color"]
    assert r.body["rows"][0]["cells"][:3] == ["w1", 3, "blue"]
    # Single-object GET.
    r = await api.get(f"{CMS}/a", headers={"Accept": TABLE_ACCEPT})
    assert r.body["kind"] == "Table" and len(r.body["rows"]) == 1
    # Watch: one Table per event.
    async with api.watch(CMS, {"resourceVersion": str(api.s.store.rv)}, headers={"Accept": TABLE_ACCEPT}) as w:
        await api.ok("POST", CMS, cm("b"))
        (ev,) = await w.take(1)
        assert ev["type"] == "ADDED" and ev["object"]["kind"] == "Table"
        assert ev["object"]["rows"][0]["cells"][0] == "b"


async def test_table_v1beta1_only(api: Api) -> None:
    r = await api.get(CMS, headers={"Accept": "application/json;as=Table;v=v1beta1;g=meta.k8s.io"})
    assert r.status == 200
    assert r.headers["Content-Type"] == "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
    assert r.body["kind"] == "Table"


@pytest.mark.parametrize(
    ("path", "accept"),
    [
        (CMS, "application/vnd.example+xml"),
        (CMS, "application/json;as=Table;v=v9;g=meta.k8s.io"),
        (f"{CMS}/x", "text/html"),
        ("/apis", "application/xml"),
    ],
)
async def test_not_acceptable(api: Api, path: str, accept: str) -> None:
    r = await api.get(path, headers={"Accept": accept})
    assert_status(r, 406, "NotAcceptable")


# =============================================================================================== 3.B reads


async def test_get_resource_version_semantics(api: Api) -> None:
    created = await api.ok("POST", CMS, cm("a"))
    rv = created["metadata"]["resourceVersion"]
    for value in (None, "0", rv, "1"):
        params = {"resourceVersion": value} if value is not None else None
        r = await api.get(f"{CMS}/a", params=params)
        assert r.status == 200 and r.body["metadata"]["resourceVersion"] == rv


async def test_get_missing(api: Api) -> None:
    r = await api.get(f"{CMS}/nope")
    b = assert_status(r, 404, "NotFound", 'configmaps "nope" not found')
    assert b["details"] == {"name": "nope", "kind": "configmaps"}
    await install_crds(api)
    r = await api.get(f"{WIDGETS}/nope")
    b = assert_status(r, 404, "NotFound", f'widgets.{GROUP} "nope" not found')
    assert b["details"] == {"name": "nope", "group": GROUP, "kind": "widgets"}


async def test_list_shape(api: Api) -> None:
    await install_crds(api)
    await api.ok("POST", CMS, cm("a"))
    await api.ok("POST", WIDGETS, widget("w"))
    r = await api.get(CMS)
    assert r.body["kind"] == "ConfigMapList" and r.body["apiVersion"] == "v1"
    assert int(r.body["metadata"]["resourceVersion"]) == api.s.store.rv
    assert [i["metadata"]["name"] for i in r.body["items"]] == ["a"]
    assert "continue" not in r.body["metadata"] and "remainingItemCount" not in r.body["metadata"]
    r = await api.get(WIDGETS)
    assert r.body["kind"] == "WidgetList" and r.body["apiVersion"] == f"{GROUP}/v1"
    assert r.body["items"][0]["kind"] == "Widget" and r.body["items"][0]["apiVersion"] == f"{GROUP}/v1"
    # All-namespaces list.
    r = await api.get("/api/v1/configmaps")
    assert r.status == 200 and [i["metadata"]["name"] for i in r.body["items"]] == ["a"]


async def test_list_rv_matrix(api: Api) -> None:
    await api.ok("POST", CMS, cm("a", data={"v": "1"}))
    old_rv = api.s.store.rv
    await api.ok("PUT", f"{CMS}/a", cm("a", data={"v": "2"}))
    await api.ok("POST", CMS, cm("b"))
    now = api.s.store.rv

    def names(r: R) -> list[str]:
        return [i["metadata"]["name"] for i in r.body["items"]]

    # rvm unset, no limit: unset -> most recent, 0 -> any, N -> not older than N (served from now).
    for params in ({}, {"resourceVersion": "0"}, {"resourceVersion": str(old_rv)}):
        r = await api.get(CMS, params=params)
        assert r.status == 200 and names(r) == ["a", "b"] and r.rv == now, params
    # rvm unset + limit: N -> Exact.
    r = await api.get(CMS, params={"resourceVersion": str(old_rv), "limit": "10"})
    assert r.rv == old_rv and names(r) == ["a"] and r.body["items"][0]["data"] == {"v": "1"}
    assert r.body["items"][0]["metadata"]["resourceVersion"] == str(old_rv)
    # Explicit Exact: the snapshot from history.
    r = await api.get(CMS, params={"resourceVersion": str(old_rv), "resourceVersionMatch": "Exact"})
    assert r.rv == old_rv and names(r) == ["a"] and r.body["items"][0]["data"] == {"v": "1"}
    # NotOlderThan with a past RV -> current state; with 0 -> any.
    for rv in (str(old_rv), "0"):
        r = await api.get(CMS, params={"resourceVersion": rv, "resourceVersionMatch": "NotOlderThan"})
        assert r.status == 200 and names(r) == ["a", "b"]


@pytest.mark.parametrize(
    ("params", "cause_type", "message"),
    [
        (
            {"resourceVersionMatch": "Exact"},
            "FieldValueForbidden",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            {"resourceVersionMatch": "Exact", "resourceVersion": "0"},
            "FieldValueForbidden",
            'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
        ),
        (
            {"resourceVersionMatch": "Newest", "resourceVersion": "1"},
            "FieldValueNotSupported",
            'resourceVersionMatch: Unsupported value: "Newest": supported values: "Exact", "NotOlderThan", ""',
        ),
    ],
)
async def test_list_options_invalid(
    api: Api, params: dict[str, str], cause_type: str, message: str
) -> None:
    r = await api.get(CMS, params=params)
    b = assert_status(r, 422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {message}')
    assert b["details"]["kind"] == "ListOptions" and b["details"]["group"] == "meta.k8s.io"
    (cause,) = causes(r)
    assert cause["reason"] == cause_type and cause["field"] == "resourceVersionMatch"


async def test_continue_with_resource_version_is_400(api: Api) -> None:
    for n in "abc":
        await api.ok("POST", CMS, cm(n))
    first = await api.ok("GET", CMS, params={"limit": "1"})
    token = first["metadata"]["continue"]
    r = await api.get(CMS, params={"limit": "1", "continue": token, "resourceVersion": "5"})
    assert_status(r, 400, "BadRequest")
    r = await api.get(CMS, params={"limit": "1", "continue": token, "resourceVersion": "0"})
    assert r.status == 200


async def test_exact_compacted_rv_expired(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    old = api.s.store.rv
    await api.ok("POST", CMS, cm("b"))
    api.s.compact()
    await api.ok("POST", CMS, cm("c"))
    for params in (
        {"resourceVersion": str(old), "resourceVersionMatch": "Exact"},
        {"resourceVersion": str(old), "limit": "1"},
    ):
        r = await api.get(CMS, params=params)
        assert_status(r, 410, "Expired")


async def test_too_large_rv_waits_then_504(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lists, "TOO_LARGE_WAIT", 0.3)
    monkeypatch.setattr(watch, "TOO_LARGE_WAIT", 0.3)
    await api.ok("POST", CMS, cm("a"))
    future = str(api.s.store.rv + 100)
    for path, params in (
        (CMS, {"resourceVersion": future}),
        (CMS, {"resourceVersion": future, "resourceVersionMatch": "NotOlderThan"}),
        (CMS, {"resourceVersion": future, "watch": "true"}),
        (f"{CMS}/a", {"resourceVersion": future}),
    ):
        t0 = time.monotonic()
        r = await api.get(path, params=params)
        assert time.monotonic() - t0 >= 0.3, "answered before waiting for the resourceVersion"
        b = assert_status(r, 504, "Timeout")
        assert b["message"].startswith("Too large resource version")
        assert causes(r)[0]["reason"] == "ResourceVersionTooLarge"
        assert int(r.headers["Retry-After"]) >= 1
    # A write that brings the store to the requested RV during the wait makes the read succeed.
    target = str(api.s.store.rv + 1)

    async def later() -> None:
        await asyncio.sleep(0.1)
        await api.ok("POST", CMS, cm("late"))

    task = asyncio.create_task(later())
    r = await api.get(CMS, params={"resourceVersion": target})
    await task
    assert r.status == 200 and [i["metadata"]["name"] for i in r.body["items"]] == ["a", "late"]


async def test_pagination_snapshot(api: Api) -> None:
    for i in range(5):
        await api.ok("POST", CMS, cm(f"c{i}", data={"v": "orig"}))
    p1 = await api.get(CMS, params={"limit": "2"})
    m1 = p1.meta
    assert [i["metadata"]["name"] for i in p1.body["items"]] == ["c0", "c1"]
    assert m1["continue"] and m1["remainingItemCount"] == 3
    # Writes between pages must not show in later pages.
    await api.ok("DELETE", f"{CMS}/c3")
    await api.ok("PUT", f"{CMS}/c2", cm("c2", data={"v": "changed"}))
    await api.ok("POST", CMS, cm("c9"))
    p2 = await api.get(CMS, params={"limit": "2", "continue": m1["continue"]})
    assert p2.status == 200 and p2.meta["resourceVersion"] == m1["resourceVersion"]
    assert [i["metadata"]["name"] for i in p2.body["items"]] == ["c2", "c3"]
    assert p2.body["items"][0]["data"] == {"v": "orig"}
    assert p2.meta["remainingItemCount"] == 1
    p3 = await api.get(CMS, params={"limit": "2", "continue": p2.meta["continue"]})
    assert [i["metadata"]["name"] for i in p3.body["items"]] == ["c4"]
    assert p3.meta.get("continue", "") == "" and "remainingItemCount" not in p3.meta
    assert p3.meta["resourceVersion"] == m1["resourceVersion"]


async def test_remaining_item_count_only_without_selectors(api: Api) -> None:
    for i in range(4):
        await api.ok("POST", CMS, cm(f"c{i}", labels={"app": "x"}))
    r = await api.get(CMS, params={"limit": "1", "labelSelector": "app=x"})
    assert r.meta["continue"] and "remainingItemCount" not in r.meta
    r = await api.get(CMS, params={"limit": "1", "fieldSelector": "metadata.namespace=default"})
    assert r.meta["continue"] and "remainingItemCount" not in r.meta
    r = await api.get(CMS, params={"limit": "1"})
    assert r.meta["remainingItemCount"] == 3


async def test_snapshot_rebuilt_from_history_then_expired() -> None:
    """With the paging snapshot gone (continue_ttl=0) the next page is rebuilt from history; once history is
    compacted the token is Expired (410) and the Status carries a fresh continue token."""
    async with serve(continue_ttl=0.0) as api:
        for i in range(4):
            await api.ok("POST", CMS, cm(f"c{i}"))
        p1 = await api.get(CMS, params={"limit": "2"})
        await api.ok("DELETE", f"{CMS}/c2")
        p2 = await api.get(CMS, params={"limit": "2", "continue": p1.meta["continue"]})
        assert [i["metadata"]["name"] for i in p2.body["items"]] == ["c2", "c3"]
        p1 = await api.get(CMS, params={"limit": "1"})
        await api.ok("POST", CMS, cm("later"))
        api.s.compact()
        r = await api.get(CMS, params={"limit": "1", "continue": p1.meta["continue"]})
        b = assert_status(r, 410, "Expired")
        assert "continue parameter is too old" in b["message"]
        assert b["metadata"]["continue"]
        # The fresh token lists the remainder (inconsistently, as upstream warns).
        r = await api.get(CMS, params={"limit": "10", "continue": b["metadata"]["continue"]})
        assert r.status == 200 and [i["metadata"]["name"] for i in r.body["items"]] == ["c1", "c3", "later"]


async def test_bad_continue_token(api: Api) -> None:
    r = await api.get(CMS, params={"limit": "1", "continue": "not-a-token"})
    assert_status(r, 400, "BadRequest")


# =============================================================================================== selectors


async def test_label_selectors(api: Api) -> None:
    await api.ok("POST", CMS, cm("ax", labels={"team": "a", "tier": "x"}))
    await api.ok("POST", CMS, cm("ay", labels={"team": "a", "tier": "y", "gone": "1"}))
    await api.ok("POST", CMS, cm("bz", labels={"team": "b", "tier": "z"}))
    await api.ok("POST", CMS, cm("none"))

    async def sel(selector: str) -> list[str]:
        r = await api.get(CMS, params={"labelSelector": selector})
        assert r.status == 200, r.body
        return [i["metadata"]["name"] for i in r.body["items"]]

    assert await sel("team=a") == ["ax", "ay"]
    assert await sel("team==a") == ["ax", "ay"]
    assert await sel("team!=a") == ["bz", "none"]
    assert await sel("tier in (x,z)") == ["ax", "bz"]
    assert await sel("tier notin (x,z)") == ["ay", "none"]
    assert await sel("gone") == ["ay"]
    assert await sel("!gone") == ["ax", "bz", "none"]
    assert await sel("team=a,!gone") == ["ax"]
    # kubectl's URL encoding, sent verbatim.
    url = f"{api.s.url}{CMS}?labelSelector=team%3Da%2Ctier+in+%28x%2Cy%29%2C%21gone&limit=500"
    async with api.session.get(aiohttp.client.URL(url, encoded=True)) as resp:
        body = await resp.json()
    assert [i["metadata"]["name"] for i in body["items"]] == ["ax"]


@pytest.mark.parametrize("selector", ["team in (a", "=a", "team=a=b", "a b", "team notin a", "!!x"])
async def test_bad_label_selector_400(api: Api, selector: str) -> None:
    r = await api.get(CMS, params={"labelSelector": selector})
    assert_status(r, 400, "BadRequest")
    async with api.session.get(
        api.s.url + CMS, params={"watch": "true", "labelSelector": selector}
    ) as resp:
        assert resp.status == 400


async def test_field_selectors(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    await api.ok("POST", CMS, cm("b"))
    await api.ok("POST", PODS, pod("p1", nodeName="n1"))
    await api.ok("POST", PODS, pod("p2"))

    async def sel(path: str, selector: str) -> list[str]:
        r = await api.get(path, params={"fieldSelector": selector})
        assert r.status == 200, r.body
        return [i["metadata"]["name"] for i in r.body["items"]]

    assert await sel(CMS, "metadata.name=a") == ["a"]
    assert await sel(CMS, "metadata.name!=a") == ["b"]
    assert await sel("/api/v1/configmaps", "metadata.namespace==default,metadata.name=b") == ["b"]
    assert await sel(PODS, "spec.nodeName=n1") == ["p1"]
    assert await sel(PODS, "spec.nodeName=") == ["p2"]
    assert await sel(PODS, "status.phase=Pending,spec.nodeName!=n1") == ["p2"]
    # Kinds without a field-label conversion (ConfigMap) use the default one; Pods have their own.
    r = await api.get(CMS, params={"fieldSelector": "foo=bar"})
    assert_status(
        r, 400, "BadRequest", '"foo" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )
    r = await api.get(PODS, params={"fieldSelector": "spec.foo=bar"})
    assert_status(r, 400, "BadRequest", 'field label not supported: spec.foo')


async def test_custom_resource_field_selectors(api: Api) -> None:
    await install_crds(api)
    await api.ok("POST", WIDGETS, widget("r", color="red"))
    await api.ok("POST", WIDGETS, widget("b", color="blue"))
    r = await api.get(WIDGETS, params={"fieldSelector": "spec.color=blue"})
    assert [i["metadata"]["name"] for i in r.body["items"]] == ["b"]
    # Upstream's crConverter answers like the core kinds' conversions, not with the default conversion's
    # message, which built-ins such as ConfigMap give; see test_field_selectors.
    for path in (WIDGETS, GADGETS):
        r = await api.get(path, params={"fieldSelector": "foo.bar=x"})
        assert_status(r, 400, "BadRequest", "field label not supported: foo.bar")


# =============================================================================================== 3.C watch


async def test_watch_is_chunked_json_lines(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    async with api.session.get(api.s.url + CMS, params={"watch": "1", "timeoutSeconds": "1"}) as resp:
        assert resp.status == 200
        assert resp.headers["Transfer-Encoding"] == "chunked"
        assert resp.headers["Content-Type"] == "application/json"
        lines = (await resp.read()).splitlines()
    evs = [json.loads(x) for x in lines]
    assert evs[0]["type"] == "ADDED"
    obj = evs[0]["object"]
    assert obj["kind"] == "ConfigMap" and obj["apiVersion"] == "v1" and obj["metadata"]["name"] == "a"


async def test_watch_rv_unset_and_zero_send_synthetic_added(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    await api.ok("POST", CMS, cm("b"))
    for params in ({}, {"resourceVersion": "0"}):
        existing = [i["metadata"]["name"] for i in (await api.ok("GET", CMS))["items"]]
        async with api.watch(CMS, params) as w:
            evs = await w.take(len(existing))
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [("ADDED", n) for n in existing]
            name = f"new{len(params)}"
            await api.ok("POST", CMS, cm(name))
            (ev,) = await w.take(1)
            assert (ev["type"], ev["object"]["metadata"]["name"]) == ("ADDED", name)


async def test_21_watch_from_rv_only_later_changes_in_order(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    rv = api.s.store.rv
    await api.ok("POST", CMS, cm("b"))
    await api.ok("PUT", f"{CMS}/a", cm("a", data={"k": "2"}))
    await api.ok("DELETE", f"{CMS}/b")
    async with api.watch(CMS, {"resourceVersion": str(rv)}) as w:
        evs = await w.take(3)
        await api.ok("POST", CMS, cm("c"))
        evs += await w.take(1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
        ("ADDED", "c"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in evs]
    assert rvs == sorted(rvs) and len(set(rvs)) == 4 and rvs[0] > rv


async def test_noop_write_no_rv_no_event(api: Api) -> None:
    created = await api.ok("POST", CMS, cm("a"))
    rv = api.s.store.rv
    async with api.watch(CMS, {"resourceVersion": str(rv)}) as w:
        same = await api.ok("PUT", f"{CMS}/a", created)
        assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        same = await api.ok("PATCH", f"{CMS}/a", {"data": {"k": "v"}}, ctype="application/merge-patch+json")
        assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        assert api.s.store.rv == rv
        await api.ok("POST", CMS, cm("marker"))
        (ev,) = await w.take(1)
        assert ev["object"]["metadata"]["name"] == "marker"


async def test_selector_transitions(api: Api) -> None:
    await api.ok("POST", CMS, cm("a", labels={"app": "no"}))
    async with api.watch(CMS, {"labelSelector": "app=yes", "resourceVersion": str(api.s.store.rv)}) as w:
        await api.ok("PATCH", f"{CMS}/a", {"metadata": {"labels": {"app": "yes"}}})
        await api.ok("PATCH", f"{CMS}/a", {"data": {"k": "2"}})
        await api.ok("PATCH", f"{CMS}/a", {"metadata": {"labels": {"app": "no"}}})
        await api.ok("PATCH", f"{CMS}/a", {"data": {"k": "3"}})  # not matching: no event
        await api.ok("PATCH", f"{CMS}/a", {"metadata": {"labels": {"app": "yes"}}})
        last = await api.ok("GET", f"{CMS}/a")
        await api.ok("DELETE", f"{CMS}/a")
        evs = await w.take(5)
    assert [e["type"] for e in evs] == ["ADDED", "MODIFIED", "DELETED", "ADDED", "DELETED"]
    # The "stopped matching" DELETED carries the new (non-matching) state.
    assert evs[2]["object"]["metadata"]["labels"] == {"app": "no"}
    # The real DELETED: last state stamped with the deletion's RV.
    deleted = evs[4]["object"]
    assert deleted["data"] == last["data"]
    assert int(deleted["metadata"]["resourceVersion"]) > int(last["metadata"]["resourceVersion"])
    assert int(deleted["metadata"]["resourceVersion"]) == api.s.store.rv


async def test_bookmarks(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    async with api.watch(CMS, {"allowWatchBookmarks": "true", "resourceVersion": str(api.s.store.rv)}) as w:
        ev = await w.next(wait=3.0)
        assert ev is not None and ev["type"] == "BOOKMARK"
        assert ev["object"] == {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(api.s.store.rv)},
        }
    # Without allowWatchBookmarks: none.
    async with api.watch(CMS, {"resourceVersion": str(api.s.store.rv), "timeoutSeconds": "1"}) as w:
        assert await w.rest() == []


async def test_streaming_list(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    await api.ok("POST", CMS, cm("b"))
    params = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"}
    for rv in ("", "0", str(api.s.store.rv)):
        existing = [i["metadata"]["name"] for i in (await api.ok("GET", CMS))["items"]]
        async with api.watch(CMS, dict(params, resourceVersion=rv)) as w:
            evs = await w.take(len(existing) + 1, skip_bookmarks=False)
            assert [(e["type"], e["object"]["metadata"].get("name")) for e in evs[:-1]] == [
                ("ADDED", n) for n in existing
            ]
            end = evs[-1]
            assert end["type"] == "BOOKMARK"
            assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
            assert int(end["object"]["metadata"]["resourceVersion"]) == api.s.store.rv
            await api.ok("POST", CMS, cm(f"c{rv}"))
            (ev,) = await w.take(1)
            assert ev["type"] == "ADDED" and ev["object"]["metadata"]["name"] == f"c{rv}"


async def test_streaming_list_sends_the_versions_of_its_start(api: Api) -> None:
    """The initial events are framed while they are sent; what they carry is still fixed when the watch starts:
    a change made after that arrives as an event after the end bookmark, never inside an initial ADDED."""
    for name in ("a", "b", "c"):
        await api.ok("POST", CMS, cm(name, data={"k": "before"}))
    start_rv = api.s.store.rv
    info = api.s.registry.lookup("", "v1", "configmaps")
    assert info is not None
    params = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"}
    stream = watch._WatchStream(api.s.store, info, NS, params, None, False)
    initial = stream.backlog(None, True)
    assert initial is not None
    await api.ok("PATCH", f"{CMS}/c", {"data": {"k": "after"}})
    await api.ok("DELETE", f"{CMS}/b")
    await api.ok("POST", CMS, cm("d", data={"k": "after"}))
    evs = [json.loads(line) for line in initial]
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in evs[:-1]] == [
        ("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    assert {e["object"]["data"]["k"] for e in evs[:-1]} == {"before"}
    assert evs[-1]["type"] == "BOOKMARK"
    assert evs[-1]["object"]["metadata"]["resourceVersion"] == str(start_rv)


async def test_a_namespace_finalize_leaves_the_stored_version_as_it_was(api: Api) -> None:
    """A stored version is what a watch started earlier still sends: a later write must not change it."""
    await api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "fin"}, "spec": {"finalizers": ["a/b"]}})
    info = api.s.registry.lookup("", "v1", "namespaces")
    assert info is not None
    before = api.s.store.get(info.storage_key, "", "fin")
    assert before is not None
    seen = json.dumps(before.obj, sort_keys=True)
    await api.ok("PUT", "/api/v1/namespaces/fin/finalize", {"metadata": {"name": "fin"}, "spec": {"finalizers": []}})
    assert json.dumps(before.obj, sort_keys=True) == seen


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"sendInitialEvents": "true"},
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
            "NotOlderThan",
        ),
        (
            {"resourceVersionMatch": "NotOlderThan"},
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless "
            "sendInitialEvents is provided",
        ),
    ],
)
async def test_streaming_list_422(api: Api, params: dict[str, str], message: str) -> None:
    r = await api.get(CMS, params={"watch": "true", **params})
    b = assert_status(r, 422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {message}')
    (cause,) = causes(r)
    assert cause["reason"] == "FieldValueForbidden" and cause["field"] == "resourceVersionMatch"
    assert b["details"]["kind"] == "ListOptions"


async def test_too_old_rv_is_200_then_error_410(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    old = api.s.store.rv
    await api.ok("POST", CMS, cm("b"))
    api.s.compact()
    async with api.watch(CMS, {"resourceVersion": str(old)}) as w:
        evs = await w.rest()
    (ev,) = evs
    assert ev["type"] == "ERROR"
    st = ev["object"]
    assert st["kind"] == "Status" and st["code"] == 410 and st["reason"] == "Expired"
    assert st["message"].startswith(f"too old resource version: {old} (")
    assert st["status"] == "Failure" and st["apiVersion"] == "v1" and st["metadata"] == {}


async def test_history_window_by_size() -> None:
    async with serve(history_size=3) as api:
        await api.ok("POST", CMS, cm("a"))
        old = api.s.store.rv
        for i in range(5):
            await api.ok("POST", CMS, cm(f"x{i}"))
        async with api.watch(CMS, {"resourceVersion": str(old)}) as w:
            (ev,) = await w.rest()
        assert ev["type"] == "ERROR" and ev["object"]["code"] == 410
        # Within the window: replayed.
        async with api.watch(CMS, {"resourceVersion": str(api.s.store.rv - 2)}) as w:
            evs = await w.take(2)
        assert [e["object"]["metadata"]["name"] for e in evs] == ["x3", "x4"]


async def test_timeout_seconds_ends_cleanly(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    t0 = time.monotonic()
    async with api.watch(CMS, {"timeoutSeconds": "1", "allowWatchBookmarks": "true"}) as w:
        evs = await w.rest(wait=4.0)
    elapsed = time.monotonic() - t0
    assert 0.9 <= elapsed < 3.0
    assert evs[0]["type"] == "ADDED" and all(e["type"] in ("ADDED", "BOOKMARK") for e in evs)


async def test_single_object_watch(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    await api.ok("POST", CMS, cm("b"))
    async with api.watch(CMS, {"fieldSelector": "metadata.name=b", "timeoutSeconds": "1"}) as w:
        await api.ok("PATCH", f"{CMS}/a", {"data": {"x": "1"}})
        await api.ok("PATCH", f"{CMS}/b", {"data": {"x": "1"}})
        evs = await w.rest()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [("ADDED", "b"), ("MODIFIED", "b")]
    # The deprecated /watch/ prefix still works.
    async with api.session.get(
        f"{api.s.url}/api/v1/watch/namespaces/{NS}/configmaps/a", params={"timeoutSeconds": "1"}
    ) as resp:
        lines = (await resp.read()).splitlines()
    assert [json.loads(x)["object"]["metadata"]["name"] for x in lines] == ["a"]


# =============================================================================================== 3.D writes


async def test_create(api: Api) -> None:
    await install_crds(api)
    body = cm("a", meta={"uid": "client-uid", "creationTimestamp": "2000-01-01T00:00:00Z"})
    r = await api.post(CMS, body, params={"fieldManager": "tester"})
    assert r.status == 201
    m = r.body["metadata"]
    uuid.UUID(m["uid"])
    assert m["uid"] != "client-uid" and m["namespace"] == NS
    assert RFC3339_SECONDS.match(m["creationTimestamp"]) and m["creationTimestamp"] != "2000-01-01T00:00:00Z"
    assert int(m["resourceVersion"]) == api.s.store.rv
    assert "generation" not in m
    assert m["managedFields"][0]["manager"] == "tester" and m["managedFields"][0]["operation"] == "Update"
    # generateName.
    r = await api.post(CMS, {"metadata": {"generateName": "gen-"}, "data": {}})
    assert r.status == 201 and re.match(r"^gen-[a-z0-9]{5}$", r.body["metadata"]["name"])
    # CRs and spec-bearing built-ins get generation 1.
    r = await api.post(WIDGETS, widget("w"))
    assert r.status == 201 and r.body["metadata"]["generation"] == 1
    r = await api.post(
        PDBS,
        {"metadata": {"name": "p"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"a": "b"}}}},
    )
    assert r.status == 201 and r.body["metadata"]["generation"] == 1
    # Namespace in the body must match the URL.
    r = await api.post(CMS, cm("x", meta={"namespace": "kube-system"}))
    assert_status(r, 400, "BadRequest")
    # Name or generateName required.
    r = await api.post(CMS, {"metadata": {}, "data": {}})
    assert_status(r, 422, "Invalid")


async def test_already_exists_missing_and_terminating_namespace(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    r = await api.post(CMS, cm("a"))
    b = assert_status(r, 409, "AlreadyExists", 'configmaps "a" already exists')
    assert b["details"] == {"name": "a", "kind": "configmaps"}
    r = await api.post("/api/v1/namespaces/nope/configmaps", cm("a"))
    assert_status(r, 404, "NotFound", 'namespaces "nope" not found')
    # A namespace held in Terminating by a finalizer on its content.
    await api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "doomed"}})
    held = cm("held", meta={"finalizers": ["example.com/hold"]})
    await api.ok("POST", "/api/v1/namespaces/doomed/configmaps", held)
    await api.ok("DELETE", "/api/v1/namespaces/doomed")
    r = await api.post("/api/v1/namespaces/doomed/configmaps", cm("new"))
    b = assert_status(r, 403, "Forbidden")
    assert b["message"] == "unable to create new content in namespace doomed because it is being terminated"
    assert causes(r)[0]["reason"] == "NamespaceTerminating"


async def test_custom_resource_validation(api: Api) -> None:
    await install_crds(api)
    r = await api.post(WIDGETS, {**widget("bad", size=0, color="green", label="UPPER")})
    b = assert_status(r, 422, "Invalid")
    assert b["message"].startswith(f'Widget.{GROUP} "bad" is invalid: ')
    got = {(c["field"], c["reason"]) for c in causes(r)}
    assert ("spec.size", "FieldValueInvalid") in got
    assert ("spec.color", "FieldValueNotSupported") in got
    assert ("spec.label", "FieldValueInvalid") in got
    r = await api.post(WIDGETS, {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "x"}, "spec": {}})
    assert_status(r, 422, "Invalid")
    assert {(c["field"], c["reason"]) for c in causes(r)} == {("spec.size", "FieldValueRequired")}
    # Defaults applied, unknown fields pruned.
    r = await api.post(WIDGETS, {**widget("ok"), "extra": 1}, params={"fieldValidation": "Ignore"})
    assert r.status == 201 and r.body["spec"]["color"] == "red" and "extra" not in r.body


async def test_put_conflicts_and_rv_rules(api: Api) -> None:
    await install_crds(api)
    a = await api.ok("POST", CMS, cm("a"))
    stale = a["metadata"]["resourceVersion"]
    a["data"] = {"k": "2"}
    r = await api.put(f"{CMS}/a", a)
    assert r.status == 200 and r.body["data"] == {"k": "2"}
    a["data"] = {"k": "3"}
    r = await api.put(f"{CMS}/a", a)
    assert_status(
        r,
        409,
        "Conflict",
        'Operation cannot be fulfilled on configmaps "a": the object has been modified; please apply your '
        "changes to the latest version and try again",
    )
    assert a["metadata"]["resourceVersion"] == stale
    # Built-ins: RV omitted -> unconditional; uid and creationTimestamp kept.
    body = cm("a", data={"k": "4"}, meta={"uid": "other", "creationTimestamp": "2000-01-01T00:00:00Z"})
    r = await api.put(f"{CMS}/a", body)
    assert r.status == 200 and r.body["data"] == {"k": "4"}
    assert r.body["metadata"]["uid"] == a["metadata"]["uid"]
    assert r.body["metadata"]["creationTimestamp"] == a["metadata"]["creationTimestamp"]
    # CRs: RV required on PUT.
    w = await api.ok("POST", WIDGETS, widget("w"))
    r = await api.put(f"{WIDGETS}/w", widget("w", size=2))
    assert_status(
        r,
        422,
        "Invalid",
        f'Widget.{GROUP} "w" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for '
        "an update",
    )
    w["spec"]["size"] = 2
    r = await api.put(f"{WIDGETS}/w", w)
    assert r.status == 200
    w["spec"]["size"] = 3
    r = await api.put(f"{WIDGETS}/w", w)
    assert_status(r, 409, "Conflict")
    assert r.body["message"].startswith(f'Operation cannot be fulfilled on widgets.{GROUP} "w": ')
    # Name mismatch between body and URL.
    r = await api.put(f"{CMS}/a", cm("b"))
    assert_status(r, 400, "BadRequest")
    r = await api.put(f"{CMS}/missing", cm("missing"))
    assert_status(r, 404, "NotFound")


async def test_resource_version_in_patch_body_is_a_precondition(api: Api) -> None:
    a = await api.ok("POST", CMS, cm("a"))
    rv = a["metadata"]["resourceVersion"]
    r = await api.patch(f"{CMS}/a", {"metadata": {"resourceVersion": "1"}, "data": {"k": "x"}})
    assert_status(r, 409, "Conflict")
    r = await api.patch(f"{CMS}/a", {"metadata": {"resourceVersion": rv}, "data": {"k": "x"}})
    assert r.status == 200 and r.body["data"] == {"k": "x"}
    r = await api.patch(f"{CMS}/a", {"metadata": {"resourceVersion": rv}, "data": {"k": "y"}})
    assert_status(r, 409, "Conflict")
    # JSON patch that sets the RV works the same way.
    r = await api.patch(
        f"{CMS}/a",
        [{"op": "replace", "path": "/metadata/resourceVersion", "value": rv}],
        ctype="application/json-patch+json",
    )
    assert_status(r, 409, "Conflict")


async def test_generation_rules(api: Api) -> None:
    await install_crds(api)
    w = await api.ok("POST", WIDGETS, widget("w"))
    assert w["metadata"]["generation"] == 1
    w = await api.ok("PATCH", f"{WIDGETS}/w", {"spec": {"size": 5}}, ctype="application/merge-patch+json")
    assert w["metadata"]["generation"] == 2
    w = await api.ok("PATCH", f"{WIDGETS}/w", {"metadata": {"labels": {"a": "b"}}})
    assert w["metadata"]["generation"] == 2
    w = await api.ok(
        "PATCH", f"{WIDGETS}/w/status", {"status": {"ready": True}}, ctype="application/merge-patch+json"
    )
    assert w["metadata"]["generation"] == 2 and w["status"] == {"ready": True}
    # Deletion with a finalizer bumps generation once.
    await api.ok(
        "PATCH", f"{WIDGETS}/w", {"metadata": {"finalizers": ["example.com/x"]}}, ctype="application/merge-patch+json"
    )
    d = await api.ok("DELETE", f"{WIDGETS}/w")
    assert d["metadata"]["generation"] == 3 and d["metadata"]["deletionTimestamp"]
    d = await api.ok("DELETE", f"{WIDGETS}/w")
    assert d["metadata"]["generation"] == 3


async def test_status_subresource_split(api: Api) -> None:
    await install_crds(api)
    # Create ignores status when the subresource exists.
    w = await api.ok("POST", WIDGETS, {**widget("w"), "status": {"ready": True}})
    assert "status" not in w
    w = await api.ok("PUT", f"{WIDGETS}/w/status", {**w, "status": {"ready": True}})
    assert w["status"] == {"ready": True}
    # Main resource ignores status.
    w2 = dict(w, status={"ready": False}, spec={"size": 7, "color": "red"})
    w = await api.ok("PUT", f"{WIDGETS}/w", w2)
    assert w["status"] == {"ready": True} and w["spec"]["size"] == 7 and w["metadata"]["generation"] == 2
    # /status ignores spec and metadata.
    body = dict(w, spec={"size": 99, "color": "blue"}, status={"ready": False})
    body["metadata"] = dict(w["metadata"], labels={"sneaky": "yes"})
    w = await api.ok("PUT", f"{WIDGETS}/w/status", body)
    assert w["spec"]["size"] == 7 and w["status"] == {"ready": False}
    assert "labels" not in w["metadata"] and w["metadata"]["generation"] == 2
    # Without the subresource the whole object is writable and status changes bump generation.
    g = await api.ok("POST", GADGETS, {**widget("g"), "kind": "Gadget", "status": {"ready": True}})
    assert g["status"] == {"ready": True}
    g = await api.ok("PATCH", f"{GADGETS}/g", {"status": {"ready": False}}, ctype="application/merge-patch+json")
    assert g["status"] == {"ready": False} and g["metadata"]["generation"] == 2
    r = await api.get(f"{GADGETS}/g/status")
    assert_status(r, 404, "NotFound")
    # Built-ins: pod status only through /status.
    await api.ok("POST", PODS, pod("p"))
    p = await api.ok("GET", f"{PODS}/p")
    p2 = dict(p, status={"phase": "Running"})
    p = await api.ok("PUT", f"{PODS}/p", p2)
    assert p["status"]["phase"] == "Pending"
    p = await api.ok("PATCH", f"{PODS}/p/status", {"status": {"phase": "Running"}})
    assert p["status"]["phase"] == "Running"


async def test_pod_spec_immutability_and_scheduling_gates(api: Api) -> None:
    await api.ok("POST", PODS, pod("p", schedulingGates=[{"name": "a"}, {"name": "b"}]))
    r = await api.patch(f"{PODS}/p", {"spec": {"restartPolicy": "Never"}})
    b = assert_status(r, 422, "Invalid")
    assert "pod updates may not change fields other than" in b["message"]
    # Image, labels, annotations may change.
    r = await api.patch(
        f"{PODS}/p",
        {
            "metadata": {"labels": {"x": "y"}, "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "busybox:2"}]},
        },
        ctype="application/strategic-merge-patch+json",
    )
    assert r.status == 200 and r.body["spec"]["containers"][0]["image"] == "busybox:2"
    # Gates: removal only.
    r = await api.patch(f"{PODS}/p", [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "c"}}],
                        ctype="application/json-patch+json")
    b = assert_status(r, 422, "Invalid")
    assert any(c["field"].startswith("spec.schedulingGates") for c in causes(r))
    r = await api.patch(f"{PODS}/p", [{"op": "remove", "path": "/spec/schedulingGates/0"}],
                        ctype="application/json-patch+json")
    assert r.status == 200 and r.body["spec"]["schedulingGates"] == [{"name": "b"}]
    r = await api.patch(f"{PODS}/p", {"spec": {"schedulingGates": None}})
    assert r.status == 200 and not r.body["spec"].get("schedulingGates")


async def test_gated_pod_scheduling_directives_may_only_tighten(api: Api) -> None:
    """KEP-3838 (GA 1.30): while gated, nodeSelector and required node affinity take additions only; once the
    last gate is gone they are frozen like the rest of the spec."""
    await api.ok("POST", PODS, pod("g", schedulingGates=[{"name": "a"}], nodeSelector={"zone": "z1"}))
    r = await api.patch(f"{PODS}/g", {"spec": {"nodeSelector": {"kubernetes.io/hostname": "n1"}}})
    assert r.status == 200 and r.body["spec"]["nodeSelector"] == {"zone": "z1", "kubernetes.io/hostname": "n1"}
    r = await api.patch(f"{PODS}/g", {"spec": {"nodeSelector": {"zone": "z2"}}})
    assert_status(r, 422, "Invalid")
    assert any(c["field"] == "spec.nodeSelector" for c in causes(r))
    term = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
    req = "requiredDuringSchedulingIgnoredDuringExecution"
    r = await api.patch(f"{PODS}/g", {"spec": {"affinity": {"nodeAffinity": {req: {"nodeSelectorTerms": [term]}}}}})
    assert r.status == 200
    more = {"matchExpressions": [*term["matchExpressions"], {"key": "mig", "operator": "Exists"}]}
    r = await api.patch(f"{PODS}/g", {"spec": {"affinity": {"nodeAffinity": {req: {"nodeSelectorTerms": [more]}}}}})
    assert r.status == 200
    r = await api.patch(f"{PODS}/g", {"spec": {"affinity": {"nodeAffinity": {req: {"nodeSelectorTerms": [term]}}}}})
    assert_status(r, 422, "Invalid")  # a requirement removed
    # pin and ungate in one update, as a controller does
    r = await api.patch(f"{PODS}/g", {"spec": {"nodeSelector": {"zone": "z1", "kubernetes.io/hostname": "n1",
                                                                "pool": "p"}, "schedulingGates": None}})
    assert r.status == 200 and not r.body["spec"].get("schedulingGates")
    r = await api.patch(f"{PODS}/g", {"spec": {"nodeSelector": {"extra": "x"}}})
    b = assert_status(r, 422, "Invalid")  # no longer gated: frozen
    assert "pod updates may not change fields other than" in b["message"]


async def test_dry_run_changes_nothing(api: Api) -> None:
    await install_crds(api)
    await api.ok("POST", CMS, cm("a", meta={"finalizers": ["example.com/x"]}))
    await api.ok("POST", PODS, pod("p", nodeName="n1"))
    rv, dump = api.s.store.rv, api.s.store.dump()
    async with api.watch(CMS, {"resourceVersion": str(rv), "timeoutSeconds": "1"}) as w:
        dry = {"dryRun": "All"}
        r = await api.post(CMS, cm("b"), params=dry)
        assert r.status == 201 and r.body["metadata"]["name"] == "b" and r.body["metadata"]["uid"]
        r = await api.post(WIDGETS, widget("bad", size=0), params=dry)
        assert_status(r, 422, "Invalid")  # dry run still validates
        r = await api.post(WIDGETS, widget("w"), params=dry)
        assert r.status == 201 and r.body["spec"]["color"] == "red"  # and defaults
        r = await api.put(f"{CMS}/a", cm("a", data={"k": "dry"}, meta={"finalizers": ["example.com/x"]}), params=dry)
        assert r.status == 200 and r.body["data"] == {"k": "dry"}
        r = await api.patch(f"{CMS}/a", {"data": {"k": "dry"}}, params=dry)
        assert r.status == 200 and r.body["data"] == {"k": "dry"}
        r = await api.delete(f"{CMS}/a", params=dry)
        assert r.status == 200 and r.body["metadata"]["deletionTimestamp"]
        r = await api.delete(f"{PODS}/p", {"gracePeriodSeconds": 0, "dryRun": ["All"]})
        assert r.status == 200
        r = await api.patch(
            f"{CMS}/ssa", {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}},
            ctype="application/apply-patch+yaml", params={"fieldManager": "m", **dry},
        )
        assert r.status == 201
        assert await w.rest() == []
    assert api.s.store.rv == rv and api.s.store.dump() == dump
    r = await api.put(f"{CMS}/a", {}, params={"dryRun": "Bogus"})
    assert_status(r, 400, "BadRequest")


# =============================================================================================== 3.E patches


async def test_json_patch_errors(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    jp = "application/json-patch+json"
    r = await api.patch(f"{CMS}/a", [{"op": "add", "path": "/data/n", "value": "1"}], ctype=jp)
    assert r.status == 200 and r.body["data"] == {"k": "v", "n": "1"}
    rv = api.s.store.rv
    r = await api.req("PATCH", f"{CMS}/a", data=b"[{not json", ctype=jp)
    assert_status(r, 400, "BadRequest")
    r = await api.patch(f"{CMS}/a", {"op": "add"}, ctype=jp)
    assert_status(r, 400, "BadRequest")
    r = await api.patch(f"{CMS}/a", [{"op": "test", "path": "/data/k", "value": "nope"}], ctype=jp)
    assert_status(r, 422)
    r = await api.patch(f"{CMS}/a", [{"op": "remove", "path": "/data/missing"}], ctype=jp)
    assert_status(r, 422)
    r = await api.patch(f"{CMS}/a", [{"op": "replace", "path": "/data/k", "value": "x"}] * 10_001, ctype=jp)
    assert_status(r, 413, "RequestEntityTooLarge")
    assert api.s.store.rv == rv


async def test_merge_patch(api: Api) -> None:
    await install_crds(api)
    await api.ok("POST", CMS, cm("a", data={"x": "1", "y": "2"}))
    r = await api.patch(f"{CMS}/a", {"data": {"x": None, "z": "3"}})
    assert r.status == 200 and r.body["data"] == {"y": "2", "z": "3"}
    await api.ok("POST", WIDGETS, widget("w", items=["a", "b"]))
    r = await api.patch(f"{WIDGETS}/w", {"spec": {"items": ["c"]}})
    assert r.body["spec"]["items"] == ["c"]


async def test_strategic_merge_patch(api: Api) -> None:
    await install_crds(api)
    smp = "application/strategic-merge-patch+json"
    containers = [
        {"name": "a", "image": "img", "env": [{"name": "E1", "value": "1"}, {"name": "E2", "value": "2"}]},
        {"name": "b", "image": "img"},
    ]
    # Pods: containers merged by name (only the image may change on a pod).
    p = pod("p")
    p["spec"]["containers"] = containers
    await api.ok("POST", PODS, p)
    r = await api.patch(f"{PODS}/p", {"spec": {"containers": [{"name": "b", "image": "img2"}]}}, ctype=smp)
    assert r.status == 200, r.body
    assert [(c["name"], c["image"]) for c in r.body["spec"]["containers"]] == [("a", "img"), ("b", "img2")]
    # A pod template: env merged by name, $patch: delete.
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": containers}},
        },
    }
    dpath = f"/apis/apps/v1/namespaces/{NS}/deployments/d"
    await api.ok("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", deploy)
    tmpl_patch = {"containers": [{"name": "a", "env": [{"name": "E2", "value": "two"}, {"name": "E3", "value": "3"}]}]}
    r = await api.patch(dpath, {"spec": {"template": {"spec": tmpl_patch}}}, ctype=smp)
    assert r.status == 200, r.body
    cs = {c["name"]: c for c in r.body["spec"]["template"]["spec"]["containers"]}
    assert set(cs) == {"a", "b"}
    assert cs["a"]["env"] == [
        {"name": "E1", "value": "1"},
        {"name": "E2", "value": "two"},
        {"name": "E3", "value": "3"},
    ]
    assert r.body["metadata"]["generation"] == 2
    tmpl_patch = {"containers": [{"name": "a", "env": [{"name": "E1", "$patch": "delete"}]}]}
    r = await api.patch(dpath, {"spec": {"template": {"spec": tmpl_patch}}}, ctype=smp)
    assert r.status == 200
    assert [e["name"] for e in r.body["spec"]["template"]["spec"]["containers"][0]["env"]] == ["E2", "E3"]
    # Custom resources: 415.
    await api.ok("POST", WIDGETS, widget("w"))
    r = await api.patch(f"{WIDGETS}/w", {"spec": {"size": 2}}, ctype=smp)
    assert_status(
        r,
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
    )


async def test_server_side_apply(api: Api) -> None:
    apply_ct = "application/apply-patch+yaml"
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}, "data": {"x": "1"}}
    r = await api.patch(f"{CMS}/s", cfg, ctype=apply_ct, params={"fieldManager": "alice"})
    assert r.status == 201 and r.body["data"] == {"x": "1"}
    mf = r.body["metadata"]["managedFields"]
    assert mf[0]["manager"] == "alice" and mf[0]["operation"] == "Apply" and mf[0]["fieldsType"] == "FieldsV1"
    # YAML body.
    yaml_body = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: s\ndata:\n  x: '1'\n  y: '2'\n"
    r = await api.req("PATCH", f"{CMS}/s", data=yaml_body, ctype=apply_ct, params={"fieldManager": "alice"})
    assert r.status == 200 and r.body["data"] == {"x": "1", "y": "2"}
    # Conflict with another manager.
    other = dict(cfg, data={"x": "2"})
    r = await api.patch(f"{CMS}/s", other, ctype=apply_ct, params={"fieldManager": "bob"})
    assert_status(r, 409, "Conflict")
    (cause,) = causes(r)
    assert cause["reason"] == "FieldManagerConflict" and cause["field"] == ".data.x"
    assert cause["message"].startswith('conflict with "alice"')
    # force takes ownership.
    r = await api.patch(f"{CMS}/s", other, ctype=apply_ct, params={"fieldManager": "bob", "force": "true"})
    assert r.status == 200 and r.body["data"] == {"x": "2", "y": "2"}
    # alice drops y from her config: removed (nobody else owns it); x now belongs to bob.
    r = await api.patch(
        f"{CMS}/s", dict(cfg, data={}), ctype=apply_ct, params={"fieldManager": "alice"}
    )
    assert r.status == 200 and r.body["data"] == {"x": "2"}
    # fieldManager is required.
    r = await api.patch(f"{CMS}/s", cfg, ctype=apply_ct)
    b = assert_status(r, 422, "Invalid")
    assert causes(r)[0]["field"] == "fieldManager" and b["details"]["kind"] == "PatchOptions"
    # force only on apply.
    r = await api.patch(f"{CMS}/s", {"data": {}}, params={"force": "true"})
    assert_status(r, 400, "BadRequest")


# =============================================================================================== 3.F deletion


async def test_delete_preconditions_and_response(api: Api) -> None:
    a = await api.ok("POST", CMS, cm("a"))
    r = await api.delete(f"{CMS}/a", {"preconditions": {"uid": "wrong"}})
    b = assert_status(r, 409, "Conflict")
    assert "Precondition failed: UID in precondition: wrong" in b["message"]
    r = await api.delete(f"{CMS}/a", {"preconditions": {"resourceVersion": "1"}})
    assert_status(r, 409, "Conflict")
    r = await api.delete(
        f"{CMS}/a",
        {"propagationPolicy": "Background", "preconditions": {"uid": a["metadata"]["uid"],
                                                              "resourceVersion": a["metadata"]["resourceVersion"]}},
    )
    assert r.status == 200 and r.body["metadata"]["name"] == "a"
    r = await api.delete(f"{CMS}/a")
    assert_status(r, 404, "NotFound")
    r = await api.delete(f"{CMS}/x", {"propagationPolicy": "Sideways"})
    assert r.status in (404, 422)


async def test_finalizers(api: Api) -> None:
    await api.ok("POST", CMS, cm("a", meta={"finalizers": ["example.com/x"]}))
    async with api.watch(CMS, {"resourceVersion": str(api.s.store.rv)}) as w:
        r = await api.delete(f"{CMS}/a", {"propagationPolicy": "Background"})
        assert r.status == 200
        m = r.body["metadata"]
        assert RFC3339_SECONDS.match(m["deletionTimestamp"]) and m["deletionGracePeriodSeconds"] == 0
        (ev,) = await w.take(1)
        assert ev["type"] == "MODIFIED" and ev["object"]["metadata"]["deletionTimestamp"]
        assert (await api.get(f"{CMS}/a")).status == 200
        # No new finalizers while deleting.
        r = await api.patch(f"{CMS}/a", {"metadata": {"finalizers": ["example.com/x", "example.com/y"]}})
        assert_status(r, 422, "Invalid")
        assert causes(r)[0]["field"] == "metadata.finalizers"
        # Other updates are fine.
        r = await api.patch(f"{CMS}/a", {"data": {"k": "2"}})
        assert r.status == 200
        (ev,) = await w.take(1)
        assert ev["type"] == "MODIFIED"
        # Removing the last finalizer deletes it.
        r = await api.patch(f"{CMS}/a", {"metadata": {"finalizers": None}})
        assert r.status == 200
        (ev,) = await w.take(1)
        assert ev["type"] == "DELETED" and ev["object"]["metadata"]["name"] == "a"
    assert await gone(api, f"{CMS}/a")


async def test_pod_graceful_deletion(api: Api) -> None:
    # Unscheduled: immediate.
    await api.ok("POST", PODS, pod("unscheduled"))
    assert (await api.delete(f"{PODS}/unscheduled")).status == 200
    assert await gone(api, f"{PODS}/unscheduled")
    # Terminal: immediate.
    await api.ok("POST", PODS, pod("done", nodeName="n1"))
    await api.ok("PATCH", f"{PODS}/done/status", {"status": {"phase": "Succeeded"}})
    assert (await api.delete(f"{PODS}/done")).status == 200
    assert await gone(api, f"{PODS}/done")
    # Bound and running: waits for the kubelet's grace-0 delete.
    await ready_pod(api, "run", {"app": "x"})
    r = await api.delete(f"{PODS}/run")
    assert r.status == 200
    m = r.body["metadata"]
    assert m["deletionGracePeriodSeconds"] == 30 and m["deletionTimestamp"]
    assert (await api.get(f"{PODS}/run")).status == 200
    # A shorter grace period shortens it; a longer one does not.
    r = await api.delete(f"{PODS}/run", {"gracePeriodSeconds": 10})
    assert r.body["metadata"]["deletionGracePeriodSeconds"] == 10
    r = await api.delete(f"{PODS}/run", {"gracePeriodSeconds": 20})
    assert r.body["metadata"]["deletionGracePeriodSeconds"] == 10
    r = await api.delete(f"{PODS}/run", {"gracePeriodSeconds": 0})
    assert r.status == 200
    assert await gone(api, f"{PODS}/run")
    # spec.terminationGracePeriodSeconds is the default.
    await api.ok("POST", PODS, pod("short", nodeName="n1", terminationGracePeriodSeconds=5))
    await api.ok("PATCH", f"{PODS}/short/status", {"status": {"phase": "Running"}})
    r = await api.delete(f"{PODS}/short")
    assert r.body["metadata"]["deletionGracePeriodSeconds"] == 5


def owner_ref(owner: dict[str, Any], block: bool = False) -> dict[str, Any]:
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}
    if block:
        ref["blockOwnerDeletion"] = True
    return ref


async def test_gc_background(api: Api) -> None:
    owner = await api.ok("POST", CMS, cm("owner"))
    other = await api.ok("POST", CMS, cm("other"))
    await api.ok("POST", CMS, cm("dep", meta={"ownerReferences": [owner_ref(owner)]}))
    await api.ok("POST", CMS, cm("shared", meta={"ownerReferences": [owner_ref(owner), owner_ref(other)]}))
    await api.ok("DELETE", f"{CMS}/owner", {"propagationPolicy": "Background"})
    assert await gone(api, f"{CMS}/owner")
    await until("dep gone", lambda: gone(api, f"{CMS}/dep"), 5.0)

    async def shared_updated() -> bool:
        refs = (await api.ok("GET", f"{CMS}/shared"))["metadata"]["ownerReferences"]
        return [r["name"] for r in refs] == ["other"]

    await until("the shared dependent updated", shared_updated, 5.0)


async def test_gc_foreground(api: Api) -> None:
    owner = await api.ok("POST", CMS, cm("owner"))
    await api.ok(
        "POST",
        CMS,
        cm("dep", meta={"ownerReferences": [owner_ref(owner, block=True)], "finalizers": ["example.com/hold"]}),
    )
    r = await api.delete(f"{CMS}/owner", {"propagationPolicy": "Foreground"})
    assert r.status == 200
    assert "foregroundDeletion" in r.body["metadata"]["finalizers"] and r.body["metadata"]["deletionTimestamp"]

    async def dep_terminating() -> bool:
        d = await api.get(f"{CMS}/dep")
        return d.status == 200 and bool(d.body["metadata"].get("deletionTimestamp"))

    await until("dep terminating", dep_terminating, 5.0)
    await api.s.controllers.step()
    # The owner waits for its blocking dependent.
    assert (await api.get(f"{CMS}/owner")).status == 200
    await api.ok("PATCH", f"{CMS}/dep", {"metadata": {"finalizers": None}})
    await until("dep gone", lambda: gone(api, f"{CMS}/dep"), 5.0)
    await until("owner gone", lambda: gone(api, f"{CMS}/owner"), 5.0)


async def test_gc_orphan(api: Api) -> None:
    owner = await api.ok("POST", CMS, cm("owner"))
    await api.ok("POST", CMS, cm("dep", meta={"ownerReferences": [owner_ref(owner)]}))
    r = await api.delete(f"{CMS}/owner", params={"propagationPolicy": "Orphan"})
    assert r.status == 200
    await until("owner gone", lambda: gone(api, f"{CMS}/owner"), 5.0)
    await api.s.controllers.step()
    d = await api.ok("GET", f"{CMS}/dep")
    assert not d["metadata"].get("ownerReferences")


async def test_namespace_deletion(api: Api) -> None:
    await api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "tmp"}})
    await api.ok("POST", "/api/v1/namespaces/tmp/configmaps", cm("a"))
    await api.ok("POST", "/api/v1/namespaces/tmp/pods", pod("p", nodeName="n1"))
    r = await api.delete("/api/v1/namespaces/tmp")
    assert r.status == 200 and r.body["status"]["phase"] == "Terminating"
    assert r.body["spec"]["finalizers"] == ["kubernetes"]
    await until("configmap a in namespace tmp gone", lambda: gone(api, "/api/v1/namespaces/tmp/configmaps/a"), 5.0)
    # The bound pod waits for the kubelet: the namespace stays Terminating.
    p = await api.ok("GET", "/api/v1/namespaces/tmp/pods/p")
    assert p["metadata"]["deletionTimestamp"]
    ns = await api.ok("GET", "/api/v1/namespaces/tmp")
    assert ns["status"]["phase"] == "Terminating"
    await api.ok("DELETE", "/api/v1/namespaces/tmp/pods/p", {"gracePeriodSeconds": 0})
    await until("namespace tmp gone", lambda: gone(api, "/api/v1/namespaces/tmp"), 5.0)


# =============================================================================================== 3.G subresources


def eviction(name: str, **opts: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": NS},
    }
    if opts:
        body["deleteOptions"] = opts
    return body


async def test_eviction(api: Api) -> None:
    for i in range(3):
        await ready_pod(api, f"p{i}", {"app": "x"})
    await ready_pod(api, "unready", {"app": "x"}, ready=False)
    await api.ok(
        "POST",
        PDBS,
        {"metadata": {"name": "pdb"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "x"}}}},
    )
    await api.s.controllers.step()

    async def pdb_status() -> dict[str, Any]:
        st: dict[str, Any] = (await api.ok("GET", f"{PDBS}/pdb")).get("status") or {}
        return st

    async def observed() -> bool:
        return (await pdb_status()).get("observedGeneration") == 1

    await until("the change observed", observed, 5.0)
    st = await pdb_status()
    assert (st["currentHealthy"], st["desiredHealthy"], st["disruptionsAllowed"], st["expectedPods"]) == (3, 2, 1, 4)
    # Freeze the disruption controller to see what the eviction itself recorded.
    await api.s.controllers.stop()
    r = await api.post(f"{PODS}/p0/eviction", eviction("p0"))
    assert r.status == 201 and r.body["kind"] == "Status" and r.body["status"] == "Success"
    st = await pdb_status()
    assert "p0" in st["disruptedPods"] and st["disruptionsAllowed"] == 0
    api.s.controllers.start()
    await api.s.controllers.step()
    # Upstream's controller drops pods that are already being deleted from disruptedPods and no longer counts
    # them as healthy.
    st = await pdb_status()
    assert "p0" not in (st.get("disruptedPods") or {})
    assert (st["currentHealthy"], st["disruptionsAllowed"]) == (2, 0)
    r = await api.post(f"{PODS}/p1/eviction", eviction("p1"))
    b = assert_status(r, 429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
    (cause,) = causes(r)
    assert cause["reason"] == "DisruptionBudget"
    assert re.match(r"^The disruption budget pdb needs 2 healthy pods and has \d currently$", cause["message"])
    assert b["details"].get("retryAfterSeconds", 0) >= 0
    # p0 is terminating (graceful); it is still there, with a deletionTimestamp.
    p0 = await api.ok("GET", f"{PODS}/p0")
    assert p0["metadata"]["deletionTimestamp"]
    # Errors.
    r = await api.post(f"{PODS}/missing/eviction", eviction("missing"))
    assert_status(r, 404, "NotFound")
    r = await api.post(f"{PODS}/p1/eviction", eviction("p2"))
    assert_status(r, 400, "BadRequest")
    # A pending (unbound) pod skips the PDB check.
    await api.ok("POST", PODS, pod("pending", {"app": "x"}))
    r = await api.post(f"{PODS}/pending/eviction", eviction("pending"))
    assert r.status == 201 and await gone(api, f"{PODS}/pending")
    # Two PDBs covering one pod -> 500.
    await api.ok(
        "POST",
        PDBS,
        {"metadata": {"name": "pdb2"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}}},
    )
    r = await api.post(f"{PODS}/p2/eviction", eviction("p2"))
    assert_status(r, 500, "InternalError")


async def test_pdb_not_yet_observed_is_429() -> None:
    async with serve() as api:
        await api.s.controllers.stop()  # nobody computes PDB status
        await ready_pod(api, "p", {"app": "x"})
        spec = {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}}
        await api.ok("POST", PDBS, {"metadata": {"name": "pdb"}, "spec": spec})
        r = await api.post(f"{PODS}/p/eviction", eviction("p"))
        assert_status(r, 429, "TooManyRequests")
        await api.s.controllers.step()
        r = await api.post(f"{PODS}/p/eviction", eviction("p"))
        assert r.status == 201


@pytest.mark.parametrize("policy", ["IfHealthyBudget", "AlwaysAllow"])
async def test_unhealthy_pod_eviction_policy(api: Api, policy: str) -> None:
    """Unready pods may go under AlwaysAllow even with no disruptions left; under IfHealthyBudget only while the
    budget is healthy (currentHealthy >= desiredHealthy)."""
    await ready_pod(api, "ok", {"app": "x"})
    await ready_pod(api, "sick1", {"app": "x"}, ready=False)
    await ready_pod(api, "sick2", {"app": "x"}, ready=False)
    spec = {"minAvailable": 2, "selector": {"matchLabels": {"app": "x"}}, "unhealthyPodEvictionPolicy": policy}
    await api.ok("POST", PDBS, {"metadata": {"name": "pdb"}, "spec": spec})

    async def observed() -> bool:
        st = (await api.ok("GET", f"{PDBS}/pdb")).get("status") or {}
        return st.get("observedGeneration") == 1 and st.get("expectedPods") == 3

    await until("the change observed", observed, 5.0)
    st = (await api.ok("GET", f"{PDBS}/pdb"))["status"]
    assert (st["currentHealthy"], st["desiredHealthy"], st["disruptionsAllowed"]) == (1, 2, 0)
    r = await api.post(f"{PODS}/sick1/eviction", eviction("sick1"))
    if policy == "AlwaysAllow":
        assert r.status == 201
    else:
        assert_status(r, 429, "TooManyRequests")
    # The ready pod is protected either way.
    assert_status(await api.post(f"{PODS}/ok/eviction", eviction("ok")), 429, "TooManyRequests")


async def test_binding(api: Api) -> None:
    await api.ok("POST", PODS, pod("p"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"kind": "Node", "name": "n1"},
    }
    r = await api.post(f"{PODS}/p/binding", binding)
    assert r.status == 201
    p = await api.ok("GET", f"{PODS}/p")
    assert p["spec"]["nodeName"] == "n1"
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in p["status"]["conditions"])
    r = await api.post(f"{PODS}/p/binding", binding)
    b = assert_status(r, 409, "Conflict")
    assert b["message"].endswith('pod p is already assigned to node "n1"')


async def test_lease_micro_time(api: Api) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "leader"},
        "spec": {
            "holderIdentity": "me",
            "leaseDurationSeconds": 15,
            "acquireTime": "2024-05-01T10:00:00.123456Z",
            "renewTime": "2024-05-01T10:00:05.654321Z",
        },
    }
    r = await api.post(LEASES, lease)
    assert r.status == 201
    got = await api.ok("GET", f"{LEASES}/leader")
    assert got["spec"]["acquireTime"] == "2024-05-01T10:00:00.123456Z"
    assert got["spec"]["renewTime"] == "2024-05-01T10:00:05.654321Z"
    got["spec"]["renewTime"] = "2024-05-01T10:00:07.000001Z"
    got = await api.ok("PUT", f"{LEASES}/leader", got)
    assert got["spec"]["renewTime"] == "2024-05-01T10:00:07.000001Z"


async def test_crd_lifecycle(api: Api) -> None:
    r = await api.post(CRDS, crd("Widget", "widgets", status_subresource=True))
    assert r.status == 201
    conds = {c["type"]: c["status"] for c in r.body["status"]["conditions"]}
    assert conds["NamesAccepted"] == "True" and conds["Established"] == "True"
    assert r.body["status"]["acceptedNames"]["kind"] == "Widget"
    # Discovery: legacy, aggregated, per group-version; OpenAPI v3 index and doc.
    groups = (await api.ok("GET", "/apis"))["groups"]
    assert any(g["name"] == GROUP for g in groups)
    agg = await api.get("/apis", headers={"Accept": AGG_V2})
    assert GROUP in {g["metadata"]["name"] for g in agg.body["items"]}
    rl = await api.ok("GET", f"/apis/{GROUP}/v1")
    assert {x["name"] for x in rl["resources"]} == {"widgets", "widgets/status"}
    idx = await api.ok("GET", "/openapi/v3")
    url = idx["paths"][f"apis/{GROUP}/v1"]["serverRelativeURL"]
    doc = await api.ok("GET", url)
    assert doc["openapi"].startswith("3.0")
    # Instances, then deletion of the CRD takes them along.
    await api.ok("POST", WIDGETS, widget("w"))
    r = await api.delete(f"{CRDS}/widgets.{GROUP}")
    assert r.status == 200
    await until("the widgets CRD gone", lambda: gone(api, f"{CRDS}/widgets.{GROUP}"), 5.0)
    assert not [s for s in api.s.store.iter((GROUP, "widgets"))]
    assert (await api.get(WIDGETS)).status == 404
    assert (await api.get(f"/apis/{GROUP}/v1")).status == 404
    assert f"apis/{GROUP}/v1" not in (await api.ok("GET", "/openapi/v3"))["paths"]
    assert all(g["name"] != GROUP for g in (await api.ok("GET", "/apis"))["groups"])


# =============================================================================================== faults


async def test_faults_error_rate_and_retry_after(api: Api) -> None:
    api.s.faults.add_error(429, 1.0, verbs=["list"], resources=["configmaps"], retry_after=2, count=1)
    r = await api.get(CMS)
    assert_status(r, 429, "TooManyRequests")
    assert r.headers["Retry-After"] == "2"
    assert (await api.get(CMS)).status == 200  # count exhausted
    assert (await api.get(f"{CMS}/x")).status == 404  # other verbs untouched
    # Over HTTP.
    r = await api.post("/sim/faults", {"action": "error", "code": 503, "verbs": ["get"], "count": 2})
    assert r.status == 200
    assert_status(await api.get(f"{CMS}/x"), 503, "ServiceUnavailable")
    state = await api.ok("GET", "/sim/faults")
    assert state["injected"] == 2 and state["resourceVersion"] == api.s.store.rv
    await api.ok("POST", "/sim/faults", {"action": "clear"})
    assert (await api.get(f"{CMS}/x")).status == 404
    r = await api.post("/sim/faults", {"action": "error", "code": 418})
    assert_status(r, 400, "BadRequest")


async def test_faults_latency(api: Api) -> None:
    api.s.faults.latency = 0.2
    t0 = time.monotonic()
    assert (await api.get(CMS)).status == 200
    assert time.monotonic() - t0 >= 0.2
    api.s.faults.latency = 0.0


async def test_faults_drop_watches(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    async with api.watch(CMS) as w:
        await w.take(1)
        assert api.s.drop_watches() == 1
        with pytest.raises((aiohttp.ClientError, ConnectionError)):
            while (await w.next(wait=2.0)) is not None:
                pass
            raise aiohttp.ClientPayloadError("ended")  # a clean end is fine too


async def test_faults_compact_over_http(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    old = api.s.store.rv
    await api.ok("POST", CMS, cm("b"))
    r = await api.ok("POST", "/sim/faults", {"action": "compact"})
    assert r["compactedResourceVersion"] == api.s.store.rv
    async with api.watch(CMS, {"resourceVersion": str(old)}) as w:
        (ev,) = await w.rest()
    assert ev["type"] == "ERROR" and ev["object"]["code"] == 410


async def test_faults_outage_and_restart_keep_state(api: Api) -> None:
    await api.ok("POST", CMS, cm("a"))
    rv = api.s.store.rv
    task = asyncio.create_task(api.s.outage(0.5))
    await until("the port closed", lambda: refuses_connections(api.s.port), 0.5, every=0.01)
    with pytest.raises(aiohttp.ClientConnectionError):
        await api.get(CMS)
    await task
    r = await api.get(f"{CMS}/a")
    assert r.status == 200 and api.s.store.rv == rv
    await api.s.restart()
    assert (await api.get(f"{CMS}/a")).status == 200
    # Over HTTP: answered first, then dark.
    r = await api.post("/sim/faults", {"action": "outage", "seconds": 0.4})
    assert r.status == 200
    await until("the port closed", lambda: refuses_connections(api.s.port), 0.4, every=0.01)
    with pytest.raises(aiohttp.ClientConnectionError):
        await api.get(CMS)
    await until("the server answering again", lambda: _up(api), 3.0)
    assert (await api.get(f"{CMS}/a")).status == 200


async def _up(api: Api) -> bool:
    try:
        return (await api.get(CMS)).status == 200
    except aiohttp.ClientConnectionError:
        return False


async def test_faults_snapshot_restore_round_trip(api: Api, tmp_path: Path) -> None:
    await install_crds(api)
    await api.ok("POST", CMS, cm("a"))
    await api.ok("POST", WIDGETS, widget("w"))
    rv = api.s.store.rv
    path = tmp_path / "snap.json"
    dump = api.s.store.dump()
    await api.ok("POST", "/sim/faults", {"action": "snapshot", "path": str(path)})
    await api.ok("DELETE", f"{CMS}/a")
    await api.ok("POST", CMS, cm("b"))
    await api.ok("DELETE", f"{CRDS}/gadgets.{GROUP}")
    await api.ok("POST", "/sim/faults", {"action": "restore", "path": str(path)})
    assert api.s.store.rv == rv and api.s.store.dump() == dump
    assert (await api.get(f"{CMS}/a")).status == 200
    assert (await api.get(f"{CMS}/b")).status == 404
    assert (await api.get(f"{WIDGETS}/w")).status == 200
    assert (await api.get(GADGETS)).status == 200  # CRD registry rebuilt from the restored store
    # History starts empty: old RVs are too old, new writes continue above the restored RV.
    async with api.watch(CMS, {"resourceVersion": str(rv - 1)}) as w:
        (ev,) = await w.rest()
    assert ev["type"] == "ERROR" and ev["object"]["code"] == 410
    c = await api.ok("POST", CMS, cm("c"))
    assert int(c["metadata"]["resourceVersion"]) == rv + 1
    # Direct API.
    api.s.save(tmp_path / "s2.json")
    api.s.restore(tmp_path / "s2.json")
    assert (await api.get(f"{CMS}/c")).status == 200


# =============================================================================================== auth


async def test_rbac_forbidden_message_and_reviews() -> None:
    async with serve(authorization="RBAC") as api:
        token = api.s.service_account_token(NS, "bot")
        hdr = {"Authorization": f"Bearer {token}"}
        r = await api.get(PODS, headers=hdr)
        assert_status(
            r,
            403,
            "Forbidden",
            'pods is forbidden: User "system:serviceaccount:default:bot" cannot list resource "pods" in API group '
            '"" in the namespace "default"',
        )
        r = await api.get(f"{LEASES}/x", headers=hdr)
        assert_status(
            r,
            403,
            "Forbidden",
            'leases.coordination.k8s.io "x" is forbidden: User "system:serviceaccount:default:bot" cannot get '
            'resource "leases" in API group "coordination.k8s.io" in the namespace "default"',
        )
        r = await api.get("/api/v1/nodes", headers=hdr)
        assert r.body["message"].endswith("at the cluster scope")
        # Grant pod reads through a Role + RoleBinding.
        await api.ok(
            "POST",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles",
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
            },
        )
        await api.ok(
            "POST",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings",
            {
                "metadata": {"name": "bot-reads"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": NS}],
            },
        )
        assert (await api.get(PODS, headers=hdr)).status == 200
        assert (await api.post(PODS, pod("p"), headers=hdr)).status == 403
        # Unknown token -> 401.
        r = await api.get(PODS, headers={"Authorization": "Bearer nope"})
        assert_status(r, 401, "Unauthorized")
        # TokenReview.
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        r = await api.post("/apis/authentication.k8s.io/v1/tokenreviews", review)
        assert r.status == 201
        assert r.body["status"]["authenticated"] is True
        assert r.body["status"]["user"]["username"] == "system:serviceaccount:default:bot"
        r = await api.post("/apis/authentication.k8s.io/v1/tokenreviews", {"spec": {"token": "bogus"}})
        assert r.status == 201 and not r.body["status"].get("authenticated")
        # SubjectAccessReview.
        sar = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": "system:serviceaccount:default:bot",
                "groups": ["system:serviceaccounts"],
                "resourceAttributes": {"namespace": NS, "verb": "list", "resource": "pods"},
            },
        }
        r = await api.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", sar)
        assert r.status == 201 and r.body["status"]["allowed"] is True
        sar["spec"]["resourceAttributes"]["verb"] = "delete"
        r = await api.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", sar)
        assert r.status == 201 and r.body["status"]["allowed"] is False
        # The bot cannot do reviews itself, nor touch the emulator's control endpoint.
        r = await api.get("/sim/faults", headers=hdr)
        assert_status(r, 403, "Forbidden")

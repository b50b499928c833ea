"""One scenario list, three real clients: kubernetes-asyncio, the official `kubernetes` client and kubectl.

Every scenario is written once against the `Client` adapter of `clients.py` and runs for each client
(ids "asyncio", "official", "kubectl"); each docstring names the API server behaviour its test checks.
Results are observed through a plain-HTTP admin connection where the client under test would hide them.

Where a client has no direct way to do something, the scenario uses that client's closest real path:
kubectl watches from a resourceVersion, reads single list pages and posts Evictions and
SelfSubjectAccessReviews with `get --raw` / `create --raw` (its `auth can-i` posts protobuf, which the
emulator does not decode), PUTs an object without resourceVersion with `replace --raw` (plain `replace`
fills it in), and talks to the RBAC server over TLS (client-go sends no bearer token to http:// servers).
kubernetes-asyncio's CustomObjectsApi maps only 200 for PATCH, so an apply that created (201) is read back.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trustme
from aiohttp import web
from clients import (
    CONFIGMAPS,
    CRDS,
    MUTATING,
    NAMESPACES,
    PDBS,
    PODS,
    ROLEBINDINGS,
    ROLES,
    SERVICEACCOUNTS,
    SERVICES,
    VALIDATING,
    WIDGETS,
    Admin,
    ApiError,
    Client,
    KubectlClient,
    TLSFrontend,
    connect,
    names,
)
from waiting import wait_until

if TYPE_CHECKING:
    from running_server import RunningServer


CLIENTS = ["asyncio", "official", "kubectl"]
FINALIZER = "conformance.gpuops.io/hold"


@pytest.fixture(params=CLIENTS)
def client_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(apiserver: RunningServer, client_kind: str, tmp_path: Path) -> Iterator[Client]:
    c = connect(client_kind, apiserver.kubeconfig, tmp_path / "client")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def admin(apiserver: RunningServer) -> Admin:
    return Admin(apiserver.url, apiserver.token)


# ------------------------------------------------------------------------------------------ manifests


def widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.conformance.gpuops.io"},
        "spec": {
            "group": "conformance.gpuops.io",
            "scope": "Namespaced",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "listKind": "WidgetList",
                "shortNames": ["wd"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                        {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {
                                        "size": {"type": "integer", "minimum": 0},
                                        "color": {
                                            "type": "string",
                                            "enum": ["red", "green", "blue"],
                                            "default": "red",
                                        },
                                    },
                                },
                                "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                            },
                        }
                    },
                }
            ],
        },
    }


def widget(name: str, size: int, color: str | None = None, ns: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"size": size}
    if color:
        spec["color"] = color
    return {
        "apiVersion": "conformance.gpuops.io/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def configmap(
    name: str,
    data: dict[str, str] | None = None,
    *,
    ns: str = "default",
    labels: dict[str, str] | None = None,
    **meta: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, **meta},
    }
    if labels:
        obj["metadata"]["labels"] = labels
    if data is not None:
        obj["data"] = data
    return obj


def install_widgets(admin: Admin) -> None:
    admin.create(CRDS, widget_crd(), None)


def _established(crd: dict[str, Any] | None) -> bool:
    conds = (crd or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conds)


def _rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def _status_body(e: ApiError, client: Client) -> dict[str, Any] | None:
    """The Status body for shape checks; kubectl only prints reason and message."""
    if client.name == "kubectl":
        assert e.body is None
        return None
    assert e.body is not None, e
    assert e.body["kind"] == "Status" and e.body["apiVersion"] == "v1" and e.body["status"] == "Failure"
    assert e.body["code"] == e.status and e.body["reason"] == e.reason
    return e.body


# ------------------------------------------------------------------------------------------ 3.A discovery


def test_discovery(client: Client, admin: Admin) -> None:
    """Version, group list, resource lists; a new CRD's group shows up."""
    version = client.version()
    assert version["major"] == "1" and version["gitVersion"].startswith("v1.")
    gvs = client.api_versions()
    assert {"v1", "apps/v1", "policy/v1", "apiextensions.k8s.io/v1", "rbac.authorization.k8s.io/v1"} <= gvs
    assert "conformance.gpuops.io/v1" not in gvs
    install_widgets(admin)
    assert "conformance.gpuops.io/v1" in client.api_versions()
    resources = client.api_resources()
    assert {
        "configmaps",
        "pods",
        "namespaces",
        "poddisruptionbudgets.policy",
        "customresourcedefinitions.apiextensions.k8s.io",
        "widgets.conformance.gpuops.io",
    } <= resources


# ------------------------------------------------------------------------------------------ 3.D/E apply


@pytest.mark.apiserver_warnings('unknown field "spec.bogus"')
def test_apply_crd_then_custom_resource_and_configmap(client: Client, admin: Admin) -> None:
    """Apply (kubectl: default strict validation), re-apply, schema 422."""
    (crd,) = client.apply([widget_crd()])
    assert crd["kind"] == "CustomResourceDefinition"
    wait_until("Established", lambda: _established(admin.get(CRDS, "widgets.conformance.gpuops.io", None)))

    client.apply([widget("w1", 1), configmap("cm1", {"a": "1", "b": "2"})])
    w = admin.get(WIDGETS, "w1")
    assert w is not None
    assert w["spec"] == {"size": 1, "color": "red"}  # schema default applied
    assert w["metadata"]["generation"] == 1 and w["kind"] == "Widget"
    cm = admin.get(CONFIGMAPS, "cm1")
    assert cm is not None and cm["data"] == {"a": "1", "b": "2"}

    # Re-apply: merge patch for the custom resource, strategic merge patch for the ConfigMap.
    client.apply([widget("w1", 2, "blue"), configmap("cm1", {"a": "1", "c": "3"})])
    w2 = admin.get(WIDGETS, "w1")
    assert w2 is not None
    assert w2["spec"] == {"size": 2, "color": "blue"}
    assert w2["metadata"]["generation"] == 2 and w2["metadata"]["uid"] == w["metadata"]["uid"]
    assert _rv(w2) > _rv(w)
    cm2 = admin.get(CONFIGMAPS, "cm1")
    assert cm2 is not None and cm2["data"]["c"] == "3" and cm2["metadata"]["uid"] == cm["metadata"]["uid"]
    if client.name == "kubectl":
        # Three-way client-side apply: a key dropped from the manifest is removed from the object.
        assert cm2["data"] == {"a": "1", "c": "3"}
        assert "kubectl.kubernetes.io/last-applied-configuration" in cm2["metadata"]["annotations"]
        managers = {m["manager"] for m in cm2["metadata"]["managedFields"]}
        assert "kubectl-client-side-apply" in managers

    # Re-applying the same manifests again is a no-op: no new resourceVersion.
    client.apply([widget("w1", 2, "blue")])
    w3 = admin.get(WIDGETS, "w1")
    assert w3 is not None and w3["metadata"]["resourceVersion"] == w2["metadata"]["resourceVersion"]

    # Unknown fields: kubectl validates strictly by default (fieldValidation=Strict, 400); the
    # Python clients send no fieldValidation, so the server's default (Warn) prunes the field.
    extra = widget("extra", 1)
    extra["spec"]["bogus"] = True
    if client.name == "kubectl":
        with pytest.raises(ApiError) as err:
            client.apply([extra])
        assert err.value.status == 400 and err.value.reason == "BadRequest"
        assert 'unknown field "spec.bogus"' in err.value.message
        assert admin.get(WIDGETS, "extra") is None
    else:
        client.apply([extra])
        stored = admin.get(WIDGETS, "extra")
        assert stored is not None and stored["spec"] == {"size": 1, "color": "red"}

    with pytest.raises(ApiError) as err:
        client.apply([widget("bad", -1)])
    assert err.value.status == 422 and err.value.reason == "Invalid"
    assert "spec.size" in err.value.message
    body = _status_body(err.value, client)
    if body is not None:
        assert body["details"]["name"] == "bad" and body["details"]["kind"] == "Widget"
        assert body["details"]["group"] == "conformance.gpuops.io"
        assert [c["field"] for c in body["details"]["causes"]] == ["spec.size"]
    assert admin.get(WIDGETS, "bad") is None


def test_server_side_apply(client: Client, admin: Admin) -> None:
    """SSA creates, conflicts between managers with 409 causes, force takes ownership."""
    install_widgets(admin)
    created = client.apply_server_side(WIDGETS, widget("ssa", 3), field_manager="team-a")
    assert created["spec"] == {"size": 3, "color": "red"}
    entries = created["metadata"]["managedFields"]
    assert [(e["manager"], e["operation"]) for e in entries] == [("team-a", "Apply")]

    cm = client.apply_server_side(CONFIGMAPS, configmap("ssa", {"a": "1", "b": "2"}), field_manager="team-a")
    assert cm["data"] == {"a": "1", "b": "2"}

    with pytest.raises(ApiError) as err:
        client.apply_server_side(CONFIGMAPS, configmap("ssa", {"a": "9"}), field_manager="team-b")
    assert err.value.status == 409 and err.value.reason == "Conflict"
    assert 'conflict with "team-a"' in err.value.message
    body = _status_body(err.value, client)
    if body is not None:
        causes = body["details"]["causes"]
        assert [(c["reason"], c["field"]) for c in causes] == [("FieldManagerConflict", ".data.a")]

    forced = client.apply_server_side(CONFIGMAPS, configmap("ssa", {"a": "9"}), field_manager="team-b", force=True)
    assert forced["data"] == {"a": "9", "b": "2"}
    owners = {e["manager"]: e["fieldsV1"] for e in forced["metadata"]["managedFields"]}
    assert "f:a" in owners["team-b"]["f:data"] and "f:a" not in owners["team-a"]["f:data"]

    # team-a stops applying b: nobody else owns it, so it is removed.
    after = client.apply_server_side(CONFIGMAPS, configmap("ssa", {}), field_manager="team-a")
    assert after.get("data") == {"a": "9"}


# ------------------------------------------------------------------------------------------ 3.A tables


def test_custom_resource_printer_columns(client: Client, admin: Admin) -> None:
    """`kubectl get` of a custom resource prints its additionalPrinterColumns (Table)."""
    install_widgets(admin)
    admin.create(WIDGETS, widget("p1", 3, "blue"))
    admin.merge(WIDGETS, "p1", {"status": {"phase": "Ready"}}, sub="status")
    admin.create(WIDGETS, widget("p2", 7))
    headers, rows = client.table(WIDGETS)
    assert headers == ["NAME", "SIZE", "COLOR", "PHASE", "AGE"]
    assert [r[:4] for r in rows] == [["p1", "3", "blue", "Ready"], ["p2", "7", "red", ""]]
    assert all(r[4] for r in rows)  # an age such as "0s"


def test_kubectl_get_watch_prints_table_rows(apiserver: RunningServer, admin: Admin, tmp_path: Path) -> None:
    """kubectl only (the others do not print): `kubectl get -w` asks for Tables on the watch too."""
    install_widgets(admin)
    admin.create(WIDGETS, widget("t1", 1))
    kubectl = KubectlClient(apiserver.kubeconfig, tmp_path)
    w = kubectl.start_text_watch(WIDGETS)
    try:
        _, header = w.wait_for(lambda t, o: True)
        assert header["text"].split() == ["NAME", "SIZE", "COLOR", "PHASE", "AGE"]
        _, row = w.wait_for(lambda t, o: True)
        assert row["text"].split()[:3] == ["t1", "1", "red"]
        admin.merge(WIDGETS, "t1", {"status": {"phase": "Ready"}}, sub="status")
        _, row = w.wait_for(lambda t, o: "Ready" in o["text"])
        assert row["text"].split()[:4] == ["t1", "1", "red", "Ready"]
        admin.create(WIDGETS, widget("t2", 2, "green"))
        w.wait_for(lambda t, o: o["text"].split()[:3] == ["t2", "2", "green"])
    finally:
        w.stop()


# ------------------------------------------------------------------------------------------ 3.B reads


@pytest.mark.apiserver_options(root_ca_publisher=False)  # counts the ConfigMaps of a namespace
def test_list_pagination(client: Client, admin: Admin) -> None:
    """Paging with limit=2 over 5 objects: continue tokens, remainingItemCount, one snapshot."""
    ns = "paging"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, None)
    for i in range(5):
        admin.create(CONFIGMAPS, configmap(f"p{i}", ns=ns), ns)
    full = client.list_objects(CONFIGMAPS, ns)
    assert names(full["items"]) == [f"p{i}" for i in range(5)]

    first = client.list_objects(CONFIGMAPS, ns, limit=2)
    assert first["kind"] == "ConfigMapList" and names(first["items"]) == ["p0", "p1"]
    assert first["metadata"]["continue"] and first["metadata"]["remainingItemCount"] == 3
    snapshot_rv = first["metadata"]["resourceVersion"]

    admin.create(CONFIGMAPS, configmap("p2a", ns=ns), ns)  # after the snapshot: not in later pages
    admin.merge(CONFIGMAPS, "p3", {"data": {"late": "1"}}, ns)

    second = client.list_objects(CONFIGMAPS, ns, limit=2, continue_=first["metadata"]["continue"])
    assert names(second["items"]) == ["p2", "p3"]
    assert "data" not in second["items"][1]  # as of the snapshot
    assert second["metadata"]["resourceVersion"] == snapshot_rv
    assert second["metadata"]["remainingItemCount"] == 1

    last = client.list_objects(CONFIGMAPS, ns, limit=2, continue_=second["metadata"]["continue"])
    assert names(last["items"]) == ["p4"]
    assert not last["metadata"].get("continue") and "remainingItemCount" not in last["metadata"]
    assert last["metadata"]["resourceVersion"] == snapshot_rv


@pytest.mark.apiserver_options(root_ca_publisher=False)  # counts the ConfigMaps of a namespace
def test_label_and_field_selectors(client: Client, admin: Admin) -> None:
    """Equality and set-based label selectors, field selectors, 400 on bad selectors."""
    admin.create(CONFIGMAPS, configmap("s1", labels={"tier": "web", "team": "a"}))
    admin.create(CONFIGMAPS, configmap("s2", labels={"tier": "db", "team": "a"}))
    admin.create(CONFIGMAPS, configmap("s3", labels={"tier": "web", "team": "b", "gone": "x"}))
    admin.create(CONFIGMAPS, configmap("s4", {"k": "v"}))
    client.label(CONFIGMAPS, "s4", {"tier": "cache"})  # kubectl label
    patched = client.patch(CONFIGMAPS, "s4", {"metadata": {"labels": {"team": "c"}}}, patch_type="strategic")
    assert patched["metadata"]["labels"] == {"tier": "cache", "team": "c"} and patched["data"] == {"k": "v"}

    def sel(label: str = "", fields: str = "") -> list[str]:
        return sorted(names(client.list_objects(CONFIGMAPS, label_selector=label, field_selector=fields)["items"]))

    assert sel("team=a") == ["s1", "s2"]
    assert sel("tier in (web,db),!gone") == ["s1", "s2"]
    assert sel("tier!=web") == ["s2", "s4"]
    assert sel("team notin (a,b)") == ["s4"]
    assert sel("gone") == ["s3"]
    assert sel(fields="metadata.name=s3") == ["s3"]
    assert sel("team==a", "metadata.name!=s1") == ["s2"]
    assert sel(fields="metadata.namespace=default,metadata.name!=s4") == ["s1", "s2", "s3"]

    with pytest.raises(ApiError) as err:
        sel(fields="spec.foo=1")
    assert err.value.status == 400 and err.value.reason == "BadRequest"
    # ConfigMap has no field-label conversion of its own: the default conversion's text.
    assert '"spec.foo" is not a known field selector: only "metadata.name", "metadata.namespace"' in (
        err.value.message
    )
    _status_body(err.value, client)

    with pytest.raises(ApiError) as err:
        sel("tier in (web")
    assert err.value.status == 400 and err.value.reason == "BadRequest"


# ------------------------------------------------------------------------------------------ 3.C watch


def test_watch_sees_changes_made_by_another_client(client: Client, admin: Admin) -> None:
    """A running watch (kubectl: `get -w`) sees ADDED, MODIFIED and DELETED from elsewhere."""
    admin.create(CONFIGMAPS, configmap("w-a", {"v": "1"}))
    w = client.start_watch(CONFIGMAPS)
    try:
        _, first = w.wait_for(lambda t, o: t == "ADDED" and o["metadata"]["name"] == "w-a")
        assert first["data"] == {"v": "1"}
        admin.merge(CONFIGMAPS, "w-a", {"data": {"v": "2"}})
        _, mod = w.wait_for(lambda t, o: t == "MODIFIED")
        assert mod["data"] == {"v": "2"} and mod["kind"] == "ConfigMap" and mod["apiVersion"] == "v1"
        assert _rv(mod) > _rv(first)
        admin.create(CONFIGMAPS, configmap("w-b"))
        w.wait_for(lambda t, o: t == "ADDED" and o["metadata"]["name"] == "w-b")
        admin.delete(CONFIGMAPS, "w-a")
        _, gone = w.wait_for(lambda t, o: t == "DELETED")
        assert gone["metadata"]["name"] == "w-a" and _rv(gone) > _rv(mod)
    finally:
        w.stop()


def test_watch_resumes_from_resource_version(client: Client, admin: Admin) -> None:
    """Watching from N replays exactly the changes after N, in order, no synthetic ADDED."""
    admin.create(CONFIGMAPS, configmap("r-a", {"v": "1"}))
    start = admin.rv(CONFIGMAPS)
    admin.merge(CONFIGMAPS, "r-a", {"data": {"v": "2"}})
    admin.create(CONFIGMAPS, configmap("r-b"))
    admin.delete(CONFIGMAPS, "r-a")
    events = client.watch(CONFIGMAPS, resource_version=start, max_events=3)
    assert [(t, o["metadata"]["name"]) for t, o in events] == [
        ("MODIFIED", "r-a"),
        ("ADDED", "r-b"),
        ("DELETED", "r-a"),
    ]
    rvs = [_rv(o) for _, o in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3 and rvs[0] > int(start)


def test_selector_filtered_watch(client: Client, admin: Admin) -> None:
    """Starting to match a label-selected watch is ADDED, stopping to match is DELETED."""
    admin.create(CONFIGMAPS, configmap("l-a", labels={"team": "b"}))
    start = admin.rv(CONFIGMAPS)
    admin.create(CONFIGMAPS, configmap("l-b", labels={"team": "b"}))  # never matches
    admin.merge(CONFIGMAPS, "l-a", {"metadata": {"labels": {"team": "a"}}})
    admin.merge(CONFIGMAPS, "l-a", {"data": {"k": "v"}})
    admin.merge(CONFIGMAPS, "l-a", {"metadata": {"labels": {"team": "c"}}})
    events = client.watch(CONFIGMAPS, resource_version=start, max_events=3, label_selector="team=a")
    assert [(t, o["metadata"]["name"]) for t, o in events] == [
        ("ADDED", "l-a"),
        ("MODIFIED", "l-a"),
        ("DELETED", "l-a"),
    ]
    # The DELETED object is the last state, the one that no longer matches.
    assert events[2][1]["metadata"]["labels"] == {"team": "c"}


def test_watch_bookmarks(client: Client, admin: Admin) -> None:
    """allowWatchBookmarks brings BOOKMARKs that carry only kind, apiVersion and the RV."""
    admin.create(CONFIGMAPS, configmap("b-a"))
    start = admin.rv(CONFIGMAPS)
    events = client.watch(CONFIGMAPS, resource_version=start, max_events=1, bookmarks=True)
    assert events == [
        ("BOOKMARK", {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": start}})
    ]


@pytest.mark.apiserver_options(root_ca_publisher=False)  # counts the ConfigMaps of a namespace
def test_watch_too_old_gives_410_then_relist(
    client: Client, admin: Admin, apiserver: RunningServer
) -> None:
    """After compaction a watch from an old RV fails with 410 Expired; relist recovers."""
    admin.create(CONFIGMAPS, configmap("x-a", {"v": "1"}))
    old = admin.rv(CONFIGMAPS)
    admin.merge(CONFIGMAPS, "x-a", {"data": {"v": "2"}})
    apiserver.run(apiserver.server.compact)

    with pytest.raises(ApiError) as err:
        client.watch(CONFIGMAPS, resource_version=old, max_events=1)
    assert err.value.status == 410 and err.value.reason == "Expired"
    assert "too old resource version" in err.value.message

    # Relist as reflectors and `kubectl get` do (limit=500); kubectl only shows the list RV this way.
    fresh = client.list_objects(CONFIGMAPS, limit=500)
    assert names(fresh["items"]) == ["x-a"] and fresh["items"][0]["data"] == {"v": "2"}
    admin.create(CONFIGMAPS, configmap("x-b"))
    events = client.watch(CONFIGMAPS, resource_version=fresh["metadata"]["resourceVersion"], max_events=1)
    assert [(t, o["metadata"]["name"]) for t, o in events] == [("ADDED", "x-b")]


# ------------------------------------------------------------------------------------------ 3.D writes


def test_stale_update_conflicts(client: Client, admin: Admin) -> None:
    """409 Conflict on a stale PUT or RV-carrying patch; 409 AlreadyExists on create."""
    created = client.create(CONFIGMAPS, configmap("c", {"v": "1"}))
    assert created["metadata"]["uid"] and created["metadata"]["creationTimestamp"]
    stale = client.get(CONFIGMAPS, "c")
    admin.merge(CONFIGMAPS, "c", {"data": {"v": "2"}})

    stale["data"]["v"] = "3"
    with pytest.raises(ApiError) as err:
        client.replace(CONFIGMAPS, stale)
    assert err.value.status == 409 and err.value.reason == "Conflict"
    assert 'Operation cannot be fulfilled on configmaps "c": the object has been modified' in err.value.message
    body = _status_body(err.value, client)
    if body is not None:
        assert body["details"] == {"name": "c", "kind": "configmaps"}

    with pytest.raises(ApiError) as err:
        client.patch(
            CONFIGMAPS,
            "c",
            {"metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]}, "data": {"v": "4"}},
            patch_type="merge",
        )
    assert err.value.status == 409 and err.value.reason == "Conflict"

    current = client.get(CONFIGMAPS, "c")
    current["data"]["v"] = "5"
    updated = client.replace(CONFIGMAPS, current)
    assert updated["data"] == {"v": "5"} and _rv(updated) > _rv(current)

    with pytest.raises(ApiError) as err:
        client.create(CONFIGMAPS, configmap("c"))
    assert err.value.status == 409 and err.value.reason == "AlreadyExists"
    assert 'configmaps "c" already exists' in err.value.message


def test_status_subresource_split(client: Client, admin: Admin) -> None:
    """The main resource ignores status, /status ignores everything else; generation."""
    install_widgets(admin)
    body = widget("s", 1)
    body["status"] = {"phase": "FromCreate"}
    created = client.create(WIDGETS, body)
    assert "status" not in created and created["metadata"]["generation"] == 1

    created["spec"]["size"] = 2
    created["status"] = {"phase": "FromMain"}
    main = client.replace(WIDGETS, created)
    assert main["spec"]["size"] == 2 and "status" not in main and main["metadata"]["generation"] == 2

    st = client.patch(
        WIDGETS,
        "s",
        {"spec": {"size": 9}, "status": {"phase": "Ready"}, "metadata": {"labels": {"x": "y"}}},
        patch_type="merge",
        subresource="status",
    )
    assert st["status"] == {"phase": "Ready"} and st["spec"]["size"] == 2
    assert "labels" not in st["metadata"] and st["metadata"]["generation"] == 2

    current = client.get(WIDGETS, "s")
    current["status"]["phase"] = "Done"
    current["spec"]["size"] = 5
    done = client.replace(WIDGETS, current, subresource="status")
    assert done["status"] == {"phase": "Done"} and done["spec"]["size"] == 2
    assert done["metadata"]["generation"] == 2

    # Custom resources need a resourceVersion on update.
    del current["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as err:
        client.replace(WIDGETS, current)
    assert err.value.status == 422 and err.value.reason == "Invalid"
    assert "must be specified for an update" in err.value.message


# ------------------------------------------------------------------------------------------ 3.G eviction


def _ready_pod(admin: Admin, name: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "ev"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}]},
    }
    created = admin.create(PODS, pod)
    created["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    admin.put(PODS, created, sub="status")


def _pdb_status(admin: Admin) -> dict[str, Any]:
    pdb = admin.get(PDBS, "ev-pdb")
    assert pdb is not None
    st = dict(pdb.get("status") or {})
    st["generation"] = pdb["metadata"]["generation"]
    return st


def test_eviction_refused_by_pdb_then_allowed(client: Client, admin: Admin) -> None:
    """Eviction: 429 TooManyRequests with a DisruptionBudget cause; allowed eviction deletes gracefully."""
    _ready_pod(admin, "ev-1")
    admin.create(
        PDBS,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "ev-pdb"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "ev"}}},
        },
    )
    wait_until("disruption controller to observe the PDB",
               lambda: (st := _pdb_status(admin)).get("observedGeneration") == st["generation"]
               and st.get("currentHealthy") == 1)
    with pytest.raises(ApiError) as err:
        client.evict("ev-1")
    assert err.value.status == 429 and err.value.reason == "TooManyRequests"
    assert err.value.message.startswith("Cannot evict pod as it would violate the pod's disruption budget.")
    body = _status_body(err.value, client)
    if body is not None:
        assert body["details"]["causes"] == [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget ev-pdb needs 1 healthy pods and has 1 currently",
            }
        ]
    pod = admin.get(PODS, "ev-1")
    assert pod is not None and "deletionTimestamp" not in pod["metadata"]

    _ready_pod(admin, "ev-2")
    wait_until("disruptionsAllowed=1", lambda: _pdb_status(admin).get("disruptionsAllowed") == 1)
    client.evict("ev-1")
    pod = admin.get(PODS, "ev-1")
    # A bound, running pod is deleted gracefully: it stays until the kubelet confirms.
    assert pod is not None and pod["metadata"]["deletionTimestamp"]
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 30


# ------------------------------------------------------------------------------------------ 3.F deletion


def test_finalizer_flow(client: Client, admin: Admin) -> None:
    """Delete marks, the object stays until its last finalizer goes, then 404."""
    client.create(CONFIGMAPS, configmap("f", {"v": "1"}, finalizers=[FINALIZER]))
    client.delete(CONFIGMAPS, "f")
    marked = client.get(CONFIGMAPS, "f")
    assert marked["metadata"]["deletionTimestamp"] and marked["metadata"]["finalizers"] == [FINALIZER]
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 0

    with pytest.raises(ApiError) as err:
        client.patch(
            CONFIGMAPS, "f", {"metadata": {"finalizers": [FINALIZER, "example.com/late"]}}, patch_type="merge"
        )
    assert err.value.status == 422 and err.value.reason == "Invalid"

    client.patch(CONFIGMAPS, "f", [{"op": "remove", "path": "/metadata/finalizers"}], patch_type="json")
    assert admin.get(CONFIGMAPS, "f") is None
    with pytest.raises(ApiError) as err:
        client.get(CONFIGMAPS, "f")
    assert err.value.status == 404 and err.value.reason == "NotFound"
    assert err.value.message == 'configmaps "f" not found'
    body = _status_body(err.value, client)
    if body is not None:
        assert body["details"] == {"name": "f", "kind": "configmaps"}


def _owned(name: str, owner: dict[str, Any], block: bool = False) -> dict[str, Any]:
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}
    if block:
        ref["blockOwnerDeletion"] = True
    return configmap(name, ownerReferences=[ref])


def test_owner_reference_garbage_collection(client: Client, admin: Admin) -> None:
    """Owner references: Background deletes dependents, Orphan strips their ownerReferences, Foreground waits."""
    owner = admin.create(CONFIGMAPS, configmap("owner-bg"))
    client.create(CONFIGMAPS, _owned("dep-bg", owner))
    owner2 = admin.create(CONFIGMAPS, configmap("owner-orphan"))
    client.create(CONFIGMAPS, _owned("dep-orphan", owner2))
    owner3 = admin.create(CONFIGMAPS, configmap("owner-fg"))
    client.create(CONFIGMAPS, _owned("dep-fg", owner3, block=True))

    client.delete(CONFIGMAPS, "owner-bg")
    client.delete(CONFIGMAPS, "owner-orphan", propagation="Orphan")
    client.delete(CONFIGMAPS, "owner-fg", propagation="Foreground")

    wait_until("background GC of dep-bg", lambda: admin.get(CONFIGMAPS, "dep-bg") is None)
    wait_until("orphaning owner to go", lambda: admin.get(CONFIGMAPS, "owner-orphan") is None)
    dep = admin.get(CONFIGMAPS, "dep-orphan")
    assert dep is not None and not dep["metadata"].get("ownerReferences")
    wait_until("foreground deletion of owner-fg and dep-fg",
               lambda: admin.get(CONFIGMAPS, "owner-fg") is None and admin.get(CONFIGMAPS, "dep-fg") is None)


# ------------------------------------------------------------------------------------------ admission


class HookServer:
    """An HTTPS admission webhook: denies ConfigMaps labelled deny=true, labels the others."""

    def __init__(self) -> None:
        self.ca = trustme.CA()
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.reviews: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        req = review["request"]
        self.reviews.append(req)
        labels = (req.get("object") or {}).get("metadata", {}).get("labels") or {}
        resp: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        if request.path == "/validate" and labels.get("deny") == "true":
            resp = {
                "uid": req["uid"],
                "allowed": False,
                "status": {"code": 403, "reason": "Forbidden", "message": "deny=true is not allowed here"},
            }
        elif request.path == "/mutate":
            op: dict[str, Any]
            if labels:
                op = {"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}
            else:
                op = {"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}
            resp["patchType"] = "JSONPatch"
            resp["patch"] = base64.b64encode(json.dumps([op]).encode()).decode()
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/validate", self.handle)
        app.router.add_post("/mutate", self.handle)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("hooks.default.svc").configure_cert(ctx)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca.cert_pem.bytes()).decode()


def _webhook_config(res_kind: str, name: str, path: str, ca_bundle: str) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": name,
        "clientConfig": {"service": {"namespace": "default", "name": "hooks", "path": path}, "caBundle": ca_bundle},
        "rules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}
        ],
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": res_kind,
        "metadata": {"name": name},
        "webhooks": [hook],
    }


def test_admission_webhooks(client: Client, admin: Admin, apiserver: RunningServer) -> None:
    """A validating webhook's denial reaches the client; a mutating webhook's patch is stored."""
    hooks = HookServer()
    apiserver.call(hooks.start())
    try:
        admin.create(
            SERVICES,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "hooks", "annotations": {"sim.gpuops.io/endpoint": f"127.0.0.1:{hooks.port}"}},
                "spec": {"ports": [{"port": 443}]},
            },
        )
        bundle = hooks.ca_bundle
        client.create(
            MUTATING,
            _webhook_config("MutatingWebhookConfiguration", "label.conformance.gpuops.io", "/mutate", bundle),
            None,
        )
        client.create(
            VALIDATING,
            _webhook_config("ValidatingWebhookConfiguration", "deny.conformance.gpuops.io", "/validate", bundle),
            None,
        )
        plain = client.create(CONFIGMAPS, configmap("plain", {"k": "v"}))
        assert plain["metadata"]["labels"] == {"mutated": "yes"}
        stored = admin.get(CONFIGMAPS, "plain")
        assert stored is not None and stored["metadata"]["labels"] == {"mutated": "yes"}

        with pytest.raises(ApiError) as err:
            client.create(CONFIGMAPS, configmap("denied", labels={"deny": "true"}))
        assert err.value.status == 403 and err.value.reason == "Forbidden"
        assert (
            'admission webhook "deny.conformance.gpuops.io" denied the request: deny=true is not allowed here'
            in err.value.message
        )
        _status_body(err.value, client)
        assert admin.get(CONFIGMAPS, "denied") is None
        ops = {(r["operation"], r["name"]) for r in hooks.reviews}
        assert ("CREATE", "plain") in ops and ("CREATE", "denied") in ops
    finally:
        apiserver.call(hooks.stop())


# ------------------------------------------------------------------------------------------ RBAC


@pytest.mark.apiserver_options(root_ca_publisher=False)  # counts the ConfigMaps of a namespace
def test_rbac_allow_and_deny(rbac_apiserver: RunningServer, client_kind: str, tmp_path: Path) -> None:
    """RBAC: a ServiceAccount bound to a read-only Role can list ConfigMaps and nothing more (403)."""
    admin = Admin(rbac_apiserver.url, rbac_apiserver.token)
    admin.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}})
    admin.create(
        ROLES,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "cm-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
        },
    )
    admin.create(
        ROLEBINDINGS,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "cm-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}],
        },
    )
    admin.create(CONFIGMAPS, configmap("visible", {"k": "v"}))
    token = rbac_apiserver.server.service_account_token("default", "reader")
    # Over TLS, because kubectl sends no bearer token to an http:// server (see TLSFrontend).
    tls = TLSFrontend(rbac_apiserver.url)
    rbac_apiserver.call(tls.start())
    kubeconfig = tmp_path / "sa-kubeconfig"
    kubeconfig.write_text(tls.kubeconfig(token))
    client = connect(client_kind, kubeconfig, tmp_path / "client")
    try:
        assert names(client.list_objects(CONFIGMAPS)["items"]) == ["visible"]
        assert client.get(CONFIGMAPS, "visible")["data"] == {"k": "v"}
        assert client.can_i("list", CONFIGMAPS) and not client.can_i("delete", CONFIGMAPS)

        with pytest.raises(ApiError) as err:
            client.create(CONFIGMAPS, configmap("nope"))
        assert err.value.status == 403 and err.value.reason == "Forbidden"
        assert (
            'configmaps is forbidden: User "system:serviceaccount:default:reader" cannot create resource '
            '"configmaps" in API group "" in the namespace "default"'
        ) in err.value.message
        body = _status_body(err.value, client)
        if body is not None:
            assert body["details"] == {"kind": "configmaps"}

        with pytest.raises(ApiError) as err:
            client.list_objects(PODS)
        assert err.value.status == 403 and err.value.reason == "Forbidden"
        assert 'cannot list resource "pods"' in err.value.message
    finally:
        client.close()
        rbac_apiserver.call(tls.stop())


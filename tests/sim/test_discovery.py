"""Discovery documents (/version, /api, /apis, legacy and aggregated) and content negotiation (Table, 406)."""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops_sim.apiserver import discovery
from gpuops_sim.apiserver.discovery import (
    AGGREGATED_V2,
    AGGREGATED_V2BETA1,
    aggregated_discovery,
    api_group_list,
    api_resource_list,
    api_versions,
    negotiate_discovery,
    negotiate_object,
    version_info,
)
from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.resources import ResourceInfo, builtin_resources

KUBECTL_DISCOVERY_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
)
KUBECTL_TABLE_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)


def gwb(version: str = "v1alpha1") -> ResourceInfo:
    return ResourceInfo(
        group="gpuops.io",
        version=version,
        resource="gpuworkloadbudgets",
        kind="GPUWorkloadBudget",
        singular="gpuworkloadbudget",
        namespaced=True,
        short_names=("gwb",),
        categories=("all",),
        subresources={"status": ("GPUWorkloadBudget", ("get", "patch", "update"))},
        crd_name="gpuworkloadbudgets.gpuops.io",
    )


def infos() -> list[ResourceInfo]:
    return [*builtin_resources(), gwb()]


class _GroupVersionKind:
    """kubernetes < 37 names a model it does not ship (IoK8sApimachineryPkgApisMetaV1GroupVersionKind) as the type
    of aggregated discovery's responseKind; this stand-in, with the three required string fields, lets the rest
    of the document still be checked against the client's models."""

    openapi_types = {"group": "str", "version": "str", "kind": "str"}
    attribute_map = {"group": "group", "version": "version", "kind": "kind"}

    def __init__(self, group: str, version: str, kind: str, local_vars_configuration: Any = None) -> None:
        self.group, self.version, self.kind = group, version, kind


_GVK_MODEL = "IoK8sApimachineryPkgApisMetaV1GroupVersionKind"
if not hasattr(kubernetes.client.models, _GVK_MODEL):
    setattr(kubernetes.client.models, _GVK_MODEL, _GroupVersionKind)


def deserialize(data: Any, klass: str) -> Any:
    """Decode with the official client's models, which reject missing required fields."""
    client = kubernetes.client.ApiClient()
    return client._ApiClient__deserialize(data, klass)  # type: ignore[attr-defined]


def test_version() -> None:
    v = version_info()
    assert (v["major"], v["minor"]) == ("1", "37")
    assert v["gitVersion"].startswith("v1.37.0")
    for key in ("platform", "goVersion", "buildDate", "compiler", "gitCommit", "gitTreeState"):
        assert isinstance(v[key], str) and v[key]
    assert deserialize(v, "VersionInfo").git_version == v["gitVersion"]


def test_api_versions_and_group_list() -> None:
    api = api_versions()
    assert api == {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    assert api_versions("10.0.0.1:6443")["serverAddressByClientCIDRs"] == [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": "10.0.0.1:6443"}
    ]
    deserialize(api, "V1APIVersions")
    groups = api_group_list(infos())
    assert groups["kind"] == "APIGroupList"
    names = [g["name"] for g in groups["groups"]]
    assert "" not in names and len(names) == len(set(names))
    assert {"apps", "policy", "gpuops.io", "apiextensions.k8s.io"} <= set(names)
    apps = next(g for g in groups["groups"] if g["name"] == "apps")
    assert apps["preferredVersion"] == {"groupVersion": "apps/v1", "version": "v1"}
    deserialize(groups, "V1APIGroupList")


def test_preferred_version_follows_kube_priority() -> None:
    many = [gwb("v1alpha1"), gwb("v1beta2"), gwb("v1"), gwb("v2beta1"), gwb("v1beta1")]
    group = api_group_list(many)["groups"][0]
    assert [v["version"] for v in group["versions"]] == ["v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1"]
    assert group["preferredVersion"]["version"] == "v1"
    agg = aggregated_discovery(many, core=False, version="v2")
    assert [v["version"] for v in agg["items"][0]["versions"]] == [
        "v1",
        "v2beta1",
        "v1beta2",
        "v1beta1",
        "v1alpha1",
    ]


def test_core_resource_list_has_subresources_with_kinds() -> None:
    doc = api_resource_list(infos(), "v1")
    assert doc is not None
    assert doc["kind"] == "APIResourceList" and doc["groupVersion"] == "v1"
    by_name = {r["name"]: r for r in doc["resources"]}
    pods = by_name["pods"]
    assert pods["singularName"] == "pod" and pods["namespaced"] is True and pods["kind"] == "Pod"
    assert pods["shortNames"] == ["po"] and pods["categories"] == ["all"]
    assert pods["verbs"] == sorted(pods["verbs"]) and "watch" in pods["verbs"]
    assert by_name["pods/status"] == {
        "name": "pods/status",
        "singularName": "",
        "namespaced": True,
        "kind": "Pod",
        "verbs": ["get", "patch", "update"],
    }
    eviction = by_name["pods/eviction"]
    assert (eviction["group"], eviction["version"], eviction["kind"]) == ("policy", "v1", "Eviction")
    assert eviction["verbs"] == ["create"]
    assert by_name["pods/binding"]["kind"] == "Binding" and "group" not in by_name["pods/binding"]
    assert by_name["namespaces"]["namespaced"] is False
    # A subresource follows its parent in the listing.
    names = [r["name"] for r in doc["resources"]]
    subs = ["pods/attach", "pods/binding", "pods/eviction", "pods/exec", "pods/log", "pods/portforward", "pods/proxy",
            "pods/status"]
    assert names[names.index("pods") + 1:names.index("pods") + 9] == subs
    deserialize(doc, "V1APIResourceList")


def test_group_resource_lists() -> None:
    doc = api_resource_list(infos(), "gpuops.io/v1alpha1")
    assert doc is not None
    cr = doc["resources"][0]
    assert cr["shortNames"] == ["gwb"] and cr["categories"] == ["all"]
    reviews = api_resource_list(infos(), "authentication.k8s.io/v1")
    assert reviews is not None
    assert reviews["resources"][0]["verbs"] == ["create"]
    assert api_resource_list(infos(), "nope.io/v1") is None
    assert api_resource_list(infos(), "v2") is None


@pytest.mark.parametrize("version", ["v2", "v2beta1"])
def test_aggregated_core(version: str) -> None:
    doc = aggregated_discovery(infos(), core=True, version=version)
    assert doc["kind"] == "APIGroupDiscoveryList"
    assert doc["apiVersion"] == f"apidiscovery.k8s.io/{version}"
    assert len(doc["items"]) == 1
    core = doc["items"][0]
    assert core["metadata"].get("name", "") == ""
    (v1,) = core["versions"]
    assert v1["version"] == "v1" and v1["freshness"] == "Current"
    pods = next(r for r in v1["resources"] if r["resource"] == "pods")
    assert pods["responseKind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert pods["scope"] == "Namespaced" and pods["singularResource"] == "pod"
    assert pods["shortNames"] == ["po"] and pods["categories"] == ["all"]
    subs = {s["subresource"]: s for s in pods["subresources"]}
    assert subs["eviction"]["responseKind"] == {"group": "policy", "version": "v1", "kind": "Eviction"}
    assert subs["status"]["verbs"] == ["get", "patch", "update"]
    nodes = next(r for r in v1["resources"] if r["resource"] == "nodes")
    assert nodes["scope"] == "Cluster"
    configmaps = next(r for r in v1["resources"] if r["resource"] == "configmaps")
    assert "subresources" not in configmaps and "categories" not in configmaps
    deserialize(doc, "V2APIGroupDiscoveryList" if version == "v2" else "V2beta1APIGroupDiscoveryList")


def test_aggregated_groups() -> None:
    doc = aggregated_discovery(infos(), core=False, version="v2")
    names = [item["metadata"]["name"] for item in doc["items"]]
    assert "" not in names and "gpuops.io" in names and "apps" in names
    cr = next(item for item in doc["items"] if item["metadata"]["name"] == "gpuops.io")
    res = cr["versions"][0]["resources"][0]
    assert res["shortNames"] == ["gwb"]
    assert res["responseKind"] == {"group": "gpuops.io", "version": "v1alpha1", "kind": "GPUWorkloadBudget"}
    deserialize(doc, "V2APIGroupDiscoveryList")
    with pytest.raises(ValueError):
        aggregated_discovery(infos(), core=False, version="v3")


def test_negotiate_discovery_content_types() -> None:
    assert negotiate_discovery(KUBECTL_DISCOVERY_ACCEPT) == ("v2", AGGREGATED_V2)
    assert AGGREGATED_V2 == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    assert AGGREGATED_V2BETA1 == "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
    beta_first = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
    assert negotiate_discovery(beta_first) == ("v2beta1", AGGREGATED_V2BETA1)
    # q-values outrank order.
    q = (
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;q=0.5,"
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList;q=0.9"
    )
    assert negotiate_discovery(q)[0] == "v2beta1"
    assert negotiate_discovery("application/json;q=0.9, " + AGGREGATED_V2 + ";q=0.1")[0] == "legacy"
    for legacy in (None, "", "application/json", "*/*", "application/*", "application/json, */*"):
        assert negotiate_discovery(legacy) == ("legacy", "application/json")
    # Unknown discovery versions are skipped, not guessed.
    assert negotiate_discovery("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList,*/*")[
        0
    ] == ("legacy")


@pytest.mark.parametrize(
    "accept", ["application/vnd.kubernetes.protobuf", "text/html", "application/json;q=0"]
)
def test_discovery_not_acceptable(accept: str) -> None:
    with pytest.raises(StatusError) as err:
        negotiate_discovery(accept)
    assert err.value.code == 406 and err.value.reason == "NotAcceptable"


def test_negotiate_object() -> None:
    assert negotiate_object(KUBECTL_TABLE_ACCEPT) == "table-v1"
    assert (
        negotiate_object("application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")
        == "table-v1beta1"
    )
    assert (
        negotiate_object(
            "application/json;as=Table;v=v1;g=meta.k8s.io;q=0.5,application/json;as=Table;v=v1beta1;"
            "g=meta.k8s.io"
        )
        == "table-v1beta1"
    )
    for accept in (
        None,
        "",
        "*/*",
        "application/*",
        "application/json",
        "application/json;charset=utf-8",
        "application/json;stream=watch",
        "application/json, */*",
        "application/vnd.kubernetes.protobuf, application/json",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
        "application/json;as=Table;v=v2;g=meta.k8s.io,application/json",
    ):
        assert negotiate_object(accept) == "json", accept


@pytest.mark.parametrize(
    "accept",
    [
        "application/vnd.kubernetes.protobuf",
        "text/html",
        "application/yaml;q=1,application/json;q=0",
        "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    ],
)
def test_object_not_acceptable(accept: str) -> None:
    with pytest.raises(StatusError) as err:
        negotiate_object(accept)
    status = err.value.to_status()
    assert status["code"] == 406 and status["reason"] == "NotAcceptable"
    assert status["message"] == "only the following media types are accepted: application/json"


_RANGES = {
    "application/json": "json",
    "*/*": "json",
    "application/json;as=Table;v=v1;g=meta.k8s.io": "table-v1",
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io": "table-v1beta1",
    "application/vnd.kubernetes.protobuf": None,
    "text/html": None,
}


@given(st.lists(st.tuples(st.sampled_from(sorted(_RANGES)), st.sampled_from([None, 0.0, 0.3, 0.7, 1.0]))))
def test_negotiation_honours_order_and_q(entries: list[tuple[str, float | None]]) -> None:
    """The highest-q acceptable entry wins; ties go to the one the client listed first."""
    accept = ",".join(m if q is None else f"{m};q={q}" for m, q in entries)
    ranked = sorted(
        ((1.0 if q is None else q, i, _RANGES[m]) for i, (m, q) in enumerate(entries)),
        key=lambda t: (-t[0], t[1]),
    )
    expected = next((r for q, _, r in ranked if q > 0 and r is not None), None)
    if not entries:
        expected = "json"
    if expected is None:
        with pytest.raises(StatusError):
            negotiate_object(accept)
    else:
        assert negotiate_object(accept) == expected


def test_inputs_not_mutated() -> None:
    served = infos()
    before = [repr(i) for i in served]
    api_group_list(served)
    aggregated_discovery(served, core=False, version="v2")
    api_resource_list(served, "v1")
    assert [repr(i) for i in served] == before
    assert discovery.version_priority("v10") < discovery.version_priority("v2")

"""OpenAPI v3 publishing and built-in schemas: the index, per-group-version documents, what kubectl reads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from gpuops_sim.apiserver.builtin_schemas import builtin_schema, kind_schema, meta_schema, model_name
from gpuops_sim.apiserver.discovery import subresource_kind
from gpuops_sim.apiserver.openapi import (
    group_version_hash,
    openapi_v3_group_version,
    openapi_v3_index,
    schema_name,
)
from gpuops_sim.apiserver.resources import STREAMING_SUBRESOURCES, ResourceInfo, builtin_resources

GWB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "properties": {"gpuHours": {"type": "integer", "minimum": 0}, "team": {"type": "string"}},
        },
        "status": {"type": "object", "properties": {"used": {"type": "number"}}},
    },
}


def gwb(schema: dict[str, Any] | None = None) -> ResourceInfo:
    return ResourceInfo(
        group="gpuops.io",
        version="v1alpha1",
        resource="gpuworkloadbudgets",
        kind="GPUWorkloadBudget",
        singular="gpuworkloadbudget",
        namespaced=True,
        short_names=("gwb",),
        subresources={"status": ("GPUWorkloadBudget", ("get", "patch", "update"))},
        status_subresource=True,
        schema=msgspec.json.decode(msgspec.json.encode(GWB_SCHEMA if schema is None else schema)),
        crd_name="gpuworkloadbudgets.gpuops.io",
    )


def infos() -> list[ResourceInfo]:
    return [*builtin_resources(), gwb()]


def gvk(group: str, version: str, kind: str) -> dict[str, str]:
    return {"group": group, "version": version, "kind": kind}


def patch_ops(doc: dict[str, Any], want: dict[str, str]) -> list[dict[str, Any]]:
    return [
        item["patch"]
        for item in doc["paths"].values()
        if "patch" in item and item["patch"]["x-kubernetes-group-version-kind"] == want
    ]


def kubectl_supports_field_validation(doc: dict[str, Any], want: dict[str, str]) -> bool:
    """kubectl's query_param_verifier_v3: the first PATCH op of the GVK decides; Go maps have no order, so all
    of them must agree."""
    ops = patch_ops(doc, want)
    return bool(ops) and all(any(p["name"] == "fieldValidation" for p in op["parameters"]) for op in ops)


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def component_for(doc: dict[str, Any], want: dict[str, str]) -> dict[str, Any]:
    matches = [
        s
        for s in doc["components"]["schemas"].values()
        if want in s.get("x-kubernetes-group-version-kind", [])
    ]
    assert len(matches) == 1, want
    found: dict[str, Any] = matches[0]
    return found


# ------------------------------------------------------------------------------------------- builtin schemas


def test_every_builtin_kind_has_a_model_schema() -> None:
    for info in builtin_resources():
        schema = builtin_schema(info)
        assert schema is not None, info.kind
        assert schema["type"] == "object"
        assert {"apiVersion", "kind", "metadata"} <= set(schema["properties"]), info.kind
        for sub, (sub_kind, _) in info.subresources.items():
            if sub in STREAMING_SUBRESOURCES:
                continue  # connect operations (exec, proxy...) take query options, not a body
            group, version, _ = subresource_kind(info, sub_kind)  # eviction: policy/v1, token: authentication
            assert kind_schema(group, version, sub_kind) is not None, sub_kind
    assert model_name("", "v1", "Event") == "CoreV1Event"
    assert model_name("events.k8s.io", "v1", "Event") == "EventsV1Event"
    assert model_name("", "v1", "Pod") == "V1Pod"
    assert model_name("gpuops.io", "v1alpha1", "GPUWorkloadBudget") is None
    assert builtin_schema(gwb()) is None


def test_schema_types_and_json_names() -> None:
    pod = builtin_schema(builtin_resources()[1])
    assert pod is not None
    meta = pod["properties"]["metadata"]["properties"]
    assert meta["creationTimestamp"] == {"type": "string", "format": "date-time"}
    assert meta["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert meta["generation"] == {"type": "integer", "format": "int64"}
    spec = pod["properties"]["spec"]["properties"]
    container = spec["containers"]["items"]
    assert spec["containers"]["type"] == "array" and container["type"] == "object"
    assert container["properties"]["imagePullPolicy"] == {"type": "string"}
    assert spec["hostNetwork"] == {"type": "boolean"}
    # Quantities accept the numbers YAML produces (nvidia.com/gpu: 1, cpu: 0.5).
    limits = container["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
    assert {"type": "number"} in limits["oneOf"] and limits["x-kubernetes-preserve-unknown-fields"] is True
    probe_port = container["properties"]["livenessProbe"]["properties"]["httpGet"]["properties"]["port"]
    assert probe_port["x-kubernetes-int-or-string"] is True
    # Event uses the core model, not events.k8s.io's.
    event = kind_schema("", "v1", "Event")
    assert event is not None and "involvedObject" in event["properties"]
    secret = kind_schema("", "v1", "Secret")
    assert secret is not None and secret["properties"]["data"]["additionalProperties"]["format"] == "byte"
    fields_v1 = meta["managedFields"]["items"]["properties"]["fieldsV1"]
    assert fields_v1 == {"x-kubernetes-preserve-unknown-fields": True}


@pytest.mark.parametrize(
    ("group", "kind", "path"),
    [
        ("", "Service", ("spec", "ports", "targetPort")),
        ("policy", "PodDisruptionBudget", ("spec", "minAvailable")),
        ("policy", "PodDisruptionBudget", ("spec", "maxUnavailable")),
        ("apps", "Deployment", ("spec", "strategy", "rollingUpdate", "maxSurge")),
        ("apps", "DaemonSet", ("spec", "updateStrategy", "rollingUpdate", "maxUnavailable")),
    ],
)
def test_int_or_string_fields(group: str, kind: str, path: tuple[str, ...]) -> None:
    node = kind_schema(group, "v1", kind)
    for name in path:
        assert node is not None
        if node.get("type") == "array":
            node = node["items"]
        node = node["properties"][name]
    assert node is not None and node["x-kubernetes-int-or-string"] is True


def test_jsonschemaprops_recursion_is_cut() -> None:
    crd = kind_schema("apiextensions.k8s.io", "v1", "CustomResourceDefinition")
    assert crd is not None
    versions = crd["properties"]["spec"]["properties"]["versions"]["items"]
    root = versions["properties"]["schema"]["properties"]["openAPIV3Schema"]
    assert root["properties"]["type"] == {"type": "string"}
    assert root["properties"]["$ref"] == {"type": "string"}
    assert root["properties"]["x-kubernetes-preserve-unknown-fields"] == {"type": "boolean"}
    assert root["properties"]["properties"]["additionalProperties"] == {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    assert root["properties"]["default"] == {"x-kubernetes-preserve-unknown-fields": True}


def test_patch_metadata_from_list_strategy() -> None:
    calls: list[tuple[str, str, tuple[str, ...]]] = []

    def fake(group: str, kind: str, path: tuple[str, ...]) -> tuple[str | None, str | None]:
        calls.append((group, kind, path))
        if path[-1] in ("containers", "env"):
            return "merge", "name"
        if path == ("metadata", "finalizers"):
            return "merge", None
        return None, None

    deploy = kind_schema("apps", "v1", "Deployment", list_strategy=fake)
    assert deploy is not None
    containers = deploy["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"][
        "containers"
    ]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    assert containers["x-kubernetes-patch-strategy"] == "merge"
    assert containers["items"]["properties"]["env"]["x-kubernetes-patch-merge-key"] == "name"
    finalizers = deploy["properties"]["metadata"]["properties"]["finalizers"]
    assert (
        finalizers["x-kubernetes-patch-strategy"] == "merge"
        and "x-kubernetes-patch-merge-key" not in finalizers
    )
    volumes = deploy["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"][
        "volumes"
    ]
    assert "x-kubernetes-patch-strategy" not in volumes
    assert ("apps", "Deployment", ("spec", "template", "spec", "containers", "env")) in calls
    # Only lists are asked about, with list items skipped in the path.
    assert all(kind == "Deployment" for _, kind, path in calls)
    assert ("apps", "Deployment", ("spec", "replicas")) not in calls
    assert ("apps", "Deployment", ("spec", "template", "spec", "volumes", "configMap", "items")) in calls
    pod = builtin_schema(builtin_resources()[1], list_strategy=fake)
    assert pod is not None
    assert pod["properties"]["spec"]["properties"]["containers"]["x-kubernetes-patch-merge-key"] == "name"


def test_schema_is_cached_and_fast() -> None:
    kind_schema("", "v1", "Pod")
    start = time.perf_counter()
    for _ in range(1000):
        for info in builtin_resources():
            builtin_schema(info)
    assert time.perf_counter() - start < 1.0
    assert kind_schema("", "v1", "Pod") is kind_schema("", "v1", "Pod")
    assert meta_schema("ObjectMeta")["properties"]["name"] == {"type": "string"}


# ------------------------------------------------------------------------------------------------ OpenAPI v3


def test_index_points_at_each_group_version() -> None:
    served = infos()
    index = openapi_v3_index(served)
    assert set(index) == {"paths"}
    paths = index["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/policy/v1", "apis/gpuops.io/v1alpha1"} <= set(paths)
    for key, entry in paths.items():
        url = entry["serverRelativeURL"]
        assert url.startswith(f"/openapi/v3/{key}?hash=")
        doc = openapi_v3_group_version(served, key.removeprefix("api/").removeprefix("apis/"))
        assert doc is not None
        assert url.endswith("?hash=" + group_version_hash(doc))
    assert openapi_v3_group_version(served, "nope.io/v1") is None


def test_hash_is_stable_and_tracks_crd_changes() -> None:
    first = openapi_v3_index(infos())["paths"]
    again = openapi_v3_index(infos())["paths"]
    assert first == again
    changed_schema = msgspec.json.decode(msgspec.json.encode(GWB_SCHEMA))
    changed_schema["properties"]["spec"]["properties"]["extra"] = {"type": "string"}
    changed = openapi_v3_index([*builtin_resources(), gwb(changed_schema)])["paths"]
    assert changed["apis/gpuops.io/v1alpha1"] != first["apis/gpuops.io/v1alpha1"]
    assert changed["api/v1"] == first["api/v1"]


def test_document_shape() -> None:
    doc = openapi_v3_group_version(infos(), "v1")
    assert doc is not None
    assert doc["openapi"] == "3.0.0"
    assert doc["info"]["title"] == "Kubernetes"
    item = doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]
    assert set(item) == {"get", "put", "patch", "delete", "parameters"}
    collection = doc["paths"]["/api/v1/namespaces/{namespace}/configmaps"]
    assert {collection[m]["x-kubernetes-action"] for m in ("get", "post", "delete")} == {
        "list",
        "post",
        "deletecollection",
    }
    assert collection["post"]["operationId"] == "createCoreV1NamespacedConfigMap"
    assert doc["paths"]["/api/v1/configmaps"]["get"]["operationId"] == "listCoreV1ConfigMapForAllNamespaces"
    assert "/api/v1/namespaces/{name}" in doc["paths"]
    assert "/api/v1/nodes/{name}/status" in doc["paths"]
    for path_item in doc["paths"].values():
        for method, op in path_item.items():
            if method == "parameters":
                continue
            assert op["x-kubernetes-action"] and op["x-kubernetes-group-version-kind"]["version"]
            names = {p["name"] for p in op.get("parameters", [])}
            if method in ("post", "put", "patch"):
                assert {"dryRun", "fieldManager", "fieldValidation"} <= names
            if method == "patch":
                assert "force" in names
    schemas = doc["components"]["schemas"]
    for ref in refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.split("/")[-1] in schemas, ref
    assert schema_name("", "v1", "Pod", custom=False) in schemas
    assert schemas["io.k8s.api.core.v1.Pod"]["x-kubernetes-group-version-kind"] == [gvk("", "v1", "Pod")]
    assert schemas["io.k8s.api.core.v1.PodList"]["properties"]["items"]["items"] == {
        "$ref": "#/components/schemas/io.k8s.api.core.v1.Pod"
    }
    for meta in ("Status", "DeleteOptions", "ListMeta", "Patch"):
        assert f"io.k8s.apimachinery.pkg.apis.meta.v1.{meta}" in schemas


def test_every_kind_passes_kubectl_field_validation_check() -> None:
    served = infos()
    for info in served:
        doc = openapi_v3_group_version(served, info.group_version)
        assert doc is not None
        want = gvk(info.group, info.version, info.kind)
        if "patch" in info.verbs:
            assert kubectl_supports_field_validation(doc, want), info.kind
            component_for(doc, want)


def test_patch_content_types() -> None:
    served = infos()
    core = openapi_v3_group_version(served, "v1")
    cr = openapi_v3_group_version(served, "gpuops.io/v1alpha1")
    assert core is not None and cr is not None
    for op in patch_ops(core, gvk("", "v1", "ConfigMap")):
        assert set(op["requestBody"]["content"]) == {
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
        }
    cr_ops = patch_ops(cr, gvk("gpuops.io", "v1alpha1", "GPUWorkloadBudget"))
    assert len(cr_ops) == 2  # the object and its status
    for op in cr_ops:
        assert "application/strategic-merge-patch+json" not in op["requestBody"]["content"]
        assert "application/merge-patch+json" in op["requestBody"]["content"]


def test_subresource_operations() -> None:
    doc = openapi_v3_group_version(infos(), "v1")
    assert doc is not None
    eviction = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}/eviction"]
    assert set(eviction) == {"post", "parameters"}
    assert eviction["post"]["x-kubernetes-group-version-kind"] == gvk("policy", "v1", "Eviction")
    assert eviction["post"]["operationId"] == "createCoreV1NamespacedPodEviction"
    assert "io.k8s.api.policy.v1.Eviction" in doc["components"]["schemas"]
    status = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}/status"]
    assert set(status) == {"get", "put", "patch", "parameters"}
    assert status["patch"]["x-kubernetes-group-version-kind"] == gvk("", "v1", "Pod")
    reviews = openapi_v3_group_version(infos(), "authentication.k8s.io/v1")
    assert reviews is not None
    assert list(reviews["paths"]) == ["/apis/authentication.k8s.io/v1/tokenreviews"]
    assert set(reviews["paths"]["/apis/authentication.k8s.io/v1/tokenreviews"]) == {"post", "parameters"}


def test_custom_resource_component() -> None:
    info = gwb()
    before = msgspec.json.encode(info.schema)
    doc = openapi_v3_group_version([*builtin_resources(), info], "gpuops.io/v1alpha1")
    assert doc is not None
    assert msgspec.json.encode(info.schema) == before  # the CRD's schema is not touched
    schemas = doc["components"]["schemas"]
    name = "io.gpuops.v1alpha1.GPUWorkloadBudget"
    assert schema_name("gpuops.io", "v1alpha1", "GPUWorkloadBudget", custom=True) == name
    cr = schemas[name]
    assert cr["x-kubernetes-group-version-kind"] == [gvk("gpuops.io", "v1alpha1", "GPUWorkloadBudget")]
    assert cr["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]
    assert cr["properties"]["spec"]["properties"]["gpuHours"] == {"type": "integer", "minimum": 0}
    assert (
        schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]["labels"]["type"] == "object"
    )
    assert "io.gpuops.v1alpha1.GPUWorkloadBudgetList" in schemas
    ops = doc["paths"]["/apis/gpuops.io/v1alpha1/namespaces/{namespace}/gpuworkloadbudgets/{name}"]
    assert ops["patch"]["operationId"] == "patchGpuopsIoV1alpha1NamespacedGPUWorkloadBudget"
    assert ops["get"]["tags"] == ["gpuopsIo_v1alpha1"]
    # A CRD without a schema still publishes a usable component.
    bare = openapi_v3_group_version([gwb({})], "gpuops.io/v1alpha1")
    assert bare is not None
    loose = bare["components"]["schemas"][name]
    assert loose["x-kubernetes-preserve-unknown-fields"] is True and "metadata" in loose["properties"]


def test_component_names_follow_upstream() -> None:
    assert schema_name("apps", "v1", "Deployment", custom=False) == "io.k8s.api.apps.v1.Deployment"
    assert schema_name("rbac.authorization.k8s.io", "v1", "Role", custom=False) == "io.k8s.api.rbac.v1.Role"
    assert (
        schema_name("apiextensions.k8s.io", "v1", "CustomResourceDefinition", custom=False)
        == "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"
    )
    assert schema_name("example.com", "v1", "Foo", custom=True) == "com.example.v1.Foo"


def test_documents_are_fresh_copies() -> None:
    served = infos()
    doc = openapi_v3_group_version(served, "v1")
    assert doc is not None
    doc["paths"].clear()
    again = openapi_v3_group_version(served, "v1")
    assert again is not None and again["paths"]
    pod = kind_schema("", "v1", "Pod")
    assert pod is not None and "x-kubernetes-group-version-kind" not in pod

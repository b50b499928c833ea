"""OpenAPI v3 publishing: the `/openapi/v3` index and one document per group-version.

kubectl's default `--validate=strict` decides from these documents whether the server validates fields
itself: it needs, for the object's group/version/kind, a PATCH operation carrying
`x-kubernetes-group-version-kind` and a `fieldValidation` query parameter. Without that it falls back to
`/openapi/v2`, which we do not serve, and refuses to apply. kubectl apply also reads the kind's component
schema (matched by `x-kubernetes-group-version-kind`) for strategic-merge-patch metadata, and `kubectl
explain` walks it. The layout (paths, operation ids, component names) follows upstream so tools that
key on it keep working.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from gpuops_sim.apiserver.builtin_schemas import kind_schema, meta_schema
from gpuops_sim.apiserver.discovery import SERVER_VERSION, served_groups, subresource_kind
from gpuops_sim.apiserver.resources import ResourceInfo

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
OBJECT_META = f"{META}.ObjectMeta"
LIST_META = f"{META}.ListMeta"
STATUS = f"{META}.Status"
DELETE_OPTIONS = f"{META}.DeleteOptions"
PATCH = f"{META}.Patch"

_SPECIAL_PACKAGES = {
    "": "io.k8s.api.core",
    "apiextensions.k8s.io": "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions",
    "apiregistration.k8s.io": "io.k8s.kube-aggregator.pkg.apis.apiregistration",
}
_PATCH_TYPES_CUSTOM = (
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
)
_PATCH_TYPES_BUILTIN = (*_PATCH_TYPES_CUSTOM, "application/strategic-merge-patch+json")
_SUBRESOURCE_OPS = {
    "get": ("get", "read"),
    "update": ("put", "replace"),
    "patch": ("patch", "patch"),
    "create": ("post", "create"),
}


def schema_name(group: str, version: str, kind: str, *, custom: bool) -> str:
    """Component name as upstream publishes it: `io.k8s.api.core.v1.Pod`, CRDs `io.gpuops.v1alpha1.Kind`."""
    if custom:
        package = ".".join(reversed(group.split(".")))
    elif group in _SPECIAL_PACKAGES:
        package = _SPECIAL_PACKAGES[group]
    else:
        package = "io.k8s.api." + group.split(".")[0]
    return f"{package}.{version}.{kind}"


def group_version_hash(doc: dict[str, Any]) -> str:
    """Stable content hash (upstream uses SHA-512 in upper-case hex) for the `?hash=` of the index."""
    return hashlib.sha512(msgspec.json.encode(doc, order="sorted")).hexdigest().upper()


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _camel(group: str, version: str) -> tuple[str, str]:
    """("CoreV1", "core_v1"), ("RbacAuthorizationV1", "rbacAuthorization_v1"): operation id and tag parts."""
    g = group.removesuffix(".k8s.io") if group else "core"
    words = [w for w in re.split(r"[.\-]", g) if w]
    camel = "".join(w[:1].upper() + w[1:] for w in words)
    tag = camel[:1].lower() + camel[1:] + "_" + version
    return camel + version[:1].upper() + version[1:], tag


def _query(name: str, type_: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "description": description,
        "schema": {"type": type_, "uniqueItems": True},
    }


_DRY_RUN = _query(
    "dryRun",
    "string",
    "When present, indicates that modifications should not be persisted. Valid "
    "values are: - All: all dry run stages will be processed",
)
_FIELD_MANAGER = _query(
    "fieldManager",
    "string",
    "fieldManager is a name associated with the actor or entity that is making these changes.",
)
_FIELD_VALIDATION = _query(
    "fieldValidation",
    "string",
    "fieldValidation instructs the server on how to handle "
    "objects in the request containing unknown or duplicate fields. Valid values are: "
    "Ignore, Warn (default), Strict.",
)
_FORCE = _query(
    "force",
    "boolean",
    'Force is going to "force" Apply requests. It means user will re-acquire '
    "conflicting fields owned by other people. Force flag must be unset for non-apply patch requests.",
)
_LIST_PARAMS = [
    _query(
        "continue",
        "string",
        "The continue option should be set when retrieving more results from the server.",
    ),
    _query("fieldSelector", "string", "A selector to restrict the list of returned objects by their fields."),
    _query("labelSelector", "string", "A selector to restrict the list of returned objects by their labels."),
    _query("limit", "integer", "limit is a maximum number of responses to return for a list call."),
    _query(
        "resourceVersion",
        "string",
        "resourceVersion sets a constraint on what resource versions a request may be served from.",
    ),
    _query(
        "resourceVersionMatch",
        "string",
        "resourceVersionMatch determines how resourceVersion is applied to list calls.",
    ),
    _query("timeoutSeconds", "integer", "Timeout for the list/watch call."),
]
_WATCH_PARAMS = [
    _query(
        "allowWatchBookmarks", "boolean", 'allowWatchBookmarks requests watch events with type "BOOKMARK".'
    ),
    _query("sendInitialEvents", "boolean", "`sendInitialEvents=true` may be set together with `watch=true`."),
    _query(
        "watch",
        "boolean",
        "Watch for changes to the described resources and return them as a stream of add, "
        "update, and remove notifications.",
    ),
]
_DELETE_PARAMS = [
    _DRY_RUN,
    _query("gracePeriodSeconds", "integer", "The duration in seconds before the object should be deleted."),
    _query("orphanDependents", "boolean", "Deprecated: please use the PropagationPolicy."),
    _query(
        "propagationPolicy",
        "string",
        "Whether and how garbage collection will be performed: 'Orphan', 'Background' or 'Foreground'.",
    ),
]
_PRETTY = _query("pretty", "string", "If 'true', then the output is pretty printed.")


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "description": description,
        "required": True,
        "schema": {"type": "string", "uniqueItems": True},
    }


def _responses(schema: str, codes: Sequence[str], *, watch: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": _ref(schema)}}
    if watch:
        content["application/json;stream=watch"] = {"schema": _ref(schema)}
    texts = {"200": "OK", "201": "Created", "202": "Accepted"}
    out: dict[str, Any] = {code: {"description": texts[code], "content": content} for code in codes}
    out["401"] = {"description": "Unauthorized"}
    return out


def _body(schema: str, content_types: Sequence[str] = ("*/*",), *, required: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"content": {ct: {"schema": _ref(schema)} for ct in content_types}}
    if required:
        body["required"] = True
    return body


def _gvk(group: str, version: str, kind: str) -> dict[str, str]:
    return {"group": group, "version": version, "kind": kind}


class _DocBuilder:
    """Paths and components of one group-version document."""

    def __init__(self, group: str, version: str) -> None:
        self.group = group
        self.version = version
        self.prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        self.gv_camel, self.tag = _camel(group, version)
        self.paths: dict[str, Any] = {}
        self.schemas: dict[str, Any] = {}
        self.used_meta: set[str] = {STATUS}

    def op(
        self, action: str, op_id: str, gvk: dict[str, str], description: str, **fields: Any
    ) -> dict[str, Any]:
        return {
            "tags": [self.tag],
            "description": description,
            "operationId": op_id,
            **fields,
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": dict(gvk),
        }

    def add_resource(self, info: ResourceInfo) -> None:
        kind_name = self.add_kind(info.group, info.version, info.kind, info)
        base = (
            f"{self.prefix}/namespaces/{{namespace}}/{info.resource}"
            if info.namespaced
            else (f"{self.prefix}/{info.resource}")
        )
        common: list[dict[str, Any]] = []
        if info.namespaced:
            common.append(
                _path_param("namespace", "object name and auth scope, such as for teams and projects")
            )
        verbs = set(info.verbs)
        list_name = ""
        if "list" in verbs:
            list_name = self.add_list(info, kind_name, custom=info.is_custom)
        collection = self._collection_ops(info, kind_name, list_name)
        if collection:
            self.paths[base] = {**collection, "parameters": [*common, _PRETTY]}
        if info.namespaced and "list" in verbs:
            self.paths[f"{self.prefix}/{info.resource}"] = {
                "get": self.op(
                    "list",
                    f"list{self.gv_camel}{info.kind}ForAllNamespaces",
                    _gvk(info.group, info.version, info.kind),
                    f"list or watch objects of kind {info.kind}",
                    responses=_responses(list_name, ["200"], watch=True),
                ),
                "parameters": [*_LIST_PARAMS, *self._watch_params(info), _PRETTY],
            }
        item_common = [_path_param("name", f"name of the {info.kind}"), *common, _PRETTY]
        item = self._item_ops(info, kind_name)
        if item:
            self.paths[f"{base}/{{name}}"] = {**item, "parameters": item_common}
        for sub in sorted(info.subresources):
            self.add_subresource(info, sub, f"{base}/{{name}}/{sub}", item_common)

    @staticmethod
    def _watch_params(info: ResourceInfo) -> list[dict[str, Any]]:
        return _WATCH_PARAMS if "watch" in info.verbs else []

    def _collection_ops(self, info: ResourceInfo, kind_name: str, list_name: str) -> dict[str, Any]:
        """list, create and deletecollection, as far as the resource serves them."""
        verbs = set(info.verbs)
        gvk = _gvk(info.group, info.version, info.kind)
        suffix = f"{self.gv_camel}{'Namespaced' if info.namespaced else ''}{info.kind}"
        collection: dict[str, Any] = {}
        if "list" in verbs:
            collection["get"] = self.op(
                "list",
                f"list{suffix}",
                gvk,
                f"list or watch objects of kind {info.kind}",
                parameters=[*_LIST_PARAMS, *self._watch_params(info)],
                responses=_responses(list_name, ["200"], watch=True),
            )
        if "create" in verbs:
            collection["post"] = self.op(
                "post",
                f"create{suffix}",
                gvk,
                f"create a {info.kind}",
                parameters=[_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION],
                requestBody=_body(kind_name),
                responses=_responses(kind_name, ["200", "201", "202"]),
            )
        if "deletecollection" in verbs:
            self.used_meta.add(DELETE_OPTIONS)
            collection["delete"] = self.op(
                "deletecollection",
                f"deleteCollection{suffix}",
                gvk,
                f"delete collection of {info.kind}",
                parameters=[*_DELETE_PARAMS, *_LIST_PARAMS],
                requestBody=_body(DELETE_OPTIONS, required=False),
                responses=_responses(STATUS, ["200"]),
            )
        return collection

    def _item_ops(self, info: ResourceInfo, kind_name: str) -> dict[str, Any]:
        """get, update (put), patch and delete of one named object, as far as the resource serves them."""
        verbs = set(info.verbs)
        gvk = _gvk(info.group, info.version, info.kind)
        suffix = f"{self.gv_camel}{'Namespaced' if info.namespaced else ''}{info.kind}"
        item: dict[str, Any] = {}
        if "get" in verbs:
            item["get"] = self.op(
                "get", f"read{suffix}", gvk, f"read the specified {info.kind}", responses=_responses(kind_name, ["200"])
            )
        if "update" in verbs:
            item["put"] = self.op(
                "put",
                f"replace{suffix}",
                gvk,
                f"replace the specified {info.kind}",
                parameters=[_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION],
                requestBody=_body(kind_name),
                responses=_responses(kind_name, ["200", "201"]),
            )
        if "patch" in verbs:
            item["patch"] = self.patch_op(f"patch{suffix}", gvk, info.kind, kind_name, custom=info.is_custom)
        if "delete" in verbs:
            self.used_meta.add(DELETE_OPTIONS)
            item["delete"] = self.op(
                "delete",
                f"delete{suffix}",
                gvk,
                f"delete a {info.kind}",
                parameters=list(_DELETE_PARAMS),
                requestBody=_body(DELETE_OPTIONS, required=False),
                responses=_responses(STATUS, ["200", "202"]),
            )
        return item

    def add_subresource(self, info: ResourceInfo, sub: str, path: str, params: list[dict[str, Any]]) -> None:
        body_kind, sub_verbs = info.subresources[sub]
        g, v, k = subresource_kind(info, body_kind)
        same_gv = (g, v) == (info.group, info.version)
        name = self.add_kind(g, v, k, info if (same_gv and k == info.kind) else None)
        gvk = _gvk(g, v, k)
        suffix = f"{'Namespaced' if info.namespaced else ''}{info.kind}{sub[:1].upper()}{sub[1:]}"
        ops: dict[str, Any] = {}
        for verb in sorted(set(sub_verbs)):
            if verb not in _SUBRESOURCE_OPS:
                continue
            method, word = _SUBRESOURCE_OPS[verb]
            op_id = f"{word}{self.gv_camel}{suffix}"
            desc = f"{word} {sub} of the specified {info.kind}"
            if method == "get":
                ops["get"] = self.op("get", op_id, gvk, desc, responses=_responses(name, ["200"]))
            elif method == "put":
                ops["put"] = self.op(
                    "put",
                    op_id,
                    gvk,
                    desc,
                    parameters=[_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION],
                    requestBody=_body(name),
                    responses=_responses(name, ["200", "201"]),
                )
            elif method == "patch":
                ops["patch"] = self.patch_op(op_id, gvk, info.kind, name, custom=info.is_custom)
            else:
                ops["post"] = self.op(
                    "post",
                    op_id,
                    gvk,
                    desc,
                    parameters=[_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION],
                    requestBody=_body(name),
                    responses=_responses(name, ["200", "201", "202"]),
                )
        if ops:
            self.paths[path] = {**ops, "parameters": params}

    def patch_op(
        self, op_id: str, gvk: dict[str, str], kind: str, schema: str, *, custom: bool
    ) -> dict[str, Any]:
        self.used_meta.add(PATCH)
        return self.op(
            "patch",
            op_id,
            gvk,
            f"partially update the specified {kind}",
            parameters=[_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION, _FORCE],
            requestBody=_body(PATCH, _PATCH_TYPES_CUSTOM if custom else _PATCH_TYPES_BUILTIN),
            responses=_responses(schema, ["200", "201"]),
        )

    def add_kind(self, group: str, version: str, kind: str, info: ResourceInfo | None) -> str:
        """Register the component of a kind once; `info` (the resource's own kind) supplies CRD schemas."""
        is_custom = info is not None and info.is_custom
        name = schema_name(group, version, kind, custom=is_custom)
        if name in self.schemas:
            return name
        if info is not None and info.is_custom:
            schema = _custom_schema(info.schema)
            self.used_meta.add(OBJECT_META)
        else:
            schema = _copy(kind_schema(group, version, kind)) or {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
        schema["x-kubernetes-group-version-kind"] = [_gvk(group, version, kind)]
        self.schemas[name] = schema
        return name

    def add_list(self, info: ResourceInfo, kind_name: str, *, custom: bool) -> str:
        name = schema_name(info.group, info.version, info.list_kind, custom=custom)
        self.used_meta.add(LIST_META)
        self.schemas[name] = {
            "type": "object",
            "description": f"{info.list_kind} is a list of {info.kind}",
            "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string"},
                "items": {"type": "array", "items": _ref(kind_name)},
                "kind": {"type": "string"},
                "metadata": _ref(LIST_META),
            },
            "x-kubernetes-group-version-kind": [_gvk(info.group, info.version, info.list_kind)],
        }
        return name

    def document(self) -> dict[str, Any]:
        schemas = dict(self.schemas)
        for name in sorted(self.used_meta):
            short = name.rsplit(".", 1)[1]
            if short == "Patch":
                schemas[name] = {
                    "type": "object",
                    "description": "Patch is provided to give a concrete name and "
                    "type to the Kubernetes PATCH request body.",
                }
                continue
            schema = _copy(meta_schema(short))
            if short == "Status":
                schema["x-kubernetes-group-version-kind"] = [_gvk("", "v1", "Status")]
            elif short == "DeleteOptions":
                gvks = [_gvk("", "v1", "DeleteOptions")]
                if self.group:
                    gvks.append(_gvk(self.group, self.version, "DeleteOptions"))
                schema["x-kubernetes-group-version-kind"] = gvks
            schemas[name] = schema
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": SERVER_VERSION},
            "paths": self.paths,
            "components": {"schemas": schemas},
        }


def _copy(schema: dict[str, Any] | None) -> dict[str, Any]:
    """Deep copy of a shared schema (msgspec round trip: faster than copy.deepcopy)."""
    out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(schema)) if schema else {}
    return out


def _custom_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """A CRD version's schema as upstream publishes it: metadata is a reference to ObjectMeta."""
    out = _copy(schema)
    out.setdefault("type", "object")
    if not schema:
        out["x-kubernetes-preserve-unknown-fields"] = True
    props = out.setdefault("properties", {})
    props.setdefault(
        "apiVersion",
        {
            "type": "string",
            "description": "APIVersion defines the versioned schema of this representation of an object.",
        },
    )
    props.setdefault(
        "kind",
        {
            "type": "string",
            "description": "Kind is a string value representing the REST resource this object represents.",
        },
    )
    props["metadata"] = {
        "allOf": [_ref(OBJECT_META)],
        "description": "Standard object's metadata.",
    }
    return out


@functools.lru_cache(maxsize=128)
def _document(group: str, version: str, fingerprint: bytes) -> tuple[bytes, str] | None:
    infos = msgspec.json.decode(fingerprint, type=list[ResourceInfo])
    if not infos:
        return None
    builder = _DocBuilder(group, version)
    for info in sorted(infos, key=lambda i: i.resource):
        builder.add_resource(info)
    doc = builder.document()
    return msgspec.json.encode(doc), group_version_hash(doc)


def _cached(infos: Sequence[ResourceInfo], group: str, version: str) -> tuple[bytes, str] | None:
    served = [i for i in infos if i.group == group and i.version == version]
    return _document(group, version, msgspec.json.encode(served))


def _split(group_version: str) -> tuple[str, str]:
    group, _, version = group_version.rpartition("/")
    return group, version


def openapi_v3_group_version(infos: Sequence[ResourceInfo], group_version: str) -> dict[str, Any] | None:
    """`GET /openapi/v3/api/v1`, `/openapi/v3/apis/{g}/{v}`: a fresh OpenAPI 3.0 doc, or None."""
    group, version = _split(group_version)
    cached = _cached(infos, group, version)
    if cached is None:
        return None
    doc: dict[str, Any] = msgspec.json.decode(cached[0])
    return doc


def openapi_v3_group_version_bytes(
    infos: Sequence[ResourceInfo], group_version: str
) -> tuple[bytes, str] | None:
    """The encoded document and its hash, for a server that wants to skip re-encoding (same content)."""
    group, version = _split(group_version)
    return _cached(infos, group, version)


def openapi_v3_index(infos: Sequence[ResourceInfo]) -> dict[str, Any]:
    """`GET /openapi/v3`: where each group-version document lives, with its content hash."""
    paths: dict[str, Any] = {}
    for group, versions in served_groups(infos).items():
        for version in versions:
            cached = _cached(infos, group, version)
            if cached is None:
                continue
            key = f"apis/{group}/{version}" if group else f"api/{version}"
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={cached[1]}"}
    return {"paths": paths}

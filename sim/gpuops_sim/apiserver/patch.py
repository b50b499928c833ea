"""PATCH bodies as the kube-apiserver applies them: JSON, merge and strategic merge patch.

Faithful to what the apiserver links, not to the RFCs where the two differ: JSON patch behaves like
gopkg.in/evanphx/json-patch.v4 (negative indices, `replace` of a missing object key adds it, `copy` of a
missing key copies null) and strategic merge patch ports k8s.io/apimachinery/pkg/util/strategicpatch,
including how list order comes out. Error codes follow apiserver's handlers/patch.go: undecodable bodies
400, JSON patch operations that do not apply 422 (with the generic message, the reason is only in
`__cause__`), more than 10 000 operations 413, strategic-merge errors 400/422/500 as upstream classifies
them. The patch metadata of built-in kinds (patchStrategy/patchMergeKey tags, and for server-side apply
the listType/listMapKey/structType markers) lives in the tables below, built from k8s.io/api 1.37 types.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import StatusError, bad_request
from .store import clone

MAX_JSON_PATCH_OPERATIONS = 10000
# kube-apiserver's --json-patch-max-copy-bytes default: bytes all `copy` operations of a patch may add.
JSON_PATCH_MAX_COPY_BYTES = 3 * 1024 * 1024
_REJECTED = "the server rejected our request due to an error in our request"

_MISSING: Any = object()


# ----------------------------------------------------------------------------------------- helpers


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: 1 == 1.0 like JSON numbers, but True != 1 unlike Python."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return False
        return all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _go_float(v: float) -> str:
    if v.is_integer() and abs(v) < 1e21:
        return str(int(v))
    return repr(v).replace("e-0", "e-").replace("e+0", "e+")


def gofmt(v: Any) -> str:
    """A JSON value printed like Go's `%v` of its `interface{}` decoding; upstream error messages use it."""
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _go_float(v)
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{gofmt(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, list):
        return "[" + " ".join(gofmt(x) for x in v) + "]"
    return str(v)


def _go_type(v: Any) -> str:
    """The Go type encoding/json decodes a value into (ints keep int64 as the apiserver's decoder does)."""
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int64"
    if isinstance(v, float):
        return "float64"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "[]interface {}"
    return "map[string]interface {}"


def _json_kind(v: Any) -> str:
    """How encoding/json names a value in 'cannot unmarshal X into Go value' errors."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _go_key(v: Any) -> tuple[str, Any]:
    """A hashable stand-in for Go's `==` on interface{} values (int64 and float64 never compare equal)."""
    if isinstance(v, dict | list):
        return (_go_type(v), json.dumps(v, sort_keys=True))
    return (_go_type(v), v)


def _go_eq(a: Any, b: Any) -> bool:
    return _go_key(a) == _go_key(b)


# ----------------------------------------------------------------------------------- JSON patch


class _OpFailed(Exception):
    """An operation that does not apply; upstream answers 422 and keeps this text to itself."""


_ATOI = re.compile(r"[+-]?[0-9]+")


def _atoi(s: str) -> int:
    if not _ATOI.fullmatch(s):
        raise _OpFailed(f'strconv.Atoi: parsing "{s}": invalid syntax')
    return int(s)


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _index(arr: list[Any], key: str, *, extra: int = 0) -> int:
    """A (possibly negative) index into `arr`; `extra` = 1 allows the one-past-the-end slot of `add`."""
    idx = _atoi(key)
    size = len(arr) + extra
    if idx >= size:
        raise _OpFailed(f"Unable to access invalid index: {idx}: invalid index referenced")
    if idx < 0:
        if idx < -size:
            raise _OpFailed(f"Unable to access invalid index: {idx}: invalid index referenced")
        idx += size
    return idx


def _get(con: Any, key: str) -> Any:
    """evanphx `container.get`: a missing object key is not an error (it reads as null)."""
    if isinstance(con, dict):
        return con.get(key)
    return con[_index(con, key)]


def _find(doc: Any, path: str) -> tuple[Any, str] | None:
    parts = path.split("/")
    if len(parts) < 2:
        return None
    cur = doc
    for part in parts[1:-1]:
        try:
            nxt = _get(cur, _unescape(part))
        except _OpFailed:
            return None
        if not isinstance(nxt, dict | list):
            return None
        cur = nxt
    return cur, _unescape(parts[-1])


def _add(con: Any, key: str, value: Any) -> None:
    if isinstance(con, dict):
        con[key] = value
    elif key == "-":
        con.append(value)
    else:
        con.insert(_index(con, key, extra=1), value)


def _remove(con: Any, key: str) -> Any:
    if isinstance(con, dict):
        if key not in con:
            raise _OpFailed(f"Unable to remove nonexistent key: {key}: missing value")
        return con.pop(key)
    return con.pop(_index(con, key))


def _str_field(op: dict[str, Any], name: str, what: str) -> str:
    v = op.get(name)
    if not isinstance(v, str):
        raise _OpFailed(f"{what} operation failed to decode {name}")
    return v


def _apply_op(doc: Any, op: dict[str, Any], copied: list[int]) -> Any:
    kind = op.get("op")
    kind = kind if isinstance(kind, str) else "unknown"
    if kind not in ("add", "remove", "replace", "move", "copy", "test"):
        raise _OpFailed(f"Unexpected kind: {kind}")
    path = _str_field(op, "path", kind)
    value = clone(op.get("value"))
    if kind == "replace" and path == "":
        if not isinstance(value, dict | list):
            raise _OpFailed("replace operation value must be object or array")
        return value
    if kind == "test" and path == "":
        if "value" not in op or not json_equal(doc, value):
            raise _OpFailed(f"testing value {path} failed: test failed")
        return doc
    if kind in ("move", "copy"):
        frm = _str_field(op, "from", kind)
        found = _find(doc, frm)
        if found is None:
            raise _OpFailed(f"{kind} operation does not apply: doc is missing from path: {frm}")
        con, key = found
        moved = _get(con, key)
        if kind == "move":
            _remove(con, key)
        else:
            moved = clone(moved)
            copied[0] += len(json.dumps(moved, separators=(",", ":"), ensure_ascii=False).encode())
            if copied[0] > JSON_PATCH_MAX_COPY_BYTES:
                raise _OpFailed(
                    f"Unable to complete the copy, the accumulated size increase of copy is {copied[0]}, "
                    f"exceeding the limit {JSON_PATCH_MAX_COPY_BYTES}"
                )
        found = _find(doc, path)
        if found is None:
            raise _OpFailed(f"{kind} operation does not apply: doc is missing destination path: {path}")
        _add(found[0], found[1], moved)
        return doc
    found = _find(doc, path)
    if found is None:
        raise _OpFailed(f'{kind} operation does not apply: doc is missing path: "{path}": missing value')
    con, key = found
    if kind == "add":
        _add(con, key, value)
    elif kind == "remove":
        _remove(con, key)
    elif kind == "replace":
        if isinstance(con, dict):
            con[key] = value  # v4 quirk: a missing object key is simply set
        else:
            con[_index(con, key)] = value
    else:  # test
        current = _get(con, key)
        if current is None:
            if op.get("value") is not None:
                raise _OpFailed(f"testing value {path} failed: test failed")
        elif "value" not in op or not json_equal(current, value):
            raise _OpFailed(f"testing value {path} failed: test failed")
    return doc


def apply_json_patch(doc: Any, patch: Any) -> Any:
    """RFC 6902 as the apiserver applies it; `doc` and `patch` are not changed."""
    if patch is None:
        return clone(doc)
    if not isinstance(patch, list):
        raise bad_request(f"json: cannot unmarshal {_json_kind(patch)} into Go value of type jsonpatch.Patch")
    for op in patch:
        if op is not None and not isinstance(op, dict):
            raise bad_request(
                f"json: cannot unmarshal {_json_kind(op)} into Go value of type jsonpatch.Operation"
            )
    if len(patch) > MAX_JSON_PATCH_OPERATIONS:
        raise StatusError(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: The allowed maximum operations in a JSON patch is "
            f"{MAX_JSON_PATCH_OPERATIONS}, got {len(patch)}",
        )
    result = clone(doc)
    copied = [0]
    try:
        if not isinstance(result, dict | list):
            raise _OpFailed("json: cannot unmarshal document into a container")
        for op in patch:
            result = _apply_op(result, op or {}, copied)
    except _OpFailed as e:
        raise StatusError(422, "Invalid", _REJECTED) from e
    return result


# ---------------------------------------------------------------------------------- merge patch


def apply_merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7386. A non-object patch replaces the document, as the RFC says; the HTTP layer is
    the one to refuse such bodies the way the apiserver does."""
    if not isinstance(patch, dict):
        return clone(patch)
    return _merge_into(clone(doc) if isinstance(doc, dict) else {}, patch)


def _merge_into(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Merge `patch` into `target`, a copy this call owns (cloned once at the top, not at every level)."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict):
            sub = target.get(k)
            target[k] = _merge_into(sub if isinstance(sub, dict) else {}, v)
        else:
            target[k] = clone(v)
    return target


# ------------------------------------------------------------------------ built-in patch metadata


@dataclass(frozen=True)
class _Field:
    type: str | None = None  # struct type of the field, or of the items of a list
    strategy: str | None = None  # patchStrategy tag as upstream spells it ("merge,retainKeys", ...)
    key: str | None = None  # patchMergeKey
    ssa: str | None = None  # server-side apply: "map" | "set" | "atomic" (list or map); None = default
    keys: tuple[str, ...] = ()  # listMapKey markers when ssa == "map"
    always: bool = False  # a non-pointer struct: present (maybe empty) in every typed object
    null: bool = False  # no omitempty: a typed object carries it as null while unset


_NONE = _Field()


def _merge_list(item: str | None, key: str, *keys: str, strategy: str = "merge") -> _Field:
    return _Field(item, strategy, key, "map", keys or (key,))


_CONDITIONS = _merge_list(None, "type")
_STATUS_CONDITIONS = {"conditions": _CONDITIONS}

# Struct types whose values server-side apply treats as one atomic leaf (+structType=atomic).
_ATOMIC_TYPES = frozenset(
    {
        "OwnerReference",
        "LabelSelector",
        "LocalObjectReference",
        "ObjectReference",
        "NodeSelector",
        "EvictionResponder",
        "ConfigMapKeySelector",
        "SecretKeySelector",
        "ObjectFieldSelector",
        "ResourceFieldSelector",
        "FileKeySelector",
        "TypedLocalObjectReference",
    }
)

_CONTAINER = {
    "ports": _merge_list(None, "containerPort", "containerPort", "protocol"),
    "env": _merge_list("EnvVar", "name"),
    "volumeMounts": _merge_list(None, "mountPath"),
    "volumeDevices": _merge_list(None, "devicePath"),
    "resources": _Field("ResourceRequirements", always=True),
}

_TYPES: dict[str, dict[str, _Field]] = {
    "ObjectMeta": {
        "ownerReferences": _merge_list("OwnerReference", "uid"),
        "finalizers": _Field(None, "merge", None, "set"),
    },
    "PodTemplateSpec": {
        "metadata": _Field("ObjectMeta", always=True),
        "spec": _Field("PodSpec", always=True),
    },
    "PodSpec": {
        "volumes": _merge_list(None, "name", strategy="merge,retainKeys"),
        "initContainers": _merge_list("Container", "name"),
        "containers": _Field("Container", "merge", "name", "map", ("name",), null=True),
        "ephemeralContainers": _merge_list("Container", "name"),
        "imagePullSecrets": _merge_list("LocalObjectReference", "name"),
        "hostAliases": _merge_list(None, "ip"),
        "topologySpreadConstraints": _merge_list(None, "topologyKey", "topologyKey", "whenUnsatisfiable"),
        "schedulingGates": _merge_list(None, "name"),
        "resourceClaims": _merge_list(None, "name", strategy="merge,retainKeys"),
        "evictionResponders": _merge_list("EvictionResponder", "name"),
        "nodeSelector": _Field(ssa="atomic"),
        "affinity": _Field("Affinity"),
    },
    "Affinity": {"nodeAffinity": _Field("NodeAffinity")},
    "NodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": _Field("NodeSelector")},
    "Container": _CONTAINER,
    "EnvVar": {"valueFrom": _Field("EnvVarSource")},
    "EnvVarSource": {
        "configMapKeyRef": _Field("ConfigMapKeySelector"),
        "secretKeyRef": _Field("SecretKeySelector"),
        "fieldRef": _Field("ObjectFieldSelector"),
        "resourceFieldRef": _Field("ResourceFieldSelector"),
        "fileKeyRef": _Field("FileKeySelector"),
    },
    "ResourceRequirements": {"claims": _Field(ssa="map", keys=("name",))},
    "PodStatus": {
        "conditions": _CONDITIONS,
        "hostIPs": _Field(None, "merge", "ip", "atomic"),
        "podIPs": _merge_list(None, "ip"),
        "resourceClaimStatuses": _merge_list(None, "name", strategy="merge,retainKeys"),
        "nodeAllocatableResourceClaimStatuses": _merge_list(
            "NodeAllocatableResourceClaimStatus", "resourceClaimName"
        ),
        "volumeHealth": _Field("PodVolumeHealth", ssa="map", keys=("name",)),
        "containerStatuses": _Field("ContainerStatus", ssa="atomic"),
        "initContainerStatuses": _Field("ContainerStatus", ssa="atomic"),
        "ephemeralContainerStatuses": _Field("ContainerStatus", ssa="atomic"),
    },
    "ContainerStatus": {
        "volumeMounts": _merge_list(None, "mountPath"),
        "allocatedResourcesStatus": _merge_list("ResourceStatus", "name"),
    },
    "ResourceStatus": {"resources": _Field(ssa="map", keys=("resourceID",))},
    "PodVolumeHealth": {"healthConditions": _merge_list(None, "status", "status", "reason")},
    "NodeAllocatableResourceClaimStatus": {
        "containers": _Field(ssa="set"),
        "mapping": _merge_list(None, "name"),
        "overhead": _merge_list(None, "name"),
    },
    "NodeSpec": {"podCIDRs": _Field(None, "merge", None, "set")},
    "NodeStatus": {"conditions": _CONDITIONS, "addresses": _merge_list(None, "type")},
    "ServiceSpec": {
        "ports": _merge_list(None, "port", "port", "protocol"),
        "selector": _Field(ssa="atomic"),
    },
    "PodDisruptionBudgetSpec": {"selector": _Field("LabelSelector", "replace")},
    "JobSpec": {"template": _Field("PodTemplateSpec", always=True), "selector": _Field("LabelSelector")},
    "JobStatus": {
        "conditions": _Field(None, "merge", "type", "atomic"),
        "uncountedTerminatedPods": _Field("UncountedTerminatedPods"),
    },
    "UncountedTerminatedPods": {"succeeded": _Field(ssa="set"), "failed": _Field(ssa="set")},
    "DeploymentSpec": {
        "selector": _Field("LabelSelector"),
        "template": _Field("PodTemplateSpec", always=True),
        "strategy": _Field(None, "retainKeys", always=True),
    },
    "DaemonSetSpec": {
        "selector": _Field("LabelSelector"),
        "template": _Field("PodTemplateSpec", always=True),
        "updateStrategy": _Field(always=True),
    },
    "ReplicaSetSpec": {"selector": _Field("LabelSelector"), "template": _Field("PodTemplateSpec", always=True)},
    "StatefulSetSpec": {
        "selector": _Field("LabelSelector"),
        "template": _Field("PodTemplateSpec", always=True),
        "updateStrategy": _Field(always=True),
    },
    "ReplicationControllerSpec": {"selector": _Field(ssa="atomic"), "template": _Field("PodTemplateSpec")},
    "CronJobSpec": {"jobTemplate": _Field("JobTemplateSpec", always=True)},
    "JobTemplateSpec": {"metadata": _Field("ObjectMeta", always=True), "spec": _Field("JobSpec", always=True)},
    "Webhook": {
        "matchConditions": _merge_list(None, "name"),
        "namespaceSelector": _Field("LabelSelector"),
        "objectSelector": _Field("LabelSelector"),
    },
}


def _root(spec: str | None = None, status: str | None = None, **fields: _Field) -> dict[str, _Field]:
    out = {"metadata": _Field("ObjectMeta", always=True)}
    if spec is not None:
        out["spec"] = _Field(spec or None, always=True)
    if status is not None:
        out["status"] = _Field(status or None, always=True)
    out.update(fields)
    return out


_STATUS_WITH_CONDITIONS = "StatusWithConditions"
_TYPES[_STATUS_WITH_CONDITIONS] = _STATUS_CONDITIONS

# (group, kind) of every built-in kind served -> fields of its root object.
_ROOTS: dict[tuple[str, str], dict[str, _Field]] = {
    ("", "Pod"): _root("PodSpec", "PodStatus"),
    ("", "Node"): _root("NodeSpec", "NodeStatus"),
    ("", "Namespace"): _root("", _STATUS_WITH_CONDITIONS),
    ("", "Service"): _root("ServiceSpec", _STATUS_WITH_CONDITIONS),
    ("", "ServiceAccount"): _root(secrets=_merge_list("ObjectReference", "name")),
    ("", "Event"): _root(involvedObject=_Field("ObjectReference"), related=_Field("ObjectReference")),
    ("", "ConfigMap"): _root(),
    ("", "Secret"): _root(),
    ("coordination.k8s.io", "Lease"): _root(""),
    ("policy", "PodDisruptionBudget"): _root("PodDisruptionBudgetSpec", _STATUS_WITH_CONDITIONS),
    ("batch", "Job"): _root("JobSpec", "JobStatus"),
    ("apps", "Deployment"): _root("DeploymentSpec", _STATUS_WITH_CONDITIONS),
    ("apps", "DaemonSet"): _root("DaemonSetSpec", _STATUS_WITH_CONDITIONS),
    ("apps", "ReplicaSet"): _root("ReplicaSetSpec", _STATUS_WITH_CONDITIONS),
    ("apps", "StatefulSet"): _root("StatefulSetSpec", _STATUS_WITH_CONDITIONS),
    ("batch", "CronJob"): _root("CronJobSpec", ""),
    ("", "ReplicationController"): _root("ReplicationControllerSpec", _STATUS_WITH_CONDITIONS),
    ("", "PodTemplate"): _root(template=_Field("PodTemplateSpec", always=True)),
    ("apiextensions.k8s.io", "CustomResourceDefinition"): _root("", ""),
    ("rbac.authorization.k8s.io", "Role"): _root(),
    ("rbac.authorization.k8s.io", "RoleBinding"): _root(roleRef=_Field(always=True)),
    ("rbac.authorization.k8s.io", "ClusterRole"): _root(),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): _root(roleRef=_Field(always=True)),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"): _root(
        webhooks=_merge_list("Webhook", "name")
    ),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"): _root(
        webhooks=_merge_list("Webhook", "name")
    ),
    ("authentication.k8s.io", "TokenReview"): _root("", ""),
    ("authorization.k8s.io", "SubjectAccessReview"): _root("", ""),
}
_GENERIC_ROOT = _root()
_ROOT_NAME = "<root>"


def is_builtin_kind(group: str, kind: str) -> bool:
    """Whether the tables describe this kind (server-side apply then uses its list types)."""
    return (group, kind) in _ROOTS


def _fields(group: str, kind: str, type_name: str | None) -> dict[str, _Field]:
    if type_name == _ROOT_NAME:
        return _ROOTS.get((group, kind), _GENERIC_ROOT)
    return _TYPES.get(type_name or "", {})


def _lookup(group: str, kind: str, path: tuple[str, ...]) -> _Field | None:
    type_name: str | None = _ROOT_NAME
    found: _Field | None = None
    for name in path:
        found = _fields(group, kind, type_name).get(name)
        if found is None:
            return None
        type_name = found.type
    return found


@functools.lru_cache(maxsize=4096)
def list_strategy(group: str, kind: str, path: tuple[str, ...]) -> tuple[str | None, str | None]:
    """(x-kubernetes-patch-strategy, x-kubernetes-patch-merge-key) of the field at `path` (JSON names from the
    root, list items skipped). The strategy is upstream's tag verbatim: "merge", "merge,retainKeys",
    "retainKeys" (Deployment spec.strategy) or "replace" (PodDisruptionBudget spec.selector)."""
    f = _lookup(group, kind, path)
    if f is None:
        return None, None
    return f.strategy, f.key


@functools.lru_cache(maxsize=4096)
def builtin_ssa_shape(
    group: str, kind: str, path: tuple[str, ...]
) -> tuple[str, tuple[str, ...], bool] | None:
    """How server-side apply sees the field at `path` of a built-in kind: (relationship, list map keys,
    whether list items are atomic). Relationship is "map"/"set"/"atomic" (lists) or "atomic" (maps and
    structs); None means the default (lists atomic, maps granular)."""
    f = _lookup(group, kind, path)
    if f is None:
        return None
    item_atomic = f.type in _ATOMIC_TYPES
    if f.ssa is not None:
        return f.ssa, f.keys, item_atomic and f.ssa in ("map", "set")
    if item_atomic:
        return "atomic", (), False
    return None


@functools.lru_cache(maxsize=1024)
def builtin_always_present(group: str, kind: str, path: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """(name, zero value) of the fields a typed object of the struct at `path` always carries: non-pointer
    structs as {}, slices without omitempty as null. Whether ownership of a newly written map or list
    includes the map or list itself depends on it."""
    if path:
        f = _lookup(group, kind, path)
        if f is None or f.type is None:
            return ()
        fields = _fields(group, kind, f.type)
    else:
        if (group, kind) not in _ROOTS:
            return ()
        fields = _ROOTS[(group, kind)]
    return tuple((name, {} if f.always else None) for name, f in fields.items() if f.always or f.null)


# ------------------------------------------------------------------------- strategic merge patch

_DIRECTIVE = "$patch"
_RETAIN_KEYS = "$retainKeys"
_SET_ORDER = "$setElementOrder"
_DELETE_PRIMITIVES = "$deleteFromPrimitiveList"

_ERR_PRIMITIVE_LIST = "invalid patch format of primitive list"
_ERR_RETAIN_KEYS = "invalid patch format of retainKeys"
_ERR_SET_ORDER = "invalid patch format of setElementOrder list"


class _Smp:
    """One strategic merge: the kind it is for, and the errors upstream raises, by class."""

    def __init__(self, group: str, kind: str) -> None:
        self.group = group
        self.kind = kind

    # -- errors -------------------------------------------------------------------------------

    @staticmethod
    def e400(msg: str) -> StatusError:
        return bad_request(msg)

    @staticmethod
    def e422(msg: str) -> StatusError:
        err = StatusError(422, "Invalid", _REJECTED)
        err.__cause__ = ValueError(msg)
        return err

    @staticmethod
    def e500(msg: str) -> StatusError:
        # A plain Go error: the apiserver answers 500 with no reason and the error text as message.
        return StatusError(500, "", msg)

    def bad_arg(self, expected: str, actual: Any) -> StatusError:
        got = "%!s(<nil>)" if actual is None else _go_type(actual)
        return self.e500(f"expected a {expected}, but received a {got}")

    def no_merge_key(self, m: Any, key: str) -> StatusError:
        return self.e500(f"map: {gofmt(m)} does not contain declared merge key: {key}")

    # -- schema -------------------------------------------------------------------------------

    def field(self, type_name: str | None, name: str) -> _Field:
        return _fields(self.group, self.kind, type_name).get(name, _NONE)

    @staticmethod
    def strategy(f: _Field) -> str:
        parts = [s for s in (f.strategy or "").split(",") if s and s != "retainKeys"]
        return parts[0] if parts else ""

    # -- maps ---------------------------------------------------------------------------------

    def merge_map(self, original: dict[str, Any], patch: dict[str, Any], t: str | None) -> dict[str, Any]:
        if _DIRECTIVE in patch:
            directive = patch[_DIRECTIVE]
            if directive == "replace":
                del patch[_DIRECTIVE]
                cleaned: dict[str, Any] = _clean_new(patch)
                return cleaned
            if directive == "delete":
                return {}
            raise self.e500(f"unknown patch type: {gofmt(directive)} in map: {gofmt(patch)}")
        self.retain_keys(original, patch)
        self.set_element_order(original, patch, t)
        for key in list(patch):
            pv = patch[key]
            k = key
            is_delete_list = False
            if key.startswith(_DELETE_PRIMITIVES):
                k = self.extract_key(key, _DELETE_PRIMITIVES, _ERR_PRIMITIVE_LIST)
                is_delete_list = True
            if pv is None:
                original.pop(k, None)
                continue
            if k not in original or _go_type(original[k]) != _go_type(pv):
                if not is_delete_list:
                    _set_new(original, k, pv)
                continue
            ov = original[k]
            f = self.field(t, k)
            if isinstance(ov, dict):
                if self.strategy(f) == "replace":
                    original[k] = _clean_new(pv)
                else:
                    original[k] = self.merge_map(ov, pv, f.type)
            elif isinstance(ov, list):
                if self.strategy(f) == "merge" or is_delete_list:
                    original[k] = self.merge_slice(ov, pv, f, is_delete_list)[0]
                else:
                    original[k] = _clean_new(pv)
            else:
                _set_new(original, k, pv)
        return original

    def extract_key(self, key: str, prefix: str, err: str) -> str:
        head, sep, rest = key.partition("/")
        if not sep or head != prefix:
            raise self.e400(err)
        return rest

    def retain_keys(self, original: dict[str, Any], patch: dict[str, Any]) -> None:
        if _RETAIN_KEYS not in patch:
            return
        retain = patch.pop(_RETAIN_KEYS)
        if not isinstance(retain, list):
            raise self.e400(_ERR_RETAIN_KEYS)
        keep = {v for v in retain if isinstance(v, str)}
        for k, v in patch.items():
            if v is None or k.startswith(_DELETE_PRIMITIVES) or k.startswith(_SET_ORDER):
                continue
            if k not in keep:
                raise self.e400(_ERR_RETAIN_KEYS)
        for k in list(original):
            if k not in keep:
                del original[k]

    def set_element_order(self, original: dict[str, Any], patch: dict[str, Any], t: str | None) -> None:
        """`$setElementOrder/<list>`: merge that list now, then order it as the directive says."""
        for key in list(patch):
            if not key.startswith(_SET_ORDER):
                continue
            order = patch.pop(key)
            if not isinstance(order, list):
                raise self.bad_arg("[]interface {}", order)
            okey = self.extract_key(key, _SET_ORDER, _ERR_SET_ORDER)
            ov = original.get(okey, _MISSING)
            pv = patch.get(okey, _MISSING)
            if ov is not _MISSING and not isinstance(ov, list):
                raise self.bad_arg("[]interface {}", ov)
            if pv is not _MISSING and not isinstance(pv, list):
                raise self.bad_arg("[]interface {}", pv)
            f = self.field(t, okey)
            mkey = f.key or ""
            self.validate_order(None if pv is _MISSING else pv, order, mkey)
            window: list[Any]
            if ov is not _MISSING and pv is _MISSING:
                merged, window = ov, ov
            elif ov is _MISSING and pv is not _MISSING:
                merged, window = _clean_new(pv), []
            elif ov is not _MISSING:
                if self.strategy(f) == "merge":
                    merged, window = self.merge_slice(ov, pv, f, False)
                else:
                    merged, window = _clean_new(pv), ov
            else:
                continue
            if mkey:
                items, server_only = self.partition_maps(merged, order, mkey)
            else:
                items, server_only = _partition_primitives(merged, order)
            kind = self.element_kind([] if ov is _MISSING else ov, [] if pv is _MISSING else pv)
            original[okey] = self.normalize_order(items, server_only, order, window, mkey, kind)
            patch.pop(okey, None)

    def validate_order(self, patch_list: list[Any] | None, order: list[Any], mkey: str) -> None:
        if not order or not patch_list:
            return
        items = [v for v in patch_list if not _is_delete(v)] if mkey else patch_list
        if mkey:
            for v in patch_list:
                if not isinstance(v, dict):
                    raise self.bad_arg("map[string]interface {}", v)
        pi = oi = 0
        while pi < len(items) and oi < len(order):
            if isinstance(items[pi], dict) and _DIRECTIVE in items[pi]:
                pi += 1
                continue
            if self.merge_key_equal(items[pi], order[oi], mkey):
                pi += 1
            oi += 1
        if pi < len(items) and oi >= len(order):
            raise self.e500(
                f"The order in patch list:\n{gofmt(patch_list)}\n doesn't match {_SET_ORDER} list:\n"
                f"{gofmt(order)}\n"
            )

    def merge_key_equal(self, left: Any, right: Any, mkey: str) -> bool:
        if not mkey:
            return _go_eq(left, right)
        if not isinstance(left, dict):
            raise self.bad_arg("map[string]interface {}", left)
        if not isinstance(right, dict):
            raise self.bad_arg("map[string]interface {}", right)
        if mkey not in left:
            raise self.no_merge_key(left, mkey)
        if mkey not in right:
            raise self.no_merge_key(right, mkey)
        return _go_eq(left[mkey], right[mkey])

    # -- lists --------------------------------------------------------------------------------

    def element_kind(self, *lists: list[Any]) -> str:
        prev: str | None = None
        for lst in lists:
            for v in lst:
                cur = _go_type(v)
                if prev is None:
                    if isinstance(v, list):
                        raise self.e422("lists of lists are not supported")
                    prev = cur
                elif cur != prev:
                    raise self.e500(
                        "list element types are not identical: " + gofmt([list(x) for x in lists])
                    )
        if prev is None:
            raise self.e500("no elements in any of the given slices")
        return "map" if prev == "map[string]interface {}" else "scalar"

    def merge_slice(
        self, original: list[Any], patch: list[Any], f: _Field, is_delete_list: bool
    ) -> tuple[list[Any], list[Any]]:
        """The merged list, and what upstream's caller then sees in its own (aliased) copy of `original`:
        Go's in-place deletes and appends show through when the backing array is shared."""
        if not original and not patch:
            return original, original
        kind = self.element_kind(original, patch)
        mkey = f.key or ""
        if kind != "map":
            if is_delete_list:
                drop = {_go_key(v) for v in patch}
                return [v for v in original if _go_key(v) not in drop], original
            merged: list[Any] = []
            seen: set[tuple[str, Any]] = set()
            for v in original + patch:
                if _go_key(v) not in seen:
                    seen.add(_go_key(v))
                    merged.append(v)
            items, server_only = _partition_primitives(merged, patch)
            return self.normalize_order(items, server_only, patch, original, "", kind), original
        if not mkey:
            raise self.e500(f"cannot merge lists without merge key for {f.type or 'the list'}")
        window = _Aliased(original)
        cur = list(original)
        plain: list[Any] = []
        replace = False
        for item in patch:
            if not isinstance(item, dict) or _DIRECTIVE not in item:
                plain.append(item)
                continue
            directive = item[_DIRECTIVE]
            if directive == "delete":
                if mkey not in item:
                    raise self.no_merge_key(item, mkey)
                while (idx := self.find(cur, mkey, item[mkey])) is not None:
                    del cur[idx]
                    window.delete(idx)
            elif directive == "replace":
                replace = True
            elif directive == "merge":
                raise self.e500("merging lists cannot yet be specified in the patch")
            else:
                raise self.e500(f"unknown patch type: {gofmt(directive)} in map: {gofmt(item)}")
        if replace:
            cur, plain = plain, []
            window.detach()
        server_order = list(cur)
        for item in plain:
            if mkey not in item:
                raise self.no_merge_key(item, mkey)
            idx = self.find(cur, mkey, item[mkey])
            if idx is not None:
                cur[idx] = self.merge_map(cur[idx], item, f.type)
                window.set(idx, cur[idx])
            else:
                cur.append(item)
                window.append(item)
        items, server_only = self.partition_maps(cur, plain, mkey)
        return self.normalize_order(items, server_only, plain, server_order, mkey, kind), window.view()

    def find(self, items: list[Any], mkey: str, value: Any) -> int | None:
        for i, v in enumerate(items):
            if not isinstance(v, dict):
                raise self.e500(f"value for key {i} is not a map")
            if mkey in v and _go_eq(v[mkey], value):
                return i
        return None

    def partition_maps(self, merged: list[Any], by: list[Any], mkey: str) -> tuple[list[Any], list[Any]]:
        items: list[Any] = []
        server_only: list[Any] = []
        for v in merged:
            if not isinstance(v, dict):
                raise self.bad_arg("map[string]interface {}", v)
            if mkey not in v:
                raise self.no_merge_key(v, mkey)
            (items if self.find(by, mkey, v[mkey]) is not None else server_only).append(v)
        return items, server_only

    def normalize_order(
        self,
        items: list[Any],
        server_only: list[Any],
        order: list[Any],
        server_order: list[Any],
        mkey: str,
        kind: str,
    ) -> list[Any]:
        items = self.sort_by(items, order, mkey, kind)
        server_only = self.sort_by(server_only, server_order, mkey, kind)
        return _merge_sorted(server_only, items, server_order, mkey, kind)

    def sort_by(self, to_sort: list[Any], order: list[Any], mkey: str, kind: str) -> list[Any]:
        deletes: list[Any] = []
        if kind == "map":
            for lst in (to_sort, order):
                for v in lst:
                    if not isinstance(v, dict):
                        raise self.bad_arg("map[string]interface {}", v)
                    if mkey not in v:
                        raise self.no_merge_key(v, mkey)
            deletes = [v for v in to_sort if v.get(_DIRECTIVE) == "delete"]
            to_sort = [v for v in to_sort if v.get(_DIRECTIVE) != "delete"]
        idx = [_position(order, v, mkey, kind) for v in to_sort]
        if all(i >= 0 for i in idx):
            ranked = sorted(range(len(to_sort)), key=lambda i: idx[i])
            return [to_sort[i] for i in ranked] + deletes
        # Go's sort.SliceStable with a less() that answers true for unknown items: an insertion sort.
        out = list(to_sort)
        pos = list(idx)
        for i in range(1, len(out)):
            j = i
            while j > 0 and (pos[j] < 0 or pos[j - 1] < 0 or pos[j] < pos[j - 1]):
                out[j], out[j - 1] = out[j - 1], out[j]
                pos[j], pos[j - 1] = pos[j - 1], pos[j]
                j -= 1
        return out + deletes


class _Aliased:
    """The caller's view of a Go slice whose backing array (cap == len) a callee edits in place."""

    def __init__(self, original: list[Any]) -> None:
        self.arr = list(original)
        self.n = len(original)
        self.shared = True

    def delete(self, idx: int) -> None:
        if self.shared:
            self.arr[idx : self.n - 1] = self.arr[idx + 1 : self.n]
            self.n -= 1

    def set(self, idx: int, value: Any) -> None:
        if self.shared and idx < self.n:
            self.arr[idx] = value

    def append(self, value: Any) -> None:
        if self.shared and self.n < len(self.arr):
            self.arr[self.n] = value
            self.n += 1
        else:
            self.shared = False

    def detach(self) -> None:
        self.shared = False

    def view(self) -> list[Any]:
        return self.arr


def _is_delete(v: Any) -> bool:
    return isinstance(v, dict) and v.get(_DIRECTIVE) == "delete"


def _position(items: list[Any], value: Any, mkey: str, kind: str) -> int:
    if kind == "map":
        want = value.get(mkey) if isinstance(value, dict) else None
        for i, v in enumerate(items):
            if _go_eq(v.get(mkey) if isinstance(v, dict) else None, want):
                return i
        return -1
    for i, v in enumerate(items):
        if _go_eq(v, value):
            return i
    return -1


def _merge_sorted(
    left: list[Any], right: list[Any], server_order: list[Any], mkey: str, kind: str
) -> list[Any]:
    """Upstream mergeSortedSlice: interleave server-only items (left) into patch items (right)."""
    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if i >= len(left):
            out.append(right[j])
            j += 1
        elif j >= len(right):
            out.append(left[i])
            i += 1
        else:
            li = _position(server_order, left[i], mkey, kind)
            ri = _position(server_order, right[j], mkey, kind)
            if li >= 0 and ri >= 0 and li < ri:
                out.append(left[i])
                i += 1
            else:
                out.append(right[j])
                j += 1
    return out


def _partition_primitives(merged: list[Any], by: list[Any]) -> tuple[list[Any], list[Any]]:
    wanted = {_go_key(v) for v in by}
    return [v for v in merged if _go_key(v) in wanted], [v for v in merged if _go_key(v) not in wanted]


def _discard_nulls(v: Any) -> None:
    if isinstance(v, dict):
        for k in [k for k, x in v.items() if x is None]:
            del v[k]
        for x in v.values():
            _discard_nulls(x)
    elif isinstance(v, list):
        for x in v:
            _discard_nulls(x)


def _remove_directives(v: Any) -> tuple[Any, bool]:
    """Upstream removeDirectives, plus the other directive keys, which a typed decode would drop."""
    if isinstance(v, dict):
        if _DIRECTIVE in v:
            return None, False
        out: dict[str, Any] = {}
        for k, x in v.items():
            if k == _RETAIN_KEYS or k.startswith((_SET_ORDER + "/", _DELETE_PRIMITIVES + "/")):
                continue
            nv, keep = _remove_directives(x)
            if keep:
                out[k] = nv
        return out, True
    if isinstance(v, list):
        items = []
        for x in v:
            nv, keep = _remove_directives(x)
            if keep:
                items.append(nv)
        return items, True
    return v, True


def _clean_new(v: Any) -> Any:
    _discard_nulls(v)
    return _remove_directives(v)[0]


def _set_new(original: dict[str, Any], k: str, pv: Any) -> None:
    _discard_nulls(pv)
    value, keep = _remove_directives(pv)
    if keep:
        original[k] = value
    else:
        original.pop(k, None)


def apply_strategic_merge_patch(
    doc: dict[str, Any], patch: dict[str, Any], group: str, kind: str
) -> dict[str, Any]:
    """A strategic merge patch on a built-in object; `doc` and `patch` are not changed.

    Kinds missing from the tables merge like metadata-only objects; refusing custom resources (415) is
    the HTTP layer's job, since only it knows whether a kind is a CRD.
    """
    body: Any = patch
    if body is None:
        return clone(doc)
    if not isinstance(body, dict):
        raise bad_request(
            f"json: cannot unmarshal {_json_kind(body)} into Go value of type map[string]interface {{}}"
        )
    original = clone(doc) if isinstance(doc, dict) else {}
    return _Smp(group, kind).merge_map(original, clone(body), _ROOT_NAME)

"""Defaulting and validation of built-in kinds: what kube-apiserver's registry strategies do on write.

Only the rules our controllers and clients can observe are modelled: names, pod defaults (the ones the
scheduler and kubelet read), pod update immutability, scheduling-gate removal, Job template rules,
namespace finalizers, Secret stringData, Service defaults.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import msgspec

from . import defaults
from .encodingmemo import EncodingsBySchema
from .errors import Cause, StatusError, invalid

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)

# Kinds whose names are DNS labels rather than subdomains.
_LABEL_NAMED = {("", "Namespace"), ("", "Service")}


def _q(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def validate_name(group: str, kind: str, name: str) -> list[Cause]:
    if (group, kind) in _LABEL_NAMED:
        if len(name) > 63 or not DNS1123_LABEL.match(name):
            return [Cause("FieldValueInvalid", f"Invalid value: {_q(name)}: {_LABEL_MSG}", "metadata.name")]
        return []
    if len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        return [Cause("FieldValueInvalid", f"Invalid value: {_q(name)}: {_SUBDOMAIN_MSG}", "metadata.name")]
    return []


def _valid_qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED.match(name))


def validate_metadata(meta: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        return [Cause("FieldValueInvalid", "Invalid value: must be a map of strings", "metadata.labels")]
    for k, v in labels.items():
        if not _valid_qualified_name(k):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_q(k)}: name part must consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character",
                    "metadata.labels",
                )
            )
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_q(v)}: a valid label must be an empty string or consist of alphanumeric "
                    "characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                    "metadata.labels",
                )
            )
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict) or any(not isinstance(v, str) for v in annotations.values()):
        causes.append(
            Cause("FieldValueInvalid", "Invalid value: must be a map of strings", "metadata.annotations")
        )
    elif sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        causes.append(
            Cause("FieldValueTooLong", "Too long: must have at most 262144 bytes", "metadata.annotations")
        )
    for i, f in enumerate(meta.get("finalizers") or []):
        if not isinstance(f, str) or not _valid_qualified_name(f):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_q(f)}: must be a qualified name",
                    f"metadata.finalizers[{i}]",
                )
            )
        elif "/" not in f and f not in ("kubernetes", "orphan", "foregroundDeletion"):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_q(f)}: name is neither a standard finalizer name nor is it fully qualified",
                    f"metadata.finalizers[{i}]",
                )
            )
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for field in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref, dict) or not ref.get(field):
                causes.append(
                    Cause("FieldValueRequired", "Required value", f"metadata.ownerReferences[{i}].{field}")
                )
    return causes


# ------------------------------------------------------------------------------------------ pods

_NOT_READY_TOLERATIONS = [
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
]


def _pod_admission_defaults(spec: dict[str, Any]) -> None:
    """What the Priority, ServiceAccount and DefaultTolerationSeconds admission plugins add to a new Pod."""
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    if not spec.get("priorityClassName"):
        spec.setdefault("priority", 0)
    spec.setdefault("serviceAccountName", "default")
    tol = spec.setdefault("tolerations", [])
    if isinstance(tol, list):
        keys = {t.get("key") for t in tol if isinstance(t, dict)}
        tol.extend(dict(t) for t in _NOT_READY_TOLERATIONS if t["key"] not in keys)


def _qos(spec: dict[str, Any]) -> str:
    containers = [
        c for c in (spec.get("containers") or []) + (spec.get("initContainers") or []) if isinstance(c, dict)
    ]
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if any(k in req or k in lim for k in ("cpu", "memory")):
            any_set = True
        for k in ("cpu", "memory"):
            if k not in lim or req.get(k, lim.get(k)) != lim.get(k):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _container_causes(spec: dict[str, Any], path: str) -> list[Cause]:
    """Each container and init container needs a unique DNS label name and an image."""
    causes: list[Cause] = []
    names: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            p = f"{path}.{kind}[{i}]"
            if not isinstance(c, dict):
                causes.append(Cause("FieldValueInvalid", "Invalid value: must be an object", p))
                continue
            name = c.get("name")
            if not name:
                causes.append(Cause("FieldValueRequired", "Required value", f"{p}.name"))
            elif not isinstance(name, str) or not DNS1123_LABEL.match(name):
                causes.append(
                    Cause("FieldValueInvalid", f"Invalid value: {_q(name)}: {_LABEL_MSG}", f"{p}.name")
                )
            elif name in names:
                causes.append(Cause("FieldValueDuplicate", f"Duplicate value: {_q(name)}", f"{p}.name"))
            else:
                names.add(name)
            if not c.get("image"):
                causes.append(Cause("FieldValueRequired", "Required value", f"{p}.image"))
    return causes


def _scheduling_gate_causes(spec: dict[str, Any], path: str) -> list[Cause]:
    """Scheduling gates hold a pod back from the scheduler, so a pod already bound to a node may have none;
    each gate needs a unique qualified name."""
    causes: list[Cause] = []
    gates = spec.get("schedulingGates") or []
    if gates and spec.get("nodeName"):
        causes.append(
            Cause(
                "FieldValueForbidden",
                "Forbidden: cannot be set with spec.nodeName",
                f"{path}.schedulingGates",
            )
        )
    seen: set[str] = set()
    for i, g in enumerate(gates):
        gname = g.get("name") if isinstance(g, dict) else None
        if not gname or not isinstance(gname, str) or not _valid_qualified_name(gname):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_q(gname)}: must be a qualified name",
                    f"{path}.schedulingGates[{i}].name",
                )
            )
        elif gname in seen:
            causes.append(
                Cause(
                    "FieldValueDuplicate",
                    f"Duplicate value: {_q(gname)}",
                    f"{path}.schedulingGates[{i}].name",
                )
            )
        else:
            seen.add(gname)
    return causes


def validate_pod_spec(spec: Any, path: str) -> list[Cause]:
    if not isinstance(spec, dict):
        return [Cause("FieldValueRequired", "Required value", path)]
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not containers:
        causes.append(Cause("FieldValueRequired", "Required value", f"{path}.containers"))
    causes.extend(_container_causes(spec, path))
    rp = spec.get("restartPolicy")
    if rp is not None and rp not in ("Always", "OnFailure", "Never"):
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: {_q(rp)}: supported values: "Always", "OnFailure", "Never"',
                f"{path}.restartPolicy",
            )
        )
    causes.extend(_scheduling_gate_causes(spec, path))
    return causes


_POD_MUTABLE_MSG = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
    "tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def _mask_mutable(spec: dict[str, Any]) -> dict[str, Any]:
    masked = dict(spec)
    for kind in ("containers", "initContainers"):
        masked[kind] = [
            {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
            for c in spec.get(kind) or []
        ]
    for k in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates"):
        masked.pop(k, None)
    return masked


def _gated_directives(os_: dict[str, Any], ns_: dict[str, Any]) -> list[Cause]:
    """KEP-3838 (GA in 1.30): while a pod is scheduling-gated its node selector and required node affinity may
    be tightened (additions only); preferred node affinity may change freely."""
    causes: list[Cause] = []
    old_sel, new_sel = os_.get("nodeSelector") or {}, ns_.get("nodeSelector") or {}
    if any(new_sel.get(k) != v for k, v in old_sel.items()):
        causes.append(Cause("FieldValueForbidden", "Forbidden: only additions to spec.nodeSelector are allowed "
                            "(no mutations or deletions)", "spec.nodeSelector"))
    old_na = (os_.get("affinity") or {}).get("nodeAffinity")
    new_na = (ns_.get("affinity") or {}).get("nodeAffinity")
    if old_na is None:
        return causes
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    old_terms = ((old_na or {}).get(key) or {}).get("nodeSelectorTerms") or []
    new_terms = ((new_na or {}).get(key) or {}).get("nodeSelectorTerms") or []
    if not old_terms:
        return causes
    ok = len(old_terms) == len(new_terms) and all(
        all((nt.get(f) or [])[:len(ot.get(f) or [])] == (ot.get(f) or []) for f in ("matchExpressions", "matchFields"))
        for ot, nt in zip(old_terms, new_terms, strict=True))
    if not ok:
        causes.append(Cause("FieldValueForbidden", "Forbidden: only additions are allowed (no mutations or "
                            "deletions)", f"spec.affinity.nodeAffinity.{key}"))
    return causes


def _mask_gated(spec: dict[str, Any]) -> dict[str, Any]:
    masked = dict(spec)
    masked.pop("nodeSelector", None)
    affinity = dict(masked.pop("affinity", None) or {})
    affinity.pop("nodeAffinity", None)
    if affinity:
        masked["affinity"] = affinity
    return masked


def validate_pod_update(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    os_, ns_ = old.get("spec") or {}, new.get("spec") or {}
    causes: list[Cause] = []
    gated = bool(os_.get("schedulingGates"))
    old_m, new_m = _mask_mutable(os_), _mask_mutable(ns_)
    if gated:
        old_m, new_m = _mask_gated(old_m), _mask_gated(new_m)
        causes.extend(_gated_directives(os_, ns_))
    if old_m != new_m:
        causes.append(Cause("FieldValueForbidden", _POD_MUTABLE_MSG, "spec"))
    old_tol, new_tol = os_.get("tolerations") or [], ns_.get("tolerations") or []
    if any(t not in new_tol for t in old_tol):
        causes.append(
            Cause(
                "FieldValueForbidden",
                "Forbidden: existing toleration can not be modified except its tolerationSeconds",
                "spec.tolerations",
            )
        )
    old_gates = {g.get("name") for g in os_.get("schedulingGates") or [] if isinstance(g, dict)}
    for i, g in enumerate(ns_.get("schedulingGates") or []):
        if isinstance(g, dict) and g.get("name") not in old_gates:
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    f"Forbidden: only deletion is allowed, but found new scheduling gate '{g.get('name')}'",
                    f"spec.schedulingGates[{i}]",
                )
            )
    return causes


# ------------------------------------------------------------------------------------------ per kind


def redefault(group: str, kind: str, obj: dict[str, Any]) -> None:
    """Defaults again after a mutating webhook's patch (kube-apiserver runs the defaulter on the patched object):
    a container a webhook added gets its defaults, a limit-only extended resource its request."""
    defaults.apply(group, kind, obj)


def _default_match_resources(match: Any) -> None:
    """SetDefaults_MatchResources: Equivalent matching, selectors that select everything, rules of any scope."""
    if not isinstance(match, dict):
        return
    match.setdefault("matchPolicy", "Equivalent")
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    for rules in ("resourceRules", "excludeResourceRules"):
        for rule in match.get(rules) or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")


def _prepare_pod(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict):
        _pod_admission_defaults(spec)
        obj["status"] = {"phase": "Pending", "qosClass": _qos(spec)}


def _prepare_namespace(obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    # `null` decodes to an empty map in Go, so a null spec or labels gets the same defaults as none.
    obj["spec"] = {**(obj.get("spec") or {}), "finalizers": ["kubernetes"]}
    obj["status"] = {"phase": "Active"}
    meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/metadata.name": meta["name"]}


def _prepare_job(obj: dict[str, Any]) -> None:
    """Job defaults, and the labels tying the Job's pods to it (its selector, unless manualSelector)."""
    meta = obj["metadata"]
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    uid = meta["uid"]
    tmpl = spec.setdefault("template", {})
    tmeta = tmpl.setdefault("metadata", {})
    labels = tmeta.setdefault("labels", {})
    user_labels = dict(labels)
    labels.update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "controller-uid": uid,
            "batch.kubernetes.io/job-name": meta["name"],
            "job-name": meta["name"],
        }
    )
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    if not meta.get("labels"):
        # SetDefaults_Job: a Job without labels takes its template's; with none given, defaulting on
        # read copies the generated ones (controller-uid, job-name), as `kubectl get job -o yaml` shows.
        meta["labels"] = user_labels or dict(labels)
    obj["status"] = {}


def _prepare_service(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict):
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for p in spec.get("ports") or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
                p.setdefault("targetPort", p.get("port"))
    obj["status"] = {"loadBalancer": {}}


def _prepare_admission_policy(kind: str, obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind == "ValidatingAdmissionPolicy":
        spec.setdefault("failurePolicy", "Fail")
        _default_match_resources(spec.get("matchConstraints"))
    else:
        _default_match_resources(spec.get("matchResources"))


def prepare_create(group: str, kind: str, obj: dict[str, Any]) -> None:
    """Defaults and server-owned fields set on create, in place (obj is the handler's private copy)."""
    defaults.apply(group, kind, obj)
    if (group, kind) == ("", "Pod"):
        _prepare_pod(obj)
    elif (group, kind) == ("", "Namespace"):
        _prepare_namespace(obj)
    elif (group, kind) == ("batch", "Job"):
        _prepare_job(obj)
    elif group == "admissionregistration.k8s.io" and kind in (
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ):
        _prepare_admission_policy(kind, obj)
    elif (group, kind) == ("", "Service"):
        _prepare_service(obj)
    elif group in ("apps", "batch", "policy", "networking.k8s.io", "certificates.k8s.io"):
        obj["status"] = {}  # status is the controllers' to write: a create starts from none
    elif (group, kind) in (("", "PersistentVolume"), ("", "PersistentVolumeClaim")):
        obj["status"] = {"phase": "Pending"}
    elif (group, kind) in (("", "ReplicationController"), ("", "ResourceQuota")):
        obj["status"] = {}


def _quantity_text(value: Any) -> Any:
    """JSON numbers in quantity fields come back as strings, as the apiserver's Quantity type serialises them."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    milli = value * 1000
    if milli.is_integer():
        return f"{int(milli)}m"
    return repr(value)


def _quantities(mapping: Any) -> None:
    if isinstance(mapping, dict):
        for k, v in mapping.items():
            mapping[k] = _quantity_text(v)


def _pod_spec_quantities(spec: Any) -> None:
    if not isinstance(spec, dict):
        return
    _quantities(spec.get("overhead"))
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(kind) or []:
            res = c.get("resources") if isinstance(c, dict) else None
            if isinstance(res, dict):
                _quantities(res.get("requests"))
                _quantities(res.get("limits"))


def _canonical_base64(value: Any) -> Any:
    """Secret data as kube-apiserver stores it: Go's base64 decoder skips line breaks (PEM-style wrapped values,
    as in the TLS example of the Kubernetes docs), and the bytes are encoded again without them."""
    if not isinstance(value, str) or ("\n" not in value and "\r" not in value):
        return value
    try:
        return base64.b64encode(base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)).decode()
    except ValueError:
        return value  # validation names it


def normalize(group: str, kind: str, obj: dict[str, Any]) -> None:
    """Conversions every write goes through (Secret stringData is write-only; quantities become strings)."""
    if (group, kind) == ("", "Secret"):
        data = obj.get("data")
        if isinstance(data, dict):
            obj["data"] = {k: _canonical_base64(v) for k, v in data.items()}
        if "stringData" in obj:
            data = obj.setdefault("data", {}) or {}
            for k, v in (obj.pop("stringData") or {}).items():
                data[k] = base64.b64encode(str(v).encode()).decode()
            obj["data"] = data
    elif (group, kind) == ("", "Pod"):
        _pod_spec_quantities(obj.get("spec"))
    elif (group, kind) in (("batch", "Job"), ("apps", "Deployment"), ("apps", "DaemonSet")):
        template = (obj.get("spec") or {}).get("template")
        if isinstance(template, dict):
            _pod_spec_quantities(template.get("spec"))
    elif (group, kind) == ("", "Node"):
        status = obj.get("status")
        if isinstance(status, dict):
            _quantities(status.get("capacity"))
            _quantities(status.get("allocatable"))


def validate(group: str, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    causes: list[Cause] = []
    if (group, kind) == ("", "Pod"):
        causes += validate_pod_spec(obj.get("spec"), "spec")
        if old is not None:
            causes += validate_pod_update(old, obj)
    elif (group, kind) == ("batch", "Job"):
        tmpl = (obj.get("spec") or {}).get("template")
        if not isinstance(tmpl, dict):
            causes.append(Cause("FieldValueRequired", "Required value", "spec.template"))
        else:
            causes += validate_pod_spec(tmpl.get("spec"), "spec.template.spec")
            rp = (tmpl.get("spec") or {}).get("restartPolicy")
            if rp not in ("Never", "OnFailure"):
                causes.append(
                    Cause(
                        "FieldValueNotSupported",
                        f'Unsupported value: {_q(rp)}: supported values: "OnFailure", "Never"',
                        "spec.template.spec.restartPolicy",
                    )
                )
        if old is not None and (old.get("spec") or {}).get("selector") != (obj.get("spec") or {}).get("selector"):
                causes.append(
                    Cause("FieldValueInvalid", "Invalid value: field is immutable", "spec.selector")
                )
    elif (group, kind) == ("policy", "PodDisruptionBudget"):
        spec = obj.get("spec") or {}
        if "minAvailable" in spec and "maxUnavailable" in spec:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    "Invalid value: minAvailable and maxUnavailable cannot be both set",
                    "spec",
                )
            )
    elif (group, kind) == ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"):
        from .policies import check_policy

        causes += check_policy(obj)
    elif (group, kind) == ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"):
        from .policies import check_binding

        causes += check_binding(obj)
    elif (group, kind) == ("", "Secret"):
        for k, v in (obj.get("data") or {}).items():
            try:
                base64.b64decode(str(v), validate=True)
            except ValueError:
                causes.append(Cause("FieldValueInvalid", "Invalid value: illegal base64 data", f"data[{k}]"))
    return causes


def check_valid(group: str, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    meta = obj["metadata"]
    causes = validate_name(group, kind, meta.get("name", "")) if old is None else []
    causes += validate_metadata(meta)
    causes += validate(group, kind, obj, old)
    if causes:
        raise invalid(kind, group, meta.get("name", ""), causes)


def ensure_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise StatusError(400, "BadRequest", "the body of the request must be a JSON object")
    meta = body.get("metadata")
    if meta is None:
        body["metadata"] = {}
    elif not isinstance(meta, dict):
        raise StatusError(400, "BadRequest", "metadata must be an object")
    else:
        from .builtin_schemas import meta_schema

        kind = body.get("kind") if isinstance(body.get("kind"), str) else "Object"
        err = go_decode_error(meta_schema("ObjectMeta"), meta, f"{kind}.metadata")
        if err:  # decoding into the Go type fails before any validation (400, not 422)
            version = body.get("apiVersion") if isinstance(body.get("apiVersion"), str) else ""
            raise StatusError(
                400, "BadRequest", f'{kind} in version "{version}" cannot be handled as a {kind}: {err}'
            )
    return body


_GO_JSON = {str: "string", bool: "bool", int: "number", float: "number", list: "array", dict: "object"}


def go_decode_error(s: dict[str, Any], x: Any, path: str) -> str | None:
    """The error Go's json decoder would raise decoding `x` into the built-in type described by schema `s`
    (null is always accepted; unknown fields are pruning's business), or None. Built-ins have typed fields
    where CRs have a schema: `data: {"k": 1}` is a 400 there, not a stored value."""
    if x is None or not isinstance(s, dict):
        return None
    jt = _GO_JSON.get(type(x), "value")
    t = s.get("type")
    if s.get("x-kubernetes-int-or-string"):
        ok = isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool))
        go_type = "intstr.IntOrString"
    elif "oneOf" in s or "anyOf" in s or t is None:
        return None  # quantities, preserve-unknown-fields and other free-form values
    elif t == "object":
        if not isinstance(x, dict):
            return f"json: cannot unmarshal {jt} into Go struct field {path} of type object"
        props = s.get("properties") or {}
        extra = s.get("additionalProperties")
        for k, v in x.items():
            sub = props.get(k) if k in props else (extra if isinstance(extra, dict) else None)
            err = go_decode_error(sub, v, f"{path}.{k}") if sub is not None else None
            if err:
                return err
        return None
    elif t == "array":
        if not isinstance(x, list):
            return f"json: cannot unmarshal {jt} into Go struct field {path} of type array"
        for v in x:
            err = go_decode_error(s.get("items") or {}, v, path)
            if err:
                return err
        return None
    elif t == "string":
        ok, go_type = isinstance(x, str), "string"
    elif t == "boolean":
        ok, go_type = isinstance(x, bool), "bool"
    elif t == "integer":
        ok, go_type = isinstance(x, int) and not isinstance(x, bool), str(s.get("format") or "int64")
    elif t == "number":
        ok, go_type = isinstance(x, int | float) and not isinstance(x, bool), "float64"
    else:
        return None
    if ok:
        return None
    return f"json: cannot unmarshal {jt} into Go struct field {path} of type {go_type}"


_decoded = EncodingsBySchema(5_000, 1_000)
"""Encodings of top-level values that decoded cleanly into a built-in schema's kind."""


def builtin_decode_error(bschema: dict[str, Any], kind: str, obj: dict[str, Any]) -> str | None:
    """go_decode_error for a whole object, skipping apiVersion/kind/metadata (validated elsewhere).

    Pods of one workload are created with the same spec: top-level values that decoded before (by field
    and encoding; the answer depends on nothing else) are not walked again."""
    props = bschema.get("properties") or {}
    seen = _decoded.of(bschema)
    for k, v in obj.items():
        if k not in ("apiVersion", "kind", "metadata") and k in props:
            try:
                key: bytes | None = k.encode() + b"=" + msgspec.json.encode(v)
            except (OverflowError, TypeError, ValueError):
                key = None
            if key is not None and key in seen:
                continue
            err = go_decode_error(props[k], v, f"{kind}.{k}")
            if err:
                return err
            if key is not None:
                _decoded.remember(bschema, key)
    return None

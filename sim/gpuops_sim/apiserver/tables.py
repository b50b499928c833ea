"""Server-side printing: `meta.k8s.io/v1 Table` bodies for `kubectl get`.

kubectl asks for `application/json;as=Table;v=v1;g=meta.k8s.io` on list, get and watch and prints the
cells as given, so the cells must be what kube-apiserver would compute:

* built-ins with an upstream printer get its columns, including the priority-1 ("wide") ones, which the
  server always fills; ages are rendered server-side the way `duration.HumanDuration` does. These are
  Pod, Node, Namespace, ConfigMap, Secret, ServiceAccount, Event, Service, Endpoints, PodTemplate,
  ReplicationController, PersistentVolume(Claim), ResourceQuota, Lease, PodDisruptionBudget, EndpointSlice,
  Deployment, ReplicaSet, StatefulSet, DaemonSet, ControllerRevision, Job, CronJob, Ingress, IngressClass,
  NetworkPolicy, PriorityClass, StorageClass, CertificateSigningRequest, (Cluster)RoleBinding, the webhook
  configurations, ValidatingAdmissionPolicy(Binding), and APIService (kube-aggregator's own table);
* other built-ins (LimitRange, Role, ClusterRole, CustomResourceDefinition, ...) get the default convertor's
  "Name" and "Created At" (an RFC 3339 string), as upstream has no printer for them;
* custom resources get "Name" plus the CRD's additionalPrinterColumns ("Age" if it lists none). A column
  shows the *first* JSONPath result only, `date` columns are turned into ages on the server, and a
  missing value is a null cell (kubectl prints it blank).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from . import quantity
from .errors import bad_request
from .gostrings import go_json_escape
from .resources import ResourceInfo
from .selectors import label_selector_from_object
from .store import clone

__all__ = [
    "TABLE_API_VERSION",
    "column_definitions",
    "human_duration",
    "jsonpath_find",
    "render_table",
    "render_table_row_event",
]

TABLE_API_VERSION = "meta.k8s.io/v1"
INCLUDE_OBJECT_VALUES = ("None", "Metadata", "Object")

Column = dict[str, Any]
Cells = list[Any]

# ---------------------------------------------------------------------------------------------------------
# Times and numbers rendered the way Go renders them

_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})")


def _parse_time(value: Any) -> datetime | None:
    """metav1.Time from JSON: RFC 3339 (fractions allowed); None for absent, empty or unparseable."""
    if not isinstance(value, str):
        return None
    m = _RFC3339.fullmatch(value)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micros = int((m.group(7) or "0")[:6].ljust(6, "0"))
    zone = m.group(8)
    offset = (
        timedelta(0)
        if zone == "Z"
        else (1 if zone[0] == "+" else -1) * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    )
    try:
        local = datetime(year, month, day, hour, minute, second, micros)
    except ValueError:
        return None
    return (local - offset).replace(tzinfo=UTC)


def _is_zero_time(t: datetime | None) -> bool:
    return t is None or t == datetime(1, 1, 1, tzinfo=UTC)


def human_duration(d: timedelta) -> str:
    """duration.HumanDuration: about two significant figures, as `kubectl get` shows ages."""
    seconds = int(d.total_seconds())  # truncates toward zero like Go's int(d.Seconds())
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 60 * 2:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        s = seconds % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def _since(value: Any, now: datetime) -> str:
    """translateTimestampSince: an age, or `<unknown>` for a missing timestamp."""
    t = _parse_time(value)
    if _is_zero_time(t):
        return "<unknown>"
    assert t is not None
    return human_duration(now - t)


def _rfc3339(value: Any) -> str:
    """Time.UTC().Format(time.RFC3339): whole seconds, `Z`; the zero time when absent."""
    t = _parse_time(value) or datetime(1, 1, 1, tzinfo=UTC)
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}Z"


def _digits(f: float) -> tuple[str, int, bool]:
    """Shortest round-trip digits of a non-zero |f|, where its decimal point goes, and its sign."""
    sign, digits, exponent = Decimal(repr(f)).as_tuple()
    assert isinstance(exponent, int)
    ds = "".join(map(str, digits))
    return ds.rstrip("0"), len(ds) + exponent, bool(sign)


def _fmt_e(ds: str, dp: int, neg: bool, short_exp: bool) -> str:
    mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
    exp = dp - 1
    e = f"{abs(exp):02d}" if not short_exp else str(abs(exp))
    return ("-" if neg else "") + mant + "e" + ("-" if exp < 0 else "+") + e


def _fmt_f(ds: str, dp: int, neg: bool) -> str:
    if dp <= 0:
        body = "0." + "0" * -dp + ds
    elif dp >= len(ds):
        body = ds + "0" * (dp - len(ds))
    else:
        body = ds[:dp] + "." + ds[dp:]
    return ("-" if neg else "") + body


def go_float(f: float) -> str:
    """fmt's %v of a float64 (strconv 'g', shortest): 1.5, 1e+06, 1.234567e+06."""
    if math.isnan(f) or math.isinf(f):
        return "NaN" if math.isnan(f) else ("+Inf" if f > 0 else "-Inf")
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    ds, dp, neg = _digits(f)
    if not -4 <= dp - 1 < 6:  # shortest %g switches to e-notation outside [1e-4, 1e6)
        return _fmt_e(ds, dp, neg, short_exp=False)
    return _fmt_f(ds, dp, neg)


def _json_float(f: float) -> str:
    """encoding/json's float64: plain decimals unless tiny or huge, then e-notation without padding."""
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    ds, dp, neg = _digits(f)
    if abs(f) < 1e-6 or abs(f) >= 1e21:
        return _fmt_e(ds, dp, neg, short_exp=True)
    return _fmt_f(ds, dp, neg)


def _go_json(value: Any) -> str:
    """json.Marshal of decoded JSON: compact, sorted keys, HTML-safe escapes, Go number spelling."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, str):
        return go_json_escape(json.dumps(value, ensure_ascii=False))
    if isinstance(value, Mapping):
        members = (f"{_go_json(str(k))}:{_go_json(value[k])}" for k in sorted(value, key=str))
        return "{" + ",".join(members) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_go_json(v) for v in value) + "]"
    return _go_json(str(value))


# ---------------------------------------------------------------------------------------------------------
# JSONPath, the subset CRD printer columns use (k8s.io/client-go/util/jsonpath, missing keys allowed)


class JSONPathError(ValueError):
    """The path cannot be parsed or evaluated; a printer column then shows a null cell."""


Step = tuple[Any, ...]


def _parse_path(text: str) -> list[Step]:
    s = text.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    if s.startswith("$"):
        s = s[1:]
    steps: list[Step] = []
    i, n = 0, len(s)
    while i < n:
        if s.startswith("..", i):
            steps.append(("recurse",))
            i += 2
            if i < n and s[i] == "[":
                continue
            i = _parse_name(s, i, steps)
        elif s[i] == ".":
            i = _parse_name(s, i + 1, steps)
        elif s[i] == "[":
            i = _parse_bracket(s, i, steps)
        else:
            raise JSONPathError(f"unrecognized character in action: {s[i]!r}")
    return steps


def _parse_name(s: str, i: int, steps: list[Step]) -> int:
    out: list[str] = []
    while i < len(s) and s[i] not in ".[]":
        if s[i] == "\\" and i + 1 < len(s):
            out.append(s[i + 1])
            i += 2
            continue
        out.append(s[i])
        i += 1
    name = "".join(out)
    if not name:
        # A lone trailing dot (`{.}`) means the current node.
        if i >= len(s):
            return i
        raise JSONPathError("empty field name")
    steps.append(("wild",) if name == "*" else ("field", name))
    return i


def _bracket_end(s: str, i: int) -> int:
    """Index of the `]` closing the bracket opened at i, skipping quoted text and parentheses."""
    depth, quote = 0, ""
    for j in range(i + 1, len(s)):
        c = s[j]
        if quote:
            if c == "\\":
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "]" and depth == 0:
            return j
    raise JSONPathError("unterminated array")


def _split_top(text: str, sep: str) -> list[str]:
    parts, start, quote = [], 0, ""
    for j, c in enumerate(text):
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == sep:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return parts


def _unquote(text: str) -> str | None:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    return None


def _parse_bracket(s: str, i: int, steps: list[Step]) -> int:
    end = _bracket_end(s, i)
    inner = s[i + 1 : end].strip()
    if inner == "*":
        steps.append(("wild",))
    elif inner.startswith("?"):
        body = inner[1:].strip()
        if not (body.startswith("(") and body.endswith(")")):
            raise JSONPathError(f"unrecognized filter: {inner}")
        steps.append(_parse_filter(body[1:-1].strip()))
    else:
        parts = _split_top(inner, ",")
        names = [_unquote(p) for p in parts]
        if all(n is not None for n in names):
            steps.append(("keys", [n for n in names if n is not None]))
        elif len(parts) == 1 and ":" in inner:
            nums = inner.split(":")
            if len(nums) > 3:
                raise JSONPathError(f"invalid slice: {inner}")
            try:
                bounds = [int(x) if x.strip() else None for x in nums] + [None] * (3 - len(nums))
            except ValueError:
                raise JSONPathError(f"invalid slice: {inner}") from None
            steps.append(("slice", *bounds))
        else:
            try:
                steps.append(("index", [int(p) for p in parts]))
            except ValueError:
                raise JSONPathError(f"invalid array index: {inner}") from None
    return end + 1


_FILTER_OPS = ("==", "!=", "<=", ">=", "<", ">")


def _parse_filter(body: str) -> Step:
    quote = ""
    for j, c in enumerate(body):
        if quote:
            if c == quote:
                quote = ""
            continue
        if c in "'\"":
            quote = c
            continue
        for op in _FILTER_OPS:
            if body.startswith(op, j):
                left, right = body[:j].strip(), body[j + len(op) :].strip()
                return ("filter", _parse_operand(left), op, _parse_operand(right))
    return ("filter", _parse_operand(body), None, None)


def _parse_operand(text: str) -> tuple[str, Any]:
    if text.startswith("@"):
        return ("path", _parse_path(text[1:]))
    quoted = _unquote(text)
    if quoted is not None:
        return ("value", quoted)
    if text in ("true", "false"):
        return ("value", text == "true")
    if text == "null":
        return ("value", None)
    try:
        return ("value", int(text))
    except ValueError:
        pass
    try:
        return ("value", float(text))
    except ValueError:
        raise JSONPathError(f"unrecognized filter operand: {text}") from None


def _descendants(value: Any) -> list[Any]:
    out = [value]
    if isinstance(value, Mapping):
        for k in sorted(value, key=str):
            out.extend(_descendants(value[k]))
    elif isinstance(value, list):
        for v in value:
            out.extend(_descendants(v))
    return out


def _compare(left: Any, op: str, right: Any) -> bool:
    num = (int, float)
    if (
        isinstance(left, num)
        and isinstance(right, num)
        and not isinstance(left, bool)
        and not isinstance(right, bool)
    ):
        pass
    elif type(left) is not type(right) or (op not in ("==", "!=") and not isinstance(left, str)):
        raise JSONPathError(f"incompatible types for comparison: {left!r} {op} {right!r}")
    if op == "==":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    if op == "<":
        return bool(left < right)
    if op == ">":
        return bool(left > right)
    if op == "<=":
        return bool(left <= right)
    return bool(left >= right)


def _eval(steps: Sequence[Step], values: list[Any]) -> list[Any]:
    for step in steps:
        kind = step[0]
        out: list[Any] = []
        for v in values:
            if kind == "field":
                if isinstance(v, Mapping) and step[1] in v:
                    out.append(v[step[1]])
            elif kind == "keys":
                if isinstance(v, Mapping):
                    out.extend(v[k] for k in step[1] if k in v)
            elif kind == "wild":
                if isinstance(v, Mapping):
                    out.extend(v[k] for k in sorted(v, key=str))
                elif isinstance(v, list):
                    out.extend(v)
            elif kind == "recurse":
                out.extend(_descendants(v))
            elif kind == "index":
                if not isinstance(v, list):
                    raise JSONPathError(f"{v!r} is not array or slice")
                for idx in step[1]:
                    j = idx + len(v) if idx < 0 else idx
                    if not 0 <= j < len(v):
                        raise JSONPathError(f"array index out of bounds: index {idx}, length {len(v)}")
                    out.append(v[j])
            elif kind == "slice":
                if not isinstance(v, list):
                    raise JSONPathError(f"{v!r} is not array or slice")
                start, stop, stride = step[1], step[2], step[3]
                if stride == 0:
                    raise JSONPathError("step must be > 0")
                out.extend(v[slice(start, stop, stride)])
            elif kind == "filter":
                if not isinstance(v, list):
                    raise JSONPathError(f"{v!r} is not array or slice and cannot be filtered")
                _, left, op, right = step
                for item in v:
                    lefts = _operand(left, item)
                    if op is None:
                        if lefts:
                            out.append(item)
                        continue
                    rights = _operand(right, item)
                    if lefts and rights and _compare(lefts[0], op, rights[0]):
                        out.append(item)
        values = out
    return values


def _operand(operand: tuple[str, Any], item: Any) -> list[Any]:
    kind, value = operand
    return _eval(value, [item]) if kind == "path" else [value]


def jsonpath_find(path: str, obj: Any) -> list[Any]:
    """All values `path` selects in `obj` (missing keys select nothing); JSONPathError if malformed."""
    try:
        return _eval(_parse_path(path), [obj])
    except RecursionError:
        raise JSONPathError("path nests too deeply") from None


# ---------------------------------------------------------------------------------------------------------
# Columns

_NAME_DESC = (
    "Name must be unique within a namespace; clients use it to refer to the object. "
    "More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
_CREATED_DESC = (
    "CreationTimestamp is the time the server created the object, in UTC RFC 3339. "
    "More info: https://git.k8s.io/community/contributors/devel/sig-architecture/"
    "api-conventions.md#metadata"
)


def _col(
    name: str, type_: str = "string", description: str = "", *, fmt: str = "", priority: int = 0
) -> Column:
    return {"name": name, "type": type_, "format": fmt, "description": description, "priority": priority}


_NAME = _col("Name", "string", _NAME_DESC, fmt="name")
_AGE = _col("Age", "string", _CREATED_DESC)
_CONTAINERS = _col("Containers", description="Names of each container in the template.", priority=1)
_IMAGES = _col("Images", description="Images referenced by each container in the template.", priority=1)

_POD_COLUMNS = [
    _NAME,
    _col("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
    _col("Status", description="The aggregate status of the containers in this pod."),
    _col("Restarts", description="How many times the pod's containers restarted, and when the last one did."),
    _AGE,
    _col("IP", description="The pod's primary IP address; empty until one is allocated.", priority=1),
    _col("Node", description="The node the pod is bound to.", priority=1),
    _col(
        "Nominated Node",
        description="The node the scheduler nominated while preempting for this pod.",
        priority=1,
    ),
    _col("Readiness Gates", description="Extra conditions evaluated for pod readiness.", priority=1),
]
_NODE_COLUMNS = [
    _NAME,
    _col("Status", description="The status of the node"),
    _col("Roles", description="The roles of the node"),
    _AGE,
    _col("Version", description="Kubelet version reported by the node."),
    _col("Internal-IP", description="Addresses reachable on the node.", priority=1),
    _col("External-IP", description="Addresses reachable on the node.", priority=1),
    _col("OS-Image", description="OS image reported by the node.", priority=1),
    _col("Kernel-Version", description="Kernel version reported by the node.", priority=1),
    _col("Container-Runtime", description="Container runtime version reported by the node.", priority=1),
]
_NAMESPACE_COLUMNS = [_NAME, _col("Status", description="The status of the namespace"), _AGE]
_CONFIGMAP_COLUMNS = [_NAME, _col("Data", description="Number of data and binaryData keys."), _AGE]
_SECRET_COLUMNS = [
    _NAME,
    _col("Type", description="Lets programs handle the secret's data by kind."),
    _col("Data", description="Number of data keys."),
    _AGE,
]
_SERVICEACCOUNT_COLUMNS = [_NAME, _col("Secrets", description="Number of secrets listed."), _AGE]
_LEASE_COLUMNS = [_NAME, _col("Holder", description="The current holder of the lease."), _AGE]
_PDB_COLUMNS = [
    _NAME,
    _col("Min Available", description="The minimum number of pods that must be available."),
    _col("Max Unavailable", description="The maximum number of pods that may be unavailable."),
    _col("Allowed Disruptions", "integer", "Calculated number of pods that may be disrupted at this time."),
    _AGE,
]
_DEPLOYMENT_COLUMNS = [
    _NAME,
    _col("Ready", description="Number of the pod with ready state"),
    _col("Up-to-date", description="Pods that run the newest template."),
    _col("Available", description="Pods available for at least minReadySeconds."),
    _AGE,
    _CONTAINERS,
    _IMAGES,
    _col("Selector", description="Label query over the pods the deployment manages.", priority=1),
]
_JOB_COLUMNS = [
    _NAME,
    _col("Status", description="Status of the job."),
    _col("Completions", description="The desired number of successfully finished pods the job should be run with."),
    _col("Duration", description="Time required to complete the job."),
    _AGE,
    _CONTAINERS,
    _IMAGES,
    _col("Selector", description="A label query over pods that should match the pod count.", priority=1),
]
_EVENT_COLUMNS = [
    _col("Last Seen", description="When the event was last observed."),
    _col("Type", description="Type of this event (Normal, Warning)."),
    _col("Reason", description="Short, machine understandable reason for the event."),
    _col("Object", description="The object this event is about."),
    _col("Subobject", description="Path to the part of the object the event concerns.", priority=1),
    _col("Source", description="The component reporting this event.", priority=1),
    _col("Message", description="A human-readable description of the event."),
    _col("First Seen", description="When the event was first recorded.", priority=1),
    _col("Count", description="How many times the event occurred.", priority=1),
    _col("Name", "string", _NAME_DESC, fmt="name", priority=1),
]


def _wide_template(selector_desc: str) -> list[Column]:
    """The priority-1 columns of controllers with a pod template: containers, images, selector."""
    return [_CONTAINERS, _IMAGES, _col("Selector", description=selector_desc, priority=1)]


def _replica_columns(what: str) -> list[Column]:
    """ReplicaSet and ReplicationController print the same desired/current/ready counts."""
    return [
        _NAME,
        _col("Desired", "integer", f"Number of replicas the {what} asks for."),
        _col("Current", "integer", f"Number of replicas the {what} has created."),
        _col("Ready", "integer", f"Number of the {what}'s replicas that are ready."),
        _AGE,
        *_wide_template(f"Label query over the pods the {what} manages."),
    ]


def _binding_columns(what: str) -> list[Column]:
    """RoleBinding and ClusterRoleBinding: the role, and (wide) the subjects split by kind."""
    return [
        _NAME,
        _col("Role", description="The role the binding grants, as Kind/name."),
        _AGE,
        _col("Users", description=f"Users in the {what}", priority=1),
        _col("Groups", description=f"Groups in the {what}", priority=1),
        _col("ServiceAccounts", description=f"ServiceAccounts in the {what}", priority=1),
    ]


_SERVICE_COLUMNS = [
    _NAME,
    _col("Type", description="How the service is exposed: ClusterIP, NodePort, LoadBalancer or ExternalName."),
    _col("Cluster-IP", description="The address the service has inside the cluster."),
    _col("External-IP", description="Addresses outside the cluster that reach the service."),
    _col("Port(s)", description="The ports the service exposes, with node ports where allocated."),
    _AGE,
    _col("Selector", description="Label query over the pods that back the service.", priority=1),
]
_ENDPOINTS_COLUMNS = [_NAME, _col("Endpoints", description="Addresses and ports that back the service."), _AGE]
_ENDPOINTSLICE_COLUMNS = [
    _NAME,
    _col("AddressType", description="The kind of address every endpoint of the slice has."),
    _col("Ports", description="The network ports the endpoints expose."),
    _col("Endpoints", description="The addresses of the slice's endpoints."),
    _AGE,
]
_PODTEMPLATE_COLUMNS = [
    _NAME,
    _col("Containers", description="Names of each container in the template."),
    _col("Images", description="Images referenced by each container in the template."),
    _col("Pod Labels", description="The labels for the pod template."),
]
_REPLICATIONCONTROLLER_COLUMNS = _replica_columns("replication controller")
_REPLICASET_COLUMNS = _replica_columns("replica set")
_STATEFULSET_COLUMNS = [
    _NAME,
    _col("Ready", description="Number of the pod with ready state"),
    _AGE,
    _CONTAINERS,
    _IMAGES,
]
_DAEMONSET_COLUMNS = [
    _NAME,
    _col("Desired", "integer", "Number of nodes that should run the daemon pod."),
    _col("Current", "integer", "Number of nodes that run at least one daemon pod and should."),
    _col("Ready", "integer", "Number of nodes whose daemon pod is ready."),
    _col("Up-to-date", "integer", "Number of nodes whose daemon pod runs the newest template."),
    _col("Available", "integer", "Number of nodes whose daemon pod has been ready for minReadySeconds."),
    _col("Node Selector", description="The node labels a node needs to run the daemon pod."),
    _AGE,
    *_wide_template("Label query over the pods the daemon set manages."),
]
_CRONJOB_COLUMNS = [
    _NAME,
    _col("Schedule", description="The schedule in Cron format."),
    _col("Timezone", description="The time zone the schedule is read in."),
    _col("Suspend", "boolean", "Whether later runs are suspended."),
    _col("Active", "integer", "Number of jobs of this cron job that are running."),
    _col("Last Schedule", description="When a job was last scheduled."),
    _AGE,
    *_wide_template("Label query over the pods of the jobs this cron job creates."),
]
_INGRESS_COLUMNS = [
    _NAME,
    _col("Class", description="The name of the IngressClass resource that should be used for additional configuration"),
    _col("Hosts", description="Hosts that incoming requests are matched against before the ingress rule"),
    _col("Address", description="Address is a list containing ingress points for the load-balancer"),
    _col("Ports", description="Ports of TLS configurations that open"),
    _AGE,
]
_INGRESSCLASS_COLUMNS = [
    _NAME,
    _col("Controller", description="Controller that is responsible for handling this class"),
    _col("Parameters", description="A reference to a resource with additional parameters"),
    _AGE,
]
_PERSISTENTVOLUME_COLUMNS = [
    _NAME,
    _col("Capacity", description="The storage capacity of the volume."),
    _col("Access Modes", description="The ways the volume can be mounted."),
    _col("Reclaim Policy", description="What happens to the volume when its claim is released."),
    _col("Status", description="The phase of the volume."),
    _col("Claim", description="The claim bound to the volume, as namespace/name."),
    _col("StorageClass", description="StorageClass of the pv"),
    _col("VolumeAttributesClass", description="VolumeAttributesClass of the pv"),
    _col("Reason", description="Why the volume is in its phase."),
    _AGE,
    _col("VolumeMode", description="Whether the volume is a filesystem or a raw block device.", priority=1),
]
_PERSISTENTVOLUMECLAIM_COLUMNS = [
    _NAME,
    _col("Status", description="The phase of the claim."),
    _col("Volume", description="The volume bound to the claim."),
    _col("Capacity", description="The storage capacity of the bound volume."),
    _col("Access Modes", description="The ways the bound volume can be mounted."),
    _col("StorageClass", description="StorageClass of the pvc"),
    _col("VolumeAttributesClass", description="VolumeAttributesClass of the pvc"),
    _AGE,
    _col("VolumeMode", description="Whether the claim wants a filesystem or a raw block device.", priority=1),
]
_RESOURCEQUOTA_COLUMNS = [
    _NAME,
    _col("Request", description="Request represents a minimum amount of cpu/memory that a container may consume."),
    _col(
        "Limit",
        description="Limits control the maximum amount of cpu/memory that a container may use independent of "
        "contention on the node.",
    ),
    _AGE,
]
_PRIORITYCLASS_COLUMNS = [
    _NAME,
    _col("Value", "integer", "The priority pods of this class get."),
    _col("Global-Default", "boolean", "Whether pods without a priority class get this one."),
    _AGE,
    _col("PreemptionPolicy", description="Whether pods of this class may preempt lower-priority pods."),
]
_STORAGECLASS_COLUMNS = [
    _NAME,
    _col("Provisioner", description="The volume plugin that provisions volumes of this class."),
    _col("ReclaimPolicy", description="What happens to a provisioned volume when its claim is released."),
    _col("VolumeBindingMode", description="When volumes are provisioned and bound."),
    _col("AllowVolumeExpansion", description="Whether claims of this class may grow."),
    _AGE,
]
_CSR_COLUMNS = [
    _NAME,
    _AGE,
    _col("SignerName", description="The signer asked to sign the certificate."),
    _col("Requestor", description="The user who created the request."),
    _col("RequestedDuration", description="How long the certificate is asked to be valid."),
    _col("Condition", description="Whether the request is approved, denied or failed, and issued."),
]
_APISERVICE_COLUMNS = [
    _NAME,
    _col("Service", description="The reference to the service that hosts this API endpoint."),
    _col("Available", description="Whether this service is available."),
    _AGE,
]
_CONTROLLERREVISION_COLUMNS = [
    _NAME,
    _col("Controller", description="Controller of the object"),
    _col("Revision", description="The revision number of the state the object holds."),
    _AGE,
]
_NETWORKPOLICY_COLUMNS = [
    _NAME,
    _col("Pod-Selector", description="Label query over the pods the policy applies to."),
    _AGE,
]
_ROLEBINDING_COLUMNS = _binding_columns("roleBinding")
_CLUSTERROLEBINDING_COLUMNS = _binding_columns("clusterRoleBinding")
_WEBHOOK_COLUMNS = [
    _NAME,
    _col("Webhooks", "integer", "Webhooks indicates the number of webhooks registered in this configuration"),
    _AGE,
]
_VAP_COLUMNS = [
    _NAME,
    _col(
        "Validations", "integer", "Validations indicates the number of validation rules defined in this configuration"
    ),
    _col("ParamKind", description="ParamKind specifies the kind of resources used to parameterize this policy"),
    _AGE,
]
_VAPB_COLUMNS = [
    _NAME,
    _col("PolicyName", description="The policy the binding binds."),
    _col("ParamRef", description="The parameter resource the binding configures the policy with."),
    _AGE,
]
_DEFAULT_COLUMNS = [_NAME, _col("Created At", "date", _CREATED_DESC)]


def _printer_columns(info: ResourceInfo) -> Sequence[Mapping[str, Any]]:
    """The CRD's additionalPrinterColumns, or the Age column the apiserver serves when it lists none."""
    age = {
        "name": "Age",
        "type": "date",
        "jsonPath": ".metadata.creationTimestamp",
        "description": _CREATED_DESC,
    }
    return info.printer_columns or [age]


def _custom_columns(info: ResourceInfo) -> list[Column]:
    cols = [_NAME]
    for c in _printer_columns(info):
        path = str(c.get("jsonPath", ""))
        desc = c.get("description") or f"Custom resource definition column (in JSONPath format): {path}"
        cols.append(
            _col(
                str(c.get("name", "")),
                str(c.get("type", "")),
                str(desc),
                fmt=str(c.get("format") or ""),
                priority=int(c.get("priority") or 0),
            )
        )
    return cols


# ---------------------------------------------------------------------------------------------------------
# Rows


def _g(obj: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)
    return obj


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    return _str(_g(obj, "metadata", "name"))


def _age(obj: Mapping[str, Any], now: datetime) -> str:
    return _since(_g(obj, "metadata", "creationTimestamp"), now)


def _later(current: datetime | None, candidate: Any) -> datetime | None:
    t = _parse_time(candidate)
    if t is None or _is_zero_time(t):
        return current
    return t if current is None or current < t else current


def _terminated_reason(term: Mapping[str, Any], prefix: str) -> str:
    if _str(term.get("reason")):
        return prefix + _str(term.get("reason"))
    if _int(term.get("signal")):
        return f"{prefix}Signal:{_int(term.get('signal'))}"
    return f"{prefix}ExitCode:{_int(term.get('exitCode'))}"


def _has_condition(conditions: list[Any], type_: str) -> bool:
    return any(_g(c, "type") == type_ and _g(c, "status") == "True" for c in conditions)


@dataclass
class _PodTally:
    """What printPod gathers from a pod's container statuses on the way to its READY, STATUS and RESTARTS."""

    reason: str
    ready: int = 0
    restarts: int = 0
    last_restart: datetime | None = None
    sidecar_restarts: int = 0
    last_sidecar_restart: datetime | None = None


def _tally_init_containers(t: _PodTally, status: Mapping[str, Any], init_count: int, sidecars: set[Any]) -> bool:
    """Count init containers' restarts and started sidecars; True while one is still initializing (the
    first that neither succeeded nor runs as a started sidecar), whose state becomes the reason."""
    for i, cs in enumerate(_list(status.get("initContainerStatuses"))):
        count = _int(_g(cs, "restartCount"))
        t.restarts += count
        finished = _g(cs, "lastState", "terminated", "finishedAt")
        t.last_restart = _later(t.last_restart, finished)
        is_sidecar = _g(cs, "name") in sidecars
        if is_sidecar:
            t.sidecar_restarts += count
            t.last_sidecar_restart = _later(t.last_sidecar_restart, finished)
        term, waiting = _g(cs, "state", "terminated"), _g(cs, "state", "waiting")
        if isinstance(term, Mapping) and _int(term.get("exitCode")) == 0:
            continue
        if is_sidecar and _g(cs, "started") is True:
            if _g(cs, "ready") is True:
                t.ready += 1
            continue
        if isinstance(term, Mapping):
            t.reason = _terminated_reason(term, "Init:")
        elif isinstance(waiting, Mapping) and _str(waiting.get("reason")) not in ("", "PodInitializing"):
            t.reason = "Init:" + waiting["reason"]
        else:
            t.reason = f"Init:{i}/{init_count}"
        return True
    return False


def _tally_containers(t: _PodTally, status: Mapping[str, Any], conditions: list[Any]) -> None:
    """Once initialized: restarts are the sidecars' and the containers', the first container (in spec
    order) waiting or terminated gives the reason, and running ready containers count as ready."""
    t.restarts, t.last_restart = t.sidecar_restarts, t.last_sidecar_restart
    has_running = False
    for cs in reversed(_list(status.get("containerStatuses"))):
        t.restarts += _int(_g(cs, "restartCount"))
        t.last_restart = _later(t.last_restart, _g(cs, "lastState", "terminated", "finishedAt"))
        term, waiting = _g(cs, "state", "terminated"), _g(cs, "state", "waiting")
        if isinstance(waiting, Mapping) and _str(waiting.get("reason")):
            t.reason = waiting["reason"]
        elif isinstance(term, Mapping):
            t.reason = _terminated_reason(term, "")
        elif _g(cs, "ready") is True and isinstance(_g(cs, "state", "running"), Mapping):
            has_running = True
            t.ready += 1
    if t.reason == "Completed" and has_running:
        t.reason = "Running" if _has_condition(conditions, "Ready") else "NotReady"


def _readiness_gates_text(spec: Mapping[str, Any], conditions: list[Any]) -> str:
    """READINESS GATES: how many of the pod's gates have a True condition."""
    gates = _list(spec.get("readinessGates"))
    if not gates:
        return "<none>"
    true_count = 0
    for gate in gates:
        for c in conditions:
            if _g(c, "type") == _g(gate, "conditionType"):
                true_count += _g(c, "status") == "True"
                break
    return f"{true_count}/{len(gates)}"


def _pod_row_conditions(phase: str) -> list[dict[str, str]]:
    """The row's Completed condition, which `kubectl get` uses to hide finished pods."""
    if phase == "Succeeded":
        return [
            {
                "type": "Completed",
                "status": "True",
                "reason": "Succeeded",
                "message": "The pod has completed successfully.",
            }
        ]
    if phase == "Failed":
        return [{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]
    return []


def _pod_row(pod: Mapping[str, Any], now: datetime) -> tuple[Cells, list[dict[str, str]]]:
    """printPod: READY counts ready containers (and started sidecars), STATUS is the most telling reason."""
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))
    init_specs = _list(spec.get("initContainers"))
    sidecar_specs = [c for c in init_specs if _g(c, "restartPolicy") == "Always"]
    total = len(_list(spec.get("containers"))) + len(sidecar_specs)
    conditions = _list(status.get("conditions"))
    phase = _str(status.get("phase"))
    t = _PodTally(reason=_str(status.get("reason")) or phase)
    for c in conditions:
        if _g(c, "type") == "PodScheduled" and _g(c, "reason") == "SchedulingGated":
            t.reason = "SchedulingGated"
    initializing = _tally_init_containers(t, status, len(init_specs), {_g(c, "name") for c in sidecar_specs})
    if not initializing or _has_condition(conditions, "Initialized"):
        _tally_containers(t, status, conditions)
    deleting = _g(pod, "metadata", "deletionTimestamp") is not None
    if deleting and status.get("reason") == "NodeLost":
        t.reason = "Unknown"
    elif deleting and phase not in ("Succeeded", "Failed"):
        t.reason = "Terminating"
    restarts_text = str(t.restarts)
    if t.restarts and t.last_restart is not None:
        restarts_text = f"{t.restarts} ({human_duration(now - t.last_restart)} ago)"
    ips = _list(status.get("podIPs"))
    pod_ip = _str(_g(ips[0], "ip")) if ips else _str(status.get("podIP"))
    cells: Cells = [
        _name(pod),
        f"{t.ready}/{total}",
        t.reason,
        restarts_text,
        _age(pod, now),
        pod_ip or "<none>",
        _str(spec.get("nodeName")) or "<none>",
        _str(status.get("nominatedNodeName")) or "<none>",
        _readiness_gates_text(spec, conditions),
    ]
    return cells, _pod_row_conditions(phase)


def _node_cells(node: Mapping[str, Any], now: datetime) -> Cells:
    by_type = {_g(c, "type"): c for c in _list(_g(node, "status", "conditions"))}
    status: list[str] = []
    if "Ready" in by_type:
        status.append("Ready" if _g(by_type["Ready"], "status") == "True" else "NotReady")
    else:
        status.append("Unknown")
    if _g(node, "spec", "unschedulable") is True:
        status.append("SchedulingDisabled")
    roles: set[str] = set()
    for k, v in _dict(_g(node, "metadata", "labels")).items():
        if k.startswith("node-role.kubernetes.io/") and len(k) > len("node-role.kubernetes.io/"):
            roles.add(k[len("node-role.kubernetes.io/") :])
        elif k == "kubernetes.io/role" and v:
            roles.add(str(v))
    info = _dict(_g(node, "status", "nodeInfo"))

    def address(kind: str) -> str:
        for a in _list(_g(node, "status", "addresses")):
            if _g(a, "type") == kind:
                return _str(_g(a, "address"))
        return "<none>"

    return [
        _name(node),
        ",".join(status),
        ",".join(sorted(roles)) or "<none>",
        _age(node, now),
        _str(info.get("kubeletVersion")),
        address("InternalIP"),
        address("ExternalIP"),
        _str(info.get("osImage")) or "<unknown>",
        _str(info.get("kernelVersion")) or "<unknown>",
        _str(info.get("containerRuntimeVersion")) or "<unknown>",
    ]


def _int_or_string(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "N/A"
    return str(value)


def _deployment_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    return [
        _name(obj),
        f"{_int(status.get('readyReplicas'))}/{_int(spec.get('replicas'), 1)}",
        _int(status.get("updatedReplicas")),
        _int(status.get("availableReplicas")),
        _age(obj, now),
        *_template_cells(spec, formatted=False),
    ]


def _container_cells(pod_spec: Any) -> Cells:
    """layoutContainerCells: the containers' names, and their images, each joined with commas."""
    containers = _list(_g(pod_spec, "containers"))
    return [
        ",".join(_str(_g(c, "name")) for c in containers),
        ",".join(_str(_g(c, "image")) for c in containers),
    ]


def _selector_text(selector: Any, *, formatted: bool = True) -> str:
    """A label selector's string form. metav1.FormatLabelSelector (`formatted`, most workloads) prints `<none>`
    for a selector without terms and `<error>` for a malformed one; the Deployment printer prints the bare
    string, empty or `<invalid>`."""
    try:
        text = str(label_selector_from_object(selector))
    except ValueError:
        return "<error>" if formatted else "<invalid>"
    return (text or "<none>") if formatted else text


def _template_cells(spec: Mapping[str, Any], *, formatted: bool = True) -> Cells:
    """The wide columns of workload kinds: the template's container names and images, and the selector."""
    return [*_container_cells(_g(spec, "template", "spec")), _selector_text(spec.get("selector"), formatted=formatted)]


def _job_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """kubectl's job printer: status by condition precedence, `succeeded/completions`, run duration."""
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    conds = _list(status.get("conditions"))
    if _has_condition(conds, "Complete"):
        state = "Complete"
    elif _has_condition(conds, "Failed"):
        state = "Failed"
    elif _g(obj, "metadata", "deletionTimestamp"):
        state = "Terminating"
    elif _has_condition(conds, "Suspended"):
        state = "Suspended"
    elif _has_condition(conds, "FailureTarget"):
        state = "FailureTarget"
    elif _has_condition(conds, "SuccessCriteriaMet"):
        state = "SuccessCriteriaMet"
    else:
        state = "Running"
    succeeded = _int(status.get("succeeded"))
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{_int(spec.get('completions'))}"
    elif _int(spec.get("parallelism"), 1) > 1:
        completions = f"{succeeded}/1 of {_int(spec.get('parallelism'))}"
    else:
        completions = f"{succeeded}/1"
    started = _parse_time(status.get("startTime"))
    finished = _parse_time(status.get("completionTime"))
    duration = "" if started is None else human_duration((finished or now) - started)
    return [
        _name(obj),
        state,
        completions,
        duration,
        _age(obj, now),
        *_template_cells(spec),
    ]


def _event_cells(ev: Mapping[str, Any], now: datetime) -> Cells:
    first = _since(ev.get("firstTimestamp"), now)
    if _is_zero_time(_parse_time(ev.get("firstTimestamp"))):
        first = _since(ev.get("eventTime"), now)
    last = _since(ev.get("lastTimestamp"), now)
    if _is_zero_time(_parse_time(ev.get("lastTimestamp"))):
        last = first
    count = _int(ev.get("count"))
    series = ev.get("series")
    if isinstance(series, Mapping):
        last = _since(series.get("lastObservedTime"), now)
        count = _int(series.get("count"))
    elif count == 0:
        count = 1
    involved = _dict(ev.get("involvedObject"))
    kind = _str(involved.get("kind")).lower()
    target = f"{kind}/{involved['name']}" if _str(involved.get("name")) else kind
    component = _str(_g(ev, "source", "component")) or _str(ev.get("reportingComponent"))
    instance = _str(_g(ev, "source", "host")) or _str(ev.get("reportingInstance"))
    source = f"{component}, {instance}" if instance else component
    return [
        last,
        _str(ev.get("type")),
        _str(ev.get("reason")),
        target,
        _str(involved.get("fieldPath")),
        source,
        _str(ev.get("message")).strip(),
        first,
        count,
        _name(ev),
    ]


# Printed the way kube-apiserver's printers print them. A few fields the apiserver always defaults on write
# (replicas, a service port's protocol, a volume's phase, mode and reclaim policy, ...) are read as that
# default when absent, so a row shows what the same object shows on a real cluster.


def _labels_text(labels: Any) -> str:
    """labels.FormatLabels: `k=v` pairs sorted by key and joined with commas, `<none>` for none."""
    pairs = _dict(labels)
    return ",".join(f"{k}={_str(pairs[k])}" for k in sorted(pairs)) or "<none>"


def _quantity(value: Any) -> str:
    """resource.Quantity.String(): canonical text ("1024Mi" is "1Gi"); an absent quantity is "0"."""
    if value is None:
        return "0"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return _str(value)
    try:
        return quantity.canonical(value if isinstance(value, str) else str(value))
    except ValueError:
        return str(value)


def _more(items: list[str], total: int, limit: int = 3) -> str:
    """The printers' short lists: the first `limit` items, then ` + N more...` for the rest."""
    shown = ",".join(items[:limit])
    return f"{shown} + {total - limit} more..." if total > limit else shown


def _host_port(host: str, port: Any) -> str:
    """net.JoinHostPort: an IPv6 address is bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _service_ports(ports: list[Any]) -> str:
    """`80/TCP`, or `80:30080/TCP` once a node port is allocated; `<none>` for a service without ports."""
    pieces = []
    for p in ports:
        protocol = _str(_g(p, "protocol")) or "TCP"
        node_port = _int(_g(p, "nodePort"))
        port = _int(_g(p, "port"))
        pieces.append(f"{port}:{node_port}/{protocol}" if node_port > 0 else f"{port}/{protocol}")
    return ",".join(pieces) or "<none>"


def _load_balancer_text(status: Any) -> str:
    """The load balancer's ingress points (IP, else hostname), sorted and deduplicated. The apiserver renders
    Tables wide, so the text is never clipped."""
    points = {_str(_g(i, "ip")) or _str(_g(i, "hostname")) for i in _list(_g(status, "loadBalancer", "ingress"))}
    return ",".join(sorted(points - {""}))


def _service_external_ip(spec: Mapping[str, Any], status: Any, type_: str) -> str:
    """getServiceExternalIP: external IPs for ClusterIP and NodePort services, the load balancer's points
    (then the external IPs, or `<pending>` without either) for LoadBalancer, the DNS name for ExternalName."""
    external = [_str(ip) for ip in _list(spec.get("externalIPs"))]
    if type_ in ("ClusterIP", "NodePort"):
        return ",".join(external) or "<none>"
    if type_ == "LoadBalancer":
        lb = _load_balancer_text(status)
        if external:
            return ",".join([*(lb.split(",") if lb else []), *external])
        return lb or "<pending>"
    if type_ == "ExternalName":
        return _str(spec.get("externalName"))
    return "<unknown>"


def _service_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printService. The apiserver copies clusterIP into clusterIPs, so either one gives the first address."""
    spec = _dict(obj.get("spec"))
    type_ = _str(spec.get("type")) or "ClusterIP"
    ips = _list(spec.get("clusterIPs"))
    cluster_ip = (_str(ips[0]) if ips else _str(spec.get("clusterIP"))) or "<none>"
    return [
        _name(obj),
        type_,
        cluster_ip,
        _service_external_ip(spec, obj.get("status"), type_),
        _service_ports(_list(spec.get("ports"))),
        _age(obj, now),
        _labels_text(spec.get("selector")),
    ]


def _endpoints_text(subsets: list[Any]) -> str:
    """`ip:port` for each address and port (bare IPs for a subset without ports), the first three shown."""
    if not subsets:
        return "<none>"
    shown: list[str] = []
    total = 0
    for subset in subsets:
        addresses = [_str(_g(a, "ip")) for a in _list(_g(subset, "addresses"))]
        ports = _list(_g(subset, "ports"))
        if not ports:
            total += len(addresses)
            shown.extend(addresses)
        for port in ports:
            total += len(addresses)
            shown.extend(_host_port(ip, _int(_g(port, "port"))) for ip in addresses)
    return _more(shown, total)


def _endpoint_slice_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printEndpointSlice: ports by number (else name, else `*`), endpoint addresses; `<unset>` for none."""
    ports = []
    for p in _list(obj.get("ports")):
        number, name = _g(p, "port"), _g(p, "name")
        numbered = isinstance(number, int) and not isinstance(number, bool)
        ports.append(str(number) if numbered else name if isinstance(name, str) else "*")
    addresses = [_str(a) for e in _list(obj.get("endpoints")) for a in _list(_g(e, "addresses"))]
    return [
        _name(obj),
        _str(obj.get("addressType")),
        _more(ports, len(ports)) or "<unset>",
        _more(addresses, len(addresses)) or "<unset>",
        _age(obj, now),
    ]


def _pod_template_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printPodTemplate: containers, images and the template's labels, and no Age column."""
    template = _dict(obj.get("template"))
    return [_name(obj), *_container_cells(template.get("spec")), _labels_text(_g(template, "metadata", "labels"))]


def _replication_controller_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printReplicationController. An absent selector defaults to the template's labels on write."""
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    selector = spec.get("selector") or _g(spec, "template", "metadata", "labels")
    return [
        _name(obj),
        _int(spec.get("replicas"), 1),
        _int(status.get("replicas")),
        _int(status.get("readyReplicas")),
        _age(obj, now),
        *_container_cells(_g(spec, "template", "spec")),
        _labels_text(selector),
    ]


def _replica_set_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printReplicaSet: desired (spec.replicas, 1 by default), current and ready replica counts."""
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    return [
        _name(obj),
        _int(spec.get("replicas"), 1),
        _int(status.get("replicas")),
        _int(status.get("readyReplicas")),
        _age(obj, now),
        *_template_cells(spec),
    ]


def _stateful_set_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printStatefulSet: READY is `ready/desired`; its wide columns have no selector."""
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    return [
        _name(obj),
        f"{_int(status.get('readyReplicas'))}/{_int(spec.get('replicas'), 1)}",
        _age(obj, now),
        *_container_cells(_g(spec, "template", "spec")),
    ]


def _daemon_set_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printDaemonSet: the five scheduling counts from status and the template's node selector."""
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    return [
        _name(obj),
        *(
            _int(status.get(k))
            for k in (
                "desiredNumberScheduled",
                "currentNumberScheduled",
                "numberReady",
                "updatedNumberScheduled",
                "numberAvailable",
            )
        ),
        _labels_text(_g(spec, "template", "spec", "nodeSelector")),
        _age(obj, now),
        *_template_cells(spec),
    ]


def _bool_text(value: Any) -> str:
    """printBoolPtr: `True`, `False`, or `<unset>`."""
    return "<unset>" if not isinstance(value, bool) else "True" if value else "False"


def _cron_job_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printCronJob. `suspend` defaults to false on write, so an absent one prints False."""
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    last = status.get("lastScheduleTime")
    suspend, time_zone = spec.get("suspend"), spec.get("timeZone")
    return [
        _name(obj),
        _str(spec.get("schedule")),
        time_zone if isinstance(time_zone, str) else "<none>",
        _bool_text(False if suspend is None else suspend),
        len(_list(status.get("active"))),
        "<none>" if last is None else _since(last, now),
        _age(obj, now),
        *_template_cells(_dict(_g(spec, "jobTemplate", "spec"))),
    ]


def _ingress_hosts(rules: list[Any]) -> str:
    """formatHosts: the hosts of the rules that name one, `*` if none does. Three are shown; once a fourth
    rule follows them, `+ N more...` counts every rule past the third, with a host or without."""
    hosts: list[str] = []
    for rule in rules:
        if len(hosts) == 3:
            return f"{','.join(hosts)} + {len(rules) - 3} more..."
        if _str(_g(rule, "host")):
            hosts.append(_str(_g(rule, "host")))
    return ",".join(hosts) or "*"


def _ingress_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printIngress: the class (`<none>` without one), hosts, load balancer address, and `80` or `80, 443`
    depending on whether the ingress terminates TLS."""
    spec = _dict(obj.get("spec"))
    class_name = spec.get("ingressClassName")
    return [
        _name(obj),
        class_name if isinstance(class_name, str) else "<none>",
        _ingress_hosts(_list(spec.get("rules"))),
        _load_balancer_text(obj.get("status")),
        "80, 443" if _list(spec.get("tls")) else "80",
        _age(obj, now),
    ]


def _ingress_class_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printIngressClass: parameters as `Kind.apiGroup/name` (`Kind/name` without a group)."""
    spec = _dict(obj.get("spec"))
    params = spec.get("parameters")
    text = "<none>"
    if isinstance(params, Mapping):
        group = params.get("apiGroup")
        kind = _str(params.get("kind")) + (f".{group}" if isinstance(group, str) else "")
        text = f"{kind}/{_str(params.get('name'))}"
    return [_name(obj), _str(spec.get("controller")), text, _age(obj, now)]


def _access_modes(modes: Any) -> str:
    """GetAccessModesAsString: each mode once, always in the order RWO, ROX, RWX, RWOP."""
    present = {m for m in _list(modes) if isinstance(m, str)}
    order = (("ReadWriteOnce", "RWO"), ("ReadOnlyMany", "ROX"), ("ReadWriteMany", "RWX"), ("ReadWriteOncePod", "RWOP"))
    return ",".join(short for mode, short in order if mode in present)


def _storage_class_of(obj: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """The beta storage-class annotation wins over spec.storageClassName, as the storage helpers read it."""
    annotations = _dict(_g(obj, "metadata", "annotations"))
    if "volume.beta.kubernetes.io/storage-class" in annotations:
        return _str(annotations["volume.beta.kubernetes.io/storage-class"])
    return _str(spec.get("storageClassName"))


def _volume_phase(obj: Mapping[str, Any]) -> str:
    """A volume's or claim's phase, `Terminating` once it is being deleted; phases default to Pending."""
    if _g(obj, "metadata", "deletionTimestamp") is not None:
        return "Terminating"
    return _str(_g(obj, "status", "phase")) or "Pending"


def _attributes_class(spec: Mapping[str, Any]) -> str:
    """The VolumeAttributesClass name; `<unset>` only when the field is absent (an empty name prints blank)."""
    name = spec.get("volumeAttributesClassName")
    return name if isinstance(name, str) else "<unset>"


def _persistent_volume_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printPersistentVolume. Reclaim policy (Retain) and volume mode (Filesystem) default on write."""
    spec = _dict(obj.get("spec"))
    claim = spec.get("claimRef")
    return [
        _name(obj),
        _quantity(_g(spec, "capacity", "storage")),
        _access_modes(spec.get("accessModes")),
        _str(spec.get("persistentVolumeReclaimPolicy")) or "Retain",
        _volume_phase(obj),
        f"{_str(_g(claim, 'namespace'))}/{_str(_g(claim, 'name'))}" if isinstance(claim, Mapping) else "",
        _storage_class_of(obj, spec),
        _attributes_class(spec),
        _str(_g(obj, "status", "reason")),
        _age(obj, now),
        _str(spec.get("volumeMode")) or "Filesystem",
    ]


def _persistent_volume_claim_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printPersistentVolumeClaim: capacity and access modes only once the claim names its volume."""
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    volume = _str(spec.get("volumeName"))
    return [
        _name(obj),
        _volume_phase(obj),
        volume,
        _quantity(_g(status, "capacity", "storage")) if volume else "",
        _access_modes(status.get("accessModes")) if volume else "",
        _storage_class_of(obj, spec),
        _attributes_class(spec),
        _age(obj, now),
        _str(spec.get("volumeMode")) or "Filesystem",
    ]


def _resource_quota_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printResourceQuota: `name: used/hard` for each hard limit in status, sorted by resource name;
    `limits.*` resources go to the Limit column, every other one to Request."""
    hard, used = _dict(_g(obj, "status", "hard")), _dict(_g(obj, "status", "used"))
    requests: list[str] = []
    limits: list[str] = []
    for resource in sorted(hard):
        pieces = resource.split(".")
        column = limits if len(pieces) > 1 and pieces[0] == "limits" else requests
        column.append(f"{resource}: {_quantity(used.get(resource))}/{_quantity(hard[resource])}")
    return [_name(obj), ", ".join(requests), ", ".join(limits), _age(obj, now)]


def _priority_class_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printPriorityClass. The preemption policy defaults to PreemptLowerPriority on write."""
    return [
        _name(obj),
        _int(obj.get("value")),
        obj.get("globalDefault") is True,
        _age(obj, now),
        _str(obj.get("preemptionPolicy")) or "PreemptLowerPriority",
    ]


_DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


def _storage_class_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printStorageClass: `(default)` after the name of the default class (either annotation, "true")."""
    annotations = _dict(_g(obj, "metadata", "annotations"))
    default = any(annotations.get(a) == "true" for a in _DEFAULT_CLASS_ANNOTATIONS)
    return [
        _name(obj) + (" (default)" if default else ""),
        _str(obj.get("provisioner")),
        _str(obj.get("reclaimPolicy")) or "Delete",
        _str(obj.get("volumeBindingMode")) or "Immediate",
        obj.get("allowVolumeExpansion") is True,
        _age(obj, now),
    ]


def _csr_condition(obj: Mapping[str, Any]) -> str:
    """Denied before Approved before Pending, then `,Failed` and `,Issued` (a certificate was written)."""
    types = {_str(_g(c, "type")) for c in _list(_g(obj, "status", "conditions"))}
    text = "Denied" if "Denied" in types else "Approved" if "Approved" in types else "Pending"
    if "Failed" in types:
        text += ",Failed"
    if _str(_g(obj, "status", "certificate")):
        text += ",Issued"
    return text


def _csr_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printCertificateSigningRequest: note Age comes second, and the requested duration is an age-like text."""
    spec = _dict(obj.get("spec"))
    seconds = spec.get("expirationSeconds")
    duration = human_duration(timedelta(seconds=seconds)) if isinstance(seconds, int) else "<none>"
    return [
        _name(obj),
        _age(obj, now),
        _str(spec.get("signerName")) or "<none>",
        _str(spec.get("username")),
        duration,
        _csr_condition(obj),
    ]


def _api_service_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """kube-aggregator's APIService table: the backing service (`Local` for none) and the Available
    condition, with its reason when it is not True."""
    service = _g(obj, "spec", "service")
    where = f"{_str(_g(service, 'namespace'))}/{_str(_g(service, 'name'))}" if isinstance(service, Mapping) else "Local"
    available = "Unknown"
    for c in _list(_g(obj, "status", "conditions")):
        if _g(c, "type") == "Available":
            status, reason = _str(_g(c, "status")), _str(_g(c, "reason"))
            available = f"{status} ({reason})" if status != "True" and reason else status
            break
    return [_name(obj), where, available, _age(obj, now)]


def _controller_of(obj: Mapping[str, Any]) -> str:
    """The controlling owner as `kind.group/name` in lower case (`kind/name` for the core group)."""
    for ref in _list(_g(obj, "metadata", "ownerReferences")):
        if _g(ref, "controller") is not True:
            continue
        api_version, kind = _str(_g(ref, "apiVersion")), _str(_g(ref, "kind"))
        group = api_version.split("/")[0] if "/" in api_version else ""
        group_kind = f"{kind}.{group}" if group else kind
        return f"{group_kind.lower()}/{_str(_g(ref, 'name'))}" if group_kind else _str(_g(ref, "name"))
    return "<none>"


def _controller_revision_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printControllerRevision: the controlling owner and the revision number."""
    return [_name(obj), _controller_of(obj), _int(obj.get("revision")), _age(obj, now)]


def _binding_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printRoleBinding / printClusterRoleBinding: `Kind/name` of the role, then the subjects by kind."""
    users: list[str] = []
    groups: list[str] = []
    accounts: list[str] = []
    for s in _list(obj.get("subjects")):
        kind, name = _g(s, "kind"), _str(_g(s, "name"))
        if kind == "ServiceAccount":
            accounts.append(f"{_str(_g(s, 'namespace'))}/{name}")
        elif kind == "User":
            users.append(name)
        elif kind == "Group":
            groups.append(name)
    ref = _dict(obj.get("roleRef"))
    return [
        _name(obj),
        f"{_str(ref.get('kind'))}/{_str(ref.get('name'))}",
        _age(obj, now),
        ", ".join(users),
        ", ".join(groups),
        ", ".join(accounts),
    ]


def _go_selector_struct(selector: Mapping[str, Any]) -> str:
    """A LabelSelector as its generated String() method prints it (the form a binding's paramRef shows)."""
    labels = _dict(selector.get("matchLabels"))
    label_text = "".join(f"{k}: {_str(labels[k])}," for k in sorted(labels))
    exprs = "".join(
        f"LabelSelectorRequirement{{Key:{_str(_g(e, 'key'))},Operator:{_str(_g(e, 'operator'))},"
        f"Values:[{' '.join(_str(v) for v in _list(_g(e, 'values')))}],}},"
        for e in _list(selector.get("matchExpressions"))
    )
    return (
        f"&LabelSelector{{MatchLabels:map[string]string{{{label_text}}},"
        f"MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}"
    )


def _param_ref_text(ref: Any) -> str:
    """`namespace/name`, `*/name` when the namespace is left to the request, the selector, or `<unset>`."""
    if not isinstance(ref, Mapping):
        return "<unset>"
    name, namespace = _str(ref.get("name")), _str(ref.get("namespace"))
    if name:
        return f"{namespace or '*'}/{name}"
    selector = ref.get("selector")
    return _go_selector_struct(selector) if isinstance(selector, Mapping) else "<unset>"


def _webhook_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """Mutating and validating webhook configurations print how many webhooks they hold."""
    return [_name(obj), len(_list(obj.get("webhooks"))), _age(obj, now)]


def _policy_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printValidatingAdmissionPolicy: the number of validations and the param kind as `apiVersion/Kind`."""
    spec = _dict(obj.get("spec"))
    kind = spec.get("paramKind")
    param_kind = f"{_str(kind.get('apiVersion'))}/{_str(kind.get('kind'))}" if isinstance(kind, Mapping) else "<unset>"
    return [_name(obj), len(_list(spec.get("validations"))), param_kind, _age(obj, now)]


def _policy_binding_cells(obj: Mapping[str, Any], now: datetime) -> Cells:
    """printValidatingAdmissionPolicyBinding: the policy and the parameter reference."""
    spec = _dict(obj.get("spec"))
    return [_name(obj), _str(spec.get("policyName")), _param_ref_text(spec.get("paramRef")), _age(obj, now)]


_PRINTERS: dict[tuple[str, str], tuple[list[Column], Callable[[Mapping[str, Any], datetime], Cells]]] = {
    ("", "Node"): (_NODE_COLUMNS, _node_cells),
    ("", "Namespace"): (
        _NAMESPACE_COLUMNS,
        lambda o, now: [_name(o), _str(_g(o, "status", "phase")), _age(o, now)],
    ),
    ("", "ConfigMap"): (
        _CONFIGMAP_COLUMNS,
        lambda o, now: [_name(o), len(_dict(o.get("data"))) + len(_dict(o.get("binaryData"))), _age(o, now)],
    ),
    ("", "Secret"): (
        _SECRET_COLUMNS,
        lambda o, now: [_name(o), _str(o.get("type")), len(_dict(o.get("data"))), _age(o, now)],
    ),
    ("", "ServiceAccount"): (
        _SERVICEACCOUNT_COLUMNS,
        lambda o, now: [_name(o), len(_list(o.get("secrets"))), _age(o, now)],
    ),
    ("", "Event"): (_EVENT_COLUMNS, _event_cells),
    ("coordination.k8s.io", "Lease"): (
        _LEASE_COLUMNS,
        lambda o, now: [_name(o), _str(_g(o, "spec", "holderIdentity")), _age(o, now)],
    ),
    ("policy", "PodDisruptionBudget"): (
        _PDB_COLUMNS,
        lambda o, now: [
            _name(o),
            _int_or_string(_g(o, "spec", "minAvailable")),
            _int_or_string(_g(o, "spec", "maxUnavailable")),
            _int(_g(o, "status", "disruptionsAllowed")),
            _age(o, now),
        ],
    ),
    ("apps", "Deployment"): (_DEPLOYMENT_COLUMNS, _deployment_cells),
    ("batch", "Job"): (_JOB_COLUMNS, _job_cells),
    ("", "Service"): (_SERVICE_COLUMNS, _service_cells),
    ("", "Endpoints"): (
        _ENDPOINTS_COLUMNS,
        lambda o, now: [_name(o), _endpoints_text(_list(o.get("subsets"))), _age(o, now)],
    ),
    ("discovery.k8s.io", "EndpointSlice"): (_ENDPOINTSLICE_COLUMNS, _endpoint_slice_cells),
    ("", "PodTemplate"): (_PODTEMPLATE_COLUMNS, _pod_template_cells),
    ("", "ReplicationController"): (_REPLICATIONCONTROLLER_COLUMNS, _replication_controller_cells),
    ("", "PersistentVolume"): (_PERSISTENTVOLUME_COLUMNS, _persistent_volume_cells),
    ("", "PersistentVolumeClaim"): (_PERSISTENTVOLUMECLAIM_COLUMNS, _persistent_volume_claim_cells),
    ("", "ResourceQuota"): (_RESOURCEQUOTA_COLUMNS, _resource_quota_cells),
    ("apps", "ReplicaSet"): (_REPLICASET_COLUMNS, _replica_set_cells),
    ("apps", "StatefulSet"): (_STATEFULSET_COLUMNS, _stateful_set_cells),
    ("apps", "DaemonSet"): (_DAEMONSET_COLUMNS, _daemon_set_cells),
    ("apps", "ControllerRevision"): (_CONTROLLERREVISION_COLUMNS, _controller_revision_cells),
    ("batch", "CronJob"): (_CRONJOB_COLUMNS, _cron_job_cells),
    ("networking.k8s.io", "Ingress"): (_INGRESS_COLUMNS, _ingress_cells),
    ("networking.k8s.io", "IngressClass"): (_INGRESSCLASS_COLUMNS, _ingress_class_cells),
    ("networking.k8s.io", "NetworkPolicy"): (
        _NETWORKPOLICY_COLUMNS,
        lambda o, now: [_name(o), _selector_text(_g(o, "spec", "podSelector") or {}), _age(o, now)],
    ),
    ("scheduling.k8s.io", "PriorityClass"): (_PRIORITYCLASS_COLUMNS, _priority_class_cells),
    ("storage.k8s.io", "StorageClass"): (_STORAGECLASS_COLUMNS, _storage_class_cells),
    ("certificates.k8s.io", "CertificateSigningRequest"): (_CSR_COLUMNS, _csr_cells),
    ("apiregistration.k8s.io", "APIService"): (_APISERVICE_COLUMNS, _api_service_cells),
    ("rbac.authorization.k8s.io", "RoleBinding"): (_ROLEBINDING_COLUMNS, _binding_cells),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): (_CLUSTERROLEBINDING_COLUMNS, _binding_cells),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"): (_WEBHOOK_COLUMNS, _webhook_cells),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"): (_WEBHOOK_COLUMNS, _webhook_cells),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"): (_VAP_COLUMNS, _policy_cells),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"): (_VAPB_COLUMNS, _policy_binding_cells),
}


def column_definitions(info: ResourceInfo) -> list[Column]:
    """The Table's columnDefinitions for this resource (fresh dicts, safe to modify)."""
    if info.is_custom:
        cols = _custom_columns(info)
    elif (info.group, info.kind) == ("", "Pod"):
        cols = _POD_COLUMNS
    elif (info.group, info.kind) in _PRINTERS:
        cols = _PRINTERS[(info.group, info.kind)][0]
    else:
        cols = _DEFAULT_COLUMNS
    return [dict(c) for c in cols]


def _custom_cell(column: Mapping[str, Any], obj: Mapping[str, Any], now: datetime) -> Any:
    """One additionalPrinterColumns cell: the first JSONPath result, typed by the column's type."""
    try:
        found = jsonpath_find(str(column.get("jsonPath", "")), obj)
    except JSONPathError:
        return None
    if not found:
        return None
    value = found[0]
    kind = column.get("type")
    if kind == "string":
        if value is None:
            return "<no value>"  # what Go's text printer makes of a JSON null
        if isinstance(value, (Mapping, list)):
            return _go_json(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return go_float(value)
        return str(value)
    if value is None:
        return None
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return int(value)
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value)
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if kind == "date":
        if not isinstance(value, str):
            return None
        if value in ("", "null"):
            return "<unknown>"
        t = _parse_time(value)
        if t is None:
            return "<invalid>"
        return "<unknown>" if _is_zero_time(t) else human_duration(now - t)
    return None


def _row(
    info: ResourceInfo, obj: Mapping[str, Any], include_object: str, api_version: str, now: datetime
) -> dict[str, Any]:
    conditions: list[dict[str, str]] = []
    if info.is_custom:
        cells: Cells = [_name(obj)] + [_custom_cell(c, obj, now) for c in _printer_columns(info)]
    elif (info.group, info.kind) == ("", "Pod"):
        cells, conditions = _pod_row(obj, now)
    elif (info.group, info.kind) in _PRINTERS:
        cells = _PRINTERS[(info.group, info.kind)][1](obj, now)
    else:
        cells = [_name(obj), _rfc3339(_g(obj, "metadata", "creationTimestamp"))]
    row: dict[str, Any] = {"cells": cells}
    if conditions:
        row["conditions"] = conditions
    if include_object == "None":
        row["object"] = None
    elif include_object == "Object":
        full = clone(dict(obj))
        full.setdefault("kind", info.kind)
        full.setdefault("apiVersion", info.api_version)
        row["object"] = full
    else:
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": api_version,
            "metadata": clone(_dict(obj.get("metadata"))),
        }
    return row


def _check_include_object(include_object: str) -> str:
    if include_object == "":
        return "Metadata"
    if include_object not in INCLUDE_OBJECT_VALUES:
        raise bad_request(
            "Unable to convert to Table as requested: includeObject: Invalid value: "
            f"{json.dumps(include_object)}: must be 'Metadata', 'Object', 'None', or empty"
        )
    return include_object


def render_table(
    info: ResourceInfo,
    items: Sequence[Mapping[str, Any]],
    *,
    resource_version: str,
    continue_token: str = "",
    remaining: int | None = None,
    include_object: str = "Metadata",
    include_headers: bool = True,
    api_version: str = TABLE_API_VERSION,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A Table of `items` (a list page, or one object for a get) with the list metadata given.

    `include_object` is the `includeObject` query parameter (400 BadRequest if not one of the
    allowed values); `include_headers=False` leaves columnDefinitions null, as watch events after
    the first do; `api_version` is `meta.k8s.io/v1beta1` if the client asked for that.
    """
    mode = _check_include_object(include_object)
    when = now or datetime.now(UTC)
    meta: dict[str, Any] = {}
    if resource_version:
        meta["resourceVersion"] = resource_version
    if continue_token:
        meta["continue"] = continue_token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": meta,
        "columnDefinitions": column_definitions(info) if include_headers else None,
        "rows": [_row(info, obj, mode, api_version, when) for obj in items],
    }


def render_table_row_event(
    info: ResourceInfo,
    obj: Mapping[str, Any],
    *,
    include_headers: bool = True,
    include_object: str = "Metadata",
    api_version: str = TABLE_API_VERSION,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The Table one watch event carries: one row, the object's resourceVersion as the Table's.

    Upstream sends column definitions only with a watch's first event; pass `include_headers=False`
    for the rest.
    """
    rv = _str(_g(obj, "metadata", "resourceVersion"))
    return render_table(
        info,
        [obj],
        resource_version=rv,
        include_object=include_object,
        include_headers=include_headers,
        api_version=api_version,
        now=now,
    )

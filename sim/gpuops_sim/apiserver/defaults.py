"""Defaults kube-apiserver gives built-in objects on every decode (create, update, patch), as the
SetDefaults_* functions of each API group's v1 package document them.

Pod templates get only the pod *spec* defaults: requests copied from limits, `enableServiceLinks` and the
admission plugins' fields (priority, service account, default tolerations) belong to Pods alone, so a
Deployment's template stays as its author wrote it plus the spec defaults (what `kubectl get deploy -o yaml`
shows). Fields the server owns at creation (uids, generated labels, initial status) are in
builtin.prepare_create; this module is pure defaulting and safe to run again on an object it already did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RBAC_GROUP = "rbac.authorization.k8s.io"
_VOLUME_SOURCES_WITH_MODE = ("secret", "configMap", "downwardAPI", "projected")
_DEFAULT_MODE = 0o644


def _obj(parent: Any, key: str) -> dict[str, Any] | None:
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else None


def _items(parent: Any, key: str) -> list[dict[str, Any]]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _sub(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """The object at `key`, made an empty one when absent or null (Go's nil struct pointer, defaulted)."""
    value = parent.get(key)
    if not isinstance(value, dict):
        value = parent[key] = {}
    return value


def _set(obj: dict[str, Any], key: str, value: Any) -> None:
    """Default a field that is absent, null or (for strings) empty, as Go's zero-value checks do."""
    if obj.get(key) in (None, ""):
        obj[key] = value


# ------------------------------------------------------------------------------------------ pod spec


def _image_pull_policy(image: str) -> str:
    """Always for an untagged or `:latest` image without a digest, else IfNotPresent."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _probe(probe: dict[str, Any] | None) -> None:
    if probe is None:
        return
    for key, value in (("timeoutSeconds", 1), ("periodSeconds", 10), ("successThreshold", 1),
                       ("failureThreshold", 3)):
        _set(probe, key, value)
    http = _obj(probe, "httpGet")
    if http is not None:
        _set(http, "path", "/")
        _set(http, "scheme", "HTTP")


def _env_field_refs(container: dict[str, Any]) -> None:
    for env in _items(container, "env"):
        ref = _obj(_obj(env, "valueFrom"), "fieldRef")
        if ref is not None:
            _set(ref, "apiVersion", "v1")


def container(c: dict[str, Any]) -> None:
    _set(c, "terminationMessagePath", "/dev/termination-log")
    _set(c, "terminationMessagePolicy", "File")
    _set(c, "imagePullPolicy", _image_pull_policy(str(c.get("image") or "")))
    for port in _items(c, "ports"):
        _set(port, "protocol", "TCP")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        _probe(_obj(c, probe))
    _env_field_refs(c)


def _volume(volume: dict[str, Any]) -> None:
    sources = [k for k in volume if k != "name" and volume[k] is not None]
    if not sources:
        volume["emptyDir"] = {}
    for key in _VOLUME_SOURCES_WITH_MODE:
        source = _obj(volume, key)
        if source is not None:
            _set(source, "defaultMode", _DEFAULT_MODE)
    for projection in _items(_obj(volume, "projected"), "sources"):
        token = _obj(projection, "serviceAccountToken")
        if token is not None:
            _set(token, "expirationSeconds", 3600)
    host_path = _obj(volume, "hostPath")
    if host_path is not None and host_path.get("type") is None:
        host_path["type"] = ""


def pod_spec(spec: dict[str, Any]) -> None:
    """SetDefaults_PodSpec and the defaults of what a spec holds (containers, volumes, probes, ports)."""
    _set(spec, "dnsPolicy", "ClusterFirst")
    _set(spec, "restartPolicy", "Always")
    if spec.get("securityContext") is None:
        spec["securityContext"] = {}
    _set(spec, "terminationGracePeriodSeconds", 30)
    _set(spec, "schedulerName", "default-scheduler")
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for c in _items(spec, key):
            container(c)
    for volume in _items(spec, "volumes"):
        _volume(volume)


def pod(obj: dict[str, Any]) -> None:
    """SetDefaults_Pod: the spec defaults plus what only a Pod gets."""
    spec = _obj(obj, "spec")
    if spec is None:
        return
    pod_spec(spec)
    for key in ("containers", "initContainers"):
        for c in _items(spec, key):
            resources = c.get("resources") if isinstance(c.get("resources"), dict) else None
            limits = _obj(resources, "limits")
            if resources is not None and limits:
                requests = resources.setdefault("requests", {}) or {}
                resources["requests"] = {**{k: v for k, v in limits.items()}, **requests}
    if spec.get("enableServiceLinks") is None:
        spec["enableServiceLinks"] = True
    if spec.get("hostNetwork"):
        for c in _items(spec, "containers") + _items(spec, "initContainers"):
            for port in _items(c, "ports"):
                _set(port, "hostPort", port.get("containerPort"))


def pod_template(template: dict[str, Any] | None) -> None:
    spec = _obj(template, "spec")
    if spec is not None:
        pod_spec(spec)


def _templated(*path: str) -> Callable[[dict[str, Any]], None]:
    """Defaults for a kind whose pod template sits at spec.<path...>.template."""
    def default(obj: dict[str, Any]) -> None:
        node: Any = _obj(obj, "spec")
        for key in path:
            node = _obj(node, key)
        pod_template(_obj(node, "template"))

    return default


# ------------------------------------------------------------------------------------------- apps


def deployment(obj: dict[str, Any]) -> None:
    spec = _sub(obj, "spec")
    _set(spec, "replicas", 1)
    strategy = _sub(spec, "strategy")
    _set(strategy, "type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = _sub(strategy, "rollingUpdate")
        _set(rolling, "maxUnavailable", "25%")
        _set(rolling, "maxSurge", "25%")
    _set(spec, "revisionHistoryLimit", 10)
    _set(spec, "progressDeadlineSeconds", 600)
    pod_template(_obj(spec, "template"))


def daemon_set(obj: dict[str, Any]) -> None:
    spec = _sub(obj, "spec")
    strategy = _sub(spec, "updateStrategy")
    _set(strategy, "type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = _sub(strategy, "rollingUpdate")
        _set(rolling, "maxUnavailable", 1)
        if rolling.get("maxSurge") is None:
            rolling["maxSurge"] = 0
    _set(spec, "revisionHistoryLimit", 10)
    pod_template(_obj(spec, "template"))


def stateful_set(obj: dict[str, Any]) -> None:
    spec = _sub(obj, "spec")
    _set(spec, "podManagementPolicy", "OrderedReady")
    strategy = _sub(spec, "updateStrategy")
    _set(strategy, "type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = _sub(strategy, "rollingUpdate")
        if rolling.get("partition") is None:
            rolling["partition"] = 0
    retention = _sub(spec, "persistentVolumeClaimRetentionPolicy")
    _set(retention, "whenDeleted", "Retain")
    _set(retention, "whenScaled", "Retain")
    _set(spec, "replicas", 1)
    _set(spec, "revisionHistoryLimit", 10)
    pod_template(_obj(spec, "template"))


def replica_set(obj: dict[str, Any]) -> None:
    spec = _sub(obj, "spec")
    _set(spec, "replicas", 1)
    pod_template(_obj(spec, "template"))


def replication_controller(obj: dict[str, Any]) -> None:
    """SetDefaults_ReplicationController: replicas, and selector and labels from the template's labels."""
    spec = _sub(obj, "spec")
    template = _obj(spec, "template")
    labels = (_obj(template, "metadata") or {}).get("labels") or {}
    if labels and not spec.get("selector"):
        spec["selector"] = dict(labels)
    meta = _sub(obj, "metadata")
    if labels and not meta.get("labels"):
        meta["labels"] = dict(labels)
    _set(spec, "replicas", 1)
    pod_template(template)


# ---------------------------------------------------------------------------------------- others


def cron_job(obj: dict[str, Any]) -> None:
    spec = _sub(obj, "spec")
    _set(spec, "concurrencyPolicy", "Allow")
    if spec.get("suspend") is None:
        spec["suspend"] = False
    _set(spec, "successfulJobsHistoryLimit", 3)
    _set(spec, "failedJobsHistoryLimit", 1)
    pod_template(_obj(_obj(_obj(spec, "jobTemplate"), "spec"), "template"))


def network_policy(obj: dict[str, Any]) -> None:
    spec = _sub(obj, "spec")
    for rule in _items(spec, "ingress") + _items(spec, "egress"):
        for port in _items(rule, "ports"):
            _set(port, "protocol", "TCP")
    if not spec.get("policyTypes"):
        spec["policyTypes"] = ["Ingress"] + (["Egress"] if spec.get("egress") else [])


def _rbac_binding(obj: dict[str, Any]) -> None:
    ref = _obj(obj, "roleRef")
    if ref is not None:
        _set(ref, "apiGroup", RBAC_GROUP)
    for subject in _items(obj, "subjects"):
        if subject.get("kind") in ("User", "Group"):
            _set(subject, "apiGroup", RBAC_GROUP)


def limit_range(obj: dict[str, Any]) -> None:
    """SetDefaults_LimitRangeItem: a container limit defaults to max, its request to the limit, then min."""
    for item in _items(_obj(obj, "spec"), "limits"):
        if item.get("type") != "Container":
            continue
        default, request = _sub(item, "default"), _sub(item, "defaultRequest")
        for key, value in (_obj(item, "max") or {}).items():
            default.setdefault(key, value)
        for source in (default, _obj(item, "min") or {}):
            for key, value in source.items():
                request.setdefault(key, value)


def _webhooks(mutating: bool) -> Callable[[dict[str, Any]], None]:
    """SetDefaults_{Mutating,Validating}Webhook: fail closed, equivalent matching, select everything, ten
    seconds, rules of any scope, services on 443."""
    def default(obj: dict[str, Any]) -> None:
        for hook in _items(obj, "webhooks"):
            _set(hook, "failurePolicy", "Fail")
            _set(hook, "matchPolicy", "Equivalent")
            for key in ("namespaceSelector", "objectSelector"):
                if hook.get(key) is None:
                    hook[key] = {}
            _set(hook, "timeoutSeconds", 10)
            if mutating:
                _set(hook, "reinvocationPolicy", "Never")
            for rule in _items(hook, "rules"):
                _set(rule, "scope", "*")
            service = _obj(_obj(hook, "clientConfig"), "service")
            if service is not None:
                _set(service, "port", 443)

    return default


def _ports_protocol(*path: str) -> Callable[[dict[str, Any]], None]:
    def default(obj: dict[str, Any]) -> None:
        groups: list[Any] = [obj]
        for key in path[:-1]:
            groups = [item for g in groups for item in _items(g, key)]
        for g in groups:
            for port in _items(g, path[-1]):
                _set(port, "protocol", "TCP")

    return default


def _volume_mode(obj: dict[str, Any]) -> None:
    spec = _sub(obj, "spec")
    _set(spec, "volumeMode", "Filesystem")


def persistent_volume(obj: dict[str, Any]) -> None:
    _volume_mode(obj)
    _set(_sub(obj, "spec"), "persistentVolumeReclaimPolicy", "Retain")


def node(obj: dict[str, Any]) -> None:
    """SetDefaults_NodeStatus: what a node reports no allocatable for is all allocatable."""
    status = _obj(obj, "status")
    if status is not None and status.get("allocatable") is None and isinstance(status.get("capacity"), dict):
        status["allocatable"] = dict(status["capacity"])


def _fields(**values: Any) -> Callable[[dict[str, Any]], None]:
    def default(obj: dict[str, Any]) -> None:
        for key, value in values.items():
            _set(obj, key, value)

    return default


DEFAULTERS: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("", "Pod"): pod,
    ("", "Node"): node,
    ("", "PodTemplate"): lambda obj: pod_template(_obj(obj, "template")),
    ("", "ReplicationController"): replication_controller,
    ("", "PersistentVolume"): persistent_volume,
    ("", "PersistentVolumeClaim"): _volume_mode,
    ("", "LimitRange"): limit_range,
    ("", "Endpoints"): _ports_protocol("subsets", "ports"),
    ("", "Secret"): _fields(type="Opaque"),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"): _webhooks(mutating=True),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"): _webhooks(mutating=False),
    ("apps", "Deployment"): deployment,
    ("apps", "DaemonSet"): daemon_set,
    ("apps", "StatefulSet"): stateful_set,
    ("apps", "ReplicaSet"): replica_set,
    ("batch", "Job"): _templated(),
    ("batch", "CronJob"): cron_job,
    ("discovery.k8s.io", "EndpointSlice"): _ports_protocol("ports"),
    ("networking.k8s.io", "NetworkPolicy"): network_policy,
    (RBAC_GROUP, "RoleBinding"): _rbac_binding,
    (RBAC_GROUP, "ClusterRoleBinding"): _rbac_binding,
    ("scheduling.k8s.io", "PriorityClass"): _fields(preemptionPolicy="PreemptLowerPriority"),
    ("storage.k8s.io", "StorageClass"): _fields(reclaimPolicy="Delete", volumeBindingMode="Immediate"),
}


def apply(group: str, kind: str, obj: dict[str, Any]) -> None:
    """Default `obj` in place (a kind without defaults is left alone)."""
    defaulter = DEFAULTERS.get((group, kind))
    if defaulter is not None:
        defaulter(obj)

"""What resources the emulator serves: names, scope, verbs and subresources, as discovery reports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass
class ResourceInfo:
    """One served resource of one group/version. CRDs add these at run time."""

    group: str
    version: str
    resource: str  # plural, lower case: "pods"
    kind: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    # subresource name -> (kind of its body, verbs)
    subresources: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # Whether spec changes bump metadata.generation (CRs and spec-bearing built-ins).
    has_generation: bool = False
    # Whether the object carries a status that only the status subresource may write.
    status_subresource: bool = False
    # Structural OpenAPI v3 schema of the whole object (CRDs; built-ins get one derived from models).
    schema: dict[str, Any] | None = None
    # CRD only: printer columns, selectable fields, and the CRD's name.
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    selectable_fields: tuple[str, ...] = ()
    crd_name: str = ""
    # Only writable through a POST that returns a result (tokenreviews, subjectaccessreviews).
    create_only: bool = False

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def api_version(self) -> str:
        return self.group_version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def is_custom(self) -> bool:
        return bool(self.crd_name)

    @property
    def storage_key(self) -> tuple[str, str]:
        """Objects are stored once per group/resource, whatever version is asked for."""
        return (self.group, self.resource)


_STD_SUB = ("get", "patch", "update")
_PROXY_VERBS = ("create", "delete", "get", "patch", "update")
STREAMING_SUBRESOURCES = ("exec", "attach", "portforward", "proxy")


def _r(
    group: str,
    version: str,
    resource: str,
    kind: str,
    namespaced: bool,
    *,
    short: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    sub: dict[str, tuple[str, tuple[str, ...]]] | None = None,
    generation: bool = False,
    verbs: tuple[str, ...] = ALL_VERBS,
    create_only: bool = False,
) -> ResourceInfo:
    subs = dict(sub or {})
    return ResourceInfo(
        group=group,
        version=version,
        resource=resource,
        kind=kind,
        singular=kind.lower(),
        namespaced=namespaced,
        short_names=short,
        categories=categories,
        verbs=verbs,
        subresources=subs,
        has_generation=generation,
        status_subresource="status" in subs,
        create_only=create_only,
    )


# A data table: one entry per built-in resource.
def builtin_resources() -> list[ResourceInfo]:
    """The built-in resources of a kube-apiserver that gpuops and its tests use."""
    return [
        _r(
            "", "v1", "namespaces", "Namespace", False, short=("ns",), sub={"status": ("Namespace", _STD_SUB)},
            # Upstream's namespace storage has no deletecollection.
            verbs=tuple(v for v in ALL_VERBS if v != "deletecollection"),
        ),
        _r(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            short=("po",),
            categories=("all",),
            sub={
                "status": ("Pod", _STD_SUB),
                "eviction": ("Eviction", ("create",)),
                "binding": ("Binding", ("create",)),
                "log": ("Pod", ("get",)),
                # Served only to say why not: no container runs a process (see podlog.refused).
                "exec": ("PodExecOptions", ("create", "get")),
                "attach": ("PodAttachOptions", ("create", "get")),
                "portforward": ("PodPortForwardOptions", ("create", "get")),
                "proxy": ("PodProxyOptions", _PROXY_VERBS),
            },
        ),
        _r("", "v1", "nodes", "Node", False, short=("no",),
           sub={"status": ("Node", _STD_SUB), "proxy": ("NodeProxyOptions", _PROXY_VERBS)}),
        _r("", "v1", "events", "Event", True, short=("ev",)),
        _r("", "v1", "configmaps", "ConfigMap", True, short=("cm",)),
        _r("", "v1", "secrets", "Secret", True),
        _r(
            "",
            "v1",
            "services",
            "Service",
            True,
            short=("svc",),
            categories=("all",),
            sub={"status": ("Service", _STD_SUB), "proxy": ("ServiceProxyOptions", _PROXY_VERBS)},
        ),
        # token: TokenRequest (`kubectl create token`), create only
        _r("", "v1", "serviceaccounts", "ServiceAccount", True, short=("sa",),
           sub={"token": ("TokenRequest", ("create",))}),
        _r("", "v1", "endpoints", "Endpoints", True, short=("ep",)),
        _r("", "v1", "limitranges", "LimitRange", True, short=("limits",)),
        _r("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, short=("pvc",),
           sub={"status": ("PersistentVolumeClaim", _STD_SUB)}),
        _r("", "v1", "persistentvolumes", "PersistentVolume", False, short=("pv",),
           sub={"status": ("PersistentVolume", _STD_SUB)}),
        _r("", "v1", "podtemplates", "PodTemplate", True),
        _r("", "v1", "replicationcontrollers", "ReplicationController", True, short=("rc",), categories=("all",),
           sub={"status": ("ReplicationController", _STD_SUB), "scale": ("Scale", _STD_SUB)}, generation=True),
        _r("", "v1", "resourcequotas", "ResourceQuota", True, short=("quota",),
           sub={"status": ("ResourceQuota", _STD_SUB)}),
        _r("coordination.k8s.io", "v1", "leases", "Lease", True),
        _r("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
        _r("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, short=("pc",)),
        _r("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, short=("sc",)),
        _r("certificates.k8s.io", "v1", "certificatesigningrequests", "CertificateSigningRequest", False,
           short=("csr",), sub={"status": ("CertificateSigningRequest", _STD_SUB),
                                "approval": ("CertificateSigningRequest", _STD_SUB)}),
        _r("apiregistration.k8s.io", "v1", "apiservices", "APIService", False, categories=("api-extensions",),
           sub={"status": ("APIService", _STD_SUB)}),
        _r(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            True,
            short=("pdb",),
            sub={"status": ("PodDisruptionBudget", _STD_SUB)},
            generation=True,
        ),
        _r(
            "batch",
            "v1",
            "jobs",
            "Job",
            True,
            categories=("all",),
            sub={"status": ("Job", _STD_SUB)},
            generation=True,
        ),
        _r(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            True,
            short=("deploy",),
            categories=("all",),
            sub={"status": ("Deployment", _STD_SUB), "scale": ("Scale", _STD_SUB)},
            generation=True,
        ),
        _r("apps", "v1", "replicasets", "ReplicaSet", True, short=("rs",), categories=("all",),
           sub={"status": ("ReplicaSet", _STD_SUB), "scale": ("Scale", _STD_SUB)}, generation=True),
        _r("apps", "v1", "statefulsets", "StatefulSet", True, short=("sts",), categories=("all",),
           sub={"status": ("StatefulSet", _STD_SUB), "scale": ("Scale", _STD_SUB)}, generation=True),
        _r("apps", "v1", "controllerrevisions", "ControllerRevision", True),
        _r("batch", "v1", "cronjobs", "CronJob", True, short=("cj",), categories=("all",),
           sub={"status": ("CronJob", _STD_SUB)}, generation=True),
        _r(
            "apps",
            "v1",
            "daemonsets",
            "DaemonSet",
            True,
            short=("ds",),
            categories=("all",),
            sub={"status": ("DaemonSet", _STD_SUB)},
            generation=True,
        ),
        _r(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            False,
            short=("crd", "crds"),
            categories=("api-extensions",),
            sub={"status": ("CustomResourceDefinition", _STD_SUB)},
            generation=True,
        ),
        # stored and served (kubectl apply -k installs one); the emulator has no pod network to enforce it on
        _r("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, short=("netpol",),
           generation=True),
        _r("networking.k8s.io", "v1", "ingresses", "Ingress", True, short=("ing",),
           sub={"status": ("Ingress", _STD_SUB)}, generation=True),
        _r("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False),
        _r("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
        _r("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
        _r("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
        _r("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
        _r(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            False,
            categories=("api-extensions",),
            generation=True,
        ),
        _r(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            False,
            categories=("api-extensions",),
            generation=True,
        ),
        _r(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicy",
            False,
            categories=("api-extensions",),
            sub={"status": ("ValidatingAdmissionPolicy", _STD_SUB)},
            generation=True,
        ),
        _r(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            False,
            categories=("api-extensions",),
            generation=True,
        ),
        _r(
            "authentication.k8s.io",
            "v1",
            "tokenreviews",
            "TokenReview",
            False,
            verbs=("create",),
            create_only=True,
        ),
        _r(
            "authorization.k8s.io",
            "v1",
            "subjectaccessreviews",
            "SubjectAccessReview",
            False,
            verbs=("create",),
            create_only=True,
        ),
        _r(
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            "SelfSubjectAccessReview",
            False,
            verbs=("create",),
            create_only=True,
        ),
    ]

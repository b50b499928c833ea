"""Authentication, request attributes, RBAC and the review APIs of the emulated API server.

Who may call what, with the same decisions and Forbidden messages as kube-apiserver.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuops_sim.apiserver import auth
from gpuops_sim.apiserver.auth import (
    ANONYMOUS_USER,
    Attributes,
    Authenticator,
    ObjectsRBAC,
    UserInfo,
    authorize,
    forbidden,
    request_attributes,
    self_subject_access_review,
    subject_access_review,
    token_review,
)
from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.protobuf import DecodeError, decode_object


def role(name: str, rules: list[dict[str, Any]], namespace: str = "", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    if "labels" in extra:
        meta["labels"] = extra.pop("labels")
    return {"kind": "Role" if namespace else "ClusterRole", "metadata": meta, "rules": rules, **extra}


def binding(
    name: str, ref_kind: str, ref_name: str, subjects: list[dict[str, Any]], namespace: str = ""
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": ref_kind, "name": ref_name},
        "subjects": subjects,
    }


def user(name: str, *groups: str) -> UserInfo:
    return UserInfo(name, groups=groups)


SA = UserInfo(
    "system:serviceaccount:team-a:budget", groups=("system:serviceaccounts", "system:serviceaccounts:team-a")
)


def attrs(u: UserInfo, method: str, path: str, **query: str) -> Attributes:
    return request_attributes(u, method, path, query)


# ----------------------------------------------------------------------------------------------------------
# Authentication


def test_bearer_token_maps_to_user_with_authenticated_group() -> None:
    a = Authenticator()
    a.add_token("s3cret", UserInfo("alice", "u1", ("devs",)))
    got = a.authenticate("Bearer s3cret")
    assert got == UserInfo("alice", "u1", ("devs", "system:authenticated"))
    assert a.authenticate("bearer s3cret") == got  # scheme is case-insensitive upstream
    assert a.authenticate("  Bearer s3cret  ") == got


def test_unknown_token_is_unauthorized_even_with_anonymous_allowed() -> None:
    a = Authenticator(allow_anonymous=True)
    assert a.authenticate("Bearer nope") is None
    err = auth.unauthorized()
    assert err.to_status() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


@pytest.mark.parametrize("header", [None, "", "Basic YWxpY2U6cHc=", "Bearer", "Bearer  s3cret"])
def test_headers_without_a_bearer_token_are_anonymous(header: str | None) -> None:
    a = Authenticator()
    a.add_token("s3cret", UserInfo("alice"))
    assert a.authenticate(header) == ANONYMOUS_USER
    assert ANONYMOUS_USER.username == "system:anonymous"
    assert ANONYMOUS_USER.groups == ("system:unauthenticated",)
    assert Authenticator(allow_anonymous=False).authenticate(header) is None


def test_service_account_tokens() -> None:
    a = Authenticator()
    t1 = a.service_account_token("team-a", "budget", uid="uid-1")
    t2 = a.service_account_token("team-a", "budget")
    assert t1 != t2 and len(t1) >= 32
    got = a.authenticate(f"Bearer {t1}")
    assert got is not None
    assert got.username == "system:serviceaccount:team-a:budget"
    assert got.uid == "uid-1"
    assert got.groups == ("system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated")
    a.remove_token(t1)
    assert a.authenticate(f"Bearer {t1}") is None


def test_user_info_is_hashable_and_serializes_like_go() -> None:
    u = UserInfo("bob", extra={"scopes": ("a",)})
    assert hash(u) == hash(UserInfo("bob", extra={"scopes": ("a",)}))
    assert u.to_dict() == {"username": "bob", "extra": {"scopes": ["a"]}}


# ----------------------------------------------------------------------------------------------------------
# Request attributes (RequestInfoFactory)

U = user("u")


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        # (verb, namespace, group, version, resource, subresource, name, resource_request)
        ("GET", "/api/v1/namespaces/ns/pods/p", {}, ("get", "ns", "", "v1", "pods", "", "p", True)),
        ("HEAD", "/api/v1/namespaces/ns/pods/p", {}, ("get", "ns", "", "v1", "pods", "", "p", True)),
        ("GET", "/api/v1/namespaces/ns/pods", {}, ("list", "ns", "", "v1", "pods", "", "", True)),
        ("GET", "/api/v1/pods", {}, ("list", "", "", "v1", "pods", "", "", True)),
        (
            "GET",
            "/api/v1/namespaces/ns/pods",
            {"watch": "true"},
            ("watch", "ns", "", "v1", "pods", "", "", True),
        ),
        ("GET", "/api/v1/pods", {"watch": "1"}, ("watch", "", "", "v1", "pods", "", "", True)),
        ("GET", "/api/v1/pods", {"watch": "false"}, ("list", "", "", "v1", "pods", "", "", True)),
        ("GET", "/api/v1/pods", {"watch": "0"}, ("list", "", "", "v1", "pods", "", "", True)),
        ("GET", "/api/v1/watch/namespaces/ns/pods", {}, ("watch", "ns", "", "v1", "pods", "", "", True)),
        ("GET", "/api/v1/watch/namespaces/ns/pods/p", {}, ("watch", "ns", "", "v1", "pods", "", "p", True)),
        # A list narrowed to one name by field selector is authorized as that name (resourceNames rules).
        (
            "GET",
            "/api/v1/namespaces/ns/pods",
            {"fieldSelector": "metadata.name=p"},
            ("list", "ns", "", "v1", "pods", "", "p", True),
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/pods",
            {"fieldSelector": "metadata.name==p", "watch": "true"},
            ("watch", "ns", "", "v1", "pods", "", "p", True),
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/pods",
            {"fieldSelector": "metadata.name!=p"},
            ("list", "ns", "", "v1", "pods", "", "", True),
        ),
        ("POST", "/api/v1/namespaces/ns/pods", {}, ("create", "ns", "", "v1", "pods", "", "", True)),
        ("PUT", "/api/v1/namespaces/ns/pods/p", {}, ("update", "ns", "", "v1", "pods", "", "p", True)),
        ("PATCH", "/api/v1/namespaces/ns/pods/p", {}, ("patch", "ns", "", "v1", "pods", "", "p", True)),
        ("DELETE", "/api/v1/namespaces/ns/pods/p", {}, ("delete", "ns", "", "v1", "pods", "", "p", True)),
        (
            "DELETE",
            "/api/v1/namespaces/ns/pods",
            {},
            ("deletecollection", "ns", "", "v1", "pods", "", "", True),
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns/pods/p/status",
            {},
            ("update", "ns", "", "v1", "pods", "status", "p", True),
        ),
        (
            "POST",
            "/api/v1/namespaces/ns/pods/p/eviction",
            {},
            ("create", "ns", "", "v1", "pods", "eviction", "p", True),
        ),
        # Namespaces themselves: the namespace of the request is the namespace's name.
        ("GET", "/api/v1/namespaces/ns", {}, ("get", "ns", "", "v1", "namespaces", "", "ns", True)),
        ("GET", "/api/v1/namespaces", {}, ("list", "", "", "v1", "namespaces", "", "", True)),
        ("POST", "/api/v1/namespaces", {}, ("create", "", "", "v1", "namespaces", "", "", True)),
        (
            "PUT",
            "/api/v1/namespaces/ns/status",
            {},
            ("update", "ns", "", "v1", "namespaces", "status", "ns", True),
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns/finalize",
            {},
            ("update", "ns", "", "v1", "namespaces", "finalize", "ns", True),
        ),
        ("DELETE", "/api/v1/namespaces/ns", {}, ("delete", "ns", "", "v1", "namespaces", "", "ns", True)),
        ("GET", "/api/v1/nodes/n1", {}, ("get", "", "", "v1", "nodes", "", "n1", True)),
        (
            "GET",
            "/apis/gpuops.io/v1alpha1/namespaces/ns/gpuworkloadbudgets/b",
            {},
            ("get", "ns", "gpuops.io", "v1alpha1", "gpuworkloadbudgets", "", "b", True),
        ),
        (
            "PATCH",
            "/apis/gpuops.io/v1alpha1/namespaces/ns/gpuworkloadbudgets/b/status",
            {},
            ("patch", "ns", "gpuops.io", "v1alpha1", "gpuworkloadbudgets", "status", "b", True),
        ),
        (
            "GET",
            "/apis/gpuops.io/v1alpha1/spotpools",
            {},
            ("list", "", "gpuops.io", "v1alpha1", "spotpools", "", "", True),
        ),
        (
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {},
            ("create", "", "authorization.k8s.io", "v1", "subjectaccessreviews", "", "", True),
        ),
        (
            "GET",
            "/apis/apps/v1/namespaces/ns/deployments/",
            {},
            ("list", "ns", "apps", "v1", "deployments", "", "", True),
        ),
        # Non-resource paths: lower-cased HTTP method as verb.
        ("GET", "/version", {}, ("get", "", "", "", "", "", "", False)),
        ("GET", "/api", {}, ("get", "", "", "", "", "", "", False)),
        ("GET", "/api/v1", {}, ("get", "", "", "", "", "", "", False)),
        ("GET", "/apis", {}, ("get", "", "", "", "", "", "", False)),
        ("GET", "/apis/apps/v1", {}, ("get", "", "", "", "", "", "", False)),
        ("GET", "/openapi/v3/apis/apps/v1", {"hash": "x"}, ("get", "", "", "", "", "", "", False)),
        ("GET", "/healthz", {}, ("get", "", "", "", "", "", "", False)),
        ("POST", "/metrics", {}, ("post", "", "", "", "", "", "", False)),
        ("GET", "/", {}, ("get", "", "", "", "", "", "", False)),
    ],
)
def test_request_attributes(method: str, path: str, query: dict[str, str], expected: tuple[Any, ...]) -> None:
    a = request_attributes(U, method, path, query)
    got = (
        a.verb,
        a.namespace,
        a.api_group,
        a.api_version,
        a.resource,
        a.subresource,
        a.name,
        a.resource_request,
    )
    assert got == expected
    assert a.path == path
    assert a.user is U


def test_request_attributes_special_verb_without_resource_is_an_error() -> None:
    with pytest.raises(StatusError) as e:
        request_attributes(U, "GET", "/api/v1/watch", {})
    assert e.value.code == 500


# ----------------------------------------------------------------------------------------------------------
# RBAC

POD_READER = role(
    "pod-reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
)
POLICY = ObjectsRBAC(
    [
        POD_READER,
        role("node-reader", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]),
        role("evictor", [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]),
        role(
            "status-writer", [{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["update", "patch"]}]
        ),
        role(
            "budget-one",
            [
                {
                    "apiGroups": ["gpuops.io"],
                    "resources": ["gpuworkloadbudgets"],
                    "resourceNames": ["b1"],
                    "verbs": ["get", "update", "list", "watch", "delete"],
                }
            ],
        ),
        role("metrics", [{"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]}]),
        role("everything", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        role(
            "cm-editor",
            [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
            namespace="team-a",
        ),
        binding("nodes", "ClusterRole", "node-reader", [{"kind": "Group", "name": "ops"}]),
        binding("metrics", "ClusterRole", "metrics", [{"kind": "User", "name": "prom"}]),
        binding("root", "ClusterRole", "everything", [{"kind": "User", "name": "root"}]),
        binding(
            "evict",
            "ClusterRole",
            "evictor",
            [{"kind": "ServiceAccount", "name": "budget", "namespace": "team-a"}],
        ),
        binding(
            "sa-pods",
            "ClusterRole",
            "pod-reader",
            [{"kind": "ServiceAccount", "name": "budget"}],
            namespace="team-a",
        ),
        binding(
            "budget-one", "ClusterRole", "budget-one", [{"kind": "User", "name": "bob"}], namespace="team-a"
        ),
        binding("cm", "Role", "cm-editor", [{"kind": "Group", "name": "devs"}], namespace="team-a"),
        binding("cm-elsewhere", "Role", "cm-editor", [{"kind": "Group", "name": "devs"}], namespace="team-b"),
        binding("status", "ClusterRole", "status-writer", [{"kind": "User", "name": "kubelet"}]),
    ]
)


@pytest.mark.parametrize(
    ("who", "method", "path", "query", "allowed"),
    [
        # ClusterRoleBinding to a group applies in every namespace and cluster-wide.
        (user("carol", "ops"), "GET", "/api/v1/nodes/n1", {}, True),
        (user("carol", "ops"), "GET", "/api/v1/nodes", {}, True),
        (user("carol", "ops"), "DELETE", "/api/v1/nodes/n1", {}, False),
        (user("carol"), "GET", "/api/v1/nodes", {}, False),
        # RoleBinding of a ClusterRole: only inside the binding's namespace.
        (SA, "GET", "/api/v1/namespaces/team-a/pods", {}, True),
        (SA, "GET", "/api/v1/namespaces/team-a/pods", {"watch": "1"}, True),
        (SA, "GET", "/api/v1/namespaces/team-b/pods", {}, False),
        (SA, "GET", "/api/v1/pods", {}, False),
        (user("system:serviceaccount:team-b:budget"), "GET", "/api/v1/namespaces/team-a/pods", {}, False),
        # Subresources need their own rule: pods does not grant pods/eviction and vice versa.
        (SA, "POST", "/api/v1/namespaces/team-b/pods/p/eviction", {}, True),
        (SA, "GET", "/api/v1/namespaces/team-a/pods/p/status", {}, False),
        (SA, "DELETE", "/api/v1/namespaces/team-a/pods/p", {}, False),
        # "*/status" matches the status subresource of anything, and nothing else.
        (user("kubelet"), "PATCH", "/api/v1/namespaces/x/pods/p/status", {}, True),
        (
            user("kubelet"),
            "PUT",
            "/apis/gpuops.io/v1alpha1/namespaces/x/gpuworkloadbudgets/b/status",
            {},
            True,
        ),
        (user("kubelet"), "PATCH", "/api/v1/namespaces/x/pods/p", {}, False),
        (user("kubelet"), "PATCH", "/api/v1/namespaces/x/pods/p/eviction", {}, False),
        # "*" resources include subresources.
        (user("root"), "POST", "/api/v1/namespaces/x/pods/p/eviction", {}, True),
        (user("root"), "GET", "/metrics", {}, False),
        # resourceNames: only requests that carry a name.
        (user("bob"), "GET", "/apis/gpuops.io/v1alpha1/namespaces/team-a/gpuworkloadbudgets/b1", {}, True),
        (user("bob"), "PUT", "/apis/gpuops.io/v1alpha1/namespaces/team-a/gpuworkloadbudgets/b1", {}, True),
        (user("bob"), "GET", "/apis/gpuops.io/v1alpha1/namespaces/team-a/gpuworkloadbudgets/b2", {}, False),
        (user("bob"), "GET", "/apis/gpuops.io/v1alpha1/namespaces/team-a/gpuworkloadbudgets", {}, False),
        (user("bob"), "DELETE", "/apis/gpuops.io/v1alpha1/namespaces/team-a/gpuworkloadbudgets", {}, False),
        (
            user("bob"),
            "GET",
            "/apis/gpuops.io/v1alpha1/namespaces/team-a/gpuworkloadbudgets",
            {"fieldSelector": "metadata.name=b1"},
            True,
        ),
        (
            user("bob"),
            "GET",
            "/apis/gpuops.io/v1alpha1/namespaces/team-a/gpuworkloadbudgets",
            {"fieldSelector": "metadata.name=b1", "watch": "true"},
            True,
        ),
        (user("bob"), "GET", "/apis/other.io/v1/namespaces/team-a/gpuworkloadbudgets/b1", {}, False),
        # Role (namespaced) referenced by a RoleBinding; missing Role in team-b denies.
        (user("dan", "devs"), "DELETE", "/api/v1/namespaces/team-a/configmaps/c", {}, True),
        (user("dan", "devs"), "DELETE", "/api/v1/namespaces/team-b/configmaps/c", {}, False),
        # nonResourceURLs: exact or prefix with trailing "*"; cluster bindings only.
        (user("prom"), "GET", "/metrics", {}, True),
        (user("prom"), "GET", "/debug/pprof/heap", {}, True),
        (user("prom"), "GET", "/debug", {}, False),
        (user("prom"), "POST", "/metrics", {}, False),
        (user("prom"), "GET", "/metricsz", {}, False),
        # system:masters is allowed everything without any binding.
        (user("admin", "system:masters"), "DELETE", "/api/v1/namespaces/x/pods", {}, True),
        (user("admin", "system:masters"), "GET", "/whatever", {}, True),
    ],
)
def test_rbac_table(who: UserInfo, method: str, path: str, query: dict[str, str], allowed: bool) -> None:
    got, _ = authorize(request_attributes(who, method, path, query), POLICY)
    assert got is allowed


def test_rbac_reasons_name_the_binding() -> None:
    ok, reason = authorize(attrs(SA, "GET", "/api/v1/namespaces/team-a/pods"), POLICY)
    assert ok
    assert reason == (
        'RBAC: allowed by RoleBinding "sa-pods/team-a" of ClusterRole "pod-reader" to '
        'ServiceAccount "budget/team-a"'
    )
    ok, reason = authorize(attrs(user("carol", "ops"), "GET", "/api/v1/nodes"), POLICY)
    assert reason == 'RBAC: allowed by ClusterRoleBinding "nodes" of ClusterRole "node-reader" to Group "ops"'
    ok, reason = authorize(attrs(user("nobody"), "GET", "/api/v1/nodes"), POLICY)
    assert (ok, reason) == (False, "")
    # A binding whose role is missing is reported (once per distinct error) in the denial reason.
    ok, reason = authorize(
        attrs(user("dan", "devs"), "GET", "/api/v1/namespaces/team-b/configmaps/c"), POLICY
    )
    assert (ok, reason) == (False, 'RBAC: role.rbac.authorization.k8s.io "cm-editor" not found')


def test_service_account_subject_in_cluster_role_binding_needs_a_namespace() -> None:
    rbac = ObjectsRBAC(
        [
            POD_READER,
            binding("b", "ClusterRole", "pod-reader", [{"kind": "ServiceAccount", "name": "budget"}]),
        ]
    )
    assert authorize(attrs(SA, "GET", "/api/v1/namespaces/team-a/pods"), rbac)[0] is False


def test_role_binding_applies_to_its_namespace_object() -> None:
    """GET /api/v1/namespaces/team-a is a request "in" team-a, so team-a RoleBindings apply."""
    rbac = ObjectsRBAC(
        [
            role("ns-reader", [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]),
            binding("b", "ClusterRole", "ns-reader", [{"kind": "User", "name": "eve"}], namespace="team-a"),
        ]
    )
    assert authorize(attrs(user("eve"), "GET", "/api/v1/namespaces/team-a"), rbac)[0] is True
    assert authorize(attrs(user("eve"), "GET", "/api/v1/namespaces/team-b"), rbac)[0] is False
    assert authorize(attrs(user("eve"), "GET", "/api/v1/namespaces"), rbac)[0] is False


def test_aggregated_cluster_roles_are_resolved() -> None:
    rbac = ObjectsRBAC(
        [
            role(
                "gpu-view",
                [],
                aggregationRule={
                    "clusterRoleSelectors": [{"matchLabels": {"gpuops.io/aggregate-to-view": "true"}}]
                },
            ),
            role(
                "gpu-admin",
                [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],  # stale rules are ignored
                aggregationRule={
                    "clusterRoleSelectors": [
                        {"matchExpressions": [{"key": "gpuops.io/aggregate-to-admin", "operator": "Exists"}]},
                        {"matchLabels": {"gpuops.io/aggregate-to-view": "true"}},
                    ]
                },
            ),
            role(
                "budgets-view",
                [{"apiGroups": ["gpuops.io"], "resources": ["gpuworkloadbudgets"], "verbs": ["get", "list"]}],
                labels={"gpuops.io/aggregate-to-view": "true"},
            ),
            role(
                "budgets-edit",
                [{"apiGroups": ["gpuops.io"], "resources": ["gpuworkloadbudgets"], "verbs": ["update"]}],
                labels={"gpuops.io/aggregate-to-admin": "yes"},
            ),
            role(
                "unrelated",
                [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
                labels={"gpuops.io/aggregate-to-view": "false"},
            ),
            binding("v", "ClusterRole", "gpu-view", [{"kind": "User", "name": "viewer"}]),
            binding("a", "ClusterRole", "gpu-admin", [{"kind": "User", "name": "admin"}]),
        ]
    )
    path = "/apis/gpuops.io/v1alpha1/namespaces/x/gpuworkloadbudgets/b"
    assert authorize(attrs(user("viewer"), "GET", path), rbac)[0] is True
    assert authorize(attrs(user("viewer"), "PUT", path), rbac)[0] is False
    assert authorize(attrs(user("viewer"), "GET", "/api/v1/namespaces/x/secrets/s"), rbac)[0] is False
    assert authorize(attrs(user("admin"), "PUT", path), rbac)[0] is True
    assert authorize(attrs(user("admin"), "GET", path), rbac)[0] is True
    assert authorize(attrs(user("admin"), "DELETE", path), rbac)[0] is False
    cr = rbac.cluster_role("gpu-admin")
    assert cr is not None
    assert auth.aggregated_rules(cr, rbac) == [
        {"apiGroups": ["gpuops.io"], "resources": ["gpuworkloadbudgets"], "verbs": ["update"]},
        {"apiGroups": ["gpuops.io"], "resources": ["gpuworkloadbudgets"], "verbs": ["get", "list"]},
    ]


def test_aggregation_chains_and_cycles_terminate() -> None:
    """a aggregates b, b aggregates a and leaf: both get leaf's rules (the controller's fixed point)."""

    def agg(value: str) -> dict[str, Any]:
        return {"clusterRoleSelectors": [{"matchLabels": {"agg": value}}]}

    rbac = ObjectsRBAC(
        [
            role("a", [], labels={"agg": "b"}, aggregationRule=agg("a")),
            role("b", [], labels={"agg": "a"}, aggregationRule=agg("b")),
            role("leaf", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}], labels={"agg": "b"}),
            role("empty", [], aggregationRule=agg("nothing")),
            binding("x", "ClusterRole", "b", [{"kind": "User", "name": "u"}]),
            binding("y", "ClusterRole", "a", [{"kind": "User", "name": "w"}]),
            binding("z", "ClusterRole", "empty", [{"kind": "User", "name": "v"}]),
        ]
    )
    for name, allowed in (("u", True), ("w", True), ("v", False)):
        assert authorize(attrs(user(name), "GET", "/api/v1/namespaces/n/pods/p"), rbac)[0] is allowed


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {}, True),
        (None, {"a": "b"}, False),
        ({"matchLabels": {"a": "b"}}, {"a": "b", "c": "d"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "c"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]}, {"a": "y"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {"a": "x"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ],
)
def test_label_selector_matches(
    selector: dict[str, Any] | None, labels: dict[str, str], matches: bool
) -> None:
    assert auth.label_selector_matches(selector, labels) is matches


def test_label_selector_rejects_bad_operators() -> None:
    with pytest.raises(ValueError):
        auth.label_selector_matches(
            {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, {}
        )
    with pytest.raises(ValueError):
        auth.label_selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, {})


# ----------------------------------------------------------------------------------------------------------
# Forbidden messages (exact upstream wording)


@pytest.mark.parametrize(
    ("who", "method", "path", "message", "details"),
    [
        (
            SA,
            "GET",
            "/api/v1/namespaces/ns/pods/x",
            'pods "x" is forbidden: User "system:serviceaccount:team-a:budget" cannot get resource "pods" '
            'in API group "" in the namespace "ns"',
            {"name": "x", "kind": "pods"},
        ),
        (
            user("u"),
            "GET",
            "/api/v1/pods",
            'pods is forbidden: User "u" cannot list resource "pods" in API group "" at the cluster scope',
            {"kind": "pods"},
        ),
        (
            user("u"),
            "GET",
            "/api/v1/namespaces/ns/pods",
            'pods is forbidden: User "u" cannot list resource "pods" in API group "" in the namespace "ns"',
            {"kind": "pods"},
        ),
        (
            user("u"),
            "POST",
            "/api/v1/namespaces/ns/pods/p/eviction",
            'pods "p" is forbidden: User "u" cannot create resource "pods/eviction" in API group "" '
            'in the namespace "ns"',
            {"name": "p", "kind": "pods"},
        ),
        (
            user("u"),
            "PATCH",
            "/apis/gpuops.io/v1alpha1/namespaces/ns/gpuworkloadbudgets/b/status",
            'gpuworkloadbudgets.gpuops.io "b" is forbidden: User "u" cannot patch resource '
            '"gpuworkloadbudgets/status" in API group "gpuops.io" in the namespace "ns"',
            {"name": "b", "group": "gpuops.io", "kind": "gpuworkloadbudgets"},
        ),
        (
            user("u"),
            "GET",
            "/api/v1/namespaces/ns",
            'namespaces "ns" is forbidden: User "u" cannot get '
            'resource "namespaces" in API group "" in the namespace "ns"',
            {"name": "ns", "kind": "namespaces"},
        ),
        (
            user("u"),
            "GET",
            "/api/v1/nodes/n",
            'nodes "n" is forbidden: User "u" cannot get resource "nodes" '
            'in API group "" at the cluster scope',
            {"name": "n", "kind": "nodes"},
        ),
        (
            user("u"),
            "DELETE",
            "/apis/apps/v1/namespaces/ns/deployments",
            'deployments.apps is forbidden: User "u" cannot deletecollection resource "deployments" '
            'in API group "apps" in the namespace "ns"',
            {"group": "apps", "kind": "deployments"},
        ),
        (
            user("system:anonymous"),
            "GET",
            "/metrics",
            'forbidden: User "system:anonymous" cannot get path "/metrics"',
            None,
        ),
    ],
)
def test_forbidden_messages(
    who: UserInfo, method: str, path: str, message: str, details: dict[str, str] | None
) -> None:
    err = forbidden(attrs(who, method, path))
    status = err.to_status()
    assert (err.code, err.reason) == (403, "Forbidden")
    assert status["message"] == message
    assert status.get("details") == details


def test_forbidden_appends_the_authorizer_reason() -> None:
    a = attrs(user("dan", "devs"), "GET", "/api/v1/namespaces/team-b/configmaps/c")
    allowed, reason = authorize(a, POLICY)
    assert not allowed
    assert forbidden(a, reason).message == (
        'configmaps "c" is forbidden: User "dan" cannot get resource "configmaps" in API group "" in the '
        'namespace "team-b": RBAC: role.rbac.authorization.k8s.io "cm-editor" not found'
    )


# ----------------------------------------------------------------------------------------------------------
# TokenReview / SubjectAccessReview


def test_token_review_authenticated() -> None:
    a = Authenticator()
    tok = a.service_account_token("team-a", "budget", uid="u-1")
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": tok}}
    out = token_review(body, a)
    assert out["spec"] == {"token": tok}
    assert out["status"] == {
        "authenticated": True,
        "user": {
            "username": "system:serviceaccount:team-a:budget",
            "uid": "u-1",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"],
        },
        "audiences": ["https://kubernetes.default.svc.cluster.local"],
    }
    assert "status" not in body  # input untouched


def test_token_review_unknown_token_and_foreign_audience() -> None:
    a = Authenticator()
    a.add_token("t", UserInfo("alice"))
    out = token_review({"spec": {"token": "nope"}}, a)
    assert out["kind"] == "TokenReview" and out["apiVersion"] == "authentication.k8s.io/v1"
    assert out["status"] == {"user": {}, "error": "invalid bearer token"}
    out = token_review({"spec": {"token": "t", "audiences": ["vault"]}}, a)
    assert "authenticated" not in out["status"]
    out = token_review({"spec": {"token": "t", "audiences": ["vault", auth.DEFAULT_AUDIENCE]}}, a)
    assert out["status"]["authenticated"] is True
    assert out["status"]["audiences"] == [auth.DEFAULT_AUDIENCE]


def test_token_review_requires_a_token() -> None:
    with pytest.raises(StatusError) as e:
        token_review({"spec": {}}, Authenticator())
    assert (e.value.code, e.value.reason, e.value.message) == (
        400,
        "BadRequest",
        "token is required for TokenReview in authentication",
    )


def test_subject_access_review() -> None:
    body: dict[str, Any] = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "system:serviceaccount:team-a:budget",
            "groups": ["system:serviceaccounts"],
            "resourceAttributes": {"namespace": "team-a", "verb": "list", "resource": "pods"},
        },
    }
    out = subject_access_review(body, POLICY)
    assert out["status"] == {
        "allowed": True,
        "reason": 'RBAC: allowed by RoleBinding "sa-pods/team-a" of '
        'ClusterRole "pod-reader" to ServiceAccount "budget/team-a"',
    }
    body["spec"]["resourceAttributes"]["verb"] = "delete"
    assert subject_access_review(body, POLICY)["status"] == {"allowed": False}
    sub = {
        "spec": {
            "user": "u",
            "resourceAttributes": {
                "namespace": "n",
                "verb": "create",
                "resource": "pods",
                "subresource": "eviction",
                "name": "p",
            },
        }
    }
    assert subject_access_review(sub, POLICY)["status"]["allowed"] is False
    masters = {
        "spec": {"groups": ["system:masters"], "resourceAttributes": {"verb": "delete", "resource": "x"}}
    }
    assert subject_access_review(masters, POLICY)["status"] == {"allowed": True}
    non = {"spec": {"user": "prom", "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}
    assert subject_access_review(non, POLICY)["status"]["allowed"] is True


def test_subject_access_review_takes_the_subject_literally() -> None:
    """No system:authenticated is added to a SAR subject, unlike a real request."""
    rbac = ObjectsRBAC(
        [
            POD_READER,
            binding("b", "ClusterRole", "pod-reader", [{"kind": "Group", "name": "system:authenticated"}]),
        ]
    )
    sar = {"spec": {"user": "u", "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "n"}}}
    assert subject_access_review(sar, rbac)["status"]["allowed"] is False
    sar["spec"]["groups"] = ["system:authenticated"]
    assert subject_access_review(sar, rbac)["status"]["allowed"] is True


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"user": "u"},
            'SubjectAccessReview.authorization.k8s.io "" is invalid: spec: Invalid value: null: '
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ),
        (
            {"resourceAttributes": {"verb": "get"}},
            'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: Invalid value: "": '
            "at least one of user or group must be specified",
        ),
        (
            {"user": "u", "resourceAttributes": {}, "nonResourceAttributes": {"path": "/x"}},
            'SubjectAccessReview.authorization.k8s.io "" is invalid: spec: Invalid value: {"path":"/x"}: '
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ),
    ],
)
def test_subject_access_review_validation(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(StatusError) as e:
        subject_access_review({"spec": spec}, POLICY)
    assert (e.value.code, e.value.reason, e.value.message) == (422, "Invalid", message)


def test_self_subject_access_review_uses_the_caller() -> None:
    body = {"spec": {"resourceAttributes": {"verb": "get", "resource": "nodes"}}}
    out = self_subject_access_review(body, user("carol", "ops"), POLICY)
    assert out["kind"] == "SelfSubjectAccessReview"
    assert out["status"]["allowed"] is True
    assert self_subject_access_review(body, user("carol"), POLICY)["status"] == {"allowed": False}


def test_bootstrap_policy_allows_discovery_and_can_i() -> None:
    roles, bindings = auth.bootstrap_policy()
    rbac = ObjectsRBAC([*roles, *bindings])
    a = Authenticator()
    sa = a.authenticate(f"Bearer {a.service_account_token('team-a', 'budget')}")
    assert sa is not None
    for path in (
        "/api",
        "/apis",
        "/apis/apps/v1",
        "/version",
        "/openapi/v3",
        "/openapi/v3/api/v1",
        "/healthz",
    ):
        assert authorize(attrs(sa, "GET", path), rbac)[0] is True, path
    assert authorize(attrs(sa, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"), rbac)[0]
    assert authorize(attrs(sa, "GET", "/api/v1/namespaces/team-a/pods"), rbac)[0] is False
    assert authorize(attrs(ANONYMOUS_USER, "GET", "/version"), rbac)[0] is True
    assert authorize(attrs(ANONYMOUS_USER, "GET", "/api"), rbac)[0] is False
    admin = UserInfo("admin", groups=("system:masters",))
    assert authorize(attrs(admin, "DELETE", "/api/v1/nodes"), rbac) == (True, "")


# ----------------------------------------------------------------------------------------------------------
# TokenRequest (serviceaccounts/token), token audiences and expiry


SA_OBJ = {"metadata": {"name": "robot", "namespace": "team-a", "uid": "sa-uid-1"}}


def test_token_request_defaults_and_the_token_authenticates_as_the_service_account() -> None:
    now = [1_000_000.0]
    a = Authenticator(clock=lambda: now[0])
    out = auth.token_request({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
                             SA_OBJ, a)
    assert out["kind"] == "TokenRequest" and out["apiVersion"] == "authentication.k8s.io/v1"
    assert out["spec"]["audiences"] == [auth.DEFAULT_AUDIENCE] and out["spec"]["expirationSeconds"] == 3600
    assert out["status"]["expirationTimestamp"] == "1970-01-12T14:46:40Z"  # now + 3600 s
    user = a.authenticate(f"Bearer {out['status']['token']}")
    assert user is not None
    assert (user.username, user.uid) == ("system:serviceaccount:team-a:robot", "sa-uid-1")
    assert user.groups == ("system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated")
    # each token carries its own ID, as upstream's credential-id extra
    other = a.authenticate(f"Bearer {auth.token_request({'spec': {}}, SA_OBJ, a)['status']['token']}")
    assert other is not None
    assert user.extra[auth.CREDENTIAL_ID] != other.extra[auth.CREDENTIAL_ID]
    assert user.extra[auth.CREDENTIAL_ID][0].startswith("JTI=")
    now[0] += 3600  # expired at its expirationTimestamp
    assert a.authenticate(f"Bearer {out['status']['token']}") is None


def test_token_request_audiences_bind_where_the_token_is_valid() -> None:
    a = Authenticator()
    vault = auth.token_request({"spec": {"audiences": ["vault"], "expirationSeconds": 600}}, SA_OBJ, a)
    token = vault["status"]["token"]
    assert a.authenticate(f"Bearer {token}") is None  # not for the API server
    review = token_review({"spec": {"token": token, "audiences": ["vault"]}}, a)
    assert review["status"]["authenticated"] is True and review["status"]["audiences"] == ["vault"]
    assert "authenticated" not in token_review({"spec": {"token": token}}, a)["status"]


def test_token_request_validation() -> None:
    a = Authenticator()
    with pytest.raises(StatusError) as e:
        auth.token_request({"spec": {"expirationSeconds": 599}}, SA_OBJ, a)
    assert e.value.code == 422 and "may not specify a duration less than 10 minutes" in e.value.message
    with pytest.raises(StatusError) as e:
        auth.token_request({"spec": {"boundObjectRef": {"kind": "ConfigMap", "name": "x"}}}, SA_OBJ, a)
    assert e.value.code == 422 and "spec.boundObjectRef.kind" in str(e.value.to_status())
    with pytest.raises(StatusError) as e:  # a bound object that does not exist
        auth.token_request({"spec": {"boundObjectRef": {"kind": "Pod", "name": "gone"}}}, SA_OBJ, a,
                           lambda kind, ns, name: None)
    assert e.value.code == 404
    pod = {"metadata": {"name": "p", "namespace": "team-a", "uid": "pod-uid"}}
    out = auth.token_request({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}},
                             SA_OBJ, a, lambda kind, ns, name: pod if (kind, ns, name) == ("Pod", "team-a", "p")
                             else None)
    assert out["spec"]["boundObjectRef"]["uid"] == "pod-uid"
    user = a.authenticate(f"Bearer {out['status']['token']}")
    assert user is not None and user.extra["authentication.kubernetes.io/pod-name"] == ("p",)


def _pb(number: int, payload: bytes | int) -> bytes:
    def varint(v: int) -> bytes:
        out = b""
        while True:
            b, v = v & 0x7F, v >> 7
            out += bytes([b | (0x80 if v else 0)])
            if not v:
                return out
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_protobuf_token_requests_as_kubectl_create_token_sends_them() -> None:
    spec = _pb(1, b"aud-1") + _pb(1, b"aud-2") + _pb(4, 7200) + _pb(3, _pb(1, b"Pod") + _pb(3, b"p"))
    raw = b"k8s\x00" + _pb(1, _pb(1, b"authentication.k8s.io/v1") + _pb(2, b"TokenRequest")) + _pb(
        2, _pb(1, _pb(1, b"robot")) + _pb(2, spec)) + _pb(4, b"application/vnd.kubernetes.protobuf")
    assert decode_object(raw)["spec"] == {
        "audiences": ["aud-1", "aud-2"], "expirationSeconds": 7200, "boundObjectRef": {"kind": "Pod", "name": "p"}}
    with pytest.raises(DecodeError):
        decode_object(b"not protobuf")


# What kubectl v1.37 `auth can-i create pods/eviction` posts (`-v=9`): TypeMeta, an ObjectMeta of empty
# fields, spec.resourceAttributes with empty strings for the unset fields, an empty status, and the envelope's
# empty contentEncoding/contentType. (`pods/eviction` is TYPE/NAME to can-i: the pod named "eviction".)
KUBECTL_CAN_I = bytes.fromhex(
    "6b3873000a320a17617574686f72697a6174696f6e2e6b38732e696f2f763112175365"
    "6c665375626a6563744163636573735265766965771247"
    "0a100a0012001a0022002a00320038004200"
    "12290a270a0764656661756c741206637265617465"
    "1a0022002a04706f647332003a086576696374696f6e"
    "1a08080012001a002000"
    "1a002200"
)


def _envelope(kind: str, api_version: str, obj: bytes) -> bytes:
    type_meta = _pb(1, api_version.encode()) + _pb(2, kind.encode())
    return b"k8s\x00" + _pb(1, type_meta) + _pb(2, obj) + _pb(4, b"application/vnd.kubernetes.protobuf")


def test_protobuf_self_subject_access_review_as_kubectl_auth_can_i_sends_it() -> None:
    review = decode_object(KUBECTL_CAN_I)
    assert review == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "metadata": {},
        "spec": {"resourceAttributes": {"namespace": "default", "verb": "create", "resource": "pods",
                                        "name": "eviction"}},
        "status": {"allowed": False},
    }
    # The decoded review answers like its JSON twin.
    rbac = ObjectsRBAC([role("evict", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"],
                                     "resourceNames": ["eviction"]}]),
                     binding("evict", "ClusterRole", "evict", [{"kind": "User", "name": "alice"}])])
    assert self_subject_access_review(review, user("alice"), rbac)["status"]["allowed"] is True
    assert self_subject_access_review(review, user("bob"), rbac)["status"] == {"allowed": False}


def test_protobuf_self_subject_access_review_non_resource_and_selectors() -> None:
    non = _pb(2, _pb(1, b"/metrics") + _pb(2, b"get"))
    raw = _envelope("SelfSubjectAccessReview", "authorization.k8s.io/v1", _pb(1, b"") + _pb(2, non))
    assert decode_object(raw)["spec"] == {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}
    # selectors decode as well; an empty resourceAttributes is still present, and a field number the message
    # does not have (SubjectAccessReview's user = 3) is skipped, as unknown fields are.
    res = _pb(1, _pb(2, b"list") + _pb(5, b"pods") + _pb(8, _pb(1, b"spec.nodeName=n")))
    raw = _envelope("SelfSubjectAccessReview", "authorization.k8s.io/v1", _pb(2, res + _pb(3, b"root")))
    assert decode_object(raw)["spec"] == {
        "resourceAttributes": {"verb": "list", "resource": "pods", "fieldSelector": {"rawSelector": "spec.nodeName=n"}}}
    raw = _envelope("", "", _pb(2, _pb(1, b"")))
    assert decode_object(raw, "authorization.k8s.io/v1", "SelfSubjectAccessReview")["spec"] == {
        "resourceAttributes": {}}


def test_protobuf_subject_access_review() -> None:
    extra = _pb(5, _pb(1, b"scopes") + _pb(2, _pb(1, b"view") + _pb(1, b"edit")))
    spec = (_pb(1, _pb(1, b"team-a") + _pb(2, b"get") + _pb(3, b"apps") + _pb(5, b"deployments")
                + _pb(6, b"scale") + _pb(7, b"web"))
            + _pb(3, b"alice") + _pb(4, b"devs") + _pb(4, b"ops") + extra + _pb(6, b"uid-1"))
    raw = _envelope("SubjectAccessReview", "authorization.k8s.io/v1", _pb(1, b"") + _pb(2, spec))
    review = decode_object(raw)
    assert review["spec"] == {
        "resourceAttributes": {"namespace": "team-a", "verb": "get", "group": "apps", "resource": "deployments",
                               "subresource": "scale", "name": "web"},
        "user": "alice", "groups": ["devs", "ops"], "extra": {"scopes": ["view", "edit"]}, "uid": "uid-1",
    }
    rbac = ObjectsRBAC([role("scale", [{"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get"]}]),
                     binding("scale", "ClusterRole", "scale", [{"kind": "Group", "name": "ops"}])])
    assert subject_access_review(review, rbac)["status"]["allowed"] is True


def test_protobuf_token_review() -> None:
    a = Authenticator()
    a.add_token("tok", user("alice"))
    raw = _envelope("TokenReview", "authentication.k8s.io/v1", _pb(2, _pb(1, b"tok") + _pb(2, b"https://x")))
    review = decode_object(raw)
    assert review["spec"] == {"token": "tok", "audiences": ["https://x"]}
    raw = _envelope("TokenReview", "authentication.k8s.io/v1", _pb(2, _pb(1, b"tok")))
    assert token_review(decode_object(raw), a)["status"]["user"]["username"] == "alice"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not protobuf", "expected prefix [107 56 115 0]"),
        (b"", "empty data"),
        (b"k8s\x00\x12\x80", "unexpected EOF"),
        (b"k8s\x00\x12\x05ab", "unexpected EOF"),
        (b"k8s\x00\x12\x02\x11\x00", "unexpected EOF"),  # fixed64 cut short
        (b"k8s\x00\x00\x00", "illegal tag 0"),
        (b"k8s\x00\x12\x02\x13\x00", "illegal wireType 3"),
        (_envelope("SelfSubjectAccessReview", "authorization.k8s.io/v1", _pb(2, _pb(2, _pb(1, 7)))), "wrong wireType"),
        (_envelope("TokenRequest", "authentication.k8s.io/v1", _pb(2, _pb(4, b"x"))), "wrong wireType"),
        (_envelope("NoSuchKind", "v1", b""), "no kind 'NoSuchKind' is registered for version 'v1'"),
        (bytes(range(256)), "expected prefix"),
        (b"k8s\x00" + bytes(range(255, 0, -1)), ""),
    ],
)
def test_garbage_protobuf_bodies_are_decode_errors(raw: bytes, message: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode_object(raw, "authorization.k8s.io/v1", "SelfSubjectAccessReview")
    assert message.lower() in str(e.value).lower()


def test_invalid_utf8_is_replaced_as_go_prints_it() -> None:
    raw = _envelope("TokenReview", "authentication.k8s.io/v1", _pb(2, _pb(1, b"\xc3")))
    assert decode_object(raw)["spec"] == {"token": "\ufffd"}


@pytest.mark.anyio
async def test_serviceaccount_token_subresource_and_the_audit_hook() -> None:
    import aiohttp

    from gpuops_sim.apiserver import APIServer

    async with APIServer(authorization="RBAC") as server, aiohttp.ClientSession() as http:
        decisions: list[auth.Decision] = []
        server.audit_hooks.append(decisions.append)
        admin = {"Authorization": f"Bearer {server.admin_token}"}
        base = f"{server.url}/api/v1/namespaces/default/serviceaccounts"
        async with http.post(f"{base}/robot/token", json={"spec": {}}, headers=admin) as r:
            assert r.status == 404  # no such ServiceAccount
        async with http.post(base, json={"metadata": {"name": "robot"}}, headers=admin) as r:
            assert r.status == 201
        async with http.post(f"{base}/robot/token", json={"kind": "TokenRequest", "spec": {}}, headers=admin) as r:
            assert r.status == 201
            token = (await r.json())["status"]["token"]
        async with http.get(f"{server.url}/api/v1/namespaces/default/pods",
                            headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 403  # authenticated as the ServiceAccount, which may do nothing yet
        last = decisions[-1]
        assert (last.allowed, last.attrs.verb, last.attrs.resource) == (False, "list", "pods")
        assert last.attrs.user.username == "system:serviceaccount:default:robot"
        assert last.attrs.user.extra[auth.CREDENTIAL_ID][0].startswith("JTI=")
        assert any(d.allowed and d.attrs.subresource == "token" for d in decisions)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

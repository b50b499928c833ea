"""User impersonation (`kubectl --as/--as-group/--as-uid`) and `kubectl auth can-i` against the emulator.

The Impersonate-* headers are authorized as kube-apiserver does (verb `impersonate` on users, groups,
serviceaccounts, uids and userextras/<key>), a denied one is the upstream 403, and the request is then
authorized as the impersonated user. The kubectl tests run the real binary over TLS (client-go sends bearer
tokens only there), so its protobuf SelfSubjectAccessReviews and impersonation headers are the real ones.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
import yaml

from gpuops_sim.apiserver import APIServer, auth
from gpuops_sim.apiserver.auth import (
    AUTHENTICATED,
    Attributes,
    ImpersonationHeaderError,
    ImpersonationRequest,
    ObjectsRBAC,
    UserInfo,
    impersonate,
    impersonation_requests,
)
from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.protobuf import CONTENT_TYPE, decode_object

if TYPE_CHECKING:
    from running_server import RunningServer

KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"
if not KUBECTL.exists():
    KUBECTL = Path(shutil.which("kubectl") or "/nonexistent/kubectl")

ROBOT = "system:serviceaccount:team-a:robot"
RBAC_V1 = "rbac.authorization.k8s.io/v1"




def role(name: str, rules: list[dict[str, Any]], namespace: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": RBAC_V1, "kind": "Role" if namespace else "ClusterRole", "metadata": meta, "rules": rules}


def binding(name: str, ref_kind: str, subjects: list[dict[str, Any]], namespace: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": RBAC_V1,
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": ref_kind, "name": name},
        "subjects": subjects,
    }


def impersonator_policy() -> list[dict[str, Any]]:
    """alice may impersonate the user bob, the group devs, uid u-1, scopes=view, and service accounts of
    team-a only (a RoleBinding there); bob may do nothing."""
    alice = [{"kind": "User", "name": "alice"}]
    return [
        role("impersonator", [
            {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["bob"]},
            {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": ["devs"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["uids"], "verbs": ["impersonate"],
             "resourceNames": ["u-1"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/scopes"], "verbs": ["impersonate"],
             "resourceNames": ["view"]},
        ]),
        binding("impersonator", "ClusterRole", alice),
        role("sa-impersonator", [{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}],
             "team-a"),
        binding("sa-impersonator", "Role", alice, "team-a"),
    ]


def checker(objs: Iterable[Mapping[str, Any]], seen: list[Attributes] | None = None) -> Any:
    rbac = ObjectsRBAC(objs)

    def check(attrs: Attributes) -> tuple[bool, str]:
        if seen is not None:
            seen.append(attrs)
        return auth.authorize(attrs, rbac)

    return check


ALICE = UserInfo("alice", "alice-uid", ("staff", AUTHENTICATED), {"scopes": ("all",)})


# ----------------------------------------------------------------------------------------------------------
# Headers


def test_headers_become_impersonation_requests_in_upstream_order() -> None:
    headers = [
        ("impersonate-uid", "u-1"),
        ("Impersonate-Extra-Acme.com%2FProject", "p1"),
        ("Impersonate-Group", "devs"),
        ("Impersonate-User", ROBOT),
        ("IMPERSONATE-GROUP", ""),
        ("Impersonate-Extra-acme.com%2Fproject", "p2"),
        ("Impersonate-Extra-bad%zzkey", "x"),
        ("Accept", "application/json"),
    ]
    assert impersonation_requests(headers) == [
        ImpersonationRequest("ServiceAccount", "robot", namespace="team-a"),
        ImpersonationRequest("Group", "devs"),
        ImpersonationRequest("Group", ""),  # every header line is a group, even an empty one
        ImpersonationRequest("UserExtra", "p1", extra_key="acme.com/project"),
        ImpersonationRequest("UserExtra", "p2", extra_key="acme.com/project"),
        ImpersonationRequest("UserExtra", "x", extra_key="bad%zzkey"),  # a malformed escape stays as sent
        ImpersonationRequest("UID", "u-1"),
    ]
    assert impersonation_requests([("Authorization", "Bearer x")]) == []
    assert impersonation_requests([("Impersonate-User", "")]) == []


@pytest.mark.parametrize(
    "username",
    [
        "system:serviceaccount:team-a:robot:x",
        "system:serviceaccount:Team-A:robot",
        "system:serviceaccount::robot",
        "system:serviceaccount:team-a:",
        "system:serviceaccount:team-a:Robot",
        "system:serviceaccounts:team-a",
        "system:serviceaccount:" + "a" * 64 + ":robot",
    ],
)
def test_malformed_service_account_names_are_plain_users(username: str) -> None:
    assert impersonation_requests([("Impersonate-User", username)]) == [ImpersonationRequest("User", username)]


def test_dotted_service_account_names_are_service_accounts() -> None:
    got = impersonation_requests([("Impersonate-User", "system:serviceaccount:ns-1:a.b-c")])
    assert got == [ImpersonationRequest("ServiceAccount", "a.b-c", namespace="ns-1")]


@pytest.mark.parametrize(
    ("headers", "shown"),
    [
        ([("Impersonate-Group", "devs")], "[{Group  devs    }]"),
        ([("Impersonate-Uid", "u-1")], "[{UID  u-1  authentication.k8s.io/v1  }]"),
        ([("Impersonate-Extra-Scopes", "view"), ("Impersonate-User", "")],
         "[{UserExtra  view  authentication.k8s.io/v1  scopes}]"),
    ],
)
def test_groups_uid_or_extras_without_a_user_are_refused(headers: list[tuple[str, str]], shown: str) -> None:
    with pytest.raises(ImpersonationHeaderError) as e:
        impersonate(ALICE, headers, checker([]))
    assert str(e.value) == f"requested {shown} without impersonating a user"
    assert e.value.response_text("/api/v1/pods?limit=1") == (
        f'Internal Server Error: "/api/v1/pods?limit=1": requested {shown} without impersonating a user\n')


# ----------------------------------------------------------------------------------------------------------
# Who the request becomes


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], ALICE),
        ([("Impersonate-User", ROBOT)],
         UserInfo(ROBOT, groups=("system:serviceaccounts", "system:serviceaccounts:team-a", AUTHENTICATED))),
        ([("Impersonate-User", ROBOT), ("Impersonate-Group", "devs")], UserInfo(ROBOT, groups=("devs", AUTHENTICATED))),
        ([("Impersonate-User", "bob")], UserInfo("bob", groups=(AUTHENTICATED,))),
        ([("Impersonate-User", "bob"), ("Impersonate-Group", "system:unauthenticated")],
         UserInfo("bob", groups=("system:unauthenticated",))),
        ([("Impersonate-User", "bob"), ("Impersonate-Group", AUTHENTICATED), ("Impersonate-Group", "devs")],
         UserInfo("bob", groups=(AUTHENTICATED, "devs"))),
        ([("Impersonate-User", "system:anonymous")], UserInfo("system:anonymous", groups=("system:unauthenticated",))),
        ([("Impersonate-User", "bob"), ("Impersonate-Uid", "u-1"), ("Impersonate-Extra-Scopes", "view"),
          ("Impersonate-Extra-scopes", "edit")],
         UserInfo("bob", "u-1", (AUTHENTICATED,), {"scopes": ("view", "edit")})),
    ],
)
def test_the_impersonated_user_info(headers: list[tuple[str, str]], expected: UserInfo) -> None:
    masters = UserInfo("admin", groups=(auth.MASTERS, AUTHENTICATED))  # system:masters may impersonate anyone
    got = impersonate(masters, headers, checker([])) if headers else impersonate(ALICE, headers, checker([]))
    assert (got.username, got.uid, got.groups, dict(got.extra)) == (
        expected.username, expected.uid, expected.groups, dict(expected.extra))


def test_every_impersonated_value_is_authorized_for_the_requester() -> None:
    seen: list[Attributes] = []
    headers = [("Impersonate-User", "bob"), ("Impersonate-Group", "devs"), ("Impersonate-Uid", "u-1"),
               ("Impersonate-Extra-Scopes", "view")]
    got = impersonate(ALICE, headers, checker(impersonator_policy(), seen))
    assert got == UserInfo("bob", "u-1", ("devs", AUTHENTICATED), {"scopes": ("view",)})
    assert [(a.user.username, a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name) for a in seen] == [
        ("alice", "impersonate", "", "users", "", "", "bob"),
        ("alice", "impersonate", "", "groups", "", "", "devs"),
        ("alice", "impersonate", "authentication.k8s.io", "userextras", "scopes", "", "view"),
        ("alice", "impersonate", "authentication.k8s.io", "uids", "", "", "u-1"),
    ]
    robot = impersonate(ALICE, [("Impersonate-User", ROBOT)], checker(impersonator_policy()))
    assert robot.username == ROBOT


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([("Impersonate-User", "carol")],
         'users "carol" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the '
         "cluster scope"),
        ([("Impersonate-User", "bob"), ("Impersonate-Group", "system:masters")],
         'groups "system:masters" is forbidden: User "alice" cannot impersonate resource "groups" in API group "" '
         "at the cluster scope"),
        ([("Impersonate-User", "system:serviceaccount:team-b:robot")],
         'serviceaccounts "robot" is forbidden: User "alice" cannot impersonate resource "serviceaccounts" in API '
         'group "" in the namespace "team-b"'),
        ([("Impersonate-User", "bob"), ("Impersonate-Uid", "u-2")],
         'uids.authentication.k8s.io "u-2" is forbidden: User "alice" cannot impersonate resource "uids" in API '
         'group "authentication.k8s.io" at the cluster scope'),
        ([("Impersonate-User", "bob"), ("Impersonate-Extra-Scopes", "edit")],
         'userextras.authentication.k8s.io "edit" is forbidden: User "alice" cannot impersonate resource '
         '"userextras/scopes" in API group "authentication.k8s.io" at the cluster scope'),
    ],
)
def test_denied_impersonation_is_forbidden(headers: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(StatusError) as e:
        impersonate(ALICE, headers, checker(impersonator_policy()))
    assert (e.value.code, e.value.reason, e.value.message) == (403, "Forbidden", message)


def test_a_missing_role_is_the_reason_of_a_denied_impersonation() -> None:
    dangling = binding("ghost", "ClusterRole", [{"kind": "User", "name": "alice"}])
    with pytest.raises(StatusError) as e:
        impersonate(ALICE, [("Impersonate-User", "bob")], checker([dangling]))
    assert e.value.message.endswith(
        'cannot impersonate resource "users" in API group "" at the cluster scope: RBAC: '
        'clusterrole.rbac.authorization.k8s.io "ghost" not found')


# ----------------------------------------------------------------------------------------------------------
# Over HTTP


@pytest.mark.anyio
async def test_impersonation_over_http_is_audited_and_authorizes_the_request_as_the_new_user() -> None:
    async with APIServer(authorization="RBAC") as server, aiohttp.ClientSession() as http:
        for obj in impersonator_policy():
            kind = "rolebindings" if obj["kind"] == "RoleBinding" else (
                "roles" if obj["kind"] == "Role" else obj["kind"].lower() + "s")
            server.store.put(("rbac.authorization.k8s.io", kind), obj)
        server.authn.add_token("alice-token", UserInfo("alice"))
        decisions: list[auth.Decision] = []
        server.audit_hooks.append(decisions.append)
        alice = {"Authorization": "Bearer alice-token"}
        pods = f"{server.url}/api/v1/namespaces/team-a/pods"
        async with http.get(pods, headers={**alice, "Impersonate-User": "carol"}) as r:
            assert r.status == 403
            body = await r.json()
            assert body["reason"] == "Forbidden" and body["details"] == {"name": "carol", "kind": "users"}
        async with http.get(pods, headers={**alice, "Impersonate-User": ROBOT}) as r:
            assert r.status == 403
            assert (await r.json())["message"] == (
                f'pods is forbidden: User "{ROBOT}" cannot list resource "pods" in API group "" in the namespace '
                '"team-a"')
        assert [(d.attrs.user.username, d.attrs.verb, d.attrs.resource, d.allowed) for d in decisions[-2:]] == [
            ("alice", "impersonate", "serviceaccounts", True), (ROBOT, "list", "pods", False)]
        # The impersonated user is who SelfSubjectAccessReview answers for (as JSON here).
        review = {"spec": {"resourceAttributes": {"verb": "impersonate", "resource": "users", "name": "bob"}}}
        async with http.post(f"{server.url}/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json=review,
                             headers={**alice, "Impersonate-User": "bob"}) as r:
            assert r.status == 201 and (await r.json())["status"] == {"allowed": False}
        async with http.get(pods, headers={**alice, "Impersonate-Group": "devs"}) as r:
            assert r.status == 500 and r.content_type == "text/plain"
            assert await r.text() == (
                'Internal Server Error: "/api/v1/namespaces/team-a/pods": requested [{Group  devs    }] without '
                "impersonating a user\n")


@pytest.mark.anyio
async def test_always_allow_still_impersonates() -> None:
    async with APIServer() as server, aiohttp.ClientSession() as http:
        server.authn.add_token("alice-token", UserInfo("alice"))
        decisions: list[auth.Decision] = []
        server.audit_hooks.append(decisions.append)
        url = f"{server.url}/api/v1/namespaces/default/configmaps"
        headers = {"Authorization": "Bearer alice-token", "Impersonate-User": "bob"}
        async with http.post(url, json={"metadata": {"name": "c"}}, headers=headers) as r:
            assert r.status == 201
        assert [(d.attrs.user.username, d.attrs.verb, d.allowed) for d in decisions] == [
            ("alice", "impersonate", True), ("bob", "create", True)]


@pytest.mark.anyio
async def test_protobuf_reviews_over_http() -> None:
    def pb(number: int, payload: bytes) -> bytes:
        assert len(payload) < 128
        return bytes([number << 3 | 2, len(payload)]) + payload

    def envelope(kind: str, group_version: str, spec: bytes) -> bytes:
        return b"k8s\x00" + pb(1, pb(1, group_version.encode()) + pb(2, kind.encode())) + pb(2, pb(2, spec))

    authz = "/apis/authorization.k8s.io/v1"
    async with APIServer(authorization="RBAC") as server, aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {server.admin_token}", "Content-Type": CONTENT_TYPE,
                   "Accept": f"{CONTENT_TYPE},application/json"}

        async def post(path: str, body: bytes, **extra: str) -> tuple[int, dict[str, Any]]:
            async with http.post(f"{server.url}{path}", data=body, headers={**headers, **extra}) as r:
                if r.status < 300:  # answered in protobuf, the client's first choice
                    assert r.content_type == CONTENT_TYPE
                    return r.status, decode_object(await r.read())
                return r.status, json.loads(await r.read())

        ssar = envelope("SelfSubjectAccessReview", "authorization.k8s.io/v1",
                        pb(1, pb(2, b"list") + pb(5, b"pods")))
        code, body = await post(f"{authz}/selfsubjectaccessreviews", ssar)
        assert code == 201 and body["status"]["allowed"] is True
        assert body["spec"] == {"resourceAttributes": {"verb": "list", "resource": "pods"}}
        code, body = await post(f"{authz}/selfsubjectaccessreviews", ssar, **{"Impersonate-User": "bob"})
        assert code == 201 and body["status"] == {"allowed": False}
        sar = envelope("SubjectAccessReview", "authorization.k8s.io/v1",
                       pb(2, pb(1, b"/healthz") + pb(2, b"get")) + pb(3, b"bob") + pb(4, AUTHENTICATED.encode()))
        code, body = await post(f"{authz}/subjectaccessreviews", sar)
        assert code == 201 and body["status"]["allowed"] is True
        tr = envelope("TokenReview", "authentication.k8s.io/v1", pb(1, server.admin_token.encode()))
        code, body = await post("/apis/authentication.k8s.io/v1/tokenreviews", tr)
        assert code == 201 and body["status"]["user"]["username"] == "admin"
        for garbage in (b"garbage", b"k8s\x00\x12\xff", ssar[:-3]):
            code, body = await post(f"{authz}/selfsubjectaccessreviews", garbage)
            assert (code, body["reason"]) == (400, "BadRequest"), garbage
        # A body in protobuf must be of the kind its URL serves; CBOR is not emulated at all.
        code, body = await post(f"{authz}/selfsubjectaccessreviews", tr)
        assert (code, body["reason"]) == (400, "BadRequest")
        assert "does not match the expected kind (SelfSubjectAccessReview)" in body["message"]
        cbor = {"Content-Type": "application/cbor"}
        code, body = await post("/api/v1/namespaces/default/configmaps", b"\xa0", **cbor)
        assert (code, body["reason"]) == (415, "UnsupportedMediaType")


# ----------------------------------------------------------------------------------------------------------
# The real kubectl


POLICY = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}},
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "robot", "namespace": "team-a"}},
    role("robot", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ], "team-a"),
    binding("robot", "Role", [{"kind": "ServiceAccount", "name": "robot", "namespace": "team-a"}], "team-a"),
    role("robot-metrics", [{"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]}]),
    binding("robot-metrics", "ClusterRole", [{"kind": "ServiceAccount", "name": "robot", "namespace": "team-a"}]),
    role("configmap-reader", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]),
    binding("configmap-reader", "ClusterRole", [{"kind": "Group", "name": "system:serviceaccounts:team-a"}], "team-a"),
    *impersonator_policy(),
]


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=60, check=False,
        )

    def can_i(self, *args: str) -> bool:
        """`kubectl auth can-i`: "yes" and exit 0, or "no" and exit 1 (anything else fails the test)."""
        done = self("auth", "can-i", *args)
        answer = done.stdout.strip()
        assert (answer, done.returncode) in (("yes", 0), ("no", 1)), (args, done.returncode, done.stdout, done.stderr)
        return answer == "yes"


@pytest.fixture
def cluster(tls_rbac_apiserver: RunningServer, tmp_path: Path) -> Iterator[tuple[Kubectl, Kubectl, RunningServer]]:
    """An RBAC-enforcing emulator over TLS with POLICY applied: kubectl as the admin and as alice."""
    rs = tls_rbac_apiserver
    admin = Kubectl(rs.kubeconfig)
    applied = admin("apply", "-f", "-", stdin=yaml.safe_dump_all(POLICY))
    assert applied.returncode == 0, applied.stderr
    rs.run(rs.server.authn.add_token, "alice-token", UserInfo("alice"))
    (tmp_path / "alice.kubeconfig").write_text(rs.server.kubeconfig("alice-token", user="alice"))
    yield admin, Kubectl(tmp_path / "alice.kubeconfig"), rs


def test_kubectl_auth_can_i_as_a_service_account(cluster: tuple[Kubectl, Kubectl, RunningServer]) -> None:
    admin, _, rs = cluster
    decisions: list[auth.Decision] = []
    rs.run(rs.server.audit_hooks.append, decisions.append)
    as_robot = ("--as", ROBOT)
    # Resource requests (kubectl posts them as protobuf SelfSubjectAccessReviews).
    assert admin.can_i("create", "pods", "--subresource", "eviction", "-n", "team-a", *as_robot)
    assert admin.can_i("get", "pods", "-n", "team-a", *as_robot)
    assert not admin.can_i("list", "pods", "-n", "team-a", *as_robot)
    assert not admin.can_i("get", "pods", "-n", "default", *as_robot)
    assert not admin.can_i("create", "pods/eviction", "-n", "team-a", *as_robot)  # TYPE/NAME: the pod "eviction"
    # Non-resource URLs.
    assert admin.can_i("get", "/metrics", *as_robot)
    assert admin.can_i("get", "/debug/pprof", *as_robot)
    assert not admin.can_i("get", "/logs", *as_robot)
    # An impersonated service account is in its groups (system:serviceaccounts:team-a may list configmaps
    # there), unless groups are given, which replace them.
    assert admin.can_i("list", "configmaps", "-n", "team-a", *as_robot)
    assert not admin.can_i("list", "configmaps", "-n", "team-a", *as_robot, "--as-group", "devs")
    assert admin.can_i("list", "configmaps", "-n", "team-a", "--as", "bob", "--as-group", "system:masters")
    # The admin itself (no impersonation) may do anything.
    assert admin.can_i("delete", "nodes")
    reviews = [d.attrs.user for d in decisions if d.attrs.resource == "selfsubjectaccessreviews"]
    assert reviews and all(u.username == ROBOT for u in reviews[:9])
    assert reviews[0].groups == ("system:serviceaccounts", "system:serviceaccounts:team-a", AUTHENTICATED)


def test_kubectl_requests_are_authorized_as_the_impersonated_user(
    cluster: tuple[Kubectl, Kubectl, RunningServer],
) -> None:
    admin, _, _ = cluster
    listed = admin("get", "pods", "-n", "team-a", "--as", ROBOT)
    assert listed.returncode == 1
    assert listed.stderr.strip() == (
        f'Error from server (Forbidden): pods is forbidden: User "{ROBOT}" cannot list resource "pods" in API '
        'group "" in the namespace "team-a"')
    got = admin("get", "pod", "p", "-n", "team-a", "--as", ROBOT)  # get is allowed: the pod is just not there
    assert got.returncode == 1 and 'pods "p" not found' in got.stderr
    assert admin("get", "pods", "-n", "team-a").returncode == 0


def test_kubectl_impersonation_needs_the_impersonate_verb(cluster: tuple[Kubectl, Kubectl, RunningServer]) -> None:
    _, alice, _ = cluster
    denied = alice("auth", "can-i", "get", "pods", "--as", "carol")
    assert denied.returncode == 1
    assert denied.stderr.strip().splitlines()[-1] == (
        'Error from server (Forbidden): users "carol" is forbidden: User "alice" cannot impersonate resource '
        '"users" in API group "" at the cluster scope')
    denied = alice("get", "pods", "--as", "bob", "--as-group", "system:masters")
    assert denied.returncode == 1 and 'groups "system:masters" is forbidden: User "alice" cannot impersonate' in (
        denied.stderr)
    denied = alice("get", "pods", "--as", "system:serviceaccount:default:robot")
    assert denied.returncode == 1 and (
        'serviceaccounts "robot" is forbidden: User "alice" cannot impersonate resource "serviceaccounts" in API '
        'group "" in the namespace "default"') in denied.stderr
    # What alice may impersonate works, and is then only as powerful as the one impersonated.
    assert not alice.can_i("get", "pods", "--as", "bob")
    assert alice.can_i("get", "pods", "-n", "team-a", "--as", ROBOT)
    assert not alice.can_i("get", "pods", "-n", "team-a", "--as", "bob", "--as-group", "devs", "--as-uid", "u-1")
    denied = alice("auth", "can-i", "get", "pods", "--as", "bob", "--as-uid", "u-2")
    assert denied.returncode == 1 and 'uids.authentication.k8s.io "u-2" is forbidden' in denied.stderr
    # can-i answers about the impersonate verb itself like any other.
    assert not alice.can_i("impersonate", "users")
    assert alice.can_i("impersonate", "users/bob")
    assert alice.can_i("impersonate", "serviceaccounts", "-n", "team-a")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

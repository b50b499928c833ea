"""Who is calling and may they: bearer tokens, request attributes, RBAC, TokenReview and SubjectAccessReview.

The emulator enforces RBAC only when asked to; when it does, clients must see the same users, groups, verbs,
decisions and `Forbidden` messages as from a kube-apiserver running `--authorization-mode=RBAC`, so that
`kubectl auth can-i`, TokenReview-based webhooks and least-privilege manifests behave identically.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gpuops_sim.apiserver.errors import Cause, StatusError, bad_request, internal, invalid, qualified

ANONYMOUS = "system:anonymous"
UNAUTHENTICATED = "system:unauthenticated"
AUTHENTICATED = "system:authenticated"
MASTERS = "system:masters"
SA_PREFIX = "system:serviceaccount:"
SA_GROUP = "system:serviceaccounts"
DEFAULT_AUDIENCE = "https://kubernetes.default.svc.cluster.local"

_RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """The `UserInfo` JSON of TokenReview and AdmissionReview (empty fields omitted, as Go does)."""
        out: dict[str, Any] = {}
        if self.username:
            out["username"] = self.username
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


ANONYMOUS_USER = UserInfo(ANONYMOUS, groups=(UNAUTHENTICATED,))


def unauthorized() -> StatusError:
    """What kube-apiserver answers for a bearer token it does not know (even with anonymous auth on)."""
    return StatusError(401, "Unauthorized", "Unauthorized")


@dataclass(frozen=True)
class _Token:
    user: UserInfo
    audiences: tuple[str, ...] | None = None  # None: the API server's audiences (static tokens)
    expires: float | None = None  # wall-clock seconds since the epoch; None: never


class Authenticator:
    """A static token table, like `--token-auth-file`, plus service-account tokens minted on demand.

    Static and legacy service-account tokens are valid for the API server's audiences. Tokens from a
    TokenRequest carry the audiences and expiry they were issued for: the API server accepts one only if it
    names one of its audiences and has not expired (TokenReview checks the same against the asked audiences).
    """

    def __init__(
        self,
        *,
        allow_anonymous: bool = True,
        api_audiences: Sequence[str] = (DEFAULT_AUDIENCE,),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._tokens: dict[str, _Token] = {}
        self.allow_anonymous = allow_anonymous
        self.api_audiences = tuple(api_audiences)
        self.clock = clock

    def add_token(
        self, token: str, user: UserInfo, *, audiences: Sequence[str] | None = None, expires: float | None = None
    ) -> None:
        if not token:
            raise ValueError("empty tokens are never valid")
        self._tokens[token] = _Token(user, None if audiences is None else tuple(audiences), expires)

    def remove_token(self, token: str) -> None:
        self._tokens.pop(token, None)

    def service_account_token(
        self,
        namespace: str,
        name: str,
        uid: str = "",
        *,
        audiences: Sequence[str] | None = None,
        expires: float | None = None,
        extra: Mapping[str, tuple[str, ...]] | None = None,
    ) -> str:
        token = secrets.token_urlsafe(32)
        user = UserInfo(
            username=f"{SA_PREFIX}{namespace}:{name}",
            uid=uid,
            groups=(SA_GROUP, f"{SA_GROUP}:{namespace}", AUTHENTICATED),
            extra=dict(extra or {}),
        )
        self.add_token(token, user, audiences=audiences, expires=expires)
        return token

    def authenticate_token(self, token: str, audiences: Sequence[str] | None = None) -> UserInfo | None:
        """The user behind a token valid for one of `audiences` (default: the API server's), with
        `system:authenticated` added the way the group adder does."""
        entry = self._tokens.get(token) if token else None
        if entry is None:
            return None
        if entry.expires is not None and self.clock() >= entry.expires:
            return None
        wanted = self.api_audiences if audiences is None else tuple(audiences)
        if not set(wanted) & set(self.token_audiences(entry)):
            return None
        user = entry.user
        if AUTHENTICATED in user.groups or UNAUTHENTICATED in user.groups:
            return user
        return UserInfo(user.username, user.uid, (*user.groups, AUTHENTICATED), user.extra)

    def token_audiences(self, entry: _Token) -> tuple[str, ...]:
        return self.api_audiences if entry.audiences is None else entry.audiences

    def audiences_of(self, token: str) -> tuple[str, ...]:
        """The audiences a known token was issued for (empty for an unknown one)."""
        entry = self._tokens.get(token) if token else None
        return () if entry is None else self.token_audiences(entry)

    def authenticate(self, authorization_header: str | None) -> UserInfo | None:
        """None means 401. A header without a bearer token falls through to the anonymous user (upstream)."""
        token = _bearer_token(authorization_header)
        if token is not None:
            return self.authenticate_token(token)
        return ANONYMOUS_USER if self.allow_anonymous else None


def _bearer_token(header: str | None) -> str | None:
    """Upstream splits on single spaces: "Bearer  x" (two spaces) carries an empty token, i.e. none at all."""
    auth = (header or "").strip()
    if not auth:
        return None
    parts = auth.split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


# ----------------------------------------------------------------------------------------------------------
# Request attributes


@dataclass(frozen=True)
class Attributes:
    user: UserInfo
    verb: str
    namespace: str
    api_group: str
    api_version: str
    resource: str
    subresource: str
    name: str
    path: str
    resource_request: bool


@dataclass(frozen=True)
class Decision:
    """One authorization decision, as the API server's audit hooks see it."""

    attrs: Attributes
    allowed: bool
    reason: str


_API_PREFIXES = ("api", "apis")
_SPECIAL_VERBS = ("proxy", "watch")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


def _query_bool(value: str | None) -> bool:
    """Query booleans decode like upstream's parameter codec: anything but "0"/"false" is true."""
    if value is None:
        return False
    return not (value == "0" or value.lower() == "false")


def _exact_name_from_field_selector(selector: str) -> str | None:
    for term in selector.split(","):
        term = term.strip()
        for op in ("==", "="):
            key, sep, value = term.partition(op)
            if sep and not key.endswith("!") and key.strip() == "metadata.name":
                return value.strip()
    return None


def _valid_path_segment(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "%" not in name


def request_attributes(user: UserInfo, method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """Classify a REST request as kube-apiserver's RequestInfoFactory does, for authorization and errors."""
    verb = method.lower()
    trimmed = path.strip("/")
    parts = trimmed.split("/") if trimmed else []

    def non_resource() -> Attributes:
        return Attributes(user, verb, "", "", "", "", "", "", path, False)

    if len(parts) < 3 or parts[0] not in _API_PREFIXES:
        return non_resource()
    prefix, rest = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(rest) < 3:
            return non_resource()
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]

    if rest[0] in _SPECIAL_VERBS:
        if len(rest) < 2:
            raise internal(
                f"failed to create RequestInfo: unable to determine kind and namespace from url {path}"
            )
        verb, rest = rest[0], rest[1:]
    else:
        verb = _METHOD_VERBS.get(method.upper(), "")

    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]

    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 and verb != "proxy" else ""

    if not name and verb == "get":
        verb = "watch" if _query_bool(query.get("watch")) else "list"
        selector = query.get("fieldSelector")
        if selector:
            exact = _exact_name_from_field_selector(selector)
            if exact is not None and _valid_path_segment(exact):
                name = exact
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user, verb, namespace, group, version, resource, subresource, name, path, True)


# ----------------------------------------------------------------------------------------------------------
# Label selectors (shared with admission webhooks' namespace/object selectors)


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """metav1.LabelSelector semantics: None selects nothing, {} selects everything.

    Raises ValueError for an operator upstream would reject.
    """
    if selector is None:
        return False
    have = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if have.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key = expr.get("key", "")
        op = expr.get("operator", "")
        values = list(expr.get("values") or [])
        if op == "In":
            if not values:
                raise ValueError(f"for 'in', 'notin' operators, values set can't be empty: {key}")
            if key not in have or have[key] not in values:
                return False
        elif op == "NotIn":
            if not values:
                raise ValueError(f"for 'in', 'notin' operators, values set can't be empty: {key}")
            if key in have and have[key] in values:
                return False
        elif op == "Exists":
            if key not in have:
                return False
        elif op == "DoesNotExist":
            if key in have:
                return False
        else:
            raise ValueError(f'"{op}" is not a valid label selector operator')
    return True


# ----------------------------------------------------------------------------------------------------------
# RBAC


class RBACSource(Protocol):
    def roles(self, namespace: str) -> Iterable[Mapping[str, Any]]: ...
    def cluster_roles(self) -> Iterable[Mapping[str, Any]]: ...
    def role_bindings(self, namespace: str) -> Iterable[Mapping[str, Any]]: ...
    def cluster_role_bindings(self) -> Iterable[Mapping[str, Any]]: ...
    def cluster_role(self, name: str) -> Mapping[str, Any] | None: ...
    def role(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


class ObjectsRBAC:
    """An RBACSource over a plain list of Role, ClusterRole, RoleBinding and ClusterRoleBinding objects (tests,
    offline checks of manifests), with the same lookups the store-backed source answers."""

    def __init__(self, objects: Iterable[Mapping[str, Any]] = ()) -> None:
        self.objs: list[Mapping[str, Any]] = list(objects)

    def _of(self, kind: str, namespace: str | None = None) -> list[Mapping[str, Any]]:
        return [o for o in self.objs if o.get("kind") == kind
                and (namespace is None or (o.get("metadata") or {}).get("namespace", "") == namespace)]

    def roles(self, namespace: str) -> Iterable[Mapping[str, Any]]:
        return self._of("Role", namespace)

    def cluster_roles(self) -> Iterable[Mapping[str, Any]]:
        return self._of("ClusterRole")

    def role_bindings(self, namespace: str) -> Iterable[Mapping[str, Any]]:
        return self._of("RoleBinding", namespace)

    def cluster_role_bindings(self) -> Iterable[Mapping[str, Any]]:
        return self._of("ClusterRoleBinding")

    def cluster_role(self, name: str) -> Mapping[str, Any] | None:
        return next((o for o in self._of("ClusterRole") if _meta_name(o) == name), None)

    def role(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return next((o for o in self._of("Role", namespace) if _meta_name(o) == name), None)


def _meta_name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def aggregated_rules(cluster_role: Mapping[str, Any], rbac: RBACSource) -> list[dict[str, Any]]:
    """The rules the clusterrole-aggregation controller would write into an aggregated ClusterRole.

    Chains of aggregation are followed to their fixed point (the controller gets there over several passes).
    The server may store the result into the object, as the controller does; authorize() computes it anyway.
    """
    return _resolve_rules(cluster_role, rbac, set())


def _resolve_rules(role: Mapping[str, Any], rbac: RBACSource, seen: set[str]) -> list[dict[str, Any]]:
    agg = role.get("aggregationRule")
    if agg is None:
        return [dict(r) for r in role.get("rules") or []]
    name = _meta_name(role)
    seen = seen | {name}
    selectors = agg.get("clusterRoleSelectors") or []
    candidates = sorted(rbac.cluster_roles(), key=_meta_name)
    out: list[dict[str, Any]] = []
    for selector in selectors:
        for other in candidates:
            other_name = _meta_name(other)
            if other_name in seen:
                continue
            labels = (other.get("metadata") or {}).get("labels") or {}
            try:
                if not label_selector_matches(selector, labels):
                    continue
            except ValueError:
                continue
            for rule in _resolve_rules(other, rbac, seen):
                if rule not in out:
                    out.append(rule)
    return out


def _has(items: Any, wanted: str, wildcard: str = "*") -> bool:
    return any(item in (wildcard, wanted) for item in items or ())


def _resource_matches(rule_resources: Any, combined: str, subresource: str) -> bool:
    for res in rule_resources or ():
        if res in ("*", combined):
            return True
        if subresource and res == "*/" + subresource:
            return True
    return False


def _non_resource_url_matches(urls: Any, path: str) -> bool:
    for url in urls or ():
        if url in ("*", path):
            return True
        if url.endswith("*") and path.startswith(url.rstrip("*")):
            return True
    return False


def rule_allows(attrs: Attributes, rule: Mapping[str, Any]) -> bool:
    """One PolicyRule against one request; resourceNames only ever match requests that carry a name."""
    if not _has(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.resource_request:
        return _non_resource_url_matches(rule.get("nonResourceURLs"), attrs.path)
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    if not _has(rule.get("apiGroups"), attrs.api_group):
        return False
    if not _resource_matches(rule.get("resources"), combined, attrs.subresource):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _subject_applies(user: UserInfo, subject: Mapping[str, Any], binding_namespace: str) -> bool:
    kind = subject.get("kind")
    name = subject.get("name", "")
    if kind == "User":
        return bool(user.username == name)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        sa_namespace = subject.get("namespace") or binding_namespace
        if not sa_namespace:
            return False
        return user.username == f"{SA_PREFIX}{sa_namespace}:{name}"
    return False


def _describe_subject(subject: Mapping[str, Any], binding_namespace: str) -> str:
    kind = subject.get("kind", "")
    name = subject.get("name", "")
    if kind == "ServiceAccount":
        return f'{kind} "{name}/{subject.get("namespace") or binding_namespace}"'
    return f'{kind} "{name}"'


def _role_ref_rules(
    ref: Mapping[str, Any], binding_namespace: str, rbac: RBACSource
) -> tuple[list[dict[str, Any]], str | None]:
    kind = ref.get("kind", "")
    name = ref.get("name", "")
    if kind == "Role":
        role = rbac.role(binding_namespace, name)
        if role is None:
            return [], f'role.{_RBAC_GROUP} "{name}" not found'
        return [dict(r) for r in role.get("rules") or []], None
    if kind == "ClusterRole":
        cluster_role = rbac.cluster_role(name)
        if cluster_role is None:
            return [], f'clusterrole.{_RBAC_GROUP} "{name}" not found'
        return aggregated_rules(cluster_role, rbac), None
    return [], f'unsupported role reference kind: "{kind}"'


def _aggregate_errors(errors: list[str]) -> str:
    """utilerrors.NewAggregate's rendering: one error bare, several deduplicated in brackets."""
    unique = list(dict.fromkeys(errors))
    if len(errors) == 1 or len(unique) == 1:
        return unique[0]
    return "[" + ", ".join(unique) + "]"


def authorize(attrs: Attributes, rbac: RBACSource) -> tuple[bool, str]:
    """system:masters first (the privileged-group authorizer), then RBAC's allow-only rule walk."""
    if MASTERS in attrs.user.groups:
        return True, ""
    errors: list[str] = []
    for binding in rbac.cluster_role_bindings():
        found = _allowing_rule(attrs, binding, "", rbac, errors)
        if found is not None:
            ref = binding.get("roleRef") or {}
            return True, (
                f'RBAC: allowed by ClusterRoleBinding "{_meta_name(binding)}" of {ref.get("kind", "")} '
                f'"{ref.get("name", "")}" to {found}'
            )
    if attrs.namespace:
        for binding in rbac.role_bindings(attrs.namespace):
            found = _allowing_rule(attrs, binding, attrs.namespace, rbac, errors)
            if found is not None:
                ref = binding.get("roleRef") or {}
                return True, (
                    f'RBAC: allowed by RoleBinding "{_meta_name(binding)}/{attrs.namespace}" of '
                    f'{ref.get("kind", "")} "{ref.get("name", "")}" to {found}'
                )
    return False, ("RBAC: " + _aggregate_errors(errors)) if errors else ""


def _allowing_rule(
    attrs: Attributes, binding: Mapping[str, Any], namespace: str, rbac: RBACSource, errors: list[str]
) -> str | None:
    """The description of the subject through which `binding` allows the request, or None."""
    subjects = binding.get("subjects") or []
    subject = next((s for s in subjects if _subject_applies(attrs.user, s, namespace)), None)
    if subject is None:
        return None
    rules, error = _role_ref_rules(binding.get("roleRef") or {}, namespace, rbac)
    if error is not None:
        errors.append(error)
        return None
    if any(rule_allows(attrs, rule) for rule in rules):
        return _describe_subject(subject, namespace)
    return None


def forbidden(attrs: Attributes, reason: str = "") -> StatusError:
    """The 403 of responsewriters.Forbidden; `reason` is the authorizer's (e.g. a missing role) if any."""
    user = attrs.user.username
    if not attrs.resource_request:
        what = f'User "{user}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        group = attrs.api_group
        what = f'User "{user}" cannot {attrs.verb} resource "{resource}" in API group "{group}" {where}'
    if reason:
        what = f"{what}: {reason}"
    if not attrs.resource and not attrs.api_group:
        message = f"forbidden: {what}"
    elif attrs.name:
        message = f'{qualified(attrs.resource, attrs.api_group)} "{attrs.name}" is forbidden: {what}'
    else:
        message = f"{qualified(attrs.resource, attrs.api_group)} is forbidden: {what}"
    return StatusError(403, "Forbidden", message, name=attrs.name, group=attrs.api_group, kind=attrs.resource)


# ----------------------------------------------------------------------------------------------------------
# User impersonation (`kubectl --as/--as-group/--as-uid`): the Impersonate-* headers, authorized like
# kube-apiserver's impersonation filter does before the request itself is authorized as the new user.

IMPERSONATE_USER = "Impersonate-User"
IMPERSONATE_GROUP = "Impersonate-Group"
IMPERSONATE_UID = "Impersonate-Uid"
IMPERSONATE_EXTRA_PREFIX = "Impersonate-Extra-"
_AUTHN_GROUP = "authentication.k8s.io"
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PERCENT_ESCAPES = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class ImpersonationRequest:
    """One thing a request asks to act as; its `impersonate` check is on `resource` (see attributes())."""

    kind: str  # "User", "ServiceAccount", "Group", "UserExtra" or "UID"
    name: str
    namespace: str = ""
    extra_key: str = ""

    def attributes(self, requester: UserInfo) -> Attributes:
        """What the requester must be allowed: verb impersonate on users/groups/serviceaccounts (core group)
        or uids/userextras/<key> (authentication.k8s.io), named like the impersonated value."""
        resource, group, version, subresource = {
            "User": ("users", "", "", ""),
            "ServiceAccount": ("serviceaccounts", "", "", ""),
            "Group": ("groups", "", "", ""),
            "UserExtra": ("userextras", _AUTHN_GROUP, "v1", self.extra_key),
            "UID": ("uids", _AUTHN_GROUP, "v1", ""),
        }[self.kind]
        return Attributes(requester, "impersonate", self.namespace, group, version, resource, subresource,
                          self.name, "", True)

    def go_string(self) -> str:
        """How Go's %v prints the v1.ObjectReference upstream builds for it (in its one error message)."""
        api_version = "authentication.k8s.io/v1" if self.kind in ("UserExtra", "UID") else ""
        return "{" + " ".join((self.kind, self.namespace, self.name, "", api_version, "", self.extra_key)) + "}"


class ImpersonationHeaderError(ValueError):
    """Impersonation headers that cannot be honoured (groups, uid or extras without a user): upstream answers
    these with a plain-text 500 (responsewriters.InternalError), not a Status."""

    def response_text(self, request_uri: str) -> str:
        return f"Internal Server Error: {json.dumps(request_uri)}: {self}\n"


def split_service_account_username(username: str) -> tuple[str, str] | None:
    """(namespace, name) of a `system:serviceaccount:<ns>:<name>` username with a valid namespace and name."""
    if not username.startswith(SA_PREFIX):
        return None
    parts = username[len(SA_PREFIX):].split(":")
    if len(parts) != 2:
        return None
    namespace, name = parts
    if len(namespace) > 63 or not _DNS1123_LABEL.fullmatch(namespace):
        return None
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        return None
    return namespace, name


def _unescape_extra_key(key: str) -> str:
    """Extra keys travel lower-cased and percent-encoded in header names; a malformed escape is kept as is."""
    if _PERCENT_ESCAPES.search(key):
        return key
    return urllib.parse.unquote(key)


def impersonation_requests(headers: Iterable[tuple[str, str]]) -> list[ImpersonationRequest]:
    """The impersonation a request's headers ask for, in upstream's order: user, groups, extras, uid.

    Header names are matched case-insensitively; every Impersonate-Group (and Impersonate-Extra-*) header
    line is one value. Raises ImpersonationHeaderError for groups, extras or a uid without a user.
    """
    users: list[str] = []
    groups: list[str] = []
    uids: list[str] = []
    extras: list[ImpersonationRequest] = []
    extra_prefix = IMPERSONATE_EXTRA_PREFIX.lower()
    for name, value in headers:
        lower = name.lower()
        if lower == IMPERSONATE_USER.lower():
            users.append(value)
        elif lower == IMPERSONATE_GROUP.lower():
            groups.append(value)
        elif lower == IMPERSONATE_UID.lower():
            uids.append(value)
        elif lower.startswith(extra_prefix):
            key = _unescape_extra_key(lower[len(extra_prefix):])
            extras.append(ImpersonationRequest("UserExtra", value, extra_key=key))
    out: list[ImpersonationRequest] = []
    user = users[0] if users else ""  # like http.Header.Get: the first value
    if user:
        sa = split_service_account_username(user)
        if sa is not None:
            out.append(ImpersonationRequest("ServiceAccount", sa[1], namespace=sa[0]))
        else:
            out.append(ImpersonationRequest("User", user))
    out.extend(ImpersonationRequest("Group", g) for g in groups)
    out.extend(extras)
    uid = uids[0] if uids else ""
    if uid:
        out.append(ImpersonationRequest("UID", uid))
    if (groups or extras or uid) and not user:
        shown = "[" + " ".join(r.go_string() for r in out) + "]"
        raise ImpersonationHeaderError(f"requested {shown} without impersonating a user")
    return out


def impersonate(
    requester: UserInfo,
    headers: Iterable[tuple[str, str]],
    check: Callable[[Attributes], tuple[bool, str]],
) -> UserInfo:
    """The user a request acts as: `requester`, or whom its Impersonate-* headers name once `check` (the
    authorizer, e.g. RBAC) allowed the requester every one of them; the first denied one is a 403 about the
    requester (`users "bob" is forbidden: User "alice" cannot impersonate resource "users" ...`).

    Like upstream: impersonated groups are exactly those asked for; without any, a service account gets
    system:serviceaccounts and system:serviceaccounts:<namespace>; system:authenticated is added unless
    system:authenticated or system:unauthenticated was asked for (system:anonymous gets
    system:unauthenticated instead). Nothing of the requester (groups, extra, uid) carries over.
    """
    requests = impersonation_requests(headers)
    if not requests:
        return requester
    username = uid = ""
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    groups_specified = any(r.kind == "Group" for r in requests)
    for req in requests:
        attrs = req.attributes(requester)
        allowed, reason = check(attrs)
        if not allowed:
            raise forbidden(attrs, reason)
        if req.kind == "ServiceAccount":
            username = f"{SA_PREFIX}{req.namespace}:{req.name}"
            if not groups_specified:
                groups = [SA_GROUP, f"{SA_GROUP}:{req.namespace}"]
        elif req.kind == "User":
            username = req.name
        elif req.kind == "Group":
            groups.append(req.name)
        elif req.kind == "UserExtra":
            extra.setdefault(req.extra_key, []).append(req.name)
        else:
            uid = req.name
    if username != ANONYMOUS:
        if AUTHENTICATED not in groups and UNAUTHENTICATED not in groups:
            groups.append(AUTHENTICATED)
    elif UNAUTHENTICATED not in groups:
        groups.append(UNAUTHENTICATED)
    return UserInfo(username, uid, tuple(groups), {k: tuple(v) for k, v in extra.items()})


# ----------------------------------------------------------------------------------------------------------
# TokenReview / SubjectAccessReview


def _review_shell(body: Mapping[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(body))
    out["apiVersion"] = api_version
    out["kind"] = kind
    out.setdefault("metadata", {})
    out.setdefault("spec", {})
    return out


def token_review(body: Mapping[str, Any], authn: Authenticator) -> dict[str, Any]:
    """authentication.k8s.io/v1 TokenReview: status as upstream serializes it (false/empty fields omitted)."""
    spec = body.get("spec") or {}
    token = spec.get("token") or ""
    if not token:
        raise bad_request("token is required for TokenReview in authentication")
    out = _review_shell(body, "authentication.k8s.io/v1", "TokenReview")
    wanted = list(spec.get("audiences") or []) or list(authn.api_audiences)
    audiences = [a for a in authn.audiences_of(token) if a in wanted]
    user = authn.authenticate_token(token, audiences) if audiences else None
    if user is None:
        out["status"] = {"user": {}, "error": "invalid bearer token"}
        return out
    out["status"] = {"authenticated": True, "user": user.to_dict(), "audiences": audiences}
    return out


# ----------------------------------------------------------------------------------------------------------
# TokenRequest (serviceaccounts/token)

MIN_TOKEN_SECONDS = 600
MAX_TOKEN_SECONDS = 1 << 32
DEFAULT_TOKEN_SECONDS = 3600
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
_BOUND_KINDS = ("Pod", "Secret", "Node")


def _pod_node_extra(pod: Mapping[str, Any], bound_object: Callable[[str, str, str], Mapping[str, Any] | None]
                    ) -> dict[str, tuple[str, ...]]:
    """A token bound to a scheduled pod also names the pod's node (as kube-apiserver does since 1.30): node
    agents are confined to their node by admission policies that compare it with what they write."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if not node:
        return {}
    found = bound_object("Node", "", node)
    if found is None:
        return {}
    uid = str((found.get("metadata") or {}).get("uid", ""))
    return {"authentication.kubernetes.io/node-name": (node,), "authentication.kubernetes.io/node-uid": (uid,)}


def pod_bound_extra(pod: Mapping[str, Any], bound_object: Callable[[str, str, str], Mapping[str, Any] | None]
                    ) -> dict[str, tuple[str, ...]]:
    """The user extra of a token bound to `pod` (pod and node names and uids, and a credential id)."""
    meta = pod.get("metadata") or {}
    extra: dict[str, tuple[str, ...]] = {"authentication.kubernetes.io/pod-name": (str(meta.get("name", "")),),
             "authentication.kubernetes.io/pod-uid": (str(meta.get("uid", "")),),
             CREDENTIAL_ID: (f"JTI={uuid.uuid4()}",)}
    extra.update(_pod_node_extra(pod, bound_object))
    return extra


def _token_seconds(spec: Mapping[str, Any], causes: list[Cause]) -> int:
    """spec.expirationSeconds, defaulted to an hour; a lifetime out of bounds is a cause, a non-integer a 400."""
    seconds = spec.get("expirationSeconds")
    if seconds is None:
        seconds = DEFAULT_TOKEN_SECONDS
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise bad_request("TokenRequest: spec.expirationSeconds must be an integer")
    if seconds < MIN_TOKEN_SECONDS:
        causes.append(Cause("FieldValueInvalid", f"Invalid value: {seconds}: may not specify a duration less "
                            "than 10 minutes", "spec.expirationSeconds"))
    elif seconds > MAX_TOKEN_SECONDS:
        causes.append(Cause("FieldValueTooLong", f"Invalid value: {seconds}: may not specify a duration "
                            "larger than 2^32 seconds", "spec.expirationSeconds"))
    return seconds


def _bound_object_extra(
    spec: dict[str, Any],
    namespace: str,
    bound_object: Callable[[str, str, str], Mapping[str, Any] | None] | None,
    causes: list[Cause],
) -> dict[str, tuple[str, ...]]:
    """The user extra naming spec.boundObjectRef's object (which must exist, with the uid given if any); the
    ref in `spec` gets the object's uid. An unsupported kind is a cause."""
    ref = spec.get("boundObjectRef")
    if not ref:
        return {}
    ref_kind, ref_name, ref_uid = str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", ""))
    if ref_kind not in _BOUND_KINDS:
        causes.append(Cause("FieldValueNotSupported", f'Unsupported value: "{ref_kind}": supported values: '
                            + ", ".join(f'"{k}"' for k in _BOUND_KINDS), "spec.boundObjectRef.kind"))
        return {}
    if bound_object is None:
        return {}
    obj = bound_object(ref_kind, namespace if ref_kind != "Node" else "", ref_name)
    obj_uid = str(((obj or {}).get("metadata") or {}).get("uid", ""))
    if obj is None or (ref_uid and ref_uid != obj_uid):
        what = f"{ref_kind.lower()}s" if ref_kind != "Node" else "nodes"
        raise StatusError(404, "NotFound", f'{what} "{ref_name}" not found', name=ref_name, kind=what)
    key = {"Pod": "pod", "Secret": "secret", "Node": "node"}[ref_kind]
    extra: dict[str, tuple[str, ...]] = {
        f"authentication.kubernetes.io/{key}-name": (ref_name,),
        f"authentication.kubernetes.io/{key}-uid": (obj_uid,),
    }
    if ref_kind == "Pod":
        extra.update(_pod_node_extra(obj or {}, bound_object))
    spec["boundObjectRef"] = dict(ref, uid=obj_uid)
    return extra


def _token_response(name: str, namespace: str, spec: dict[str, Any], token: str, expires: float) -> dict[str, Any]:
    """The TokenRequest as answered: the defaulted spec and the token with its expiry."""
    stamp = datetime.fromtimestamp(int(expires), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace,
                     "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": stamp},
    }


def token_request(
    body: Any,
    service_account: Mapping[str, Any],
    authn: Authenticator,
    bound_object: Callable[[str, str, str], Mapping[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """authentication.k8s.io/v1 TokenRequest: a bearer token for `service_account` (what `kubectl create
    token` posts). Validation and defaults follow the REST docs: audiences default to the API server's,
    expirationSeconds to 3600 and must be at least 600; a bound object must exist (and match its uid).
    """
    if not isinstance(body, Mapping):
        raise bad_request("the body of a TokenRequest must be an object")
    kind = body.get("kind")
    if kind not in (None, "", "TokenRequest"):
        raise bad_request(f'TokenRequest: kind must be "TokenRequest", not {kind!r}')
    meta = service_account.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    spec = dict(body.get("spec") or {})
    causes: list[Cause] = []
    seconds = _token_seconds(spec, causes)
    audiences = [str(a) for a in spec.get("audiences") or []] or list(authn.api_audiences)
    extra = _bound_object_extra(spec, namespace, bound_object, causes)
    if causes:
        raise invalid("TokenRequest", "authentication.k8s.io", name, causes)
    # Like upstream, the token's ID reaches authorizers and audit as user extra (one per issued token).
    extra[CREDENTIAL_ID] = (f"JTI={uuid.uuid4()}",)
    expires = authn.clock() + seconds
    token = authn.service_account_token(namespace, name, str(meta.get("uid", "")), audiences=audiences,
                                        expires=expires, extra=extra)
    spec["audiences"] = audiences
    spec["expirationSeconds"] = seconds
    return _token_response(name, namespace, spec, token, expires)


def _sar_attributes(spec: Mapping[str, Any], user: UserInfo, kind: str) -> Attributes:
    res = spec.get("resourceAttributes")
    non = spec.get("nonResourceAttributes")
    causes: list[Cause] = []
    one_of = "exactly one of nonResourceAttributes or resourceAttributes must be specified"
    if res is not None and non is not None:
        shown = json.dumps(non, separators=(",", ":"))
        causes.append(Cause("FieldValueInvalid", f"Invalid value: {shown}: {one_of}", "spec"))
    if res is None and non is None:
        causes.append(Cause("FieldValueInvalid", f"Invalid value: null: {one_of}", "spec"))
    if kind == "SubjectAccessReview" and not user.username and not user.groups:
        no_subject = 'Invalid value: "": at least one of user or group must be specified'
        causes.append(Cause("FieldValueInvalid", no_subject, "spec.user"))
    if causes:
        raise invalid(kind, "authorization.k8s.io", "", causes)
    if res is not None:
        return Attributes(
            user=user,
            verb=str(res.get("verb") or ""),
            namespace=str(res.get("namespace") or ""),
            api_group=str(res.get("group") or ""),
            api_version=str(res.get("version") or "*"),
            resource=str(res.get("resource") or ""),
            subresource=str(res.get("subresource") or ""),
            name=str(res.get("name") or ""),
            path="",
            resource_request=True,
        )
    assert non is not None
    verb, path = str(non.get("verb") or ""), str(non.get("path") or "")
    return Attributes(user, verb, "", "", "", "", "", "", path, False)


def _sar_status(attrs: Attributes, rbac: RBACSource) -> dict[str, Any]:
    allowed, reason = authorize(attrs, rbac)
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    return status


def subject_access_review(body: Mapping[str, Any], rbac: RBACSource) -> dict[str, Any]:
    """authorization.k8s.io/v1 SubjectAccessReview: the subject is taken literally (no groups are added)."""
    spec = body.get("spec") or {}
    extra = {k: tuple(v or ()) for k, v in (spec.get("extra") or {}).items()}
    groups = tuple(spec.get("groups") or ())
    user = UserInfo(str(spec.get("user") or ""), str(spec.get("uid") or ""), groups, extra)
    attrs = _sar_attributes(spec, user, "SubjectAccessReview")
    out = _review_shell(body, "authorization.k8s.io/v1", "SubjectAccessReview")
    out["status"] = _sar_status(attrs, rbac)
    return out


def self_subject_access_review(body: Mapping[str, Any], user: UserInfo, rbac: RBACSource) -> dict[str, Any]:
    """What `kubectl auth can-i` posts: the same review, for the requesting user."""
    spec = body.get("spec") or {}
    attrs = _sar_attributes(spec, user, "SelfSubjectAccessReview")
    out = _review_shell(body, "authorization.k8s.io/v1", "SelfSubjectAccessReview")
    out["status"] = _sar_status(attrs, rbac)
    return out


# ----------------------------------------------------------------------------------------------------------
# Bootstrap policy


def _bootstrap_meta(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    }


def _bootstrap_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": f"{_RBAC_GROUP}/v1", "kind": "ClusterRole", "metadata": _bootstrap_meta(name), "rules": rules}


def _bootstrap_binding(name: str, groups: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{_RBAC_GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _bootstrap_meta(name),
        "roleRef": {"apiGroup": _RBAC_GROUP, "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": _RBAC_GROUP, "kind": "Group", "name": g} for g in groups],
    }


def _bootstrap_roles() -> list[dict[str, Any]]:
    """The default ClusterRoles: full access for system:masters, and what every client needs to discover."""
    public_info = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
    return [
        _bootstrap_role(
            "cluster-admin",
            [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ],
        ),
        _bootstrap_role(
            "system:discovery",
            [
                {
                    "nonResourceURLs": [
                        "/api",
                        "/api/*",
                        "/apis",
                        "/apis/*",
                        "/openapi",
                        "/openapi/*",
                        *public_info,
                    ],
                    "verbs": ["get"],
                }
            ],
        ),
        _bootstrap_role("system:public-info-viewer", [{"nonResourceURLs": public_info, "verbs": ["get"]}]),
        _bootstrap_role(
            "system:basic-user",
            [
                {
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    "verbs": ["create"],
                },
                {
                    "apiGroups": ["authentication.k8s.io"],
                    "resources": ["selfsubjectreviews"],
                    "verbs": ["create"],
                },
            ],
        ),
    ]


def bootstrap_policy() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The default ClusterRoles and ClusterRoleBindings any authenticated client relies on (discovery, can-i).

    A subset of kube-apiserver's bootstrap policy; the server seeds these when it turns RBAC on.
    """
    bindings = [
        _bootstrap_binding("cluster-admin", [MASTERS]),
        _bootstrap_binding("system:discovery", [AUTHENTICATED]),
        _bootstrap_binding("system:public-info-viewer", [AUTHENTICATED, UNAUTHENTICATED]),
        _bootstrap_binding("system:basic-user", [AUTHENTICATED]),
    ]
    return _bootstrap_roles(), bindings

"""Helpers of test_install_rbac.py: what our ServiceAccounts asked the API server, and which RBAC rule each
request needs.

`AuditLog` keeps every authorization decision the emulated API server makes (its audit hook). `PolicySet` is
an in-memory RBAC source built from snapshots of the installed objects, narrowed to some bindings and with
rules edited, so the recorded requests can be re-authorized against "the install minus one rule" with the
API server's own `authorize()`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpuops_sim.apiserver import APIServer
from gpuops_sim.apiserver.auth import CREDENTIAL_ID, Attributes, Decision, ObjectsRBAC, authorize

RBAC_GROUP = "rbac.authorization.k8s.io"


class AuditLog:
    """Every authorization decision of one API server, in order."""

    def __init__(self, server: APIServer) -> None:
        self.decisions: list[Decision] = []
        server.audit_hooks.append(self.decisions.append)

    def of_user(self, username: str) -> list[Decision]:
        return [d for d in self.decisions if d.attrs.user.username == username]

    def of_credential(self, credential: str) -> list[Attributes]:
        return [d.attrs for d in self.decisions if d.attrs.user.extra.get(CREDENTIAL_ID, ()) == (credential,)]

    def denied(self, usernames: Iterable[str]) -> list[Decision]:
        users = set(usernames)
        return [d for d in self.decisions if d.attrs.user.username in users and not d.allowed]


def describe(attrs: Attributes) -> str:
    if not attrs.resource_request:
        return f"{attrs.verb} {attrs.path}"
    res = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    where = f" -n {attrs.namespace}" if attrs.namespace else ""
    name = f" {attrs.name}" if attrs.name else ""
    return f"{attrs.verb} {res}.{attrs.api_group or 'core'}{name}{where}"


# ------------------------------------------------------------------------------------------------ policies


@dataclass(frozen=True)
class RuleEdit:
    """One thing to take out of a role: a whole rule, or one verb / resource / nonResourceURL of it."""

    kind: str  # "Role" or "ClusterRole"
    namespace: str
    role: str
    index: int
    field: str | None = None  # None: the whole rule; else "verbs", "resources" or "nonResourceURLs"
    value: str | None = None

    def apply(self, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = copy.deepcopy(rules)
        if self.field is None:
            del out[self.index]
            return out
        kept = [v for v in out[self.index][self.field] if v != self.value]
        if kept:
            out[self.index][self.field] = kept
        else:
            del out[self.index]
        return out

    def __str__(self) -> str:
        where = f"Role {self.namespace}/{self.role}" if self.kind == "Role" else f"ClusterRole {self.role}"
        what = "the whole rule" if self.field is None else f"{self.field} {self.value!r}"
        return f"{where} rule #{self.index}: {what}"


def edits_of(role: Mapping[str, Any]) -> Iterator[RuleEdit]:
    """The rule itself, then each verb and each resource (or URL) of it when it lists several."""
    meta = role["metadata"]
    for i, rule in enumerate(role.get("rules") or []):
        base = RuleEdit(role["kind"], meta.get("namespace", ""), meta["name"], i)
        yield base
        for field in ("verbs", "resources", "nonResourceURLs"):
            values = rule.get(field) or []
            if len(values) > 1:
                for v in values:
                    yield RuleEdit(base.kind, base.namespace, base.role, i, field, v)


class PolicySet(ObjectsRBAC):
    """An RBAC source (auth.RBACSource) over snapshots of RBAC objects, optionally with one rule edited."""

    def __init__(self, objects: Iterable[Mapping[str, Any]], edit: RuleEdit | None = None) -> None:
        objs = [copy.deepcopy(dict(o)) for o in objects]
        if edit is not None:
            for o in objs:
                m = o["metadata"]
                if o["kind"] == edit.kind and m["name"] == edit.role and m.get("namespace", "") == edit.namespace:
                    o["rules"] = edit.apply(o.get("rules") or [])
        super().__init__(objs)


    def denied(self, requests: Iterable[Attributes]) -> list[Attributes]:
        return [a for a in requests if not authorize(a, self)[0]]


def snapshot(server: APIServer) -> list[dict[str, Any]]:
    """Every Role, ClusterRole and binding the API server holds now (with their kinds filled in)."""
    out: list[dict[str, Any]] = []
    for resource, kind in (("roles", "Role"), ("clusterroles", "ClusterRole"), ("rolebindings", "RoleBinding"),
                           ("clusterrolebindings", "ClusterRoleBinding")):
        for stored in server.store.iter((RBAC_GROUP, resource)):
            out.append(dict(copy.deepcopy(stored.obj), kind=kind))
    return out


def narrowed(objects: Iterable[Mapping[str, Any]], keep_roles: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """All roles, the bootstrap bindings (discovery, can-i), and only the bindings of our ServiceAccounts to
    the roles in `keep_roles` ((kind, name) pairs): the policy of a process granted exactly those roles."""
    keep = set(keep_roles)
    out = []
    for o in objects:
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            labels = o["metadata"].get("labels") or {}
            ref = o.get("roleRef") or {}
            ours = labels.get("app.kubernetes.io/part-of") == "gpuops"
            if ours and (ref.get("kind"), ref.get("name")) not in keep:
                continue
        out.append(dict(o))
    return out

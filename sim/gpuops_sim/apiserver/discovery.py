"""Discovery documents (/version, /api, /apis, legacy and aggregated) and content negotiation.

kubectl resolves every resource name, short name and category through these documents before it sends
a single object request, so their shapes follow the upstream wire format field by field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.resources import ResourceInfo

SERVER_VERSION = "v1.37.0-gpuops"  # the wire format (protobuf table) and behaviour it emulates
AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
JSON = "application/json"

# Subresources whose body is a kind of another group-version (everything else shares the parent's GV).
_FOREIGN_SUBRESOURCE_KINDS: dict[str, tuple[str, str]] = {
    "Eviction": ("policy", "v1"),
    "Scale": ("autoscaling", "v1"),
    "TokenRequest": ("authentication.k8s.io", "v1"),
}

_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_info() -> dict[str, Any]:
    """`GET /version`. The build fields are stable so tests can compare them."""
    major, minor = SERVER_VERSION[1:].split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": SERVER_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-08-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str | None = None) -> dict[str, Any]:
    """`GET /api`. Clients ignore the CIDR table, but it must be a list, not null."""
    cidrs = [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}] if server_address else []
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidrs}


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key of Kubernetes version priority: GA > beta > alpha, higher numbers first, others last."""
    m = _VERSION_RE.match(version)
    if m is None:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), version)


def served_groups(infos: Iterable[ResourceInfo]) -> dict[str, list[str]]:
    """Group -> versions by priority; groups keep the order in which the caller lists them."""
    out: dict[str, list[str]] = {}
    for info in infos:
        versions = out.setdefault(info.group, [])
        if info.version not in versions:
            versions.append(info.version)
    for versions in out.values():
        versions.sort(key=version_priority)
    return out


def api_group_list(infos: Sequence[ResourceInfo]) -> dict[str, Any]:
    """`GET /apis` legacy document: every non-core group with its preferred version."""
    groups = []
    for group, versions in served_groups(infos).items():
        if not group:
            continue
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        groups.append({"name": group, "versions": gvs, "preferredVersion": dict(gvs[0])})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def subresource_kind(info: ResourceInfo, kind: str) -> tuple[str, str, str]:
    """(group, version, kind) of a subresource's body: eviction is policy/v1, status is the parent's."""
    group, version = _FOREIGN_SUBRESOURCE_KINDS.get(kind, (info.group, info.version))
    return group, version, kind


def _of(infos: Sequence[ResourceInfo], group: str, version: str) -> list[ResourceInfo]:
    return sorted((i for i in infos if i.group == group and i.version == version), key=lambda i: i.resource)


def api_resource_list(infos: Sequence[ResourceInfo], group_version: str) -> dict[str, Any] | None:
    """`GET /api/v1`, `GET /apis/{g}/{v}`; None when nothing is served there (-> 404)."""
    group, _, version = group_version.rpartition("/")
    served = _of(infos, group, version)
    if not served:
        return None
    resources: list[dict[str, Any]] = []
    for info in served:
        entry: dict[str, Any] = {
            "name": info.resource,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": sorted(info.verbs),
        }
        if info.short_names:
            entry["shortNames"] = list(info.short_names)
        if info.categories:
            entry["categories"] = list(info.categories)
        resources.append(entry)
        for sub in sorted(info.subresources):
            sub_kind, sub_verbs = info.subresources[sub]
            sub_group, sub_version, _ = subresource_kind(info, sub_kind)
            sub_entry: dict[str, Any] = {
                "name": f"{info.resource}/{sub}",
                "singularName": "",
                "namespaced": info.namespaced,
            }
            if (sub_group, sub_version) != (info.group, info.version):
                sub_entry["group"] = sub_group
                sub_entry["version"] = sub_version
            sub_entry["kind"] = sub_kind
            sub_entry["verbs"] = sorted(sub_verbs)
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _resource_discovery(info: ResourceInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "resource": info.resource,
        "responseKind": {"group": info.group, "version": info.version, "kind": info.kind},
        "scope": "Namespaced" if info.namespaced else "Cluster",
        "singularResource": info.singular,
        "verbs": sorted(info.verbs),
    }
    if info.short_names:
        entry["shortNames"] = list(info.short_names)
    if info.categories:
        entry["categories"] = list(info.categories)
    subs = []
    for sub in sorted(info.subresources):
        sub_kind, sub_verbs = info.subresources[sub]
        g, v, k = subresource_kind(info, sub_kind)
        kind_ref = {"group": g, "version": v, "kind": k}
        subs.append({"subresource": sub, "responseKind": kind_ref, "verbs": sorted(sub_verbs)})
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated_discovery(infos: Sequence[ResourceInfo], *, core: bool, version: str) -> dict[str, Any]:
    """`APIGroupDiscoveryList` for `/api` (core) or `/apis`; `version` is "v2" or "v2beta1"."""
    if version not in ("v2", "v2beta1"):
        raise ValueError(f"unknown aggregated discovery version {version!r}")
    items = []
    for group, versions in served_groups(infos).items():
        if bool(group) == core:
            continue
        metadata: dict[str, Any] = {"creationTimestamp": None}
        if group:
            metadata["name"] = group
        items.append(
            {
                "metadata": metadata,
                "versions": [
                    {
                        "version": v,
                        "resources": [_resource_discovery(i) for i in _of(infos, group, v)],
                        "freshness": "Current",
                    }
                    for v in versions
                ],
            }
        )
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": f"apidiscovery.k8s.io/{version}",
        "metadata": {},
        "items": items,
    }


class MediaRange:
    """One entry of an Accept header."""

    __slots__ = ("params", "q", "subtype", "type")

    def __init__(self, type_: str, subtype: str, params: dict[str, str], q: float) -> None:
        self.type = type_
        self.subtype = subtype
        self.params = params
        self.q = q

    def matches_json(self) -> bool:
        return (self.type, self.subtype) in (("application", "json"), ("application", "*"), ("*", "*"))


def parse_accept(accept: str | None) -> list[MediaRange]:
    """Accept entries in preference order: by q-value, ties in the client's order; q=0 entries dropped."""
    ranges: list[MediaRange] = []
    for raw in (accept or "").split(","):
        parts = [p.strip() for p in raw.split(";")]
        if not parts[0]:
            continue
        type_, _, subtype = parts[0].lower().partition("/")
        params: dict[str, str] = {}
        q = 1.0
        for p in parts[1:]:
            key, _, value = p.partition("=")
            key = key.strip().lower()
            value = value.strip().strip('"')
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            elif key:
                params[key] = value
        if q > 0:
            ranges.append(MediaRange(type_, subtype or "*", params, q))
    ranges.sort(key=lambda r: -r.q)  # stable: equal q keeps the client's order
    return ranges


def _not_acceptable(accepted: Sequence[str]) -> StatusError:
    return StatusError(
        406, "NotAcceptable", f"only the following media types are accepted: {', '.join(accepted)}"
    )


def negotiate_discovery(accept: str | None) -> tuple[str, str]:
    """Aggregated v2/v2beta1 or legacy discovery for `/api` and `/apis` -> (mode, Content-Type)."""
    if not (accept or "").strip():
        return "legacy", JSON
    for r in parse_accept(accept):
        if not r.matches_json():
            continue
        as_ = r.params.get("as")
        if as_ is None:
            return "legacy", JSON
        if (
            r.subtype == "json"
            and as_ == "APIGroupDiscoveryList"
            and r.params.get("g") == "apidiscovery.k8s.io"
            and r.params.get("v") in ("v2", "v2beta1")
        ):
            v = r.params["v"]
            return v, AGGREGATED_V2 if v == "v2" else AGGREGATED_V2BETA1
    raise _not_acceptable([JSON, AGGREGATED_V2, AGGREGATED_V2BETA1])


PROTOBUF = "application/vnd.kubernetes.protobuf"


def negotiate_object(accept: str | None, protobuf: bool = False) -> str:
    """Representation of a resource GET/LIST/WATCH: "table-v1", "table-v1beta1", "protobuf" or "json".

    Protobuf is offered for built-in kinds only (`protobuf`), as upstream serves custom resources and
    Tables in JSON alone; the client's first acceptable choice wins, so a typed Go client that lists
    protobuf first gets protobuf."""
    if not (accept or "").strip():
        return "json"
    for r in parse_accept(accept):
        if protobuf and f"{r.type}/{r.subtype}" == PROTOBUF and "as" not in r.params:
            return "protobuf"
        if not r.matches_json():
            continue
        as_ = r.params.get("as")
        if as_ is None:
            return "json"
        if r.subtype == "json" and as_ == "Table" and r.params.get("g") == "meta.k8s.io":
            if r.params.get("v") == "v1":
                return "table-v1"
            if r.params.get("v") == "v1beta1":
                return "table-v1beta1"
    raise _not_acceptable([JSON, PROTOBUF] if protobuf else [JSON])

"""Turning a REST path into (group, version, resource, namespace, name, subresource)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    group: str
    version: str
    resource: str = ""  # empty: the group-version discovery document itself
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    namespaced_path: bool = False  # the URL carried /namespaces/{ns}/
    legacy_watch: bool = False  # the deprecated /watch/ prefix


def parse_path(path: str) -> Route | None:
    """None for paths that are not under /api/v1 or /apis/{group}/{version}."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None
    if parts[0] == "api":
        if len(parts) < 2:
            return None
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis":
        if len(parts) < 3:
            return None
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    legacy_watch = False
    if rest and rest[0] == "watch":
        legacy_watch = True
        rest = rest[1:]
    if not rest:
        return Route(group, version, legacy_watch=legacy_watch)
    namespace = ""
    namespaced_path = False
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace = rest[1]
        namespaced_path = True
        rest = rest[2:]
    elif rest[0] == "namespaces" and len(rest) >= 2:
        namespace = rest[1]
    if len(rest) > 3:
        return None
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    return Route(group, version, resource, namespace, name, sub, namespaced_path, legacy_watch)

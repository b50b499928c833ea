"""Which resources are served right now: the built-ins plus whatever established CRDs add."""

from __future__ import annotations

from .resources import ResourceInfo, builtin_resources


class Registry:
    def __init__(self) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceInfo] = {}
        self._crd_gvrs: dict[str, list[tuple[str, str, str]]] = {}
        self.generation = 0  # bumps whenever the served set changes (discovery/OpenAPI caches key on it)
        for info in builtin_resources():
            self._by_gvr[(info.group, info.version, info.resource)] = info

    def lookup(self, group: str, version: str, resource: str) -> ResourceInfo | None:
        return self._by_gvr.get((group, version, resource))

    def all(self) -> list[ResourceInfo]:
        return list(self._by_gvr.values())

    def group_versions(self) -> set[tuple[str, str]]:
        return {(g, v) for (g, v, _) in self._by_gvr}

    def for_group_resource(self, group: str, resource: str) -> list[ResourceInfo]:
        return [i for (g, _, r), i in self._by_gvr.items() if g == group and r == resource]

    def by_kind(self, group: str, kind: str) -> ResourceInfo | None:
        for (g, _, _), info in self._by_gvr.items():
            if g == group and info.kind == kind:
                return info
        return None

    def set_crd(self, crd_name: str, infos: list[ResourceInfo]) -> None:
        """Serve (or re-serve after an update) the versions of one CRD."""
        self.remove_crd(crd_name)
        keys = []
        for info in infos:
            key = (info.group, info.version, info.resource)
            existing = self._by_gvr.get(key)
            if existing is not None and not existing.is_custom:
                continue  # a CRD may not shadow a built-in
            self._by_gvr[key] = info
            keys.append(key)
        self._crd_gvrs[crd_name] = keys
        self.generation += 1

    def remove_crd(self, crd_name: str) -> None:
        for key in self._crd_gvrs.pop(crd_name, []):
            self._by_gvr.pop(key, None)
        self.generation += 1

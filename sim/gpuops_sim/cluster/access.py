"""In-process read and write access to the emulator for the cluster's components.

Components read the store directly (they run in the emulator's loop, like an informer that is never
behind) and write through `ObjectAPI`, so validation, resourceVersions, managedFields and watch events are
exactly those of a client's write. Each component writes as its own user and field manager, the way
kube-scheduler, kubelets and kube-controller-manager do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from ..apiserver.auth import UserInfo
from ..apiserver.errors import StatusError
from ..apiserver.objects import ObjectAPI, WriteContext, rfc3339
from ..apiserver.resources import ResourceInfo
from ..apiserver.server import APIServer
from ..apiserver.store import GroupResource, Store, WatchEvent

PODS: GroupResource = ("", "pods")
NODES: GroupResource = ("", "nodes")
EVENTS: GroupResource = ("", "events")
NAMESPACES: GroupResource = ("", "namespaces")
LEASES: GroupResource = ("coordination.k8s.io", "leases")
JOBS: GroupResource = ("batch", "jobs")
DEPLOYMENTS: GroupResource = ("apps", "deployments")
REPLICASETS: GroupResource = ("apps", "replicasets")
CRONJOBS: GroupResource = ("batch", "cronjobs")
DAEMONSETS: GroupResource = ("apps", "daemonsets")
STATEFULSETS: GroupResource = ("apps", "statefulsets")
CONTROLLER_REVISIONS: GroupResource = ("apps", "controllerrevisions")
PVCS: GroupResource = ("", "persistentvolumeclaims")
# gpuops' own kinds (manifests/crds), as emulated runs address them
BUDGETS: GroupResource = ("gpuops.io", "gpuworkloadbudgets")
GROUPS: GroupResource = ("gpuops.io", "gpunodegroups")
POOLS: GroupResource = ("gpuops.io", "spotpools")

MERGE = "application/merge-patch+json"
NODE_LEASE_NAMESPACE = "kube-node-lease"


class ClusterAccess:
    """One component's handle on the emulator: store reads, writes as `user`, Events as `component`."""

    def __init__(self, server: APIServer, user: str, *, component: str, groups: tuple[str, ...] = ()) -> None:
        self.server = server
        self.api: ObjectAPI = server.api
        self.store: Store = server.store
        self.user = UserInfo(user, groups=(*groups, "system:masters", "system:authenticated"))
        self.component = component
        self._infos: dict[GroupResource, ResourceInfo] = {}

    # ------------------------------------------------------------------------------------ time

    def now(self) -> datetime:
        """Wall-clock time as the emulator stamps objects (tests may replace `api.clock`)."""
        return self.api.clock()

    def stamp(self) -> str:
        return rfc3339(self.now())

    # ------------------------------------------------------------------------------------ reads

    def info(self, gr: GroupResource) -> ResourceInfo:
        got = self._infos.get(gr)
        if got is None:
            infos = self.server.registry.for_group_resource(*gr)
            if not infos:
                raise LookupError(f"the emulator serves no resource {gr[1]}.{gr[0] or 'core'}")
            got = self._infos[gr] = infos[0]
        return got

    def get(self, gr: GroupResource, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object itself: read-only for callers (clone before changing it)."""
        s = self.store.get(gr, namespace, name)
        return s.obj if s is not None else None

    def iter(self, gr: GroupResource, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        for s in self.store.iter(gr, namespace):
            yield s.obj

    def listen(self, listener: Any) -> None:
        """Call `listener(WatchEvent)` synchronously on every change; it must only record work."""
        self.store.add_listener(listener)

    # ------------------------------------------------------------------------------------ writes

    def _ctx(self) -> WriteContext:
        # The cluster's components write only fields they know; skipping the unknown-field walk (whose only
        # output would be warnings) spares a third of a status write.
        return WriteContext(self.user, field_manager=self.component, field_validation="Ignore")

    async def create(self, gr: GroupResource, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.api.create(self.info(gr), namespace, obj, self._ctx())

    async def create_object(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create any object by its apiVersion and kind, as `kubectl create -f` would."""
        api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
        group = api_version.rpartition("/")[0]
        info = self.server.registry.by_kind(group, kind)
        if info is None:
            raise LookupError(f"the emulator serves no {kind} in {api_version or 'v1'} (is its CRD installed?)")
        ns = (obj.get("metadata") or {}).get("namespace") or "default" if info.namespaced else ""
        return await self.api.create(info, ns, obj, self._ctx())

    async def patch(
        self, gr: GroupResource, namespace: str, name: str, patch: dict[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): lists are replaced whole, `None` deletes a key."""
        _, obj = await self.api.patch(self.info(gr), namespace, name, MERGE, patch, self._ctx(), subresource)
        return obj

    async def update(
        self, gr: GroupResource, namespace: str, name: str, obj: dict[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        """A PUT with optimistic concurrency: 409 Conflict if `obj`'s resourceVersion is stale."""
        return await self.api.update(self.info(gr), namespace, name, obj, self._ctx(), subresource)

    async def delete(
        self,
        gr: GroupResource,
        namespace: str,
        name: str,
        *,
        grace_seconds: int | None = None,
        uid: str | None = None,
        propagation: str | None = None,
    ) -> dict[str, Any] | None:
        """Delete; None when already gone. Graceful for bound pods unless `grace_seconds=0`."""
        options: dict[str, Any] = {}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if propagation:
            options["propagationPolicy"] = propagation
        try:
            _, obj = await self.api.delete(self.info(gr), namespace, name, options, self._ctx())
        except StatusError as e:
            if e.code == 404:
                return None
            raise
        return obj

    async def bind(self, namespace: str, name: str, node: str) -> None:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        await self.api.bind(namespace, name, body, self._ctx())

    async def evict(self, namespace: str, name: str) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        await self.api.evict(namespace, name, body, self._ctx())

    async def event(
        self, involved: dict[str, Any], kind: str, type_: str, reason: str, message: str, *, host: str = ""
    ) -> None:
        """A core/v1 Event on `involved`, as `kubectl describe` shows it; never fails the caller."""
        meta = involved["metadata"]
        ns = meta.get("namespace") or "default"
        now = self.now()
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
            "involvedObject": {"apiVersion": involved.get("apiVersion", "v1"), "kind": kind, "name": meta["name"],
                               "namespace": meta.get("namespace", ""), "uid": meta.get("uid", ""),
                               "resourceVersion": meta.get("resourceVersion", "")},
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": self.component, **({"host": host} if host else {})},
            "reportingComponent": self.component,
            "reportingInstance": host or self.component,
            "firstTimestamp": rfc3339(now),
            "lastTimestamp": rfc3339(now),
            "count": 1,
        }
        with contextlib.suppress(StatusError):  # events are best effort, as in client-go's recorder
            await self.create(EVENTS, ns, ev)


__all__ = ["BUDGETS", "EVENTS", "GROUPS", "JOBS", "LEASES", "NAMESPACES", "NODES", "PODS", "POOLS", "ClusterAccess",
           "WatchEvent"]

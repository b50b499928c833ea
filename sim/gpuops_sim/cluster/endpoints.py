"""The EndpointSlice and Endpoints controllers of kube-controller-manager: for every Service with a
selector, the addresses of the pods it selects, so `kubectl describe svc` shows endpoints and a client that
resolves a Service through its slices finds the pods.

One slice per Service and address type (IPv4) holds every endpoint (a cluster here never nears the
100-endpoint split); the legacy Endpoints object mirrors it as `subsets`. Pods without an IP, terminal pods,
and pods of other namespaces are not endpoints. Work is driven by store events: a pod or Service change marks
its namespace's Services dirty, and a step rewrites only slices whose content changed.
"""

from __future__ import annotations

import contextlib
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.selectors import label_selector_from_object
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent
from .access import PODS, ClusterAccess
from .loop import Loop

log = structlog.get_logger("gpuops_sim.endpoints")

SERVICES = ("", "services")
ENDPOINTS = ("", "endpoints")
SLICES = ("discovery.k8s.io", "endpointslices")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.k8s.io"
USER = "system:serviceaccount:kube-system:endpointslice-controller"
Key = tuple[str, str]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _target_port(port: dict[str, Any], pod: dict[str, Any]) -> int | None:
    """A Service port's target on one pod: a number, or a named container port looked up in the pod."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target and p.get("protocol", "TCP") == port.get("protocol", "TCP"):
                return int(p["containerPort"])
    return None


def endpoint_pods(service: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    selector = label_selector_from_object({"matchLabels": (service.get("spec") or {}).get("selector") or {}})
    return sorted((p for p in pods if (p.get("status") or {}).get("podIP")
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                   and selector.matches(p["metadata"].get("labels"))),
                  key=lambda p: p["metadata"]["name"])


def slice_content(service: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The endpoints and ports of a Service's slice (ports resolved against the first pod, as upstream
    groups endpoints by their resolved ports)."""
    endpoints = []
    for pod in pods:
        terminating = bool(pod["metadata"].get("deletionTimestamp"))
        ready = _ready(pod) and not terminating
        entry: dict[str, Any] = {
            "addresses": [pod["status"]["podIP"]],
            "conditions": {"ready": ready, "serving": _ready(pod), "terminating": terminating},
            "targetRef": {"kind": "Pod", "namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"],
                          "uid": pod["metadata"]["uid"]},
        }
        if (pod.get("spec") or {}).get("nodeName"):
            entry["nodeName"] = pod["spec"]["nodeName"]
        endpoints.append(entry)
    ports = []
    for port in (service.get("spec") or {}).get("ports") or []:
        number = _target_port(port, pods[0]) if pods else None
        if number is not None or not pods:
            out = {"name": port.get("name", ""), "protocol": port.get("protocol", "TCP")}
            if number is not None:
                out["port"] = number
            ports.append(out)
    return {"endpoints": endpoints, "ports": ports}


def endpoints_subsets(content: dict[str, Any]) -> list[dict[str, Any]]:
    ready = [e for e in content["endpoints"] if e["conditions"]["ready"]]
    not_ready = [e for e in content["endpoints"] if not e["conditions"]["ready"]]
    if not content["endpoints"]:
        return []

    def address(e: dict[str, Any]) -> dict[str, Any]:
        out = {"ip": e["addresses"][0], "targetRef": e["targetRef"]}
        if "nodeName" in e:
            out["nodeName"] = e["nodeName"]
        return out

    subset: dict[str, Any] = {"ports": [p for p in content["ports"] if "port" in p]}
    if ready:
        subset["addresses"] = [address(e) for e in ready]
    if not_ready:
        subset["notReadyAddresses"] = [address(e) for e in not_ready]
    return [subset]


class EndpointsController(Loop):
    name = "endpointslice-controller"

    def __init__(self, server: APIServer) -> None:
        super().__init__()
        self.access = ClusterAccess(server, USER, component="endpointslice-controller",
                                    groups=("system:serviceaccounts", "system:serviceaccounts:kube-system"))
        self._dirty: set[Key] = set()
        self._namespaces: set[str] = set()
        self.access.listen(self._on_event)

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr == SERVICES:
            self._dirty.add(ev.key)
            self.wake()
        elif ev.gr == PODS:
            self._namespaces.add(ev.key[0])
            self.wake()

    async def step(self) -> None:
        self.due()  # a retry timer only wakes the step: the keys to retry are in _dirty
        namespaces, self._namespaces = self._namespaces, set()
        for ns in namespaces:
            self._dirty.update((ns, s["metadata"]["name"]) for s in self.access.iter(SERVICES, ns))
        dirty, self._dirty = self._dirty, set()
        failed: set[Key] = set()
        for key in sorted(dirty):
            try:
                await self._sync(*key)
            except StatusError as e:  # a conflict or a write refused: retried shortly, never lost
                if e.code != 409:
                    log.warning("endpoints sync failed", namespace=key[0], service=key[1], error=e.message)
                failed.add(key)
        if failed:
            self._dirty |= failed
            self.after("retry", 0.5)

    async def _sync(self, namespace: str, name: str) -> None:
        service = self.access.get(SERVICES, namespace, name)
        if service is None or service["metadata"].get("deletionTimestamp"):
            with contextlib.suppress(StatusError):
                await self.access.delete(ENDPOINTS, namespace, name)
            return  # its slices go with it: they are owned by the Service
        spec = service.get("spec") or {}
        if spec.get("selector") is None or spec.get("type") == "ExternalName" or name == "kubernetes":
            return  # no selector: the user manages the endpoints
        pods = endpoint_pods(service, list(self.access.iter(PODS, namespace)))
        content = slice_content(service, pods)
        await self._write_slice(service, content)
        await self._write_endpoints(service, content)

    async def _write_slice(self, service: dict[str, Any], content: dict[str, Any]) -> None:
        meta = service["metadata"]
        ns, name = meta["namespace"], meta["name"]
        mine = [s for s in self.access.iter(SLICES, ns)
                if (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == name
                and (s["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY]
        labels = {**(meta.get("labels") or {}), SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: MANAGED_BY}
        if not mine:
            owner = {"apiVersion": "v1", "kind": "Service", "name": name, "uid": meta["uid"], "controller": True,
                     "blockOwnerDeletion": True}
            body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                    "metadata": {"generateName": f"{name}-", "namespace": ns, "labels": labels,
                                 "ownerReferences": [owner]}, **content}
            await self.access.create(SLICES, ns, body)
            return
        current = mine[0]
        if {k: current.get(k) for k in ("endpoints", "ports")} == content and \
                current["metadata"].get("labels") == labels:
            return
        updated = {**current, **content, "metadata": {**current["metadata"], "labels": labels}}
        await self.access.update(SLICES, ns, current["metadata"]["name"], updated)

    async def _write_endpoints(self, service: dict[str, Any], content: dict[str, Any]) -> None:
        meta = service["metadata"]
        ns, name = meta["namespace"], meta["name"]
        subsets = endpoints_subsets(content)
        current = self.access.get(ENDPOINTS, ns, name)
        if current is None:
            labels = dict(meta.get("labels") or {})
            body: dict[str, Any] = {"apiVersion": "v1", "kind": "Endpoints",
                                    "metadata": {"name": name, "namespace": ns, "labels": labels}}
            if subsets:
                body["subsets"] = subsets
            await self.access.create(ENDPOINTS, ns, body)
        elif (current.get("subsets") or []) != subsets:
            updated = {k: v for k, v in current.items() if k != "subsets"}
            if subsets:
                updated["subsets"] = subsets
            await self.access.update(ENDPOINTS, ns, name, updated)

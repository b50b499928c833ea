"""Service addresses kube-apiserver allocates: ClusterIPs from the service CIDR, NodePorts from the node port
range, and the fields that come with them (ipFamilies, ipFamilyPolicy, traffic policies).

Allocation is by scan of the stored Services (a cluster has few), so there is no allocator state to keep in
step with restores and deletions. An update keeps what was allocated when the request leaves it unset, as
the apiserver's service storage does; a new NodePort or LoadBalancer port gets a fresh node port.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from .errors import Cause, invalid

SERVICE_CIDR = ipaddress.IPv4Network("10.96.0.0/12")
KUBERNETES_SERVICE_IP = str(SERVICE_CIDR.network_address + 1)
NODE_PORTS = range(30000, 32768)
_NODE_PORT_TYPES = ("NodePort", "LoadBalancer")


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    return spec


def _ports(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in spec.get("ports") or [] if isinstance(p, dict)]


def _used(services: Iterable[dict[str, Any]]) -> tuple[set[str], set[int]]:
    ips: set[str] = set()
    node_ports: set[int] = set()
    for svc in services:
        spec = svc.get("spec") or {}
        ips.update(ip for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if ip and ip != "None")
        node_ports.update(int(p["nodePort"]) for p in _ports(spec) if p.get("nodePort"))
    return ips, node_ports


def _next_ip(used: set[str], name: str) -> str:
    for address in SERVICE_CIDR.hosts():
        text = str(address)
        if text != KUBERNETES_SERVICE_IP and text not in used:
            return text
    raise invalid("Service", "", name, [Cause("FieldValueInvalid", "Internal error: range is full",
                                              "spec.clusterIPs")])


def _next_node_port(used: set[int], name: str) -> int:
    for port in NODE_PORTS:
        if port not in used:
            used.add(port)
            return port
    raise invalid("Service", "", name, [Cause("FieldValueInvalid", "Internal error: range is full",
                                              "spec.ports[0].nodePort")])


def allocate(obj: dict[str, Any], existing: Iterable[dict[str, Any]]) -> None:
    """Fill a new Service's addresses (in place), avoiding those of `existing`."""
    spec = _spec(obj)
    kind = spec.get("type") or "ClusterIP"
    name = str(obj.get("metadata", {}).get("name", ""))
    ips, node_ports = _used(existing)
    if kind != "ExternalName":
        if not spec.get("clusterIP"):
            spec["clusterIP"] = (KUBERNETES_SERVICE_IP if _is_kubernetes_service(obj) else _next_ip(ips, name))
        if spec["clusterIP"] == "None":
            spec.setdefault("clusterIPs", ["None"])
        else:
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    if kind in _NODE_PORT_TYPES:
        spec.setdefault("externalTrafficPolicy", "Cluster")
        for port in _ports(spec):
            if not port.get("nodePort"):
                port["nodePort"] = _next_node_port(node_ports, name)
    if kind == "LoadBalancer":
        spec.setdefault("allocateLoadBalancerNodePorts", True)


def keep_allocated(old: dict[str, Any], new: dict[str, Any], existing: Iterable[dict[str, Any]]) -> None:
    """An update that leaves allocated fields unset keeps the old values; new node ports are allocated."""
    old_spec, spec = old.get("spec") or {}, _spec(new)
    if (spec.get("type") or "ClusterIP") == (old_spec.get("type") or "ClusterIP"):
        for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            if not spec.get(key) and old_spec.get(key):
                spec[key] = old_spec[key]
        old_node_ports = {(p.get("port"), p.get("protocol", "TCP")): p.get("nodePort") for p in _ports(old_spec)}
        for port in _ports(spec):
            kept = old_node_ports.get((port.get("port"), port.get("protocol", "TCP")))
            if not port.get("nodePort") and kept:
                port["nodePort"] = kept
    others = [s for s in existing if s.get("metadata", {}).get("uid") != old.get("metadata", {}).get("uid")]
    allocate(new, others)


def _is_kubernetes_service(obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    return bool(meta.get("namespace") == "default" and meta.get("name") == "kubernetes")

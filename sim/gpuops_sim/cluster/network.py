"""The emulated cluster's network for pods that run as real processes: each gets an address of its own, Services
get cluster DNS names and load-balance over their ready endpoints, as kube-proxy and CoreDNS provide.

Everything runs on this machine, so the emulation maps the cluster's addresses onto loopback:

- a process pod keeps the pod IP the kubelet gave it (10.244.x.y in `kubectl get pods -o wide`), and its
  sockets live on a loopback address of its own (127.<n>.x.y; Linux routes all of 127.0.0.0/8 to `lo`), so two
  replicas can both listen on :8443 as two pods can;
- a Service keeps its ClusterIP; the table written here tells a pod's processes where a connection to
  ClusterIP:port goes: one of the Service's ready endpoints, translated to where it really listens (a process
  pod's loopback address, or a site service this cluster registered with `add_external`);
- `<service>.<namespace>.svc[.cluster.local]` resolve to the ClusterIP.

The pod side of this (binding "all interfaces" to the pod's own address, resolving cluster names, translating
connections) is `podnet/sitecustomize.py`, which a process pod loads at start; it reads the table this loop
writes (a JSON file, replaced atomically on every change). The API server resolves webhook Services through the
same table (`resolve_service`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
from pathlib import Path
from typing import Any

import structlog

from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent
from .access import ClusterAccess
from .endpoints import SERVICE_NAME_LABEL, SERVICES, SLICES
from .loop import Loop

log = structlog.get_logger("gpuops_sim.network")

SHIM_DIR = Path(__file__).resolve().parent / "podnet"
"""Put on a process pod's PYTHONPATH: its `sitecustomize` module applies the table to the pod's sockets."""

CLUSTER_DOMAIN = "cluster.local"


class PodNetwork(Loop):
    """Start with the cluster; `sandbox(pod_ip)` gives a process pod its loopback address, `table_path` is the
    file the pods read, `resolve_service` answers the API server's webhook calls."""

    name = "pod-network"

    def __init__(self, server: APIServer, root: Path) -> None:
        super().__init__()
        self.access = ClusterAccess(server, "system:kube-proxy", component="kube-proxy")
        self.root = root
        self.table_path = root / "network.json"
        self._octet = random.SystemRandom().randint(32, 250)  # two clusters on one machine rarely share it
        self._sandboxes: dict[str, str] = {}
        self._free = 1
        self._external: dict[str, str] = {}
        self._written: dict[str, Any] | None = None
        self.table: dict[str, Any] = {"dns": {}, "services": {}, "pods": {}}
        self.access.listen(self._on_event)

    # ------------------------------------------------------------------------------------ addresses

    def sandbox(self, pod_ip: str) -> str:
        """The loopback address a process pod with `pod_ip` listens on (the same for the pod's lifetime)."""
        address = self._sandboxes.get(pod_ip)
        if address is None:
            n = self._free
            self._free += 1
            address = str(ipaddress.IPv4Address((127 << 24) | (self._octet << 16) | n))
            self._sandboxes[pod_ip] = address
            self.wake()
        return address

    def release(self, pod_ip: str) -> None:
        if self._sandboxes.pop(pod_ip, None) is not None:
            self.wake()

    def listening_address(self, ip: str) -> str | None:
        """Where the process pod with pod IP `ip` listens; None for a pod that is only simulated."""
        return self._sandboxes.get(ip)

    def add_external(self, ip: str, port: int, target: str) -> None:
        """Route endpoint `ip:port` (e.g. of a selectorless Service's EndpointSlice) to `target` (host:port on
        this machine): how a site service outside the pods (the emulated cloud) joins the network."""
        self._external[f"{ip}:{port}"] = target
        self.wake()

    # ------------------------------------------------------------------------------------ the table

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr in (SERVICES, SLICES):
            self.wake()

    async def step(self) -> None:
        self.due()
        self.table = self._build()
        if self.table != self._written:
            self._write(self.table)
            self._written = self.table

    def _write(self, table: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.table_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, sort_keys=True))
        os.replace(tmp, self.table_path)

    def _build(self) -> dict[str, Any]:
        dns: dict[str, str] = {}
        services: dict[str, list[str]] = {}
        for svc in self.access.iter(SERVICES):
            meta, spec = svc["metadata"], svc.get("spec") or {}
            ip = spec.get("clusterIP")
            if not ip or ip == "None" or spec.get("type") == "ExternalName":
                continue
            name = f"{meta['name']}.{meta['namespace']}.svc"
            dns[name] = dns[f"{name}.{CLUSTER_DOMAIN}"] = ip
            for port in spec.get("ports") or []:
                services[f"{ip}:{port.get('port')}"] = self._backends(meta["namespace"], meta["name"], port)
        return {"dns": dns, "services": services, "pods": dict(self._sandboxes)}

    def _backends(self, namespace: str, service: str, port: dict[str, Any]) -> list[str]:
        """Where a Service port's connections go: its ready endpoints that really listen somewhere."""
        out: list[str] = []
        for sl in self.access.iter(SLICES, namespace):
            if (sl["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) != service:
                continue
            wanted = port.get("name") or ""
            numbers = [p.get("port") for p in sl.get("ports") or [] if (p.get("name") or "") == wanted]
            if not numbers or numbers[0] is None:
                continue
            for ep in sl.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("ready") is False:
                    continue
                for address in ep.get("addresses") or []:
                    target = self._external.get(f"{address}:{numbers[0]}")
                    sandbox = self._sandboxes.get(address)
                    if target is None and sandbox is not None:
                        target = f"{sandbox}:{numbers[0]}"
                    if target is not None:
                        out.append(target)
        return sorted(out)

    def resolve_service(self, namespace: str, name: str, port: int) -> str | None:
        """host:port of a ready endpoint of Service namespace/name's `port`, as the API server reaches a webhook
        (None when the Service is not known here)."""
        svc = self.access.get(SERVICES, namespace, name)
        if svc is None:
            return None
        ip = (svc.get("spec") or {}).get("clusterIP")
        for p in (svc.get("spec") or {}).get("ports") or []:
            if p.get("port") == port:
                backends = self._backends(namespace, name, p)
                if backends:
                    return random.choice(backends)
                raise ConnectionError(f'service "{namespace}/{name}" has no ready endpoint for port {port} '
                                      f"(ClusterIP {ip})")
        raise ConnectionError(f'service "{namespace}/{name}" has no port {port}')

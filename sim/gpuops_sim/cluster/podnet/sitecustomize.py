"""A process pod's view of the emulated cluster network, applied when its Python starts.

The emulated kubelet puts this folder on the PYTHONPATH of the processes it runs for a pod, with
GPUOPS_SIM_POD_ADDRESS (the pod's own loopback address), GPUOPS_SIM_NETWORK (the table the cluster writes,
see `gpuops_sim.cluster.network`) and GPUOPS_SIM_POD_NAMESPACE. It then gives the process what a pod's network
namespace, cluster DNS and kube-proxy give a container:

- listening on every interface (host "", "0.0.0.0", or None with AI_PASSIVE) listens on the pod's address only;
- `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc[.cluster.local]` resolve to the Service's ClusterIP (an unknown name
  under .svc does not exist, as with CoreDNS);
- a connection to ClusterIP:port goes to one of the Service's ready endpoints (refused when it has none), and a
  connection to another process pod's IP goes to where that pod listens.

Nothing happens unless both variables are set, so the module is inert anywhere else.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import random
import socket
from typing import Any

_ADDRESS = os.environ.get("GPUOPS_SIM_POD_ADDRESS", "")
_TABLE = os.environ.get("GPUOPS_SIM_NETWORK", "")
_NAMESPACE = os.environ.get("GPUOPS_SIM_POD_NAMESPACE", "default")
_SERVICE_CIDR = ipaddress.IPv4Network("10.96.0.0/12")
_ANY = ("", "0.0.0.0", "::", None)
_cache: dict[str, Any] = {"mtime": -1, "table": {"dns": {}, "services": {}, "pods": {}}}


def _table() -> dict[str, Any]:
    try:
        mtime = os.stat(_TABLE).st_mtime_ns
    except OSError:
        return dict(_cache["table"])
    if mtime != _cache["mtime"]:
        try:
            with open(_TABLE, encoding="utf-8") as f:
                _cache["table"] = json.load(f)
            _cache["mtime"] = mtime
        except (OSError, ValueError):
            pass  # replaced while read: the previous table stays until the next call
    return dict(_cache["table"])


def _cluster_ip(name: str) -> str | None:
    """The ClusterIP of a cluster DNS name, None for a name outside the cluster; raises for a missing .svc name."""
    name = name.rstrip(".").lower()
    dns = _table().get("dns") or {}
    candidates = [name]
    if "." not in name:
        candidates.append(f"{name}.{_NAMESPACE}.svc")
    elif name.count(".") == 1:
        candidates.append(f"{name}.svc")
    for c in candidates:
        if c in dns:
            return str(dns[c])
    if name.endswith(".svc") or name.endswith(".svc.cluster.local"):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return None


_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                flags: int = 0) -> Any:
    """Passive lookups of "every interface" give the pod's address; cluster names give their ClusterIP."""
    name = host.decode() if isinstance(host, bytes) else host
    if name in _ANY and (flags & socket.AI_PASSIVE or name in ("0.0.0.0", "::")):
        return _getaddrinfo(_ADDRESS, port, socket.AF_INET, type, proto, flags | socket.AI_NUMERICHOST)
    if isinstance(name, str) and name and family in (0, socket.AF_INET, socket.AF_UNSPEC):
        ip = _cluster_ip(name)
        if ip is not None:
            return _getaddrinfo(ip, port, socket.AF_INET, type, proto, flags | socket.AI_NUMERICHOST)
    return _getaddrinfo(host, port, family, type, proto, flags)


def _destination(address: Any) -> Any:
    """Where a connection to `address` really goes (kube-proxy's DNAT and the pod routes, in one step)."""
    if not (isinstance(address, tuple) and len(address) == 2 and isinstance(address[0], str)):
        return address
    host, port = address
    table = _table()
    backends = (table.get("services") or {}).get(f"{host}:{port}")
    if backends is not None:
        if not backends:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"no ready endpoint behind {host}:{port}")
        target, _, target_port = random.choice(backends).rpartition(":")
        return (target, int(target_port))
    sandbox = (table.get("pods") or {}).get(host)
    if sandbox is not None:
        return (sandbox, port)
    try:
        if ipaddress.IPv4Address(host) in _SERVICE_CIDR:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"no Service has {host}:{port}")
    except ValueError:
        pass
    return address


_bind = socket.socket.bind
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _bind_in_pod(self: socket.socket, address: Any) -> None:
    if self.family == socket.AF_INET and isinstance(address, tuple) and address[0] in ("", "0.0.0.0"):
        address = (_ADDRESS, *address[1:])
    _bind(self, address)


def _connect_in_pod(self: socket.socket, address: Any) -> None:
    if self.family == socket.AF_INET:
        address = _destination(address)
    _connect(self, address)


def _connect_ex_in_pod(self: socket.socket, address: Any) -> int:
    if self.family == socket.AF_INET:
        try:
            address = _destination(address)
        except ConnectionRefusedError:
            return errno.ECONNREFUSED
    return _connect_ex(self, address)


def install() -> None:
    socket.getaddrinfo = getaddrinfo
    socket.socket.bind = _bind_in_pod  # type: ignore[method-assign,assignment]
    socket.socket.connect = _connect_in_pod  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = _connect_ex_in_pod  # type: ignore[method-assign,assignment]


if _ADDRESS and _TABLE:
    install()

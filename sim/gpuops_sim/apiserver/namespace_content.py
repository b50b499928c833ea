"""What every namespace of a cluster holds without anyone creating it: the `default` ServiceAccount (the
ServiceAccount controller's) and the `kube-root-ca.crt` ConfigMap with the cluster CA (the root-CA
publisher's), plus the `default/kubernetes` Service that points at the API server itself.

They are written in the same step as the namespace, not after a controller's delay: a pod created right
after its namespace is admitted, where on a real cluster it can lose a race to the ServiceAccount
controller. Whoever deletes them gets them back, as the controllers recreate them.
"""

from __future__ import annotations

import uuid
from typing import Any

from .services import KUBERNETES_SERVICE_IP
from .store import Store

SERVICE_ACCOUNTS = ("", "serviceaccounts")
CONFIG_MAPS = ("", "configmaps")
SERVICES = ("", "services")
ENDPOINTS = ("", "endpoints")
ENDPOINT_SLICES = ("discovery.k8s.io", "endpointslices")
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
MIRRORING_CONTROLLER = "endpointslicemirroring-controller.k8s.io"
DEFAULT_SERVICE_ACCOUNT = "default"


def _meta(name: str, namespace: str, now: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": now, **extra}


def default_service_account(namespace: str, now: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(DEFAULT_SERVICE_ACCOUNT, namespace, now)}


def root_ca_configmap(namespace: str, ca_pem: str, now: str) -> dict[str, Any]:
    meta = _meta(ROOT_CA_CONFIGMAP, namespace, now)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"ca.crt": ca_pem}}


def fill_namespace(store: Store, namespace: str, ca_pem: str | None, now: str) -> None:
    """Put what a namespace must hold, leaving what is already there alone (no CA: no root-CA publisher)."""
    if store.get(SERVICE_ACCOUNTS, namespace, DEFAULT_SERVICE_ACCOUNT) is None:
        store.put(SERVICE_ACCOUNTS, default_service_account(namespace, now))
    if ca_pem is not None and store.get(CONFIG_MAPS, namespace, ROOT_CA_CONFIGMAP) is None:
        store.put(CONFIG_MAPS, root_ca_configmap(namespace, ca_pem, now))


def kubernetes_service(port: int, now: str) -> list[tuple[tuple[str, str], dict[str, Any]]]:
    """The `default/kubernetes` Service and its Endpoints and EndpointSlice (the API server at `port`)."""
    ports = [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]
    labels = {"component": "apiserver", "provider": "kubernetes"}
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta("kubernetes", "default", now, labels=labels),
        "spec": {"ports": ports, "clusterIP": KUBERNETES_SERVICE_IP, "clusterIPs": [KUBERNETES_SERVICE_IP],
                 "type": "ClusterIP", "sessionAffinity": "None", "ipFamilies": ["IPv4"],
                 "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"},
        "status": {"loadBalancer": {}},
    }
    endpoints = {
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": _meta("kubernetes", "default", now, labels={"endpointslice.kubernetes.io/skip-mirror": "true"}),
        "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    }
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": _meta("kubernetes", "default", now,
                          labels={"kubernetes.io/service-name": "kubernetes",
                                  "endpointslice.kubernetes.io/managed-by": MIRRORING_CONTROLLER}),
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    return [(SERVICES, service), (ENDPOINTS, endpoints), (ENDPOINT_SLICES, slice_)]


def seed_kubernetes_service(store: Store, port: int, now: str) -> None:
    for gr, obj in kubernetes_service(port, now):
        if store.get(gr, "default", "kubernetes") is None:
            store.put(gr, obj)


"""The emulated site's own services, reachable from pods by their cluster DNS names over HTTPS, as a real
site's BMC gateway and instance API would be: the emulated cloud's power API as `bmc-gateway.infra.svc` and its
spot instance API as `spot-api.infra.svc` (both on port 443, under /power/v1 and /spot/v1).

Each is a Service without a selector plus an EndpointSlice naming an address on the site network, which the pod
network routes to the cloud's HTTPS listener. Their certificate comes from a CA of this run; process pods trust
it through $SSL_CERT_FILE (`processes.ProcessRuntime`), as nodes of a real site trust their own CA.
"""

from __future__ import annotations

from typing import Any

from ..apiserver.errors import StatusError
from ..apiserver.tls import ServingCert, make_serving_cert
from ..cloud import CloudServer
from .access import NAMESPACES, ClusterAccess
from .endpoints import SERVICE_NAME_LABEL, SERVICES, SLICES
from .network import CLUSTER_DOMAIN, PodNetwork

NAMESPACE = "infra"
SERVICES_AT = {"bmc-gateway": "192.168.100.10", "spot-api": "192.168.100.11"}
"""Service name -> its endpoint's address on the site network."""
TARGET_PORT = 8443


def site_cert() -> ServingCert:
    names = [f"{name}.{NAMESPACE}.svc" for name in SERVICES_AT]
    return make_serving_cert(names + [f"{n}.{CLUSTER_DOMAIN}" for n in names], days=30)


async def publish(access: ClusterAccess, cloud: CloudServer, network: PodNetwork, cert: ServingCert) -> int:
    """Serve the cloud over HTTPS too and publish it as the site's Services; returns the HTTPS port."""
    port = await cloud.add_tls_site(cert.server_context())
    if access.get(NAMESPACES, "", NAMESPACE) is None:
        await access.create(NAMESPACES, "", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": NAMESPACE}})
    for name, address in SERVICES_AT.items():
        network.add_external(address, TARGET_PORT, f"127.0.0.1:{port}")
        await _create(access, SERVICES, _service(name))
        await _create(access, SLICES, _slice(name, address))
    return port


def _service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "gpuops-sim"}},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": TARGET_PORT, "protocol": "TCP"}]}}


def _slice(name: str, address: str) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"{name}-site", "namespace": NAMESPACE,
                         "labels": {SERVICE_NAME_LABEL: name, "endpointslice.kubernetes.io/managed-by": "gpuops-sim"}},
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": TARGET_PORT, "protocol": "TCP"}]}


async def _create(access: ClusterAccess, gr: tuple[str, str], body: dict[str, Any]) -> None:
    try:
        await access.create(gr, NAMESPACE, body)
    except StatusError as e:
        if e.code != 409:
            raise

"""The MIG slicer's mutating admission webhook: on every pod CREATE that asks for a MIG slice, the apiserver calls
`MUTATE_PATH` (`manifests/webhook/`), and `mutation.mutate` renames the resource and adds the scheduling gate.

Served on every replica, leader or not (`gpuops.kube.admission`): with `failurePolicy: Fail` a replica that does
not answer fails MIG pod creations, so readiness waits until it serves and until the caBundle trusts its CA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import Counter, Histogram

from gpuops.kube.admission.cabundle import CABundlePatcher
from gpuops.kube.admission.certs import CertKeeper, ServingCerts, service_dns_names
from gpuops.kube.admission.http import Limits
from gpuops.kube.admission.review import MutationResult
from gpuops.kube.admission.server import Route, WebhookServer
from gpuops.kube.manager import Manager

from .mutation import mutate
from .settings import DEFAULT_NAMESPACE, DEFAULT_PORT, DEFAULT_SERVICE

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "DEFAULT_NAMESPACE",
    "DEFAULT_PORT",
    "DEFAULT_SERVICE",
    "MUTATE_PATH",
    "REQUESTS",
    "REQUEST_SECONDS",
    "MigWebhook",
    "install",
    "mig_route",
    "mig_server",
]

MUTATE_PATH: Final = "/mutate-pods"
DEFAULT_CONFIG_NAME: Final = "gpuops-mig-slicer"
FIELD_MANAGER: Final = "gpuops-mig-slicer-cabundle"

REQUESTS: Final = Counter(
    "gpuops_migslicer_webhook_requests_total",
    "AdmissionReviews answered by the MIG slicer webhook, by result (mutated, unchanged, denied, error).",
    ["result"],
)
REQUEST_SECONDS: Final = Histogram(
    "gpuops_migslicer_webhook_request_duration_seconds",
    "Time to answer one AdmissionReview, reading the body included (the apiserver's timeout is 5 s).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


def mig_route(mutate_pod: Callable[[Mapping[str, Any]], MutationResult] = mutate) -> Route:
    return Route("mig-slicer", mutate_pod, REQUESTS, REQUEST_SECONDS)


def mig_server(certs: CertKeeper | ServingCerts, *, host: str | None = None, port: int = DEFAULT_PORT,
               mutate_pod: Callable[[Mapping[str, Any]], MutationResult] = mutate,
               cert_check_interval: float = 3600.0, limits: Limits | None = None) -> WebhookServer:
    """A server with the MIG slicer's one route at MUTATE_PATH."""
    return WebhookServer(certs, host=host, port=port, routes={MUTATE_PATH: mig_route(mutate_pod)},
                         cert_check_interval=cert_check_interval, limits=limits)


@dataclass(frozen=True, slots=True)
class MigWebhook:
    certs: CertKeeper
    server: WebhookServer
    patcher: CABundlePatcher | None


def install(
    manager: Manager,
    *,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    port: int = DEFAULT_PORT,
    config_name: str = DEFAULT_CONFIG_NAME,
    host: str | None = None,
    cert_dir: str | None = None,
    extra_names: Sequence[str] = (),
    patch_ca_bundle: bool = True,
    ca_check_interval: float = 60.0,
    cert_check_interval: float = 3600.0,
) -> MigWebhook:
    """Add the webhook server and the caBundle patcher to `manager`, both on every replica (no leadership).

    `service`/`namespace` name the Service the configuration points at (the certificate covers
    `<service>.<namespace>.svc[.cluster.local]` plus `extra_names`, DNS names or IPs); `port` is the pod port
    the Service targets; `cert_dir` keeps the CA across restarts when it is a writable volume. Set
    `patch_ca_bundle=False` when something else (cert-manager's cainjector) owns the caBundle."""
    keeper = CertKeeper([*service_dns_names(service, namespace), *extra_names], cert_dir)
    server = mig_server(keeper, host=host, port=port, cert_check_interval=cert_check_interval)
    patcher: CABundlePatcher | None = None
    if patch_ca_bundle:
        patcher = CABundlePatcher(manager.client, config_name, keeper.ca_pem, FIELD_MANAGER,
                                  interval=ca_check_interval)
        keeper.before_new_ca.append(patcher.sync)
        manager.add_runnable("migslicer-webhook-cabundle", patcher.run, need_leader_election=False)
    manager.add_runnable("migslicer-webhook", server.run, need_leader_election=False)

    def ready() -> str | None:
        """With `failurePolicy: Fail`, a replica the Service routes to before it serves, or before the API server
        trusts its CA, refuses MIG pods: keep it out of the endpoints until both hold."""
        if not server.listening:
            return "the webhook server is not listening yet"
        if patcher is not None and not patcher.trusted:
            return f"our CA is not yet in the caBundle of {config_name}"
        return None

    manager.readyz.add("mig-webhook", ready)
    return MigWebhook(keeper, server, patcher)

"""The MIG slicer's mutating admission webhook: on every pod CREATE that asks for a MIG slice, the apiserver calls
`MUTATE_PATH` (`manifests/webhook/`), and `mutation.mutate` renames the resource and adds the scheduling gate.

Served on every replica, leader or not (`gpuops.kube.admission`): with `failurePolicy: Fail` a replica that does
not answer fails MIG pod creations, so readiness waits until it serves and until the caBundle trusts its CA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from prometheus_client import Counter, Histogram

from gpuops.kube.admission import install as admission
from gpuops.kube.admission.certs import CertKeeper, ServingCerts
from gpuops.kube.admission.http import Limits
from gpuops.kube.admission.install import Webhook
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
) -> Webhook:
    """The MIG slicer's webhook on `manager` (`gpuops.kube.admission.install.install` says what each argument
    does). Readiness waits for it: with `failurePolicy: Fail`, a replica the Service routes to before it serves,
    or before the API server trusts its CA, refuses MIG pods."""
    return admission.install(
        manager, "migslicer-webhook", {MUTATE_PATH: mig_route()}, service=service, namespace=namespace, port=port,
        config_name=config_name, field_manager=FIELD_MANAGER, host=host, cert_dir=cert_dir, extra_names=extra_names,
        patch_ca_bundle=patch_ca_bundle, ca_check_interval=ca_check_interval,
        cert_check_interval=cert_check_interval)

"""The Gate webhook on a manager: its route (`gatehook.py`'s mutation over the reconciler's GateBook), its
server, CA and caBundle (`gpuops.kube.admission`), and the metrics of its answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from prometheus_client import Counter, Histogram

from gpuops.kube.admission.install import Webhook
from gpuops.kube.admission.install import install as install_webhook
from gpuops.kube.admission.server import Route
from gpuops.kube.manager import Manager

from .gatehook import GateBook, gating_mutation
from .reconciler import BudgetReconciler

__all__ = ["CONFIG_NAME", "GATE_PATH", "REQUESTS", "REQUEST_SECONDS", "gate_route", "install"]

GATE_PATH: Final = "/gate-pods"
CONFIG_NAME: Final = "gpuops-budget-gate"
FIELD_MANAGER: Final = "gpuops-budget-gate-cabundle"

REQUESTS: Final = Counter(
    "gpuops_budget_gate_webhook_requests_total",
    "AdmissionReviews answered by the Gate budgets' webhook, by result (mutated: held, unchanged, error).",
    ["result"],
)
REQUEST_SECONDS: Final = Histogram(
    "gpuops_budget_gate_webhook_request_duration_seconds",
    "Time to answer one AdmissionReview, reading the body included.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


def gate_route(book: GateBook) -> Route:
    """Answered on the server's thread (the mutation reads the book, which a worker process would not share)."""
    return Route("budget-gate", gating_mutation(book), REQUESTS, REQUEST_SECONDS, offload=False)


def install(manager: Manager, reconciler: BudgetReconciler, *, service: str, namespace: str, port: int,
            host: str | None = None, cert_dir: str | None = None, extra_names: Sequence[str] = (),
            ca_check_interval: float = 60.0) -> Webhook:
    """The Gate webhook for the budgets `reconciler` reconciles (see `gpuops.kube.admission.install`)."""
    keeper = reconciler.gatekeeper
    if keeper is None:
        raise ValueError("the reconciler has no gatekeeper: Gate would hold pods nobody releases")
    keeper.webhook = True
    return install_webhook(manager, "budget-gate-webhook", {GATE_PATH: gate_route(keeper.book)}, service=service,
                           namespace=namespace, port=port, config_name=CONFIG_NAME, field_manager=FIELD_MANAGER,
                           host=host, cert_dir=cert_dir, extra_names=extra_names,
                           ca_check_interval=ca_check_interval)


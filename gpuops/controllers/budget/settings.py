"""The budget controller's settings, and how `gpuops run` knows the controller (flags `--budget-*`)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from gpuops.kube.registry import ControllerDefinition
from gpuops.kube.settings import flag

__all__ = ["CONTROLLER", "DEFAULT_NAMESPACE", "DEFAULT_SERVICE", "Settings"]

DEFAULT_SERVICE = "gpuops-budget-webhook"
DEFAULT_NAMESPACE = "gpuops-system"
"""The webhook Service's namespace when the operator runs outside a pod and none is given."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    status_refresh: Annotated[float, flag(
        "rewrite a budget's status at least this often while its pods run, so `kubectl get gwb` stays fresh "
        "between pod changes (0: only on changes; the metrics are exact at scrape time either way)",
        metavar="SECONDS", ge=0)] = 60.0
    """What `kubectl get gwb` shows drifts by at most this."""
    max_concurrent_reconciles: Annotated[int, flag(
        "budgets reconciled at once (each mostly waits on its status write)", metavar="N", ge=1)] = 16
    """A budget reconcile mostly waits on its one status write: with 1,000 budgets and 100 pod completions/s the
    4 workers other controllers use were all busy waiting (bench/scale.py) while the work queue grew."""
    webhook_port: Annotated[int, flag(
        "port of the admission webhook that holds back new pods of exhausted Gate budgets (HTTPS, own CA; 0: no "
        "webhook, and Gate budgets hold nothing back)", metavar="PORT", ge=0, le=65535)] = 0
    webhook_host: Annotated[str, flag("address the webhook listens on (default: all)", metavar="ADDR")] = ""
    webhook_service: Annotated[str, flag("the webhook's Service, which its certificate names",
                                         metavar="NAME")] = DEFAULT_SERVICE
    webhook_namespace: Annotated[str | None, flag(
        f"the Service's namespace (default: the operator's, else {DEFAULT_NAMESPACE})", metavar="NS")] = None
    webhook_cert_dir: Annotated[str | None, flag(
        "keep the webhook's CA here across restarts (a writable volume; default: memory)", metavar="DIR")] = None


CONTROLLER = ControllerDefinition("budget", Settings, "gpuops.controllers.budget.setup:setup",
                                crds=("gpuops.controllers.budget.api:CRD",
                                      "gpuops.controllers.budget.pricelist:CRD"))

"""One admission webhook of a controller, added to a manager: its server, its CA, the caBundle it keeps.

Each controller that admits pods installs its own (its port, its MutatingWebhookConfiguration, its CA), so
controllers stay independent of each other; the Service in front of the operator names one port per webhook.
Everything runs on every replica, leader or not: the Service spreads the API server's calls over all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuops.kube.manager import Manager

from .cabundle import CABundlePatcher
from .certs import CertKeeper, service_dns_names
from .server import Route, WebhookServer

__all__ = ["Webhook", "install"]


@dataclass(frozen=True, slots=True)
class Webhook:
    certs: CertKeeper
    server: WebhookServer
    patcher: CABundlePatcher | None


def install(
    manager: Manager,
    name: str,
    routes: Mapping[str, Route],
    *,
    service: str,
    namespace: str,
    port: int,
    config_name: str,
    field_manager: str,
    host: str | None = None,
    cert_dir: str | None = None,
    extra_names: Sequence[str] = (),
    patch_ca_bundle: bool = True,
    ca_check_interval: float = 60.0,
    cert_check_interval: float = 3600.0,
    gate_readiness: bool = True,
) -> Webhook:
    """Add the webhook server and the caBundle patcher to `manager`, both on every replica (no leadership).

    `service`/`namespace` name the Service the configuration `config_name` points at (the certificate covers
    `<service>.<namespace>.svc[.cluster.local]` plus `extra_names`, DNS names or IPs); `port` is the pod port
    the Service targets; `cert_dir` keeps the CA across restarts when it is a writable volume. Set
    `patch_ca_bundle=False` when something else (cert-manager's cainjector) owns the caBundle. With
    `gate_readiness` the replica is not ready until it serves and the caBundle trusts its CA (what a webhook
    with `failurePolicy: Fail` needs, so the Service never routes a call to a replica that would fail it)."""
    keeper = CertKeeper([*service_dns_names(service, namespace), *extra_names], cert_dir)
    server = WebhookServer(keeper, host=host, port=port, routes=routes, cert_check_interval=cert_check_interval)
    patcher: CABundlePatcher | None = None
    if patch_ca_bundle:
        patcher = CABundlePatcher(manager.client, config_name, keeper.ca_pem, field_manager,
                                  interval=ca_check_interval)
        keeper.before_new_ca.append(patcher.sync)
        manager.add_runnable(f"{name}-cabundle", patcher.run, need_leader_election=False)
    manager.add_runnable(name, server.run, need_leader_election=False)

    def ready() -> str | None:
        if not server.listening:
            return f"the {name} server is not listening yet"
        if patcher is not None and not patcher.trusted:
            return f"our CA is not yet in the caBundle of {config_name}"
        return None

    if gate_readiness:
        manager.readyz.add(name, ready)
    return Webhook(keeper, server, patcher)

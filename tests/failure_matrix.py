"""What an on-call engineer sees for each failure class: the condition, the Event, the metric and the log line.

One row per failure class a controller meets. The failure-matrix tests (tests/controllers/*/test_*_failure_matrix.py)
drive every row against the emulated cluster with a real `gpuops run` process and check all four places; the
README's "What you see when ..." table is generated from these rows (tests/readme_sections.py), so the table says
only what a test has seen.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

from waiting import until


class Seen(NamedTuple):
    failure: str
    """What went wrong, as the user would put it."""
    condition: str
    """The condition(s) on the object: Type=Status (Reason)."""
    event: str
    """The Warning Event's reason, on the object."""
    metric: str
    """The series that shows it (and that an alert uses)."""
    log: str
    """The log line's event text; it carries the object's key (pool=, group=)."""


def _pool(failure: str, reason: str, calls: str = "", condition: str = "", log: str = "spot pool not ready",
          event: str = "") -> Seen:
    metric = f'gpuops_spotpool_not_ready{{reason="{reason}"}} 1'
    if calls:
        metric += f', gpuops_spotpool_provider_calls_total{{result="{calls}"}}'
    return Seen(failure, condition or f"Ready=False ({reason})", event or reason, metric, log)


SPOTPOOL: dict[str, Seen] = {
    "secret-missing": _pool("its credentials Secret does not exist", "SecretNotFound",
                            condition="CredentialsInvalid=True (SecretNotFound), Ready=False (SecretNotFound)"),
    "secret-not-allowed": _pool("its credentials Secret is in a namespace the operator may not read (never read)",
                                "SecretNotAllowed"),
    "plain-http-credentials": _pool("its credentials would go over plain http:// and insecureAllowHTTP is not set",
                                    "InsecureTransport"),
    "wrong-credentials": _pool("the cloud refuses the Secret's keys (HTTP 401)", "CredentialsInvalid", "credentials",
                               "CredentialsInvalid=True (AuthFailure), Ready=False (CredentialsInvalid)"),
    "forbidden": _pool("the cloud forbids the call (HTTP 403)", "CredentialsInvalid", "credentials",
                       "CredentialsInvalid=True (UnauthorizedOperation), Ready=False (CredentialsInvalid)"),
    "dns": _pool("the endpoint's host name does not resolve", "CloudUnavailable", "transient"),
    "refused": _pool("nothing listens at the endpoint (connection refused)", "CloudUnavailable", "transient"),
    "tls": _pool("the TLS handshake with the endpoint fails", "CloudUnavailable", "transient"),
    "timeout": _pool("the cloud does not answer within the call timeout (15 s)", "CloudUnavailable", "transient"),
    "not-found": _pool("the cloud answers 404 (wrong endpoint path)", "CloudRequestInvalid", "invalid"),
    "malformed": _pool("the endpoint answers 200 with a body that is not the API's JSON (e.g. a proxy's HTML page)",
                       "CloudUnavailable", "transient"),
    "throttled": _pool("the cloud throttles (HTTP 429)", "CloudThrottled", "throttled"),
    "server-error": _pool("the cloud fails (HTTP 503)", "CloudUnavailable", "transient"),
    "capacity": _pool("no spot capacity for any type and zone of the template", "CapacityError", "capacity",
                      "CapacityError=True (AllBackedOff), Ready=False (CapacityError)", "launch failed"),
    "quota": _pool("the account's instance quota is used up", "QuotaExceeded", "quota",
                   "QuotaExceeded=True (InstanceLimitExceeded), Ready=False (QuotaExceeded)", "launch failed"),
    "invalid-spec": _pool("the spec passes admission but the cloud cannot take it (12 KiB user data limit)",
                          "InvalidSpec"),
    "deletion-blocked": _pool("the pool is deleted but its instances cannot be terminated", "DeletionBlocked",
                              condition="DeletionBlocked=True (TerminationFailed), Ready=False (DeletionBlocked)"),
}
"""Spot pool failures by case name (the matrix test's case ids)."""

def _group(failure: str, code: str, *, refused: bool = False, log: str = "power webhook failed") -> Seen:
    condition = f"WebhookFailing=True ({'Refused' if refused else 'Retrying'}), Ready=False (WebhookFailed)"
    metric = f'gpuops_autoprovision_webhook_requests_total{{direction="up",code="{code}"}}'
    return Seen(failure, condition, "WebhookFailed", metric, log)


AUTOPROVISION: dict[str, Seen] = {
    "secret-missing": _group("the power webhook's Secret does not exist", "unsent", log="power webhook not sent"),
    "secret-key-missing": _group("the Secret has neither the token nor the HMAC key", "unsent", refused=True,
                                 log="power webhook not sent"),
    "dns": _group("the webhook's host name does not resolve", "error"),
    "refused": _group("nothing listens at the webhook URL (connection refused)", "error"),
    "tls": _group("the TLS handshake with the webhook fails", "error"),
    "timeout": _group("the webhook does not answer within spec.scaleUp.timeoutSeconds", "timeout"),
    "unauthorized": _group("the webhook answers 401 (no or wrong token)", "401", refused=True,
                           log="power webhook refused"),
    "forbidden": _group("the webhook answers 403", "403", refused=True, log="power webhook refused"),
    "not-found": _group("the webhook answers 404 (machine unknown to the power API)", "404", refused=True,
                        log="power webhook refused"),
    "throttled": _group("the webhook answers 429", "429"),
    "server-error": _group("the webhook answers 503", "503"),
    "node-claimed": Seen("another, older GPUNodeGroup manages the same node", "Ready=False (NodeClaimed)",
                         "NodeClaimed", 'gpuops_autoprovision_group_refused{reason="NodeClaimed"} 1',
                         "node group not managed"),
    "secret-not-allowed": Seen("the webhook's Secret is in a namespace the operator may not read (never read)",
                               "Ready=False (SecretNotAllowed)", "SecretNotAllowed",
                               'gpuops_autoprovision_group_refused{reason="SecretNotAllowed"} 1',
                               "node group not managed"),
    "plain-http-token": Seen("the token would go over plain http:// and insecureAllowHTTP is not set",
                             "Ready=False (InsecureTransport)", "InsecureTransport",
                             'gpuops_autoprovision_group_refused{reason="InsecureTransport"} 1',
                             "node group not managed"),
}
"""GPUNodeGroup failures by case name; every power-on is for a pending pod only that group could serve."""

def _mig(failure: str, reason: str, metric: str) -> Seen:
    return Seen(failure, f"gpuops.io/MigSlices=False ({reason}) on the pod", "FailedMigAllocation", metric,
                "pod waits for MIG slices")


MIGSLICER: dict[str, Seen] = {
    "mig-disabled": _mig("the only node the pod may use has MIG mode off on its GPUs", "MigDisabled",
                         'gpuops_migslicer_gpus{state="Disabled"} 1'),
    "reset-pending": _mig("its GPUs' MIG mode change waits for a GPU reset", "MigResetPending",
                          'gpuops_migslicer_gpus{state="Pending"} 1'),
    "unknown-model": _mig("its GPUs are of a model gpuops has no MIG tables for", "UnknownGPUModel",
                          'gpuops_migslicer_gpus{state="UnknownModel"} 1'),
    "agent-silent": _mig("the node's agent stopped reporting (MigNode heartbeat older than 120 s)",
                         "AgentNotReporting", "gpuops_migslicer_agent_heartbeat_age_seconds > 120"),
    "unsatisfiable": _mig("the pod asks for a profile no GPU there offers", "Unsatisfiable",
                          'gpuops_migslicer_plan_failures_total{reason="Unsatisfiable"} > 0'),
    "no-agent": _mig("the only node the pod may use runs no gpuops node agent (it has no MigNode)",
                     "AgentNotRegistered", 'gpuops_migslicer_plan_failures_total{reason="AgentNotRegistered"} > 0'),
    "not-advertised": _mig("the slice was made, but the agent's device plugin never offered it to the kubelet "
                           "(not registered)", "DeviceNotAdvertised",
                           'gpuops_migslicer_plan_failures_total{reason="DeviceNotAdvertised"} > 0'),
    "report-refused": _mig("another MigNode reports the same GPU (a forged or confused agent report): neither is "
                           "planned on", "AgentReportRefused",
                           'gpuops_migslicer_plan_failures_total{reason="AgentReportRefused"} > 0'),
}
"""MIG pod failures by case name: the node the pod is pinned to, as its agent reports it."""

BUDGET: dict[str, Seen] = {
    "pdb-blocked": Seen("an Evict budget over quota, but a PodDisruptionBudget allows no eviction now",
                        "Degraded=True (EvictionBlocked)", "EvictionBlocked",
                        'gpuops_budget_enforcement_actions_total{action="Evict",result="Blocked"}', "eviction refused"),
    "eviction-fails": Seen("an Evict budget over quota, but the API server fails the eviction (HTTP 500)",
                           "Degraded=True (EnforcementFailed)", "EvictionFailed",
                           'gpuops_budget_enforcement_actions_total{action="Evict",result="Error"}',
                           "eviction refused"),
}
"""Budget failures by case name (its spec cannot be wrong: admission refuses every spec the controller would)."""

MATRICES: dict[str, dict[str, Seen]] = {"budget": BUDGET, "spot pool": SPOTPOOL, "node autoprovision": AUTOPROVISION,
                                        "MIG slicer": MIGSLICER}


# ---------------------------------------------------------------------------------------------- what the tests share


def expected_conditions(seen: Seen) -> dict[str, tuple[str, str]]:
    """"A=B (R), C=D (S)" -> {A: (B, R), C: (D, S)}."""
    out = {}
    for part in seen.condition.split(", "):
        head, _, reason = part.partition(" (")
        kind, _, status = head.partition("=")
        out[kind] = (status, reason.rstrip(")"))
    return out


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in (obj.get("status") or {}).get("conditions") or ()}


def log_lines(path: Path) -> list[dict[str, Any]]:
    """The operator's JSON log records (other lines skipped)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def still_missing(what: str, probe: Callable[[], Awaitable[str]], within: float = 60.0) -> str:
    """Poll `probe` (what is still missing, "" once the failure shows in all four places) until it answers ""
    or `within` seconds pass; its last answer, so that a matrix test reports every class and goes on."""
    last = ""

    async def shown() -> bool:
        nonlocal last
        last = await probe()
        return not last

    try:
        await until(what, shown, within)
    except AssertionError:  # the wait timed out
        return last
    return ""

"""GPUWorkloadBudget (gpuops.io/v1alpha1): the CRD's types, and the checked view of a spec the reconciler uses.

The CRD schema (manifests/crds/gpuworkloadbudgets.gpuops.io.yaml) refuses bad specs at admission; `parse_spec`
checks them again because objects written before a schema change, or by a server without CEL, can still
reach us. Its errors name the field and the fix, and end up in the Ready/Degraded conditions.

Time in status: RFC 3339 in UTC; pod-derived instants have whole seconds (Kubernetes truncates them), the
controller's own instants (computedAt, overQuotaSince, ...) keep microseconds, written as a fraction only
when there is one.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Literal

import msgspec

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import MICROS_PER_HOUR
from gpuops.accounting.quantity import parse_quantity
from gpuops.controllers.errors import SpecError
from gpuops.kube.objects import Condition, LabelSelector, ObjectMeta
from gpuops.kube.resources import ResourceType
from gpuops.kube.selectors import Selector, SelectorError
from gpuops.kube.selectors import compile_selector as _compile
from gpuops.kube.times import format_time, parse_time

__all__ = [
    "ACTIONS",
    "API_VERSION",
    "BUDGETS",
    "DEFAULT_RESOURCE",
    "FINALIZER",
    "GROUP",
    "KIND",
    "PAUSED_AT",
    "PAUSED_BY",
    "PLURAL",
    "VERSION",
    "Accounting",
    "Action",
    "BudgetSpec",
    "BudgetStatus",
    "Enforcement",
    "GPUWorkloadBudget",
    "LastEnforcement",
    "LedgerBucketStatus",
    "LedgerEntryStatus",
    "LedgerStatus",
    "ParsedSpec",
    "Quota",
    "Selector",
    "SpecError",
    "compile_selector",
    "format_time",
    "parse_spec",
    "parse_time",
]

GROUP: Final = "gpuops.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "gpuworkloadbudgets"
KIND: Final = "GPUWorkloadBudget"
API_VERSION: Final = f"{GROUP}/{VERSION}"
DEFAULT_RESOURCE: Final = "nvidia.com/gpu"

FINALIZER: Final = "gpuops.io/budget-accounting"
"""On matched pods of budgets with accounting.retainFinishedPods, until their final usage is in the ledger."""
PAUSED_BY: Final = "gpuops.io/paused-by"
"""`<namespace>/<budget>` on Jobs we suspended and pods we marked, so we resume only what we paused."""
PAUSED_AT: Final = "gpuops.io/paused-at"

Action = Literal["AlertOnly", "Pause", "Evict"]
ACTIONS: Final[tuple[Action, ...]] = ("AlertOnly", "Pause", "Evict")


class _Api(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Base of the CRD types: camelCase JSON, defaults left out, every field optional when decoding."""


# ---------------------------------------------------------------------------------------------- spec


class Quota(_Api):
    gpu_hours: str | int | float | None = None
    window_hours: int = 0


class Enforcement(_Api):
    action: str = "AlertOnly"
    delay_seconds: int = 60
    eviction_grace_period_seconds: int | None = None


class Accounting(_Api):
    retain_finished_pods: bool = False


class BudgetSpec(_Api):
    selector: LabelSelector | None = None
    gpu_resource_name: str = DEFAULT_RESOURCE
    quota: Quota = msgspec.field(default_factory=Quota)
    enforcement: Enforcement = msgspec.field(default_factory=Enforcement)
    accounting: Accounting = msgspec.field(default_factory=Accounting)


# ---------------------------------------------------------------------------------------------- status


class LedgerEntryStatus(_Api):
    """A finished or deleted pod whose usage keeps counting while it overlaps the window."""

    uid: str = ""
    name: str = ""
    start: str = ""
    end: str = ""
    gpus: str = "0"


class LedgerBucketStatus(_Api):
    """Compacted entries: `gpuSeconds` used inside [start, end), at most `peakGpus` at once."""

    start: str = ""
    end: str = ""
    gpu_seconds: str = "0"
    peak_gpus: str = "0"


class LedgerStatus(_Api):
    resource_name: str = ""
    max_entries: int = 0
    bucket_seconds: int = 0
    error_bound_gpu_hours: str = ""
    compacted_through: str | None = None
    """Finished pods ending at or before this are in the buckets (or out of the window): never count them again."""
    entries: tuple[LedgerEntryStatus, ...] | None = None
    buckets: tuple[LedgerBucketStatus, ...] | None = None


class LastEnforcement(_Api):
    action: str = ""
    pod: str = ""
    job: str = ""
    time: str = ""
    result: str = ""
    message: str = ""


class BudgetStatus(_Api):
    observed_generation: int = 0
    consumed_gpu_hours: str = ""
    remaining_gpu_hours: str = ""
    quota_gpu_hours: str = ""
    burn_rate_gpus: str = ""
    tracked_pods: int = 0
    running_pods: int = 0
    computed_at: str | None = None
    over_quota_since: str | None = None
    exhausts_at: str | None = None
    ledger: LedgerStatus | None = None
    last_enforcement: LastEnforcement | None = None
    conditions: tuple[Condition, ...] | None = None


class GPUWorkloadBudget(_Api):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: BudgetSpec = msgspec.field(default_factory=BudgetSpec)
    status: BudgetStatus = msgspec.field(default_factory=BudgetStatus)


BUDGETS: Final = ResourceType(GROUP, VERSION, PLURAL, KIND, True, GPUWorkloadBudget)


# ---------------------------------------------------------------------------------------------- selectors


def compile_selector(selector: LabelSelector | None, field: str = "spec.selector") -> Selector:
    """`gpuops.kube.selectors.compile_selector`, with its error as a SpecError (an empty selector is refused)."""
    try:
        return _compile(selector, field)
    except SelectorError as e:
        raise SpecError(e.field, e.detail) from None


# ---------------------------------------------------------------------------------------------- spec view


@dataclass(frozen=True, slots=True)
class ParsedSpec:
    """A checked spec in the units the accounting package wants (window and delay in microseconds)."""

    selector: Selector
    resource: str
    quota: Fraction
    window: int
    window_hours: int
    action: Action
    delay: int
    eviction_grace: int | None
    retain: bool


def parse_spec(spec: BudgetSpec) -> ParsedSpec:
    """The checked view of `spec`; SpecError names the first bad field."""
    selector = compile_selector(spec.selector)
    resource = spec.gpu_resource_name or DEFAULT_RESOURCE
    raw = spec.quota.gpu_hours
    if raw is None or raw == "":
        raise SpecError("spec.quota.gpuHours", 'required: the GPU-hours allowed per window, e.g. "100" or "2.5"')
    try:
        quota = parse_quantity(raw, what="spec.quota.gpuHours")
    except AccountingError as e:
        raise SpecError("spec.quota.gpuHours", f'{e}; write a quantity greater than 0, e.g. "100" or "2.5"') from None
    if quota <= 0:
        raise SpecError("spec.quota.gpuHours", f"must be greater than 0, got {raw!r}")
    hours = spec.quota.window_hours
    if isinstance(hours, bool) or not isinstance(hours, int) or hours < 1:
        raise SpecError("spec.quota.windowHours", f"must be an integer >= 1 (hours), got {hours!r}")
    action = spec.enforcement.action or "AlertOnly"
    if action not in ACTIONS:
        raise SpecError("spec.enforcement.action", f"unsupported value {action!r}: use Evict, Pause or AlertOnly")
    delay = spec.enforcement.delay_seconds
    if delay < 0:
        raise SpecError("spec.enforcement.delaySeconds", f"must be >= 0, got {delay}")
    grace = spec.enforcement.eviction_grace_period_seconds
    if grace is not None and grace < 0:
        raise SpecError("spec.enforcement.evictionGracePeriodSeconds", f"must be >= 0, got {grace}")
    return ParsedSpec(
        selector=selector,
        resource=resource,
        quota=quota,
        window=hours * MICROS_PER_HOUR,
        window_hours=hours,
        action=action,
        delay=delay * 1_000_000,
        eviction_grace=grace,
        retain=spec.accounting.retain_finished_pods,
    )

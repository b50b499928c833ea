"""GPUWorkloadBudget (gpuops.io/v1alpha1): the CRD's types, and the checked view of a spec the reconciler uses.

The CRD schema is generated from these Structs (`make manifests`) and refuses bad specs at admission; `parse_spec`
checks them again because objects written before a schema change, or by a server without CEL, can still
reach us. Its errors name the field and the fix, and end up in the Ready/Degraded conditions.

Time in status: RFC 3339 in UTC, written with a fraction only when there is one. Pod-derived instants have
whole seconds (Kubernetes truncates them; a pod that left the API still running has no recorded end and ends at
our own observation, in microseconds), and so do the instants figures are counted at (computedAt,
overQuotaSince, exhaustsAt: `gpuops.accounting.reporting`); lastEnforcement.time keeps the clock's microseconds.
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Final, Literal

import msgspec

from gpuops.accounting import windows as win
from gpuops.accounting.calendar import CALENDARS, Calendar
from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import MICROS_PER_HOUR, format_gpu_hours
from gpuops.accounting.pricing import Unit
from gpuops.accounting.quantity import parse_quantity
from gpuops.controllers.apigroup import DEFAULT_RESOURCE, ApiStruct, CustomObject, custom_resource, resource_type
from gpuops.controllers.budget.pricelist import CURRENCY
from gpuops.controllers.errors import SpecError
from gpuops.kube.crd import USE_DEFAULT, Column, Rule, crd
from gpuops.kube.crd.patterns import DNS_SUBDOMAIN, QUANTITY, resource_name
from gpuops.kube.objects import Condition, LabelSelector
from gpuops.kube.selectors import Selector, SelectorError
from gpuops.kube.selectors import compile_selector as _compile
from gpuops.kube.times import format_time, parse_time

__all__ = [
    "ACTIONS",
    "BUDGETS",
    "DEFAULT_RESOURCE",
    "FINALIZER",
    "GATE",
    "GATED_BY",
    "GATE_CONDITION",
    "KIND",
    "PAUSED_AT",
    "PAUSED_BY",
    "PLURAL",
    "Accounting",
    "Action",
    "Allowance",
    "BudgetSpec",
    "BudgetStatus",
    "CalendarWindowSpec",
    "CostQuota",
    "Enforcement",
    "GPUWorkloadBudget",
    "LastEnforcement",
    "LedgerBucketStatus",
    "LedgerEntryStatus",
    "LedgerStatus",
    "ParsedSpec",
    "PeriodSummary",
    "Quota",
    "Selector",
    "SpecError",
    "UsageByKind",
    "compile_selector",
    "format_time",
    "load_zone",
    "parse_spec",
    "parse_time",
    "parse_window",
]

PLURAL: Final = "gpuworkloadbudgets"
KIND: Final = "GPUWorkloadBudget"

FINALIZER: Final = "gpuops.io/budget-accounting"
"""On matched pods of budgets with accounting.retainFinishedPods, until their final usage is in the ledger."""
PAUSED_BY: Final = "gpuops.io/paused-by"
"""`<namespace>/<budget>` on Jobs we suspended and pods we marked, so we resume only what we paused."""
PAUSED_AT: Final = "gpuops.io/paused-at"
GATE: Final = "gpuops.io/budget"
"""The scheduling gate a Gate budget's admission webhook puts on the new pods it holds back."""
GATED_BY: Final = "gpuops.io/gated-by"
"""On a held pod: the names of the budgets (in its namespace, comma-separated) holding it; the gate goes once
none is left."""
GATE_CONDITION: Final = "gpuops.io/BudgetGate"
"""The held pod's condition: True while a budget holds it (the message names which and until when), False once
released."""

CARRY_OVER: Final = ("None", "Unused")
_ZONE_NAME: Final = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$"
"""The shape of an IANA time zone name: relative, without "." or "..", so it can only name a zone."""

Action = Literal["AlertOnly", "Pause", "Evict", "Gate"]
ACTIONS: Final[tuple[Action, ...]] = ("AlertOnly", "Pause", "Evict", "Gate")


# ---------------------------------------------------------------------------------------------- spec


class CalendarWindowSpec(ApiStruct):
    calendar: Annotated[str, crd(required=True, enum=CALENDARS)] = ""
    """Day, Week (Monday to Sunday, ISO 8601) or Month: the budget renews at the start of each, and usage from
    before the current one stops counting."""
    time_zone: Annotated[str, crd(default=USE_DEFAULT, max_length=64, pattern=_ZONE_NAME)] = "UTC"
    """The IANA time zone whose wall clock the periods follow (e.g. Europe/Berlin, America/New_York): a period
    starts at local midnight, or where the clock jumps over midnight at the first instant after the jump. Days
    last 23 or 25 hours across daylight saving changes."""
    carry_over: Annotated[str, crd(default=USE_DEFAULT, enum=CARRY_OVER)] = "None"
    """What a period left unused: None (the default) is forfeited, every period starts with the quota. Unused is
    added to the next period's quota, at most one quota (a period never allows more than twice the quota); only
    from a period this budget accounted (a new budget, or one whose operator missed a whole period, carries
    nothing). status.carriedOverGpuHours shows it."""


def _positive(field: str, example: str) -> Rule:
    return Rule("isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0')) && "
                "quantity(string(self)).isLessThan(quantity('1G'))",
                f"{field} must be a quantity greater than 0 and below 1G (a billion), e.g. {example}")


class CostQuota(ApiStruct):
    amount: Annotated[str | int | None, crd(required=True, pattern=QUANTITY, rules=(
        _positive("spec.quota.cost.amount", '"5000" or "12.5"'),))] = None
    """Money allowed per window, in `currency`, at the prices of the budget's GPUPriceList."""
    currency: Annotated[str, crd(required=True, pattern=CURRENCY)] = ""
    """ISO 4217 code; it must be the price list's currency."""


class Quota(ApiStruct):
    gpu_hours: Annotated[str | int | None, crd(pattern=QUANTITY, rules=(
        _positive("spec.quota.gpuHours", '"100", "2.5" or "500m"'),))] = None
    """GPU-hours allowed per window, a quantity greater than 0 ("100", "2.5", "500m"). Reaching it exactly counts
    as over quota. Set this, weightedGpuHours or cost."""
    weighted_gpu_hours: Annotated[str | int | None, crd(pattern=QUANTITY, rules=(
        _positive("spec.quota.weightedGpuHours", '"400" or "2.5"'),))] = None
    """Weighted GPU-hours allowed per window: each GPU-hour counts the weight its GPU model has in the budget's
    GPUPriceList (an H100 hour may count 4, an L4 hour 1)."""
    cost: CostQuota | None = None
    """Money allowed per window: each GPU-hour costs the price of its GPU model and capacity type (spot or
    on-demand) in the budget's GPUPriceList, at the prices in force while it ran."""
    window_hours: Annotated[int | None, crd(minimum=1, maximum=8784)] = None
    """Length of a rolling window in hours: usage older than this stops counting. Set this or `window`."""
    window: CalendarWindowSpec | None = None
    """A calendar window instead of a rolling one: the quota renews every day, week or month of a time zone (with
    nothing carried over from the previous period unless `carryOver` says so). Set this or `windowHours`."""


class Enforcement(ApiStruct):
    action: Annotated[str, crd(default=USE_DEFAULT, enum=ACTIONS)] = "AlertOnly"
    """AlertOnly emits a Warning Event QuotaExceeded (then at most one reminder per 10 minutes) and touches
    nothing. Pause suspends the batch/v1 Jobs owning matched pods (and annotates other matched pods with
    gpuops.io/paused-by), and resumes them once under quota. Evict evicts running matched pods through the
    Eviction API (PodDisruptionBudgets respected), largest in-window usage first; their usage keeps counting.
    Gate alerts as AlertOnly and, from delaySeconds after the budget went over quota, holds back new matched pods
    that request its resource: the operator's admission webhook admits them with the scheduling gate
    gpuops.io/budget and the pod condition gpuops.io/BudgetGate says which budget holds them and until when; they
    are released oldest first as the budget allows (see gateHorizonMinutes). Running pods and Jobs are never
    touched."""
    delay_seconds: Annotated[int, crd(default=USE_DEFAULT, minimum=0, maximum=2592000)] = 60
    """Seconds the budget must stay over quota before the action runs, measured from the QuotaExceeded transition
    (an operator restart does not reset it)."""
    eviction_grace_period_seconds: Annotated[int | None, crd(minimum=0, maximum=86400)] = None
    """Termination grace period for evicted pods (Eviction deleteOptions); unset uses each pod's own
    terminationGracePeriodSeconds."""
    gate_horizon_minutes: Annotated[int, crd(default=USE_DEFAULT, minimum=0, maximum=44640)] = 60
    """Gate: a held pod is released when the remaining quota covers this many minutes of its GPUs, of the running
    pods' and of the pods released before it, each GPU-hour at the highest rate the quota's unit charges (1 for
    GPU-hours; the price list's highest weight or price otherwise). 0 releases every held pod as soon as the
    budget is under quota."""


class Accounting(ApiStruct):
    retain_finished_pods: Annotated[bool, crd(default=USE_DEFAULT)] = False
    """Put the finalizer gpuops.io/budget-accounting on matched pods and remove it only once their final usage is
    in status.ledger, so pods deleted while the operator is down are not lost. Without it such pods are lost
    (bounded by their GPUs times their runtime)."""


class BudgetSpec(ApiStruct):
    selector: Annotated[LabelSelector | None, crd(required=True, map_type="atomic", rules=(
        Rule("(has(self.matchLabels) && size(self.matchLabels) > 0) || "
             "(has(self.matchExpressions) && size(self.matchExpressions) > 0)",
             "spec.selector must not be empty: set matchLabels or matchExpressions (an empty selector would match "
             "every pod in the namespace)", reason="FieldValueRequired"),
    ))] = None
    """Label selector of the pods (in the budget's namespace) whose GPU usage counts. It must not be empty: an
    empty selector would match every pod in the namespace. A pod counts in every budget that selects it."""
    gpu_resource_name: Annotated[str, resource_name(default=USE_DEFAULT)] = DEFAULT_RESOURCE
    """The extended resource whose effective request counts as GPUs (init containers, sidecars and pod overhead
    included, as the scheduler counts them); with nvidia.com/gpu, MIG slices (nvidia.com/mig-*) count as their
    share of the GPU (3g of an A100 is 3/7). Use "cpu" to try budgets on a cluster without GPUs; fractional
    amounts count as fractions of a GPU."""
    quota: Annotated[Quota, crd(required=True, rules=(
        Rule("has(self.windowHours) != has(self.window)",
             "set exactly one of spec.quota.windowHours (a rolling window, e.g. 24) and spec.quota.window (a "
             "calendar period, e.g. {calendar: Month, timeZone: Europe/Berlin})"),
        Rule("(has(self.gpuHours) ? 1 : 0) + (has(self.weightedGpuHours) ? 1 : 0) + (has(self.cost) ? 1 : 0) == 1",
             "set exactly one of spec.quota.gpuHours, spec.quota.weightedGpuHours and spec.quota.cost",
             reason="FieldValueRequired"),
    ))] = msgspec.field(default_factory=Quota)
    """How much per window (GPU-hours, weighted GPU-hours or money), and which window."""
    price_list: Annotated[str | None, crd(max_length=253, pattern=DNS_SUBDOMAIN)] = None
    """The GPUPriceList that prices and weighs this budget's GPU-hours; unset: the one marked default. Without one,
    the budget counts GPU-hours only (a weighted or cost quota needs one)."""
    enforcement: Annotated[Enforcement, crd(default=USE_DEFAULT)] = msgspec.field(default_factory=Enforcement)
    """What happens once the budget is over quota."""
    accounting: Annotated[Accounting, crd(default=USE_DEFAULT)] = msgspec.field(default_factory=Accounting)
    """How finished pods are kept."""


# ---------------------------------------------------------------------------------------------- status


class LedgerEntryStatus(ApiStruct):
    """A finished or deleted pod whose usage keeps counting while it overlaps the window."""

    uid: str = ""
    """The pod's UID."""
    name: str = ""
    """The pod's name (in the budget's namespace)."""
    start: Annotated[str, crd(format="date-time")] = ""
    """Earliest container start."""
    end: Annotated[str, crd(format="date-time")] = ""
    """Latest container finish (or when the pod was seen gone), as counted."""
    gpus: str = "0"
    """GPUs held (a quantity)."""
    recorded_end: Annotated[str | None, crd(format="date-time")] = None
    """Present when `end` lies past the pod's recorded finish: an earlier figure counted the pod that far before
    its finish reached the operator, and a reported figure is not taken back. The time between the two is
    counted and included in errorBoundGpuHours."""
    model: str | None = None
    """The GPU model of the node the pod ran on (its nvidia.com/gpu.product label); absent if unknown."""
    capacity_type: str | None = None
    """OnDemand or Spot, from the node's labels while the pod ran; absent if unknown."""


class LedgerBucketStatus(ApiStruct):
    """Compacted entries: `gpuSeconds` used inside [start, end), at most `peakGpus` at once."""

    start: Annotated[str, crd(format="date-time")] = ""
    """Cell start."""
    end: Annotated[str, crd(format="date-time")] = ""
    """Cell end."""
    gpu_seconds: str = "0"
    """GPU-seconds used inside the cell (a quantity)."""
    peak_gpus: str = "0"
    """Upper bound on the GPUs in use at once inside the cell (a quantity)."""
    late_gpu_seconds: str = "0"
    """Of gpuSeconds, what was counted past the merged pods' recorded finishes (see the entries' recordedEnd)."""
    model: str | None = None
    """The GPU model of the merged entries (one bucket per model and capacity type in a cell)."""
    capacity_type: str | None = None
    """OnDemand or Spot, of the merged entries."""


class LedgerStatus(ApiStruct):
    resource_name: str = ""
    """The resource the amounts are of (a changed gpuResourceName starts a new ledger)."""
    max_entries: int = 0
    """Entries kept individually before the oldest are merged into buckets."""
    bucket_seconds: int = 0
    """Width of the buckets entries are merged into."""
    error_bound_gpu_hours: str = ""
    """Most GPU-hours consumedGpuHours can exceed the usage the pods' own records give right now: buckets
    straddling the window's trailing edge count whole, and time counted past recorded finishes (recordedEnd,
    lateGpuSeconds) counts. consumedGpuHours minus this never exceeds the usage by the records."""
    compacted_through: Annotated[str | None, crd(format="date-time")] = None
    """Finished pods ending at or before this are in the buckets (or out of the window): they are never counted
    again."""
    entries: tuple[LedgerEntryStatus, ...] | None = None
    """One entry per finished or deleted pod."""
    buckets: tuple[LedgerBucketStatus, ...] | None = None
    """Merged entries, one per grid cell of bucketSeconds."""


class LastEnforcement(ApiStruct):
    action: str = ""
    """AlertOnly, Pause or Evict."""
    pod: str = ""
    """The pod acted on (or the largest consumer, for AlertOnly)."""
    job: str = ""
    """The Job suspended or resumed (Pause)."""
    time: Annotated[str, crd(format="date-time")] = ""
    """When."""
    result: str = ""
    """Alerted, Suspended, Marked, Resumed, Evicted, Blocked or Failed."""
    message: str = ""
    """What happened, for humans."""


class UsageByKind(ApiStruct):
    """GPU-hours used in the window on one GPU model with one capacity type."""

    model: str = ""
    """The nodes' GPU model (nvidia.com/gpu.product); empty where the pods' node was not known."""
    capacity_type: str = ""
    """OnDemand or Spot; empty where the pods' node was not known."""
    gpu_hours: str = "0"
    """GPU-hours in the window at computedAt, 6 decimals."""
    weighted_gpu_hours: str | None = None
    """Weighted GPU-hours (with a price list), 6 decimals."""
    cost: str | None = None
    """What they cost (with a price list), in status.currency, 6 decimals."""


class Allowance(ApiStruct):
    """A weighted or cost quota's figures, in its unit (a GPU-hours quota has quotaGpuHours and
    remainingGpuHours)."""

    unit: str = ""
    """WeightedGPUHours or Cost."""
    currency: str | None = None
    """Of a cost quota."""
    quota: str = ""
    """For the current window (with a calendar window, what carried over included), 6 decimals."""
    consumed: str = ""
    """Used in the window at computedAt, 6 decimals."""
    remaining: str = ""
    """Quota minus consumption, floored at 0."""
    carried_over: str | None = None
    """With a calendar window: what the previous period left unused that the quota includes."""


class PeriodSummary(ApiStruct):
    """What a calendar budget's previous period used, frozen when the next one began (for chargeback)."""

    start: Annotated[str, crd(format="date-time")] = ""
    """When the period began."""
    end: Annotated[str, crd(format="date-time")] = ""
    """When it ended."""
    gpu_hours: str = "0"
    """GPU-hours used in it, 6 decimals."""
    weighted_gpu_hours: str | None = None
    """Weighted GPU-hours (with a price list)."""
    cost: str | None = None
    """What they cost (with a price list), in `currency`."""
    currency: str | None = None
    """Of the cost."""
    usage: tuple[UsageByKind, ...] | None = None
    """By GPU model and capacity type."""


class BudgetStatus(ApiStruct):
    observed_generation: Annotated[int, crd(format="int64")] = 0
    """The spec generation this status describes."""
    consumed_gpu_hours: str = ""
    """GPU-hours used in the window at computedAt, running pods counted up to it, 6 decimals (exact before
    rounding). Events and metrics show the same figure for the same second."""
    remaining_gpu_hours: str = ""
    """Quota minus consumption at computedAt, floored at 0, 6 decimals."""
    quota_gpu_hours: str = ""
    """The quota in GPU-hours for the current window, 6 decimals (with a calendar window, what carried over
    included)."""
    burn_rate_gpus: str = ""
    """GPUs held by matched running pods at computedAt (consumption grows at this rate)."""
    tracked_pods: Annotated[int | None, crd(format="int32")] = None  # None until computed: 0 is written
    """Pods (live or in the ledger) whose GPU usage overlaps the window."""
    running_pods: Annotated[int | None, crd(format="int32")] = None
    """Matched pods holding GPUs now."""
    held_pods: Annotated[int | None, crd(format="int32")] = None
    """Gate: pods this budget holds back now, waiting for its quota (absent for other actions)."""
    computed_at: Annotated[str | None, crd(format="date-time")] = None
    """The whole second these numbers were computed at (written only when one of them changed)."""
    period_start: Annotated[str | None, crd(format="date-time")] = None
    """With a calendar window: when the current period began (usage before it no longer counts)."""
    period_end: Annotated[str | None, crd(format="date-time")] = None
    """With a calendar window: when the current period ends and the quota renews."""
    carried_over_gpu_hours: str | None = None
    """With a calendar window: GPU-hours the previous period left unused that this period's quota includes
    (quotaGpuHours is spec.quota.gpuHours plus this); 0 unless spec.quota.window.carryOver is Unused."""
    over_quota_since: Annotated[str | None, crd(format="date-time")] = None
    """Since when consumption has been at or above the quota; enforcement delays count from it."""
    exhausts_at: Annotated[str | None, crd(format="date-time")] = None
    """When the quota will be reached if running pods keep running and nothing new starts (usage leaving the window
    accounted for); absent if never or already over quota."""
    allowance: Allowance | None = None
    """A weighted or cost quota's figures in its unit; the enforcement decision and exhaustsAt follow them."""
    price_list: str | None = None
    """The GPUPriceList the figures below are counted with."""
    currency: str | None = None
    """Of costSoFar and usage[].cost."""
    cost_so_far: str | None = None
    """What the GPU-hours in the window cost, each at the prices in force while it ran, 6 decimals."""
    consumed_weighted_gpu_hours: str | None = None
    """Weighted GPU-hours in the window, 6 decimals."""
    usage: tuple[UsageByKind, ...] | None = None
    """consumedGpuHours (and with a price list weighted GPU-hours and cost) by GPU model and capacity type (the
    kinds add up to the totals before rounding)."""
    previous_period: PeriodSummary | None = None
    """With a calendar window: what the previous period used, by GPU model and capacity type, as it ended (kept
    through the current period; only a period this budget accounted to its end)."""
    ledger: LedgerStatus | None = None
    """Usage of finished and deleted pods still inside the window, so it keeps counting after the pods are gone.
    Bounded: beyond maxEntries the oldest entries merge into buckets of bucketSeconds. consumedGpuHours exceeds
    the usage the pods' records give by at most errorBoundGpuHours."""
    last_enforcement: LastEnforcement | None = None
    """The latest enforcement step."""
    conditions: Annotated[tuple[Condition, ...] | None, crd(list_type="map", list_map_keys=("type",))] = None
    """Ready, QuotaExceeded, Degraded and, once Pause has met a Job another controller owns, ConflictDetected
    (True with reason ExternallyManagedJobs naming the Jobs left running, e.g. Kueue's; False once none is).
    metav1.Condition."""


class GPUWorkloadBudget(CustomObject):
    """GPUWorkloadBudget limits the GPU-hours that the pods chosen by a label selector may use within a rolling
    window or a calendar period (a day, week or month of a time zone), and enforces the limit (alert, pause Jobs,
    or evict pods). Usage of finished and deleted pods keeps counting while it is inside the window.
    How usage is counted: a pod holds its GPUs from its first container start to its last container finish, in
    whole seconds as Kubernetes records them; a running pod counts up to the last whole second, and no further
    than the operator's pod watch has been current (while that watch is down, counting pauses rather than
    guesses). Status, Events, the enforcement decision and the metrics compute the same figure at the same whole
    second (the status's computedAt), so an Event never names a figure the status contradicts. A reported figure
    is not taken back when a pod's finish arrives late: the pod counts through the second an earlier figure
    counted it, up to one second past its recorded finishedAt (that record's precision: a container that
    finished "at second 10" stopped within [10, 11)); the ledger marks those seconds (recordedEnd) and
    status.ledger.errorBoundGpuHours includes them. Only a finish the operator learned of more than a second
    after its recorded finishedAt, by the operator's clock (a late write, a slow watch, or an operator clock
    ahead of the cluster's), lowers an earlier figure, to the exact one. The operator remembers reported seconds
    while it runs; after a restart a pod's recorded finish counts. A pod that starts and stops within the same second
    counts zero. A pod that vanishes while still running has no recorded finish: it counts until the operator
    stopped it (an eviction without grace period) or saw it go."""

    spec: Annotated[BudgetSpec, crd(required=True)] = msgspec.field(default_factory=BudgetSpec)
    """What to account and how to enforce it."""
    status: BudgetStatus = msgspec.field(default_factory=BudgetStatus)
    """Written by the budget controller."""


BUDGETS: Final = resource_type(PLURAL, KIND, True, GPUWorkloadBudget)
CRD: Final = custom_resource(
    BUDGETS,
    Column("Consumed", "string", ".status.consumedGpuHours",
           "GPU-hours used in the window when the status was last computed."),
    Column("Quota", "string", ".spec.quota.gpuHours", "GPU-hours allowed per window."),
    Column("Remaining", "string", ".status.remainingGpuHours", "Quota minus consumption, floored at 0."),
    Column("Pods", "integer", ".status.trackedPods",
           "Pods whose GPU usage overlaps the window (live or in the ledger)."),
    Column("Action", "string", ".spec.enforcement.action",
           "What happens once the budget has been over quota for enforcement.delaySeconds."),
    Column("Exceeded", "string", '.status.conditions[?(@.type=="QuotaExceeded")].status',
           "The QuotaExceeded condition.", priority=1),
    Column("Window", "integer", ".spec.quota.windowHours", "Rolling window length in hours.", priority=1),
    Column("Renews", "date", ".status.periodEnd", "When a calendar window's period ends and the quota renews.",
           priority=1),
    Column("Cost", "string", ".status.costSoFar", "What the GPU-hours in the window cost (with a price list).",
           priority=1),
    Column("Currency", "string", ".status.currency", "Of the cost.", priority=1),
    Column("Held", "integer", ".status.heldPods", "Gate: pods held back, waiting for the quota.", priority=1),
    short_names=("gwb",),
)


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
    window: win.Window
    per: str
    """The window for messages: "24h", or "calendar month (Europe/Berlin)"."""
    action: Action
    delay: int
    eviction_grace: int | None
    retain: bool
    gate_horizon: int = 3_600_000_000
    """Gate: microseconds of GPUs the remaining quota must cover for a held pod to go (`gpuops.accounting.gate`)."""
    unit: Unit = "GPUHours"
    """What the quota counts: GPU-hours, weighted GPU-hours or money (the price list's)."""
    currency: str | None = None
    """A cost quota's currency."""
    price_list: str | None = None
    """The GPUPriceList named by the spec; None: the default one."""
    carry_over: bool = False
    """Calendar windows: the previous period's unused quota is added to the current one's."""
    carried: Fraction | None = None
    """Set on the spec of one reconcile (`carryover.in_period`): what the quota includes from the previous
    period; None for rolling windows."""

    def length_at(self, at: int) -> int:
        """The length of the window `at` sees (in a calendar period: the time since it began)."""
        return win.length_at(self.window, at)

    def edge_at(self, at: int) -> int:
        """The window's trailing edge at `at`: usage before it does not count."""
        return at - win.length_at(self.window, at)

    @property
    def unit_name(self) -> str:
        """The quota's unit in messages: "GPU-hours", "weighted GPU-hours" or the currency."""
        if self.unit == "Cost":
            return self.currency or ""
        return "weighted GPU-hours" if self.unit == "WeightedGPUHours" else "GPU-hours"

    def amount(self, value: Fraction) -> str:
        """An amount in the quota's unit, for messages: "12.500000 GPU-hours", "30.000000 EUR"."""
        return f"{format_gpu_hours(value)} {self.unit_name}"

    @property
    def accounted_over(self) -> str:
        """"over a 24h window", "per calendar month (Europe/Berlin)"."""
        return f"over a {self.per} window" if isinstance(self.window, win.RollingWindow) else f"per {self.per}"

    @property
    def during(self) -> str:
        """"in the last 24h", "this calendar month (Europe/Berlin)"."""
        return f"in the last {self.per}" if isinstance(self.window, win.RollingWindow) else f"this {self.per}"


def parse_spec(spec: BudgetSpec) -> ParsedSpec:
    """The checked view of `spec`; SpecError names the first bad field."""
    selector = compile_selector(spec.selector)
    resource = spec.gpu_resource_name or DEFAULT_RESOURCE
    unit, field, raw = _quota_amount(spec.quota)
    try:
        quota = parse_quantity(raw, what=field)
    except AccountingError as e:
        raise SpecError(field, f'{e}; write a quantity greater than 0, e.g. "100" or "2.5"') from None
    if quota <= 0:
        raise SpecError(field, f"must be greater than 0, got {raw!r}")
    currency = spec.quota.cost.currency if spec.quota.cost is not None else None
    if unit == "Cost" and not re.fullmatch(CURRENCY, currency or ""):
        raise SpecError("spec.quota.cost.currency", f"must be an ISO 4217 code such as EUR or USD, got {currency!r}")
    window, per = parse_window(spec.quota)
    carry = spec.quota.window is not None and spec.quota.window.carry_over == "Unused"
    if spec.quota.window is not None and spec.quota.window.carry_over not in CARRY_OVER:
        raise SpecError("spec.quota.window.carryOver", f"unsupported value {spec.quota.window.carry_over!r}: use "
                                                       "None or Unused")
    action = spec.enforcement.action or "AlertOnly"
    if action not in ACTIONS:
        raise SpecError("spec.enforcement.action", f"unsupported value {action!r}: use Evict, Pause, Gate or "
                                                   "AlertOnly")
    delay = spec.enforcement.delay_seconds
    if delay < 0:
        raise SpecError("spec.enforcement.delaySeconds", f"must be >= 0, got {delay}")
    grace = spec.enforcement.eviction_grace_period_seconds
    if grace is not None and grace < 0:
        raise SpecError("spec.enforcement.evictionGracePeriodSeconds", f"must be >= 0, got {grace}")
    horizon = spec.enforcement.gate_horizon_minutes
    if horizon < 0:
        raise SpecError("spec.enforcement.gateHorizonMinutes", f"must be >= 0, got {horizon}")
    return ParsedSpec(
        selector=selector,
        resource=resource,
        quota=quota,
        window=window,
        per=per,
        action=action,
        delay=delay * 1_000_000,
        eviction_grace=grace,
        retain=spec.accounting.retain_finished_pods,
        gate_horizon=horizon * 60 * 1_000_000,
        unit=unit,
        currency=currency,
        price_list=spec.price_list or None,
        carry_over=carry,
    )


def _quota_amount(quota: Quota) -> tuple[Unit, str, str | int]:
    """The quota's unit, the field holding its amount, and the amount; SpecError unless exactly one is set."""
    given: list[tuple[Unit, str, str | int | None]] = []
    if quota.weighted_gpu_hours is not None:
        given.append(("WeightedGPUHours", "spec.quota.weightedGpuHours", quota.weighted_gpu_hours))
    if quota.cost is not None:
        given.append(("Cost", "spec.quota.cost.amount", quota.cost.amount))
    if quota.gpu_hours is not None or not given:
        given.insert(0, ("GPUHours", "spec.quota.gpuHours", quota.gpu_hours))
    if len(given) != 1:
        raise SpecError("spec.quota", 'set exactly one of gpuHours (e.g. "100"), weightedGpuHours (e.g. "400") and '
                                      'cost (e.g. {amount: "5000", currency: EUR})')
    unit, field, raw = given[0]
    if raw is None or raw == "":
        raise SpecError(field, 'required: the amount allowed per window, e.g. "100" or "2.5"')
    return unit, field, raw


def parse_window(quota: Quota) -> tuple[win.Window, str]:
    """The rolling or calendar window `quota` names, and how messages name it."""
    hours, calendar = quota.window_hours, quota.window
    if (hours is None) == (calendar is None):
        raise SpecError("spec.quota", "set exactly one of windowHours (a rolling window, e.g. 24) and window (a "
                                      "calendar period, e.g. {calendar: Month, timeZone: Europe/Berlin})")
    if calendar is None:
        if isinstance(hours, bool) or not isinstance(hours, int) or hours < 1:
            raise SpecError("spec.quota.windowHours", f"must be an integer >= 1 (hours), got {hours!r}")
        return win.RollingWindow(hours * MICROS_PER_HOUR), f"{hours}h"
    if calendar.calendar not in CALENDARS:
        raise SpecError("spec.quota.window.calendar", f"unsupported value {calendar.calendar!r}: use Day, Week or "
                                                      "Month")
    name = calendar.time_zone or "UTC"
    zone = load_zone(name)
    kind: Calendar = calendar.calendar  # checked against CALENDARS above
    return win.CalendarWindow(kind, zone), f"calendar {kind.lower()} ({name})"


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone `name` from the tz database; SpecError if there is no such zone."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise SpecError("spec.quota.window.timeZone", f"unknown time zone {name!r}: use an IANA name such as "
                                                      "Europe/Berlin, America/New_York or UTC") from None

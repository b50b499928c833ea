"""A budget's status: the one the reconcile computed (figures, ledger, conditions), and its write.

The write is one merge patch of what changed, guarded by the resourceVersion the reconcile read: a status that
did not change costs no write, and a budget changed meanwhile is reconciled again from its update event.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.accounting.pricing import Totals
from gpuops.accounting.reporting import counting_instant
from gpuops.accounting.windows import period_of
from gpuops.controllers.coexistence import CONDITION, NO_CONFLICT
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.errors import NotFound
from gpuops.kube.mergepatch import merge_patch
from gpuops.kube.objects import Condition

from .api import (
    BUDGETS,
    Allowance,
    BudgetStatus,
    GPUWorkloadBudget,
    LastEnforcement,
    LedgerStatus,
    ParsedSpec,
    PeriodSummary,
    SpecError,
    UsageByKind,
    format_time,
)
from .kinds import split
from .ledger import usage_quantity
from .units import Figures

__all__ = ["JOBS_LEFT_ALONE", "desired_status", "invalid_status", "usage_items", "with_conflict", "write_status"]

_SECOND = 1_000_000

JOBS_LEFT_ALONE = "ExternallyManagedJobs"
"""ConflictDetected reason (and Event reason) of a budget whose Pause left Jobs to the controller owning them."""


def _stamp(now: int) -> str:
    """A condition's lastTransitionTime: whole seconds, as metav1.Time holds them."""
    return format_time(now - now % _SECOND)


def _conditions(items: list[dict[str, Any]]) -> tuple[Condition, ...]:
    return msgspec.convert(items, tuple[Condition, ...])


def desired_status(
    budget: GPUWorkloadBudget,
    spec: ParsedSpec,
    fig: Figures,
    ledger: LedgerStatus,
    *,
    over_since: int | None,
    previous: PeriodSummary | None = None,
    last: LastEnforcement | None,
    degraded: tuple[str, str] | None,
    running: int,
    held: int | None = None,
    gating: tuple[bool, str] | None = None,
    now: int,
) -> BudgetStatus:
    """The status for the figures at counting instant `now`; computedAt stays as it is (`write_status` sets it
    when anything else changed)."""
    period = period_of(spec.window, now)
    gpu, usage, priced = fig.gpu_hours, fig.quota, fig.priced
    in_gpu_hours = spec.unit == "GPUHours"
    carried = format_gpu_hours(spec.carried) if spec.carried is not None else None
    return BudgetStatus(
        observed_generation=budget.metadata.generation,
        consumed_gpu_hours=format_gpu_hours(gpu.consumed),
        remaining_gpu_hours=format_gpu_hours(usage.remaining) if in_gpu_hours else "",
        quota_gpu_hours=format_gpu_hours(spec.quota) if in_gpu_hours else "",
        burn_rate_gpus=usage_quantity(gpu.burn_rate),
        tracked_pods=gpu.pods_in_window,
        running_pods=running,
        held_pods=held,
        computed_at=budget.status.computed_at,
        period_start=format_time(period.start) if period is not None else None,
        period_end=format_time(period.end) if period is not None else None,
        carried_over_gpu_hours=carried if in_gpu_hours else None,
        over_quota_since=format_time(over_since) if over_since is not None else None,
        exhausts_at=format_time(usage.exhausted_at) if usage.exhausted_at is not None else None,
        allowance=None if in_gpu_hours else Allowance(
            unit=spec.unit, currency=spec.currency, quota=format_gpu_hours(spec.quota),
            consumed=format_gpu_hours(usage.consumed), remaining=format_gpu_hours(usage.remaining),
            carried_over=carried),
        price_list=priced.name if priced is not None else None,
        currency=priced.currency if priced is not None else None,
        cost_so_far=format_gpu_hours(fig.cost) if priced is not None else None,
        consumed_weighted_gpu_hours=format_gpu_hours(fig.weighted) if priced is not None else None,
        usage=usage_items(fig.by_kind, priced is not None),
        previous_period=previous,
        ledger=ledger,
        last_enforcement=last,
        conditions=_conditions(_gating(_accounted(budget, spec, usage.over_quota, over_since, degraded, now),
                                       gating, budget.metadata.generation, now)),
    )


def usage_items(by_kind: Mapping[str, Totals], priced: bool) -> tuple[UsageByKind, ...] | None:
    """status.usage (and previousPeriod.usage): one item per kind, weighted and cost only with a price list."""
    items = []
    for key, totals in sorted(by_kind.items()):
        model, capacity = split(key)
        items.append(UsageByKind(
            model=model or "", capacity_type=capacity or "", gpu_hours=format_gpu_hours(totals.gpu_hours),
            weighted_gpu_hours=format_gpu_hours(totals.weighted_gpu_hours) if priced else None,
            cost=format_gpu_hours(totals.cost) if priced else None))
    return tuple(items) or None


def _accounted(budget: GPUWorkloadBudget, spec: ParsedSpec, over: bool, over_since: int | None,
               degraded: tuple[str, str] | None, now: int) -> list[dict[str, Any]]:
    """Ready, QuotaExceeded and Degraded of a budget whose usage was accounted."""
    gen, stamp = budget.metadata.generation, _stamp(now)
    quota, window = spec.amount(spec.quota), spec.per
    items = cond.set_condition(
        budget.status.conditions, "Ready", "True", "Accounted",
        f"usage of {spec.resource} by the selected pods is accounted {spec.accounted_over}", gen, now=stamp,
    )
    if over:
        msg = f"consumption reached the quota of {quota} per {window}"
        if over_since is not None:
            msg += f" (since {format_time(over_since)}); action {spec.action}"
        items = cond.set_condition(items, "QuotaExceeded", "True", "QuotaReached", msg, gen, now=stamp)
    else:
        items = cond.set_condition(items, "QuotaExceeded", "False", "WithinBudget",
                                   f"consumption is below the quota of {quota} per {window}",
                                   gen, now=stamp)
    if degraded is None:
        return cond.set_condition(items, "Degraded", "False", "AsExpected",
                                  "accounting and enforcement work as expected", gen, now=stamp)
    return cond.set_condition(items, "Degraded", "True", degraded[0], degraded[1], gen, now=stamp)


def _gating(items: list[dict[str, Any]], gating: tuple[bool, str] | None, gen: int | None,
            now: int) -> list[dict[str, Any]]:
    """Gate budgets: the Gating condition (whether new pods are held, why and until when); none otherwise."""
    if gating is None:
        return cond.remove_condition(items, "Gating")
    closed, message = gating
    return cond.set_condition(items, "Gating", "True" if closed else "False",
                              "HoldingNewPods" if closed else "AdmittingNewPods", message, gen, now=_stamp(now))


def invalid_status(budget: GPUWorkloadBudget, err: SpecError, now: int) -> BudgetStatus:
    """The status of a budget whose spec does not check: not Ready, Degraded, the figures left as they were."""
    gen, stamp = budget.metadata.generation, _stamp(now)
    items = cond.set_condition(budget.status.conditions, "Ready", "False", "InvalidSpec", str(err), gen, now=stamp)
    items = cond.set_condition(items, "Degraded", "True", "InvalidSpec", str(err), gen, now=stamp)
    items = cond.remove_condition(items, "Gating")  # a budget that does not check holds nothing back
    return msgspec.structs.replace(budget.status, observed_generation=gen, conditions=_conditions(items))


def with_conflict(budget: GPUWorkloadBudget, desired: BudgetStatus, left_alone: list[tuple[str, str]],
                  now: int) -> tuple[BudgetStatus, str | None]:
    """`desired` with ConflictDetected set from the Jobs Pause left alone, and the message to send as a Warning
    Event when that is news (None otherwise). A budget that never had a conflict gets no such condition."""
    current = cond.get_condition(budget.status.conditions, CONDITION)
    if left_alone:
        names = sorted({name for name, _ in left_alone})
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        value, reason = "True", JOBS_LEFT_ALONE
        message = (f"over quota, but Pause did not suspend Job(s) {shown}: {left_alone[0][1]}. Stop them through "
                   "that controller (Kueue: a ClusterQueue or LocalQueue stopPolicy, a smaller quota, or the "
                   "Workload's spec.active=false), or use the Evict action, which works on any pod")
    elif current is not None and current.status != "False":
        value, reason = "False", NO_CONFLICT
        message = "no Job this budget would pause is owned by another controller"
    else:
        return desired, None
    items = cond.set_condition(desired.conditions, CONDITION, value, reason, message[:1024],
                               budget.metadata.generation, now=_stamp(now))
    # news: the conflict starts, or a Job joins it (one that finished or went leaves quietly)
    news = value == "True" and (current is None or current.status != "True"
                                or bool({n for n, _ in left_alone} - _jobs_named(current.message)))
    return msgspec.structs.replace(desired, conditions=_conditions(items)), message if news else None


_NAMED = re.compile(r"did not suspend Job\(s\) (.*?)(?: and \d+ more)?: ")


def _jobs_named(message: str) -> set[str]:
    """The Jobs a ConflictDetected message of ours names (beyond the first ten: not listed, so taken as news)."""
    found = _NAMED.search(message)
    return set(found.group(1).split(", ")) if found else set()


async def write_status(client: Client, budget: GPUWorkloadBudget, desired: BudgetStatus, now: int) -> bool:
    """Merge-patch what changed (guarded by resourceVersion); False if the budget is gone. computedAt is the
    counting instant of `now`: the whole second the figures were computed at."""
    patch = merge_patch(budget.status, desired)
    if not patch:
        return True
    patch["computedAt"] = format_time(counting_instant(now))
    meta = budget.metadata
    try:
        await client.patch(
            BUDGETS, meta.name, {"metadata": {"resourceVersion": meta.resource_version}, "status": patch},
            namespace=meta.namespace, subresource="status",
        )
    except NotFound:
        return False
    return True

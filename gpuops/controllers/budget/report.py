"""`gpuops budget report`: usage and cost per budget, namespace, GPU model and capacity type, from the budgets'
status, as a table, CSV or JSON (chargeback).

The figures are the ones the budgets' status holds, so the report agrees with `kubectl get gwb` and with the
metrics of the same names: the current window as of each budget's `computedAt`, or with `--period previous` the
calendar period that ended last (`status.previousPeriod`, frozen when it ended; rolling budgets have none). A
budget with a price list has weighted GPU-hours and cost; without one those columns are empty.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, TextIO

from gpuops.accounting.gpuhours import MICROS_PER_HOUR
from gpuops.kube.times import format_time, parse_time_or_none

from .api import BUDGETS, GPUWorkloadBudget, UsageByKind

__all__ = ["Line", "add_arguments", "lines", "main", "render"]

Period = Literal["current", "previous"]
COLUMNS = ("namespace", "budget", "from", "to", "model", "capacity_type", "gpu_hours", "weighted_gpu_hours",
           "cost", "currency")
ALL = "(all)"
"""The model and capacity type of a budget's total line."""


@dataclass(frozen=True, slots=True)
class Line:
    """One line of the report: a budget's usage on one GPU model and capacity type (or its total, `ALL`)."""

    namespace: str
    budget: str
    start: str
    end: str
    model: str
    capacity_type: str
    gpu_hours: str
    weighted_gpu_hours: str
    cost: str
    currency: str


def _span(budget: GPUWorkloadBudget, period: Period) -> tuple[str, str] | None:
    """The interval the figures are of: the previous period, or the current window up to computedAt."""
    st = budget.status
    if period == "previous":
        prev = st.previous_period
        return (prev.start, prev.end) if prev is not None else None
    if not st.computed_at:
        return None
    if st.period_start:
        return st.period_start, st.computed_at
    hours = budget.spec.quota.window_hours
    at = parse_time_or_none(st.computed_at)
    if hours is None or at is None:
        return None
    return format_time(at - hours * MICROS_PER_HOUR), st.computed_at


def lines(budgets: Iterable[GPUWorkloadBudget], period: Period = "current") -> list[Line]:
    """The report's lines: per budget (by namespace and name) its kinds, then its total."""
    out: list[Line] = []
    for b in sorted(budgets, key=lambda b: (b.metadata.namespace, b.metadata.name)):
        span = _span(b, period)
        if span is None:
            continue
        st = b.status
        prev = st.previous_period
        if period == "previous" and prev is not None:
            kinds, total = prev.usage or (), UsageByKind(gpu_hours=prev.gpu_hours,
                                                         weighted_gpu_hours=prev.weighted_gpu_hours, cost=prev.cost)
            currency = prev.currency or ""
        else:
            kinds = st.usage or ()
            total = UsageByKind(gpu_hours=st.consumed_gpu_hours or "0",
                                weighted_gpu_hours=st.consumed_weighted_gpu_hours, cost=st.cost_so_far)
            currency = st.currency or ""
        meta = b.metadata
        for u in (*kinds, UsageByKind(model=ALL, capacity_type=ALL, gpu_hours=total.gpu_hours,
                                      weighted_gpu_hours=total.weighted_gpu_hours, cost=total.cost)):
            out.append(Line(meta.namespace, meta.name, *span, u.model or "unknown", u.capacity_type or "unknown",
                            u.gpu_hours, u.weighted_gpu_hours or "", u.cost or "", currency if u.cost else ""))
    return out


def _table(items: Sequence[Line]) -> str:
    rows = [[c.upper().replace("_", "-") for c in COLUMNS], *([*asdict(x).values()] for x in items)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "".join("   ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows)


def _csv(items: Sequence[Line]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([*asdict(x).values()] for x in items)
    return buf.getvalue()


def _json(items: Sequence[Line]) -> str:
    """One object per budget: its interval, totals and kinds; amounts stay exact decimal strings."""
    budgets: dict[tuple[str, str], dict[str, object]] = {}
    for x in items:
        entry = budgets.setdefault((x.namespace, x.budget), {"namespace": x.namespace, "budget": x.budget,
                                                             "from": x.start, "to": x.end, "usage": []})
        figures = {"gpuHours": x.gpu_hours, "weightedGpuHours": x.weighted_gpu_hours or None,
                   "cost": x.cost or None, "currency": x.currency or None}
        if x.model == ALL:
            entry["total"] = figures
        else:
            usage = entry["usage"]
            assert isinstance(usage, list)
            usage.append({"model": x.model, "capacityType": x.capacity_type, **figures})
    return json.dumps(list(budgets.values()), indent=2) + "\n"


def render(items: Sequence[Line], output: str) -> str:
    return {"table": _table, "csv": _csv, "json": _json}[output](items)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="kubeconfig file (default: $KUBECONFIG, then in-cluster config, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("-n", "--namespace", help="only the budgets of this namespace (default: all namespaces)")
    p.add_argument("--period", choices=("current", "previous"), default="current",
                   help="the current window up to each budget's last status, or the calendar period that ended "
                        "last (default: %(default)s)")
    p.add_argument("-o", "--output", choices=("table", "csv", "json"), default="table",
                   help="(default: %(default)s)")


async def _budgets(args: argparse.Namespace) -> list[GPUWorkloadBudget]:
    from gpuops.kube.client import Client

    client = await Client.auto(args.kubeconfig, args.context)
    try:
        _, items = await client.list(BUDGETS, args.namespace or None)
        return items
    finally:
        await client.close()


def main(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    try:
        budgets = asyncio.run(_budgets(args))
    except Exception as e:
        print(f"gpuops budget report: cannot list GPUWorkloadBudgets: {e}", file=sys.stderr)
        return 1
    items = lines(budgets, args.period)
    out.write(render(items, args.output))
    if not items:
        print("gpuops budget report: no budget has figures for that period", file=sys.stderr)
    return 0

"""`gpuops budget report` against the emulated API server: an organisation's budget over two teams and each
team's own, priced by the default GPUPriceList; the report (table, CSV, JSON) shows each budget's usage and cost
by GPU model and capacity type as its status holds them, the organisation's equal to its teams' together, and
the figures equal the ones computed here from the pods' start times, node labels and prices."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import pytest
from budget_harness import NS, Clock, Reconciles, budget, environment, pod, running_since

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.cli import build_parser
from gpuops.controllers.budget import report
from gpuops.controllers.budget.api import GPUWorkloadBudget
from gpuops.controllers.budget.pricelist import PRICE_LISTS
from gpuops.kube.controller import Request
from gpuops.kube.resources import NODES

pytestmark = pytest.mark.anyio

A100 = "NVIDIA-A100-SXM4-80GB"
F = Fraction


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def team_pod(name: str, team: str, node: str, gpus: int) -> dict[str, Any]:
    body = pod(name, gpus, labels={"org": "ml", "team": team})
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def run_report(kubeconfig: Path, *argv: str) -> tuple[int, str]:
    args = build_parser().parse_args(["budget", "report", "--kubeconfig", str(kubeconfig), *argv])
    out = io.StringIO()
    return report.main(args, out), out.getvalue()


async def test_the_report_shows_each_budget_by_model_and_capacity_and_the_org_adds_up(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.client.patch(NODES, "a100-1", {"metadata": {"labels": {"karpenter.sh/capacity-type": "spot"}}})
        await env.client.create(PRICE_LISTS, {
            "apiVersion": "gpuops.io/v1alpha1", "kind": "GPUPriceList", "metadata": {"name": "cloud"},
            "spec": {"currency": "EUR", "default": True, "fallback": {"onDemand": "2"},
                     "prices": [{"model": A100, "onDemand": "3.5", "spot": "1.25", "weight": "2"}]}})
        for name, labels in (("org", {"org": "ml"}), ("team-a", {"team": "a"}), ("team-b", {"team": "b"})):
            await env.create_budget(budget(name, "100", labels=labels, window=24))
        await env.create_pod(team_pod("a-train", "a", "a100-0", 2))
        await env.create_pod(team_pod("b-train", "b", "a100-1", 1))
        t_a = await env.until("a-train running", lambda: running_since(env, "a-train"))
        t_b = await env.until("b-train running", lambda: running_since(env, "b-train"))
        now = max(t_a, t_b) + 900
        clock = Clock()
        clock.set(now)
        handle = await env.start(clock=clock)
        seen = Reconciles(handle)
        for name in ("org", "team-a", "team-b"):
            await seen.after(env, Request(NS, name))

        a_hours, b_hours = 2 * F(now - t_a, 3_600), F(now - t_b, 3_600)
        a_cost, b_cost = F(7, 2) * a_hours, F(5, 4) * b_hours
        code, text = await asyncio.to_thread(run_report, env.kubeconfig, "-o", "csv")
        assert code == 0
        rows = list(csv.DictReader(io.StringIO(text)))
        got = {(r["budget"], r["model"], r["capacity_type"]): (r["gpu_hours"], r["cost"], r["currency"]) for r in rows}
        fmt = format_gpu_hours
        assert got == {
            ("org", A100, "OnDemand"): (fmt(a_hours), fmt(a_cost), "EUR"),
            ("org", A100, "Spot"): (fmt(b_hours), fmt(b_cost), "EUR"),
            ("org", "(all)", "(all)"): (fmt(a_hours + b_hours), fmt(a_cost + b_cost), "EUR"),
            ("team-a", A100, "OnDemand"): (fmt(a_hours), fmt(a_cost), "EUR"),
            ("team-a", "(all)", "(all)"): (fmt(a_hours), fmt(a_cost), "EUR"),
            ("team-b", A100, "Spot"): (fmt(b_hours), fmt(b_cost), "EUR"),
            ("team-b", "(all)", "(all)"): (fmt(b_hours), fmt(b_cost), "EUR"),
        }
        window = {(r["from"], r["to"]) for r in rows}
        assert len(window) == 1  # the three computed at the same second, over the same 24 hours
        assert all(r["namespace"] == NS and F(r["weighted_gpu_hours"]) == 2 * F(r["gpu_hours"]) for r in rows)

        code, text = await asyncio.to_thread(run_report, env.kubeconfig, "-o", "json", "-n", NS)
        by_budget = {b["budget"]: b for b in json.loads(text)}
        assert by_budget["org"]["total"]["cost"] == fmt(a_cost + b_cost)
        assert [(u["model"], u["capacityType"]) for u in by_budget["org"]["usage"]] == [
            (A100, "OnDemand"), (A100, "Spot")]
        code, text = await asyncio.to_thread(run_report, env.kubeconfig)
        header, *lines = text.splitlines()
        assert header.split() == ["NAMESPACE", "BUDGET", "FROM", "TO", "MODEL", "CAPACITY-TYPE", "GPU-HOURS",
                                  "WEIGHTED-GPU-HOURS", "COST", "CURRENCY"]
        assert len(lines) == 7

        code, text = await asyncio.to_thread(run_report, env.kubeconfig, "--period", "previous", "-o", "csv")
        assert (code, text) == (0, ",".join(report.COLUMNS) + "\n")  # rolling windows have no closed period


def test_report_lines_from_statuses_alone() -> None:
    """The report reads only status: a budget never computed has no line; a previous period is reported as
    frozen, kinds first and its total last."""
    never = {"metadata": {"name": "new", "namespace": "x"}, "spec": {"quota": {"gpuHours": "1", "windowHours": 1}}}
    closed = {"metadata": {"name": "monthly", "namespace": "x"},
              "spec": {"quota": {"gpuHours": "1", "window": {"calendar": "Month"}}},
              "status": {"computedAt": "2026-12-01T00:10:00Z", "periodStart": "2026-12-01T00:00:00Z",
                         "consumedGpuHours": "0.5",
                         "previousPeriod": {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z",
                                            "gpuHours": "720.000000", "usage": [
                                                {"model": "L4", "capacityType": "Spot", "gpuHours": "720.000000"}]}}}
    budgets = [msgspec.convert(b, GPUWorkloadBudget) for b in (never, closed)]
    assert report.lines(budgets, "current") == [report.Line(
        "x", "monthly", "2026-12-01T00:00:00Z", "2026-12-01T00:10:00Z", "(all)", "(all)", "0.5", "", "", "")]
    assert [(x.model, x.gpu_hours, x.start, x.end) for x in report.lines(budgets, "previous")] == [
        ("L4", "720.000000", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"),
        ("(all)", "720.000000", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")]

"""The priced scenario of bench/budget_accuracy.py: GPUs of four models (one the price list does not name), on
on-demand and spot nodes, two budgets over the same pods (cost per calendar day, weighted GPU-hours per rolling
hour), a day boundary and a price change in the middle of the run; cost and weighted GPU-hours are compared at
every sample with the truth computed here from the pods' container timestamps, their nodes' labels and the
prices (see `priced` for what is judged).

The day boundary: calendar periods follow a time zone's wall clock, and no real zone has a midnight within a
minute of any moment. The scenario writes a zone of its own (a TZif file with a fixed offset, to the second, that
puts a local midnight `boundary` seconds into the run), named Bench/Midnight, and runs the operator with
PYTHONTZPATH pointing at it: the operator loads it as any IANA zone. Real zones' periods are tested against
glibc in tests/accounting/test_calendar.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import tempfile
import time
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from _budget_common import BUDGETS_PATH, CRDS, NS, TARGET, ratio
from prometheus_client.parser import text_string_to_metric_families

from gpuops.accounting.reporting import counting_instant
from gpuops_sim.budget_workload import MICROS, micros, pod
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, until
from gpuops_sim.scenario import parse

__all__ = ["PRICED_FULL", "PRICED_QUICK", "PricedPlan", "judge_priced", "priced", "priced_failures",
           "priced_markdown"]

GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
SPOT_LABEL = "karpenter.sh/capacity-type"
ZONE = "Bench/Midnight"
LIST = "bench-prices"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"
GROUPS = (  # (node group, emulator model, spot)
    ("h100", "H100-80GB", False), ("h100-spot", "H100-80GB", True), ("a100-spot", "A100-80GB", True),
    ("l4", "L4-24GB", False), ("t4", "T4-16GB", False),
)
BEFORE = {  # product label -> (on-demand, spot, weight) per GPU-hour; T4 is not listed: the fallback applies
    "NVIDIA-H100-80GB-HBM3": ("6.50", "2.90", "4"), "NVIDIA-A100-SXM4-80GB": ("3.80", "1.60", "2"),
    "NVIDIA-L4": ("0.80", "0.35", "0.5"),
}
AFTER = {"NVIDIA-H100-80GB-HBM3": ("4.25", "1.95", "3"), "NVIDIA-A100-SXM4-80GB": ("3.80", "1.20", "2"),
         "NVIDIA-L4": ("0.95", "0.35", "0.5")}
FALLBACK = ("2.00", "2.00", "1")


@dataclass(frozen=True, slots=True)
class PricedPlan:
    """Pods arrive at `rate`/s for `arrivals` s on the five node groups (uniformly), each running a uniform draw
    from `runtime` s with 1 or 2 GPUs; the day ends (local midnight of ZONE) at `boundary` s and the prices change
    at `change` s; a sample every `every` s until `seconds`. Samples are judged from `judge_from` s into the run,
    and the daily budget's from `judge_from` s into its new day: before that a figure is too small for whole-second
    container timestamps (one second of one pod) to stay within 0.1 % of it, as in the other scenarios."""

    seconds: float
    arrivals: float
    rate: float
    runtime: tuple[float, float]
    boundary: float
    change: float
    every: float
    judge_from: float = 30.0
    seed: int = 7


PRICED_QUICK = PricedPlan(seconds=80.0, arrivals=76.0, rate=4.0, runtime=(5.0, 15.0), boundary=25.0, change=45.0,
                          every=2.0)
PRICED_FULL = PricedPlan(seconds=240.0, arrivals=220.0, rate=2.0, runtime=(20.0, 60.0), boundary=80.0,
                         change=150.0, every=5.0)


def _tzif(offset: int) -> bytes:
    """A TZif (version 2) zone with one fixed UTC offset in seconds, and its POSIX TZ footer."""
    abbr = b"BENCH\0"

    def block() -> bytes:
        return b"TZif2" + b"\0" * 15 + struct.pack(">6l", 0, 0, 0, 0, 1, len(abbr)) + \
            struct.pack(">lBB", offset, 0, 0) + abbr

    h = abs(offset)
    footer = f"<BENCH>{'-' if offset >= 0 else '+'}{h // 3600}:{h % 3600 // 60:02d}:{h % 60:02d}"
    return block() + block() + b"\n" + footer.encode() + b"\n"


def _zone_with_midnight_at(directory: Path, midnight: int) -> None:
    """Write ZONE under `directory` so that local midnight falls on the Unix second `midnight`."""
    offset = -(midnight % 86_400)
    if offset <= -43_200:
        offset += 86_400
    (directory / "Bench").mkdir(parents=True, exist_ok=True)
    (directory / ZONE).write_bytes(_tzif(offset))


def _price_list(table: dict[str, tuple[str, str, str]]) -> dict[str, Any]:
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUPriceList", "metadata": {"name": LIST},
            "spec": {"currency": "EUR", "default": True,
                     "prices": [{"model": m, "onDemand": od, "spot": sp, "weight": w}
                                for m, (od, sp, w) in table.items()],
                     "fallback": {"onDemand": FALLBACK[0], "spot": FALLBACK[1], "weight": FALLBACK[2]}}}


def _budgets() -> list[dict[str, Any]]:
    base = {"selector": {"matchLabels": {"app": "priced-bench"}}, "enforcement": {"action": "AlertOnly"}}
    return [
        {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget", "metadata": {"name": "daily-cost"},
         "spec": {**base, "quota": {"cost": {"amount": "1000000", "currency": "EUR"},
                                    "window": {"calendar": "Day", "timeZone": ZONE}}}},
        {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget", "metadata": {"name": "hourly-weighted"},
         "spec": {**base, "quota": {"weightedGpuHours": "1000000", "windowHours": 1}}},
    ]


# ---------------------------------------------------------------------------------------------- the truth


def _rates(table: dict[str, tuple[str, str, str]], model: str, spot: bool) -> tuple[Fraction, Fraction]:
    on_demand, spot_price, weight = table.get(model, FALLBACK)
    return Fraction(spot_price if spot else on_demand), Fraction(weight)


def _span(p: dict[str, Any], at: int) -> tuple[int, int] | None:
    """The pod's GPU time up to `at` from its container timestamps (the emulator's), or None."""
    starts, ends, done = [], [], True
    for s in (p.get("status") or {}).get("containerStatuses") or []:
        state = s.get("state") or {}
        run, term = state.get("running") or {}, state.get("terminated") or {}
        if run.get("startedAt") or term.get("startedAt"):
            starts.append(micros(run.get("startedAt") or term["startedAt"]))
        if term.get("finishedAt"):
            ends.append(micros(term["finishedAt"]))
        else:
            done = False
    if not starts:
        return None
    return min(starts), min(max(ends), at) if done and ends else at


def truth(pods: list[dict[str, Any]], nodes: dict[str, dict[str, str]], change: int, *, since: int,
          at: int) -> tuple[Fraction, Fraction]:
    """(cost, weighted GPU-hours) of `pods` inside [since, at), each second at the prices of its node's model and
    capacity (from the node's labels) in force then: BEFORE until `change`, AFTER from it."""
    cost = weighted = Fraction(0)
    for p in pods:
        span = _span(p, at)
        labels = nodes.get((p.get("spec") or {}).get("nodeName") or "", {})
        if span is None or not labels:
            continue
        gpus = sum(Fraction(c["resources"]["limits"][GPU]) for c in p["spec"]["containers"])
        model, spot = labels.get(PRODUCT, ""), labels.get(SPOT_LABEL) == "spot"
        lo, hi = max(span[0], since), span[1]
        for table, a, b in ((BEFORE, lo, min(hi, change)), (AFTER, max(lo, change), hi)):
            if b > a:
                price, weight = _rates(table, model, spot)
                hours = gpus * Fraction(b - a, 3_600 * MICROS)
                cost += price * hours
                weighted += weight * hours
    return cost, weighted


def _scraped(text: str, name: str, budget: str) -> Fraction | None:
    """The sum of `name`'s samples of one budget (its kinds), exact from the text's decimal."""
    found = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("name") == budget and sample.labels.get("namespace") == NS:
                found = (found or Fraction(0)) + Fraction(repr(sample.value))
    return found


# ---------------------------------------------------------------------------------------------- the run


async def _create(rig: OperatorHarness, plan: PricedPlan, t0: float, names: list[str]) -> None:
    rng = random.Random(plan.seed)
    for i in range(int(plan.arrivals * plan.rate)):
        await asyncio.sleep(max(0.0, t0 + i / plan.rate - time.monotonic()))
        group = GROUPS[rng.randrange(len(GROUPS))][0]
        body = pod(f"priced-{i:04d}", {"app": "priced-bench"}, GPU, str(rng.choice((1, 2))),
                   round(rng.uniform(*plan.runtime), 1))
        body["spec"]["nodeSelector"] = {"bench/group": group}
        await rig.request("POST", PODS_PATH, body)
        names.append(body["metadata"]["name"])


def _scenario() -> Any:
    groups = [{"name": g, "gpuModel": m, "gpusPerNode": 8, "count": 3, "bootSeconds": 0.05,
               "devicePluginSeconds": 0.05, "labels": {"bench/group": g, **({SPOT_LABEL: "spot"} if spot else {})}}
              for g, m, spot in GROUPS]
    return parse({"name": "budget-priced", "namespaces": [NS], "nodeGroups": groups,
                  "kubelet": {"startLatencySeconds": 0.5, "leaseSeconds": 2.0, "nodeStatusSeconds": 10.0,
                              "events": False}, "scheduler": {"events": False}})


async def _sample(rig: OperatorHarness, midnight: int, change: int | None, nodes: dict[str, dict[str, str]],
                  t: float, judge_from: float) -> dict[str, Any]:
    text, s0, s1 = await rig.scrape()
    statuses = {b["metadata"]["name"]: b.get("status") or {}
                for b in (await rig.request("GET", BUDGETS_PATH))["items"]}
    pods = (await rig.request("GET", PODS_PATH))["items"]
    cut = change if change is not None else 1 << 62
    row: dict[str, Any] = {"t": round(t, 1)}
    for name, field, metric, index in (
            ("daily-cost", "costSoFar", "gpuops_budget_usage_cost", 0),
            ("hourly-weighted", "consumedWeightedGpuHours", "gpuops_budget_usage_weighted_gpu_seconds", 1)):
        st = statuses.get(name, {})
        if not st.get("computedAt") or st.get(field) is None:
            row[name] = None
            continue
        at = micros(st["computedAt"])
        since = (midnight if at >= midnight else midnight - 86_400 * MICROS) if name == "daily-cost" else \
            at - 3_600 * MICROS
        exact = truth(pods, nodes, cut, since=since, at=at)[index]
        reported = Fraction(st[field])
        scraped = _scraped(text, metric, name)
        lo_at, hi_at = counting_instant(s0), counting_instant(s1)

        def window_start(x: int, budget: str = name) -> int:
            return (midnight if x >= midnight else midnight - 86_400 * MICROS) if budget == "daily-cost" else \
                x - 3_600 * MICROS

        low = truth(pods, nodes, cut, since=window_start(lo_at), at=lo_at)[index]
        high = truth(pods, nodes, cut, since=window_start(hi_at), at=hi_at)[index]
        if scraped is not None and index == 1:
            scraped /= 3_600  # weighted GPU-seconds -> weighted GPU-hours
        metric_ratio = None if scraped is None else (
            1.0 if min(low, high) <= scraped <= max(low, high) else
            ratio(scraped, low if abs(scraped - low) < abs(scraped - high) else high))
        row[name] = {"status": str(reported), "truth": float(exact), "accuracy_status": ratio(reported, exact),
                     "accuracy_metric": metric_ratio, "after_boundary": at >= midnight,
                     "after_change": change is not None and at >= change,
                     "judged": exact > 0 and t >= judge_from and (name != "daily-cost" or at < midnight or
                                                                 at >= midnight + round(judge_from * MICROS))}
    return row


@dataclass
class PricedResult:
    plan: dict[str, Any]
    pods: int
    boundary_at: str
    change_at: str | None
    samples: list[dict[str, Any]]
    boundary_t: float = 0.0
    """Seconds into the run (from the first pod's creation) the day ended."""
    change_t: float = 0.0
    """Seconds into the run the new prices took effect."""


async def priced(plan: PricedPlan) -> PricedResult:
    """Run the scenario: the operator's figures (status and metric) sampled every `plan.every` s."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.time()
        midnight_s = int(start + plan.boundary) + 1
        zones = Path(tmp) / "zones"
        _zone_with_midnight_at(zones, midnight_s)
        midnight = midnight_s * MICROS
        async with OperatorHarness(SimCluster(_scenario(), workload=False, faults=False), Path(tmp), crds=CRDS,
                                   env={"PYTHONTZPATH": str(zones)}) as rig:
            await rig.request("POST", "/apis/gpuops.io/v1alpha1/gpupricelists", _price_list(BEFORE))
            for b in _budgets():
                await rig.request("POST", BUDGETS_PATH, b)
            nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {}
                     for n in (await rig.request("GET", "/api/v1/nodes"))["items"]}
            t0, t0_wall = time.monotonic(), time.time()
            names: list[str] = []
            creator = asyncio.create_task(_create(rig, plan, t0, names))
            samples: list[dict[str, Any]] = []
            change: int | None = None
            k = 1
            while (t := k * plan.every) <= plan.seconds:
                await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
                if change is None and t >= plan.change:
                    change = await _change_prices(rig)
                samples.append(await _sample(rig, midnight, change, nodes, t, plan.judge_from))
                k += 1
            await creator
            return PricedResult(asdict(plan), len(names), _iso(midnight), None if change is None else _iso(change),
                                samples, round(midnight / MICROS - t0_wall, 1),
                                -1.0 if change is None else round(change / MICROS - t0_wall, 1))


async def _change_prices(rig: OperatorHarness) -> int:
    """Patch the prices; the instant they take effect, as the API server recorded the write (managed fields)."""
    assert rig.http is not None
    async with rig.http.patch(f"{rig.cluster.server.url}/apis/gpuops.io/v1alpha1/gpupricelists/{LIST}",
                              headers={**rig.headers, "Content-Type": "application/merge-patch+json"},
                              data=json.dumps({"spec": _price_list(AFTER)["spec"]})) as r:
        got = await r.json(content_type=None)
        assert r.status == 200, got
    times = [micros(e["time"]) for e in got["metadata"].get("managedFields") or ()
             if e.get("time") and not e.get("subresource") and "f:spec" in (e.get("fieldsV1") or {})]
    await until("the new prices recorded", lambda: _recorded(rig), 10)
    return max(times)


async def _recorded(rig: OperatorHarness) -> bool:
    got = await rig.request("GET", f"/apis/gpuops.io/v1alpha1/gpupricelists/{LIST}")
    return len((got.get("status") or {}).get("history") or ()) >= 2


def _iso(instant: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(instant // MICROS))


# ---------------------------------------------------------------------------------------------- the verdict


def judge_priced(result: PricedResult) -> tuple[dict[str, Any], bool]:
    """Figures, and whether every sample's status and metric were >= 0.999 of the truth (cost and weighted)."""
    figures: dict[str, Any] = {"pods": result.pods, "samples": len(result.samples)}
    ok = bool(result.samples) and result.change_at is not None
    for name in ("daily-cost", "hourly-weighted"):
        shown = [s[name] for s in result.samples if s.get(name) and s[name]["truth"] > 0]
        figures[f"{name}_min_accuracy_reported_not_judged"] = min(
            [r["accuracy_status"] for r in shown] + [r["accuracy_metric"] or 0.0 for r in shown], default=-1.0)
        rows = [r for r in shown if r["judged"]]
        status = [r["accuracy_status"] for r in rows]
        metric = [r["accuracy_metric"] for r in rows if r["accuracy_metric"] is not None]
        figures[f"{name}_min_accuracy_status"] = min(status, default=-1.0)
        figures[f"{name}_max_accuracy_status"] = max(status, default=-1.0)
        figures[f"{name}_min_accuracy_metric"] = min(metric, default=-1.0)
        figures[f"{name}_samples_after_boundary"] = sum(1 for r in rows if r["after_boundary"])
        figures[f"{name}_samples_after_change"] = sum(1 for r in rows if r["after_change"])
        ok = ok and bool(rows) and len(metric) == len(rows) and min(status + metric) >= float(TARGET)
        ok = ok and figures[f"{name}_samples_after_boundary"] > 0 and figures[f"{name}_samples_after_change"] > 0
    figures["meets_accuracy_target"] = int(ok)
    return figures, ok


def priced_failures(result: PricedResult) -> list[str]:
    out = []
    for s in result.samples:
        for name in ("daily-cost", "hourly-weighted"):
            r = s.get(name)
            if r and r["judged"] and min(r["accuracy_status"], r["accuracy_metric"] or 0.0) < float(TARGET):
                out.append(f"t={s['t']} s {name}: status {r['accuracy_status']}, metric {r['accuracy_metric']}")
    return out or ["no sample after the day boundary or the price change, or a budget never reported"]


def _cells(r: dict[str, Any] | None) -> str:
    if not r:
        return "- | - | -"
    metric = "-" if r["accuracy_metric"] is None else f"{r['accuracy_metric']:.6f}"
    mark = "" if r["judged"] else " (not judged)"
    return f"{r['truth']:.6f} | {r['accuracy_status']:.6f} | {metric}{mark}"


def priced_markdown(result: PricedResult, figures: dict[str, Any]) -> str:
    rows = [f"| {s['t']:g} | {_cells(s.get('daily-cost'))} | {_cells(s.get('hourly-weighted'))} |"
            for s in result.samples]
    plan = result.plan
    return f"""## Priced: cost and weighted GPU-hours across a day boundary and a price change

{result.pods} pods (1 or 2 GPUs, {plan['runtime'][0]:g}-{plan['runtime'][1]:g} s) on H100 (on-demand and spot),
A100 (spot), L4 and T4 (not in the price list: fallback prices) nodes; budget `daily-cost` counts cost per
calendar day of a zone whose midnight falls at {result.boundary_at} (t = {result.boundary_t:g} s), `hourly-weighted`
weighted GPU-hours over a rolling hour; the prices change at {result.change_at} (t = {result.change_t:g} s, the API
server's time of the write). Truth: the pods' container timestamps, their nodes' labels and the two price tables,
computed in the bench. Status accuracy at its computedAt; metric accuracy 1 when it lies between the truth at the
whole seconds its scrape request spans, else the ratio to the nearer.

| t (s) | daily cost: truth (EUR) | status | metric | hourly weighted: truth | status | metric |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Target (every judged sample, status and metric, >= 0.999 of the truth, with judged samples after the boundary and
after the change; samples are judged from {plan['judge_from']:g} s into the run and into the new day, before which
one second of one pod is more than 0.1 % of the figure): {"met" if figures["meets_accuracy_target"] else "NOT met"}.
"""

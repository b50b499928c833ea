"""Evict enforcement: a budget's consumption never drops while its pods are evicted, and evicted pods keep counting.

Injected: two budgets with `enforcement.action: Evict`, `delaySeconds: 2` and a small quota (N pods x 4 GPU-s,
so it is crossed about 4 s after all pods run) select disjoint sets of N 1-GPU pods that would run for an hour:
`evict` without retainFinishedPods (its pods have terminationGracePeriodSeconds 0 and no finalizer, so an
eviction removes a running pod from the API at once: the controller only has the DELETED event's last state)
and `evict-retain` with it (the accounting finalizer keeps an evicted pod until the kubelet has written its
terminated state and the ledger holds its final usage). The controller then evicts every running pod of each
budget (policy/v1 Eviction, at most 3 per second per budget: enforcement.py), since consumption in a 1 h
window only grows.

Checked: every ~150 ms through the evictions, each budget's status.consumedGpuHours (GET over HTTP, as a user reads
it) and the scraped `gpuops_budget_consumed_gpu_seconds` (/ 3600); the largest drop between consecutive samples must
be <= 1e-9 GPU-h for both. Evictions done: pods of the set removed (all deletions here are evictions), the
operator's `gpuops_budget_enforcement_actions_total{action="Evict",result="Evicted"}` (both budgets), the budgets'
`Evicted` Events. Once every pod is gone: final accuracy of status (at computedAt) and metric (at the scrape)
against the truth, which includes the evicted pods' last states: their container timestamps, whole seconds as the
operator counts them, and for a pod removed while running (no finishedAt) the instant the store removed it.
Pass, per budget: all N pods evicted, no drop, final accuracy within 0.999..1.001 (metric: inside its scrape
window, see chaos/_budget.py `snapshot_ok`).

`--quick`: N = 9 instead of 24 (the timeline is short already: about 15 s of evictions in full mode).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any

from _budget import GPU, NS, Chaos, PodLog, PodRecord, metric_gpu_hours, open_rig, set_labels, snapshot, snapshot_ok
from _common import Detail, Figures, Found, Report, metric_sum, mode_of, pace, run_scenario

from gpuops_sim.budget_workload import MICROS, budget, micros, pod
from gpuops_sim.harness import now_us, until

NAME = "budget_evict"
NOTES = {
    "evict_largest_status_drop_gpu_seconds": "max over consecutive samples of previous - next (must be <= 0)",
    "evict_final_accuracy_metric": "at the scrape's midpoint (reported)",
    "evict_final_accuracy_metric_in_window": "at some instant of the scrape request (judged)",
    "operator_evict_counter": "gpuops_budget_enforcement_actions_total{action=Evict,result=Evicted}, both budgets",
    "evict_ledger_end_minus_truth_end_ms_mean": "ledger entry end - store removal, per evicted pod (ms)",
    "evict_retain_ledger_end_minus_truth_end_ms_mean": "ledger entry end - container finishedAt (ms)",
}

SETS = ("evict", "evict-retain")
labels = partial(set_labels, "evict")
QUOTA_SECONDS_PER_POD = 4
DELAY = 2
SAMPLE_EVERY = 0.15
TOL = Fraction(1, 10**9)  # GPU-hours


@dataclass
class Series:
    """One budget's samples: (when µs, value GPU-h) for status and metric, and the evictions status named."""

    status: list[tuple[int, Fraction]] = field(default_factory=list)
    metric: list[tuple[int, Fraction]] = field(default_factory=list)
    named: set[str] = field(default_factory=set)

    @staticmethod
    def largest_drop(values: list[tuple[int, Fraction]]) -> tuple[Fraction, tuple[int, int] | None]:
        """The largest decrease between consecutive samples (<= 0 when it never drops) and the two samples'
        instants (µs)."""
        worst, at = Fraction(-1), None
        for (t0, a), (t1, b) in itertools.pairwise(values):
            if a - b > worst:
                worst, at = a - b, (t0, t1)
        return (worst if values[1:] else Fraction(0)), at


def drop_evidence(recs: list[PodRecord], at: tuple[int, int] | None, origin: int) -> list[dict[str, Any]]:
    """Pods whose recorded end (whole seconds, as Kubernetes stamps it) lies within the second before the first
    sample's instant: a value computed while the operator still saw them running counted them up to that
    instant, a later one only up to their recorded end."""
    if at is None:
        return []
    out = []
    for r in recs:
        ended = r.terminal_at if r.terminal_at is not None else r.gone_at
        if ended is None:
            continue
        end = pod_end(r)
        if end is not None and end < at[0] < end + MICROS:
            meta = r.last["metadata"]
            out.append({"pod": meta["name"], "finishedAt": end / MICROS,
                        "deletionTimestamp": meta.get("deletionTimestamp"),
                        "store_terminal_offset_s": round((ended - origin) / MICROS, 3),
                        "first_sample_offset_s": round((at[0] - origin) / MICROS, 3),
                        "second_sample_offset_s": round((at[1] - origin) / MICROS, 3),
                        "counted_beyond_end_gpu_seconds": round((at[0] - end) / MICROS, 6)})
    return out


async def sampler(chaos: Chaos, series: dict[str, Series], stop: asyncio.Event) -> None:
    while not stop.is_set():
        text, s0, s1 = await chaos.rig.scrape()
        for s in SETS:
            b = await chaos.rig.request("GET", f"/apis/gpuops.io/v1alpha1/namespaces/{NS}/gpuworkloadbudgets/{s}")
            st = b.get("status") or {}
            if st.get("consumedGpuHours") is not None:
                series[s].status.append((micros(st["computedAt"]), Fraction(st["consumedGpuHours"])))
            last = st.get("lastEnforcement") or {}
            if last.get("result") == "Evicted":
                series[s].named.add(str(last.get("pod")))
            value = metric_gpu_hours(text, s)  # the GPU-seconds gauge / 3600, exact
            if value is not None:
                series[s].metric.append(((s0 + s1) // 2, value))
        await asyncio.sleep(SAMPLE_EVERY)  # the sampling cadence


def pod_end(rec: PodRecord) -> int | None:
    """The end truth uses: the latest container finishedAt (synthesized at removal for a running pod)."""
    statuses = (PodLog.final_state(rec).get("status") or {}).get("containerStatuses") or ()
    ends = [micros(t["finishedAt"]) for c in statuses
            if (t := (c.get("state") or {}).get("terminated")) and t.get("finishedAt")]
    return max(ends) if ends else None


def ledger_lag_ms(status: dict[str, Any], recs: list[PodRecord]) -> list[float]:
    """Per evicted pod: the end its ledger entry holds minus the end truth uses (ms; > 0 = counted longer)."""
    entries = {e["uid"]: micros(e["end"]) for e in (status.get("ledger") or {}).get("entries") or ()}
    out = []
    for r in recs:
        end, uid = pod_end(r), r.last["metadata"]["uid"]
        if end is not None and uid in entries:
            out.append((entries[uid] - end) / 1000)
    return out


async def scenario(quick: bool, seed: int) -> Found:
    n = 9 if quick else 24
    quota = f"{n * QUOTA_SECONDS_PER_POD / 3600:.9f}"
    async with open_rig("chaos-evict", 2 * n, seed=seed) as chaos:
        for s in SETS:
            await chaos.create_budget(budget(s, labels(s), GPU, quota=quota, action="Evict", delay=DELAY,
                                             retain=(s == "evict-retain")))
        series = {s: Series() for s in SETS}
        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler(chaos, series, stop))
        origin = now_us()
        for i in range(n):
            await pace(origin / MICROS, i * 0.05)
            for s in SETS:
                await chaos.create_pod(pod(f"{s}-{i:03d}", labels(s), GPU, "1", 3600))

        async def all_evicted() -> bool:
            recs = [r for s in SETS for r in chaos.log.select(labels(s))]
            return len(recs) == 2 * n and all(r.gone_at is not None for r in recs)

        timed_out = False
        try:
            await until("every pod evicted and gone", all_evicted, 60 + n, every=0.2)
        except TimeoutError:
            timed_out = True
        settle = now_us() / MICROS
        await pace(settle, 2.0)  # keep sampling a little after the last pod went: a late drop would show here
        stop.set()
        await sampling
        text = await chaos.metrics()
        snaps = {s: await snapshot(chaos, s, labels(s), origin) for s in SETS}
        counter = metric_sum(text, "gpuops_budget_enforcement_actions_total", {"action": "Evict", "result": "Evicted"})
        figures: dict[str, float | int] = {"pods_per_budget": n}
        ok = not timed_out
        detail: dict[str, Any] = {}
        for s in SETS:
            recs = chaos.log.select(labels(s))
            gone = [r for r in recs if r.gone_at is not None]
            marked = sorted(r.deletion_at for r in recs if r.deletion_at is not None)
            drop_s, at_s = Series.largest_drop(series[s].status)
            drop_m, at_m = Series.largest_drop(series[s].metric)
            k = s.replace("-", "_")
            lag = ledger_lag_ms(chaos.status(s), recs)
            figures.update({
                f"{k}_pods_evicted": len(gone),
                f"{k}_evicted_events": chaos.events("Evicted", s),
                f"{k}_pods_named_in_last_enforcement": len(series[s].named),
                f"{k}_eviction_span_seconds": round((marked[-1] - marked[0]) / MICROS, 3) if marked else -1,
                f"{k}_first_eviction_offset_seconds": round((marked[0] - origin) / MICROS, 3) if marked else -1,
                f"{k}_status_samples": len(series[s].status),
                f"{k}_metric_samples": len(series[s].metric),
                f"{k}_largest_status_drop_gpu_seconds": round(float(drop_s * 3600), 6),
                f"{k}_largest_metric_drop_gpu_seconds": round(float(drop_m * 3600), 6),
                f"{k}_ledger_end_minus_truth_end_ms_mean": round(sum(lag) / len(lag), 3) if lag else -1,
                f"{k}_ledger_end_minus_truth_end_ms_max": round(max(lag), 3) if lag else -1,
                f"{k}_final_accuracy_status": snaps[s]["accuracy_status"],
                f"{k}_final_accuracy_metric": snaps[s]["accuracy_metric"],
                f"{k}_final_accuracy_metric_in_window": snaps[s]["accuracy_metric_in_window"],
            })
            ok = ok and len(gone) == n and drop_s <= TOL and drop_m <= TOL and snapshot_ok(snaps[s])
            detail[s] = {
                "final": snaps[s],
                "status_drop_evidence": drop_evidence(recs, at_s, origin) if drop_s > TOL else [],
                "metric_drop_evidence": drop_evidence(recs, at_m, origin) if drop_m > TOL else [],
                "status_series": [[round((t - origin) / MICROS, 3), str(v)] for t, v in series[s].status],
                "metric_series": [[round((t - origin) / MICROS, 3), float(v)] for t, v in series[s].metric],
            }
        figures["operator_evict_counter"] = counter
        figures["timed_out"] = int(timed_out)
        return figures, {"quota_gpu_hours": quota, "budgets": detail}, ok


def report(figures: Figures, extra: Detail, args: argparse.Namespace) -> Report:
    n = figures["pods_per_budget"]
    injected = (f"Evict budgets (quota {n}x{QUOTA_SECONDS_PER_POD} GPU-s, delay {DELAY} s) over {n} pods each, "
                "with and without the finalizer")
    checked = f"status+metric sampled every {SAMPLE_EVERY} s: no drop; all evicted; final accuracy"
    key = (f"evicted {figures['evict_pods_evicted']}+{figures['evict_retain_pods_evicted']}; largest drop status "
           f"{figures['evict_largest_status_drop_gpu_seconds']:g}/"
           f"{figures['evict_retain_largest_status_drop_gpu_seconds']:g}, metric "
           f"{figures['evict_largest_metric_drop_gpu_seconds']:g}/"
           f"{figures['evict_retain_largest_metric_drop_gpu_seconds']:g} GPU-s; final acc "
           f"{figures['evict_final_accuracy_status']:g}/{figures['evict_retain_final_accuracy_status']:g}")
    md = f"""# Budget Evict: consumption never drops ({mode_of(args)} run)

Injected: two `action: Evict` budgets (`delaySeconds: {DELAY}`, quota {extra['quota_gpu_hours']} GPU-h = \
{n} x {QUOTA_SECONDS_PER_POD} GPU-s),
each over {n} running 1-GPU pods: `evict` (no finalizer, grace 0: an evicted pod leaves the API at once) and
`evict-retain` (retainFinishedPods: the finalizer holds an evicted pod until its final usage is recorded).
Checked: status.consumedGpuHours (HTTP GET) and the scraped metric every {SAMPLE_EVERY} s through the evictions
(largest drop between consecutive samples must be <= 1e-9 GPU-h); every pod evicted; final accuracy against
truth that includes the evicted pods."""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report, facts={"namespace": NS})
